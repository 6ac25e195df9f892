//! `sopactl link | switch | status | certs`: the operator's side of the controller.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use sopa_channel::{
    client,
    identity::{self, Identity},
    proto::{
        LinkChange, LinkRef, Role, StatusRequest, SwitchChange, TrustChange,
        control::control_client::ControlClient,
    },
    tls,
};
use sopa_controller::certs;
use sopa_ops::{
    duration::Dur,
    exit::{CONFIG, PRIVILEGES},
};
use tonic::{Status, transport::Channel};

use crate::exit::{Coded, REFUSED, UNAVAILABLE};

#[derive(Args)]
pub struct Connection {
    /// The controller, e.g. https://sopa-controller:7470, or its replicas as a list
    /// (https://c1:7470,https://c2:7470): tried in turn until one answers.
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
    /// How long one controller of the list has to answer before the next is tried (a leader
    /// retries a write that etcd did not confirm for up to about 10 s before it refuses it).
    #[arg(long, env = "SOPA_TIMEOUT", alias = "timeout-ms", default_value_t = Dur::ms(15_000))]
    timeout: Dur,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum State {
    Down,
    Up,
    /// Links only: end the path meter's suspicion now and never drain the link on its
    /// evidence (an operator's override).
    Trust,
    /// Links only: hand a trusted link back to the path meter.
    Untrust,
}

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Create the fabric's CA in DIR (ca.pem, ca.key; never overwrites). Keep ca.key offline.
    Init {
        /// Where ca.pem and ca.key are written.
        dir: PathBuf,
        /// Days the CA is valid for (every certificate it issues expires before it does).
        #[arg(long, default_value_t = certs::CA_DAYS)]
        days: u32,
    },
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
    Show {
        /// The certificate (PEM).
        file: PathBuf,
    },
    /// Revoke a certificate through the controller: kept in its state (so every replica
    /// refuses it), refused at its next handshake, its open stream closed.
    Revoke {
        #[command(flatten)]
        conn: Connection,
        /// The serial, as `sopactl certs show` and `certs issue` print it.
        serial: String,
        /// Why (shown by `sopactl history`).
        #[arg(long, default_value = "")]
        reason: String,
    },
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

/// The TLS for the controllers of `c`, or none for plaintext ones.
fn client_tls(c: &Connection) -> Result<Option<sopa_channel::tls::ClientTls>> {
    let list = client::endpoints(&c.controller);
    if list.is_empty() {
        bail!("--controller {:?} names no controller", c.controller);
    }
    // Every address read before any is tried: a bad one is what was given, not a controller
    // away (which a script would try again).
    for e in &list {
        if e.starts_with("unix:") {
            continue;
        }
        let uri: tonic::transport::Uri = e
            .parse()
            .map_err(|err| anyhow::anyhow!("--controller {e}: not an address ({err})"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            bail!("--controller {e}: give https://HOST:PORT, http://HOST:PORT or unix:PATH");
        }
    }
    if list.iter().all(|e| e.starts_with("https://")) {
        let dir = c
            .certs
            .as_ref()
            .context("an https controller needs --certs DIR (or SOPA_CERTS)")?;
        return Ok(Some(tls::client_config(dir, &c.controller_name)?));
    }
    if list.iter().any(|e| e.starts_with("https://")) {
        bail!(
            "--controller {}: the controllers of a list must all be https:// (or all http://)",
            c.controller
        );
    }
    if c.certs.is_some() {
        bail!("--certs given for a plaintext controller address; use https://");
    }
    if list.iter().any(|e| e.starts_with("http://")) {
        eprintln!(
            "sopactl: plaintext to {}; if the controller serves TLS, use https:// with --certs",
            c.controller
        );
    }
    Ok(None)
}

/// Why one controller of the list did not answer.
enum Failure {
    Unreachable(String),
    Refused(Status),
}

/// Runs `request` against the controllers `--controller` lists, in turn, until one answers: a
/// replica that does not lead does not listen, a stopped one does not answer within
/// --timeout, and one that lost the leadership or could not store a change answers
/// UNAVAILABLE. Any other answer, success or refusal, is the answer. Trying a change again
/// elsewhere is safe: setting a state twice changes nothing the second time.
pub async fn call<T, F, Fut>(c: &Connection, what: &str, request: F) -> Result<T>
where
    F: Fn(ControlClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    // What was given (addresses, certificates) is refused: 78, but a file its permissions
    // refuse 77 (`exit::code` reads the cause in the chain).
    let tls =
        client_tls(c).map_err(|e| Coded::error(crate::exit::code(&e, CONFIG), format!("{e:#}")))?;
    let timeout = c.timeout.0;
    let mut tried = Vec::new();
    // A handshake that failed over a certificate is not cured by trying again.
    let mut certificate = None;
    for endpoint in client::endpoints(&c.controller) {
        let attempt = async {
            let channel = client::connect(endpoint, tls.as_ref())
                .await
                .map_err(Failure::Unreachable)?;
            let control = ControlClient::new(channel)
                .max_decoding_message_size(sopa_channel::proto::MAX_MESSAGE_BYTES);
            request(control).await.map_err(Failure::Refused)
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(reply)) => return Ok(reply.into_inner()),
            Ok(Err(Failure::Refused(s)))
                if !matches!(
                    s.code(),
                    // The transport's own failures (a handshake ended by an alert comes as
                    // any of these), not the controller's answer.
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                ) =>
            {
                let code = match s.code() {
                    tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => PRIVILEGES,
                    _ => REFUSED,
                };
                return Err(Coded::error(code, format!("{what}: {}", s.message())));
            }
            Ok(Err(Failure::Refused(s))) => {
                let why = format!("{endpoint}: {}", client::source_chain(&s));
                certificate = certificate.or(certificate_trouble(&why));
                tried.push(why);
            }
            Ok(Err(Failure::Unreachable(e))) => {
                certificate = certificate.or(certificate_trouble(&e));
                tried.push(e);
            }
            Err(_) => tried.push(format!(
                "{endpoint}: no answer within {} (a change it was given may or may not have been made; `sopactl status` shows)",
                c.timeout
            )),
        }
    }
    let tried = tried.join("; ");
    Err(match certificate {
        Some((code, advice)) => Coded::error(code, format!("{what}: {advice} ({tried})")),
        None => Coded::error(
            UNAVAILABLE,
            format!("{what}: no controller answered ({tried}); check that one runs and leads"),
        ),
    })
}

/// A TLS handshake that failed over a certificate, read off the error's text (rustls' own
/// words): ours refused theirs (the controller's certificate is not what --certs' ca.pem and
/// --controller-name expect: 78), or theirs refused ours (revoked, or of another CA: 77). The
/// latter only when its alert arrives: under TLS 1.3 the controller judges the client's
/// certificate after the client's side of the handshake is done, and the alert may reach it
/// as a connection closed instead, which is not told from a controller gone.
fn certificate_trouble(why: &str) -> Option<(u8, &'static str)> {
    if why.contains("invalid peer certificate") {
        Some((
            CONFIG,
            "the controller's certificate is not the one --certs' ca.pem and --controller-name expect",
        ))
    } else if why.contains("received fatal alert") {
        Some((
            PRIVILEGES,
            "the controller refused this certificate (revoked, or not of the fabric's CA)",
        ))
    } else {
        None
    }
}

fn word(s: State) -> &'static str {
    match s {
        State::Down => "down",
        State::Up => "up",
        State::Trust => "trusted",
        State::Untrust => "judged by the path meter",
    }
}

