//! `sopactl link | switch | status | certs`: the operator's side of the controller.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use sopa_channel::{
    client,
    identity::{self, Identity},
    proto::{
        LinkChange, LinkRef, Role, StatusRequest, SwitchChange,
        control::control_client::ControlClient,
    },
    tls,
};
use sopa_controller::certs;
use tonic::transport::Channel;

#[derive(Args)]
pub struct Connection {
    /// The controller, e.g. https://sopa-controller:7470.
    #[arg(
        long,
        env = "SOPA_CONTROLLER",
        default_value = "https://127.0.0.1:7470"
    )]
    controller: String,
    /// This operator's (or viewer's) certificate folder (ca.pem, node.pem, node.key), from
    /// `sopactl certs issue --role operator|viewer`.
    #[arg(long, env = "SOPA_CERTS")]
    certs: Option<PathBuf>,
    /// The name in the controller's certificate.
    #[arg(long, env = "SOPA_CONTROLLER_NAME", default_value = tls::CONTROLLER_NAME)]
    controller_name: String,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum State {
    Down,
    Up,
}

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Create the fabric's CA in DIR (ca.pem, ca.key; never overwrites). Keep ca.key offline.
    Init { dir: PathBuf },
    /// Issue one node its certificate, naming its node and role (sopa://ROLE/NODE), into a
    /// folder of its own (ca.pem, node.pem, node.key): all that node needs, no CA key.
    Issue {
        /// The CA's folder (from `sopactl certs init`).
        #[arg(long, env = "SOPA_CA")]
        ca: PathBuf,
        /// host, switch, operator, viewer or controller.
        #[arg(long, value_parser = parse_role)]
        role: identity::Role,
        /// The node's name in the topology (a host or switch), or a name for the operator,
        /// viewer or controller.
        #[arg(long)]
        node: String,
        /// The folder to write (created; existing files are never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// A controller's DNS names and addresses (repeatable; default sopa-controller,
        /// localhost, 127.0.0.1).
        #[arg(long = "name")]
        names: Vec<String>,
        /// Days of validity.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
    /// The node, role and serial a certificate names (for a deny list entry).
    Show { file: PathBuf },
}

fn parse_role(s: &str) -> Result<identity::Role, String> {
    s.parse()
        .map_err(|e: identity::IdentityError| e.to_string())
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

pub async fn connect(c: &Connection) -> Result<ControlClient<Channel>> {
    let tls = if c.controller.starts_with("https://") {
        let dir = c
            .certs
            .as_ref()
            .context("an https controller needs --certs DIR (or SOPA_CERTS)")?;
        Some(tls::client_config(dir, &c.controller_name)?)
    } else {
        if c.certs.is_some() {
            bail!("--certs given for a plaintext controller address; use https://");
        }
        None
    };
    let channel = client::connect(&c.controller, tls.as_ref())
        .await
        .map_err(anyhow::Error::msg)?;
    if c.controller.starts_with("http://") {
        eprintln!(
            "sopactl: plaintext to {}; if the controller serves TLS, use https:// with --certs",
            c.controller
        );
    }
    Ok(ControlClient::new(channel))
}

fn word(s: State) -> &'static str {
    match s {
        State::Down => "down",
        State::Up => "up",
    }
}

pub fn link(c: &Connection, state: State, a: &str, b: &str) -> Result<()> {
    runtime().block_on(async {
        let reply = connect(c)
            .await?
            .set_link(LinkChange {
                link: Some(LinkRef {
                    a: a.into(),
                    b: b.into(),
                }),
                down: matches!(state, State::Down),
            })
            .await
            .map_err(|s| anyhow::anyhow!("link {a} {b}: {}", s.message()))?
            .into_inner();
        let what = if reply.changed { "now" } else { "already" };
        println!(
            "link {a}:{b} {what} {} (version {})",
            word(state),
            reply.version
        );
        Ok(())
    })
}

pub fn switch(c: &Connection, state: State, name: &str) -> Result<()> {
    runtime().block_on(async {
        let reply = connect(c)
            .await?
            .set_switch(SwitchChange {
                name: name.into(),
                down: matches!(state, State::Down),
            })
            .await
            .map_err(|s| anyhow::anyhow!("switch {name}: {}", s.message()))?
            .into_inner();
        let what = if reply.changed { "now" } else { "already" };
        println!(
            "switch {name} {what} {} (version {})",
            word(state),
            reply.version
        );
        Ok(())
    })
}

