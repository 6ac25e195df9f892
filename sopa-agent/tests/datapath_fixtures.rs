//! Fixture tables for `tc_stamp` and `xdp_strip`, run through BPF_PROG_TEST_RUN (needs root,
//! no namespaces). Each case: a crafted packet, the expected output and the counted reason.

mod common;

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use aya::programs::{TestRun as _, TestRunOptions};
use etherparse::{IpNumber, Ipv4Header, Ipv4Options, PacketBuilder};
use sopa_agent::{datapath::Datapath, path_table::PathTable};
use sopa_common::{
    hash::flow_hash,
    maps::{Config, FlowKey, Pin, mode, stamp_reason, strip_reason},
    wire::HOP_NONE,
};

use common::{Fixture, TABLE, TC_ACT_SHOT, TC_ACT_UNSPEC, allowed_cpus, gso_ctx, run_on_cpu};

const SRC: [u8; 4] = [10, 1, 0, 2];
const DST: [u8; 4] = [10, 2, 0, 2];
const DST_INTER_POD: [u8; 4] = [10, 3, 1, 2];
const DST_OUTSIDE: [u8; 4] = [192, 168, 7, 1];

/// The flow key tc_stamp builds for a packet from SRC.
fn flow_key(dst: [u8; 4], sport: u16, dport: u16, proto: u8) -> FlowKey {
    FlowKey {
        saddr: u32::from_ne_bytes(SRC),
        daddr: u32::from_ne_bytes(dst),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        _pad: [0; 3],
    }
}

/// The key of `tcp(dst, sport, ..)`.
fn tcp_key(dst: [u8; 4], sport: u16) -> FlowKey {
    flow_key(dst, sport, 5001, 6)
}

/// The path index a new flow's round robin starts at: its hash with the fixtures' seed (7).
fn start(key: &FlowKey, paths: u32) -> u32 {
    flow_hash(key, 7) % paths
}

/// TABLE's inter-pod path at `index`: [[0, 0], [0, 1], [1, 0], [1, 1]].
fn inter_pod_path(index: u32) -> (u8, u8) {
    ((index % 4 / 2) as u8, (index % 2) as u8)
}

fn tcp(dst: [u8; 4], sport: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(SRC, dst, 64)
        .tcp(sport, 5001, seq, 65535)
        .ack(1);
    let mut out = Vec::new();
    builder.write(&mut out, payload).unwrap();
    out
}

fn udp(dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(SRC, dst, 64)
        .udp(4000, 4001);
    let mut out = Vec::new();
    builder.write(&mut out, payload).unwrap();
    out
}

fn icmp(dst: [u8; 4]) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(SRC, dst, 64)
        .icmpv4_echo_request(1, 1);
    let mut out = Vec::new();
    builder.write(&mut out, b"ping").unwrap();
    out
}

fn ipv6() -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6([0xfd; 16], [0xfe; 16], 64)
        .udp(1, 2);
    let mut out = Vec::new();
    builder.write(&mut out, b"six").unwrap();
    out
}

