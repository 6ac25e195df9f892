//! Any fabric behind one interface: the graph, its hosts and destination prefixes, and the
//! candidate paths between them.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use sopa_common::srv6::{Block, DEFAULT_BLOCK};

use crate::{
    Error, Result,
    clos::Clos,
    fat_tree::FatTree,
    graph::{Graph, LinkId, NodeId, NodeKind},
    inventory::{Inventory, check},
    modric::{Modric, ModricParams},
    prefix::Prefix,
    prefix6::Prefix6,
    srv6::{HOST6_PREFIX, embed},
};

/// What a topology is built from: the spec a controller loads and pushes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum TopologySpec {
    FatTree {
        k: u32,
    },
    Modric(ModricParams),
    /// An operator's fabric as built (`crate::inventory`).
    Inventory(Box<Inventory>),
}

#[derive(Clone, Debug)]
// One topology per process: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Topology {
    FatTree(FatTree),
    Modric(Modric),
    Clos(Box<Clos>),
}

/// One destination prefix: the hosts under one edge or access switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rack {
    pub prefix: Prefix,
    pub tor: NodeId,
    /// Topology-specific coordinates: (pod, edge), (container, access switch) or, for an
    /// inventory, (rack index, 0).
    pub at: (u32, u32),
}

impl Topology {
    pub fn build(spec: &TopologySpec) -> Result<Self> {
        Ok(match spec {
            TopologySpec::FatTree { k } => Self::FatTree(FatTree::new(*k)?),
            TopologySpec::Modric(p) => Self::Modric(Modric::new(*p)?),
            TopologySpec::Inventory(inv) => Self::Clos(Box::new(check::build(inv)?)),
        })
    }

    pub fn spec(&self) -> TopologySpec {
        match self {
            Self::FatTree(f) => TopologySpec::FatTree { k: f.k },
            Self::Modric(m) => TopologySpec::Modric(m.p),
            Self::Clos(c) => TopologySpec::Inventory(Box::new(c.inventory.clone())),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Self::FatTree(f) => format!("Fat-Tree k={}", f.k),
            Self::Modric(m) => format!(
                "MODRIC {}x{} (q={}, x={}, y={})",
                m.p.m, m.p.n, m.p.q, m.p.x, m.p.y
            ),
            Self::Clos(c) => format!(
                "{} ({}-tier Clos, {} racks, {} hosts)",
                c.inventory.name.as_deref().unwrap_or("inventory"),
                c.tiers(),
                c.racks().len(),
                c.hosts()
            ),
        }
    }

    pub fn graph(&self) -> &Graph {
        match self {
            Self::FatTree(f) => &f.graph,
            Self::Modric(m) => &m.graph,
            Self::Clos(c) => &c.graph,
        }
    }

    pub fn host_count(&self) -> u32 {
        match self {
            Self::FatTree(f) => f.hosts(),
            Self::Modric(m) => m.hosts(),
            Self::Clos(c) => c.hosts(),
        }
    }

    /// Every destination prefix, in a fixed order.
    pub fn racks(&self) -> Vec<Rack> {
        match self {
            Self::FatTree(f) => (0..f.k)
                .flat_map(|pod| (0..f.k / 2).map(move |e| (pod, e)))
                .map(|(pod, e)| Rack {
                    prefix: f.edge_prefix(pod, e),
                    tor: f.edge(pod, e),
                    at: (pod, e),
                })
                .collect(),
            Self::Modric(m) => (0..m.p.containers())
                .flat_map(|c| (0..m.p.x).map(move |a| (c, a)))
                .map(|(c, a)| Rack {
                    prefix: m.access_prefix(c, a),
                    tor: m.access_switch(c, a),
                    at: (c, a),
                })
                .collect(),
            Self::Clos(c) => c
                .racks()
                .iter()
                .enumerate()
                .map(|(i, r)| Rack {
                    prefix: r.ipv4,
                    tor: r.tor,
                    at: (i as u32, 0),
                })
                .collect(),
        }
    }

    /// The rack of a host.
    pub fn rack_of(&self, host: NodeId) -> Result<Rack> {
        self.check_host(host)?;
        let at = match self {
            Self::FatTree(f) => {
                let h = f.host_at(host);
                (h.pod, h.edge)
            }
            Self::Modric(m) => {
                let h = m.host_at(host).expect("checked");
                (h.container, h.access)
            }
            Self::Clos(c) => (c.rack_index(host).expect("checked"), 0),
        };
        let (prefix, tor) = match self {
            Self::FatTree(f) => (f.edge_prefix(at.0, at.1), f.edge(at.0, at.1)),
            Self::Modric(m) => (m.access_prefix(at.0, at.1), m.access_switch(at.0, at.1)),
            Self::Clos(c) => {
                let r = &c.racks()[at.0 as usize];
                (r.ipv4, r.tor)
            }
        };
        Ok(Rack { prefix, tor, at })
    }

    fn check_host(&self, node: NodeId) -> Result<()> {
        let g = self.graph();
        if (node as usize) < g.nodes.len() && g.node(node).kind == NodeKind::Host {
            Ok(())
        } else {
            Err(Error::NotAHost(
                g.nodes
                    .get(node as usize)
                    .map_or(node.to_string(), |n| n.name.clone()),
            ))
        }
    }

