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

/// R's uSIDs in the SRv6 encoding: one per path (each a `seg6local` End locator with the
/// NEXT-C-SID flavour), and one per rack (A's and B's host routes hang under them).
pub const R_PATH_USIDS: [u16; 3] = [0x0100, 0x0101, 0x0102];
pub const A_RACK_USID: u16 = 0x0201;
pub const B_RACK_USID: u16 = 0x0202;
/// A's and B's IPv6 addresses: the fabric's plan (`sopa_topology::srv6::embed`), the /96
/// `fd00:5a::` with each host's IPv4 address in the last 32 bits (10.101.1.2, 10.101.2.2).
pub const A_ADDR6: &str = "fd00:5a::a65:102";
pub const B_ADDR6: &str = "fd00:5a::a65:202";
/// The /96 of the hosts' IPv6 addresses.
pub const FABRIC6: &str = "fd00:5a::/96";

/// A's prefix and B's prefix (each host's rack).
pub const A_PREFIX: &str = "10.101.1.0/24";
pub const B_PREFIX: &str = "10.101.2.0/24";

/// Agents on A and B are nodes named after their namespaces: what run-time commands recorded
/// for them (`sopa-agent granularity`, `mode`) goes with the namespaces.
impl Drop for Arb {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            crate::agent::forget_run_time_choices(ns.name());
        }
    }
}

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

    /// Makes R a plain Linux SRv6 node (no program of ours): IPv6 on every link, forwarding,
    /// one End (NEXT-C-SID) locator per path, and A's and B's SRv6 addresses routed under
    /// their rack's uSID; every link at MTU `mtu` (a fabric's: the hosts' 1500 plus the 40 of
    /// the outer header loses no goodput).
    pub fn make_srv6(&self, paths: usize, mtu: u32) -> Result<()> {
        let mtu = mtu.to_string();
        for (ns, dev) in [
            (&self.a, &self.a_if),
            (&self.r, &self.r_a_if),
            (&self.r, &self.r_b_if),
            (&self.b, &self.b_if),
        ] {
            ns.ip(&["link", "set", dev, "mtu", &mtu])?;
        }
        let six = |ns: &NetNs, addr: &str, dev: &str| {
            ns.ip(&["-6", "addr", "add", addr, "dev", dev, "nodad"])
        };
        // Each rack's IPv6 prefix is its IPv4 one embedded: /96 + 24.
        six(&self.a, &format!("{A_ADDR6}/120"), &self.a_if)?;
        six(&self.r, "fd00:5a::a65:101/120", &self.r_a_if)?;
        six(&self.r, "fd00:5a::a65:201/120", &self.r_b_if)?;
        six(&self.b, &format!("{B_ADDR6}/120"), &self.b_if)?;
        for (ns, gw) in [(&self.a, "fd00:5a::a65:101"), (&self.b, "fd00:5a::a65:201")] {
            ns.ip(&["-6", "route", "add", "default", "via", gw])?;
        }
        self.r.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        for usid in &R_PATH_USIDS[..paths] {
            self.r.ip(&[
                "-6",
                "route",
                "add",
                &format!("fcbb:bb00:{usid:x}::/48"),
                "encap",
                "seg6local",
                "action",
                "End",
                "flavors",
                "next-csid",
                "lblen",
                "32",
                "nflen",
                "16",
                "dev",
                &self.r_a_if,
            ])?;
        }
        for (rack, via, dev) in [
            (A_RACK_USID, A_ADDR6, &self.r_a_if),
            (B_RACK_USID, B_ADDR6, &self.r_b_if),
        ] {
            self.r.ip(&[
                "-6",
                "route",
                "add",
                &format!("fcbb:bb00:{rack:x}:e002::/64"),
                "via",
                via,
                "dev",
                dev,
            ])?;
        }
        Ok(())
    }

    /// The SRv6 path table of a host at `own` (its rack's uSID `own_rack`) towards `prefix`
    /// (rack uSID `rack`): `paths` single-decision paths, path `i` through R's uSID `i`.
    pub fn srv6_path_table(
        own: &str,
        own_rack: u16,
        prefix: &str,
        rack: u16,
        paths: usize,
    ) -> String {
        let hops: Vec<String> = (0..paths).map(|h| format!("[{h}]")).collect();
        let segs: Vec<String> = R_PATH_USIDS[..paths]
            .iter()
            .map(|u| format!("[{u:#06x}]"))
            .collect();
        format!(
            "version = 1\nencoding = \"srv6\"\n\n[srv6]\nsource = \"{own}\"\n\
             receive = \"fcbb:bb00:{own_rack:x}:e002::\"\nfabric6 = \"{FABRIC6}\"\n\n\
             [[destination]]\n\
             prefix = \"{prefix}\"\npaths = [{}]\nsegments = [{}]\ntail = [{rack:#06x}]\n",
            hops.join(", "),
            segs.join(", ")
        )
    }

    /// Agents on A and B (A's table towards B's rack and B's towards A's, `paths` paths each),
    /// both started with `flags`.
    pub fn start_agents(
        &self,
        paths: u8,
        flags: &[&str],
    ) -> Result<(crate::agent::Agent, crate::agent::Agent)> {
        let a = crate::agent::Agent::start(
            &self.a,
            self.a.name(),
            &self.a_if,
            &Self::path_table(B_PREFIX, paths),
            flags,
        )?;
        let b = crate::agent::Agent::start(
            &self.b,
            self.b.name(),
            &self.b_if,
            &Self::path_table(A_PREFIX, paths),
            flags,
        )?;
        Ok((a, b))
    }

    /// An iperf3 server on B at `port`, listening when this returns (its log in the temporary
    /// folder); it ends when the returned process is dropped.
    pub fn iperf3_server(&self, port: u16) -> Result<crate::Process> {
        let log = std::env::temp_dir().join(format!("{}-iperf3.log", self.b.name()));
        let server = crate::Process::spawn(
            Some(&self.b),
            std::path::Path::new("iperf3"),
            &["-s", "-p", &port.to_string()],
            &log,
        )?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !self.b.tcp_listening(port).unwrap_or(false) {
            if std::time::Instant::now() > deadline {
                return Err(crate::Error::Failed(format!(
                    "the iperf3 server does not listen on {port} (log {})",
                    log.display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(server)
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