fn arp() -> Vec<u8> {
    let mut p = vec![0xff; 6];
    p.extend([2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    p.extend([
        0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 1, 0, 2, 0, 0, 0, 0, 0, 0, 10, 2, 0, 2,
    ]);
    p
}

fn vlan_tagged() -> Vec<u8> {
    let mut p = tcp(DST, 1, 1, b"x");
    // 802.1Q tag between the MACs and the EtherType.
    p.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    p
}

/// A TCP packet to DST whose IPv4 header carries `options` (IHL > 5).
fn with_ip_options(options: &[u8]) -> Vec<u8> {
    let mut ip = Ipv4Header::new(20, 64, IpNumber::TCP, SRC, DST).unwrap();
    ip.options = Ipv4Options::try_from(options).unwrap();
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
        .tcp(1, 2, 3, 4);
    let mut out = Vec::new();
    builder.write(&mut out, &[]).unwrap();
    out
}

fn set_ip_field(mut p: Vec<u8>, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    f(&mut p[14..]);
    common::fix_ipv4_checksum(&mut p);
    p
}

fn fragment(offset: u16, more: bool) -> Vec<u8> {
    set_ip_field(udp(DST, b"frag"), |ip| {
        let v = offset | if more { 0x2000 } else { 0 };
        ip[6..8].copy_from_slice(&v.to_be_bytes());
    })
}

/// What tc_stamp must make of `original` for the path (hop0, hop1).
fn stamped(original: &[u8], hop0: u8, hop1: u8) -> Vec<u8> {
    common::with_option(original, hop0, hop1)
}

fn counters(f: &Fixture) -> (Vec<u64>, Vec<u64>) {
    (
        f.maps.stamp_counters().unwrap(),
        f.maps.strip_counters().unwrap(),
    )
}

enum Expect {
    Stamped(u8, u8),
    /// The sender's own option, its hop bytes replaced with ours.
    Restamped(u8, u8),
    Untouched,
    Dropped,
}

/// `forged` (a frame carrying our option) with its hop bytes replaced by (hop0, hop1).
fn restamped(forged: &[u8], hop0: u8, hop1: u8) -> Vec<u8> {
    let mut p = forged.to_vec();
    p[36] = hop0;
    p[37] = hop1;
    common::fix_ipv4_checksum(&mut p);
    p
}

#[test]
fn stamp_fixture_table() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let truncated_ip = tcp(DST, 1, 1, b"")[..30].to_vec();
    let truncated_ports = tcp(DST, 1, 1, b"")[..36].to_vec();
    let ihl4 = set_ip_field(tcp(DST, 9, 1, b"x"), |ip| ip[0] = 0x44);
    let version6 = set_ip_field(tcp(DST, 9, 1, b"x"), |ip| ip[0] = 0x65);
    let in_pod = start(&tcp_key(DST, 1000), 3) as u8;
    let udp_in_pod = start(&flow_key(DST, 4000, 4001, 17), 3) as u8;
    let (inter0, inter1) = inter_pod_path(start(&tcp_key(DST_INTER_POD, 1000), 4));
    let forged_in_pod = start(&tcp_key(DST, 1500), 3) as u8;
    let (forged0, forged1) = inter_pod_path(start(&tcp_key(DST_INTER_POD, 1500), 4));
    let forged = |p: Vec<u8>| common::with_option(&p, 1, 1);
    let cases: Vec<(&str, Vec<u8>, Expect, u32)> = vec![
        (
            "tcp in pod",
            tcp(DST, 1000, 1, b"hello"),
            Expect::Stamped(in_pod, HOP_NONE),
            stamp_reason::STAMPED,
        ),
        (
            "udp in pod",
            udp(DST, b"datagram"),
            Expect::Stamped(udp_in_pod, HOP_NONE),
            stamp_reason::STAMPED,
        ),
        (
            "tcp inter pod",
            tcp(DST_INTER_POD, 1000, 1, b"x"),
            Expect::Stamped(inter0, inter1),
            stamp_reason::STAMPED,
        ),
        (
            "not a fabric destination",
            tcp(DST_OUTSIDE, 1, 1, b"x"),
            Expect::Untouched,
            stamp_reason::NOT_FABRIC,
        ),
        (
            "icmp",
            icmp(DST),
            Expect::Untouched,
            stamp_reason::NOT_TCP_UDP,
        ),
        ("ipv6", ipv6(), Expect::Untouched, stamp_reason::NOT_IPV4),
        ("arp", arp(), Expect::Untouched, stamp_reason::NOT_IPV4),
        (
            "vlan tagged",
            vlan_tagged(),
            Expect::Untouched,
            stamp_reason::NOT_IPV4,
        ),
        (
            "ipv4 with options",
            with_ip_options(&[0x94, 4, 0, 0]),
            Expect::Untouched,
            stamp_reason::HAS_OPTIONS,
        ),
        (
            "our option set by the sender, in pod",
            forged(tcp(DST, 1500, 1, b"x")),
            Expect::Restamped(forged_in_pod, HOP_NONE),
            stamp_reason::STAMPED,
        ),
        (
            "our option set by the sender, inter pod",
            forged(tcp(DST_INTER_POD, 1500, 1, b"x")),
            Expect::Restamped(forged0, forged1),
            stamp_reason::STAMPED,
        ),
        (
            "our option on icmp",
            forged(icmp(DST)),
            Expect::Dropped,
            stamp_reason::FORGED_DROPPED,
        ),
        (
            "our option to a destination outside the fabric",
            forged(tcp(DST_OUTSIDE, 1, 1, b"x")),
            Expect::Dropped,
            stamp_reason::FORGED_DROPPED,
        ),
        (
            "our option on a fragment",
            forged(fragment(0, true)),
            Expect::Dropped,
            stamp_reason::FORGED_DROPPED,
        ),
        (
            "our option type with another length (tc_forward ignores it)",
            with_ip_options(&[0x9E, 8, 1, 1, 1, 1, 0, 0]),
            Expect::Untouched,
            stamp_reason::HAS_OPTIONS,
        ),
        (
            "first fragment",
            fragment(0, true),
            Expect::Untouched,
            stamp_reason::FRAGMENT,
        ),
        (
            "later fragment",
            fragment(100, false),
            Expect::Untouched,
            stamp_reason::FRAGMENT,
        ),
        (
            "ihl below 5",
            ihl4,
            Expect::Untouched,
            stamp_reason::BAD_HEADER,
        ),
        (
            "version 6 in an ipv4 frame",
            version6,
            Expect::Untouched,
            stamp_reason::BAD_HEADER,
        ),
        (
            "truncated ports",
            truncated_ports,
            Expect::Untouched,
            stamp_reason::TOO_SHORT,
        ),
    ];
    // An IPv4 skb shorter than its base header cannot reach TC egress, and test_run refuses to
    // build one (EINVAL) rather than run the program on it; the strip table covers such frames.
    for short in [truncated_ip, tcp(DST, 1, 1, b"")[..14].to_vec()] {
        let mut out = vec![0u8; 128];
        let opts = TestRunOptions {
            data_in: Some(&short),
            data_out: Some(&mut out),
            ..Default::default()
        };
        assert!(
            f.datapath.stamp_program().test_run(opts).is_err(),
            "the kernel refuses a truncated IPv4 skb"
        );
    }
    for (name, packet, expect, reason) in cases {
        let (before, _) = counters(&f);
        let (action, out) = f.stamp_with(&packet, None);
        let want_action = match expect {
            Expect::Dropped => TC_ACT_SHOT,
            _ => TC_ACT_UNSPEC,
        };
        assert_eq!(action, want_action, "{name}: action");
        match expect {
            Expect::Stamped(h0, h1) => {
                assert_eq!(out, stamped(&packet, h0, h1), "{name}: stamped bytes");
                let ip = etherparse::Ipv4HeaderSlice::from_slice(&out[14..])
                    .unwrap()
                    .to_header();
                assert_eq!(
                    ip.header_checksum,
                    ip.calc_header_checksum(),
                    "{name}: checksum"
                );
                assert_eq!(ip.options.as_slice(), &[0x9E, 4, h0, h1], "{name}: option");
            }
            Expect::Restamped(h0, h1) => {
                assert_eq!(out, restamped(&packet, h0, h1), "{name}: re-stamped bytes");
                let (after, _) = counters(&f);
                assert_eq!(
                    after[stamp_reason::RESTAMPED as usize],
                    before[stamp_reason::RESTAMPED as usize] + 1,
                    "{name}: counted as restamped"
                );
            }
            Expect::Untouched => assert_eq!(out, packet, "{name}: must pass untouched"),
            Expect::Dropped => {}
        }
        let (after, _) = counters(&f);
        assert_eq!(
            after[reason as usize],
            before[reason as usize] + 1,
            "{name}: counted as {}",
            stamp_reason::NAMES[reason as usize]
        );
        let verdicts = |c: &[u64]| {
            (0..stamp_reason::COUNT)
                .filter(|i| stamp_reason::is_verdict(*i))
                .map(|i| c[i as usize])
                .sum::<u64>()
        };
        assert_eq!(
            verdicts(&after),
            verdicts(&before) + 1,
            "{name}: counted once"
        );
    }
}

#[test]
fn round_robin_is_exact_per_flow() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let hops = |f: &mut Fixture, sport: u16, n: usize| -> Vec<u8> {
        (0..n)
            .map(|i| f.stamp(&tcp(DST, sport, i as u32, b"data"))[36])
            .collect()
    };
    // Each flow starts where its hash says, then takes every path in turn.
    let cycle = |first: u32, n: u32, len: u32| -> Vec<u8> {
        (0..len).map(|i| ((first + i) % n) as u8).collect()
    };
    let s = start(&tcp_key(DST, 40000), 3);
    let t = start(&tcp_key(DST, 40001), 3);
    assert_eq!(hops(&mut f, 40000, 6), cycle(s, 3, 6));
    // Another flow keeps its own counter; the first resumes where it was.
    assert_eq!(hops(&mut f, 40001, 2), cycle(t, 3, 2));
    assert_eq!(hops(&mut f, 40000, 1), cycle(s + 6, 3, 1));
    let inter_pod: Vec<(u8, u8)> = (0..8)
        .map(|i| {
            let out = f.stamp(&tcp(DST_INTER_POD, 5, i, b"d"));
            (out[36], out[37])
        })
        .collect();
    let u = start(&tcp_key(DST_INTER_POD, 5), 4);
    let want: Vec<(u8, u8)> = (0..8).map(|i| inter_pod_path(u + i)).collect();
    assert_eq!(inter_pod, want);
    // The per-hop counters agree with what went out.
    let mut hop0 = [0u64; 3];
    for h in cycle(s, 3, 7).into_iter().chain(cycle(t, 3, 2)) {
        hop0[usize::from(h)] += 1;
    }
    for (h, _) in &want {
        hop0[usize::from(*h)] += 1;
    }
    let hop_counts = f.maps.hop_counters().unwrap();
    assert_eq!(&hop_counts[..3], &hop0);
}

