//! The Hedera baseline (Al-Fares et al., NSDI 2010) as the SOPA paper compares against it: host
//! agents report their elephants (flows at 10% of the NIC rate or more) every scheduling
//! interval; the controller estimates their natural demands ([`demand`]), places each new one
//! with Global First Fit ([`gff`]) and pushes per-flow pins to the source agents. Every other
//! flow keeps the 5-tuple hash, the ECMP behaviour Hedera starts from.

pub mod demand;
pub mod gff;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use gff::{Directed, Reservations};
use sopa_topology::{
    NodeKind, Topology,
    graph::NodeId,
    paths::{Failures, Hops},
};

use sopa_channel::proto::{
    Elephant, FiveTuple, FlowPin, FlowReport, HederaAgent, HederaStatusReply, MAX_FLOWS, PinAck,
    PinSet,
};

#[derive(Clone, Copy, Debug)]
pub struct HederaConfig {
    /// The scheduling interval (Hedera used 5 s; agents report every second by default).
    pub interval: Duration,
    /// How long a pushed pin holds without a newer pin set.
    pub pin_lifetime: Duration,
    /// The elephant threshold, as a fraction of the sender's NIC rate.
    pub threshold: f64,
}

impl Default for HederaConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            pin_lifetime: Duration::from_secs(5),
            threshold: 0.1,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReportError {
    #[error("flow report from {0:?}, which is not a host of the topology")]
    NotAHost(String),
    #[error("flow report: interval_ms and nic_bps must be positive")]
    BadUnits,
    #[error("flow report: {0} flows is more than the {MAX_FLOWS} a report may carry")]
    TooMany(usize),
    #[error("flow report: sample {0} has no 5-tuple")]
    NoFlow(usize),
    #[error("flow report: flow {0} has protocol {1}, not TCP (6) or UDP (17)")]
    Protocol(String, u32),
    #[error("flow report: flow {0} does not start at the reporting host {1}")]
    NotFromReporter(String, Ipv4Addr),
    #[error("flow report: flow {0} goes to {1}, which is not another host of the topology")]
    UnknownDestination(String, Ipv4Addr),
    #[error("flow report: flow {0} has a port above 65535")]
    Port(String),
    #[error("flow report: flow {0} appears twice")]
    Duplicate(String),
}

struct Report {
    at: Instant,
    nic_bps: u64,
    flows: Vec<(FiveTuple, u64)>,
}

#[derive(Clone, Debug)]
struct Placement {
    src: NodeId,
    hops: Hops,
    links: Vec<Directed>,
    demand: f64,
    since: u64,
}

#[derive(Clone, Debug, Default)]
struct AgentCounters {
    reports: u64,
    reports_refused: u64,
    pins_refused: u64,
    last_error: String,
}

/// The scheduler's whole state: the latest report of every agent, the placements and their
/// reservations.
pub struct Scheduler {
    pub config: HederaConfig,
    round: u64,
    reports: BTreeMap<String, Report>,
    agents: BTreeMap<String, AgentCounters>,
    placements: BTreeMap<FiveTuple, Placement>,
    last: Vec<Elephant>,
}

impl Scheduler {
    pub fn new(config: HederaConfig) -> Self {
        Self {
            config,
            round: 0,
            reports: BTreeMap::new(),
            agents: BTreeMap::new(),
            placements: BTreeMap::new(),
            last: Vec::new(),
        }
    }

    /// Takes `node`'s report whole, or refuses it whole (counted) and changes nothing else.
    pub fn accept_report(
        &mut self,
        topo: &Topology,
        node: &str,
        report: &FlowReport,
        now: Instant,
    ) -> Result<(), ReportError> {
        let result = check_report(topo, node, report);
        let counters = self.agents.entry(node.to_owned()).or_default();
        match result {
            Ok(flows) => {
                counters.reports += 1;
                self.reports.insert(
                    node.to_owned(),
                    Report {
                        at: now,
                        nic_bps: report.nic_bps,
                        flows,
                    },
                );
                Ok(())
            }
            Err(e) => {
                counters.reports_refused += 1;
                counters.last_error = e.to_string();
                Err(e)
            }
        }
    }

    pub fn pin_ack(&mut self, node: &str, ack: &PinAck) {
        if !ack.error.is_empty() {
            let c = self.agents.entry(node.to_owned()).or_default();
            c.pins_refused += 1;
            c.last_error = format!("round {}: {}", ack.round, ack.error);
        }
    }

