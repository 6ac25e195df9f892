//! Replays a fuzz target's committed seeds (`fuzz/seeds/<target>/`), and the inputs a local
//! `cargo xtask fuzz` found or kept (`fuzz/artifacts/<target>/`, `fuzz/corpus/<target>/`,
//! neither committed), through its check in an ordinary test: every input the fuzzer starts
//! from stays checked on every run of the suite, without libFuzzer.

use std::path::Path;

/// Runs `check` on every input of `target`; panics naming each input that failed.
pub fn replay(target: &str, check: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut inputs = Vec::new();
    for dir in ["seeds", "artifacts", "corpus"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        inputs.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
    }
    inputs.sort();
    assert!(
        inputs.iter().any(|p| p.starts_with(fuzz.join("seeds"))),
        "no committed seeds for {target} in {}",
        fuzz.join("seeds").display()
    );
    let failed: Vec<String> = inputs
        .iter()
        .filter(|p| {
            let data = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            std::panic::catch_unwind(|| check(&data)).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs failed: {failed:?}",
        failed.len(),
        inputs.len()
    );
    println!("{target}: {} inputs replayed", inputs.len());
}
