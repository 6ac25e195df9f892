//! `tc_stamp`'s work in parts, for `cargo xtask bench datapath`: each program does one part of
//! what `tc_stamp` does to a stamped packet, on the same maps (the bench loads them beside its
//! datapath, sharing its pins), so the bench can say where the time over the floor goes. One
//! part has two forms: the flow's round robin in the flow table (an LRU lookup), and in the
//! socket's own storage (`bpf_sk_storage_get`), where `tc_stamp` keeps it for the host's own
//! TCP connections. The agent never attaches them.

use aya_ebpf::{
    bindings::{BPF_SK_STORAGE_GET_F_CREATE, TC_ACT_UNSPEC},
    helpers::generated::bpf_sk_storage_get,
    macros::classifier,
    programs::TcContext,
};
use core::hint::black_box;
use sopa_common::{
    maps::{FlowState, lookup},
    wire::{ETH_HLEN, IPV4_BASE_LEN},
};

use crate::{
    CONFIG, FLOWS, LOOKUP, METER_COLOR, METER_CONFIG, START, meter::Meter, packet::Ipv4,
    tc_stamp::tc_ptr,
};

/// Lookups of an existing storage in `part_flow_sk_found` (the bench divides by it).
pub const FOUND: usize = 8;

/// The header fields every part starts from (what `tc_stamp` has parsed by then).
#[inline(always)]
fn parsed(ctx: &TcContext) -> Option<(Ipv4, [u8; 4])> {
    let header: *const [u8; IPV4_BASE_LEN] = tc_ptr(ctx, ETH_HLEN)?;
    // SAFETY: bounds checked by tc_ptr.
    let ip = Ipv4::parse(unsafe { &*header });
    let ports: *const [u8; 4] = tc_ptr(ctx, ETH_HLEN + IPV4_BASE_LEN)?;
    // SAFETY: as above.
    Some((ip, unsafe { *ports }))
}

/// The configuration `tc_stamp` reads from arrays for every packet: the mode and seed, the
/// first path, the fabric's cover (its mask twice) and the path table's lookup slot, the
/// meter's period and color.
#[classifier]
pub fn part_config(_ctx: TcContext) -> i32 {
    // Each value kept whole (an `Option` would leave bytes the verifier sees unwritten).
    black_box(CONFIG.get(0).map_or(0, |c| c.mode ^ c.hash_seed));
    black_box(START.get(0).copied().unwrap_or(0));
    for slot in [
        lookup::FABRIC_MASK,
        lookup::FABRIC,
        lookup::FABRIC_MASK,
        lookup::PATHS,
    ] {
        black_box(LOOKUP.get(black_box(slot)).copied().unwrap_or(0));
    }
    black_box(METER_CONFIG.get(0).map_or(0, |c| c.period_ns));
    black_box(METER_COLOR.get(0).copied().unwrap_or(0));
    TC_ACT_UNSPEC
}

/// The encoding and its addresses: a one-entry hash, so the agent can replace the value whole.
#[classifier]
pub fn part_encap(_ctx: TcContext) -> i32 {
    black_box(crate::encap().map_or(0, |e| e.encoding));
    TC_ACT_UNSPEC
}

/// The destination's path set, by exact match (the bench's racks are all /24s).
#[classifier]
pub fn part_paths(ctx: TcContext) -> i32 {
    if let Some((ip, _)) = parsed(&ctx) {
        let paths = crate::prefix::find(
            lookup::PATHS,
            &crate::PATHS_EXACT,
            crate::prefix::paths_trie,
            ip.daddr,
        );
        black_box(paths.map_or(0, |p| p.count));
    }
    TC_ACT_UNSPEC
}

/// The flow's round robin in the flow table (LRU hash), the flow's entry already there.
#[classifier]
pub fn part_flow_lru(ctx: TcContext) -> i32 {
    if let Some((ip, ports)) = parsed(&ctx)
        && let Some(state) = FLOWS.get_ptr_mut(&ip.flow_key(&ports))
    {
        // SAFETY: a pointer from a successful lookup, valid for this run.
        unsafe { (*state).next = (*state).next.wrapping_add(1) };
    }
    TC_ACT_UNSPEC
}

/// The flow's round robin in its socket's storage, `times` lookups (the first creates it: a
/// test run's socket is new each run).
#[inline(always)]
fn flow_sk(ctx: &TcContext, times: usize) {
    // SAFETY: reading a field of the context the kernel handed us.
    let sk = unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk };
    if sk.is_null() {
        return;
    }
    let map = core::ptr::from_ref(&crate::SOCKET_FLOWS).cast_mut().cast();
    for _ in 0..times {
        // SAFETY: the map is ours, `sk` the skb's socket, checked non-null.
        let state = unsafe {
            bpf_sk_storage_get(
                map,
                sk.cast(),
                core::ptr::null_mut(),
                u64::from(BPF_SK_STORAGE_GET_F_CREATE),
            )
        }
        .cast::<FlowState>();
        if !state.is_null() {
            // SAFETY: storage the helper returned, valid for this run.
            unsafe { (*state).next = (*state).next.wrapping_add(1) };
        }
    }
}

/// Socket storage, created for the run's new socket.
#[classifier]
pub fn part_flow_sk(ctx: TcContext) -> i32 {
    flow_sk(&ctx, 1);
    TC_ACT_UNSPEC
}

/// Socket storage, created and then found [`FOUND`] times: over `part_flow_sk`, [`FOUND`]
/// times what a flow's every later packet costs (the difference of two runs that allocate is
/// noisy; one lookup's share of several is not).
#[classifier]
pub fn part_flow_sk_found(ctx: TcContext) -> i32 {
    flow_sk(&ctx, 1 + FOUND);
    TC_ACT_UNSPEC
}

/// The path meter: its configuration read and the packet counted.
#[classifier]
pub fn part_meter(ctx: TcContext) -> i32 {
    if let Some((ip, _)) = parsed(&ctx)
        && let Some(m) = Meter::now()
    {
        black_box(m.sent(ip.daddr, [0, 1], 1, u64::from(ctx.len())));
    }
    TC_ACT_UNSPEC
}

/// The MTU check of a packet sent as it is, 4 bytes more.
#[classifier]
pub fn part_mtu(ctx: TcContext) -> i32 {
    black_box(crate::tc_stamp::fits_with(&ctx, 4));
    TC_ACT_UNSPEC
}

/// The counters of a stamped packet: its reason and its two hops.
#[classifier]
pub fn part_counts(_ctx: TcContext) -> i32 {
    crate::packet::count(&crate::STAMP_STATS, black_box(0), 1);
    crate::packet::count(&crate::HOP_STATS, black_box(0), 1);
    crate::packet::count(&crate::HOP_STATS, black_box(256 + 1), 1);
    TC_ACT_UNSPEC
}
