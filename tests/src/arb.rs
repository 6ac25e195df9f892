//! The smallest routed fabric: host A - router R - host B, R a plain Linux router.

use std::net::Ipv4Addr;

use crate::{Error, NetNs, Result, netns::veth, run_name};

pub struct Arb {
    pub a: NetNs,
    pub r: NetNs,
    pub b: NetNs,
    /// A's interface and R's interface facing A.
    pub a_if: String,
    pub r_a_if: String,
    /// R's interface facing B, and B's interface.
    pub r_b_if: String,
    pub b_if: String,
    pub a_addr: Ipv4Addr,
    pub b_addr: Ipv4Addr,
}

/// A's prefix and B's prefix (each host's rack).
pub const A_PREFIX: &str = "10.101.1.0/24";
pub const B_PREFIX: &str = "10.101.2.0/24";

impl Arb {
    /// Builds A - R - B: 10.101.1.2/24 on A, 10.101.2.2/24 on B, R forwarding between them,
    /// default routes on both hosts via R. Everything goes away on drop.
    pub fn new(tag: &str) -> Result<Self> {
        let p = run_name(tag);
        // Interface names are `<p>r0`-like and the kernel takes at most 15 bytes.
        if p.len() + 2 > 15 {
            return Err(Error::Failed(format!(
                "the tag {tag:?} makes interface names like {p}r0 longer than the kernel's 15 \
                 bytes: use a tag of at most {} characters",
                tag.len().saturating_sub(p.len() + 2 - 15)
            )));
        }
        let a = NetNs::new(&format!("{p}-a"))?;
        let r = NetNs::new(&format!("{p}-r"))?;
        let b = NetNs::new(&format!("{p}-b"))?;
        let (a_if, r_a_if, r_b_if, b_if) = (
            format!("{p}a0"),
            format!("{p}r0"),
            format!("{p}r1"),
            format!("{p}b0"),
        );
        veth(&a, &a_if, &r, &r_a_if)?;
        veth(&b, &b_if, &r, &r_b_if)?;
        a.ip(&["addr", "add", "10.101.1.2/24", "dev", &a_if])?;
        r.ip(&["addr", "add", "10.101.1.1/24", "dev", &r_a_if])?;
        r.ip(&["addr", "add", "10.101.2.1/24", "dev", &r_b_if])?;
        b.ip(&["addr", "add", "10.101.2.2/24", "dev", &b_if])?;
        a.ip(&["route", "add", "default", "via", "10.101.1.1"])?;
        b.ip(&["route", "add", "default", "via", "10.101.2.1"])?;
        r.sysctl("net.ipv4.ip_forward", "1")?;
        Ok(Self {
            a,
            r,
            b,
            a_if,
            r_a_if,
            r_b_if,
            b_if,
            a_addr: Ipv4Addr::new(10, 101, 1, 2),
            b_addr: Ipv4Addr::new(10, 101, 2, 2),
        })
    }

    /// A path table with `paths` single-decision paths towards `prefix`.
    pub fn path_table(prefix: &str, paths: u8) -> String {
        let hops: Vec<String> = (0..paths).map(|h| format!("[{h}]")).collect();
        format!(
            "version = 1\n\n[[destination]]\nprefix = \"{prefix}\"\npaths = [{}]\n",
            hops.join(", ")
        )
    }
}
