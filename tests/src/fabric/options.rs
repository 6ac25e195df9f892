//! How a fabric is asked for: the topology (`fat-tree:4`, `modric:2x2`, an inventory file), the
//! links' rate and queue, the encoding and the agents' flags.

use sopa_topology::{Topology, srv6::Encoding, topology::TopologySpec};

/// Whether `name` can name a Linux interface: 1 to 15 bytes, no slash, colon or whitespace,
/// not `.` or `..`.
pub(super) fn is_ifname(name: &str) -> bool {
    (1..16).contains(&name.len())
        && name != "."
        && name != ".."
        && !name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace())
}

/// `fat-tree:K`, `modric:MxN[:q:x:y]` (q=1, x=2, y=2 by default), or the path of an
/// inventory file (`sopa_topology::inventory`; checked here, every refusal named).
pub fn parse_topo(s: &str) -> std::result::Result<TopologySpec, String> {
    let path = std::path::Path::new(s);
    if s.ends_with(".toml") || path.is_file() {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("reading the inventory {s}: {e}"))?;
        let inv = sopa_topology::inventory::Inventory::from_toml(&text)
            .map_err(|e| format!("inventory {s}: {e}"))?;
        let spec = TopologySpec::Inventory(Box::new(inv));
        Topology::build(&spec).map_err(|e| format!("inventory {s}: {e}"))?;
        return Ok(spec);
    }
    let bad = || {
        format!("topology {s:?}: write fat-tree:K, modric:MxN[:q:x:y] or an inventory file's path")
    };
    let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
    match kind {
        "fat-tree" => Ok(TopologySpec::FatTree {
            k: rest.parse().map_err(|_| bad())?,
        }),
        "modric" => {
            let mut parts = rest.split(':');
            let (m, n) = parts
                .next()
                .and_then(|d| d.split_once('x'))
                .ok_or_else(bad)?;
            let nums: Vec<u32> = parts
                .map(|p| p.parse().map_err(|_| bad()))
                .collect::<std::result::Result<_, _>>()?;
            let (q, x, y) = match nums[..] {
                [] => (1, 2, 2),
                [q, x, y] => (q, x, y),
                _ => return Err(bad()),
            };
            Ok(TopologySpec::Modric(
                sopa_topology::modric::ModricParams::new(
                    m.parse().map_err(|_| bad())?,
                    n.parse().map_err(|_| bad())?,
                    q,
                    x,
                    y,
                ),
            ))
        }
        _ => Err(bad()),
    }
}

#[derive(Clone, Debug)]
pub struct FabricOptions {
    /// Link rate in Mbit/s; `None` leaves links unshaped.
    pub rate_mbit: Option<u32>,
    /// Drop-tail queue per link direction, in full-size packets (counted in bytes).
    pub queue_packets: u32,
    /// Extra flags for every host agent (mode, granularity, ...). Without `--granularity`,
    /// the hosts spray per packet, as the paper does.
    pub host_args: Vec<String>,
    /// Also wire every host to one big switch (the non-blocking ideal), with links shaped like
    /// the fabric's: the `ideal` mode of the experiments routes the hosts through it.
    pub ideal: bool,
    /// Controller replicas: 1 runs one controller with a state file; 2 or more run that many
    /// replicas on a three-member etcd cluster (in a namespace of their own), one elected.
    pub controllers: usize,
    /// How hosts carry the path. SRv6 gives every link IPv6 addresses (the topology's plan)
    /// and runs every link at [`SRV6_FABRIC_MTU`], the hosts' 1500 plus the outer header and the
    /// path meter's mark.
    pub encoding: Encoding,
    /// How a shaped link serializes its packets.
    pub link_qdisc: LinkQdisc,
    /// Extra flags for every switch agent (e.g. `--usid ebpf`).
    pub switch_args: Vec<String>,
}

/// The qdisc that makes a veth a link of the fabric's rate (this kernel has htb, tbf and
/// pfifo/bfifo, no netem or fq).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkQdisc {
    /// HTB at the rate (quantum one full packet) with a byte-limited bfifo below it.
    #[default]
    Htb,
    /// TBF at the rate with a bucket of one packet: a packet leaves only once the link would
    /// have finished sending the one before, as a switch port serializes.
    Tbf,
}

impl std::fmt::Display for LinkQdisc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Htb => "htb",
            Self::Tbf => "tbf",
        })
    }
}

impl std::str::FromStr for LinkQdisc {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "htb" => Ok(Self::Htb),
            "tbf" => Ok(Self::Tbf),
            other => Err(format!("link qdisc {other:?}: htb or tbf")),
        }
    }
}

/// Fabric links' MTU in the SRv6 encoding: hosts keep 1500 on their routes.
pub const SRV6_FABRIC_MTU: u32 = 1548;

impl Default for FabricOptions {
    fn default() -> Self {
        Self {
            rate_mbit: Some(100),
            queue_packets: 100,
            host_args: Vec::new(),
            ideal: false,
            controllers: 1,
            encoding: Encoding::default(),
            link_qdisc: LinkQdisc::default(),
            switch_args: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LinkQdisc;

    #[test]
    fn link_qdiscs_parse_and_print_by_name() {
        for q in [LinkQdisc::Htb, LinkQdisc::Tbf] {
            assert_eq!(q.to_string().parse::<LinkQdisc>(), Ok(q));
        }
        assert_eq!("tbf".parse::<LinkQdisc>(), Ok(LinkQdisc::Tbf));
        let err = "netem".parse::<LinkQdisc>().unwrap_err();
        assert!(err.contains("netem") && err.contains("htb or tbf"), "{err}");
    }
}
