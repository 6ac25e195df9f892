//! Single-stream TCP A -> R -> B with and without agents (iperf3): the throughput, and the
//! skbs B's stack receives per segment A sent (GRO kept or lost at the receiver).

use std::process::Command;

use sopa_testbed::{arb::Arb, capture::Capture, traffic::tcp_counters};

use crate::Args;

/// The iperf3 server's port on B.
const PORT: u16 = 5299;

/// Runs one iperf3 client from A to B for `seconds` and returns the receiver's Gbit/s.
fn iperf(arb: &Arb, seconds: u32) -> f64 {
    iperf_with(arb, &["-t", &seconds.to_string()])
}

/// Runs one iperf3 client from A to B with `extra` arguments (how long, or how much), and
/// returns the receiver's Gbit/s.
fn iperf_with(arb: &Arb, extra: &[&str]) -> f64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            arb.a.name(),
            "iperf3",
            "-c",
            "10.101.2.2",
            "-p",
            &PORT.to_string(),
            "-C",
            "cubic",
            "-J",
            // Client on CPU 0, server on CPU 1: unpinned, single runs flipped between two
            // modes (both on one CPU or not), 8 and 27 Gbit/s without agents in one run.
            "-A",
            "0,1",
        ])
        .args(extra)
        .output()
        .expect("run iperf3");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
        panic!(
            "iperf3 output is not JSON ({err}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| panic!("iperf3 failed: {}", report["error"]))
        / 1e9
}

