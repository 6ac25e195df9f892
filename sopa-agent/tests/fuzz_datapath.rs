//! Both programs fed generated packets through BPF_PROG_TEST_RUN (needs root): random bytes,
//! truncations, IHL 0..15, bad option lengths, fragments, VLAN tags, IPv6, flipped bytes. Every
//! verdict must be the documented one (TC_ACT_UNSPEC, XDP_PASS; TC_ACT_SHOT for a sender's own
//! copy of the fabric's option that tc_stamp cannot replace) and every output either the input
//! unchanged or exactly the correctly stamped / re-stamped / stripped packet; every run is
//! counted under one verdict. `SOPA_FUZZ_PACKETS` sets the number per program (default 100,000).

mod common;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use aya::programs::{TestRun as _, TestRunOptions};
use etherparse::PacketBuilder;
use sopa_agent::{datapath::Datapath, path_table::PathTable};
use sopa_common::maps::{Config, mode, stamp_reason, strip_reason};

/// TCX_NEXT: the packet goes on to the programs and filters attached after ours.
const TC_ACT_UNSPEC: u32 = -1i32 as u32;
const TC_ACT_SHOT: u32 = 2;
const XDP_PASS: u32 = 2;

use common::TABLE;

fn packets() -> usize {
    std::env::var("SOPA_FUZZ_PACKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const DSTS: [[u8; 4]; 4] = [
    [10, 2, 0, 7],
    [10, 3, 9, 2],
    [192, 168, 1, 1],
    [10, 2, 0, 255],
];

fn base_packet(r: &mut Rng) -> Vec<u8> {
    let dst = DSTS[r.below(4) as usize];
    let payload: Vec<u8> = (0..r.below(120)).map(|_| r.byte()).collect();
    let eth = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let mut out = Vec::new();
    match r.below(5) {
        0 => eth
            .ipv6([0xfd; 16], [0xfe; 16], 64)
            .udp(1, 2)
            .write(&mut out, &payload)
            .unwrap(),
        1 => eth
            .ipv4([10, 1, 0, 2], dst, 64)
            .icmpv4_echo_request(1, 1)
            .write(&mut out, &payload)
            .unwrap(),
        2 => eth
            .ipv4([10, 1, 0, 2], dst, 64)
            .udp(r.next() as u16, r.next() as u16)
            .write(&mut out, &payload)
            .unwrap(),
        _ => eth
            .ipv4([10, 1, 0, 2], dst, 64)
            .tcp(r.next() as u16, 5001, r.next() as u32, 65535)
            .ack(1)
            .write(&mut out, &payload)
            .unwrap(),
    }
    out
}

/// A packet for the stamp program: valid or damaged in one of the ways the issue lists.
fn stamp_input(r: &mut Rng) -> Vec<u8> {
    if r.chance(10) {
        return (0..r.below(200)).map(|_| r.byte()).collect();
    }
    let mut p = base_packet(r);
    if p.len() >= 34 && p[12..14] == [8, 0] && r.chance(15) {
        // The fabric's option set by the sender itself.
        p = common::with_option(&p, r.byte(), r.byte());
    }
    mutate(r, &mut p);
    p
}

/// A packet for the strip program: often carrying our option (right or wrong), else anything.
fn strip_input(r: &mut Rng) -> Vec<u8> {
    if r.chance(10) {
        return (0..r.below(200)).map(|_| r.byte()).collect();
    }
    let mut p = base_packet(r);
    if p.len() >= 34 && p[12..14] == [8, 0] && r.chance(60) {
        p = common::with_option(&p, r.byte() % 4, r.byte());
        if r.chance(20) {
            p[35] = r.byte(); // a bad option length
        }
        if r.chance(10) {
            p[34] = r.byte(); // a foreign option type
        }
    }
    mutate(r, &mut p);
    p
}

fn mutate(r: &mut Rng, p: &mut Vec<u8>) {
    let ipv4 = p.len() >= 34 && p[12..14] == [8, 0];
    if ipv4 && r.chance(15) {
        p[14] = (p[14] & 0xF0) | r.below(16) as u8; // IHL 0..15
    }
    if ipv4 && r.chance(10) {
        let frag = (r.next() as u16) & 0x3FFF;
        p[20..22].copy_from_slice(&frag.to_be_bytes());
    }
    if ipv4 && r.chance(5) {
        p[14] = (r.below(16) as u8) << 4 | (p[14] & 0x0F); // version
    }
    if r.chance(8) {
        p.splice(12..12, [0x81, 0x00, 0x00, r.byte()]); // an 802.1Q tag
    }
    if r.chance(10) && p.len() > 14 {
        let i = 14 + r.below((p.len() - 14) as u64) as usize;
        p[i] = r.byte();
    }
    if ipv4 && r.chance(60) {
        common::fix_ipv4_checksum(p);
    }
    if r.chance(15) {
        let len = r.below(p.len() as u64 + 1) as usize;
        p.truncate(len);
    }
}

/// The modes the stamp run rotates through, with a value out of range (treated as off).
const MODES: [u32; 7] = [
    mode::SOPA,
    mode::RPS,
    mode::ECMP,
    mode::PINNED,
    mode::SINGLE,
    mode::OFF,
    mode::COUNT + 3,
];

/// Whether `frame` must leave stamped in `m`, from the rule docs/operate.md states: an unfragmented
/// IHL-5 IPv4 TCP or UDP packet (its ports present) to a prefix of the path table, in a mode
/// that stamps. With `forged`, the same for a packet carrying the fabric's option (IHL 6).
fn should_stamp(frame: &[u8], m: u32, forged: bool) -> bool {
    let header = if forged { 24 } else { 20 };
    if !(mode::SOPA..mode::COUNT).contains(&m) || frame.len() < 14 + header + 4 {
        return false;
    }
    let ip = &frame[14..];
    let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x3FFF != 0;
    frame[12..14] == [0x08, 0x00]
        && ip[0] == if forged { 0x46 } else { 0x45 }
        && !fragment
        && matches!(ip[9], 6 | 17)
        && !paths_of(frame).is_empty()
}

/// Whether `frame` carries the fabric's option as `tc_forward` honours it: an IHL-6 IPv4
/// header whose option is type 0x9E, length 4.
fn carries_our_option(frame: &[u8]) -> bool {
    frame.len() >= 14 + 22
        && frame[12..14] == [0x08, 0x00]
        && frame[14] == 0x46
        && frame[34..36] == [0x9E, 4]
}

/// `forged` with its hop bytes replaced by `hops`, the checksum adjusted for that word only.
fn restamped(forged: &[u8], hops: [u8; 2]) -> Vec<u8> {
    use sopa_common::wire::{checksum_adjust, word};
    let mut p = forged.to_vec();
    p[36..38].copy_from_slice(&hops);
    let check = checksum_adjust(
        u16::from_be_bytes([p[24], p[25]]),
        word(forged[36], forged[37]),
        word(hops[0], hops[1]),
    );
    p[24..26].copy_from_slice(&check.to_be_bytes());
    p
}

/// Whether BPF_PROG_TEST_RUN refuses `frame` as an skb before the program runs: shorter than
/// an Ethernet header, or than the IPv4 / IPv6 header its EtherType announces.
fn kernel_refuses_skb(frame: &[u8]) -> bool {
    frame.len() < 14
        || (frame[12..14] == [0x08, 0x00] && frame.len() < 14 + 20)
        || (frame[12..14] == [0x86, 0xdd] && frame.len() < 14 + 40)
}

/// The destination's candidate paths in TABLE, if the frame is an IPv4 packet to one.
fn paths_of(frame: &[u8]) -> Vec<[u8; 2]> {
    let d = &frame[30..34];
    if d[..3] == [10, 2, 0] {
        vec![[0, 0xFF], [1, 0xFF], [2, 0xFF]]
    } else if d[..2] == [10, 3] {
        vec![[0, 0], [0, 1], [1, 0], [1, 1]]
    } else {
        vec![]
    }
}

/// The option removed, IHL and total length lowered, and the checksum adjusted for exactly
/// those words (RFC 1624): a checksum that was wrong on input stays wrong by as much.
fn stripped(input: &[u8]) -> Vec<u8> {
    use sopa_common::wire::{checksum_adjust, word};
    let mut p = input.to_vec();
    p.drain(34..38);
    p[14] = 0x45;
    let tot = u16::from_be_bytes([p[16], p[17]]).wrapping_sub(4);
    p[16..18].copy_from_slice(&tot.to_be_bytes());
    let old = word(input[14], input[15])
        + word(input[16], input[17])
        + word(input[34], input[35])
        + word(input[36], input[37]);
    let new = word(p[14], p[15]) + word(p[16], p[17]);
    let check = checksum_adjust(u16::from_be_bytes([input[24], input[25]]), old, new);
    p[24..26].copy_from_slice(&check.to_be_bytes());
    p
}

fn load(tag: &str) -> (Datapath, sopa_agent::datapath::MapSet, PathBuf) {
    static N: AtomicU32 = AtomicU32::new(0);
    let pins = PathBuf::from(format!(
        "/sys/fs/bpf/sopa-test-fuzz-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut d = Datapath::load(&pins).expect("load");
    let mut maps = d.take_maps().unwrap();
    maps.set_config(Config {
        mode: mode::SOPA,
        hash_seed: 1,
    })
    .unwrap();
    maps.apply_paths(&PathTable::parse(TABLE).unwrap()).unwrap();
    (d, maps, pins)
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn tc_stamp_survives_generated_packets() {
    let (mut d, mut maps, pins) = load("stamp");
    let _rm = RemoveOnDrop(pins);
    let mut r = Rng(0x5eed_f00d);
    let (mut stamped, mut untouched, mut refused) = (0u64, 0u64, 0u64);
    let (mut restamped_count, mut dropped) = (0u64, 0u64);
    let verdicts = |m: &sopa_agent::datapath::MapSet| -> u64 {
        let c = m.stamp_counters().unwrap();
        (0..stamp_reason::COUNT)
            .filter(|i| stamp_reason::is_verdict(*i))
            .map(|i| c[i as usize])
            .sum()
    };
    let before = verdicts(&maps);
    let mut current = mode::SOPA;
    for i in 0..packets() {
        // Every mode, and a value out of range, switched as the run goes.
        if i % 10_000 == 0 {
            current = MODES[i / 10_000 % MODES.len()];
            maps.set_config(Config {
                mode: current,
                hash_seed: 1,
            })
            .unwrap();
        }
        let input = stamp_input(&mut r);
        let mut out = vec![0u8; input.len() + 64];
        let opts = TestRunOptions {
            data_in: Some(&input),
            data_out: Some(&mut out),
            ..Default::default()
        };
        let result = match d.stamp_program().test_run(opts) {
            Ok(res) => res,
            Err(e) => {
                // The kernel refuses skbs too short for their headers before the program runs.
                assert!(
                    kernel_refuses_skb(&input),
                    "test_run refused a {}-byte frame: {e}: {:?}: {input:02x?}",
                    input.len(),
                    std::error::Error::source(&e).map(|s| s.to_string())
                );
                refused += 1;
                continue;
            }
        };
        out.truncate(result.data_size_out as usize);
        // Decided from the packet and the mode alone, not from what the program did.
        if carries_our_option(&input) {
            if !should_stamp(&input, current, true) {
                assert_eq!(
                    result.return_value, TC_ACT_SHOT,
                    "packet {i} (mode {current}): a forged option we would not replace must be \
                     dropped: {input:02x?}"
                );
                dropped += 1;
                continue;
            }
            assert_eq!(
                result.return_value, TC_ACT_UNSPEC,
                "packet {i}: {input:02x?}"
            );
            let hops = [out[36], out[37]];
            assert!(
                paths_of(&input).contains(&hops),
                "packet {i}: re-stamped with {hops:?}, not a path of its destination"
            );
            assert_eq!(
                out,
                restamped(&input, hops),
                "packet {i}: not the correctly re-stamped packet"
            );
            restamped_count += 1;
            continue;
        }
        assert_eq!(
            result.return_value, TC_ACT_UNSPEC,
            "packet {i}: {input:02x?}"
        );
        let expected = should_stamp(&input, current, false);
        if out == input {
            assert!(
                !expected,
                "packet {i} (mode {current}): a stampable packet left unstamped: {input:02x?}"
            );
            untouched += 1;
            continue;
        }
        assert!(
            expected,
            "packet {i} (mode {current}): stamped a packet that must pass untouched: {input:02x?}"
        );
        assert_eq!(out.len(), input.len() + 4, "packet {i}: {input:02x?}");
        let hops = [out[36], out[37]];
        assert!(
            paths_of(&input).contains(&hops),
            "packet {i}: stamped with {hops:?}, not a path of its destination"
        );
        assert_eq!(
            out,
            common::with_option(&input, hops[0], hops[1]),
            "packet {i}: not the correctly stamped packet"
        );
        stamped += 1;
    }
    let counted = verdicts(&maps) - before;
    eprintln!(
        "tc_stamp: {stamped} stamped, {untouched} untouched, {restamped_count} forged options \
         re-stamped, {dropped} dropped, {refused} refused by the kernel"
    );
    assert_eq!(
        counted,
        stamped + untouched + restamped_count + dropped,
        "one verdict per run"
    );
    assert!(
        stamped > 1_000 && untouched > 1_000 && restamped_count > 100 && dropped > 100,
        "every outcome exercised"
    );
}

#[test]
fn xdp_strip_survives_generated_packets() {
    let (mut d, maps, pins) = load("strip");
    let _rm = RemoveOnDrop(pins);
    let mut r = Rng(0xdead_beef_cafe);
    let (mut removed, mut untouched, mut refused) = (0u64, 0u64, 0u64);
    let verdicts = |m: &sopa_agent::datapath::MapSet| -> u64 {
        let c = m.strip_counters().unwrap();
        (0..strip_reason::COUNT)
            .filter(|i| strip_reason::is_verdict(*i))
            .map(|i| c[i as usize])
            .sum()
    };
    let before = verdicts(&maps);
    for i in 0..packets() {
        let input = strip_input(&mut r);
        let mut out = vec![0u8; input.len() + 64];
        let opts = TestRunOptions {
            data_in: Some(&input),
            data_out: Some(&mut out),
            ..Default::default()
        };
        let result = match d.strip_program().test_run(opts) {
            Ok(res) => res,
            Err(e) => {
                assert!(
                    input.len() < 14,
                    "test_run refused a {}-byte frame: {e}",
                    input.len()
                );
                refused += 1;
                continue;
            }
        };
        assert_eq!(result.return_value, XDP_PASS, "packet {i}: {input:02x?}");
        out.truncate(result.data_size_out as usize);
        if out == input {
            untouched += 1;
            continue;
        }
        // Only our option, well formed, on an IHL-6 IPv4 packet, is ever removed.
        assert!(
            input.len() >= 38
                && input[12..14] == [8, 0]
                && input[14] == 0x46
                && input[34..36] == [0x9E, 4],
            "packet {i}: changed a packet without our option: {input:02x?}"
        );
        assert_eq!(
            out,
            stripped(&input),
            "packet {i}: not the correctly stripped packet"
        );
        removed += 1;
    }
    let counted = verdicts(&maps) - before;
    eprintln!(
        "xdp_strip: {removed} stripped, {untouched} untouched, {refused} refused by the kernel"
    );
    assert_eq!(counted, removed + untouched, "one verdict per run");
    assert!(
        removed > 1_000 && untouched > 1_000,
        "both outcomes exercised"
    );
}
