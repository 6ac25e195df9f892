//! How the chosen path travels, one module per encoding behind [`Encoding`]: `tc_stamp`
//! chooses the path and asks the host's encoding to carry it; `xdp_strip` asks it to undo that
//! before GRO. A new encoding is a module here and an arm in each method below.
//!
//! - [`option`]: the paper's IPv4 option, for SOPA's software switches (`tc_forward`).
//! - [`srv6`]: a uSID list in an outer IPv6 header, for SRv6 fabrics.
//! - [`entropy`]: the flow label a hashing switch spreads on, for fabrics that only hash.
//! - [`outer`]: the outer IPv6 header the last two share.

pub mod entropy;
pub mod option;
pub mod outer;
pub mod srv6;

use aya_ebpf::programs::TcContext;
use sopa_common::{
    maps::{Encap, HostConfig, encoding, stamp_reason as stamp},
    srv6::MARK_LEN,
    wire::OPTION_LEN,
};

use crate::{meter::Meter, packet::Ipv4};
use outer::{Inner, OUTER_LEN};

/// The host's encoding, with the host's settings (its addresses, its lookups) where it needs
/// them.
#[derive(Clone, Copy)]
pub enum Encoding {
    Option,
    Srv6(&'static HostConfig),
    Entropy(&'static HostConfig),
}

impl Encoding {
    /// What the agent set (the option where it set nothing).
    #[inline(always)]
    pub fn of(host: &'static HostConfig) -> Self {
        match host.encap.encoding {
            encoding::SRV6 => Self::Srv6(host),
            encoding::ENTROPY => Self::Entropy(host),
            _ => Self::Option,
        }
    }

    /// The addresses of an encoding that carries IPv6 (the option does not).
    #[inline(always)]
    pub fn ipv6(self) -> Option<&'static Encap> {
        match self {
            Self::Option => None,
            Self::Srv6(h) | Self::Entropy(h) => Some(&h.encap),
        }
    }

    /// Whether the path meter can count this encoding's packets at both ends: the entropy
    /// encoding has no room for its mark (any byte a switch hashes would move the packet).
    #[inline(always)]
    pub fn metered(self) -> bool {
        !matches!(self, Self::Entropy(_))
    }

    /// What carrying a path adds to an IPv4 packet, with the meter's mark or without it.
    #[inline(always)]
    pub fn extra_ipv4(self, marked: bool) -> u16 {
        match self {
            Self::Option => OPTION_LEN.into(),
            Self::Srv6(_) => outer_len(marked),
            Self::Entropy(_) => OUTER_LEN,
        }
    }

    /// What carrying a path adds to an IPv6 packet.
    #[inline(always)]
    pub fn extra_ipv6(self, marked: bool) -> u16 {
        match self {
            Self::Srv6(_) => outer_len(marked),
            Self::Option | Self::Entropy(_) => 0,
        }
    }

    /// Carries path `hops` on the IPv4 packet `ip` (the meter's mark on it while `meter` runs).
    #[inline(always)]
    pub fn carry_ipv4(
        self,
        ctx: &TcContext,
        ip: &Ipv4,
        hops: [u8; 2],
        meter: Option<Meter>,
    ) -> Result<(), u32> {
        match self {
            Self::Option => option::stamp(ctx, ip, option::wire(hops, meter)),
            Self::Srv6(h) => {
                srv6::encapsulate(ctx, ip, h, hops, Inner::Ipv4, meter.map(|m| m.color))
            }
            Self::Entropy(h) => entropy::encapsulate(ctx, ip, &h.encap, hops),
        }
    }

    /// Carries path `hops` on an IPv6 packet of next header `next` (`ip` describes it by the
    /// IPv4 addresses it embeds).
    #[inline(always)]
    pub fn carry_ipv6(
        self,
        ctx: &TcContext,
        ip: &Ipv4,
        next: u8,
        hops: [u8; 2],
        meter: Option<Meter>,
    ) -> Result<(), u32> {
        match self {
            Self::Option => Err(stamp::NOT_IPV4),
            Self::Srv6(h) => {
                srv6::encapsulate(ctx, ip, h, hops, Inner::Ipv6, meter.map(|m| m.color))
            }
            Self::Entropy(_) => entropy::relabel_ipv6(ctx, ip, next, hops),
        }
    }
}

/// What an outer header adds, with the meter's mark or without it.
#[inline(always)]
fn outer_len(marked: bool) -> u16 {
    if marked {
        OUTER_LEN + MARK_LEN as u16
    } else {
        OUTER_LEN
    }
}
