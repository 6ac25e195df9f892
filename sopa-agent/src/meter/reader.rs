//! The meter's reader: half a period after each period ends, the counters of its color are
//! read and emptied and the period's report is sent to the controller; and what became of each reading,
//! for the agent's metrics.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use sopa_channel::proto::agent_message::Kind;
use sopa_common::maps::{stamp_reason, strip_reason};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::{MeterClock, PeriodMeter, Turns, reading_late, tai_ns};
use crate::datapath::{MapSet, meter_maps::MeterCounters};

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

    /// A turn of the color past its eighth of a period, or failed.
    pub(super) fn late_turn(&self) {
        self.late_turns.fetch_add(1, Relaxed);
    }

    fn count(&self, outcome: Outcome, n: u64) {
        self.readings[outcome as usize].fetch_add(n, Relaxed);
    }
}

/// Reads and empties the meter half a period after each period ends and sends its report to
/// `reports` (`None`, no controller: the counters are only emptied, so the tables never fill);
/// `turns`: the color's turns ([`start_turning`]); `stats` counts each reported period's
/// outcome.
pub async fn report_loop(
    maps: Arc<Mutex<MapSet>>,
    reports: Option<mpsc::Sender<Kind>>,
    clock: Arc<MeterClock>,
    turns: Turns,
    stats: Arc<MeterStats>,
) {
    if clock.get().period_ns == 0 {
        return;
    }
    // Handles of the reader's own: reading and emptying a full table holds no lock.
    let counters = match maps.lock().expect("maps lock").meter_counters() {
        Ok(Some(counters)) => counters,
        Ok(None) => return,
        Err(err) => {
            warn!(%err, "the path meter's counters cannot be opened; no path reports");
            return;
        }
    };
    let mut c = clock.get();
    let mut meter = PeriodMeter::new(c);
    let mut last_closed: Option<u64> = None;
    loop {
        // The controller's clock, once adopted, counts other periods: readings start again.
        if clock.get() != c {
            c = clock.get();
            meter = PeriodMeter::new(c);
            last_closed = None;
        }
        let t = c.period_ns;
        let now = tai_ns();
        let mut next = c.start_of(c.period_at(now)) + t / 2;
        if next <= now {
            next += t;
        }
        tokio::time::sleep(Duration::from_nanos(next - now)).await;
        // The period planned for: woken in the next one (the runtime held up), its color may be
        // in use again or its last packets not in yet, and `read_and_report` finds the reading
        // late (it checks the time once the counters are read).
        let Some(closed) = c.period_at(next).checked_sub(1) else {
            continue;
        };
        // Periods the reader slept through (the runtime held it up for a period or more) were
        // never read: late, as far as the controller is concerned.
        if let Some(last) = last_closed {
            stats.count(Outcome::Late, closed.saturating_sub(last + 1));
        }
        last_closed = Some(closed);
        let late = reading_late(*turns.lock().expect("turns lock"), closed);
        let Some(reports) = &reports else {
            if let Err(err) = counters.take((closed & 1) as u8) {
                warn!(%err, "emptying the path meter's counters");
            }
            continue;
        };
        let outcome = read_and_report(&maps, &counters, reports, &mut meter, closed, late, &clock);
        stats.count(outcome, 1);
    }
}

/// Reads and empties the counters of period `closed`'s color and sends the period's report,
/// if exact.
fn read_and_report(
    maps: &Mutex<MapSet>,
    counters: &MeterCounters,
    reports: &mpsc::Sender<Kind>,
    meter: &mut PeriodMeter,
    closed: u64,
    late: bool,
    clock: &MeterClock,
) -> Outcome {
    let mut read_at = 0;
    let read = counters.take((closed & 1) as u8).and_then(|c| {
        // On time or not as the counters were read: waiting for the map set's lock (a table
        // push holds it) after that changes nothing the counters hold.
        read_at = tai_ns();
        // The map set's lock only for two counter reads and the mode.
        let maps = maps.lock().expect("maps lock");
        let stamp = maps.stamp_counters()?;
        let strip = maps.strip_counters()?;
        let full =
            stamp[stamp_reason::METER_FULL as usize] + strip[strip_reason::METER_FULL as usize];
        Ok((
            c,
            full,
            maps.config()?.mode == sopa_common::maps::mode::SOPA,
        ))
    });
    let (counts, full, spraying) = match read {
        Ok(r) => r,
        Err(err) => {
            warn!(%err, "reading the path meter");
            return Outcome::Unread;
        }
    };
    // Done before the next period of this color began (by the clock the meter counts)?
    let c = clock.get();
    let late = late || c != meter.clock() || c.period_at(read_at) != closed + 1;
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
