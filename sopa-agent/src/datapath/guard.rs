//! The host's socket-option guard: `sockopt_guard` attached to a cgroup (v2) holding every
//! process that could send around `tc_stamp` with `CAP_NET_RAW` alone (`AF_PACKET` with
//! `PACKET_QDISC_BYPASS`, `AF_XDP`). By default the root of the cgroup v2 hierarchy, which holds
//! every process of the host: where the host mounts none (a cgroup v1 host), the agent mounts
//! it for itself, journaled, and unmounts it at stop.

use std::{
    fs::File,
    path::{Path, PathBuf},
    str::FromStr,
};

use std::os::fd::AsFd as _;

use aya::programs::{
    CgroupSockopt,
    links::{FdLink, PinnedLink},
};
use tracing::info;

use super::{Datapath, LinkState, adopt_link, link_err};
use crate::error::{Error, Result};

pub const GUARD_PROGRAM: &str = "sockopt_guard";
/// Where the guard's link is pinned, inside the node's pin folder.
pub const GUARD_LINK_PIN: &str = "link_guard";
/// `BPF_CGROUP_SETSOCKOPT` (linux/bpf.h).
const BPF_CGROUP_SETSOCKOPT: u32 = 22;
/// Where the agent mounts the cgroup v2 hierarchy when the host has no mount of it.
pub const CGROUP2_MOUNT: &str = "/run/sopa/cgroup2";

/// `--guard-cgroup`: where the guard goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardCgroup {
    /// The root of the cgroup v2 hierarchy (mounted by the agent where the host has none).
    Root,
    /// This cgroup v2 directory (its processes and their descendants).
    Path(PathBuf),
    /// No guard: a process with `CAP_NET_RAW` can send with hop bytes of its choosing.
    Off,
}

impl FromStr for GuardCgroup {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "root" => Ok(Self::Root),
            "off" => Ok(Self::Off),
            p if p.starts_with('/') => Ok(Self::Path(PathBuf::from(p))),
            other => Err(format!(
                "{other:?}: write root (the cgroup v2 root: every process of the host), off, or \
                 the absolute path of a cgroup v2 directory"
            )),
        }
    }
}

impl std::fmt::Display for GuardCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Root => f.write_str("root"),
            Self::Off => f.write_str("off"),
            Self::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The mount point of the cgroup v2 hierarchy in this mount namespace, if any (from
/// `/proc/self/mountinfo`).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let fields: Vec<&str> = left.split_whitespace().collect();
        (fstype == "cgroup2" && fields.get(3) == Some(&"/")).then(|| PathBuf::from(fields[4]))
    })
}

/// Mounts the cgroup v2 hierarchy at `dir` (created if needed).
pub fn mount_cgroup2(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Config(format!("{} holds a NUL byte", dir.display())))?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            c"cgroup2".as_ptr(),
            target.as_ptr(),
            c"cgroup2".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(Error::io(
            format!(
                "mounting the cgroup v2 hierarchy at {} for the socket-option guard (a kernel \
                 without cgroup v2 or CONFIG_CGROUP_BPF: start with --guard-cgroup off, and \
                 processes with CAP_NET_RAW can send around tc_stamp)",
                dir.display()
            ),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Unmounts what [`mount_cgroup2`] mounted.
pub fn unmount_cgroup2(dir: &Path) -> Result<()> {
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Config(format!("{} holds a NUL byte", dir.display())))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) && err.raw_os_error() != Some(libc::ENOENT) {
            return Err(Error::io(format!("unmounting {}", dir.display()), err));
        }
    }
    Ok(())
}

/// Whether a guard is attached for the node whose pins are in `pin_dir`, and what it refused
/// by reason (empty where the datapath has no guard).
pub fn guard_status(pin_dir: &Path) -> (bool, std::collections::BTreeMap<String, u64>) {
    use aya::maps::{Map, MapData, PerCpuArray};
    use sopa_common::maps::{GUARD_STATS_MAP, guard};
    let attached = pin_dir.join(GUARD_LINK_PIN).exists();
    let counts = MapData::from_pin(pin_dir.join(GUARD_STATS_MAP))
        .ok()
        .and_then(|m| PerCpuArray::<MapData, u64>::try_from(Map::PerCpuArray(m)).ok())
        .map(|m| {
            guard::NAMES
                .iter()
                .enumerate()
                .skip(1)
                .map(|(i, n)| {
                    let v = m.get(&(i as u32), 0).map(|v| v.iter().sum()).unwrap_or(0);
                    ((*n).to_owned(), v)
                })
                .collect()
        })
        .unwrap_or_default();
    (attached, counts)
}

impl Datapath {
    /// Attaches the guard to `cgroup` (beside other programs there), pinned so that it
    /// outlives this process with the rest of the datapath. A guard a previous agent left is
    /// replaced once this one is attached: no moment without one.
    pub fn attach_guard(&mut self, cgroup: &Path) -> Result<LinkState> {
        let dir = File::open(cgroup)
            .map_err(|e| Error::io(format!("opening cgroup {}", cgroup.display()), e))?;
        let program: &mut CgroupSockopt = self
            .ebpf
            .program_mut(GUARD_PROGRAM)
            .expect("the object defines sockopt_guard")
            .try_into()
            .map_err(Error::program(GUARD_PROGRAM))?;
        let prog_id = program.info().map_err(Error::program(GUARD_PROGRAM))?.id();
        // A link the agent can pin (aya keeps cgroup links to itself): it outlives this
        // process with the rest of the datapath.
        let prog_fd = program.fd().map_err(Error::program(GUARD_PROGRAM))?;
        let link = super::syscall::link_create(prog_fd.as_fd(), dir.as_fd(), BPF_CGROUP_SETSOCKOPT)
            .map_err(|e| {
                Error::io(
                    format!(
                        "attaching {GUARD_PROGRAM} to cgroup {} (a cgroup v2 directory is needed: \
                     start with --guard-cgroup naming one, or off)",
                        cgroup.display()
                    ),
                    e,
                )
            })?;
        let pin = self.pin_dir.join(GUARD_LINK_PIN);
        let replaced = adopt_link(&pin)?.map(|(_, id)| id);
        if replaced.is_some() {
            std::fs::remove_file(&pin)
                .map_err(|e| Error::io(format!("unpinning {}", pin.display()), e))?;
        }
        super::syscall::pin(link.as_fd(), &pin)
            .map_err(|e| Error::io(format!("pinning {}", pin.display()), e))?;
        let fd = FdLink::from(PinnedLink::from_pin(&pin).map_err(link_err(&pin))?);
        self.links.push(fd);
        info!(cgroup = %cgroup.display(), "socket options that send around tc_stamp refused");
        Ok(LinkState { prog_id, replaced })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_takes_root_off_or_an_absolute_path() {
        assert_eq!("root".parse(), Ok(GuardCgroup::Root));
        assert_eq!("off".parse(), Ok(GuardCgroup::Off));
        assert_eq!(
            "/sys/fs/cgroup/x".parse(),
            Ok(GuardCgroup::Path("/sys/fs/cgroup/x".into()))
        );
        let err = "x".parse::<GuardCgroup>().unwrap_err();
        assert!(err.contains("\"x\"") && err.contains("root"), "{err}");
    }
}
