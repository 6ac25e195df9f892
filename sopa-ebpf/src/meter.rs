//! The path meter's datapath half: the current period's color (as the agent set it), and the
//! counters of packets sent and received per (peer rack, path), in a map per color
//! (`sopa_common::maps::meter`). The option carries the color in its first hop byte, the SRv6
//! encoding in RFC 9343's mark (`sopa_common::srv6`).
//!
//! The counters are per CPU: a packet adds to its own CPU's copy with plain adds (no atomic
//! instruction, no cache line another CPU writes), and the agent sums the copies when it reads
//! the color's maps and empties them, half a period after the color's period ended.

use aya_ebpf::{bindings::BPF_NOEXIST, maps::PerCpuHashMap};
use sopa_common::maps::{HostConfig, MeterKey, meter, strip_reason as reason};

use crate::{METER_COLOR, METER_PEERS, METER_RECEIVED0, METER_RECEIVED1, METER_SENT0, METER_SENT1};

/// Metering as configured now: the period's color and the rack mask.
#[derive(Clone, Copy)]
pub struct Meter {
    pub color: u8,
    mask: u32,
}

impl Meter {
    /// The meter, when the host's settings have it on.
    #[inline(always)]
    pub fn now(host: &HostConfig) -> Option<Self> {
        let config = &host.meter;
        if config.period_ns == 0 {
            return None;
        }
        // The agent turns the color at each period's start on the TAI clock (the clock every
        // host's agent reads): a clock read and a division here cost 50 ns a packet.
        let color = METER_COLOR.get(0).copied().unwrap_or(0);
        Some(Self {
            color: (color & 1) as u8,
            mask: config.rack_mask,
        })
    }

    /// The first hop byte as it leaves: marked in an odd period.
    #[inline(always)]
    pub fn mark(&self, hop0: u8) -> u8 {
        if self.color == 1 {
            hop0 | meter::COLOR
        } else {
            hop0
        }
    }

    /// Counts `n` packets of `bytes` on the wire to `daddr` on path `hops`; false when the
    /// table is full.
    #[inline(always)]
    pub fn sent(&self, daddr: [u8; 4], hops: [u8; 2], n: u64, bytes: u64) -> bool {
        let key = self.key(daddr, hops, self.color);
        // Each color's map at a call site of its own (the verifier sees one map per call).
        let counter = if self.color == 0 {
            counter(&METER_SENT0, key)
        } else {
            counter(&METER_SENT1, key)
        };
        let Some(counter) = counter else {
            return false;
        };
        // SAFETY: a pointer from a successful lookup of this CPU's copy, valid for this run.
        unsafe {
            (*counter).packets += n;
            (*counter).bytes += bytes;
        }
        true
    }

    /// Counts `n` packets from `saddr` on path `hops` in the period of `color`, if the mark is
    /// one the fabric's paths to this host can carry ([`meter::PEERS_MAP`]): from a rack of the
    /// fabric, each hop within what that rack's paths use. Returns the strip reason to count
    /// the packet under when it is not counted: `METER_FOREIGN`, or `METER_FULL` (the table
    /// is full).
    #[inline(always)]
    pub fn received(
        host: &HostConfig,
        saddr: [u8; 4],
        hops: [u8; 2],
        color: u8,
        n: u64,
    ) -> Result<(), u32> {
        let config = &host.meter;
        if config.period_ns == 0 {
            return Ok(());
        }
        let peer = u32::from_ne_bytes(saddr) & config.rack_mask;
        let hops = [hops[0] & meter::HOP_MASK, hops[1]];
        // SAFETY: a pointer from a successful lookup, read once (the agent replaces whole
        // values).
        let Some(limits) = METER_PEERS
            .get_ptr(&peer)
            .map(|p| unsafe { core::ptr::read_volatile(p) })
        else {
            return Err(reason::METER_FOREIGN);
        };
        if !limits.carries(hops) {
            return Err(reason::METER_FOREIGN);
        }
        let key = MeterKey {
            peer,
            hops,
            color: color & 1,
            _pad: 0,
        };
        let counter = if key.color == 0 {
            counter(&METER_RECEIVED0, key)
        } else {
            counter(&METER_RECEIVED1, key)
        };
        let Some(counter) = counter else {
            return Err(reason::METER_FULL);
        };
        // SAFETY: as in `sent`.
        unsafe { *counter += n };
        Ok(())
    }

    #[inline(always)]
    fn key(&self, addr: [u8; 4], hops: [u8; 2], color: u8) -> MeterKey {
        MeterKey {
            peer: u32::from_ne_bytes(addr) & self.mask,
            hops: [hops[0] & meter::HOP_MASK, hops[1]],
            color,
            _pad: 0,
        }
    }
}

/// This CPU's counter of `key`, created at zero first; `None` when the map is full.
#[inline(always)]
fn counter<V: Default>(map: &PerCpuHashMap<MeterKey, V>, key: MeterKey) -> Option<*mut V> {
    // One lookup for a counter that exists (every packet but a path's first in the period).
    if let Some(c) = map.get_ptr_mut(&key) {
        return Some(c);
    }
    // Another CPU may create it at the same moment: NOEXIST lets one win, and each CPU finds
    // its own copy of the winner's entry. Only E2BIG says the map is full: a packet arriving
    // late, while the agent empties its color, may see its new entry deleted before it looks
    // it up, and creates it again.
    let mut tries = 0;
    while tries < 2 {
        if let Err(e) = map.insert(&key, &V::default(), u64::from(BPF_NOEXIST))
            && e == -E2BIG
        {
            return None;
        }
        if let Some(c) = map.get_ptr_mut(&key) {
            return Some(c);
        }
        tries += 1;
    }
    None
}

/// `E2BIG` (linux/errno.h): what a map update returns when the map is full.
const E2BIG: i32 = 7;
