//! Packet helpers shared by the BPF_PROG_TEST_RUN fixture tables.
#![allow(dead_code)]

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use aya::programs::{TestRun as _, TestRunOptions};
use sopa_agent::{
    datapath::{Datapath, MapSet},
    path_table::PathTable,
};
use sopa_common::{
    maps::{Config, MeterKey, MeterSent},
    wire::ipv4_header_checksum,
};

/// The fabric's IPv6 address of an IPv4 one (fd00:5a::/96 + the 32 bits).
pub fn six(v4: [u8; 4]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&[0xfd, 0, 0, 0x5a]);
    a[12..].copy_from_slice(&v4);
    a
}

/// The counters that went up between two readings of a program's counters, by name.
pub fn verdicts(before: &[u64], after: &[u64], names: &[&'static str]) -> Vec<&'static str> {
    (0..names.len())
        .filter(|&i| after[i] > before[i])
        .map(|i| names[i])
        .collect()
}

/// TCX_NEXT: the packet goes on to the programs and filters attached after ours.
pub const TC_ACT_UNSPEC: u32 = -1i32 as u32;
pub const TC_ACT_SHOT: u32 = 2;
pub const XDP_PASS: u32 = 2;

/// A loaded datapath whose pins live in a folder of its own, removed on drop.
pub struct Fixture {
    pub datapath: Datapath,
    pub maps: MapSet,
    pub pins: PathBuf,
}

impl Fixture {
    pub fn new(table: &str, mode: u32) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let pins = PathBuf::from(format!(
            "/sys/fs/bpf/sopa-test-fixtures-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let datapath = Datapath::load(&pins).expect("the programs load and pass the verifier");
        Self::from_loaded(datapath, pins, table, mode)
    }

    pub fn from_loaded(mut datapath: Datapath, pins: PathBuf, table: &str, mode: u32) -> Self {
        let mut maps = datapath.take_maps().unwrap();
        maps.set_config(Config { mode, hash_seed: 7 }).unwrap();
        let table = PathTable::parse(table).unwrap();
        maps.apply_paths(&table).unwrap();
        maps.apply_encoding(&table).unwrap();
        Self {
            datapath,
            maps,
            pins,
        }
    }

    /// One of the datapath's maps, opened from its pin (to read or damage it behind the
    /// agent's back).
    pub fn pinned(&self, name: &str) -> aya::maps::Map {
        aya::maps::Map::from_map_data(aya::maps::MapData::from_pin(self.pins.join(name)).unwrap())
            .unwrap()
    }

    /// Changes the datapath's current settings (`HOST_MAP`'s current slot) in place, which no
    /// agent does (it writes the other slot and names it): a fixture's packets run one at a
    /// time, never under the write.
    pub fn set_host(&self, change: impl FnOnce(&mut sopa_common::maps::HostConfig)) {
        use aya::maps::{Array, MapData};
        use sopa_common::maps::{HOST_INDEX_MAP, HOST_MAP, HostConfig};
        let index: Array<MapData, u32> = self.pinned(HOST_INDEX_MAP).try_into().unwrap();
        let current = index.get(&0, 0).unwrap() & 1;
        let mut slots: Array<MapData, HostConfig> = self.pinned(HOST_MAP).try_into().unwrap();
        let mut host = slots.get(&current, 0).unwrap();
        change(&mut host);
        slots.set(current, host, 0).unwrap();
    }

    pub fn stamp(&mut self, packet: &[u8]) -> Vec<u8> {
        let (action, out) = self.stamp_with(packet, None);
        assert_eq!(action, TC_ACT_UNSPEC, "tc_stamp passes this packet on");
        out
    }

    /// tc_stamp's action and output for `packet`, with `ctx` as its `__sk_buff`.
    pub fn stamp_with(&mut self, packet: &[u8], ctx: Option<&[u8]>) -> (u32, Vec<u8>) {
        let mut out = vec![0u8; packet.len() + 64];
        let opts = TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ctx_in: ctx,
            ..Default::default()
        };
        let result = self
            .datapath
            .stamp_program()
            .test_run(opts)
            .expect("test_run tc_stamp");
        out.truncate(result.data_size_out as usize);
        (result.return_value, out)
    }

    pub fn strip(&mut self, packet: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; packet.len() + 64];
        let opts = TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ..Default::default()
        };
        let result = self
            .datapath
            .strip_program()
            .test_run(opts)
            .expect("test_run xdp_strip");
        assert_eq!(
            result.return_value, XDP_PASS,
            "xdp_strip always passes packets on"
        );
        out.truncate(result.data_size_out as usize);
        out
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pins);
    }
}

