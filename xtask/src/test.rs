//! `cargo xtask test`: the whole suite, one test executable at a time, each under a time limit,
//! every one run even when another fails, then a summary table and a closing line
//! `N passed, N failed`. The namespace suites and the BPF_PROG_TEST_RUN fixtures need root; they
//! create only namespaces and pins of their own, and whatever an interrupted earlier run left
//! (namespaces, pins, run folders of the testbed's names) is removed before the first suite.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI32, Ordering},
        mpsc::RecvTimeoutError,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::setup;

#[derive(Args)]
pub struct TestArgs {
    /// Seconds per fuzz target (0 skips fuzzing).
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
    /// must pass on a busy machine too.
    #[arg(long, env = "SOPA_BUSY_CORES", default_value_t = 0)]
    pub busy_cores: u32,
    /// Skip the smoke pass of the benchmarks and experiments at toy size.
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

/// What one run of a suite counted.
pub struct Outcome {
    pub name: String,
    pub passed: u64,
    pub failed: u64,
    pub seconds: f64,
    /// Why the run failed beyond its failed tests: a time-out, a crash, an exit code.
    pub note: Option<String>,
    /// The panic messages of the failed tests, reprinted after the table so that the end of a
    /// long log says why, not only what, failed.
    pub panics: Vec<String>,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.failed == 0 && self.note.is_none()
    }

    /// A run that could not happen at all (a spawn or a build failed).
    pub fn error(name: &str, e: &anyhow::Error) -> Self {
        Self {
            name: name.to_owned(),
            passed: 0,
            failed: 1,
            seconds: 0.0,
            note: Some(format!("{e:#}")),
            panics: Vec::new(),
        }
    }

