//! Running a child process as a suite or a smoke step: in its own process group, echoed line
//! by line, killed with everything it started at its time limit, and Ctrl-C passed on to it.

use std::{
    io::{BufRead as _, BufReader},
    process::Child,
    sync::{
        atomic::{AtomicI32, Ordering},
        mpsc::RecvTimeoutError,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

pub struct Watched {
    pub lines: Vec<String>,
    pub success: bool,
    pub status: String,
    pub timed_out: bool,
    pub seconds: f64,
}

/// The process group of the suite running now, for [`forward_signals`].
static CURRENT_GROUP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    let group = CURRENT_GROUP.load(Ordering::SeqCst);
    // SAFETY: kill, signal and raise are async-signal-safe.
    unsafe {
        if group > 0 {
            libc::kill(-group, signal);
        }
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// Ctrl-C and SIGTERM reach the suite running in its own process group too (and everything it
/// started), then end this process as they would have.
pub fn forward_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only makes async-signal-safe calls.
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Sends `signal` to the process group `group`.
fn kill_group(group: u32, signal: libc::c_int) {
    // SAFETY: signalling a process group this runner created for its child.
    unsafe { libc::kill(-(group as i32), signal) };
}

/// Waits up to `grace` for `child` to exit.
fn exited_within(child: &mut Child, grace: Duration) -> Result<Option<std::process::ExitStatus>> {
    let until = Instant::now() + grace;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Echoes and collects a child's stdout (the leader of its own process group) until it exits
/// or `timeout` passes; then its whole process group is killed (SIGTERM, SIGKILL 5 s later).
/// Whatever the leader left running in its group is killed once it has exited, so nothing can
/// hold the pipe, or this runner, open.
pub fn watch(mut child: Child, timeout: Duration, echo: impl Fn(&str)) -> Result<Watched> {
    let start = Instant::now();
    let group = child.id();
    CURRENT_GROUP.store(group as i32, Ordering::SeqCst);
    let stdout = child.stdout.take().context("the child's stdout is piped")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        // Bytes, not `lines()`: a line that is not UTF-8 must not stop the reading.
        while matches!(reader.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches('\n')
                .to_owned();
            buf.clear();
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let take = |line: String, lines: &mut Vec<String>| {
        echo(&line);
        lines.push(line);
    };
    let deadline = start + timeout;
    let mut timed_out = false;
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => take(line, &mut lines),
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(50)),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= deadline {
            timed_out = true;
            kill_group(group, libc::SIGTERM);
            if let Some(st) = exited_within(&mut child, Duration::from_secs(5))? {
                break Some(st);
            }
            kill_group(group, libc::SIGKILL);
            break exited_within(&mut child, Duration::from_secs(5))?;
        }
    };
    // The leader is gone: what it left in its group goes too, then the pipe drains.
    kill_group(group, libc::SIGKILL);
    CURRENT_GROUP.store(0, Ordering::SeqCst);
    let drain_until = Instant::now() + Duration::from_secs(5);
    while let Ok(line) = rx.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
        take(line, &mut lines);
    }
    let success = !timed_out && status.is_some_and(|s| s.success());
    Ok(Watched {
        lines,
        success,
        status: status.map_or_else(|| "no exit after SIGKILL".to_owned(), |s| s.to_string()),
        timed_out,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use std::{
        os::unix::process::CommandExt as _,
        process::{Command, Stdio},
    };

    use super::*;

    #[test]
    fn a_leader_that_exits_leaving_a_child_on_the_pipe_does_not_hold_the_runner() {
        let child = Command::new("sh")
            .args(["-c", "echo done; sleep 30 & exit 0"])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let w = watch(child, Duration::from_secs(60), |_| {}).unwrap();
        assert!(w.success && !w.timed_out, "{}", w.status);
        assert_eq!(w.lines, ["done"]);
        assert!(w.seconds < 10.0, "held for {} s", w.seconds);
    }

    #[test]
    fn a_suite_past_its_time_is_killed_with_its_children() {
        // The time limit leaves the shell seconds to say it started, however busy the
        // machine (500 ms did not, once, with a build running beside it); its children sleep
        // far longer than the limit, so only the kill ends them in time.
        let child = Command::new("sh")
            .args(["-c", "echo started; sleep 120 & sleep 120; echo never"])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let w = watch(child, Duration::from_secs(5), |_| {}).unwrap();
        assert!(w.timed_out);
        assert!(!w.success);
        assert_eq!(w.lines, ["started"]);
        assert!(w.seconds < 60.0, "killed in {} s", w.seconds);
    }
}
