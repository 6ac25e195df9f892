//! Fixture table for `tc_forward` through BPF_PROG_TEST_RUN (root, no namespaces): a stamped
//! packet at its decision point is redirected by its hop byte with the TTL decremented and a
//! valid checksum; a hop byte naming no uplink is dropped; an option from a port the switch does
//! not trust is neutralized (NOPs, the checksum adjusted) and routed by the kernel; everything
//! else passes untouched. BPF_PROG_TEST_RUN runs the program on the loopback device (ifindex 1),
//! the port the fixtures trust or not.

mod common;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use aya::programs::{TestRun as _, TestRunOptions};
use etherparse::PacketBuilder;
use sopa_agent::{
    datapath::{Datapath, maps::ForwardMaps},
    path_table::Prefix,
};
use sopa_common::{
    maps::{FwdEntry, Uplink, forward_reason as reason, trust},
    srv6::{Block, DEFAULT_BLOCK},
};

/// The port BPF_PROG_TEST_RUN runs the program on.
const LOOPBACK: u32 = 1;

/// TCX_NEXT: the packet goes on to the programs and filters attached after ours.
const TC_ACT_UNSPEC: u32 = -1i32 as u32;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

struct Switch {
    datapath: Datapath,
    maps: ForwardMaps,
    pins: PathBuf,
}

impl Drop for Switch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pins);
    }
}

fn entry(hop_byte: u8, uplinks: &[(u32, [u8; 4])]) -> FwdEntry {
    let mut e = FwdEntry::PASS;
    e.hop_byte = hop_byte;
    e.count = uplinks.len() as u8;
    for (slot, (ifindex, nh)) in e.uplinks.iter_mut().zip(uplinks) {
        *slot = Uplink {
            ifindex: *ifindex,
            nexthop: u32::from_ne_bytes(*nh),
        };
    }
    e
}

/// An edge switch of pod 0 (its rack 10.0.0.0/24): decides by hop0 for everything else, with
/// two uplinks; a second entry decides by hop1 (as an aggregation switch would) for 10.2/16.
/// Every uplink has an ifindex of its own. BPF_PROG_TEST_RUN returns the redirect verdict
/// without performing it, so the port a hop value really leaves by is checked on the wire, by
/// the fabric suites (packets out of each port, `fabric_fat_tree.rs`, `fabric_modric.rs`).
fn switch() -> Switch {
    static N: AtomicU32 = AtomicU32::new(0);
    let pins = PathBuf::from(format!(
        "/sys/fs/bpf/sopa-test-forward-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut datapath =
        Datapath::load_switch(&pins).expect("tc_forward loads and passes the verifier");
    let mut maps = datapath.take_forward_maps().unwrap();
    let p = |s: &str| s.parse::<Prefix>().unwrap();
    maps.set(
        &p("10.0.0.0/8"),
        &entry(1, &[(11, [10, 0, 2, 1]), (12, [10, 0, 3, 1])]),
    )
    .unwrap();
    maps.set(&p("10.0.0.0/24"), &FwdEntry::PASS).unwrap();
    maps.set(
        &p("10.2.0.0/16"),
        &entry(2, &[(21, [10, 2, 4, 1]), (22, [10, 2, 5, 1])]),
    )
    .unwrap();
    maps.set_trusted(&BTreeMap::from([(LOOPBACK, trust::SWITCH)]))
        .unwrap();
    Switch {
        datapath,
        maps,
        pins,
    }
}

fn run(s: &mut Switch, packet: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; packet.len() + 64];
    let r = s
        .datapath
        .forward_program()
        .test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .expect("test_run tc_forward");
    out.truncate(r.data_size_out as usize);
    (r.return_value, out)
}

/// A TCP packet to `dst` with our option (hop0, hop1) and `ttl`.
fn stamped(dst: [u8; 4], hop0: u8, hop1: u8, ttl: u8) -> Vec<u8> {
    common::with_option(&plain_ttl(dst, ttl), hop0, hop1)
}

fn plain(dst: [u8; 4]) -> Vec<u8> {
    plain_ttl(dst, 64)
}

fn plain_ttl(dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let mut p = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 0, 0, 2], dst, ttl)
        .tcp(1000, 2000, 1, 100)
        .write(&mut p, b"payload")
        .unwrap();
    p
}

