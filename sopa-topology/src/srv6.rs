//! A fabric's IPv6 and SRv6 plan, shared by the controller, the agents and the testbed: how
//! paths travel ([`Encoding`]), every node's IPv6 addresses, every switch's uSID, and what a
//! host's uSID lists and a switch's SRv6 routes are (`sopa_common::srv6` has the wire format).
//!
//! - A host's IPv6 address embeds its IPv4 one: [`HOST6_PREFIX`] (a /96) plus the 32 bits, so
//!   a rack's IPv6 prefix is the /96 plus its IPv4 prefix length. A switch answers its hosts on
//!   the embedding of its IPv4 gateway address.
//! - Switch-to-switch link `L` is the /127 [`LINK6_BASE`] + 2L, its `a` end the even address.
//! - Every path address begins with the fabric's 32-bit uSID block ([`Topology::usid_block`]:
//!   an inventory's `usid_block`, `fcbb:bb00::/32` where it gives none).
//! - Switch `n` (the n-th switch in node order) has uSID `n + 1` (or an inventory's): its
//!   locator `block:uSID::/48` is a `seg6local` End route with the NEXT-C-SID flavour.
//! - A host receives on `block:<its rack switch's uSID>:<its local uSID>::`, a /64 its rack
//!   switch routes to it (more specific than the switch's own locator, so that switch forwards
//!   the address as it is and the host's XDP program removes the outer header).
//! - A path's list: the uSIDs of the switches its decisions choose (the far end of each
//!   decision link), then the destination's rack switch, then the destination's local uSID.
//!   Between them, switches route the next uSID's locator on their ordinary IPv6 routes.

use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use serde::{Deserialize, Serialize};
use sopa_common::{
    srv6::{Block, MAX_GLOBAL_USID, address, host_lid},
    wire::HOP_NONE,
};

use crate::{
    Error, Hops, LinkId, NodeId, NodeKind, Prefix, Result, Topology, forwarding,
    paths::{Failures, PathTable},
};

/// How the hosts carry the chosen path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Encoding {
    /// The paper's IPv4 option: software or programmable switches running `tc_forward`.
    #[default]
    Ipv4Option,
    /// The path as a uSID list in an outer IPv6 header: any SRv6 fabric, no program on a switch.
    Srv6,
    /// The path as the flow label a hashing switch spreads on, learned by probing: fabrics
    /// whose switches only hash (`crate::entropy`).
    Entropy,
}

impl Encoding {
    pub const ALL: [Encoding; 3] = [Encoding::Ipv4Option, Encoding::Srv6, Encoding::Entropy];

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Ipv4Option => "ipv4-option",
            Encoding::Srv6 => "srv6",
            Encoding::Entropy => "entropy",
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Encoding {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                format!("encoding {s:?} is not known: use \"ipv4-option\", \"srv6\" or \"entropy\"")
            })
    }
}

/// Hosts' IPv6 addresses: this /96 plus their IPv4 address.
pub const HOST6_PREFIX: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x5a, 0, 0, 0, 0, 0, 0);
/// The base of switch-to-switch link addresses (one /127 per link).
pub const LINK6_BASE: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x5b, 0, 0, 0, 0, 0, 0);

/// The IPv6 address that embeds `v4`.
pub fn embed(v4: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(HOST6_PREFIX) | u128::from(u32::from(v4)))
}

/// The two addresses of switch-to-switch link `link` (its `a` end first) and the subnet's
/// length: the inventory's, or else the /127 [`LINK6_BASE`] + 2 * `link`.
pub fn link_addresses6(topo: &Topology, link: LinkId) -> (Ipv6Addr, Ipv6Addr, u8) {
    if let Topology::Clos(c) = topo
        && let Some(ends) = c.link_ipv6(link)
    {
        return ends;
    }
    let base = u128::from(LINK6_BASE) + 2 * u128::from(link);
    (Ipv6Addr::from(base), Ipv6Addr::from(base + 1), 127)
}

/// Every switch's uSID, by node, and the block they are in.
#[derive(Clone, Debug)]
pub struct Usids {
    usids: Vec<u16>,
    pub block: Block,
}

