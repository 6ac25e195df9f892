//! Fixture tables for the SRv6 encoding of `tc_stamp` and `xdp_strip`, run through
//! BPF_PROG_TEST_RUN (needs root): byte-exact encapsulation for every path, the flow label,
//! decapsulation back to the original bytes, and every packet that is not ours left alone.

mod common;

use std::collections::BTreeSet;

use etherparse::PacketBuilder;
use sopa_common::{
    hash::flow_hash,
    maps::{FlowKey, mode, stamp_reason, strip_reason},
    srv6::{
        Block, DEFAULT_BLOCK, MARK_LEN, NEXTHDR_DEST, NEXTHDR_IPV4, NEXTHDR_IPV6, mark_header,
        outer_header,
    },
};

use common::{Fixture, TC_ACT_UNSPEC, gso_ctx, six, verdicts};

/// A single-decision prefix with 3 paths and a two-decision one with 4, as in the option's
/// fixtures, each path naming the switches it chooses.
const TABLE: &str = r#"
encoding = "srv6"
[srv6]
source = "fd00:a:1::2"
receive = "fcbb:bb00:e002::"
fabric6 = "fd00:5a::/96"

[[destination]]
prefix = "10.2.0.0/24"
paths = [[0], [1], [2]]
segments = [[0x0100], [0x0101], [0x0102]]
tail = [0x0200]

[[destination]]
prefix = "10.3.0.0/19"
paths = [[0, 0], [0, 1], [1, 0], [1, 1]]
segments = [[0x0100, 0x0300], [0x0100, 0x0301], [0x0101, 0x0302], [0x0101, 0x0303]]
tail = [0x0110, 0x0210]
"#;

const SOURCE: [u8; 16] = [0xfd, 0, 0, 0xa, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
const SRC: [u8; 4] = [10, 1, 0, 2];
const DST: [u8; 4] = [10, 2, 0, 2];
/// Offset 0x102 in 10.3.0.0/19: local uSID 0xE102.
const DST_INTER_POD: [u8; 4] = [10, 3, 1, 2];

const MAC_DST: [u8; 6] = [2, 0, 0, 0, 0, 2];
const MAC_SRC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn tcp_tos(dst: [u8; 4], sport: u16, tos: u8, payload: &[u8]) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv4(SRC, dst, 64)
        .tcp(sport, 5001, 1, 65535)
        .ack(1);
    let mut out = Vec::new();
    builder.write(&mut out, payload).unwrap();
    out[15] = tos;
    common::fix_ipv4_checksum(&mut out);
    out
}

fn tcp(dst: [u8; 4], sport: u16, payload: &[u8]) -> Vec<u8> {
    tcp_tos(dst, sport, 0, payload)
}

fn udp(dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv4(SRC, dst, 64)
        .udp(4000, 4001);
    let mut out = Vec::new();
    builder.write(&mut out, payload).unwrap();
    out
}

fn key(dst: [u8; 4], sport: u16) -> FlowKey {
    FlowKey {
        saddr: u32::from_ne_bytes(SRC),
        daddr: u32::from_ne_bytes(dst),
        sport: sport.to_be(),
        dport: 5001u16.to_be(),
        proto: 6,
        _pad: [0; 3],
    }
}

/// The address of the uSID list `usids` in the default block (TABLE's).
fn address(usids: &[u16]) -> [u8; 16] {
    sopa_common::srv6::address(DEFAULT_BLOCK, usids)
}

/// The outer destination of TABLE's path `index` to 10.3.1.2.
fn inter_pod_address(index: u32) -> [u8; 16] {
    let chosen = [
        [0x0100, 0x0300],
        [0x0100, 0x0301],
        [0x0101, 0x0302],
        [0x0101, 0x0303],
    ];
    let [a, b] = chosen[index as usize % 4];
    address(&[a, b, 0x0110, 0x0210, 0xE102])
}

/// `inner` (an Ethernet frame of IPv4) with the outer header of `dst` and flow label `label`.
fn encapsulated(inner: &[u8], dst: &[u8; 16], label: u32) -> Vec<u8> {
    let ip = &inner[14..];
    let mut out = inner[..12].to_vec();
    out.extend(0x86DDu16.to_be_bytes());
    let len = u16::from_be_bytes([ip[2], ip[3]]);
    out.extend(outer_header(len, NEXTHDR_IPV4, ip[1], label, &SOURCE, dst));
    out.extend(ip);
    out
}

