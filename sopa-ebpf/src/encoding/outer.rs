//! The outer IPv6 header the SRv6 and entropy encodings put in front of a packet
//! (`sopa_common::srv6::outer_header`), and its removal at the destination host before GRO:
//! what the two share. Each encoding chooses the header's destination and flow label.

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV6, BPF_F_ADJ_ROOM_FIXED_GSO, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    },
    helpers::{bpf_check_mtu, bpf_xdp_adjust_head},
    programs::{TcContext, XdpContext},
};
use sopa_common::{
    maps::{HostConfig, stamp_reason as stamp, strip_reason as strip},
    srv6::{
        ETH_P_IPV6, IPV6_HLEN, MARK_LEN, NEXTHDR_DEST, NEXTHDR_IPV4, NEXTHDR_IPV6,
        decapsulated_ecn, mark_header, outer_header, read_mark,
    },
    wire::{ETH_HLEN, ETH_P_IP, IPPROTO_TCP, IPPROTO_UDP, IPV4_BASE_LEN, checksum_adjust, word},
};

use crate::{
    STRIP_STATS,
    meter::Meter,
    packet::{Ipv4, count, ptr_at},
    tc_stamp::{is_gso, tc_ptr},
};

/// What the outer header adds to a packet.
pub const OUTER_LEN: u16 = IPV6_HLEN as u16;

/// Whether every segment of a GSO packet still fits the interface's MTU with `extra` bytes of
/// outer headers on. Checked before encapsulating: room made for a tunnel header cannot be
/// taken back cleanly.
#[inline(always)]
fn gso_segments_fit(ctx: &TcContext, ip: &Ipv4, inner: &Inner, extra: u32) -> Result<bool, u32> {
    // Only IHL-5 IPv4 packets and IPv6 ones without extension headers are encapsulated.
    let l3 = match inner {
        Inner::Ipv4 => IPV4_BASE_LEN,
        Inner::Ipv6 => IPV6_HLEN,
    };
    let l4 = ETH_HLEN + l3;
    let l4_header = if ip.proto == IPPROTO_TCP {
        let offset: *const u8 = tc_ptr(ctx, l4 + 12).ok_or(stamp::TOO_SHORT)?;
        // SAFETY: bounds checked by tc_ptr.
        u32::from(unsafe { *offset } >> 4) * 4
    } else if ip.proto == IPPROTO_UDP {
        8
    } else {
        return Ok(false);
    };
    let mut mtu: u32 = 0;
    // SAFETY: the helper reads the skb and writes the u32 it is given (the device's MTU).
    unsafe { bpf_check_mtu(ctx.skb.skb.cast(), 0, &mut mtu, 0, 0) };
    // SAFETY: reading a field of the context the kernel handed us.
    let gso_size = u32::from(unsafe { (*ctx.skb.skb).gso_size });
    let segment = l3 as u32 + l4_header + gso_size + extra;
    Ok(mtu == 0 || segment <= mtu)
}

