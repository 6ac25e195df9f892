//! From an inventory to a [`Clos`] model, or every reason it cannot be one. Each refusal names
//! the entries at fault and what to change; all of them are collected, not only the first.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
};

use sopa_common::srv6::{Block, MAX_GLOBAL_USID};

use super::schema::{Inventory, Tier};
use crate::{
    clos::{Clos, ClosRack, EndAddresses},
    graph::{Graph, LinkId, NodeId, NodeKind, Speed},
    prefix::Prefix,
    prefix6::Prefix6,
    srv6::{HOST6_PREFIX, LINK6_BASE},
};

/// The two switches as first cabled, and every cable between them.
type Cables = ((NodeId, NodeId), Vec<String>);

/// Most uplinks one switch can have: a hop byte names one, and 255 means "no choice".
pub const MAX_UPLINKS: usize = 254;

/// One thing the inventory says that SOPA cannot build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    NoRacks,
    DuplicateSwitch(String),
    BadPort {
        link: usize,
        port: String,
    },
    UnknownSwitch {
        link: usize,
        port: String,
    },
    PortTwice {
        port: String,
    },
    SameTier {
        link: usize,
        a: String,
        b: String,
        tier: Tier,
    },
    SkipsTier {
        link: usize,
        a: String,
        b: String,
    },
    Parallel {
        a: String,
        b: String,
        ports: Vec<String>,
    },
    TooManyUplinks {
        switch: String,
        count: usize,
    },
    LinkPrefix {
        link: usize,
        prefix: String,
    },
    UnknownTor {
        rack: usize,
        tor: String,
    },
    TorNotLeaf {
        tor: String,
        tier: Tier,
    },
    TwoRacks {
        tor: String,
    },
    Overlap {
        a: String,
        a_prefix: String,
        b: String,
        b_prefix: String,
    },
    HostOutside {
        host: String,
        addr: String,
        tor: String,
        prefix: String,
    },
    HostIpv6WithoutPrefix {
        host: String,
        tor: String,
    },
    DuplicateHost(String),
    DuplicateAddress {
        addr: String,
        a: String,
        b: String,
    },
    Gateway {
        tor: String,
        gateway: String,
        why: String,
    },
    NoPath {
        a: String,
        b: String,
    },
    Ambiguous {
        top: String,
        leaf: String,
        spines: Vec<String>,
    },
    Usid {
        switch: String,
        why: String,
    },
    UsidBlock {
        block: String,
        why: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoRacks => write!(f, "the inventory has no [[rack]]: nothing to route to"),
            Refusal::DuplicateSwitch(n) => {
                write!(
                    f,
                    "switch {n:?} is listed twice: give every switch one entry"
                )
            }
            Refusal::BadPort { link, port } => write!(
                f,
                "link {link}: {port:?} is not a port; write it as SWITCH:PORT (\"leaf1:swp49\")"
            ),
            Refusal::UnknownSwitch { link, port } => write!(
                f,
                "link {link} ({port}) names a switch no [[switch]] lists: add it or fix the name"
            ),
            Refusal::PortTwice { port } => {
                write!(f, "port {port} is cabled twice: a port holds one link")
            }
            Refusal::SameTier { link, a, b, tier } => write!(
                f,
                "link {link} joins {a} and {b}, both {tier}s: a Clos links only adjacent tiers"
            ),
            Refusal::SkipsTier { link, a, b } => write!(
                f,
                "link {link} joins {a} and {b}, two tiers apart: the option carries one choice \
                 per tier, so a link may only join adjacent tiers"
            ),
            Refusal::Parallel { a, b, ports } => write!(
                f,
                "{a} and {b} are joined by {} links ({}): a path takes one link per hop; bond \
                 them and list the bond once",
                ports.len(),
                ports.join(", ")
            ),
            Refusal::TooManyUplinks { switch, count } => write!(
                f,
                "{switch} has {count} uplinks: a path's hop byte names at most {MAX_UPLINKS}"
            ),
            Refusal::LinkPrefix { link, prefix } => write!(
                f,
                "link {link}: subnet {prefix} holds fewer than two addresses (use a /31 or /127, \
                 or shorter)"
            ),
            Refusal::UnknownTor { rack, tor } => write!(
                f,
                "rack {rack}: its tor {tor:?} is not a [[switch]]: add it or fix the name"
            ),
            Refusal::TorNotLeaf { tor, tier } => write!(
                f,
                "rack of {tor}: {tor} is a {tier}; hosts hang off leaves (tier = \"leaf\")"
            ),
            Refusal::TwoRacks { tor } => write!(
                f,
                "{tor} is the tor of two racks: give it one [[rack]] (one IPv4 and one IPv6 \
                 prefix)"
            ),
            Refusal::Overlap {
                a,
                a_prefix,
                b,
                b_prefix,
            } => write!(
                f,
                "the prefix {a_prefix} of {a} overlaps {b_prefix} of {b}: each address belongs \
                 to one place"
            ),
            Refusal::HostOutside {
                host,
                addr,
                tor,
                prefix,
            } => write!(
                f,
                "host {host}'s address {addr} is outside its rack's prefix {prefix} ({tor}): fix \
                 the address or the prefix"
            ),
            Refusal::HostIpv6WithoutPrefix { host, tor } => write!(
                f,
                "host {host} has an IPv6 address but the rack of {tor} has no ipv6 prefix: add one"
            ),
            Refusal::DuplicateHost(n) => write!(f, "host {n:?} is listed twice"),
            Refusal::DuplicateAddress { addr, a, b } => {
                write!(f, "address {addr} is given to both {a} and {b}")
            }
            Refusal::Gateway { tor, gateway, why } => {
                write!(f, "the gateway {gateway} of the rack of {tor} {why}")
            }
            Refusal::NoPath { a, b } => write!(
                f,
                "no up-down path joins the racks of {a} and {b}: the fabric is cut in two; cable \
                 them to a common spine or super-spine"
            ),
            Refusal::Ambiguous { top, leaf, spines } => write!(
                f,
                "{top} reaches {leaf} through {} spines ({}): the option carries only the \
                 choices going up, so a super-spine must reach each leaf through one spine",
                spines.len(),
                spines.join(", ")
            ),
            Refusal::Usid { switch, why } => write!(f, "the uSID of {switch} {why}"),
            Refusal::UsidBlock { block, why } => write!(f, "usid_block {block} {why}"),
        }
    }
}

