//! A node's folders, name, network namespace and the capabilities an agent needs, for either
//! role.

use std::path::{Path, PathBuf};

use crate::{
    BPFFS_ROOT, RUN_ROOT,
    error::{Error, Result},
};

/// The node's pin folder. bpffs refuses names containing '.', so dots become ':' there.
pub fn pin_dir(node: &str) -> PathBuf {
    Path::new(BPFFS_ROOT).join(node.replace('.', ":"))
}

pub fn run_dir(node: &str) -> PathBuf {
    Path::new(RUN_ROOT).join(node)
}

/// Checks a node name: it names folders, so only `[A-Za-z0-9._-]`, 1 to 64 characters.
pub fn validate_node(node: &str) -> Result<()> {
    let ok = !node.is_empty()
        && node.len() <= 64
        && node != "."
        && node != ".."
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "node name {node:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-'"
        )))
    }
}

/// Moves the calling thread into the network namespace `netns` (a name under /run/netns, or a
/// path to a namespace file).
pub fn enter_netns(netns: &str) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    let path = if netns.contains('/') {
        PathBuf::from(netns)
    } else {
        Path::new("/run/netns").join(netns)
    };
    let file = std::fs::File::open(&path).map_err(|err| {
        Error::Config(format!(
            "network namespace {netns:?} ({}): {err}; create it with `ip netns add {netns}`",
            path.display()
        ))
    })?;
    // SAFETY: setns on an open namespace file descriptor.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(Error::io(
            format!("entering network namespace {netns:?}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Fails early, before anything is changed, when the process lacks the capabilities it needs.
pub fn check_privileges() -> Result<()> {
    check_capabilities(true)
}

/// What `detach` needs: it loads no program, so the verifier's CAP_PERFMON is not asked for.
pub fn check_undo_privileges() -> Result<()> {
    check_capabilities(false)
}

fn check_capabilities(load_programs: bool) -> Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|err| Error::io("reading /proc/self/status", err))?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1 << cap) != 0;
    // Without CAP_SYS_ADMIN the verifier wants CAP_BPF and CAP_PERFMON both (the programs
    // read packet pointers and call tracing-class helpers).
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_SYS_ADMIN) {
        if !has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if load_programs && !has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Privileges(format!(
            "missing {} to load eBPF programs and change network settings",
            missing.join(", ")
        )))
    }
}

/// Removes a node's pins and record, undoing nothing (what they describe is gone).
pub(crate) fn forget(pins: &Path, run_dir: &Path) -> Result<()> {
    for dir in [pins, run_dir] {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(format!("removing {}", dir.display()), e));
            }
            _ => {}
        }
    }
    Ok(())
}
