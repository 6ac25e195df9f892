//! A switch's own reaction to ports it sees lose their carrier, computed without the controller
//! (which may be far away, or unreachable) and installed in `tc_forward` in the time a netlink
//! event takes to arrive.
//!
//! Two kinds of local repair, both checked by simulating how the rest of the fabric forwards
//! the packet (every other switch's decisions and kernel routes as it has them, under the
//! failures the controller has published; this switch's dead ports unknown to them):
//! - **Substitution**: a decision whose hop value names a dead uplink sends that value's
//!   packets out of the next live uplink (in hop order) from which the destination is reached.
//! - **Detour**: a destination whose every next hop here is dead (a core switch that lost its
//!   link down into a pod) leaves by another port, the hop byte the next switch decides by
//!   rewritten so the packet comes back down by another way (Fat-Tree: core -> an aggregation
//!   switch of another pod -> another core -> the pod; F10's local rerouting, on a plain
//!   Fat-Tree). A detoured packet is marked (the high bit of the first hop byte) and is never
//!   detoured twice: two failures that would bounce it between them cost the packet, not a loop.
//!   A destination no detour reaches is dropped here ([`Reaction::unreachable`]) rather than
//!   handed to the kernel, whose route around the failure leads into other switches' decisions,
//!   which would send it back.

use std::collections::{BTreeSet, HashMap};

use crate::{
    forwarding::{self, Decision},
    graph::{LinkId, NodeId, NodeKind},
    paths::Failures,
    prefix::Prefix,
    topology::{Rack, Topology},
};

/// Where a destination's packets leave when every next hop of this switch towards it is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detour {
    pub prefix: Prefix,
    /// The live port the packets leave by.
    pub link: LinkId,
    /// Hop byte (1 or 2) and value written into the packet so the next switch sends it on by a
    /// way that reaches the destination; `None`: the next switch routes it by destination.
    pub rewrite: Option<(u8, u8)>,
}

/// Switch `me`'s forwarding with its ports on `dead` gone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reaction {
    /// The plan's decisions, every hop value on a dead uplink moved to a live one that reaches
    /// the destination (a value with none keeps its dead uplink: those packets are lost).
    pub decisions: Vec<Decision>,
    pub detours: Vec<Detour>,
    /// Hop values moved to another uplink, over all decisions.
    pub substituted: usize,
    /// Destinations whose every next hop here is dead and that no detour reaches: their packets
    /// are dropped here.
    pub unreachable: Vec<Prefix>,
}

/// Mark of a detoured packet, as `tc_forward` sets it.
pub use sopa_common::maps::fwd_kind::DETOURED;

/// A bound on the forwarding simulated per candidate (ECMP and unknown hop bytes branch).
const STEP_BUDGET: usize = 4096;