#[test]
fn per_flow_counts_add_up_when_every_cpu_stamps_the_flow_at_once() {
    // Hedera's elephant detection reads a flow's bytes (the pinned mode, the only one that
    // counts them): every CPU sending the flow at the same time must count. Each CPU runs
    // tc_stamp on one flow's packet `RUNS` times (test_run runs the program on the calling
    // CPU), all at once.
    const RUNS: u32 = 200_000;
    let mut f = Fixture::new(TABLE, mode::PINNED);
    let allowed = allowed_cpus();
    assert!(
        allowed.len() >= 2,
        "this test needs two CPUs to run the program on at once; allowed: {allowed:?}"
    );
    let cpus = allowed.len();
    let packet = tcp(DST, 41000, 0, b"data");
    let start = std::sync::Barrier::new(cpus);
    let program = &*f.datapath.stamp_program();
    std::thread::scope(|s| {
        for cpu in 0..cpus {
            let (program, packet, start, allowed) = (program, &packet, &start, &allowed);
            s.spawn(move || {
                run_on_cpu(allowed[cpu]);
                let mut out = vec![0u8; packet.len() + 64];
                let opts = TestRunOptions {
                    data_in: Some(packet),
                    data_out: Some(&mut out),
                    repeat: RUNS,
                    ..Default::default()
                };
                start.wait();
                let r = program.test_run(opts).unwrap();
                assert_eq!(r.return_value, TC_ACT_UNSPEC);
            });
        }
    });
    let flows = f.maps.flows().unwrap();
    let (_, state) = flows
        .iter()
        .find(|(k, _)| *k == tcp_key(DST, 41000))
        .expect("the flow's state");
    let runs = u64::from(RUNS) * cpus as u64;
    assert_eq!(
        state.packets, runs,
        "packets counted by {cpus} CPUs at once"
    );
    // test_run repeats the program on one skb: each CPU's first run stamps the packet, the
    // others see it 4 bytes longer (and re-stamp it as a forged option).
    let len = packet.len() as u64;
    assert_eq!(
        state.bytes,
        cpus as u64 * len + (runs - cpus as u64) * (len + 4),
        "bytes counted by {cpus} CPUs at once"
    );
}

#[test]
fn one_packet_flows_spread_evenly_from_their_first_packet() {
    // 10,000 flows of one packet each (a SYN, a DNS query): each starts at its hash, so the
    // four inter-pod paths share them evenly instead of all taking path 0.
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let flows = 10_000u32;
    let mut per_path = [0u32; 4];
    for sport in 0..flows {
        let out = f.stamp(&tcp(DST_INTER_POD, 20_000 + sport as u16, 0, b""));
        per_path[usize::from(out[36]) * 2 + usize::from(out[37])] += 1;
    }
    let even = flows / 4;
    eprintln!("{flows} one-packet flows over 4 paths: {per_path:?}");
    for (path, n) in per_path.iter().enumerate() {
        assert!(
            n.abs_diff(even) * 100 <= even * 3,
            "path {path}: {n} of {flows} one-packet flows, more than 3% from {even}: {per_path:?}"
        );
    }
}

#[test]
fn first_path_zero_starts_every_flow_at_path_zero_as_the_paper_does() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    assert_eq!(
        f.maps.first_path().unwrap(),
        sopa_common::maps::first_path::HASH,
        "the default"
    );
    f.maps
        .set_first_path(sopa_common::maps::first_path::ZERO)
        .unwrap();
    for sport in 0..200u16 {
        let first = f.stamp(&tcp(DST_INTER_POD, 30_000 + sport, 0, b""));
        assert_eq!((first[36], first[37]), (0, 0), "flow {sport}: path 0 first");
        let second = f.stamp(&tcp(DST_INTER_POD, 30_000 + sport, 1, b""));
        assert_eq!(
            (second[36], second[37]),
            (0, 1),
            "flow {sport}: then path 1"
        );
    }
}

#[test]
fn ecmp_is_stable_and_rps_uses_every_path() {
    let mut f = Fixture::new(TABLE, mode::ECMP);
    for sport in 1..20u16 {
        let first = f.stamp(&tcp(DST, sport, 0, b"x"))[36];
        for seq in 1..5 {
            assert_eq!(
                f.stamp(&tcp(DST, sport, seq, b"x"))[36],
                first,
                "ecmp keeps a flow on one path"
            );
        }
    }
    let used: std::collections::BTreeSet<u8> = (1..200u16)
        .map(|sport| f.stamp(&tcp(DST, sport, 0, b"x"))[36])
        .collect();
    assert_eq!(used.len(), 3, "ecmp spreads flows over all paths");

    f.maps
        .set_config(Config {
            mode: mode::RPS,
            hash_seed: 7,
        })
        .unwrap();
    let mut per_path = [0u32; 3];
    for seq in 0..300 {
        per_path[usize::from(f.stamp(&tcp(DST, 7, seq, b"x"))[36])] += 1;
    }
    assert!(
        per_path.iter().all(|n| *n > 50),
        "rps sprays one flow over all paths: {per_path:?}"
    );
}

#[test]
fn pinned_mode_follows_live_pins_and_hashes_the_rest() {
    let mut f = Fixture::new(TABLE, mode::PINNED);
    let key = tcp_key;
    // Without pins every flow takes the 5-tuple hash, as userspace predicts it.
    for sport in 1..40u16 {
        let hop = f.stamp(&tcp(DST, sport, 0, b"x"))[36];
        assert_eq!(u32::from(hop), flow_hash(&key(DST, sport), 7) % 3);
    }
    // A pinned flow takes its pin; its neighbour keeps the hash.
    let hashed = |sport| {
        let i = (flow_hash(&key(DST_INTER_POD, sport), 7) % 4) as u8;
        (i / 2, i % 2)
    };
    let pinned_path = if hashed(9) == (1, 0) {
        [0u8, 1]
    } else {
        [1u8, 0]
    };
    let now = sopa_agent::hedera::monotonic_ns();
    let pin = |expires_ns| Pin {
        hops: pinned_path,
        _pad: [0; 6],
        expires_ns,
    };
    f.maps
        .replace_pins(&[(key(DST_INTER_POD, 9), pin(now + 60_000_000_000))])
        .unwrap();
    for seq in 0..5 {
        let out = f.stamp(&tcp(DST_INTER_POD, 9, seq, b"data"));
        assert_eq!([out[36], out[37]], pinned_path, "the pin wins");
        let out = f.stamp(&tcp(DST_INTER_POD, 10, seq, b"data"));
        assert_eq!((out[36], out[37]), hashed(10), "unpinned: hashed");
    }
    let c = counters(&f).0;
    assert_eq!(c[stamp_reason::PINNED as usize], 5);
    // The flow table carries the bytes Hedera's elephant detection reads.
    let flows = f.maps.flows().unwrap();
    let (_, st) = flows
        .iter()
        .find(|(k, _)| *k == key(DST_INTER_POD, 9))
        .expect("the pinned flow is tracked");
    assert_eq!(st.packets, 5);
    assert_eq!(st.bytes, 5 * 58, "five 58-byte frames");
    // An expired pin is ignored and counted: the flow is back on its hash.
    f.maps
        .replace_pins(&[(key(DST_INTER_POD, 9), pin(now.saturating_sub(1)))])
        .unwrap();
    let out = f.stamp(&tcp(DST_INTER_POD, 9, 9, b"data"));
    assert_eq!((out[36], out[37]), hashed(9));
    assert_eq!(counters(&f).0[stamp_reason::PIN_EXPIRED as usize], 1);
    // Replacing with nothing removes every pin.
    f.maps.replace_pins(&[]).unwrap();
    assert!(f.maps.pins().unwrap().is_empty());
}

