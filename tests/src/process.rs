//! Processes started inside a namespace, stopped (by their PID) on drop.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use crate::{Error, NetNs, Result};

/// A child process; SIGTERM on drop, SIGKILL if it has not exited within a few seconds.
pub struct Process {
    name: String,
    child: Option<Child>,
    pub log: std::path::PathBuf,
}

impl Process {
    /// Starts `program args` inside `ns` (network namespace only, via setns before exec),
    /// with stdout and stderr written to `log`.
    pub fn spawn(ns: Option<&NetNs>, program: &Path, args: &[&str], log: &Path) -> Result<Self> {
        let out = std::fs::File::create(log)
            .map_err(|err| Error::io(format!("creating {}", log.display()), err))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("duplicating a log fd", e))?;
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        if let Some(ns) = ns {
            let path = std::ffi::CString::new(format!("/run/netns/{}", ns.name())).expect("no NUL");
            // SAFETY: only async-signal-safe calls (open, setns) between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                    if fd < 0 || libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(fd);
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| Error::io(format!("starting {}", program.display()), e))?;
        Ok(Self {
            name: program.display().to_string(),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    /// Lets the process run on without this guard (it will not be stopped); returns its PID.
    pub fn leak(mut self) -> u32 {
        self.child.take().map_or(0, |c| c.id())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The exit status if the process has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits up to `timeout` for the exit.
    pub fn stop_with(&mut self, signal: i32, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        if let Ok(Some(status)) = child.try_wait() {
            self.child = None;
            return Some(status);
        }
        // SAFETY: signalling our own child by its PID.
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGTERM, then SIGKILL after 5 s; returns the exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.child.as_ref()?;
        if let Some(status) = self.stop_with(libc::SIGTERM, Duration::from_secs(5)) {
            return Some(status);
        }
        eprintln!("testbed: {} did not stop on SIGTERM; killing it", self.name);
        self.stop_with(libc::SIGKILL, Duration::from_secs(5))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}
