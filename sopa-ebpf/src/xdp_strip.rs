//! `xdp_strip`, XDP on the host's fabric interface: remove our source-route option before the
//! stack (and GRO, which never merges packets carrying options) sees it, or the outer IPv6
//! header of a packet sent to this host (SRv6, entropy), or the entropy encoding's flow label
//! (`crate::encoding`), and measure reordering.
//!
//! Only our own option is removed: IHL 6 whose option is type 0x9E, length 4. A foreign option,
//! or ours with a length that does not match, is left alone and counted.

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use sopa_common::{
    maps::{ReorderState, encoding, measure, meter, strip_reason as reason},
    srv6::ETH_P_IPV6,
    wire::{
        ETH_HLEN, ETH_P_IP, IPPROTO_TCP, IPV4_BASE_LEN, IPV4_STAMPED_LEN, OPTION_LEN,
        OPTION_OFFSET, OPTION_TYPE, checksum_adjust, word,
    },
};

use crate::{
    REORDER, STRIP_STATS,
    encoding::{
        Encoding,
        entropy::{self, Arrival},
        outer::Inner,
        srv6,
    },
    meter::Meter,
    packet::{Ipv4, count, ptr_at},
};

const STAMPED_FRAME_HEAD: usize = ETH_HLEN + IPV4_STAMPED_LEN;

/// `Ok(STRIPPED | NO_OPTION)` or the reason the packet was left alone.
#[inline(always)]
pub fn try_strip(ctx: &XdpContext) -> Result<u32, u32> {
    let ether_type: *const [u8; 2] =
        ptr_at(ctx.data(), ctx.data_end(), 12).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by ptr_at.
    let ether_type = u16::from_be_bytes(unsafe { *ether_type });
    // Never missing in practice: the maps are the datapath's own.
    let host = crate::host_config::current().ok_or(reason::NOT_IPV4)?;
    if ether_type == ETH_P_IPV6 {
        let inner = match Encoding::of(host) {
            Encoding::Srv6(h) => srv6::decapsulate(ctx, h)?,
            Encoding::Entropy(h) => match entropy::receive(ctx, h)? {
                Arrival::Decapsulated(inner) => inner,
                Arrival::Relabelled => return Ok(reason::LABEL_CLEARED),
            },
            Encoding::Option => return Err(reason::NOT_IPV4),
        };
        if let Inner::Ipv4 = inner {
            let header: *const [u8; IPV4_BASE_LEN] =
                ptr_at(ctx.data(), ctx.data_end(), ETH_HLEN).ok_or(reason::DECAPSULATED)?;
            let ip = Ipv4::parse(unsafe { &*header });
            if ip.version == 4 && ip.ihl == 5 {
                measure_reordering(ctx, &ip);
            }
        }
        return Ok(reason::DECAPSULATED);
    }
    if ether_type != ETH_P_IP {
        return Err(reason::NOT_IPV4);
    }
    let header: *const [u8; IPV4_BASE_LEN] =
        ptr_at(ctx.data(), ctx.data_end(), ETH_HLEN).ok_or(reason::TOO_SHORT)?;
    let ip = Ipv4::parse(unsafe { &*header });
    if ip.version != 4 || ip.ihl < 5 {
        return Err(reason::BAD_HEADER);
    }
    if ip.ihl == 5 {
        measure_reordering(ctx, &ip);
        return Ok(reason::NO_OPTION);
    }
    let option: *const [u8; 2] =
        ptr_at(ctx.data(), ctx.data_end(), OPTION_OFFSET).ok_or(reason::TOO_SHORT)?;
    let [kind, len] = unsafe { *option };
    if kind != OPTION_TYPE {
        return Err(reason::FOREIGN_OPTION);
    }
    if len != OPTION_LEN || ip.ihl != 6 {
        return Err(reason::BAD_LENGTH);
    }

    // In 16-bit words, which take a third of the instructions of byte moves: the frame starts
    // 2-aligned wherever XDP runs (drivers and generic XDP give it an even headroom, and where
    // alignment is strict the verifier checks these accesses against NET_IP_ALIGN).
    let head: *mut [u16; STAMPED_FRAME_HEAD / 2] =
        ptr_at(ctx.data(), ctx.data_end(), 0).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by ptr_at.
    let w = unsafe { &mut *head };
    // Word indices: Ethernet 0..7, the base header E..E+10, the option E+10..E+12.
    const E: usize = ETH_HLEN / 2;
    // The path meter counts it by the path and color it carries, whether or not the strip below
    // succeeds (the packet is delivered either way); only where hosts carry the path in the
    // option (in an SRv6 fabric, no host of the fabric sends one).
    let [hop0, hop1] = w[E + 11].to_ne_bytes();
    let color = u8::from(hop0 & meter::COLOR != 0);
    let counted = if host.encap.encoding == encoding::IPV4_OPTION {
        Meter::received(host, ip.saddr, [hop0, hop1], color, 1)
    } else {
        Err(reason::METER_FOREIGN)
    };
    if let Err(why) = counted {
        count(&STRIP_STATS, why, 1);
    }
    // The base header's first two words for its new length.
    let w0 = u16::from_ne_bytes([0x45, ip.tos]);
    let w1 = ip.tot_len.wrapping_sub(u16::from(OPTION_LEN)).to_be();
    // The checksum adjusted for the words that changed or went (RFC 1624), not recomputed: a
    // header corrupted in transit stays corrupted, and the stack still drops it.
    let be = |x: u16| u32::from(u16::from_be(x));
    let old = be(w[E]) + be(w[E + 1]) + be(w[E + 10]) + be(w[E + 11]);
    let check = checksum_adjust(u16::from_be(w[E + 5]), old, be(w0) + be(w1)).to_be();
    // Slide the base header, then Ethernet, over the option (highest word first: every word
    // is read before it is overwritten), and drop the 4 bytes now in front.
    const SHIFT: usize = OPTION_LEN as usize / 2;
    let mut i = IPV4_BASE_LEN / 2;
    while i > 0 {
        i -= 1;
        w[E + SHIFT + i] = match i {
            0 => w0,
            1 => w1,
            5 => check,
            _ => w[E + i],
        };
    }
    let mut i = E;
    while i > 0 {
        i -= 1;
        w[SHIFT + i] = w[i];
    }
    // SAFETY: plain helper call on our context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, i32::from(OPTION_LEN)) } != 0 {
        // The frame is already shifted; put the option back so the packet stays whole.
        restore(ctx, &ip);
        return Err(reason::ADJUST_FAILED);
    }
    let stripped = Ipv4 {
        ihl: 5,
        tot_len: ip.tot_len.wrapping_sub(u16::from(OPTION_LEN)),
        ..ip
    };
    measure_reordering(ctx, &stripped);
    Ok(reason::STRIPPED)
}

