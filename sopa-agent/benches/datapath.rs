//! `cargo xtask bench datapath`: the cost of the datapath, measured side by side in one run.
//!
//! 1. ns per packet of `tc_stamp` and `xdp_strip` against programs that do nothing, through
//!    BPF_PROG_TEST_RUN, runs interleaved so both see the same machine: the IPv4 option and the
//!    SRv6 encoding (a second datapath, encapsulating) side by side; `xdp_strip` as agents run
//!    it (reordering not measured) and measuring reordering; and the floors, the kernel helper
//!    that makes or removes the option's room alone (`tc_room`, `xdp_head`), which no encoding
//!    that inserts bytes can go below.
//! 2. Single-stream TCP throughput A -> R -> B (iperf3, cubic) without agents and with agents
//!    at both granularities, rounds interleaved; medians and ratios.

use std::{process::Command, time::Duration};

use aya::{
    EbpfLoader,
    programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp},
};
use sopa_agent::{
    datapath::{self, Datapath, MapSet},
    path_table::PathTable,
};
use sopa_common::maps::{Config, lookup, mode};
use sopa_testbed::{Process, arb::Arb};

struct Args {
    runs: u32,
    iperf_seconds: u32,
    rounds: u32,
}

fn parse_args() -> Args {
    let mut args = Args {
        runs: 1_000_000,
        iperf_seconds: 5,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> u32 {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match a.as_str() {
            "--runs" => args.runs = value("--runs"),
            "--iperf-seconds" => args.iperf_seconds = value("--iperf-seconds"),
            // 0: the test_run table alone.
            "--rounds" => args.rounds = value("--rounds"),
            "--bench" => {}
            other => {
                panic!(
                    "unknown argument {other}; use --runs N, --iperf-seconds S, --rounds R (0: no iperf3)"
                )
            }
        }
    }
    args
}

fn frame(dst: [u8; 4], payload: usize) -> Vec<u8> {
    let builder = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 101, 1, 2], dst, 64)
        .tcp(40000, 5201, 1, 65535)
        .ack(1);
    let mut out = Vec::new();
    builder.write(&mut out, &vec![0x5a; payload]).unwrap();
    out
}

/// Kernel-measured run time of one program on one input, summed over single runs.
struct Meter {
    name: &'static str,
    total_ns: u128,
    runs: u64,
}

fn main() {
    let args = parse_args();
    test_run_table(&args);
    if args.rounds > 0 {
        throughput_table(&args);
    }
}