/// Why a change is made, kept in the controller's history; and whether a drain that leaves two
/// racks with no path between them is made anyway.
#[derive(clap::Args, Clone, Debug)]
pub struct Why {
    /// Why (shown by `sopactl history`).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Take it down even where two racks are then left with no path between them.
    #[arg(long)]
    pub force: bool,
}

pub fn link(c: &Connection, state: State, a: &str, b: &str, why: &Why) -> Result<()> {
    if let State::Trust | State::Untrust = state {
        let change = TrustChange {
            link: Some(LinkRef {
                a: a.into(),
                b: b.into(),
            }),
            trust: matches!(state, State::Trust),
            reason: why.reason.clone(),
        };
        return runtime().block_on(async {
            let reply = call(c, &format!("link {a} {b}"), |mut control| {
                let change = change.clone();
                async move { control.set_trust(change).await }
            })
            .await?;
            let drain = if reply.changed {
                ", its suspicion ended"
            } else {
                ""
            };
            println!(
                "link {a}:{b} now {}{drain} (version {})",
                word(state),
                reply.version
            );
            Ok(())
        });
    }
    let change = LinkChange {
        link: Some(LinkRef {
            a: a.into(),
            b: b.into(),
        }),
        down: matches!(state, State::Down),
        reason: why.reason.clone(),
        force: why.force,
    };
    runtime().block_on(async {
        let reply = call(c, &format!("link {a} {b}"), |mut control| {
            let change = change.clone();
            async move { control.set_link(change).await }
        })
        .await?;
        let what = if reply.changed { "now" } else { "already" };
        println!(
            "link {a}:{b} {what} {} (version {})",
            word(state),
            reply.version
        );
        Ok(())
    })
}