/// The flow label of an encapsulated frame.
fn label_of(frame: &[u8]) -> u32 {
    u32::from_be_bytes([0, frame[15] & 0xF, frame[16], frame[17]])
}

#[test]
fn every_path_is_encapsulated_byte_for_byte_in_round_robin() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let sport = 4242;
    let start = flow_hash(&key(DST_INTER_POD, sport), 7) % 4;
    let mut label = None;
    for i in 0..8u32 {
        let packet = tcp_tos(DST_INTER_POD, sport, 0xB8 | (i % 3) as u8, &[i as u8; 100]);
        let out = f.stamp(&packet);
        let l = label_of(&out);
        assert_eq!(*label.get_or_insert(l), l, "one flow, one label");
        let want = encapsulated(&packet, &inter_pod_address(start + i), l);
        assert_eq!(out, want, "packet {i}: path {}", (start + i) % 4);
    }
    let c = f.maps.stamp_counters().unwrap();
    assert_eq!(c[stamp_reason::STAMPED as usize], 8);
    let hops = f.maps.hop_counters().unwrap();
    assert_eq!((hops[0], hops[1], hops[256], hops[257]), (4, 4, 4, 4));
}

#[test]
fn a_single_decision_path_ends_with_the_rack_switch_and_the_host() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let packet = udp(DST, b"one decision");
    let out = f.stamp(&packet);
    let index = (0..3)
        .find(|i| out[14 + 24..14 + 40] == address(&[0x0100 + i, 0x0200, 0xE002]))
        .expect("the destination is one of the three paths' lists");
    assert_eq!(
        out,
        encapsulated(
            &packet,
            &address(&[0x0100 + index, 0x0200, 0xE002]),
            label_of(&out)
        )
    );
}

#[test]
fn flows_get_labels_of_their_own() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let labels: BTreeSet<u32> = (0..16)
        .map(|sport| label_of(&f.stamp(&tcp(DST_INTER_POD, 1000 + sport, b"x"))))
        .collect();
    // 20-bit labels of 16 flows: a collision is possible, a handful is not.
    assert!(labels.len() >= 14, "{labels:x?}");
}

#[test]
fn decapsulation_gives_back_the_original_frame() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    // The inner TCP packet is measured like any other.
    f.maps.set_reordering_measured(true).unwrap();
    let before = f.maps.strip_counters().unwrap();
    let inner = tcp(DST, 7, &[9; 300]);
    let ours = encapsulated(&inner, &address(&[0xE002]), 0x12345);
    assert_eq!(f.strip(&ours), inner);
    let after = f.maps.strip_counters().unwrap();
    assert_eq!(
        verdicts(&before, &after, &strip_reason::NAMES),
        ["tcp_data", "decapsulated"]
    );
}

#[test]
fn congestion_marked_on_the_outer_header_reaches_the_inner_one() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    // Inner ECT(0), outer CE.
    let inner = tcp_tos(DST, 7, 0x02, b"marked");
    let mut ours = encapsulated(&inner, &address(&[0xE002]), 1);
    ours[15] |= 0x30;
    let out = f.strip(&ours);
    assert_eq!(out[15], 0x03, "CE inside");
    assert!(common::checksum_ok(&out), "the checksum follows");
    let mut want = inner.clone();
    want[15] = 0x03;
    common::fix_ipv4_checksum(&mut want);
    assert_eq!(out, want);
}

#[test]
fn packets_that_are_not_ours_pass_as_they_are() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let inner = tcp(DST, 7, b"x");
    let mut srh = encapsulated(&inner, &address(&[0xE002]), 1);
    srh[14 + 6] = 43; // a routing header follows: another SR domain's packet
    let mut udp6 = Vec::new();
    PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv6([0xfd; 16], [0xfe; 16], 64)
        .udp(1, 2)
        .write(&mut udp6, b"six")
        .unwrap();
    // (name, frame, strip verdict)
    let cases = [
        (
            "another host's local uSID",
            encapsulated(&inner, &address(&[0xE003]), 1),
            strip_reason::FOREIGN_SRV6,
        ),
        (
            "a list this host is not at the end of",
            encapsulated(&inner, &address(&[0x0200, 0xE002]), 1),
            strip_reason::FOREIGN_SRV6,
        ),
        ("a routing header", srh, strip_reason::FOREIGN_SRV6),
        ("plain IPv6", udp6, strip_reason::NOT_IPV4),
        (
            "an IPv6 header cut short",
            encapsulated(&inner, &address(&[0xE002]), 1)[..40].to_vec(),
            strip_reason::NOT_IPV4,
        ),
    ];
    for (name, frame, reason) in cases {
        let before = f.maps.strip_counters().unwrap();
        assert_eq!(f.strip(&frame), frame, "{name}: untouched");
        let after = f.maps.strip_counters().unwrap();
        assert_eq!(
            verdicts(&before, &after, &strip_reason::NAMES),
            [strip_reason::NAMES[reason as usize]],
            "{name}"
        );
    }
}

