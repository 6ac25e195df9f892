//! `cargo xtask testbed`: a fabric in namespaces to explore by hand.
//!
//! `up` builds it and leaves it running, recording what it made in a state file; `exec`, `fail`,
//! `restore`, `status` use that file; `down` removes everything; `clean` also removes what a
//! killed run left (namespaces, pins and state of testbed names).

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
use sopa_testbed::fabric::{Detached, Fabric, FabricOptions, LinkQdisc};
use sopa_topology::{srv6::Encoding, topology::TopologySpec};

use crate::{demo::build_release, setup};

#[derive(Subcommand)]
pub enum TestbedCommand {
    /// Build a fabric and leave it running.
    Up {
        /// fat-tree:K or modric:MxN (q=1, x=2, y=2 unless given as modric:MxN:q:x:y).
        #[arg(long, default_value = "fat-tree:4", conflicts_with = "fabric")]
        topo: String,
        /// An inventory file: the operator's own fabric, by its names and addresses
        /// (`sopactl fabric check FILE` says what it refuses).
        #[arg(long, value_name = "FILE")]
        fabric: Option<PathBuf>,
        /// Link rate in Mbit/s (0: unshaped).
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Host path-selection mode: sopa, rps, ecmp or off (off: the switches' kernel ECMP).
        #[arg(long, default_value = "sopa")]
        mode: String,
        /// Drop-tail queue per link direction, in full-size packets.
        #[arg(long, default_value_t = 100)]
        queue: u32,
        /// Controller replicas: 1 (a state file), or 2 to 5 on a three-member etcd cluster,
        /// one elected leader (kill it: another takes over).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
        controllers: u8,
        /// How hosts carry the path: ipv4-option (switches run tc_forward) or srv6 (switches
        /// are Linux SRv6 routers, their uSIDs consumed by the kernel's seg6local End or, without
        /// it, by tc_forward; links at 1548).
        #[arg(long, default_value = "ipv4-option")]
        encoding: Encoding,
        /// How shaped links serialize: htb, or tbf with a one-packet bucket.
        #[arg(long, default_value = "htb")]
        qdisc: LinkQdisc,
        /// SRv6: who consumes each switch's uSID (the switch agents' --usid): auto (the
        /// kernel's seg6local End where the kernel has it, tc_forward otherwise), kernel, ebpf.
        #[arg(long, default_value = "auto", value_parser = ["auto", "kernel", "ebpf"])]
        usid: String,
    },
    /// Run a command in a node's namespace: `testbed exec h0 -- ping 10.1.0.2`.
    Exec {
        node: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Fail a link (`fail a0 c0`) or a whole switch (`fail a0`) for real, under whatever
    /// traffic runs: the interfaces set down, so the link carries nothing either way and the
    /// switches' agents see their ports lose the carrier (they repair locally at once, and report
    /// it to the controller). With `--controller-only`, only the controller's state changes
    /// (`sopactl link down`: the hosts move off the link, the link itself still works).
    Fail {
        a: String,
        b: Option<String>,
        #[arg(long)]
        controller_only: bool,
    },
    /// Bring back what `fail` took down (same arguments).
    Restore {
        a: String,
        b: Option<String>,
        #[arg(long)]
        controller_only: bool,
    },
    /// The controller's view, and a node's agent status with `--node`.
    Status {
        #[arg(long)]
        node: Option<String>,
    },
    /// Stop everything and delete the namespaces.
    Down,
    /// Remove leftovers of killed runs (namespaces, pins, state named like the testbed's).
    Clean,
}

fn state_file() -> PathBuf {
    PathBuf::from(sopa_testbed::leftovers::TESTBED_STATE)
}

fn load() -> Result<Detached> {
    let path = state_file();
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "no testbed is up ({}); start one with `cargo xtask testbed up`",
            path.display()
        )
    })?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a testbed state", path.display()))
}

pub fn parse_topo(s: &str) -> Result<TopologySpec> {
    sopa_testbed::fabric::parse_topo(s).map_err(anyhow::Error::msg)
}

fn status_cmd(program: &std::path::Path, args: &[&str]) -> Result<()> {
    let st = std::process::Command::new(program).args(args).status()?;
    if !st.success() {
        bail!("{} {} failed", program.display(), args.join(" "));
    }
    Ok(())
}

