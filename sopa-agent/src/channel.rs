//! The host agent's side of the push channel: every snapshot and delta from the controller
//! becomes this host's candidate paths (computed locally from the pushed topology), written to
//! the datapath prefix by prefix, each prefix swapped atomically (make-before-break).

use sopa_channel::{
    client::Applier,
    proto::{Delta, PinSet, Snapshot},
    view::FabricView,
};
use sopa_topology::{paths::PathTable as Candidates, srv6::Encoding};
use tracing::{info, warn};

use crate::{
    changes::ControllerState,
    entropy::{
        discover::Pace,
        runner::{Discovery, default_pace},
        source::LabelSource,
    },
    host::Host,
    path_table::PathTable,
    srv6::{Srv6Paths, Srv6Table},
};

pub struct HostApplier<'a> {
    host: &'a mut Host,
    node: String,
    endpoint: String,
    view: Option<FabricView>,
    candidates: Option<Candidates>,
    state: ControllerState,
    /// The path meter's clock, which adopts the controller's from its snapshots.
    meter_clock: Option<std::sync::Arc<crate::meter::MeterClock>>,
    /// Notified at every new session (the LLDP table is sent again).
    session: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// The entropy encoding's labels and the probing that finds them (given, or made with the
    /// first snapshot in that encoding), and its pace.
    discovery: Option<std::sync::Arc<Discovery>>,
    pace: Pace,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The live paths of some destinations of `c`, as the datapath takes them.
fn table_of(c: &Candidates, only: Option<&[usize]>) -> PathTable {
    let mut t = PathTable::default();
    let all: Vec<usize>;
    let indices = match only {
        Some(i) => i,
        None => {
            all = (0..c.destinations.len()).collect();
            &all
        }
    };
    for &i in indices {
        let d = &c.destinations[i];
        t.destinations.insert(d.prefix(), d.alive_hops().collect());
    }
    t
}

/// This host's SRv6 addresses and every destination's uSID lists, from the pushed topology.
fn srv6_table(
    topo: &sopa_topology::Topology,
    candidates: &Candidates,
) -> Result<Srv6Table, String> {
    let plan = sopa_topology::srv6::host_plan(topo, candidates).map_err(|e| e.to_string())?;
    let table = Srv6Table {
        source: plan.source,
        receive: plan.receive,
        fabric6: Some(sopa_topology::srv6::HOST6_PREFIX),
        destinations: plan
            .destinations
            .into_iter()
            .map(|d| {
                (
                    d.prefix,
                    Srv6Paths {
                        chosen: d.chosen.into_iter().collect(),
                        tail: d.tail,
                    },
                )
            })
            .collect(),
    };
    table.validate()?;
    Ok(table)
}

impl<'a> HostApplier<'a> {
    /// Labels in the entropy encoding from `discovery` (which the caller can also steer, as
    /// `sopa-agent labels` does through SIGHUP), not from one of its own.
    pub fn with_discovery(mut self, discovery: std::sync::Arc<Discovery>) -> Self {
        self.discovery = Some(discovery);
        self
    }

    /// `notify` is told at every new session.
    pub fn on_session(&mut self, notify: std::sync::Arc<tokio::sync::Notify>) {
        self.session = Some(notify);
    }

    /// Applies what the controller pushes to `host` (topology name `node`); `meter_clock`: the
    /// path meter's clock, which adopts the controller's.
    pub fn new(
        host: &'a mut Host,
        node: &str,
        endpoint: &str,
        meter_clock: Option<std::sync::Arc<crate::meter::MeterClock>>,
    ) -> Self {
        let state = ControllerState {
            endpoint: endpoint.to_owned(),
            since_unix: now(),
            ..ControllerState::default()
        };
        host.set_controller_state(state.clone());
        Self {
            host,
            node: node.to_owned(),
            endpoint: endpoint.to_owned(),
            view: None,
            candidates: None,
            state,
            meter_clock,
            session: None,
            discovery: None,
            pace: default_pace(),
        }
    }

    fn record(&mut self) {
        self.host.set_controller_state(self.state.clone());
    }
}

impl HostApplier<'_> {
    /// Removes the pins whose path a failure killed (the flow falls back to the hash until
    /// the controller places it again).
    fn drop_dead_pins(&mut self) {
        let Some(candidates) = self.candidates.as_ref() else {
            return;
        };
        let maps = self.host.maps();
        let mut maps = maps.lock().expect("maps lock");
        let result = maps.pins().and_then(|pins| {
            let (kept, dropped) = crate::hedera::still_live(pins, candidates);
            if dropped > 0 {
                info!(dropped, "pins on failed paths removed");
                maps.replace_pins(&kept)?;
            }
            Ok(())
        });
        if let Err(err) = result {
            warn!(%err, "checking the pins after a change");
        }
    }
}

