//! `tc_forward`'s SRv6 half: a packet of the fabric's uSID block whose next uSID this switch can
//! no longer reach (every port towards it dead) has its list rewritten by the rule the switch
//! agent wrote for it (`sopa_topology::srv6_failover`), then the kernel routes it as always
//! (its End consumes this switch's own uSID, or, on a kernel without `seg6local`,
//! `usid_shift` does here). With no port dead there is no rule, and a uSID packet costs one
//! array lookup. A detour marks the packet in its flow label; a marked packet
//! that needs a second detour is dropped, not bounced. The outer IPv6 header has no checksum
//! and the inner packet's is over its own addresses: nothing else changes.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use sopa_common::{
    maps::{UsidRuleKey, forward_reason as reason, usid_repair::MAX_WITH},
    srv6::{FLOW_LABEL_DETOURED, IPV6_HLEN, LIB_BASE, USID_SLOTS},
    wire::ETH_HLEN,
};

use crate::{USID_CONFIG, USID_RULES, packet::ptr_at};

/// Offset of the destination's first uSID in the IPv6 header (after the 32-bit block).
pub(crate) const FIRST_USID: usize = 28;
/// The detour mark's bit in the header's second byte (the flow label's top bit).
const DETOURED_BIT: u8 = (FLOW_LABEL_DETOURED >> 16) as u8;

#[inline(always)]
pub fn repair(ctx: &TcContext) -> Result<(i32, u32), u32> {
    if ctx.data() + ETH_HLEN + IPV6_HLEN > ctx.data_end() {
        let _ = ctx.pull_data((ETH_HLEN + IPV6_HLEN) as u32);
    }
    let header: *mut [u8; IPV6_HLEN] =
        ptr_at(ctx.data(), ctx.data_end(), ETH_HLEN).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by ptr_at.
    let h = unsafe { &mut *header };
    // Copied out: the agent may rewrite the entry meanwhile.
    let config = USID_CONFIG.get(0).copied().ok_or(reason::NOT_IPV4)?;
    let block = u32::from_ne_bytes(config.block);
    if h[0] >> 4 != 6 || block == 0 || u32::from_ne_bytes([h[24], h[25], h[26], h[27]]) != block {
        // Neither SRv6 of this fabric nor anything else this program knows.
        return Err(reason::NOT_IPV4);
    }
    let repaired = if config.rules == 0 {
        reason::USID_INTACT
    } else {
        match rewrite(h, config.me) {
            Ok(r) => r,
            Err(dropped) => return Ok((TC_ACT_SHOT as i32, dropped)),
        }
    };
    if config.shift == 0 {
        return Ok((TC_ACT_UNSPEC, repaired));
    }
    // uN in eBPF: the kernel routes on the next uSID once this switch's own is consumed here.
    match crate::usid_shift::shift(h, config.me) {
        Some(reason::USID_LAST) => Ok((TC_ACT_SHOT as i32, reason::USID_LAST)),
        // A repaired list counts as repaired (one reason per packet).
        Some(shifted) if repaired == reason::USID_INTACT => Ok((TC_ACT_UNSPEC, shifted)),
        _ => Ok((TC_ACT_UNSPEC, repaired)),
    }
}

/// The rule for `h`'s list, if there is one, applied to it: the reason it was rewritten, or
/// `Err` with the reason it must be dropped.
#[inline(always)]
fn rewrite(h: &mut [u8; IPV6_HLEN], me: u16) -> Result<u32, u32> {
    let mut s = [0u16; USID_SLOTS];
    let mut used = 0;
    for (i, slot) in s.iter_mut().enumerate() {
        *slot = u16::from_be_bytes([h[FIRST_USID + 2 * i], h[FIRST_USID + 2 * i + 1]]);
        if *slot != 0 {
            used = i + 1;
        }
    }
    // Before its End, this switch's own uSID leads the list.
    let p = usize::from(s[0] == me);
    let next = s[p];
    let after = s[p + 1];
    let key = UsidRuleKey {
        next,
        after: if after >= LIB_BASE { 0 } else { after },
    };
    // Copied out at once: the agent may replace the entry while this packet is being rewritten.
    let Some(rule) = USID_RULES
        .get_ptr(&key)
        // SAFETY: a volatile read of a whole value from a live map slot.
        .map(|p| unsafe { core::ptr::read_volatile(p) })
    else {
        return Ok(reason::USID_INTACT);
    };
    let detour = rule.detour != 0;
    if detour && h[1] & DETOURED_BIT != 0 {
        return Err(reason::USID_DETOUR_REFUSED);
    }
    let (replace, len) = (usize::from(rule.replace), usize::from(rule.len));
    if len > MAX_WITH || p + replace > used || used - replace + len > USID_SLOTS {
        return Err(reason::USID_NO_ROOM);
    }
    // out = s[..p] ++ with[..len] ++ s[p + replace..], in arrays of 16 read and written at
    // indexes masked to them (the checks above keep every index below 12, and the slots past
    // the list are zero): the verifier sees every access inside its array.
    let mut from = [0u16; 16];
    from[..USID_SLOTS].copy_from_slice(&s);
    let mut to = [0u16; 16];
    to[0] = s[0];
    for (i, w) in rule.with.iter().enumerate() {
        if i < len {
            to[(p + i) & 15] = *w;
        }
    }
    for t in 0..USID_SLOTS {
        to[(p + len + t) & 15] = from[(p + replace + t) & 15];
    }
    let mut out = [0u16; USID_SLOTS];
    out.copy_from_slice(&to[..USID_SLOTS]);
    for (i, o) in out.iter().enumerate() {
        let [a, b] = o.to_be_bytes();
        h[FIRST_USID + 2 * i] = a;
        h[FIRST_USID + 2 * i + 1] = b;
    }
    if detour {
        h[1] |= DETOURED_BIT;
        return Ok(reason::USID_DETOURED);
    }
    Ok(reason::USID_REPAIRED)
}