/// The fixtures' path table: a single-decision prefix with 3 paths, a two-decision one with 4.
pub const TABLE: &str = r#"
[[destination]]
prefix = "10.2.0.0/24"
paths = [[0], [1], [2]]
[[destination]]
prefix = "10.3.0.0/16"
paths = [[0, 0], [0, 1], [1, 0], [1, 1]]
"#;

/// Recomputes the IPv4 header checksum of an Ethernet frame in place.
pub fn fix_ipv4_checksum(frame: &mut [u8]) {
    let ihl = usize::from(frame[14] & 0x0f).max(5) * 4;
    frame[24] = 0;
    frame[25] = 0;
    let end = (14 + ihl).min(frame.len());
    let sum = ipv4_header_checksum(&frame[14..end]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
}

/// What `tc_stamp` makes of an IHL-5 frame for the path (hop0, hop1): the checksum adjusted for
/// the words that changed or came (RFC 1624), so a valid one stays valid and a wrong one stays
/// wrong by as much.
pub fn with_option(original: &[u8], hop0: u8, hop1: u8) -> Vec<u8> {
    use sopa_common::wire::{checksum_adjust, word};
    let mut p = original.to_vec();
    p.splice(34..34, [0x9E, 4, hop0, hop1]);
    p[14] = 0x46;
    let tot = u16::from_be_bytes([p[16], p[17]]).wrapping_add(4);
    p[16..18].copy_from_slice(&tot.to_be_bytes());
    let old = word(original[14], original[15]) + word(original[16], original[17]);
    let new = word(p[14], p[15]) + word(p[16], p[17]) + word(0x9E, 4) + word(hop0, hop1);
    let check = checksum_adjust(u16::from_be_bytes([p[24], p[25]]), old, new);
    p[24..26].copy_from_slice(&check.to_be_bytes());
    p
}

/// The IPv4 header checksum of a frame is valid.
pub fn checksum_ok(frame: &[u8]) -> bool {
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    sopa_common::wire::ipv4_header_checksum(&frame[14..14 + ihl]) == 0
}

/// An `__sk_buff` for BPF_PROG_TEST_RUN: a GSO packet of `segs` segments carrying `gso_size`
/// bytes of payload each (offsets of `gso_segs` and `gso_size` in the UAPI struct).
pub fn gso_ctx(segs: u32, gso_size: u32) -> [u8; 192] {
    let mut ctx = [0u8; 192];
    ctx[164..168].copy_from_slice(&segs.to_ne_bytes());
    ctx[176..180].copy_from_slice(&gso_size.to_ne_bytes());
    ctx
}

/// The path meter's packets in all, over `counts`.
pub fn meter_total(counts: &[(MeterKey, u64)]) -> u64 {
    counts.iter().map(|(_, n)| n).sum()
}

/// The sender's meter counts as packets only.
pub fn meter_packets(counts: &[(MeterKey, MeterSent)]) -> Vec<(MeterKey, u64)> {
    counts.iter().map(|(k, c)| (*k, c.packets)).collect()
}

/// The sender's meter bytes in all, over `counts`.
pub fn meter_bytes(counts: &[(MeterKey, MeterSent)]) -> u64 {
    counts.iter().map(|(_, c)| c.bytes).sum()
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t filled by the kernel for this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu`.
pub fn run_on_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity to CPU {cpu}"
        );
    }
}
