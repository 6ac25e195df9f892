//! `cargo xtask demo`: A - R - B in namespaces (R a plain Linux router), agents on A and B in
//! `sopa` mode, one TCP transfer, and what each point of the path saw.

use anyhow::{Context as _, Result, bail};
use sopa_testbed::{
    agent::Agent,
    arb::{A_PREFIX, Arb, B_PREFIX},
    capture::Capture,
    traffic::{SendOptions, tcp_transfer},
};

use crate::setup;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// The small demo instead: A - R - B with a capture of the option on the wire.
    #[arg(long, conflicts_with = "fabric")]
    arb: bool,
    /// Your own fabric: an inventory file (`sopactl fabric generate`, `sopactl fabric check`);
    /// the first host of each rack sends to the next rack's, in sopa and in ECMP.
    #[arg(long, value_name = "FILE")]
    fabric: Option<std::path::PathBuf>,
    /// Fabric demo: link rate in Mbit/s.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Fabric demo: MB per flow.
    #[arg(long, default_value_t = 10)]
    flow_mb: u64,
    /// MiB to send from A to B.
    #[arg(long, default_value_t = 200)]
    mib: u64,
    /// Candidate paths in A's and B's path tables.
    #[arg(long, default_value_t = 3)]
    paths: u8,
    /// Path selection of both agents: sopa, rps, ecmp or off.
    #[arg(long, default_value = "sopa")]
    mode: String,
    /// packet (gso_max_segs 1: the capture at R shows the paths cycle packet by packet),
    /// flowcell:N (the agent's own default is flowcell:4) or burst.
    #[arg(long, default_value = "packet")]
    granularity: String,
    /// Fabric demo: how hosts carry the path, ipv4-option (switches run tc_forward) or srv6
    /// (switches are Linux SRv6 routers: the kernel's seg6local End consumes each uSID where the
    /// kernel has it, else the switch agent's tc_forward).
    #[arg(long, default_value = "ipv4-option")]
    encoding: sopa_topology::srv6::Encoding,
    /// Run the binaries the SOPA_*_BIN variables name instead of building them in release (the
    /// test runner's smoke pass, which built them already).
    #[arg(long, hide = true)]
    prebuilt: bool,
}

/// Builds the agent, the controller, sopactl and sopa-traffic in release and points the
/// testbed at them.
pub fn build_release() -> Result<()> {
    setup::build_bins(true).map(drop)
}

fn step(msg: &str) {
    eprintln!("==> {msg}");
}

