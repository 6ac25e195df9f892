//! `cargo xtask demo`: the SOPA paper's section 4.2 experiment on a Fat-Tree k=4 of namespaces.
//! Flows 0->4, 0->5, 1->4, 1->5 (10 MB each, all at once) over shaped links, first with the hosts
//! in `sopa` mode (per-flow round-robin source routing), then in `off` mode (no option: the
//! switches' own kernel ECMP). Prints per-flow throughput and packets per core path.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sopa_testbed::{
    experiment,
    fabric::{Fabric, FabricOptions},
    traffic::Transfer,
};
use sopa_topology::{srv6::Encoding, topology::TopologySpec};

use crate::demo::build_release;

/// Packets through each of the four core paths of pod 0's uplinks: (aggregation, core). With
/// the option, what `tc_forward` redirected; in SRv6 (no program on a switch), what left each
/// core port, as the interfaces counted it.
fn core_paths(f: &Fabric) -> Result<[u64; 4]> {
    let mut out = [0; 4];
    for (i, agg) in ["a0", "a1"].iter().enumerate() {
        let per_port: Vec<u64> = match f.encoding {
            Encoding::Ipv4Option => {
                let s = f.switch_status(agg)?;
                (0..2)
                    .map(|j| s["uplinks"][j].as_u64().unwrap_or(0))
                    .collect()
            }
            Encoding::Srv6 | Encoding::Entropy => {
                f.hop_ports_tx(agg, "10.1.0.2".parse().expect("an address"))
            }
        };
        for (j, n) in per_port.into_iter().take(2).enumerate() {
            out[2 * i + j] = n;
        }
    }
    Ok(out)
}

