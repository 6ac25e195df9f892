//! The netlink codec of the agent's route socket.
//!
//! `netlink-packet-route` (every release to date) reads the `RTAX_CC_ALGO` route metric as a
//! `u32`, where the kernel sends the congestion control's name (`congctl cubic` arrives as
//! `"cubic\0"`). The message fails to parse and the codec drops the whole route: a fabric
//! route with `congctl` would be invisible to the agent, which would then add a more specific
//! copy of some other route in its place. This codec parks that one metric under a type
//! number no kernel uses before the message is parsed (so it is kept, bytes intact, as an
//! unknown metric) and gives it its number back on everything sent to the kernel.

use std::{fmt::Debug, io};

use bytes::BytesMut;
use netlink_packet_core::{NetlinkDeserializable, NetlinkMessage, NetlinkSerializable};
use netlink_proto::{NetlinkCodec, NetlinkMessageCodec};

/// `RTAX_CC_ALGO` of linux/rtnetlink.h.
const RTAX_CC_ALGO: u16 = 16;
/// Where the codec parks it: a metric number far beyond `RTAX_MAX`, flag bits clear.
pub const CC_ALGO_PARKED: u16 = 0x3F00 | RTAX_CC_ALGO;

const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;
/// `struct nlmsghdr` and `struct rtmsg`.
const NLMSG_HDR: usize = 16;
const RTMSG: usize = 12;
const RTA_METRICS: u16 = 8;
/// The type bits of an attribute's type (without NLA_F_NESTED, NLA_F_NET_BYTEORDER).
const NLA_TYPE_MASK: u16 = 0x3FFF;

pub struct RouteCodec;

impl NetlinkMessageCodec for RouteCodec {
    fn decode<T>(src: &mut BytesMut) -> io::Result<Option<NetlinkMessage<T>>>
    where
        T: NetlinkDeserializable + Debug,
    {
        // Idempotent: the buffer may hold several messages and is decoded one at a time.
        renumber_metric(src, RTAX_CC_ALGO, CC_ALGO_PARKED);
        NetlinkCodec::decode(src)
    }

    fn encode<T>(msg: NetlinkMessage<T>, buf: &mut BytesMut) -> io::Result<()>
    where
        T: NetlinkSerializable + Debug,
    {
        let start = buf.len();
        NetlinkCodec::encode(msg, buf)?;
        renumber_metric(&mut buf[start..], CC_ALGO_PARKED, RTAX_CC_ALGO);
        Ok(())
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Netlink attributes are padded to 4 bytes.
fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// Rewrites the type of every route metric `from` into `to`, in every route message of the
/// datagram `buf` (anything malformed is left for the parser to refuse).
pub fn renumber_metric(buf: &mut [u8], from: u16, to: u16) {
    let mut msg = 0;
    while let Some(len) = u32_at(buf, msg).map(|l| l as usize) {
        if len < NLMSG_HDR || msg + len > buf.len() {
            return;
        }
        let kind = u16_at(buf, msg + 4).unwrap_or(0);
        if matches!(kind, RTM_NEWROUTE | RTM_DELROUTE | RTM_GETROUTE) {
            let end = msg + len;
            let mut attr = msg + NLMSG_HDR + RTMSG;
            while attr + 4 <= end {
                let (Some(alen), Some(akind)) = (u16_at(buf, attr), u16_at(buf, attr + 2)) else {
                    break;
                };
                let alen = usize::from(alen);
                if alen < 4 || attr + alen > end {
                    break;
                }
                if akind & NLA_TYPE_MASK == RTA_METRICS {
                    let mut m = attr + 4;
                    while m + 4 <= attr + alen {
                        let mlen = usize::from(u16_at(buf, m).unwrap_or(0));
                        let mkind = u16_at(buf, m + 2).unwrap_or(0);
                        if mlen < 4 || m + mlen > attr + alen {
                            break;
                        }
                        if mkind & NLA_TYPE_MASK == from {
                            let flags = mkind & !NLA_TYPE_MASK;
                            buf[m + 2..m + 4].copy_from_slice(&(to | flags).to_ne_bytes());
                        }
                        m += align(mlen);
                    }
                }
                attr += align(alen);
            }
        }
        msg += align(len);
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NLM_F_MULTIPART, NetlinkHeader, NetlinkPayload};
    use netlink_packet_route::{
        RouteNetlinkMessage,
        route::{RouteMessage, RouteMetric},
    };
    use netlink_packet_utils::nla::DefaultNla;

    use super::*;

    /// A route as the kernel sends it for `ip route add 10.1.0.0/16 dev X mtu 1400 congctl
    /// reno`: RTA_METRICS holding RTAX_MTU and RTAX_CC_ALGO "reno\0".
    fn kernel_datagram() -> BytesMut {
        let mut msg = RouteMessage::default();
        msg.header.destination_prefix_length = 16;
        msg.attributes
            .push(netlink_packet_route::route::RouteAttribute::Metrics(vec![
                RouteMetric::Mtu(1400),
                RouteMetric::Other(DefaultNla::new(CC_ALGO_PARKED, b"reno\0".to_vec())),
            ]));
        let mut nl = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(msg)),
        );
        nl.header.flags = NLM_F_MULTIPART;
        nl.finalize();
        let mut buf = BytesMut::new();
        NetlinkCodec::encode(nl, &mut buf).unwrap();
        // As the kernel has it: the algorithm under its own number.
        renumber_metric(&mut buf, CC_ALGO_PARKED, RTAX_CC_ALGO);
        buf
    }

    #[test]
    fn the_stock_codec_drops_a_route_with_congctl() {
        let mut twice = kernel_datagram();
        twice.extend_from_slice(&kernel_datagram());
        let parsed = NetlinkCodec::decode::<RouteNetlinkMessage>(&mut twice).unwrap();
        assert!(parsed.is_none(), "the premise of this codec: {parsed:?}");
    }

    #[test]
    fn a_route_with_congctl_is_read_and_written_back_unchanged() {
        let original = kernel_datagram();
        let mut twice = original.clone();
        twice.extend_from_slice(&original);
        let mut seen = 0;
        while let Some(msg) = RouteCodec::decode::<RouteNetlinkMessage>(&mut twice).unwrap() {
            seen += 1;
            let mut out = BytesMut::new();
            RouteCodec::encode(msg, &mut out).unwrap();
            assert_eq!(out, original, "re-encoded as the kernel sent it");
        }
        assert_eq!(seen, 2, "both routes of the datagram");
    }
}
