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

#[cfg(test)]
mod tests {
    use super::*;

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
