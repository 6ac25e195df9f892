//! A Clos fabric of up to three tiers as an inventory describes it (see [`crate::inventory`]):
//! the operator's names, addresses and cabling, unequal shapes allowed. Built only through
//! [`crate::inventory::check::build`], which refuses what this model cannot carry.
//!
//! Node ids: hosts first (racks in file order, hosts in their order), then switches in file
//! order. Link ids: each host's link first (same order), then the switch links in file order.
//! A switch's ports are numbered in link order, so its uplinks (links to the tier above) are
//! in file order; a path's hop byte at a tier is the index of the uplink it takes there.
//!
//! Paths: all shortest up-down paths. From a source under leaf `L` to the rack of leaf `M`, the
//! paths turn at the lowest tier where some path exists: at a spine `S` linked to both (one
//! choice: hop0 = the uplink of `L` to `S`), or else at a super-spine `C` (hop0 the uplink of
//! `L` to `S`, hop1 the uplink of `S` to `C`, then the one spine below `C` linked to `M`). The
//! inventory check refuses a super-spine that reaches a leaf through two spines (the option
//! carries only the choices going up) and two leaves with no up-down path between them.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use sopa_common::{srv6::Block, wire::HOP_NONE};

use crate::{
    graph::{Graph, LinkId, NodeId},
    inventory::Inventory,
    prefix::Prefix,
    prefix6::Prefix6,
    srv6::embed,
};

/// One rack of the inventory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClosRack {
    pub tor: NodeId,
    pub ipv4: Prefix,
    pub ipv6: Option<Prefix6>,
    pub gateway: Ipv4Addr,
}

/// Two ends' addresses and the subnet's length.
pub type EndAddresses<A> = (A, A, u8);

#[derive(Clone, Debug)]
pub struct Clos {
    /// The inventory as given: what the controller pushes.
    pub inventory: Inventory,
    pub graph: Graph,
    /// Per node: 0 for hosts, then the tier (1 leaf, 2 spine, 3 super-spine).
    pub(crate) level: Vec<u8>,
    pub(crate) racks: Vec<ClosRack>,
    /// Per host node: its rack's index.
    pub(crate) host_rack: Vec<u32>,
    /// Per link: the port names of its `a` and `b` ends, where the inventory names them.
    pub(crate) port_names: Vec<[Option<String>; 2]>,
    pub(crate) link4: Vec<Option<EndAddresses<Ipv4Addr>>>,
    pub(crate) link6: Vec<Option<EndAddresses<Ipv6Addr>>>,
    /// Per host node: its IPv6 address where its rack has IPv6.
    pub(crate) host6: Vec<Option<Ipv6Addr>>,
    pub(crate) by_addr: HashMap<Ipv4Addr, NodeId>,
    /// Per node: (link, neighbour) to the tier above, in port order.
    pub(crate) up: Vec<Vec<(LinkId, NodeId)>>,
    /// Per switch: its uSID where the inventory gives one.
    pub(crate) usid: Vec<Option<u16>>,
    /// The inventory's uSID block, checked.
    pub(crate) usid_block: Option<Block>,
}

impl Clos {
    pub fn hosts(&self) -> u32 {
        self.host_rack.len() as u32
    }

    pub fn racks(&self) -> &[ClosRack] {
        &self.racks
    }

    /// The tier of `node`: 0 for a host, 1 leaf, 2 spine, 3 super-spine.
    pub fn level(&self, node: NodeId) -> u8 {
        self.level[node as usize]
    }

    /// The highest tier the fabric has.
    pub fn tiers(&self) -> u8 {
        self.level.iter().copied().max().unwrap_or(0)
    }

    /// `node`'s links to the tier above, in port order: hop value `i` takes the `i`-th.
    pub fn uplinks(&self, node: NodeId) -> &[(LinkId, NodeId)] {
        &self.up[node as usize]
    }

