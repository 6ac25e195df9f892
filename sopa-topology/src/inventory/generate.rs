//! Inventories of regular fabrics, written as an operator would: the Fat-Tree of the SOPA paper
//! with its names and addresses (the same graph, node for node and link for link, as
//! [`crate::fat_tree::FatTree`]), and a two-tier leaf-spine carved from the prefixes given.

use std::net::Ipv4Addr;

use super::schema::{HostEntry, Inventory, LinkEntry, RackEntry, SwitchEntry, Tier};
use crate::{Error, Result, fat_tree::FatTree, prefix::Prefix, prefix6::Prefix6};

fn switch(name: String, tier: Tier, pod: Option<String>) -> SwitchEntry {
    SwitchEntry {
        name,
        tier,
        pod,
        usid: None,
    }
}

/// Fat-Tree(k) with the paper's names (`h0..`, `e0..`, `a0..`, `c0..`) and addresses (host
/// `10.p.e.(2+i)` under the rack `10.p.e.0/24`, gateway `10.p.e.1`). Ports are named `pN` after
/// the model's port numbers; link addresses are left to the default (`172.16.0.0 + 2L`), which
/// is what the model gives.
pub fn fat_tree(k: u32) -> Result<Inventory> {
    let ft = FatTree::new(k)?;
    let g = &ft.graph;
    let h = k / 2;
    let mut inv = Inventory {
        name: Some(format!("fat-tree-k{k}")),
        ..Inventory::default()
    };
    let port = |node, link: u32| {
        let p = g
            .ports(node)
            .iter()
            .position(|(l, _)| *l == link)
            .expect("a port of the link");
        format!("{}:p{p}", g.name(node))
    };
    for pod in 0..k {
        for e in 0..h {
            let tor = ft.edge(pod, e);
            inv.racks.push(RackEntry {
                tor: g.name(tor).to_owned(),
                ipv4: ft.edge_prefix(pod, e),
                ipv6: None,
                gateway: None,
                hosts: (0..h)
                    .map(|i| {
                        let host = ft.host(pod, e, i);
                        HostEntry {
                            name: g.name(host).to_owned(),
                            ipv4: g.node(host).addr.expect("hosts have addresses"),
                            ipv6: None,
                            port: Some(format!("p{i}")),
                        }
                    })
                    .collect(),
            });
        }
    }
    for pod in 0..k {
        for e in 0..h {
            let n = g.name(ft.edge(pod, e)).to_owned();
            inv.switches
                .push(switch(n, Tier::Leaf, Some(format!("pod{pod}"))));
        }
    }
    for pod in 0..k {
        for a in 0..h {
            let n = g.name(ft.agg(pod, a)).to_owned();
            inv.switches
                .push(switch(n, Tier::Spine, Some(format!("pod{pod}"))));
        }
    }
    for a in 0..h {
        for j in 0..h {
            let n = g.name(ft.core(a, j)).to_owned();
            inv.switches
                .push(switch(n, Tier::SuperSpine, Some(format!("plane{a}"))));
        }
    }
    for link in ft.hosts()..g.links.len() as u32 {
        let l = &g.links[link as usize];
        inv.links.push(LinkEntry {
            a: port(l.a, link),
            b: port(l.b, link),
            ipv4: None,
            ipv6: None,
        });
    }
    Ok(inv)
}

/// What `leaf_spine` builds.
#[derive(Clone, Debug)]
pub struct LeafSpine {
    pub leaves: u32,
    pub spines: u32,
    pub hosts_per_leaf: u32,
    /// Carved into one rack prefix per leaf, each the smallest holding the gateway and the
    /// hosts.
    pub prefix: Prefix,
    /// Carved into one /64 per leaf, where given.
    pub prefix6: Option<Prefix6>,
    /// Carved into one /31 per leaf-spine link.
    pub links: Prefix,
    /// Carved into one /127 per link, where given.
    pub links6: Option<Prefix6>,
}

