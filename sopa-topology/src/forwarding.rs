//! What each switch of a fabric needs to forward: the `tc_forward` decisions (for which
//! destinations it chooses by a hop byte, and which link each hop value names) and the kernel's
//! destination routes (for everything else: downward, and packets without the option). Also the
//! addresses of every link, so the switch agent, the testbed and the controller agree on them.
//!
//! Addressing: a host has its model address; its rack switch answers on the rack's gateway
//! address (Fat-Tree `10.p.e.1`, MODRIC the last address of the AS prefix, an inventory's rack
//! its `gateway`). Switch-to-switch link `L` is the inventory's subnet, or else the /31
//! `172.16.0.0 + 2L`, its `a` end the even address.

use std::{collections::BTreeMap, net::Ipv4Addr};

use crate::{
    graph::{LinkId, NodeId, NodeKind},
    paths::Failures,
    prefix::Prefix,
    topology::{Rack, Topology},
};

/// A `tc_forward` decision: destinations in `prefix` are forwarded by hop byte `hop_byte`
/// (1: hop0, 2: hop1), hop value `h` leaving by `uplinks[h]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub prefix: Prefix,
    pub hop_byte: u8,
    pub uplinks: Vec<LinkId>,
}

/// A kernel route: destinations in `prefix` leave by any of `links` (several: multipath).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRoute {
    pub prefix: Prefix,
    pub links: Vec<LinkId>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchPlan {
    pub decisions: Vec<Decision>,
    pub routes: Vec<KernelRoute>,
}

/// The base of switch-to-switch link addresses.
pub const LINK_BASE: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 0);

/// The two addresses of switch-to-switch link `link` (its `a` end first) and the subnet's
/// length: the inventory's, or else the /31 [`LINK_BASE`] + 2 * `link`.
pub fn link_addresses(topo: &Topology, link: LinkId) -> (Ipv4Addr, Ipv4Addr, u8) {
    if let Topology::Clos(c) = topo
        && let Some(ends) = c.link_ipv4(link)
    {
        return ends;
    }
    let base = u32::from(LINK_BASE) + 2 * link;
    (Ipv4Addr::from(base), Ipv4Addr::from(base + 1), 31)
}

/// The address a rack's switch answers on towards its hosts.
pub fn gateway(topo: &Topology, rack: &Rack) -> Ipv4Addr {
    match topo {
        Topology::Clos(c) => c.racks()[rack.at.0 as usize].gateway,
        Topology::FatTree(_) => Ipv4Addr::from(u32::from(rack.prefix.addr) | 1),
        Topology::Modric(_) => {
            let host_bits = 32 - u32::from(rack.prefix.len);
            Ipv4Addr::from(u32::from(rack.prefix.addr) | ((1 << host_bits) - 1))
        }
    }
}

/// The plan of switch `node` with everything up.
pub fn plan(topo: &Topology, node: NodeId) -> SwitchPlan {
    plan_under(topo, node, &Failures::none(topo.graph()))
}

/// The plan of switch `node` under `failures`: the decisions stay (hosts steer source-routed
/// packets around failures), the kernel routes follow the shortest paths that are still alive,
/// so packets without the option (and the `ecmp` baseline) avoid every next hop that can no
/// longer reach the destination, not only the dead links at this switch.
pub fn plan_under(topo: &Topology, node: NodeId, failures: &Failures) -> SwitchPlan {
    SwitchPlan {
        routes: routes(topo, node, failures),
        decisions: decisions(topo, node, &topo.racks()),
    }
}

/// Switch `node`'s decision for `rack`'s destinations, if it decides for them.
pub fn decision_for(topo: &Topology, node: NodeId, rack: &Rack) -> Option<Decision> {
    decisions(topo, node, std::slice::from_ref(rack)).pop()
}

/// Hop counts from every node to `to` over the links usable under `failures` (`u32::MAX`:
/// unreachable): what the kernel routes towards `to` follow.
pub fn distances(topo: &Topology, to: NodeId, failures: &Failures) -> Vec<u32> {
    bfs_alive(topo, to, failures)
}

/// Hop counts to `src` over usable links (`u32::MAX`: unreachable).
fn bfs_alive(topo: &Topology, src: NodeId, failures: &Failures) -> Vec<u32> {
    let g = topo.graph();
    let mut dist = vec![u32::MAX; g.nodes.len()];
    let mut queue = std::collections::VecDeque::from([src]);
    dist[src as usize] = 0;
    while let Some(n) = queue.pop_front() {
        for &(link, next) in g.ports(n) {
            if dist[next as usize] == u32::MAX && failures.usable(g, link) {
                dist[next as usize] = dist[n as usize] + 1;
                queue.push_back(next);
            }
        }
    }
    dist
}