/// A fabric of its own uSID block (the block of the address a host receives on): every path
/// address begins with it, the host strips its own address in it, and a packet of the default
/// block is not this fabric's.
#[test]
fn a_fabric_of_its_own_block_encapsulates_and_strips_in_it() {
    const OURS: Block = [0x20, 0x01, 0x0d, 0xb8];
    let table = TABLE.replace("fcbb:bb00:e002::", "2001:db8:e002::");
    let mut f = Fixture::new(&table, mode::SOPA);
    let in_ours = |usids: &[u16]| sopa_common::srv6::address(OURS, usids);
    let packet = udp(DST, b"own block");
    let mut seen = BTreeSet::new();
    for _ in 0..3 {
        let out = f.stamp(&packet);
        let index = (0..3)
            .find(|i| out[14 + 24..14 + 40] == in_ours(&[0x0100 + i, 0x0200, 0xE002]))
            .expect("one of the three paths' lists, in the fabric's block");
        assert_eq!(
            out,
            encapsulated(
                &packet,
                &in_ours(&[0x0100 + index, 0x0200, 0xE002]),
                label_of(&out)
            )
        );
        seen.insert(index);
    }
    assert_eq!(seen.len(), 3, "round robin over the three paths");

    let inner = tcp(DST, 7, b"x");
    assert_eq!(
        f.strip(&encapsulated(&inner, &in_ours(&[0xE002]), 1)),
        inner
    );
    for (name, frame, reason) in [
        (
            "another host of this block",
            encapsulated(&inner, &in_ours(&[0xE003]), 1),
            strip_reason::FOREIGN_SRV6,
        ),
        (
            "this host's uSIDs in the default block",
            encapsulated(&inner, &address(&[0xE002]), 1),
            strip_reason::NOT_IPV4,
        ),
    ] {
        let before = f.maps.strip_counters().unwrap();
        assert_eq!(f.strip(&frame), frame, "{name}: untouched");
        let after = f.maps.strip_counters().unwrap();
        assert_eq!(
            verdicts(&before, &after, &strip_reason::NAMES),
            [strip_reason::NAMES[reason as usize]],
            "{name}"
        );
    }
}

#[test]
fn what_srv6_cannot_carry_leaves_unencapsulated() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let mut icmp = Vec::new();
    PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv4(SRC, DST, 64)
        .icmpv4_echo_request(1, 1)
        .write(&mut icmp, b"ping")
        .unwrap();
    let mut fragment = udp(DST, b"frag");
    fragment[20] = 0x20; // more fragments
    common::fix_ipv4_checksum(&mut fragment);
    let mut options = tcp(DST, 9, b"x");
    options.splice(34..34, [0x9E, 4, 0, 0]);
    options[14] = 0x46;
    let tot = u16::from_be_bytes([options[16], options[17]]) + 4;
    options[16..18].copy_from_slice(&tot.to_be_bytes());
    common::fix_ipv4_checksum(&mut options);
    let cases = [
        ("icmp", icmp, stamp_reason::NOT_TCP_UDP),
        ("a fragment", fragment, stamp_reason::FRAGMENT),
        (
            "outside the fabric",
            tcp([192, 168, 7, 1], 9, b"x"),
            stamp_reason::NOT_FABRIC,
        ),
        (
            "an IPv4 option, even ours",
            options,
            stamp_reason::HAS_OPTIONS,
        ),
        (
            "a packet already encapsulated",
            encapsulated(&tcp(DST, 7, b"x"), &address(&[0x0100, 0xE002]), 1),
            stamp_reason::NOT_TCP_UDP,
        ),
        // (BPF_PROG_TEST_RUN refuses an skb whose IPv4 header is cut: the ports are cut here.)
        (
            "truncated ports",
            tcp(DST, 9, b"")[..36].to_vec(),
            stamp_reason::TOO_SHORT,
        ),
    ];
    for (name, packet, reason) in cases {
        let before = f.maps.stamp_counters().unwrap();
        let (action, out) = f.stamp_with(&packet, None);
        assert_eq!(action, TC_ACT_UNSPEC, "{name}: passed on");
        assert_eq!(out, packet, "{name}: untouched");
        let after = f.maps.stamp_counters().unwrap();
        let counted: Vec<&str> = verdicts(&before, &after, &stamp_reason::NAMES)
            .into_iter()
            .filter(|n| {
                stamp_reason::is_verdict(
                    stamp_reason::NAMES.iter().position(|x| x == n).unwrap() as u32
                )
            })
            .collect();
        assert_eq!(counted, [stamp_reason::NAMES[reason as usize]], "{name}");
    }
}

