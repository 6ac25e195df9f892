//! The path meter's intake: every host's period report passes here before the tomography
//! (`crate::tomography`) keeps anything of it. A report is refused, counted by reason and its
//! host named, when it is malformed or claims more than links carry (`checks`), is numbered by
//! another clock than the controller's (`clock`), names racks or paths the topology lacks,
//! or comes faster than one a period (`hosts`). A report whose sent counts its own spraying
//! cannot produce is set aside (its rack is not judged that period) and its host named
//! inconsistent.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use sopa_channel::proto::{MeterHost, PathReport};
use sopa_topology::Topology;

use crate::tomography::{JudgeConfig, Tomography};

pub mod checks;
pub mod clock;
pub mod hosts;

pub use clock::MeterClock;

/// The reason a host is named for when its report is set aside as inconsistent.
pub const INCONSISTENT: &str = "inconsistent";

/// Periods after a fabric change whose reports are not checked for balance: a host that
/// applies a change mid-period sprays over a different set of paths in each part of it.
const UNSETTLED_PERIODS: u64 = 3;

/// Meter periods the evidence waits after a change for every connected agent to acknowledge
/// it (4 s at 250 ms); an agent still silent then is counted as lagging and not waited for.
pub const MAX_SETTLE_PERIODS: u64 = 16;

/// Why a report is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("{0}")]
    Implausible(String),
    #[error("{0}")]
    Period(String),
    #[error("{0}")]
    Epoch(String),
    /// A period ahead of the controller's clock, or (a host's clock off) behind it.
    #[error("{0}")]
    Clock(String),
    /// A period behind the controller's clock: a host's clock off, or reports held up (an
    /// agent keeps a few while its controller is away and sends them when it is back).
    #[error("{0}")]
    Late(String),
    #[error("{0}")]
    Topology(String),
    #[error(
        "more than {} reports at once, or {} a period",
        hosts::REPORT_BURST,
        hosts::REPORTS_PER_PERIOD
    )]
    Rate,
}

impl Refused {
    /// The reason's name, as metrics and status label it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::Implausible(_) => "implausible",
            Self::Period(_) => "period",
            Self::Epoch(_) => "epoch",
            Self::Clock(_) | Self::Late(_) => "clock",
            Self::Topology(_) => "topology",
            Self::Rate => "rate",
        }
    }

    pub const REASONS: [&'static str; 7] = [
        "malformed",
        "implausible",
        "period",
        "epoch",
        "clock",
        "topology",
        "rate",
    ];
}

/// A refused report: why, and whether its host was not named for that already (worth a
/// warning; the same refusal every period after it is not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub why: Refused,
    pub news: bool,
}

/// What became of a report that was not refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    /// A period closed (and should be judged).
    pub closed: bool,
    /// Set aside as inconsistent, why, and whether that is news.
    pub inconsistent: Option<(String, bool)>,
}

/// The tomography behind its intake.
pub struct Meter {
    pub tomography: Tomography,
    pub clock: MeterClock,
    bounds: checks::Bounds,
    hosts: hosts::Hosts,
    /// Reports refused, by reason; set aside as inconsistent.
    refused: BTreeMap<&'static str, u64>,
    pub inconsistent: u64,
    /// Reports taken (inconsistent ones too), and their encoded bytes.
    pub reports: u64,
    pub report_bytes: u64,
    /// Reports of periods up to this one are not checked for balance (a change was applied
    /// around then).
    unsettled_through: Option<u64>,
    /// The period after which the last change is settled without the agents that have not
    /// acknowledged it.
    settle_by: Option<u64>,
}

/// Who sent a report: its host, and how long its session has been up.
#[derive(Clone, Copy, Debug)]
pub struct Reporter<'a> {
    pub host: &'a str,
    pub session_age: Duration,
}

impl<'a> Reporter<'a> {
    /// `host`, on a session up long enough that nothing it sends is stale.
    pub fn settled(host: &'a str) -> Self {
        Self {
            host,
            session_age: Duration::MAX,
        }
    }
}

/// How many of the controller's periods into a session reports behind the clock are taken as
/// kept while the controller was away (an agent sends them right after its hello).
pub const FRESH_PERIODS: u32 = 4;

impl Meter {
    pub fn new(topo: Arc<Topology>, judge: JudgeConfig, clock: MeterClock) -> Self {
        let bounds = checks::Bounds::new(judge.link_bps, clock.period_ms());
        let mut tomography = Tomography::new(topo, judge);
        tomography.set_period_ms(clock.period_ms());
        Self {
            tomography,
            clock,
            bounds,
            hosts: hosts::Hosts::default(),
            refused: BTreeMap::new(),
            inconsistent: 0,
            reports: 0,
            report_bytes: 0,
            unsettled_through: None,
            settle_by: None,
        }
    }