/// The throughput table: iperf3 without agents and with agents at both granularities; then the
/// receiver's skbs per segment.
pub fn table(args: &Args) {
    let arb = Arb::new("bench").expect("build A - R - B");
    let _server = arb.iperf3_server(PORT).expect("iperf3 server");
    // (name, agent granularity, gso_max_segs set by hand without agents). Per-packet spraying
    // costs mostly segmentation, so it is compared with gso_max_segs 1 without agents too.
    let configs: [(&str, Option<&str>, Option<&str>); 4] = [
        ("no agent", None, None),
        ("agents, granularity burst (GSO)", Some("burst"), None),
        ("no agent, gso_max_segs 1", None, Some("1")),
        ("agents, granularity packet", Some("packet"), None),
    ];
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    eprintln!(
        "iperf3: {} rounds of {} configurations, {} s each",
        args.rounds,
        configs.len(),
        args.iperf_seconds
    );
    for _ in 0..args.rounds {
        for (i, (_, granularity, segs)) in configs.iter().enumerate() {
            let set_segs = |v: &str| {
                arb.a
                    .ip(&["link", "set", &arb.a_if, "gso_max_segs", v])
                    .unwrap();
                arb.b
                    .ip(&["link", "set", &arb.b_if, "gso_max_segs", v])
                    .unwrap();
            };
            if let Some(v) = segs {
                set_segs(v);
            }
            let agents = granularity.map(|g| {
                arb.start_agents(4, &["--granularity", g, "--no-metrics"])
                    .unwrap()
            });
            results[i].push(iperf(&arb, args.iperf_seconds));
            if segs.is_some() {
                set_segs("65535");
            }
            if let Some((a, b)) = agents {
                let stamped = a.status().unwrap()["stamp"]["stamped"]
                    .as_u64()
                    .unwrap_or(0);
                assert!(stamped > 0, "the agent stamped nothing");
                a.stop();
                b.stop();
            }
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (base_median, base_best) = (median(&results[0]), best(&results[0]));
    let (segs_median, segs_best) = (median(&results[2]), best(&results[2]));
    println!();
    println!(
        "single-stream TCP A -> R -> B (iperf3, cubic, client on CPU 0, server on CPU 1, {} s, {} rounds)",
        args.iperf_seconds, args.rounds
    );
    println!(
        "{:<34} {:>8} {:>6} {:>8} {:>6} {:>12}   runs",
        "configuration", "median", "ratio", "best", "ratio", "vs segs=1"
    );
    for (i, ((name, _, _), runs)) in configs.iter().zip(&results).enumerate() {
        let (m, b) = (median(runs), best(runs));
        let vs = if i == 3 {
            format!("{:.2}/{:.2}", m / segs_median, b / segs_best)
        } else {
            String::new()
        };
        let runs: Vec<String> = runs.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "{name:<34} {m:>8.2} {:>6.2} {b:>8.2} {:>6.2} {vs:>12}   {}",
            m / base_median,
            b / base_best,
            runs.join(" ")
        );
    }
    println!(
        "(Gbit/s; on 2 cores single runs flip between two modes, so read best-of-N beside the median)"
    );
    receiver_table(&arb, args);
}

/// The skbs with data B's stack receives per segment A sends, in a 16 MB transfer, without
/// agents and with them (flowcell:4, the default granularity), `xdp_strip` attached each way
/// it can be on veth. As on a real link, frames of at most the MTU cross it: A's interface
/// segments in software (TSO off; a veth would otherwise hand B whole GSO packets, which no
/// NIC does), after `tc_stamp`. B's interface holds GRO's flush 2 ms (veth's is off by default;
/// a NIC's interrupt moderation batches likewise), so merging is there to lose.
fn receiver_table(arb: &Arb, args: &Args) {
    let tso = |on: bool| {
        let state = if on { "on" } else { "off" };
        sopa_testbed::netns::run(
            "ip",
            &[
                "netns",
                "exec",
                arb.a.name(),
                "ethtool",
                "-K",
                &arb.a_if,
                "tso",
                state,
            ],
        )
        .expect("ethtool on A");
    };
    let gro = |on: bool| {
        let (state, hold) = if on { ("on", "2000000") } else { ("off", "0") };
        let out = Command::new("ip")
            .args(["netns", "exec", arb.b.name(), "sh", "-c"])
            .arg(format!(
                "ethtool -K {iface} gro {state} && echo {hold} > /sys/class/net/{iface}/gro_flush_timeout",
                iface = arb.b_if
            ))
            .output()
            .expect("run ethtool");
        assert!(out.status.success(), "setting GRO on B: {out:?}");
    };
    // (name, the agents' --xdp-mode; without agents, an empty XDP program natively on B or
    // nothing). A veth runs GRO only in NAPI, which it enables for native XDP: the empty
    // program is the same receive path without SOPA.
    // gso_max_segs 4 on A without agents: A's packets as the agents' flowcells cut them.
    let configs: [(&str, Option<&str>, bool); 5] = [
        ("no agent", None, false),
        ("no agent, empty XDP program native on B", None, true),
        ("the same, gso_max_segs 4 on A", Some("segs"), true),
        (
            "agents, xdp_strip generic (veth's auto)",
            Some("generic"),
            false,
        ),
        ("agents, xdp_strip native", Some("native"), false),
    ];
    // Its maps pinned in a folder of its own, gone with it (not aya's default, bpffs' root).
    let pins = crate::Pins::new("rx-");
    let mut empty = aya::EbpfLoader::new()
        .default_map_pin_directory(&pins)
        .load(sopa_agent::datapath::OBJECT)
        .expect("load the baselines");
    let xdp_pass: &mut aya::programs::Xdp = empty
        .program_mut("xdp_pass")
        .expect("xdp_pass")
        .try_into()
        .expect("an XDP program");
    xdp_pass.load().expect("load xdp_pass");
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut dropped = 0;
    gro(true);
    tso(false);
    for _ in 0..args.rounds {
        for (i, (_, xdp, empty_on_b)) in configs.iter().enumerate() {
            // Attached in B's namespace (the interface's name is looked up there), detached
            // at the end of the round.
            let empty_link = empty_on_b.then(|| {
                arb.b
                    .run(|| xdp_pass.attach(&arb.b_if, aya::programs::XdpMode::Driver))
                    .unwrap()
                    .expect("attach xdp_pass natively on B")
            });
            let cut = *xdp == Some("segs");
            if cut {
                arb.a
                    .ip(&["link", "set", &arb.a_if, "gso_max_segs", "4"])
                    .unwrap();
            }
            let agents = xdp.filter(|_| !cut).map(|mode| {
                arb.start_agents(4, &["--xdp-mode", mode, "--no-metrics"])
                    .unwrap()
            });
            let sent = || tcp_counters(&arb.a).unwrap()["Tcp.OutSegs"];
            let capture = Capture::start(&arb.b, &arb.b_if).unwrap();
            let before = sent();
            iperf_with(arb, &["-n", "16M"]);
            let segments = sent() - before;
            let got = capture.finish().unwrap();
            dropped += got.dropped;
            let skbs = got
                .frames
                .iter()
                .filter(|f| sopa_testbed::capture::tcp_data_to(f, PORT).is_some())
                .count();
            results[i].push(skbs as f64 / segments as f64);
            if let Some((a, b)) = agents {
                a.stop();
                b.stop();
            }
            if cut {
                arb.a
                    .ip(&["link", "set", &arb.a_if, "gso_max_segs", "65535"])
                    .unwrap();
            }
            if let Some(link) = empty_link {
                xdp_pass.detach(link).expect("detach xdp_pass");
            }
        }
    }
    gro(false);
    tso(true);
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (plain, same_path, same_cut) = (
        median(&results[0]),
        median(&results[1]),
        median(&results[2]),
    );
    println!();
    println!(
        "receiver: skbs with data B's stack receives per segment A sends (16 MB, frames of the \
         MTU, GRO on, flush held 2 ms; {} rounds, median; target with agents at most 1.1x \
         without)",
        args.rounds
    );
    println!(
        "{:<42} {:>14} {:>10} {:>14} {:>10}   runs",
        "configuration", "skbs/segment", "vs plain", "vs empty XDP", "same cut"
    );
    for ((name, _, _), runs) in configs.iter().zip(&results) {
        let m = median(runs);
        let runs: Vec<String> = runs.iter().map(|r| format!("{r:.3}")).collect();
        println!(
            "{name:<42} {m:>14.3} {:>10.2} {:>14.2} {:>10.2}   {}",
            m / plain,
            m / same_path,
            m / same_cut,
            runs.join(" ")
        );
    }
    println!(
        "(same cut: against the empty XDP program with A's packets cut as the agents' flowcells \
         cut them; GRO here merges within one of A's packets' segments, not across them)"
    );
    if dropped > 0 {
        println!("(the capture missed {dropped} frames: the figures are low by as much)");
    }
}
