//! The host role: stamp on egress, strip on ingress, and the host settings they need
//! (tcp_reordering, fabric route MTUs, GSO granularity), all undone on exit.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use tracing::warn;

use crate::{
    changes::SharedJournal,
    datapath::{Datapath, MapSet},
    error::{Error, Result},
    granularity::{self, Granularity},
    metrics,
    netlink::Netlink,
    path_table::{PathTable, Prefix},
    routes::RouteKeeper,
};

mod leftovers;
mod node;
mod start;

pub(crate) use node::forget;
pub use node::{
    check_privileges, check_undo_privileges, enter_netns, pin_dir, run_dir, validate_node,
};

/// How `xdp_strip` attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpAttach {
    /// Generic on veth (native XDP there disables the peer's TSO), native elsewhere.
    Auto,
    Generic,
    Native,
}

#[derive(Clone, Debug)]
pub struct HostOptions {
    pub node: String,
    pub iface: String,
    pub paths: PathTable,
    pub paths_file: Option<PathBuf>,
    pub mode: u32,
    pub granularity: Granularity,
    pub xdp: XdpAttach,
    pub tcp_reordering: u32,
    pub metrics_addr: Option<SocketAddr>,
    /// Who may reach the metrics address besides loopback (`--metrics-allow`), and its TLS.
    pub metrics_access: sopa_ops::http::Access,
    /// This node's certificate (`--certs DIR/node.pem`), whose expiry the metrics show.
    pub certificate: Option<PathBuf>,
    pub hash_seed: u32,
    /// Lower the fabric routes' MTU by the option's 4 bytes (a plain `mtu`: DF stays on).
    pub lower_route_mtu: bool,
    /// The paths come from a controller: an adopted datapath keeps its path map until the
    /// controller's snapshot replaces it (an empty start table would cut traffic).
    pub paths_from_controller: bool,
    /// Restore and unpin whatever a previous agent of this node left, instead of adopting it.
    pub reset: bool,
    /// The namespace the agent runs in (recorded for `sopa-agent detach`).
    pub netns: Option<String>,
    /// A live agent of this node hands its datapath over (SIGUSR1: it exits keeping it
    /// attached) and this one adopts it: an upgrade in place.
    pub takeover: bool,
    /// Where `tc_stamp` goes in the interface's TCX egress chain (or among its egress filters).
    pub tcx_order: crate::datapath::TcxOrder,
    /// How `tc_stamp` attaches: a TCX link, or a cls_bpf filter (`--attach`).
    pub attach: crate::datapath::tc_hook::AttachMode,
    /// The mode was given at start (`--mode`): a mode set at run time is forgotten, before
    /// the agent says it is up.
    pub forget_runtime_mode: bool,
    /// The path meter's period of alternate marking (zero: no metering).
    pub meter_period: std::time::Duration,
    /// `xdp_strip` measures the reordering of arriving TCP flows.
    pub measure_reordering: bool,
    /// Where the socket-option guard goes (`--guard-cgroup`).
    pub guard_cgroup: crate::datapath::guard::GuardCgroup,
}

/// Bytes the table's encoding adds to every IPv4 packet it carries a path in.
fn overhead(table: &PathTable) -> u32 {
    if table.srv6.is_some() {
        // The outer header and the meter's mark, whether or not the meter runs now.
        sopa_common::srv6::MAX_OVERHEAD as u32
    } else if table.entropy.is_some() {
        // The outer header (IPv6 grows by nothing: its label is rewritten in place).
        sopa_common::srv6::IPV6_HLEN as u32
    } else {
        u32::from(sopa_common::wire::OPTION_LEN)
    }
}

/// A started host datapath. Dropping it without [`Host::stop`] leaves the journal for the next
/// start to restore.
pub struct Host {
    datapath: Datapath,
    maps: Arc<Mutex<MapSet>>,
    journal: SharedJournal,
    netlink: Netlink,
    metrics: Option<tokio::task::JoinHandle<()>>,
    /// The fabric routes' MTU (absent with `--keep-route-mtu`), and the task that keeps it
    /// lowered when routes change under the agent.
    routes: Option<(
        Arc<tokio::sync::Mutex<RouteKeeper>>,
        tokio::task::JoinHandle<()>,
    )>,
    gauges: metrics::AgentGauges,
}

impl Host {
    /// This agent's run folder (its journal and what `status` reads besides the maps).
    pub fn run_dir(&self) -> Option<PathBuf> {
        self.journal.with(|j| run_dir(&j.record.node))
    }

