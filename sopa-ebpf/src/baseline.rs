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
