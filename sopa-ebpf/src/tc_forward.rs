//! `tc_forward`, TC ingress on every port of a software switch: a packet carrying our option
//! whose destination makes this switch a decision point goes out of the uplink its hop byte
//! names (`bpf_redirect_neigh` to the next switch, TTL decremented); everything else is left to
//! the kernel, which routes by destination (and multipath-hashes packets without the option:
//! the ECMP baseline is Linux's own). Where the switch agent saw a port die, its decisions
//! already name live uplinks, and destinations it can no longer reach down have a detour entry
//! (`sopa_topology::failover`): out of another port, a hop byte rewritten, the packet marked so
//! it is detoured at most once (a second dead end, or one no detour gets around, drops it). In
//! the SRv6 encoding the same repair rewrites uSID lists instead (`usid_repair`). Only ports in the trust map may bring the option: on any
//! other (a host whose agent is not live, so its processes could choose hop bytes themselves)
//! the option's four bytes become NOPs and the kernel routes the packet, so neither this switch
//! nor any after it honours the sender's choice, and nothing is dropped.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC, bpf_redir_neigh},
    helpers::bpf_redirect_neigh,
    maps::lpm_trie::Key,
    programs::TcContext,
};
use sopa_common::{
    maps::{MAX_UPLINKS, forward_reason as reason, fwd_kind, meter},
    srv6::ETH_P_IPV6,
    wire::{
        ETH_HLEN, ETH_P_IP, IPV4_BASE_LEN, IPV4_STAMPED_LEN, OPTION_LEN, OPTION_TYPE,
        checksum_adjust, word,
    },
};

use crate::{
    FORWARD, FORWARD_UPLINK_STATS, TRUST,
    packet::{Ipv4, count, ptr_at},
};

const AF_INET: u32 = 2;

/// `Ok((verdict, reason))`: the TC action and why.
#[inline(always)]
pub fn try_forward(ctx: &TcContext) -> (i32, u32) {
    match decide(ctx) {
        Ok(v) => v,
        // Fail open: anything we cannot read is the kernel's to route, after whatever else
        // is attached to this port (TCX_NEXT; TC_ACT_OK would end the chain here).
        Err(r) => (TC_ACT_UNSPEC, r),
    }
}

#[inline(always)]
fn decide(ctx: &TcContext) -> Result<(i32, u32), u32> {
    if ctx.data() + ETH_HLEN + IPV4_STAMPED_LEN > ctx.data_end() {
        // Headers may sit in paged data: pull them in once (a short packet has no option).
        let _ = ctx.pull_data((ETH_HLEN + IPV4_STAMPED_LEN) as u32);
    }
    let ether_type: *const [u8; 2] =
        ptr_at(ctx.data(), ctx.data_end(), 12).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by ptr_at.
    match u16::from_be_bytes(unsafe { *ether_type }) {
        ETH_P_IP => {}
        ETH_P_IPV6 => return crate::usid_repair::repair(ctx),
        _ => return Err(reason::NOT_IPV4),
    }
    let base: *const [u8; IPV4_BASE_LEN] =
        ptr_at(ctx.data(), ctx.data_end(), ETH_HLEN).ok_or(reason::TOO_SHORT)?;
    let ip = Ipv4::parse(unsafe { &*base });
    if ip.version != 4 || ip.ihl < 5 {
        return Err(reason::BAD_HEADER);
    }
    if ip.ihl != 6 {
        return Err(reason::NO_OPTION);
    }
    let header: *mut [u8; IPV4_STAMPED_LEN] =
        ptr_at(ctx.data(), ctx.data_end(), ETH_HLEN).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by ptr_at.
    let h = unsafe { &mut *header };
    if h[20] != OPTION_TYPE || h[21] != OPTION_LEN {
        return Err(reason::NO_OPTION);
    }
    // SAFETY: the context is the live __sk_buff; at TC ingress `ifindex` is the receiving port.
    let port = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: a plain read of a u32 value.
    if unsafe { TRUST.get(&port) }.is_none() {
        neutralize(h);
        return Err(reason::UNTRUSTED);
    }
    let entry = FORWARD
        .get(Key::new(32, ip.daddr))
        .ok_or(reason::NOT_DECISION)?;
    if entry.kind == fwd_kind::UNREACHABLE {
        return Ok((TC_ACT_SHOT as i32, reason::UNREACHABLE));
    }
    let detour = entry.kind == fwd_kind::DETOUR;
    let (slot, done) = if detour {
        if h[22] & fwd_kind::DETOURED != 0 {
            return Ok((TC_ACT_SHOT as i32, reason::DETOUR_REFUSED));
        }
        (0, reason::DETOURED)
    } else {
        let hop = match entry.hop_byte {
            1 => h[22] & meter::HOP_MASK,
            2 => h[23],
            _ => return Err(reason::NOT_DECISION),
        };
        if hop >= entry.count || usize::from(hop) >= MAX_UPLINKS {
            return Ok((TC_ACT_SHOT as i32, reason::UNKNOWN_HOP));
        }
        (hop, reason::REDIRECTED)
    };
    if h[8] <= 1 {
        // The kernel drops it and tells the sender (ICMP time exceeded).
        return Err(reason::TTL_EXPIRED);
    }
    let uplink = entry.uplinks[usize::from(slot) & (MAX_UPLINKS - 1)];
    // TTL - 1 (and a detour's hop bytes), the checksum adjusted rather than recomputed: a
    // header corrupted on the way here stays detectably corrupted.
    let old = word(h[8], h[9]);
    h[8] -= 1;
    let mut check = checksum_adjust(u16::from_be_bytes([h[10], h[11]]), old, word(h[8], h[9]));
    if detour {
        let old = word(h[22], h[23]);
        match entry.hop_byte {
            // The period's color stays: the meter at the receiver counts the packet in it.
            1 => h[22] = entry.value | (h[22] & meter::COLOR),
            2 => h[23] = entry.value,
            _ => {}
        }
        h[22] |= fwd_kind::DETOURED;
        check = checksum_adjust(check, old, word(h[22], h[23]));
    }
    [h[10], h[11]] = check.to_be_bytes();
    let mut params = bpf_redir_neigh {
        nh_family: AF_INET,
        __bindgen_anon_1: aya_ebpf::bindings::bpf_redir_neigh__bindgen_ty_1 {
            ipv4_nh: uplink.nexthop,
        },
    };
    // SAFETY: a helper call with a live, correctly sized parameter block.
    let action = unsafe {
        bpf_redirect_neigh(
            uplink.ifindex,
            &mut params,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        )
    };
    if action as i64 == TC_ACT_SHOT as i64 {
        return Ok((TC_ACT_SHOT as i32, reason::REDIRECT_FAILED));
    }
    if !detour {
        count(&FORWARD_UPLINK_STATS, u32::from(slot), 1);
    }
    Ok((action as i32, done))
}

/// Overwrites the option with four NOPs (a valid option area the stack ignores; IHL unchanged),
/// the checksum adjusted for both words, so a header corrupted on the way stays corrupted.
#[inline(always)]
fn neutralize(h: &mut [u8; IPV4_STAMPED_LEN]) {
    const NOP: u8 = 1;
    let (first, second) = (word(h[20], h[21]), word(h[22], h[23]));
    [h[20], h[21], h[22], h[23]] = [NOP; 4];
    let check = u16::from_be_bytes([h[10], h[11]]);
    let check = checksum_adjust(check, first, word(NOP, NOP));
    let check = checksum_adjust(check, second, word(NOP, NOP));
    [h[10], h[11]] = check.to_be_bytes();
}
