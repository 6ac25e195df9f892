//! `cargo xtask test`: the whole suite. The namespace suites and the BPF_PROG_TEST_RUN fixtures
//! need root; they create only namespaces and pins of their own.

use anyhow::{Result, bail};

use crate::setup::{self, cargo};

pub fn run(extra: &[String]) -> Result<()> {
    if !setup::is_root() {
        bail!(
            "the datapath and namespace tests load eBPF programs and create namespaces: run as root"
        );
    }
    // The namespace suites start the binaries; build them first, in the test profile's folder.
    setup::build_bins(false)?;
    let mut args = vec!["test", "--workspace", "--exclude", "sopa-ebpf"];
    if !extra.is_empty() {
        args.push("--");
        args.extend(extra.iter().map(String::as_str));
    }
    cargo(&args)
}
