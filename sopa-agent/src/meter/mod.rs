//! The host agent's path meter: reads and empties the datapath's per (peer rack, path)
//! counters of a color half a period after each period of alternate marking ends (its color's
//! counters are still then: its packets have arrived and the next period of that color has
//! not begun), and reports what the period sent and received to the controller, which compares
//! the two ends of every path (`sopa_common::maps::meter`).
//!
//! Periods are cut on the TAI clock, counted from the epoch and of the length the controller's
//! snapshot gives (`clock`), so every host of the fabric agrees on them as closely as its clock
//! is synchronized (a quarter of a period is the margin: 62 ms at the default
//! 250 ms). The agent turns the color `tc_stamp` marks with at each period's start
//! (`sopa_common::maps::meter::COLOR_MAP`), on a thread of its own; a turn later than an eighth
//! of a period makes the reading of the period it ends late, and no report is made of it or of
//! the next of its color (the hosts' counts of that color would not end at the same moment).

use std::collections::BTreeMap;

use sopa_channel::proto::{PathReport, PeerPaths};
use sopa_common::maps::{MeterKey, MeterSent};

use crate::datapath::meter_maps::MeterCounts;

mod clock;
pub mod peers;
mod reader;

pub use clock::{
    Clock, DEFAULT_PERIOD, LATE_TURN_DIVISOR, MeterClock, Turned, Turns, reading_late,
    start_turning, tai_ns, turn_at,
};
pub use reader::{MeterStats, Outcome, report_loop};

/// Turns each reading of a color's counters (emptied as they are read) into its period's
/// report, when the reading holds that period's packets and only them.
pub struct PeriodMeter {
    clock: Clock,
    /// Per color: the period of its last reading.
    last: [Option<u64>; 2],
    /// A reading of this color was late: the next one holds packets of two periods.
    dirty: [bool; 2],
    /// The datapath's `meter_full` counters at the last reading of each color: one reading of
    /// a color and the next span the whole period between, so a packet refused in it is seen.
    full: [u64; 2],
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
            full: [0, 0],
            spraying: false,
        }
    }

    /// Takes the counters of period `period`'s color, read and emptied after it closed;
    /// `late`: the reading ended after the next period of that color began (some of its
    /// packets may be in it); `spraying`: the datapath is in `sopa` mode now. A period in which
    /// it may not have sprayed every flow evenly over its paths is reported incomplete: where a
    /// flow keeps to one path (ecmp, pinned, single) or picks at random (rps), a congested path
    /// loses more than its siblings, as a gray link's would.
    /// Returns the period's report, or `None` when this reading cannot give an exact one: the
    /// first of its color (it holds whatever was counted since the maps were last emptied, by
    /// an agent before this one or since its start), one after a missed or late one.
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
        let incomplete = full != self.full[color] || !spraying || !self.spraying;
        self.full[color] = full;
        self.spraying = spraying;
        let exact = !late && !self.dirty[color] && self.last[color] == Some(period.wrapping_sub(2));
        self.dirty[color] = late;
        self.last[color] = Some(period);
        if !exact {
            return None;
        }
        let received = received
            .into_iter()
            .map(|(k, packets)| (k, MeterSent { packets, bytes: 0 }))
            .collect();
        Some(PathReport {
            period,
            period_ms: (self.clock.period_ns / 1_000_000) as u32,
            epoch_ns: self.clock.epoch_ns,
            sent: by_rack(sent, true),
            received: by_rack(received, false),
            incomplete,
        })
    }
}

