//! Whether a record's process still runs (its PID and start time), and signalling it through a
//! pidfd.

use std::fs;

use super::Record;

impl Record {
    /// Whether the process that wrote this record is still running: the same PID with the
    /// same start time. (A record of an older agent, without a start time, falls back to the
    /// PID's command line naming sopa-agent.)
    pub fn is_live(&self) -> bool {
        match self.start_time {
            // A zombie (exited, not yet reaped by its parent) is not running.
            Some(started) => proc_stat(self.pid)
                .is_some_and(|(state, at)| state != 'Z' && state != 'X' && at == started),
            None => fs::read(format!("/proc/{}/cmdline", self.pid))
                .map(|cmdline| String::from_utf8_lossy(&cmdline).contains("sopa-agent"))
                .unwrap_or(false),
        }
    }
}

/// Fields 3 (the state: R, S, D, Z for a zombie ...) and 22 (the start time, clock ticks after
/// boot) of `/proc/PID/stat`, read once.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')'; the rest
    // starts at field 3, so field 22 is its 20th word.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.nth(18)?.parse().ok()?))
}

#[cfg(test)]
pub(super) fn process_state(pid: u32) -> Option<char> {
    proc_stat(pid).map(|(state, _)| state)
}

/// When the process started, in clock ticks after boot.
pub fn process_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, started)| started)
}

/// Sends `signal` to the agent a record names, through a pidfd: the process is checked to be
/// that agent (PID and start time) after the pidfd pins it, so a PID reused meanwhile is never
/// signalled.
pub fn signal_agent(record: &Record, signal: i32) -> std::io::Result<()> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    // SAFETY: pidfd_open with flags 0 returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, record.pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if !record.is_live() {
        return Err(std::io::Error::other(format!(
            "process {} is no longer the agent that wrote the record",
            record.pid
        )));
    }
    use std::os::fd::AsRawFd as _;
    // SAFETY: a pidfd we hold, a valid signal number, no siginfo, flags 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
