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

/// The bench's datapaths.
#[derive(Clone, Copy)]
enum Dp {
    /// The option, every rack prefix one length (the exact match).
    Main,
    /// The option, a prefix of another length more (the trie's longest match).
    Trie,
    /// SRv6, exact matches.
    Six,
    /// SRv6, the tries.
    SixTrie,
}

/// The path meter's period as agents run it by default (`--meter-period-ms 250`).
const METER_PERIOD_NS: u64 = 250_000_000;

/// What a row runs.
#[derive(Clone, Copy)]
enum Prog {
    TcPass,
    XdpPass,
    /// A floor in the baselines' object, by program name.
    Baseline(&'static str),
    Stamp(Dp),
    Strip(Dp),
}

impl Prog {
    /// An XDP program (against `XDP_PASS`), or a TC one (against the empty classifier).
    fn is_xdp(self) -> bool {
        match self {
            Prog::XdpPass | Prog::Strip(_) => true,
            Prog::Baseline(name) => name.starts_with("xdp_"),
            Prog::TcPass | Prog::Stamp(_) => false,
        }
    }
}

/// One program on one input, timed by the kernel and summed over single runs.
struct Row<'a> {
    name: &'static str,
    prog: Prog,
    input: &'a [u8],
    meter: bool,
    reordering: bool,
}

impl<'a> Row<'a> {
    fn new(name: &'static str, prog: Prog, input: &'a [u8]) -> Self {
        Self {
            name,
            prog,
            input,
            meter: true,
            reordering: false,
        }
    }

    fn meter_off(self) -> Self {
        Self {
            meter: false,
            ..self
        }
    }

