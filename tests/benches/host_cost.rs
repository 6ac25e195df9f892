//! `cargo xtask bench host-cost [-- --mbit 500 --seconds 4 --rounds 3 --streams 1,8]`: what
//! spraying costs a host at a fixed offered load. iperf3 from A to B through R at `--mbit`
//! Mbit/s in all (`-b`, split over the streams), single-stream and multi-stream, without the
//! agents and with both agents per GSO burst, per flowcell of 16, 8, 4 segments and per packet;
//! the granularity is changed at run time (`sopa-agent granularity`), every configuration once
//! per round, interleaved. Per configuration: the rate reached, and the machine's busy
//! CPU-seconds per GB delivered (`/proc/stat`: A, R and B share the machine, so this is the
//! sender's, the router's and the receiver's work together), as ratios to no agent and to per
//! packet.

use std::process::Command;

use sopa_testbed::{agent::set_granularity, arb::Arb, experiment::cpu};

struct Args {
    mbit: u32,
    seconds: u32,
    rounds: u32,
    streams: Vec<u32>,
}

/// The command line (`cargo xtask bench host-cost -- --help`).
#[derive(clap::Parser)]
#[command(
    name = "bench host-cost",
    about = "The CPU a transfer costs the sender, the router and the receiver, per granularity, against no agent"
)]
struct Cli {
    /// The transfer's rate, Mbit/s.
    #[arg(long, default_value_t = 500)]
    mbit: u32,
    /// Seconds per transfer.
    #[arg(long, default_value_t = 4)]
    seconds: u32,
    /// Rounds over every configuration.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Parallel TCP streams, comma-separated: a row each.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    streams: Vec<u32>,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args() -> Args {
    let cli = <Cli as clap::Parser>::parse();
    let a = Args {
        mbit: cli.mbit,
        seconds: cli.seconds,
        rounds: cli.rounds,
        streams: cli.streams,
    };
    assert!(
        a.mbit > 0 && a.seconds > 0 && a.rounds > 0 && a.streams.iter().all(|s| *s > 0),
        "--mbit, --seconds, --rounds and --streams must be positive"
    );
    a
}

/// The configurations, in the order each round runs them: `None` is no agent.
const GRANULARITIES: [Option<&str>; 6] = [
    None,
    Some("burst"),
    Some("flowcell:16"),
    Some("flowcell:8"),
    Some("flowcell:4"),
    Some("packet"),
];

const PORT: u16 = 5301;

/// One iperf3 run: (Gbit/s received, busy CPU-seconds per GB received).
fn measure(arb: &Arb, a: &Args, streams: u32) -> (f64, f64) {
    let per_stream = format!("{}K", u64::from(a.mbit) * 1000 / u64::from(streams));
    let (idle0, total0) = cpu();
    let out = Command::new("ip")
        .args(["netns", "exec", arb.a.name(), "iperf3", "-c"])
        .arg(arb.b_addr.to_string())
        .args(["-p", &PORT.to_string(), "-C", "cubic", "-J"])
        .args(["-t", &a.seconds.to_string()])
        .args(["-P", &streams.to_string(), "-b", &per_stream])
        .output()
        .expect("run iperf3");
    let (idle1, total1) = cpu();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
        panic!(
            "iperf3 output is not JSON ({err}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let received = &report["end"]["sum_received"];
    let bytes = received["bytes"]
        .as_f64()
        .unwrap_or_else(|| panic!("iperf3 failed: {}", report["error"]));
    let gbit = received["bits_per_second"].as_f64().unwrap_or(0.0) / 1e9;
    let hz = sopa_testbed::experiment::clock_ticks_per_s();
    let busy_s = total1
        .saturating_sub(total0)
        .saturating_sub(idle1.saturating_sub(idle0)) as f64
        / hz;
    (gbit, busy_s / (bytes / 1e9).max(1e-9))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = args();
    let arb = Arb::new("cost").expect("build A - R - B");
    let _server = arb.iperf3_server(PORT).expect("iperf3 server");
    // [streams][configuration] -> runs of (Gbit/s, CPU s/GB).
    let mut runs = vec![vec![Vec::<(f64, f64)>::new(); GRANULARITIES.len()]; a.streams.len()];
    eprintln!(
        "iperf3 at {} Mbit/s in all: {} rounds x {} configurations x {} stream counts, {} s each",
        a.mbit,
        a.rounds,
        GRANULARITIES.len(),
        a.streams.len(),
        a.seconds
    );
    let progress = indicatif::ProgressBar::new(u64::from(a.rounds) * GRANULARITIES.len() as u64);
    for _ in 0..a.rounds {
        let mut agents = None;
        for (ci, g) in GRANULARITIES.iter().enumerate() {
            if let Some(g) = g {
                let (ag_a, ag_b) = agents.get_or_insert_with(|| {
                    arb.start_agents(4, &["--no-metrics", "--granularity", "packet"])
                        .expect("agents on A and B")
                });
                for agent in [&*ag_a, &*ag_b] {
                    set_granularity(&agent.node, g).unwrap_or_else(|e| panic!("{e}"));
                }
            }
            for (si, streams) in a.streams.iter().enumerate() {
                runs[si][ci].push(measure(&arb, &a, *streams));
            }
            progress.inc(1);
        }
        if let Some((ag_a, ag_b)) = agents {
            let stamped = ag_a.status().unwrap()["stamp"]["stamped"]
                .as_u64()
                .unwrap_or(0);
            assert!(stamped > 0, "the agent stamped nothing");
            assert_eq!(ag_a.stop(), Some(0));
            assert_eq!(ag_b.stop(), Some(0));
        }
    }
    progress.finish_and_clear();
    println!();
    println!(
        "host cost at a fixed offered load: iperf3 A -> R -> B, {} Mbit/s in all, cubic, {} s, {} rounds interleaved (medians)",
        a.mbit, a.seconds, a.rounds
    );
    println!(
        "{:>7} {:<19} {:>8} {:>9} {:>10} {:>8}   CPU s/GB per round",
        "streams", "configuration", "Gbit/s", "CPU s/GB", "/no agent", "/packet"
    );
    for (si, streams) in a.streams.iter().enumerate() {
        let cpu_of = |ci: usize| median(&runs[si][ci].iter().map(|r| r.1).collect::<Vec<_>>());
        let (none, packet) = (cpu_of(0), cpu_of(GRANULARITIES.len() - 1));
        for (ci, g) in GRANULARITIES.iter().enumerate() {
            let rate = median(&runs[si][ci].iter().map(|r| r.0).collect::<Vec<_>>());
            let c = cpu_of(ci);
            let short = if rate * 1e3 < 0.95 * f64::from(a.mbit) {
                "  (did not reach the offered load)"
            } else {
                ""
            };
            let each: Vec<String> = runs[si][ci].iter().map(|r| format!("{:.2}", r.1)).collect();
            println!(
                "{streams:>7} {:<19} {rate:>8.3} {c:>9.2} {:>10.2} {:>8.2}   {}{short}",
                g.map_or("no agent".to_owned(), |g| format!("agent {g}")),
                c / none,
                c / packet,
                each.join(" ")
            );
        }
    }
    println!(
        "(CPU s/GB: busy CPU-seconds of the whole machine, sender, router and receiver together, per GB delivered)"
    );
}