/// Every host agent of `f` to `mode`, at run time (`sopa-agent mode`).
pub fn set_mode(f: &Fabric, mode: &str) -> Result<()> {
    for host in f.hosts.values() {
        let out = std::process::Command::new(sopa_testbed::bins::sopa_agent())
            .args(["mode", "--node", &host.node, mode])
            .output()?;
        if !out.status.success() {
            bail!(
                "switching {} to {mode}: {}",
                host.node,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// A progress bar of `steps`, its first step done: the binaries built in release.
pub fn started(steps: u64) -> Result<ProgressBar> {
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg}").expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar.set_message("building the agents and the controller (release)");
    build_release()?;
    bar.inc(1);
    Ok(bar)
}

pub fn run(rate: u32, mb: u64, encoding: Encoding) -> Result<()> {
    let bar = started(7)?;
    bar.set_message(format!(
        "building a Fat-Tree k=4 in namespaces: 36 nodes, 48 links at {rate} Mbit/s, paths as {encoding}"
    ));
    let opts = FabricOptions {
        rate_mbit: Some(rate),
        encoding,
        ..FabricOptions::default()
    };
    let mut f =
        Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).context("building the fabric")?;
    bar.inc(1);
    bar.set_message(if encoding == Encoding::Entropy {
        "starting the controller and 16 host agents (the switches are plain hashing routers)"
    } else {
        "starting the controller, 20 switch agents and 16 host agents"
    });
    f.start(&opts).context("starting the agents")?;
    f.wait_ready(Duration::from_secs(90))
        .context("waiting for every agent")?;
    // In the entropy encoding each host first finds a label per path to every other host.
    let discovery = if encoding == Encoding::Entropy {
        bar.set_message("every host probing for the labels of its paths");
        let all = sopa_testbed::routers::discovered(&f, Duration::from_secs(90))
            .context("waiting for every host's label discovery")?;
        let rows: Vec<&serde_json::Value> = all
            .iter()
            .flat_map(|(_, e)| e["destinations"].as_array().into_iter().flatten())
            .collect();
        let sum = |k: &str| rows.iter().map(|d| d[k].as_u64().unwrap_or(0)).sum::<u64>();
        let incomplete: usize = all
            .iter()
            .map(|(_, e)| e["incomplete"].as_array().map_or(0, Vec::len))
            .sum();
        Some((rows.len(), sum("probes"), sum("millis"), incomplete))
    } else {
        None
    };
    bar.inc(1);
    // The entropy encoding adds its blind baseline: round robin over random labels.
    let modes: &[&str] = if encoding == Encoding::Entropy {
        &["sopa", "rr-blind", "off"]
    } else {
        &["sopa", "off"]
    };
    bar.set_length(3 + 2 * modes.len() as u64);
    let mut rows = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        bar.set_message(format!("hosts in {mode} mode"));
        match *mode {
            "rr-blind" => {
                set_mode(&f, "sopa")?;
                experiment::set_labels(&f, "blind")?;
            }
            m => {
                experiment::set_labels(&f, "discovered")?;
                set_mode(&f, m)?;
            }
        }
        bar.inc(1);
        bar.set_message(format!(
            "{mode}: flows 0->4, 0->5, 1->4, 1->5, {mb} MB each"
        ));
        let flows = experiment::flows(&f, "sec4.2", 0);
        let (p0, b0) = (core_paths(&f)?, experiment::core_link_bytes(&f, "sec4.2"));
        let transfers = experiment::run_round(&f, &flows, mb, 7500 + 10 * i as u16, false);
        let (p1, b1) = (core_paths(&f)?, experiment::core_link_bytes(&f, "sec4.2"));
        if let Some(t) = transfers.iter().find(|t| !t.intact()) {
            bail!("a flow arrived corrupted ({} bytes)", t.bytes);
        }
        let packets: Vec<u64> = p1.iter().zip(p0).map(|(a, b)| a - b).collect();
        let bytes: Vec<u64> = b1.iter().zip(b0).map(|(a, b)| a - b).collect();
        rows.push((mode.to_string(), transfers, packets, bytes));
        bar.inc(1);
    }
    bar.finish_and_clear();

    println!();
    println!(
        "SOPA paper section 4.2 on a Fat-Tree k=4 of namespaces, links at {rate} Mbit/s, {mb} MB per flow (cubic), paths as {encoding}"
    );
    println!("{:-<98}", "");
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>9} {:>8}   {:<40}",
        "mode", "0->4", "0->5", "1->4", "1->5", "mean", "pod 0 core links a0c0 a0c1 a1c2 a1c3 (MB)"
    );
    for (mode, transfers, packets, bytes) in &rows {
        let mbps: Vec<f64> = transfers.iter().map(Transfer::mbit_per_s).collect();
        let mean = mbps.iter().sum::<f64>() / mbps.len() as f64;
        let mb: Vec<String> = bytes
            .iter()
            .map(|b| format!("{:.1}", *b as f64 / 1e6))
            .collect();
        let label = if mode == "off" { "ecmp" } else { mode.as_str() };
        println!(
            "{:<8} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1}   {}",
            label,
            mbps[0],
            mbps[1],
            mbps[2],
            mbps[3],
            mean,
            mb.join("  ")
        );
        if mode != "off" {
            let how = match encoding {
                Encoding::Ipv4Option => "source-routed per core path (tc_forward's counters)",
                Encoding::Srv6 => "out of each core port (uSID lists; the interfaces' counters)",
                Encoding::Entropy => {
                    "out of each core port (flow labels; the interfaces' counters)"
                }
            };
            println!("{:<8} packets {how}: {packets:?}", "");
        }
    }
    println!("{:-<98}", "");
    let (payload, wire) = match encoding {
        Encoding::Ipv4Option => (1444.0, 1514.0),
        Encoding::Srv6 | Encoding::Entropy => (1448.0, 1554.0),
    };
    println!(
        "throughput in Mbit/s per flow; each host's uplink carries two flows, so the fair share is about {:.0} (a flow's ceiling is {payload}/{wire} of the link with {encoding}).",
        f64::from(rate) * payload / wire / 2.0
    );
    if encoding == Encoding::Srv6 {
        // The switch agents' `--usid auto`: the kernel's End route where it has one.
        let consumer = if sopa_testbed::kernel::has_seg6local() {
            "the kernel's seg6local End (NEXT-C-SID) consumes each switch's uSID"
        } else {
            "this kernel has no seg6local (CONFIG_IPV6_SEG6_LWTUNNEL), so each switch's tc_forward consumes its own uSID and the kernel routes the next"
        };
        println!(
            "srv6: each packet leaves its host inside an outer IPv6 header whose destination is the path as a uSID list; the switches are Linux SRv6 routers: {consumer}."
        );
    }
    if let Some((pairs, probes, millis, incomplete)) = discovery {
        println!(
            "entropy: the switches are plain Linux routers hashing each packet's header (IPv6 with its flow label), each with its own seed, no agent and no program. Every host probed every other rack's hosts for one flow label per path ({probes} probes, {:.1} per destination host, {:.0} ms each; {incomplete} destinations short of paths); sopa sends each flow round robin over those labels. rr-blind: round robin over as many random labels as paths, no probing, so the hash puts several on one path and none on another.",
            probes as f64 / pairs.max(1) as f64,
            millis as f64 / pairs.max(1) as f64
        );
    }
    println!(
        "sopa: every flow round-robins its packets over the 4 core paths; ecmp: the hosts stamp nothing (mode off) and the switches' kernel multipath picks one path per flow."
    );
    drop(f);
    Ok(())
}
