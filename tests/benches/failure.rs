//! `cargo xtask bench failure [-- --modes sopa,ecmp --elements a0:c0,a2,gray:a0:c0:2 --rate 10
//! --seconds 15 --healthy 600 --encoding ipv4-option]`: failures under traffic on Fat-Tree k=4,
//! one run each, in one path encoding (`srv6`: the switches' repair rewrites uSID lists, the
//! hosts' meters read the path from RFC 9343's mark behind the outer header). The
//! permutation runs (every host sends to one other and receives from one); at `--onset` seconds
//! an element fails for real (a link cut, a switch with every interface down, a gray link that
//! drops a share of what one end sends with its carrier up), and it stays failed until the flows
//! end. Per mode and element:
//! - the flows affected: those with a candidate path through the element;
//! - packets the failure cost, counted one by one between the sender's rack switch and the
//!   receiver (captures, matched by IPv4 ID): a lost packet whose option names a path through
//!   the element (a drop-tail queue's losses elsewhere are not the failure's); for packets
//!   without the option (ecmp) the path is the switches' hash, unknown here, so every loss of an
//!   affected flow from the onset until the controller applied the change is counted, an upper
//!   bound (marked `<=`);
//! - when the last of those packets entered the fabric, after the onset: from then on nothing
//!   is sent into the failure;
//! - the time until each affected flow is back to 90% of the rate it settles to under the
//!   failure (its receiver's interface sampled, rates in 100 ms bins averaged over 500 ms; a
//!   flow that settles under a tenth of its rate before counts as never back), and that settled
//!   rate over the rate before;
//! - the time until every switch that lost a port has repaired `tc_forward` (its log's time of
//!   the repair against the moment the interface was set down, both from one clock);
//! - the time until the controller knows and every agent has applied the change (for a gray
//!   link: until the path meter convicted it and every agent applied its drain);
//! - links the path meter drained that had not failed (false drains).
//!
//! Then `--healthy` seconds of the permutation in `sopa` mode with nothing failed: every link
//! the path meter drains meanwhile is a false drain.
//!
//! Writes `failure.json` and one figure per element (goodput of all flows over time, one line
//! per mode) into `--out`.

use std::time::{Duration, SystemTime};