/// Pins the flow from `sport` to DST_INTER_POD on the path `hops`, for ever.
fn pin(f: &mut Fixture, sport: u16, hops: [u8; 2]) {
    let pin = sopa_common::maps::Pin {
        hops,
        _pad: [0; 6],
        expires_ns: u64::MAX,
    };
    f.maps
        .replace_pins(&[(key(DST_INTER_POD, sport), pin)])
        .unwrap();
}

#[test]
fn a_hedera_pin_takes_the_usids_of_its_hop_pair() {
    let mut f = Fixture::new(TABLE, mode::PINNED);
    let sport = 78;
    pin(&mut f, sport, [1, 1]);
    for i in 0..4 {
        let packet = tcp(DST_INTER_POD, sport, &[i; 64]);
        let out = f.stamp(&packet);
        // TABLE's path (1, 1) is the fourth: uSIDs 0x0101, 0x0303.
        assert_eq!(
            out,
            encapsulated(&packet, &inter_pod_address(3), label_of(&out))
        );
    }
    let c = f.maps.stamp_counters().unwrap();
    assert_eq!(c[stamp_reason::PINNED as usize], 4);
}

#[test]
fn a_pinned_path_without_usids_leaves_unencapsulated() {
    // Hedera pins name hop pairs; one the table has no uSIDs for is not guessed at.
    let mut f = Fixture::new(TABLE, mode::PINNED);
    let sport = 77;
    pin(&mut f, sport, [9, 9]);
    let packet = tcp(DST_INTER_POD, sport, b"x");
    let before = f.maps.stamp_counters().unwrap();
    assert_eq!(f.stamp(&packet), packet);
    let after = f.maps.stamp_counters().unwrap();
    assert_eq!(
        after[stamp_reason::NO_SEGMENTS as usize],
        before[stamp_reason::NO_SEGMENTS as usize] + 1
    );
}

#[test]
fn switching_encodings_at_run_time_takes_effect_on_the_next_packet() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let packet = tcp(DST, 5, b"x");
    assert_eq!(f.stamp(&packet).len(), packet.len() + 40);
    f.maps.apply_srv6(None).unwrap();
    assert_eq!(f.stamp(&packet).len(), packet.len() + 4, "the option again");
    let table = sopa_agent::path_table::PathTable::parse(TABLE).unwrap();
    f.maps.apply_srv6(table.srv6.as_ref()).unwrap();
    assert_eq!(f.stamp(&packet).len(), packet.len() + 40);
}

