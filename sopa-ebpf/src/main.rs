//! SOPA's eBPF programs. This file holds only the maps and the entry points; each program's logic
//! lives in its own module. The programs fail open: whatever happens, the packet goes on
//! (TC_ACT_UNSPEC / XDP_PASS), unchanged unless it was completely rewritten, and the reason is
//! counted. The one exception is a packet that carries this fabric's option which `tc_stamp`
//! cannot replace: it is dropped, so no sender steers the fabric itself. On TC they are guests among other programs: TC_ACT_UNSPEC is TCX_NEXT, which runs
//! every program and legacy filter attached after ours, where TC_ACT_OK (TCX_PASS) would end
//! the chain with us.
#![no_std]
#![no_main]
// Atomic adds on map values (per-flow counters): see `tc_stamp::account`.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod baseline;
mod encoding;
mod host_config;
mod lossy;
mod meter;
mod packet;
mod parts;
mod prefix;
mod sockopt_guard;
mod tc_forward;
mod tc_stamp;
mod usid_repair;
mod usid_shift;
mod xdp_strip;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, TC_ACT_SHOT, TC_ACT_UNSPEC, xdp_action::XDP_PASS},
    btf_maps::SkStorage,
    macros::{btf_map, cgroup_sockopt, classifier, map, xdp},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::{SockoptContext, TcContext, XdpContext},
};
use sopa_common::maps::{
    Config, EV_CAPACITY, EvKey, FLOWS_CAPACITY, FWD_CAPACITY, FlowKey, FlowState, FwdEntry,
    HOP_STATS_LEN, HostConfig, MAX_UPLINKS, MeterKey, MeterPeer, MeterSent, PATHS_CAPACITY,
    PINS_CAPACITY, PathSet, Pin, REASON_SLOTS, REORDER_CAPACITY, ReorderState, SRV6_SEGS_CAPACITY,
    SegKey, Segments, Srv6Dest, TRUST_CAPACITY, UsidRepairConfig, UsidRule, UsidRuleKey,
};

// Names must equal the constants of `sopa_common::maps` (checked by the agent's loader tests).
#[map(name = "SOPA_CFG_V1")]
static CONFIG: Array<Config> = Array::pinned(1, 0);

#[map(name = "SOPA_START_V1")]
static START: Array<u32> = Array::pinned(1, 0);

#[map(name = "SOPA_PATHS_V1")]
static PATHS: LpmTrie<[u8; 4], PathSet> = LpmTrie::pinned(PATHS_CAPACITY, 0);

#[map(name = "SOPA_PATHX_V1")]
static PATHS_EXACT: HashMap<[u8; 4], PathSet> = HashMap::pinned(PATHS_CAPACITY, BPF_F_NO_PREALLOC);

// The agent's settings in two slots, and which one is current (`host_config`).
#[map(name = "SOPA_HOST_V1")]
static HOST: Array<HostConfig> = Array::pinned(2, 0);

#[map(name = "SOPA_HOSTI_V1")]
static HOST_INDEX: Array<u32> = Array::pinned(1, 0);

#[map(name = "SOPA_EV_V1")]
static EVS: HashMap<EvKey, u32> = HashMap::pinned(EV_CAPACITY, BPF_F_NO_PREALLOC);

#[map(name = "SOPA_SRV6D_V1")]
static SRV6_DESTS: LpmTrie<[u8; 4], Srv6Dest> = LpmTrie::pinned(PATHS_CAPACITY, 0);

#[map(name = "SOPA_SRV6DX_V1")]
static SRV6_DESTS_EXACT: HashMap<[u8; 4], Srv6Dest> =
    HashMap::pinned(PATHS_CAPACITY, BPF_F_NO_PREALLOC);

#[map(name = "SOPA_SRV6S_V1")]
static SRV6_SEGS: HashMap<SegKey, Segments> = HashMap::pinned(SRV6_SEGS_CAPACITY, 0);

// One LRU list for every CPU: with an LRU list per CPU (BPF_F_NO_COMMON_LRU) the kernel splits
// the capacity between the CPUs, and a sender whose flows start on one CPU could use only its
// share (measured: 34,016 of 65,536 entries on 2 CPUs).
#[map(name = "SOPA_FLOWS_V1")]
static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::pinned(FLOWS_CAPACITY, 0);

// In each socket of the host's own TCP connections (`tc_stamp::socket_state`): a BTF map, as
// the kernel requires of socket storage.
#[btf_map(name = "SOPA_FLOWSK_V1")]
static SOCKET_FLOWS: SkStorage<FlowState> = SkStorage::new();

#[map(name = "SOPA_PINS_V1")]
static PINS: HashMap<FlowKey, Pin> = HashMap::pinned(PINS_CAPACITY, 0);

#[map(name = "SOPA_STAMP_V2")]
static STAMP_STATS: PerCpuArray<u64> = PerCpuArray::pinned(REASON_SLOTS, 0);

#[map(name = "SOPA_HOPS_V1")]
static HOP_STATS: PerCpuArray<u64> = PerCpuArray::pinned(HOP_STATS_LEN, 0);