/// Every refusal of one inventory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusals(pub Vec<Refusal>);

impl fmt::Display for Refusals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the inventory is refused ({} problems):", self.0.len())?;
        for r in &self.0 {
            write!(f, "\n  - {r}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refusals {}

fn kind(tier: Tier) -> NodeKind {
    match tier {
        Tier::Leaf => NodeKind::Edge,
        Tier::Spine => NodeKind::Aggregation,
        Tier::SuperSpine => NodeKind::Core,
    }
}

fn ends4(p: Prefix) -> Option<EndAddresses<Ipv4Addr>> {
    let base = u32::from(p.addr);
    match p.len {
        31 => Some((Ipv4Addr::from(base), Ipv4Addr::from(base + 1), 31)),
        len if len < 31 => Some((Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2), len)),
        _ => None,
    }
}

fn ends6(p: Prefix6) -> Option<EndAddresses<Ipv6Addr>> {
    match p.len {
        127 => Some((p.nth(0), p.nth(1), 127)),
        len if len < 127 => Some((p.nth(1), p.nth(2), len)),
        _ => None,
    }
}

/// The model of `inv`, or every reason there is none.
pub fn build(inv: &Inventory) -> Result<Clos, Refusals> {
    let mut no = Vec::new();
    if inv.racks.is_empty() {
        no.push(Refusal::NoRacks);
    }
    // Switches by name.
    let mut tier_of: HashMap<&str, (usize, Tier)> = HashMap::new();
    for (i, s) in inv.switches.iter().enumerate() {
        if tier_of.insert(&s.name, (i, s.tier)).is_some() {
            no.push(Refusal::DuplicateSwitch(s.name.clone()));
        }
    }
    // Racks: one per leaf.
    let mut rack_of_tor: HashMap<&str, usize> = HashMap::new();
    for (r, rack) in inv.racks.iter().enumerate() {
        match tier_of.get(rack.tor.as_str()) {
            None => no.push(Refusal::UnknownTor {
                rack: r + 1,
                tor: rack.tor.clone(),
            }),
            Some((_, t)) if *t != Tier::Leaf => no.push(Refusal::TorNotLeaf {
                tor: rack.tor.clone(),
                tier: *t,
            }),
            Some(_) => {
                if rack_of_tor.insert(&rack.tor, r).is_some() {
                    no.push(Refusal::TwoRacks {
                        tor: rack.tor.clone(),
                    });
                }
            }
        }
    }
    check_prefixes(inv, &mut no);
    let hosts = check_hosts(inv, &mut no);

    // The graph: hosts, then switches, then host links, then switch links.
    let mut g = Graph::default();
    let mut level = Vec::new();
    let mut host_rack = Vec::new();
    let mut host6 = Vec::new();
    let mut by_addr = HashMap::new();
    for (r, rack) in inv.racks.iter().enumerate() {
        for (h, host) in rack.hosts.iter().enumerate() {
            let id = g.add_node(NodeKind::Host, host.name.clone(), Some(host.ipv4));
            level.push(0);
            host_rack.push(r as u32);
            host6.push(hosts[r][h]);
            by_addr.insert(host.ipv4, id);
        }
    }
    let first_switch = g.nodes.len() as NodeId;
    for s in &inv.switches {
        g.add_node(kind(s.tier), s.name.clone(), None);
        level.push(s.tier.level());
    }
    let switch_id = |name: &str| tier_of.get(name).map(|(i, _)| first_switch + *i as NodeId);
    let mut port_names: Vec<[Option<String>; 2]> = Vec::new();
    let mut link4 = Vec::new();
    let mut link6 = Vec::new();
    let mut ports_used: HashSet<String> = HashSet::new();
    for rack in &inv.racks {
        let tor = switch_id(&rack.tor);
        for host in &rack.hosts {
            let id = by_addr.get(&host.ipv4).copied();
            // A rack refused above leaves its hosts unlinked: the model is not returned.
            if let (Some(tor), Some(id)) = (tor, id) {
                g.add_link(id, tor, Speed::S2);
            }
            if let Some(p) = &host.port {
                let full = format!("{}:{p}", rack.tor);
                if !ports_used.insert(full.clone()) {
                    no.push(Refusal::PortTwice { port: full });
                }
            }
            port_names.push([None, host.port.clone()]);
            link4.push(None);
            link6.push(None);
        }
    }
    // Per switch pair: the pair as first cabled, and every cable between them.
    let mut pairs: BTreeMap<(NodeId, NodeId), Cables> = BTreeMap::new();
    for (i, link) in inv.links.iter().enumerate() {
        let n = i + 1;
        let mut ends = Vec::new();
        for port in [&link.a, &link.b] {
            let Some((sw, p)) = port
                .split_once(':')
                .filter(|(s, p)| !s.is_empty() && !p.is_empty())
            else {
                no.push(Refusal::BadPort {
                    link: n,
                    port: port.clone(),
                });
                continue;
            };
            let Some(id) = switch_id(sw) else {
                no.push(Refusal::UnknownSwitch {
                    link: n,
                    port: port.clone(),
                });
                continue;
            };
            if !ports_used.insert(port.clone()) {
                no.push(Refusal::PortTwice { port: port.clone() });
            }
            ends.push((id, p.to_owned(), tier_of[sw].1));
        }
        let v4 = link.ipv4.map(|p| {
            ends4(p).ok_or(Refusal::LinkPrefix {
                link: n,
                prefix: p.to_string(),
            })
        });
        let v6 = link.ipv6.map(|p| {
            ends6(p).ok_or(Refusal::LinkPrefix {
                link: n,
                prefix: p.to_string(),
            })
        });
        let (v4, v6) = match (v4.transpose(), v6.transpose()) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                no.extend(a.err());
                no.extend(b.err());
                continue;
            }
        };
        let [(a, ap, at), (b, bp, bt)] = match <[_; 2]>::try_from(ends) {
            Ok(e) => e,
            Err(_) => continue,
        };
        let (an, bn) = (g.name(a).to_owned(), g.name(b).to_owned());
        if at == bt {
            no.push(Refusal::SameTier {
                link: n,
                a: an,
                b: bn,
                tier: at,
            });
            continue;
        }
        if at.level().abs_diff(bt.level()) != 1 {
            no.push(Refusal::SkipsTier {
                link: n,
                a: an,
                b: bn,
            });
            continue;
        }
        pairs
            .entry((a.min(b), a.max(b)))
            .or_insert_with(|| ((a, b), Vec::new()))
            .1
            .push(format!("{an}:{ap} - {bn}:{bp}"));
        g.add_link(a, b, Speed::S2);
        port_names.push([Some(ap), Some(bp)]);
        link4.push(v4);
        link6.push(v6);
    }
    for ((a, b), ports) in pairs.values() {
        if ports.len() > 1 {
            no.push(Refusal::Parallel {
                a: g.name(*a).to_owned(),
                b: g.name(*b).to_owned(),
                ports: ports.clone(),
            });
        }
    }
    let up: Vec<Vec<(LinkId, NodeId)>> = (0..g.nodes.len() as NodeId)
        .map(|n| {
            g.ports(n)
                .iter()
                .filter(|(_, m)| level[*m as usize] > level[n as usize] && level[n as usize] > 0)
                .copied()
                .collect()
        })
        .collect();
    for (n, ups) in up.iter().enumerate() {
        if ups.len() > MAX_UPLINKS {
            no.push(Refusal::TooManyUplinks {
                switch: g.name(n as NodeId).to_owned(),
                count: ups.len(),
            });
        }
    }
    let usid = check_usids(inv, &g, first_switch, &mut no);
    let usid_block = check_block(inv, &mut no);
    let racks: Vec<ClosRack> = inv
        .racks
        .iter()
        .map(|r| ClosRack {
            tor: switch_id(&r.tor).unwrap_or(0),
            ipv4: r.ipv4,
            ipv6: r.ipv6,
            gateway: r.gateway.unwrap_or_else(|| first_address(r.ipv4)),
        })
        .collect();
    if !no.is_empty() {
        return Err(Refusals(no));
    }
    let clos = Clos {
        inventory: inv.clone(),
        graph: g,
        level,
        racks,
        host_rack,
        port_names,
        link4,
        link6,
        host6,
        by_addr,
        up,
        usid,
        usid_block,
    };
    check_paths(&clos, &mut no);
    if no.is_empty() {
        Ok(clos)
    } else {
        Err(Refusals(no))
    }
}

