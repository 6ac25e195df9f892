//! The cabling check: what agents' LLDP hears, compared with the inventory. A port whose
//! neighbour is not the one the inventory cables to it is named (`leaf3:swp50 is cabled to
//! spine2:swp4, the inventory says spine1:swp3`); when a switch says so, the inventory's link
//! at that port is kept out of every path until the cable or the inventory is fixed. Hosts'
//! tables are shown, never acted on: no host changes fabric state by what it reports.

use std::collections::{BTreeMap, BTreeSet};

use sopa_channel::proto::{
    LinkRef, Miscabled, NeighbourReport, NeighbourSeen, PortNeighbour, Role,
};
use sopa_topology::{NodeKind, Topology};

/// Most ports one report may list, and the longest name kept: a report is an agent's claim,
/// bounded like every other.
pub const MAX_PORTS: usize = 1024;
const MAX_NAME: usize = 64;

/// Every agent's latest LLDP table.
#[derive(Debug, Default)]
pub struct Cabling {
    by_node: BTreeMap<String, NeighbourSeen>,
}

fn clip(s: &str) -> String {
    s.chars().take(MAX_NAME).collect()
}

impl Cabling {
    /// Keeps `node`'s new table (clipped to the bounds).
    pub fn set(&mut self, node: &str, role: Role, report: &NeighbourReport) {
        let mut ports: Vec<PortNeighbour> = report
            .ports
            .iter()
            .take(MAX_PORTS)
            .map(|p| PortNeighbour {
                port: clip(&p.port),
                chassis: clip(&p.chassis),
                remote_port: clip(&p.remote_port),
            })
            .collect();
        ports.sort();
        self.by_node.insert(
            node.to_owned(),
            NeighbourSeen {
                node: node.to_owned(),
                role: role as i32,
                ports,
                addresses: report.addresses.iter().take(16).map(|a| clip(a)).collect(),
            },
        );
    }

    pub fn tables(&self) -> Vec<NeighbourSeen> {
        self.by_node.values().cloned().collect()
    }

    /// Every port of every table that the inventory cables otherwise.
    pub fn mismatches(&self, topo: &Topology) -> Vec<Miscabled> {
        self.by_node
            .values()
            .flat_map(|seen| mismatches(topo, &seen.node, &seen.ports))
            .collect()
    }
}

/// The inventory's neighbour of `node`'s port `port`: the link and `peer:port` (a host's
/// name alone: hosts' ports are not named). `None` where the inventory has no link there, or
/// names no ports at all (a generated fabric).
fn expected(topo: &Topology, node: &str, port: &str) -> Option<(LinkRef, String)> {
    let Topology::Clos(c) = topo else {
        return None;
    };
    let g = topo.graph();
    let me = g.find(node)?;
    g.ports(me).iter().find_map(|&(link, peer)| {
        let mine = c.port_name(link, me);
        // A host's own port: its one link, whatever its interface is called.
        let matches = mine == Some(port) || (g.node(me).kind == NodeKind::Host && mine.is_none());
        matches.then(|| {
            let theirs = match c.port_name(link, peer) {
                Some(p) => format!("{}:{p}", g.name(peer)),
                None => g.name(peer).to_owned(),
            };
            let l = &g.links[link as usize];
            (
                LinkRef {
                    a: g.name(l.a).to_owned(),
                    b: g.name(l.b).to_owned(),
                },
                theirs,
            )
        })
    })
}

/// Whether the inventory names any port (an inventory's fabric: there is something to check).
pub fn checkable(topo: &Topology) -> bool {
    matches!(topo, Topology::Clos(_))
}

/// `node`'s ports whose neighbour is not the inventory's.
pub fn mismatches(topo: &Topology, node: &str, ports: &[PortNeighbour]) -> Vec<Miscabled> {
    if !checkable(topo) {
        return Vec::new();
    }
    ports
        .iter()
        .filter_map(|p| {
            let seen = format!("{}:{}", p.chassis, p.remote_port);
            let at = format!("{node}:{}", p.port);
            match expected(topo, node, &p.port) {
                Some((_, want)) if want == seen || want == p.chassis => None,
                Some((link, want)) => Some(Miscabled {
                    at,
                    seen,
                    expected: want,
                    link: Some(link),
                }),
                None => Some(Miscabled {
                    at,
                    seen,
                    expected: String::new(),
                    link: None,
                }),
            }
        })
        .collect()
}

