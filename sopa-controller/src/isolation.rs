//! Whether the fabric still connects every rack to every other: a drain or a switch taken down
//! by an operator that would leave two racks with none of their paths is refused unless forced
//! (a failure a switch reports, or a suspect the meter drains, is a fact, never refused).

use std::collections::BTreeMap;

use sopa_topology::{Topology, graph::NodeKind, paths::Failures};

/// Two racks (by their top-of-rack switches' names) between which every candidate path crosses
/// something down under `failures`, if any: the first such pair found, racks in the topology's
/// order. Paths are judged from the racks' switches: a host's own link is its own. Every rack
/// pair's paths are walked: 2 ms at k=16, 89 ms at k=32, 0.54 s at k=48 (a release build here,
/// nothing down), once per operator drain.
pub fn isolated_racks(topo: &Topology, failures: &Failures) -> Option<(String, String)> {
    let g = topo.graph();
    // One host per rack, to enumerate the rack's paths from.
    let mut host_of = BTreeMap::new();
    for (id, node) in g.nodes.iter().enumerate() {
        if node.kind == NodeKind::Host
            && let Ok(rack) = topo.rack_of(id as _)
        {
            host_of.entry(rack.tor).or_insert(id as _);
        }
    }
    let racks = topo.racks();
    for a in &racks {
        let Some(&host) = host_of.get(&a.tor) else {
            continue;
        };
        for b in racks.iter().filter(|b| b.tor != a.tor) {
            let mut alive = false;
            topo.paths_to_rack(host, b, |_, _, links| {
                alive = alive
                    || links.iter().all(|&l| {
                        let link = &g.links[l as usize];
                        let host_link = g.node(link.a).kind == NodeKind::Host
                            || g.node(link.b).kind == NodeKind::Host;
                        host_link || failures.usable(g, l)
                    });
            });
            if !alive {
                return Some((g.name(a.tor).to_owned(), g.name(b.tor).to_owned()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use sopa_topology::topology::TopologySpec;

    fn link(topo: &Topology, f: &mut Failures, a: &str, b: &str) {
        let g = topo.graph();
        let (na, nb) = (g.find(a).unwrap(), g.find(b).unwrap());
        for l in g.links_between(na, nb).collect::<Vec<_>>() {
            f.set_link(l, true);
        }
    }

    #[test]
    fn a_rack_is_cut_off_only_when_every_path_is_down() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let g = topo.graph();
        let mut f = Failures::none(g);
        assert_eq!(isolated_racks(&topo, &f), None);
        // One of e0's two uplinks: every rack still reaches every other.
        link(&topo, &mut f, "e0", "a0");
        assert_eq!(isolated_racks(&topo, &f), None);
        // Both: e0's rack is cut off.
        link(&topo, &mut f, "e0", "a1");
        let (a, b) = isolated_racks(&topo, &f).expect("e0 cut off");
        assert!(a == "e0" || b == "e0", "{a} {b}");
        // A switch down: its links go with it (a0 and a1 of pod 0 both: pod 0 cut off).
        let mut f = Failures::none(g);
        f.set_node(g, g.find("a0").unwrap(), true);
        assert_eq!(isolated_racks(&topo, &f), None);
        f.set_node(g, g.find("a1").unwrap(), true);
        assert!(isolated_racks(&topo, &f).is_some());
        // A host's own link cuts off the host, not its rack.
        let mut f = Failures::none(g);
        link(&topo, &mut f, "h0", "e0");
        assert_eq!(isolated_racks(&topo, &f), None);
    }
}
