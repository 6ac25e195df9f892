//! The SOPA paper's experiments on a running fabric, the modes side by side: used by
//! `cargo xtask bench fabric` and, with small flows, by the test suite.

use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;
use sopa_topology::NodeKind;

use crate::{
    fabric::Fabric,
    traffic::{SendOptions, Transfer, tcp_counters, tcp_transfer},
};

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub experiment: String,
    pub modes: Vec<String>,
    pub repeat: u32,
    pub rate_mbit: u32,
    pub mb: u64,
    pub seed: u64,
    /// Sequential flows per host of the production and failure workloads.
    pub flows_per_host: u32,
    /// The production and failure workloads' flows capped at this size (their VL2 sizes reach
    /// 30 MB): a toy run (`--smoke`, the suite) stays toy-sized. `None`: the sizes as drawn.
    pub max_flow_bytes: Option<u64>,
}

/// Controller flags for the paper's experiments: the path meter reports but drains nothing.
/// They compare load balancing, and a drain would change the fabric under one mode and not
/// the others: in the failure experiment (production workload, a0 down) the meter once drained
/// a6:e7 for bursts of drops at 41% mean load, congestion it could not tell from a gray link
/// (issue 16's open part). Gray links are judged in `fabric_gray` and `bench failure`, which
/// count false drains.
pub const METER_REPORTS_ONLY: [&str; 2] = ["--max-suspects", "0"];

/// The fidelity check: one flow alone must reach this fraction of the link rate.
pub const FIDELITY: f64 = 0.90;
/// Tries of the lone flow before the fidelity check fails.
pub const ALONE_TRIES: u32 = 3;
/// The lone flow's size at least, in MB: long enough that slow start and the connection's
/// set-up are a small part of it (4 MB is 3.4 s at 10 Mbit/s), whatever the runs' flow size.
pub const ALONE_MB: u64 = 4;

/// Everything one run measured.
#[derive(Serialize, serde::Deserialize)]
pub struct Report {
    pub alone_fraction: f64,
    /// How many tries of the lone flow that took (at most [`ALONE_TRIES`]).
    #[serde(default)]
    pub alone_tries: u32,
    /// The share of the CPUs the hypervisor took (steal) while the lone flow ran, in %: a
    /// fidelity failure with much of it says the machine, not the emulation, was short.
    #[serde(default)]
    pub alone_steal_pct: f64,
    pub rate_mbit: f64,
    pub results: Vec<ModeResult>,
}

/// What one mode accumulated over the rounds.
#[derive(Default)]
struct Acc {
    transfers: Vec<Transfer>,
    names: Vec<(String, String)>,
    counters: BTreeMap<&'static str, u64>,
    links: Vec<u64>,
    idle: u64,
    steal: u64,
    total: u64,
    drops: u64,
    /// Mean throughput (fraction of R) of each round.
    round_means: Vec<f64>,
}

/// What the fidelity check measured: one flow alone on the idle fabric.
#[derive(Clone, Copy, Debug)]
pub struct Fidelity {
    /// The best try's throughput over the link rate.
    pub fraction: f64,
    /// How many tries that took (at most [`ALONE_TRIES`]).
    pub tries: u32,
    /// The share of the CPUs the hypervisor took (steal) while the lone flow ran, in %.
    pub steal_pct: f64,
}

/// The fidelity check on `f` at `plan`'s rate: one flow alone on the idle fabric, between two
/// pods or containers. What is checked is what the fabric can carry: the flow is at least
/// ALONE_MB long (a 1 MB flow is mostly slow start, and reached 0.878-0.888 of the rate here on
/// an idle machine), and a try the machine slowed is tried again, up to ALONE_TRIES times,
/// until one reaches FIDELITY; the best try is reported with the number of tries.
pub fn fidelity(f: &Fabric, plan: &Plan) -> Fidelity {
    let a = plan;
    set_mode(f, "sopa");
    let alone = flows(f, "permutation", a.seed).into_iter().next().unwrap();
    let (mut fraction, mut tries) = (0.0f64, 0);
    let steal0 = steal();
    while tries < ALONE_TRIES && fraction < FIDELITY {
        let port = 9000 + 10 * tries as u16;
        tries += 1;
        let t = &run_round(
            f,
            std::slice::from_ref(&alone),
            a.mb.max(ALONE_MB),
            port,
            false,
        )[0];
        fraction = fraction.max(t.mbit_per_s() / f64::from(a.rate_mbit));
        eprintln!(
            "fidelity: one flow alone, try {tries}: {:.3} of the link rate",
            t.mbit_per_s() / f64::from(a.rate_mbit)
        );
    }
    let steal_pct = {
        let (stolen, total) = steal();
        100.0 * stolen.saturating_sub(steal0.0) as f64
            / total.saturating_sub(steal0.1).max(1) as f64
    };
    Fidelity {
        fraction,
        tries,
        steal_pct,
    }
}