    /// The index of `host`'s rack.
    pub fn rack_index(&self, host: NodeId) -> Option<u32> {
        self.host_rack.get(host as usize).copied()
    }

    pub fn host_by_addr(&self, addr: Ipv4Addr) -> Option<NodeId> {
        self.by_addr.get(&addr).copied()
    }

    /// A host's link is numbered like the host.
    pub fn host_link(&self, host: NodeId) -> LinkId {
        host
    }

    /// The port name of `link` at `node`'s end, where the inventory names it.
    pub fn port_name(&self, link: LinkId, node: NodeId) -> Option<&str> {
        let l = &self.graph.links[link as usize];
        let end = usize::from(l.a != node);
        self.port_names[link as usize][end].as_deref()
    }

    /// The IPv4 addresses of switch link `link` (`a` end first) and the subnet length, where
    /// the inventory gives them.
    pub fn link_ipv4(&self, link: LinkId) -> Option<EndAddresses<Ipv4Addr>> {
        self.link4.get(link as usize).copied().flatten()
    }

    pub fn link_ipv6(&self, link: LinkId) -> Option<EndAddresses<Ipv6Addr>> {
        self.link6.get(link as usize).copied().flatten()
    }

    /// `host`'s IPv6 address: the inventory's, or the embedding of its IPv4 one where its rack
    /// has no IPv6 prefix.
    pub fn host_ipv6(&self, host: NodeId) -> Ipv6Addr {
        self.host6[host as usize]
            .unwrap_or_else(|| embed(self.graph.node(host).addr.expect("hosts have addresses")))
    }

    /// The uSID the inventory gives switch `node`.
    pub fn usid(&self, node: NodeId) -> Option<u16> {
        self.usid.get(node as usize).copied().flatten()
    }

    /// The uSID block the inventory gives.
    pub fn usid_block(&self) -> Option<Block> {
        self.usid_block
    }

    /// Pushes every shortest up-down path from host `src` to rack `rack` (its index) as
    /// (hop0, hop1, links), the source's own link first and the destination ToR last;
    /// nothing for the source's own rack.
    pub fn paths_to_rack(&self, src: NodeId, rack: u32, mut push: impl FnMut(u8, u8, &[LinkId])) {
        let own = self.host_rack[src as usize];
        if own == rack {
            return;
        }
        let leaf = self.racks[own as usize].tor;
        let dst = self.racks[rack as usize].tor;
        let first = self.host_link(src);
        let mut found = false;
        for (i, &(l1, spine)) in self.uplinks(leaf).iter().enumerate() {
            if let Some(down) = self.graph.links_between(spine, dst).next() {
                push(i as u8, HOP_NONE, &[first, l1, down]);
                found = true;
            }
        }
        if found {
            return;
        }
        for (i, &(l1, spine)) in self.uplinks(leaf).iter().enumerate() {
            for (j, &(l2, top)) in self.uplinks(spine).iter().enumerate() {
                if let Some((l3, l4)) = self.down_via(top, dst) {
                    push(i as u8, j as u8, &[first, l1, l2, l3, l4]);
                }
            }
        }
    }

    /// The one two-hop way down from super-spine `top` to leaf `leaf`: (top-spine, spine-leaf).
    pub(crate) fn down_via(&self, top: NodeId, leaf: NodeId) -> Option<(LinkId, LinkId)> {
        self.graph
            .ports(top)
            .iter()
            .filter(|(_, n)| self.level(*n) == 2)
            .find_map(|&(l3, spine)| {
                self.graph
                    .links_between(spine, leaf)
                    .next()
                    .map(|l4| (l3, l4))
            })
    }

    /// Whether `switch` reaches leaf `leaf` going only down.
    pub fn reaches_down(&self, switch: NodeId, leaf: NodeId) -> bool {
        match self.level(switch) {
            1 => switch == leaf,
            2 => self.graph.links_between(switch, leaf).next().is_some(),
            3 => self.down_via(switch, leaf).is_some(),
            _ => false,
        }
    }
}