    pub fn host_by_addr(&self, addr: Ipv4Addr) -> Option<NodeId> {
        match self {
            Self::FatTree(f) => f.host_by_addr(addr),
            Self::Modric(m) => m.host_by_addr(addr),
            Self::Clos(c) => c.host_by_addr(addr),
        }
    }

    /// Host `host`'s IPv6 address: the inventory's, or else its IPv4 address embedded in
    /// [`HOST6_PREFIX`].
    pub fn host_ipv6(&self, host: NodeId) -> Ipv6Addr {
        match self {
            Self::Clos(c) => c.host_ipv6(host),
            _ => embed(self.graph().node(host).addr.expect("hosts have addresses")),
        }
    }

    /// `rack`'s IPv6 prefix: the inventory's, or else its IPv4 prefix embedded.
    pub fn rack_ipv6(&self, rack: &Rack) -> Prefix6 {
        if let Self::Clos(c) = self
            && let Some(p) = c.racks()[rack.at.0 as usize].ipv6
        {
            return p;
        }
        Prefix6::of(embed(rack.prefix.addr), 96 + rack.prefix.len)
    }

    /// The IPv6 address `rack`'s switch answers its hosts on.
    pub fn gateway_ipv6(&self, rack: &Rack) -> Ipv6Addr {
        let gw = crate::forwarding::gateway(self, rack);
        let offset = u32::from(gw) & !crate::prefix::netmask(rack.prefix.len);
        match self {
            Self::Clos(c) if c.racks()[rack.at.0 as usize].ipv6.is_some() => {
                self.rack_ipv6(rack).nth(u128::from(offset))
            }
            _ => embed(gw),
        }
    }

    /// The fabric's SRv6 uSID block: an inventory's, or [`DEFAULT_BLOCK`].
    pub fn usid_block(&self) -> Block {
        match self {
            Self::Clos(c) => c.usid_block().unwrap_or(DEFAULT_BLOCK),
            _ => DEFAULT_BLOCK,
        }
    }

    /// Whether the fabric routes IPv6 in every encoding: an inventory whose racks have IPv6
    /// prefixes. (The generated fabrics carry IPv6 only in the SRv6 encoding.)
    pub fn routes_ipv6(&self) -> bool {
        matches!(self, Self::Clos(c) if c.racks().iter().any(|r| r.ipv6.is_some()))
    }

    /// The IPv6 prefixes every host address of the fabric falls in: the /96 of embedded
    /// addresses, or an inventory's rack prefixes.
    pub fn host_ipv6_prefixes(&self) -> Vec<Prefix6> {
        let embedded = Prefix6::of(HOST6_PREFIX, 96);
        match self {
            Self::Clos(c) => {
                let mut out: Vec<Prefix6> = c.racks().iter().filter_map(|r| r.ipv6).collect();
                if c.racks().iter().any(|r| r.ipv6.is_none()) {
                    out.push(embedded);
                }
                out
            }
            _ => vec![embedded],
        }
    }

    /// A host by name (`h4`, `h.0.1.2.3`) or address.
    pub fn resolve_host(&self, s: &str) -> Result<NodeId> {
        let node = match s.parse::<Ipv4Addr>() {
            Ok(addr) => self.host_by_addr(addr),
            Err(_) => self.graph().find(s),
        }
        .ok_or_else(|| Error::UnknownNode(s.to_owned()))?;
        self.check_host(node)?;
        Ok(node)
    }

    /// The link named `A:B` (node names); the first of parallel links.
    pub fn resolve_link(&self, s: &str) -> Result<LinkId> {
        let (a, b) = s
            .split_once(':')
            .ok_or_else(|| Error::UnknownNode(format!("{s} (write a link as NODE:NODE)")))?;
        let g = self.graph();
        let na = g.find(a).ok_or_else(|| Error::UnknownNode(a.to_owned()))?;
        let nb = g.find(b).ok_or_else(|| Error::UnknownNode(b.to_owned()))?;
        g.links_between(na, nb)
            .next()
            .ok_or_else(|| Error::NoLink(a.to_owned(), b.to_owned()))
    }

    /// The host's own link to its rack switch.
    pub fn host_link(&self, host: NodeId) -> LinkId {
        match self {
            Self::FatTree(f) => f.host_link(host),
            Self::Modric(m) => m.host_link(host).expect("a host"),
            Self::Clos(c) => c.host_link(host),
        }
    }

    /// Pushes every candidate path from `src` to the hosts of `rack` (nothing for its own
    /// rack: a single path without an option).
    pub fn paths_to_rack(&self, src: NodeId, rack: &Rack, push: impl FnMut(u8, u8, &[LinkId])) {
        match self {
            Self::FatTree(f) => f.paths_to_edge(src, rack.at.0, rack.at.1, push),
            Self::Modric(m) => m.paths_to_access(src, rack.at.0, rack.at.1, push),
            Self::Clos(c) => c.paths_to_rack(src, rack.at.0, push),
        }
    }
}
