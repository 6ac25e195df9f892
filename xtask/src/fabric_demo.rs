//! `cargo xtask demo`: the SOPA paper's section 4.2 experiment on a Fat-Tree k=4 of namespaces.
//! Flows 0->4, 0->5, 1->4, 1->5 (10 MB each, all at once) over shaped links, first with the hosts
//! in `sopa` mode (per-flow round-robin source routing), then in `off` mode (no option: the
//! switches' own kernel ECMP). Prints per-flow throughput and packets per core path.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    traffic::{SendOptions, Transfer, tcp_transfer},
};
use sopa_topology::topology::TopologySpec;

use crate::demo::build_release;

const FLOWS: [(&str, &str); 4] = [("h0", "h4"), ("h0", "h5"), ("h1", "h4"), ("h1", "h5")];

/// Packets through each of the four core paths of pod 0's uplinks: (aggregation, core).
fn core_paths(f: &Fabric) -> Result<[u64; 4]> {
    let mut out = [0; 4];
    for (i, agg) in ["a0", "a1"].iter().enumerate() {
        let s = f.switch_status(agg)?;
        for j in 0..2 {
            out[2 * i + j] = s["uplinks"][j].as_u64().unwrap_or(0);
        }
    }
    Ok(out)
}

/// Bytes each of pod 0's four aggregation-to-core links carried (tx on the aggregation side).
fn core_bytes(f: &Fabric) -> Result<[u64; 4]> {
    let g = f.topo.graph();
    let mut out = [0; 4];
    for (i, (agg, core)) in [("a0", "c0"), ("a0", "c1"), ("a1", "c2"), ("a1", "c3")]
        .iter()
        .enumerate()
    {
        let (a, c) = (g.find(agg).unwrap(), g.find(core).unwrap());
        let l = g.links_between(a, c).next().unwrap();
        let dev = format!(
            "{}{l}{}",
            f.prefix,
            if g.links[l as usize].a == a { "a" } else { "b" }
        );
        let bytes = f.ns(agg).run(move || {
            let out = std::process::Command::new("ip")
                .args(["-s", "-j", "link", "show", &dev])
                .output()
                .ok()?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            v[0]["stats64"]["tx"]["bytes"].as_u64()
        })?;
        out[i] = bytes.unwrap_or(0);
    }
    Ok(out)
}

fn run_flows(f: &Fabric, mb: u64, first_port: u16) -> Result<Vec<Transfer>> {
    let g = f.topo.graph();
    let results: Vec<Result<Transfer>> = std::thread::scope(|s| {
        let handles: Vec<_> = FLOWS
            .iter()
            .enumerate()
            .map(|(i, (src, dst))| {
                let addr = g.node(g.find(dst).unwrap()).addr.unwrap();
                let (sns, dns) = (f.ns(src), f.ns(dst));
                s.spawn(move || {
                    tcp_transfer(
                        sns,
                        dns,
                        addr,
                        first_port + i as u16,
                        mb * 1_000_000,
                        &SendOptions::default(),
                    )
                    .with_context(|| format!("flow {src} -> {dst}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("flow thread"))
            .collect()
    });
    results.into_iter().collect()
}

pub fn run(rate: u32, mb: u64) -> Result<()> {
    let bar = ProgressBar::new(7);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg}").expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar.set_message("building the agents and the controller (release)");
    build_release()?;
    bar.inc(1);
    bar.set_message(format!(
        "building a Fat-Tree k=4 in namespaces: 36 nodes, 48 links at {rate} Mbit/s"
    ));
    let opts = FabricOptions {
        rate_mbit: Some(rate),
        ..FabricOptions::default()
    };
    let mut f =
        Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).context("building the fabric")?;
    bar.inc(1);
    bar.set_message("starting the controller, 20 switch agents and 16 host agents");
    f.start(&opts).context("starting the agents")?;
    f.wait_ready(Duration::from_secs(90))
        .context("waiting for every agent")?;
    bar.inc(1);
    let mut rows = Vec::new();
    for (i, mode) in ["sopa", "off"].iter().enumerate() {
        bar.set_message(format!("hosts in {mode} mode"));
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
        bar.inc(1);
        bar.set_message(format!(
            "{mode}: flows 0->4, 0->5, 1->4, 1->5, {mb} MB each"
        ));
        let (p0, b0) = (core_paths(&f)?, core_bytes(&f)?);
        let transfers = run_flows(&f, mb, 7500 + 10 * i as u16)?;
        let (p1, b1) = (core_paths(&f)?, core_bytes(&f)?);
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
        "SOPA paper section 4.2 on a Fat-Tree k=4 of namespaces, links at {rate} Mbit/s, {mb} MB per flow (cubic)"
    );
    println!("{:-<96}", "");
    println!(
        "{:<6} {:>9} {:>9} {:>9} {:>9} {:>8}   {:<40}",
        "mode", "0->4", "0->5", "1->4", "1->5", "mean", "pod 0 core links a0c0 a0c1 a1c2 a1c3 (MB)"
    );
    for (mode, transfers, packets, bytes) in &rows {
        let mbps: Vec<f64> = transfers.iter().map(Transfer::mbit_per_s).collect();
        let mean = mbps.iter().sum::<f64>() / mbps.len() as f64;
        let mb: Vec<String> = bytes
            .iter()
            .map(|b| format!("{:.1}", *b as f64 / 1e6))
            .collect();
        println!(
            "{:<6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1}   {}",
            mode,
            mbps[0],
            mbps[1],
            mbps[2],
            mbps[3],
            mean,
            mb.join("  ")
        );
        if mode == "sopa" {
            println!("{:<6} packets source-routed per core path: {packets:?}", "");
        }
    }
    println!("{:-<96}", "");
    println!(
        "throughput in Mbit/s per flow; each host's uplink carries two flows, so the fair share is about {:.0}.",
        f64::from(rate) * 0.956 / 2.0
    );
    println!(
        "sopa: every flow round-robins its packets over the 4 core paths; off: the switches' kernel ECMP picks one path per flow."
    );
    drop(f);
    Ok(())
}
