//! Packet helpers shared by the BPF_PROG_TEST_RUN fixture tables.
#![allow(dead_code)]

use sopa_common::wire::ipv4_header_checksum;

/// The fixtures' path table: a single-decision prefix with 3 paths, a two-decision one with 4.
pub const TABLE: &str = r#"
[[destination]]
prefix = "10.2.0.0/24"
paths = [[0], [1], [2]]
[[destination]]
prefix = "10.3.0.0/16"
paths = [[0, 0], [0, 1], [1, 0], [1, 1]]
"#;

/// Recomputes the IPv4 header checksum of an Ethernet frame in place.
pub fn fix_ipv4_checksum(frame: &mut [u8]) {
    let ihl = usize::from(frame[14] & 0x0f).max(5) * 4;
    frame[24] = 0;
    frame[25] = 0;
    let end = (14 + ihl).min(frame.len());
    let sum = ipv4_header_checksum(&frame[14..end]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
}

/// What `tc_stamp` makes of an IHL-5 frame for the path (hop0, hop1).
pub fn with_option(original: &[u8], hop0: u8, hop1: u8) -> Vec<u8> {
    let mut p = original.to_vec();
    p.splice(34..34, [0x9E, 4, hop0, hop1]);
    p[14] = 0x46;
    let tot = u16::from_be_bytes([p[16], p[17]]) + 4;
    p[16..18].copy_from_slice(&tot.to_be_bytes());
    fix_ipv4_checksum(&mut p);
    p
}

/// The IPv4 header checksum of a frame is valid.
pub fn checksum_ok(frame: &[u8]) -> bool {
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    sopa_common::wire::ipv4_header_checksum(&frame[14..14 + ihl]) == 0
}