fn first_address(p: Prefix) -> Ipv4Addr {
    let base = u32::from(p.addr);
    Ipv4Addr::from(if p.len >= 31 { base } else { base + 1 })
}

fn check_prefixes(inv: &Inventory, no: &mut Vec<Refusal>) {
    for (i, a) in inv.racks.iter().enumerate() {
        for b in &inv.racks[i + 1..] {
            let len = a.ipv4.len.min(b.ipv4.len);
            if Prefix::of(a.ipv4.addr, len) == Prefix::of(b.ipv4.addr, len) {
                no.push(Refusal::Overlap {
                    a: a.tor.clone(),
                    a_prefix: a.ipv4.to_string(),
                    b: b.tor.clone(),
                    b_prefix: b.ipv4.to_string(),
                });
            }
            if let (Some(x), Some(y)) = (a.ipv6, b.ipv6)
                && x.overlaps(&y)
            {
                no.push(Refusal::Overlap {
                    a: a.tor.clone(),
                    a_prefix: x.to_string(),
                    b: b.tor.clone(),
                    b_prefix: y.to_string(),
                });
            }
        }
    }
}

/// Checks hosts and gateways; returns each host's IPv6 address (rack, host).
fn check_hosts(inv: &Inventory, no: &mut Vec<Refusal>) -> Vec<Vec<Option<Ipv6Addr>>> {
    let mut names = HashSet::new();
    let mut addrs: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for rack in &inv.racks {
        let gw = rack.gateway.unwrap_or_else(|| first_address(rack.ipv4));
        if !rack.ipv4.contains_addr(gw) {
            no.push(Refusal::Gateway {
                tor: rack.tor.clone(),
                gateway: gw.to_string(),
                why: format!("is outside the rack's prefix {}", rack.ipv4),
            });
        }
        addrs.insert(gw.to_string(), format!("the gateway of {}", rack.tor));
        let mut six = Vec::new();
        for host in &rack.hosts {
            if !names.insert(host.name.as_str()) {
                no.push(Refusal::DuplicateHost(host.name.clone()));
            }
            if !rack.ipv4.contains_addr(host.ipv4) {
                no.push(Refusal::HostOutside {
                    host: host.name.clone(),
                    addr: host.ipv4.to_string(),
                    tor: rack.tor.clone(),
                    prefix: rack.ipv4.to_string(),
                });
            }
            let v6 = match (host.ipv6, rack.ipv6) {
                (Some(a), Some(p)) => {
                    if !p.contains_addr(a) {
                        no.push(Refusal::HostOutside {
                            host: host.name.clone(),
                            addr: a.to_string(),
                            tor: rack.tor.clone(),
                            prefix: p.to_string(),
                        });
                    }
                    Some(a)
                }
                (Some(_), None) => {
                    no.push(Refusal::HostIpv6WithoutPrefix {
                        host: host.name.clone(),
                        tor: rack.tor.clone(),
                    });
                    None
                }
                (None, Some(p)) => Some(p.nth(u128::from(
                    u32::from(host.ipv4) & !crate::prefix::netmask(rack.ipv4.len),
                ))),
                (None, None) => None,
            };
            for a in [Some(host.ipv4.to_string()), v6.map(|a| a.to_string())]
                .into_iter()
                .flatten()
            {
                if let Some(first) = addrs.insert(a.clone(), host.name.clone()) {
                    no.push(Refusal::DuplicateAddress {
                        addr: a,
                        a: first,
                        b: host.name.clone(),
                    });
                }
            }
            six.push(v6);
        }
        out.push(six);
    }
    out
}

