//! SOPA's namespace testbed: network namespaces and veth links behind RAII guards, processes
//! started inside them, TCP transfers with checksums, and packet captures. Used by the
//! integration suites, `cargo xtask demo` and the benchmarks.

pub mod agent;
pub mod arb;
pub mod bins;
pub mod bpftool;
pub mod capture;
pub mod controller_fabric;
pub mod etcd;
pub mod experiment;
pub mod fabric;
pub mod failure;
pub mod figures;
pub mod forge;
pub mod granularity;
pub mod gray;
pub mod kernel;
pub mod leftovers;
pub mod loss;
pub mod lossy;
pub mod netns;
pub mod phases;
pub mod process;
pub mod prometheus;
pub mod reach;
pub mod resilience;
pub mod routers;
pub mod traffic;

pub use bins::release as bins_release;

/// Whether this build embeds the eBPF programs (the testbed loads its lossy link from them): a
/// build made before `cargo xtask setup` installed the eBPF toolchain does not.
pub fn datapath_built() -> bool {
    !sopa_agent::datapath::OBJECT.is_empty()
}
pub use netns::{NetNs, run_name};
pub use process::Process;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A connected transfer where no byte moved for the stall time-out.
    #[error("{what} stalled: nothing moved for {stall:?} after {moved} of {total} bytes")]
    Stalled {
        what: String,
        moved: u64,
        total: u64,
        stall: std::time::Duration,
    },
    #[error("{0}")]
    Failed(String),
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The environment variable naming the file where a suite records the checks it skipped
/// (`cargo xtask test` sets it per suite and counts the lines in its table).
pub const SKIPPED_FILE_ENV: &str = "SOPA_SKIPPED_FILE";

/// Set to `full` by `cargo xtask test --full`: a phase that can run longer to be surer does
/// (each says what it does in either tier).
pub const TIER_ENV: &str = "SOPA_TEST_TIER";

/// Whether the suite runs in the full tier ([`TIER_ENV`]).
pub fn full_tier() -> bool {
    std::env::var(TIER_ENV).is_ok_and(|t| t == "full")
}

/// Records that a check was not judged and why (the machine could not give it a fair run, the
/// kernel lacks what it checks): printed, and one line in the file [`SKIPPED_FILE_ENV`] names,
/// so that the runner's table shows it. A check skipped is never a check passed.
pub fn skipped(check: &str, why: &str) {
    let line = format!("{check}: {why}");
    eprintln!("skipped: {line}");
    if let Some(path) = std::env::var_os(SKIPPED_FILE_ENV) {
        use std::io::Write as _;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{}", line.replace('\n', " ")));
        if let Err(e) = written {
            eprintln!("recording the skipped check in {}: {e}", path.display());
        }
    }
}

/// A temporary folder `sopa-NAME-…`, removed when the guard drops, on failure too.
pub fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("sopa-{name}-"))
        .tempdir()
        .expect("a temporary folder")
}
