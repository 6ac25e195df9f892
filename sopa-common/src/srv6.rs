//! The SRv6 encoding: the path as a list of micro-SIDs (uSIDs, RFC 9800's NEXT-C-SID flavour) in
//! the destination address of an outer IPv6 header that the sending host puts in front of the
//! packet (reduced encapsulation: no segment routing header while the list fits one address).
//!
//! ```text
//! outer destination:  fcbb:bb00 : uSID 1 : uSID 2 : ... : LID : 0 ...
//!                     '- block -' '- one per switch the path names -' '- the host -'
//! ```
//!
//! - The block is 32 bits (the fabric's: an inventory's `usid_block`, [`DEFAULT_BLOCK`] where
//!   it gives none), every uSID 16, so one address holds [`USID_SLOTS`] of them. A host's
//!   datapath takes the block from the address it receives on; a switch's from its
//!   configuration.
//! - A switch owns one global uSID. Its locator `block:uSID::/48` is a `seg6local` End route
//!   with the NEXT-C-SID flavour: it shifts the list left by one uSID and forwards on the new
//!   destination, exactly what SONiC's uN and SAI's uSID behaviours do in hardware.
//! - The list ends with the destination host's local uSID ([`LIB_BASE`] plus the host's offset
//!   in its rack's prefix): after the host's rack switch consumed its own uSID, that switch
//!   routes the address to the host port, and the host's XDP program removes the outer header.
//!
//! Outer header fields: version 6, traffic class copied from the inner packet (DSCP and ECN),
//! flow label from the inner flow's hash (so receivers' NICs keep spreading flows over their
//! queues, and IPv6 multipath routes hash per flow), next header 4 (IPv4 inside) or 41 (IPv6
//! inside), hop limit [`HOP_LIMIT`].
//!
//! While the path meter runs, a Destination Options header of [`MARK_LEN`] bytes follows the
//! outer header: RFC 9343's Alternate-Marking option, whose FlowMonID names the path (its two
//! hop bytes) and whose L flag is the period's color. Only the host the address finally names
//! reads it (no segment routing header precedes it, so no switch does), and switches forward it
//! as they forward any IPv6 packet: nothing in the packet varies per path where a NIC hashes
//! (the flow label stays the flow's), so a flow keeps its receive queue.
//!
//! ```text
//! next header | 0 | 0x12 | 4 | FlowMonID (20 bits: 0000 hop0 hop1) L D reserved (10)
//! ```

/// EtherType of IPv6, host order.
pub const ETH_P_IPV6: u16 = 0x86DD;
/// IPv6 fixed header length: what the outer header adds to every packet.
pub const IPV6_HLEN: usize = 40;
/// Next header of an IPv4 packet inside IPv6 (IP-in-IPv6).
pub const NEXTHDR_IPV4: u8 = 4;
/// Next header of an IPv6 packet inside IPv6.
pub const NEXTHDR_IPV6: u8 = 41;
/// The outer header's hop limit.
pub const HOP_LIMIT: u8 = 64;
/// Next header of a Destination Options header.
pub const NEXTHDR_DEST: u8 = 60;
/// The IPv6 option type of Alternate Marking (RFC 9343, IANA): skipped where not understood,
/// not changed en route.
pub const ALT_MARK_OPTION: u8 = 0x12;
/// The Destination Options header carrying the mark: 2 bytes of header, 2 of option type and
/// length, 4 of data; no padding.
pub const MARK_LEN: usize = 8;
/// The most the encoding adds to a packet: the outer header and the mark. Routes and fabric
/// MTUs leave room for both, so turning the meter on never makes a packet too big.
pub const MAX_OVERHEAD: usize = IPV6_HLEN + MARK_LEN;