    /// The handle that applies a granularity set at run time (`sopa-agent granularity`,
    /// delivered by SIGHUP) to this agent's interface; the record then says the agent takes
    /// SIGHUP, which `sopa-agent granularity` requires (the caller installs the handler).
    pub fn granularity_control(&self) -> Result<granularity::Control> {
        let (ifname, index, node) = self
            .journal
            .with(|j| {
                (
                    j.record.iface.clone(),
                    j.record.ifindex,
                    j.record.node.clone(),
                )
            })
            .ok_or_else(|| Error::Config("the agent is stopping".into()))?;
        let control =
            granularity::Control::new(self.journal.clone(), ifname, index, run_dir(&node))?;
        self.journal
            .with(|j| {
                j.record.reloads_on_sighup = true;
                j.save()
            })
            .unwrap_or(Ok(()))?;
        Ok(control)
    }

    /// What this host's agent does without features its kernel lacks, one `feature: instead`
    /// each (for the controller's view of the fleet).
    pub fn fallbacks(&self) -> Vec<String> {
        self.journal
            .with(|j| j.record.fallback_lines())
            .unwrap_or_default()
    }

    pub fn maps(&self) -> Arc<Mutex<MapSet>> {
        Arc::clone(&self.maps)
    }

    /// Installs `table` as the datapath's whole path table (make-before-break), first giving
    /// new fabric prefixes their lowered route MTU. Used when the controller pushes paths.
    pub async fn apply_table(&mut self, table: &PathTable) -> Result<()> {
        if let Some((keeper, _)) = &self.routes {
            let mut keeper = keeper.lock().await;
            keeper.set_overhead(overhead(table));
            keeper
                .ensure6(table.srv6.as_ref().and_then(|s| s.fabric6))
                .await?;
        }
        self.prepare_routes(table.destinations.keys()).await?;
        let mut maps = self.maps.lock().expect("maps lock");
        // Paths and their uSIDs both in place before the encoding that needs them; a stale
        // entry of either goes after.
        if table.srv6.is_some() || table.entropy.is_some() {
            maps.apply_paths(table)?;
            maps.apply_encoding(table)
        } else {
            maps.apply_encoding(table)?;
            maps.apply_paths(table)
        }
    }

    /// Rewrites the path sets of some prefixes only (each one atomically).
    pub async fn update_prefixes(&mut self, changed: &PathTable) -> Result<()> {
        self.prepare_routes(changed.destinations.keys()).await?;
        let mut maps = self.maps.lock().expect("maps lock");
        for (prefix, hops) in &changed.destinations {
            maps.set_paths(prefix, hops)?;
        }
        Ok(())
    }

    async fn prepare_routes<'a>(
        &mut self,
        prefixes: impl Iterator<Item = &'a Prefix>,
    ) -> Result<()> {
        match &self.routes {
            Some((keeper, _)) => keeper.lock().await.ensure(prefixes).await,
            None => Ok(()),
        }
    }

    /// The path meter's counts of periods and late turns, which the agent's metrics show.
    pub fn meter_stats(&self) -> Arc<crate::meter::MeterStats> {
        Arc::clone(&self.gauges.meter)
    }

    /// Records the controller channel's state where `sopa-agent status` reads it.
    pub fn set_controller_state(&mut self, state: crate::changes::ControllerState) {
        use std::sync::atomic::Ordering::Relaxed;
        self.gauges.state.store(i64::from(state.connected), Relaxed);
        self.gauges.version.store(state.version, Relaxed);
        *self.gauges.peers_down.lock().expect("peers lock") = state.peers_down.clone();
        if let Some(Err(err)) = self.journal.with(|j| j.set_controller(state)) {
            warn!(%err, "recording the controller state");
        }
    }

    /// Detaches the programs and restores every host setting the agent changed; with
    /// `keep_attached`, leaves the datapath and the settings it needs as they are, recorded for
    /// the next agent to adopt (or `sopa-agent detach` to remove).
    pub async fn stop(mut self, keep_attached: bool) -> Vec<Error> {
        if let Some(metrics) = self.metrics.take() {
            metrics.abort();
        }
        if let Some((keeper, watch)) = self.routes.take() {
            // No route change of ours after this point: a check under way finishes first
            // (it holds the keeper), then the watch ends.
            let idle = keeper.lock().await;
            watch.abort();
            let _ = watch.await;
            drop(idle);
        }
        self.datapath
            .stop(self.journal.take(), &self.netlink, keep_attached)
            .await
    }
}