fn test_run_table(args: &Args) {
    // A rack prefix per edge switch of a k=48 Fat-Tree (1,152 /24s), the benchmark's
    // destination among them: the trie's walk is as deep as in such a fabric.
    let racks: String = (0..48u32)
        .flat_map(|pod| (0..24u32).map(move |edge| (pod, edge)))
        .map(|(pod, edge)| {
            format!(
                "[[destination]]\nprefix = \"10.{pod}.{edge}.0/24\"\n\
                 paths = [[0, 0], [0, 1], [1, 0], [1, 1]]\n"
            )
        })
        .collect();
    // The same racks in the SRv6 encoding, each with its switches' uSIDs.
    let srv6 = "encoding = \"srv6\"\n[srv6]\nsource = \"fd00:5a::a65:102\"\n\
                receive = \"fcbb:bb00:9:e102::\"\n";
    let racks6: String = racks.replace(
        "paths = [[0, 0], [0, 1], [1, 0], [1, 1]]\n",
        "paths = [[0, 0], [0, 1], [1, 0], [1, 1]]\n\
         segments = [[1, 3], [1, 4], [2, 5], [2, 6]]\ntail = [9]\n",
    );
    // One prefix of another length more: the tries' longest match, as every datapath looked
    // destinations up before the exact match.
    let other_length = "[[destination]]\nprefix = \"10.200.0.0/19\"\npaths = [[0, 0]]\n";
    let (mut dp, mut maps, pins) = loaded("", &racks);
    let (mut dp_trie, maps_trie, pins_trie) = loaded("trie-", &format!("{racks}{other_length}"));
    let (mut dp6, maps6, pins6) = loaded("6-", &format!("{srv6}{racks6}"));
    let (mut dp6_trie, maps6_trie, pins6_trie) = loaded(
        "6-trie-",
        &format!("{srv6}{racks6}{other_length}segments = [[1, 3]]\ntail = [9]\n"),
    );
    for (m, want) in [
        (&maps, Some(24)),
        (&maps_trie, None),
        (&maps6, Some(24)),
        (&maps6_trie, None),
    ] {
        assert_eq!(m.exact_length_of(lookup::PATHS).unwrap(), want);
    }
    assert_eq!(maps6.exact_length_of(lookup::SRV6_DESTS).unwrap(), Some(24));
    assert_eq!(
        maps6_trie.exact_length_of(lookup::SRV6_DESTS).unwrap(),
        None
    );
    let mut baseline = EbpfLoader::new()
        .default_map_pin_directory(&pins)
        .load(datapath::OBJECT)
        .expect("load the baselines");
    let tc_pass: &mut SchedClassifier =
        baseline.program_mut("tc_pass").unwrap().try_into().unwrap();
    tc_pass.load().unwrap();
    let xdp_pass: &mut Xdp = baseline
        .program_mut("xdp_pass")
        .unwrap()
        .try_into()
        .unwrap();
    xdp_pass.load().unwrap();
    prog_ref::<SchedClassifier>(&mut baseline, "tc_room")
        .load()
        .unwrap();
    let xdp_head: &mut Xdp = baseline
        .program_mut("xdp_head")
        .unwrap()
        .try_into()
        .unwrap();
    xdp_head.load().unwrap();

    let fabric = frame([10, 3, 1, 2], 1448);
    let outside = frame([192, 168, 9, 9], 1448);
    // Inside the prefix that covers the racks (10.0.0.0/10), in none of them: looked up, missed.
    let inside = frame([10, 63, 0, 1], 1448);
    let mut out = vec![0u8; 2048];
    let run_once = |prog: &mut dyn FnMut(TestRunOptions) -> u128, input: &[u8], out: &mut [u8]| {
        prog(TestRunOptions {
            data_in: Some(input),
            data_out: Some(out),
            ..Default::default()
        })
    };
    // What a program makes of `input`.
    let output = |prog: &mut SchedClassifier, input: &[u8]| {
        let mut out = vec![0u8; 2048];
        let r = prog
            .test_run(TestRunOptions {
                data_in: Some(input),
                data_out: Some(&mut out),
                ..Default::default()
            })
            .unwrap();
        out.truncate(r.data_size_out as usize);
        out
    };
    let stamped = output(dp.stamp_program(), &fabric);
    assert_eq!(
        stamped.len(),
        fabric.len() + 4,
        "the benchmark packet is stamped"
    );

    // The tries' datapaths do the same work on it.
    assert_eq!(output(dp_trie.stamp_program(), &fabric), stamped);
    assert_eq!(
        output(dp6_trie.stamp_program(), &fabric),
        output(dp6.stamp_program(), &fabric)
    );

    assert_eq!(
        output(dp.stamp_program(), &inside),
        inside,
        "no prefix: passed"
    );
    assert_eq!(output(dp_trie.stamp_program(), &inside), inside);

    // The floors do their work on this packet too (a helper that failed would cost less).
    assert_eq!(
        output(prog_ref(&mut baseline, "tc_room"), &fabric).len(),
        fabric.len() + 4,
        "tc_room makes the option's room"
    );
    let mut head_out = vec![0u8; 2048];
    let head = prog_ref::<Xdp>(&mut baseline, "xdp_head")
        .test_run(TestRunOptions {
            data_in: Some(&fabric),
            data_out: Some(&mut head_out),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        head.data_size_out as usize,
        fabric.len() - 4,
        "xdp_head removes 4 bytes"
    );
    let encapsulated = {
        let mut p = output(dp6.stamp_program(), &fabric);
        assert_eq!(
            p.len(),
            fabric.len() + 40,
            "the benchmark packet is encapsulated"
        );
        // As it arrives: the list consumed down to the destination's own address.
        p[14 + 24..14 + 40].copy_from_slice(
            &"fcbb:bb00:9:e102::"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        p
    };
    let mut meters = [
        Meter {
            name: "tc: empty program (baseline)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc_stamp, fabric TCP (stamped)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc_stamp, other destination (passed)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "xdp: XDP_PASS (baseline)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "xdp_strip, stamped TCP (stripped)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "xdp_strip, plain TCP (passed)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc_stamp, fabric TCP (SRv6 encapsulated)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "xdp_strip, SRv6 (decapsulated)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "xdp_strip, stamped, reordering measured",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc: adjust_room +4 alone (floor)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "xdp: adjust_head +4 alone (floor)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc_stamp, stamped, two lengths (trie)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc_stamp, no prefix, two lengths (trie)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc_stamp, SRv6, two lengths (tries)",
            total_ns: 0,
            runs: 0,
        },
        Meter {
            name: "tc_stamp, no prefix (exact match)",
            total_ns: 0,
            runs: 0,
        },
    ];
    let batch = 10_000u32.min(args.runs);
    let batches = args.runs.div_ceil(batch);
    eprintln!(
        "test_run: {} runs of each of {} programs, interleaved in batches of {batch}",
        batches * batch,
        meters.len()
    );
    for _ in 0..batches {
        for (i, meter) in meters.iter_mut().enumerate() {
            // Off unless asked for, as an agent runs it by default.
            maps.set_reordering_measured(i == 8).unwrap();
            for _ in 0..batch {
                let mut f = |opts: TestRunOptions| -> u128 {
                    let r = match i {
                        0 => tc_pass_ref(&mut baseline).test_run(opts),
                        1 | 2 | 14 => dp.stamp_program().test_run(opts),
                        3 => xdp_pass_ref(&mut baseline).test_run(opts),
                        6 => dp6.stamp_program().test_run(opts),
                        7 => dp6.strip_program().test_run(opts),
                        9 => prog_ref::<SchedClassifier>(&mut baseline, "tc_room").test_run(opts),
                        10 => prog_ref::<Xdp>(&mut baseline, "xdp_head").test_run(opts),
                        11 | 12 => dp_trie.stamp_program().test_run(opts),
                        13 => dp6_trie.stamp_program().test_run(opts),
                        _ => dp.strip_program().test_run(opts),
                    }
                    .expect("test_run");
                    r.duration.as_nanos()
                };
                let input: &[u8] = match i {
                    0 | 1 | 3 | 6 | 9 | 10 | 11 | 13 => &fabric,
                    2 => &outside,
                    12 | 14 => &inside,
                    4 | 8 => &stamped,
                    7 => &encapsulated,
                    _ => &fabric,
                };
                meter.total_ns += run_once(&mut f, input, &mut out);
                meter.runs += 1;
            }
        }
    }
    let mean = |m: &Meter| m.total_ns as f64 / m.runs as f64;
    println!();
    println!("datapath cost per packet (BPF_PROG_TEST_RUN, kernel-timed, 1514-byte TCP frame)");
    println!(
        "{:<40} {:>10} {:>14} {:>8}",
        "program", "ns/packet", "over baseline", "ratio"
    );
    for (i, m) in meters.iter().enumerate() {
        let base = if i < 3 || i == 6 || i == 9 || i >= 11 {
            mean(&meters[0])
        } else {
            mean(&meters[3])
        };
        println!(
            "{:<40} {:>10.1} {:>+14.1} {:>8.2}",
            m.name,
            mean(m),
            mean(m) - base,
            mean(m) / base
        );
    }
    let over = |i: usize, base: usize| mean(&meters[i]) - mean(&meters[base]);
    println!(
        "SRv6 over the option: encapsulating {:+.1} ns/packet ({:.2}x the option's cost), \
         decapsulating {:+.1} ns/packet ({:.2}x)",
        over(6, 1),
        over(6, 0) / over(1, 0),
        over(7, 4),
        over(7, 3) / over(4, 3)
    );
    println!(
        "one exact match over the trie's longest match (1,152 rack prefixes): stamped {:+.1} \
         ns/packet, no prefix {:+.1}, SRv6 {:+.1}",
        over(1, 11),
        over(14, 12),
        over(6, 13)
    );
    drop(baseline);
    drop(dp);
    drop(dp6);
    drop(dp_trie);
    drop(dp6_trie);
    let _ = std::fs::remove_dir_all(&pins);
    let _ = std::fs::remove_dir_all(&pins6);
    let _ = std::fs::remove_dir_all(&pins_trie);
    let _ = std::fs::remove_dir_all(&pins6_trie);
}

/// A datapath of its own (pins under `sopa-bench-{tag}PID`) in `sopa` mode, given `table`.
fn loaded(tag: &str, table: &str) -> (Datapath, MapSet, std::path::PathBuf) {
    let pins = std::path::PathBuf::from(format!(
        "/sys/fs/bpf/sopa-bench-{tag}{}",
        std::process::id()
    ));
    let mut dp = Datapath::load(&pins).expect("load the datapath");
    let mut maps = dp.take_maps().unwrap();
    maps.set_config(Config {
        mode: mode::SOPA,
        hash_seed: 1,
    })
    .unwrap();
    let table = PathTable::parse(table).unwrap();
    maps.apply_paths(&table).unwrap();
    maps.apply_srv6(table.srv6.as_ref()).unwrap();
    (dp, maps, pins)
}

fn prog_ref<'a, P>(ebpf: &'a mut aya::Ebpf, name: &str) -> &'a mut P
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program>,
    <&'a mut P as TryFrom<&'a mut aya::programs::Program>>::Error: std::fmt::Debug,
{
    ebpf.program_mut(name).unwrap().try_into().unwrap()
}

fn tc_pass_ref(ebpf: &mut aya::Ebpf) -> &mut SchedClassifier {
    ebpf.program_mut("tc_pass").unwrap().try_into().unwrap()
}

fn xdp_pass_ref(ebpf: &mut aya::Ebpf) -> &mut Xdp {
    ebpf.program_mut("xdp_pass").unwrap().try_into().unwrap()
}

/// Runs one iperf3 client from A to B and returns the receiver's Gbit/s.
fn iperf(arb: &Arb, seconds: u32) -> f64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            arb.a.name(),
            "iperf3",
            "-c",
            "10.101.2.2",
            "-p",
            "5299",
            "-C",
            "cubic",
            "-J",
            // Client on CPU 0, server on CPU 1: unpinned, single runs flipped between two
            // modes (both on one CPU or not), 8 and 27 Gbit/s without agents in one run.
            "-A",
            "0,1",
        ])
        .args(["-t", &seconds.to_string()])
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

fn throughput_table(args: &Args) {
    let arb = Arb::new("bench").expect("build A - R - B");
    let log = std::env::temp_dir().join(format!("{}-iperf3.log", arb.b.name()));
    let _server = Process::spawn(
        Some(&arb.b),
        std::path::Path::new("iperf3"),
        &["-s", "-p", "5299"],
        &log,
    )
    .expect("iperf3 server");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !arb.b.tcp_listening(5299).unwrap_or(false) {
        assert!(
            std::time::Instant::now() < deadline,
            "the iperf3 server does not listen (log {})",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
}