impl Applier for HostApplier<'_> {
    fn meter_clock(&self) -> Option<(u32, u64)> {
        let c = self.meter_clock.as_ref()?.get();
        Some(((c.period_ns / 1_000_000) as u32, c.epoch_ns))
    }

    async fn snapshot(&mut self, s: &Snapshot) -> Result<(), String> {
        let view = FabricView::from_snapshot(s).map_err(|e| e.to_string())?;
        let topo = &view.topology;
        // By name, or by address (`--host auto`).
        let src = topo.resolve_host(&self.node).ok().ok_or_else(|| {
            format!(
                "node {:?} is not a host of the pushed topology ({})",
                self.node,
                topo.name()
            )
        })?;
        let candidates =
            Candidates::compute(topo, src, &view.failures).map_err(|e| e.to_string())?;
        let mut table = table_of(&candidates, None);
        if view.encoding == Encoding::Srv6 {
            table.srv6 = Some(srv6_table(topo, &candidates)?);
        }
        if view.encoding == Encoding::Entropy {
            let (maps, pace) = (self.host.maps(), self.pace);
            let run_dir = self
                .host
                .run_dir()
                .ok_or_else(|| "the agent is stopping".to_owned())?;
            let d = self.discovery.get_or_insert_with(|| {
                std::sync::Arc::new(Discovery::new(maps, run_dir, pace, LabelSource::Discovered))
            });
            // The labels found so far; the rest come as discovery finds them.
            table.entropy = Some(d.table_for(topo, src));
        } else if let Some(d) = &self.discovery {
            // Another encoding: no label is probed or written from now on.
            d.stop();
        }
        self.host
            .apply_table(&table)
            .await
            .map_err(|e| format!("writing the datapath: {e}"))?;
        info!(
            epoch = s.epoch,
            version = s.version,
            prefixes = table.len(),
            encoding = %view.encoding,
            "applied the controller's snapshot"
        );
        // The racks and paths the meter counts marks from: the topology's, whatever is down.
        let peers = crate::meter::peers::peers(topo, src);
        self.host
            .maps()
            .lock()
            .expect("maps lock")
            .set_meter_peers(&peers)
            .map_err(|e| format!("writing the path meter's peers: {e}"))?;
        if let Some(clock) = &self.meter_clock {
            clock.adopt(s.meter_period_ms, s.meter_epoch_ns);
        }
        if view.encoding == Encoding::Entropy
            && let Some(d) = &self.discovery
        {
            d.restart(topo, src, &candidates);
        }
        self.view = Some(view);
        self.candidates = Some(candidates);
        self.state.epoch = s.epoch;
        self.state.version = s.version;
        self.state.last_error.clear();
        self.record();
        Ok(())
    }

    async fn delta(&mut self, d: &Delta) -> Result<(), (String, bool)> {
        let (Some(view), Some(candidates)) = (self.view.as_mut(), self.candidates.as_mut()) else {
            return Err(("a delta before any snapshot".into(), true));
        };
        let changed = view
            .apply_delta(d)
            .map_err(|e| (e.to_string(), e.needs_resync()))?;
        let touched = candidates.update(view.topology.graph(), &view.failures, &changed);
        let table = table_of(candidates, Some(&touched));
        if let Err(e) = self.host.update_prefixes(&table).await {
            // The view moved on but the datapath may not have: start over from a snapshot.
            let msg = format!("writing the datapath: {e}");
            self.state.last_error = msg.clone();
            self.view = None;
            self.candidates = None;
            self.record();
            return Err((msg, true));
        }
        info!(
            version = d.version,
            prefixes = touched.len(),
            "applied a delta"
        );
        self.state.version = d.version;
        self.record();
        self.drop_dead_pins();
        // A hash-threshold switch moves healthy flows when a next hop goes: probe again.
        if let (Some(disc), Some(view), Some(c)) = (&self.discovery, &self.view, &self.candidates)
            && view.encoding == Encoding::Entropy
            && !touched.is_empty()
        {
            disc.restart(&view.topology, c.source, c);
        }
        Ok(())
    }

    async fn pins(&mut self, set: &PinSet) -> Result<(), String> {
        let (Some(view), Some(candidates)) = (self.view.as_ref(), self.candidates.as_ref()) else {
            return Err("pins before any snapshot".into());
        };
        let g = view.topology.graph();
        let own = g
            .node(candidates.source)
            .addr
            .expect("hosts have addresses");
        let pins = crate::hedera::check_pins(set, own, candidates, crate::hedera::monotonic_ns())
            .inspect_err(|e| warn!(round = set.round, error = %e, "pin set refused"))?;
        let maps = self.host.maps();
        let mut maps = maps.lock().expect("maps lock");
        maps.replace_pins(&pins)
            .map_err(|e| format!("writing the pins: {e}"))
    }

    fn position(&self) -> (u64, u64) {
        self.view.as_ref().map_or((0, 0), |v| (v.epoch, v.version))
    }

    fn peers(&mut self, peers: &sopa_channel::proto::PeerAgents) {
        let down = &peers.down;
        if self.state.peers_down != *down {
            if down.is_empty() {
                info!("every peer host's agent is back");
            } else {
                warn!(hosts = ?down, "peer hosts without their agent: they receive packets with the option on");
            }
            self.state.peers_down = down.clone();
            self.record();
        }
    }

    fn connected(&mut self, up: bool) {
        if up && let Some(s) = &self.session {
            s.notify_one();
        }
        if self.state.connected != up {
            self.state.connected = up;
            self.state.since_unix = now();
            self.state.endpoint = self.endpoint.clone();
            self.record();
        }
    }
}