/// Puts an outer IPv6 header from `source` to `dst` with flow label `label` in front of the
/// packet `ip` describes (an IPv6 one by its embedded IPv4 addresses, its whole length and its
/// traffic class), and after it the meter's mark of path `hops` in the period of `color` while
/// the meter runs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn encapsulate(
    ctx: &TcContext,
    ip: &Ipv4,
    source: &[u8; 16],
    dst: &[u8; 16],
    label: u32,
    hops: [u8; 2],
    inner: Inner,
    color: Option<u8>,
) -> Result<(), u32> {
    let mark = if color.is_some() { MARK_LEN as u16 } else { 0 };
    if is_gso(ctx) && !gso_segments_fit(ctx, ip, &inner, u32::from(OUTER_LEN + mark))? {
        return Err(stamp::TOO_BIG);
    }
    // FIXED_GSO keeps gso_size, so a segment grows by exactly the outer header and the mark:
    // the fabric's MTU is 48 more than the hosts' (or the agent lowered the route MTUs by 48).
    ctx.adjust_room(
        i32::from(OUTER_LEN + mark),
        BPF_ADJ_ROOM_MAC,
        u64::from(BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_FIXED_GSO),
    )
    .map_err(|_| stamp::ADJUST_FAILED)?;
    // Both pointers before anything is written (a pull for the mark would void the header's),
    // so a packet never leaves with a header that announces a mark it lacks.
    let (head, at): (*mut [u8; ETH_HLEN + IPV6_HLEN], Option<*mut [u8; MARK_LEN]>) =
        if color.is_some() {
            tc_ptr::<[u8; MARK_LEN]>(ctx, ETH_HLEN + IPV6_HLEN).ok_or(stamp::ADJUST_FAILED)?;
            let (data, end) = (ctx.data(), ctx.data_end());
            (
                ptr_at(data, end, 0).ok_or(stamp::ADJUST_FAILED)?,
                Some(ptr_at(data, end, ETH_HLEN + IPV6_HLEN).ok_or(stamp::ADJUST_FAILED)?),
            )
        } else {
            (tc_ptr(ctx, 0).ok_or(stamp::ADJUST_FAILED)?, None)
        };
    // SAFETY: bounds checked by tc_ptr / ptr_at after the room was made.
    let h = unsafe { &mut *head };
    // The kernel switched the skb's protocol; the frame's EtherType is ours to write.
    [h[12], h[13]] = ETH_P_IPV6.to_be_bytes();
    let next = match inner {
        Inner::Ipv4 => NEXTHDR_IPV4,
        Inner::Ipv6 => NEXTHDR_IPV6,
    };
    let (outer_next, payload_len) = match color {
        Some(_) => (NEXTHDR_DEST, ip.tot_len.wrapping_add(mark)),
        None => (next, ip.tot_len),
    };
    let outer = outer_header(payload_len, outer_next, ip.tos, label, source, dst);
    let mut i = 0;
    while i < IPV6_HLEN {
        h[ETH_HLEN + i] = outer[i];
        i += 1;
    }
    if let (Some(color), Some(at)) = (color, at) {
        // SAFETY: bounds checked above, in the room made for it.
        unsafe { *at = mark_header(next, hops, color) };
    }
    Ok(())
}

/// What is inside an outer header.
pub enum Inner {
    Ipv4,
    Ipv6,
}

/// Removes the outer header of an IPv6 frame sent to `host.encap.receive`, this host's address of
/// the encoding. Anything else is left alone: `Err` says why, `foreign(destination)` for a
/// frame to another address.
#[inline(always)]
pub fn decapsulate(
    ctx: &XdpContext,
    host: &HostConfig,
    foreign: impl Fn(&[u8; 16]) -> u32,
) -> Result<Inner, u32> {
    let head: *mut [u8; ETH_HLEN + IPV6_HLEN] =
        ptr_at(ctx.data(), ctx.data_end(), 0).ok_or(strip::NOT_IPV4)?;
    // SAFETY: bounds checked by ptr_at.
    let f = unsafe { &mut *head };
    let o = ETH_HLEN;
    let mut da = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        da[i] = f[o + 24 + i];
        i += 1;
    }
    // One comparison of the whole address (a byte-by-byte one branches the verifier 16 times).
    let ours = u128::from_ne_bytes(da) == u128::from_ne_bytes(host.encap.receive);
    if !ours {
        return Err(foreign(&da));
    }
    if f[o] >> 4 != 6 {
        return Err(strip::FOREIGN_SRV6);
    }
    let outer_ecn = ((f[o] << 4) | (f[o + 1] >> 4)) & 0b11;
    // The meter's mark, when the sender's meter ran: the path and the period's color, counted
    // by the inner packet's source whether or not the strip below succeeds (as the option's).
    let (next, mark) = if f[o + 6] == NEXTHDR_DEST {
        let at: *const [u8; MARK_LEN] =
            ptr_at(ctx.data(), ctx.data_end(), ETH_HLEN + IPV6_HLEN).ok_or(strip::TOO_SHORT)?;
        // SAFETY: bounds checked by ptr_at.
        let Some((next, hops, color)) = read_mark(unsafe { &*at }) else {
            return Err(strip::FOREIGN_SRV6);
        };
        (next, Some((hops, color)))
    } else {
        (f[o + 6], None)
    };
    let (inner, ether_type) = match next {
        NEXTHDR_IPV4 => (Inner::Ipv4, ETH_P_IP),
        NEXTHDR_IPV6 => (Inner::Ipv6, ETH_P_IPV6),
        _ => return Err(strip::FOREIGN_SRV6),
    };
    if let Some((hops, color)) = mark {
        const L3: usize = ETH_HLEN + IPV6_HLEN + MARK_LEN;
        // The source's IPv4 address: its own, or the one an IPv6 source of the fabric embeds.
        let source = match inner {
            Inner::Ipv4 => ptr_at::<[u8; 4]>(ctx.data(), ctx.data_end(), L3 + 12),
            Inner::Ipv6 => ptr_at::<[u8; 4]>(ctx.data(), ctx.data_end(), L3 + 20),
        };
        let source = source.ok_or(strip::TOO_SHORT)?;
        // SAFETY: bounds checked by ptr_at.
        if let Err(why) = Meter::received(host, unsafe { *source }, hops, color, 1) {
            count(&STRIP_STATS, why, 1);
        }
        slide::<{ IPV6_HLEN + MARK_LEN }>(ctx, ether_type)?;
    } else {
        slide::<IPV6_HLEN>(ctx, ether_type)?;
    }
    propagate_ecn(ctx, &inner, outer_ecn);
    Ok(inner)
}

