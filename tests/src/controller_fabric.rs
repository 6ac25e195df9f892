//! Two hosts and a controller namespace behind one plain Linux router: A (Fat-Tree host h0,
//! 10.0.0.2), B (10.1.0.2) and C (10.200.0.2), where controllers (and etcd) run. The
//! controller suites' fabric.

use crate::{NetNs, Result, netns::veth, run_name};

pub struct ControllerFabric {
    pub a: NetNs,
    pub b: NetNs,
    pub c: NetNs,
    pub r: NetNs,
    pub a_if: String,
    pub b_if: String,
}

impl ControllerFabric {
    /// The namespaces `<run>-a`, `-b`, `-c` and `-r`, named after `tag` and this run; deleted
    /// when the guard drops.
    pub fn new(tag: &str) -> Result<Self> {
        let p = run_name(tag);
        let (a, b, c, r) = (
            NetNs::new(&format!("{p}-a"))?,
            NetNs::new(&format!("{p}-b"))?,
            NetNs::new(&format!("{p}-c"))?,
            NetNs::new(&format!("{p}-r"))?,
        );
        for (ns, i, host, gw, net) in [
            (&a, "a", "10.0.0.2/24", "10.0.0.1", "10.0.0.1/24"),
            (&b, "b", "10.1.0.2/24", "10.1.0.1", "10.1.0.1/24"),
            (&c, "c", "10.200.0.2/24", "10.200.0.1", "10.200.0.1/24"),
        ] {
            let (host_if, router_if) = (format!("{p}{i}0"), format!("{p}r{i}"));
            veth(ns, &host_if, &r, &router_if)?;
            ns.ip(&["addr", "add", host, "dev", &host_if])?;
            r.ip(&["addr", "add", net, "dev", &router_if])?;
            ns.ip(&["route", "add", "default", "via", gw])?;
        }
        r.sysctl("net.ipv4.ip_forward", "1")?;
        Ok(Self {
            a_if: format!("{p}a0"),
            b_if: format!("{p}b0"),
            a,
            b,
            c,
            r,
        })
    }
}
