//! The per-network-namespace sysctls the agent reads and sets.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::error::{Error, Result};

static PROC_ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Reads and writes sysctls under `root` (`--proc-root`: where a container mounts the host's
/// /proc) instead of /proc; set once, before the first sysctl is read.
pub fn set_proc_root(root: &Path) {
    let _ = PROC_ROOT.set(root.to_owned());
}

fn proc_root() -> &'static Path {
    PROC_ROOT.get().map_or(Path::new("/proc"), PathBuf::as_path)
}

/// `net.ipv4.tcp_reordering`: the duplicate-ACK count that triggers a fast retransmit.
pub const TCP_REORDERING: &str = "net.ipv4.tcp_reordering";

/// Writing 1 bumps the namespace's IPv4 route generation: every cached route is checked again
/// at its socket's next send, and the socket takes the device's limits anew.
pub const IPV4_ROUTE_FLUSH: &str = "net.ipv4.route.flush";

/// A key's file: dots separate its parts, and a part holding a dot (an interface `eth0.100`)
/// writes it as '/' (`net.ipv6.conf.eth0/100.accept_dad`), as sysctl(8) does.
fn path(key: &str) -> PathBuf {
    let swapped: String = key
        .chars()
        .map(|c| match c {
            '.' => '/',
            '/' => '.',
            c => c,
        })
        .collect();
    proc_root().join("sys").join(swapped)
}

/// The key of `setting` for interface `name` in `family`'s `conf` (`net.ipv6.conf.NAME.SETTING`).
pub fn interface_key(family: &str, name: &str, setting: &str) -> String {
    format!("net.{family}.conf.{}.{setting}", name.replace('.', "/"))
}

pub fn read(key: &str) -> Result<String> {
    std::fs::read_to_string(path(key))
        .map(|v| v.trim().to_owned())
        .map_err(|err| Error::io(format!("reading {key}"), err))
}

pub fn write(key: &str, value: &str) -> Result<()> {
    std::fs::write(path(key), value).map_err(|err| Error::io(format!("setting {key}={value}"), err))
}

/// Whether two sysctl values are the same setting: numbers compare by value (the kernel reads
/// `0x0037` back as `55`), words and whitespace-separated lists word by word.
pub fn same_value(a: &str, b: &str) -> bool {
    fn number(word: &str) -> Option<u64> {
        match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => word.parse().ok(),
        }
    }
    let (mut a, mut b) = (a.split_whitespace(), b.split_whitespace());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) => {
                let same = match (number(x), number(y)) {
                    (Some(m), Some(n)) => m == n,
                    _ => x == y,
                };
                if !same {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::same_value;

    #[test]
    fn values_compare_as_the_kernel_reads_them_back() {
        assert!(same_value("0x0037", "55"));
        assert!(same_value("10", " 10\n"));
        assert!(same_value("4096\t87380\t6291456", "4096 87380 6291456"));
        assert!(same_value("cubic", "cubic"));
        assert!(!same_value("10", "3"));
        assert!(!same_value("4096 87380", "4096"));
        assert!(!same_value("cubic", "reno"));
    }
}
