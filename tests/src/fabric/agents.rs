//! The fabric's agents: starting host and switch agents, their status, and waiting until
//! every one applied the controller's version.

use std::time::{Duration, Instant};

use sopa_topology::{NodeKind, topology::TopologySpec};

use crate::{Error, Process, Result, agent::Agent, bins};

use super::{Fabric, FabricOptions, wait};

impl Fabric {
    /// Starts the controller, then every switch agent, then every host agent.
    pub fn start(&mut self, opts: &FabricOptions) -> Result<()> {
        let text = format!("encoding = \"{}\"\n", self.encoding)
            + &match self.topo.spec() {
                TopologySpec::FatTree { k } => {
                    format!("[topology]\nkind = \"fat-tree\"\nk = {k}\n")
                }
                TopologySpec::Modric(p) => format!(
                    "[topology]\nkind = \"modric\"\nm = {}\nn = {}\nq = {}\nx = {}\ny = {}\n",
                    p.m, p.n, p.q, p.x, p.y
                ),
                // The inventory file itself, with the fabric's encoding in it.
                TopologySpec::Inventory(inv) => {
                    return self.start_with_spec(
                        opts,
                        &sopa_topology::inventory::Inventory {
                            encoding: Some(self.encoding),
                            ..*inv
                        }
                        .to_toml(),
                    );
                }
            };
        self.start_with_spec(opts, &text)
    }

    fn start_with_spec(&mut self, opts: &FabricOptions, text: &str) -> Result<()> {
        let spec = self.dir.join("topology.toml");
        std::fs::write(&spec, text).map_err(|e| Error::io("writing the topology spec", e))?;
        if opts.controllers > 1 {
            self.start_replicas(opts.controllers)?;
        } else {
            self.start_controller()?;
        }
        self.opts = opts.clone();
        let g = self.topo.graph().clone();
        if crate::routers::switches_have_agents(self) {
            for node in g.nodes.iter().filter(|n| n.kind.is_switch()) {
                self.start_switch(&node.name)?;
            }
        } else {
            crate::routers::configure(self)?;
        }
        for node in g.nodes.iter().filter(|n| n.kind == NodeKind::Host) {
            self.start_host(&node.name)?;
        }
        Ok(())
    }

    /// Starts (or starts again, after [`Fabric::stop_host`]) host `name`'s agent with the
    /// flags [`Fabric::start`] gave every host.
    pub fn start_host(&mut self, name: &str) -> Result<()> {
        self.start_host_with(name, &[])
    }

    /// [`Fabric::start_host`] with `extra` flags after every host's.
    pub fn start_host_with(&mut self, name: &str, extra: &[&str]) -> Result<()> {
        self.start_host_as(name, name, extra)
    }

    /// [`Fabric::start_host_with`], the agent told `--host host` (a name, an address, or
    /// `auto`: found by its interface's address in the inventory).
    pub fn start_host_as(&mut self, name: &str, host: &str, extra: &[&str]) -> Result<()> {
        let id = self.topo.graph().find(name).expect("a host");
        let opts = &self.opts;
        // Elephants (Hedera's pinned mode) are measured against the shaped rate.
        let nic = opts.rate_mbit.map(|r| r.to_string());
        // The experiments report the receivers' reordering. They reproduce the paper's
        // per-packet spraying unless the options choose a unit (the agent's own default is a
        // flowcell).
        let per_packet = !opts
            .host_args
            .iter()
            .any(|a| a == "--granularity" || a.starts_with("--granularity="));
        let args: Vec<&str> = std::iter::once("--measure-reordering")
            .chain(
                per_packet
                    .then_some(["--granularity", "packet"])
                    .into_iter()
                    .flatten(),
            )
            .chain((!self.host_metrics).then_some("--no-metrics"))
            .chain(
                nic.as_deref()
                    .map(|r| ["--nic-rate-mbit", r])
                    .into_iter()
                    .flatten(),
            )
            .chain(opts.host_args.iter().map(String::as_str))
            .chain(extra.iter().copied())
            .collect();
        let agent = Agent::start_with_controller(
            &self.namespaces[&id],
            &format!("{}-{}", self.prefix, name),
            host,
            &self.host_ifaces[&id],
            &self.controller_address(),
            &args,
        )?;
        self.hosts.insert(id, agent);
        Ok(())
    }