fn check_usids(
    inv: &Inventory,
    g: &Graph,
    first_switch: NodeId,
    no: &mut Vec<Refusal>,
) -> Vec<Option<u16>> {
    let mut out = vec![None; g.nodes.len()];
    let mut seen: HashMap<u16, &str> = HashMap::new();
    for (i, s) in inv.switches.iter().enumerate() {
        let Some(u) = s.usid else { continue };
        if u == 0 || u > MAX_GLOBAL_USID {
            no.push(Refusal::Usid {
                switch: s.name.clone(),
                why: format!("{u:#x} is outside the global uSIDs 0x1 to {MAX_GLOBAL_USID:#x}"),
            });
        } else if let Some(other) = seen.insert(u, &s.name) {
            no.push(Refusal::Usid {
                switch: s.name.clone(),
                why: format!("{u:#x} is also {other}'s"),
            });
        }
        out[first_switch as usize + i] = Some(u);
    }
    out
}

/// The inventory's uSID block: a /32 of unicast addresses no host or link address is in (the
/// switches route every address of it as a uSID list).
fn check_block(inv: &Inventory, no: &mut Vec<Refusal>) -> Option<Block> {
    let b = inv.usid_block?;
    let mut refuse = |why: String| {
        no.push(Refusal::UsidBlock {
            block: b.to_string(),
            why,
        })
    };
    if b.len != 32 {
        refuse(format!(
            "is a /{}: the block is the first 32 bits of every path address (F3216: a 32-bit \
             block, 16-bit uSIDs); give a /32",
            b.len
        ));
        return None;
    }
    let reserved: [(&str, Prefix6); 3] = [
        ("multicast", "ff00::/8".parse().expect("a prefix")),
        ("link-local", "fe80::/10".parse().expect("a prefix")),
        (
            "the unspecified, loopback and IPv4-mapped addresses",
            "::/32".parse().expect("a prefix"),
        ),
    ];
    if let Some((what, p)) = reserved.iter().find(|(_, p)| p.overlaps(&b)) {
        refuse(format!(
            "overlaps {p} ({what}): give a block of global or unique-local unicast addresses"
        ));
        return None;
    }
    let mut taken: Vec<(String, Prefix6)> = Vec::new();
    for r in &inv.racks {
        match r.ipv6 {
            Some(p) => taken.push((format!("the rack of {}", r.tor), p)),
            None => taken.push((
                "the hosts' embedded IPv4 addresses".into(),
                Prefix6::of(HOST6_PREFIX, 96),
            )),
        }
    }
    for (i, l) in inv.links.iter().enumerate() {
        match l.ipv6 {
            Some(p) => taken.push((format!("link {} ({} - {})", i + 1, l.a, l.b), p)),
            None => taken.push((
                "the links' default IPv6 addresses".into(),
                Prefix6::of(LINK6_BASE, 96),
            )),
        }
    }
    let mut said = HashSet::new();
    let mut clash = false;
    for (what, p) in taken {
        if p.overlaps(&b) && said.insert(what.clone()) {
            refuse(format!(
                "overlaps {p} of {what}: a switch would take those addresses for uSID lists; \
                 give a block no host or link address is in"
            ));
            clash = true;
        }
    }
    if clash {
        return None;
    }
    let a = b.addr.octets();
    Some([a[0], a[1], a[2], a[3]])
}

