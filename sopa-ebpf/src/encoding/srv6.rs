//! The SRv6 encoding at the host (`sopa_common::srv6` has the format): `tc_stamp` puts an outer
//! IPv6 header whose destination is the chosen path's uSID list in front of the packet,
//! `xdp_strip` removes it at the destination host before GRO (`super::outer` does both).

use aya_ebpf::{
    helpers::bpf_get_hash_recalc,
    programs::{TcContext, XdpContext},
};
use sopa_common::{
    maps::{
        HostConfig, MAX_CHOSEN, MAX_TAIL, SegKey, lookup, stamp_reason as stamp,
        strip_reason as strip,
    },
    srv6::{LIB_BASE, MAX_HOST_OFFSET, USID_SLOTS, flow_label},
};

use super::outer::{self, Inner};
use crate::{SRV6_SEGS, packet::Ipv4};

/// Shifts one 16-bit word into a 128-bit value held as two halves.
#[inline(always)]
fn push(acc: &mut (u64, u64), word: u16) {
    acc.0 = (acc.0 << 16) | (acc.1 >> 48);
    acc.1 = (acc.1 << 16) | u64::from(word);
}

/// The outer destination of path `hops` to `ip.daddr`: the fabric's block (that of the address
/// this host receives on), the chosen switches' uSIDs, the destination's tail, its local uSID.
#[inline(always)]
fn path_address(ip: &Ipv4, host: &HostConfig, hops: [u8; 2]) -> Result<[u8; 16], u32> {
    let dest = crate::prefix::find(
        host.lookup[lookup::SRV6_DESTS as usize],
        &crate::SRV6_DESTS_EXACT,
        crate::prefix::srv6_dests_trie,
        ip.daddr,
    )
    .ok_or(stamp::NO_SEGMENTS)?;
    let segs = SRV6_SEGS
        .get_ptr(&SegKey {
            group: dest.group,
            hops,
        })
        // SAFETY: a pointer from a successful lookup, read once (the agent replaces whole
        // values).
        .map(|p| unsafe { core::ptr::read_volatile(p) })
        .ok_or(stamp::NO_SEGMENTS)?;
    let offset = u32::from_be_bytes(ip.daddr) & dest.host_mask;
    let (chosen, tail) = (usize::from(segs.len), usize::from(dest.tail_len));
    if offset > MAX_HOST_OFFSET
        || chosen > MAX_CHOSEN
        || tail > MAX_TAIL
        || chosen + tail + 1 > USID_SLOTS
    {
        return Err(stamp::NO_SEGMENTS);
    }
    let mut acc = (0u64, 0u64);
    let block = &host.encap.receive;
    push(&mut acc, u16::from_be_bytes([block[0], block[1]]));
    push(&mut acc, u16::from_be_bytes([block[2], block[3]]));
    let mut words = 2;
    for i in 0..MAX_CHOSEN {
        if i < chosen {
            push(&mut acc, segs.usids[i]);
            words += 1;
        }
    }
    for i in 0..MAX_TAIL {
        if i < tail {
            push(&mut acc, dest.tail[i]);
            words += 1;
        }
    }
    push(&mut acc, LIB_BASE | offset as u16);
    words += 1;
    for _ in 0..8 {
        if words < 8 {
            push(&mut acc, 0);
            words += 1;
        }
    }
    let (hi, lo) = (acc.0.to_be_bytes(), acc.1.to_be_bytes());
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 8 {
        out[i] = hi[i];
        out[8 + i] = lo[i];
        i += 1;
    }
    Ok(out)
}

/// Puts the outer IPv6 header of path `hops` in front of the packet `ip` describes, with the
/// meter's mark of the period of `color` while the meter runs. The flow label is the inner
/// flow's hash, so receivers' NICs and IPv6 multipath routes keep a flow together.
#[inline(always)]
pub fn encapsulate(
    ctx: &TcContext,
    ip: &Ipv4,
    host: &HostConfig,
    hops: [u8; 2],
    inner: Inner,
    color: Option<u8>,
) -> Result<(), u32> {
    let dst = path_address(ip, host, hops)?;
    // The inner flow's hash (the socket's, for local TCP), read before the packet changes.
    // SAFETY: the helper reads and may set the skb's hash.
    let label = flow_label(unsafe { bpf_get_hash_recalc(ctx.skb.skb) });
    outer::encapsulate(ctx, ip, &host.encap.source, &dst, label, hops, inner, color)
}

/// Removes the outer header of a frame sent to this host's SRv6 address; one to another
/// address of the fabric's uSID block is counted foreign.
#[inline(always)]
pub fn decapsulate(ctx: &XdpContext, host: &HostConfig) -> Result<Inner, u32> {
    outer::decapsulate(ctx, host, |da| {
        let r = &host.encap.receive;
        let in_block = u32::from_ne_bytes([da[0], da[1], da[2], da[3]])
            == u32::from_ne_bytes([r[0], r[1], r[2], r[3]]);
        if in_block {
            strip::FOREIGN_SRV6
        } else {
            strip::NOT_IPV4
        }
    })
}
