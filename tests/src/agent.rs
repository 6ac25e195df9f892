//! A `sopa-agent` running in a namespace, stopped on drop.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use crate::{Error, NetNs, Process, Result, bins};

pub struct Agent {
    pub node: String,
    pub process: Process,
    dir: PathBuf,
}

impl Agent {
    /// Starts `sopa-agent --netns NS run --node NODE --iface IFACE --paths <paths_toml> ARGS`
    /// and waits until its status answers.
    pub fn start(
        ns: &NetNs,
        node: &str,
        iface: &str,
        paths_toml: &str,
        args: &[&str],
    ) -> Result<Self> {
        let mut agent = Self::launch(ns, node, iface, paths_toml, args)?;
        agent.wait_up()?;
        Ok(agent)
    }

    /// Like [`Agent::start`], without waiting for anything: the agent may still be starting.
    pub fn launch(
        ns: &NetNs,
        node: &str,
        iface: &str,
        paths_toml: &str,
        args: &[&str],
    ) -> Result<Self> {
        let dir = Self::dir(node)?;
        let paths = dir.join("paths.toml");
        std::fs::write(&paths, paths_toml).map_err(|e| Error::io("writing the path table", e))?;
        let paths = paths.display().to_string();
        let mut source = vec!["--paths", paths.as_str()];
        source.extend_from_slice(args);
        Self::launch_with(ns, node, iface, &source, dir)
    }

    /// Starts an agent whose paths come from the controller at `controller` (plaintext), as
    /// topology host `host`.
    pub fn start_with_controller(
        ns: &NetNs,
        node: &str,
        host: &str,
        iface: &str,
        controller: &str,
        args: &[&str],
    ) -> Result<Self> {
        let mut agent = Self::launch_with_controller(ns, node, host, iface, controller, args)?;
        agent.wait_up()?;
        Ok(agent)
    }

    /// Like [`Agent::start_with_controller`], without waiting for anything (its controller may
    /// not run yet).
    pub fn launch_with_controller(
        ns: &NetNs,
        node: &str,
        host: &str,
        iface: &str,
        controller: &str,
        args: &[&str],
    ) -> Result<Self> {
        let dir = Self::dir(node)?;
        let mut source = vec![
            "--controller",
            controller,
            "--insecure",
            "--host",
            host,
            "--heartbeat-ms",
            "200",
        ];
        source.extend_from_slice(args);
        Self::launch_with(ns, node, iface, &source, dir)
    }