pub fn run(cmd: TestbedCommand) -> Result<()> {
    if !setup::is_root() {
        bail!("the testbed creates network namespaces: run as root");
    }
    match cmd {
        TestbedCommand::Up {
            topo,
            fabric,
            rate,
            mode,
            queue,
            controllers,
            encoding,
            qdisc,
            usid,
        } => {
            if state_file().exists() {
                bail!(
                    "a testbed is already up ({}); `cargo xtask testbed down` first",
                    state_file().display()
                );
            }
            let spec = match &fabric {
                Some(file) => parse_topo(&file.display().to_string())?,
                None => parse_topo(&topo)?,
            };
            build_release()?;
            let opts = FabricOptions {
                rate_mbit: (rate > 0).then_some(rate),
                host_args: vec!["--mode".into(), mode.clone()],
                queue_packets: queue,
                ideal: false,
                controllers: usize::from(controllers),
                encoding,
                link_qdisc: qdisc,
                switch_args: vec!["--usid".into(), usid.clone()],
            };
            let topo = sopa_topology::Topology::build(&spec)?.name();
            eprintln!(
                "==> building {topo} at {} in namespaces",
                if rate > 0 {
                    format!("{rate} Mbit/s")
                } else {
                    "full speed".into()
                }
            );
            let mut fabric = Fabric::build(&spec, &opts)?;
            eprintln!("==> starting the controller and the agents");
            fabric.start(&opts)?;
            fabric.wait_ready(std::time::Duration::from_secs(120))?;
            let d = fabric.detach();
            std::fs::create_dir_all(state_file().parent().expect("a folder"))?;
            std::fs::write(state_file(), serde_json::to_vec_pretty(&d)?)?;
            println!(
                "{} is up: {} namespaces, hosts in {mode} mode, paths as {encoding}.",
                d.topology,
                d.namespaces.len()
            );
            println!("  cargo xtask testbed exec h0 -- ping -c 3 10.1.0.2");
            println!(
                "  cargo xtask testbed fail a0 c0      # a link cut; `fail a0` a switch; and: restore, status [--node h0], down"
            );
            Ok(())
        }
        TestbedCommand::Exec { node, command } => {
            let d = load()?;
            let ns = d
                .namespaces
                .get(&node)
                .with_context(|| format!("no node {node:?} in this testbed"))?;
            let st = std::process::Command::new("ip")
                .args(["netns", "exec", ns])
                .args(&command)
                .status()?;
            std::process::exit(st.code().unwrap_or(1));
        }
        TestbedCommand::Fail {
            a,
            b,
            controller_only,
        } => fail(&a, b.as_deref(), controller_only, false),
        TestbedCommand::Restore {
            a,
            b,
            controller_only,
        } => fail(&a, b.as_deref(), controller_only, true),
        TestbedCommand::Status { node } => {
            let d = load()?;
            match node {
                Some(n) => {
                    let agent = d
                        .agents
                        .get(&n)
                        .with_context(|| format!("no node {n:?} in this testbed"))?;
                    status_cmd(
                        &sopa_testbed::bins_release("sopa-agent"),
                        &["status", "--node", agent],
                    )
                }
                None => status_cmd(
                    &sopa_testbed::bins_release("sopactl"),
                    &["status", "--controller", &d.controller_address()],
                ),
            }
        }
        TestbedCommand::Down => {
            let d = load()?;
            d.teardown();
            std::fs::remove_file(state_file())?;
            println!("{} is down", d.topology);
            Ok(())
        }
        TestbedCommand::Clean => clean(),
    }
}

/// `fail` and `restore`: a link (`b` given) or switch `a`, for real or in the controller only.
fn fail(a: &str, b: Option<&str>, controller_only: bool, restore: bool) -> Result<()> {
    let d = load()?;
    let state = if restore { "up" } else { "down" };
    if controller_only {
        let args: Vec<&str> = match b {
            Some(b) => vec!["link", state, a, b],
            None => vec!["switch", state, a],
        };
        let address = d.controller_address();
        let mut args = args;
        args.extend(["--controller", &address]);
        return status_cmd(&sopa_testbed::bins_release("sopactl"), &args);
    }
    let ends = match b {
        Some(b) => vec![d.link_end(a, b).with_context(|| {
            format!("no link between switches {a} and {b} in this testbed (host links are not failed: a host has one)")
        })?],
        None => {
            let ends = d.switch_ends(a);
            if ends.is_empty() {
                bail!("{a} is not a switch of this testbed");
            }
            ends
        }
    };
    for (ns, iface) in &ends {
        let st = std::process::Command::new("ip")
            .args(["-n", ns, "link", "set", iface, state])
            .status()?;
        if !st.success() {
            bail!("ip -n {ns} link set {iface} {state} failed");
        }
    }
    let what = b.map_or_else(|| format!("switch {a}"), |b| format!("link {a}:{b}"));
    println!(
        "{what} {}: {} interface(s) set {state}; `cargo xtask testbed status` shows the controller's view",
        if restore { "restored" } else { "failed" },
        ends.len()
    );
    Ok(())
}

fn clean() -> Result<()> {
    if let Ok(d) = load() {
        d.teardown();
        let _ = std::fs::remove_file(state_file());
    }
    let r = sopa_testbed::leftovers::clean_except(None)?;
    println!(
        "removed {} testbed namespaces ({} processes in them) and {} pin, run and temporary folders",
        r.namespaces, r.processes, r.folders
    );
    Ok(())
}
