//! The SOPA source-route option: four bytes directly after the 20-byte IPv4 base header.
//!
//! | byte | meaning |
//! |---|---|
//! | 0 | `0x9E`: copied = 1, class 0, number 30 (RFC 4727 experimental) |
//! | 1 | `4`: option length |
//! | 2 | hop0: uplink index at the first decision point |
//! | 3 | hop1: second decision, [`HOP_NONE`] when the path has only one |

/// Option type byte: copied flag set, class 0, number 30 (RFC 4727 experimental).
pub const OPTION_TYPE: u8 = 0x9E;
/// Option length byte (type, length, hop0, hop1).
pub const OPTION_LEN: u8 = 4;
/// hop1 of a path with a single decision point.
pub const HOP_NONE: u8 = 0xFF;

/// Ethernet header length.
pub const ETH_HLEN: usize = 14;
/// EtherType of IPv4, host order.
pub const ETH_P_IP: u16 = 0x0800;
/// IPv4 base header length (IHL 5).
pub const IPV4_BASE_LEN: usize = 20;
/// IPv4 header length with our option (IHL 6).
pub const IPV4_STAMPED_LEN: usize = IPV4_BASE_LEN + OPTION_LEN as usize;
/// Offset of the option in an Ethernet frame.
pub const OPTION_OFFSET: usize = ETH_HLEN + IPV4_BASE_LEN;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// The bytes of the option for one path.
pub const fn encode(hop0: u8, hop1: u8) -> [u8; 4] {
    [OPTION_TYPE, OPTION_LEN, hop0, hop1]
}

/// The RFC 1071 Internet checksum of an IPv4 header whose checksum field reads zero.
pub fn ipv4_header_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i + 1 < header.len() {
        sum += u32::from(u16::from_be_bytes([header[i], header[i + 1]]));
        i += 2;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// Folds a one's-complement sum of 16-bit words to 16 bits (end-around carry).
#[inline(always)]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum as u16
}

/// RFC 1624, eqn. 3: the header checksum `check` after header words that summed to `old`
/// (unfolded one's-complement sum) were replaced by words summing to `new` (removed words count
/// in `old` only, added ones in `new` only). Unlike recomputing, a checksum that was wrong in
/// transit stays wrong, so the next hop still discards the corrupted header.
#[inline(always)]
pub const fn checksum_adjust(check: u16, old: u32, new: u32) -> u16 {
    let sum = (!check) as u32 + (!fold(old)) as u32 + fold(new) as u32;
    !fold(sum)
}

/// A big-endian 16-bit word of a header, for [`checksum_adjust`] sums.
#[inline(always)]
pub const fn word(hi: u8, lo: u8) -> u32 {
    ((hi as u32) << 8) | lo as u32
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;

    /// A header with its checksum computed, the checksum field at bytes 10-11.
    fn with_checksum(mut h: Vec<u8>) -> Vec<u8> {
        h[10] = 0;
        h[11] = 0;
        let c = ipv4_header_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    fn check(h: &[u8]) -> u16 {
        u16::from_be_bytes([h[10], h[11]])
    }

    fn headers() -> impl Iterator<Item = Vec<u8>> {
        // A spread of headers, stamped (24 bytes), with every TTL and many IDs and lengths.
        (0u32..4096).map(|i| {
            let mut h = vec![
                0x46,
                (i % 7) as u8,
                0,
                0,
                0,
                0,
                0x40,
                0,
                0,
                6,
                0,
                0,
                10,
                1,
                0,
                2,
                10,
                2,
                0,
                2,
                0x9E,
                4,
                (i % 3) as u8,
                0xFF,
            ];
            h[2..4].copy_from_slice(&((24 + i * 13) as u16).to_be_bytes());
            h[4..6].copy_from_slice(&(i.wrapping_mul(40503) as u16).to_be_bytes());
            h[8] = (i % 256) as u8;
            with_checksum(h)
        })
    }

    #[test]
    fn adjusting_equals_recomputing_for_a_ttl_decrement_and_a_strip() {
        for h in headers() {
            // TTL - 1 (tc_forward).
            let mut t = h.clone();
            t[8] = t[8].wrapping_sub(1);
            let adjusted = checksum_adjust(check(&h), word(h[8], h[9]), word(t[8], t[9]));
            assert_eq!(adjusted, check(&with_checksum(t.clone())), "{h:02x?}");
            // The option removed, IHL and total length with it (xdp_strip).
            let mut s = h[..20].to_vec();
            s[0] = 0x45;
            let len = u16::from_be_bytes([h[2], h[3]]) - 4;
            s[2..4].copy_from_slice(&len.to_be_bytes());
            let old = word(h[0], h[1]) + word(h[2], h[3]) + word(h[20], h[21]) + word(h[22], h[23]);
            let new = word(s[0], s[1]) + word(s[2], s[3]);
            assert_eq!(
                checksum_adjust(check(&h), old, new),
                check(&with_checksum(s)),
                "{h:02x?}"
            );
        }
    }

    #[test]
    fn a_wrong_checksum_stays_wrong_by_the_same_amount() {
        for h in headers() {
            let mut bad = h.clone();
            bad[10] ^= 0x10; // corrupted in transit
            let mut t = bad.clone();
            t[8] = t[8].wrapping_sub(1);
            let adjusted = checksum_adjust(check(&bad), word(h[8], h[9]), word(t[8], t[9]));
            assert_ne!(adjusted, check(&with_checksum(t)), "{h:02x?}: repaired");
        }
    }

    #[test]
    fn option_bytes() {
        assert_eq!(encode(2, HOP_NONE), [0x9E, 4, 2, 0xFF]);
        // copied flag (bit 7) set, class 0 (bits 5-6), number 30 (bits 0-4).
        assert_eq!(OPTION_TYPE >> 7, 1);
        assert_eq!((OPTION_TYPE >> 5) & 0b11, 0);
        assert_eq!(OPTION_TYPE & 0x1F, 30);
    }

    #[test]
    fn checksum_of_known_header() {
        // Example header from RFC 1071 discussions: 45 00 00 73 00 00 40 00 40 11 [b8 61] c0 a8 00 01 c0 a8 00 c7
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_header_checksum(&header), 0xb861);
    }
}
