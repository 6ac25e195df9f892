//! `cargo xtask bench fabric --experiment sec4.2|permutation|production|failure --modes
//! sopa,rps,ecmp,hedera,single --repeat N [--topo fat-tree:4 | --fabric INVENTORY.toml] [--rate
//! 100] [--mb 10] [--seed S]
//! [--flows-per-host 20] [--encoding ipv4-option,srv6] [--rates 10,25] [--qdisc htb|tbf]
//! [--xdp auto|generic|native,...]`: the SOPA paper's
//! experiments on the namespace fabric, the modes measured side by side in one run on one
//! fabric. With several encodings or rates, the fabric is built once per encoding and rate in
//! the same run (the same topology and seed; an SRv6 fabric's links at 1548), and the means are
//! compared mode by mode. With several `--xdp` attach modes (one encoding, one rate), a fabric
//! is built per attach mode of the hosts' `xdp_strip`, and the modes' means and the machine's
//! CPU are compared side by side.
//!
//! `--experiment granularity`: the flowcell sweep on the permutation (by default the ideal,
//! `sopa` per packet and `sopa+cellN` for N in 2, 4, 8, 16, 44, at 10 and 25 Mbit/s): per
//! flowcell its time on the wire, throughput over the ideal (mean, worst flow) and over per
//! packet, p99 FCT, reordering and the machine's CPU per GB, with a figure against the time on
//! the wire (see `sopa_testbed::granularity`).
//!
//! Modes: `sopa` (per-flow round-robin source routing), `rps` (a random path per packet),
//! `ecmp` (no option: the switches' own kernel multipath); in the entropy encoding also
//! `random` (a random flow label per packet: spraying over the switches' hash) and `rr-blind`
//! (round robin over as many random labels as paths, no discovery), which the other encodings'
//! fabrics skip; each optionally with ablations:
//! `+r3` (tcp_reordering 3 instead of 10), `+norack` (no RACK), `+burst` (GSO bursts), `+first0`
//! (new flows start at path 0, as the paper's algorithm does, not at their hash). Per mode:
//! throughput as a fraction of the link rate (mean, min, p5, p99), flow completion times (and
//! those of the flows of at most 100 kB), reordered packets (receivers'
//! counters), fast retransmits and timeouts (the hosts' TCP counters), and how evenly the
//! aggregation-to-core links were loaded. Fidelity checks first: one flow alone must reach 90%
//! of the link rate (in one of at most three tries, the best reported with the number of
//! tries), and the run reports the CPU it left idle (at least 15% in every mode; time the
//! hypervisor stole is reported beside it and is not idle).

use std::time::Duration;

use clap::ValueEnum as _;
use sopa_agent::host::XdpAttach;
use sopa_testbed::{
    experiment::{self, MIN_IDLE_PCT, ModeResult, Plan, Report},
    fabric::{Fabric, FabricOptions, LinkQdisc, SRV6_FABRIC_MTU, parse_topo},
    granularity,
};
use sopa_topology::srv6::Encoding;

struct Args {
    experiment: String,
    modes: Vec<String>,
    repeat: u32,
    topo: String,
    /// The topology as printed: its name (an inventory's, not its file's path).
    label: String,
    /// Link rates, Mbit/s: a fabric each, in this order.
    rates: Vec<u32>,
    mb: u64,
    seed: u64,
    flows_per_host: u32,
    /// Where the JSON and the figures go (default: results/ at the workspace root).
    out: std::path::PathBuf,
    /// A toy-size run that checks the benchmark runs end to end: the verdict is printed and the
    /// JSON marked as always, but an invalid verdict does not fail the run.
    smoke: bool,
    /// The encodings to measure, each on a fabric of its own.
    encodings: Vec<Encoding>,
    /// How the links serialize: htb (the default) or tbf with a one-packet bucket.
    qdisc: LinkQdisc,
    /// How the hosts' agents attach `xdp_strip` (`sopa-agent run --xdp-mode`), each on a fabric
    /// of its own.
    xdp: Vec<XdpAttach>,
}

