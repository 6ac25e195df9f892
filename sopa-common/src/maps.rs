//! Every map of the datapath: its name (layout-versioned: bump `_Vn` when a layout changes, so a
//! pin of another layout is never reused), capacity, key and value. Keys and values are
//! `#[repr(C)]`, fixed-width, padded explicitly and size-asserted.
//!
//! Map names stay within the kernel's 15 characters so the kernel object name and the pin agree.

use core::mem::size_of;

/// Path-selection mode, stored in [`Config::mode`].
pub mod mode {
    /// Stamp nothing: every packet passes untouched (kernel routing).
    pub const OFF: u32 = 0;
    /// Per-flow round-robin over the destination's paths (SOPA).
    pub const SOPA: u32 = 1;
    /// A random path per packet (RPS).
    pub const RPS: u32 = 2;
    /// A path by hash of the 5-tuple (ECMP at the host).
    pub const ECMP: u32 = 3;
    /// Hedera: a flow with a live entry in [`super::PINS_MAP`] takes its pinned path, every
    /// other flow the 5-tuple hash (the ECMP behaviour Hedera starts from).
    pub const PINNED: u32 = 4;
    /// Every flow on the destination's first candidate path (the single-path baseline).
    pub const SINGLE: u32 = 5;
    /// Number of modes; valid modes are below it.
    pub const COUNT: u32 = 6;
}

/// Runtime configuration, a one-entry array. Userspace rewrites it to switch modes without
/// reloading the programs.
pub const CONFIG_MAP: &str = "SOPA_CFG_V1";

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// One of [`mode`].
    pub mode: u32,
    /// Seed of the 5-tuple hash used by `ecmp` mode and the stateless fallback.
    pub hash_seed: u32,
}
const _: () = assert!(size_of::<Config>() == 8);

/// Where a new flow's round robin starts: a one-entry array holding one of [`first_path`].
/// A map of its own, so a datapath of an older layout reads the default from a fresh one.
pub const START_MAP: &str = "SOPA_START_V1";

/// Values of [`START_MAP`].
pub mod first_path {
    /// At the flow's hash (the default): SYNs and one-packet flows spread over every path, and
    /// a flow evicted from the table does not go back to the first.
    pub const HASH: u32 = 0;
    /// At path 0, as the paper's algorithm does: kept to measure what seeding changes.
    pub const ZERO: u32 = 1;
    pub const NAMES: [&str; 2] = ["hash", "zero"];
}

/// The settings the agent alone writes and every packet reads: the encoding and this host's
/// addresses in it, how destinations are looked up, the path meter's period and rack mask
/// ([`HostConfig`]). An array of two slots, of which [`HOST_INDEX_MAP`] names the current one:
/// the agent writes the other slot whole, then names it, and writes the first again only after
/// an RCU grace period (when no program can still be reading it). A program reads every
/// setting from one slot, so never half of a change, with two array reads the verifier inlines
/// (they replace `SOPA_ENCAP_V2`, a one-entry hash, `SOPA_LOOKUP_V1` and `SOPA_METER_V1`: six
/// reads a stamped packet, one of them a hash; seven in SRv6). All zero in a fresh datapath: the IPv4 option, the
/// tries for every destination, the meter off.
pub const HOST_MAP: &str = "SOPA_HOST_V1";
/// The current slot of [`HOST_MAP`], a one-entry array of u32 (0 or 1).
pub const HOST_INDEX_MAP: &str = "SOPA_HOSTI_V1";

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostConfig {
    /// How the chosen path travels, with this host's addresses.
    pub encap: Encap,
    /// How destinations are looked up, by [`lookup`] slot (host order).
    pub lookup: [u32; lookup::SLOTS as usize],
    /// The path meter's period and rack mask.
    pub meter: MeterConfig,
}
const _: () = assert!(size_of::<HostConfig>() == 88);