pub fn switch(c: &Connection, state: State, name: &str, why: &Why) -> Result<()> {
    if let State::Trust | State::Untrust = state {
        return Err(Coded::error(
            CONFIG,
            format!(
                "sopactl switch {name}: a switch is only taken down or up; trust applies to links"
            ),
        ));
    }
    let change = SwitchChange {
        name: name.into(),
        down: matches!(state, State::Down),
        reason: why.reason.clone(),
        force: why.force,
    };
    runtime().block_on(async {
        let reply = call(c, &format!("switch {name}"), |mut control| {
            let change = change.clone();
            async move { control.set_switch(change).await }
        })
        .await?;
        let what = if reply.changed { "now" } else { "already" };
        println!(
            "switch {name} {what} {} (version {})",
            word(state),
            reply.version
        );
        Ok(())
    })
}

pub fn history(c: &Connection, limit: u32, json: bool) -> Result<()> {
    runtime().block_on(async {
        let h = call(c, "history", |mut control| async move {
            control
                .history(sopa_channel::proto::HistoryRequest { limit })
                .await
        })
        .await?;
        if json {
            let entries: Vec<_> = h
                .entries
                .iter()
                .map(|e| {
                    serde_json::json!({"version": e.version, "unix_ms": e.unix_ms, "who": e.who, "what": e.what, "reason": e.reason})
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&entries)?);
            return Ok(());
        }
        println!("{:>8}  {:<24} {:<36} {:<28} why", "version", "when (UTC)", "who", "what");
        for e in &h.entries {
            println!(
                "{:>8}  {:<24} {:<36} {:<28} {}",
                e.version,
                utc(e.unix_ms),
                e.who,
                e.what,
                e.reason
            );
        }
        Ok(())
    })
}