#[test]
fn a_packet_the_outer_header_would_take_past_the_mtu_passes_unencapsulated() {
    // BPF_PROG_TEST_RUN sends the packet out of the namespace's loopback: give it a host's MTU.
    let ns = sopa_testbed::netns::NetNs::new(&sopa_testbed::netns::run_name("mtu6")).unwrap();
    ns.ip(&["link", "set", "lo", "mtu", "1500"]).unwrap();
    let mut f = Fixture::new(TABLE, mode::SOPA);
    // (name, packet, __sk_buff, verdict)
    type Case = (&'static str, Vec<u8>, Option<[u8; 192]>, u32);
    let cases: Vec<Case> = vec![
        // IP length 1461: 40 more is one past the MTU.
        (
            "one byte too long",
            tcp(DST, 1, &[7; 1421]),
            None,
            stamp_reason::TOO_BIG,
        ),
        (
            "just fits",
            tcp(DST, 2, &[7; 1420]),
            None,
            stamp_reason::STAMPED,
        ),
        (
            "gso segments that would not fit",
            tcp(DST, 3, &[7; 2842]),
            Some(gso_ctx(2, 1421)),
            stamp_reason::TOO_BIG,
        ),
    ];
    // With the path meter on, its mark takes 8 bytes more.
    let marked_cases: Vec<Case> = vec![
        (
            "fits without the mark, not with it",
            tcp(DST, 4, &[7; 1420]),
            None,
            stamp_reason::TOO_BIG,
        ),
        (
            "just fits with the mark",
            tcp(DST, 5, &[7; 1412]),
            None,
            stamp_reason::STAMPED,
        ),
        (
            "gso segments that fit only without the mark",
            tcp(DST, 6, &[7; 2826]),
            Some(gso_ctx(2, 1413)),
            stamp_reason::TOO_BIG,
        ),
    ];
    let period = sopa_agent::meter::DEFAULT_PERIOD.as_nanos() as u64;
    let cases = cases
        .into_iter()
        .map(|c| (0, c))
        .chain(marked_cases.into_iter().map(|c| (period, c)));
    ns.run(|| {
        for (period, (name, packet, ctx, reason)) in cases {
            f.maps.set_meter_period(period).unwrap();
            let before = f.maps.stamp_counters().unwrap();
            let (action, out) = f.stamp_with(&packet, ctx.as_ref().map(|c| &c[..]));
            assert_eq!(action, TC_ACT_UNSPEC, "{name}: passed on");
            let after = f.maps.stamp_counters().unwrap();
            assert_eq!(
                after[reason as usize],
                before[reason as usize] + 1,
                "{name}: counted as {}",
                stamp_reason::NAMES[reason as usize]
            );
            if reason == stamp_reason::STAMPED {
                let mark = if period == 0 { 0 } else { MARK_LEN };
                assert_eq!(out.len(), packet.len() + 40 + mark, "{name}");
            } else {
                assert_eq!(out, packet, "{name}: untouched");
            }
        }
    })
    .unwrap();
}

fn tcp6(dst: [u8; 16], sport: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv6(six(SRC), dst, 64)
        .tcp(sport, 5001, 1, 65535)
        .write(&mut out, payload)
        .unwrap();
    out
}

/// `inner` (an Ethernet frame of IPv6) with the outer header of `dst` and flow label `label`.
fn encapsulated6(inner: &[u8], dst: &[u8; 16], label: u32) -> Vec<u8> {
    let ip = &inner[14..];
    let mut out = inner[..14].to_vec();
    let len = u16::from_be_bytes([ip[4], ip[5]]) + 40;
    let tclass = (ip[0] << 4) | (ip[1] >> 4);
    out.extend(outer_header(len, NEXTHDR_IPV6, tclass, label, &SOURCE, dst));
    out.extend(ip);
    out
}

#[test]
fn ipv6_to_the_fabric_takes_the_paths_of_the_ipv4_address_it_embeds() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let sport = 4343;
    // The flow as the datapath keys it: the embedded IPv4 addresses.
    let start = flow_hash(&key(DST_INTER_POD, sport), 7) % 4;
    for i in 0..8u32 {
        let packet = tcp6(six(DST_INTER_POD), sport, &[i as u8; 200]);
        let out = f.stamp(&packet);
        let want = encapsulated6(&packet, &inter_pod_address(start + i), label_of(&out));
        assert_eq!(out, want, "packet {i}: path {}", (start + i) % 4);
        // And back: B's xdp_strip gives the original frame.
        let mut arriving = want.clone();
        arriving[14 + 24..14 + 40].copy_from_slice(&address(&[0xE002]));
        assert_eq!(f.strip(&arriving), packet, "packet {i} decapsulated");
    }
}

