//! The host agent's path meter: reads the datapath's per (peer rack, path, color) counters
//! half a period after each period of alternate marking ends (its color's counters are still
//! then: its packets have arrived and the next period of that color has not begun), and
//! reports what the period sent and received to the controller, which compares the two ends
//! of every path (`sopa_common::maps::meter`).
//!
//! Periods are cut on the TAI clock, so every host of the fabric agrees on them as closely as
//! its clock is synchronized (a quarter of a period is the margin: 62 ms at the default
//! 250 ms). The agent turns the color `tc_stamp` marks with at each period's start
//! (`sopa_common::maps::meter::COLOR_MAP`), on a thread of its own; a turn later than an eighth
//! of a period makes the reading of the period it ends late, and no report is made of it or of
//! the next of its color (the hosts' counts of that color would not end at the same moment).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use sopa_channel::proto::{PathReport, PeerPaths, agent_message::Kind};
use sopa_common::maps::{MeterKey, MeterSent, stamp_reason, strip_reason};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::datapath::{MapSet, maps::MeterCounts};

/// The default period of alternate marking.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(250);

/// TAI nanoseconds (`CLOCK_TAI`, the clock of `bpf_ktime_get_tai_ns`).
pub fn tai_ns() -> u64 {
    crate::hedera::clock_ns(libc::CLOCK_TAI)
}

/// One color's counters as last read, and the period they closed.
struct Reading {
    period: u64,
    sent: HashMap<MeterKey, MeterSent>,
    received: HashMap<MeterKey, MeterSent>,
}

/// Turns successive readings of the cumulative counters into each period's packets.
pub struct PeriodMeter {
    period: Duration,
    last: [Option<Reading>; 2],
    /// A reading of this color was late: the next one's baseline is not clean either.
    dirty: [bool; 2],
    /// The datapath's `meter_full` counters at the last reading.
    full: u64,
    /// Whether the datapath sprayed (`sopa` mode) at the last reading.
    spraying: bool,
}

impl PeriodMeter {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
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
            period_ms: self.period.as_millis() as u32,
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

/// A turn later than this share of a period (an eighth: 31 ms at the default 250 ms) makes the
/// readings it touched late. A period is exact while the hosts' clock skew, a turn's delay and
/// the packets' time in flight stay under half a period: a quarter is the clocks' margin, an
/// eighth the turn's, an eighth the flight's.
pub const LATE_TURN_DIVISOR: u64 = 8;

/// The color's last turn: the period turned to, and whether the turn was late or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turned {
    pub period: u64,
    pub late: bool,
}

/// What the turning thread shares with the reader: its last turn.
pub type Turns = Arc<Mutex<Option<Turned>>>;

/// What became of a period's reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An exact report, handed to the channel.
    Reported,
    /// Turned or read too late to be exact, or not read at all (the reader woke a period or
    /// more late): no report.
    Late,
    /// The reading of a color after none, a late or an unread one: a baseline, no report.
    Baseline,
    /// Exact, but the channel's queue was full (the controller away): dropped.
    Unsent,
    /// The counters could not be read.
    Unread,
}

impl Outcome {
    pub const ALL: [Self; 5] = [
        Self::Reported,
        Self::Late,
        Self::Baseline,
        Self::Unsent,
        Self::Unread,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Late => "late",
            Self::Baseline => "baseline",
            Self::Unsent => "unsent",
            Self::Unread => "unread",
        }
    }
}

/// What the path meter did, for the agent's metrics: its readings of periods by outcome, and
/// the color's turns past their eighth of a period (or failed).
#[derive(Debug, Default)]
pub struct MeterStats {
    readings: [AtomicU64; Outcome::ALL.len()],
    late_turns: AtomicU64,
}

impl MeterStats {
    pub fn readings(&self, outcome: Outcome) -> u64 {
        self.readings[outcome as usize].load(Relaxed)
    }

    pub fn late_turns(&self) -> u64 {
        self.late_turns.load(Relaxed)
    }

    fn count(&self, outcome: Outcome, n: u64) {
        self.readings[outcome as usize].fetch_add(n, Relaxed);
    }
}

