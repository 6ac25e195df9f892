//! IPv4 prefixes with host bits clear.

use std::{fmt, net::Ipv4Addr, str::FromStr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    pub addr: Ipv4Addr,
    pub len: u8,
}

/// The netmask of a prefix length, host order (0 for /0).
pub fn netmask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

pub fn mask(addr: Ipv4Addr, len: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(addr) & netmask(len))
}

/// The longest prefix holding every one of `prefixes` (0/0 for none).
pub fn cover<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> Prefix {
    let mut it = prefixes.into_iter();
    let Some(first) = it.next() else {
        return Prefix::of(Ipv4Addr::UNSPECIFIED, 0);
    };
    it.fold(Prefix::of(first.addr, first.len), |c, p| {
        let common = (u32::from(c.addr) ^ u32::from(p.addr)).leading_zeros() as u8;
        Prefix::of(c.addr, c.len.min(p.len).min(common))
    })
}

/// The length every one of `prefixes` has, where they all have one (and there is any) and it
/// is not 0.
pub fn one_length<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> Option<u8> {
    let mut lengths = prefixes.into_iter().map(|p| p.len);
    let len = lengths.next()?;
    if len == 0 || lengths.any(|l| l != len) {
        return None;
    }
    Some(len)
}

impl Prefix {
    /// The prefix of length `len` containing `addr`.
    pub fn of(addr: Ipv4Addr, len: u8) -> Self {
        Self {
            addr: mask(addr, len),
            len,
        }
    }

    pub fn contains(&self, other: &Prefix) -> bool {
        other.len >= self.len && mask(other.addr, self.len) == self.addr
    }

    pub fn contains_addr(&self, addr: Ipv4Addr) -> bool {
        mask(addr, self.len) == self.addr
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| format!("prefix {s:?} has no length; write it as A.B.C.D/N"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("prefix {s:?}: {addr:?} is not an IPv4 address"))?;
        let len: u8 =
            len.parse().ok().filter(|len| *len <= 32).ok_or_else(|| {
                format!("prefix {s:?}: length {len:?} is not a number from 0 to 32")
            })?;
        let network = mask(addr, len);
        if network != addr {
            return Err(format!(
                "prefix {s:?} has host bits set; did you mean {network}/{len}?"
            ));
        }
        Ok(Self { addr, len })
    }
}

impl serde::Serialize for Prefix {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    #[test]
    fn the_cover_is_the_longest_prefix_holding_them_all() {
        assert_eq!(cover([&p("10.3.1.0/24")]), p("10.3.1.0/24"));
        assert_eq!(
            cover([&p("10.3.1.0/24"), &p("10.3.2.0/24")]),
            p("10.3.0.0/22")
        );
        assert_eq!(
            cover([&p("10.0.0.0/24"), &p("10.47.23.0/24")]),
            p("10.0.0.0/10")
        );
        assert_eq!(
            cover([&p("10.3.0.0/16"), &p("10.3.9.0/24")]),
            p("10.3.0.0/16")
        );
        assert_eq!(
            cover([&p("10.0.0.0/8"), &p("192.168.0.0/16")]),
            p("0.0.0.0/0")
        );
        assert_eq!(cover(&[] as &[Prefix]), p("0.0.0.0/0"));
    }

    #[test]
    fn one_length_or_none() {
        assert_eq!(one_length([&p("10.3.1.0/24"), &p("10.3.2.0/24")]), Some(24));
        assert_eq!(one_length([&p("10.3.0.0/16"), &p("10.3.2.0/24")]), None);
        assert_eq!(one_length([&p("0.0.0.0/0")]), None);
        assert_eq!(one_length(&[] as &[Prefix]), None);
        assert_eq!(netmask(24), 0xffff_ff00);
        assert_eq!(netmask(32), u32::MAX);
        assert_eq!(netmask(0), 0);
    }
}