/// (name, packet, action, reason, the uplink it must leave by).
type Case = (&'static str, Vec<u8>, u32, u32, Option<usize>);

#[test]
fn forward_fixture_table() {
    let mut s = switch();
    let mut ipv6 = Vec::new();
    PacketBuilder::ethernet2([2; 6], [3; 6])
        .ipv6([1; 16], [2; 16], 64)
        .udp(1, 2)
        .write(&mut ipv6, b"x")
        .unwrap();
    let mut foreign = stamped([10, 1, 0, 2], 1, 0, 64);
    foreign[34] = 0x94; // router alert, not ours
    common::fix_ipv4_checksum(&mut foreign);
    let cases: Vec<Case> = vec![
        (
            "hop0 = 1 to another pod",
            stamped([10, 1, 0, 2], 1, 0, 64),
            TC_ACT_REDIRECT,
            reason::REDIRECTED,
            Some(1),
        ),
        (
            "hop0 = 0 to another pod",
            stamped([10, 3, 1, 2], 0, 1, 64),
            TC_ACT_REDIRECT,
            reason::REDIRECTED,
            Some(0),
        ),
        (
            "hop1 decides for 10.2/16",
            stamped([10, 2, 0, 2], 0, 1, 64),
            TC_ACT_REDIRECT,
            reason::REDIRECTED,
            Some(1),
        ),
        (
            "a hop naming no uplink",
            stamped([10, 1, 0, 2], 7, 0, 64),
            TC_ACT_SHOT,
            reason::UNKNOWN_HOP,
            None,
        ),
        (
            "own rack: the kernel delivers",
            stamped([10, 0, 0, 3], 1, 0, 64),
            TC_ACT_UNSPEC,
            reason::NOT_DECISION,
            None,
        ),
        (
            "outside the fabric",
            stamped([192, 168, 1, 1], 1, 0, 64),
            TC_ACT_UNSPEC,
            reason::NOT_DECISION,
            None,
        ),
        (
            "no option: kernel ECMP",
            plain([10, 1, 0, 2]),
            TC_ACT_UNSPEC,
            reason::NO_OPTION,
            None,
        ),
        (
            "a foreign option",
            foreign,
            TC_ACT_UNSPEC,
            reason::NO_OPTION,
            None,
        ),
        (
            "TTL 1: the kernel answers",
            stamped([10, 1, 0, 2], 1, 0, 1),
            TC_ACT_UNSPEC,
            reason::TTL_EXPIRED,
            None,
        ),
        ("ipv6", ipv6, TC_ACT_UNSPEC, reason::NOT_IPV4, None),
    ];
    for (name, packet, action, why, uplink) in cases {
        let before = (
            s.maps.counters().unwrap(),
            s.maps.uplink_counters().unwrap(),
        );
        let (got, out) = run(&mut s, &packet);
        assert_eq!(got, action, "{name}: action");
        let after = (
            s.maps.counters().unwrap(),
            s.maps.uplink_counters().unwrap(),
        );
        assert_eq!(
            after.0[why as usize],
            before.0[why as usize] + 1,
            "{name}: counted as {}",
            reason::NAMES[why as usize]
        );
        if let Some(u) = uplink {
            assert_eq!(after.1[u], before.1[u] + 1, "{name}: left by uplink {u}");
            let mut expect = packet.clone();
            expect[22] -= 1;
            common::fix_ipv4_checksum(&mut expect);
            assert_eq!(
                out, expect,
                "{name}: TTL decremented, checksum valid, nothing else changed"
            );
        } else {
            assert_eq!(out, packet, "{name}: untouched");
        }
    }
}

#[test]
fn a_header_corrupted_in_transit_stays_corrupted() {
    let mut s = switch();
    let good = stamped([10, 1, 0, 2], 1, 0, 64);
    let mut bad = good.clone();
    bad[24] ^= 0x5A; // the checksum, damaged on the wire
    assert!(common::checksum_ok(&good) && !common::checksum_ok(&bad));
    let (got, out) = run(&mut s, &good);
    assert_eq!(got, TC_ACT_REDIRECT);
    assert!(common::checksum_ok(&out), "a good header stays good");
    let (got, out) = run(&mut s, &bad);
    assert_eq!(got, TC_ACT_REDIRECT);
    assert!(
        !common::checksum_ok(&out),
        "the TTL decrement repaired a corrupted header: {:02x?}",
        &out[14..38]
    );
    // Wrong by exactly what it was wrong by before.
    let mut expect = bad.clone();
    expect[22] -= 1;
    let check = sopa_common::wire::checksum_adjust(
        u16::from_be_bytes([bad[24], bad[25]]),
        sopa_common::wire::word(bad[22], bad[23]),
        sopa_common::wire::word(expect[22], expect[23]),
    );
    expect[24..26].copy_from_slice(&check.to_be_bytes());
    assert_eq!(out, expect);
}

/// `frame` (carrying our option) with the option's four bytes turned into NOPs and the
/// checksum adjusted from the one it had (a bad checksum stays bad by as much).
fn neutralized(frame: &[u8]) -> Vec<u8> {
    use sopa_common::wire::{checksum_adjust, word};
    let mut expect = frame.to_vec();
    let mut check = u16::from_be_bytes([frame[24], frame[25]]);
    for i in [34, 36] {
        check = checksum_adjust(check, word(frame[i], frame[i + 1]), word(1, 1));
        expect[i..i + 2].copy_from_slice(&[1, 1]);
    }
    expect[24..26].copy_from_slice(&check.to_be_bytes());
    expect
}

#[test]
fn an_option_from_an_untrusted_port_is_neutralized_and_left_to_the_kernel() {
    let mut s = switch();
    s.maps.set_trusted(&BTreeMap::new()).unwrap();
    assert_eq!(s.maps.trusted(), Some(BTreeMap::new()), "no port trusted");
    for (name, packet) in [
        ("at a decision point", stamped([10, 1, 0, 2], 1, 0, 64)),
        ("for the own rack", stamped([10, 0, 0, 3], 1, 1, 64)),
        ("hop1 decides", stamped([10, 2, 0, 2], 0, 1, 64)),
    ] {
        let before = s.maps.counters().unwrap();
        let (got, out) = run(&mut s, &packet);
        assert_eq!(got, TC_ACT_UNSPEC, "{name}: the kernel routes it");
        let after = s.maps.counters().unwrap();
        assert_eq!(
            after[reason::UNTRUSTED as usize],
            before[reason::UNTRUSTED as usize] + 1,
            "{name}: counted as untrusted"
        );
        assert_eq!(
            after[reason::REDIRECTED as usize],
            before[reason::REDIRECTED as usize],
            "{name}: not redirected"
        );
        assert_eq!(out, neutralized(&packet), "{name}: the option is four NOPs");
        assert!(common::checksum_ok(&out), "{name}: a valid header");
        assert_eq!(out[22], packet[22], "{name}: TTL left to the kernel");
    }
    // A header corrupted on the way stays corrupted.
    let mut bad = stamped([10, 1, 0, 2], 1, 0, 64);
    bad[24] ^= 0x5A;
    let (got, out) = run(&mut s, &bad);
    assert_eq!(got, TC_ACT_UNSPEC);
    assert!(
        !common::checksum_ok(&out),
        "the rewrite repaired a bad header"
    );
    assert_eq!(out, neutralized(&bad));
    // Packets without our option are not touched on an untrusted port either.
    let packet = plain([10, 1, 0, 2]);
    let (got, out) = run(&mut s, &packet);
    assert_eq!((got, out), (TC_ACT_UNSPEC, packet));

    // Trusted again: honoured.
    s.maps
        .set_trusted(&BTreeMap::from([(LOOPBACK, trust::HOST)]))
        .unwrap();
    let (got, _) = run(&mut s, &stamped([10, 1, 0, 2], 1, 0, 64));
    assert_eq!(got, TC_ACT_REDIRECT);
}

#[test]
fn a_detour_rewrites_the_hop_byte_marks_the_packet_and_is_taken_once() {
    use sopa_common::{
        maps::fwd_kind::{DETOUR, DETOURED, UNREACHABLE},
        wire::HOP_NONE,
    };
    let mut s = switch();
    let p = |s: &str| s.parse::<Prefix>().unwrap();
    // 10.9/16: this switch's way down is dead; leave by port 31, hop1 := 1.
    let mut d = entry(2, &[(31, [10, 9, 9, 1])]);
    d.kind = DETOUR;
    d.value = 1;
    s.maps.set(&p("10.9.0.0/16"), &d).unwrap();
    // 10.8/16: detoured with no byte rewritten (the next switch routes by destination).
    let mut d = entry(0, &[(32, [10, 8, 8, 1])]);
    d.kind = DETOUR;
    s.maps.set(&p("10.8.0.0/16"), &d).unwrap();

    let count = |s: &Switch, why: u32| s.maps.counters().unwrap()[why as usize];
    let uplinks = |s: &Switch| s.maps.uplink_counters().unwrap();
    for (name, dst, hops, expect_hops) in [
        ("hop1 rewritten", [10, 9, 0, 2], (1, 0), (1 | DETOURED, 1)),
        (
            "nothing rewritten",
            [10, 8, 0, 2],
            (1, 1),
            (1 | DETOURED, 1),
        ),
        // A one-decision path: the second byte is "none" (0xFF), which is no mark.
        (
            "hop1 none",
            [10, 8, 0, 2],
            (0, HOP_NONE),
            (DETOURED, HOP_NONE),
        ),
    ] {
        let packet = stamped(dst, hops.0, hops.1, 64);
        let (before, up_before) = (count(&s, reason::DETOURED), uplinks(&s));
        let (got, out) = run(&mut s, &packet);
        assert_eq!(got, TC_ACT_REDIRECT, "{name}");
        assert_eq!(count(&s, reason::DETOURED), before + 1, "{name}: counted");
        assert_eq!(
            uplinks(&s),
            up_before,
            "{name}: no hop value's uplink counted"
        );
        let mut expect = packet.clone();
        expect[22] -= 1;
        (expect[36], expect[37]) = expect_hops;
        common::fix_ipv4_checksum(&mut expect);
        assert_eq!(
            out, expect,
            "{name}: TTL, hop bytes, mark, a valid checksum"
        );

        // At a second dead end the marked packet is not detoured again: dropped, not handed to
        // the kernel (whose way around leads into other switches' decisions).
        let before = count(&s, reason::DETOUR_REFUSED);
        let (got, again) = run(&mut s, &out);
        assert_eq!((got, &again), (TC_ACT_SHOT, &out), "{name}: dropped");
        assert_eq!(count(&s, reason::DETOUR_REFUSED), before + 1, "{name}");
    }

    // A decision ignores the mark: hop0 = 1 | DETOURED leaves by uplink 1.
    let marked = stamped([10, 1, 0, 2], 1 | DETOURED, 0, 64);
    let before = uplinks(&s);
    let (got, out) = run(&mut s, &marked);
    assert_eq!(got, TC_ACT_REDIRECT);
    assert_eq!(uplinks(&s)[1], before[1] + 1, "left by uplink 1");
    assert_eq!(out[36], 1 | DETOURED, "the mark stays");

    // No way at all: dropped here, counted.
    let mut e = FwdEntry::PASS;
    e.kind = UNREACHABLE;
    s.maps.set(&p("10.7.0.0/16"), &e).unwrap();
    let before = count(&s, reason::UNREACHABLE);
    let packet = stamped([10, 7, 0, 2], 1, 0, 64);
    let (got, out) = run(&mut s, &packet);
    assert_eq!((got, out), (TC_ACT_SHOT, packet));
    assert_eq!(count(&s, reason::UNREACHABLE), before + 1);

    // A header corrupted on the way stays corrupted through a detour.
    let mut bad = stamped([10, 9, 0, 2], 1, 0, 64);
    bad[24] ^= 0x5A;
    let (got, out) = run(&mut s, &bad);
    assert_eq!(got, TC_ACT_REDIRECT);
    assert!(
        !common::checksum_ok(&out),
        "the detour repaired a bad header"
    );
}

/// An SRv6 frame: `plain(dst)` inside an outer header to the uSID list `usids` of the default
/// block, flow label `label`.
fn usid_frame(usids: &[u16], label: u32) -> Vec<u8> {
    usid_frame_in(DEFAULT_BLOCK, usids, label)
}

/// [`usid_frame`] in `block`.
fn usid_frame_in(block: Block, usids: &[u16], label: u32) -> Vec<u8> {
    use sopa_common::srv6::{NEXTHDR_IPV4, address, outer_header};
    let inner = plain([10, 2, 0, 2]);
    let ip = &inner[14..];
    let mut out = inner[..12].to_vec();
    out.extend(0x86DDu16.to_be_bytes());
    let len = u16::from_be_bytes([ip[2], ip[3]]);
    out.extend(outer_header(
        len,
        NEXTHDR_IPV4,
        ip[1],
        label,
        &[0xFD; 16],
        &address(block, usids),
    ));
    out.extend(ip);
    out
}

/// The uSIDs of an SRv6 frame's destination, up to the first 0.
fn usids_of(frame: &[u8]) -> Vec<u16> {
    frame[14 + 28..14 + 40]
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect()
}

#[test]
fn a_usid_list_behind_a_dead_port_is_rewritten_and_a_detour_taken_once() {
    use sopa_common::{
        maps::{UsidRule, UsidRuleKey},
        srv6::FLOW_LABEL_DETOURED,
    };
    let mut s = switch();
    let count = |s: &Switch, r: u32| s.maps.counters().unwrap()[r as usize];
    // This switch is uSID 5. With no rule, a uSID packet passes untouched.
    let packet = usid_frame(&[5, 9, 3, 0xE002], 0x1234);
    s.maps
        .set_usid_rules(5, DEFAULT_BLOCK, false, &BTreeMap::new())
        .unwrap();
    let before = count(&s, reason::USID_INTACT);
    let (got, out) = run(&mut s, &packet);
    assert_eq!((got, &out), (TC_ACT_UNSPEC, &packet));
    assert_eq!(count(&s, reason::USID_INTACT), before + 1);

    let rule = |replace: u8, with: &[u16], detour: bool| {
        let mut w = [0; 4];
        w[..with.len()].copy_from_slice(with);
        UsidRule {
            replace,
            len: with.len() as u8,
            detour: u8::from(detour),
            _pad: 0,
            with: w,
        }
    };
    let key = |next, after| UsidRuleKey { next, after };
    s.maps
        .set_usid_rules(
            5,
            DEFAULT_BLOCK,
            false,
            &BTreeMap::from([
                // Substitute the next uSID (9 -> 10), after our own.
                (key(9, 3), rule(1, &[10], false)),
                // Substitute the next two (as a rack switch whose uplink died).
                (key(7, 8), rule(2, &[11, 12], false)),
                // Detour before the destination's rack switch (3), followed by a host.
                (key(3, 0), rule(0, &[13, 14], true)),
            ]),
        )
        .unwrap();
    let cases: [(&[u16], &[u16], u32); 4] = [
        // Our own uSID first: the rule keys on the one after it.
        (
            &[5, 9, 3, 0xE002],
            &[5, 10, 3, 0xE002],
            reason::USID_REPAIRED,
        ),
        // Not ours first (a host's packet at its rack switch): keyed on the first.
        (
            &[7, 8, 3, 0xE002],
            &[11, 12, 3, 0xE002],
            reason::USID_REPAIRED,
        ),
        (
            &[5, 3, 0xE002],
            &[5, 13, 14, 3, 0xE002],
            reason::USID_DETOURED,
        ),
        // No rule for this list: untouched.
        (&[5, 4, 3, 0xE002], &[5, 4, 3, 0xE002], reason::USID_INTACT),
    ];
    for (list, want, why) in cases {
        let before = count(&s, why);
        let (got, out) = run(&mut s, &usid_frame(list, 0x1234));
        assert_eq!(got, TC_ACT_UNSPEC, "{list:?}");
        assert_eq!(usids_of(&out), want, "{list:?}");
        assert_eq!(count(&s, why), before + 1, "{list:?}");
        // The rest of the frame is the packet's own.
        let sent = usid_frame(list, 0x1234);
        assert_eq!(out.len(), sent.len());
        assert_eq!(out[14 + 40..], sent[14 + 40..], "{list:?}: inner packet");
        let label = u32::from_be_bytes([0, out[15] & 0xF, out[16], out[17]]);
        let marked = why == reason::USID_DETOURED;
        assert_eq!(label & FLOW_LABEL_DETOURED != 0, marked, "{list:?}");
        assert_eq!(label & !FLOW_LABEL_DETOURED, 0x1234, "{list:?}");
    }

    // A detoured packet at a second dead end: dropped, counted.
    let before = count(&s, reason::USID_DETOUR_REFUSED);
    let marked = usid_frame(&[5, 3, 0xE002], 0x1234 | FLOW_LABEL_DETOURED);
    let (got, _) = run(&mut s, &marked);
    assert_eq!(got, TC_ACT_SHOT);
    assert_eq!(count(&s, reason::USID_DETOUR_REFUSED), before + 1);

    // A detour that would not fit the address: dropped, counted.
    let before = count(&s, reason::USID_NO_ROOM);
    let full = usid_frame(&[5, 3, 0xE002, 1, 1, 1], 0);
    let (got, _) = run(&mut s, &full);
    assert_eq!(got, TC_ACT_SHOT);
    assert_eq!(count(&s, reason::USID_NO_ROOM), before + 1);

    // Rules gone (the port came back): untouched again.
    s.maps
        .set_usid_rules(5, DEFAULT_BLOCK, false, &BTreeMap::new())
        .unwrap();
    assert!(s.maps.usid_rules().unwrap().is_empty());
    let packet = usid_frame(&[5, 9, 3, 0xE002], 0);
    let (got, out) = run(&mut s, &packet);
    assert_eq!((got, out), (TC_ACT_UNSPEC, packet));
}

/// A repair rule: the uSID 9 before 3 becomes 10 (a dead port towards 9).
fn replace_9_after_3_with_10() -> (sopa_common::maps::UsidRuleKey, sopa_common::maps::UsidRule) {
    (
        sopa_common::maps::UsidRuleKey { next: 9, after: 3 },
        sopa_common::maps::UsidRule {
            replace: 1,
            len: 1,
            detour: 0,
            _pad: 0,
            with: [10, 0, 0, 0],
        },
    )
}

/// The uN behaviour in eBPF (a kernel without `seg6local`): this switch's uSID consumed at the
/// head of the list, the rest shifted up and zero-filled, byte for byte, the packet left to the
/// kernel's routing (which decrements the hop limit, and answers 1 with ICMP); nothing else of
/// the frame changes. What the kernel's End leaves alone is left alone.
#[test]
fn the_un_shift_in_ebpf_consumes_this_switchs_usid_byte_for_byte() {
    let mut s = switch();
    let count = |s: &Switch, r: u32| s.maps.counters().unwrap()[r as usize];
    // This switch is uSID 5, and tc_forward consumes it.
    s.maps
        .set_usid_rules(5, DEFAULT_BLOCK, true, &BTreeMap::new())
        .unwrap();
    let with_hop_limit = |mut frame: Vec<u8>, hl: u8| {
        frame[14 + 7] = hl;
        frame
    };
    let shifted: [(&[u16], &[u16]); 5] = [
        // Lists of 2 to 6 uSIDs: the rest moves up one slot.
        (&[5, 9], &[9]),
        (&[5, 9, 3], &[9, 3]),
        (&[5, 9, 3, 0xE002], &[9, 3, 0xE002]),
        (&[5, 9, 8, 3, 0xE002], &[9, 8, 3, 0xE002]),
        (&[5, 9, 8, 7, 3, 0xE002], &[9, 8, 7, 3, 0xE002]),
    ];
    for (hl, (list, want)) in [64u8, 1]
        .into_iter()
        .flat_map(|hl| shifted.map(|c| (hl, c)))
    {
        let before = count(&s, reason::USID_SHIFTED);
        let sent = with_hop_limit(usid_frame(list, 0x1234), hl);
        let (got, out) = run(&mut s, &sent);
        assert_eq!(got, TC_ACT_UNSPEC, "{list:?}: the kernel routes it");
        assert_eq!(usids_of(&out), want, "{list:?}");
        assert_eq!(count(&s, reason::USID_SHIFTED), before + 1, "{list:?}");
        // Byte for byte: the block, then the shifted list zero-filled; everything else as sent,
        // the hop limit included (the kernel's forwarding takes it down, as after its End).
        let mut expect = sent.clone();
        expect[14 + 28..14 + 40]
            .copy_from_slice(&sopa_common::srv6::address(DEFAULT_BLOCK, want)[4..]);
        assert_eq!(out, expect, "{list:?}, hop limit {hl}");
    }

    // The list's last uSID is ours: nothing to route to, dropped as the kernel's End drops it.
    let before = count(&s, reason::USID_LAST);
    let (got, _) = run(&mut s, &usid_frame(&[5], 0));
    assert_eq!(got, TC_ACT_SHOT);
    assert_eq!(count(&s, reason::USID_LAST), before + 1);

    // Left as they are: a list not for this switch, one naming a host of this rack next (its
    // /64 route is more specific than the locator), our last uSID with a routing header after
    // it (the kernel's End goes on to that), a packet outside the block.
    let untouched: [Vec<u8>; 4] = [
        usid_frame(&[9, 5, 3, 0xE002], 0),
        usid_frame(&[5, 0xE002], 0),
        {
            let mut f = usid_frame(&[5], 0);
            f[14 + 6] = 43;
            f
        },
        {
            let mut f = usid_frame(&[5, 9, 3], 0);
            f[14 + 24] = 0xFD;
            f
        },
    ];
    for frame in untouched {
        let shifted = count(&s, reason::USID_SHIFTED);
        let (got, out) = run(&mut s, &frame);
        assert_eq!(
            (got, &out),
            (TC_ACT_UNSPEC, &frame),
            "{:?}",
            usids_of(&frame)
        );
        assert_eq!(count(&s, reason::USID_SHIFTED), shifted);
    }

    // A list repaired around a dead port is then shifted too (counted as repaired).
    let (key, rule) = replace_9_after_3_with_10();
    s.maps
        .set_usid_rules(5, DEFAULT_BLOCK, true, &BTreeMap::from([(key, rule)]))
        .unwrap();
    let before = count(&s, reason::USID_REPAIRED);
    let (got, out) = run(&mut s, &usid_frame(&[5, 9, 3, 0xE002], 0));
    assert_eq!(got, TC_ACT_UNSPEC);
    assert_eq!(usids_of(&out), [10, 3, 0xE002]);
    assert_eq!(count(&s, reason::USID_REPAIRED), before + 1);

    // With the kernel consuming it, tc_forward leaves our uSID alone.
    s.maps
        .set_usid_rules(5, DEFAULT_BLOCK, false, &BTreeMap::new())
        .unwrap();
    let frame = usid_frame(&[5, 9, 3], 0);
    let (got, out) = run(&mut s, &frame);
    assert_eq!((got, out), (TC_ACT_UNSPEC, frame));
}

/// A fabric of its own uSID block: the switch repairs and shifts that block's lists, and leaves
/// those of any other block (the default one included) as they are.
#[test]
fn a_switch_works_on_its_fabrics_own_usid_block_only() {
    let mut s = switch();
    let count = |s: &Switch, r: u32| s.maps.counters().unwrap()[r as usize];
    const OURS: Block = [0x20, 0x01, 0x0d, 0xb8];
    let (key, rule) = replace_9_after_3_with_10();
    s.maps
        .set_usid_rules(5, OURS, true, &BTreeMap::from([(key, rule)]))
        .unwrap();
    let before = count(&s, reason::USID_REPAIRED);
    let (got, out) = run(&mut s, &usid_frame_in(OURS, &[5, 9, 3, 0xE002], 0));
    assert_eq!(got, TC_ACT_UNSPEC);
    assert_eq!(out[14 + 24..14 + 28], OURS, "the block stays");
    assert_eq!(usids_of(&out), [10, 3, 0xE002], "repaired and shifted");
    assert_eq!(count(&s, reason::USID_REPAIRED), before + 1);
    let before = count(&s, reason::USID_SHIFTED);
    let (_, out) = run(&mut s, &usid_frame_in(OURS, &[5, 4, 3, 0xE002], 0));
    assert_eq!(usids_of(&out), [4, 3, 0xE002], "shifted");
    assert_eq!(count(&s, reason::USID_SHIFTED), before + 1);

    let (shifted, repaired) = (
        count(&s, reason::USID_SHIFTED),
        count(&s, reason::USID_REPAIRED),
    );
    for other in [DEFAULT_BLOCK, [0x20, 0x01, 0x0d, 0xb9]] {
        let frame = usid_frame_in(other, &[5, 9, 3, 0xE002], 0);
        let (got, out) = run(&mut s, &frame);
        assert_eq!((got, out), (TC_ACT_UNSPEC, frame), "{other:x?}");
    }
    assert_eq!(count(&s, reason::USID_SHIFTED), shifted);
    assert_eq!(count(&s, reason::USID_REPAIRED), repaired);
}