/// A period's counts grouped by peer rack, with the bytes when `bytes`; keys that counted
/// nothing are left out.
fn by_rack(mut counts: Vec<(MeterKey, MeterSent)>, bytes: bool) -> Vec<PeerPaths> {
    let mut racks: BTreeMap<u32, PeerPaths> = BTreeMap::new();
    counts.sort_by_key(|(k, _)| *k);
    for (k, v) in counts {
        if v.packets == 0 {
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
        e.packets.push(v.packets);
        if bytes {
            e.bytes.push(v.bytes);
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
    fn a_period_is_what_its_reading_counted_after_a_reading_of_the_period_before_of_its_color() {
        let mut m = PeriodMeter::new(Clock::default());
        let a = key([10, 2, 0, 0], [1, 0], 1);
        let b = key([10, 2, 0, 0], [0, 1], 1);
        // First reading of color 1: it holds whatever was counted before it.
        assert!(
            m.sample(7, (vec![(a, out(10))], vec![]), 0, false, true)
                .is_none()
        );
        // Period 8 (color 0) does not disturb color 1.
        assert!(m.sample(8, (vec![], vec![]), 0, false, true).is_none());
        let r = m
            .sample(
                9,
                (vec![(a, out(15)), (b, out(4))], vec![(a, 3)]),
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
    fn a_missed_or_late_reading_gives_no_report_until_a_reading_holds_one_period() {
        let mut m = PeriodMeter::new(Clock::default());
        let a = key([10, 2, 0, 0], [1, 0], 0);
        assert!(
            m.sample(2, (vec![(a, out(1))], vec![]), 0, false, true)
                .is_none()
        );
        // Period 4 missed: 6's reading holds two periods.
        assert!(
            m.sample(6, (vec![(a, out(4))], vec![]), 0, false, true)
                .is_none()
        );
        // Late: no report, and the next one holds packets of the period after too.
        assert!(
            m.sample(8, (vec![(a, out(4))], vec![]), 0, true, true)
                .is_none()
        );
        assert!(
            m.sample(10, (vec![(a, out(3))], vec![]), 0, false, true)
                .is_none()
        );
        let r = m
            .sample(12, (vec![(a, out(8))], vec![]), 0, false, true)
            .expect("clean again");
        assert_eq!(r.sent[0].packets, vec![8]);
        // A full table since the last reading marks the report incomplete.
        let r = m
            .sample(14, (vec![(a, out(1))], vec![]), 3, false, true)
            .expect("a report");
        assert!(r.incomplete);
        let r = m
            .sample(16, (vec![(a, out(1))], vec![]), 3, false, true)
            .expect("a report");
        assert!(!r.incomplete);
        // Not spraying now, or at the reading before: incomplete (congestion would look gray).
        let r = m
            .sample(18, (vec![(a, out(1))], vec![]), 3, false, false)
            .expect("a report");
        assert!(r.incomplete);
        let r = m
            .sample(20, (vec![(a, out(1))], vec![]), 3, false, true)
            .expect("a report");
        assert!(r.incomplete);
        // A key that counted nothing is left out of the report.
        let r = m
            .sample(22, (vec![(a, out(0))], vec![]), 3, false, true)
            .expect("a report");
        assert!(r.sent.is_empty());
    }

    #[test]
    fn a_packet_refused_early_in_a_period_marks_its_report_though_the_other_color_saw_it_first() {
        let mut m = PeriodMeter::new(Clock::default());
        let a = key([10, 2, 0, 0], [1, 0], 0);
        for p in 0..4 {
            let _ = m.sample(p, (vec![(a, out(1))], vec![]), 0, false, true);
        }
        // A packet of period 5 refused in its first half: the reading of period 4, half a
        // period into 5, is the first to see the count grow; 5's own reading must not take
        // that reading's count as its baseline.
        let r = m
            .sample(4, (vec![(a, out(1))], vec![]), 1, false, true)
            .expect("a report");
        assert!(r.incomplete, "4 may have lost it too");
        let r = m
            .sample(5, (vec![(a, out(1))], vec![]), 1, false, true)
            .expect("a report");
        assert!(r.incomplete, "5 lost it");
        let r = m
            .sample(6, (vec![(a, out(1))], vec![]), 1, false, true)
            .expect("a report");
        assert!(!r.incomplete, "6 lost nothing");
    }
}