/// Values of [`Encap::encoding`].
pub mod encoding {
    /// The paper's: the hop bytes in an IPv4 option, for software or programmable switches.
    pub const IPV4_OPTION: u32 = 0;
    /// The path as a uSID list in an outer IPv6 header (`crate::srv6`), for any SRv6 fabric.
    pub const SRV6: u32 = 1;
    /// The path as the entropy value a hashing switch spreads on (`crate::entropy`): the flow
    /// label of IPv6, or of an outer IPv6 header around IPv4; for fabrics that only hash.
    pub const ENTROPY: u32 = 2;
    pub const NAMES: [&str; 3] = ["ipv4-option", "srv6", "entropy"];
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Encap {
    /// One of [`encoding`].
    pub encoding: u32,
    pub _pad: u32,
    /// The outer header's source address: this host's IPv6 address.
    pub source: [u8; 16],
    /// The outer destination this host receives on (the block and its local uSID): `xdp_strip`
    /// removes the outer header of exactly these packets. Its first four bytes are the fabric's
    /// uSID block, which begins every path address `tc_stamp` writes.
    pub receive: [u8; 16],
    /// The /96 of the fabric's IPv6 host addresses, which embed the hosts' IPv4 ones: an IPv6
    /// packet to it takes the paths of the embedded IPv4 destination. All zero: IPv6 is not
    /// encapsulated.
    pub fabric6: [u8; 12],
    pub _pad2: u32,
}
const _: () = assert!(size_of::<Encap>() == 56);

/// SRv6: destination prefix -> what ends its paths' uSID lists (LPM trie keyed like
/// [`PATHS_MAP`]). A prefix without an entry is not encapsulated.
pub const SRV6_DESTS_MAP: &str = "SOPA_SRV6D_V1";
/// uSIDs between the path's chosen switches and the destination host's local uSID.
pub const MAX_TAIL: usize = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Srv6Dest {
    /// The [`SRV6_SEGS_MAP`] group that names the switches of this prefix's paths.
    pub group: u16,
    /// Valid entries of `tail`.
    pub tail_len: u16,
    /// uSIDs after the chosen switches (the destination's rack switch).
    pub tail: [u16; MAX_TAIL],
    /// The host bits of the prefix (host order): a destination's local uSID is
    /// `srv6::LIB_BASE | (daddr & host_mask)`.
    pub host_mask: u32,
}
const _: () = assert!(size_of::<Srv6Dest>() == 12);

/// SRv6: (group, hop pair) -> the uSIDs of the switches the path chooses (hash). Destinations
/// whose paths name the same switches for the same hop pairs share a group (every destination
/// of a Fat-Tree shares one), so the map grows with the paths of one source, not with
/// destinations times paths.
pub const SRV6_SEGS_MAP: &str = "SOPA_SRV6S_V1";
pub const SRV6_SEGS_CAPACITY: u32 = 65_536;
/// uSIDs of the switches one path chooses.
pub const MAX_CHOSEN: usize = 3;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegKey {
    pub group: u16,
    pub hops: [u8; 2],
}
const _: () = assert!(size_of::<SegKey>() == 4);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segments {
    /// Valid entries of `usids`.
    pub len: u16,
    pub usids: [u16; MAX_CHOSEN],
}
const _: () = assert!(size_of::<Segments>() == 8);

/// Entropy: [`EvKey`] -> the flow label (20 bits) whose packets take that path (hash). One
/// entry per destination host, next header and path: the switches hash all three.
pub const EV_MAP: &str = "SOPA_EV_V1";
pub const EV_CAPACITY: u32 = 262_144;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EvKey {
    /// The destination's IPv4 address (of an IPv6 destination of the fabric: the one it
    /// embeds).
    pub daddr: [u8; 4],
    /// The next header the switches hash: `entropy::NEXT_IPV4` for encapsulated IPv4, 6 or 17
    /// for IPv6.
    pub next: u8,
    pub _pad: u8,
    /// The path chosen, as the path table names it.
    pub hops: [u8; 2],
}
const _: () = assert!(size_of::<EvKey>() == 8);

/// Destination prefix -> candidate paths (LPM trie keyed by the IPv4 address, network order).
pub const PATHS_MAP: &str = "SOPA_PATHS_V1";
/// Destination prefixes (one per edge/access switch of a fabric).
pub const PATHS_CAPACITY: u32 = 16_384;
/// The same path sets keyed by the prefix's network address alone (hash, network order),
/// looked up with one exact match instead of the trie's walk when every prefix of the table has
/// one length ([`HostConfig::lookup`]). Allocated as entries come (a path set is 2 KB).
pub const PATHS_EXACT_MAP: &str = "SOPA_PATHX_V1";
/// [`SRV6_DESTS_MAP`]'s entries keyed by network address, as [`PATHS_EXACT_MAP`]'s are.
pub const SRV6_DESTS_EXACT_MAP: &str = "SOPA_SRV6DX_V1";

/// How `tc_stamp` looks destinations up: the slots of [`HostConfig::lookup`], all 0 in a
/// fresh datapath (the tries, for every destination).
pub mod lookup {
    /// The netmask every prefix of [`super::PATHS_EXACT_MAP`] has, or 0 (prefixes of several
    /// lengths, or the exact table being rewritten): the trie, which always holds the whole
    /// table, is looked up.
    pub const PATHS: u32 = 0;
    /// The same for [`super::SRV6_DESTS_EXACT_MAP`].
    pub const SRV6_DESTS: u32 = 1;
    /// A prefix covering every destination prefix (network and mask): a destination outside it
    /// is not the fabric's, without a lookup. A mask of 0 covers everything, whatever the
    /// network.
    pub const FABRIC: u32 = 2;
    pub const FABRIC_MASK: u32 = 3;
    pub const SLOTS: u32 = 4;
}

/// Paths per destination prefix: (k/2)^2 for a Fat-Tree of k = 64.
pub const MAX_PATHS: usize = 1024;

/// The candidate paths of one destination prefix, as (hop0, hop1) byte pairs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathSet {
    /// Number of valid entries in `hops`; 0 means every path has failed.
    pub count: u32,
    pub hops: [[u8; 2]; MAX_PATHS],
}
const _: () = assert!(size_of::<PathSet>() == 4 + 2 * MAX_PATHS);

