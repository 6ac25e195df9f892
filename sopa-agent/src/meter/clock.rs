//! The meter's clock: the period and the TAI nanosecond its periods are counted from, as the
//! controller's snapshot gives them (or as a flag fixed them), and the thread that turns the
//! datapath's color at each period's start.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tracing::{info, warn};

use super::MeterStats;
use crate::datapath::MapSet;

/// The default period of alternate marking.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(250);

/// TAI nanoseconds (`CLOCK_TAI`, the clock of `bpf_ktime_get_tai_ns`).
pub fn tai_ns() -> u64 {
    crate::hedera::clock_ns(libc::CLOCK_TAI)
}

/// The meter's period and epoch: period `p` begins at `epoch_ns + p * period_ns` (TAI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    pub period_ns: u64,
    pub epoch_ns: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            period_ns: DEFAULT_PERIOD.as_nanos() as u64,
            epoch_ns: 0,
        }
    }
}

impl Clock {
    /// The turn made at `now` (TAI ns) for its period.
    pub fn turn_at(&self, now: u64) -> Turned {
        turn_at(now.saturating_sub(self.epoch_ns), self.period_ns)
    }

    /// When period `p` begins (TAI ns).
    pub fn start_of(&self, p: u64) -> u64 {
        self.epoch_ns
            .saturating_add(p.saturating_mul(self.period_ns))
    }

    /// The period `now` falls in.
    pub fn period_at(&self, now: u64) -> u64 {
        now.saturating_sub(self.epoch_ns) / self.period_ns.max(1)
    }
}

/// The clock the agent's meter runs by, shared by the thread that turns the color, the reader
/// and the channel, which adopts the controller's unless a flag fixed it.
#[derive(Debug)]
pub struct MeterClock {
    clock: Mutex<Clock>,
    /// `--meter-period-ms` was given: the controller's period is not adopted.
    fixed: bool,
}

impl MeterClock {
    /// A clock of `period` counted from the TAI epoch until the controller's arrives; `fixed`:
    /// kept whatever the controller says.
    pub fn new(period: Duration, fixed: bool) -> Arc<Self> {
        Arc::new(Self {
            clock: Mutex::new(Clock {
                period_ns: period.as_nanos() as u64,
                epoch_ns: 0,
            }),
            fixed,
        })
    }

    pub fn get(&self) -> Clock {
        *self.clock.lock().expect("clock lock")
    }

    /// Adopts the controller's clock from its snapshot (`period_ms` 0: a controller that
    /// gives none). Returns whether the clock changed.
    pub fn adopt(&self, period_ms: u32, epoch_ns: u64) -> bool {
        if period_ms == 0 {
            return false;
        }
        let theirs = Clock {
            period_ns: u64::from(period_ms) * 1_000_000,
            epoch_ns,
        };
        let mut clock = self.clock.lock().expect("clock lock");
        if *clock == theirs {
            return false;
        }
        if self.fixed {
            if clock.period_ns != theirs.period_ns {
                warn!(
                    ours_ms = clock.period_ns / 1_000_000,
                    controller_ms = period_ms,
                    "--meter-period-ms differs from the controller's meter period: the controller refuses this host's path reports"
                );
            }
            // The epoch is adopted all the same: only the numbers change, never a color.
            if clock.period_ns == theirs.period_ns && clock.epoch_ns != epoch_ns {
                *clock = theirs;
                return true;
            }
            return false;
        }
        info!(
            period_ms,
            epoch_ns, "the path meter runs by the controller's clock"
        );
        *clock = theirs;
        true
    }
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
    clock: Arc<MeterClock>,
    stats: Arc<MeterStats>,
) -> crate::error::Result<Option<Turns>> {
    if clock.get().period_ns == 0 {
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
            // late for the reading (it is marked so), but not a late turn to count. So is the
            // first after the controller's clock was adopted.
            let mut counted: Option<Clock> = None;
            loop {
                let c = clock.get();
                let turn = c.turn_at(tai_ns());
                let turn = match color.set((turn.period & 1) as u8) {
                    Ok(()) => turn,
                    Err(err) => {
                        warn!(%err, "turning the path meter's color");
                        Turned { late: true, ..turn }
                    }
                };
                if turn.late && counted == Some(c) {
                    stats.late_turn();
                }
                counted = Some(c);
                *shared.lock().expect("turns lock") = Some(turn);
                sleep_until_tai(c.start_of(turn.period + 1));
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_controllers_clock_is_adopted_unless_a_flag_fixed_the_period() {
        let c = MeterClock::new(DEFAULT_PERIOD, false);
        assert!(!c.adopt(0, 0), "a controller without a clock");
        assert!(c.adopt(100, 2_000_000_000));
        assert_eq!(
            c.get(),
            Clock {
                period_ns: 100_000_000,
                epoch_ns: 2_000_000_000
            }
        );
        assert!(!c.adopt(100, 2_000_000_000), "the same again");
        let fixed = MeterClock::new(Duration::from_millis(50), true);
        assert!(!fixed.adopt(250, 500_000_000));
        assert_eq!(fixed.get().period_ns, 50_000_000);
        let fixed = MeterClock::new(DEFAULT_PERIOD, true);
        assert!(fixed.adopt(250, 500_000_000), "the same period: its epoch");
        // Counted from its epoch: a period's start and color as from the TAI epoch.
        let clock = fixed.get();
        assert_eq!(clock.period_at(clock.start_of(7)), 7);
        assert_eq!(clock.turn_at(clock.start_of(7) + 5).period, 7);
    }
}