/// The links switch `node`'s table says are miscabled (the inventory's link at each port
/// whose neighbour differs).
pub fn miscabled_links(
    topo: &Topology,
    node: &str,
    ports: &[PortNeighbour],
) -> BTreeSet<(String, String)> {
    mismatches(topo, node, ports)
        .into_iter()
        .filter_map(|m| m.link)
        .map(|l| (l.a, l.b))
        .collect()
}

/// How a mismatch reads in status and logs.
pub fn describe(m: &Miscabled) -> String {
    if m.expected.is_empty() {
        format!(
            "{} is cabled to {}, which the inventory does not list",
            m.at, m.seen
        )
    } else {
        format!(
            "{} is cabled to {}, the inventory says {}",
            m.at, m.seen, m.expected
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sopa_topology::{inventory::generate, topology::TopologySpec};

    fn leaf_spine() -> Topology {
        let inv = generate::leaf_spine(&generate::LeafSpine {
            leaves: 2,
            spines: 2,
            hosts_per_leaf: 1,
            prefix: "10.0.0.0/24".parse().unwrap(),
            prefix6: None,
            links: "10.1.0.0/24".parse().unwrap(),
            links6: None,
        })
        .unwrap();
        Topology::build(&TopologySpec::Inventory(Box::new(inv))).unwrap()
    }

    fn n(port: &str, chassis: &str, remote: &str) -> PortNeighbour {
        PortNeighbour {
            port: port.into(),
            chassis: chassis.into(),
            remote_port: remote.into(),
        }
    }

    #[test]
    fn a_swapped_cable_is_named_at_each_end_and_its_link_kept_out() {
        let t = leaf_spine();
        // leaf1's uplinks are swp2 (spine1) and swp3 (spine2); spine1:swp1 and spine2:swp1
        // face leaf1.
        assert!(
            mismatches(
                &t,
                "leaf1",
                &[n("swp2", "spine1", "swp1"), n("swp3", "spine2", "swp1")]
            )
            .is_empty()
        );
        let m = mismatches(&t, "spine1", &[n("swp1", "leaf2", "swp2")]);
        assert_eq!(m.len(), 1);
        assert_eq!(
            describe(&m[0]),
            "spine1:swp1 is cabled to leaf2:swp2, the inventory says leaf1:swp2"
        );
        assert_eq!(
            miscabled_links(&t, "spine1", &[n("swp1", "leaf2", "swp2")]),
            BTreeSet::from([("leaf1".to_owned(), "spine1".to_owned())])
        );
        // A port the inventory does not cable.
        let m = mismatches(&t, "spine1", &[n("swp9", "leaf2", "swp9")]);
        assert_eq!(
            describe(&m[0]),
            "spine1:swp9 is cabled to leaf2:swp9, which the inventory does not list"
        );
        assert!(m[0].link.is_none());
        // A host's uplink: its rack's ToR and port.
        assert!(mismatches(&t, "leaf1-h1", &[n("eth0", "leaf1", "swp1")]).is_empty());
        let m = mismatches(&t, "leaf1-h1", &[n("eth0", "leaf2", "swp1")]);
        assert_eq!(
            describe(&m[0]),
            "leaf1-h1:eth0 is cabled to leaf2:swp1, the inventory says leaf1:swp1"
        );
        // A generated fabric names no ports: nothing to check.
        let ft = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        assert!(mismatches(&ft, "e0", &[n("x", "y", "z")]).is_empty());
    }

    #[test]
    fn tables_are_bounded() {
        let mut c = Cabling::default();
        let long = "x".repeat(1000);
        let report = NeighbourReport {
            ports: (0..5000).map(|i| n(&format!("p{i}"), &long, "q")).collect(),
            addresses: vec![long.clone(); 100],
        };
        c.set("spine1", Role::Switch, &report);
        let t = &c.tables()[0];
        assert_eq!(t.ports.len(), MAX_PORTS);
        assert_eq!(t.ports[0].chassis.len(), MAX_NAME);
        assert_eq!(t.addresses.len(), 16);
    }
}

/// A draft inventory from what the agents' LLDP heard (`sopactl fabric discover`): switches
/// and their cables from the switches' tables; the leaves are the switches hosts hear on their
/// uplink, spines their other neighbours, super-spines the spines' other neighbours; each
/// leaf's rack holds the hosts cabled to it, every rack's prefix of the one length that keeps
/// them all apart. What LLDP cannot tell (link addresses, gateways, IPv6) is left to the
/// defaults, for the operator to fill in.
pub fn draft_inventory(tables: &[NeighbourSeen]) -> sopa_topology::inventory::Inventory {
    use sopa_topology::{
        inventory::{HostEntry, Inventory, LinkEntry, RackEntry, SwitchEntry, Tier},
        prefix::Prefix,
    };
    let hosts: Vec<&NeighbourSeen> = tables
        .iter()
        .filter(|t| t.role == Role::Host as i32)
        .collect();
    let host_names: BTreeSet<&str> = hosts.iter().map(|h| h.node.as_str()).collect();
    // Cables between switches, each once (as an unordered pair of ports).
    let mut cables: BTreeSet<((String, String), (String, String))> = BTreeSet::new();
    let mut adjacent: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in tables.iter().filter(|t| t.role == Role::Switch as i32) {
        adjacent.entry(t.node.clone()).or_default();
        for p in &t.ports {
            if host_names.contains(p.chassis.as_str()) {
                continue;
            }
            let a = (t.node.clone(), p.port.clone());
            let b = (p.chassis.clone(), p.remote_port.clone());
            cables.insert(if a <= b { (a, b) } else { (b, a) });
            adjacent
                .entry(t.node.clone())
                .or_default()
                .insert(p.chassis.clone());
            adjacent
                .entry(p.chassis.clone())
                .or_default()
                .insert(t.node.clone());
        }
    }
    let uplink = |h: &NeighbourSeen| h.ports.first().cloned();
    let leaves: BTreeSet<String> = hosts
        .iter()
        .filter_map(|h| uplink(h).map(|p| p.chassis))
        .collect();
    let mut tier: BTreeMap<String, Tier> = leaves.iter().map(|l| (l.clone(), Tier::Leaf)).collect();
    for (level, from) in [(Tier::Spine, Tier::Leaf), (Tier::SuperSpine, Tier::Spine)] {
        let below: Vec<String> = tier
            .iter()
            .filter(|(_, t)| **t == from)
            .map(|(n, _)| n.clone())
            .collect();
        for n in below {
            for m in adjacent.get(&n).into_iter().flatten() {
                tier.entry(m.clone()).or_insert(level);
            }
        }
    }
    let mut inv = Inventory {
        name: Some("discovered".into()),
        ..Inventory::default()
    };
    // Upper tiers first, as an operator lists them; a switch no tier reached is left out
    // (nothing cabled it to a rack).
    for t in [Tier::SuperSpine, Tier::Spine, Tier::Leaf] {
        for (n, _) in tier.iter().filter(|(_, x)| **x == t) {
            inv.switches.push(SwitchEntry {
                name: n.clone(),
                tier: t,
                pod: None,
                usid: None,
            });
        }
    }
    for ((a, ap), (b, bp)) in &cables {
        if tier.contains_key(a) && tier.contains_key(b) {
            inv.links.push(LinkEntry {
                a: format!("{a}:{ap}"),
                b: format!("{b}:{bp}"),
                ipv4: None,
                ipv6: None,
            });
        }
    }
    let addr = |h: &NeighbourSeen| {
        h.addresses
            .iter()
            .find_map(|a| a.parse::<std::net::Ipv4Addr>().ok())
    };
    // Per rack: its hosts, the prefix covering them, and the longest prefix it shares with
    // another rack's host.
    let mut racks = Vec::new();
    for leaf in &leaves {
        let mine: Vec<&NeighbourSeen> = hosts
            .iter()
            .copied()
            .filter(|h| uplink(h).is_some_and(|p| &p.chassis == leaf) && addr(h).is_some())
            .collect();
        let Some(first) = mine.first().and_then(|h| addr(h)) else {
            continue;
        };
        let cover = sopa_topology::prefix::cover(
            &mine
                .iter()
                .filter_map(|h| addr(h))
                .map(|a| Prefix::of(a, 32))
                .collect::<Vec<_>>(),
        );
        let shared = hosts
            .iter()
            .filter(|h| uplink(h).is_some_and(|p| &p.chassis != leaf))
            .filter_map(|h| addr(h))
            .map(|a| (u32::from(a) ^ u32::from(first)).leading_zeros() as u8)
            .max()
            .unwrap_or(0);
        racks.push((leaf, mine, cover, shared + 1));
    }
    // Racks of one size, as fabrics are built: the longest length that keeps every rack apart
    // (a rack whose hosts need more room keeps the room its hosts need).
    let apart = racks.iter().map(|r| r.3).max().unwrap_or(24).min(30);
    for (leaf, mine, cover, _) in racks {
        inv.racks.push(RackEntry {
            tor: leaf.clone(),
            ipv4: Prefix::of(cover.addr, apart.min(cover.len)),
            ipv6: None,
            gateway: None,
            hosts: mine
                .iter()
                .filter_map(|h| {
                    Some(HostEntry {
                        name: h.node.clone(),
                        ipv4: addr(h)?,
                        ipv6: None,
                        port: uplink(h).map(|p| p.remote_port),
                    })
                })
                .collect(),
        });
    }
    inv
}

#[cfg(test)]
mod discover_tests {
    use super::*;
    use sopa_topology::{Topology, inventory::generate, topology::TopologySpec};

    /// The tables a generated leaf-spine's agents would report, drafted back into the same
    /// fabric (names, tiers, cables, racks and prefixes).
    #[test]
    fn a_draft_from_the_tables_is_the_fabric() {
        let inv = generate::leaf_spine(&generate::LeafSpine {
            leaves: 3,
            spines: 2,
            hosts_per_leaf: 2,
            prefix: "100.64.0.0/24".parse().unwrap(),
            prefix6: None,
            links: "100.127.0.0/24".parse().unwrap(),
            links6: None,
        })
        .unwrap();
        let t = Topology::build(&TopologySpec::Inventory(Box::new(inv.clone()))).unwrap();
        let Topology::Clos(c) = &t else {
            unreachable!()
        };
        let g = t.graph();
        let tables: Vec<NeighbourSeen> = (0..g.nodes.len() as u32)
            .map(|n| {
                let host = g.node(n).kind == NodeKind::Host;
                let ports = g
                    .ports(n)
                    .iter()
                    .filter(|(_, peer)| g.node(*peer).kind.is_switch())
                    .map(|&(l, peer)| PortNeighbour {
                        port: c.port_name(l, n).unwrap_or("eth0").to_owned(),
                        chassis: g.name(peer).to_owned(),
                        remote_port: c.port_name(l, peer).unwrap().to_owned(),
                    })
                    .collect();
                NeighbourSeen {
                    node: g.name(n).to_owned(),
                    role: if host { Role::Host } else { Role::Switch } as i32,
                    ports,
                    addresses: g.node(n).addr.map(|a| a.to_string()).into_iter().collect(),
                }
            })
            .collect();
        let draft = draft_inventory(&tables);
        let d = Topology::build(&TopologySpec::Inventory(Box::new(draft.clone())))
            .unwrap_or_else(|e| panic!("{e}\n{}", draft.to_toml()));
        let mut want: Vec<_> = inv
            .racks
            .iter()
            .map(|r| (r.tor.clone(), r.ipv4, r.hosts.len()))
            .collect();
        let mut got: Vec<_> = draft
            .racks
            .iter()
            .map(|r| (r.tor.clone(), r.ipv4, r.hosts.len()))
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(d.graph().links.len(), g.links.len());
        let tiers = |i: &sopa_topology::inventory::Inventory| {
            let mut v: Vec<_> = i
                .switches
                .iter()
                .map(|s| (s.name.clone(), s.tier))
                .collect();
            v.sort();
            v
        };
        assert_eq!(tiers(&draft), tiers(&inv));
    }
}