#[test]
fn mode_switches_at_run_time() {
    let mut f = Fixture::new(TABLE, mode::OFF);
    let p = tcp(DST, 1, 1, b"x");
    assert_eq!(f.stamp(&p), p);
    assert_eq!(counters(&f).0[stamp_reason::MODE_OFF as usize], 1);
    f.maps
        .set_config(Config {
            mode: mode::SOPA,
            hash_seed: 0,
        })
        .unwrap();
    let first = (flow_hash(&tcp_key(DST, 1), 0) % 3) as u8;
    assert_eq!(f.stamp(&p), stamped(&p, first, HOP_NONE));
    // An empty table: nothing is a fabric destination any more.
    f.maps.apply_paths(&PathTable::default()).unwrap();
    assert_eq!(f.stamp(&p), p);
    assert_eq!(counters(&f).0[stamp_reason::NOT_FABRIC as usize], 1);
}

#[test]
fn strip_restores_the_original_byte_for_byte() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    for original in [
        tcp(DST, 1000, 77, b"payload bytes"),
        udp(DST, b"datagram"),
        tcp(DST_INTER_POD, 2, 3, &[0xAB; 1400]),
    ] {
        let on_wire = f.stamp(&original);
        assert_ne!(on_wire, original);
        assert_eq!(f.strip(&on_wire), original);
    }
    assert_eq!(counters(&f).1[strip_reason::STRIPPED as usize], 3);
}

#[test]
fn strip_keeps_a_corrupted_header_corrupted() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let original = tcp(DST, 1000, 77, b"payload");
    let on_wire = f.stamp(&original);
    assert!(common::checksum_ok(&on_wire));
    let mut damaged = on_wire.clone();
    damaged[25] ^= 0x21; // the checksum's low byte, damaged in transit
    let out = f.strip(&damaged);
    assert_eq!(out.len(), original.len(), "stripped all the same");
    assert!(
        !common::checksum_ok(&out),
        "stripping repaired a corrupted header: {:02x?}",
        &out[14..34]
    );
    assert_eq!(
        out[..24],
        original[..24],
        "everything before the checksum as sent"
    );
    assert_eq!(out[26..], original[26..], "everything after it as sent");
    assert_eq!(
        f.strip(&on_wire),
        original,
        "an intact one comes out as sent"
    );
}

#[test]
fn strip_fixture_table() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let ours_bad_len = with_ip_options(&[0x9E, 8, 1, 1, 0, 0, 0, 0]);
    let ours_then_other = with_ip_options(&[0x9E, 4, 1, 1, 0x01, 0x01, 0x01, 0x01]);
    let ihl4 = set_ip_field(tcp(DST, 9, 1, b"x"), |ip| ip[0] = 0x44);
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("no option", tcp(DST, 1, 1, b"x"), strip_reason::NO_OPTION),
        (
            "router alert",
            with_ip_options(&[0x94, 4, 0, 0]),
            strip_reason::FOREIGN_OPTION,
        ),
        (
            "nop padding",
            with_ip_options(&[0x01, 0x01, 0x01, 0x01]),
            strip_reason::FOREIGN_OPTION,
        ),
        ("ours with length 8", ours_bad_len, strip_reason::BAD_LENGTH),
        (
            "ours followed by another",
            ours_then_other,
            strip_reason::BAD_LENGTH,
        ),
        ("ipv6", ipv6(), strip_reason::NOT_IPV4),
        ("arp", arp(), strip_reason::NOT_IPV4),
        ("ihl below 5", ihl4, strip_reason::BAD_HEADER),
        (
            "truncated ip header",
            tcp(DST, 1, 1, b"")[..30].to_vec(),
            strip_reason::TOO_SHORT,
        ),
        (
            "truncated option",
            stamped(&tcp(DST, 1, 1, b""), 1, 1)[..35].to_vec(),
            strip_reason::TOO_SHORT,
        ),
    ];
    for (name, packet, reason) in cases {
        let (_, before) = counters(&f);
        assert_eq!(f.strip(&packet), packet, "{name}: must pass untouched");
        let (_, after) = counters(&f);
        assert_eq!(
            after[reason as usize],
            before[reason as usize] + 1,
            "{name}: counted as {}",
            strip_reason::NAMES[reason as usize]
        );
    }
}

#[test]
fn strip_counts_reordered_tcp_arrivals_only_while_measuring() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let seg = |seq: u32| f_stamped(seq);
    fn f_stamped(seq: u32) -> Vec<u8> {
        stamped(&tcp(DST, 3333, seq, &[0; 100]), 0, HOP_NONE)
    }
    // A fresh datapath measures nothing: every packet is stripped, none is followed.
    assert!(!f.maps.reordering_measured().unwrap());
    for seq in [1000, 1300, 1200] {
        f.strip(&seg(seq));
    }
    let (_, strip) = counters(&f);
    assert_eq!(strip[strip_reason::STRIPPED as usize], 3);
    assert_eq!(
        strip[strip_reason::TCP_DATA as usize] + strip[strip_reason::TCP_REORDERED as usize],
        0,
        "not measured"
    );
    f.maps.set_reordering_measured(true).unwrap();
    assert!(f.maps.reordering_measured().unwrap());
    // In order 1000, 1100, then 1300 overtakes 1200, then a pure ACK (no data, not counted).
    for seq in [1000, 1100, 1300, 1200] {
        f.strip(&seg(seq));
    }
    f.strip(&stamped(&tcp(DST, 3333, 1400, b""), 0, HOP_NONE));
    let (_, strip) = counters(&f);
    assert_eq!(strip[strip_reason::TCP_DATA as usize], 4);
    assert_eq!(strip[strip_reason::TCP_REORDERED as usize], 1);
    assert_eq!(strip[strip_reason::STRIPPED as usize], 3 + 5);
    // Unstamped flows (ecmp mode) are measured the same way.
    f.strip(&tcp(DST, 4444, 500, &[0; 10]));
    f.strip(&tcp(DST, 4444, 400, &[0; 10]));
    let (_, strip) = counters(&f);
    assert_eq!(strip[strip_reason::TCP_REORDERED as usize], 2);
    // Off again: the counters keep what was measured.
    f.maps.set_reordering_measured(false).unwrap();
    f.strip(&tcp(DST, 4444, 300, &[0; 10]));
    let (_, strip) = counters(&f);
    assert_eq!(strip[strip_reason::TCP_DATA as usize], 6);
    assert_eq!(strip[strip_reason::TCP_REORDERED as usize], 2);
    let _ = Ipv4Addr::LOCALHOST;
}

