//! Switches that only hash, for the entropy encoding: each switch namespace of a [`Fabric`] as
//! a plain Linux router, with no agent and no program. Its routes are the topology's (every
//! neighbour on a shortest path to each rack, IPv4 and the rack's IPv6 /120 of embedded host
//! addresses) as multipath routes; IPv6 hashes source, destination, next header and flow label
//! (policy 0), IPv4 the 5-tuple (policy 3, fields 0x37: on veth, policy 1 reuses the sender's
//! socket hash); each router has a hash seed of its own (every namespace shares the boot seed
//! otherwise, and tiers would choose alike); a next hop whose link is down leaves the group
//! (`ignore_routes_with_linkdown`). Routers answer probes without an ICMP rate limit
//! (`net.ipv6.icmp.ratelimit` 0), which the run reports. When the testbed takes a link down
//! or brings it back, every router's routes are recomputed around the links without carrier
//! ([`reroute`]), as a fabric's routing protocol would converge: without it, the other pods
//! would go on hashing traffic into a core that can no longer deliver it.

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
    }
    install(f, &Failures::none(&g))
}

/// Every router's routes as the topology gives them under `failures`, one `ip -batch` per
/// router: a rack a router can no longer reach loses its route.
fn install(f: &Fabric, failures: &Failures) -> Result<()> {
    let g = f.topo.graph();
    for (id, node) in g.nodes.iter().enumerate() {
        if !node.kind.is_switch() {
            continue;
        }
        let id = id as u32;
        let routes = forwarding::routes(&f.topo, id, failures);
        let mut batch = String::new();
        for rack in f.topo.racks() {
            // A rack switch's hosts are on their ports' peer addresses already.
            if rack.tor == id {
                continue;
            }
            let Some(route) = routes.iter().find(|r| r.prefix == rack.prefix) else {
                batch.push_str(&format!("route del {}\n", rack.prefix));
                batch.push_str(&format!("route del {}\n", rack6(f, rack.prefix)));
                continue;
            };
            let (mut v4, mut v6) = (
                format!("route replace {}", route.prefix),
                // The family follows from the prefix: a batch line takes no options.
                format!("route replace {}", rack6(f, route.prefix)),
            );
            for link in &route.links {
                let l = &g.links[*link as usize];
                let (a, b, _) = link_addresses(&f.topo, *link);
                let (a6, b6, _) = link_addresses6(&f.topo, *link);
                let (peer4, peer6) = if l.a == id { (b, b6) } else { (a, a6) };
                let dev = f.dev(*link, id);
                v4.push_str(&format!(" nexthop via {peer4} dev {dev}"));
                v6.push_str(&format!(" nexthop via {peer6} dev {dev}"));
            }
            batch.push_str(&format!("{v4}\n{v6}\n"));
        }
        batch_ip(f.ns(&node.name).name(), &batch)?;
    }
    Ok(())
}

/// Runs `ip -force -batch -` in namespace `ns` on `commands` (errors of one line do not stop
/// the rest; a route already gone is such an error).
fn batch_ip(ns: &str, commands: &str) -> Result<()> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("ip")
        .args(["-n", ns, "-force", "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| crate::Error::io("running ip -batch", e))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(commands.as_bytes())
        .map_err(|e| crate::Error::io("writing to ip -batch", e))?;
    let out = child
        .wait_with_output()
        .map_err(|e| crate::Error::io("waiting for ip -batch", e))?;
    // Deleting a route that is not there is expected; anything else is not.
    let errors: Vec<&str> = std::str::from_utf8(&out.stderr)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.contains("No such process") && !l.starts_with("Command failed"))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(crate::Error::Failed(format!(
            "ip -batch in {ns}: {}",
            errors.join("; ")
        )))
    }
}

/// The fabric's routing converging after links went down or came back, as a routing protocol
/// (BGP with BFD) would: the links whose switch interfaces have no carrier are taken as
/// failed, and every router's routes recomputed around them. A link that drops packets with its
/// carrier up is not seen, as a routing protocol whose hellos get through would not see it.
pub fn reroute(f: &Fabric) -> Result<()> {
    let g = f.topo.graph();
    // Each switch's interfaces that are up, one `ip -br link` per switch.
    let mut up = std::collections::HashSet::new();
    for node in g.nodes.iter().filter(|n| n.kind.is_switch()) {
        for line in f.ns(&node.name).ip(&["-br", "link"])?.lines() {
            let mut words = line.split_whitespace();
            if let (Some(name), Some("UP")) = (words.next(), words.next()) {
                let name = name.split('@').next().unwrap_or(name);
                up.insert((node.name.clone(), name.to_owned()));
            }
        }
    }
    let mut failures = Failures::none(g);
    for (l, link) in g.links.iter().enumerate() {
        let end = if g.node(link.a).kind.is_switch() {
            link.a
        } else {
            link.b
        };
        if !up.contains(&(g.name(end).to_owned(), f.dev(l as u32, end))) {
            failures.set_link(l as u32, true);
        }
    }
    install(f, &failures)
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
