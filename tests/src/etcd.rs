//! A real etcd cluster (the distribution's `etcd`, from Debian's etcd-server) on the loopback of
//! a namespace; every member is stopped when the guard drops.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{Error, NetNs, Process, Result};

/// Member `i` serves clients on 127.0.0.1:(2379 + 2i) and its peers on the port above.
pub fn client_port(i: usize) -> u16 {
    2379 + 2 * i as u16
}

/// The `etcd` binary, or an error that says how to get it.
pub fn etcd_bin() -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Failed(
                "etcd is missing: `cargo xtask setup` installs it (Debian's etcd-server)".into(),
            )
        })
}

pub struct EtcdCluster {
    /// The members' processes; `None` once killed.
    pub members: Vec<Option<Process>>,
    logs: Vec<PathBuf>,
}

impl EtcdCluster {
    /// Starts `n` members in `ns`, data and logs under `dir`, with short election timeouts
    /// (heartbeat 50 ms, election 500 ms: leases of 1 s are allowed), and returns once every
    /// member serves clients (its log says so).
    pub fn start(ns: &NetNs, dir: &Path, n: usize) -> Result<Self> {
        let bin = etcd_bin()?;
        let peer = |i: usize| format!("http://127.0.0.1:{}", client_port(i) + 1);
        let initial: Vec<String> = (0..n).map(|i| format!("m{i}={}", peer(i))).collect();
        let initial = initial.join(",");
        let mut members = Vec::new();
        let mut logs = Vec::new();
        for i in 0..n {
            let client = format!("http://127.0.0.1:{}", client_port(i));
            let data = dir.join(format!("etcd-m{i}"));
            let log = dir.join(format!("etcd-m{i}.log"));
            let args = [
                "--name".to_owned(),
                format!("m{i}"),
                "--data-dir".into(),
                data.display().to_string(),
                "--listen-client-urls".into(),
                client.clone(),
                "--advertise-client-urls".into(),
                client,
                "--listen-peer-urls".into(),
                peer(i),
                "--initial-advertise-peer-urls".into(),
                peer(i),
                "--initial-cluster".into(),
                initial.clone(),
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                format!("sopa-{}", ns.name()),
                "--heartbeat-interval".into(),
                "50".into(),
                "--election-timeout".into(),
                "500".into(),
                "--logger".into(),
                "zap".into(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            members.push(Some(Process::spawn(Some(ns), &bin, &args, &log)?));
            logs.push(log);
        }
        let mut cluster = Self { members, logs };
        for i in 0..n {
            cluster.wait_log(i, "serving client traffic", Duration::from_secs(60))?;
        }
        Ok(cluster)
    }

    /// `etcd:127.0.0.1:2379,...`, the controllers' --store.
    pub fn store_flag(&self) -> String {
        let endpoints: Vec<String> = (0..self.members.len())
            .map(|i| format!("127.0.0.1:{}", client_port(i)))
            .collect();
        format!("etcd:{}", endpoints.join(","))
    }

    /// Kills member `i` (SIGKILL) and waits for its end.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].take() {
            p.stop_with(libc::SIGKILL, Duration::from_secs(10));
        }
    }

    /// The member that leads the raft group now: the one whose log says it became leader at
    /// the highest term.
    pub fn raft_leader(&self) -> usize {
        let term = |i: usize| {
            self.log(i)
                .lines()
                .filter_map(|l| {
                    let at = l.find("became leader at term ")?;
                    l[at + "became leader at term ".len()..]
                        .split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .max()
        };
        (0..self.members.len())
            .filter(|&i| self.members[i].is_some())
            .max_by_key(|&i| term(i))
            .expect("a member runs")
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.logs[i]).unwrap_or_default()
    }

    fn wait_log(&mut self, i: usize, line: &str, within: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.log(i).contains(line) {
                return Ok(());
            }
            if let Some(status) = self.members[i].as_mut().and_then(Process::try_wait) {
                return Err(Error::Failed(format!(
                    "etcd member m{i} exited ({status}):\n{}",
                    self.log(i)
                )));
            }
            if start.elapsed() > within {
                return Err(Error::Failed(format!(
                    "etcd member m{i} did not serve within {within:?}:\n{}",
                    self.log(i)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
