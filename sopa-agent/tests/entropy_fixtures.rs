//! Fixture tables for the entropy encoding of `tc_stamp` and `xdp_strip`, run through
//! BPF_PROG_TEST_RUN (needs root): IPv4 in an outer IPv6 header byte for byte with each path's
//! label, IPv6 relabelled in place with the labels of its next header, round robin over the
//! paths, what has no label or is not ours left alone, and the receiver's normalisation before
//! GRO (outer header removed, label zeroed).

mod common;

use std::collections::BTreeSet;

use etherparse::PacketBuilder;
use sopa_common::{
    entropy::label_of,
    maps::{mode, stamp_reason, strip_reason},
    srv6::{NEXTHDR_IPV4, outer_header},
};

use common::{Fixture, six, verdicts};

/// One destination prefix with 4 paths; labels for one of its hosts, 10.2.0.2.
const TABLE: &str = r#"
encoding = "entropy"

[entropy]
source = "fd00:5a::a01:2"
fabric6 = "fd00:5a::/96"

[[entropy.host]]
address = "10.2.0.2"
ipv4 = [0x11111, 0x22222, 0x33333, 0x44444]
tcp6 = [0x51111, 0x52222, 0x53333, 0x54444]
udp6 = [0x61111, 0x62222, 0x63333, 0x64444]

[[destination]]
prefix = "10.2.0.0/24"
paths = [[0, 0], [0, 1], [1, 0], [1, 1]]
"#;

const IPV4_LABELS: [u32; 4] = [0x11111, 0x22222, 0x33333, 0x44444];
const TCP6_LABELS: [u32; 4] = [0x51111, 0x52222, 0x53333, 0x54444];
const UDP6_LABELS: [u32; 4] = [0x61111, 0x62222, 0x63333, 0x64444];

const SRC: [u8; 4] = [10, 1, 0, 2];
const DST: [u8; 4] = [10, 2, 0, 2];
/// In the prefix, without labels.
const UNLABELLED: [u8; 4] = [10, 2, 0, 3];
const MAC_DST: [u8; 6] = [2, 0, 0, 0, 0, 2];
const MAC_SRC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn tcp(dst: [u8; 4], sport: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv4(SRC, dst, 64)
        .tcp(sport, 5001, 1, 65535)
        .write(&mut out, payload)
        .unwrap();
    out
}

fn tcp6(src: [u8; 16], dst: [u8; 16], label: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv6(src, dst, 64)
        .tcp(7000, 5001, 1, 65535)
        .write(&mut out, payload)
        .unwrap();
    out[15] |= ((label >> 16) & 0xF) as u8;
    out[16] = (label >> 8) as u8;
    out[17] = label as u8;
    out
}

fn udp6(dst: [u8; 16], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
        .ipv6(six(SRC), dst, 64)
        .udp(4000, 4001)
        .write(&mut out, payload)
        .unwrap();
    out
}

/// `inner` (an Ethernet frame of IPv4) in the outer header from `src` to `dst`, label `label`.
fn encapsulated(inner: &[u8], src: &[u8; 16], dst: &[u8; 16], label: u32) -> Vec<u8> {
    let ip = &inner[14..];
    let mut out = inner[..12].to_vec();
    out.extend(0x86DDu16.to_be_bytes());
    let len = u16::from_be_bytes([ip[2], ip[3]]);
    out.extend(outer_header(len, NEXTHDR_IPV4, ip[1], label, src, dst));
    out.extend(ip);
    out
}

/// The flow label of the IPv6 header of `frame`.
fn label(frame: &[u8]) -> u32 {
    label_of([frame[14], frame[15], frame[16], frame[17]])
}

#[test]
fn ipv4_goes_in_an_outer_header_to_its_host_labelled_per_path_in_round_robin() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let packet = tcp(DST, 1000, b"entropy");
    let mut labels = Vec::new();
    for _ in 0..8 {
        let before = f.maps.stamp_counters().unwrap();
        let out = f.stamp(&packet);
        let after = f.maps.stamp_counters().unwrap();
        assert_eq!(
            verdicts(&before, &after, &stamp_reason::NAMES),
            ["stamped", "flows_created"][..if labels.is_empty() { 2 } else { 1 }]
        );
        let l = label(&out);
        assert_eq!(
            out,
            encapsulated(&packet, &six(SRC), &six(DST), l),
            "byte for byte: from this host's address to the destination's, next header 4"
        );
        labels.push(l);
    }
    // Round robin: each of the 4 paths' labels once in any 4 consecutive packets.
    for w in labels.windows(4) {
        let set: BTreeSet<u32> = w.iter().copied().collect();
        assert_eq!(set, IPV4_LABELS.into_iter().collect(), "{labels:x?}");
    }
}