#[test]
fn ipv6_that_srv6_does_not_carry_leaves_unencapsulated() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let with_next = |next: u8| {
        let mut p = tcp6(six(DST), 9, b"x");
        p[14 + 6] = next;
        p
    };
    let cases = [
        (
            "a hop-by-hop header",
            with_next(0),
            stamp_reason::HAS_OPTIONS,
        ),
        ("a routing header", with_next(43), stamp_reason::HAS_OPTIONS),
        (
            "a destination options header",
            with_next(60),
            stamp_reason::HAS_OPTIONS,
        ),
        ("a fragment header", with_next(44), stamp_reason::FRAGMENT),
        (
            "BIG TCP's payload length of 0",
            {
                let mut p = tcp6(six(DST), 9, b"x");
                p[18] = 0;
                p[19] = 0;
                p
            },
            stamp_reason::TOO_BIG,
        ),
        ("icmpv6", with_next(58), stamp_reason::NOT_TCP_UDP),
        (
            "IPv4 inside already",
            with_next(4),
            stamp_reason::NOT_TCP_UDP,
        ),
        (
            "outside the fabric's /96",
            tcp6(
                [0xfd, 0, 0, 0x5b, 0, 0, 0, 0, 0, 0, 0, 0, 10, 2, 0, 2],
                9,
                b"x",
            ),
            stamp_reason::NOT_FABRIC,
        ),
        // (BPF_PROG_TEST_RUN refuses an skb whose IPv6 header is cut: the ports are cut here.)
        (
            "truncated ports",
            tcp6(six(DST), 9, b"")[..56].to_vec(),
            stamp_reason::TOO_SHORT,
        ),
    ];
    for (name, packet, reason) in cases {
        let before = f.maps.stamp_counters().unwrap();
        let (action, out) = f.stamp_with(&packet, None);
        assert_eq!(action, TC_ACT_UNSPEC, "{name}: passed on");
        assert_eq!(out, packet, "{name}: untouched");
        let after = f.maps.stamp_counters().unwrap();
        assert_eq!(
            after[reason as usize],
            before[reason as usize] + 1,
            "{name}: counted as {}",
            stamp_reason::NAMES[reason as usize]
        );
    }
}

/// `encapsulated` with the path meter's mark of path `hops` in the period of `color` between
/// the outer header and the inner packet (IPv4 or IPv6 inside, by the inner frame's EtherType).
fn marked(inner: &[u8], dst: &[u8; 16], label: u32, hops: [u8; 2], color: u8) -> Vec<u8> {
    let ip = &inner[14..];
    let (next, len) = if inner[12..14] == [0x86, 0xDD] {
        (NEXTHDR_IPV6, u16::from_be_bytes([ip[4], ip[5]]) + 40)
    } else {
        (NEXTHDR_IPV4, u16::from_be_bytes([ip[2], ip[3]]))
    };
    let tclass = if next == NEXTHDR_IPV6 {
        (ip[0] << 4) | (ip[1] >> 4)
    } else {
        ip[1]
    };
    let mut out = inner[..12].to_vec();
    out.extend(0x86DDu16.to_be_bytes());
    out.extend(outer_header(
        len + MARK_LEN as u16,
        NEXTHDR_DEST,
        tclass,
        label,
        &SOURCE,
        dst,
    ));
    out.extend(mark_header(next, hops, color));
    out.extend(ip);
    out
}