use sopa_testbed::{
    experiment::{self, set_mode},
    fabric::{Fabric, FabricOptions},
    failure::{
        Element, Timeline, element_links, paths_through, rates, recovery, recovery_to, repairs,
    },
    figures,
    loss::Seen,
    loss::{FlowCaptures, ms_after},
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::{srv6::Encoding, topology::TopologySpec};

struct Args {
    encoding: Encoding,
    modes: Vec<String>,
    elements: Vec<Element>,
    rate: u32,
    seconds: f64,
    onset: f64,
    seed: u64,
    out: std::path::PathBuf,
    /// Seconds of the healthy run (0: none).
    healthy: f64,
    /// Each flow paced to this share of the link rate (1: unpaced, the permutation fills
    /// every link; the path meter judges no link above its --max-load).
    load: f64,
}

/// The command line (`cargo xtask bench failure -- --help`).
#[derive(clap::Parser)]
#[command(
    name = "bench failure",
    about = "Failures in the middle of a permutation run: a link cut, a switch down, gray links; recovery per mode"
)]
struct Cli {
    /// The encoding of the fabric.
    #[arg(long, default_value = "ipv4-option")]
    encoding: Encoding,
    /// Modes, comma-separated (default sopa,rps,ecmp; --smoke: sopa,ecmp).
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// What fails, comma-separated: a link (a0:c0), a switch (a2), a gray link losing a share
    /// in percent (gray:a0:c0:2).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "a0:c0,a2,gray:a0:c0:2,gray:a0:c0:0.5"
    )]
    elements: Vec<Element>,
    /// Link rate, Mbit/s.
    #[arg(long, default_value_t = 10)]
    rate: u32,
    /// Seconds of each run (default 15; --smoke 5).
    #[arg(long)]
    seconds: Option<f64>,
    /// When the failure starts, seconds into the run (default 4; --smoke 2).
    #[arg(long)]
    onset: Option<f64>,
    /// The seed of the permutation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the JSON and the figures go (default: results/ at the workspace root).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Seconds of the healthy run, 0 for none (default 600; --smoke 10).
    #[arg(long)]
    healthy: Option<f64>,
    /// Each flow paced to this share of the link rate (1: unpaced).
    #[arg(long, default_value_t = 1.0)]
    load: f64,
    /// A toy-size run: two modes, short runs.
    #[arg(long)]
    smoke: bool,
    /// Draw the figures of a JSON this benchmark wrote, without running anything (named after
    /// the JSON: `failure-srv6.json` draws `failure-ELEMENT-srv6.svg` beside it).
    #[arg(long)]
    replot: Option<std::path::PathBuf>,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn args(cli: Cli) -> Args {
    let (modes, seconds, onset, healthy) = if cli.smoke {
        (vec!["sopa", "ecmp"], 5.0, 2.0, 10.0)
    } else {
        (vec!["sopa", "rps", "ecmp"], 15.0, 4.0, 600.0)
    };
    let a = Args {
        encoding: cli.encoding,
        modes: cli
            .modes
            .unwrap_or_else(|| modes.into_iter().map(str::to_owned).collect()),
        elements: cli.elements,
        healthy: cli.healthy.unwrap_or(healthy),
        load: cli.load,
        rate: cli.rate,
        seconds: cli.seconds.unwrap_or(seconds),
        onset: cli.onset.unwrap_or(onset),
        seed: cli.seed,
        out: cli
            .out
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results")),
    };
    assert!(
        a.onset > 1.0 && a.onset < a.seconds,
        "--onset must fall within the run, after its first second"
    );
    a
}

const BIN: Duration = Duration::from_millis(100);

#[derive(serde::Serialize)]
struct Row {
    mode: String,
    element: String,
    flows: usize,
    affected: usize,
    /// Packets the failure cost (sum over flows, max per flow); `bound`: an upper bound (no
    /// option to tell the path by).
    lost_sum: usize,
    lost_max: usize,
    bound: bool,
    /// When the last packet the failure cost entered the fabric, ms after the onset.
    last_loss_ms: Option<f64>,
    /// Affected flows back to 90% of their settled rate (seconds after the onset): median and
    /// max; flows never back within the run (or stalled) are counted in `never_back`.
    back_median_s: Option<f64>,
    /// Affected flows' settled rate under the failure over their rate before (median).
    settled_over_before: Option<f64>,
    back_max_s: Option<f64>,
    never_back: usize,
    /// From the onset until every switch that lost a port had repaired `tc_forward` (the last
    /// of them; `None`: one did not log a repair), milliseconds.
    local_repair_ms: Option<f64>,
    /// Frames the captures could not keep up with (the losses are then a lower bound).
    capture_drops: u64,
    /// How long the kernel took to set the (first) interface down: the set-down call's duration.
    teardown_ms: f64,
    /// The longest any agent took from the link event to the maps written, milliseconds.
    agent_ms: Option<f64>,
    /// From the onset until the controller knew and every agent had applied it (`None`: not
    /// within the run, a gray link the meter did not convict in time).
    controller_applied_s: Option<f64>,
    /// Links the path meter drained that had not failed.
    false_drains: Vec<String>,
    /// A gray link's own drops (its `tc_lossy` counts them): how many, and the last one's
    /// time after the onset (sampled every 10 ms). Exact where packets carry no path to tell
    /// the failure's losses from the queues' (`ecmp`, the entropy encoding).
    element_dropped: Option<(u64, Option<f64>)>,
    /// Goodput of all flows over the link rate, per 100 ms bin from the start (for the figure).
    goodput: Vec<f64>,
    onset_bin: usize,
}