/// Runs the fidelity check and then every mode of `plan` on `f` ([`run_with`]).
pub fn run(f: &Fabric, plan: &Plan) -> Report {
    run_with(f, plan, fidelity(f, plan))
}

/// Runs every mode of `plan` on `f`, the modes interleaved per round (round 1: every mode,
/// round 2: every mode, ...), so that whatever drifts on the machine during a run weighs on
/// every mode alike; `fidelity` is what the check measured on this fabric at this rate (once
/// for several experiments on one fabric).
pub fn run_with(f: &Fabric, plan: &Plan, fidelity: Fidelity) -> Report {
    let a = plan;
    let sequential = matches!(a.experiment.as_str(), "production" | "failure");
    let progress = indicatif::ProgressBar::new(u64::from(a.repeat) * a.modes.len() as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} rounds {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    progress.set_prefix(a.experiment.clone());
    let mut acc: Vec<Acc> = a.modes.iter().map(|_| Acc::default()).collect();
    for r in 0..a.repeat {
        for (mi, mode) in a.modes.iter().enumerate() {
            progress.set_message(mode.clone());
            progress.inc(1);
            set_mode(f, mode);
            let mptcp = mode.starts_with("mptcp");
            let failed = (a.experiment == "failure").then(|| fail_switch(f, FAILED_SWITCH));
            let (c0, l0, cpu0) = (
                host_counters(f),
                core_link_bytes(f, &a.experiment),
                CpuTicks::read(),
            );
            let drops0 = queue_drops(f);
            let mut round: Vec<(String, String, Transfer)> = Vec::new();
            if sequential {
                let mut sched = production(f, a.seed + u64::from(r), a.flows_per_host);
                if let Some(cap) = a.max_flow_bytes {
                    for (_, flows) in &mut sched {
                        for (_, bytes) in flows {
                            *bytes = (*bytes).min(cap);
                        }
                    }
                }
                let total: u64 = sched
                    .iter()
                    .flat_map(|(_, fl)| fl.iter().map(|x| x.1))
                    .sum();
                eprintln!(
                    "{mode}: round {} of {}, {} hosts x {} sequential flows, {:.1} MB in all",
                    r + 1,
                    a.repeat,
                    sched.len(),
                    a.flows_per_host,
                    total as f64 / 1e6
                );
                let port = 20_000 + (mi as u16) * 2000 + (r as u16) * 10;
                round = run_sequential(f, &sched, port, mptcp);
            } else {
                let fl = flows(f, &a.experiment, a.seed + u64::from(r));
                eprintln!(
                    "{mode}: round {} of {}, {} flows of {} MB",
                    r + 1,
                    a.repeat,
                    fl.len(),
                    a.mb
                );
                let port = 10_000 + (mi as u16) * 1000 + (r as u16) * 50;
                let ts = run_round(f, &fl, a.mb, port, mptcp);
                round.extend(fl.into_iter().zip(ts).map(|((s, d), t)| (s, d, t)));
            }
            let (c1, l1, cpu1) = (
                host_counters(f),
                core_link_bytes(f, &a.experiment),
                CpuTicks::read(),
            );
            let drops = queue_drops(f).saturating_sub(drops0);
            if let Some(links) = failed {
                restore_switch(f, FAILED_SWITCH, &links);
            }
            assert!(
                round.iter().all(|(_, _, t)| t.intact()),
                "{mode}: a flow arrived corrupted"
            );
            if mptcp {
                check_mptcp(mode, round.iter().map(|(_, _, t)| t));
            }
            let m = &mut acc[mi];
            let fracs: Vec<f64> = round
                .iter()
                .map(|(_, _, t)| t.mbit_per_s() / f64::from(a.rate_mbit))
                .collect();
            m.round_means
                .push(fracs.iter().sum::<f64>() / fracs.len().max(1) as f64);
            for (k, v) in &c1 {
                *m.counters.entry(k).or_default() +=
                    v.saturating_sub(c0.get(k).copied().unwrap_or(0));
            }
            if m.links.is_empty() {
                m.links = vec![0; l1.len()];
            }
            for ((sum, x), y) in m.links.iter_mut().zip(&l1).zip(&l0) {
                *sum += x.saturating_sub(*y);
            }
            m.idle += cpu1.idle.saturating_sub(cpu0.idle);
            m.steal += cpu1.steal.saturating_sub(cpu0.steal);
            m.total += cpu1.total.saturating_sub(cpu0.total);
            m.drops += drops;
            for (s, d, t) in round {
                m.names.push((s, d));
                m.transfers.push(t);
            }
        }
    }
    progress.finish_and_clear();
    let results = a
        .modes
        .iter()
        .zip(acc)
        .map(|(mode, m)| mode_result(f, a, mode, m))
        .collect();
    Report {
        alone_fraction: fidelity.fraction,
        alone_tries: fidelity.tries,
        alone_steal_pct: fidelity.steal_pct,
        rate_mbit: f64::from(a.rate_mbit),
        results,
    }
}

/// An MPTCP column must measure MPTCP: no flow fell back to TCP, and the path manager opened
/// every announced subflow on at least one flow (short flows may end before all are up). A
/// flow can count more than the announced ones: under a failure a subflow that lost its path
/// is replaced while the old one is still being closed.
fn check_mptcp<'a>(mode: &str, transfers: impl Iterator<Item = &'a Transfer>) {
    let (mut fell_back, mut most) = (0, 0u8);
    for t in transfers {
        fell_back += usize::from(t.tcp.mptcp_fallback);
        most = most.max(t.tcp.mptcp_subflows.unwrap_or(0));
    }
    assert!(
        fell_back == 0 && usize::from(most) >= MPTCP_PORTS.len(),
        "{mode}: {fell_back} flows fell back to TCP and at most {most} of {} extra subflows \
         opened: the column would not measure MPTCP",
        MPTCP_PORTS.len()
    );
}

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