/// The reaction of switch `me` to its ports on `dead` (links), the controller's `failures` as
/// every other switch has them (links the controller lists as failed are never a repair's way).
/// With `dead` empty, the plan's decisions unchanged.
pub fn react(
    topo: &Topology,
    me: NodeId,
    failures: &Failures,
    dead: &BTreeSet<LinkId>,
) -> Reaction {
    // The routes as a packet arriving here expects them: the hosts chose this switch by the
    // fabric's paths, so what matters is whether the way down those paths take from here is
    // dead, even once the controller lists it (a host that has not applied, or cannot reach,
    // the controller's change still sends by it); the kernel's route under the failures may go
    // around, through other switches whose decisions would send an option-carrying packet back.
    let plan = forwarding::plan(topo, me);
    let mut out = Reaction {
        decisions: plan.decisions.clone(),
        ..Reaction::default()
    };
    if dead.is_empty() {
        return out;
    }
    let g = topo.graph();
    let racks = topo.racks();
    let mut sim = Sim::new(topo, failures, dead, me);
    for (d, rack) in out.decisions.iter_mut().filter_map(|d| {
        let rack = racks.iter().find(|r| r.prefix == d.prefix)?;
        Some((d, rack))
    }) {
        let original = d.uplinks.clone();
        for v in 0..original.len() {
            if !dead.contains(&original[v]) {
                continue;
            }
            let mut bytes = [None, None];
            bytes[usize::from(d.hop_byte - 1) & 1] = Some(v as u8);
            let substitute = (1..original.len())
                .map(|i| original[(v + i) % original.len()])
                .find(|l| {
                    !dead.contains(l) && failures.usable(g, *l) && sim.reaches_over(*l, rack, bytes)
                });
            if let Some(l) = substitute {
                d.uplinks[v] = l;
                out.substituted += 1;
            }
        }
    }
    // Destinations routed by the kernel here (no decision) whose every next hop is dead.
    let decided: BTreeSet<Prefix> = plan.decisions.iter().map(|d| d.prefix).collect();
    let live_ports: Vec<(LinkId, NodeId)> = g
        .ports(me)
        .iter()
        .copied()
        .filter(|(l, n)| !dead.contains(l) && failures.usable(g, *l) && g.node(*n).kind.is_switch())
        .collect();
    for (i, route) in plan.routes.iter().enumerate() {
        if decided.contains(&route.prefix)
            || route.prefix.len == 32
            || route.links.iter().any(|l| !dead.contains(l))
        {
            continue;
        }
        let Some(rack) = racks.iter().find(|r| r.prefix == route.prefix) else {
            continue;
        };
        // Spread the detoured destinations over the live ports, starting one further each.
        let n = live_ports.len();
        let found = (0..n)
            .map(|j| live_ports[(i + j) % n])
            .find_map(|(link, next)| sim.detour_via(link, next, rack, i));
        match found {
            Some(d) => out.detours.push(d),
            None => out.unreachable.push(route.prefix),
        }
    }
    out
}

/// Forwarding of the rest of the fabric, as seen from `me`.
struct Sim<'a> {
    topo: &'a Topology,
    failures: &'a Failures,
    dead: &'a BTreeSet<LinkId>,
    me: NodeId,
    /// Per rack switch: hop counts to it over the controller's usable links.
    dist: HashMap<NodeId, Vec<u32>>,
    steps: usize,
}

impl<'a> Sim<'a> {
    fn new(
        topo: &'a Topology,
        failures: &'a Failures,
        dead: &'a BTreeSet<LinkId>,
        me: NodeId,
    ) -> Self {
        Self {
            topo,
            failures,
            dead,
            me,
            dist: HashMap::new(),
            steps: 0,
        }
    }

    /// A detour for `rack` leaving by `link` to switch `next`: rewriting the hop byte `next`
    /// decides by (each value, starting at `offset`), or none if `next` routes by destination.
    fn detour_via(
        &mut self,
        link: LinkId,
        next: NodeId,
        rack: &Rack,
        offset: usize,
    ) -> Option<Detour> {
        match forwarding::decision_for(self.topo, next, rack) {
            Some(d) => {
                let n = d.uplinks.len();
                (0..n).map(|j| ((offset + j) % n) as u8).find_map(|v| {
                    let mut bytes = [None, None];
                    bytes[usize::from(d.hop_byte - 1) & 1] = Some(v);
                    self.reaches_over(link, rack, bytes).then_some(Detour {
                        prefix: rack.prefix,
                        link,
                        rewrite: Some((d.hop_byte, v)),
                    })
                })
            }
            None => self
                .reaches_over(link, rack, [None, None])
                .then_some(Detour {
                    prefix: rack.prefix,
                    link,
                    rewrite: None,
                }),
        }
    }

    /// Whether a packet for `rack` that leaves `me` over `link`, carrying hop bytes `bytes`
    /// (`None`: any value), reaches the rack's switch whichever way each switch sends it.
    fn reaches_over(&mut self, link: LinkId, rack: &Rack, bytes: [Option<u8>; 2]) -> bool {
        self.steps = 0;
        let next = self.topo.graph().links[link as usize].other(self.me);
        let mut visited = vec![self.me];
        self.reaches(next, rack, bytes, &mut visited)
    }