/// Undo the shift of a failed strip (the head could not move, so the bytes are all still there).
#[inline(always)]
fn restore(ctx: &XdpContext, ip: &Ipv4) {
    let Some(head) = ptr_at::<[u8; STAMPED_FRAME_HEAD]>(ctx.data(), ctx.data_end(), 0) else {
        return;
    };
    // SAFETY: bounds checked by ptr_at.
    let frame = unsafe { &mut *head };
    let shift = OPTION_LEN as usize;
    let mut i = 0;
    while i < ETH_HLEN {
        frame[i] = frame[shift + i];
        i += 1;
    }
    let mut h = [0u8; IPV4_STAMPED_LEN];
    let mut i = 0;
    while i < IPV4_BASE_LEN {
        h[i] = frame[ETH_HLEN + shift + i];
        i += 1;
    }
    let tot_len = ip.tot_len.to_be_bytes();
    // The base header as stripped (IHL 5, shorter), whose checksum was adjusted for that.
    let stripped = word(h[0], h[1]) + word(h[2], h[3]);
    h[0] = 0x46;
    h[2] = tot_len[0];
    h[3] = tot_len[1];
    h[20] = OPTION_TYPE;
    h[21] = OPTION_LEN;
    // The hop bytes were overwritten by the shift; they matter to nobody downstream.
    h[22] = 0;
    h[23] = 0;
    // Adjusted back, not recomputed: a header corrupted in transit stays corrupted here too.
    let restored = word(h[0], h[1]) + word(h[2], h[3]) + word(h[20], h[21]) + word(h[22], h[23]);
    let check = checksum_adjust(u16::from_be_bytes([h[10], h[11]]), stripped, restored);
    [h[10], h[11]] = check.to_be_bytes();
    let mut i = 0;
    while i < IPV4_STAMPED_LEN {
        frame[ETH_HLEN + i] = h[i];
        i += 1;
    }
}

/// Counts a TCP data packet, and whether it arrived below the highest sequence seen in its flow;
/// only while the agent has reordering measured (`measure::REORDERING`).
#[inline(always)]
fn measure_reordering(ctx: &XdpContext, ip: &Ipv4) {
    if crate::MEASURE
        .get(0)
        .is_none_or(|m| m & measure::REORDERING == 0)
    {
        return;
    }
    if ip.proto != IPPROTO_TCP || ip.is_fragment() || ip.ihl != 5 {
        return;
    }
    let Some(tcp) = ptr_at::<[u8; 20]>(ctx.data(), ctx.data_end(), ETH_HLEN + IPV4_BASE_LEN) else {
        return;
    };
    // SAFETY: bounds checked by ptr_at.
    let tcp = unsafe { &*tcp };
    let header_len = u16::from(tcp[12] >> 4) * 4;
    let payload = ip
        .tot_len
        .saturating_sub(IPV4_BASE_LEN as u16)
        .saturating_sub(header_len);
    if payload == 0 {
        return;
    }
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let end = seq.wrapping_add(u32::from(payload));
    let key = ip.flow_key(&[tcp[0], tcp[1], tcp[2], tcp[3]]);
    count(&STRIP_STATS, reason::TCP_DATA, 1);
    match REORDER.get_ptr_mut(&key) {
        Some(state) => {
            // SAFETY: a pointer from a successful map lookup.
            let state = unsafe { &mut *state };
            state.packets += 1;
            if (seq.wrapping_sub(state.highest_end) as i32) < 0 {
                state.reordered += 1;
                count(&STRIP_STATS, reason::TCP_REORDERED, 1);
            }
            if (end.wrapping_sub(state.highest_end) as i32) > 0 {
                state.highest_end = end;
            }
        }
        None => {
            let state = ReorderState {
                highest_end: end,
                packets: 1,
                ..ReorderState::default()
            };
            let _ = REORDER.insert(&key, &state, u64::from(BPF_NOEXIST));
        }
    }
}