fn mode_result(f: &Fabric, a: &Plan, mode: &str, m: Acc) -> ModeResult {
    let mut frac: Vec<f64> = m
        .transfers
        .iter()
        .map(|t| t.mbit_per_s() / f64::from(a.rate_mbit))
        .collect();
    frac.sort_by(f64::total_cmp);
    let mut fct: Vec<f64> = m.transfers.iter().map(|t| t.seconds).collect();
    fct.sort_by(f64::total_cmp);
    let mut short: Vec<f64> = m
        .transfers
        .iter()
        .filter(|t| t.bytes <= SHORT_FLOW_BYTES)
        .map(|t| t.seconds)
        .collect();
    short.sort_by(f64::total_cmp);
    let d = |k: &str| m.counters.get(k).copied().unwrap_or(0);
    let (core_links_max_over_min, core_links_idle) = core_balance(&m.links);
    let subflows: Vec<f64> = m
        .transfers
        .iter()
        .filter_map(|t| t.tcp.mptcp_subflows.map(f64::from))
        .collect();
    ModeResult {
        mode: mode.to_owned(),
        flows: m.transfers.len(),
        mean: frac.iter().sum::<f64>() / frac.len().max(1) as f64,
        min: frac.first().copied().unwrap_or(0.0),
        p5: percentile(&frac, 0.05),
        p99: percentile(&frac, 0.99),
        jain: jain(&frac),
        round_means: m.round_means,
        fct_mean_s: fct.iter().sum::<f64>() / fct.len().max(1) as f64,
        fct_p99_s: percentile(&fct, 0.99),
        short_flows: short.len(),
        short_fct_mean_s: short.iter().sum::<f64>() / short.len().max(1) as f64,
        short_fct_p99_s: percentile(&short, 0.99),
        reordered_pct: 100.0 * d("tcp_reordered") as f64 / d("tcp_data").max(1) as f64,
        fast_retransmits: d("fast_retransmits"),
        timeouts: d("timeouts"),
        retrans_segs: d("retrans_segs"),
        queue_drops: m.drops,
        core_links: core_link_names(f, &a.experiment)
            .into_iter()
            .zip(m.links.iter().copied())
            .collect(),
        core_links_max_over_min,
        core_links_idle,
        idle_cpu_pct: 100.0 * m.idle as f64 / m.total.max(1) as f64,
        steal_cpu_pct: 100.0 * m.steal as f64 / m.total.max(1) as f64,
        cpu_s_per_gb: {
            let busy_s = m.total.saturating_sub(m.idle + m.steal) as f64 / clock_ticks_per_s();
            let gb = m.transfers.iter().map(|t| t.bytes).sum::<u64>() as f64 / 1e9;
            if gb > 0.0 { busy_s / gb } else { 0.0 }
        },
        mptcp_subflows_mean: (!subflows.is_empty())
            .then(|| subflows.iter().sum::<f64>() / subflows.len() as f64),
        per_flow: m
            .names
            .iter()
            .zip(&m.transfers)
            .map(|((s, d), t)| {
                (
                    s.clone(),
                    d.clone(),
                    t.mbit_per_s(),
                    t.seconds,
                    t.tcp.total_retrans,
                )
            })
            .collect(),
    }
}

/// The largest flow counted as short (about half of the production workload's flows).
pub const SHORT_FLOW_BYTES: u64 = 100_000;

/// xorshift64 for reproducible random permutations.
pub fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Every host of the fabric, by name, in node order.
fn host_names(f: &Fabric) -> Vec<String> {
    f.topo
        .graph()
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Host)
        .map(|n| n.name.clone())
        .collect()
}

