//! The entropy encoding on a host (`sopa_common::entropy` has the format): this host's IPv6
//! address, the fabric's /96 of host addresses, and per destination host, next header and path
//! the flow label (entropy value, EV) a hashing switch sends along that path, as a path table
//! file gives them, checked and compiled into the datapath's label map.
//!
//! In a path table file:
//!
//! ```toml
//! encoding = "entropy"
//! [entropy]
//! source = "fd00:5a::a00:2"    # this host's IPv6 address: outer source, and where it receives
//! fabric6 = "fd00:5a::/96"     # the hosts' addresses: this /96 and their IPv4 address
//!
//! [[entropy.host]]             # per destination host: a label per path of its prefix, in order
//! address = "10.2.0.2"
//! ipv4 = [0x1a2b3, 0x00017, 0x4c001, 0x00902]  # encapsulated IPv4 (next header 4)
//! tcp6 = [0x00001, 0x00002, 0x00003, 0x00004]  # IPv6 TCP, optional
//! udp6 = [0x00005, 0x00006, 0x00007, 0x00008]  # IPv6 UDP, optional
//! ```
//!
//! The labels are learned by probing (`discover`, with the packets of `probe`): the topology
//! (`sopa_topology::entropy`) says which hop limits tell a destination's paths apart and which
//! path the routers that answered make.

pub mod discover;
pub mod loss;
pub mod probe;
pub mod runner;
pub mod source;

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use serde::Deserialize;
use sopa_common::{
    entropy::{LABEL_MASK, NEXT_IPV4},
    maps::{Encap, EvKey, encoding},
    wire::{IPPROTO_TCP, IPPROTO_UDP},
};

use crate::path_table::{Hops, Prefix};

/// This host's addresses and the labels of every destination host's paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntropyTable {
    /// The outer source address, and the address this host receives encapsulated IPv4 on.
    pub source: Ipv6Addr,
    /// The /96 of the fabric's IPv6 host addresses (each embeds its host's IPv4 address).
    pub fabric6: Ipv6Addr,
    pub labels: BTreeMap<EvKey, u32>,
}

/// The `[entropy]` table of a path table file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyV1 {
    source: String,
    fabric6: String,
    #[serde(default)]
    host: Vec<HostV1>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostV1 {
    address: String,
    ipv4: Vec<i64>,
    tcp6: Option<Vec<i64>>,
    udp6: Option<Vec<i64>>,
}

impl EntropyTable {
    /// The table of a file's `[entropy]` section, for the paths `destinations` lists; the error
    /// names the bad entry.
    pub fn parse(
        file: &EntropyV1,
        destinations: &BTreeMap<Prefix, Vec<Hops>>,
    ) -> Result<Self, String> {
        let source = file.source.parse::<Ipv6Addr>().map_err(|_| {
            format!(
                "[entropy] source = {:?} is not an IPv6 address",
                file.source
            )
        })?;
        let fabric6 = file
            .fabric6
            .strip_suffix("/96")
            .and_then(|a| a.parse::<Ipv6Addr>().ok())
            .filter(|a| a.octets()[12..] == [0; 4])
            .ok_or_else(|| {
                format!(
                    "[entropy] fabric6 = {:?} is not an IPv6 /96 (the hosts' addresses embed \
                     their IPv4 ones in its last 32 bits)",
                    file.fabric6
                )
            })?;
        let mut labels = BTreeMap::new();
        let mut seen = std::collections::BTreeSet::new();
        for (i, h) in file.host.iter().enumerate() {
            let at = format!("[[entropy.host]] {} ({:?})", i + 1, h.address);
            let addr: Ipv4Addr = h
                .address
                .parse()
                .map_err(|_| format!("{at}: not an IPv4 address"))?;
            if !seen.insert(addr) {
                return Err(format!("{at}: {addr} is listed twice"));
            }
            // The paths of the longest prefix holding it, as the datapath finds them.
            let Some((prefix, paths)) = destinations
                .iter()
                .filter(|(p, _)| p.contains_addr(addr))
                .max_by_key(|(p, _)| p.len)
            else {
                return Err(format!(
                    "{at}: no [[destination]] holds {addr}: its paths are not known"
                ));
            };
            for (name, next, list) in [
                ("ipv4", NEXT_IPV4, Some(&h.ipv4)),
                ("tcp6", IPPROTO_TCP, h.tcp6.as_ref()),
                ("udp6", IPPROTO_UDP, h.udp6.as_ref()),
            ] {
                let Some(list) = list else { continue };
                if list.len() != paths.len() {
                    return Err(format!(
                        "{at}: {} {name} labels for the {} paths of {prefix}; give one per path, \
                         in their order",
                        list.len(),
                        paths.len()
                    ));
                }
                for (hops, label) in paths.iter().zip(list) {
                    let label = u32::try_from(*label)
                        .ok()
                        .filter(|l| *l <= LABEL_MASK)
                        .ok_or_else(|| {
                            format!(
                                "{at}: {name} label {label} of path {hops} is not a flow label \
                                 (0 to 0xFFFFF)"
                            )
                        })?;
                    labels.insert(
                        EvKey {
                            daddr: addr.octets(),
                            next,
                            _pad: 0,
                            hops: [hops.hop0, hops.hop1],
                        },
                        label,
                    );
                }
            }
        }
        Ok(Self {
            source,
            fabric6,
            labels,
        })
    }

    /// The encoding entry of the datapath: this host receives on its own address.
    pub fn encap(&self) -> Encap {
        let mut fabric6 = [0; 12];
        fabric6.copy_from_slice(&self.fabric6.octets()[..12]);
        Encap {
            encoding: encoding::ENTROPY,
            _pad: 0,
            source: self.source.octets(),
            receive: self.source.octets(),
            fabric6,
            _pad2: 0,
        }
    }
}
