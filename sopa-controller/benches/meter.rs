//! `cargo xtask bench meter`: how large the path meter's reports are and what judging them
//! costs, from Fat-Tree k=4 to k=48. No network: reports are built as a host agent builds them
//! (per peer rack, its paths' hops and packet counts in two packed arrays) and encoded.
//!
//! - Report size: one host's report for one period when it sends to R racks in other pods on
//!   every path (and receives as much from R racks): bytes encoded, per path and per second at
//!   the default 250 ms period.
//! - Judging: every host of the fabric sends to one rack in another pod (a permutation of
//!   racks) for 16 periods with one core link losing 2%; the time the controller takes to take
//!   every host's reports of a period and judge it, side by side across fabric sizes.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use prost::Message as _;
use sopa_channel::proto::{PathReport, PeerPaths};
use sopa_controller::tomography::{JudgeConfig, Tomography};
use sopa_topology::{NodeKind, Topology, topology::TopologySpec};

/// A typical packet count of one path in one period (a 10 Gbit/s host spraying 576 paths sends
/// about 360 full packets per path per 250 ms): two varint bytes.
const PER_PATH: u64 = 300;

/// Their bytes on the wire, as a sender counts them (full packets and acknowledgements mixed,
/// 1,000 bytes on average): three varint bytes.
const PER_PATH_BYTES: u64 = PER_PATH * 1000;

fn fat_tree(k: u32) -> Topology {
    Topology::build(&TopologySpec::FatTree { k }).expect("a Fat-Tree")
}

/// The report of `host` sending `PER_PATH` on every path to `racks` racks of other pods, and
/// receiving as much from as many.
fn report(topo: &Topology, host: u32, racks: usize) -> PathReport {
    let own = topo.rack_of(host).unwrap();
    let mut r = PathReport {
        period: 1,
        period_ms: 250,
        ..PathReport::default()
    };
    for rack in topo
        .racks()
        .iter()
        .filter(|r| r.at.0 != own.at.0)
        .take(racks)
    {
        let mut p = PeerPaths {
            rack: u32::from(rack.prefix.addr),
            ..PeerPaths::default()
        };
        topo.paths_to_rack(host, rack, |h0, h1, _| {
            p.hops.push(u32::from(h0) | (u32::from(h1) << 8));
            p.packets.push(PER_PATH);
        });
        r.received.push(p.clone());
        // Only the sender counts bytes.
        p.bytes = vec![PER_PATH_BYTES; p.packets.len()];
        r.sent.push(p);
    }
    r
}

fn sizes() {
    println!("Path report of one host for one period (sent and received, every path of each rack)");
    println!(
        "{:<12} {:>6} {:>8} {:>10} {:>12} {:>14}",
        "fabric", "paths", "racks", "bytes", "bytes/path", "KB/s at 250ms"
    );
    for k in [4u32, 16, 48] {
        let topo = fat_tree(k);
        let host = topo.graph().nodes_of(NodeKind::Host).next().unwrap();
        let paths = (k / 2 * k / 2) as usize;
        for racks in [1usize, 10, 100] {
            let other = (k * k / 2 - k / 2) as usize;
            if racks > other {
                continue;
            }
            let r = report(&topo, host, racks);
            let bytes = r.encoded_len();
            let n = 2 * racks * paths;
            println!(
                "{:<12} {:>6} {:>8} {:>10} {:>12.2} {:>14.1}",
                format!("k={k}"),
                paths,
                racks,
                bytes,
                bytes as f64 / n as f64,
                bytes as f64 * 4.0 / 1024.0
            );
        }
    }
}