/// The turn made at `now` (TAI ns) for its period, with a period of `t` ns.
pub fn turn_at(now: u64, t: u64) -> Turned {
    Turned {
        period: now / t,
        late: now % t > t / LATE_TURN_DIVISOR,
    }
}

/// Whether the reading that closes period `closed` is late for want of a timely turn into the
/// next period (the closed period's color was still in use after the margin, or still is).
pub fn reading_late(turned: Option<Turned>, closed: u64) -> bool {
    !matches!(turned, Some(Turned { period, late: false }) if period == closed + 1)
}

/// Turns the meter's color at each period's start on the TAI clock, on a thread of its own
/// (`clock_nanosleep` on `CLOCK_TAI` to the period's start: no runtime's timer or task, and
/// no lock the agent's other work holds, delays it). With the period 0, or without a color to
/// turn, nothing is started and `None` is returned: no period is reported then. (The agent
/// always runs the programs of its own build, which take the color from it; only the pins of
/// an older datapath lack the color, and `MapSet::meter_color` says `None` for them.) The thread
/// ends at its next turn once every [`Turns`] handle is dropped.
pub fn start_turning(
    maps: &Mutex<MapSet>,
    period: Duration,
    stats: Arc<MeterStats>,
) -> crate::error::Result<Option<Turns>> {
    let t = period.as_nanos() as u64;
    if t == 0 {
        return Ok(None);
    }
    let Some(mut color) = maps.lock().expect("maps lock").meter_color()? else {
        warn!("this datapath's programs take no color from the agent; no path reports");
        return Ok(None);
    };
    let turns: Turns = Arc::new(Mutex::new(None));
    let shared = Arc::clone(&turns);
    std::thread::Builder::new()
        .name("meter-color".into())
        .spawn(move || {
            // The first turn is made at the agent's start, wherever in its period that falls:
            // late for the reading (it is marked so), but not a late turn to count.
            let mut started = false;
            loop {
                let turn = turn_at(tai_ns(), t);
                let turn = match color.set((turn.period & 1) as u8) {
                    Ok(()) => turn,
                    Err(err) => {
                        warn!(%err, "turning the path meter's color");
                        Turned { late: true, ..turn }
                    }
                };
                if turn.late && started {
                    stats.late_turns.fetch_add(1, Relaxed);
                }
                started = true;
                *shared.lock().expect("turns lock") = Some(turn);
                sleep_until_tai((turn.period + 1) * t);
                if Arc::strong_count(&shared) == 1 {
                    return;
                }
            }
        })
        .map_err(|e| crate::error::Error::io("starting the path meter's color thread", e))?;
    Ok(Some(turns))
}