    /// One scheduling round: elephants from the reports of the last three intervals, their
    /// demands, placements kept while their flow stays an elephant on a live path, new ones by
    /// Global First Fit. Returns the pin set of every agent that reports.
    pub fn round(
        &mut self,
        topo: &Topology,
        failures: &Failures,
        now: Instant,
    ) -> BTreeMap<String, PinSet> {
        self.round += 1;
        let stale = self.config.interval * 3;
        self.reports
            .retain(|_, r| now.saturating_duration_since(r.at) <= stale);
        let g = topo.graph();

        // Elephants, in a stable order: by reporting node, then 5-tuple.
        let mut elephants: Vec<(FiveTuple, NodeId, NodeId, f64)> = Vec::new();
        for (node, r) in &self.reports {
            let Some(src) = g.find(node) else { continue };
            for (t, rate) in &r.flows {
                let measured = *rate as f64 / r.nic_bps as f64;
                if measured < self.config.threshold {
                    continue;
                }
                let Some(dst) = topo.host_by_addr(Ipv4Addr::from(t.daddr)) else {
                    continue;
                };
                elephants.push((*t, src, dst, measured));
            }
        }
        let demands = demand::estimate(
            &elephants
                .iter()
                .map(|(_, s, d, _)| (*s, *d))
                .collect::<Vec<_>>(),
        );
        let live: BTreeMap<FiveTuple, f64> = elephants
            .iter()
            .zip(&demands)
            .map(|(e, d)| (e.0, *d))
            .collect();

        // Reservations end when a flow ends, goes quiet or loses its path.
        self.placements.retain(|t, p| {
            live.contains_key(t) && p.links.iter().all(|(l, _)| failures.usable(g, *l))
        });
        let mut reserved = Reservations::default();
        for (t, p) in self.placements.iter_mut() {
            p.demand = live[t];
            reserved.reserve(&p.links, p.demand);
        }
        for ((t, src, dst, _), d) in elephants.iter().zip(&demands) {
            if self.placements.contains_key(t) {
                continue;
            }
            let routes = gff::routes(topo, failures, *src, *dst);
            if let Some(i) = gff::first_fit(topo, &routes, *d, &reserved) {
                reserved.reserve(&routes[i].links, *d);
                self.placements.insert(
                    *t,
                    Placement {
                        src: *src,
                        hops: routes[i].hops,
                        links: routes[i].links.clone(),
                        demand: *d,
                        since: self.round,
                    },
                );
            }
        }

        self.last = elephants
            .iter()
            .zip(&demands)
            .map(|((t, src, dst, measured), d)| {
                let p = self.placements.get(t);
                Elephant {
                    flow: Some(*t),
                    src: g.name(*src).to_owned(),
                    dst: g.name(*dst).to_owned(),
                    measured: *measured,
                    demand: *d,
                    placed: p.is_some(),
                    hop0: p.map_or(0, |p| u32::from(p.hops.hop0)),
                    hop1: p.map_or(0, |p| u32::from(p.hops.hop1)),
                    path: p.map_or_else(String::new, |p| path_name(topo, p.src, &p.links)),
                    since_round: p.map_or(0, |p| p.since),
                }
            })
            .collect();

        let lifetime_ms = self.config.pin_lifetime.as_millis().min(u32::MAX as u128) as u32;
        let mut sets: BTreeMap<String, PinSet> = self
            .reports
            .keys()
            .map(|n| {
                (
                    n.clone(),
                    PinSet {
                        round: self.round,
                        lifetime_ms,
                        pins: Vec::new(),
                    },
                )
            })
            .collect();
        for (t, p) in &self.placements {
            if let Some(set) = sets.get_mut(g.name(p.src)) {
                set.pins.push(FlowPin {
                    flow: Some(*t),
                    hop0: u32::from(p.hops.hop0),
                    hop1: u32::from(p.hops.hop1),
                });
            }
        }
        sets
    }

    pub fn status(&self) -> HederaStatusReply {
        HederaStatusReply {
            round: self.round,
            interval_ms: self.config.interval.as_millis().min(u32::MAX as u128) as u32,
            elephants: self.last.clone(),
            agents: self
                .agents
                .iter()
                .map(|(node, c)| HederaAgent {
                    node: node.clone(),
                    reports: c.reports,
                    reports_refused: c.reports_refused,
                    pins_refused: c.pins_refused,
                    last_error: c.last_error.clone(),
                })
                .collect(),
        }
    }
}