#[test]
fn single_mode_puts_every_flow_on_the_first_path() {
    let mut f = Fixture::new(TABLE, mode::SINGLE);
    for sport in 1..=12u16 {
        for seq in 0..3 {
            let p = tcp(DST_INTER_POD, sport, seq, b"x");
            assert_eq!(f.stamp(&p), stamped(&p, 0, 0), "flow {sport}, packet {seq}");
        }
        let p = tcp(DST, sport, 1, b"x");
        assert_eq!(f.stamp(&p), stamped(&p, 0, HOP_NONE), "flow {sport}");
    }
    assert_eq!(counters(&f).0[stamp_reason::STAMPED as usize], 12 * 4);
}

#[test]
fn a_mode_value_out_of_range_stamps_nothing() {
    // A config written by a newer agent, or damaged: the program treats it as off.
    for bad in [mode::COUNT, mode::COUNT + 1, u32::MAX] {
        let mut f = Fixture::new(TABLE, bad);
        let p = tcp(DST, 1, 1, b"x");
        assert_eq!(f.stamp(&p), p, "mode {bad}: untouched");
        assert_eq!(
            counters(&f).0[stamp_reason::MODE_OFF as usize],
            1,
            "mode {bad}: counted as mode off"
        );
    }
}

#[test]
fn a_packet_whose_length_the_header_could_not_say_once_stamped_passes_unstamped() {
    // BIG TCP (IPv4 GSO past 64 KB) sends tot_len 0; 4 bytes more would overflow a tot_len of
    // 65,532 or more. Either leaves as it is, counted too_big, and no flow state is touched.
    let mut f = Fixture::new(TABLE, mode::SOPA);
    for tot_len in [0u16, 65_532, 65_535] {
        let p = set_ip_field(tcp(DST, 9, 1, b"x"), |ip| {
            ip[2..4].copy_from_slice(&tot_len.to_be_bytes());
        });
        assert_eq!(f.stamp(&p), p, "tot_len {tot_len}: unstamped");
    }
    let (stamp, _) = counters(&f);
    assert_eq!(stamp[stamp_reason::TOO_BIG as usize], 3);
    assert_eq!(stamp[stamp_reason::FLOWS_CREATED as usize], 0);
    // The largest length that still fits the option is stamped.
    let p = set_ip_field(tcp(DST, 9, 1, b"x"), |ip| {
        ip[2..4].copy_from_slice(&65_531u16.to_be_bytes());
    });
    let out = f.stamp(&p);
    assert_eq!(&out[16..18], &65_535u16.to_be_bytes(), "65,531 + 4");
}

#[test]
fn a_destination_whose_paths_all_failed_passes_unstamped() {
    let mut f = Fixture::new(TABLE, mode::SOPA);
    // Every path to 10.3/16 failed: the agent writes an empty path set.
    f.maps
        .set_paths(&"10.3.0.0/16".parse().unwrap(), &[])
        .unwrap();
    let p = tcp(DST_INTER_POD, 1, 1, b"x");
    assert_eq!(f.stamp(&p), p, "left to the kernel's routing");
    assert_eq!(counters(&f).0[stamp_reason::NO_PATH as usize], 1);
    // The other destination is untouched by that.
    let q = tcp(DST, 1, 1, b"x");
    let first = start(&tcp_key(DST, 1), 3) as u8;
    assert_eq!(f.stamp(&q), stamped(&q, first, HOP_NONE));
}

