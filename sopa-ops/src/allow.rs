//! Who may reach a process's HTTP endpoints: loopback always, and the networks an operator
//! lists (`--metrics-allow 10.0.0.0/8,2001:db8::/32`) when it binds them off loopback.

use std::{fmt, net::IpAddr, str::FromStr};

/// One network: an address and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    len: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CidrError {
    #[error("{0:?} is not an address or ADDRESS/LENGTH (e.g. 10.0.0.0/8, 2001:db8::/32)")]
    Syntax(String),
    #[error("{0:?}: the length is past the address's {1} bits")]
    Length(String, u8),
    #[error("{0:?} has bits set past its length: did you mean {1}?")]
    HostBits(String, Cidr),
}

impl Cidr {
    fn bits(ip: IpAddr) -> (u128, u8) {
        match ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    }

    fn mask(len: u8) -> u128 {
        if len == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(len))
        }
    }

    /// `ip` is in this network (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if ip.is_ipv4() != self.network.is_ipv4() {
            return false;
        }
        let (net, _) = Self::bits(self.network);
        let (addr, _) = Self::bits(ip);
        addr & Self::mask(self.len) == net
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let network: IpAddr = addr.parse().map_err(|_| CidrError::Syntax(s.to_owned()))?;
        let (bits, max) = Self::bits(network);
        let len = match len {
            Some(l) => l
                .parse::<u8>()
                .map_err(|_| CidrError::Syntax(s.to_owned()))?,
            None => max,
        };
        if len > max {
            return Err(CidrError::Length(s.to_owned(), max));
        }
        // An IPv4 address sits in the top 32 of the 128 bits: lengths count from the top.
        let cidr = Self { network, len };
        if bits & !Self::mask(len) != 0 {
            let masked = bits & Self::mask(len);
            let network = match network {
                IpAddr::V4(_) => IpAddr::from(((masked >> 96) as u32).to_be_bytes()),
                IpAddr::V6(_) => IpAddr::from(masked.to_be_bytes()),
            };
            return Err(CidrError::HostBits(s.to_owned(), Self { network, len }));
        }
        Ok(cidr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.len)
    }
}

/// The networks allowed besides loopback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowList {
    networks: Vec<Cidr>,
    /// Always, but in this crate's tests (whose clients can only be loopback).
    loopback: bool,
}

impl Default for AllowList {
    fn default() -> Self {
        Self {
            networks: Vec::new(),
            loopback: true,
        }
    }
}

impl AllowList {
    /// Loopback, or in one of the listed networks.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        (self.loopback && ip.is_loopback()) || self.networks.iter().any(|c| c.contains(ip))
    }

    /// No network beyond loopback.
    pub fn is_empty(&self) -> bool {
        self.networks.is_empty()
    }

    /// The same list without loopback, for tests whose clients can only be loopback.
    #[cfg(test)]
    pub(crate) fn without_loopback(mut self) -> Self {
        self.loopback = false;
        self
    }
}

impl FromStr for AllowList {
    type Err = CidrError;

    /// A comma-separated list; empty for none.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(|networks| Self {
                networks,
                loopback: true,
            })
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.networks.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        let list: AllowList = "10.0.0.0/8, 2001:db8::/32,192.0.2.7".parse().unwrap();
        assert!(list.allows(ip("10.200.3.4")));
        assert!(!list.allows(ip("11.0.0.1")));
        assert!(list.allows(ip("2001:db8:ffff::1")));
        assert!(!list.allows(ip("2001:db9::1")));
        assert!(list.allows(ip("192.0.2.7")));
        assert!(!list.allows(ip("192.0.2.8")));
        // A v4 client on a dual-stack socket arrives mapped.
        assert!(list.allows(ip("::ffff:10.1.2.3")));
        assert!(!list.allows(ip("::ffff:11.1.2.3")));
        // Loopback always; nothing else with an empty list.
        let none = AllowList::default();
        assert!(none.allows(ip("127.0.0.1")) && none.allows(ip("::1")));
        assert!(!none.allows(ip("10.0.0.1")));
        assert!(
            "0.0.0.0/0"
                .parse::<AllowList>()
                .unwrap()
                .allows(ip("203.0.113.9"))
        );
        assert!(
            !"0.0.0.0/0"
                .parse::<AllowList>()
                .unwrap()
                .allows(ip("2001:db8::1"))
        );
    }

    #[test]
    fn bad_networks_are_named() {
        assert_eq!(
            "10.0.0.1/8".parse::<Cidr>().unwrap_err().to_string(),
            "\"10.0.0.1/8\" has bits set past its length: did you mean 10.0.0.0/8?"
        );
        assert!(matches!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::Length(_, 32))
        ));
        assert!(matches!("ten/8".parse::<Cidr>(), Err(CidrError::Syntax(_))));
        assert_eq!(
            "2001:db8::/32".parse::<Cidr>().unwrap().to_string(),
            "2001:db8::/32"
        );
        assert_eq!(
            "10.0.0.0/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
    }
}