    fn reordering(self) -> Self {
        Self {
            reordering: true,
            ..self
        }
    }
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
            fabric.len() + 48,
            "the benchmark packet is encapsulated, with the path meter's mark"
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
    let mut dps = [dp, dp_trie, dp6, dp6_trie];
    // Each row: what runs, on which input, against which empty program; the path meter on
    // (the agents' default, every 250 ms) unless the row says otherwise.
    let rows = [
        Row::new("tc: empty program (baseline)", Prog::TcPass, &fabric),
        Row::new(
            "tc_stamp, fabric TCP (stamped)",
            Prog::Stamp(Dp::Main),
            &fabric,
        ),
        Row::new(
            "tc_stamp, other destination (passed)",
            Prog::Stamp(Dp::Main),
            &outside,
        ),
        Row::new(
            "tc_stamp, no prefix (exact match)",
            Prog::Stamp(Dp::Main),
            &inside,
        ),
        Row::new(
            "tc_stamp, stamped, meter off",
            Prog::Stamp(Dp::Main),
            &fabric,
        )
        .meter_off(),
        Row::new(
            "tc_stamp, stamped, two lengths (trie)",
            Prog::Stamp(Dp::Trie),
            &fabric,
        ),
        Row::new(
            "tc_stamp, no prefix, two lengths (trie)",
            Prog::Stamp(Dp::Trie),
            &inside,
        ),
        Row::new(
            "tc_stamp, fabric TCP (SRv6 encapsulated)",
            Prog::Stamp(Dp::Six),
            &fabric,
        ),
        Row::new(
            "tc_stamp, SRv6, two lengths (tries)",
            Prog::Stamp(Dp::SixTrie),
            &fabric,
        ),
        Row::new(
            "tc: adjust_room +4 alone (floor)",
            Prog::Baseline("tc_room"),
            &fabric,
        ),
        Row::new("xdp: XDP_PASS (baseline)", Prog::XdpPass, &fabric),
        Row::new(
            "xdp_strip, stamped TCP (stripped)",
            Prog::Strip(Dp::Main),
            &stamped,
        ),
        Row::new(
            "xdp_strip, plain TCP (passed)",
            Prog::Strip(Dp::Main),
            &fabric,
        ),
        Row::new(
            "xdp_strip, stripped, meter off",
            Prog::Strip(Dp::Main),
            &stamped,
        )
        .meter_off(),
        Row::new(
            "xdp_strip, stamped, reordering measured",
            Prog::Strip(Dp::Main),
            &stamped,
        )
        .reordering(),
        Row::new(
            "xdp_strip, SRv6 (decapsulated)",
            Prog::Strip(Dp::Six),
            &encapsulated,
        ),
        Row::new(
            "xdp: adjust_head +4 alone (floor)",
            Prog::Baseline("xdp_head"),
            &fabric,
        ),
    ];
    let mut totals = vec![(0u128, 0u64); rows.len()];
    let batch = 10_000u32.min(args.runs);
    let batches = args.runs.div_ceil(batch);
    eprintln!(
        "test_run: {} runs of each of {} programs, interleaved in batches of {batch}",
        batches * batch,
        rows.len()
    );
    // The meter and reordering switches are the option's exact-match datapath's: a row of
    // another datapath must not claim them.
    for row in &rows {
        let main = matches!(row.prog, Prog::Stamp(Dp::Main) | Prog::Strip(Dp::Main));
        assert!(main || (row.meter && !row.reordering), "{}", row.name);
    }
    for _ in 0..batches {
        for (row, total) in rows.iter().zip(&mut totals) {
            maps.set_reordering_measured(row.reordering).unwrap();
            maps.set_meter_period(if row.meter { METER_PERIOD_NS } else { 0 })
                .unwrap();
            for _ in 0..batch {
                let mut f = |opts: TestRunOptions| -> u128 {
                    let r = match row.prog {
                        Prog::TcPass => tc_pass_ref(&mut baseline).test_run(opts),
                        Prog::XdpPass => xdp_pass_ref(&mut baseline).test_run(opts),
                        Prog::Baseline(name) if row.prog.is_xdp() => {
                            prog_ref::<Xdp>(&mut baseline, name).test_run(opts)
                        }
                        Prog::Baseline(name) => {
                            prog_ref::<SchedClassifier>(&mut baseline, name).test_run(opts)
                        }
                        Prog::Stamp(dp) => dps[dp as usize].stamp_program().test_run(opts),
                        Prog::Strip(dp) => dps[dp as usize].strip_program().test_run(opts),
                    }
                    .expect("test_run");
                    r.duration.as_nanos()
                };
                total.0 += run_once(&mut f, row.input, &mut out);
                total.1 += 1;
            }
        }
    }
    let mean = |name: &str| {
        let i = rows
            .iter()
            .position(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row {name}"));
        totals[i].0 as f64 / totals[i].1 as f64
    };
    println!();
    println!(
        "datapath cost per packet (BPF_PROG_TEST_RUN, kernel-timed, 1514-byte TCP frame; \
         path meter on, as agents run by default, unless a row says off)"
    );
    println!(
        "{:<42} {:>10} {:>14} {:>8}",
        "program", "ns/packet", "over baseline", "ratio"
    );
    for row in &rows {
        let ns = mean(row.name);
        // Each program against the empty program of its hook.
        let base = mean(if row.prog.is_xdp() {
            "xdp: XDP_PASS (baseline)"
        } else {
            "tc: empty program (baseline)"
        });
        println!(
            "{:<42} {:>10.1} {:>+14.1} {:>8.2}",
            row.name,
            ns,
            ns - base,
            ns / base
        );
    }
    let over = |a: &str, b: &str| mean(a) - mean(b);
    let (tc, xdp) = ("tc: empty program (baseline)", "xdp: XDP_PASS (baseline)");
    let (stamped_row, stripped_row) = (
        "tc_stamp, fabric TCP (stamped)",
        "xdp_strip, stamped TCP (stripped)",
    );
    let (six, six_strip) = (
        "tc_stamp, fabric TCP (SRv6 encapsulated)",
        "xdp_strip, SRv6 (decapsulated)",
    );
    println!(
        "SRv6 over the option: encapsulating {:+.1} ns/packet ({:.2}x the option's cost), \
         decapsulating {:+.1} ns/packet ({:.2}x)",
        over(six, stamped_row),
        over(six, tc) / over(stamped_row, tc),
        over(six_strip, stripped_row),
        over(six_strip, xdp) / over(stripped_row, xdp)
    );
    println!(
        "one exact match over the trie's longest match (1,152 rack prefixes): stamped {:+.1} \
         ns/packet, no prefix {:+.1}, SRv6 {:+.1}",
        over(stamped_row, "tc_stamp, stamped, two lengths (trie)"),
        over(
            "tc_stamp, no prefix (exact match)",
            "tc_stamp, no prefix, two lengths (trie)"
        ),
        over(six, "tc_stamp, SRv6, two lengths (tries)")
    );
    println!(
        "the path meter: stamped {:+.1} ns/packet, stripped {:+.1}",
        over(stamped_row, "tc_stamp, stamped, meter off"),
        over(stripped_row, "xdp_strip, stripped, meter off")
    );
    drop(baseline);
    drop(dps);
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
    maps.set_meter_period(METER_PERIOD_NS).unwrap();
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
