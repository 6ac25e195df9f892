//! The paper's encoding at the host: the 4-byte source-route option (type 0x9E, length 4,
//! hop0, hop1) inserted after the IPv4 base header (`sopa_common::wire` has the format), or
//! the hop bytes of an option the sender forged replaced with ours. `xdp_strip` removes it.

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_FIXED_GSO, bpf_adj_room_mode::BPF_ADJ_ROOM_NET,
        bpf_check_mtu_flags::BPF_MTU_CHK_SEGS, bpf_check_mtu_ret::BPF_MTU_CHK_RET_SEGS_TOOBIG,
    },
    helpers::bpf_check_mtu,
    programs::TcContext,
};
use aya_log_ebpf::warn;
use sopa_common::{
    maps::stamp_reason as reason,
    wire::{
        ETH_HLEN, IPV4_BASE_LEN, IPV4_STAMPED_LEN, OPTION_LEN, OPTION_TYPE, checksum_adjust, word,
    },
};

use crate::{
    meter::Meter,
    packet::{Ipv4, ptr_at},
    tc_stamp::{is_gso, tc_ptr},
};

/// The hop bytes as they travel: the path's, the first carrying the meter's color while the
/// meter runs.
#[inline(always)]
pub fn wire(hops: [u8; 2], meter: Option<Meter>) -> [u8; 2] {
    match meter {
        Some(m) => [m.mark(hops[0]), hops[1]],
        None => hops,
    }
}

/// Inserts the option with `hops` after the base header.
#[inline(always)]
pub fn stamp(ctx: &TcContext, ip: &Ipv4, [hop0, hop1]: [u8; 2]) -> Result<(), u32> {
    // FIXED_GSO keeps gso_size: otherwise the kernel shrinks it by 4 and a full segment no longer
    // divides the payload, so every re-segmentation point emits an extra 4-byte segment per
    // GSO packet (one per packet at gso_max_segs 1). The agent lowers the route MTU by 4 so that
    // segments of the unchanged size still fit.
    if let Err(err) = ctx.adjust_room(
        i32::from(OPTION_LEN),
        BPF_ADJ_ROOM_NET,
        u64::from(BPF_F_ADJ_ROOM_FIXED_GSO),
    ) {
        warn!(ctx, "tc_stamp: bpf_skb_adjust_room failed: {}", err);
        return Err(reason::ADJUST_FAILED);
    }
    if is_gso(ctx) && !segments_fit(ctx) {
        // Take the room back: the header in front of it is still the original one.
        if ctx
            .adjust_room(
                -i32::from(OPTION_LEN),
                BPF_ADJ_ROOM_NET,
                u64::from(BPF_F_ADJ_ROOM_FIXED_GSO),
            )
            .is_ok()
        {
            return Err(reason::TOO_BIG);
        }
        warn!(
            ctx,
            "tc_stamp: could not take back the room of a GSO packet too big to stamp"
        );
    }
    // The room sits right after the base header; rewrite the header around it.
    let header: *mut [u8; IPV4_BASE_LEN + OPTION_LEN as usize] =
        ptr_at(ctx.data(), ctx.data_end(), ETH_HLEN).ok_or(reason::ADJUST_FAILED)?;
    // SAFETY: bounds checked by ptr_at after the room was made.
    let h = unsafe { &mut *header };
    let tot_len = ip.tot_len.wrapping_add(u16::from(OPTION_LEN)).to_be_bytes();
    let old = word(h[0], h[1]) + word(h[2], h[3]);
    h[0] = 0x46;
    h[2] = tot_len[0];
    h[3] = tot_len[1];
    h[20] = OPTION_TYPE;
    h[21] = OPTION_LEN;
    h[22] = hop0;
    h[23] = hop1;
    // Adjusted for the words that changed or came (RFC 1624): a dozen instructions where a
    // recomputation reads the whole header.
    let new =
        word(h[0], h[1]) + word(h[2], h[3]) + word(OPTION_TYPE, OPTION_LEN) + word(hop0, hop1);
    let check = checksum_adjust(u16::from_be_bytes([h[10], h[11]]), old, new);
    [h[10], h[11]] = check.to_be_bytes();
    Ok(())
}

/// Replaces the hop bytes of an option the sender set itself with `hops`; the checksum is
/// adjusted, so a header that was wrong stays wrong.
#[inline(always)]
pub fn restamp(ctx: &TcContext, [hop0, hop1]: [u8; 2]) -> Result<(), u32> {
    let header: *mut [u8; IPV4_STAMPED_LEN] = tc_ptr(ctx, ETH_HLEN).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by tc_ptr.
    let h = unsafe { &mut *header };
    let old = word(h[22], h[23]);
    h[22] = hop0;
    h[23] = hop1;
    let check = checksum_adjust(u16::from_be_bytes([h[10], h[11]]), old, word(hop0, hop1));
    [h[10], h[11]] = check.to_be_bytes();
    Ok(())
}

/// Whether every segment of a stamped GSO packet fits the interface's MTU, measured by the
/// kernel (which knows the inner headers of a tunnelled packet, where `gso_size` alone does not
/// say how long a segment is).
#[inline(always)]
fn segments_fit(ctx: &TcContext) -> bool {
    let mut mtu: u32 = 0;
    // SAFETY: the helper reads the skb and writes the u32 it is given.
    let ret = unsafe {
        bpf_check_mtu(
            ctx.skb.skb.cast(),
            0,
            &mut mtu,
            0,
            u64::from(BPF_MTU_CHK_SEGS),
        )
    };
    ret != i64::from(BPF_MTU_CHK_RET_SEGS_TOOBIG)
}