/// The path meter in the SRv6 encoding: `tc_stamp` puts RFC 9343's mark after the outer header
/// (the path's hop bytes, the period's color) and counts what it sends per (destination rack,
/// path, color); `xdp_strip` counts by the mark and the inner source's rack, and removes the
/// mark with the outer header. With the period 0 there is no mark.
#[test]
fn the_path_meter_marks_srv6_packets_in_rfc_9343s_option_and_counts_both_ends() {
    use common::{meter_bytes as bytes, meter_packets as packets, meter_total as total};
    let mut f = Fixture::new(TABLE, mode::SOPA);
    // The color is the agent's to turn.
    let period = sopa_agent::meter::DEFAULT_PERIOD.as_nanos() as u64;
    f.maps.set_meter_period(period).unwrap();
    let mut turn = f.maps.meter_color().unwrap().expect("a color to turn");
    let sport = 4545;
    let start = flow_hash(&key(DST_INTER_POD, sport), 7) % 4;
    let hops = |i: u32| [[0, 0], [0, 1], [1, 0], [1, 1]][((start + i) % 4) as usize];
    let mut arrived = Vec::new();
    for (i, color) in [0u8, 0, 1].into_iter().enumerate() {
        turn.set(color).unwrap();
        let i = i as u32;
        let packet = tcp(DST_INTER_POD, sport, &[i as u8; 100]);
        let out = f.stamp(&packet);
        let want = marked(
            &packet,
            &inter_pod_address(start + i),
            label_of(&out),
            hops(i),
            color,
        );
        assert_eq!(out, want, "packet {i}: path {:?}, color {color}", hops(i));
        arrived.push((out, packet));
    }
    // IPv6 inside: the same mark, its next header 41.
    let packet6 = tcp6(six(DST_INTER_POD), sport, &[3; 100]);
    let out6 = f.stamp(&packet6);
    assert_eq!(
        out6,
        marked(
            &packet6,
            &inter_pod_address(start + 3),
            label_of(&out6),
            hops(3),
            1
        )
    );
    arrived.push((out6, packet6));
    let (sent0, _) = f.maps.meter_counts(0).unwrap();
    let (sent1, _) = f.maps.meter_counts(1).unwrap();
    // The bytes the packets took on the wire, outer header and mark on.
    let wire = |r: std::ops::Range<usize>| arrived[r].iter().map(|(o, _)| o.len() as u64).sum();
    assert_eq!((bytes(&sent0), bytes(&sent1)), (wire(0..2), wire(2..4)));
    let (sent0, sent1) = (packets(&sent0), packets(&sent1));
    assert_eq!((total(&sent0), total(&sent1)), (2, 2));
    let rack = u32::from_ne_bytes([10, 3, 1, 0]);
    assert!(sent0.iter().chain(&sent1).all(|(k, _)| k.peer == rack));

    // At the destination (its rack switch consumed the list): the original frame, counted by
    // the mark's path and color, from the source's rack (one of the fabric's: its paths here
    // take hops below 2 and 2); the receiver's own period is no matter.
    turn.set(0).unwrap();
    let peer = sopa_common::maps::MeterPeer {
        hop_limits: [2, 2],
        hop1_none: 0,
        _pad: 0,
    };
    f.maps
        .set_meter_peers(&[("10.1.0.0/24".parse().unwrap(), peer)])
        .unwrap();
    for (out, packet) in &arrived {
        let mut frame = out.clone();
        frame[14 + 24..14 + 40].copy_from_slice(&address(&[0xE002]));
        assert_eq!(&f.strip(&frame), packet, "decapsulated, mark and all");
    }
    let (_, received0) = f.maps.meter_counts(0).unwrap();
    let (_, received1) = f.maps.meter_counts(1).unwrap();
    let from = u32::from_ne_bytes([10, 1, 0, 0]);
    assert!(
        received0
            .iter()
            .chain(&received1)
            .all(|(k, _)| k.peer == from)
    );
    let by_path = |c: &[(sopa_common::maps::MeterKey, u64)]| {
        let mut v: Vec<_> = c.iter().map(|(k, n)| ((k.hops, k.color), *n)).collect();
        v.sort();
        v
    };
    let sent: Vec<_> = [by_path(&sent0), by_path(&sent1)].concat();
    let got: Vec<_> = [by_path(&received0), by_path(&received1)].concat();
    assert_eq!(sent, got, "each path and color counted alike at both ends");

    // A Destination Options header that is not our mark is not ours to remove.
    let mut foreign = arrived[0].0.clone();
    foreign[14 + 24..14 + 40].copy_from_slice(&address(&[0xE002]));
    foreign[14 + 40 + 2] = 0x1E;
    let before = f.maps.strip_counters().unwrap();
    assert_eq!(f.strip(&foreign), foreign, "untouched");
    let after = f.maps.strip_counters().unwrap();
    assert_eq!(
        verdicts(&before, &after, &strip_reason::NAMES),
        ["foreign_srv6"]
    );

    // An option's mark is not the SRv6 fabric's: left uncounted (no host of it sends one).
    let opt = common::with_option(&arrived[0].1, 0, 1);
    let before = f.maps.strip_counters().unwrap();
    f.strip(&opt);
    let after = f.maps.strip_counters().unwrap();
    let i = strip_reason::METER_FOREIGN as usize;
    assert_eq!(
        after[i],
        before[i] + 1,
        "an option's mark in an SRv6 fabric"
    );
    assert_eq!(f.maps.meter_counts(0).unwrap().1, received0);

    // Off: no mark, nothing counted.
    f.maps.set_meter_period(0).unwrap();
    let packet = tcp(DST_INTER_POD, sport, b"off");
    let out = f.stamp(&packet);
    assert_eq!(out.len(), packet.len() + 40);
    assert_eq!(out[14 + 6], NEXTHDR_IPV4);
    let (sent1, _) = f.maps.meter_counts(1).unwrap();
    assert_eq!(total(&packets(&sent1)), 2);
}

