//! `cargo xtask test`: the whole suite, one test executable at a time, each under a time limit,
//! every one run even when another fails, then a summary table sorted by time and a closing
//! line `N passed, N failed`. The namespace suites and the BPF_PROG_TEST_RUN fixtures need root;
//! they create only namespaces and pins of their own, and whatever an interrupted earlier run
//! left (namespaces, pins, run folders of the testbed's names) is removed before the first
//! suite.
//!
//! Two tiers. The fast one (the default, and CI's) builds one profile, the test profile, for
//! everything it runs: the suites, then a smoke pass of every benchmark at its smallest size on
//! the same binaries; the fuzz targets' committed seeds are replayed by ordinary tests. It holds
//! each suite to a time budget and itself to 15 minutes. The full one (`--full`) adds today's
//! sizes: the bench smoke pass of every experiment and both encodings in release, and timed
//! fuzzing with libFuzzer.

mod report;

use std::{
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
pub use report::{Outcome, print_table};

use crate::{
    setup,
    watch::{forward_signals, watch},
};

#[derive(Args)]
pub struct TestArgs {
    /// The full tier: the fast tier's suites, then the smoke pass of every benchmark and
    /// experiment at today's sizes (release build) and every fuzz target with libFuzzer for
    /// --fuzz-seconds. Run it before a change to tests, benches, experiments or anything
    /// docs/RESULTS.md cites.
    #[arg(long, env = "SOPA_TEST_FULL")]
    pub full: bool,
    /// Seconds per fuzz target in the full tier (0 skips fuzzing).
    #[arg(long, env = "SOPA_FUZZ_SECONDS", default_value_t = 20)]
    pub fuzz_seconds: u64,
    /// Run every suite this many times (one build), stopping at nothing; the summary counts
    /// the rounds that passed whole. The smoke pass and the fuzz targets run with the first.
    #[arg(long, env = "SOPA_TEST_REPEAT", default_value_t = 1)]
    pub repeat: u32,
    /// Seconds one test executable may run before it is killed (with every process it started)
    /// and counted as failed.
    #[arg(long, env = "SOPA_SUITE_TIMEOUT", default_value_t = 900)]
    pub suite_timeout: u64,
    /// Keep this many cores busy with a spinning thread each while the suites run: the suite
    /// must pass on a busy machine too (the time budgets grow with the CPU taken).
    #[arg(long, env = "SOPA_BUSY_CORES", default_value_t = 0)]
    pub busy_cores: u32,
    /// Skip the smoke pass of the benchmarks and experiments.
    #[arg(long, env = "SOPA_NO_BENCH_SMOKE")]
    pub no_bench_smoke: bool,
    /// Extra arguments for every test executable, e.g. a test name filter (`-- fabric_`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// One test executable, as cargo built it.
struct Suite {
    /// `package/target`, e.g. `sopa-testbed/host_resilience`.
    name: String,
    exe: PathBuf,
    /// The package's folder: cargo runs tests there.
    dir: PathBuf,
}

/// Where the runner writes each suite's seconds.
fn times_file() -> PathBuf {
    setup::workspace_root().join("target/xtask/test-times.json")
}

pub fn run(args: &TestArgs) -> Result<()> {
    if !setup::is_root() {
        bail!(
            "the datapath and namespace tests load eBPF programs and create namespaces: run as root"
        );
    }
    if args.repeat == 0 {
        bail!("--repeat 0 runs nothing: give 1 or more");
    }
    forward_signals();
    report_leftovers(sopa_testbed::leftovers::clean()?);
    // The namespace suites start the binaries; build them first, in the test profile's folder.
    // The build is not a suite: its time is outside the tier's budget.
    let build = build_outcome(setup::build_bins(false)?);
    // The full tier installs the packages and runs the images (tests/tests/package.rs);
    // built first, once: a failure is a row of the table (the package suite then says what is
    // missing), not the end of the run.
    let mut image = None;
    if args.full && args.args.is_empty() {
        let started = std::time::Instant::now();
        let mut o = Outcome::new("cargo xtask image", started.elapsed().as_secs_f64());
        match crate::package::image() {
            Ok(tags) => o.passed = tags.len() as u64,
            Err(e) => o.note = Some(format!("{e:#}")),
        }
        o.seconds = started.elapsed().as_secs_f64();
        image = Some(o);
    }
    let (suites, benches) = build_suites()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let busy = Busy::start(args.busy_cores);
    let filtered = !args.args.is_empty();
    let tier = if args.full { "full" } else { "fast" };
    let mut rounds = Vec::new();
    for round in 1..=args.repeat {
        if args.repeat > 1 {
            println!("\n===== round {round} of {} =====", args.repeat);
        }
        let mut outcomes: Vec<Outcome> = suites
            .iter()
            .map(|s| {
                run_suite(s, &args.args, Duration::from_secs(args.suite_timeout), tier)
                    .unwrap_or_else(|e| Outcome::error(&s.name, &e))
            })
            .collect();
        if round == 1 && !filtered {
            outcomes.push(build.clone());
            outcomes.extend(image.clone());
        }
        // A filtered run is someone iterating on a few tests: no smoke pass, no fuzzing then.
        // Both run once, with the first round: `--repeat` is about the suites.
        if !filtered && !args.no_bench_smoke && round == 1 {
            let timeout = Duration::from_secs(args.suite_timeout);
            let rows = if args.full {
                crate::smoke::full(timeout)
            } else {
                crate::smoke::fast(&benches, timeout)
            };
            match rows {
                Ok(rows) => outcomes.extend(rows),
                Err(e) => outcomes.push(Outcome::error("smoke pass", &e)),
            }
            // The full smoke pass runs the release binaries; later rounds run these.
            setup::point_bins(false);
        }
        if !filtered && args.full && args.fuzz_seconds > 0 && round == 1 {
            match crate::fuzz::run_all(args.fuzz_seconds) {
                Ok(rows) => outcomes.extend(rows),
                Err(e) => outcomes.push(Outcome::error("fuzz targets", &e)),
            }
        }
        if !args.full {
            for o in &mut outcomes {
                o.judge_time(report::budget(&o.name, args.busy_cores, cores));
            }
        }
        let seconds: f64 = outcomes.iter().map(|o| o.seconds).sum();
        print_table(
            &format!("round {round}, {tier} tier: {seconds:.0} s"),
            &outcomes,
        );
        report::write_times(&times_file(), tier, round, &outcomes)?;
        let tier_budget = report::TIER_BUDGET_S * report::scale(args.busy_cores, cores);
        if !args.full && !filtered && seconds > tier_budget {
            let mut o = Outcome::new("the fast tier", 0.0);
            o.note = Some(format!(
                "took {seconds:.0} s, past its budget of {tier_budget:.0} s (slowest: {})",
                slowest(&outcomes)
            ));
            println!("\n{}", o.note.as_deref().unwrap_or_default());
            outcomes.push(o);
        }
        println!("times of each suite: {}", times_file().display());
        rounds.push(outcomes);
    }
    drop(busy);
    let clean = rounds.iter().filter(|r| r.iter().all(Outcome::ok)).count();
    let passed: u64 = rounds.iter().flatten().map(|o| o.passed).sum();
    let failed: u64 = rounds.iter().flatten().map(Outcome::failures).sum();
    if args.repeat > 1 {
        println!(
            "\n{clean} of {} rounds passed whole{}",
            args.repeat,
            if args.busy_cores > 0 {
                format!(" with {} core(s) kept busy", args.busy_cores)
            } else {
                String::new()
            }
        );
    }
    println!("\n{passed} passed, {failed} failed");
    let skipped: usize = rounds.iter().flatten().map(|o| o.skipped.len()).sum();
    if filtered && passed == 0 && failed == 0 && skipped == 0 {
        // A filter that names no test would otherwise read as a clean run.
        bail!(
            "no test name matches {:?}: the filter is a test function's name or part of it \
             (e.g. `-- ecmp_mode`), not a suite's file name",
            args.args.join(" ")
        );
    }
    if failed > 0 {
        // The closing line above is the verdict; the table names what failed.
        std::process::exit(1);
    }
    Ok(())
}

/// The build step as a check: a first build (a clean clone, or the eBPF crate changed) shows
/// the eBPF build as cargo's one progress line, with no warning lines from build scripts
/// (aya-build used to pass on every line of its inner cargo: about forty).
fn build_outcome(warnings: usize) -> Outcome {
    let mut o = Outcome::new("build (quiet: no build-script warnings)", 0.0);
    if warnings == 0 {
        o.passed = 1;
    } else {
        o.failed = 1;
        o.note = Some(format!(
            "the build wrote {warnings} build-script warning lines (`warning: sopa-…@…:`); \
             a first build must write none"
        ));
    }
    o
}

/// The three slowest of `outcomes`, with their seconds.
fn slowest(outcomes: &[Outcome]) -> String {
    let mut by_time: Vec<&Outcome> = outcomes.iter().collect();
    by_time.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    by_time
        .iter()
        .take(3)
        .map(|o| format!("{} {:.0} s", o.name, o.seconds))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report_leftovers(r: sopa_testbed::leftovers::Removed) {
    if r.namespaces + r.folders + r.processes > 0 {
        println!(
            "removed what an interrupted earlier run left: {} namespaces, {} processes in them, \
             {} pin, run and temporary folders",
            r.namespaces, r.processes, r.folders
        );
    }
}

/// Builds every test executable and every benchmark of the workspace in the test profile (one
/// `cargo test --all-targets --no-run`) and lists them: the suites, and the benchmarks by
/// name for the fast smoke pass.
fn build_suites() -> Result<(Vec<Suite>, crate::smoke::Benches)> {
    let built = setup::build_executables("test", &["--all-targets"])?;
    let mut suites = Vec::new();
    let mut benches = crate::smoke::Benches::new();
    for e in built {
        match e.kind.as_str() {
            // Built as plain programs (harness = false): the smoke pass runs them.
            "bench" => {
                benches.insert(e.target, (e.path, e.dir));
            }
            // Integration suites, whatever their harness; libraries' and binaries' own tests.
            "test" => suites.push(Suite {
                name: format!("{}/{}", e.package, e.target),
                exe: e.path,
                dir: e.dir,
            }),
            "lib" | "bin" if e.harness => suites.push(Suite {
                name: match e.kind.as_str() {
                    "lib" => format!("{} (unit)", e.package),
                    _ => format!("{} bin {}", e.package, e.target),
                },
                exe: e.path,
                dir: e.dir,
            }),
            _ => {}
        }
    }
    if suites.is_empty() {
        bail!("cargo built no test executable");
    }
    suites.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((suites, benches))
}

/// Runs one test executable as `cargo test` would (in its package's folder), one test at a
/// time, killing it and everything it started at `timeout`, and counts its results from
/// libtest's summary lines and the checks it skipped from its skip file.
fn run_suite(suite: &Suite, extra: &[String], timeout: Duration, tier: &str) -> Result<Outcome> {
    println!("\n----- {} -----", suite.name);
    let skips = setup::workspace_root()
        .join("target/xtask/skipped")
        .join(suite.name.replace(['/', ' ', '(', ')'], "_"));
    if let Some(dir) = skips.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&skips);
    let mut cmd = Command::new(&suite.exe);
    // Every binary runs its tests one at a time: two fabrics, or two agents, on 2 cores make
    // each other's timing. A caller's own --test-threads wins.
    if !extra.iter().any(|a| a.starts_with("--test-threads")) {
        cmd.arg("--test-threads=1");
    }
    cmd.args(extra)
        .current_dir(&suite.dir)
        .env("CARGO_MANIFEST_DIR", &suite.dir)
        .env(sopa_testbed::SKIPPED_FILE_ENV, &skips)
        .env(sopa_testbed::TIER_ENV, tier)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // Its own process group, so a time-out ends the agents and tools it started too.
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", suite.exe.display()))?;
    let result = watch(child, timeout, |line| println!("{line}"))?;
    let mut o = Outcome::new(&suite.name, result.seconds);
    for line in &result.lines {
        if let Some((p, f)) = report::libtest_counts(line) {
            o.passed += p;
            o.failed += f;
        }
    }
    o.note = if result.timed_out {
        Some(format!(
            "killed after {} s (--suite-timeout)",
            timeout.as_secs()
        ))
    } else if !result.success && o.failed == 0 {
        Some(format!("exited with {}", result.status))
    } else {
        None
    };
    if result.timed_out {
        // What the killed suite left (namespaces, pins, agents in them) must not disturb the
        // next one.
        match sopa_testbed::leftovers::clean() {
            Ok(r) => report_leftovers(r),
            Err(e) => eprintln!("removing what the killed suite left: {e}"),
        }
    }
    if o.failed > 0 {
        o.panics = report::panic_messages(&result.lines);
    }
    o.skipped = std::fs::read_to_string(&skips)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default();
    Ok(o)
}

/// Spinning threads that keep cores busy until dropped.
struct Busy {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(cores: u32) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        if cores > 0 {
            println!("keeping {cores} core(s) busy while the suites run");
        }
        Self { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