/// Every host sends to the rack `shift` pods over, same edge index: a rack permutation.
fn permutation(topo: &Topology, lossy: (&str, &str), periods: u64) -> (Duration, usize, usize) {
    let g = topo.graph();
    let racks = topo.racks();
    let hosts: Vec<u32> = g.nodes_of(NodeKind::Host).collect();
    let names: BTreeSet<String> = hosts.iter().map(|h| g.name(*h).to_owned()).collect();
    let mut t = Tomography::new(Arc::new(topo.clone()), JudgeConfig::default());
    let pods = racks.iter().map(|r| r.at.0).max().unwrap() + 1;
    // Each host's rack, and the first host of each rack (the receiver), looked up once.
    let rack_of: Vec<usize> = hosts
        .iter()
        .map(|&h| {
            let tor = topo.rack_of(h).unwrap().tor;
            racks.iter().position(|r| r.tor == tor).unwrap()
        })
        .collect();
    let mut first = vec![None; racks.len()];
    for (i, &r) in rack_of.iter().enumerate() {
        first[r].get_or_insert(hosts[i]);
    }
    let (from, to) = (g.find(lossy.0).unwrap(), g.find(lossy.1).unwrap());
    let mut took = Duration::ZERO;
    let mut verdicts = 0;
    for period in 0..periods {
        let mut reports: std::collections::BTreeMap<String, PathReport> = names
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    PathReport {
                        period,
                        period_ms: 250,
                        ..PathReport::default()
                    },
                )
            })
            .collect();
        for (i, &h) in hosts.iter().enumerate() {
            let own = &racks[rack_of[i]];
            let dst = racks
                .iter()
                .find(|r| r.at == ((own.at.0 + 1) % pods, own.at.1))
                .unwrap();
            let receiver = first[racks.iter().position(|r| r.tor == dst.tor).unwrap()].unwrap();
            let mut sent = PeerPaths {
                rack: u32::from(dst.prefix.addr),
                ..PeerPaths::default()
            };
            let mut recv = PeerPaths {
                rack: u32::from(own.prefix.addr),
                ..PeerPaths::default()
            };
            topo.paths_to_rack(h, dst, |h0, h1, links| {
                let mut at = h;
                let mut through = false;
                for &l in links {
                    let next = g.links[l as usize].other(at);
                    through |= (at, next) == (from, to);
                    at = next;
                }
                let lost = if through { PER_PATH / 50 } else { 0 };
                sent.hops.push(u32::from(h0) | (u32::from(h1) << 8));
                sent.packets.push(PER_PATH);
                sent.bytes.push(PER_PATH_BYTES);
                recv.hops.push(u32::from(h0) | (u32::from(h1) << 8));
                recv.packets.push(PER_PATH - lost);
            });
            reports.get_mut(g.name(h)).unwrap().sent.push(sent);
            reports
                .get_mut(g.name(receiver))
                .unwrap()
                .received
                .push(recv);
        }
        let start = Instant::now();
        for (name, r) in reports {
            t.accept(&name, r, &names);
        }
        verdicts = t.judge(|_| false).len();
        took += start.elapsed();
    }
    (took / periods as u32, hosts.len(), verdicts)
}

fn judging(max_k: u32) {
    println!(
        "\nJudging: every host sends to a rack one pod over on every path, a0 -> c0 loses 2%; per period"
    );
    println!(
        "{:<8} {:>7} {:>12} {:>10} {:>9}",
        "fabric", "hosts", "take+judge", "per host", "verdicts"
    );
    for k in [4u32, 8, 16, 24, 32, 48]
        .into_iter()
        .filter(|k| *k <= max_k)
    {
        let topo = fat_tree(k);
        // The longest window's 16 periods where the fabric is small; past k=24 building the
        // reports takes longer than judging them, and a window's sums grow with paths, not
        // periods.
        let periods = if k <= 24 { 16 } else { 6 };
        let (per_period, hosts, verdicts) = permutation(&topo, ("a0", "c0"), periods);
        println!(
            "{:<8} {:>7} {:>10.1}ms {:>8.1}us {:>9}",
            format!("k={k}"),
            hosts,
            per_period.as_secs_f64() * 1e3,
            per_period.as_secs_f64() * 1e6 / hosts as f64,
            verdicts
        );
    }
}

/// The command line (`cargo xtask bench meter -- --help`).
#[derive(clap::Parser)]
#[command(
    name = "bench meter",
    about = "The path meter at the controller: report sizes, and judging a k=48 fabric's periods"
)]
struct Cli {
    /// A small fabric, to check the benchmark runs.
    #[arg(long)]
    smoke: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let smoke = <Cli as clap::Parser>::parse().smoke;
    sizes();
    judging(if smoke { 8 } else { 48 });
}