/// A two-tier leaf-spine: leaves `leaf1..` with hosts `leafN-h1..` on ports `swp1..` and
/// uplinks on the ports after them, spines `spine1..` with leaf `i` on `swpi`; every leaf
/// cabled to every spine.
pub fn leaf_spine(p: &LeafSpine) -> Result<Inventory> {
    let bad = |m: String| Err(Error::Invalid(format!("leaf-spine: {m}")));
    if p.leaves < 2 || p.spines < 1 || p.hosts_per_leaf < 1 {
        return bad("give at least 2 leaves, 1 spine and 1 host per leaf".into());
    }
    if p.spines as usize > super::check::MAX_UPLINKS {
        return bad(format!(
            "{} spines are more than a hop byte names",
            p.spines
        ));
    }
    // Network, gateway, hosts (and broadcast): the smallest prefix holding them.
    let need = u64::from(p.hosts_per_leaf) + 3;
    let rack_bits = 64 - (need - 1).leading_zeros() as u8;
    let rack_len = 32u8.saturating_sub(rack_bits);
    let fit = |prefix_len: u8, sub_len: u8, count: u64| {
        sub_len >= prefix_len && u32::from(sub_len - prefix_len) < 64 && {
            let room = 1u64 << (sub_len - prefix_len);
            room >= count
        }
    };
    if !fit(p.prefix.len, rack_len, u64::from(p.leaves)) {
        return bad(format!(
            "{} racks of /{rack_len} ({} hosts each) do not fit in {}",
            p.leaves, p.hosts_per_leaf, p.prefix
        ));
    }
    let link_count = u64::from(p.leaves) * u64::from(p.spines);
    if !fit(p.links.len, 31, link_count) {
        return bad(format!("{link_count} /31 links do not fit in {}", p.links));
    }
    if let Some(six) = p.prefix6
        && !(six.len <= 64
            && (64 - six.len >= 64 || (1u64 << (64 - six.len)) >= u64::from(p.leaves)))
    {
        return bad(format!("{} /64 racks do not fit in {six}", p.leaves));
    }
    if let Some(six) = p.links6
        && !(six.len <= 127 && (127 - six.len >= 64 || (1u64 << (127 - six.len)) >= link_count))
    {
        return bad(format!("{link_count} /127 links do not fit in {six}"));
    }
    let mut inv = Inventory {
        name: Some(format!("leaf-spine-{}x{}", p.leaves, p.spines)),
        ..Inventory::default()
    };
    for s in 1..=p.spines {
        inv.switches
            .push(switch(format!("spine{s}"), Tier::Spine, None));
    }
    for l in 1..=p.leaves {
        inv.switches
            .push(switch(format!("leaf{l}"), Tier::Leaf, None));
        let base = u32::from(p.prefix.addr) + ((l - 1) << rack_bits);
        let rack = Prefix::of(Ipv4Addr::from(base), rack_len);
        inv.racks.push(RackEntry {
            tor: format!("leaf{l}"),
            ipv4: rack,
            ipv6: p
                .prefix6
                .map(|six| Prefix6::of(six.nth(u128::from(l - 1) << 64), 64)),
            gateway: None,
            hosts: (1..=p.hosts_per_leaf)
                .map(|h| HostEntry {
                    name: format!("leaf{l}-h{h}"),
                    ipv4: Ipv4Addr::from(base + 1 + h),
                    ipv6: None,
                    port: Some(format!("swp{h}")),
                })
                .collect(),
        });
    }
    for l in 1..=p.leaves {
        for s in 1..=p.spines {
            let n = u64::from(l - 1) * u64::from(p.spines) + u64::from(s - 1);
            inv.links.push(LinkEntry {
                a: format!("leaf{l}:swp{}", p.hosts_per_leaf + s),
                b: format!("spine{s}:swp{l}"),
                ipv4: Some(Prefix::of(
                    Ipv4Addr::from(u32::from(p.links.addr) + 2 * n as u32),
                    31,
                )),
                ipv6: p
                    .links6
                    .map(|six| Prefix6::of(six.nth(2 * u128::from(n)), 127)),
            });
        }
    }
    Ok(inv)
}