    /// Waits until the controller's down links satisfy `done` (their count) and every agent of
    /// the fabric (each host and switch agent running) is connected and has ACKed the
    /// controller's version: the change has been applied
    /// everywhere (a switch ACKs once its routes are installed, a host once its datapath is
    /// written). At most 30 s.
    pub fn wait_applied(&self, done: impl Fn(usize) -> bool, what: &str) -> Result<()> {
        self.wait_applied_within(done, what, Duration::from_secs(30))
    }

    /// [`Fabric::wait_applied`], for at most `within`.
    pub fn wait_applied_within(
        &self,
        done: impl Fn(usize) -> bool,
        what: &str,
        within: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            let st: serde_json::Value = serde_json::from_str(&self.sopactl(&["status", "--json"])?)
                .map_err(|e| Error::Failed(format!("sopactl status --json: {e}")))?;
            let down = st["down_links"].as_array().map_or(0, Vec::len);
            // Every agent reaches the controller over the management socket, which no fabric
            // failure touches: one that is not connected now (heartbeats missed on a starved
            // machine) has not applied the change yet, and its host still sends on the old paths.
            // Every agent of the fabric: a controller that restarted lists only those that have
            // reconnected so far, and one still in its backoff has not applied anything.
            let expected = self.hosts.len() + self.switches.len();
            let applied = st["agents"].as_array().is_some_and(|agents| {
                agents.len() >= expected
                    && agents
                        .iter()
                        .all(|a| a["connected"] == true && a["applied_version"] == st["version"])
            });
            if done(down) && applied {
                return Ok(());
            }
            if start.elapsed() > within {
                return Err(Error::Failed(format!(
                    "{what} did not reach the controller and every agent within {within:?}: {st}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts (or restarts) the switch agent of switch `name`.
    pub fn start_switch(&mut self, name: &str) -> Result<()> {
        self.start_switch_with(name, &[])
    }

    /// Starts (or restarts) the switch agent of switch `name` with `extra` flags (e.g.
    /// `--keep-attached`).
    pub fn start_switch_with(&mut self, name: &str, extra: &[&str]) -> Result<()> {
        let id = self.topo.graph().find(name).expect("a switch");
        let ns = self.namespaces[&id].name().to_owned();
        let socket = self.controller_address();
        let agent_node = self.switch_node(name);
        let log = self.dir.join(format!("{name}.log"));
        let mut args = vec![
            "--netns",
            &ns,
            "switch",
            "--node",
            &agent_node,
            "--host",
            name,
            "--controller",
            &socket,
            "--heartbeat-ms",
            "500",
        ];
        args.extend(self.opts.switch_args.iter().map(String::as_str));
        args.extend_from_slice(extra);
        if extra.contains(&"--keep-attached") {
            self.kept_attached.insert(agent_node.clone(), ns.clone());
        } else {
            self.kept_attached.remove(&agent_node);
        }
        let p = Process::spawn(None, &bins::sopa_agent(), &args, &log)?;
        self.switches.insert(name.to_owned(), p);
        Ok(())
    }

    /// Stops the switch agent of `name` with SIGTERM (it restores what it changed) and returns
    /// its exit code.
    pub fn stop_switch(&mut self, name: &str) -> Option<i32> {
        let mut p = self.switches.remove(name)?;
        p.stop_with(libc::SIGTERM, Duration::from_secs(15))
            .and_then(|s| s.code())
    }

    /// SIGKILLs the switch agent of `name` (its forwarding state stays behind in the kernel).
    pub fn kill_switch(&mut self, name: &str) {
        if let Some(mut p) = self.switches.remove(name) {
            p.stop_with(libc::SIGKILL, Duration::from_secs(5));
        }
    }

    /// Waits until switch `name`'s agent runs, holds the controller's state and has
    /// `tc_forward` on its ports (at most `within`); otherwise an error with its log.
    pub fn wait_switch_synced(&self, name: &str, within: Duration) -> Result<()> {
        wait(&format!("{name}'s agent"), within, || {
            self.switch_status(name).is_ok_and(|s| {
                s["running"] == true
                    && s["controller"]["version"].as_u64().unwrap_or(0) >= 1
                    && s["forward_programs"]
                        .as_object()
                        .is_some_and(|p| !p.is_empty())
            })
        })
        .map_err(|e| Error::Failed(format!("{e}:\n{}", self.switch_log(name))))
    }

    /// The agent node name of switch `name` (its pin and run folders).
    pub fn switch_node(&self, name: &str) -> String {
        format!("{}-{}", self.prefix, name)
    }

    /// The log of switch `name`'s agent.
    pub fn switch_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The host agent of host `name`.
    pub fn host(&self, name: &str) -> &Agent {
        &self.hosts[&self.topo.graph().find(name).expect("a host")]
    }

    /// Stops host `name`'s agent with SIGTERM (it restores the host: no program stays) and
    /// returns its exit code.
    pub fn stop_host(&mut self, name: &str) -> Option<i32> {
        let id = self.topo.graph().find(name).expect("a host");
        self.hosts.remove(&id)?.stop()
    }

    /// `sopa-agent status --json` of switch `name`.
    pub fn switch_status(&self, name: &str) -> Result<serde_json::Value> {
        let out = std::process::Command::new(bins::sopa_agent())
            .args([
                "status",
                "--json",
                "--node",
                &format!("{}-{}", self.prefix, name),
            ])
            .output()
            .map_err(|e| Error::io("sopa-agent status", e))?;
        if !out.status.success() {
            return Err(Error::Failed(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| Error::Failed(e.to_string()))
    }

    /// [`Fabric::wait_ready`], then every agent on the controller's version with no link
    /// down: the state a phase of a shared fabric starts from (an agent's late first report of
    /// a port can still change it after `wait_ready`).
    pub fn wait_settled(&self, timeout: Duration) -> Result<()> {
        self.wait_ready(timeout)?;
        self.wait_applied_within(|down| down == 0, "a settled fabric", timeout)
    }

    /// [`Fabric::wait_settled`] for a phase harness's check (a phase ends settled, so 20 s is
    /// long): what is not settled, in words.
    pub fn settled(&mut self) -> std::result::Result<(), String> {
        self.wait_settled(Duration::from_secs(20))
            .map_err(|e| e.to_string())
    }

    /// Waits until every switch has installed its plan (its status shows the controller's
    /// version) and every host holds a path to every other rack.
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let g = self.topo.graph();
        // Switches without agents (hashing routers) have nothing to wait for.
        let switches: Vec<&str> = g
            .nodes
            .iter()
            .filter(|n| n.kind.is_switch() && crate::routers::switches_have_agents(self))
            .map(|n| n.name.as_str())
            .collect();
        let racks = self.topo.racks().len() as u64;
        // A plan installed, and every host port trusted (its host's agent live): until then
        // the option from that host is neutralized.
        wait("every switch's plan and trusted ports", timeout, || {
            switches.iter().all(|s| {
                self.switch_status(s).is_ok_and(|st| {
                    st["controller"]["version"].as_u64().unwrap_or(0) >= 1
                        && st["controller"]["untrusted_hosts"]
                            .as_array()
                            .is_some_and(|h| h.is_empty())
                })
            })
        })?;
        wait("every host's paths", timeout, || {
            self.hosts.values().all(|a| {
                a.status()
                    .is_ok_and(|st| st["prefixes"].as_u64() == Some(racks - 1))
            })
        })
    }
}