/// (source, destination) host names of one round of the experiment.
pub fn flows(f: &Fabric, experiment: &str, seed: u64) -> Vec<(String, String)> {
    let g = f.topo.graph();
    let hosts = host_names(f);
    match experiment {
        "sec4.2" => {
            assert!(
                hosts.len() == 16 && f.topo.name().starts_with("Fat-Tree"),
                "sec4.2 is defined on Fat-Tree k=4"
            );
            [("h0", "h4"), ("h0", "h5"), ("h1", "h4"), ("h1", "h5")]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        }
        // The granularity sweep runs on the permutation.
        "permutation" | "granularity" => {
            // A random permutation without fixed points: every host sends to one other host and
            // receives from one.
            let mut next = rng(seed);
            let n = hosts.len();
            let mut perm: Vec<usize> = (0..n).collect();
            loop {
                for i in (1..n).rev() {
                    perm.swap(i, (next() % (i as u64 + 1)) as usize);
                }
                if perm.iter().enumerate().all(|(i, p)| i != *p) {
                    break;
                }
            }
            (0..n)
                .map(|i| (hosts[i].clone(), hosts[perm[i]].clone()))
                .collect()
        }
        "modric-1to1" | "modric-all" => {
            // The MODRIC paper's experiment set 3 on its container grid: one-to-one pairs each
            // container with the one diagonally across (every flow crosses a row and a column);
            // all-to-all sends host i of a container to host i of another container, the
            // containers taken in turn, so every container talks to every other.
            let sopa_topology::topology::TopologySpec::Modric(p) = f.topo.spec() else {
                panic!("{experiment} is defined on MODRIC");
            };
            let containers = p.m * p.n;
            let at = |h: &str| {
                let r = f.topo.rack_of(g.find(h).unwrap()).unwrap();
                r.at.0
            };
            let mut by_container: BTreeMap<u32, Vec<String>> = BTreeMap::new();
            for h in &hosts {
                by_container.entry(at(h)).or_default().push(h.clone());
            }
            let mut out = Vec::new();
            for (c, members) in &by_container {
                for (i, h) in members.iter().enumerate() {
                    let to = if experiment == "modric-1to1" {
                        containers - 1 - c
                    } else {
                        (c + 1 + (i as u32) % (containers - 1)) % containers
                    };
                    out.push((h.clone(), by_container[&to][i].clone()));
                }
            }
            out
        }
        other => panic!(
            "experiment {other:?}: sec4.2, permutation, production, failure, modric-1to1 or modric-all"
        ),
    }
}

/// The switch the failure experiment takes down: the leftmost aggregation switch of pod 0.
pub const FAILED_SWITCH: &str = "a0";

/// A flow size from a VL2-like distribution: 95% under 1 MB (10 KB to 1 MB), 3.5% from 1 to
/// 10 MB, 1.5% from 10 to 30 MB, each log-uniform.
pub fn vl2_size(next: &mut impl FnMut() -> u64) -> u64 {
    let u = (next() % 1_000_000) as f64 / 1e6;
    let v = (next() % 1_000_000) as f64 / 1e6;
    let (lo, hi): (f64, f64) = if u < 0.95 {
        (10e3, 1e6)
    } else if u < 0.985 {
        (1e6, 10e6)
    } else {
        (10e6, 30e6)
    };
    (lo * (hi / lo).powf(v)) as u64
}

/// The production workload: every host sends `per_host` flows one after the other, each to a
/// random other host, sizes from [`vl2_size`].
pub fn production(f: &Fabric, seed: u64, per_host: u32) -> Vec<(String, Vec<(String, u64)>)> {
    let hosts = host_names(f);
    let mut next = rng(seed ^ 0x5052_4f44);
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let flows = (0..per_host)
                .map(|_| {
                    let mut d = (next() % (hosts.len() as u64 - 1)) as usize;
                    if d >= i {
                        d += 1;
                    }
                    (hosts[d].clone(), vl2_size(&mut next))
                })
                .collect();
            (h.clone(), flows)
        })
        .collect()
}

