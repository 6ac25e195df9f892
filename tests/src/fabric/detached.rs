//! A fabric left running after the process that built it exits (`cargo xtask testbed up`),
//! and stopping its processes later.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{Process, agent::Agent};

use super::Fabric;

/// A fabric left running after the process that built it exits (`cargo xtask testbed up`):
/// enough to reach it and to tear it down later.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Detached {
    pub prefix: String,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// Where agents and `sopactl` reach the controller (every replica's socket); empty for
    /// the one controller on `socket`.
    #[serde(default)]
    pub controller: String,
    pub topology: String,
    /// Node name -> namespace.
    pub namespaces: BTreeMap<String, String>,
    /// Node name -> agent node name (for `sopa-agent status --node`).
    pub agents: BTreeMap<String, String>,
    /// Host agents, switch agents, then the controller: the order to stop them in.
    pub pids: Vec<u32>,
    /// Every switch's links to other switches: switch -> peer -> its interface towards it.
    #[serde(default)]
    pub links: BTreeMap<String, BTreeMap<String, String>>,
}

impl Fabric {
    /// Leaves everything running and returns what is needed to find and remove it.
    pub fn detach(mut self) -> Detached {
        let g = self.topo.graph().clone();
        let links = self.link_ifaces();
        let mut pids: Vec<u32> = std::mem::take(&mut self.hosts)
            .into_values()
            .map(Agent::leak)
            .collect();
        pids.extend(
            std::mem::take(&mut self.switches)
                .into_values()
                .map(Process::leak),
        );
        pids.extend(self.controller.take().map(Process::leak));
        let controller = if self.replicas.is_empty() {
            String::new()
        } else {
            self.controller_address()
        };
        pids.extend(
            std::mem::take(&mut self.replicas)
                .into_iter()
                .map(Process::leak),
        );
        if let Some(etcd) = self.etcd.take() {
            pids.extend(etcd.members.into_iter().flatten().map(Process::leak));
        }
        let mut namespaces: BTreeMap<String, String> = std::mem::take(&mut self.namespaces)
            .into_iter()
            .map(|(id, ns)| (g.name(id).to_owned(), ns.leak()))
            .collect();
        if let Some(big) = self.ideal.take() {
            namespaces.insert("ideal".into(), big.leak());
        }
        if let Some(ctl) = self.ctl_ns.take() {
            namespaces.insert("ctl".into(), ctl.leak());
        }
        let agents = g
            .nodes
            .iter()
            .map(|n| (n.name.clone(), format!("{}-{}", self.prefix, n.name)))
            .collect();
        let detached = Detached {
            prefix: self.prefix.clone(),
            dir: self.dir.clone(),
            socket: self.socket.clone(),
            controller,
            topology: self.topo.name(),
            namespaces,
            agents,
            pids,
            links,
        };
        std::mem::forget(self);
        detached
    }
}

impl Detached {
    /// Where `sopactl` reaches the controller.
    pub fn controller_address(&self) -> String {
        if self.controller.is_empty() {
            format!("unix:{}", self.socket.display())
        } else {
            self.controller.clone()
        }
    }

    /// The namespace and interface of switch `a`'s end of its link to switch `b`.
    pub fn link_end(&self, a: &str, b: &str) -> Option<(String, String)> {
        let iface = self.links.get(a)?.get(b)?;
        Some((self.namespaces.get(a)?.clone(), iface.clone()))
    }

    /// Every end switch `name` has of a link to another switch: (namespace, interface).
    pub fn switch_ends(&self, name: &str) -> Vec<(String, String)> {
        let Some(ns) = self.namespaces.get(name) else {
            return Vec::new();
        };
        self.links
            .get(name)
            .into_iter()
            .flat_map(|peers| peers.values())
            .map(|iface| (ns.clone(), iface.clone()))
            .collect()
    }

    /// Stops every process (SIGTERM, then SIGKILL) and deletes every namespace and file.
    pub fn teardown(&self) {
        for &pid in &self.pids {
            stop_pid(pid);
        }
        for ns in self.namespaces.values() {
            let _ = crate::netns::ip(&["netns", "del", ns]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGTERM `pid`, then SIGKILL after 5 s; only for processes a testbed started.
pub fn stop_pid(pid: u32) {
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    // Only a process that is still ours: a recycled PID belongs to someone else.
    let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("sopa-"));
    if pid == 0 || !alive(pid) || !ours {
        return;
    }
    // SAFETY: signalling a process this testbed started, by its recorded PID.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}