pub fn status(c: &Connection, json: bool) -> Result<()> {
    runtime().block_on(async {
        let s = connect(c)
            .await?
            .status(StatusRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("status: {}", s.message()))?
            .into_inner();
        if json {
            let agents: Vec<_> = s
                .agents
                .iter()
                .map(|a| {
                    serde_json::json!({
                        "node": a.node, "role": role(a.role), "connected": a.connected,
                        "applied_version": a.applied_version, "last_ack": a.last_ack,
                        "last_nack": a.last_nack, "last_error": a.last_error, "agent_version": a.agent_version,
                    })
                })
                .collect();
            let down: Vec<String> = s.down_links.iter().map(|l| format!("{}:{}", l.a, l.b)).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "epoch": s.epoch, "version": s.version, "topology": serde_json::from_str::<serde_json::Value>(&s.topology).unwrap_or_default(),
                    "down_links": down, "down_switches": s.down_switches, "agents": agents,
                    "drained_links": s.drained_links.iter().map(|l| format!("{}:{}", l.a, l.b)).collect::<Vec<_>>(),
                    "held_links": s.held_links.iter().filter_map(|h| h.link.as_ref().map(|l| serde_json::json!({"link": format!("{}:{}", l.a, l.b), "remaining_ms": h.remaining_ms}))).collect::<Vec<_>>(),
                    "refusals": s.refusals.iter().map(|r| (r.reason.clone(), serde_json::Value::from(r.count))).collect::<serde_json::Map<_, _>>(),
                }))?
            );
            return Ok(());
        }
        println!("controller epoch {:x}, version {}, topology {}", s.epoch, s.version, s.topology);
        let drained: Vec<(&str, &str)> = s.drained_links.iter().map(|l| (l.a.as_str(), l.b.as_str())).collect();
        let down: Vec<String> = s
            .down_links
            .iter()
            .map(|l| {
                let why = if drained.contains(&(l.a.as_str(), l.b.as_str())) { "drained" } else { "reported" };
                format!("{}:{} ({why})", l.a, l.b)
            })
            .collect();
        println!(
            "down: links [{}], switches [{}]",
            down.join(", "),
            s.down_switches.join(", ")
        );
        for h in &s.held_links {
            if let Some(l) = &h.link {
                println!("flapping: {}:{} held down for {} ms more", l.a, l.b, h.remaining_ms);
            }
        }
        if !s.refusals.is_empty() {
            let r: Vec<String> = s.refusals.iter().map(|r| format!("{} {}", r.reason, r.count)).collect();
            println!("refused clients: {}", r.join(", "));
        }
        println!("{:<24} {:<7} {:<13} {:>8} {:>8} {:>9}  last error", "agent", "role", "state", "applied", "ack", "nack");
        for a in &s.agents {
            let state = if a.connected { "connected" } else { "disconnected" };
            println!(
                "{:<24} {:<7} {:<13} {:>8} {:>8} {:>9}  {}",
                a.node, role(a.role), state, a.applied_version, a.last_ack, a.last_nack, a.last_error
            );
        }
        Ok(())
    })
}

fn role(r: i32) -> &'static str {
    match Role::try_from(r) {
        Ok(Role::Host) => "host",
        Ok(Role::Switch) => "switch",
        _ => "?",
    }
}

pub fn certs(cmd: CertsCommand) -> Result<()> {
    match cmd {
        CertsCommand::Init { dir } => {
            for path in certs::init(&dir)? {
                println!("wrote {}", path.display());
            }
            println!(
                "keep ca.key offline; issue each node, operator and the controller a certificate of its own: sopactl certs issue --ca {} --role ROLE --node NAME --out DIR",
                dir.display()
            );
            Ok(())
        }
        CertsCommand::Issue {
            ca,
            role,
            node,
            out,
            names,
            days,
        } => {
            let id = Identity::new(role, node)?;
            let issued = certs::issue(
                &ca,
                &id,
                &out,
                &certs::IssueOptions {
                    names,
                    days,
                    expired: false,
                },
            )?;
            for path in &issued.files {
                println!("wrote {}", path.display());
            }
            println!("identity {}  serial {}", id.uri(), issued.serial);
            println!(
                "to revoke it: add {} to the controller's --revoked file",
                issued.serial
            );
            Ok(())
        }
        CertsCommand::Show { file } => {
            let (id, serial) = certs::read_identity(&file)?;
            println!("identity {}  serial {serial}", id.uri());
            Ok(())
        }
    }
}
