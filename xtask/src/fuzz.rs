//! `cargo xtask fuzz [--seconds N]` and the fuzz step of `cargo xtask test`: every cargo-fuzz
//! target in fuzz/ for a bounded time, from the committed seeds, in a scratch corpus.

use std::{path::Path, process::Command, time::Instant};

use anyhow::{Context as _, Result, bail};

use crate::{
    setup::{self, workspace_root},
    test::Outcome,
};

/// The targets and what they cover.
pub const TARGETS: [(&str, &str); 3] = [
    (
        "channel_messages",
        "the push channel's decoder, both directions, and applying what decodes",
    ),
    ("path_table_toml", "the agent's path table loader"),
    (
        "topology_spec_toml",
        "the controller's topology spec loader",
    ),
];

pub fn run(seconds: u64) -> Result<()> {
    let failed: Vec<_> = run_all(seconds)?
        .into_iter()
        .filter_map(|o| o.note)
        .collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("\n"));
    }
    Ok(())
}

/// Every target for `seconds`, one after the other even when one fails; a row each for the
/// summary of `cargo xtask test`.
pub fn run_all(seconds: u64) -> Result<Vec<Outcome>> {
    setup::cargo_fuzz()?;
    let fuzz = workspace_root().join("fuzz");
    let scratch = std::env::temp_dir().join(format!("sopa-fuzz-{}", std::process::id()));
    let outcomes = TARGETS
        .iter()
        .map(|(target, what)| {
            let start = Instant::now();
            let result = one(&fuzz, &scratch, target, what, seconds);
            let mut o = Outcome::new(&format!("fuzz {target}"), start.elapsed().as_secs_f64());
            o.passed = u64::from(result.is_ok());
            o.failed = u64::from(result.is_err());
            o.note = result.err().map(|e| format!("{e:#}"));
            o
        })
        .collect();
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(outcomes)
}

fn one(fuzz: &Path, scratch: &Path, target: &str, what: &str, seconds: u64) -> Result<()> {
    let corpus = scratch.join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let seeds = fuzz.join("seeds").join(target);
    println!("fuzz {target} ({what}) for {seconds} s");
    let start = Instant::now();
    // No sanitizer: the code under test is safe Rust, where a bug shows as a panic, which
    // libFuzzer reports either way; the build is much faster. The loaders never load the
    // datapath, so the agent crate is built without its eBPF object.
    let st = Command::new("cargo")
        .args(["+nightly", "fuzz", "run", "--sanitizer", "none", target])
        .arg(&corpus)
        .arg(&seeds)
        .args([
            "--",
            &format!("-max_total_time={seconds}"),
            "-rss_limit_mb=2048",
            "-timeout=10",
            "-print_final_stats=1",
        ])
        .env("SOPA_AGENT_NO_EBPF", "1")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .current_dir(fuzz)
        .status()
        .context("running cargo fuzz")?;
    if !st.success() {
        bail!(
            "fuzz target {target} failed ({st}): the input that broke it is in fuzz/artifacts/{target}/; \
             reproduce with `cd fuzz && SOPA_AGENT_NO_EBPF=1 cargo +nightly fuzz run -s none {target} artifacts/{target}/<file>`"
        );
    }
    println!(
        "fuzz {target}: no failure in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
