//! The smoke pass of `cargo xtask test`: every benchmark run end to end at toy size, so a
//! benchmark that nothing else runs cannot rot unnoticed. A smoke row checks that the run
//! completes and writes what it writes, not its figures: a toy-size run says nothing about
//! speed. The fast tier runs each benchmark once at its smallest size on the test profile's
//! binaries ([`fast`]); the full tier runs every experiment, mode and encoding in release
//! ([`full`]).

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{setup::workspace_root, test::Outcome, watch::watch};

/// Benchmark executables by name: (executable, package folder).
pub type Benches = HashMap<String, (PathBuf, PathBuf)>;

/// The fabric modes the smoke pass runs, every baseline and every ablation.
const FABRIC_MODES: &str =
    "sopa,rps,ecmp,hedera,single,mptcp,ideal,sopa+r3,sopa+norack,sopa+burst,sopa+first0";
/// `bench datapath` at its smallest: every table, a few runs each.
const DATAPATH_SMOKE: [&str; 10] = [
    "--runs",
    "2000",
    "--scaling-runs",
    "2000",
    "--meter-periods",
    "3",
    "--iperf-seconds",
    "1",
    "--rounds",
    "1",
];

/// Every experiment of `bench fabric`, with the topology it runs on.
const EXPERIMENTS: [(&str, &str); 6] = [
    ("sec4.2", "fat-tree:4"),
    ("permutation", "fat-tree:4"),
    ("production", "fat-tree:4"),
    ("failure", "fat-tree:4"),
    ("modric-1to1", "modric:2x2"),
    ("modric-all", "modric:2x2"),
];

