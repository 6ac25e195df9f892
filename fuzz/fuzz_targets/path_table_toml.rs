//! The agent's path table loader on any text: a table or a refusal naming the problem, never a
//! panic; an accepted table always holds only valid prefixes and hop values.
#![no_main]

#[path = "../checks/path_table_toml.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
