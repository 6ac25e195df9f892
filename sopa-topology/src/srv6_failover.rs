//! A switch's own repair of SRv6 uSID lists around its dead ports, computed without the
//! controller and installed in `tc_forward`'s uSID rules in the time a netlink event takes.
//!
//! In the SRv6 encoding a list names switches (`crate::srv6`): the sender's rack switch routes
//! the first uSID's locator, each named switch consumes its own uSID (End, NEXT-C-SID) and
//! routes the next one. A switch whose way to the next uSID is dead cannot just use another
//! port, as `tc_forward` does with a hop byte: the next switch would still be told to go on to
//! the one behind the dead link. The repair rewrites the list instead, keyed by the uSID the
//! switch is about to route (`next`) and the one after it (`after`, 0 when that is a host's
//! local uSID):
//! - **Substitution**: `next` replaced by a live neighbour (an aggregation switch that lost a
//!   core uplink sends to the other core, which reaches the same pods), or `next` and `after`
//!   replaced by a live neighbour and one of its neighbours (a rack switch that lost an uplink
//!   names the other aggregation switch and one of that switch's cores).
//! - **Detour**: two uSIDs inserted before `next` (a core switch that lost its link down into a
//!   pod goes through another pod's aggregation switch and another core; an aggregation switch
//!   that lost a rack switch goes through a sibling rack and the other aggregation switch). A
//!   detoured packet is marked ([`sopa_common::srv6::FLOW_LABEL_DETOURED`]) and never detoured
//!   twice: two failures that would bounce it between them cost the packet, not a loop.
//!
//! Every rule is checked by walking the rewritten list through the fabric as its switches route
//! it (their SRv6 routes under the controller's failures), for every list that reaches this
//! switch and needs the rule: it must arrive at the destination host without coming back here.
//! A route with a dead next hop counts as dead, here and in the walk: the kernel keeps an IPv6
//! next hop whose carrier is gone and goes on hashing packets onto it (the switch cannot set
//! `ignore_routes_with_linkdown` for IPv6, which would also skip its End locator's route, anchored
//! on a port). Of the
//! rules that do, the shortest walks are kept, and lists that differ in `after` are spread over
//! them. A list no rule gets around is left as it is (its packets are lost at the dead port, as
//! before).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sopa_common::srv6::{LIB_BASE, USID_SLOTS};

use crate::{
    LinkId, NodeId, NodeKind, Result, Topology,
    paths::{Failures, PathTable},
    srv6::{Srv6Route, Usids, host_plan, local_usid, switch_routes},
};

/// One rewrite: at the switch, a list whose next uSID is `next`, followed by `after` (0: a host's
/// local uSID, or nothing), has its `replace` uSIDs from `next` on replaced by `with`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub next: u16,
    pub after: u16,
    pub replace: u8,
    pub with: Vec<u16>,
    /// The packet goes back up before it goes on: marked, and refused a second detour.
    pub detour: bool,
}

/// Switch `me`'s uSID rules for its ports on `dead`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reaction {
    pub rules: Vec<Rule>,
    /// Keys (next, after) of lists that need a repair here and that no rule gets around.
    pub unrepaired: Vec<(u16, u16)>,
}

impl Reaction {
    pub fn substituted(&self) -> usize {
        self.rules.iter().filter(|r| !r.detour).count()
    }

    pub fn detours(&self) -> usize {
        self.rules.iter().filter(|r| r.detour).count()
    }
}

/// One switch's SRv6 forwarding as the walk needs it.
#[derive(Clone, Debug, Default)]
struct Table {
    own: u16,
    locators: HashMap<u16, Vec<LinkId>>,
    /// Local uSID of a host behind this rack switch -> its link.
    hosts: HashMap<u16, LinkId>,
}

/// The longest walk: a detour makes a path of at most 9 switches.
const MAX_DEPTH: usize = 12;
/// A bound on the steps of one walk (multipath routes branch).
const STEP_BUDGET: usize = 4096;

