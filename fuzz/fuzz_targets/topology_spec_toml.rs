//! The controller's topology spec loader on any text: a spec that builds, or a refusal naming
//! the file, never a panic (nor a topology too large to build: sizes are checked first).
#![no_main]

#[path = "../checks/topology_spec_toml.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
