//! The fabric's controller: one on a Unix socket or replicas over an etcd cluster, and
//! `sopactl` against it.

use std::{path::PathBuf, time::Duration};

use crate::{Error, NetNs, Process, Result, bins};

use super::{Fabric, wait};

impl Fabric {
    /// Starts the controller on the testbed's socket, with the testbed's state file (so a
    /// restarted controller keeps its drains).
    pub fn start_controller(&mut self) -> Result<()> {
        let spec = self.dir.join("topology.toml");
        let socket = format!("unix:{}", self.socket.display());
        // The testbed's own state file: a restarted controller keeps its drains.
        let store = format!("file:{}", self.controller_state_file().display());
        let _ = std::fs::remove_file(&self.socket);
        self.controller = Some(Process::spawn(
            None,
            &bins::sopa_controller(),
            &[
                "--topology",
                spec.to_str().expect("utf-8"),
                "--listen",
                &socket,
                "--insecure",
                "--store",
                &store,
                // The experiments take links down and up on purpose, mode after mode: no
                // flap damping here (the controller's suites test it).
                "--flap-limit",
                "0",
                "--heartbeat-ms",
                "500",
            ]
            .into_iter()
            .chain(self.controller_args.iter().map(String::as_str))
            .collect::<Vec<_>>(),
            &self.dir.join("controller.log"),
        )?);
        wait("the controller's socket", Duration::from_secs(10), || {
            self.socket.exists()
        })?;
        Ok(())
    }

    /// Where agents and `sopactl` reach the controller: its socket, or every replica's.
    pub fn controller_address(&self) -> String {
        if self.replicas.is_empty() {
            format!("unix:{}", self.socket.display())
        } else {
            replica_address(&self.dir, self.replicas.len())
        }
    }

    /// Starts `n` controller replicas on a three-member etcd cluster, all in a namespace of
    /// their own (`<prefix>-ctl`), each serving on a socket of its own; returns once one is
    /// elected and serves.
    pub fn start_replicas(&mut self, n: usize) -> Result<()> {
        let ns = NetNs::new(&format!("{}-ctl", self.prefix))?;
        let etcd = crate::etcd::EtcdCluster::start(&ns, &self.dir, 3)?;
        let spec = self.dir.join("topology.toml");
        let store = etcd.store_flag();
        for i in 0..n {
            let socket = format!("unix:{}", replica_socket(&self.dir, i).display());
            let name = format!("replica-{i}");
            self.replicas.push(Process::spawn(
                Some(&ns),
                &bins::sopa_controller(),
                &[
                    "--topology",
                    spec.to_str().expect("utf-8"),
                    "--listen",
                    &socket,
                    "--insecure",
                    "--store",
                    &store,
                    "--name",
                    &name,
                    "--flap-limit",
                    "0",
                    "--heartbeat-ms",
                    "500",
                ],
                &self.dir.join(format!("controller-{i}.log")),
            )?);
        }
        self.etcd = Some(etcd);
        self.ctl_ns = Some(ns);
        // Only the elected replica binds its socket.
        wait(
            "an elected controller's socket",
            Duration::from_secs(30),
            || (0..n).any(|i| replica_socket(&self.dir, i).exists()),
        )?;
        Ok(())
    }

    /// The address the controller serves its metrics on, where its flags give one
    /// (`--metrics-addr` in [`Fabric::controller_args`]).
    pub fn controller_metrics_addr(&self) -> Option<&str> {
        self.controller_args
            .iter()
            .position(|a| a == "--metrics-addr")
            .and_then(|i| self.controller_args.get(i + 1))
            .map(String::as_str)
    }

    /// Stops the controller and starts it again (its drains kept in its state file, the rest of
    /// its memory gone: the path meter's evidence and strikes, its counters), then waits until
    /// every agent has applied its state again.
    pub fn restart_controller(&mut self) -> Result<()> {
        self.stop_controller();
        self.start_controller()?;
        self.wait_applied(|_| true, "the restarted controller's state")
    }

    /// Where the testbed's controller keeps its state.
    pub fn controller_state_file(&self) -> std::path::PathBuf {
        self.dir.join("controller-state.json")
    }

    /// Stops the controller (SIGTERM); agents keep their state and retry.
    pub fn stop_controller(&mut self) {
        if let Some(mut p) = self.controller.take() {
            p.stop_with(libc::SIGTERM, Duration::from_secs(10));
        }
    }

    /// The single controller's log so far (empty with replicas or before it started), for
    /// what a failing test prints.
    pub fn controller_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("controller.log")).unwrap_or_default()
    }

    /// `sopactl ARGS --controller unix:SOCKET` (every replica's socket, with replicas).
    pub fn sopactl(&self, args: &[&str]) -> Result<String> {
        let socket = self.controller_address();
        let out = std::process::Command::new(bins::sopactl())
            .args(args)
            .args(["--controller", &socket])
            .output()
            .map_err(|e| Error::io("sopactl", e))?;
        if !out.status.success() {
            return Err(Error::Failed(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Replica `i`'s socket.
fn replica_socket(dir: &std::path::Path, i: usize) -> PathBuf {
    dir.join(format!("controller-{i}.sock"))
}

/// Every replica's socket, as a `--controller` list.
fn replica_address(dir: &std::path::Path, n: usize) -> String {
    (0..n)
        .map(|i| format!("unix:{}", replica_socket(dir, i).display()))
        .collect::<Vec<_>>()
        .join(",")
}