    /// A directory of this launch's own (its path table, its log): two agents of one node
    /// (an upgrade, a takeover, one refused) each keep theirs, and dropping one leaves the
    /// other's log readable.
    fn dir(node: &str) -> Result<std::path::PathBuf> {
        static LAUNCHES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("sopa-testbed-{node}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        Ok(dir)
    }

    fn launch_with(
        ns: &NetNs,
        node: &str,
        iface: &str,
        source: &[&str],
        dir: std::path::PathBuf,
    ) -> Result<Self> {
        let mut full = vec![
            "--netns",
            ns.name(),
            "run",
            "--node",
            node,
            "--iface",
            iface,
        ];
        full.extend_from_slice(source);
        let log = dir.join("agent.log");
        let process = Process::spawn(None, &bins::sopa_agent(), &full, &log)?;
        Ok(Self {
            node: node.to_owned(),
            process,
            dir,
        })
    }

    /// Waits until the agent has attached and recorded its programs.
    pub fn wait_up(&mut self) -> Result<()> {
        let node = self.node.clone();
        let agent = self;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = agent.process.try_wait() {
                return Err(Error::Failed(format!(
                    "sopa-agent for {node} exited ({status}) at start:\n{}",
                    agent.process.log_text()
                )));
            }
            // Attached and recorded: the programs' ids are in the record.
            if let Ok(status) = agent.status()
                && status["running"] == serde_json::Value::Bool(true)
                && status["pid"] == serde_json::json!(agent.process.pid())
                && status["programs"].is_object()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Failed(format!(
                    "sopa-agent for {node} did not come up:\n{}",
                    agent.process.log_text()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `sopa-agent status --node NODE --json`, parsed.
    pub fn status(&self) -> Result<serde_json::Value> {
        status_of(&self.node)
    }

    /// SIGTERM and wait: the agent detaches and restores. Returns its exit code.
    pub fn stop(mut self) -> Option<i32> {
        self.process.stop().and_then(|s| s.code())
    }
}

/// `sopa-agent status --node NODE --json` of any node, running or not.
pub fn status_of(node: &str) -> Result<serde_json::Value> {
    {
        let out = Command::new(bins::sopa_agent())
            .args(["status", "--node", node, "--json"])
            .output()
            .map_err(|e| Error::io("running sopa-agent status", e))?;
        if !out.status.success() {
            return Err(Error::Failed(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| Error::Failed(format!("status JSON: {e}")))
    }
}

/// `sopa-agent mode --node NODE MODE`: the running agent's mode switched; its output.
pub fn set_mode(node: &str, mode: &str) -> Result<String> {
    set_mode_with(node, mode, &[])
}

/// `sopa-agent mode --node NODE MODE EXTRA...`.
pub fn set_mode_with(node: &str, mode: &str, extra: &[&str]) -> Result<String> {
    run_time_command("mode", node, mode, extra)
}

/// `sopa-agent labels --node NODE SOURCE`: returns once the agent's labels from it are all in
/// place.
pub fn set_labels(node: &str, source: &str) -> Result<String> {
    run_time_command("labels", node, source, &[])
}

/// `sopa-agent reordering --node NODE on|off`: its output.
pub fn set_reordering(node: &str, on: bool) -> Result<String> {
    run_time_command("reordering", node, if on { "on" } else { "off" }, &[])
}

/// `sopa-agent granularity --node NODE G`: the running agent applies it before this returns.
pub fn set_granularity(node: &str, granularity: &str) -> Result<String> {
    run_time_command("granularity", node, granularity, &[])
}

/// Removes what run-time commands recorded for `node` under /run/sopa (`mode`, `granularity`,
/// the entropy encoding's summary), which outlives the node's agent by design so that a
/// restart keeps it, and the node's folder once empty: a test's nodes go with the test.
pub fn forget_run_time_choices(node: &str) {
    let dir = std::path::Path::new("/run/sopa").join(node);
    for file in ["mode.json", "granularity.json", "entropy.json"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    let _ = std::fs::remove_dir(dir);
}

/// `sopa-agent COMMAND --node NODE VALUE EXTRA...`, a change to a running agent: its output, or
/// its error output.
fn run_time_command(command: &str, node: &str, value: &str, extra: &[&str]) -> Result<String> {
    let out = Command::new(bins::sopa_agent())
        .args([command, "--node", node, value])
        .args(extra)
        .output()
        .map_err(|e| Error::io(format!("running sopa-agent {command}"), e))?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "sopa-agent {command} {value} on {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Agent {
    /// SIGKILL and wait: what the agent left (attached programs, its journal) stays for the
    /// next agent of the node.
    pub fn kill(mut self) {
        self.process
            .stop_with(libc::SIGKILL, Duration::from_secs(5));
    }

    /// Lets the agent run on without this guard; returns its PID.
    pub fn leak(self) -> u32 {
        let mut this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped; the process is moved out exactly once.
        let process = unsafe { std::ptr::read(&this.process) };
        let _ = std::mem::take(&mut this.node);
        process.leak()
    }

    pub fn log(&self) -> String {
        self.process.log_text()
    }

    /// Waits until the agent's log holds `line` (at most `within`); false if it never did.
    /// Readiness is the record on disk, which the agent writes just before it logs what it did.
    pub fn wait_log(&self, line: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.log().contains(line) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.process.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