/// The command line (`cargo xtask bench fabric -- --help`).
#[derive(clap::Parser)]
#[command(
    name = "bench fabric",
    about = "The SOPA paper's experiments on the namespace fabric, the modes measured side by side in one run"
)]
struct Cli {
    /// sec4.2, permutation, production, failure, or granularity (the flowcell sweep).
    #[arg(long, default_value = "sec4.2")]
    experiment: String,
    /// Modes, comma-separated: sopa, rps, ecmp, hedera, single, ideal; in the entropy encoding
    /// also random and rr-blind; each with ablations (+r3, +norack, +burst, +first0, +cellN).
    /// Default: sopa,rps,ecmp,hedera,ideal (the granularity sweep: its flowcells).
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Runs of each mode.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// The fabric: fat-tree:K, modric:..., or an inventory file (the operator's fabric).
    #[arg(long, visible_alias = "fabric", default_value = "fat-tree:4")]
    topo: String,
    /// Link rates in Mbit/s, comma-separated: a fabric each (default 100; the granularity
    /// sweep 10,25).
    #[arg(long, visible_alias = "rates", value_delimiter = ',', value_parser = parse_rate)]
    rate: Option<Vec<u32>>,
    /// MB per flow.
    #[arg(long, default_value_t = 10)]
    mb: u64,
    /// The seed of the traffic pattern.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Flows per host (the production experiment).
    #[arg(long, default_value_t = 20)]
    flows_per_host: u32,
    /// Where the JSON and the figures go (default: results/ at the workspace root).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// A toy-size run that checks the benchmark runs end to end: an invalid verdict does not
    /// fail it.
    #[arg(long)]
    smoke: bool,
    /// Encodings, comma-separated (ipv4-option, srv6, entropy): a fabric each.
    #[arg(long, value_delimiter = ',', default_value = "ipv4-option")]
    encoding: Vec<Encoding>,
    /// How the links serialize: htb, or tbf with a one-packet bucket.
    #[arg(long, default_value = "htb")]
    qdisc: LinkQdisc,
    /// How the hosts' agents attach xdp_strip, comma-separated (auto, generic, native): a
    /// fabric each.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    xdp: Vec<XdpAttach>,
    /// Draw the figures of a JSON this benchmark wrote, without running anything.
    #[arg(long)]
    replot: Option<String>,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `100` or `100mbit`.
fn parse_rate(r: &str) -> Result<u32, String> {
    r.trim_end_matches("mbit")
        .parse()
        .map_err(|_| format!("{r:?} is not a rate in Mbit/s"))
}

fn args(cli: Cli) -> Args {
    let modes_given = cli.modes.is_some();
    let rates_given = cli.rate.is_some();
    let mut xdp = Vec::new();
    for x in cli.xdp {
        assert!(!xdp.contains(&x), "--xdp names an attach mode twice");
        xdp.push(x);
    }
    let mut a = Args {
        experiment: cli.experiment,
        modes: cli.modes.unwrap_or_else(|| {
            ["sopa", "rps", "ecmp", "hedera", "ideal"]
                .map(str::to_owned)
                .to_vec()
        }),
        repeat: cli.repeat,
        topo: cli.topo,
        label: String::new(),
        rates: cli.rate.unwrap_or_else(|| vec![100]),
        mb: cli.mb,
        seed: cli.seed,
        flows_per_host: cli.flows_per_host,
        out: cli
            .out
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results")),
        smoke: cli.smoke,
        encodings: cli.encoding,
        qdisc: cli.qdisc,
        xdp,
    };
    assert!(
        a.xdp.len() == 1
            || (a.encodings.len() == 1 && a.rates.len() == 1 && a.experiment != "granularity"),
        "--xdp with more than one attach mode compares them on one encoding at one rate, not in the granularity sweep"
    );
    if a.experiment == "granularity" {
        if !modes_given {
            a.modes = [
                "ideal",
                "sopa",
                "sopa+cell2",
                "sopa+cell4",
                "sopa+cell8",
                "sopa+cell16",
            ]
            .into_iter()
            .map(str::to_owned)
            .chain([format!("sopa+cell{}", granularity::MAX_GSO_SEGS)])
            .collect();
        }
        if !rates_given {
            a.rates = vec![10, 25];
        }
        assert!(
            a.modes.iter().any(|m| m == "ideal") && a.modes.iter().any(|m| m == "sopa"),
            "--experiment granularity compares flowcells with per-packet spraying (sopa) and the ideal: --modes must hold both"
        );
    }
    for m in &a.modes {
        if let Err(e) = m.parse::<experiment::ModeSpec>() {
            panic!("{e}");
        }
    }
    a.label = parse_topo(&a.topo)
        .and_then(|s| sopa_topology::Topology::build(&s).map_err(|e| e.to_string()))
        .map(|t| t.name())
        .unwrap_or_else(|e| panic!("{e}"));
    a
}

/// `--replot FILE`: draws the figures of a JSON this benchmark wrote, without running anything.
fn replot(path: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let dir = std::path::Path::new(path).parent().expect("a folder");
    let stem = std::path::Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a file name");
    // The flowcell sweep's own JSON: its one figure, named after it.
    if v["experiment"] == "granularity" {
        let rows: Vec<granularity::Row> = serde_json::from_value(v["rows"].clone())
            .unwrap_or_else(|e| panic!("{path}: its rows: {e}"));
        let f = granularity::figure(&rows, dir, stem).expect("writing the figure");
        println!("figure: {}", f.display());
        return;
    }
    let not_ours = |what: &str| -> ! {
        panic!(
            "{path}: no {what}; --replot takes a JSON `bench fabric` wrote (fabric-*.json), \
             not another bench's"
        )
    };
    let report = Report {
        alone_fraction: v["fidelity"]["alone_fraction"].as_f64().unwrap_or(0.0),
        alone_tries: v["fidelity"]["alone_tries"].as_u64().unwrap_or(1) as u32,
        alone_steal_pct: v["fidelity"]["alone_steal_pct"].as_f64().unwrap_or(0.0),
        rate_mbit: v["rate_mbit"]
            .as_f64()
            .unwrap_or_else(|| not_ours("rate_mbit")),
        results: serde_json::from_value(v["modes"].clone())
            .unwrap_or_else(|e| not_ours(&format!("modes ({e})"))),
    };
    // The JSON's own name (`fabric-permutation-entropy.json`): a run per encoding or rate
    // wrote one each, and its figures are named after it.
    for f in sopa_testbed::figures::write(&report, dir, stem).expect("writing the figures") {
        println!("figure: {}", f.display());
    }
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    if let Some(path) = &cli.replot {
        return replot(path);
    }
    let a = args(cli);
    let mut measured = Vec::new();
    let mut valid = true;
    let mut by_xdp = Vec::new();
    for &encoding in &a.encodings {
        for &rate in &a.rates {
            for &xdp in &a.xdp {
                // The name `sopa-agent run --xdp-mode` takes.
                let xdp = xdp
                    .to_possible_value()
                    .expect("every attach mode has a name")
                    .get_name()
                    .to_owned();
                let (results, ok) = run_one(&a, encoding, rate, &xdp);
                valid &= ok;
                if a.xdp.len() > 1 {
                    by_xdp.push((xdp, results));
                } else {
                    measured.push((encoding, rate, results));
                }
            }
        }
    }
    if a.experiment == "granularity" {
        sweep(&a, &measured, valid);
    } else if measured.len() > 1 {
        compare(&a, &measured);
    } else if by_xdp.len() > 1 {
        compare_xdp(&by_xdp);
    }
    if !valid {
        println!("INVALID: the fidelity check failed; the JSON and figures above are marked so");
        if !a.smoke {
            std::process::exit(2);
        }
    }
}

/// Wire bytes and TCP payload of a full-size packet (1500-byte inner IPv4 packet, timestamps
/// on) in each encoding: the ceiling of the goodput ratio on rate-limited links.
fn full_size(encoding: Encoding) -> (f64, f64) {
    match encoding {
        // The route MTU is 4 under the link's 1500: the option fits in it.
        Encoding::Ipv4Option => (1500.0 + 14.0, 1496.0 - 52.0),
        // Links at 1548: the 1500-byte inner packet, the 40-byte outer header and the path
        // meter's 8-byte mark (the testbed's agents meter).
        Encoding::Srv6 => (f64::from(SRV6_FABRIC_MTU) + 14.0, 1500.0 - 52.0),
        // The 1500-byte inner packet in a 40-byte outer header (no mark: the meter is off).
        Encoding::Entropy => (1540.0 + 14.0, 1500.0 - 52.0),
    }
}

/// The means of every mode side by side, each encoding over the first.
fn compare(a: &Args, measured: &[(Encoding, u32, Vec<ModeResult>)]) {
    let (base, base_rate, base_results) = &measured[0];
    println!();
    println!(
        "encodings side by side ({} on {} at {base_rate} Mbit/s, the same seed):",
        a.experiment, a.label
    );
    let (bw, bp) = full_size(*base);
    for (enc, _, results) in measured[1..].iter().filter(|m| m.1 == *base_rate) {
        let (w, p) = full_size(*enc);
        println!(
            "{:<12} {:>12} {:>12} {:>8}",
            "mode",
            base.name(),
            enc.name(),
            "ratio"
        );
        for r in results {
            let Some(b) = base_results.iter().find(|b| b.mode == r.mode) else {
                continue;
            };
            if b.mean <= 0.0 {
                continue;
            }
            println!(
                "{:<12} {:>12.3} {:>12.3} {:>8.3}",
                r.mode,
                b.mean,
                r.mean,
                r.mean / b.mean
            );
        }
        println!(
            "(the header ceiling: a full-size packet carries {p:.0} payload bytes in {w:.0} on \
             the wire with {enc}, {bp:.0} in {bw:.0} with {base}: at most {:.3} of its goodput \
             on rate-limited links)",
            (p / w) / (bp / bw)
        );
    }
}

/// Every mode's mean and the machine's CPU under each XDP attach mode of the hosts, side by
/// side (each on its own fabric, one after the other in this run).
fn compare_xdp(by_xdp: &[(String, Vec<ModeResult>)]) {
    println!();
    println!("xdp_strip's attach modes side by side (mean, CPU idle %, steal %, CPU s/GB):");
    let header: Vec<String> = by_xdp.iter().map(|(x, _)| format!("{x:>28}")).collect();
    println!("{:<12} {}", "mode", header.join(" "));
    for r in &by_xdp[0].1 {
        let cells: Vec<String> = by_xdp
            .iter()
            .map(
                |(_, results)| match results.iter().find(|m| m.mode == r.mode) {
                    Some(m) => format!(
                        "{:>7.3} {:>6.1} {:>6.1} {:>6.1}",
                        m.mean, m.idle_cpu_pct, m.steal_cpu_pct, m.cpu_s_per_gb
                    ),
                    None => format!("{:>28}", "-"),
                },
            )
            .collect();
        println!("{:<12} {}", r.mode, cells.join(" "));
    }
    println!("(the ideal's links carry no SOPA program: its column differs by the machine alone)");
}

/// Measures every mode on a fabric of `encoding`, its hosts' agents attaching `xdp_strip` as
/// `xdp` says; prints its table, writes its JSON and figures. Returns the results and whether
/// the fidelity checks held.
fn run_one(a: &Args, encoding: Encoding, rate: u32, xdp: &str) -> (Vec<ModeResult>, bool) {
    let spec = parse_topo(&a.topo).unwrap_or_else(|e| panic!("{e}"));
    let opts = FabricOptions {
        rate_mbit: Some(rate),
        // The non-blocking ideal is a mode of the run: its big switch is built beside the fabric.
        ideal: a.modes.iter().any(|m| m.starts_with("ideal")),
        encoding,
        link_qdisc: a.qdisc,
        host_args: match xdp {
            "auto" => Vec::new(),
            x => vec!["--xdp-mode".into(), x.into()],
        },
        ..FabricOptions::default()
    };
    eprintln!(
        "building {} at {rate} Mbit/s ({} links), paths as {encoding}, xdp_strip {xdp}",
        a.label, a.qdisc
    );
    let mut f = Fabric::build(&spec, &opts).expect("build the fabric");
    f.controller_args
        .extend(experiment::METER_REPORTS_ONLY.map(String::from));
    f.start(&opts).expect("start the agents");
    f.wait_ready(Duration::from_secs(120))
        .expect("agents ready");
    let discovery = (encoding == Encoding::Entropy).then(|| discovery(&f));
    // The entropy encoding's baselines have no meaning where the path is named.
    let modes: Vec<String> = a
        .modes
        .iter()
        .filter(|m| {
            encoding == Encoding::Entropy
                || !m
                    .parse::<experiment::ModeSpec>()
                    .expect("checked")
                    .entropy_only()
        })
        .cloned()
        .collect();
    if modes.len() < a.modes.len() {
        eprintln!(
            "{encoding}: random and rr-blind are the entropy encoding's baselines, not run here"
        );
    }
    let plan = Plan {
        experiment: a.experiment.clone(),
        modes,
        repeat: a.repeat,
        rate_mbit: rate,
        mb: a.mb,
        seed: a.seed,
        flows_per_host: a.flows_per_host,
        // A toy run is toy-sized in every workload: production's VL2 sizes reach 30 MB.
        max_flow_bytes: a.smoke.then_some(a.mb * 1_000_000),
    };
    let report = experiment::run(&f, &plan);
    drop(f);
    // The verdict comes first: a run that fails it is written, but marked invalid.
    let fidelity_ok = report.alone_fraction >= experiment::FIDELITY;
    // The machine must have had CPU to spare, or the emulation, not the fabric, set the pace.
    let min_idle = report
        .results
        .iter()
        .map(|r| r.idle_cpu_pct)
        .fold(f64::INFINITY, f64::min);
    let cpu_ok = min_idle >= MIN_IDLE_PCT;
    let valid = fidelity_ok && cpu_ok;
    let mut suffix = match encoding {
        Encoding::Ipv4Option => String::new(),
        e => format!("-{e}"),
    };
    if a.rates.len() > 1 {
        suffix.push_str(&format!("-{rate}mbit"));
    }
    if a.qdisc != LinkQdisc::Htb {
        suffix.push_str(&format!("-{}", a.qdisc));
    }
    if xdp != "auto" {
        suffix.push_str(&format!("-xdp-{xdp}"));
    }
    let name = if valid {
        format!("fabric-{}{suffix}", a.experiment)
    } else {
        format!("fabric-{}{suffix}-INVALID", a.experiment)
    };
    let figures =
        sopa_testbed::figures::write(&report, &a.out, &name).expect("writing the figures");
    let Report {
        alone_fraction,
        alone_tries,
        alone_steal_pct,
        results,
        ..
    } = report;

    println!();
    println!(
        "{} on {} at {} Mbit/s, paths as {encoding}, {}, {} round(s), cubic",
        a.experiment,
        a.label,
        rate,
        if matches!(a.experiment.as_str(), "production" | "failure") {
            format!(
                "{} sequential VL2-like flows per host (95% under 1 MB)",
                a.flows_per_host
            )
        } else {
            format!("{} MB flows", a.mb)
        },
        a.repeat
    );
    println!(
        "fidelity: one flow alone reached {:.3} of the link rate (best of {alone_tries} {}, {alone_steal_pct:.1}% of the CPUs stolen by the hypervisor meanwhile; {}); CPU idle during each mode below",
        alone_fraction,
        if alone_tries == 1 { "try" } else { "tries" },
        if fidelity_ok {
            "ok, at least 0.90"
        } else {
            "FAILED: below 0.90, the figures below are not valid"
        }
    );
    if !cpu_ok {
        println!(
            "fidelity FAILED: the CPUs were {min_idle:.1}% idle in the busiest mode (need {MIN_IDLE_PCT}%; time the hypervisor stole is not idle): the figures below are not valid; lower --rate (on 2 cores, 10 Mbit/s per link passes with per-packet units and 25 does not: docs/RESULTS.md)"
        );
    }
    println!(
        "{:<12} {:>5} {:>6} {:>13} {:>6} {:>6} {:>6} {:>5} {:>8} {:>8} {:>9} {:>8} {:>6} {:>7} {:>13} {:>6} {:>6} {:>8}",
        "mode",
        "flows",
        "mean",
        "rounds min-max",
        "min",
        "p5",
        "p99",
        "Jain",
        "FCT s",
        "p99 s",
        "reord %",
        "fastRTX",
        "RTOs",
        "drops",
        "core max/min",
        "idle%",
        "steal%",
        "CPU s/GB"
    );
    for r in &results {
        let lo = r.round_means.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.round_means.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<12} {:>5} {:>6.3} {:>6.3}-{:<6.3} {:>6.3} {:>6.3} {:>6.3} {:>5.3} {:>8.2} {:>8.2} {:>9.3} {:>8} {:>6} {:>7} {:>13} {:>6.1} {:>6.1} {:>8.1}",
            r.mode,
            r.flows,
            r.mean,
            lo,
            hi,
            r.min,
            r.p5,
            r.p99,
            r.jain,
            r.fct_mean_s,
            r.fct_p99_s,
            r.reordered_pct,
            r.fast_retransmits,
            r.timeouts,
            r.queue_drops,
            experiment::core_balance_text(r.core_links_max_over_min, r.core_links_idle),
            r.idle_cpu_pct,
            r.steal_cpu_pct,
            r.cpu_s_per_gb
        );
        if r.short_flows > 0 {
            println!(
                "{:<12} ({} flows of at most {} kB: FCT mean {:.3} s, p99 {:.3} s)",
                "",
                r.short_flows,
                experiment::SHORT_FLOW_BYTES / 1000,
                r.short_fct_mean_s,
                r.short_fct_p99_s
            );
        }
        if let Some(sub) = r.mptcp_subflows_mean {
            println!(
                "{:<12} (MPTCP: {sub:.2} subflows beside the first, per flow)",
                ""
            );
        }
    }
    // Every mode over the non-blocking ideal, measured in the same run.
    if let Some(ideal) = results.iter().find(|r| r.mode == "ideal" && r.mean > 0.0) {
        let ratios: Vec<String> = results
            .iter()
            .filter(|r| r.mode != "ideal")
            .map(|r| format!("{}/ideal {:.3}", r.mode, r.mean / ideal.mean))
            .collect();
        println!("over the non-blocking ideal: {}", ratios.join(", "));
    }
    // The ratios the results page quotes, measured here side by side.
    if let Some(sopa) = results.iter().find(|r| r.mode == "sopa") {
        let ratios: Vec<String> = results
            .iter()
            .filter(|r| r.mode != "sopa" && r.mean > 0.0)
            .map(|r| format!("sopa/{} {:.2}", r.mode, sopa.mean / r.mean))
            .collect();
        println!("ratios of means: {}", ratios.join(", "));
        let overlapping: Vec<&str> = results
            .iter()
            .filter(|r| r.mode != "sopa" && r.round_means.len() > 1)
            .filter(|r| experiment::spreads_overlap(&r.round_means, &sopa.round_means))
            .map(|r| r.mode.as_str())
            .collect();
        if !overlapping.is_empty() {
            println!(
                "(round means of sopa and {} overlap: that difference is within the spread)",
                overlapping.join(", ")
            );
        }
    }
    let (wire, payload) = full_size(encoding);
    println!(
        "(throughput as a fraction of the link rate; a flow's ceiling is {payload:.0}/{wire:.0} = {:.3} with {encoding};",
        payload / wire
    );
    println!(
        " rounds min-max: the lowest and highest round mean (one seed each, modes interleaved per round);\n Jain: Jain's fairness index over every flow (1 when all are equal);\n drops: packets the links' drop-tail queues dropped, every switch and host;"
    );
    println!(
        " core max/min: the busiest over the least busy loaded core link; +N idle: links that carried\n under 1% of the busiest one's bytes (a mode's unused paths), left out of the ratio;\n idle%: the CPUs' idle time (the fidelity check needs 15%); steal%: what the hypervisor took,\n not headroom;\n CPU s/GB: busy CPU-seconds of the whole machine, every namespace, per GB the flows moved)"
    );
    let _ = std::fs::create_dir_all(&a.out);
    let path = a.out.join(format!("{name}.json"));
    let json = serde_json::json!({
        "experiment": a.experiment, "topology": a.label, "rate_mbit": rate, "flow_mb": a.mb, "repeat": a.repeat,
        "encoding": encoding.name(), "qdisc": a.qdisc.to_string(), "xdp": xdp,
        "valid": valid, "discovery": discovery,
        "fidelity": { "alone_fraction": alone_fraction, "alone_tries": alone_tries, "alone_steal_pct": alone_steal_pct, "alone_ok": fidelity_ok, "min_idle_cpu_pct": min_idle, "cpu_ok": cpu_ok }, "modes": results,
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).expect("writing the JSON");
    println!("JSON: {}", path.display());
    for fig in &figures {
        println!("figure: {}", fig.display());
    }
    (results, valid)
}

