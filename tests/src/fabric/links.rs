//! The fabric's links: their interfaces and addresses, cutting, mending and swapping them,
//! and the ports a switch sends a destination's packets on.

use std::collections::BTreeMap;

use sopa_topology::{
    LinkId, NodeId, NodeKind, Topology,
    forwarding::link_addresses,
    srv6::{Encoding, link_addresses6},
};

use crate::{NetNs, Result};

use super::{Fabric, options::is_ifname};

impl Fabric {
    /// Packets that left `switch` by the port each hop value names for destination `dst`
    /// (`tc_forward`'s decision for it, from the topology's forwarding plan), as the
    /// interfaces counted them: element `h` is hop value `h`'s port.
    pub fn hop_ports_tx(&self, switch: &str, dst: std::net::Ipv4Addr) -> Vec<u64> {
        let g = self.topo.graph();
        let n = g.find(switch).expect("a switch");
        let plan = sopa_topology::forwarding::plan(&self.topo, n);
        let decision = plan
            .decisions
            .iter()
            .find(|d| d.prefix.contains_addr(dst))
            .unwrap_or_else(|| panic!("{switch} has no decision for {dst}"));
        decision
            .uplinks
            .iter()
            .map(|&l| {
                let dev = self.dev(l, n);
                self.ns(switch).tx_packets(&dev).expect("tx packets")
            })
            .collect()
    }

    /// Every host's namespace and IPv4 address.
    pub fn host_addresses(&self) -> Vec<(&NetNs, std::net::Ipv4Addr)> {
        let g = self.topo.graph();
        g.nodes_of(NodeKind::Host)
            .map(|h| {
                (
                    &self.namespaces[&h],
                    g.node(h).addr.expect("hosts have addresses"),
                )
            })
            .collect()
    }

    /// Every host's namespace and IPv6 address (an inventory's, or its IPv4 one embedded).
    pub fn host_addresses6(&self) -> Vec<(&NetNs, std::net::Ipv6Addr)> {
        let g = self.topo.graph();
        g.nodes_of(NodeKind::Host)
            .map(|h| (&self.namespaces[&h], self.topo.host_ipv6(h)))
            .collect()
    }

    /// The interface of the link between `node` and `peer`, on `node`'s side.
    pub fn link_iface(&self, node: &str, peer: &str) -> String {
        let g = self.topo.graph();
        let (n, p) = (g.find(node).expect("a node"), g.find(peer).expect("a node"));
        let l = g
            .links_between(n, p)
            .next()
            .unwrap_or_else(|| panic!("no link {node}:{peer}"));
        self.dev(l, n)
    }

    /// The interface of `link` at `node`'s end: an inventory's port name where it makes a
    /// Linux interface name (interfaces are created in their namespaces, so names repeat
    /// across switches as on real ones), else `<prefix><link>a|b`.
    pub fn dev(&self, link: LinkId, node: NodeId) -> String {
        if let Topology::Clos(c) = &self.topo
            && let Some(port) = c.port_name(link, node)
            && is_ifname(port)
        {
            return port.to_owned();
        }
        let a = self.topo.graph().links[link as usize].a == node;
        format!("{}{link}{}", self.prefix, if a { "a" } else { "b" })
    }

    /// Swaps the cables of `switch`'s ports `p1` and `p2` (an inventory's port names), as a
    /// technician would: both ports go dark, each interface takes the other's name and the
    /// other's configured addresses (configuration belongs to the port, the cable moves), and
    /// both come back up facing the other's neighbour. Calling it again puts them back.
    pub fn swap_ports(&self, switch: &str, p1: &str, p2: &str) -> Result<()> {
        let ns = self.ns(switch);
        let g = self.topo.graph();
        let me = g.find(switch).expect("a switch");
        let six = self.encoding == Encoding::Srv6 || self.topo.routes_ipv6();
        let addresses = |port: &str| -> Vec<(bool, String)> {
            let Some(&(l, _)) = g.ports(me).iter().find(|(l, _)| self.dev(*l, me) == port) else {
                panic!("{switch} has no port {port}")
            };
            let a_end = g.links[l as usize].a == me;
            let (a, b, len) = link_addresses(&self.topo, l);
            let mut out = vec![(false, format!("{}/{len}", if a_end { a } else { b }))];
            if six {
                let (a, b, len) = link_addresses6(&self.topo, l);
                out.push((true, format!("{}/{len}", if a_end { a } else { b })));
            }
            out
        };
        let (a1, a2) = (addresses(p1), addresses(p2));
        let tmp = format!("{}swap", self.prefix);
        for p in [p1, p2] {
            ns.ip(&["link", "set", p, "down"])?;
            ns.ip(&["addr", "flush", "dev", p])?;
        }
        ns.ip(&["link", "set", p1, "name", &tmp])?;
        ns.ip(&["link", "set", p2, "name", p1])?;
        ns.ip(&["link", "set", &tmp, "name", p2])?;
        for (p, addrs) in [(p1, a1), (p2, a2)] {
            for (v6, a) in addrs {
                let mut args = vec!["addr", "add", &a, "dev", p];
                if v6 {
                    args.insert(0, "-6");
                    args.push("nodad");
                }
                ns.ip(&args)?;
            }
            ns.ip(&["link", "set", p, "up"])?;
        }
        Ok(())
    }

    /// Cuts the link between `a` and `b` for real: `a`'s end set down, so the link carries
    /// nothing either way (the other end of the veth loses its carrier), as a pulled cable or a
    /// dead optic would. Returns the time just before the cut.
    pub fn cut_link(&self, a: &str, b: &str) -> Result<std::time::SystemTime> {
        let iface = self.link_iface(a, b);
        let at = self.ns(a).set_up(&iface, false)?;
        // Switches without agents report nothing: the routers' routing converges, and the
        // testbed tells the controller.
        if !crate::routers::switches_have_agents(self) {
            crate::routers::reroute(self)?;
            self.sopactl(&["link", "down", a, b])?;
        }
        Ok(at)
    }

    /// Brings back a link [`Fabric::cut_link`] cut.
    pub fn mend_link(&self, a: &str, b: &str) -> Result<()> {
        let iface = self.link_iface(a, b);
        self.ns(a).set_up(&iface, true)?;
        if !crate::routers::switches_have_agents(self) {
            crate::routers::reroute(self)?;
            self.sopactl(&["link", "up", a, b])?;
        }
        Ok(())
    }

    /// Every switch's links to other switches: switch -> peer -> its interface towards it.
    pub fn link_ifaces(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let g = self.topo.graph();
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for l in g
            .links
            .iter()
            .filter(|l| g.node(l.a).kind.is_switch() && g.node(l.b).kind.is_switch())
        {
            let (a, b) = (g.name(l.a), g.name(l.b));
            out.entry(a.into())
                .or_default()
                .insert(b.into(), self.link_iface(a, b));
            out.entry(b.into())
                .or_default()
                .insert(a.into(), self.link_iface(b, a));
        }
        out
    }
}