/// A uSID block: the first 32 bits of every path address of a fabric, in network order.
pub type Block = [u8; 4];
/// The block of a fabric that names none (`fcbb:bb00::/32`, the block of the uSID examples in
/// RFC 9800 and in SONiC's documentation).
pub const DEFAULT_BLOCK: Block = [0xFC, 0xBB, 0xBB, 0x00];
/// uSIDs one address holds after the block.
pub const USID_SLOTS: usize = 6;
/// Local uSIDs (the LIB of RFC 9800's example allocation, `0xE000..=0xFFFF`): meaningful only on
/// the switch whose uSID came before them. A host's local uSID is `LIB_BASE` plus its offset in
/// its rack's prefix.
pub const LIB_BASE: u16 = 0xE000;
/// The largest offset of a host in its rack's prefix that has a local uSID.
pub const MAX_HOST_OFFSET: u32 = 0x1FFF;
/// Global uSIDs, for switches: `1..LIB_BASE` (0 ends a list).
pub const MAX_GLOBAL_USID: u16 = LIB_BASE - 1;

/// The 128-bit address of a uSID list: `block`, then `usids` in order, zero-filled.
/// `usids` longer than [`USID_SLOTS`] are cut (callers check the length first).
pub fn address(block: Block, usids: &[u16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&block);
    for (i, u) in usids.iter().take(USID_SLOTS).enumerate() {
        out[4 + 2 * i..6 + 2 * i].copy_from_slice(&u.to_be_bytes());
    }
    out
}

/// The local uSID of the host at `offset` in its rack's prefix, if it has one.
pub const fn host_lid(offset: u32) -> Option<u16> {
    if offset > MAX_HOST_OFFSET {
        None
    } else {
        Some(LIB_BASE | offset as u16)
    }
}

/// The outer flow label of a flow whose hash is `hash`: the upper bits rotated down, as the
/// kernel's own IPv6 tunnels and Cilium do, cut to 19 bits (the 20th is
/// [`FLOW_LABEL_DETOURED`], clear when a host sends).
pub const fn flow_label(hash: u32) -> u32 {
    hash.rotate_left(16) & 0x7_FFFF
}

/// The flow label's top bit: a switch's local repair detoured the packet once already (the
/// switches' `tc_forward` sets it; a second detour drops the packet instead of bouncing it).
pub const FLOW_LABEL_DETOURED: u32 = 0x8_0000;

/// The outer IPv6 header: `payload_len` the inner packet's whole length, `next` its next-header
/// value, `tclass` the inner packet's DSCP and ECN byte.
pub const fn outer_header(
    payload_len: u16,
    next: u8,
    tclass: u8,
    label: u32,
    src: &[u8; 16],
    dst: &[u8; 16],
) -> [u8; IPV6_HLEN] {
    let mut h = [0u8; IPV6_HLEN];
    let first = (6u32 << 28) | ((tclass as u32) << 20) | (label & 0xF_FFFF);
    let f = first.to_be_bytes();
    h[0] = f[0];
    h[1] = f[1];
    h[2] = f[2];
    h[3] = f[3];
    let l = payload_len.to_be_bytes();
    h[4] = l[0];
    h[5] = l[1];
    h[6] = next;
    h[7] = HOP_LIMIT;
    let mut i = 0;
    while i < 16 {
        h[8 + i] = src[i];
        h[24 + i] = dst[i];
        i += 1;
    }
    h
}

/// The Destination Options header of path `hops` in the period of `color` (0 or 1), in front
/// of a packet of next header `next`.
pub const fn mark_header(next: u8, hops: [u8; 2], color: u8) -> [u8; MARK_LEN] {
    let flow_mon_id = ((hops[0] as u32) << 8) | hops[1] as u32;
    let data = (flow_mon_id << 12) | (((color & 1) as u32) << 11);
    let d = data.to_be_bytes();
    [next, 0, ALT_MARK_OPTION, 4, d[0], d[1], d[2], d[3]]
}

/// A mark as [`mark_header`] writes it: the next header, the path's hop bytes and the color;
/// `None` for any other Destination Options header (the host leaves such a packet alone).
pub const fn read_mark(h: &[u8; MARK_LEN]) -> Option<(u8, [u8; 2], u8)> {
    if h[1] != 0 || h[2] != ALT_MARK_OPTION || h[3] != 4 || h[4] >> 4 != 0 {
        return None;
    }
    let data = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    let flow_mon_id = data >> 12;
    let hops = [(flow_mon_id >> 8) as u8, flow_mon_id as u8];
    Some((h[0], hops, ((data >> 11) & 1) as u8))
}

