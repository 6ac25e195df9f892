//! The few `bpf(2)` commands aya does not offer for what the agent needs (a map-in-map to wait
//! for grace periods with, a cgroup link it can pin), as raw system calls.

use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

/// Commands (linux/bpf.h).
pub const BPF_MAP_CREATE: libc::c_long = 0;
pub const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
pub const BPF_OBJ_PIN: libc::c_long = 6;
pub const BPF_LINK_CREATE: libc::c_long = 28;

/// `union bpf_attr`, as large as any command here needs; the kernel takes the unused tail
/// being zero.
#[repr(C, align(8))]
pub struct Attr(pub [u32; 32]);

impl Attr {
    pub fn zeroed() -> Self {
        Self([0; 32])
    }

    /// Sets the 64-bit field at 32-bit word `at` (a pointer the kernel reads).
    pub fn set_u64(&mut self, at: usize, v: u64) {
        self.0[at] = v as u32;
        self.0[at + 1] = (v >> 32) as u32;
    }
}

pub fn bpf(cmd: libc::c_long, attr: &Attr) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, fully initialised bpf_attr of the size given.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const Attr,
            std::mem::size_of::<Attr>() as u32,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new file descriptor the kernel returned.
pub fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: a file descriptor the kernel just returned to us alone.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// `BPF_LINK_CREATE` of `prog` on `target` (a cgroup's directory) for `attach_type`.
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: u32,
) -> std::io::Result<OwnedFd> {
    let mut attr = Attr::zeroed();
    // prog_fd, target_fd, attach_type, flags.
    attr.0[0] = prog.as_raw_fd() as u32;
    attr.0[1] = target.as_raw_fd() as u32;
    attr.0[2] = attach_type;
    bpf(BPF_LINK_CREATE, &attr).map(owned)
}

/// `BPF_OBJ_PIN` of `fd` at `path` (on bpffs).
pub fn pin(fd: BorrowedFd<'_>, path: &std::path::Path) -> std::io::Result<()> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut attr = Attr::zeroed();
    // pathname (u64 pointer), bpf_fd, file_flags.
    attr.set_u64(0, path.as_ptr() as u64);
    attr.0[2] = fd.as_raw_fd() as u32;
    bpf(BPF_OBJ_PIN, &attr).map(drop)
}
