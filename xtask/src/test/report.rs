//! What `cargo xtask test` reports: each suite's counts and seconds against its time budget,
//! the table sorted by time, the skipped checks, and the timing file
//! (`target/xtask/test-times.json`).

use std::path::Path;

use anyhow::{Context as _, Result};

/// The fast tier's whole budget on a 2-core machine, suites, smoke pass and replays together.
pub const TIER_BUDGET_S: f64 = 15.0 * 60.0;

/// What one run of a suite (a test executable, a smoke step, a fuzz target) counted.
#[derive(Clone)]
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
    /// Checks the suite did not judge, each with its reason (`sopa_testbed::skipped`).
    pub skipped: Vec<String>,
    /// The seconds this suite may take in the fast tier; `None` where none is set (the full
    /// tier).
    pub budget: Option<f64>,
}

impl Outcome {
    /// A run that passed, with nothing else known yet.
    pub fn new(name: &str, seconds: f64) -> Self {
        Self {
            name: name.to_owned(),
            passed: 0,
            failed: 0,
            seconds,
            note: None,
            panics: Vec::new(),
            skipped: Vec::new(),
            budget: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.failed == 0 && self.note.is_none()
    }

    /// A run that could not happen at all (a spawn or a build failed).
    pub fn error(name: &str, e: &anyhow::Error) -> Self {
        Self {
            failed: 1,
            note: Some(format!("{e:#}")),
            ..Self::new(name, 0.0)
        }
    }

    /// Failed tests, or 1 for a run that failed without a failed test (a time-out, a crash,
    /// its budget passed).
    pub fn failures(&self) -> u64 {
        self.failed + u64::from(self.failed == 0 && self.note.is_some())
    }

    /// Sets the fast tier's budget and fails the run that passed it.
    pub fn judge_time(&mut self, budget: f64) {
        self.budget = Some(budget);
        if self.seconds > budget && self.note.is_none() {
            self.note = Some(format!(
                "took {:.0} s, past its budget of {budget:.0} s",
                self.seconds
            ));
        }
    }
}

/// The seconds a suite or smoke step may take in the fast tier on this 2-core machine, by
/// what it builds: a suite of namespace fabrics 120 s, another namespace suite (A - R - B, a
/// controller and two agents) 60 s, anything else 30 s; a smoke step that runs a Fat-Tree
/// experiment (fabric, failure) 120 s, another 60 s. The readers-under-a-rewrite races are a
/// fixed amount of work, 20 million test runs per CPU and test, so their time is the
/// machine's speed: 60 s (17-19 s here, 25 s on a slower CI machine). The IPv4 option's
/// fabric carries the most phases, three of them the path meter's (a gray link at two rates, a lying host then a real loss, a host on another
/// period), which wait out its windows of evidence: 180 s (it took 82-116 s here). With
/// `busy` of `cores` kept busy the machine has that much less CPU, and every budget grows in
/// proportion.
pub fn budget(name: &str, busy: u32, cores: u32) -> f64 {
    let base = if name == "sopa-testbed/fabric_option" {
        180.0
    } else if name.starts_with("sopa-testbed/fabric_")
        || name.starts_with("smoke bench fabric")
        || name.starts_with("smoke bench failure")
    {
        120.0
    } else if name.starts_with("sopa-testbed/")
        || name.starts_with("smoke ")
        || name == "sopa-agent/rewrite_races"
    {
        60.0
    } else {
        30.0
    };
    base * scale(busy, cores)
}

/// How much longer everything takes with `busy` of `cores` kept busy.
pub fn scale(busy: u32, cores: u32) -> f64 {
    let cores = cores.max(1);
    f64::from(cores) / f64::from(cores.saturating_sub(busy).max(1))
}

/// libtest's `test result: ok. 3 passed; 1 failed; 0 ignored; …` -> (3, 1).
pub fn libtest_counts(line: &str) -> Option<(u64, u64)> {
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

/// Lines of a panic message and the lines after it, per message (libtest prints a failed
/// test's captured output, panic included, in its `failures:` section).
const PANIC_LINES: usize = 8;

/// The panic messages in a suite's output: each `thread '…' panicked at …` line (libtest's
/// captured output) or each failed phase's section (`---- name ----`, the harness of the
/// suites that share a fabric), with the lines that follow it up to a blank line or
/// `PANIC_LINES`.
pub fn panic_messages(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let panic = lines[i].starts_with("thread '") && lines[i].contains("panicked at");
        let phase = lines[i].starts_with("---- ")
            && lines[i].ends_with(" ----")
            && !lines[i].ends_with(" stdout ----");
        if panic || phase {
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

/// Prints the summary table, slowest first, with each budget where the tier sets one; returns
/// the failures it counts.
pub fn print_table(title: &str, outcomes: &[Outcome]) -> u64 {
    let width = outcomes
        .iter()
        .map(|o| o.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    println!("\n{title}");
    println!(
        "{:<width$}  {:>6}  {:>6}  {:>7}  {:>8}  {:>6}",
        "suite", "passed", "failed", "skipped", "seconds", "budget"
    );
    for o in sorted {
        println!(
            "{:<width$}  {:>6}  {:>6}  {:>7}  {:>8.1}  {:>6}{}",
            o.name,
            o.passed,
            o.failures(),
            o.skipped.len(),
            o.seconds,
            o.budget.map_or_else(|| "-".into(), |b| format!("{b:.0}")),
            o.note
                .as_deref()
                .map(|n| format!("  {n}"))
                .unwrap_or_default()
        );
    }
    let passed: u64 = outcomes.iter().map(|o| o.passed).sum();
    let failed: u64 = outcomes.iter().map(Outcome::failures).sum();
    let skipped: usize = outcomes.iter().map(|o| o.skipped.len()).sum();
    let seconds: f64 = outcomes.iter().map(|o| o.seconds).sum();
    println!(
        "{:<width$}  {passed:>6}  {failed:>6}  {skipped:>7}  {seconds:>8.1}",
        "total"
    );
    for o in outcomes.iter().filter(|o| !o.skipped.is_empty()) {
        println!("\nskipped in {}:", o.name);
        for line in &o.skipped {
            println!("  {line}");
        }
    }
    for o in outcomes.iter().filter(|o| !o.panics.is_empty()) {
        println!("\nwhy {} failed:", o.name);
        for line in &o.panics {
            println!("  {line}");
        }
    }
    failed
}

/// Writes each suite's seconds, budget and counts of the round `outcomes` to `path`.
pub fn write_times(path: &Path, tier: &str, round: u32, outcomes: &[Outcome]) -> Result<()> {
    let total: f64 = outcomes.iter().map(|o| o.seconds).sum();
    let suites: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "name": o.name,
                "seconds": (o.seconds * 10.0).round() / 10.0,
                "budget": o.budget,
                "passed": o.passed,
                "failed": o.failures(),
                "skipped": o.skipped,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "tier": tier,
        "round": round,
        "seconds": (total * 10.0).round() / 10.0,
        "budget": (tier == "fast").then_some(TIER_BUDGET_S),
        "suites": suites,
    });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
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
    fn reprints_the_failures_of_phases() {
        let out: Vec<String> = [
            "test gray ... FAILED",
            "",
            "failures:",
            "",
            "---- gray ----",
            "a0:c0 was never suspect",
            "",
            "failures:",
            "    gray",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            panic_messages(&out),
            ["---- gray ----", "a0:c0 was never suspect"]
        );
    }

    #[test]
    fn a_suite_past_its_budget_fails_and_busy_cores_stretch_it() {
        let mut o = Outcome::new("sopa-testbed/fabric_srv6", 121.0);
        o.passed = 8;
        o.judge_time(budget(&o.name, 0, 2));
        assert!(!o.ok(), "past 120 s");
        assert!(o.note.as_deref().unwrap().contains("budget of 120 s"));
        let mut o = Outcome::new("sopa-testbed/fabric_srv6", 121.0);
        o.judge_time(budget(&o.name, 1, 2));
        assert!(o.ok(), "one core of two busy: 240 s");
        assert_eq!(budget("sopa-topology (unit)", 0, 2), 30.0);
        assert_eq!(budget("sopa-testbed/host_datapath", 0, 2), 60.0);
        assert_eq!(budget("smoke bench fabric permutation", 0, 2), 120.0);
        assert_eq!(budget("sopa-testbed/fabric_option", 0, 2), 180.0);
        assert_eq!(budget("sopa-testbed/fabric_srv6", 0, 2), 120.0);
        assert_eq!(budget("sopa-agent/rewrite_races", 0, 2), 60.0);
        assert_eq!(budget("sopa-agent/datapath_fixtures", 0, 2), 30.0);
        // A failed run keeps its own reason.
        let mut o = Outcome::error("x", &anyhow::anyhow!("crashed"));
        o.seconds = 100.0;
        o.judge_time(30.0);
        assert_eq!(o.note.as_deref(), Some("crashed"));
    }
}
