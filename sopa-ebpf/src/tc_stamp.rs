//! `tc_stamp`, TC egress on the host's fabric interface: choose a path for the packet and have
//! the host's encoding carry it (`crate::encoding`): the 4-byte source-route option after the
//! IPv4 base header, the destination of an outer IPv6 header (SRv6), or the flow label a
//! hashing switch spreads on (entropy).
//!
//! Only IHL-5, unfragmented TCP/UDP packets to a fabric prefix are stamped, and only when the
//! option still fits the interface's MTU (a packet that would not is passed unstamped: never
//! dropped for our sake). A GSO super-packet gets one option, which the kernel copies into every
//! segment (the spraying unit is then the burst; `gso_max_segs` 1 makes it the packet).
//!
//! A packet that already carries this fabric's option was given it by its sender: its hop
//! bytes are replaced with our own choice, or, where we would stamp nothing, it is dropped.

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST, BPF_SK_STORAGE_GET_F_CREATE, bpf_check_mtu_ret::BPF_MTU_CHK_RET_FRAG_NEEDED,
    },
    helpers::{
        bpf_check_mtu, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_sk_fullsock,
        generated::bpf_sk_storage_get,
    },
    programs::TcContext,
};
use sopa_common::{
    maps::{
        FlowKey, FlowState, HostConfig, MAX_PATHS, PathSet, lookup, mode, stamp_reason as reason,
    },
    srv6::{ETH_P_IPV6, IPV6_HLEN, MAX_OVERHEAD},
    wire::{
        ETH_HLEN, ETH_P_IP, IPPROTO_TCP, IPPROTO_UDP, IPV4_BASE_LEN, IPV4_STAMPED_LEN, OPTION_LEN,
        OPTION_TYPE,
    },
};

use crate::{
    CONFIG, FLOWS, HOP_STATS, PINS,
    encoding::{Encoding, option},
    meter::Meter,
    packet::{Ipv4, Ipv6, count, flow_hash, ptr_at},
};

/// A pointer to a `T` at `offset`, pulling non-linear data into the head first if needed.
#[inline(always)]
pub(crate) fn tc_ptr<T>(ctx: &TcContext, offset: usize) -> Option<*mut T> {
    if let Some(p) = ptr_at::<T>(ctx.data(), ctx.data_end(), offset) {
        return Some(p);
    }
    ctx.pull_data((offset + core::mem::size_of::<T>()) as u32)
        .ok()?;
    ptr_at::<T>(ctx.data(), ctx.data_end(), offset)
}

