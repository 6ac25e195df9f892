//! IPv6 routes of a switch in the SRv6 encoding: other switches' locators and hosts' receive
//! addresses over next hops, and the switch's own locator as the kernel's `seg6local` End
//! behaviour with the NEXT-C-SID (uSID) flavour, as
//! `ip -6 route add fcbb:bb00:N::/48 encap seg6local action End flavors next-csid lblen 32 nflen 16`
//! writes it. `netlink-packet-route` has no seg6local attributes: they are built on its raw
//! attribute support (`RouteLwTunnelEncap::Other`).

use std::net::Ipv6Addr;

use netlink_packet_route::{
    AddressFamily,
    route::{
        RouteAddress, RouteAttribute, RouteHeader, RouteLwEnCapType, RouteLwTunnelEncap,
        RouteMessage, RouteNextHop, RouteProtocol, RouteScope, RouteType,
    },
};
use netlink_packet_utils::nla::DefaultNla;
use serde::{Deserialize, Serialize};

/// `RTPROT_STATIC`: the origin of the routes a switch agent installs.
const RTPROT_STATIC: u8 = 4;

// include/uapi/linux/seg6_local.h
const SEG6_LOCAL_ACTION: u16 = 1;
const SEG6_LOCAL_ACTION_END: u32 = 1;
const SEG6_LOCAL_FLAVORS: u16 = 11;
const SEG6_LOCAL_FLV_OPERATION: u16 = 1;
const SEG6_LOCAL_FLV_LCBLOCK_BITS: u16 = 2;
const SEG6_LOCAL_FLV_LCNODE_FN_BITS: u16 = 3;
const SEG6_LOCAL_FLV_OP_NEXT_CSID: u32 = 4;
/// The kernel parses the flavours strictly: the nest must say it is one.
const NLA_F_NESTED: u16 = 0x8000;

/// A route of the main IPv6 table that a switch agent installs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Route6 {
    pub dst: Ipv6Addr,
    pub len: u8,
    pub action: Action6,
    /// The route's MTU, where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action6 {
    /// Forward over these (gateway, interface) next hops (several: multipath); gateway `::`
    /// for a next hop on the link itself.
    Via { nexthops: Vec<(Ipv6Addr, u32)> },
    /// `seg6local` End, NEXT-C-SID flavour (32-bit block, 16-bit uSIDs), on interface `oif`.
    UsidEnd { oif: u32 },
}

/// One netlink attribute: length, type, value, padded to 4 bytes (host byte order).
fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend((len as u16).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(value);
    out.resize(len.next_multiple_of(4), 0);
    out
}

impl Route6 {
    pub fn name(&self) -> String {
        format!("{}/{}", self.dst, self.len)
    }

    /// Whether this route's prefix holds `addr`/`len`.
    pub fn covers(&self, addr: Ipv6Addr, len: u8) -> bool {
        let mask = |l: u8| u128::MAX.checked_shl(128 - u32::from(l)).unwrap_or(0);
        self.len <= len
            && u128::from(addr) & mask(self.len) == u128::from(self.dst) & mask(self.len)
    }

    /// Whether `current`, read from the kernel now, is still this route as we added it: the
    /// same destination, next hops (in any order) and MTU.
    pub fn still_installed_as(&self, current: &Route6) -> bool {
        let hops = |r: &Route6| match &r.action {
            Action6::Via { nexthops } => {
                let mut h = nexthops.clone();
                h.sort_unstable();
                Some(h)
            }
            Action6::UsidEnd { .. } => None,
        };
        self.dst == current.dst
            && self.len == current.len
            && self.mtu == current.mtu
            && hops(self) == hops(current)
    }