impl PathSet {
    pub const EMPTY: Self = Self {
        count: 0,
        hops: [[0; 2]; MAX_PATHS],
    };
}

/// Per-flow state of the sender (LRU hash keyed by [`FlowKey`]).
pub const FLOWS_MAP: &str = "SOPA_FLOWS_V1";
pub const FLOWS_CAPACITY: u32 = 65_536;

/// Per-flow state of a TCP connection this host's own socket sends, in the socket's storage
/// (`bpf_sk_storage_get`): no table to fill or evict, freed with the socket, and a lookup that
/// costs a fifth of the flow table's (`cargo xtask bench datapath`). Not pinned: an agent
/// that takes over starts the round robin of the connections already open again, one past
/// their first path. Forwarded packets, UDP and sockets of other kinds keep [`FLOWS_MAP`].
pub const SOCKET_FLOWS_MAP: &str = "SOPA_FLOWSK_V1";

/// A flow's 5-tuple, addresses and ports in network order as they appear in the packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<FlowKey>() == 16);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// Round-robin position: the next packet takes path `next % count`. A new flow starts at
    /// its 5-tuple hash ([`crate::hash::flow_hash`] with the configured seed).
    pub next: u32,
    pub _pad: u32,
    /// Packets (GSO segments) and bytes sent by the flow, counted in the pinned mode only
    /// (Hedera's elephant detection reads them; other modes leave them at 0).
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(size_of::<FlowState>() == 24);

/// Hedera's per-flow pins, written by the agent from the controller's placements (hash keyed by
/// [`FlowKey`]). A pin past `expires_ns` is ignored: a dead agent or controller cannot leave a
/// flow pinned forever.
pub const PINS_MAP: &str = "SOPA_PINS_V1";
pub const PINS_CAPACITY: u32 = 16_384;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pin {
    /// The path, as the (hop0, hop1) pair of one of the destination's candidate paths.
    pub hops: [u8; 2],
    pub _pad: [u8; 6],
    /// `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`) after which the pin is void.
    pub expires_ns: u64,
}
const _: () = assert!(size_of::<Pin>() == 16);

/// What the programs measure beyond their counters: a one-entry array of [`measure`] bits,
/// 0 (nothing) in a fresh datapath. A map of its own, so a datapath of an older layout reads
/// the default from a fresh one.
pub const MEASURE_MAP: &str = "SOPA_MEASURE_V1";

/// Bits of [`MEASURE_MAP`].
pub mod measure {
    /// `xdp_strip` follows every arriving TCP flow's sequence numbers ([`super::REORDER_MAP`],
    /// the `tcp_data` and `tcp_reordered` counters): an LRU lookup per data packet, about half
    /// of the program's cost, so it runs only while someone reads it.
    pub const REORDERING: u32 = 1;
}

/// Receiver-side reordering state per flow (LRU hash keyed by [`FlowKey`] of the arriving packet).
pub const REORDER_MAP: &str = "SOPA_REORD_V1";
pub const REORDER_CAPACITY: u32 = 65_536;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReorderState {
    /// Highest TCP sequence number + payload length seen (host order).
    pub highest_end: u32,
    pub _pad: u32,
    /// TCP data packets seen, and those that arrived below `highest_end`.
    pub packets: u64,
    pub reordered: u64,
}
const _: () = assert!(size_of::<ReorderState>() == 24);

/// Slots of every per-CPU reason counter map: more than the reasons in use, so a new reason
/// needs no new map layout (and no upgrade step). Unused slots stay 0.
pub const REASON_SLOTS: u32 = 32;

