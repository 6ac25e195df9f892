//! What a run measures beside the flows: the CPUs' time (idle, steal), the hosts' TCP
//! counters, the queues' drops, the core links' bytes and their balance, and the statistics
//! the tables print (percentiles, Jain's index, overlapping spreads).

use std::collections::BTreeMap;

use sopa_topology::NodeKind;

use crate::{fabric::Fabric, traffic::tcp_counters};

/// Whether the spreads of two sets of round means (lowest to highest) meet: a difference
/// between the two modes is then within the spread of either.
pub fn spreads_overlap(a: &[f64], b: &[f64]) -> bool {
    let range = |x: &[f64]| {
        x.iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            })
    };
    let ((a_lo, a_hi), (b_lo, b_hi)) = (range(a), range(b));
    a_lo <= b_hi && b_lo <= a_hi
}

/// Jain's fairness index of `x`: 1 when every value is equal, 1/n when one takes everything.
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * squares)
}

/// The unit of `/proc/stat` (USER_HZ).
pub fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// (steal, total) clock ticks of every CPU since boot: what the hypervisor took against the
/// wall clock times the CPUs.
pub fn steal() -> (u64, u64) {
    let t = CpuTicks::read();
    (t.steal, t.total)
}

/// (not ours, total) clock ticks of every CPU since boot: idle, iowait and steal from
/// `/proc/stat`, against the wall-clock uptime times the CPUs. Busy time is the difference.
/// `/proc/stat`'s user and system ticks are sampled at the timer tick, which a tickless CPU
/// stops while idle: short bursts of work between idle periods (a paced sender, softirqs) go
/// uncounted, and a single stream's per-packet cost read from them ranged 0.2 to 11.7 s/GB
/// across identical runs; idle time is measured exactly, and the wall clock is.
pub fn cpu() -> (u64, u64) {
    let t = CpuTicks::read();
    (t.idle + t.steal, t.total)
}

/// One reading of `/proc/stat`'s summary line and `/proc/uptime`, in clock ticks.
pub struct CpuTicks {
    /// idle + iowait (measured exactly by tickless CPUs).
    pub idle: u64,
    pub steal: u64,
    /// Uptime times the CPUs.
    pub total: u64,
}

impl CpuTicks {
    pub fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let mut lines = stat.lines();
        let v: Vec<u64> = lines
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let cpus = lines.take_while(|l| l.starts_with("cpu")).count().max(1);
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|u| u.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Self {
            idle: at(3) + at(4),
            steal: at(7),
            total: (uptime * cpus as f64 * clock_ticks_per_s()) as u64,
        }
    }
}

/// Sums of the hosts' receive-side reordering and TCP counters.
pub fn host_counters(f: &Fabric) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for (id, agent) in &f.hosts {
        let st = agent.status().expect("host status");
        *out.entry("tcp_data").or_insert(0) += st["strip"]["tcp_data"].as_u64().unwrap_or(0);
        *out.entry("tcp_reordered").or_insert(0) +=
            st["strip"]["tcp_reordered"].as_u64().unwrap_or(0);
        let c = tcp_counters(f.ns(f.topo.graph().name(*id))).expect("TCP counters");
        for (key, name) in [
            ("fast_retransmits", "TcpExt.TCPFastRetrans"),
            ("timeouts", "TcpExt.TCPTimeouts"),
            ("retrans_segs", "Tcp.RetransSegs"),
        ] {
            *out.entry(key).or_insert(0) += c.get(name).copied().unwrap_or(0);
        }
    }
    out
}

/// Packets dropped by the links' drop-tail queues in every namespace of the fabric.
pub fn queue_drops(f: &Fabric) -> u64 {
    let drops = |ns: &crate::NetNs| -> u64 {
        let out = ns.tc(&["-s", "-j", "qdisc", "show"]).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| {
                v.as_array().map(|qdiscs| {
                    qdiscs
                        .iter()
                        // The links' drop-tail queues: HTB's root counts its leaf's drops
                        // again, so only the leaves are summed; TBF's bfifo is hidden from
                        // `tc qdisc show`, and TBF's root counts its drops (and the packets too
                        // large for its bucket).
                        .filter(|q| q["kind"] == "bfifo" || q["kind"] == "tbf")
                        .filter_map(|q| q["drops"].as_u64())
                        .sum::<u64>()
                })
            })
            .unwrap_or(0)
    };
    let nodes: u64 = f
        .topo
        .graph()
        .nodes
        .iter()
        .map(|n| drops(f.ns(&n.name)))
        .sum();
    // The big switch of the ideal, when the fabric has one.
    nodes + f.ideal_ns().map_or(0, drops)
}