/// Every benchmark once at its smallest size, on the executables the suites' build made (the
/// testbed already points at its binaries): one experiment with a mode of each kind, one
/// failure, the demo with 16 MiB.
pub fn fast(benches: &Benches, timeout: Duration) -> Result<Vec<Outcome>> {
    let out = std::env::temp_dir().join(format!("sopa-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out_s = out.display().to_string();
    let mut rows = vec![
        bench(benches, "datapath", &DATAPATH_SMOKE, timeout),
        bench(benches, "topology", &["--smoke"], timeout),
        bench(benches, "channel", &["--rounds", "1", "--smoke"], timeout),
        bench(benches, "meter", &["--smoke"], timeout),
        bench(
            benches,
            "host_cost",
            &["--seconds", "1", "--rounds", "1", "--streams", "1"],
            timeout,
        ),
        bench(
            benches,
            "resilience",
            &["--rounds", "1", "--smoke"],
            timeout,
        ),
    ];
    // Per packet and per flow, the controller's pins and the big switch of the ideal: a mode of
    // every kind the experiments have, on one fabric.
    let mut row = bench(
        benches,
        "fabric",
        &[
            "--smoke",
            "--experiment",
            "permutation",
            "--modes",
            "sopa,ecmp,hedera,ideal",
            "--rate",
            "10",
            "--mb",
            "1",
            "--out",
            &out_s,
        ],
        timeout,
    );
    expect_json(&mut row, &out, "fabric-permutation");
    row.name = "smoke bench fabric permutation".into();
    rows.push(row);
    let mut row = bench(
        benches,
        "failure",
        &["--smoke", "--elements", "a0:c0", "--out", &out_s],
        timeout,
    );
    if row.note.is_none() && !out.join("failure.json").exists() {
        row.note = Some(format!("wrote no failure.json in {out_s}"));
    }
    row.name = "smoke bench failure".into();
    rows.push(row);
    rows.push(replot(
        benches,
        "fabric",
        &out,
        "fabric-permutation",
        timeout,
    ));
    rows.push(replot(benches, "failure", &out, "failure", timeout));
    rows.push(step(
        "smoke demo --arb",
        xtask_command(&["demo", "--arb", "--mib", "16", "--prebuilt"]),
        timeout,
    ));
    rows.push(help(benches));
    Ok(finish(rows, &out))
}

/// Every benchmark prints its options with `--help` (`cargo xtask bench NAME -- --help`), and
/// exits 0 without running anything.
fn help(benches: &Benches) -> Outcome {
    let start = std::time::Instant::now();
    let mut o = Outcome::new("smoke bench --help", 0.0);
    let mut names: Vec<&String> = benches.keys().collect();
    names.sort();
    let mut refused = Vec::new();
    for name in names {
        let (exe, dir) = &benches[name];
        let out = Command::new(exe)
            .args(["--bench", "--help"])
            .current_dir(dir)
            .output();
        match out {
            Ok(out)
                if out.status.success()
                    && String::from_utf8_lossy(&out.stdout).contains("Usage:") =>
            {
                o.passed += 1
            }
            Ok(out) => refused.push(format!(
                "{name} ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or_default()
            )),
            Err(e) => refused.push(format!("{name}: {e}")),
        }
    }
    if !refused.is_empty() {
        o.failed = refused.len() as u64;
        o.note = Some(format!("no help from: {}", refused.join("; ")));
    }
    o.seconds = start.elapsed().as_secs_f64();
    o
}

/// Every benchmark, and every experiment with every mode, both encodings and the flowcell
/// sweep, at toy size (one round, 1 MB flows) in release.
pub fn full(timeout: Duration) -> Result<Vec<Outcome>> {
    crate::demo::build_release()?;
    let benches = build_benches()?;
    let out = std::env::temp_dir().join(format!("sopa-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out_s = out.display().to_string();
    let mut rows = vec![
        bench(&benches, "datapath", &DATAPATH_SMOKE, timeout),
        bench(&benches, "topology", &["--smoke"], timeout),
        bench(&benches, "channel", &["--rounds", "1", "--smoke"], timeout),
        bench(&benches, "meter", &["--smoke"], timeout),
        bench(
            &benches,
            "host_cost",
            &["--seconds", "1", "--rounds", "1", "--streams", "1,2"],
            timeout,
        ),
        bench(
            &benches,
            "resilience",
            &["--rounds", "1", "--smoke"],
            timeout,
        ),
    ];
    for (experiment, topo) in EXPERIMENTS {
        // Every mode and ablation on the concurrent experiments; the sequential ones (a few
        // seconds per flow at 10 Mbit/s) with every base mode and one flow per host.
        let (modes, per_host) = match (topo.starts_with("modric"), experiment) {
            (true, _) => ("sopa,rps,ecmp,single,ideal", "2"),
            (false, "production" | "failure") => ("sopa,rps,ecmp,hedera,single,mptcp,ideal", "1"),
            _ => (FABRIC_MODES, "2"),
        };
        let mut row = bench(
            &benches,
            "fabric",
            &[
                "--smoke",
                "--experiment",
                experiment,
                "--topo",
                topo,
                "--modes",
                modes,
                "--rate",
                "10",
                "--mb",
                "1",
                "--flows-per-host",
                per_host,
                "--out",
                &out_s,
            ],
            timeout,
        );
        // Written either way; marked invalid where the toy run failed the fidelity check.
        expect_json(&mut row, &out, &format!("fabric-{experiment}"));
        row.name = format!("smoke bench fabric {experiment}");
        rows.push(row);
    }
    // Both encodings, each on its fabric, compared in one run.
    let mut row = bench(
        &benches,
        "fabric",
        &[
            "--smoke",
            "--experiment",
            "permutation",
            "--encoding",
            "ipv4-option,srv6",
            "--modes",
            "sopa,ecmp,hedera",
            "--rate",
            "10",
            "--mb",
            "1",
            "--out",
            &out_s,
        ],
        timeout,
    );
    expect_json(&mut row, &out, "fabric-permutation-srv6");
    row.name = "smoke bench fabric --encoding ipv4-option,srv6".into();
    rows.push(row);
    // The flowcell sweep: two rates, each its own fabric, set at run time through the agents.
    let mut row = bench(
        &benches,
        "fabric",
        &[
            "--smoke",
            "--experiment",
            "granularity",
            "--modes",
            "ideal,sopa,sopa+cell4",
            "--rates",
            "10,20",
            "--mb",
            "1",
            "--out",
            &out_s,
        ],
        timeout,
    );
    expect_json(&mut row, &out, "fabric-granularity-sweep");
    row.name = "smoke bench fabric granularity".into();
    rows.push(row);
    // Failures under traffic: a core link and an aggregation switch, two modes.
    let mut row = bench(&benches, "failure", &["--smoke", "--out", &out_s], timeout);
    if row.note.is_none() && !out.join("failure.json").exists() {
        row.note = Some(format!("wrote no failure.json in {out_s}"));
    }
    row.name = "smoke bench failure".into();
    rows.push(row);
    rows.push(replot(&benches, "fabric", &out, "fabric-sec4.2", timeout));
    rows.push(replot(
        &benches,
        "fabric",
        &out,
        "fabric-granularity-sweep",
        timeout,
    ));
    rows.push(replot(&benches, "failure", &out, "failure", timeout));
    rows.push(step(
        "smoke demo --arb",
        xtask_command(&["demo", "--arb"]),
        timeout,
    ));
    Ok(finish(rows, &out))
}

/// `bench BENCH --replot` of the JSON `name` a run wrote into `out` (or its `-INVALID` one).
fn replot(
    benches: &Benches,
    bench_name: &str,
    out: &std::path::Path,
    name: &str,
    timeout: Duration,
) -> Outcome {
    let json = [format!("{name}.json"), format!("{name}-INVALID.json")]
        .map(|n| out.join(n))
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| out.join(format!("{name}.json")));
    let mut row = bench(
        benches,
        bench_name,
        &["--replot", &json.display().to_string()],
        timeout,
    );
    row.name = format!("smoke bench {bench_name} --replot {name}");
    row
}

/// Each row one check; the scratch folder removed.
fn finish(mut rows: Vec<Outcome>, out: &std::path::Path) -> Vec<Outcome> {
    for r in &mut rows {
        r.passed = u64::from(r.note.is_none());
        r.failed = u64::from(r.note.is_some());
    }
    let _ = std::fs::remove_dir_all(out);
    rows
}

/// A run that passed must have written `NAME.json`, or `NAME-INVALID.json` where the toy run
/// failed its fidelity check.
fn expect_json(row: &mut Outcome, out: &std::path::Path, name: &str) {
    let written = [format!("{name}.json"), format!("{name}-INVALID.json")]
        .iter()
        .any(|n| out.join(n).exists());
    if row.note.is_none() && !written {
        row.note = Some(format!("wrote no {name}.json in {}", out.display()));
    }
}

/// Every benchmark executable of the workspace, built once (`cargo bench --no-run`): name ->
/// (executable, package folder).
fn build_benches() -> Result<Benches> {
    Ok(crate::setup::build_executables("bench", &[])?
        .into_iter()
        .filter(|e| e.kind == "bench")
        .map(|e| (e.target, (e.path, e.dir)))
        .collect())
}

/// One smoke row: a failure to even start it is the row's failure, not the pass's.
fn bench(benches: &Benches, name: &str, args: &[&str], timeout: Duration) -> Outcome {
    let Some((exe, dir)) = benches.get(name) else {
        return Outcome::error(
            &format!("smoke bench {name}"),
            &anyhow::anyhow!("cargo built no benchmark named {name}"),
        );
    };
    let mut cmd = Command::new(exe);
    // `--bench`, as cargo passes it to a benchmark.
    cmd.arg("--bench").args(args).current_dir(dir);
    step(&format!("smoke bench {name}"), cmd, timeout)
}

fn xtask_command(args: &[&str]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("xtask").args(args).current_dir(workspace_root());
    cmd
}

fn step(name: &str, cmd: Command, timeout: Duration) -> Outcome {
    run_step(name, cmd, timeout).unwrap_or_else(|e| Outcome::error(name, &e))
}

fn run_step(name: &str, mut cmd: Command, timeout: Duration) -> Result<Outcome> {
    use std::os::unix::process::CommandExt as _;
    println!("\n----- {name} -----");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let w = watch(child, timeout, |line| println!("{line}"))?;
    let note = if w.timed_out {
        Some(format!("killed after {} s", timeout.as_secs()))
    } else if !w.success {
        Some(format!("exited with {}", w.status))
    } else {
        None
    };
    if w.timed_out {
        let _ = sopa_testbed::leftovers::clean();
    }
    let mut o = Outcome::new(name, w.seconds);
    if !w.success {
        // A bench ends on its error (anyhow's chain): its last lines say why.
        o.panics = w.lines[w.lines.len().saturating_sub(8)..].to_vec();
    }
    o.note = note;
    Ok(o)
}