/// Why `tc_stamp` did what it did with a packet: index into [`STAMP_STATS_MAP`].
pub mod stamp_reason {
    pub const STAMPED: u32 = 0;
    pub const NOT_IPV4: u32 = 1;
    pub const TOO_SHORT: u32 = 2;
    pub const BAD_HEADER: u32 = 3;
    pub const HAS_OPTIONS: u32 = 4;
    pub const FRAGMENT: u32 = 5;
    pub const NOT_TCP_UDP: u32 = 6;
    pub const NOT_FABRIC: u32 = 7;
    pub const NO_PATH: u32 = 8;
    pub const MODE_OFF: u32 = 9;
    pub const ADJUST_FAILED: u32 = 10;
    /// Passed unstamped because the option would take it past the interface's MTU: its sender
    /// ignored the route's lowered MTU (`IP_PMTUDISC_INTERFACE`/`OMIT`, raw sockets, an upper
    /// device's larger MTU, a prefix whose route the agent could not lower).
    pub const TOO_BIG: u32 = 11;
    /// Dropped: the packet already carried this fabric's option (set by the sender itself,
    /// e.g. through `IP_OPTIONS`) and is not one `tc_stamp` would stamp, so its hop bytes
    /// cannot be replaced with a choice of ours and the switches must not see them.
    pub const FORGED_DROPPED: u32 = 12;
    /// Not verdicts (from here on): stamped packets of `pinned` mode that took a live pin, and
    /// those whose pin had expired (they took the hash).
    pub const PINNED: u32 = 13;
    pub const PIN_EXPIRED: u32 = 14;
    /// Not a verdict: flows entered into the flow table (the LRU evicts the least recently
    /// used one when it is full; created minus entries is the eviction count).
    pub const FLOWS_CREATED: u32 = 15;
    /// Not a verdict: stamped packets that took a stateless choice because the flow could not
    /// be entered into the flow table.
    pub const FLOW_TABLE_FULL: u32 = 16;
    /// Not a verdict: stamped packets that already carried this fabric's option, whose hop
    /// bytes were replaced with our own choice (a sender cannot pick its path).
    pub const RESTAMPED: u32 = 17;
    /// Passed as it is: the encoding is SRv6 and the destination or the chosen path has no
    /// uSIDs (a path table without them, or one being replaced).
    pub const NO_SEGMENTS: u32 = 18;
    /// Not a verdict: a stamped packet the path meter could not count (its table was full).
    pub const METER_FULL: u32 = 19;
    /// Passed as it is: the encoding is entropy and no entropy value is known for the
    /// destination, next header and chosen path (not probed yet, or being replaced).
    pub const NO_LABEL: u32 = 20;
    /// Passed as it is: one of this host's entropy probes (`entropy::PROBE_MARK`).
    pub const PROBE: u32 = 21;
    /// Not a verdict: TCP connections of this host's sockets whose round robin began in the
    /// socket's storage ([`super::SOCKET_FLOWS_MAP`]), not in the flow table.
    pub const SOCKET_FLOWS_CREATED: u32 = 22;
    pub const COUNT: u32 = 23;
    const _: () = assert!(COUNT <= super::REASON_SLOTS);
    /// Names in index order, for status and metrics.
    pub const NAMES: [&str; COUNT as usize] = [
        "stamped",
        "not_ipv4",
        "too_short",
        "bad_header",
        "has_options",
        "fragment",
        "not_tcp_udp",
        "not_fabric",
        "no_path",
        "mode_off",
        "adjust_failed",
        "too_big",
        "forged_dropped",
        "pinned",
        "pin_expired",
        "flows_created",
        "flow_table_full",
        "restamped",
        "no_segments",
        "meter_full",
        "no_label",
        "probe",
        "socket_flows_created",
    ];
    /// Whether counter `i` is a verdict: every packet is counted under exactly one verdict.
    pub const fn is_verdict(i: u32) -> bool {
        i < PINNED || i == NO_SEGMENTS || i == NO_LABEL || i == PROBE
    }
}

/// Per-CPU packet counters of `tc_stamp`, indexed by [`stamp_reason`], [`REASON_SLOTS`] long.
pub const STAMP_STATS_MAP: &str = "SOPA_STAMP_V2";

/// Per-CPU counters of the chosen hop values: index `hop0` for the first byte, `256 + hop1` for
/// the second. Counted in segments, so a GSO super-packet counts as the packets it becomes.
pub const HOP_STATS_MAP: &str = "SOPA_HOPS_V1";
pub const HOP_STATS_LEN: u32 = 512;

