//! `cargo xtask demo --fabric FILE`: the operator's own fabric from its inventory, in
//! namespaces, with its names and addresses: the first host of each rack sends to the first
//! host of the next rack (a ring, all at once) over shaped links, first in `sopa` mode, then
//! in `off` (the switches' own kernel ECMP). Prints each flow's throughput and the packets the
//! first flow's leaf sent up each uplink.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result, bail};
use sopa_testbed::{
    experiment,
    fabric::{Fabric, FabricOptions},
    traffic::Transfer,
};
use sopa_topology::{Topology, srv6::Encoding};

use crate::{
    fabric_demo::{set_mode, started},
    testbed::parse_topo,
};

/// Packets out of each uplink of `leaf`, as its interfaces counted them (every packet: the
/// flows' and the ACKs of the flow towards the rack).
fn uplinks(f: &Fabric, leaf: &str) -> Result<Vec<(String, u64)>> {
    let Topology::Clos(c) = &f.topo else {
        bail!("not an inventory's fabric");
    };
    let g = f.topo.graph();
    let me = g.find(leaf).expect("a leaf");
    c.uplinks(me)
        .iter()
        .map(|&(_, spine)| {
            let name = g.name(spine).to_owned();
            let n = f.ns(leaf).tx_packets(&f.link_iface(leaf, &name))?;
            Ok((name, n))
        })
        .collect()
}

pub fn run(file: &Path, rate: u32, mb: u64, encoding: Encoding) -> Result<()> {
    let spec = parse_topo(&file.display().to_string())?;
    let topo = Topology::build(&spec)?;
    // The first host of each rack, to the first host of the next.
    let firsts: Vec<String> = topo
        .racks()
        .iter()
        .filter_map(|r| {
            let g = topo.graph();
            (0..g.nodes.len() as u32)
                .find(|h| topo.rack_of(*h).is_ok_and(|x| x.tor == r.tor))
                .map(|h| g.name(h).to_owned())
        })
        .collect();
    if firsts.len() < 2 {
        bail!(
            "{} has fewer than two racks with hosts: nothing crosses the fabric",
            file.display()
        );
    }
    let flows: Vec<(String, String)> = (0..firsts.len())
        .map(|i| (firsts[i].clone(), firsts[(i + 1) % firsts.len()].clone()))
        .collect();
    let bar = started(5)?;
    let g = topo.graph();
    bar.set_message(format!(
        "building {} in namespaces: {} nodes, {} links at {rate} Mbit/s, paths as {encoding}",
        topo.name(),
        g.nodes.len(),
        g.links.len()
    ));
    let opts = FabricOptions {
        rate_mbit: Some(rate),
        encoding,
        ..FabricOptions::default()
    };
    let mut f = Fabric::build(&spec, &opts).context("building the fabric")?;
    bar.inc(1);
    bar.set_message("starting the controller and every agent");
    f.start(&opts).context("starting the agents")?;
    f.wait_ready(Duration::from_secs(90))
        .context("waiting for every agent")?;
    bar.inc(1);
    let leaf = g
        .name(topo.rack_of(g.find(&flows[0].0).expect("a host"))?.tor)
        .to_owned();
    let mut rows = Vec::new();
    for (i, mode) in ["sopa", "off"].iter().enumerate() {
        bar.set_message(format!("{mode}: {} flows of {mb} MB", flows.len()));
        set_mode(&f, mode)?;
        let before = uplinks(&f, &leaf)?;
        let transfers = experiment::run_round(&f, &flows, mb, 7600 + 10 * i as u16, false);
        let after = uplinks(&f, &leaf)?;
        if let Some(t) = transfers.iter().find(|t| !t.intact()) {
            bail!("a flow arrived corrupted ({} bytes)", t.bytes);
        }
        let per: Vec<(String, u64)> = after
            .into_iter()
            .zip(before)
            .map(|((n, a), (_, b))| (n, a - b))
            .collect();
        rows.push((mode.to_string(), transfers, per));
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!();
    println!(
        "{} of namespaces, links at {rate} Mbit/s, {mb} MB per flow (cubic), paths as {encoding}",
        topo.name()
    );
    println!("{:-<96}", "");
    for (mode, transfers, per) in &rows {
        let label = if mode == "off" { "ecmp" } else { mode.as_str() };
        let mbps: Vec<f64> = transfers.iter().map(Transfer::mbit_per_s).collect();
        let mean = mbps.iter().sum::<f64>() / mbps.len() as f64;
        println!("{label:<6} mean {mean:.1} Mbit/s per flow");
        for ((a, b), m) in flows.iter().zip(&mbps) {
            println!("         {a} -> {b}: {m:.1} Mbit/s");
        }
        let ups: Vec<String> = per.iter().map(|(n, p)| format!("{n} {p}")).collect();
        println!(
            "         packets out of {leaf}'s uplinks: {}",
            ups.join(", ")
        );
    }
    println!("{:-<96}", "");
    println!(
        "sopa: each flow round-robins its packets over every up-down path of its rack pair; ecmp: the hosts stamp nothing (mode off) and the switches' kernel multipath picks one path per flow."
    );
    drop(f);
    Ok(())
}
