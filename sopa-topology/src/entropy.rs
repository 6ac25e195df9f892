//! The entropy encoding's view of a fabric of switches that only hash: which router answers a
//! probe of each hop limit on each candidate path, which hop limits tell the paths apart, and
//! which router an ICMPv6 error's source address names. A host that probed a path (the
//! routers that answered, by hop limit) finds here which of its candidate paths it was.

use std::{collections::HashMap, net::Ipv6Addr};

use crate::{Hops, NodeId, Topology, paths::PathTable, srv6::link_addresses6};

/// Whether the entropy encoding can carry `topo`'s paths: IPv4 travels in an outer header to
/// the destination's IPv6 address, which the hosts' datapath derives from the IPv4 one (the
/// fabric's /96), so an inventory whose racks have IPv6 prefixes of their own is refused.
pub fn check(topo: &Topology) -> crate::Result<()> {
    if topo.routes_ipv6() {
        return Err(crate::Error::Invalid(format!(
            "{}: the entropy encoding reaches hosts at the IPv6 addresses that embed their IPv4 \
             ones ({}/96); this inventory gives its racks IPv6 prefixes of their own: remove \
             them, or use \"ipv4-option\" or \"srv6\"",
            topo.name(),
            crate::srv6::HOST6_PREFIX
        )));
    }
    Ok(())
}

/// Every switch's IPv6 addresses (both ends of its switch links, and a rack switch's address
/// towards its hosts): a router answers from one of them.
pub fn routers(topo: &Topology) -> HashMap<Ipv6Addr, NodeId> {
    let g = topo.graph();
    let mut out = HashMap::new();
    for (i, l) in g.links.iter().enumerate() {
        if g.node(l.a).kind.is_switch() && g.node(l.b).kind.is_switch() {
            let (a, b, _) = link_addresses6(topo, i as u32);
            out.insert(a, l.a);
            out.insert(b, l.b);
        }
    }
    for rack in topo.racks() {
        out.insert(topo.gateway_ipv6(&rack), rack.tor);
    }
    out
}

/// The candidate paths from a table's source to one destination rack, as probes see them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probed {
    /// The hop limits whose routers tell the paths apart (the fewest, in order).
    pub hop_limits: Vec<u8>,
    /// Per live candidate path: its hops and the router a probe of each hop limit (1, 2, ...)
    /// of the path meets, up to the destination's rack switch.
    pub paths: Vec<(Hops, Vec<NodeId>)>,
}

impl Probed {
    /// The live paths to the rack of destination `index` in `table` (a path through a failed
    /// link is not there to find).
    pub fn of(topo: &Topology, table: &PathTable, index: usize) -> Self {
        let g = topo.graph();
        let d = &table.destinations[index];
        let paths: Vec<(Hops, Vec<NodeId>)> = d
            .candidates
            .iter()
            .filter(|c| c.alive)
            .map(|c| {
                let mut node = table.source;
                let routers = table
                    .links(c)
                    .iter()
                    .map(|l| {
                        node = g.links[*l as usize].other(node);
                        node
                    })
                    .collect();
                (c.hops, routers)
            })
            .collect();
        // Add hop limits until every path's routers at them are its own.
        let len = paths.iter().map(|(_, r)| r.len()).min().unwrap_or(0);
        let mut hop_limits: Vec<u8> = Vec::new();
        let distinct = |limits: &[u8]| {
            let sigs: std::collections::BTreeSet<Vec<NodeId>> = paths
                .iter()
                .map(|(_, r)| limits.iter().map(|h| r[usize::from(*h) - 1]).collect())
                .collect();
            sigs.len()
        };
        for h in 1..=len as u8 {
            if distinct(&hop_limits) == paths.len() {
                break;
            }
            let mut with = hop_limits.clone();
            with.push(h);
            if distinct(&with) > distinct(&hop_limits) {
                hop_limits = with;
            }
        }
        Self { hop_limits, paths }
    }

    /// The path whose routers at `hop_limits` are `answered` (each named by the address it
    /// answered from), if any.
    pub fn path_of(
        &self,
        routers: &HashMap<Ipv6Addr, NodeId>,
        answered: &[Ipv6Addr],
    ) -> Option<Hops> {
        let nodes: Vec<NodeId> = answered
            .iter()
            .map(|a| routers.get(a).copied())
            .collect::<Option<_>>()?;
        self.paths
            .iter()
            .find(|(_, r)| {
                self.hop_limits
                    .iter()
                    .map(|h| r[usize::from(*h) - 1])
                    .eq(nodes.iter().copied())
            })
            .map(|(hops, _)| *hops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{paths::Failures, topology::TopologySpec};

    #[test]
    fn fat_tree_paths_are_told_apart_at_the_aggregation_and_the_core() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let g = topo.graph();
        let h0 = g.find("h0").unwrap();
        let table = PathTable::compute(&topo, h0, &Failures::none(g)).unwrap();
        let routers = routers(&topo);
        // Two addresses per switch link, one gateway per rack; every one a switch's.
        assert_eq!(routers.len(), 2 * 32 + 8);
        assert!(routers.values().all(|n| g.node(*n).kind.is_switch()));
        for (i, d) in table.destinations.iter().enumerate() {
            let p = Probed::of(&topo, &table, i);
            let inter_pod = d.candidates.len() == 4;
            // Inter-pod: e, a, c, a', e' (the aggregation then the core tell 4 paths apart);
            // within the pod: e, a, e' (the aggregation tells 2 apart).
            assert_eq!(
                p.hop_limits,
                if inter_pod { vec![2, 3] } else { vec![2] },
                "{}",
                d.prefix()
            );
            for (hops, r) in &p.paths {
                assert_eq!(r.len(), if inter_pod { 5 } else { 3 });
                // The answer of each path's own routers, from any of their addresses, is it.
                let answered: Vec<Ipv6Addr> = p
                    .hop_limits
                    .iter()
                    .map(|h| {
                        let n = r[usize::from(*h) - 1];
                        *routers.iter().find(|(_, v)| **v == n).unwrap().0
                    })
                    .collect();
                assert_eq!(p.path_of(&routers, &answered), Some(*hops));
            }
            // An address no switch has names no path.
            let stranger = vec!["2001:db8::1".parse().unwrap(); p.hop_limits.len()];
            assert_eq!(p.path_of(&routers, &stranger), None);
        }
    }
}
