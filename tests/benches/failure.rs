//! `cargo xtask bench failure [-- --modes sopa,ecmp --elements a0:c0,a2 --rate 10 --seconds 12]`:
//! failures under traffic on Fat-Tree k=4, one run each. The permutation runs (every host sends
//! to one other and receives from one); at `--onset` seconds an element fails for real (a link
//! cut, a switch with every interface down), and it stays down until the flows end. Per mode and
//! element:
//! - packets lost per flow, counted one by one between the sender's rack switch and the
//!   receiver (captures, matched by IPv4 ID), and when the last lost packet entered the fabric
//!   after the onset: the time until the failure costs nothing more;
//! - the time until each affected flow is back to 90% of its rate before the failure (its
//!   receiver's interface sampled every 100 ms) and held it for half a second;
//! - the time until the controller knows and every agent has applied the change.
//!
//! Writes `failure.json` and one figure per element (goodput of all flows over time, one line
//! per mode) into `--out`.

use std::time::{Duration, SystemTime};

use sopa_testbed::{
    experiment::{self, set_mode},
    fabric::{Fabric, FabricOptions},
    failure::{Element, Timeline, rates, recovery},
    figures,
    loss::{FlowCaptures, ms_after},
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::topology::TopologySpec;

struct Args {
    modes: Vec<String>,
    elements: Vec<Element>,
    rate: u32,
    seconds: f64,
    onset: f64,
    seed: u64,
    out: std::path::PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        modes: vec!["sopa".into(), "rps".into(), "ecmp".into()],
        elements: vec!["a0:c0".parse().unwrap(), "a2".parse().unwrap()],
        rate: 10,
        seconds: 12.0,
        onset: 4.0,
        seed: 1,
        out: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} takes a value"));
        match flag.as_str() {
            "--modes" => a.modes = value().split(',').map(str::to_owned).collect(),
            "--elements" => {
                a.elements = value()
                    .split(',')
                    .map(|e| {
                        e.parse()
                            .unwrap_or_else(|e: String| panic!("--elements: {e}"))
                    })
                    .collect()
            }
            "--rate" => a.rate = value().parse().expect("--rate MBIT"),
            "--seconds" => a.seconds = value().parse().expect("--seconds S"),
            "--onset" => a.onset = value().parse().expect("--onset S"),
            "--seed" => a.seed = value().parse().expect("--seed N"),
            "--out" => a.out = value().into(),
            "--smoke" => {
                a.modes = vec!["sopa".into(), "ecmp".into()];
                a.seconds = 5.0;
                a.onset = 2.0;
            }
            "--bench" => {}
            other => panic!(
                "unknown flag {other} (--modes, --elements, --rate, --seconds, --onset, --seed, --out, --smoke)"
            ),
        }
    }
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
    /// Packets lost per flow that entered from 25 ms before the onset on (sum, max).
    lost_sum: usize,
    lost_max: usize,
    /// When the last packet the failure cost entered the fabric, ms after the onset.
    last_loss_ms: Option<f64>,
    /// Affected flows back to 90% of their rate (seconds after the onset): median and max;
    /// flows never back are counted in `never_back`.
    back_median_s: Option<f64>,
    back_max_s: Option<f64>,
    never_back: usize,
    /// From the onset until the controller knew and every agent had applied it.
    controller_applied_s: f64,
    /// Goodput of all flows over the link rate, per 100 ms bin from the start (for the figure).
    goodput: Vec<f64>,
    onset_bin: usize,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn run_one(f: &Fabric, a: &Args, mode: &str, element: &Element) -> Row {
    let g = f.topo.graph();
    let flows = experiment::flows(f, "permutation", a.seed);
    let receivers: Vec<String> = flows.iter().map(|(_, d)| d.clone()).collect();
    let bytes = (f64::from(a.rate) * 1e6 / 8.0 * a.seconds) as u64;
    let caps = FlowCaptures::start(f, &flows).expect("captures");
    let timeline = Timeline::start(f, &receivers, Duration::from_millis(20)).expect("sampler");
    let start = SystemTime::now();
    let (onset, applied) = std::thread::scope(|s| {
        let handles: Vec<_> = flows
            .iter()
            .enumerate()
            .map(|(i, (src, dst))| {
                let addr = g.node(g.find(dst).unwrap()).addr.unwrap();
                let (sa, sb) = (f.ns(src), f.ns(dst));
                s.spawn(move || {
                    let opts = SendOptions {
                        stall_timeout: Duration::from_secs(60),
                        ..SendOptions::default()
                    };
                    tcp_transfer(sa, sb, addr, 7600 + i as u16, bytes, &opts)
                        .unwrap_or_else(|e| panic!("flow {src} -> {dst}: {e}"))
                })
            })
            .collect();
        // The schedule of the experiment: the element fails this far into the run.
        std::thread::sleep(Duration::from_secs_f64(a.onset));
        let onset = element.fail(f).expect("failing the element");
        let links = element.links(f);
        f.wait_applied(|down| down >= links, "the failure")
            .unwrap_or_else(|e| panic!("{e}"));
        let applied = ms_after(SystemTime::now(), onset) / 1e3;
        for h in handles {
            assert!(
                h.join().expect("a flow thread").intact(),
                "a flow arrived damaged"
            );
        }
        (onset, applied)
    });
    let samples = timeline.finish().expect("samples");
    let lost = caps.finish().expect("captures");
    element.restore(f).expect("restoring");
    f.wait_applied(|down| down == 0, "the restore")
        .unwrap_or_else(|e| panic!("{e}"));

    let onset_bin = (ms_after(onset, start) / BIN.as_millis() as f64).floor() as usize;
    let per_flow: Vec<Vec<f64>> = receivers
        .iter()
        .map(|r| rates(&samples[r], start, BIN))
        .collect();
    let skip = (1000 / BIN.as_millis()) as usize;
    let mut backs = Vec::new();
    let (mut affected, mut never_back) = (0, 0);
    let mut lost_since = Vec::new();
    let mut last_loss: Option<f64> = None;
    for (r, l) in per_flow.iter().zip(&lost) {
        assert_eq!(
            l.capture_drops, 0,
            "{}: a capture could not keep up",
            l.what
        );
        let n = l.since(onset, 25.0);
        lost_since.push(n);
        if n > 0 {
            let last = l
                .lost
                .iter()
                .map(|(_, t)| ms_after(*t, onset))
                .fold(f64::MIN, f64::max);
            last_loss = Some(last_loss.map_or(last, |x: f64| x.max(last)));
        }
        let rec = recovery(r, BIN, onset_bin, skip, 0.9, 5);
        if rec.affected || n > 0 {
            affected += 1;
            match rec.back_after_s {
                Some(s) => backs.push(s),
                None => never_back += 1,
            }
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
        lost_sum: lost_since.iter().sum(),
        lost_max: lost_since.iter().copied().max().unwrap_or(0),
        last_loss_ms: last_loss,
        back_median_s: median(backs.clone()),
        back_max_s: backs.iter().copied().reduce(f64::max),
        never_back,
        controller_applied_s: applied,
        goodput,
        onset_bin,
    }
}

fn main() {
    let a = args();
    let opts = FabricOptions {
        rate_mbit: Some(a.rate),
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
                "    lost {} (max {} per flow), last loss {:?} ms after, back in {:?} s (max {:?}), controller applied in {:.2} s",
                row.lost_sum,
                row.lost_max,
                row.last_loss_ms,
                row.back_median_s,
                row.back_max_s,
                row.controller_applied_s
            );
            rows.push(row);
        }
    }

    let fmt = |v: Option<f64>, scale: f64| v.map_or("-".into(), |x| format!("{:.0}", x * scale));
    println!(
        "\nFailures under traffic: Fat-Tree k=4, permutation at {} Mbit/s, failure {:.1} s in, one run each",
        a.rate, a.onset
    );
    println!(
        "{:<6} {:<14} {:>8} {:>10} {:>9} {:>12} {:>13} {:>10} {:>11} {:>12}",
        "mode",
        "element",
        "affected",
        "lost (sum)",
        "lost max",
        "last loss ms",
        "back med. ms",
        "back max",
        "never back",
        "ctrl applied"
    );
    for r in &rows {
        println!(
            "{:<6} {:<14} {:>5}/{:<2} {:>10} {:>9} {:>12} {:>13} {:>10} {:>11} {:>10.0}ms",
            r.mode,
            r.element,
            r.affected,
            r.flows,
            r.lost_sum,
            r.lost_max,
            fmt(r.last_loss_ms, 1.0),
            fmt(r.back_median_s, 1e3),
            fmt(r.back_max_s, 1e3),
            r.never_back,
            r.controller_applied_s * 1e3
        );
    }
    std::fs::create_dir_all(&a.out).expect("the output folder");
    let json = a.out.join("failure.json");
    std::fs::write(
        &json,
        serde_json::to_vec_pretty(&serde_json::json!({
            "topology": "fat-tree:4",
            "experiment": "permutation",
            "rate_mbit": a.rate,
            "onset_s": a.onset,
            "seconds": a.seconds,
            "bin_ms": BIN.as_millis() as u64,
            "rows": rows,
        }))
        .expect("json"),
    )
    .expect("writing failure.json");
    println!("results: {}", json.display());
    for element in &a.elements {
        let name = element.to_string();
        let series: Vec<(String, Vec<(f64, f64)>)> = rows
            .iter()
            .filter(|r| r.element == name)
            .map(|r| {
                let points = r
                    .goodput
                    .iter()
                    .enumerate()
                    .map(|(i, g)| ((i as f64 - r.onset_bin as f64) * BIN.as_secs_f64(), *g))
                    .collect();
                (r.mode.clone(), points)
            })
            .collect();
        let file = a
            .out
            .join(format!("failure-{}.svg", name.replace([' ', ':'], "-")));
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
