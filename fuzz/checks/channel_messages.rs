//! The push channel's decoder on both ends: any bytes decoded as an agent message (what the
//! controller reads) and as a controller message (what an agent reads), and whatever decodes
//! applied the way the receiving side applies it. Refusals are fine; panics are not, and a
//! refused delta must leave the view as it was.
//!
//! Shared by the cargo-fuzz target and the ordinary test that replays the committed seeds
//! (`fuzz_seeds`): one check, two drivers.

use std::{sync::OnceLock, time::Instant};

use prost::Message as _;
use sopa_channel::{
    proto::{AgentMessage, ControllerMessage, agent_message, controller_message},
    view::FabricView,
};
use sopa_controller::{
    fabric::Fabric,
    hedera::{HederaConfig, Scheduler},
};
use sopa_topology::{Topology, topology::TopologySpec};

fn base() -> &'static (Topology, sopa_channel::proto::Snapshot) {
    static BASE: OnceLock<(Topology, sopa_channel::proto::Snapshot)> = OnceLock::new();
    BASE.get_or_init(|| {
        let spec = TopologySpec::FatTree { k: 4 };
        let fabric = Fabric::new(spec.clone(), 7).unwrap();
        (Topology::build(&spec).unwrap(), fabric.snapshot())
    })
}

/// Panics where the code under test is wrong for `data`.
pub fn check(data: &[u8]) {
    let (topo, snapshot) = base();
    if let Ok(m) = AgentMessage::decode(data) {
        match m.kind {
            Some(agent_message::Kind::Flows(r)) => {
                let mut s = Scheduler::new(HederaConfig::default());
                let now = Instant::now();
                if s.accept_report(topo, "h0", &r, now).is_ok() {
                    let failures = sopa_topology::paths::Failures::none(topo.graph());
                    let _ = s.round(topo, &failures, now);
                } else {
                    assert!(s.status().elephants.is_empty());
                }
            }
            Some(agent_message::Kind::Hello(h)) => {
                let _ = (h.node.len(), h.topology_name.len());
            }
            _ => {}
        }
    }
    if let Ok(m) = ControllerMessage::decode(data) {
        match m.kind {
            Some(controller_message::Kind::Snapshot(s)) => {
                let _ = FabricView::from_snapshot(&s);
            }
            Some(controller_message::Kind::Delta(d)) => {
                let mut view = FabricView::from_snapshot(snapshot).unwrap();
                let before: Vec<_> = view.failures.down_links().collect();
                if view.apply_delta(&d).is_err() {
                    let after: Vec<_> = view.failures.down_links().collect();
                    assert_eq!(before, after, "a refused delta changed the view");
                }
            }
            _ => {}
        }
    }
}