pub fn run(args: &DemoArgs) -> Result<()> {
    if !setup::is_root() {
        bail!("the demo creates network namespaces and loads eBPF programs: run as root");
    }
    if let Some(file) = &args.fabric {
        return crate::inventory_demo::run(file, args.rate, args.flow_mb, args.encoding);
    }
    if !args.arb {
        return crate::fabric_demo::run(args.rate, args.flow_mb, args.encoding);
    }
    if args.encoding != sopa_topology::srv6::Encoding::Ipv4Option {
        bail!(
            "--arb shows the option on the wire; SRv6 has the fabric demo: `cargo xtask demo \
             --encoding srv6` (and A - R - B in tests/tests/host_srv6.rs)"
        );
    }
    if args.paths == 0 || args.paths > 254 {
        bail!("--paths {} must be from 1 to 254", args.paths);
    }
    if !args.prebuilt {
        step("building the agent (release)");
        build_release()?;
    }

    step("building A - R - B in network namespaces (R: a plain Linux router)");
    let arb = Arb::new("demo").context("building the namespaces")?;
    // B's reordering is reported below: measured for the demo (off by default, for its cost).
    let flags = [
        "--mode",
        &args.mode,
        "--granularity",
        &args.granularity,
        "--measure-reordering",
    ];
    step(&format!(
        "starting agents on A and B: mode {}, {} paths, granularity {}",
        args.mode, args.paths, args.granularity
    ));
    let agent_a = Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, args.paths),
        &flags,
    )
    .context("agent on A")?;
    let agent_b = Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::path_table(A_PREFIX, args.paths),
        &flags,
    )
    .context("agent on B")?;

    step(&format!(
        "capturing at R and at B; sending {} MiB from A to B (cubic, DF)",
        args.mib
    ));
    let at_r = Capture::start(&arb.r, &arb.r_a_if)?;
    let at_b = Capture::start(&arb.b, &arb.b_if)?;
    let transfer = tcp_transfer(
        &arb.a,
        &arb.b,
        arb.b_addr,
        5001,
        args.mib << 20,
        &SendOptions::default(),
    )
    .context("the transfer")?;
    let at_r = at_r.finish()?;
    let at_b = at_b.finish()?;
    let status_a = agent_a.status()?;
    let status_b = agent_b.status()?;

    let from_a = |frame: &Vec<u8>| -> Option<Vec<u8>> {
        let ip = ipv4_source_and_options(frame)?;
        (ip.0 == arb.a_addr.octets()).then_some(ip.1)
    };
    let r_frames: Vec<Vec<u8>> = at_r
        .frames
        .iter()
        .filter_map(from_a)
        .map(|o| sopa_testbed::capture::unmarked(&o))
        .collect();
    let r_with_option = r_frames.iter().filter(|o| o.first() == Some(&0x9E)).count();
    let mut per_hop = std::collections::BTreeMap::<u8, u64>::new();
    for o in r_frames.iter().filter(|o| o.len() == 4 && o[0] == 0x9E) {
        *per_hop.entry(o[2]).or_default() += 1;
    }
    let b_frames: Vec<Vec<u8>> = at_b.frames.iter().filter_map(from_a).collect();
    let b_with_option = b_frames.iter().filter(|o| !o.is_empty()).count();

    println!();
    println!(
        "SOPA demo: A -> R -> B, mode {}, {} paths, granularity {}",
        args.mode, args.paths, args.granularity
    );
    println!("{:-<78}", "");
    println!(
        "{:<14} {} MiB, digest {}, {:.2} s, {:.0} Mbit/s",
        "transfer",
        args.mib,
        if transfer.intact() {
            "equal"
        } else {
            "DIFFERENT"
        },
        transfer.seconds,
        transfer.mbit_per_s()
    );
    println!(
        "{:<14} {} IPv4 packets from A, {} with option 0x9E ({:.1}%)",
        "at R (wire)",
        r_frames.len(),
        r_with_option,
        100.0 * r_with_option as f64 / r_frames.len().max(1) as f64
    );
    let hops: Vec<String> = per_hop
        .iter()
        .map(|(h, n)| format!("hop0={h}: {n}"))
        .collect();
    println!("{:<14} {}", "  per path", hops.join(", "));
    println!(
        "{:<14} {} packets from A reached B's stack, {} of them with an option",
        "at B (stack)",
        b_frames.len(),
        b_with_option
    );
    println!(
        "{:<14} stamped {}, hop0 counters {}",
        "agent A", status_a["stamp"]["stamped"], status_a["hop0"]
    );
    println!(
        "{:<14} stripped {}, reordered {:.3}% of TCP data packets",
        "agent B",
        status_b["strip"]["stripped"],
        100.0 * status_b["reordered_fraction"].as_f64().unwrap_or(0.0)
    );
    if at_r.dropped + at_b.dropped > 0 {
        println!(
            "(the captures missed {} frames)",
            at_r.dropped + at_b.dropped
        );
    }
    println!("{:-<78}", "");
    println!("R is a plain router: it forwards by destination and ignores the option.");
    step("stopping the agents (they detach and restore) and removing the namespaces");
    let (a, b) = (agent_a.stop(), agent_b.stop());
    if a != Some(0) || b != Some(0) {
        bail!("an agent did not exit cleanly: A {a:?}, B {b:?}");
    }
    if !transfer.intact() {
        bail!("the transfer arrived corrupted");
    }
    Ok(())
}

/// (source address, IPv4 options) of an IPv4 frame.
fn ipv4_source_and_options(frame: &[u8]) -> Option<([u8; 4], Vec<u8>)> {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] || frame[14] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    let options = frame.get(34..14 + ihl)?.to_vec();
    Some(([frame[26], frame[27], frame[28], frame[29]], options))
}