/// The entropy encoding's label discovery on `f`, once every host's is done: its cost per
/// destination host and per rack, printed and returned for the JSON.
fn discovery(f: &Fabric) -> serde_json::Value {
    let all = sopa_testbed::routers::discovered(f, Duration::from_secs(120))
        .expect("every host's label discovery done");
    let (mut probes, mut millis, mut rows, mut incomplete) = (0u64, 0u64, 0u64, 0usize);
    for (_, e) in &all {
        for d in e["destinations"].as_array().into_iter().flatten() {
            probes += d["probes"].as_u64().unwrap_or(0);
            millis += d["millis"].as_u64().unwrap_or(0);
            rows += 1;
        }
        incomplete += e["incomplete"].as_array().map_or(0, Vec::len);
    }
    let per_rack = f.hosts.len() as f64 / f.topo.racks().len().max(1) as f64;
    let rows_f = rows.max(1) as f64;
    println!(
        "label discovery: {rows} (host, destination host) pairs, {:.1} probes and {:.0} ms per destination host (3 next headers), {:.1} probes and {:.0} ms per rack of {per_rack:.0} hosts; {incomplete} destinations with fewer paths found than the topology has",
        probes as f64 / rows_f,
        millis as f64 / rows_f,
        per_rack * probes as f64 / rows_f,
        per_rack * millis as f64 / rows_f,
    );
    serde_json::json!({
        "pairs": rows, "probes": probes, "millis": millis, "incomplete": incomplete,
        "probes_per_destination_host": probes as f64 / rows_f,
        "ms_per_destination_host": millis as f64 / rows_f,
        "hosts_per_rack": per_rack,
    })
}

