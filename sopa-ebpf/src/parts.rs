//! `tc_stamp`'s work in parts, for `cargo xtask bench datapath`: each program does one part of
//! what `tc_stamp` does to a stamped packet, on the same maps (the bench loads them beside its
//! datapath, sharing its pins), so the bench can say where the time over the floor goes. Every
//! part first does what all of them build on ([`base`]: the headers parsed, the agent's
//! settings read), and the bench takes `part_base` off each, so no work is counted twice. The
//! flow's round robin has two forms: in the flow table (an LRU lookup), and in the socket's own
//! storage (`bpf_sk_storage_get`), where `tc_stamp` keeps it for the host's own TCP
//! connections. The agent never attaches these programs.

use aya_ebpf::{
    bindings::{BPF_SK_STORAGE_GET_F_CREATE, TC_ACT_UNSPEC},
    helpers::{bpf_sk_fullsock, generated::bpf_sk_storage_get},
    macros::classifier,
    programs::TcContext,
};
use core::hint::black_box;
use sopa_common::{
    maps::{FlowState, HostConfig, lookup},
    wire::{ETH_HLEN, IPV4_BASE_LEN},
};

use crate::{CONFIG, FLOWS, host_config::current, meter::Meter, packet::Ipv4, tc_stamp::tc_ptr};

/// Lookups of an existing storage in `part_flow_sk_found` (the bench divides by it).
pub const FOUND: usize = 8;

/// What every part builds on, as `tc_stamp` has it by then: the IPv4 header and the ports
/// parsed, the agent's settings read (one snapshot).
#[inline(always)]
fn base(ctx: &TcContext) -> Option<(Ipv4, [u8; 4], &'static HostConfig)> {
    let header: *const [u8; IPV4_BASE_LEN] = tc_ptr(ctx, ETH_HLEN)?;
    // SAFETY: bounds checked by tc_ptr.
    let ip = Ipv4::parse(unsafe { &*header });
    let ports: *const [u8; 4] = tc_ptr(ctx, ETH_HLEN + IPV4_BASE_LEN)?;
    // SAFETY: as above.
    let ports = unsafe { *ports };
    let host = current()?;
    // Kept whole: an `Option` would leave bytes the verifier sees unwritten.
    black_box(host.encap.encoding ^ host.lookup[lookup::FABRIC_MASK as usize]);
    Some((ip, ports, host))
}

/// The base alone.
#[classifier]
pub fn part_base(ctx: TcContext) -> i32 {
    black_box(base(&ctx).map_or(0, |(ip, _, _)| ip.proto));
    TC_ACT_UNSPEC
}

/// The mode and the hash seed (`CONFIG`, which the `mode` command writes, apart from the
/// agent's settings).
#[classifier]
pub fn part_config(ctx: TcContext) -> i32 {
    if base(&ctx).is_some() {
        black_box(CONFIG.get(0).map_or(0, |c| c.mode ^ c.hash_seed));
    }
    TC_ACT_UNSPEC
}

/// The destination's path set, by exact match (the bench's racks are all /24s).
#[classifier]
pub fn part_paths(ctx: TcContext) -> i32 {
    if let Some((ip, _, host)) = base(&ctx) {
        let paths = crate::prefix::find(
            host.lookup[lookup::PATHS as usize],
            &crate::PATHS_EXACT,
            crate::prefix::paths_trie,
            ip.daddr,
        );
        black_box(paths.map_or(0, |p| p.count));
    }
    TC_ACT_UNSPEC
}

/// The flow's round robin in the flow table (LRU hash), the flow's entry already there: its
/// key built, looked up, its position moved on.
#[classifier]
pub fn part_flow_lru(ctx: TcContext) -> i32 {
    if let Some((ip, ports, _)) = base(&ctx)
        && let Some(state) = FLOWS.get_ptr_mut(&ip.flow_key(&ports))
    {
        // SAFETY: a pointer from a successful lookup, valid for this run.
        unsafe { (*state).next = (*state).next.wrapping_add(1) };
    }
    TC_ACT_UNSPEC
}

/// The skb's socket, full, of a TCP connection: what `tc_stamp` checks of it, then `times`
/// storage lookups that create it first (a test run's socket is new each run), each moving the
/// position on. Type and protocol are read, not required: a test run's socket has neither.
#[inline(always)]
fn flow_sk(ctx: &TcContext, times: usize) {
    // SAFETY: reading a field of the context the kernel handed us.
    let sk = unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk };
    if sk.is_null() {
        return;
    }
    // SAFETY: a helper given the skb's socket, checked non-null.
    let full = unsafe { bpf_sk_fullsock(sk) };
    if full.is_null() {
        return;
    }
    // SAFETY: a full socket the helper returned.
    black_box(unsafe { (*full).type_ ^ (*full).protocol ^ (*full).state });
    let map = core::ptr::from_ref(&crate::SOCKET_FLOWS).cast_mut().cast();
    for _ in 0..times {
        // SAFETY: our map, a full socket.
        let state = unsafe {
            bpf_sk_storage_get(
                map,
                full.cast(),
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

/// The socket's checks alone.
#[classifier]
pub fn part_flow_sk_checks(ctx: TcContext) -> i32 {
    if base(&ctx).is_some() {
        flow_sk(&ctx, 0);
    }
    TC_ACT_UNSPEC
}

/// Socket storage, created for the run's new socket.
#[classifier]
pub fn part_flow_sk(ctx: TcContext) -> i32 {
    if base(&ctx).is_some() {
        flow_sk(&ctx, 1);
    }
    TC_ACT_UNSPEC
}

/// Socket storage, created and then found [`FOUND`] times: over `part_flow_sk`, [`FOUND`]
/// times what a connection's every later packet costs (the difference of two runs that
/// allocate is noisy; one lookup's share of several is not).
#[classifier]
pub fn part_flow_sk_found(ctx: TcContext) -> i32 {
    if base(&ctx).is_some() {
        flow_sk(&ctx, 1 + FOUND);
    }
    TC_ACT_UNSPEC
}

/// The path meter: its color read, the packet counted.
#[classifier]
pub fn part_meter(ctx: TcContext) -> i32 {
    if let Some((ip, _, host)) = base(&ctx)
        && let Some(m) = Meter::now(host)
    {
        black_box(m.sent(ip.daddr, [0, 1], 1, u64::from(ctx.len())));
    }
    TC_ACT_UNSPEC
}

/// The MTU check of a packet sent as it is, 4 bytes more.
#[classifier]
pub fn part_mtu(ctx: TcContext) -> i32 {
    if base(&ctx).is_some() {
        black_box(crate::tc_stamp::fits_with(&ctx, 4));
    }
    TC_ACT_UNSPEC
}

/// The counters of a stamped packet: its reason and its two hops.
#[classifier]
pub fn part_counts(ctx: TcContext) -> i32 {
    if base(&ctx).is_some() {
        crate::packet::count(&crate::STAMP_STATS, black_box(0), 1);
        crate::packet::count(&crate::HOP_STATS, black_box(0), 1);
        crate::packet::count(&crate::HOP_STATS, black_box(256 + 1), 1);
    }
    TC_ACT_UNSPEC
}
