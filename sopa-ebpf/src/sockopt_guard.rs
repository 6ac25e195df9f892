//! The host's guard against senders that bypass `tc_stamp` (a cgroup `setsockopt` program).
//! A switch honours the option from a host whose agent is live, and every packet the host's
//! stack sends passes `tc_stamp`, which replaces any option a sender set itself. Two socket
//! kinds send around TC egress, and need only `CAP_NET_RAW` (which container runtimes grant by
//! default): an `AF_PACKET` socket with `PACKET_QDISC_BYPASS` (`dev_direct_xmit`), and an
//! `AF_XDP` socket (its transmit ring). This program refuses the one option that turns the
//! first on, and every option of the second (none can be set up without `XDP_UMEM_REG`), to
//! every process of the cgroup it is attached to.

use aya_ebpf::programs::SockoptContext;
use sopa_common::maps::guard;

/// `SOL_PACKET` and `PACKET_QDISC_BYPASS` (linux/if_packet.h), `SOL_XDP` (linux/socket.h).
const SOL_PACKET: i32 = 263;
const PACKET_QDISC_BYPASS: i32 = 20;
const SOL_XDP: i32 = 283;

/// 1 lets the option be set, 0 refuses it (`EPERM`); the reason is counted.
#[inline(always)]
pub fn check(ctx: &SockoptContext) -> (i32, u32) {
    // SAFETY: the context the kernel passed, read through its pointer.
    let (level, optname) = unsafe { ((*ctx.sockopt).level, (*ctx.sockopt).optname) };
    if level == SOL_PACKET && optname == PACKET_QDISC_BYPASS {
        (0, guard::QDISC_BYPASS)
    } else if level == SOL_XDP {
        (0, guard::XDP_SOCKET)
    } else {
        (1, guard::ALLOWED)
    }
}