/// Runs every host's flows one after the other, all hosts at once, with the traffic tool
/// (`sopa-traffic`): a server in every destination's namespace, a client running its host's
/// schedule in every source's. Returns (source, destination, transfer) of every flow; each
/// flow's hashes were compared by the tool.
pub fn run_sequential(
    f: &Fabric,
    sched: &[(String, Vec<(String, u64)>)],
    port: u16,
    mptcp: bool,
) -> Vec<(String, String, Transfer)> {
    let g = f.topo.graph();
    let tmp = crate::temp_dir(&format!("traffic-{}-{port}", f.prefix));
    let dir = tmp.path().to_path_buf();
    let tool = crate::bins::sopa_traffic();
    let addr = |h: &str| g.node(g.find(h).unwrap()).addr.unwrap();
    let mut dsts: Vec<&String> = sched
        .iter()
        .flat_map(|(_, fl)| fl.iter().map(|x| &x.0))
        .collect();
    dsts.sort();
    dsts.dedup();
    let mut servers = Vec::new();
    for d in &dsts {
        let listen = format!("{}:{port}", addr(d));
        let mut args = vec!["serve", "--listen", listen.as_str()];
        if mptcp {
            args.push("--mptcp");
        }
        let log = dir.join(format!("serve-{d}.log"));
        servers.push((
            log.clone(),
            crate::Process::spawn(Some(f.ns(d)), &tool, &args, &log).expect("sopa-traffic serve"),
        ));
    }
    let start = std::time::Instant::now();
    while !servers
        .iter()
        .all(|(log, _)| std::fs::read_to_string(log).is_ok_and(|t| t.contains("serving on")))
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the traffic servers did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut clients = Vec::new();
    for (src, flows) in sched {
        let schedule: Vec<serde_json::Value> = flows
            .iter()
            .enumerate()
            .map(|(k, (d, bytes))| {
                serde_json::json!({
                    "to": format!("{}:{port}", addr(d)), "bytes": bytes, "after_previous": k > 0,
                })
            })
            .collect();
        let file = dir.join(format!("schedule-{src}.json"));
        std::fs::write(&file, serde_json::to_string(&schedule).unwrap()).unwrap();
        let file = file.display().to_string();
        let mut args = vec!["run", "--schedule", file.as_str()];
        if mptcp {
            args.push("--mptcp");
        }
        let log = dir.join(format!("run-{src}.log"));
        let p =
            crate::Process::spawn(Some(f.ns(src)), &tool, &args, &log).expect("sopa-traffic run");
        clients.push((src, flows, log, p));
    }
    let mut out = Vec::new();
    for (src, flows, log, mut p) in clients {
        let status = loop {
            if let Some(st) = p.try_wait() {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(1800),
                "{src}'s flows did not finish in 30 minutes"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(status.success(), "{src}'s flows failed ({status}):\n{text}");
        let mut lines: Vec<serde_json::Value> = text
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        lines.sort_by_key(|l| l["index"].as_u64());
        assert_eq!(lines.len(), flows.len(), "{src}: a line per flow:\n{text}");
        for (l, (d, bytes)) in lines.iter().zip(flows) {
            let t = flow_line(l, *bytes).unwrap_or_else(|e| panic!("{src} -> {d}: {e}: {l}"));
            assert!(
                t.intact(),
                "{src} -> {d}: the receiver's digest differs from the sender's: {l}"
            );
            out.push((src.clone(), d.clone(), t));
        }
    }
    drop(servers);
    out
}

/// One flow of `sopa-traffic run`'s output (a JSON line) as a [`Transfer`], with the digest of
/// what the sender sent and of what the receiver received, as the tool printed them.
pub fn flow_line(l: &serde_json::Value, bytes: u64) -> Result<Transfer, String> {
    if let Some(e) = l["error"].as_str() {
        return Err(format!("the flow failed: {e}"));
    }
    let hash = |key: &str| -> Result<crate::traffic::Digest, String> {
        let text = l[key].as_str().ok_or(format!("no {key}"))?;
        let v: Vec<u8> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2).unwrap_or("?"), 16))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{key} is not hex: {e}"))?;
        v.try_into().map_err(|_| format!("{key} is not 16 bytes"))
    };
    if l["bytes"].as_u64() != Some(bytes) {
        return Err(format!("{} bytes, not the {bytes} scheduled", l["bytes"]));
    }
    let n = |key: &str| l[key].as_u64().unwrap_or(0);
    Ok(Transfer {
        bytes,
        seconds: l["fct_s"].as_f64().ok_or("no fct_s")?,
        sent_digest: hash("sent_digest")?,
        received_digest: hash("received_digest")?,
        tcp: crate::traffic::TcpStats {
            total_retrans: n("total_retrans") as u32,
            reord_seen: n("reord_seen") as u32,
            reordering: n("reordering") as u32,
            segs_out: 0,
            rtos: n("rtos") as u16,
            mptcp_subflows: l["mptcp_subflows"].as_u64().map(|v| v as u8),
            mptcp_fallback: l["mptcp_fallback"] == true,
        },
    })
}

/// Takes switch `name` down for real: every one of its interfaces down, so its neighbours'
/// switch agents see the ports go and report them; waits until the controller knows and the
/// hosts' path tables have dropped the paths through it. Returns the interfaces.
pub fn fail_switch(f: &Fabric, name: &str) -> Vec<String> {
    let g = f.topo.graph();
    let n = g.find(name).expect("a switch");
    let ifaces: Vec<String> = g
        .ports(n)
        .iter()
        .map(|(_, peer)| f.link_iface(name, g.name(*peer)))
        .collect();
    for i in &ifaces {
        f.ns(name)
            .ip(&["link", "set", i, "down"])
            .expect("link down");
    }
    let ports = ifaces.len();
    f.wait_applied(|down| down >= ports, "the failure")
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{name} down: {ports} links reported down by its neighbours");
    ifaces
}

pub fn restore_switch(f: &Fabric, name: &str, ifaces: &[String]) {
    for i in ifaces {
        f.ns(name).ip(&["link", "set", i, "up"]).expect("link up");
    }
    f.wait_applied(|down| down == 0, "the restore")
        .unwrap_or_else(|e| panic!("{e}"));
}