#[map(name = "SOPA_STRIP_V2")]
static STRIP_STATS: PerCpuArray<u64> = PerCpuArray::pinned(REASON_SLOTS, 0);

#[map(name = "SOPA_MEASURE_V1")]
static MEASURE: Array<u32> = Array::pinned(1, 0);

#[map(name = "SOPA_REORD_V1")]
static REORDER: LruHashMap<FlowKey, ReorderState> = LruHashMap::pinned(REORDER_CAPACITY, 0);

#[map(name = "SOPA_FWD_V1")]
static FORWARD: LpmTrie<[u8; 4], FwdEntry> = LpmTrie::pinned(FWD_CAPACITY, 0);

#[map(name = "SOPA_FWDST_V2")]
static FORWARD_STATS: PerCpuArray<u64> = PerCpuArray::pinned(REASON_SLOTS, 0);

#[map(name = "SOPA_TRUST_V1")]
static TRUST: HashMap<u32, u32> = HashMap::pinned(TRUST_CAPACITY, 0);

#[map(name = "SOPA_FWDUP_V1")]
static FORWARD_UPLINK_STATS: PerCpuArray<u64> = PerCpuArray::pinned(MAX_UPLINKS as u32, 0);

#[map(name = "SOPA_USIDC_V2")]
static USID_CONFIG: Array<UsidRepairConfig> = Array::pinned(1, 0);

#[map(name = "SOPA_USIDR_V1")]
static USID_RULES: HashMap<UsidRuleKey, UsidRule> =
    HashMap::pinned(sopa_common::maps::usid_repair::CAPACITY, 0);

#[map(name = "SOPA_COLOR_V1")]
static METER_COLOR: Array<u32> = Array::pinned(1, 0);

// One map per color and direction, per CPU, preallocated (`meter`).
#[map(name = "SOPA_SENT_C0_V1")]
static METER_SENT0: PerCpuHashMap<MeterKey, MeterSent> =
    PerCpuHashMap::pinned(sopa_common::maps::meter::CAPACITY, 0);

#[map(name = "SOPA_SENT_C1_V1")]
static METER_SENT1: PerCpuHashMap<MeterKey, MeterSent> =
    PerCpuHashMap::pinned(sopa_common::maps::meter::CAPACITY, 0);

#[map(name = "SOPA_RECV_C0_V1")]
static METER_RECEIVED0: PerCpuHashMap<MeterKey, u64> =
    PerCpuHashMap::pinned(sopa_common::maps::meter::CAPACITY, 0);

#[map(name = "SOPA_RECV_C1_V1")]
static METER_RECEIVED1: PerCpuHashMap<MeterKey, u64> =
    PerCpuHashMap::pinned(sopa_common::maps::meter::CAPACITY, 0);

#[map(name = "SOPA_METER_PEERS_V1")]
static METER_PEERS: HashMap<u32, MeterPeer> =
    HashMap::pinned(sopa_common::maps::meter::PEERS_CAPACITY, BPF_F_NO_PREALLOC);

#[map(name = "SOPA_GUARD_V1")]
static GUARD_STATS: PerCpuArray<u64> = PerCpuArray::pinned(sopa_common::maps::guard::SLOTS, 0);

/// Switch ingress: source-routed packets at their decision point go to the named uplink; an
/// option from a port the switch does not trust is neutralized; an SRv6 uSID list this switch
/// can no longer follow is rewritten around its dead port.
#[classifier]
pub fn tc_forward(ctx: TcContext) -> i32 {
    let (action, reason) = tc_forward::try_forward(&ctx);
    packet::count(&FORWARD_STATS, reason, 1);
    action
}

/// Host egress: give fabric-bound TCP/UDP packets their path, as the source-route option or as
/// an outer SRv6 header.
#[classifier]
pub fn tc_stamp(ctx: TcContext) -> i32 {
    let reason = match tc_stamp::try_stamp(&ctx) {
        Ok(reason) | Err(reason) => reason,
    };
    packet::count(&STAMP_STATS, reason, 1);
    if reason == sopa_common::maps::stamp_reason::FORGED_DROPPED {
        // Hop bytes a sender chose itself must not reach the switches.
        return TC_ACT_SHOT;
    }
    // Fail open: a packet we could not stamp still leaves, carried by kernel routing, after
    // the programs attached behind ours.
    TC_ACT_UNSPEC
}

/// Host ingress: remove our option or our outer SRv6 header before the stack sees the packet;
/// measure reordering.
#[xdp]
pub fn xdp_strip(ctx: XdpContext) -> u32 {
    let reason = match xdp_strip::try_strip(&ctx) {
        Ok(reason) | Err(reason) => reason,
    };
    packet::count(&STRIP_STATS, reason, 1);
    // Fail open: the receiving stack ignores an option it does not know.
    XDP_PASS
}

/// Host processes (a cgroup's): no socket option that sends around `tc_stamp`.
#[cgroup_sockopt(setsockopt)]
pub fn sockopt_guard(ctx: SockoptContext) -> i32 {
    let (verdict, reason) = sockopt_guard::check(&ctx);
    if reason != sopa_common::maps::guard::ALLOWED {
        packet::count(&GUARD_STATS, reason, 1);
    }
    verdict
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
