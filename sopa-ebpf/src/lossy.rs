//! `tc_lossy`, the testbed's gray failure: a link that silently drops a share of what it
//! carries while its carrier stays up (the kernel here has no `sch_netem`, `cls_matchall` or
//! `act_gact` to do it). Attached by the testbed on one end of a link, TC egress; the agent
//! never loads or attaches it. Each IPv4 or IPv6 packet is dropped with probability
//! `rate / 1,000,000` (`bpf_get_prandom_u32`); everything else (ARP) passes, as a link with bit
//! errors mostly loses data, not the neighbour's answers. Its maps are not pinned: they live as
//! long as the testbed process that attached it.

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::bpf_get_prandom_u32,
    macros::{classifier, map},
    maps::{Array, PerCpuArray},
    programs::TcContext,
};
use sopa_common::{
    maps::lossy,
    wire::{ETH_HLEN, ETH_P_IP},
};

use crate::packet::{count, ptr_at};

const ETH_P_IPV6: u16 = 0x86DD;

// Names equal `lossy::RATE_MAP` and `lossy::STATS_MAP` (checked when the testbed opens them).

#[map(name = "SOPA_LOSSY_RATE")]
static RATE: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "SOPA_LOSSY_STATS")]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(lossy::SLOTS, 0);

#[classifier]
pub fn tc_lossy(ctx: TcContext) -> i32 {
    let Some(ether_type) = ptr_at::<[u8; 2]>(ctx.data(), ctx.data_end(), 12) else {
        return TC_ACT_UNSPEC;
    };
    // SAFETY: bounds checked by ptr_at.
    let ether_type = u16::from_be_bytes(unsafe { *ether_type });
    if ether_type != ETH_P_IP && ether_type != ETH_P_IPV6 || ctx.len() < ETH_HLEN as u32 {
        return TC_ACT_UNSPEC;
    }
    count(&STATS, lossy::SEEN, 1);
    let rate = RATE.get(0).copied().unwrap_or(0);
    // SAFETY: a helper without arguments.
    let draw = unsafe { bpf_get_prandom_u32() } % lossy::PER;
    if draw < rate {
        count(&STATS, lossy::DROPPED, 1);
        return TC_ACT_SHOT;
    }
    TC_ACT_UNSPEC
}