/// `Ok(STAMPED)` or the reason the packet was left alone (or, for `FORGED_DROPPED`, dropped).
#[inline(always)]
pub fn try_stamp(ctx: &TcContext) -> Result<u32, u32> {
    // SAFETY: reading a field of the context the kernel handed us.
    if unsafe { (*ctx.skb.skb).mark } == sopa_common::entropy::PROBE_MARK {
        return Err(reason::PROBE);
    }
    // Every setting this packet needs of the agent's, in one snapshot (never missing in
    // practice: the maps are the datapath's own).
    let host = crate::host_config::current().ok_or(reason::MODE_OFF)?;
    let ether_type: *const [u8; 2] = tc_ptr(ctx, 12).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by tc_ptr.
    let ether_type = u16::from_be_bytes(unsafe { *ether_type });
    if ether_type == ETH_P_IPV6 {
        return stamp_ipv6(ctx, host);
    }
    if ether_type != ETH_P_IP {
        return Err(reason::NOT_IPV4);
    }
    let header: *const [u8; IPV4_BASE_LEN] = tc_ptr(ctx, ETH_HLEN).ok_or(reason::TOO_SHORT)?;
    let ip = Ipv4::parse(unsafe { &*header });
    if ip.version != 4 || ip.ihl < 5 {
        return Err(reason::BAD_HEADER);
    }
    // Our option, set by the sender itself (`IP_OPTIONS` with CAP_NET_RAW, which root in any
    // container has): exactly the form `tc_forward` honours. Its hop bytes are replaced with our choice, or the packet is
    // dropped where we make none.
    let forged = ip.ihl == 6 && {
        let option: *const [u8; 2] =
            tc_ptr(ctx, ETH_HLEN + IPV4_BASE_LEN).ok_or(reason::TOO_SHORT)?;
        // SAFETY: bounds checked by tc_ptr.
        unsafe { *option == [OPTION_TYPE, OPTION_LEN] }
    };
    let enc = Encoding::of(host);
    let option = matches!(enc, Encoding::Option);
    // In the other encodings no switch reads the option: one a sender set itself is left in
    // place like any other.
    if ip.ihl > 5 && (!forged || !option) {
        return Err(reason::HAS_OPTIONS);
    }
    // The path meter marks and counts the packets of the encodings that have room for its mark
    // (SRv6: in a Destination Options header after the outer one). SRv6 needs it before the
    // path is chosen (the mark's bytes must fit); the option only for a packet it stamps.
    let early_meter = if !option && enc.metered() {
        Meter::now(host)
    } else {
        None
    };
    let extra = enc.extra_ipv4(early_meter.is_some());
    let l4 = if forged {
        ETH_HLEN + IPV4_STAMPED_LEN
    } else {
        ETH_HLEN + IPV4_BASE_LEN
    };
    let choice = match choose(ctx, host, &ip, forged, extra, l4) {
        Ok(choice) => choice,
        Err(_) if forged => return Err(reason::FORGED_DROPPED),
        Err(why) => return Err(why),
    };
    // Before stamping: growing a GSO packet's header resets its segment count.
    let segs = segments(ctx);
    let meter = if option {
        Meter::now(host)
    } else {
        early_meter
    };
    if forged {
        // Only the option's encoding gets here with a forged option.
        option::restamp(ctx, option::wire(choice.hops, meter))
            .map_err(|_| reason::FORGED_DROPPED)?;
        count(&crate::STAMP_STATS, reason::RESTAMPED, 1);
    } else {
        enc.carry_ipv4(ctx, &ip, choice.hops, meter)?;
    }
    // The option a sender forged was in its headers already.
    let headers = if forged { l4 } else { l4 + usize::from(extra) };
    metered(ctx, meter, &ip, &choice, segs, headers);
    Ok(counted(&choice, segs))
}

/// Counts a stamped packet in the path meter, when it runs: its segments, and the bytes they
/// take on the wire. `headers`: where the stamped packet's L4 header begins.
#[inline(always)]
fn metered(
    ctx: &TcContext,
    meter: Option<Meter>,
    ip: &Ipv4,
    choice: &Choice,
    segs: u64,
    headers: usize,
) {
    let Some(m) = meter else {
        return;
    };
    // A GSO packet holds its headers once; each of its segments carries them (TCP's taken
    // with timestamps, 32 bytes; a segment with more options, or a tunnel's GSO packet, counts
    // a few bytes short). What a frame takes on the wire besides, the controller adds.
    let l4 = if ip.proto == IPPROTO_TCP { 32 } else { 8 };
    let bytes = u64::from(ctx.len()) + (segs - 1) * (headers as u64 + l4);
    if !m.sent(ip.daddr, choice.hops, segs, bytes) {
        count(&crate::STAMP_STATS, reason::METER_FULL, 1);
    }
}