#[test]
fn ipv6_is_relabelled_in_place_with_its_next_headers_labels() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    for (packet, want) in [
        (tcp6(six(SRC), six(DST), 0xABCDE, b"six"), TCP6_LABELS),
        (udp6(six(DST), b"six"), UDP6_LABELS),
    ] {
        let mut seen = BTreeSet::new();
        for _ in 0..4 {
            let out = f.stamp(&packet);
            assert_eq!(out.len(), packet.len(), "no byte added");
            let l = label(&out);
            let mut expect = packet.clone();
            expect[15] = (packet[15] & 0xF0) | ((l >> 16) as u8);
            expect[16] = (l >> 8) as u8;
            expect[17] = l as u8;
            assert_eq!(
                out, expect,
                "only the label changes (no checksum covers it)"
            );
            seen.insert(l);
        }
        assert_eq!(seen, want.into_iter().collect());
    }
}

#[test]
fn what_has_no_label_or_is_not_carried_passes_as_it_is() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let mut hop_by_hop = tcp6(six(SRC), six(DST), 0, b"x");
    hop_by_hop[14 + 6] = 0;
    let cases = [
        (
            "a host of the prefix without labels",
            tcp(UNLABELLED, 1, b"x"),
            stamp_reason::NO_LABEL,
        ),
        (
            "IPv6 to a host without labels",
            tcp6(six(SRC), six(UNLABELLED), 5, b"x"),
            stamp_reason::NO_LABEL,
        ),
        (
            "IPv6 with an extension header",
            hop_by_hop,
            stamp_reason::HAS_OPTIONS,
        ),
        (
            "IPv6 outside the fabric's /96",
            tcp6(six(SRC), [0xfe; 16], 5, b"x"),
            stamp_reason::NOT_FABRIC,
        ),
    ];
    for (name, packet, reason) in cases {
        let before = f.maps.stamp_counters().unwrap();
        assert_eq!(f.stamp(&packet), packet, "{name}: untouched");
        let after = f.maps.stamp_counters().unwrap();
        assert_eq!(
            after[reason as usize],
            before[reason as usize] + 1,
            "{name}: counted as {}",
            stamp_reason::NAMES[reason as usize]
        );
    }
}

#[test]
fn the_receiver_removes_the_outer_header_and_zeroes_labels_before_gro() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    // This host is fd00:5a::a01:2 (10.1.0.2); its peer sends from 10.2.0.2.
    let inner = {
        let mut out = Vec::new();
        PacketBuilder::ethernet2(MAC_SRC, MAC_DST)
            .ipv4(DST, SRC, 64)
            .tcp(5001, 1000, 1, 65535)
            .write(&mut out, &[7; 200])
            .unwrap();
        out
    };
    let ours = encapsulated(&inner, &six(DST), &six(SRC), 0x33333);
    let before = f.maps.strip_counters().unwrap();
    assert_eq!(f.strip(&ours), inner, "the outer header is gone");
    let after = f.maps.strip_counters().unwrap();
    assert_eq!(
        verdicts(&before, &after, &strip_reason::NAMES),
        ["decapsulated"]
    );

    // IPv6 from the fabric: the label zeroed, nothing else changed.
    let labelled = tcp6(six(DST), six(SRC), 0x52222, &[1; 100]);
    let before = f.maps.strip_counters().unwrap();
    let out = f.strip(&labelled);
    let after = f.maps.strip_counters().unwrap();
    assert_eq!(label(&out), 0);
    assert_eq!(out, tcp6(six(DST), six(SRC), 0, &[1; 100]));
    assert_eq!(
        verdicts(&before, &after, &strip_reason::NAMES),
        ["label_cleared"]
    );

    // Left alone: IPv6 from outside the fabric, and an outer header to another host.
    let cases = [
        (
            "IPv6 from outside the fabric",
            tcp6([0xfe; 16], six(SRC), 0x52222, b"x"),
        ),
        (
            "an outer header to another host",
            encapsulated(&inner, &six(DST), &six(UNLABELLED), 1),
        ),
    ];
    for (name, frame) in cases {
        let before = f.maps.strip_counters().unwrap();
        assert_eq!(f.strip(&frame), frame, "{name}: untouched");
        let after = f.maps.strip_counters().unwrap();
        assert_eq!(
            verdicts(&before, &after, &strip_reason::NAMES),
            ["not_ipv4"],
            "{name}"
        );
    }
}