/// Why `xdp_strip` did what it did: index into [`STRIP_STATS_MAP`].
pub mod strip_reason {
    pub const STRIPPED: u32 = 0;
    pub const NO_OPTION: u32 = 1;
    pub const FOREIGN_OPTION: u32 = 2;
    pub const BAD_LENGTH: u32 = 3;
    pub const NOT_IPV4: u32 = 4;
    pub const TOO_SHORT: u32 = 5;
    pub const BAD_HEADER: u32 = 6;
    pub const ADJUST_FAILED: u32 = 7;
    /// Not verdicts: TCP data packets seen and those that arrived out of order.
    pub const TCP_DATA: u32 = 8;
    pub const TCP_REORDERED: u32 = 9;
    /// The outer IPv6 header of a packet sent to this host's SRv6 address was removed.
    pub const DECAPSULATED: u32 = 10;
    /// IPv6 with an outer destination in the uSID block that is not this host's, or that is
    /// not a packet of ours (a routing header, another payload): left alone.
    pub const FOREIGN_SRV6: u32 = 11;
    /// Not a verdict: a stripped packet the path meter could not count (its table was full).
    pub const METER_FULL: u32 = 12;
    /// Not a verdict: a mark the path meter does not count, from a source no rack of the
    /// fabric holds, on a path no rack's paths to this host take, or in the encoding this
    /// host does not run (forged or stray marks cannot fill its table).
    pub const METER_FOREIGN: u32 = 13;
    /// The entropy encoding: an IPv6 TCP/UDP packet from the fabric whose flow label was
    /// zeroed, so GRO merges it with its flow's others.
    pub const LABEL_CLEARED: u32 = 14;
    pub const COUNT: u32 = 15;
    const _: () = assert!(COUNT <= super::REASON_SLOTS);
    pub const NAMES: [&str; COUNT as usize] = [
        "stripped",
        "no_option",
        "foreign_option",
        "bad_length",
        "not_ipv4",
        "too_short",
        "bad_header",
        "adjust_failed",
        "tcp_data",
        "tcp_reordered",
        "decapsulated",
        "foreign_srv6",
        "meter_full",
        "meter_foreign",
        "label_cleared",
    ];
    /// Whether counter `i` is a verdict (every packet counts under exactly one).
    pub const fn is_verdict(i: u32) -> bool {
        i < TCP_DATA || i == DECAPSULATED || i == FOREIGN_SRV6 || i == LABEL_CLEARED
    }
}

/// Path metering by alternate marking (RFC 9341): time is cut into periods of
/// [`MeterConfig::period_ns`] on the TAI clock, and every packet stamped in an odd period
/// carries [`meter::COLOR`] in its first hop byte. The sender counts packets per (peer rack,
/// path) in the map of the period's color of [`meter::SENT_MAPS`], the receiver per (peer
/// rack, path) in the map of the mark's color of [`meter::RECEIVED_MAPS`]; half a period after
/// a period ends its color's counters are still (its packets have arrived, the next period of
/// that color has not begun), so the two ends' counts of one period compare exactly, with no
/// packet in flight counted as lost. The agent then reads that color's maps and empties them
/// (one batched lookup-and-delete each): a map holds one period's keys, never more.
pub mod meter {
    /// Packets and bytes sent in periods of each color, [`super::MeterSent`] by
    /// [`super::MeterKey`] (peer: the destination's rack), per CPU (each CPU adds to its own
    /// counter: no atomic, no cache line two CPUs write). Before them, `SOPA_SENT_V1`
    /// (packets only) and `SOPA_SENT_V2` held both colors in one shared map that nothing
    /// emptied: it filled for good.
    pub const SENT_MAPS: [&str; 2] = ["SOPA_SENT_C0_V1", "SOPA_SENT_C1_V1"];
    /// Packets received in periods of each color (by the mark), by [`super::MeterKey`] (peer:
    /// the source's rack), per CPU. Before them, `SOPA_RECV_V1`, both colors in one map.
    pub const RECEIVED_MAPS: [&str; 2] = ["SOPA_RECV_C0_V1", "SOPA_RECV_C1_V1"];
    /// The current period's color (0 or 1), a one-entry array of u32 that the host agent
    /// writes at each period's start on the TAI clock: `tc_stamp` reads it instead of a clock
    /// and a division per packet (two thirds of the meter's cost there). Programs of
    /// earlier layouts read the clock themselves and have no such map.
    pub const COLOR_MAP: &str = "SOPA_COLOR_V1";
    /// Entries of each counter map: the (peer rack, path) pairs a host exchanges packets with
    /// in one period (the map is emptied after each reading). Preallocated: a map allocated
    /// entry by entry cost a reading 2.6 times as long (`cargo xtask bench datapath`), and
    /// every period's first packet of a pair an allocation. A packet that finds the map full is
    /// counted under `meter_full` and its period is not judged.
    pub const CAPACITY: u32 = 65_536;
    /// The racks a host counts marks from, a hash of [`super::MeterPeer`] by rack (the
    /// source address masked by [`super::MeterConfig::rack_mask`], network order): what the
    /// paths of each rack to this host may carry in their hop bytes. A mark from anywhere
    /// else is not counted, so the received table holds at most the fabric's own paths.
    pub const PEERS_MAP: &str = "SOPA_METER_PEERS_V1";
    /// Racks [`PEERS_MAP`] holds.
    pub const PEERS_CAPACITY: u32 = 65_536;
    /// The mark of an odd period in the first hop byte (hop values are below
    /// [`super::MAX_UPLINKS`], the detour mark is 0x80).
    pub const COLOR: u8 = 0x40;
    /// What a hop byte names once the marks are off.
    pub const HOP_MASK: u8 = !(COLOR | super::fwd_kind::DETOURED);
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeterConfig {
    /// The period of alternate marking in ns; 0: metering off (no mark, nothing counted).
    pub period_ns: u64,
    /// The rack part of an address (network order, as the packet holds it): a peer is counted
    /// by `address & rack_mask`.
    pub rack_mask: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<MeterConfig>() == 16);

/// What a rack's paths to this host may carry (bare hop bytes): each hop below its limit, and
/// the second also [`crate::wire::HOP_NONE`] where `hop1_none` (paths of one switch between
/// the racks).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeterPeer {
    pub hop_limits: [u8; 2],
    pub hop1_none: u8,
    pub _pad: u8,
}

