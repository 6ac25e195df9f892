//! The entropy encoding: for fabrics of switches that only hash. The host does not name the
//! path; it chooses the *entropy value* (EV) a switch's hash spreads the packet on, one EV per
//! distinct path, learned by probing (Paris traceroute: same addresses and next header, only
//! the EV and the hop limit change), and sends each flow's packets round robin over them.
//!
//! - IPv6 TCP/UDP to the fabric: the EV is the packet's flow label (20 bits), written in place.
//!   No byte is added, and no checksum changes (the label is not in the pseudo-header).
//! - IPv4: an outer IPv6 header (the one the SRv6 encoding builds, `crate::srv6::outer_header`)
//!   from this host's IPv6 address to the destination host's, next header 4, the EV its flow
//!   label. IPv6 ECMP's default hash policy (0) takes source, destination, next header and
//!   label, so every tier spreads on the EV.
//! - The receiver's XDP program removes the outer header, and zeroes an IPv6 packet's label,
//!   before GRO: GRO merges only packets whose first words are equal.
//!
//! The hash covers the destination address and the next header, so an EV's path is a property
//! of (destination host, next header, EV): the datapath looks an EV up by the destination (its
//! IPv4 address, or the one its fabric IPv6 address embeds), the next header the switches see
//! ([`NEXT_IPV4`] for encapsulated IPv4, 6 or 17 for IPv6) and the path chosen ([`EvKey`]).

/// The mark (`SO_MARK`) of a host's own probes: `tc_stamp` leaves them as the prober wrote
/// them (a probe of IPv6 TCP or UDP would otherwise get a path's label).
pub const PROBE_MARK: u32 = 0x534F_5041;

/// The flow label's bits.
pub const LABEL_MASK: u32 = 0xF_FFFF;
/// A label map value that is no label: `tc_stamp` draws a fresh random label for each packet
/// of that path (the `random` baseline: packet spraying over the switches' hash).
pub const PER_PACKET: u32 = u32::MAX;
/// Next header of the outer header of an encapsulated IPv4 packet (IP-in-IPv6).
pub const NEXT_IPV4: u8 = crate::srv6::NEXTHDR_IPV4;

/// The first 32-bit word of an IPv6 header (network order bytes) with its flow label replaced by
/// `label`: version and traffic class kept.
pub const fn relabel(first: [u8; 4], label: u32) -> [u8; 4] {
    let l = (label & LABEL_MASK).to_be_bytes();
    [first[0], (first[1] & 0xF0) | l[1], l[2], l[3]]
}

/// The flow label of an IPv6 header's first word.
pub const fn label_of(first: [u8; 4]) -> u32 {
    u32::from_be_bytes([0, first[1] & 0x0F, first[2], first[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_replaces_only_the_label() {
        let first = [0x6B, 0x9F, 0xFF, 0xFF];
        let out = relabel(first, 0x12345);
        assert_eq!(
            out,
            [0x6B, 0x91, 0x23, 0x45],
            "version 6, traffic class 0xB9 kept"
        );
        assert_eq!(label_of(out), 0x12345);
        assert_eq!(
            label_of(relabel(first, 0xFFF_FFFF)),
            LABEL_MASK,
            "cut to 20 bits"
        );
        assert_eq!(label_of(relabel(first, 0)), 0);
    }
}