#[test]
fn a_path_table_names_the_bad_entropy_entry() {
    use sopa_agent::path_table::PathTable;
    for (from, to, needle) in [
        (
            "ipv4 = [0x11111, 0x22222, 0x33333, 0x44444]",
            "ipv4 = [0x11111, 0x22222, 0x33333]",
            "3 ipv4 labels for the 4 paths of 10.2.0.0/24",
        ),
        (
            "0x44444]\ntcp6",
            "0x144444]\ntcp6",
            "ipv4 label 1328196 of path [1, 1] is not a flow label",
        ),
        (
            "address = \"10.2.0.2\"",
            "address = \"10.9.0.2\"",
            "no [[destination]] holds 10.9.0.2",
        ),
        (
            "fabric6 = \"fd00:5a::/96\"",
            "fabric6 = \"fd00:5a::/64\"",
            "is not an IPv6 /96",
        ),
        (
            "encoding = \"entropy\"",
            "encoding = \"ipv4-option\"",
            "an [entropy] table without encoding = \"entropy\"",
        ),
    ] {
        assert!(TABLE.contains(from), "{from}");
        let err = PathTable::parse(&TABLE.replacen(from, to, 1)).unwrap_err();
        assert!(err.contains(needle), "wanted {needle:?} in {err}");
    }
    let ok = PathTable::parse(TABLE).unwrap();
    assert_eq!(ok.entropy.unwrap().labels.len(), 12);
}

/// The agent's own probes (marked `PROBE_MARK`) leave with the label and hop limit the prober
/// wrote: a probe of IPv6 TCP would otherwise get a path's label and probe nothing.
#[test]
fn the_hosts_own_probes_pass_as_written() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let probe = tcp6(six(SRC), six(DST), 0x0ABCD, b"probe");
    let mut ctx = [0u8; 192];
    ctx[8..12].copy_from_slice(&sopa_common::entropy::PROBE_MARK.to_ne_bytes());
    let before = f.maps.stamp_counters().unwrap();
    let (action, out) = f.stamp_with(&probe, Some(&ctx));
    let after = f.maps.stamp_counters().unwrap();
    assert_eq!((action, out), (common::TC_ACT_UNSPEC, probe.clone()));
    assert_eq!(verdicts(&before, &after, &stamp_reason::NAMES), ["probe"]);
    // The same packet unmarked is data: it takes a path's label.
    assert!(TCP6_LABELS.contains(&label(&f.stamp(&probe))));
}

/// The `random` baseline: where the agent put `PER_PACKET` instead of a label, every packet
/// gets a fresh random label (never the mark itself), still in the outer header byte for byte.
#[test]
fn a_per_packet_mark_draws_a_label_for_every_packet() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let marked = sopa_agent::entropy::EntropyTable {
        source: "fd00:5a::a01:2".parse().unwrap(),
        fabric6: "fd00:5a::".parse().unwrap(),
        labels: f
            .maps
            .labels()
            .unwrap()
            .into_keys()
            .map(|k| (k, sopa_common::entropy::PER_PACKET))
            .collect(),
    };
    f.maps.apply_entropy(Some(&marked)).unwrap();
    let packet = tcp(DST, 1000, b"entropy");
    let labels: BTreeSet<u32> = (0..64)
        .map(|_| {
            let out = f.stamp(&packet);
            let l = label(&out);
            assert_eq!(out, encapsulated(&packet, &six(SRC), &six(DST), l));
            l
        })
        .collect();
    assert!(
        labels.len() >= 60,
        "64 packets, {} labels: {labels:x?}",
        labels.len()
    );
    assert!(
        labels.iter().all(|l| !IPV4_LABELS.contains(l)),
        "not the table's labels"
    );
}