    fn reaches(
        &mut self,
        at: NodeId,
        rack: &Rack,
        bytes: [Option<u8>; 2],
        visited: &mut Vec<NodeId>,
    ) -> bool {
        self.steps += 1;
        let g = self.topo.graph();
        if at == rack.tor {
            return true;
        }
        if self.steps > STEP_BUDGET || visited.contains(&at) || !g.node(at).kind.is_switch() {
            return false;
        }
        let next: Vec<LinkId> = match forwarding::decision_for(self.topo, at, rack) {
            Some(d) => match bytes[usize::from(d.hop_byte - 1) & 1] {
                Some(v) => match d.uplinks.get(usize::from(v)) {
                    Some(l) => vec![*l],
                    None => return false,
                },
                None => d.uplinks.clone(),
            },
            None => self.kernel_next(at, rack),
        };
        if next.is_empty() {
            return false;
        }
        visited.push(at);
        let ok = next.iter().all(|l| {
            !self.dead.contains(l)
                && self.failures.usable(g, *l)
                && self.reaches(g.links[*l as usize].other(at), rack, bytes, visited)
        });
        visited.pop();
        ok
    }

    /// The links switch `at`'s kernel route for `rack` uses (its live shortest next hops).
    fn kernel_next(&mut self, at: NodeId, rack: &Rack) -> Vec<LinkId> {
        let g = self.topo.graph();
        let dist = self
            .dist
            .entry(rack.tor)
            .or_insert_with(|| forwarding::distances(self.topo, rack.tor, self.failures));
        let here = dist[at as usize];
        if here == u32::MAX {
            return Vec::new();
        }
        g.ports(at)
            .iter()
            .filter(|(l, n)| {
                g.node(*n).kind.is_switch()
                    && g.node(*n).kind != NodeKind::Host
                    && self.failures.usable(g, *l)
                    && dist[*n as usize].checked_add(1) == Some(here)
            })
            .map(|(l, _)| *l)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{modric::ModricParams, topology::TopologySpec};

    fn fat_tree() -> Topology {
        Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap()
    }

    fn link(topo: &Topology, a: &str, b: &str) -> LinkId {
        let g = topo.graph();
        let (a, b) = (g.find(a).unwrap(), g.find(b).unwrap());
        g.ports(a).iter().find(|(_, n)| *n == b).unwrap().0
    }

    /// Follows a packet from `me` for `dst` (an address) through the whole fabric with every
    /// switch's plan and `me`'s reaction, hop bytes `bytes`; returns the switches it crosses.
    fn walk(
        topo: &Topology,
        plans: &std::collections::BTreeMap<NodeId, forwarding::SwitchPlan>,
        me: &str,
        r: &Reaction,
        dst: std::net::Ipv4Addr,
        mut bytes: [u8; 2],
        dead: &BTreeSet<LinkId>,
    ) -> Option<Vec<String>> {
        let g = topo.graph();
        let rack = topo
            .racks()
            .into_iter()
            .find(|r| r.prefix.contains_addr(dst))
            .unwrap();
        let me = g.find(me).unwrap();
        let mut at = me;
        let mut path = vec![g.name(at).to_owned()];
        for _ in 0..16 {
            if at == rack.tor {
                return Some(path);
            }
            let plan = &plans[&at];
            let decisions = if at == me {
                &r.decisions
            } else {
                &plan.decisions
            };
            let link = if let Some(d) = (at == me)
                .then(|| r.detours.iter().find(|d| d.prefix == rack.prefix))
                .flatten()
            {
                if bytes[0] & DETOURED != 0 {
                    return None;
                }
                if let Some((b, v)) = d.rewrite {
                    bytes[usize::from(b - 1)] = v;
                }
                bytes[0] |= DETOURED;
                d.link
            } else if (at == me) && r.unreachable.contains(&rack.prefix) {
                return None;
            } else if let Some(d) = decisions.iter().find(|d| d.prefix.contains_addr(dst)) {
                let hop = match d.hop_byte {
                    1 => bytes[0] & !DETOURED,
                    _ => bytes[1],
                };
                *d.uplinks.get(usize::from(hop))?
            } else {
                let route = plan.routes.iter().find(|x| x.prefix.contains_addr(dst))?;
                // Any of them: take the first live one (the kernel skips dead next hops).
                *route.links.iter().find(|l| !dead.contains(l))?
            };
            if dead.contains(&link) {
                return None;
            }
            at = g.links[link as usize].other(at);
            path.push(g.name(at).to_owned());
        }
        None
    }

    #[test]
    fn no_dead_port_changes_nothing() {
        let t = fat_tree();
        let g = t.graph();
        let a0 = g.find("a0").unwrap();
        let r = react(&t, a0, &Failures::none(g), &BTreeSet::new());
        assert_eq!(r.decisions, forwarding::plan(&t, a0).decisions);
        assert!(r.detours.is_empty());
    }

    #[test]
    fn an_aggregation_switch_moves_a_dead_core_uplinks_values_to_the_live_one() {
        let t = fat_tree();
        let g = t.graph();
        let a0 = g.find("a0").unwrap();
        let dead = BTreeSet::from([link(&t, "a0", "c0")]);
        let r = react(&t, a0, &Failures::none(g), &dead);
        let c1 = link(&t, "a0", "c1");
        // Every remote pod's decision: both hop values now leave towards c1.
        assert_eq!(r.decisions.len(), forwarding::plan(&t, a0).decisions.len());
        for d in &r.decisions {
            assert_eq!(d.uplinks, vec![c1, c1], "{}", d.prefix);
        }
        assert_eq!(r.substituted, r.decisions.len());
        assert!(r.detours.is_empty() && r.unreachable.is_empty());
    }

    #[test]
    fn a_core_switch_that_lost_a_pod_detours_through_another_pod_and_core() {
        let t = fat_tree();
        let g = t.graph();
        let c0 = g.find("c0").unwrap();
        let dead = BTreeSet::from([link(&t, "c0", "a0")]);
        let r = react(&t, c0, &Failures::none(g), &dead);
        // Pod 0's two racks, each through an aggregation switch of another pod.
        assert_eq!(r.detours.len(), 2, "{r:?}");
        assert!(r.unreachable.is_empty());
        let vias: BTreeSet<LinkId> = r.detours.iter().map(|d| d.link).collect();
        assert_eq!(vias.len(), 2, "spread over two ports: {r:?}");
        for h in ["10.0.0.2", "10.0.1.3"] {
            let path = walk(
                &t,
                &forwarding::plans(&t),
                "c0",
                &r,
                h.parse().unwrap(),
                [0, 0],
                &dead,
            )
            .unwrap();
            assert_eq!(path.len(), 5, "{h}: {path:?}");
            assert!(path[1].starts_with('a') && path[1] != "a0", "{h}: {path:?}");
            assert_eq!(path[2], "c1", "{h}: back up by the other core: {path:?}");
            assert_eq!(path[3], "a0", "{h}: {path:?}");
        }
    }

    #[test]
    fn the_detours_stay_once_the_controller_lists_the_dead_link() {
        let t = fat_tree();
        let g = t.graph();
        let c0 = g.find("c0").unwrap();
        let l = link(&t, "c0", "a0");
        let dead = BTreeSet::from([l]);
        let alone = react(&t, c0, &Failures::none(g), &dead);
        let mut known = Failures::none(g);
        known.set_link(l, true);
        let listed = react(&t, c0, &known, &dead);
        assert_eq!(listed.detours.len(), 2, "{listed:?}");
        // Still down by another pod and c1, which the listed failure leaves alive.
        for d in &listed.detours {
            assert!(
                alone.detours.iter().any(|x| x.prefix == d.prefix),
                "{listed:?}"
            );
        }
    }

    #[test]
    fn an_aggregation_switch_that_lost_an_edge_detours_through_its_sibling() {
        let t = fat_tree();
        let g = t.graph();
        let a0 = g.find("a0").unwrap();
        let dead = BTreeSet::from([link(&t, "a0", "e0")]);
        let r = react(&t, a0, &Failures::none(g), &dead);
        assert_eq!(r.detours.len(), 1, "{r:?}");
        let path = walk(
            &t,
            &forwarding::plans(&t),
            "a0",
            &r,
            "10.0.0.2".parse().unwrap(),
            [1, 1],
            &dead,
        )
        .unwrap();
        assert_eq!(path, ["a0", "e1", "a1", "e0"]);
    }

    #[test]
    fn a_second_detour_is_refused_instead_of_looping() {
        let t = fat_tree();
        let g = t.graph();
        let c0 = g.find("c0").unwrap();
        let dead = BTreeSet::from([link(&t, "c0", "a0")]);
        let r = react(&t, c0, &Failures::none(g), &dead);
        assert!(
            walk(
                &t,
                &forwarding::plans(&t),
                "c0",
                &r,
                "10.0.0.2".parse().unwrap(),
                [DETOURED, 0],
                &dead
            )
            .is_none()
        );
    }

    #[test]
    fn a_switch_cut_off_from_every_way_reports_the_destinations() {
        let t = fat_tree();
        let g = t.graph();
        let e0 = g.find("e0").unwrap();
        let dead = BTreeSet::from([link(&t, "e0", "a0"), link(&t, "e0", "a1")]);
        let r = react(&t, e0, &Failures::none(g), &dead);
        // Its decisions keep their dead uplinks (nothing else to use), nothing to detour by.
        assert_eq!(r.substituted, 0);
        assert!(r.detours.is_empty());
    }

    #[test]
    fn every_single_port_loss_in_both_topologies_leaves_every_destination_reachable() {
        let specs = [
            TopologySpec::FatTree { k: 4 },
            TopologySpec::FatTree { k: 6 },
            TopologySpec::Modric(ModricParams::new(2, 2, 1, 2, 2)),
        ];
        for spec in specs {
            let t = Topology::build(&spec).unwrap();
            let g = t.graph();
            let none = Failures::none(g);
            let plans = forwarding::plans(&t);
            let racks: Vec<(Rack, [u8; 2])> = t
                .racks()
                .into_iter()
                .map(|r| {
                    let w = widths(&plans, &r);
                    (r, w)
                })
                .collect();
            for me in (0..g.nodes.len() as NodeId).filter(|n| g.node(*n).kind.is_switch()) {
                for &(l, peer) in g.ports(me) {
                    if !g.node(peer).kind.is_switch() {
                        continue;
                    }
                    let dead = BTreeSet::from([l]);
                    let r = react(&t, me, &none, &dead);
                    assert!(
                        r.unreachable.is_empty(),
                        "{}: {} losing {}: {:?}",
                        t.name(),
                        g.name(me),
                        g.link_name(l),
                        r.unreachable
                    );
                    for (rack, widths) in racks.iter().filter(|(r, _)| r.tor != me) {
                        let dst = std::net::Ipv4Addr::from(u32::from(rack.prefix.addr) + 2);
                        // Every hop value the decisions on the way can take.
                        for b0 in 0..widths[0] {
                            // With no decision on the second byte, it is "none" (0xFF) in the packet.
                            let second: Vec<u8> = if widths[1] == 1 {
                                vec![0, sopa_common::wire::HOP_NONE]
                            } else {
                                (0..widths[1]).collect()
                            };
                            for b1 in second {
                                let path = walk(&t, &plans, g.name(me), &r, dst, [b0, b1], &dead);
                                assert!(
                                    path.is_some(),
                                    "{}: {} losing {}: {dst} hops {b0},{b1} lost",
                                    t.name(),
                                    g.name(me),
                                    g.link_name(l),
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// How many values each hop byte takes in the decisions of any switch for `rack`.
    fn widths(
        plans: &std::collections::BTreeMap<NodeId, forwarding::SwitchPlan>,
        rack: &Rack,
    ) -> [u8; 2] {
        let mut w = [1, 1];
        for d in plans.values().flat_map(|p| &p.decisions) {
            if d.prefix == rack.prefix {
                let b = &mut w[usize::from(d.hop_byte - 1)];
                *b = (*b).max(d.uplinks.len() as u8);
            }
        }
        w
    }
}