impl Usids {
    /// Numbers the switches of `topo` in node order from 1, skipping the uSIDs an inventory
    /// gives (those switches keep theirs).
    pub fn of(topo: &Topology) -> Result<Self> {
        let g = topo.graph();
        let mut next: u32 = 1;
        let mut out = vec![0; g.nodes.len()];
        let given = |i: usize| match topo {
            Topology::Clos(c) => c.usid(i as NodeId),
            _ => None,
        };
        let taken: std::collections::HashSet<u16> = (0..g.nodes.len()).filter_map(given).collect();
        for (i, n) in g.nodes.iter().enumerate() {
            if let Some(u) = given(i) {
                out[i] = u;
                continue;
            }
            if n.kind.is_switch() {
                while taken.contains(&(next as u16)) && next <= u32::from(MAX_GLOBAL_USID) {
                    next += 1;
                }
                if next > u32::from(MAX_GLOBAL_USID) {
                    return Err(Error::Invalid(format!(
                        "{} has more switches than the {MAX_GLOBAL_USID} global uSIDs of one \
                         block: the SRv6 encoding needs a second block",
                        topo.name()
                    )));
                }
                out[i] = next as u16;
                next += 1;
            }
        }
        Ok(Self {
            usids: out,
            block: topo.usid_block(),
        })
    }

    /// The uSID of switch `node` (0 for a host).
    pub fn get(&self, node: NodeId) -> u16 {
        self.usids[node as usize]
    }

    /// The address of the uSID list `list` in this block.
    pub fn address(&self, list: &[u16]) -> Ipv6Addr {
        Ipv6Addr::from(address(self.block, list))
    }
}

/// The locator of a switch of uSID `usid` in `block`: `block:uSID::/48`.
pub fn locator(block: Block, usid: u16) -> (Ipv6Addr, u8) {
    (Ipv6Addr::from(address(block, &[usid])), 48)
}

/// Where host `host` receives: its rack switch's uSID and its own local uSID.
pub fn receive_address(topo: &Topology, usids: &Usids, host: NodeId) -> Result<Ipv6Addr> {
    let rack = topo.rack_of(host)?;
    let addr = topo.graph().node(host).addr.expect("hosts have addresses");
    let lid = local_usid(addr, &rack.prefix).ok_or_else(|| {
        Error::Invalid(format!(
            "host {addr} is past the local uSIDs of its rack {} (a /19 or longer prefix has them)",
            rack.prefix
        ))
    })?;
    Ok(usids.address(&[usids.get(rack.tor), lid]))
}

/// The host bits of a prefix of length `len`.
pub fn host_mask(len: u8) -> u32 {
    u32::MAX.checked_shr(u32::from(len)).unwrap_or(0)
}

/// The local uSID of the host at `addr` in `rack`.
pub fn local_usid(addr: Ipv4Addr, rack: &Prefix) -> Option<u16> {
    host_lid(u32::from(addr) & host_mask(rack.len))
}

/// One destination's uSIDs as a host's datapath takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Srv6Destination {
    pub prefix: Prefix,
    /// Per candidate path, the uSIDs of the switches its decisions choose.
    pub chosen: Vec<(Hops, Vec<u16>)>,
    /// After them: the destination's rack switch.
    pub tail: Vec<u16>,
}

/// What host `table.source` needs to encapsulate: its addresses and every destination's lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPlan {
    pub source: Ipv6Addr,
    pub receive: Ipv6Addr,
    pub destinations: Vec<Srv6Destination>,
}

/// The SRv6 plan of the host whose candidate paths are `table` (every candidate, alive or not:
/// a failure changes which paths are used, never their lists).
pub fn host_plan(topo: &Topology, table: &PathTable) -> Result<HostPlan> {
    let usids = Usids::of(topo)?;
    let g = topo.graph();
    let src = table.source;
    let mut destinations = Vec::with_capacity(table.destinations.len());
    for d in &table.destinations {
        let mut chosen = Vec::with_capacity(d.candidates.len());
        for c in &d.candidates {
            let mut node = src;
            let mut list = Vec::with_capacity(2);
            for (i, link) in table.links(c).iter().enumerate() {
                node = g.links[*link as usize].other(node);
                // links[1] leaves the source's rack switch by hop0; links[2], where there is
                // a second decision, leaves the switch that took it by hop1.
                if i == 1 || (i == 2 && c.hops.hop1 != HOP_NONE) {
                    list.push(usids.get(node));
                }
            }
            chosen.push((c.hops, list));
        }
        destinations.push(Srv6Destination {
            prefix: d.prefix(),
            chosen,
            tail: vec![usids.get(d.rack.tor)],
        });
    }
    Ok(HostPlan {
        source: topo.host_ipv6(src),
        receive: receive_address(topo, &usids, src)?,
        destinations,
    })
}