/// Every rack pair joined by an up-down path, and every super-spine reaching each leaf through
/// at most one spine.
fn check_paths(clos: &Clos, no: &mut Vec<Refusal>) {
    let g = &clos.graph;
    // Per super-spine: the spines through which it reaches each leaf.
    let mut via: BTreeMap<(NodeId, NodeId), Vec<NodeId>> = BTreeMap::new();
    for top in (0..g.nodes.len() as NodeId).filter(|n| clos.level(*n) == 3) {
        for &(_, spine) in g.ports(top) {
            for &(_, leaf) in g.ports(spine) {
                if clos.level(leaf) == 1 {
                    via.entry((top, leaf)).or_default().push(spine);
                }
            }
        }
    }
    for ((top, leaf), spines) in &via {
        if spines.len() > 1 {
            no.push(Refusal::Ambiguous {
                top: g.name(*top).to_owned(),
                leaf: g.name(*leaf).to_owned(),
                spines: spines.iter().map(|s| g.name(*s).to_owned()).collect(),
            });
        }
    }
    // Which tops (spines, super-spines) each rack's leaf reaches going up: two racks are
    // joined when one leaf's up-set meets the other's down-set, which for a Clos is the same.
    let words = g.nodes.len().div_ceil(64);
    let reach: Vec<Vec<u64>> = clos
        .racks
        .iter()
        .map(|r| {
            let mut bits = vec![0u64; words];
            for &(_, s) in clos.uplinks(r.tor) {
                bits[s as usize / 64] |= 1 << (s % 64);
                for &(_, c) in clos.uplinks(s) {
                    // A super-spine reached up over one spine reaches the leaf back down.
                    bits[c as usize / 64] |= 1 << (c % 64);
                }
            }
            bits
        })
        .collect();
    for (i, a) in reach.iter().enumerate() {
        for (j, b) in reach.iter().enumerate().skip(i + 1) {
            if !a.iter().zip(b).any(|(x, y)| x & y != 0) {
                no.push(Refusal::NoPath {
                    a: g.name(clos.racks[i].tor).to_owned(),
                    b: g.name(clos.racks[j].tor).to_owned(),
                });
            }
        }
    }
}
