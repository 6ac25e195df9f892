//! The push channel's decoder on both ends: any bytes decoded as an agent message (what the
//! controller reads) and as a controller message (what an agent reads), and whatever decodes
//! applied the way the receiving side applies it, every message type: a hello's fields, an
//! ack or nack settling the meter, a port report against the topology and the damper, a flow
//! report through Hedera, a pin acknowledgement, and a path report through the meter's intake,
//! the tomography's fold and its judge. Refusals are fine; panics are not, a refused delta must
//! leave the view as it was, and a refused path report must leave the evidence as it was.
//!
//! Shared by the cargo-fuzz target and the ordinary test that replays the committed seeds
//! (`fuzz_seeds`): one check, two drivers.

use std::{
    collections::BTreeSet,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use prost::Message as _;
use sopa_channel::{
    proto::{
        AgentMessage, ControllerMessage, MAX_TEXT_BYTES, PathReport, agent_message, bounded,
        controller_message,
    },
    view::FabricView,
};
use sopa_controller::{
    damping::{Damper, DampingConfig},
    fabric::Fabric,
    hedera::{HederaConfig, Scheduler},
    meter::{Meter, MeterClock, Reporter},
    tomography::JudgeConfig,
};
use sopa_topology::{NodeKind, Topology, topology::TopologySpec};

struct Base {
    topo: Arc<Topology>,
    fabric: Fabric,
    snapshot: sopa_channel::proto::Snapshot,
    hosts: BTreeSet<String>,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let spec = TopologySpec::FatTree { k: 4 };
        let fabric = Fabric::new(spec.clone(), 7).unwrap();
        let topo = Arc::new(Topology::build(&spec).unwrap());
        let g = topo.graph();
        let hosts = g
            .nodes_of(NodeKind::Host)
            .map(|h| g.name(h).to_owned())
            .collect();
        Base {
            snapshot: fabric.snapshot(),
            topo,
            fabric,
            hosts,
        }
    })
}

const PERIOD: Duration = Duration::from_millis(250);

/// A path report through a fresh meter (a clock of 250 ms from the TAI epoch), at the time its
/// period's report is due: refused, or taken, folded and judged.
fn paths(b: &Base, report: PathReport) {
    let mut m = Meter::new(
        Arc::clone(&b.topo),
        JudgeConfig::default(),
        MeterClock::new(PERIOD, 0),
    );
    let p = PERIOD.as_nanos() as u64;
    let now = report
        .period
        .saturating_add(1)
        .saturating_mul(p)
        .saturating_add(p / 2);
    // Every host but h0 reported the period already, empty: h0's closes it.
    for h in b.hosts.iter().filter(|h| *h != "h0") {
        let empty = PathReport {
            period: report.period,
            period_ms: 250,
            ..PathReport::default()
        };
        let _ = m.accept(
            Reporter::settled(h),
            empty,
            0,
            now,
            Instant::now(),
            &b.hosts,
        );
    }
    let judged = m.tomography.periods_judged;
    match m.accept(
        Reporter::settled("h0"),
        report,
        0,
        now,
        Instant::now(),
        &b.hosts,
    ) {
        Ok(_) => {
            let _ = m.tomography.judge(|_| false);
            for w in [4, 16] {
                let _ = m.tomography.link_loss(w);
            }
        }
        Err(_) => assert_eq!(
            m.tomography.periods_judged, judged,
            "a refused report judged"
        ),
    }
}

/// Panics where the code under test is wrong for `data`.
pub fn check(data: &[u8]) {
    let b = base();
    let topo = &*b.topo;
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
                if h.check_fields().is_ok() {
                    let name = if h.topology_name.is_empty() {
                        &h.node
                    } else {
                        &h.topology_name
                    };
                    let _ = topo.graph().find(name);
                }
            }
            Some(agent_message::Kind::Ack(a)) => {
                let mut m = Meter::new(
                    Arc::clone(&b.topo),
                    JudgeConfig::default(),
                    MeterClock::new(PERIOD, 0),
                );
                m.changed(a.version, true, 0);
                m.tomography.settled(a.version);
                assert_eq!(m.tomography.settling(), None);
            }
            Some(agent_message::Kind::Nack(n)) => {
                assert!(bounded(&n.error, MAX_TEXT_BYTES).len() <= MAX_TEXT_BYTES);
            }
            Some(agent_message::Kind::Report(r)) => {
                if b.fabric.check_link(&r.a, &r.b).is_ok() {
                    let mut d = Damper::new(DampingConfig::default());
                    let _ = d.report(&(r.a.clone(), r.b), &r.a, r.down, Instant::now());
                }
            }
            Some(agent_message::Kind::Neighbours(r)) => {
                // Kept within bounds; compared with the topology without a panic.
                let mut c = sopa_controller::cabling::Cabling::default();
                c.set("e0", sopa_channel::proto::Role::Switch, &r);
                let t = &c.tables()[0];
                assert!(t.ports.len() <= sopa_controller::cabling::MAX_PORTS);
                let _ = c.mismatches(topo);
                let _ = sopa_controller::cabling::miscabled_links(topo, "e0", &t.ports);
            }
            Some(agent_message::Kind::PinAck(mut ack)) => {
                ack.error = bounded(&ack.error, MAX_TEXT_BYTES);
                Scheduler::new(HederaConfig::default()).pin_ack("h0", &ack);
            }
            Some(agent_message::Kind::Paths(r)) => {
                // As sent, and numbered by the controller's clock (past the clock's check).
                paths(b, r.clone());
                paths(
                    b,
                    PathReport {
                        period_ms: 250,
                        epoch_ns: 0,
                        period: r.period % 1_000_000,
                        ..r
                    },
                );
            }
            Some(agent_message::Kind::Heartbeat(_)) | None => {}
        }
    }
    if let Ok(m) = ControllerMessage::decode(data) {
        match m.kind {
            Some(controller_message::Kind::Snapshot(s)) => {
                let _ = FabricView::from_snapshot(&s);
            }
            Some(controller_message::Kind::Delta(d)) => {
                let mut view = FabricView::from_snapshot(&b.snapshot).unwrap();
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