#[test]
fn a_one_entry_flow_table_evicts_and_every_flow_is_still_stamped() {
    // FLOW_TABLE_FULL (the stateless fallback) is counted when an insert fails; on this
    // kernel an LRU map evicts instead, even at one entry, so the fallback is not reached here:
    // the test holds the table to its size and every flow to a path.
    static N: AtomicU32 = AtomicU32::new(0);
    let pins = PathBuf::from(format!(
        "/sys/fs/bpf/sopa-test-fixtures-tiny-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let datapath = Datapath::load_with_flow_capacity(&pins, 1).expect("a one-entry flow table");
    let mut f = Fixture::from_loaded(datapath, pins, TABLE, mode::SOPA);
    let flows = 64u16;
    for sport in 1..=flows {
        let p = tcp(DST_INTER_POD, sport, 1, b"x");
        let out = f.stamp(&p);
        assert_ne!(
            out, p,
            "flow {sport}: stamped whether or not the table took it"
        );
    }
    let c = counters(&f).0;
    eprintln!(
        "one-entry LRU table, {flows} flows: {} created, {} refused (stateless hash)",
        c[stamp_reason::FLOWS_CREATED as usize],
        c[stamp_reason::FLOW_TABLE_FULL as usize]
    );
    assert_eq!(c[stamp_reason::STAMPED as usize], u64::from(flows));
    assert_eq!(
        c[stamp_reason::FLOWS_CREATED as usize] + c[stamp_reason::FLOW_TABLE_FULL as usize],
        u64::from(flows),
        "every flow either entered the table or fell back to the hash"
    );
    assert!(f.maps.flow_entries() <= 1, "the table holds its one entry");
}

#[test]
fn a_packet_the_option_would_take_past_the_mtu_passes_unstamped() {
    // BPF_PROG_TEST_RUN sends the packet out of the namespace's loopback: give it the MTU of
    // a fabric link. A sender that ignores the route's lowered MTU (IP_PMTUDISC_INTERFACE or
    // OMIT, a raw socket, an upper device) fills the link; stamped, its packet would be 4
    // bytes too long and dropped.
    let ns = sopa_testbed::netns::NetNs::new(&sopa_testbed::netns::run_name("mtu")).unwrap();
    ns.ip(&["link", "set", "lo", "mtu", "1500"]).unwrap();
    let mut f = Fixture::new(TABLE, mode::SOPA);
    // (name, packet, __sk_buff, the reason counted)
    type Case = (&'static str, Vec<u8>, Option<[u8; 192]>, u32);
    let cases: Vec<Case> = vec![
        // IP length 1500: full.
        (
            "a full-size tcp segment",
            tcp(DST, 1000, 1, &[7; 1460]),
            None,
            stamp_reason::TOO_BIG,
        ),
        (
            "a full-size udp datagram",
            udp(DST, &[7; 1472]),
            None,
            stamp_reason::TOO_BIG,
        ),
        // IP length 1496: the option fits exactly.
        (
            "a segment of the route's MTU",
            tcp(DST, 1001, 1, &[7; 1456]),
            None,
            stamp_reason::STAMPED,
        ),
        // A GSO packet is measured once stamped, by the kernel's own segment length; test_run
        // cannot give an skb a GSO type, so bpf_skb_adjust_room refuses it before that (real
        // GSO packets: host_datapath's UDP GSO sender).
        (
            "tcp gso",
            tcp(DST, 1003, 1, &[7; 2914]),
            Some(gso_ctx(2, 1457)),
            stamp_reason::ADJUST_FAILED,
        ),
    ];
    ns.run(|| {
        for (name, packet, ctx, reason) in cases {
            let (before, _) = counters(&f);
            let (action, out) = f.stamp_with(&packet, ctx.as_ref().map(|c| &c[..]));
            assert_eq!(action, TC_ACT_UNSPEC, "{name}: passed on");
            let (after, _) = counters(&f);
            let counted: Vec<&str> = (0..stamp_reason::COUNT as usize)
                .filter(|&i| stamp_reason::is_verdict(i as u32) && after[i] > before[i])
                .map(|i| stamp_reason::NAMES[i])
                .collect();
            assert_eq!(
                counted,
                [stamp_reason::NAMES[reason as usize]],
                "{name}: the verdict"
            );
            if reason != stamp_reason::STAMPED {
                assert_eq!(out, packet, "{name}: must pass untouched");
            } else {
                assert_eq!(out.len(), packet.len() + 4, "{name}: stamped");
            }
        }
    })
    .unwrap();
}

#[test]
fn a_forged_option_never_leaves_as_its_sender_set_it() {
    let mut f = Fixture::new(TABLE, mode::OFF);
    // Mode off stamps nothing, but the switches still honour an option: drop it.
    let p = common::with_option(&tcp(DST_INTER_POD, 7, 1, b"x"), 1, 1);
    let (action, _) = f.stamp_with(&p, None);
    assert_eq!(action, TC_ACT_SHOT, "a forged option with the mode off");
    assert_eq!(counters(&f).0[stamp_reason::FORGED_DROPPED as usize], 1);
    f.maps
        .set_config(Config {
            mode: mode::SINGLE,
            hash_seed: 7,
        })
        .unwrap();
    // Single mode takes the first path whatever the sender asked for.
    let out = f.stamp(&p);
    assert_eq!(out, restamped(&p, 0, 0));
    // A header corrupted before us stays corrupted: the checksum is adjusted, not recomputed.
    let mut bad = p.clone();
    bad[25] ^= 0x5a;
    let out = f.stamp(&bad);
    assert_eq!(&out[36..38], &[0, 0]);
    assert!(
        !common::checksum_ok(&out),
        "a wrong checksum must stay wrong"
    );
}

/// The path meter (alternate marking): `tc_stamp` marks the first hop byte in odd periods (the
/// color the agent turns, not a clock of its own) and counts what it sends per (destination
/// rack, path, color); `xdp_strip` counts what arrives per (source rack, path, color as marked),
/// the mark and the path's hop bytes read before the strip; with the period 0 nothing is marked
/// or counted.
#[test]
fn the_path_meter_marks_odd_periods_and_counts_both_ends() {
    use common::{meter_bytes as bytes, meter_packets as packets, meter_total as total};
    use sopa_common::maps::meter;
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let period = sopa_agent::meter::DEFAULT_PERIOD.as_nanos() as u64;
    f.maps.set_meter_period(period).unwrap();
    let mut color = f.maps.meter_color().unwrap().expect("a color to turn");
    color.set(0).unwrap();
    let even: Vec<Vec<u8>> = (0..5)
        .map(|i| f.stamp(&tcp(DST_INTER_POD, 6000, i, b"even")))
        .collect();
    color.set(1).unwrap();
    let odd: Vec<Vec<u8>> = (0..3)
        .map(|i| f.stamp(&tcp(DST_INTER_POD, 6000, 5 + i, b"odd")))
        .collect();
    assert!(
        even.iter().all(|p| p[36] & meter::COLOR == 0),
        "even: unmarked"
    );
    assert!(odd.iter().all(|p| p[36] & meter::COLOR != 0), "odd: marked");
    // The path is the round robin's, whatever the mark.
    let u = start(&tcp_key(DST_INTER_POD, 6000), 4);
    for (i, p) in even.iter().chain(&odd).enumerate() {
        assert_eq!(
            (p[36] & meter::HOP_MASK, p[37]),
            inter_pod_path(u + i as u32)
        );
    }
    let (sent0, _) = f.maps.meter_counts(0).unwrap();
    let (sent1, _) = f.maps.meter_counts(1).unwrap();
    // The bytes each packet took on the wire, as stamped.
    let wire = |ps: &[Vec<u8>]| ps.iter().map(|p| p.len() as u64).sum::<u64>();
    assert_eq!((bytes(&sent0), bytes(&sent1)), (wire(&even), wire(&odd)));
    let (sent0, sent1) = (packets(&sent0), packets(&sent1));
    assert_eq!((total(&sent0), total(&sent1)), (5, 3));
    // Keyed by the destination's rack (the table's longest prefix, /24) and the bare path.
    let rack = u32::from_ne_bytes([10, 3, 1, 0]);
    for (k, n) in sent0.iter().chain(&sent1) {
        assert_eq!(k.peer, rack, "{k:?}");
        assert_eq!(k.hops[0] & !meter::HOP_MASK, 0, "{k:?}: a bare path");
        assert!(*n >= 1);
    }
    assert_eq!(
        sent0.len(),
        4,
        "five packets of one flow: every path once, one twice"
    );

    // The receiver counts each packet in the color it carries, from the source's rack.
    f.maps.set_meter_period(0).unwrap();
    for p in even.iter().chain(&odd) {
        // A packet from SRC arriving at the destination: strip it.
        f.strip(p);
    }
    let (_, received0) = f.maps.meter_counts(0).unwrap();
    assert!(received0.is_empty(), "with the period 0 nothing is counted");
    f.maps.set_meter_period(period).unwrap();
    // Counted only from the fabric's racks, on the hops their paths carry: with none known,
    // a mark is foreign.
    let foreign =
        |f: &Fixture| f.maps.strip_counters().unwrap()[strip_reason::METER_FOREIGN as usize];
    let before = foreign(&f);
    f.strip(&even[0]);
    assert!(
        f.maps.meter_counts(0).unwrap().1.is_empty(),
        "no rack known"
    );
    assert_eq!(foreign(&f), before + 1);
    let all = || even.iter().chain(&odd);
    let limits = [
        all().map(|p| (p[36] & meter::HOP_MASK) + 1).max().unwrap(),
        all().map(|p| p[37] + 1).max().unwrap(),
    ];
    let peer = sopa_common::maps::MeterPeer {
        hop_limits: limits,
        hop1_none: 0,
        _pad: 0,
    };
    f.maps
        .set_meter_peers(&[("10.1.0.0/24".parse().unwrap(), peer)])
        .unwrap();
    for p in even.iter().chain(&odd) {
        f.strip(p);
    }
    let (_, received0) = f.maps.meter_counts(0).unwrap();
    let (_, received1) = f.maps.meter_counts(1).unwrap();
    assert_eq!((total(&received0), total(&received1)), (5, 3));
    let from = u32::from_ne_bytes([10, 1, 0, 0]);
    assert!(
        received0
            .iter()
            .chain(&received1)
            .all(|(k, _)| k.peer == from)
    );
    let mut sent: Vec<_> = sent0
        .iter()
        .chain(&sent1)
        .map(|(k, n)| ((k.hops, k.color), *n))
        .collect();
    let mut got: Vec<_> = received0
        .iter()
        .chain(&received1)
        .map(|(k, n)| ((k.hops, k.color), *n))
        .collect();
    sent.sort();
    got.sort();
    assert_eq!(sent, got, "each path and color counted alike at both ends");

    // A mark from an address no rack holds, or past the hops its rack's paths take, is not
    // counted: forged marks cannot fill the table.
    let mut stray = even[0].clone();
    stray[26..30].copy_from_slice(&[10, 9, 9, 9]);
    let mut beyond = even[0].clone();
    beyond[36] = (beyond[36] & !meter::HOP_MASK) | limits[0];
    let before = foreign(&f);
    f.strip(&stray);
    f.strip(&beyond);
    assert_eq!(foreign(&f), before + 2);
    let (_, again) = f.maps.meter_counts(0).unwrap();
    assert_eq!(again, received0, "nothing counted");

    // A GSO packet counts its segments, and each segment's headers on the wire (TCP's taken
    // with timestamps). A forged option is restamped in place, which test_run allows a GSO
    // context (growing its header it does not).
    let forged = common::with_option(&tcp(DST_INTER_POD, 6001, 1, &[7; 2000]), 1, 1);
    let (action, out) = f.stamp_with(&forged, Some(&gso_ctx(2, 1000)));
    assert_eq!(action, TC_ACT_UNSPEC);
    let (sent1, _) = f.maps.meter_counts(1).unwrap();
    let headers = (14 + 24 + 32) as u64;
    assert_eq!(total(&packets(&sent1)), 3 + 2);
    assert_eq!(bytes(&sent1), wire(&odd) + out.len() as u64 + headers);

    // Off: no mark, no count.
    f.maps.set_meter_period(0).unwrap();
    let p = f.stamp(&tcp(DST_INTER_POD, 6000, 9, b"off"));
    assert_eq!(p[36] & meter::COLOR, 0);
    let (sent1, _) = f.maps.meter_counts(1).unwrap();
    let (sent0, _) = f.maps.meter_counts(0).unwrap();
    assert_eq!((total(&packets(&sent0)), total(&packets(&sent1))), (5, 5));
}

/// A table of `(prefix, first hop)` entries, one path each.
fn one_path_table(entries: &[(&str, u8)]) -> PathTable {
    let toml: String = entries
        .iter()
        .map(|(prefix, hop)| format!("[[destination]]\nprefix = \"{prefix}\"\npaths = [[{hop}]]\n"))
        .collect();
    PathTable::parse(&toml).unwrap()
}

#[test]
fn prefixes_of_one_length_are_matched_exactly_and_the_trie_finds_the_longest_otherwise() {
    use aya::maps::{LpmTrie, MapData, lpm_trie::Key};
    use sopa_common::maps::{PATHS_MAP, PathSet, lookup};

    let mut f = Fixture::new(TABLE, mode::SINGLE);
    assert_eq!(
        f.maps.exact_length().unwrap(),
        None,
        "TABLE has two lengths"
    );
    let to = |dst: [u8; 4]| tcp(dst, 1, 1, b"x");
    let (a, b) = (to([10, 3, 1, 2]), to([10, 3, 2, 2]));

    // Two /24s: one exact match per packet.
    f.maps
        .apply_paths(&one_path_table(&[("10.3.1.0/24", 1), ("10.3.2.0/24", 2)]))
        .unwrap();
    assert_eq!(f.maps.exact_length().unwrap(), Some(24));
    assert_eq!(f.stamp(&a), stamped(&a, 1, HOP_NONE));
    assert_eq!(f.stamp(&b), stamped(&b, 2, HOP_NONE));
    // The exact table is what the program reads: with the trie's entry gone it still stamps,
    // and with the mask cleared (the trie alone) it no longer does.
    let mut trie: LpmTrie<MapData, [u8; 4], PathSet> = f.pinned(PATHS_MAP).try_into().unwrap();
    trie.remove(&Key::new(24, [10, 3, 1, 0])).unwrap();
    assert_eq!(
        f.stamp(&a),
        stamped(&a, 1, HOP_NONE),
        "found by the exact match"
    );
    f.set_host(|h| h.lookup[lookup::PATHS as usize] = 0);
    assert_eq!(f.stamp(&a), a, "the trie alone no longer has it");

    // Nothing outside the prefix that covers the table is looked up.
    assert_eq!(
        f.maps.fabric_cover().unwrap(),
        Some("10.3.0.0/22".parse().unwrap())
    );
    f.set_host(|h| h.lookup[lookup::PATHS as usize] = u32::MAX << 8);
    f.set_host(|h| h.lookup[lookup::FABRIC as usize] = u32::from_be_bytes([10, 4, 0, 0]));
    assert_eq!(f.stamp(&b), b, "outside the cover: not the fabric's");
    // A mask of 0 covers everything whatever the network says (a fresh datapath's).
    let mut cover_mask = 0;
    f.set_host(|h| cover_mask = h.lookup[lookup::FABRIC_MASK as usize]);
    f.set_host(|h| h.lookup[lookup::FABRIC_MASK as usize] = 0);
    assert_eq!(f.stamp(&b), stamped(&b, 2, HOP_NONE), "mask 0: covered");
    f.set_host(|h| h.lookup[lookup::FABRIC_MASK as usize] = cover_mask);
    f.set_host(|h| h.lookup[lookup::FABRIC as usize] = u32::from_be_bytes([10, 3, 0, 0]));
    assert_eq!(f.stamp(&b), stamped(&b, 2, HOP_NONE));

    // A prefix gone from a table of the same length is gone from the exact table too.
    f.maps
        .apply_paths(&one_path_table(&[("10.3.1.0/24", 3)]))
        .unwrap();
    assert_eq!(f.maps.exact_length().unwrap(), Some(24));
    assert_eq!(f.stamp(&a), stamped(&a, 3, HOP_NONE));
    assert_eq!(f.stamp(&b), b, "10.3.2.0/24 left the table");
    assert_eq!(
        f.maps.fabric_cover().unwrap(),
        Some("10.3.1.0/24".parse().unwrap()),
        "the cover narrows to the table"
    );

    // Two lengths: the longest match, as before.
    f.maps
        .apply_paths(&one_path_table(&[("10.3.0.0/16", 4), ("10.3.1.0/24", 5)]))
        .unwrap();
    assert_eq!(f.maps.exact_length().unwrap(), None);
    assert_eq!(f.stamp(&a), stamped(&a, 5, HOP_NONE), "the /24 is longer");
    assert_eq!(
        f.stamp(&b),
        stamped(&b, 4, HOP_NONE),
        "only the /16 holds it"
    );

    // Back to one length, /16: matched exactly at /16.
    f.maps
        .apply_paths(&one_path_table(&[("10.3.0.0/16", 6)]))
        .unwrap();
    assert_eq!(f.maps.exact_length().unwrap(), Some(16));
    assert_eq!(f.stamp(&a), stamped(&a, 6, HOP_NONE));
    assert_eq!(f.stamp(&b), stamped(&b, 6, HOP_NONE));

    // One prefix of the table's length written alone (a failure's update): written in the
    // exact table too, which answers for it.
    let p16: sopa_agent::path_table::Prefix = "10.3.0.0/16".parse().unwrap();
    f.maps
        .set_paths(
            &p16,
            &[sopa_agent::path_table::Hops {
                hop0: 9,
                hop1: HOP_NONE,
            }],
        )
        .unwrap();
    assert_eq!(f.maps.exact_length().unwrap(), Some(16));
    trie.remove(&Key::new(16, [10, 3, 0, 0])).unwrap();
    assert_eq!(
        f.stamp(&a),
        stamped(&a, 9, HOP_NONE),
        "the exact table has the update"
    );
    f.maps
        .set_paths(
            &p16,
            &[sopa_agent::path_table::Hops {
                hop0: 6,
                hop1: HOP_NONE,
            }],
        )
        .unwrap();

    // One prefix of another length written alone: the exact match turns off, and the trie
    // finds the new prefix.
    let p24: sopa_agent::path_table::Prefix = "10.3.1.0/24".parse().unwrap();
    f.maps
        .set_paths(
            &p24,
            &[sopa_agent::path_table::Hops {
                hop0: 7,
                hop1: HOP_NONE,
            }],
        )
        .unwrap();
    assert_eq!(f.maps.exact_length().unwrap(), None);
    assert_eq!(f.stamp(&a), stamped(&a, 7, HOP_NONE));
    assert_eq!(f.stamp(&b), stamped(&b, 6, HOP_NONE));
    // One outside the cover widens it.
    let far: sopa_agent::path_table::Prefix = "10.9.0.0/24".parse().unwrap();
    f.maps
        .set_paths(
            &far,
            &[sopa_agent::path_table::Hops {
                hop0: 8,
                hop1: HOP_NONE,
            }],
        )
        .unwrap();
    assert_eq!(
        f.maps.fabric_cover().unwrap(),
        Some("10.0.0.0/12".parse().unwrap())
    );
    let c = to([10, 9, 0, 5]);
    assert_eq!(f.stamp(&c), stamped(&c, 8, HOP_NONE));
}

/// The kernel address of a function, from `/proc/kallsyms` (root reads real addresses).
fn kernel_symbol(name: &str) -> u64 {
    let syms = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let addr = syms
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && f[2] == name)
        .map(|f| u64::from_str_radix(f[0], 16).unwrap())
        .unwrap_or_else(|| panic!("{name} is not in /proc/kallsyms"));
    assert_ne!(
        addr, 0,
        "/proc/kallsyms hides addresses (kptr_restrict): run as root"
    );
    addr
}

/// The program as the verifier rewrote it (BPF_OBJ_GET_INFO_BY_FD), 8 bytes an instruction.
fn xlated(fd: std::os::fd::BorrowedFd<'_>) -> Vec<[u8; 8]> {
    use std::os::fd::AsRawFd;
    // The head of `struct bpf_prog_info`, up to the xlated instructions (the kernel fills what
    // fits the length given).
    #[repr(C)]
    #[derive(Default)]
    struct Info {
        prog_type: u32,
        id: u32,
        tag: [u8; 8],
        jited_len: u32,
        xlated_len: u32,
        jited_insns: u64,
        xlated_insns: u64,
    }
    #[repr(C)]
    struct Attr {
        fd: u32,
        info_len: u32,
        info: u64,
    }
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let get = |info: &mut Info| {
        let mut attr = Attr {
            fd: fd.as_raw_fd() as u32,
            info_len: size_of::<Info>() as u32,
            info: info as *mut Info as u64,
        };
        // SAFETY: `attr` and the buffer `info` points to outlive the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_OBJ_GET_INFO_BY_FD,
                &mut attr as *mut Attr,
                size_of::<Attr>(),
            )
        };
        assert_eq!(
            r,
            0,
            "BPF_OBJ_GET_INFO_BY_FD: {}",
            std::io::Error::last_os_error()
        );
    };
    let mut info = Info::default();
    get(&mut info);
    let mut insns = vec![[0u8; 8]; info.xlated_len as usize / 8];
    info = Info {
        xlated_len: info.xlated_len,
        xlated_insns: insns.as_mut_ptr() as u64,
        ..Info::default()
    };
    get(&mut info);
    insns
}