/// IPv6 in the SRv6 and entropy encodings: a TCP or UDP packet without extension headers to
/// the fabric's /96 takes the paths of the IPv4 address its destination embeds.
#[inline(always)]
fn stamp_ipv6(ctx: &TcContext, host: &'static HostConfig) -> Result<u32, u32> {
    let enc = Encoding::of(host);
    let Some(encap) = enc.ipv6() else {
        return Err(reason::NOT_IPV4);
    };
    let header: *const [u8; IPV6_HLEN] = tc_ptr(ctx, ETH_HLEN).ok_or(reason::TOO_SHORT)?;
    // SAFETY: bounds checked by tc_ptr.
    let h = unsafe { &*header };
    let ip6 = Ipv6::parse(h);
    if ip6.version != 6 {
        return Err(reason::BAD_HEADER);
    }
    match ip6.next {
        IPPROTO_TCP | IPPROTO_UDP => {}
        // Hop-by-hop, routing, destination options: extension headers, like IPv4 options.
        0 | 43 | 60 => return Err(reason::HAS_OPTIONS),
        44 => return Err(reason::FRAGMENT),
        // IP-in-IPv6 (an outer header already), ICMPv6, ESP, anything else.
        _ => return Err(reason::NOT_TCP_UDP),
    }
    let mut fabric = true;
    let mut i = 0;
    while i < 12 {
        fabric &= h[24 + i] == encap.fabric6[i];
        i += 1;
    }
    if !fabric || encap.fabric6 == [0; 12] {
        return Err(reason::NOT_FABRIC);
    }
    // The flow and the paths as for the embedded IPv4 addresses; the length is the whole
    // packet's, as an IPv4 header's would be.
    let ip = Ipv4 {
        version: 4,
        ihl: 5,
        tos: ip6.tclass,
        tot_len: ip6.payload_len.saturating_add(IPV6_HLEN as u16),
        frag: 0,
        proto: ip6.next,
        saddr: [h[20], h[21], h[22], h[23]],
        daddr: [h[36], h[37], h[38], h[39]],
    };
    // A payload length of 0 is BIG TCP's (past 64 KB, the length in the skb only): the outer
    // header could not say it. Nor could it say one within 88 bytes of the maximum.
    if ip6.payload_len == 0 || ip6.payload_len > u16::MAX - (IPV6_HLEN + MAX_OVERHEAD) as u16 {
        return Err(reason::TOO_BIG);
    }
    let meter = if enc.metered() {
        Meter::now(host)
    } else {
        None
    };
    let extra = enc.extra_ipv6(meter.is_some());
    let choice = choose(ctx, host, &ip, false, extra, ETH_HLEN + IPV6_HLEN)?;
    let segs = segments(ctx);
    enc.carry_ipv6(ctx, &ip, ip6.next, choice.hops, meter)?;
    let headers = ETH_HLEN + IPV6_HLEN + usize::from(extra);
    metered(ctx, meter, &ip, &choice, segs, headers);
    Ok(counted(&choice, segs))
}

/// Counts a stamped packet's path and how it was chosen.
#[inline(always)]
fn counted(choice: &Choice, segs: u64) -> u32 {
    count(&HOP_STATS, u32::from(choice.hops[0]), segs);
    count(&HOP_STATS, 256 + u32::from(choice.hops[1]), segs);
    if choice.stateless {
        count(&crate::STAMP_STATS, reason::FLOW_TABLE_FULL, 1);
    }
    if choice.pinned {
        count(&crate::STAMP_STATS, reason::PINNED, 1);
    }
    reason::STAMPED
}

/// A path chosen for a packet.
struct Choice {
    /// The (hop0, hop1) pair.
    hops: [u8; 2],
    /// Taken from a live Hedera pin.
    pinned: bool,
    /// Taken by hash because the flow could not be entered into the flow table.
    stateless: bool,
}