/// The switches a placed path crosses, e.g. "e0 a0 c0 a2 e2".
fn path_name(topo: &Topology, src: NodeId, links: &[Directed]) -> String {
    let g = topo.graph();
    let mut at = src;
    let mut names = Vec::new();
    for (l, _) in links {
        at = g.links[*l as usize].other(at);
        if g.node(at).kind != NodeKind::Host {
            names.push(g.name(at).to_owned());
        }
    }
    names.join(" ")
}

fn check_report(
    topo: &Topology,
    node: &str,
    report: &FlowReport,
) -> Result<Vec<(FiveTuple, u64)>, ReportError> {
    let g = topo.graph();
    let src = g
        .find(node)
        .filter(|n| g.node(*n).kind == NodeKind::Host)
        .ok_or_else(|| ReportError::NotAHost(node.to_owned()))?;
    let src_addr = g.node(src).addr.expect("hosts have addresses");
    if report.interval_ms == 0 || report.nic_bps == 0 {
        return Err(ReportError::BadUnits);
    }
    if report.flows.len() > MAX_FLOWS {
        return Err(ReportError::TooMany(report.flows.len()));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(report.flows.len());
    for (i, s) in report.flows.iter().enumerate() {
        let t = s.flow.ok_or(ReportError::NoFlow(i))?;
        let name = t.name();
        if t.proto != 6 && t.proto != 17 {
            return Err(ReportError::Protocol(name, t.proto));
        }
        if t.sport > 0xFFFF || t.dport > 0xFFFF {
            return Err(ReportError::Port(name));
        }
        if Ipv4Addr::from(t.saddr) != src_addr {
            return Err(ReportError::NotFromReporter(name, src_addr));
        }
        let daddr = Ipv4Addr::from(t.daddr);
        if topo.host_by_addr(daddr).is_none_or(|d| d == src) {
            return Err(ReportError::UnknownDestination(name, daddr));
        }
        if !seen.insert(t) {
            return Err(ReportError::Duplicate(name));
        }
        out.push((t, s.rate_bps));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use sopa_topology::topology::TopologySpec;

    use super::*;
    use sopa_channel::proto::FlowSample;

    fn ft4() -> Topology {
        Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap()
    }

    fn addr(t: &Topology, host: &str) -> u32 {
        let g = t.graph();
        u32::from(g.node(g.find(host).unwrap()).addr.unwrap())
    }

    fn flow(t: &Topology, src: &str, dst: &str, sport: u32) -> FiveTuple {
        FiveTuple {
            saddr: addr(t, src),
            daddr: addr(t, dst),
            sport,
            dport: 5001,
            proto: 6,
        }
    }

    fn report(flows: &[(FiveTuple, u64)]) -> FlowReport {
        FlowReport {
            interval_ms: 1000,
            nic_bps: 100_000_000,
            flows: flows
                .iter()
                .map(|(f, r)| FlowSample {
                    flow: Some(*f),
                    rate_bps: *r,
                    bytes: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn two_colliding_elephants_are_placed_on_disjoint_paths_and_pinned() {
        let t = ft4();
        let f = Failures::none(t.graph());
        let mut s = Scheduler::new(HederaConfig::default());
        let now = Instant::now();
        let (f1, f2) = (flow(&t, "h0", "h4", 40000), flow(&t, "h2", "h6", 40001));
        s.accept_report(&t, "h0", &report(&[(f1, 50_000_000)]), now)
            .unwrap();
        s.accept_report(&t, "h2", &report(&[(f2, 50_000_000)]), now)
            .unwrap();
        let sets = s.round(&t, &f, now);
        assert_eq!(sets["h0"].pins.len(), 1);
        assert_eq!(sets["h2"].pins.len(), 1);
        let (p1, p2) = (&sets["h0"].pins[0], &sets["h2"].pins[0]);
        assert_eq!((p1.hop0, p1.hop1), (0, 0));
        assert_eq!((p2.hop0, p2.hop1), (0, 1), "the second flow avoids a0-c0");
        let st = s.status();
        assert_eq!(st.elephants.len(), 2);
        assert!(
            st.elephants
                .iter()
                .all(|e| e.placed && (e.demand - 1.0).abs() < 1e-9)
        );
        assert_eq!(st.elephants[0].path, "e0 a0 c0 a2 e2");

        // The next round keeps both placements; when h2's flow goes quiet its pin goes.
        let later = now + Duration::from_millis(1000);
        s.accept_report(&t, "h0", &report(&[(f1, 90_000_000)]), later)
            .unwrap();
        s.accept_report(&t, "h2", &report(&[(f2, 1_000_000)]), later)
            .unwrap();
        let sets = s.round(&t, &f, later);
        assert_eq!(sets["h0"].pins.len(), 1);
        assert!(sets["h2"].pins.is_empty(), "a mouse is not pinned");
        assert_eq!(s.status().elephants.len(), 1);
    }

    #[test]
    fn a_failed_link_releases_and_replaces_a_placement() {
        let t = ft4();
        let mut f = Failures::none(t.graph());
        let mut s = Scheduler::new(HederaConfig::default());
        let now = Instant::now();
        let f1 = flow(&t, "h0", "h4", 40000);
        s.accept_report(&t, "h0", &report(&[(f1, 80_000_000)]), now)
            .unwrap();
        assert_eq!(s.round(&t, &f, now)["h0"].pins[0].hop1, 0);
        f.set_link(t.resolve_link("a0:c0").unwrap(), true);
        let pins = &s.round(&t, &f, now)["h0"].pins;
        assert_eq!((pins[0].hop0, pins[0].hop1), (0, 1));
    }

    #[test]
    fn reports_go_stale_and_their_pins_with_them() {
        let t = ft4();
        let f = Failures::none(t.graph());
        let mut s = Scheduler::new(HederaConfig::default());
        let now = Instant::now();
        let f1 = flow(&t, "h0", "h4", 40000);
        s.accept_report(&t, "h0", &report(&[(f1, 80_000_000)]), now)
            .unwrap();
        assert_eq!(s.round(&t, &f, now).len(), 1);
        let sets = s.round(&t, &f, now + Duration::from_secs(10));
        assert!(sets.is_empty(), "no fresh report: nobody to push to");
        assert!(s.status().elephants.is_empty());
    }

    #[test]
    fn malformed_reports_are_refused_whole_and_counted() {
        let t = ft4();
        let f = Failures::none(t.graph());
        let mut s = Scheduler::new(HederaConfig::default());
        let now = Instant::now();
        let good = flow(&t, "h0", "h4", 40000);
        s.accept_report(&t, "h0", &report(&[(good, 80_000_000)]), now)
            .unwrap();
        let spoofed = flow(&t, "h1", "h4", 40000);
        let mut udp_bad = good;
        udp_bad.proto = 1;
        let mut to_self = good;
        to_self.daddr = good.saddr;
        let mut outside = good;
        outside.daddr = u32::from(Ipv4Addr::new(192, 0, 2, 1));
        let mut port = good;
        port.sport = 70_000;
        let cases: Vec<(&str, FlowReport, &str)> = vec![
            (
                "h0",
                report(&[(good, 1), (spoofed, 1)]),
                "does not start at",
            ),
            ("h0", report(&[(udp_bad, 1)]), "protocol 1"),
            ("h0", report(&[(to_self, 1)]), "not another host"),
            ("h0", report(&[(outside, 1)]), "192.0.2.1"),
            ("h0", report(&[(port, 1)]), "port above"),
            ("h0", report(&[(good, 1), (good, 2)]), "twice"),
            ("e0", report(&[(good, 1)]), "not a host"),
            (
                "h0",
                FlowReport {
                    nic_bps: 0,
                    ..report(&[])
                },
                "positive",
            ),
            (
                "h0",
                FlowReport {
                    flows: vec![FlowSample::default()],
                    ..report(&[])
                },
                "no 5-tuple",
            ),
        ];
        for (node, r, needle) in cases {
            let e = s.accept_report(&t, node, &r, now).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        // The good report still stands: the refused ones changed nothing.
        let sets = s.round(&t, &f, now);
        assert_eq!(sets["h0"].pins.len(), 1);
        let st = s.status();
        let h0 = st.agents.iter().find(|a| a.node == "h0").unwrap();
        assert_eq!((h0.reports, h0.reports_refused), (1, 8));
    }
}