/// `--experiment granularity`: every rate's flowcells against per-packet spraying and the
/// ideal, the flowcell the measurements support, and its size at production rates.
fn sweep(a: &Args, measured: &[(Encoding, u32, Vec<ModeResult>)], valid: bool) {
    let rows: Vec<granularity::Row> = measured
        .iter()
        .flat_map(|(_, rate, results)| granularity::rows(*rate, results))
        .collect();
    println!();
    println!(
        "flowcells on {} (permutation, {} MB flows), each rate against its own per-packet run and ideal:",
        a.label, a.mb
    );
    print!("{}", granularity::table(&rows));
    println!(
        "(wire ms: the flowcell's full-size segments on the link; /packet: mean throughput over per-packet spraying's; CPU/pkt: CPU per GB over per-packet spraying's)"
    );
    match granularity::best(&rows) {
        Some(b) => println!(
            "shortest flowcell keeping {} of per-packet throughput at no more than {} of its CPU: {} at {} Mbit/s, {:.2} ms on the wire; the same time is {} segments at 25 Gbit/s and {} at 100 Gbit/s (at most {} per GSO super-packet)",
            granularity::KEEP_THROUGHPUT,
            granularity::MAX_CPU_RATIO,
            b.mode,
            b.rate_mbit,
            b.wire_us / 1e3,
            granularity::segments_at(b.wire_us, 25.0),
            granularity::segments_at(b.wire_us, 100.0),
            granularity::MAX_GSO_SEGS
        ),
        None => println!(
            "no flowcell kept {} of per-packet throughput at no more than {} of its CPU here",
            granularity::KEEP_THROUGHPUT,
            granularity::MAX_CPU_RATIO
        ),
    }
    let name = if valid {
        "fabric-granularity-sweep"
    } else {
        "fabric-granularity-sweep-INVALID"
    };
    let _ = std::fs::create_dir_all(&a.out);
    let path = a.out.join(format!("{name}.json"));
    let json = serde_json::json!({
        "experiment": "granularity", "topology": a.label, "flow_mb": a.mb, "repeat": a.repeat,
        "rates_mbit": a.rates, "valid": valid, "rows": rows,
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).expect("writing the JSON");
    println!("JSON: {}", path.display());
    match granularity::figure(&rows, &a.out, name) {
        Ok(fig) => println!("figure: {}", fig.display()),
        Err(e) => println!("figure not drawn: {e}"),
    }
}
