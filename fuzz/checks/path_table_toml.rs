//! The agent's path table loader on any text: a table or a refusal naming the problem, never a
//! panic; an accepted table always holds only valid prefixes and hop values.
//!
//! Shared by the cargo-fuzz target and the ordinary test that replays the committed seeds
//! (`fuzz_seeds`): one check, two drivers.

use sopa_agent::path_table::{MAX_HOP, PathTable};

/// Panics where the code under test is wrong for `data`.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match PathTable::parse(text) {
        Ok(table) => {
            for (prefix, hops) in &table.destinations {
                assert!(prefix.len <= 32);
                assert!(!hops.is_empty());
                assert!(hops.iter().all(|h| h.hop0 <= MAX_HOP));
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
