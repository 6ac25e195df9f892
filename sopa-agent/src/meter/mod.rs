//! The host agent's path meter: reads the datapath's per (peer rack, path, color) counters
//! half a period after each period of alternate marking ends (its color's counters are still
//! then: its packets have arrived and the next period of that color has not begun), and
//! reports what the period sent and received to the controller, which compares the two ends
//! of every path (`sopa_common::maps::meter`).
//!
//! Periods are cut on the TAI clock, counted from the epoch and of the length the controller's
//! snapshot gives (`clock`), so every host of the fabric agrees on them as closely as its clock
//! is synchronized (a quarter of a period is the margin: 62 ms at the default
//! 250 ms). The agent turns the color `tc_stamp` marks with at each period's start
//! (`sopa_common::maps::meter::COLOR_MAP`), on a thread of its own; a turn later than an eighth
//! of a period makes the reading of the period it ends late, and no report is made of it or of
//! the next of its color (the hosts' counts of that color would not end at the same moment).

use std::collections::{BTreeMap, HashMap};

use sopa_channel::proto::{PathReport, PeerPaths};
use sopa_common::maps::{MeterKey, MeterSent};

use crate::datapath::maps::MeterCounts;

mod clock;
pub mod peers;
mod reader;

pub use clock::{
    Clock, DEFAULT_PERIOD, LATE_TURN_DIVISOR, MeterClock, Turned, Turns, reading_late,
    start_turning, tai_ns, turn_at,
};
pub use reader::{MeterStats, Outcome, report_loop};

/// One color's counters as last read, and the period they closed.
struct Reading {
    period: u64,
    sent: HashMap<MeterKey, MeterSent>,
    received: HashMap<MeterKey, MeterSent>,
}

/// Turns successive readings of the cumulative counters into each period's packets.
pub struct PeriodMeter {
    clock: Clock,
    last: [Option<Reading>; 2],
    /// A reading of this color was late: the next one's baseline is not clean either.
    dirty: [bool; 2],
    /// The datapath's `meter_full` counters at the last reading.
    full: u64,
    /// Whether the datapath sprayed (`sopa` mode) at the last reading.
    spraying: bool,
}

impl PeriodMeter {
    /// The clock whose periods it meters.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// A meter of periods of `clock` (a new clock needs a new meter: its periods are others).
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            last: [None, None],
            dirty: [false, false],
            full: 0,
            spraying: false,
        }
    }

    /// Takes the counters of period `period`'s color read after it closed; `late`: the reading
    /// ended after the next period of that color began (some of its packets may be in it);
    /// `spraying`: the datapath is in `sopa` mode now. A period in which it may not have
    /// sprayed every flow evenly over its paths is reported incomplete: where a flow keeps to
    /// one path (ecmp, pinned, single) or picks at random (rps), a congested path loses more
    /// than its siblings, as a gray link's would.
    /// Returns the period's report, or `None` when this reading cannot give an exact one (the
    /// first of its color, after a missed or late one).
    pub fn sample(
        &mut self,
        period: u64,
        counts: MeterCounts,
        full: u64,
        late: bool,
        spraying: bool,
    ) -> Option<PathReport> {
        let color = (period & 1) as usize;
        let (sent, received) = counts;
        let now = Reading {
            period,
            sent: sent
                .into_iter()
                .map(|(mut k, v)| (clear(&mut k), v))
                .collect(),
            received: received
                .into_iter()
                .map(|(mut k, packets)| (clear(&mut k), MeterSent { packets, bytes: 0 }))
                .collect(),
        };
        let incomplete = full != self.full || !spraying || !self.spraying;
        self.full = full;
        self.spraying = spraying;
        let exact = !late
            && !self.dirty[color]
            && matches!(&self.last[color], Some(r) if r.period + 2 == period);
        self.dirty[color] = late;
        let before = self.last[color].replace(now);
        if !exact {
            return None;
        }
        let (before, now) = (before?, self.last[color].as_ref()?);
        Some(PathReport {
            period,
            period_ms: (self.clock.period_ns / 1_000_000) as u32,
            epoch_ns: self.clock.epoch_ns,
            sent: deltas(&before.sent, &now.sent, true),
            received: deltas(&before.received, &now.received, false),
            incomplete,
        })
    }
}

/// The key without its color (readings are kept per color already).
fn clear(k: &mut MeterKey) -> MeterKey {
    k.color = 0;
    *k
}