    /// Failed tests, or 1 for a run that failed without a failed test (a time-out, a crash).
    fn failures(&self) -> u64 {
        self.failed + u64::from(self.failed == 0 && self.note.is_some())
    }
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
    setup::build_bins(false)?;
    let suites = build_suites()?;
    let busy = Busy::start(args.busy_cores);
    let filtered = !args.args.is_empty();
    let mut rounds = Vec::new();
    for round in 1..=args.repeat {
        if args.repeat > 1 {
            println!("\n===== round {round} of {} =====", args.repeat);
        }
        let mut outcomes: Vec<Outcome> = suites
            .iter()
            .map(|s| {
                run_suite(s, &args.args, Duration::from_secs(args.suite_timeout))
                    .unwrap_or_else(|e| Outcome::error(&s.name, &e))
            })
            .collect();
        // A filtered run is someone iterating on a few tests: no smoke pass, no fuzzing then.
        // Both run once, with the first round: `--repeat` is about the suites.
        if !filtered && !args.no_bench_smoke && round == 1 {
            match crate::smoke::run(Duration::from_secs(args.suite_timeout)) {
                Ok(rows) => outcomes.extend(rows),
                Err(e) => outcomes.push(Outcome::error("smoke pass", &e)),
            }
            // The smoke pass runs the release binaries; the suites of later rounds run these.
            setup::point_bins(false);
        }
        if !filtered && args.fuzz_seconds > 0 && round == 1 {
            match crate::fuzz::run_all(args.fuzz_seconds) {
                Ok(rows) => outcomes.extend(rows),
                Err(e) => outcomes.push(Outcome::error("fuzz targets", &e)),
            }
        }
        print_table(&format!("round {round}"), &outcomes);
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
    if filtered && passed == 0 && failed == 0 {
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

fn report_leftovers(r: sopa_testbed::leftovers::Removed) {
    if r.namespaces + r.folders + r.processes > 0 {
        println!(
            "removed what an interrupted earlier run left: {} namespaces, {} processes in them, \
             {} pin, run and temporary folders",
            r.namespaces, r.processes, r.folders
        );
    }
}

/// Builds every test executable of the workspace (one `cargo test --no-run`) and lists them.
fn build_suites() -> Result<Vec<Suite>> {
    let mut suites: Vec<Suite> = setup::build_executables("test")?
        .into_iter()
        // The binaries the suites start are built too; only the test harnesses are suites.
        .filter(|e| e.harness)
        .map(|e| Suite {
            name: match e.kind.as_str() {
                "lib" => format!("{} (unit)", e.package),
                "bin" => format!("{} bin {}", e.package, e.target),
                _ => format!("{}/{}", e.package, e.target),
            },
            exe: e.path,
            dir: e.dir,
        })
        .collect();
    if suites.is_empty() {
        bail!("cargo built no test executable");
    }
    suites.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(suites)
}

/// Runs one test executable as `cargo test` would (in its package's folder), killing it and
/// everything it started at `timeout`, and counts its results from libtest's summary lines.
fn run_suite(suite: &Suite, extra: &[String], timeout: Duration) -> Result<Outcome> {
    println!("\n----- {} -----", suite.name);
    let mut cmd = Command::new(&suite.exe);
    cmd.args(extra)
        .current_dir(&suite.dir)
        .env("CARGO_MANIFEST_DIR", &suite.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // Its own process group, so a time-out ends the agents and tools it started too.
        .process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", suite.exe.display()))?;
    let result = watch(child, timeout, |line| println!("{line}"))?;
    let mut passed = 0;
    let mut failed = 0;
    for line in &result.lines {
        if let Some((p, f)) = libtest_counts(line) {
            passed += p;
            failed += f;
        }
    }
    let note = if result.timed_out {
        Some(format!(
            "killed after {} s (--suite-timeout)",
            timeout.as_secs()
        ))
    } else if !result.success && failed == 0 {
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
    Ok(Outcome {
        name: suite.name.clone(),
        passed,
        failed,
        seconds: result.seconds,
        note,
        panics: if failed > 0 {
            panic_messages(&result.lines)
        } else {
            Vec::new()
        },
    })
}

pub struct Watched {
    pub lines: Vec<String>,
    pub success: bool,
    pub status: String,
    pub timed_out: bool,
    pub seconds: f64,
}

/// The process group of the suite running now, for [`forward_signals`].
static CURRENT_GROUP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    let group = CURRENT_GROUP.load(Ordering::SeqCst);
    // SAFETY: kill, signal and raise are async-signal-safe.
    unsafe {
        if group > 0 {
            libc::kill(-group, signal);
        }
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// Ctrl-C and SIGTERM reach the suite running in its own process group too (and everything it
/// started), then end this process as they would have.
pub fn forward_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only makes async-signal-safe calls.
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Sends `signal` to the process group `group`.
fn kill_group(group: u32, signal: libc::c_int) {
    // SAFETY: signalling a process group this runner created for its child.
    unsafe { libc::kill(-(group as i32), signal) };
}

/// Waits up to `grace` for `child` to exit.
fn exited_within(child: &mut Child, grace: Duration) -> Result<Option<std::process::ExitStatus>> {
    let until = Instant::now() + grace;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Echoes and collects a child's stdout (the leader of its own process group) until it exits
/// or `timeout` passes; then its whole process group is killed (SIGTERM, SIGKILL 5 s later).
/// Whatever the leader left running in its group is killed once it has exited, so nothing can
/// hold the pipe, or this runner, open.
pub fn watch(mut child: Child, timeout: Duration, echo: impl Fn(&str)) -> Result<Watched> {
    let start = Instant::now();
    let group = child.id();
    CURRENT_GROUP.store(group as i32, Ordering::SeqCst);
    let stdout = child.stdout.take().context("the child's stdout is piped")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        // Bytes, not `lines()`: a line that is not UTF-8 must not stop the reading.
        while matches!(reader.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches('\n')
                .to_owned();
            buf.clear();
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let take = |line: String, lines: &mut Vec<String>| {
        echo(&line);
        lines.push(line);
    };
    let deadline = start + timeout;
    let mut timed_out = false;
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => take(line, &mut lines),
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(50)),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= deadline {
            timed_out = true;
            kill_group(group, libc::SIGTERM);
            if let Some(st) = exited_within(&mut child, Duration::from_secs(5))? {
                break Some(st);
            }
            kill_group(group, libc::SIGKILL);
            break exited_within(&mut child, Duration::from_secs(5))?;
        }
    };
    // The leader is gone: what it left in its group goes too, then the pipe drains.
    kill_group(group, libc::SIGKILL);
    CURRENT_GROUP.store(0, Ordering::SeqCst);
    let drain_until = Instant::now() + Duration::from_secs(5);
    while let Ok(line) = rx.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
        take(line, &mut lines);
    }
    let success = !timed_out && status.is_some_and(|s| s.success());
    Ok(Watched {
        lines,
        success,
        status: status.map_or_else(|| "no exit after SIGKILL".to_owned(), |s| s.to_string()),
        timed_out,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Lines of a panic message and the lines after it, per message (libtest prints a failed
/// test's captured output, panic included, in its `failures:` section).
const PANIC_LINES: usize = 8;

/// The panic messages in a suite's output: each `thread '…' panicked at …` line with the lines
/// that follow it up to a blank line or `PANIC_LINES`.
fn panic_messages(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("thread '") && lines[i].contains("panicked at") {
            let end = lines[i..]
                .iter()
                .take(PANIC_LINES)
                .position(|l| l.trim().is_empty())
                .map_or((i + PANIC_LINES).min(lines.len()), |n| i + n);
            out.extend(lines[i..end].iter().cloned());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// libtest's `test result: ok. 3 passed; 1 failed; 0 ignored; …` -> (3, 1).
fn libtest_counts(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("test result: ")?;
    let count = |word: &str| {
        rest.split(';').find_map(|part| {
            let mut it = part.split_whitespace().rev();
            (it.next()? == word)
                .then(|| it.next()?.parse::<u64>().ok())
                .flatten()
        })
    };
    Some((count("passed")?, count("failed")?))
}

/// Prints the summary table; returns the failures it counts.
pub fn print_table(title: &str, outcomes: &[Outcome]) -> u64 {
    let width = outcomes
        .iter()
        .map(|o| o.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!("\n{title}");
    println!(
        "{:<width$}  {:>6}  {:>6}  {:>8}",
        "suite", "passed", "failed", "seconds"
    );
    for o in outcomes {
        println!(
            "{:<width$}  {:>6}  {:>6}  {:>8.1}{}",
            o.name,
            o.passed,
            o.failures(),
            o.seconds,
            o.note
                .as_deref()
                .map(|n| format!("  {n}"))
                .unwrap_or_default()
        );
    }
    let passed: u64 = outcomes.iter().map(|o| o.passed).sum();
    let failed: u64 = outcomes.iter().map(Outcome::failures).sum();
    let seconds: f64 = outcomes.iter().map(|o| o.seconds).sum();
    println!(
        "{:<width$}  {passed:>6}  {failed:>6}  {seconds:>8.1}",
        "total"
    );
    for o in outcomes.iter().filter(|o| !o.panics.is_empty()) {
        println!("\nwhy {} failed:", o.name);
        for line in &o.panics {
            println!("  {line}");
        }
    }
    failed
}

/// Spinning threads that keep cores busy until dropped.
struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(cores: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
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
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_libtest_summaries() {
        assert_eq!(
            libtest_counts(
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s"
            ),
            Some((12, 0))
        );
        assert_eq!(
            libtest_counts("test result: FAILED. 3 passed; 2 failed; 0 ignored"),
            Some((3, 2))
        );
        assert_eq!(libtest_counts("test foo ... ok"), None);
    }

    #[test]
    fn reprints_the_panics_of_failed_tests() {
        let out: Vec<String> = [
            "test a ... FAILED",
            "failures:",
            "---- a stdout ----",
            "healthy: fine",
            "thread 'a' panicked at tests/a.rs:10:5:",
            "a0:c0 was never suspect",
            "note: run with `RUST_BACKTRACE=1`",
            "",
            "failures:",
            "    a",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            panic_messages(&out),
            [
                "thread 'a' panicked at tests/a.rs:10:5:",
                "a0:c0 was never suspect",
                "note: run with `RUST_BACKTRACE=1`",
            ]
        );
        assert!(panic_messages(&out[..4]).is_empty());
    }

    #[test]
    fn a_leader_that_exits_leaving_a_child_on_the_pipe_does_not_hold_the_runner() {
        let child = Command::new("sh")
            .args(["-c", "echo done; sleep 30 & exit 0"])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let w = watch(child, Duration::from_secs(60), |_| {}).unwrap();
        assert!(w.success && !w.timed_out, "{}", w.status);
        assert_eq!(w.lines, ["done"]);
        assert!(w.seconds < 10.0, "held for {} s", w.seconds);
    }

    #[test]
    fn a_suite_past_its_time_is_killed_with_its_children() {
        // The time limit leaves the shell seconds to say it started, however busy the
        // machine (500 ms did not, once, with a build running beside it); its children sleep
        // far longer than the limit, so only the kill ends them in time.
        let child = Command::new("sh")
            .args(["-c", "echo started; sleep 120 & sleep 120; echo never"])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let w = watch(child, Duration::from_secs(5), |_| {}).unwrap();
        assert!(w.timed_out);
        assert!(!w.success);
        assert_eq!(w.lines, ["started"]);
        assert!(w.seconds < 60.0, "killed in {} s", w.seconds);
    }
}