pub fn run_round(
    f: &Fabric,
    flows: &[(String, String)],
    mb: u64,
    port: u16,
    mptcp: bool,
) -> Vec<Transfer> {
    let g = f.topo.graph();
    std::thread::scope(|s| {
        let handles: Vec<_> = flows
            .iter()
            .enumerate()
            .map(|(i, (a, b))| {
                let addr = g.node(g.find(b).unwrap()).addr.unwrap();
                let (sa, sb) = (f.ns(a), f.ns(b));
                s.spawn(move || {
                    let opts = SendOptions {
                        stall_timeout: Duration::from_secs(30),
                        mptcp,
                        ..SendOptions::default()
                    };
                    tcp_transfer(sa, sb, addr, port + i as u16, mb * 1_000_000, &opts)
                        .unwrap_or_else(|e| panic!("flow {a} -> {b}: {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a flow thread"))
            .collect()
    })
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

#[derive(Serialize, serde::Deserialize)]
pub struct ModeResult {
    pub mode: String,
    pub flows: usize,
    pub mean: f64,
    pub min: f64,
    pub p5: f64,
    pub p99: f64,
    /// Jain's fairness index over every flow's throughput (1: all equal).
    #[serde(default)]
    pub jain: f64,
    /// The mean of each round (seed): their spread says which differences are noise.
    #[serde(default)]
    pub round_means: Vec<f64>,
    pub fct_mean_s: f64,
    pub fct_p99_s: f64,
    /// Flows of at most [`SHORT_FLOW_BYTES`]: how many, and their mean and p99 FCT.
    #[serde(default)]
    pub short_flows: usize,
    #[serde(default)]
    pub short_fct_mean_s: f64,
    #[serde(default)]
    pub short_fct_p99_s: f64,
    pub reordered_pct: f64,
    pub fast_retransmits: u64,
    pub timeouts: u64,
    pub retrans_segs: u64,
    /// Packets dropped by the links' queues (every switch and host interface).
    pub queue_drops: u64,
    /// Bytes each measured core link carried upward during the mode (packets per path).
    pub core_links: Vec<(String, u64)>,
    /// The busiest core link's bytes over the least busy loaded one's ([`core_balance`]);
    /// infinite when none carried load (JSON writes it as null).
    #[serde(deserialize_with = "null_is_infinite")]
    pub core_links_max_over_min: f64,
    /// Core links that carried no load ([`core_balance`]): a single-path mode's unused links.
    #[serde(default)]
    pub core_links_idle: usize,
    /// The CPUs' idle time while the mode ran, in %: the headroom the fidelity check asks for.
    /// Time the hypervisor took (steal) is not headroom: the machine wanted it and did not get it.
    pub idle_cpu_pct: f64,
    /// The share of the CPUs the hypervisor took while the mode ran, in %.
    #[serde(default)]
    pub steal_cpu_pct: f64,
    /// Busy CPU-seconds of the whole machine (every namespace: senders, switches, shapers,
    /// receivers, agents) per GB the flows moved, while the mode ran.
    #[serde(default)]
    pub cpu_s_per_gb: f64,
    /// MPTCP modes: the mean number of subflows added beside the first, per flow.
    #[serde(default)]
    pub mptcp_subflows_mean: Option<f64>,
    pub per_flow: Vec<(String, String, f64, f64, u32)>,
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

fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    use serde::Deserialize as _;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// A mode of a run: a datapath mode (`sopa`, `rps`, `single` for every flow on its first path,
/// `hedera` for the Hedera baseline, `ecmp` for the switches' kernel multipath with no option,
/// `mptcp` for MPTCP over that with 1 + 4 subflows; in the entropy encoding `random` for a
/// random flow label per packet and `rr-blind` for round robin over as many random labels as
/// paths, no discovery), optionally with ablations after `+`: `r3` (`tcp_reordering` 3
/// instead of 10), `norack` (`tcp_recovery` 0: no RACK), `burst` (GSO bursts instead of packets),
/// `cellN` (flowcells of N segments instead of packets), `first0` (new flows start at path 0 as
/// in the paper, not at their hash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeSpec {
    pub base: String,
    pub reordering: u32,
    pub rack: bool,
    /// The agents' unit of spraying (`sopa-agent granularity`): packet, flowcell:N or burst.
    pub granularity: String,
    /// New flows start their round robin at path 0, as the paper's algorithm does, instead of
    /// at their hash.
    pub first0: bool,
}

impl std::str::FromStr for ModeSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut parts = s.split('+');
        let base = parts.next().unwrap_or_default().to_owned();
        if ![
            "sopa", "rps", "ecmp", "hedera", "single", "mptcp", "ideal", "random", "rr-blind",
        ]
        .contains(&base.as_str())
        {
            return Err(format!(
                "mode {s:?}: sopa, rps, ecmp, hedera, single, mptcp, ideal, or in the entropy encoding random or rr-blind, optionally +r3, +norack, +burst, +cellN, +first0"
            ));
        }
        let mut m = Self {
            base,
            reordering: 10,
            rack: true,
            granularity: "packet".into(),
            first0: false,
        };
        for p in parts {
            match p {
                "r3" => m.reordering = 3,
                "norack" => m.rack = false,
                "burst" => m.granularity = "burst".into(),
                cell if cell
                    .strip_prefix("cell")
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|n| (1..=65_535).contains(&n)) =>
                {
                    m.granularity = format!("flowcell:{}", &cell[4..]);
                }
                "first0" => m.first0 = true,
                other => {
                    return Err(format!(
                        "mode {s:?}: unknown ablation {other:?} (r3, norack, burst, cellN with N from 1 to 65535, first0)"
                    ));
                }
            }
        }
        Ok(m)
    }
}

/// Puts every host in `mode`: the datapath mode, and the ablation settings of its TCP and its
/// fabric interface.
pub fn set_mode(f: &Fabric, mode: &str) {
    let m: ModeSpec = mode.parse().unwrap_or_else(|e| panic!("{e}"));
    let host_mode = match m.base.as_str() {
        // No option: the switches' kernel multipath (MPTCP's subflows are spread by it too).
        "ecmp" | "mptcp" => "off",
        "hedera" => "pinned",
        // The big switch of the non-blocking ideal: nothing to stamp.
        "ideal" => "off",
        // Round robin over the path indexes; the labels say where they go.
        "random" | "rr-blind" => "sopa",
        other => other,
    };
    set_labels(f, m.labels()).unwrap_or_else(|e| panic!("{e}"));
    f.use_ideal(m.base == "ideal")
        .unwrap_or_else(|e| panic!("{e}"));
    for (id, agent) in &f.hosts {
        let first = if m.first0 { "zero" } else { "hash" };
        crate::agent::set_mode_with(&agent.node, host_mode, &["--first-path", first])
            .unwrap_or_else(|e| panic!("{e}"));
        let ns = f.ns(f.topo.graph().name(*id));
        ns.sysctl("net.ipv4.tcp_reordering", &m.reordering.to_string())
            .expect("tcp_reordering");
        ns.sysctl("net.ipv4.tcp_recovery", if m.rack { "1" } else { "0" })
            .expect("tcp_recovery");
        crate::agent::set_granularity(&agent.node, &m.granularity)
            .unwrap_or_else(|e| panic!("{e}"));
        if m.base == "mptcp" {
            // fabric.md: 1 + 4 subflows, the server announcing four more ports of its address.
            ns.ip(&[
                "mptcp",
                "limits",
                "set",
                "subflow",
                "4",
                "add_addr_accepted",
                "4",
            ])
            .expect("ip mptcp limits");
            let addr = f.topo.graph().node(*id).addr.expect("a host").to_string();
            // Announcements already in place stay: removing and re-adding one (modes are
            // interleaved per round) fails while the last round's subflows on its port linger
            // in TIME_WAIT (the kernel's listener does not reuse addresses). They do nothing to
            // plain TCP in the other modes.
            let present = ns
                .ip(&["mptcp", "endpoint", "show"])
                .expect("ip mptcp endpoint show");
            for port in MPTCP_PORTS {
                if present.contains(&format!("{addr} port {port} ")) {
                    continue;
                }
                ns.ip(&[
                    "mptcp",
                    "endpoint",
                    "add",
                    &addr,
                    "port",
                    &port.to_string(),
                    "signal",
                ])
                .expect("ip mptcp endpoint add");
            }
        }
    }
}

impl ModeSpec {
    /// The entropy encoding's label source the mode needs (`sopa-agent labels`): a baseline's,
    /// or the labels discovery found.
    pub fn labels(&self) -> &'static str {
        match self.base.as_str() {
            "random" => "per-packet",
            "rr-blind" => "blind",
            _ => "discovered",
        }
    }

    /// Whether the mode is a baseline of the entropy encoding only.
    pub fn entropy_only(&self) -> bool {
        self.labels() != "discovered"
    }
}

/// Every host of an entropy fabric takes its labels from `source`, all at once, each once its
/// labels are in place; a host already there is left alone. A fabric of another encoding has
/// no labels: only `discovered` applies to it.
pub fn set_labels(f: &Fabric, source: &str) -> crate::Result<()> {
    if f.encoding != sopa_topology::srv6::Encoding::Entropy {
        if source == "discovered" {
            return Ok(());
        }
        return Err(crate::Error::Failed(format!(
            "labels {source}: a baseline of the entropy encoding, and this fabric's is {}",
            f.encoding
        )));
    }
    std::thread::scope(|scope| {
        let jobs: Vec<_> = f
            .hosts
            .values()
            .filter(|a| {
                a.status()
                    .map(|st| st["entropy"]["source"] != source || st["entropy"]["done"] != true)
                    .unwrap_or(true)
            })
            .map(|a| scope.spawn(move || crate::agent::set_labels(&a.node, source)))
            .collect();
        jobs.into_iter()
            .try_for_each(|j| j.join().expect("a labels thread").map(drop))
    })
}

/// The extra ports every host announces in `mptcp` mode (one subflow each). Below the
/// ephemeral range (32768-60999): an earlier connection's local port there would make the
/// announcement's listening socket fail with EADDRINUSE.
pub const MPTCP_PORTS: [u16; 4] = [31_001, 31_002, 31_003, 31_004];

#[cfg(test)]
mod tests {
    use super::{ModeSpec, flow_line};

    #[test]
    fn a_stray_packet_on_an_unused_core_link_counts_it_idle_not_in_the_ratio() {
        use super::{core_balance, core_balance_text};
        // Single path: one link carried everything, another one control packet, two nothing.
        let (r, idle) = core_balance(&[125_000_000, 70, 0, 0]);
        assert_eq!((r, idle), (1.0, 3));
        assert_eq!(core_balance_text(r, idle), "1.00 +3 idle");
        let (r, idle) = core_balance(&[104, 100, 98, 102]);
        assert!((r - 104.0 / 98.0).abs() < 1e-12 && idle == 0);
        assert_eq!(core_balance_text(r, idle), "1.06");
        // Just at the share a link is loaded; just under it, idle.
        assert_eq!(core_balance(&[1000, 10]), (100.0, 0));
        assert_eq!(core_balance(&[1000, 9]).1, 1);
        let (r, idle) = core_balance(&[0, 0]);
        assert!(r.is_infinite() && idle == 2);
        assert_eq!(core_balance_text(r, idle), "all idle");
        assert!(core_balance(&[]).0.is_infinite());
    }

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_a_hog() {
        assert!((super::jain(&[0.5, 0.5, 0.5, 0.5]) - 1.0).abs() < 1e-12);
        assert!((super::jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((super::jain(&[0.6, 0.2]) - 0.8).abs() < 1e-12);
    }

    #[test]
    fn spreads_overlap_only_when_they_meet_on_either_side() {
        use super::spreads_overlap;
        // Below, above, and either way round: apart.
        assert!(!spreads_overlap(&[0.41, 0.47], &[0.69, 0.70]));
        assert!(!spreads_overlap(&[0.69, 0.70], &[0.41, 0.47]));
        // Meeting, nested, touching.
        assert!(spreads_overlap(&[0.5, 0.7], &[0.6, 0.8]));
        assert!(spreads_overlap(&[0.6, 0.8], &[0.5, 0.7]));
        assert!(spreads_overlap(&[0.4, 0.9], &[0.6, 0.7]));
        assert!(spreads_overlap(&[0.5, 0.6], &[0.6, 0.7]));
    }

    #[test]
    fn a_flow_line_carries_both_hashes() {
        let a = "ab".repeat(16);
        let line = |sent: &str, received: &str| {
            serde_json::json!({
                "index": 0, "bytes": 1000, "fct_s": 0.5, "intact": true,
                "sent_digest": sent, "received_digest": received, "total_retrans": 3,
            })
        };
        let t = flow_line(&line(&a, &a), 1000).unwrap();
        assert!(t.intact());
        assert_eq!(t.tcp.total_retrans, 3);
        // One byte changed on the way: not intact, whatever the tool's own verdict said.
        let mut b = a.clone();
        b.replace_range(0..2, "ac");
        assert!(!flow_line(&line(&a, &b), 1000).unwrap().intact());
        assert!(flow_line(&line(&a, "zz"), 1000).is_err());
        assert!(flow_line(&line(&a, &a), 999).is_err());
        assert!(flow_line(&serde_json::json!({"error": "refused"}), 1000).is_err());
    }

    #[test]
    fn modes_and_ablations_parse() {
        let m: ModeSpec = "sopa+r3+norack".parse().unwrap();
        assert_eq!(
            (
                m.base.as_str(),
                m.reordering,
                m.rack,
                m.granularity.as_str()
            ),
            ("sopa", 3, false, "packet")
        );
        let m: ModeSpec = "rps+burst".parse().unwrap();
        assert!(m.granularity == "burst" && m.rack && m.reordering == 10);
        let m: ModeSpec = "sopa+cell8".parse().unwrap();
        assert_eq!(m.granularity, "flowcell:8");
        assert!(
            "sopa+cell0"
                .parse::<ModeSpec>()
                .unwrap_err()
                .contains("cellN")
        );
        assert_eq!("hedera".parse::<ModeSpec>().unwrap().base, "hedera");
        assert_eq!("mptcp".parse::<ModeSpec>().unwrap().base, "mptcp");
        assert_eq!("single".parse::<ModeSpec>().unwrap().base, "single");
        assert!(
            "quic"
                .parse::<ModeSpec>()
                .unwrap_err()
                .contains("mptcp, ideal, or in the entropy encoding random or rr-blind")
        );
        let random: ModeSpec = "random".parse().unwrap();
        assert_eq!(
            (random.labels(), random.entropy_only()),
            ("per-packet", true)
        );
        let blind: ModeSpec = "rr-blind+r3".parse().unwrap();
        assert_eq!((blind.labels(), blind.reordering), ("blind", 3));
        assert!(!"sopa".parse::<ModeSpec>().unwrap().entropy_only());
        assert!(
            "sopa+fast"
                .parse::<ModeSpec>()
                .unwrap_err()
                .contains("unknown ablation")
        );
    }
}