/// The names (`a0-c0`) of the links [`core_link_bytes`] measures, in its order.
pub fn core_link_names(f: &Fabric, experiment: &str) -> Vec<String> {
    core_links(f, experiment)
        .into_iter()
        .map(|(_, a, b)| format!("{a}-{b}"))
        .collect()
}

fn core_links(f: &Fabric, experiment: &str) -> Vec<(usize, String, String)> {
    let g = f.topo.graph();
    // A two-tier inventory (leaf-spine): its top links are the leaves' uplinks.
    if let sopa_topology::Topology::Clos(c) = &f.topo
        && c.tiers() == 2
    {
        return g
            .links
            .iter()
            .enumerate()
            .filter(|(_, l)| c.level(l.a) == 1 && c.level(l.b) == 2)
            .map(|(l, link)| (l, g.name(link.a).to_owned(), g.name(link.b).to_owned()))
            .collect();
    }
    g.links
        .iter()
        .enumerate()
        .filter(|(_, link)| {
            let (ka, kb) = (g.node(link.a).kind, g.node(link.b).kind);
            matches!((ka, kb), (NodeKind::Aggregation, NodeKind::Core))
                || (ka == NodeKind::Eps && kb == NodeKind::Eps)
        })
        .filter(|(_, link)| experiment != "sec4.2" || ["a0", "a1"].contains(&g.name(link.a)))
        .map(|(l, link)| (l, g.name(link.a).to_owned(), g.name(link.b).to_owned()))
        .collect()
}

/// Bytes sent upward on the aggregation-to-core (Fat-Tree and three-tier inventories), leaf to
/// spine (a leaf-spine inventory) or inter-container (MODRIC) links
/// the experiment loads: for sec4.2 the four uplinks of pod 0, otherwise all of them.
pub fn core_link_bytes(f: &Fabric, experiment: &str) -> Vec<u64> {
    core_links(f, experiment)
        .into_iter()
        .map(|(l, a, _)| {
            let node = f.topo.graph().find(&a).expect("a switch");
            f.ns(&a).tx_bytes(&f.dev(l as u32, node)).unwrap_or(0)
        })
        .collect()
}

/// The least idle CPU a valid run may leave.
pub const MIN_IDLE_PCT: f64 = 15.0;

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// A core link below this share of the busiest one's bytes is idle: it carried a stray control
/// packet (70 bytes against the busiest link's megabytes), not the mode's load.
pub const IDLE_LINK_SHARE: f64 = 0.01;

/// (the busiest over the least busy loaded link, the idle links) of the core links' `bytes`.
/// A mode that leaves links unused (single path, ECMP's collisions) is told by its idle count,
/// not by one stray packet's link dividing the ratio into the millions; the ratio is infinite
/// when no link carried load.
pub fn core_balance(bytes: &[u64]) -> (f64, usize) {
    let max = bytes.iter().copied().max().unwrap_or(0);
    let loaded = |b: u64| max > 0 && b as f64 >= IDLE_LINK_SHARE * max as f64;
    let idle = bytes.iter().filter(|&&b| !loaded(b)).count();
    let ratio = match bytes.iter().copied().filter(|&b| loaded(b)).min() {
        Some(min) => max as f64 / min as f64,
        None => f64::INFINITY,
    };
    (ratio, idle)
}

/// `core_balance` as the tables print it: "1.04", "1.04 +1 idle", "all idle".
pub fn core_balance_text(ratio: f64, idle: usize) -> String {
    match (ratio.is_finite(), idle) {
        (false, _) => "all idle".into(),
        (true, 0) => format!("{ratio:.2}"),
        (true, n) => format!("{ratio:.2} +{n} idle"),
    }
}