impl MeterPeer {
    /// Whether a mark of path `hops` (bare) is one these paths can carry.
    #[inline(always)]
    pub fn carries(&self, hops: [u8; 2]) -> bool {
        hops[0] < self.hop_limits[0]
            && (hops[1] < self.hop_limits[1]
                || (hops[1] == crate::wire::HOP_NONE && self.hop1_none != 0))
    }
}
const _: () = assert!(size_of::<MeterPeer>() == 4);

/// A counter of the path meter: the peer's rack (its address masked by
/// [`MeterConfig::rack_mask`], network order), the path's hop bytes without marks, the period's
/// color (0 or 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MeterKey {
    pub peer: u32,
    pub hops: [u8; 2],
    pub color: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<MeterKey>() == 8);

/// What the sender counts per [`MeterKey`]: packets, and the bytes they take on the wire
/// (Ethernet header on; a GSO packet's segments each with their headers), so the controller
/// knows each link's load without taking every packet as full-size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeterSent {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(size_of::<MeterSent>() == 16);

/// Per-CPU packet counters of `xdp_strip`, indexed by [`strip_reason`], [`REASON_SLOTS`] long.
pub const STRIP_STATS_MAP: &str = "SOPA_STRIP_V2";

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: every type is repr(C), made only of integers, with explicit padding.
    unsafe impl aya::Pod for Config {}
    unsafe impl aya::Pod for MeterPeer {}
    unsafe impl aya::Pod for PathSet {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowState {}
    unsafe impl aya::Pod for ReorderState {}
    unsafe impl aya::Pod for Pin {}
    unsafe impl aya::Pod for Encap {}
    unsafe impl aya::Pod for HostConfig {}
    unsafe impl aya::Pod for Srv6Dest {}
    unsafe impl aya::Pod for SegKey {}
    unsafe impl aya::Pod for Segments {}
    unsafe impl aya::Pod for EvKey {}
}

/// Switch role: destination prefix -> this switch's forwarding decision (LPM trie keyed by the
/// IPv4 destination, network order). No entry, or `hop_byte` 0, means "not a decision point for
/// this destination": the kernel routes the packet by destination.
pub const FWD_MAP: &str = "SOPA_FWD_V1";
pub const FWD_CAPACITY: u32 = 16_384;
/// Uplinks a decision can name: k/2 = 32 for a Fat-Tree of k = 64.
pub const MAX_UPLINKS: usize = 32;

/// One uplink: the port to redirect to and the neighbour to resolve on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uplink {
    pub ifindex: u32,
    /// The next switch's address on that link, network order.
    pub nexthop: u32,
}
const _: () = assert!(size_of::<Uplink>() == 8);

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwdEntry {
    /// A decision: 0: none here; 1: decide by hop0; 2: decide by hop1. A detour: the hop byte
    /// to overwrite with `value` (0: none).
    pub hop_byte: u8,
    /// Valid entries of `uplinks`; a hop value at or above it is dropped and counted.
    pub count: u8,
    /// [`fwd_kind`]: a decision, or a detour (this switch's way to the destination is dead).
    pub kind: u8,
    /// A detour's value for `hop_byte`.
    pub value: u8,
    pub uplinks: [Uplink; MAX_UPLINKS],
}

