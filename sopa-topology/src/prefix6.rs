//! IPv6 prefixes with host bits clear, as an inventory names a rack's or a link's.

use std::{fmt, net::Ipv6Addr, str::FromStr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix6 {
    pub addr: Ipv6Addr,
    pub len: u8,
}

/// The netmask of a prefix length (0 for /0).
pub fn netmask6(len: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(len.min(128)))
        .unwrap_or(0)
}

impl Prefix6 {
    /// The prefix of length `len` containing `addr`.
    pub fn of(addr: Ipv6Addr, len: u8) -> Self {
        Self {
            addr: Ipv6Addr::from(u128::from(addr) & netmask6(len)),
            len,
        }
    }

    pub fn contains_addr(&self, addr: Ipv6Addr) -> bool {
        u128::from(addr) & netmask6(self.len) == u128::from(self.addr)
    }

    /// Whether the two prefixes share an address.
    pub fn overlaps(&self, other: &Prefix6) -> bool {
        let len = self.len.min(other.len);
        Self::of(self.addr, len) == Self::of(other.addr, len)
    }

    /// The address `offset` past the prefix's first.
    pub fn nth(&self, offset: u128) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.addr).wrapping_add(offset))
    }
}

impl fmt::Display for Prefix6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix6 {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| format!("prefix {s:?} has no length; write it as X:Y::/N"))?;
        let addr: Ipv6Addr = addr
            .parse()
            .map_err(|_| format!("prefix {s:?}: {addr:?} is not an IPv6 address"))?;
        let len: u8 =
            len.parse().ok().filter(|len| *len <= 128).ok_or_else(|| {
                format!("prefix {s:?}: length {len:?} is not a number from 0 to 128")
            })?;
        let network = Self::of(addr, len);
        if network.addr != addr {
            return Err(format!(
                "prefix {s:?} has host bits set; did you mean {network}?"
            ));
        }
        Ok(network)
    }
}

impl serde::Serialize for Prefix6 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Prefix6 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks_and_overlaps() {
        let p: Prefix6 = "2001:db8:0:1::/64".parse().unwrap();
        assert!(p.contains_addr("2001:db8:0:1::7".parse().unwrap()));
        assert!(!p.contains_addr("2001:db8:0:2::7".parse().unwrap()));
        assert!(p.overlaps(&"2001:db8::/32".parse().unwrap()));
        assert!(!p.overlaps(&"2001:db8:0:2::/64".parse().unwrap()));
        let e = "2001:db8::1/64".parse::<Prefix6>().unwrap_err();
        assert!(e.contains("did you mean 2001:db8::/64"), "{e}");
        assert!("2001:db8::/129".parse::<Prefix6>().is_err());
        assert_eq!(netmask6(0), 0);
        assert_eq!(netmask6(128), u128::MAX);
    }
}