/// Sleeps until TAI time `at` (ns): again after a signal's interruption (the time is absolute),
/// and with the monotonic clock's sleep where the kernel cannot sleep on `CLOCK_TAI`.
fn sleep_until_tai(at: u64) {
    let ts = libc::timespec {
        tv_sec: (at / 1_000_000_000) as libc::time_t,
        tv_nsec: (at % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: the timespec is valid; no remainder is asked for (absolute time).
        let err = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_TAI,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        match err {
            0 => return,
            libc::EINTR => continue,
            _ => {
                std::thread::sleep(Duration::from_nanos(at.saturating_sub(tai_ns())));
                return;
            }
        }
    }
}

/// Reads the meter half a period after each period ends and sends its report; `turns`: the
/// color's turns ([`start_turning`]); `stats` counts each period's outcome.
pub async fn report_loop(
    maps: Arc<Mutex<MapSet>>,
    reports: mpsc::Sender<Kind>,
    period: Duration,
    turns: Turns,
    stats: Arc<MeterStats>,
) {
    let t = period.as_nanos() as u64;
    if t == 0 || !maps.lock().expect("maps lock").has_meter() {
        return;
    }
    let mut meter = PeriodMeter::new(period);
    let mut last_closed: Option<u64> = None;
    loop {
        let now = tai_ns();
        let next = (now / t) * t + t / 2;
        let next = if next <= now { next + t } else { next };
        tokio::time::sleep(Duration::from_nanos(next - now)).await;
        // The period planned for: woken in the next one (the runtime held up), its color may be
        // in use again or its last packets not in yet, and `read_and_report` finds the reading
        // late (it checks the time once the counters are read).
        let Some(closed) = (next / t).checked_sub(1) else {
            continue;
        };
        // Periods the reader slept through (the runtime held it up for a period or more) were
        // never read: late, as far as the controller is concerned.
        if let Some(last) = last_closed {
            stats.count(Outcome::Late, closed.saturating_sub(last + 1));
        }
        last_closed = Some(closed);
        let late = reading_late(*turns.lock().expect("turns lock"), closed);
        let outcome = read_and_report(&maps, &reports, &mut meter, closed, late, t);
        stats.count(outcome, 1);
    }
}

/// Reads the counters of period `closed`'s color and sends the period's report, if exact.
fn read_and_report(
    maps: &Mutex<MapSet>,
    reports: &mpsc::Sender<Kind>,
    meter: &mut PeriodMeter,
    closed: u64,
    late: bool,
    t: u64,
) -> Outcome {
    let read = {
        let maps = maps.lock().expect("maps lock");
        let full = |m: &MapSet| -> crate::error::Result<u64> {
            let stamp = m.stamp_counters()?;
            let strip = m.strip_counters()?;
            Ok(stamp[stamp_reason::METER_FULL as usize] + strip[strip_reason::METER_FULL as usize])
        };
        maps.meter_counts((closed & 1) as u8).and_then(|c| {
            Ok((
                c,
                full(&maps)?,
                maps.config()?.mode == sopa_common::maps::mode::SOPA,
            ))
        })
    };
    let (counts, full, spraying) = match read {
        Ok(r) => r,
        Err(err) => {
            warn!(%err, "reading the path meter");
            return Outcome::Unread;
        }
    };
    // Done before the next period of this color began?
    let late = late || tai_ns() / t != closed + 1;
    let Some(report) = meter.sample(closed, counts, full, late, spraying) else {
        debug!(
            period = closed,
            late, "no exact path report for this period"
        );
        return if late {
            Outcome::Late
        } else {
            Outcome::Baseline
        };
    };
    debug!(
        period = closed,
        sent_racks = report.sent.len(),
        received_racks = report.received.len(),
        "path report"
    );
    // A full queue (controller away) drops the report: the controller judges no period it
    // lacks a host's report of.
    match reports.try_send(Kind::Paths(report)) {
        Ok(()) => Outcome::Reported,
        Err(_) => Outcome::Unsent,
    }
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
    fn a_turn_past_an_eighth_of_the_period_makes_the_reading_it_ends_late() {
        // A period of 1,000 ns: period 10 starts at 10,000.
        let t = 1000;
        assert_eq!(
            turn_at(10_005, t),
            Turned {
                period: 10,
                late: false
            }
        );
        assert!(!turn_at(10_125, t).late, "an eighth: in time");
        assert!(turn_at(10_126, t).late, "past an eighth: late");
        // The reading of period 9, made in period 10.
        let on_time = Some(turn_at(10_005, t));
        assert!(!reading_late(on_time, 9));
        assert!(reading_late(Some(turn_at(10_300, t)), 9), "turned late");
        assert!(
            reading_late(Some(turn_at(9_005, t)), 9),
            "not turned yet: period 9's color still in use"
        );
        assert!(reading_late(None, 9), "never turned");
        assert!(
            reading_late(Some(turn_at(11_005, t)), 9),
            "the reading itself ran into the next period"
        );
        assert!(
            reading_late(
                Some(Turned {
                    period: 10,
                    late: true
                }),
                9
            ),
            "a failed turn"
        );
    }

    #[test]
    fn a_period_is_the_difference_of_two_readings_of_its_color() {
        let mut m = PeriodMeter::new(DEFAULT_PERIOD);
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
        let mut m = PeriodMeter::new(DEFAULT_PERIOD);
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