/// Removes the `SHIFT` bytes after the Ethernet header: its addresses and `ether_type` move in
/// front of what follows them. What they overwrite is kept until the head moved, so a failure
/// leaves the packet whole.
#[inline(always)]
fn slide<const SHIFT: usize>(ctx: &XdpContext, ether_type: u16) -> Result<(), u32> {
    let from: *const [u8; ETH_HLEN] =
        ptr_at(ctx.data(), ctx.data_end(), 0).ok_or(strip::TOO_SHORT)?;
    let to: *mut [u8; ETH_HLEN] =
        ptr_at(ctx.data(), ctx.data_end(), SHIFT).ok_or(strip::TOO_SHORT)?;
    // SAFETY: bounds checked by ptr_at; the two do not overlap (SHIFT is past the header).
    let (from, to) = unsafe { (&*from, &mut *to) };
    let saved = *to;
    let mut i = 0;
    while i < 12 {
        to[i] = from[i];
        i += 1;
    }
    [to[12], to[13]] = ether_type.to_be_bytes();
    // SAFETY: plain helper call on our context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, SHIFT as i32) } != 0 {
        // The head did not move, but the helper voided every packet pointer: fetch it again.
        if let Some(to) = ptr_at::<[u8; ETH_HLEN]>(ctx.data(), ctx.data_end(), SHIFT) {
            // SAFETY: bounds checked by ptr_at.
            unsafe { *to = saved };
        }
        return Err(strip::ADJUST_FAILED);
    }
    Ok(())
}

/// RFC 6040: congestion marked on the outer header is carried into the inner one.
#[inline(always)]
fn propagate_ecn(ctx: &XdpContext, inner: &Inner, outer_ecn: u8) {
    match inner {
        Inner::Ipv4 => {
            let Some(h) = ptr_at::<[u8; IPV4_BASE_LEN]>(ctx.data(), ctx.data_end(), ETH_HLEN)
            else {
                return;
            };
            // SAFETY: bounds checked by ptr_at.
            let h = unsafe { &mut *h };
            let ecn = decapsulated_ecn(outer_ecn, h[1] & 0b11);
            if ecn != h[1] & 0b11 {
                let old = word(h[0], h[1]);
                h[1] = (h[1] & !0b11) | ecn;
                let check =
                    checksum_adjust(u16::from_be_bytes([h[10], h[11]]), old, word(h[0], h[1]));
                [h[10], h[11]] = check.to_be_bytes();
            }
        }
        Inner::Ipv6 => {
            let Some(h) = ptr_at::<[u8; 2]>(ctx.data(), ctx.data_end(), ETH_HLEN) else {
                return;
            };
            // SAFETY: bounds checked by ptr_at.
            let h = unsafe { &mut *h };
            let inner = (h[1] >> 4) & 0b11;
            let ecn = decapsulated_ecn(outer_ecn, inner);
            h[1] = (h[1] & !0b0011_0000) | (ecn << 4);
        }
    }
}