/// The path for a stampable packet, with the flow's state updated; `extra` is what the
/// encoding adds to the packet, `l4` where its ports are.
#[inline(always)]
fn choose(
    ctx: &TcContext,
    host: &HostConfig,
    ip: &Ipv4,
    forged: bool,
    extra: u16,
    l4: usize,
) -> Result<Choice, u32> {
    if ip.is_fragment() {
        return Err(reason::FRAGMENT);
    }
    if ip.proto != IPPROTO_TCP && ip.proto != IPPROTO_UDP {
        return Err(reason::NOT_TCP_UDP);
    }
    let ports: *const [u8; 4] = tc_ptr(ctx, l4).ok_or(reason::TOO_SHORT)?;
    let key = ip.flow_key(unsafe { &*ports });

    let config = CONFIG.get(0).copied().unwrap_or_default();
    if config.mode == mode::OFF || config.mode >= mode::COUNT {
        return Err(reason::MODE_OFF);
    }
    if !crate::prefix::in_fabric(host, ip.daddr) {
        return Err(reason::NOT_FABRIC);
    }
    let paths = crate::prefix::find(
        host.lookup[lookup::PATHS as usize],
        &crate::PATHS_EXACT,
        crate::prefix::paths_trie,
        ip.daddr,
    )
    .ok_or(reason::NOT_FABRIC)?;
    let n = if paths.count as usize > MAX_PATHS {
        MAX_PATHS as u32
    } else {
        paths.count
    };
    if n == 0 {
        return Err(reason::NO_PATH);
    }
    // A length the header cannot say once stamped: BIG TCP (IPv4 GSO past 64 KB) sets
    // `tot_len` to 0 and the kernel takes the length from the skb (nor can the outer IPv6
    // header's payload length say it), and 4 more bytes would overflow a `tot_len` of 65,532 or
    // more. Such a packet leaves as it is.
    if !forged && (ip.tot_len == 0 || ip.tot_len > u16::MAX - extra) {
        return Err(reason::TOO_BIG);
    }
    if !forged && !fits_with(ctx, extra) {
        return Err(reason::TOO_BIG);
    }

    let mut fallback = false;
    let mut pin: Option<[u8; 2]> = None;
    let choice = match config.mode {
        mode::SOPA => match match socket_state(ctx, ip.proto, &key, config.hash_seed, l4) {
            Holder::Socket(state) => Some(state),
            Holder::None(start) => return Ok(self::choice(paths, start % n, false, None)),
            Holder::Table => flow_state(&key, config.hash_seed),
        } {
            Some(state) => {
                // SAFETY: a pointer from a successful map lookup. Two CPUs sending the same
                // flow at once may both read one `next`: a rare repeat, never a wrong path.
                let next = unsafe { (*state).next };
                unsafe { (*state).next = next.wrapping_add(1) };
                // No per-flow bytes here: only the pinned (Hedera) mode reads them.
                next % n
            }
            None => {
                // Flow table full: a stateless choice still gives the flow a valid path.
                fallback = true;
                flow_hash(&key, config.hash_seed) % n
            }
        },
        // SAFETY: a helper without arguments.
        mode::RPS => (unsafe { bpf_get_prandom_u32() }) % n,
        mode::PINNED => {
            // Bytes per flow are what the agent's elephant detection reads.
            if let Some(state) = flow_state(&key, config.hash_seed) {
                account(state, ctx);
            }
            // One copy of the pin, its path and its expiry read together (the agent replaces
            // the whole value; either version is a valid pin, never half of each).
            // SAFETY: a pointer from a successful lookup, read once.
            if let Some(p) = PINS
                .get_ptr(&key)
                .map(|p| unsafe { core::ptr::read_volatile(p) })
            {
                // SAFETY: a helper without arguments.
                if unsafe { bpf_ktime_get_ns() } < p.expires_ns {
                    pin = Some(p.hops);
                } else {
                    count(&crate::STAMP_STATS, reason::PIN_EXPIRED, 1);
                }
            }
            flow_hash(&key, config.hash_seed) % n
        }
        mode::SINGLE => 0,
        _ => flow_hash(&key, config.hash_seed) % n,
    };
    Ok(self::choice(paths, choice, fallback, pin))
}

/// Path `index` of `paths` (or the pin), as chosen.
#[inline(always)]
fn choice(paths: &PathSet, index: u32, stateless: bool, pin: Option<[u8; 2]>) -> Choice {
    // `index < n <= MAX_PATHS`, but the verifier does not follow `%` and LLVM drops a check it
    // can prove redundant: mask behind an opaque value so the bound survives to the verifier.
    let index = core::hint::black_box(index) as usize & (MAX_PATHS - 1);
    Choice {
        hops: pin.unwrap_or(paths.hops[index]),
        pinned: pin.is_some(),
        stateless,
    }
}