/// What switch `me` needs to react to its dead ports: every switch's routes under the
/// controller's failures, and the lists that reach `me`. Built when a plan is installed (or
/// the controller's failures change), so that a port event only chooses rules.
#[derive(Clone, Debug)]
pub struct Plan {
    me: NodeId,
    failures: Failures,
    tables: Vec<Option<Table>>,
    /// This switch's routes as the packets that reach it expect them (no failure known).
    expected: Table,
    /// Every list that reaches `me`, as it arrives.
    arrivals: BTreeSet<Vec<u16>>,
}

impl Plan {
    pub fn new(topo: &Topology, me: NodeId, failures: &Failures) -> Result<Self> {
        let g = topo.graph();
        let usids = Usids::of(topo)?;
        let table_of = |node: NodeId, failures: &Failures| -> Result<Table> {
            let mut t = Table {
                own: usids.get(node),
                ..Table::default()
            };
            for route in switch_routes(topo, node, failures)? {
                match route {
                    Srv6Route::Locator { usid, links } => {
                        t.locators.insert(usid, links);
                    }
                    Srv6Route::Host { addr, link, .. } => {
                        let lid = u16::from_be_bytes([addr.octets()[6], addr.octets()[7]]);
                        t.hosts.insert(lid, link);
                    }
                    Srv6Route::End { .. } | Srv6Route::Rack6 { .. } => {}
                }
            }
            Ok(t)
        };
        let mut tables = Vec::with_capacity(g.nodes.len());
        for (n, node) in g.nodes.iter().enumerate() {
            tables.push(if node.kind.is_switch() {
                Some(table_of(n as NodeId, failures)?)
            } else {
                None
            });
        }
        let mut plan = Self {
            me,
            failures: failures.clone(),
            expected: table_of(me, &Failures::none(g))?,
            tables,
            arrivals: BTreeSet::new(),
        };
        // One sender per rack: the lists depend on the racks only (and the destination host's
        // local uSID, which only its rack switch reads).
        let dead = |l: LinkId| !failures.usable(g, l);
        let mut arrivals = BTreeSet::new();
        let racks = topo.racks();
        for rack in &racks {
            let Some(src) = first_host(topo, rack.tor) else {
                continue;
            };
            // Every candidate, alive or not: a host that has not applied the controller's
            // change yet still sends by the paths it had.
            let table = PathTable::compute(topo, src, &Failures::none(g))?;
            let hp = host_plan(topo, &table)?;
            for d in &hp.destinations {
                let dst_rack = racks
                    .iter()
                    .find(|r| r.prefix == d.prefix)
                    .expect("a destination is a rack");
                let Some(host) = first_host(topo, dst_rack.tor) else {
                    continue;
                };
                let addr = g.node(host).addr.expect("hosts have addresses");
                let Some(lid) = local_usid(addr, &dst_rack.prefix) else {
                    continue;
                };
                for (_, chosen) in &d.chosen {
                    let list: Vec<u16> = chosen
                        .iter()
                        .chain(&d.tail)
                        .copied()
                        .chain(std::iter::once(lid))
                        .collect();
                    let mut budget = STEP_BUDGET;
                    plan.walk(
                        topo,
                        rack.tor,
                        list,
                        0,
                        &dead,
                        None,
                        true,
                        &mut |at, l| {
                            if at == me {
                                arrivals.insert(l.to_vec());
                            }
                        },
                        &mut budget,
                    );
                }
            }
        }
        plan.arrivals = arrivals;
        Ok(plan)
    }

    pub fn me(&self) -> NodeId {
        self.me
    }

    /// This switch's uSID.
    pub fn usid(&self) -> u16 {
        self.expected.own
    }

    /// Lists that reach this switch.
    pub fn arrivals(&self) -> usize {
        self.arrivals.len()
    }

