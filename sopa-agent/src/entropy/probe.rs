//! Probes that a hashing switch spreads exactly as it spreads data, and the ICMPv6 errors that
//! answer them (Paris traceroute). IPv6 ECMP hashes source, destination, next header and flow
//! label (policy 0): a probe keeps the data's addresses and next header and changes only the
//! label (the entropy value tried) and the hop limit (which router answers). Its payload
//! begins as the data's would (an IPv4 header inside for encapsulated IPv4, a TCP or UDP
//! header for IPv6) and ends with a tag naming the probe, so a reply, which quotes the probe,
//! says which label and hop limit it answers.
//!
//! ```text
//! IPv6 header (label = EV, hop limit = h) | inner header | "SOPA" | probe id (32 bits)
//! ```

use std::net::{Ipv4Addr, Ipv6Addr};

use sopa_common::{
    entropy::{LABEL_MASK, NEXT_IPV4, label_of},
    srv6::IPV6_HLEN,
    wire::{IPPROTO_TCP, IPPROTO_UDP},
};

/// The tag's first bytes.
pub const MAGIC: [u8; 4] = *b"SOPA";
/// ICMPv6 types a probe is answered with.
pub const ICMP6_DST_UNREACH: u8 = 1;
pub const ICMP6_TIME_EXCEEDED: u8 = 3;

/// One probe: the data's addresses and next header, an entropy value and a hop limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// For encapsulated IPv4, the inner addresses.
    pub src4: Ipv4Addr,
    pub dst4: Ipv4Addr,
    /// `entropy::NEXT_IPV4`, TCP or UDP.
    pub next: u8,
    pub label: u32,
    pub hop_limit: u8,
    pub id: u32,
}

impl Probe {
    /// The whole packet, IPv6 header included (for a raw socket that takes it as written).
    pub fn bytes(&self) -> Vec<u8> {
        let inner = match self.next {
            NEXT_IPV4 => ipv4_udp(self.src4, self.dst4),
            IPPROTO_TCP => {
                // Ports, a sequence number, data offset 5, ACK (a middle of a flow, which a
                // stateful box would not take for a new connection).
                let mut t = vec![0u8; 20];
                t[0..2].copy_from_slice(&33434u16.to_be_bytes());
                t[2..4].copy_from_slice(&33434u16.to_be_bytes());
                t[12] = 5 << 4;
                t[13] = 0x10;
                t
            }
            _ => {
                let mut u = vec![0u8; 8];
                u[0..2].copy_from_slice(&33434u16.to_be_bytes());
                u[2..4].copy_from_slice(&33434u16.to_be_bytes());
                u[4..6].copy_from_slice(&16u16.to_be_bytes());
                u
            }
        };
        let payload = inner.len() + 8;
        let mut p = Vec::with_capacity(IPV6_HLEN + payload);
        let first = (6u32 << 28) | (self.label & LABEL_MASK);
        p.extend(first.to_be_bytes());
        p.extend((payload as u16).to_be_bytes());
        p.push(self.next);
        p.push(self.hop_limit);
        p.extend(self.src.octets());
        p.extend(self.dst.octets());
        p.extend(inner);
        p.extend(MAGIC);
        p.extend(self.id.to_be_bytes());
        p
    }
}

/// An IPv4 header (its checksum right) and a UDP header, as a flow's packet would begin.
fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut h = vec![0u8; 28];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&36u16.to_be_bytes());
    h[8] = 64;
    h[9] = IPPROTO_UDP;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let sum: u32 = h[..20]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xFFFF) + (sum >> 16);
    let check = !(((folded & 0xFFFF) + (folded >> 16)) as u16);
    h[10..12].copy_from_slice(&check.to_be_bytes());
    h[20..22].copy_from_slice(&33434u16.to_be_bytes());
    h[22..24].copy_from_slice(&33434u16.to_be_bytes());
    h[24..26].copy_from_slice(&16u16.to_be_bytes());
    h
}

/// What a router's ICMPv6 error says about a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The router that answered.
    pub from: Ipv6Addr,
    /// The hop limit ran out there (time exceeded), or the probe reached the end (unreachable:
    /// the destination host, or a router with no route).
    pub time_exceeded: bool,
    /// From the quoted probe.
    pub dst: Ipv6Addr,
    pub next: u8,
    pub label: u32,
    pub id: u32,
}