    /// A unicast route of the main IPv6 table, forwarding over next hops (nothing else: local,
    /// encapsulating and other tables' routes are `None`).
    pub(crate) fn from_message(msg: &RouteMessage) -> Option<Self> {
        use netlink_packet_route::route::RouteMetric;
        if msg.header.kind != RouteType::Unicast
            || msg.header.address_family != AddressFamily::Inet6
        {
            return None;
        }
        let mut table = u32::from(msg.header.table);
        let (mut dst, mut gw, mut oif, mut mtu) = (Ipv6Addr::UNSPECIFIED, None, None, None);
        let mut nexthops = Vec::new();
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Destination(RouteAddress::Inet6(a)) => dst = *a,
                RouteAttribute::Gateway(RouteAddress::Inet6(a)) => gw = Some(*a),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Encap(_) | RouteAttribute::EncapType(_) => return None,
                RouteAttribute::Metrics(m) => {
                    for metric in m {
                        if let RouteMetric::Mtu(v) = metric {
                            mtu = (*v > 0).then_some(*v);
                        }
                    }
                }
                RouteAttribute::MultiPath(hops) => {
                    for hop in hops {
                        let gw = hop.attributes.iter().find_map(|a| match a {
                            RouteAttribute::Gateway(RouteAddress::Inet6(g)) => Some(*g),
                            _ => None,
                        });
                        nexthops.push((gw.unwrap_or(Ipv6Addr::UNSPECIFIED), hop.interface_index));
                    }
                }
                _ => {}
            }
        }
        if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
            return None;
        }
        if nexthops.is_empty() {
            nexthops.push((gw.unwrap_or(Ipv6Addr::UNSPECIFIED), oif?));
        }
        Some(Self {
            dst,
            len: msg.header.destination_prefix_length,
            action: Action6::Via { nexthops },
            mtu,
        })
    }

    pub(crate) fn to_message(&self) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet6;
        msg.header.destination_prefix_length = self.len;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::from(RTPROT_STATIC);
        msg.header.scope = RouteScope::Universe;
        msg.header.kind = RouteType::Unicast;
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet6(self.dst)));
        match &self.action {
            Action6::Via { nexthops } => match nexthops.as_slice() {
                [(gw, oif)] => {
                    if !gw.is_unspecified() {
                        msg.attributes
                            .push(RouteAttribute::Gateway(RouteAddress::Inet6(*gw)));
                    }
                    msg.attributes.push(RouteAttribute::Oif(*oif));
                }
                hops => {
                    let hops = hops
                        .iter()
                        .map(|(gw, oif)| {
                            let mut hop = RouteNextHop::default();
                            hop.interface_index = *oif;
                            hop.attributes =
                                vec![RouteAttribute::Gateway(RouteAddress::Inet6(*gw))];
                            hop
                        })
                        .collect();
                    msg.attributes.push(RouteAttribute::MultiPath(hops));
                }
            },
            Action6::UsidEnd { oif } => {
                let mut flavors = nla(
                    SEG6_LOCAL_FLV_OPERATION,
                    &(1u32 << SEG6_LOCAL_FLV_OP_NEXT_CSID).to_ne_bytes(),
                );
                flavors.extend(nla(SEG6_LOCAL_FLV_LCBLOCK_BITS, &[32]));
                flavors.extend(nla(SEG6_LOCAL_FLV_LCNODE_FN_BITS, &[16]));
                msg.attributes
                    .push(RouteAttribute::EncapType(RouteLwEnCapType::Seg6Local));
                msg.attributes.push(RouteAttribute::Encap(vec![
                    RouteLwTunnelEncap::Other(DefaultNla::new(
                        SEG6_LOCAL_ACTION,
                        SEG6_LOCAL_ACTION_END.to_ne_bytes().to_vec(),
                    )),
                    RouteLwTunnelEncap::Other(DefaultNla::new(
                        SEG6_LOCAL_FLAVORS | NLA_F_NESTED,
                        flavors,
                    )),
                ]));
                msg.attributes.push(RouteAttribute::Oif(*oif));
            }
        }
        if let Some(mtu) = self.mtu {
            msg.attributes.push(RouteAttribute::Metrics(vec![
                netlink_packet_route::route::RouteMetric::Mtu(mtu),
            ]));
        }
        msg
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_utils::Emitable as _;

    use super::*;

    #[test]
    fn a_route_with_an_mtu_reads_back_as_it_was_written() {
        let r = Route6 {
            dst: "fd00:5a::".parse().unwrap(),
            len: 96,
            action: Action6::Via {
                nexthops: vec![("fd00:5a::a65:101".parse().unwrap(), 3)],
            },
            mtu: Some(1500),
        };
        assert_eq!(Route6::from_message(&r.to_message()), Some(r.clone()));
        assert!(r.covers("fd00:5a::".parse().unwrap(), 96));
        assert!(!r.covers("fd00:5b::".parse().unwrap(), 96));
        let default = Route6 {
            dst: Ipv6Addr::UNSPECIFIED,
            len: 0,
            ..r
        };
        assert!(default.covers("fd00:5b::".parse().unwrap(), 96));
    }

    #[test]
    fn the_end_route_carries_the_attributes_iproute2_writes() {
        let r = Route6 {
            dst: "fcbb:bb00:5::".parse().unwrap(),
            len: 48,
            action: Action6::UsidEnd { oif: 1 },
            mtu: None,
        };
        let msg = r.to_message();
        let mut bytes = vec![0; msg.buffer_len()];
        msg.emit(&mut bytes);
        // RTA_ENCAP_TYPE (21) = 7 (seg6local), then RTA_ENCAP (22) holding the action (End)
        // and the nested flavours: operation 1 << 4 (NEXT-C-SID), block 32, node 16 bits.
        let find = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        assert!(find(&[6, 0, 21, 0, 7, 0]), "{bytes:?}");
        assert!(find(&[8, 0, 1, 0, 1, 0, 0, 0]), "action End");
        assert!(find(&[28, 0, 11, 0x80]), "nested flavours, 28 bytes");
        assert!(find(&[8, 0, 1, 0, 16, 0, 0, 0]), "next-csid");
        assert!(find(&[5, 0, 2, 0, 32, 0, 0, 0]), "lblen 32");
        assert!(find(&[5, 0, 3, 0, 16, 0, 0, 0]), "nflen 16");
    }
}