/// What a [`FwdEntry`] is.
pub mod fwd_kind {
    /// Forward by the hop byte `hop_byte` names: `uplinks[hop]` (the first byte without its
    /// [`DETOURED`] mark).
    pub const DECISION: u8 = 0;
    /// Every next hop of this switch towards the destination is dead: leave by `uplinks[0]`,
    /// `hop_byte` (if not 0) overwritten with `value`, the packet marked [`DETOURED`]; a packet
    /// already marked is dropped (counted `detour_refused`): handed to the kernel, whose
    /// routes around the failure lead into other switches' decisions, it would bounce.
    pub const DETOUR: u8 = 1;
    /// Every next hop is dead and no detour reaches the destination: dropped (counted
    /// `unreachable`) rather than handed to the kernel, for the same reason.
    pub const UNREACHABLE: u8 = 2;
    /// The high bit of the first hop byte (always present; hop values stay below it, and the
    /// second byte's "none" is 0xFF): the packet was detoured once already.
    pub const DETOURED: u8 = 0x80;
}
const _: () = assert!(size_of::<FwdEntry>() == 4 + 8 * MAX_UPLINKS);

impl FwdEntry {
    pub const PASS: Self = Self {
        hop_byte: 0,
        count: 0,
        kind: fwd_kind::DECISION,
        value: 0,
        uplinks: [Uplink {
            ifindex: 0,
            nexthop: 0,
        }; MAX_UPLINKS],
    };
}

/// Why `tc_forward` did what it did: index into [`FWD_STATS_MAP`].
pub mod forward_reason {
    pub const REDIRECTED: u32 = 0;
    pub const NO_OPTION: u32 = 1;
    pub const NOT_DECISION: u32 = 2;
    pub const UNKNOWN_HOP: u32 = 3;
    pub const TTL_EXPIRED: u32 = 4;
    pub const NOT_IPV4: u32 = 5;
    pub const TOO_SHORT: u32 = 6;
    pub const BAD_HEADER: u32 = 7;
    pub const REDIRECT_FAILED: u32 = 8;
    /// The option arrived on a port that is not in [`super::TRUST_MAP`] (a host whose agent
    /// is not live): its four bytes were overwritten with NOPs and the kernel routed the
    /// packet, so no switch after this one honours hop bytes a sender chose itself.
    pub const UNTRUSTED: u32 = 9;
    /// Sent out of a detour port (this switch's own way to the destination is dead).
    pub const DETOURED: u32 = 10;
    /// A detoured packet at a second dead end: dropped.
    pub const DETOUR_REFUSED: u32 = 11;
    /// No live way from this switch to the destination: dropped.
    pub const UNREACHABLE: u32 = 12;
    /// SRv6: a packet of the fabric's uSID block left as it is (no rule for its list, or no
    /// port of this switch is dead).
    pub const USID_INTACT: u32 = 13;
    /// SRv6: the list rewritten around a dead port (a uSID substituted).
    pub const USID_REPAIRED: u32 = 14;
    /// SRv6: the list rewritten around a dead port through another way up, the packet marked.
    pub const USID_DETOURED: u32 = 15;
    /// SRv6: a detoured packet at a second dead end: dropped.
    pub const USID_DETOUR_REFUSED: u32 = 16;
    /// SRv6: the rewritten list would not fit the address: dropped.
    pub const USID_NO_ROOM: u32 = 17;
    /// SRv6, uN in eBPF ([`super::UsidRepairConfig::shift`]): this switch's uSID consumed and
    /// the list shifted, then the kernel routes the next uSID.
    pub const USID_SHIFTED: u32 = 18;
    /// SRv6, uN in eBPF: this switch's uSID was the list's last and no routing header follows
    /// (nothing after it to route to): dropped, as the kernel's End drops it.
    pub const USID_LAST: u32 = 19;
    pub const COUNT: u32 = 20;
    const _: () = assert!(COUNT <= super::REASON_SLOTS);
    pub const NAMES: [&str; COUNT as usize] = [
        "redirected",
        "no_option",
        "not_decision",
        "unknown_hop",
        "ttl_expired",
        "not_ipv4",
        "too_short",
        "bad_header",
        "redirect_failed",
        "untrusted",
        "detoured",
        "detour_refused",
        "unreachable",
        "usid_intact",
        "usid_repaired",
        "usid_detoured",
        "usid_detour_refused",
        "usid_no_room",
        "usid_shifted",
        "usid_last",
    ];
}

/// Per-CPU counters of `tc_forward`, indexed by [`forward_reason`], [`REASON_SLOTS`] long.
pub const FWD_STATS_MAP: &str = "SOPA_FWDST_V2";

/// Switch role: the ports whose packets may carry the option (ingress ifindex -> the kind of
/// neighbour, [`trust`]). A switch trusts its links to other switches of the fabric and its
/// links to hosts whose agent the controller reports live; on any other port `tc_forward`
/// neutralizes the option ([`forward_reason::UNTRUSTED`]).
pub const TRUST_MAP: &str = "SOPA_TRUST_V1";
pub const TRUST_CAPACITY: u32 = 4096;