/// Whether a packet sent as it is (not GSO) still fits the interface's MTU with `extra` bytes
/// added. The agent lowers the route MTUs for this (or the fabric's MTU is larger), but a
/// sender may ignore them (`IP_PMTUDISC_INTERFACE`/`OMIT`, an upper device with a larger
/// MTU): such a packet, stamped, would be dropped. A GSO packet is checked once stamped
/// (`crate::encoding::option`) or, with an outer header, before (`crate::encoding::outer`).
#[inline(always)]
pub(crate) fn fits_with(ctx: &TcContext, extra: u16) -> bool {
    if is_gso(ctx) {
        return true;
    }
    let mut mtu: u32 = 0;
    // SAFETY: the helper reads the skb and writes the u32 it is given.
    let ret = unsafe { bpf_check_mtu(ctx.skb.skb.cast(), 0, &mut mtu, i32::from(extra), 0) };
    // A helper error (none is possible for the skb's own device) stamps as before.
    ret != i64::from(BPF_MTU_CHK_RET_FRAG_NEEDED)
}

#[inline(always)]
pub(crate) fn is_gso(ctx: &TcContext) -> bool {
    // SAFETY: reading a field of the context the kernel handed us.
    unsafe { (*ctx.skb.skb).gso_size != 0 }
}

/// The flow's state, created on its first packet. Its round robin starts at the flow's hash,
/// not at path 0: otherwise every host's SYNs and one-packet flows would all take the first
/// path, and a flow evicted from the table would go back to it. (`START` set to
/// `first_path::ZERO` starts at 0, as the paper does, for comparison.)
#[inline(always)]
fn flow_state(key: &FlowKey, seed: u32) -> Option<*mut FlowState> {
    if let Some(state) = FLOWS.get_ptr_mut(key) {
        return Some(state);
    }
    let fresh = first_state(key, seed);
    // EEXIST (another CPU won the race) is fine: the lookup below finds its entry.
    if FLOWS.insert(key, &fresh, u64::from(BPF_NOEXIST)).is_ok() {
        count(&crate::STAMP_STATS, reason::FLOWS_CREATED, 1);
    }
    FLOWS.get_ptr_mut(key)
}

/// A new flow's state: its round robin at its first path.
#[inline(always)]
fn first_state(key: &FlowKey, seed: u32) -> FlowState {
    let next = match crate::START.get(0) {
        Some(&sopa_common::maps::first_path::ZERO) => 0,
        _ => flow_hash(key, seed),
    };
    FlowState {
        next,
        ..FlowState::default()
    }
}

/// Where a packet's round robin is kept.
enum Holder {
    /// In the socket of the TCP connection that sends it.
    Socket(*mut FlowState),
    /// Nowhere: a TCP packet of a socket that is not the connection's own (a SYN-ACK's request
    /// socket, a time-wait socket's last ACK, a listener's reset: since Linux 6.12, which
    /// sends them with their socket), a few packets a connection at most, which take the
    /// flow's first path (this one) and enter no table.
    None(u32),
    /// In the flow table: packets without a socket (forwarded; a SYN-ACK under SYN cookies),
    /// UDP, raw sockets (the kernel's own sends resets and time-wait ACKs before 6.12).
    Table,
}