/// `YYYY-MM-DD HH:MM:SS.mmm` of Unix milliseconds, in UTC.
fn utc(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{ms:03}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

pub fn status(c: &Connection, json: bool) -> Result<()> {
    runtime().block_on(async {
        let s = call(c, "status", |mut control| async move {
            control.status(StatusRequest {}).await
        })
        .await?;
        if json {
            let agents: Vec<_> = s
                .agents
                .iter()
                .map(|a| {
                    serde_json::json!({
                        "node": a.node, "role": role(a.role), "connected": a.connected,
                        "applied_version": a.applied_version, "last_ack": a.last_ack,
                        "last_nack": a.last_nack, "last_error": a.last_error, "agent_version": a.agent_version,
                        "fallbacks": a.fallbacks,
                        "lagging_version": (a.lagging_version != 0).then_some(a.lagging_version),
                    })
                })
                .collect();
            let down: Vec<String> = s.down_links.iter().map(|l| format!("{}:{}", l.a, l.b)).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "leader": s.leader, "store": s.store, "changes_not_stored": s.changes_not_stored,
                    "epoch": s.epoch, "version": s.version, "topology": serde_json::from_str::<serde_json::Value>(&s.topology).unwrap_or_default(),
                    "down_links": down, "down_switches": s.down_switches, "agents": agents,
                    "drained_links": s.drained_links.iter().map(|l| format!("{}:{}", l.a, l.b)).collect::<Vec<_>>(),
                    "held_links": s.held_links.iter().filter_map(|h| h.link.as_ref().map(|l| serde_json::json!({"link": format!("{}:{}", l.a, l.b), "remaining_ms": h.remaining_ms}))).collect::<Vec<_>>(),
                    "suspect_links": s.suspect_links.iter().filter_map(|x| x.link.as_ref().map(|l| serde_json::json!({"link": format!("{}:{}", l.a, l.b), "loss": x.loss, "lost": x.lost, "sent": x.sent, "remaining_ms": x.remaining_ms, "strikes": x.strikes}))).collect::<Vec<_>>(),
                    "trusted_links": s.trusted_links.iter().map(|l| format!("{}:{}", l.a, l.b)).collect::<Vec<_>>(),
                    "link_loss": s.link_loss.iter().filter_map(|x| x.link.as_ref().map(|l| serde_json::json!({"from": l.a, "to": l.b, "sent": x.sent, "lost": x.lost, "load": x.load, "over_load": x.over_load}))).collect::<Vec<_>>(),
                    "refusals": s.refusals.iter().map(|r| (r.reason.clone(), serde_json::Value::from(r.count))).collect::<serde_json::Map<_, _>>(),
                    "miscabled": s.miscabled.iter().map(|m| serde_json::json!({"at": m.at, "seen": m.seen, "expected": m.expected, "link": m.link.as_ref().map(|l| format!("{}:{}", l.a, l.b)), "what": sopa_controller::cabling::describe(m)})).collect::<Vec<_>>(),
                    "neighbours": s.neighbours.iter().map(|n| serde_json::json!({"node": n.node, "role": role(n.role), "addresses": n.addresses, "ports": n.ports.iter().map(|p| serde_json::json!({"port": p.port, "chassis": p.chassis, "remote_port": p.remote_port})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
                    "meter_hosts": s.meter_hosts.iter().map(|h| serde_json::json!({"host": h.host, "reason": h.reason, "detail": h.detail, "reports": h.reports, "last_ms_ago": h.last_ms_ago})).collect::<Vec<_>>(),
                }))?
            );
            return Ok(());
        }
        match s.leader.as_str() {
            "" => println!("controller, state in {}", s.store),
            leader => println!("controller replica {leader} (leads), state in {}", s.store),
        }
        if s.changes_not_stored > 0 {
            println!(
                "{} changes refused since the start because they could not be stored: see the controller's log",
                s.changes_not_stored
            );
        }
        println!("controller epoch {:x}, version {}, topology {}", s.epoch, s.version, s.topology);
        let drained: Vec<(&str, &str)> = s.drained_links.iter().map(|l| (l.a.as_str(), l.b.as_str())).collect();
        let down: Vec<String> = s
            .down_links
            .iter()
            .map(|l| {
                let suspect = s.suspect_links.iter().filter_map(|x| x.link.as_ref()).any(|x| x.a == l.a && x.b == l.b);
                let miscabled = s.miscabled.iter().filter_map(|m| m.link.as_ref()).any(|x| x.a == l.a && x.b == l.b);
                let why = if drained.contains(&(l.a.as_str(), l.b.as_str())) {
                    "drained"
                } else if miscabled {
                    "miscabled"
                } else if suspect {
                    "suspect"
                } else {
                    "reported"
                };
                format!("{}:{} ({why})", l.a, l.b)
            })
            .collect();
        println!(
            "down: links [{}], switches [{}]",
            down.join(", "),
            s.down_switches.join(", ")
        );
        for m in &s.miscabled {
            println!("miscabled: {}", sopa_controller::cabling::describe(m));
        }
        for h in &s.held_links {
            if let Some(l) = &h.link {
                println!("flapping: {}:{} held down for {} ms more", l.a, l.b, h.remaining_ms);
            }
        }
        for x in &s.suspect_links {
            if let Some(l) = &x.link {
                println!(
                    "suspect: {}:{} lost {:.2}% ({} of {} metered packets), drained for {} ms more (strike {}); `sopactl link trust {} {}` ends it",
                    l.a, l.b, 100.0 * x.loss, x.lost, x.sent, x.remaining_ms, x.strikes, l.a, l.b
                );
            }
        }
        if !s.trusted_links.is_empty() {
            let t: Vec<String> = s.trusted_links.iter().map(|l| format!("{}:{}", l.a, l.b)).collect();
            println!("trusted (never drained by the path meter): {}", t.join(", "));
        }
        let lossy: Vec<String> = s
            .link_loss
            .iter()
            .filter(|x| x.lost > 0)
            .take(8)
            .filter_map(|x| {
                x.link.as_ref().map(|l| {
                    let judged = if x.over_load { format!(" (load {:.0}%: not judged)", 100.0 * x.load) } else { String::new() };
                    format!("{}->{} {:.2}%{judged}", l.a, l.b, 100.0 * x.lost as f64 / x.sent.max(1) as f64)
                })
            })
            .collect();
        if !lossy.is_empty() {
            println!("path meter, worst links now: {}", lossy.join(", "));
        }
        for h in &s.meter_hosts {
            let what = if h.reason == "inconsistent" { "set aside (inconsistent)" } else { "refused" };
            println!(
                "path meter: {}'s reports {what}: {} ({} reports, the last {} ms ago)",
                h.host, h.detail, h.reports, h.last_ms_ago
            );
        }
        if !s.refusals.is_empty() {
            let r: Vec<String> = s.refusals.iter().map(|r| format!("{} {}", r.reason, r.count)).collect();
            println!("refused clients: {}", r.join(", "));
        }
        println!("{:<24} {:<7} {:<13} {:>8} {:>8} {:>9}  last error", "agent", "role", "state", "applied", "ack", "nack");
        for a in &s.agents {
            let state = match (a.connected, a.lagging_version) {
                (false, _) => "disconnected",
                (true, 0) => "connected",
                (true, _) => "lagging",
            };
            println!(
                "{:<24} {:<7} {:<13} {:>8} {:>8} {:>9}  {}",
                a.node, role(a.role), state, a.applied_version, a.last_ack, a.last_nack, a.last_error
            );
        }
        for a in s.agents.iter().filter(|a| !a.fallbacks.is_empty()) {
            println!("{} runs without: {}", a.node, a.fallbacks.join("; "));
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
        CertsCommand::Init { dir, days } => {
            for path in certs::init(&dir, days)? {
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
        CertsCommand::Revoke {
            conn,
            serial,
            reason,
        } => runtime().block_on(async {
            let request = sopa_channel::proto::RevokeRequest {
                serial: serial.clone(),
                reason,
            };
            call(&conn, &format!("certs revoke {serial}"), |mut control| {
                let request = request.clone();
                async move { control.revoke(request).await }
            })
            .await?;
            println!(
                "certificate {serial} revoked: refused at its next handshake by every replica"
            );
            Ok(())
        }),
    }
}
