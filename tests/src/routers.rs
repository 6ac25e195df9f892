//! Switches that only hash, for the entropy encoding: each switch namespace of a [`Fabric`] as
//! a plain Linux router, with no agent and no program. Its routes are the topology's (every
//! neighbour on a shortest path to each rack, IPv4 and the rack's IPv6 /120 of embedded host
//! addresses) as multipath routes; IPv6 hashes source, destination, next header and flow label
//! (policy 0), IPv4 the 5-tuple (policy 3, fields 0x37: on veth, policy 1 reuses the sender's
//! socket hash); each router has a hash seed of its own (every namespace shares the boot seed
//! otherwise, and tiers would choose alike); a next hop whose link is down leaves the group
//! (`ignore_routes_with_linkdown`). Routers answer probes without an ICMP rate limit
//! (`net.ipv6.icmp.ratelimit` 0), which the run reports.

use sopa_topology::{
    forwarding::{self, link_addresses},
    paths::Failures,
    srv6::link_addresses6,
};

use crate::{Result, fabric::Fabric};

/// The ICMPv6 rate limit the routers run with, in ms (0: none).
pub const ICMP6_RATELIMIT_MS: u32 = 0;

/// Makes every switch of `f` a hashing router with the topology's routes.
pub fn configure(f: &Fabric) -> Result<()> {
    let g = f.topo.graph().clone();
    let none = Failures::none(&g);
    for (id, node) in g.nodes.iter().enumerate() {
        if !node.kind.is_switch() {
            continue;
        }
        let id = id as u32;
        let ns = f.ns(&node.name);
        for (key, value) in [
            ("net.ipv6.conf.all.forwarding", "1".to_owned()),
            ("net.ipv6.fib_multipath_hash_policy", "0".to_owned()),
            ("net.ipv4.fib_multipath_hash_policy", "3".to_owned()),
            ("net.ipv4.fib_multipath_hash_fields", "0x0037".to_owned()),
            // A seed of its own: distinct per switch, the same in every run.
            (
                "net.ipv4.fib_multipath_hash_seed",
                (7919 * (id + 1)).to_string(),
            ),
            ("net.ipv6.icmp.ratelimit", ICMP6_RATELIMIT_MS.to_string()),
            (
                "net.ipv4.conf.all.ignore_routes_with_linkdown",
                "1".to_owned(),
            ),
            (
                "net.ipv6.conf.all.ignore_routes_with_linkdown",
                "1".to_owned(),
            ),
        ] {
            ns.sysctl(key, &value)?;
        }
        for route in forwarding::routes(&f.topo, id, &none) {
            // A rack switch's hosts are on their ports' peer addresses already.
            if route.prefix.len == 32 {
                continue;
            }
            let mut v4 = vec![
                "route".to_owned(),
                "replace".to_owned(),
                route.prefix.to_string(),
            ];
            let mut v6 = vec![
                "-6".to_owned(),
                "route".to_owned(),
                "replace".to_owned(),
                rack6(f, route.prefix),
            ];
            for link in &route.links {
                let l = &g.links[*link as usize];
                let (a, b, _) = link_addresses(&f.topo, *link);
                let (a6, b6, _) = link_addresses6(&f.topo, *link);
                let (peer4, peer6) = if l.a == id { (b, b6) } else { (a, a6) };
                let dev = f.dev(*link, id);
                v4.extend(["nexthop", "via", &peer4.to_string(), "dev", &dev].map(String::from));
                v6.extend(["nexthop", "via", &peer6.to_string(), "dev", &dev].map(String::from));
            }
            for args in [v4, v6] {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ns.ip(&args)?;
            }
        }
    }
    Ok(())
}

/// A rack's IPv6 prefix, as the topology gives it (its IPv4 prefix embedded in the /96).
fn rack6(f: &Fabric, prefix: sopa_topology::Prefix) -> String {
    let rack = f
        .topo
        .racks()
        .into_iter()
        .find(|r| r.prefix == prefix)
        .expect("a rack route");
    f.topo.rack_ipv6(&rack).to_string()
}

/// Whether `f`'s switches run agents (in every encoding but entropy's).
pub fn switches_have_agents(f: &Fabric) -> bool {
    f.encoding != sopa_topology::srv6::Encoding::Entropy
}

/// Every host's label discovery once done (its `status`'s `entropy`), by host name, in at most
/// `within`; the error names the first host still probing and what it had found.
pub fn discovered(
    f: &Fabric,
    within: std::time::Duration,
) -> Result<Vec<(String, serde_json::Value)>> {
    let deadline = std::time::Instant::now() + within;
    let g = f.topo.graph();
    f.hosts
        .iter()
        .map(|(id, agent)| {
            let h = g.name(*id);
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let e = crate::fabric::wait_for(&format!("{h}'s label discovery"), left, || {
                let e = agent.status().map_err(|e| e.to_string())?["entropy"].clone();
                if e["done"] == true {
                    Ok(e)
                } else {
                    Err(e.to_string())
                }
            })?;
            Ok((h.to_owned(), e))
        })
        .collect()
}
