//! IPv4 prefixes with host bits clear.

use std::{fmt, net::Ipv4Addr, str::FromStr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    pub addr: Ipv4Addr,
    pub len: u8,
}

pub fn mask(addr: Ipv4Addr, len: u8) -> Ipv4Addr {
    let m = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    Ipv4Addr::from(u32::from(addr) & m)
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
