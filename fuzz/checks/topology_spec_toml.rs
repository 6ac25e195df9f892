//! The controller's topology spec loader on any text: a spec that builds, or a refusal naming
//! the file, never a panic (nor a topology too large to build: sizes are checked first).
//!
//! Shared by the cargo-fuzz target and the ordinary test that replays the committed seeds
//! (`fuzz_seeds`): one check, two drivers.

use sopa_controller::fabric::Fabric;

/// Panics where the code under test is wrong for `data`.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Fabric::parse_spec(text, "fuzz.toml") {
        Ok(spec) => {
            let _ = sopa_topology::Topology::build(&spec).expect("a parsed spec builds");
        }
        Err(e) => assert!(e.to_string().contains("fuzz.toml")),
    }
}
