//! The path meter's clock, which the controller owns: every host numbers and colors its
//! periods of alternate marking by the period length and epoch the controller's snapshot
//! gives it, so no host's flag or clock decides them for the others. A report for another
//! period length or epoch, or for a period far from the controller's own clock, is refused.

use std::time::Duration;

use sopa_channel::proto::PathReport;

use super::Refused;

/// How far a report's period may be from the one the controller's clock expects it for (the
/// period before the current one: a period is read half a period after it ends), in periods.
/// Two: a reading a period late, or a host clock within a period of the controller's, passes.
pub const MAX_SKEW_PERIODS: u64 = 2;

/// The meter's period and epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeterClock {
    period_ns: u64,
    epoch_ns: u64,
}

impl MeterClock {
    /// A clock of `period` whose epoch is `epoch_tai_ns` rounded down to two periods: period
    /// boundaries and colors stay those of periods counted from the TAI epoch, so hosts that
    /// adopt it one by one never disagree on a color. The controller's is epoch 0: the same
    /// clock on every replica and after every restart, so an agent that holds it needs no
    /// snapshot to keep counting.
    pub fn new(period: Duration, epoch_tai_ns: u64) -> Self {
        let period_ns = (period.as_nanos() as u64).max(1_000_000);
        Self {
            period_ns,
            epoch_ns: epoch_tai_ns - epoch_tai_ns % (2 * period_ns),
        }
    }

    pub fn period_ms(&self) -> u32 {
        (self.period_ns / 1_000_000) as u32
    }

    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    pub fn epoch_ns(&self) -> u64 {
        self.epoch_ns
    }

    /// The period `tai_ns` falls in.
    pub fn period_at(&self, tai_ns: u64) -> u64 {
        tai_ns.saturating_sub(self.epoch_ns) / self.period_ns
    }

    /// Whether `report` was numbered by this clock, and its period is near the one expected
    /// at `now_tai_ns`.
    pub fn check(&self, report: &PathReport, now_tai_ns: u64) -> Result<(), Refused> {
        if u64::from(report.period_ms) * 1_000_000 != self.period_ns {
            return Err(Refused::Period(format!(
                "periods of {} ms, but the controller's meter runs {} ms periods (an agent's --meter-period-ms overrides the controller's clock; drop it)",
                report.period_ms,
                self.period_ms()
            )));
        }
        if report.epoch_ns != self.epoch_ns {
            return Err(Refused::Epoch(format!(
                "numbered from epoch {} ns, not this controller's {} ns (a report from before the agent had this controller's snapshot)",
                report.epoch_ns, self.epoch_ns
            )));
        }
        // The period read last ended half a period ago or more.
        let expected = self.period_at(now_tai_ns).saturating_sub(1);
        let off = report.period.abs_diff(expected);
        if off > MAX_SKEW_PERIODS {
            let why = |way| {
                format!(
                    "period {} is {off} periods {way} the controller's clock (which expects {expected}): the host's clock is off, or its reports are held up",
                    report.period
                )
            };
            return Err(if report.period > expected {
                Refused::Clock(why("ahead of"))
            } else {
                Refused::Late(why("behind"))
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 250_000_000;

    fn at(period: u64, clock: &MeterClock) -> PathReport {
        PathReport {
            period,
            period_ms: 250,
            epoch_ns: clock.epoch_ns(),
            ..PathReport::default()
        }
    }

    #[test]
    fn the_epoch_keeps_boundaries_and_colors() {
        let now = 1_700_000_000_123_456_789;
        let c = MeterClock::new(Duration::from_millis(250), now);
        assert_eq!(c.epoch_ns() % (2 * P), 0);
        assert!(c.epoch_ns() <= now && now - c.epoch_ns() < 2 * P);
        // The color (the period's parity) is the one counted from the TAI epoch.
        for t in [now, now + P, now + 7 * P + 3] {
            assert_eq!(c.period_at(t) & 1, (t / P) & 1);
            assert_eq!((t - c.epoch_ns()) % P, t % P);
        }
    }

    #[test]
    fn a_report_of_another_length_epoch_or_far_period_is_refused() {
        let c = MeterClock::new(Duration::from_millis(250), 0);
        // In period 1,001, a quarter in: the report expected is of period 1,000.
        let now = 1_001 * P + P / 4;
        for p in 998..=1_002 {
            assert_eq!(c.check(&at(p, &c), now), Ok(()), "period {p}");
        }
        let why = c.check(&at(1_003, &c), now).unwrap_err();
        assert!(why.to_string().contains("3 periods ahead of"), "{why}");
        assert_eq!(why.reason(), "clock");
        let why = c.check(&at(997, &c), now).unwrap_err();
        assert!(why.to_string().contains("3 periods behind"), "{why}");
        assert!(c.check(&at(u64::MAX, &c), now).is_err());
        let fast = PathReport {
            period_ms: 50,
            ..at(5_000, &c)
        };
        let why = c.check(&fast, now).unwrap_err();
        assert!(why.to_string().contains("periods of 50 ms"), "{why}");
        assert_eq!(why.reason(), "period");
        // A period of 1 ms cannot make a TAI clock of any value pass.
        let tiny = PathReport {
            period_ms: 1,
            period: now / 1_000_000,
            ..at(0, &c)
        };
        assert_eq!(c.check(&tiny, now).unwrap_err().reason(), "period");
        let other = PathReport {
            epoch_ns: 2 * P,
            ..at(1_000, &c)
        };
        assert_eq!(c.check(&other, now).unwrap_err().reason(), "epoch");
    }
}
