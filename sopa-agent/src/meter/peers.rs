//! Which marks a host's meter counts: from each other rack of the fabric, the hop values that
//! rack's paths to this host carry (`sopa_common::maps::meter::PEERS_MAP`). Computed from the
//! topology, so forged or stray marks (from addresses no rack holds, on paths no rack takes)
//! are never counted and cannot fill the received table.

use std::collections::HashMap;

use sopa_common::{maps::MeterPeer, wire::HOP_NONE};
use sopa_topology::{NodeId, NodeKind, Topology, prefix::Prefix};

/// Each other rack's prefix, and the limits of the hop bytes its paths to `me` carry (one
/// more than the highest of each).
pub fn peers(topo: &Topology, me: NodeId) -> Vec<(Prefix, MeterPeer)> {
    let Ok(mine) = topo.rack_of(me) else {
        return Vec::new();
    };
    let g = topo.graph();
    // One host of each rack: a rack's paths are its hosts'.
    let mut hosts: HashMap<NodeId, NodeId> = HashMap::new();
    for h in g.nodes_of(NodeKind::Host) {
        if let Ok(r) = topo.rack_of(h) {
            hosts.entry(r.tor).or_insert(h);
        }
    }
    topo.racks()
        .into_iter()
        .filter(|r| r.tor != mine.tor)
        .filter_map(|r| {
            let from = *hosts.get(&r.tor)?;
            let mut peer = MeterPeer::default();
            let mut any = false;
            topo.paths_to_rack(from, &mine, |h0, h1, _| {
                any = true;
                let l = &mut peer.hop_limits;
                l[0] = l[0].max(h0.saturating_add(1));
                if h1 == HOP_NONE {
                    peer.hop1_none = 1;
                } else {
                    l[1] = l[1].max(h1.saturating_add(1));
                }
            });
            any.then_some((r.prefix, peer))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use sopa_topology::topology::TopologySpec;

    use super::*;

    #[test]
    fn every_other_rack_with_its_paths_hop_limits() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let h0 = topo.graph().find("h0").unwrap();
        let p = peers(&topo, h0);
        // Seven other racks: one in pod 0 (two paths, through either aggregation switch), six
        // in other pods (four: two aggregation switches, two cores each).
        assert_eq!(p.len(), 7);
        let own = topo.rack_of(h0).unwrap().prefix;
        assert!(p.iter().all(|(prefix, _)| *prefix != own));
        let pod0 = |p: &Prefix| p.addr.octets()[1] == 0;
        for (prefix, peer) in &p {
            // Through either of two switches above the rack; in another pod, either of two
            // cores above those; in the pod, none.
            let want = if pod0(prefix) {
                MeterPeer {
                    hop_limits: [2, 0],
                    hop1_none: 1,
                    _pad: 0,
                }
            } else {
                MeterPeer {
                    hop_limits: [2, 2],
                    hop1_none: 0,
                    _pad: 0,
                }
            };
            assert_eq!(*peer, want, "{prefix}");
            assert_eq!(peer.carries([1, 1]), !pod0(prefix));
            assert_eq!(peer.carries([1, HOP_NONE]), pod0(prefix));
            assert!(!peer.carries([2, 0]));
        }
    }
}
