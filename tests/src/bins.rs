//! Locating the project's binaries from a test or a tool.

use std::path::PathBuf;

/// The `sopa-agent` binary: `$SOPA_AGENT_BIN`, or the one beside the running test executable
/// in cargo's target folder (`target/<profile>/sopa-agent`).
pub fn sopa_agent() -> PathBuf {
    if let Some(path) = std::env::var_os("SOPA_AGENT_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test knows its own path");
    let mut dir = exe
        .parent()
        .expect("executables live in a folder")
        .to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let agent = dir.join("sopa-agent");
    assert!(
        agent.exists(),
        "{} is missing: build it first (`cargo build -p sopa-agent`) or set SOPA_AGENT_BIN",
        agent.display()
    );
    agent
}
