//! Locating the project's binaries from a test or a tool.

use std::path::{Path, PathBuf};

/// The `sopa-agent` binary: `$SOPA_AGENT_BIN`, or the one beside the running test executable
/// in cargo's target folder (`target/<profile>/sopa-agent`).
pub fn sopa_agent() -> PathBuf {
    if let Some(path) = std::env::var_os("SOPA_AGENT_BIN") {
        return PathBuf::from(path);
    }
    beside_tests("sopa-agent")
}

/// `sopa-controller`, found like [`sopa_agent`] (`$SOPA_CONTROLLER_BIN`).
pub fn sopa_controller() -> PathBuf {
    std::env::var_os("SOPA_CONTROLLER_BIN")
        .map_or_else(|| beside_tests("sopa-controller"), PathBuf::from)
}

/// `sopactl`, found like [`sopa_agent`] (`$SOPACTL_BIN`).
pub fn sopactl() -> PathBuf {
    std::env::var_os("SOPACTL_BIN").map_or_else(|| beside_tests("sopactl"), PathBuf::from)
}

/// `sopa-traffic`, the testbed's traffic tool, found like [`sopa_agent`] (`$SOPA_TRAFFIC_BIN`).
pub fn sopa_traffic() -> PathBuf {
    std::env::var_os("SOPA_TRAFFIC_BIN").map_or_else(|| beside_tests("sopa-traffic"), PathBuf::from)
}

fn beside_tests(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let mut dir = exe
        .parent()
        .expect("executables live in a folder")
        .to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build --bins`, as `cargo xtask test` does)",
        bin.display()
    );
    bin
}

/// A binary of the release build (`target/release/NAME`), as `cargo xtask` builds them.
pub fn release(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/release")
        .join(name)
}
