//! Baselines for `cargo xtask bench datapath`: programs that do nothing, so the cost of
//! `tc_stamp` and `xdp_strip` is measured against the cost of running any program at all.
//! The agent never attaches them; the coexistence tests attach `tc_pass` as another tool's
//! program would be, behind and beside ours, and count its runs.

use aya_ebpf::{
    bindings::{TC_ACT_UNSPEC, xdp_action::XDP_PASS},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

#[classifier]
pub fn tc_pass(_ctx: TcContext) -> i32 {
    TC_ACT_UNSPEC
}

#[xdp]
pub fn xdp_pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

/// The floor of an encoding that inserts bytes: `bpf_skb_adjust_room` making the option's room
/// after the IPv4 header, and nothing else (the packet is left malformed; only test runs see it).
#[classifier]
pub fn tc_room(ctx: TcContext) -> i32 {
    let _ = ctx.adjust_room(
        i32::from(sopa_common::wire::OPTION_LEN),
        aya_ebpf::bindings::bpf_adj_room_mode::BPF_ADJ_ROOM_NET,
        u64::from(aya_ebpf::bindings::BPF_F_ADJ_ROOM_FIXED_GSO),
    );
    TC_ACT_UNSPEC
}

/// The floor of the SRv6 encoding: `bpf_skb_adjust_room` making room for an outer IPv6 header
/// and the path meter's mark before the packet, as `encoding::outer` does, and nothing else.
#[classifier]
pub fn tc_room6(ctx: TcContext) -> i32 {
    use aya_ebpf::bindings::{
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV6, BPF_F_ADJ_ROOM_FIXED_GSO, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    };
    let _ = ctx.adjust_room(
        (crate::encoding::outer::OUTER_LEN as usize + sopa_common::srv6::MARK_LEN) as i32,
        BPF_ADJ_ROOM_MAC,
        u64::from(BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_FIXED_GSO),
    );
    TC_ACT_UNSPEC
}

/// The floor of removing them at the receiver: `bpf_xdp_adjust_head` alone.
#[xdp]
pub fn xdp_head(ctx: XdpContext) -> u32 {
    // SAFETY: a plain helper call on our context.
    let _ = unsafe {
        aya_ebpf::helpers::bpf_xdp_adjust_head(ctx.ctx, i32::from(sopa_common::wire::OPTION_LEN))
    };
    XDP_PASS
}