    /// Walks `list` from switch `at` as the fabric routes it; true when every branch reaches a
    /// host. `visit` sees every switch reached and the list as it arrives there. A branch that
    /// comes back to `avoid` fails. With `all`, every branch is walked even after one failed
    /// (to see every switch a list can reach).
    #[allow(clippy::too_many_arguments)]
    fn walk(
        &self,
        topo: &Topology,
        at: NodeId,
        mut list: Vec<u16>,
        depth: usize,
        dead: &dyn Fn(LinkId) -> bool,
        avoid: Option<NodeId>,
        all: bool,
        visit: &mut dyn FnMut(NodeId, &[u16]),
        budget: &mut usize,
    ) -> bool {
        if *budget == 0 || depth > MAX_DEPTH {
            return false;
        }
        *budget -= 1;
        let Some(t) = &self.tables[at as usize] else {
            // A host: delivered.
            return true;
        };
        visit(at, &list);
        if list.len() == 2 && list[0] == t.own && list[1] >= LIB_BASE {
            return t.hosts.get(&list[1]).is_some_and(|l| !dead(*l));
        }
        if list.first() == Some(&t.own) {
            list.remove(0);
        }
        let Some(&next) = list.first() else {
            return false;
        };
        let Some(links) = t.locators.get(&next) else {
            return false;
        };
        let g = topo.graph();
        if links.is_empty() || links.iter().any(|l| dead(*l)) {
            return false;
        }
        let mut ok = true;
        for &link in links {
            let other = g.links[link as usize].other(at);
            if Some(other) == avoid {
                return false;
            }
            if !self.walk(
                topo,
                other,
                list.clone(),
                depth + 1,
                dead,
                avoid,
                all,
                visit,
                budget,
            ) {
                ok = false;
                if !all {
                    break;
                }
            }
        }
        ok
    }

    /// The switches a walk of `list` from `me` visits, over all its branches (what the rules
    /// are ranked by: the fewest), if every branch reaches the destination host without a dead
    /// next hop and never comes back here.
    fn reaches(
        &self,
        topo: &Topology,
        list: Vec<u16>,
        dead: &dyn Fn(LinkId) -> bool,
    ) -> Option<usize> {
        // Coming back here fails the walk itself (`avoid`).
        let mut visited = 0;
        let mut budget = STEP_BUDGET;
        let ok = self.walk(
            topo,
            self.me,
            list,
            0,
            dead,
            Some(self.me),
            false,
            &mut |_, _| visited += 1,
            &mut budget,
        );
        ok.then_some(visited)
    }