/// An IPv6 route of a switch in the SRv6 encoding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Srv6Route {
    /// The switch's own locator: End with the NEXT-C-SID flavour.
    End { usid: u16 },
    /// Another switch's locator (a neighbour's, or a rack switch's), over these links.
    Locator { usid: u16, links: Vec<LinkId> },
    /// A host's receive address (a /64 under this rack switch's locator), over its link.
    Host {
        host: NodeId,
        addr: Ipv6Addr,
        link: LinkId,
    },
    /// A rack's IPv6 prefix (the inventory's, or its IPv4 one embedded), over the links its IPv4 route takes:
    /// IPv6 that is not encapsulated (neighbour discovery aside: ICMPv6, a host without an
    /// agent) is routed like IPv4.
    Rack6 {
        addr: Ipv6Addr,
        len: u8,
        links: Vec<LinkId>,
    },
}

/// Switch `node`'s SRv6 routes under `failures`: its own locator; its neighbours' locators over
/// the direct links that are up (the lists name the next switch after a decision, always a neighbour);
/// every rack switch's locator and every rack's IPv6 prefix over the live shortest paths, as
/// the IPv4 rack routes go; and, at a rack switch, each host's receive address.
pub fn switch_routes(topo: &Topology, node: NodeId, failures: &Failures) -> Result<Vec<Srv6Route>> {
    let usids = Usids::of(topo)?;
    let g = topo.graph();
    let mut out = vec![Srv6Route::End {
        usid: usids.get(node),
    }];
    let racks = topo.racks();
    let mut neighbours = std::collections::BTreeSet::new();
    for &(link, other) in g.ports(node) {
        // Over a link that is down, nothing: a path through it is withdrawn, and the route
        // comes back (installed again) with the link.
        if !failures.usable(g, link) {
            continue;
        }
        if g.node(other).kind.is_switch() {
            neighbours.insert(other);
            out.push(Srv6Route::Locator {
                usid: usids.get(other),
                links: vec![link],
            });
        } else if g.node(other).kind == NodeKind::Host {
            out.push(Srv6Route::Host {
                host: other,
                addr: receive_address(topo, &usids, other)?,
                link,
            });
        }
    }
    for route in forwarding::routes(topo, node, failures) {
        if route.prefix.len == 32 {
            continue;
        }
        let Some(rack) = racks.iter().find(|r| r.prefix == route.prefix) else {
            continue;
        };
        let six = topo.rack_ipv6(rack);
        out.push(Srv6Route::Rack6 {
            addr: six.addr,
            len: six.len,
            links: route.links.clone(),
        });
        if neighbours.contains(&rack.tor) {
            continue;
        }
        out.push(Srv6Route::Locator {
            usid: usids.get(rack.tor),
            links: route.links,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySpec;

    fn fat_tree() -> Topology {
        Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap()
    }

    #[test]
    fn names_parse_back() {
        for e in Encoding::ALL {
            assert_eq!(e.name().parse::<Encoding>().unwrap(), e);
        }
        assert!("mpls".parse::<Encoding>().unwrap_err().contains("mpls"));
    }

    #[test]
    fn a_fat_tree_path_names_its_aggregation_and_core_switches_then_the_rack() {
        let topo = fat_tree();
        let g = topo.graph();
        let usids = Usids::of(&topo).unwrap();
        let src = g.find("h0").unwrap();
        let table = PathTable::compute(&topo, src, &Failures::none(g)).unwrap();
        let plan = host_plan(&topo, &table).unwrap();
        assert_eq!(plan.source, "fd00:5a::a00:2".parse::<Ipv6Addr>().unwrap());
        let tor = topo.rack_of(src).unwrap().tor;
        assert_eq!(plan.receive, usids.address(&[usids.get(tor), 0xE002]));
        for (d, table_d) in plan.destinations.iter().zip(&table.destinations) {
            assert_eq!(d.tail, vec![usids.get(table_d.rack.tor)]);
            for ((hops, list), c) in d.chosen.iter().zip(&table_d.candidates) {
                // Every chosen switch is the far end of a decision link, in path order.
                let links = table.links(c);
                let far = |i: usize, from: NodeId| g.links[links[i] as usize].other(from);
                let first = far(1, tor);
                assert_eq!(list[0], usids.get(first), "{hops}");
                assert_eq!(g.node(first).kind, NodeKind::Aggregation);
                if hops.hop1 == HOP_NONE {
                    assert_eq!(list.len(), 1);
                } else {
                    let second = far(2, first);
                    assert_eq!(list, &vec![usids.get(first), usids.get(second)]);
                    assert_eq!(g.node(second).kind, NodeKind::Core);
                }
            }
        }
    }

    #[test]
    fn switch_usids_are_unique_and_never_local_or_zero() {
        let topo = fat_tree();
        let g = topo.graph();
        let usids = Usids::of(&topo).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for n in 0..g.nodes.len() as NodeId {
            if g.node(n).kind.is_switch() {
                let u = usids.get(n);
                assert!(u > 0 && u <= MAX_GLOBAL_USID);
                assert!(seen.insert(u), "uSID {u} twice");
            }
        }
    }

    #[test]
    fn an_edge_switch_routes_its_hosts_its_neighbours_and_every_other_rack() {
        let topo = fat_tree();
        let g = topo.graph();
        let usids = Usids::of(&topo).unwrap();
        let e0 = g.find("e0").unwrap();
        let routes = switch_routes(&topo, e0, &Failures::none(g)).unwrap();
        assert!(routes.contains(&Srv6Route::End {
            usid: usids.get(e0)
        }));
        let hosts = routes
            .iter()
            .filter(|r| matches!(r, Srv6Route::Host { .. }))
            .count();
        assert_eq!(hosts, 2);
        // 2 aggregation neighbours, and the 7 other edge switches (none a neighbour).
        let locators: Vec<u16> = routes
            .iter()
            .filter_map(|r| match r {
                Srv6Route::Locator { usid, .. } => Some(*usid),
                _ => None,
            })
            .collect();
        assert_eq!(locators.len(), 2 + 7, "{locators:?}");
        // The other edge of its pod by either aggregation switch; another pod's the same.
        let e2 = g.find("e2").unwrap();
        let to_e2 = routes.iter().find_map(|r| match r {
            Srv6Route::Locator { usid, links } if *usid == usids.get(e2) => Some(links.len()),
            _ => None,
        });
        assert_eq!(to_e2, Some(2));
        // e0 - a0 down: nothing over it any more, e2 by a1 alone.
        let a0 = g.find("a0").unwrap();
        let link = g.links_between(e0, a0).next().unwrap();
        let mut failures = Failures::none(g);
        failures.set_link(link, true);
        let routes = switch_routes(&topo, e0, &failures).unwrap();
        let over_it = routes.iter().any(|r| match r {
            Srv6Route::Locator { links, .. } | Srv6Route::Rack6 { links, .. } => {
                links.contains(&link)
            }
            _ => false,
        });
        assert!(!over_it, "{routes:?}");
        assert!(
            !routes
                .iter()
                .any(|r| matches!(r, Srv6Route::Locator { usid, .. } if *usid == usids.get(a0)))
        );
    }

    #[test]
    fn every_modric_path_names_one_or_two_switches_each_a_neighbour_of_the_last() {
        use crate::modric::ModricParams;
        for (m, n, q, x) in [(2, 2, 1, 2), (3, 3, 2, 4)] {
            let topo =
                Topology::build(&TopologySpec::Modric(ModricParams::new(m, n, q, x, 1))).unwrap();
            let g = topo.graph();
            let usids = Usids::of(&topo).unwrap();
            let by_usid = |u: u16| {
                (0..g.nodes.len() as NodeId)
                    .find(|n| g.node(*n).kind.is_switch() && usids.get(*n) == u)
                    .unwrap()
            };
            for src in (0..g.nodes.len() as NodeId).filter(|n| g.node(*n).kind == NodeKind::Host) {
                let table = PathTable::compute(&topo, src, &Failures::none(g)).unwrap();
                let plan = host_plan(&topo, &table).unwrap();
                let tor = topo.rack_of(src).unwrap().tor;
                for d in &plan.destinations {
                    for (hops, list) in &d.chosen {
                        let want = if hops.hop1 == HOP_NONE { 1 } else { 2 };
                        assert_eq!(list.len(), want, "{hops}");
                        let mut at = tor;
                        for u in list {
                            let next = by_usid(*u);
                            assert!(
                                g.links_between(at, next).next().is_some(),
                                "{} -> {}: not neighbours",
                                g.name(at),
                                g.name(next)
                            );
                            at = next;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn link_and_host_addresses() {
        assert_eq!(
            link_addresses6(&fat_tree(), 3),
            (
                "fd00:5b::6".parse().unwrap(),
                "fd00:5b::7".parse().unwrap(),
                127
            )
        );
        assert_eq!(
            embed(Ipv4Addr::new(10, 2, 1, 3)),
            "fd00:5a::a02:103".parse::<Ipv6Addr>().unwrap()
        );
    }
}
