//! The few `bpf(2)` commands aya does not offer for what the agent needs (a map-in-map to wait
//! for grace periods with, a cgroup link it can pin, a map read and emptied in batches), as raw
//! system calls.

use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

/// Commands (linux/bpf.h).
pub const BPF_MAP_CREATE: libc::c_long = 0;
pub const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
pub const BPF_OBJ_PIN: libc::c_long = 6;
pub const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
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

pub fn bpf(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, fully initialised bpf_attr of the size given, which the
    // kernel may write back into (batch commands return their count there).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
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
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

/// `BPF_OBJ_PIN` of `fd` at `path` (on bpffs).
pub fn pin(fd: BorrowedFd<'_>, path: &std::path::Path) -> std::io::Result<()> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut attr = Attr::zeroed();
    // pathname (u64 pointer), bpf_fd, file_flags.
    attr.set_u64(0, path.as_ptr() as u64);
    attr.0[2] = fd.as_raw_fd() as u32;
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// Keys read per `BPF_MAP_LOOKUP_AND_DELETE_BATCH` call (more where one hash bucket holds more).
const BATCH: u32 = 4096;

/// Every entry of the hash map `map` (keys of `key_size` bytes, values of `value_size`: a per-CPU
/// map's values for every possible CPU, each rounded up to 8 bytes), read and deleted in
/// batches, each handed to `each` as (keys, values), the entries' bytes one after the other,
/// in buffers of one batch reused for the next.
pub fn lookup_and_delete_batch(
    map: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    mut each: impl FnMut(&[u8], &[u8]),
) -> std::io::Result<()> {
    // The kernel's cursor (a hash bucket's index): in from the last call, out from this one.
    let (mut cursor_in, mut cursor_out) = (0u64, 0u64);
    let mut first = true;
    let mut batch = BATCH;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    loop {
        let n = batch as usize;
        keys.resize(n * key_size, 0);
        values.resize(n * value_size, 0);
        let mut attr = Attr::zeroed();
        // in_batch, out_batch, keys, values (u64 pointers), count, map_fd, elem_flags, flags.
        attr.set_u64(
            0,
            if first {
                0
            } else {
                &raw const cursor_in as u64
            },
        );
        attr.set_u64(2, &raw mut cursor_out as u64);
        attr.set_u64(4, keys.as_mut_ptr() as u64);
        attr.set_u64(6, values.as_mut_ptr() as u64);
        attr.0[8] = batch;
        attr.0[9] = map.as_raw_fd() as u32;
        let result = bpf(BPF_MAP_LOOKUP_AND_DELETE_BATCH, &mut attr);
        // The kernel writes back how many entries it returned, error or not.
        let got = (attr.0[8] as usize).min(n);
        if got > 0 {
            each(&keys[..got * key_size], &values[..got * value_size]);
        }
        match result {
            Ok(_) => {}
            // Past the last bucket: done.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            // One bucket holds more keys than the batch: again with a larger one.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && got == 0 => {
                batch = batch.saturating_mul(2);
                continue;
            }
            Err(e) => return Err(e),
        }
        cursor_in = cursor_out;
        first = false;
    }
}