/// Values of [`TRUST_MAP`].
/// The testbed's lossy link (`tc_lossy`): its maps, unpinned, and their slots.
pub mod lossy {
    /// `Array<u32>` of one entry: drops per [`PER`] packets.
    pub const RATE_MAP: &str = "SOPA_LOSSY_RATE";
    /// Per-CPU counters: [`SEEN`], [`DROPPED`].
    pub const STATS_MAP: &str = "SOPA_LOSSY_STATS";
    pub const PROGRAM: &str = "tc_lossy";
    pub const PER: u32 = 1_000_000;
    pub const SEEN: u32 = 0;
    pub const DROPPED: u32 = 1;
    pub const SLOTS: u32 = 2;
}

pub mod trust {
    /// A link to another switch of the fabric.
    pub const SWITCH: u32 = 1;
    /// A link to a host whose agent is live.
    pub const HOST: u32 = 2;
}
/// Per-CPU counters of redirected packets per uplink index (the switch's packets per path).
pub const FWD_UPLINK_STATS_MAP: &str = "SOPA_FWDUP_V1";

/// What the host's socket-option guard refused (per-CPU counters, indexed by [`guard`]).
pub const GUARD_STATS_MAP: &str = "SOPA_GUARD_V1";

/// The socket options `sockopt_guard` refuses: each one a way to send around `tc_stamp`.
pub mod guard {
    /// Not counted: everything else is let through.
    pub const ALLOWED: u32 = 0;
    /// `PACKET_QDISC_BYPASS` on an `AF_PACKET` socket.
    pub const QDISC_BYPASS: u32 = 1;
    /// Any option of an `AF_XDP` socket.
    pub const XDP_SOCKET: u32 = 2;
    pub const SLOTS: u32 = 4;
    pub const NAMES: [&str; 3] = ["allowed", "qdisc_bypass", "xdp_socket"];
}

/// Switch role, SRv6 encoding: `tc_forward`'s local repair of uSID lists around dead ports
/// (`sopa_topology::srv6_failover`).
pub mod usid_repair {
    /// `Array` of one [`super::UsidRepairConfig`] (V1 had no block: the block was fixed).
    pub const CONFIG_MAP: &str = "SOPA_USIDC_V2";
    /// [`super::UsidRuleKey`] -> [`super::UsidRule`].
    pub const RULES_MAP: &str = "SOPA_USIDR_V1";
    pub const CAPACITY: u32 = 8192;
    /// uSIDs a rule can put in.
    pub const MAX_WITH: usize = 4;
}

/// The switch's own uSID (the list's first uSID is its own before its End consumes it), who
/// consumes it, and how many rules there are: with none, and the kernel consuming it, a uSID
/// packet costs one array lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsidRepairConfig {
    pub me: u16,
    /// 1: `tc_forward` itself consumes `me` and shifts the list (uN in eBPF: the kernel has no
    /// `seg6local`, or the agent was told `--usid ebpf`); 0: the kernel's End route does. An
    /// older agent wrote 0 here (the field was padding), which is what it meant.
    pub shift: u16,
    pub rules: u32,
    /// The fabric's uSID block, network order: only packets to it are this program's. All zero
    /// (nothing written yet) matches no packet.
    pub block: crate::srv6::Block,
}
const _: () = assert!(size_of::<UsidRepairConfig>() == 12);

/// The uSID this switch is about to route, and the one after it (0: a host's local uSID, or
/// none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UsidRuleKey {
    pub next: u16,
    pub after: u16,
}

/// `replace` uSIDs from the key's `next` on become `with[..len]`; `detour` marks the packet
/// ([`crate::srv6::FLOW_LABEL_DETOURED`]) and drops one marked already.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsidRule {
    pub replace: u8,
    pub len: u8,
    pub detour: u8,
    pub _pad: u8,
    pub with: [u16; usid_repair::MAX_WITH],
}
const _: () = assert!(size_of::<UsidRule>() == 12);

#[cfg(feature = "user")]
mod fwd_pod {
    use super::*;
    // SAFETY: repr(C), integers only, explicit padding.
    unsafe impl aya::Pod for Uplink {}
    unsafe impl aya::Pod for FwdEntry {}
    unsafe impl aya::Pod for MeterConfig {}
    unsafe impl aya::Pod for MeterKey {}
    unsafe impl aya::Pod for MeterSent {}
    unsafe impl aya::Pod for UsidRepairConfig {}
    unsafe impl aya::Pod for UsidRuleKey {}
    unsafe impl aya::Pod for UsidRule {}
}