/// RFC 6040 (normal mode) at decapsulation: the inner ECN field after an outer one of `outer`.
/// Congestion marked on the outer header (CE) reaches an ECN-capable inner packet; a not-ECT
/// inner packet keeps its field (the egress would drop it instead: we leave that to the stack).
pub const fn decapsulated_ecn(outer: u8, inner: u8) -> u8 {
    const CE: u8 = 0b11;
    if outer & 0b11 == CE && inner & 0b11 != 0 {
        CE
    } else {
        inner & 0b11
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_the_block_then_the_usids_zero_filled() {
        assert_eq!(
            address(DEFAULT_BLOCK, &[0x0100, 0x0203, 0xE002]),
            [
                0xFC, 0xBB, 0xBB, 0x00, 0x01, 0x00, 0x02, 0x03, 0xE0, 0x02, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(
            address([0x20, 0x01, 0x0d, 0xb8], &[7])[..6],
            [0x20, 0x01, 0x0d, 0xb8, 0, 7]
        );
        assert_eq!(address(DEFAULT_BLOCK, &[1, 2, 3, 4, 5, 6, 7])[14..], [0, 6]);
    }

    #[test]
    fn the_outer_header_reads_back_with_a_standard_parser_of_the_fields() {
        let h = outer_header(
            1500,
            NEXTHDR_IPV4,
            0xB9,
            0x12345,
            &[1; 16],
            &address(DEFAULT_BLOCK, &[7]),
        );
        assert_eq!(h[0] >> 4, 6);
        assert_eq!(((h[0] & 0xF) << 4) | (h[1] >> 4), 0xB9);
        assert_eq!(
            u32::from_be_bytes([0, h[1] & 0xF, h[2], h[3]]),
            0x12345,
            "flow label"
        );
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), 1500);
        assert_eq!((h[6], h[7]), (4, 64));
        assert_eq!(h[8..24], [1; 16]);
        assert_eq!(h[24..30], [0xFC, 0xBB, 0xBB, 0x00, 0, 7]);
    }

    #[test]
    fn local_usids_cover_the_host_offsets_of_a_19_bit_prefix() {
        assert_eq!(host_lid(2), Some(0xE002));
        assert_eq!(host_lid(MAX_HOST_OFFSET), Some(0xFFFF));
        assert_eq!(host_lid(MAX_HOST_OFFSET + 1), None);
    }

    #[test]
    fn congestion_marked_outside_reaches_an_ecn_capable_packet_inside() {
        assert_eq!(decapsulated_ecn(0b11, 0b10), 0b11);
        assert_eq!(decapsulated_ecn(0b11, 0b01), 0b11);
        assert_eq!(decapsulated_ecn(0b11, 0b00), 0b00);
        assert_eq!(decapsulated_ecn(0b10, 0b01), 0b01);
    }

    #[test]
    fn a_mark_is_rfc_9343s_option_and_reads_back() {
        let h = mark_header(NEXTHDR_IPV4, [0x03, 0xA1], 1);
        // Next header, length 0 (8 bytes), option 0x12 of 4 bytes, FlowMonID 0x003A1, L set.
        assert_eq!(h, [4, 0, 0x12, 4, 0x00, 0x3A, 0x18, 0x00]);
        assert_eq!(read_mark(&h), Some((4, [0x03, 0xA1], 1)));
        assert_eq!(
            read_mark(&mark_header(NEXTHDR_IPV6, [0xFF, 0xFF], 0)),
            Some((41, [0xFF, 0xFF], 0))
        );
        // Any other Destination Options header is not ours.
        let mut other = h;
        other[2] = 0x1E;
        assert_eq!(read_mark(&other), None);
        let mut longer = h;
        longer[1] = 1;
        assert_eq!(read_mark(&longer), None);
    }

    #[test]
    fn a_flow_label_is_19_bits_and_never_says_detoured() {
        assert_eq!(flow_label(0xFFFF_FFFF), 0x7_FFFF);
        assert_eq!(flow_label(0x0001_0000), 1);
        assert_eq!(flow_label(0xFFFF_FFFF) & FLOW_LABEL_DETOURED, 0);
    }
}