/// Where the round robin of a packet of `proto` is kept: a TCP connection this host's own
/// socket sends keeps it in the socket (`SOCKET_FLOWS_MAP`), found without hashing the
/// 5-tuple, never evicted, freed with the socket. `l4`: where the TCP header begins.
#[inline(always)]
fn socket_state(ctx: &TcContext, proto: u8, key: &FlowKey, seed: u32, l4: usize) -> Holder {
    if proto != IPPROTO_TCP {
        return Holder::Table;
    }
    // SAFETY: reading a field of the context the kernel handed us.
    let sk = unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk };
    if sk.is_null() {
        return Holder::Table;
    }
    // SAFETY: a helper given the skb's socket, checked non-null.
    let full = unsafe { bpf_sk_fullsock(sk) };
    if full.is_null() {
        return Holder::None(first_state(key, seed).next);
    }
    // SAFETY: a full socket the helper returned, valid for this run.
    let (kind, protocol, state) = unsafe { ((*full).type_, (*full).protocol, (*full).state) };
    if kind != SOCK_STREAM || protocol != u32::from(IPPROTO_TCP) {
        return Holder::Table;
    }
    if state == TCP_LISTEN {
        return Holder::None(first_state(key, seed).next);
    }
    let map = core::ptr::from_ref(&crate::SOCKET_FLOWS).cast_mut().cast();
    let get = |value: *mut FlowState, flags: u32| {
        // SAFETY: our socket-storage map and a full socket; the helper copies `value` (or
        // zeroes) into the storage it creates.
        unsafe { bpf_sk_storage_get(map, full.cast(), value.cast(), u64::from(flags)) }
            .cast::<FlowState>()
    };
    let state = get(core::ptr::null_mut(), 0);
    if !state.is_null() {
        return Holder::Socket(state);
    }
    // The connection's first packet here. A SYN takes the flow's first path; anything else
    // (an accepted connection, whose SYN-ACK its request socket sent on the first path, or a
    // connection open before this datapath loaded) the one after it.
    let mut fresh = first_state(key, seed);
    let flags: Option<*mut u8> = tc_ptr(ctx, l4 + 13);
    // SAFETY: bounds checked by tc_ptr.
    let syn = flags.is_some_and(|f| unsafe { *f } & (TCP_SYN | TCP_ACK) == TCP_SYN);
    if !syn {
        fresh.next = fresh.next.wrapping_add(1);
    }
    let state = get(&mut fresh, BPF_SK_STORAGE_GET_F_CREATE);
    if !state.is_null() {
        count(&crate::STAMP_STATS, reason::SOCKET_FLOWS_CREATED, 1);
        return Holder::Socket(state);
    }
    // Another CPU created it first, or no memory (the flow table then).
    let state = get(core::ptr::null_mut(), 0);
    if state.is_null() {
        Holder::Table
    } else {
        Holder::Socket(state)
    }
}

/// `SOCK_STREAM` (linux/net.h), `TCP_LISTEN` (net/tcp_states.h), the TCP flags' bits.
const SOCK_STREAM: u32 = 1;
const TCP_LISTEN: u32 = 10;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// Adds this skb to its flow's packets and bytes, atomically (BPF_ATOMIC add): two CPUs
/// sending the same flow at once both count. Only in the pinned mode, whose elephant detection
/// (Hedera) reads the bytes: every other mode leaves the flow's cache line unwritten but for
/// its round-robin position.
/// (`core::sync::atomic` offers no read-modify-write on this target, which has no
/// compare-and-swap before BPF v3; the add itself is an instruction of every version.)
#[inline(always)]
fn account(state: *mut FlowState, ctx: &TcContext) {
    use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};
    // SAFETY: `state` points into a map value that stays valid for this program run, its u64
    // fields aligned; the result of the add is not used, so it is the plain atomic add.
    unsafe {
        atomic_xadd::<u64, u64, { Relaxed }>(
            core::ptr::addr_of_mut!((*state).packets),
            segments(ctx),
        );
        atomic_xadd::<u64, u64, { Relaxed }>(
            core::ptr::addr_of_mut!((*state).bytes),
            u64::from(ctx.len()),
        );
    }
}

/// The number of packets this skb becomes on the wire (a GSO super-packet is several).
#[inline(always)]
fn segments(ctx: &TcContext) -> u64 {
    // SAFETY: reading a field of the context the kernel handed us.
    let segs = unsafe { (*ctx.skb.skb).gso_segs };
    if segs == 0 { 1 } else { u64::from(segs) }
}