    /// The rules for this switch's ports on `dead` (links).
    pub fn react(&self, topo: &Topology, dead: &BTreeSet<LinkId>) -> Reaction {
        let g = topo.graph();
        if dead.is_empty() {
            return Reaction::default();
        }
        let down = |l: LinkId| dead.contains(&l) || !self.failures.usable(g, l);
        // The lists this switch cannot send on, by key.
        let mut broken: BTreeMap<(u16, u16), Vec<&Vec<u16>>> = BTreeMap::new();
        for list in &self.arrivals {
            let p = usize::from(list.first() == Some(&self.expected.own));
            let Some(&next) = list.get(p) else { continue };
            if next >= LIB_BASE {
                // A host behind this rack switch: no other way to it.
                continue;
            }
            let Some(links) = self.expected.locators.get(&next) else {
                continue;
            };
            if !links.iter().any(|l| down(*l)) {
                continue;
            }
            let after = list
                .get(p + 1)
                .copied()
                .filter(|u| *u < LIB_BASE)
                .unwrap_or(0);
            broken.entry((next, after)).or_default().push(list);
        }
        let neighbours: Vec<NodeId> = g
            .ports(self.me)
            .iter()
            .filter(|(l, n)| g.node(*n).kind.is_switch() && !down(*l))
            .map(|(_, n)| *n)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let usid = |n: NodeId| self.tables[n as usize].as_ref().map_or(0, |t| t.own);
        let mut out = Reaction::default();
        for ((next, after), lists) in broken {
            let singles = neighbours.iter().map(|v| vec![usid(*v)]);
            let pairs = || {
                neighbours.iter().flat_map(|v| {
                    g.ports(*v)
                        .iter()
                        .filter(|(_, w)| *w != self.me && g.node(*w).kind.is_switch())
                        .map(|(_, w)| *w)
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .map(move |w| vec![usid(*v), usid(w)])
                })
            };
            let mut classes: Vec<(u8, bool, Vec<Vec<u16>>)> = vec![(1, false, singles.collect())];
            if after != 0 {
                classes.push((2, false, pairs().collect()));
            }
            classes.push((0, true, pairs().collect()));
            let mut chosen = None;
            for (replace, detour, options) in classes {
                let mut valid: Vec<(usize, Vec<u16>)> = options
                    .into_iter()
                    .filter_map(|with| {
                        let mut longest = 0;
                        for list in &lists {
                            let p = usize::from(list.first() == Some(&self.expected.own));
                            let rewritten: Vec<u16> = list[..p]
                                .iter()
                                .chain(&with)
                                .chain(list.get(p + usize::from(replace)..).unwrap_or(&[]))
                                .copied()
                                .collect();
                            if rewritten.len() > USID_SLOTS {
                                return None;
                            }
                            longest = longest.max(self.reaches(topo, rewritten, &down)?);
                        }
                        Some((longest, with))
                    })
                    .collect();
                let Some(shortest) = valid.iter().map(|(n, _)| *n).min() else {
                    continue;
                };
                valid.retain(|(n, _)| *n == shortest);
                let spread = usize::from(if after != 0 { after } else { next });
                let with = valid.swap_remove(spread % valid.len()).1;
                chosen = Some(Rule {
                    next,
                    after,
                    replace,
                    with,
                    detour,
                });
                break;
            }
            match chosen {
                Some(rule) => out.rules.push(rule),
                None => out.unrepaired.push((next, after)),
            }
        }
        out
    }
}

