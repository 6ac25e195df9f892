//! The controller's topology spec loader on any text: a spec that builds, or a refusal naming
//! the file, never a panic (nor a topology too large to build: sizes are checked first).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sopa_controller::fabric::Fabric;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Fabric::parse_spec(text, "fuzz.toml") {
        Ok(spec) => {
            let _ = sopa_topology::Topology::build(&spec).expect("a parsed spec builds");
        }
        Err(e) => assert!(e.to_string().contains("fuzz.toml")),
    }
});
