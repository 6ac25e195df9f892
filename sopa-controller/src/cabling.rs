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