/// The reply in an ICMPv6 message (as a raw ICMPv6 socket returns it: no IPv6 header) from
/// `from`, if it answers one of our probes.
pub fn parse_reply(from: Ipv6Addr, msg: &[u8]) -> Option<Reply> {
    let kind = *msg.first()?;
    if kind != ICMP6_TIME_EXCEEDED && kind != ICMP6_DST_UNREACH {
        return None;
    }
    let quoted = msg.get(8..)?;
    let header = quoted.get(..IPV6_HLEN)?;
    if header[0] >> 4 != 6 {
        return None;
    }
    let next = header[6];
    let inner_len = match next {
        NEXT_IPV4 => 28,
        IPPROTO_TCP => 20,
        IPPROTO_UDP => 8,
        _ => return None,
    };
    let tag = quoted.get(IPV6_HLEN + inner_len..IPV6_HLEN + inner_len + 8)?;
    if tag[..4] != MAGIC {
        return None;
    }
    let dst: [u8; 16] = header[24..40].try_into().ok()?;
    Some(Reply {
        from,
        time_exceeded: kind == ICMP6_TIME_EXCEEDED,
        dst: Ipv6Addr::from(dst),
        next,
        label: label_of([header[0], header[1], header[2], header[3]]),
        id: u32::from_be_bytes(tag[4..8].try_into().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(next: u8) -> Probe {
        Probe {
            src: "fd00:5a::a00:2".parse().unwrap(),
            dst: "fd00:5a::a02:2".parse().unwrap(),
            src4: Ipv4Addr::new(10, 0, 0, 2),
            dst4: Ipv4Addr::new(10, 2, 0, 2),
            next,
            label: 0xABCDE,
            hop_limit: 3,
            id: 0x0102_0304,
        }
    }

    /// A router's time exceeded for `p`: the ICMPv6 header and as much of the probe as fits.
    fn answer(p: &Probe, kind: u8) -> Vec<u8> {
        let mut m = vec![kind, 0, 0, 0, 0, 0, 0, 0];
        let mut quoted = p.bytes();
        // The router decremented the hop limit to 0 before it gave up.
        quoted[7] = 0;
        m.extend(quoted);
        m
    }

    #[test]
    fn a_probe_is_the_datas_header_with_its_label_and_hop_limit() {
        for next in [NEXT_IPV4, IPPROTO_TCP, IPPROTO_UDP] {
            let p = probe(next);
            let b = p.bytes();
            let h = etherparse::Ipv6HeaderSlice::from_slice(&b).unwrap();
            assert_eq!(h.flow_label().value(), 0xABCDE);
            assert_eq!(h.hop_limit(), 3);
            assert_eq!(u8::from(h.next_header()), next);
            assert_eq!(h.source_addr(), p.src);
            assert_eq!(h.destination_addr(), p.dst);
            assert_eq!(usize::from(h.payload_length()), b.len() - 40);
            assert_eq!(b[b.len() - 8..b.len() - 4], MAGIC);
        }
        // Encapsulated IPv4: a valid inner IPv4 header of the flow's addresses.
        let b = probe(NEXT_IPV4).bytes();
        let inner = etherparse::Ipv4HeaderSlice::from_slice(&b[40..]).unwrap();
        assert_eq!(inner.destination_addr(), Ipv4Addr::new(10, 2, 0, 2));
        assert_eq!(
            inner.header_checksum(),
            inner.to_header().calc_header_checksum()
        );
    }

    #[test]
    fn a_reply_names_the_probe_it_answers() {
        let from: Ipv6Addr = "fd00:5b::3".parse().unwrap();
        for next in [NEXT_IPV4, IPPROTO_TCP, IPPROTO_UDP] {
            let p = probe(next);
            let r = parse_reply(from, &answer(&p, ICMP6_TIME_EXCEEDED)).unwrap();
            assert_eq!(
                r,
                Reply {
                    from,
                    time_exceeded: true,
                    dst: p.dst,
                    next,
                    label: 0xABCDE,
                    id: 0x0102_0304,
                }
            );
            assert!(
                !parse_reply(from, &answer(&p, ICMP6_DST_UNREACH))
                    .unwrap()
                    .time_exceeded
            );
        }
        // Not ours: another type, a foreign packet quoted, a quote cut short.
        let p = probe(IPPROTO_UDP);
        let mut echo = answer(&p, ICMP6_TIME_EXCEEDED);
        echo[0] = 129;
        assert_eq!(parse_reply(from, &echo), None);
        let mut foreign = answer(&p, ICMP6_TIME_EXCEEDED);
        let n = foreign.len();
        foreign[n - 8] = b'X';
        assert_eq!(parse_reply(from, &foreign), None);
        let short = &answer(&p, ICMP6_TIME_EXCEEDED)[..8 + 40 + 4];
        assert_eq!(parse_reply(from, short), None);
    }
}
