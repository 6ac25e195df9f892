//! The path meter's datapath half: the current period's color, and the counters of packets sent
//! and received per (peer rack, path, color) (`sopa_common::maps::meter`). The option carries
//! the color in its first hop byte, the SRv6 encoding in RFC 9343's mark (`sopa_common::srv6`).

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_tai_ns, maps::HashMap};
use sopa_common::maps::{MeterKey, meter};

use crate::{METER_CONFIG, METER_RECEIVED, METER_SENT};

/// Metering as configured now: the period's color and the rack mask.
#[derive(Clone, Copy)]
pub struct Meter {
    pub color: u8,
    mask: u32,
}

impl Meter {
    /// The meter, when it is on.
    #[inline(always)]
    pub fn now() -> Option<Self> {
        let config = METER_CONFIG.get(0)?;
        if config.period_ns == 0 {
            return None;
        }
        // SAFETY: a helper without arguments (TAI: the clock every host's agent reads too).
        let period = unsafe { bpf_ktime_get_tai_ns() } / config.period_ns;
        Some(Self {
            color: (period & 1) as u8,
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

    /// Counts `n` packets to `daddr` on path `hops`; false when the table is full.
    #[inline(always)]
    pub fn sent(&self, daddr: [u8; 4], hops: [u8; 2], n: u64) -> bool {
        add(&METER_SENT, self.key(daddr, hops, self.color), n)
    }

    /// Counts `n` packets from `saddr` on path `hops` (bare) in the period of `color`; false
    /// when the table is full.
    #[inline(always)]
    pub fn received(saddr: [u8; 4], hops: [u8; 2], color: u8, n: u64) -> bool {
        let Some(config) = METER_CONFIG.get(0) else {
            return true;
        };
        if config.period_ns == 0 {
            return true;
        }
        let key = MeterKey {
            peer: u32::from_ne_bytes(saddr) & config.rack_mask,
            hops: [hops[0] & meter::HOP_MASK, hops[1]],
            color: color & 1,
            _pad: 0,
        };
        add(&METER_RECEIVED, key, n)
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

/// Adds `n` to the counter of `key`, creating it at 0 first; false when the map is full.
#[inline(always)]
fn add(map: &HashMap<MeterKey, u64>, key: MeterKey, n: u64) -> bool {
    use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};
    // One lookup for a counter that exists (every packet but a path's first).
    let counter = match map.get_ptr_mut(&key) {
        Some(c) => Some(c),
        None => {
            // Another CPU may create it at the same moment: NOEXIST lets one win, both add.
            let _ = map.insert(&key, &0, u64::from(BPF_NOEXIST));
            map.get_ptr_mut(&key)
        }
    };
    match counter {
        Some(counter) => {
            // SAFETY: a pointer from a successful lookup, valid for this run, u64-aligned;
            // atomic because two CPUs count one peer's path at once (see `tc_stamp::account`).
            unsafe { atomic_xadd::<u64, u64, { Relaxed }>(counter, n) };
            true
        }
        None => false,
    }
}