    /// Takes `from`'s report at `now_tai_ns` (`now` on the monotonic clock). `connected`: the
    /// hosts whose agents are connected, whose reports a period waits for (less those whose
    /// reports are refused now). A refused report changes nothing but the counts of refusals.
    pub fn accept(
        &mut self,
        from: Reporter<'_>,
        report: PathReport,
        encoded_len: usize,
        now_tai_ns: u64,
        now: Instant,
        connected: &BTreeSet<String>,
    ) -> Result<Taken, Refusal> {
        let host = from.host;
        if let Err(why) = self.admit(host, &report, now_tai_ns, now) {
            *self.refused.entry(why.reason()).or_default() += 1;
            // Stale, not the host's fault, so it is not named: a report of another epoch was
            // made before its agent had this controller's snapshot, and one late in a session's
            // first periods was kept while the agent's controller was away.
            let stale = match why {
                Refused::Epoch(_) => true,
                Refused::Late(_) => from.session_age < self.clock.period() * FRESH_PERIODS,
                _ => false,
            };
            let news = !stale
                && self
                    .hosts
                    .set_aside(host, why.reason(), why.to_string(), now);
            return Err(Refusal { why, news });
        }
        self.reports += 1;
        self.report_bytes += encoded_len as u64;
        let within = self.clock.period() * 4;
        let refused = self.hosts.refused_now(now, within);
        let expected: BTreeSet<String> = connected.difference(&refused).cloned().collect();
        let checked =
            !report.incomplete && self.unsettled_through.is_none_or(|u| report.period > u);
        let inconsistent = checked.then(|| checks::unbalanced(&report)).flatten();
        let inconsistent = inconsistent.map(|why| {
            let news = self.hosts.set_aside(host, INCONSISTENT, why.clone(), now);
            (why, news)
        });
        let report = match &inconsistent {
            Some(_) => {
                self.inconsistent += 1;
                // Its counts are left out, and its rack with them: the period does not wait
                // for it, and does not judge paths its hosts are an end of.
                PathReport {
                    period: report.period,
                    incomplete: true,
                    ..PathReport::default()
                }
            }
            None => {
                self.hosts.taken(host, now);
                report
            }
        };
        let closed = self.tomography.accept(host, report, &expected);
        Ok(Taken {
            closed,
            inconsistent,
        })
    }

    fn admit(
        &mut self,
        host: &str,
        report: &PathReport,
        now_tai_ns: u64,
        now: Instant,
    ) -> Result<(), Refused> {
        // The clock first: it costs nothing, and an agent on another period (which reports
        // faster or slower than the controller's) is named for its period, not its pace. The
        // token bucket then guards the checks that cost a walk of the report.
        self.clock.check(report, now_tai_ns)?;
        if !self.hosts.take_token(host, self.clock.period(), now) {
            return Err(Refused::Rate);
        }
        checks::check(report, self.bounds)?;
        self.tomography.check(host, report)
    }

    /// The fabric changed (version `version`; `back`: something came back): the evidence
    /// starts again ([`Tomography::forget`]), and the next periods' reports are not checked
    /// for balance.
    pub fn changed(&mut self, version: u64, back: bool, now_tai_ns: u64) {
        self.tomography.forget(version, back);
        let now = self.clock.period_at(now_tai_ns);
        self.unsettled_through = Some(now + UNSETTLED_PERIODS);
        self.settle_by = Some(now + MAX_SETTLE_PERIODS);
    }

    /// Whether the wait for the agents to acknowledge the last change is over at `now_tai_ns`.
    pub fn settle_overdue(&self, now_tai_ns: u64) -> bool {
        self.settle_by
            .is_some_and(|p| self.clock.period_at(now_tai_ns) > p)
    }

    /// Hosts whose reports were set aside lately.
    pub fn named(&self, now: Instant) -> Vec<MeterHost> {
        self.hosts.named(now)
    }

    /// Reports refused, by reason (every reason, zero or not).
    pub fn refused(&self) -> Vec<(&'static str, u64)> {
        Refused::REASONS
            .iter()
            .map(|r| (*r, self.refused.get(r).copied().unwrap_or(0)))
            .collect()
    }
}

#[cfg(test)]
mod tests;