/// The flows' pacing for `--load` (none at 1).
fn pacing(a: &Args) -> Option<u64> {
    (a.load < 1.0).then(|| (f64::from(a.rate) * 1e6 / 8.0 * a.load) as u64)
}

/// A link as the controller names it (ends in order).
fn canonical(a: &str, b: &str) -> String {
    if a <= b {
        format!("{a}:{b}")
    } else {
        format!("{b}:{a}")
    }
}

/// The links the path meter holds suspect now.
fn suspects(f: &Fabric) -> Vec<String> {
    let s: serde_json::Value =
        serde_json::from_str(&f.sopactl(&["status", "--json"]).expect("sopactl status"))
            .expect("status JSON");
    s["suspect_links"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|x| x["link"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Starts every flow of `flows` (`bytes` each, paced for `--load`) on ports from `port`.
fn spawn_flows<'s, 'e: 's>(
    s: &'s std::thread::Scope<'s, 'e>,
    f: &'e Fabric,
    a: &'e Args,
    flows: &'e [(String, String)],
    bytes: u64,
    port: u16,
) -> Vec<std::thread::ScopedJoinHandle<'s, sopa_testbed::traffic::Transfer>> {
    let g = f.topo.graph();
    flows
        .iter()
        .enumerate()
        .map(|(i, (src, dst))| {
            let addr = g.node(g.find(dst).unwrap()).addr.unwrap();
            let (sa, sb) = (f.ns(src), f.ns(dst));
            s.spawn(move || {
                let opts = SendOptions {
                    stall_timeout: Duration::from_secs(60),
                    pacing_bytes_per_s: pacing(a),
                    ..SendOptions::default()
                };
                tcp_transfer(sa, sb, addr, port + i as u16, bytes, &opts)
                    .unwrap_or_else(|e| panic!("flow {src} -> {dst}: {e}"))
            })
        })
        .collect()
}

/// `seconds` of the permutation in the current mode with nothing failed: every link the path
/// meter drains meanwhile (its status sampled each second; a drain holds for its hold-down).
fn healthy(f: &Fabric, a: &Args) -> Vec<String> {
    let flows = experiment::flows(f, "permutation", a.seed);
    let bytes = (f64::from(a.rate) * 1e6 / 8.0 * a.healthy * a.load) as u64;
    let mut drained = std::collections::BTreeSet::new();
    std::thread::scope(|s| {
        let handles = spawn_flows(s, f, a, &flows, bytes, 7800);
        while !handles.iter().all(|h| h.is_finished()) {
            drained.extend(suspects(f));
            std::thread::sleep(Duration::from_secs(1));
        }
        for h in handles {
            assert!(
                h.join().expect("a flow thread").intact(),
                "a flow arrived damaged"
            );
        }
    });
    drained.extend(suspects(f));
    drained.into_iter().collect()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn run_one(f: &Fabric, a: &Args, mode: &str, element: &Element) -> Row {
    let flows = experiment::flows(f, "permutation", a.seed);
    let receivers: Vec<String> = flows.iter().map(|(_, d)| d.clone()).collect();
    let bytes = (f64::from(a.rate) * 1e6 / 8.0 * a.seconds * a.load) as u64;
    let mut gray = element.gray(f).expect("attaching tc_lossy");
    let caps = FlowCaptures::start(f, &flows).expect("captures");
    let timeline = Timeline::start(f, &receivers, Duration::from_millis(20)).expect("sampler");
    let start = SystemTime::now();
    let sampling = std::sync::atomic::AtomicBool::new(true);
    let (onset, down, applied, durations, element_dropped) = std::thread::scope(|s| {
        let handles = spawn_flows(s, f, a, &flows, bytes, 7600);
        // The schedule of the experiment: the element fails this far into the run.
        std::thread::sleep(Duration::from_secs_f64(a.onset));
        let (onset, down) = match gray.as_mut() {
            Some((lossy, percent)) => {
                let at = SystemTime::now();
                lossy.set_loss(*percent).expect("setting the loss");
                (at, SystemTime::now())
            }
            None => element.fail_timed(f).expect("failing the element"),
        };
        // The gray link's own drops, sampled until the flows are done.
        let sampler = gray.as_ref().map(|(lossy, _)| {
            let sampling = &sampling;
            s.spawn(move || {
                let (mut count, mut last) = (0, None);
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    let (_, dropped) = lossy.counts().expect("the gray link's counters");
                    if dropped > count {
                        (count, last) = (dropped, Some(ms_after(SystemTime::now(), onset)));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                (count, last)
            })
        });
        let links = element.links(f);
        // A gray link is drained once the path meter convicts it, if it does within the run.
        let within = match gray {
            Some(_) => Duration::from_secs_f64((a.seconds - a.onset).max(1.0) + 5.0),
            None => Duration::from_secs(30),
        };
        let applied = match f.wait_applied_within(|down| down >= links, "the failure", within) {
            Ok(()) => Some(ms_after(SystemTime::now(), onset) / 1e3),
            Err(e) if gray.is_some() => {
                eprintln!("    not convicted within the run: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        };
        let durations: Vec<f64> = handles
            .into_iter()
            .map(|h| {
                let t = h.join().expect("a flow thread");
                assert!(t.intact(), "a flow arrived damaged");
                t.seconds
            })
            .collect();
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        let element_dropped = sampler.map(|h| h.join().expect("the drop sampler"));
        (onset, down, applied, durations, element_dropped)
    });
    // Each neighbour's first repair after the onset, from its log.
    let local: Vec<(f64, f64)> = element
        .neighbours(f)
        .iter()
        .filter_map(|n| {
            let first = repairs(&f.switch_log(n), onset).first().copied()?;
            Some((ms_after(first.0, onset), ms_after(first.1, onset)))
        })
        .collect();
    let teardown_ms = ms_after(down, onset);
    eprintln!(
        "    the kernel took the interface down in {teardown_ms:.3} ms; local repairs (event \
         received, maps written), ms after the onset: {local:.3?}"
    );
    let complete = gray.is_none() && local.len() == element.neighbours(f).len();
    let local_repair_ms = complete.then(|| local.iter().map(|l| l.1).fold(0.0, f64::max));
    let agent_ms = complete.then(|| local.iter().map(|l| l.1 - l.0).fold(0.0, f64::max));
    let samples = timeline.finish().expect("samples");
    let lost = caps.finish().expect("captures");
    let failed_link = match element {
        Element::Gray(x, y, _) | Element::Link(x, y) => Some(canonical(x, y)),
        Element::Switch(_) => None,
    };
    let false_drains: Vec<String> = suspects(f)
        .into_iter()
        .filter(|l| Some(l) != failed_link.as_ref())
        .collect();
    if let Some((mut lossy, _)) = gray.take() {
        lossy.set_loss(0.0).expect("healing the gray link");
    }
    // Every drain of the path meter ends with the operator's trust, handed back at once.
    for l in suspects(f) {
        let (x, y) = l.split_once(':').expect("a link");
        f.sopactl(&["link", "trust", x, y])
            .expect("sopactl link trust");
        f.sopactl(&["link", "untrust", x, y])
            .expect("sopactl link untrust");
    }
    element.restore(f).expect("restoring");
    f.wait_applied(|down| down == 0, "the restore")
        .unwrap_or_else(|e| panic!("{e}"));

    let onset_bin = (ms_after(onset, start) / BIN.as_millis() as f64).floor() as usize;
    // Each flow's rates until it completed (a finished flow receives nothing more).
    let per_flow: Vec<Vec<f64>> = receivers
        .iter()
        .zip(&durations)
        .map(|(r, secs)| {
            let mut v = rates(&samples[r], start, BIN);
            v.truncate((secs / BIN.as_secs_f64()).floor() as usize);
            v
        })
        .collect();
    let skip = (1000 / BIN.as_millis()) as usize;
    let dead = element_links(f, element);
    let mut backs = Vec::new();
    let mut kept = Vec::new();
    let mut capture_drops = 0;
    // Packets without the option carry no path: counted by time, an upper bound.
    let mut bound = matches!(mode, "ecmp" | "mptcp" | "ideal");
    let (mut affected, mut never_back) = (0, 0);
    let mut lost_by_failure = Vec::new();
    let mut last_loss: Option<f64> = None;
    for ((r, l), (src, dst)) in per_flow.iter().zip(&lost).zip(&flows) {
        // A capture that could not keep up undercounts the losses: the row says so.
        capture_drops += u64::from(l.capture_drops);
        let paths = paths_through(f, src, dst, &dead);
        if !paths.iter().any(|(_, through)| *through) {
            lost_by_failure.push(0);
            continue;
        }
        affected += 1;
        // The failure's: on a path through the element, or (no option) within its window.
        let window_ms = applied.unwrap_or(a.seconds) * 1e3;
        let theirs: Vec<&Seen> = l
            .lost
            .iter()
            .filter(|p| ms_after(p.at, onset) >= -25.0)
            .filter(|p| match p.hops {
                Some(h) => paths.iter().any(|(hops, through)| *through && *hops == h),
                None => {
                    bound = true;
                    ms_after(p.at, onset) <= window_ms
                }
            })
            .collect();
        lost_by_failure.push(theirs.len());
        if let Some(last) = theirs
            .iter()
            .map(|p| ms_after(p.at, onset))
            .reduce(f64::max)
        {
            last_loss = Some(last_loss.map_or(last, |x: f64| x.max(last)));
        }
        // Its fair share under the failure: what it settles to, the mean of the last 40% of
        // its run after the onset (the fabric has less capacity now; the rate before may not
        // come back). Flows that end too soon after the onset to settle are left out.
        let after = r.get(onset_bin..).unwrap_or(&[]);
        if after.len() < 20 {
            continue;
        }
        let tail = &after[after.len() * 3 / 5..];
        let settled = tail.iter().sum::<f64>() / tail.len() as f64;
        let rec = recovery(r, BIN, onset_bin, skip, 1.0, 5);
        kept.push(settled / rec.before.max(1e-9));
        // A flow that stalled (settled at under a tenth of its rate before) is not back.
        let rec = (settled >= 0.1 * rec.before)
            .then(|| recovery_to(r, BIN, onset_bin, 0.9 * settled, 5))
            .flatten();
        match rec {
            Some(s) => backs.push(s),
            None => never_back += 1,
        }
    }
    let bins = per_flow.iter().map(Vec::len).max().unwrap_or(0);
    let goodput = (0..bins)
        .map(|i| {
            per_flow
                .iter()
                .map(|r| r.get(i).copied().unwrap_or(0.0))
                .sum::<f64>()
                / (flows.len() as f64 * f64::from(a.rate))
        })
        .collect();
    Row {
        mode: mode.into(),
        element: element.to_string(),
        flows: flows.len(),
        affected,
        lost_sum: lost_by_failure.iter().sum(),
        lost_max: lost_by_failure.iter().copied().max().unwrap_or(0),
        bound,
        last_loss_ms: last_loss,
        settled_over_before: median(kept),
        back_median_s: median(backs.clone()),
        back_max_s: backs.iter().copied().reduce(f64::max),
        never_back,
        controller_applied_s: applied,
        false_drains,
        element_dropped,
        local_repair_ms,
        capture_drops,
        teardown_ms,
        agent_ms,
        goodput,
        onset_bin,
    }
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    if let Some(json) = &cli.replot {
        return replot(json);
    }
    let a = args(cli);
    let opts = FabricOptions {
        rate_mbit: Some(a.rate),
        encoding: a.encoding,
        ..FabricOptions::default()
    };
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).expect("build the fabric");
    f.start(&opts).expect("start controller and agents");
    f.wait_ready(Duration::from_secs(120))
        .expect("every agent ready");
    let mut rows = Vec::new();
    for mode in &a.modes {
        set_mode(&f, mode);
        for element in &a.elements {
            eprintln!(
                "==> {mode}: {element} fails {:.1} s into the permutation",
                a.onset
            );
            let row = run_one(&f, &a, mode, element);
            eprintln!(
                "    lost {} (max {} per flow), last loss {:?} ms after, back in {:?} s (max {:?}), controller applied in {:?} s, false drains {:?}",
                row.lost_sum,
                row.lost_max,
                row.last_loss_ms,
                row.back_median_s,
                row.back_max_s,
                row.controller_applied_s,
                row.false_drains
            );
            rows.push(row);
        }
    }

    let fmt = |v: Option<f64>, scale: f64| v.map_or("-".into(), |x| format!("{:.0}", x * scale));
    println!(
        "\nFailures under traffic: Fat-Tree k=4 ({}), permutation at {} Mbit/s (flows paced to {:.0}% of it), failure {:.1} s in, one run each",
        a.encoding,
        a.rate,
        a.load * 100.0,
        a.onset
    );
    println!(
        "{:<6} {:<18} {:>8} {:>10} {:>9} {:>13} {:>10} {:>11} {:>8}",
        "mode",
        "element",
        "affected",
        "lost (sum)",
        "lost max",
        "back med. ms",
        "back max",
        "never back",
        "settled"
    );
    for r in &rows {
        println!(
            "{:<6} {:<18} {:>5}/{:<2} {:>10} {:>9} {:>13} {:>10} {:>11} {:>8}",
            r.mode,
            r.element,
            r.affected,
            r.flows,
            format!("{}{}", if r.bound { "<=" } else { "" }, r.lost_sum),
            format!("{}{}", if r.bound { "<=" } else { "" }, r.lost_max),
            fmt(r.back_median_s, 1e3),
            fmt(r.back_max_s, 1e3),
            r.never_back,
            r.settled_over_before
                .map_or("-".into(), |x| format!("{x:.2}")),
        );
    }
    for r in &rows {
        if let Some((n, last)) = r.element_dropped {
            println!(
                "  {} {}: the gray link itself dropped {n} packets, the last {} ms after the onset",
                r.mode,
                r.element,
                last.map_or("-".into(), |ms| format!("{ms:.0}"))
            );
        }
    }
    for r in rows.iter().filter(|r| r.capture_drops > 0) {
        println!(
            "  {} {}: the captures missed {} frames: its losses are a lower bound",
            r.mode, r.element, r.capture_drops
        );
    }
    println!(
        "\nReaction, milliseconds from the onset (the call that set the interface down, or set the loss):\n{:<6} {:<18} {:>13} {:>14} {:>13} {:>13} {:>13} {:>12}",
        "mode",
        "element",
        "kernel down",
        "agent: event",
        "local repair",
        "last loss",
        "ctrl applied",
        "false drains"
    );
    let ms = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.3}"));
    for r in &rows {
        println!(
            "{:<6} {:<18} {:>13.3} {:>14} {:>13} {:>13} {:>13} {:>12}",
            r.mode,
            r.element,
            r.teardown_ms,
            ms(r.agent_ms),
            ms(r.local_repair_ms),
            fmt(r.last_loss_ms, 1.0),
            fmt(r.controller_applied_s, 1e3),
            r.false_drains.len()
        );
    }
    println!(
        "kernel down: the set-down call's own duration (the kernel's teardown of the interface); \
         agent: event: from the link event reaching a switch agent to its maps written (the \
         slowest switch); local repair: from the onset to the last switch's maps written; last \
         loss: when the last packet the failure cost entered the fabric; ctrl applied: the \
         controller knew (for a gray link: the path meter convicted it) and every agent applied \
         the drain; false drains: other links the path meter drained."
    );
    let healthy_drains = (a.healthy > 0.0).then(|| {
        set_mode(&f, "sopa");
        eprintln!(
            "==> sopa: {:.0} s of the permutation, nothing failed",
            a.healthy
        );
        healthy(&f, &a)
    });
    if let Some(d) = &healthy_drains {
        println!(
            "\nHealthy run: {:.0} s of the permutation in sopa mode, nothing failed: {} false drains{}",
            a.healthy,
            d.len(),
            if d.is_empty() {
                String::new()
            } else {
                format!(" ({})", d.join(", "))
            }
        );
    }
    std::fs::create_dir_all(&a.out).expect("the output folder");
    // The option's files keep their names; another encoding's get its name as a suffix.
    let suffix = match a.encoding {
        Encoding::Ipv4Option => String::new(),
        e => format!("-{e}"),
    };
    let json = a.out.join(format!("failure{suffix}.json"));
    std::fs::write(
        &json,
        serde_json::to_vec_pretty(&serde_json::json!({
            "topology": "fat-tree:4",
            "encoding": a.encoding,
            "experiment": "permutation",
            "rate_mbit": a.rate,
            "onset_s": a.onset,
            "seconds": a.seconds,
            "bin_ms": BIN.as_millis() as u64,
            "rows": rows,
            "healthy_s": a.healthy,
            "load": a.load,
            "healthy_false_drains": healthy_drains,
        }))
        .expect("json"),
    )
    .expect("writing failure.json");
    println!("results: {}", json.display());
    let curves: Vec<Curve> = rows
        .iter()
        .map(|r| Curve {
            mode: r.mode.clone(),
            element: r.element.clone(),
            goodput: r.goodput.clone(),
            onset_bin: r.onset_bin,
        })
        .collect();
    draw(&curves, BIN, &a.out, &suffix);
}

/// What a figure draws of a run: its goodput over time, per 100 ms bin.
#[derive(serde::Deserialize)]
struct Curve {
    mode: String,
    element: String,
    goodput: Vec<f64>,
    onset_bin: usize,
}

/// One figure per element, a line per mode: goodput (per `bin`) against the time from the
/// failure.
fn draw(curves: &[Curve], bin: Duration, out: &std::path::Path, suffix: &str) {
    let mut elements: Vec<&str> = Vec::new();
    for c in curves {
        if !elements.contains(&c.element.as_str()) {
            elements.push(&c.element);
        }
    }
    for name in elements {
        let series: Vec<(String, Vec<(f64, f64)>)> = curves
            .iter()
            .filter(|c| c.element == name)
            .map(|c| {
                let points = c
                    .goodput
                    .iter()
                    .enumerate()
                    .map(|(i, g)| ((i as f64 - c.onset_bin as f64) * bin.as_secs_f64(), *g))
                    .collect();
                (c.mode.clone(), points)
            })
            .collect();
        let file = out.join(format!(
            "failure-{}{suffix}.svg",
            name.replace([' ', ':', '%'], "-").trim_end_matches('-')
        ));
        figures::lines(
            &file,
            &format!("{name} fails at 0 s: goodput of the permutation"),
            "seconds from the failure",
            "goodput / (flows x link rate)",
            &series,
        )
        .expect("drawing the figure");
        println!("figure: {}", file.display());
    }
}

/// `--replot FILE`: the figures of a `failure*.json`, beside it, suffixed as the JSON is
/// (`failure-srv6-load60.json`: `-srv6-load60`).
fn replot(json: &std::path::Path) {
    let text = std::fs::read_to_string(json).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", json.display()));
    let curves: Vec<Curve> = serde_json::from_value(v["rows"].clone())
        .unwrap_or_else(|e| panic!("{}: its rows: {e}", json.display()));
    let stem = json
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("failure");
    let suffix = match stem.strip_prefix("failure").unwrap_or(stem) {
        s if s.is_empty() || s.starts_with('-') => s.to_owned(),
        s => format!("-{s}"),
    };
    let bin = Duration::from_millis(v["bin_ms"].as_u64().unwrap_or(BIN.as_millis() as u64));
    draw(&curves, bin, json.parent().expect("a folder"), &suffix);
}