/// How many of a loaded program's helper calls go to the kernel function `name`.
fn helper_calls(program: std::os::fd::BorrowedFd<'_>, name: &str) -> usize {
    let insns = xlated(program);
    let base = kernel_symbol("__bpf_call_base");
    let imm = (kernel_symbol(name).wrapping_sub(base)) as i32;
    // Helper calls: BPF_JMP | BPF_CALL with src_reg 0, the function as an offset from the base.
    insns
        .iter()
        .filter(|i| i[0] == 0x85 && i[1] >> 4 == 0)
        .filter(|i| i32::from_le_bytes([i[4], i[5], i[6], i[7]]) == imm)
        .count()
}

#[test]
fn every_map_lookup_of_tc_stamp_and_xdp_strip_is_inlined_or_called_directly() {
    // A call instruction LLVM shares between two maps makes the verifier fall back to the
    // generic helper (an indirect call to the map's lookup) there: about 10-20 ns a lookup on
    // this kind of CPU, for the path table's and the SRv6 destinations' lookups alike.
    use std::os::fd::AsFd;
    let mut f = Fixture::new(TABLE, mode::SOPA);
    let stamp = f.datapath.stamp_program().fd().unwrap().as_fd();
    assert_eq!(
        helper_calls(stamp, "bpf_map_lookup_elem"),
        0,
        "tc_stamp: a lookup goes through the generic helper, a call shared between maps"
    );
    assert!(
        helper_calls(stamp, "trie_lookup_elem") >= 2,
        "the tries are called directly (and this test reads the calls right)"
    );
    let strip = f.datapath.strip_program().fd().unwrap().as_fd();
    assert_eq!(
        helper_calls(strip, "bpf_map_lookup_elem"),
        0,
        "xdp_strip: a lookup goes through the generic helper, a call shared between maps"
    );
    assert!(
        helper_calls(strip, "bpf_xdp_adjust_head") >= 1,
        "xdp_strip's calls are read right"
    );
}