/// The first host behind rack switch `tor`.
fn first_host(topo: &Topology, tor: NodeId) -> Option<NodeId> {
    let g = topo.graph();
    g.ports(tor)
        .iter()
        .map(|(_, n)| *n)
        .find(|n| g.node(*n).kind == NodeKind::Host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySpec;

    fn link(topo: &Topology, a: &str, b: &str) -> LinkId {
        let g = topo.graph();
        g.links_between(g.find(a).unwrap(), g.find(b).unwrap())
            .next()
            .unwrap()
    }

    /// Applies `rules` to `list` as `tc_forward` does at a switch whose uSID is `own`.
    fn apply(rules: &[Rule], own: u16, list: &[u16]) -> Option<(Vec<u16>, bool)> {
        let p = usize::from(list.first() == Some(&own));
        let next = *list.get(p)?;
        let after = list
            .get(p + 1)
            .copied()
            .filter(|u| *u < LIB_BASE)
            .unwrap_or(0);
        let r = rules.iter().find(|r| r.next == next && r.after == after)?;
        let out: Vec<u16> = list[..p]
            .iter()
            .chain(&r.with)
            .chain(&list[p + usize::from(r.replace)..])
            .copied()
            .collect();
        Some((out, r.detour))
    }

    /// Every single dead link of every switch of a fabric: each list that reached the switch by
    /// that link's port is rewritten, and the rewritten list reaches its host around it.
    fn every_single_failure_is_repaired(topo: &Topology, want_unrepaired: usize) {
        let g = topo.graph();
        let mut unrepaired = 0;
        let mut rules = 0;
        for me in (0..g.nodes.len() as NodeId).filter(|n| g.node(*n).kind.is_switch()) {
            let plan = Plan::new(topo, me, &Failures::none(g)).unwrap();
            assert!(plan.arrivals() > 0, "{}", g.name(me));
            for &(l, other) in g.ports(me) {
                if !g.node(other).kind.is_switch() {
                    continue;
                }
                let dead = BTreeSet::from([l]);
                let r = plan.react(topo, &dead);
                unrepaired += r.unrepaired.len();
                rules += r.rules.len();
                let down = |x: LinkId| x == l;
                for list in &plan.arrivals {
                    let Some((rewritten, _)) = apply(&r.rules, plan.expected.own, list) else {
                        continue;
                    };
                    assert!(
                        plan.reaches(topo, rewritten.clone(), &down).is_some(),
                        "{} without {}: {list:?} -> {rewritten:?}",
                        g.name(me),
                        g.link_name(l)
                    );
                }
            }
        }
        assert!(rules > 0);
        assert_eq!(unrepaired, want_unrepaired);
    }

    #[test]
    fn fat_tree_every_single_link_failure_is_repaired_at_both_ends() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        every_single_failure_is_repaired(&topo, 0);
    }

    #[test]
    fn modric_every_single_link_failure_is_repaired_at_both_ends() {
        use crate::modric::ModricParams;
        let topo =
            Topology::build(&TopologySpec::Modric(ModricParams::new(2, 2, 1, 2, 1))).unwrap();
        every_single_failure_is_repaired(&topo, 0);
    }

    #[test]
    fn fat_tree_repairs_are_the_expected_ones() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let g = topo.graph();
        let usids = Usids::of(&topo).unwrap();
        let u = |n: &str| usids.get(g.find(n).unwrap());
        let none = Failures::none(g);
        // a0 lost c0: the other core of its group, c1, reaches the same aggregation switches.
        let a0 = Plan::new(&topo, g.find("a0").unwrap(), &none).unwrap();
        let r = a0.react(&topo, &BTreeSet::from([link(&topo, "a0", "c0")]));
        assert!(!r.rules.is_empty());
        for rule in &r.rules {
            assert_eq!(
                (rule.next, rule.replace, rule.detour),
                (u("c0"), 1, false),
                "{rule:?}"
            );
            assert_eq!(rule.with, vec![u("c1")]);
        }
        // e0 lost a0: the other aggregation switch and one of its cores; lists through c0 and
        // c1 spread over c2 and c3.
        let e0 = Plan::new(&topo, g.find("e0").unwrap(), &none).unwrap();
        let r = e0.react(&topo, &BTreeSet::from([link(&topo, "e0", "a0")]));
        let by_core: BTreeSet<Vec<u16>> = r
            .rules
            .iter()
            .filter(|r| r.after == u("c0") || r.after == u("c1"))
            .map(|r| r.with.clone())
            .collect();
        assert_eq!(
            by_core,
            BTreeSet::from([vec![u("a1"), u("c2")], vec![u("a1"), u("c3")]])
        );
        // c0 lost a4: into another pod and up its other core, marked.
        let c0 = Plan::new(&topo, g.find("c0").unwrap(), &none).unwrap();
        let r = c0.react(&topo, &BTreeSet::from([link(&topo, "c0", "a4")]));
        assert!(!r.rules.is_empty());
        for rule in &r.rules {
            assert!(rule.detour && rule.replace == 0, "{rule:?}");
            assert_eq!(rule.with[1], u("c1"), "{rule:?}");
        }
        assert!(r.unrepaired.is_empty());
    }

    #[test]
    fn a_failure_the_controller_published_keeps_the_rules_for_hosts_that_did_not_apply_it() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let g = topo.graph();
        let l = link(&topo, "a0", "c0");
        let mut failures = Failures::none(g);
        failures.set_link(l, true);
        let a0 = Plan::new(&topo, g.find("a0").unwrap(), &failures).unwrap();
        let r = a0.react(&topo, &BTreeSet::from([l]));
        assert!(!r.rules.is_empty() && r.unrepaired.is_empty(), "{r:?}");
    }
}
