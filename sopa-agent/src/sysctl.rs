//! The per-network-namespace sysctls the agent reads and sets.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// `net.ipv4.tcp_reordering`: the duplicate-ACK count that triggers a fast retransmit.
pub const TCP_REORDERING: &str = "net.ipv4.tcp_reordering";

fn path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

pub fn read(key: &str) -> Result<String> {
    std::fs::read_to_string(path(key))
        .map(|v| v.trim().to_owned())
        .map_err(|err| Error::io(format!("reading {key}"), err))
}

pub fn write(key: &str, value: &str) -> Result<()> {
    std::fs::write(path(key), value).map_err(|err| Error::io(format!("setting {key}={value}"), err))
}