#[test]
fn destinations_of_one_length_are_matched_exactly() {
    use aya::maps::{HashMap, LpmTrie, MapData, lpm_trie::Key};
    use sopa_common::maps::{SRV6_DESTS_EXACT_MAP, SRV6_DESTS_MAP, Srv6Dest, lookup};

    // Both prefixes /24: the path sets and the SRv6 destinations are matched exactly.
    let one_length = TABLE.replace("10.3.0.0/19", "10.3.1.0/24");
    let mut f = Fixture::new(&one_length, mode::SINGLE);
    assert_eq!(f.maps.exact_length_of(lookup::PATHS).unwrap(), Some(24));
    assert_eq!(
        f.maps.exact_length_of(lookup::SRV6_DESTS).unwrap(),
        Some(24)
    );
    let packet = tcp(DST_INTER_POD, 9, b"x");
    let by_exact = f.stamp(&packet);
    assert_eq!(by_exact.len(), packet.len() + 40, "encapsulated");

    // The trie gives the same outer header.
    f.set_host(|h| h.lookup[lookup::SRV6_DESTS as usize] = 0);
    assert_eq!(
        f.stamp(&packet),
        by_exact,
        "the trie's answer is the exact match's"
    );
    // The exact table is what the program reads while the mask is set: with the trie's entry
    // gone it still encapsulates, with the mask cleared too it cannot.
    f.set_host(|h| h.lookup[lookup::SRV6_DESTS as usize] = u32::MAX << 8);
    let mut trie: LpmTrie<MapData, [u8; 4], Srv6Dest> =
        f.pinned(SRV6_DESTS_MAP).try_into().unwrap();
    trie.remove(&Key::new(24, [10, 3, 1, 0])).unwrap();
    assert_eq!(f.stamp(&packet), by_exact, "found by the exact match");
    f.set_host(|h| h.lookup[lookup::SRV6_DESTS as usize] = 0);
    assert_eq!(
        f.stamp(&packet),
        packet,
        "no destination: left unencapsulated"
    );

    // Back to the option: the SRv6 exact table is emptied and off.
    f.maps.apply_srv6(None).unwrap();
    assert_eq!(f.maps.exact_length_of(lookup::SRV6_DESTS).unwrap(), None);
    let dests: HashMap<MapData, [u8; 4], Srv6Dest> =
        f.pinned(SRV6_DESTS_EXACT_MAP).try_into().unwrap();
    assert_eq!(dests.keys().count(), 0, "no entry left behind");
    assert_eq!(f.stamp(&packet).len(), packet.len() + 4, "the option");

    // A table of the same length without the first destination: the second's group, which
    // both shared, compiles as group 0 again with the first's segments gone. Written against
    // the groups in place, the changed group takes a fresh id, its entries written before the
    // destination names it; the old group stays whole until nothing names it (in place, the
    // destination would name a group whose entries change under it one by one).
    f.maps
        .apply_srv6(table_of(&one_length).srv6.as_ref())
        .unwrap();
    let group_of = |dests: &HashMap<MapData, [u8; 4], Srv6Dest>| {
        dests.get(&[10, 3, 1, 0], 0).expect("10.3.1.0/24").group
    };
    let before = group_of(&dests);
    let second_only = one_length.replace(
        "[[destination]]\nprefix = \"10.2.0.0/24\"\npaths = [[0], [1], [2]]\n\
         segments = [[0x0100], [0x0101], [0x0102]]\ntail = [0x0200]\n",
        "",
    );
    assert_ne!(second_only, one_length, "the first destination is gone");
    let t = table_of(&second_only);
    f.maps.apply_paths(&t).unwrap();
    f.maps.apply_srv6(t.srv6.as_ref()).unwrap();
    assert_eq!(
        f.maps.exact_length_of(lookup::SRV6_DESTS).unwrap(),
        Some(24)
    );
    assert_ne!(
        group_of(&dests),
        before,
        "10.3.1.0/24's group changed: a fresh id"
    );
    let mut fresh = Fixture::new(&second_only, mode::SINGLE);
    assert_eq!(
        f.stamp(&packet),
        fresh.stamp(&packet),
        "as a datapath given it first"
    );
}

fn table_of(toml: &str) -> sopa_agent::path_table::PathTable {
    sopa_agent::path_table::PathTable::parse(toml).unwrap()
}
