//! What an interrupted run of the suites or of a testbed left behind, found by the testbed's
//! names (`st<pid><tag><n>…`, see [`crate::run_name`]) and removed: processes inside those
//! namespaces (every one of them was started by a testbed), the namespaces, the agents' pin and
//! run folders, and the testbed's temporary folders. Names whose PID is still running (a test
//! or a benchmark going on beside) and a fabric left running on purpose by
//! `cargo xtask testbed up` are spared.

use std::path::Path;

use crate::Result;

/// Where `cargo xtask testbed up` records the fabric it leaves running.
pub const TESTBED_STATE: &str = "/run/sopa-testbed/state.json";

/// What [`clean`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    pub namespaces: usize,
    pub processes: usize,
    pub folders: usize,
}

/// The PID part of a name the testbed gives ([`crate::run_name`]: `st`, the PID modulo
/// 100,000, a tag of letters, a counter, then anything after a `-`), if `name` is one.
pub fn testbed_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("st")?;
    let head = rest.split('-').next().unwrap_or(rest);
    let digits = head.bytes().take_while(u8::is_ascii_digit).count();
    let letters = head[digits..]
        .bytes()
        .take_while(u8::is_ascii_lowercase)
        .count();
    let counter = head[digits + letters..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    // Namespace, pin and folder names go on after a `-`, if at all.
    (digits > 0 && letters > 0 && counter > 0 && digits + letters + counter == head.len())
        .then(|| head[..digits].parse().ok())
        .flatten()
}

/// A name the testbed gives.
pub fn is_testbed_name(name: &str) -> bool {
    testbed_pid(name).is_some()
}

/// Whether a running process could have made names with `pid` (the PID modulo 100,000): such
/// names may belong to a run still going, and are left alone.
fn maybe_live(pid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|p| p % 100_000 == pid && p != std::process::id())
    })
}

/// The name prefix of a fabric `cargo xtask testbed up` keeps running, if any.
fn live_testbed_prefix() -> Option<String> {
    let text = std::fs::read_to_string(TESTBED_STATE).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["prefix"].as_str().map(str::to_owned)
}

/// Removes every leftover of the testbed's names but the live testbed's.
pub fn clean() -> Result<Removed> {
    clean_except(live_testbed_prefix().as_deref())
}

/// Removes every leftover of the testbed's names except those starting with `keep`.
pub fn clean_except(keep: Option<&str>) -> Result<Removed> {
    let ours = |name: &str| {
        testbed_pid(name).is_some_and(|pid| !maybe_live(pid))
            && !keep.is_some_and(|k| name.starts_with(k))
    };
    let mut removed = Removed::default();
    let listing = crate::netns::ip(&["netns", "list"])?;
    for line in listing.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if !ours(name) {
            continue;
        }
        if let Ok(pids) = crate::netns::ip(&["netns", "pids", name]) {
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: a process inside a namespace of the testbed's names, which only the
                // testbed creates and runs processes in.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                removed.processes += 1;
            }
        }
        if crate::netns::ip(&["netns", "del", name]).is_ok() {
            removed.namespaces += 1;
        }
    }
    for dir in ["/sys/fs/bpf/sopa", "/run/sopa"] {
        removed.folders += remove_matching(Path::new(dir), |n| ours(n));
    }
    // Temporary folders named after a testbed object: `sopa-<what>-st<digits>…`.
    removed.folders += remove_matching(&std::env::temp_dir(), |n| {
        n.starts_with("sopa-") && n.split('-').any(ours)
    });
    Ok(removed)
}

fn remove_matching(dir: &Path, matches: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| matches(&e.file_name().to_string_lossy()))
        .filter(|e| {
            let path = e.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).is_ok()
            } else {
                std::fs::remove_file(&path).is_ok()
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_the_testbed_names() {
        assert_eq!(testbed_pid("st4242f0-h0"), Some(4242));
        assert_eq!(testbed_pid("st12ctl3"), Some(12));
        assert_eq!(testbed_pid("st12ctl3-a"), Some(12));
        assert_eq!(testbed_pid("st31883f0-e0"), Some(31883));
        for other in ["stage", "cilium", "st", "st12", "st12ab", "st3x9a", "stx1"] {
            assert!(!is_testbed_name(other), "{other}");
        }
    }

    #[test]
    fn names_of_a_running_process_are_spared() {
        // PID 1 always runs.
        assert!(maybe_live(1));
    }
}