/// Switch `node`'s kernel routes under `failures`: per rack, every neighbour on a live shortest
/// path to the rack's switch; the rack's own switch routes each host out of its port. A rack
/// this switch cannot reach has no route.
pub fn routes(topo: &Topology, node: NodeId, failures: &Failures) -> Vec<KernelRoute> {
    let g = topo.graph();
    let mut out = Vec::new();
    for rack in &topo.racks() {
        if rack.tor == node {
            for &(link, host) in g.ports(node) {
                if g.node(host).kind == NodeKind::Host {
                    let addr = g.node(host).addr.expect("hosts have addresses");
                    out.push(KernelRoute {
                        prefix: Prefix::of(addr, 32),
                        links: vec![link],
                    });
                }
            }
            continue;
        }
        let dist = bfs_alive(topo, rack.tor, failures);
        let here = dist[node as usize];
        if here == u32::MAX {
            continue;
        }
        let links: Vec<LinkId> = g
            .ports(node)
            .iter()
            .filter(|(l, n)| {
                g.node(*n).kind.is_switch()
                    && failures.usable(g, *l)
                    && dist[*n as usize].checked_add(1) == Some(here)
            })
            .map(|(l, _)| *l)
            .collect();
        if !links.is_empty() {
            out.push(KernelRoute {
                prefix: rack.prefix,
                links,
            });
        }
    }
    out
}

fn decisions(topo: &Topology, node: NodeId, racks: &[Rack]) -> Vec<Decision> {
    let g = topo.graph();
    let mut out = Vec::new();
    match topo {
        Topology::FatTree(f) => {
            let h = f.k / 2;
            match g.node(node).kind {
                NodeKind::Edge => {
                    let (pod, edge) = ((node - f.edge(0, 0)) / h, (node - f.edge(0, 0)) % h);
                    let uplinks: Vec<LinkId> = (0..h).map(|a| f.edge_link(pod, edge, a)).collect();
                    for rack in racks.iter().filter(|r| r.tor != node) {
                        out.push(Decision {
                            prefix: rack.prefix,
                            hop_byte: 1,
                            uplinks: uplinks.clone(),
                        });
                    }
                }
                NodeKind::Aggregation => {
                    let (pod, a) = ((node - f.agg(0, 0)) / h, (node - f.agg(0, 0)) % h);
                    let uplinks: Vec<LinkId> = (0..h).map(|j| f.core_link(pod, a, j)).collect();
                    for rack in racks.iter().filter(|r| r.at.0 != pod) {
                        out.push(Decision {
                            prefix: rack.prefix,
                            hop_byte: 2,
                            uplinks: uplinks.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        Topology::Clos(c) => {
            // A leaf decides by hop0 for every other rack; a spine with uplinks by hop1 for
            // every rack it cannot reach going down. The uplinks are in port order.
            let level = c.level(node);
            let uplinks: Vec<LinkId> = c.uplinks(node).iter().map(|(l, _)| *l).collect();
            if uplinks.is_empty() || !(1..=2).contains(&level) {
                return out;
            }
            for rack in racks {
                let decides = match level {
                    1 => rack.tor != node,
                    _ => !c.reaches_down(node, rack.tor),
                };
                if decides {
                    out.push(Decision {
                        prefix: rack.prefix,
                        hop_byte: level,
                        uplinks: uplinks.clone(),
                    });
                }
            }
        }
        Topology::Modric(m) => {
            // Where the candidate paths of a host below this switch take their decisions, this
            // switch decides the same way: read the uplinks off the paths themselves.
            let n = m.p.n;
            let Some(c) = m.container_of(node) else {
                return out;
            };
            match g.node(node).kind {
                NodeKind::Access => {
                    let a = (0..m.p.x)
                        .find(|a| m.access_switch(c, *a) == node)
                        .expect("an AS of its container");
                    let src = m.host(c, a, 0);
                    for rack in racks.iter().filter(|r| r.tor != node) {
                        let mut uplinks = vec![0; 4];
                        topo.paths_to_rack(src, rack, |hop0, _, links| {
                            uplinks[usize::from(hop0)] = links[1]
                        });
                        out.push(Decision {
                            prefix: rack.prefix,
                            hop_byte: 1,
                            uplinks,
                        });
                    }
                }
                NodeKind::Eps => {
                    // Diagonal destinations: row-first (0) or column-first (1), decided at the
                    // source EPSC by whichever EPS of it the packet reaches.
                    let (rank, layer) = eps_rank_layer(m, c, node);
                    for rack in racks {
                        let dc = rack.at.0;
                        if dc / n == c / n || dc % n == c % n {
                            continue;
                        }
                        let mut uplinks = vec![0; 2];
                        // A host whose AS is wired to this EPS's layer enters the EPSC here.
                        let Some(a) = (0..m.p.x).find(|a| a % m.p.q == layer) else {
                            continue;
                        };
                        let src = m.host(c, a, 0);
                        topo.paths_to_rack(src, rack, |hop0, hop1, links| {
                            if u32::from(hop0) == rank {
                                uplinks[usize::from(hop1)] = links[2];
                            }
                        });
                        out.push(Decision {
                            prefix: rack.prefix,
                            hop_byte: 2,
                            uplinks,
                        });
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn eps_rank_layer(m: &crate::modric::Modric, c: u32, node: NodeId) -> (u32, u32) {
    for r in 0..4 {
        for l in 0..m.p.q {
            if m.eps(c, r, l) == node {
                return (r, l);
            }
        }
    }
    unreachable!("an EPS of its container")
}

/// The plans of every switch, by node.
pub fn plans(topo: &Topology) -> BTreeMap<NodeId, SwitchPlan> {
    let g = topo.graph();
    (0..g.nodes.len() as NodeId)
        .filter(|n| g.node(*n).kind.is_switch())
        .map(|n| (n, plan(topo, n)))
        .collect()
}
