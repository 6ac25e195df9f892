//! The uN behaviour (End with the NEXT-C-SID flavour) in eBPF, for a switch whose kernel has no
//! `seg6local` (`CONFIG_IPV6_SEG6_LWTUNNEL` unset) or whose agent was told `--usid ebpf`: at TC
//! ingress, a packet whose active uSID is this switch's own has it consumed here, the rest of
//! the list shifted up one slot and zero-filled, and the kernel then routes the next uSID on its
//! ordinary IPv6 routes, decrementing the hop limit (or answering a hop limit of 1 with ICMP
//! time exceeded) as it does after its own End. What the kernel's End would leave alone is left
//! alone: another switch's uSID, a list naming a host of this rack next (the host's /64 route
//! is more specific than the locator), a packet outside the block.

use sopa_common::{
    maps::forward_reason as reason,
    srv6::{IPV6_HLEN, LIB_BASE, USID_SLOTS},
};

use crate::usid_repair::FIRST_USID;

/// IPv6's routing header (`IPPROTO_ROUTING`).
const NEXTHDR_ROUTING: u8 = 43;

/// Consumes `me` at the head of `h`'s uSID list: [`reason::USID_SHIFTED`] when it did,
/// [`reason::USID_LAST`] when `me` was all the list held (the caller drops the packet), `None`
/// when the list is not this switch's to consume.
#[inline(always)]
pub fn shift(h: &mut [u8; IPV6_HLEN], me: u16) -> Option<u32> {
    let at = |h: &[u8; IPV6_HLEN], i: usize| {
        u16::from_be_bytes([h[FIRST_USID + 2 * i], h[FIRST_USID + 2 * i + 1]])
    };
    if me == 0 || at(h, 0) != me {
        return None;
    }
    let next = at(h, 1);
    if next == 0 {
        // With a routing header after this one the kernel's End would go on to it: left to
        // the kernel. Without one, nothing is left to route to.
        if h[6] == NEXTHDR_ROUTING {
            return None;
        }
        return Some(reason::USID_LAST);
    }
    if next >= LIB_BASE {
        // A host of this rack: its receive address is routed as it is.
        return None;
    }
    for i in 0..USID_SLOTS - 1 {
        h[FIRST_USID + 2 * i] = h[FIRST_USID + 2 * i + 2];
        h[FIRST_USID + 2 * i + 1] = h[FIRST_USID + 2 * i + 3];
    }
    h[FIRST_USID + 2 * (USID_SLOTS - 1)] = 0;
    h[FIRST_USID + 2 * (USID_SLOTS - 1) + 1] = 0;
    Some(reason::USID_SHIFTED)
}