/// What each key counted since `before`, grouped by peer rack, with the bytes when `bytes`;
/// keys that did not move are left out.
fn deltas(
    before: &HashMap<MeterKey, MeterSent>,
    now: &HashMap<MeterKey, MeterSent>,
    bytes: bool,
) -> Vec<PeerPaths> {
    let mut racks: BTreeMap<u32, PeerPaths> = BTreeMap::new();
    let mut keys: Vec<_> = now.iter().collect();
    keys.sort_by_key(|(k, _)| **k);
    for (k, v) in keys {
        let was = before.get(k).copied().unwrap_or_default();
        let d = v.packets.saturating_sub(was.packets);
        if d == 0 {
            continue;
        }
        // The key holds the address as the packet does (network order).
        let rack = u32::from_be_bytes(k.peer.to_ne_bytes());
        let e = racks.entry(rack).or_insert_with(|| PeerPaths {
            rack,
            ..PeerPaths::default()
        });
        e.hops
            .push(u32::from(k.hops[0]) | (u32::from(k.hops[1]) << 8));
        e.packets.push(d);
        if bytes {
            e.bytes.push(v.bytes.saturating_sub(was.bytes));
        }
    }
    racks.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `packets` sent, 100 bytes each.
    fn out(packets: u64) -> MeterSent {
        MeterSent {
            packets,
            bytes: packets * 100,
        }
    }

    fn key(peer: [u8; 4], hops: [u8; 2], color: u8) -> MeterKey {
        MeterKey {
            peer: u32::from_ne_bytes(peer),
            hops,
            color,
            _pad: 0,
        }
    }

    #[test]
    fn a_period_is_the_difference_of_two_readings_of_its_color() {
        let mut m = PeriodMeter::new(Clock::default());
        let a = key([10, 2, 0, 0], [1, 0], 1);
        let b = key([10, 2, 0, 0], [0, 1], 1);
        // First reading of color 1: no baseline yet.
        assert!(
            m.sample(7, (vec![(a, out(10))], vec![]), 0, false, true)
                .is_none()
        );
        // Period 8 (color 0) does not disturb color 1's baseline.
        assert!(m.sample(8, (vec![], vec![]), 0, false, true).is_none());
        let r = m
            .sample(
                9,
                (vec![(a, out(25)), (b, out(4))], vec![(a, 3)]),
                0,
                false,
                true,
            )
            .expect("an exact period");
        assert_eq!(r.period, 9);
        assert_eq!(r.sent.len(), 1);
        assert_eq!(
            r.sent[0].rack,
            u32::from(std::net::Ipv4Addr::new(10, 2, 0, 0))
        );
        assert_eq!(r.sent[0].hops, vec![1 << 8, 1]);
        assert_eq!(r.sent[0].packets, vec![4, 15]);
        assert_eq!(r.sent[0].bytes, vec![400, 1500]);
        assert_eq!(r.received[0].packets, vec![3]);
        assert!(r.received[0].bytes.is_empty());
        assert!(!r.incomplete);
    }

    #[test]
    fn a_missed_or_late_reading_gives_no_report_until_the_baseline_is_clean() {
        let mut m = PeriodMeter::new(Clock::default());
        let a = key([10, 2, 0, 0], [1, 0], 0);
        assert!(
            m.sample(2, (vec![(a, out(1))], vec![]), 0, false, true)
                .is_none()
        );
        // Period 4 missed: 6 is two periods after nothing.
        assert!(
            m.sample(6, (vec![(a, out(5))], vec![]), 0, false, true)
                .is_none()
        );
        // Late: no report, and the next one's baseline is tainted too.
        assert!(
            m.sample(8, (vec![(a, out(9))], vec![]), 0, true, true)
                .is_none()
        );
        assert!(
            m.sample(10, (vec![(a, out(12))], vec![]), 0, false, true)
                .is_none()
        );
        let r = m
            .sample(12, (vec![(a, out(20))], vec![]), 0, false, true)
            .expect("clean again");
        assert_eq!(r.sent[0].packets, vec![8]);
        // A full table since the last reading marks the report incomplete.
        let r = m
            .sample(14, (vec![(a, out(21))], vec![]), 3, false, true)
            .expect("a report");
        assert!(r.incomplete);
        let r = m
            .sample(16, (vec![(a, out(22))], vec![]), 3, false, true)
            .expect("a report");
        assert!(!r.incomplete);
        // Not spraying now, or at the reading before: incomplete (congestion would look gray).
        let r = m
            .sample(18, (vec![(a, out(23))], vec![]), 3, false, false)
            .expect("a report");
        assert!(r.incomplete);
        let r = m
            .sample(20, (vec![(a, out(24))], vec![]), 3, false, true)
            .expect("a report");
        assert!(r.incomplete);
    }
}
