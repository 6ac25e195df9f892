//! The entropy encoding at the host (`sopa_common::entropy` has the format), for fabrics of
//! switches that only hash: the chosen path travels as the entropy value (EV) the agent learned
//! takes it, in the flow label of an IPv6 packet, or of an outer IPv6 header around an IPv4 one.
//! At the destination `xdp_strip` removes the outer header, or zeroes the label, before GRO.

use aya_ebpf::{
    helpers::bpf_get_prandom_u32,
    programs::{TcContext, XdpContext},
};
use sopa_common::{
    entropy::{LABEL_MASK, NEXT_IPV4, PER_PACKET, relabel},
    maps::{Encap, EvKey, HostConfig, stamp_reason as stamp, strip_reason as strip},
    srv6::IPV6_HLEN,
    wire::{ETH_HLEN, IPPROTO_TCP, IPPROTO_UDP},
};

use super::outer::{self, Inner};
use crate::{
    EVS,
    packet::{Ipv4, ptr_at},
    tc_stamp::tc_ptr,
};

/// The flow label whose packets take path `hops` to `daddr` with next header `next` (a fresh
/// random one per packet where the agent put [`PER_PACKET`]).
#[inline(always)]
fn label(daddr: [u8; 4], next: u8, hops: [u8; 2]) -> Result<u32, u32> {
    let key = EvKey {
        daddr,
        next,
        _pad: 0,
        hops,
    };
    // SAFETY: a pointer from a successful lookup, read once.
    let value = EVS
        .get_ptr(&key)
        .map(|p| unsafe { core::ptr::read_volatile(p) })
        .ok_or(stamp::NO_LABEL)?;
    if value == PER_PACKET {
        // SAFETY: a helper without arguments.
        return Ok(unsafe { bpf_get_prandom_u32() } & LABEL_MASK);
    }
    Ok(value & LABEL_MASK)
}

/// Puts an outer IPv6 header around the IPv4 packet `ip`: from this host's IPv6 address to
/// the destination's (the fabric's /96 and `ip.daddr`), labelled with path `hops`' EV.
#[inline(always)]
pub fn encapsulate(ctx: &TcContext, ip: &Ipv4, encap: &Encap, hops: [u8; 2]) -> Result<(), u32> {
    if encap.fabric6 == [0; 12] {
        return Err(stamp::NOT_FABRIC);
    }
    let label = label(ip.daddr, NEXT_IPV4, hops)?;
    let mut dst = [0u8; 16];
    let mut i = 0;
    while i < 12 {
        dst[i] = encap.fabric6[i];
        i += 1;
    }
    dst[12] = ip.daddr[0];
    dst[13] = ip.daddr[1];
    dst[14] = ip.daddr[2];
    dst[15] = ip.daddr[3];
    outer::encapsulate(ctx, ip, &encap.source, &dst, label, hops, Inner::Ipv4, None)
}

/// Writes path `hops`' EV into the flow label of the IPv6 packet `ip` describes (by its
/// embedded IPv4 addresses), of next header `next`. Nothing else changes: no checksum covers
/// the label.
#[inline(always)]
pub fn relabel_ipv6(ctx: &TcContext, ip: &Ipv4, next: u8, hops: [u8; 2]) -> Result<(), u32> {
    let label = label(ip.daddr, next, hops)?;
    let first: *mut [u8; 4] = tc_ptr(ctx, ETH_HLEN).ok_or(stamp::TOO_SHORT)?;
    // SAFETY: bounds checked by tc_ptr.
    unsafe { *first = relabel(*first, label) };
    Ok(())
}

/// What the receiver did with an IPv6 frame of the encoding.
pub enum Arrival {
    /// The outer header was removed: this is inside.
    Decapsulated(Inner),
    /// An IPv6 packet's flow label was zeroed.
    Relabelled,
}

/// At the destination, before GRO (which merges only packets whose first words are equal): an
/// outer header sent to this host's address is removed; the flow label of a TCP or UDP packet
/// from the fabric is zeroed.
#[inline(always)]
pub fn receive(ctx: &XdpContext, host: &HostConfig) -> Result<Arrival, u32> {
    let encap = &host.encap;
    let head: *mut [u8; ETH_HLEN + IPV6_HLEN] =
        ptr_at(ctx.data(), ctx.data_end(), 0).ok_or(strip::NOT_IPV4)?;
    // SAFETY: bounds checked by ptr_at.
    let f = unsafe { &mut *head };
    let o = ETH_HLEN;
    let next = f[o + 6];
    if next != IPPROTO_TCP && next != IPPROTO_UDP {
        return outer::decapsulate(ctx, host, |_| strip::NOT_IPV4).map(Arrival::Decapsulated);
    }
    let mut fabric = encap.fabric6 != [0; 12];
    let mut i = 0;
    while i < 12 {
        fabric &= f[o + 8 + i] == encap.fabric6[i];
        i += 1;
    }
    if f[o] >> 4 != 6 || !fabric {
        return Err(strip::NOT_IPV4);
    }
    let first = relabel([f[o], f[o + 1], f[o + 2], f[o + 3]], 0);
    f[o + 1] = first[1];
    f[o + 2] = 0;
    f[o + 3] = 0;
    Ok(Arrival::Relabelled)
}
