//! What the meter knows of each reporting host: how many reports it may still send (a token
//! bucket per identity), and whether its reports are set aside now and why.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use sopa_channel::proto::MeterHost;

/// Reports one host may send at once (a reconnecting agent sends its queued ones together).
pub const REPORT_BURST: f64 = 8.0;
/// Reports one host may send per period, sustained: one is what an agent sends.
pub const REPORTS_PER_PERIOD: f64 = 1.5;

/// How long a host stays named after its last report set aside.
pub const NAMED_FOR: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Host {
    tokens: f64,
    refilled: Instant,
    /// Its last report set aside: reason, detail, when; and how many were.
    aside: Option<(&'static str, String, Instant)>,
    set_aside: u64,
    /// When a report of it was last taken.
    taken: Option<Instant>,
}

/// Every reporting host's bucket and standing.
#[derive(Debug, Default)]
pub struct Hosts {
    hosts: BTreeMap<String, Host>,
}

impl Hosts {
    /// Takes a report's token from `host`'s bucket (refilled at `per_period` reports a
    /// `period`); false when it has none left.
    pub fn take_token(&mut self, host: &str, period: Duration, now: Instant) -> bool {
        let h = self.entry(host, now);
        let refill = now.saturating_duration_since(h.refilled).as_secs_f64()
            / period.as_secs_f64().max(1e-3)
            * REPORTS_PER_PERIOD;
        h.tokens = (h.tokens + refill).min(REPORT_BURST);
        h.refilled = now;
        if h.tokens >= 1.0 {
            h.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// `host`'s report was set aside for `reason`. Returns whether that is news: the host was
    /// not named for it within [`NAMED_FOR`], or a report was taken since (worth a warning;
    /// every report after it is not).
    pub fn set_aside(
        &mut self,
        host: &str,
        reason: &'static str,
        detail: String,
        now: Instant,
    ) -> bool {
        let h = self.entry(host, now);
        let news = h.aside.as_ref().is_none_or(|(r, _, at)| {
            *r != reason
                || now.saturating_duration_since(*at) >= NAMED_FOR
                || h.taken.is_some_and(|t| t > *at)
        });
        h.aside = Some((reason, detail, now));
        h.set_aside += 1;
        news
    }

    /// `host`'s report was taken.
    pub fn taken(&mut self, host: &str, now: Instant) {
        self.entry(host, now).taken = Some(now);
    }

    /// Hosts whose reports are refused now (their last report refused, none taken since, within
    /// `within`): a period does not wait for them.
    pub fn refused_now(&self, now: Instant, within: Duration) -> BTreeSet<String> {
        self.hosts
            .iter()
            .filter(|(_, h)| match &h.aside {
                Some((reason, _, at)) => {
                    *reason != super::INCONSISTENT
                        && h.taken.is_none_or(|t| t < *at)
                        && now.saturating_duration_since(*at) < within
                }
                None => false,
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Hosts with a report set aside within [`NAMED_FOR`], by name.
    pub fn named(&self, now: Instant) -> Vec<MeterHost> {
        self.hosts
            .iter()
            .filter_map(|(n, h)| {
                let (reason, detail, at) = h.aside.as_ref()?;
                let ago = now.saturating_duration_since(*at);
                (ago < NAMED_FOR).then(|| MeterHost {
                    host: n.clone(),
                    reason: (*reason).to_owned(),
                    detail: detail.clone(),
                    reports: h.set_aside,
                    last_ms_ago: ago.as_millis() as u64,
                })
            })
            .collect()
    }

    fn entry(&mut self, host: &str, now: Instant) -> &mut Host {
        self.hosts.entry(host.to_owned()).or_insert_with(|| Host {
            tokens: REPORT_BURST,
            refilled: now,
            aside: None,
            set_aside: 0,
            taken: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_past_its_rate_is_held_to_it_and_others_are_not() {
        let mut h = Hosts::default();
        let p = Duration::from_millis(250);
        let t0 = Instant::now();
        let taken = (0..100).filter(|_| h.take_token("h0", p, t0)).count();
        assert_eq!(taken, REPORT_BURST as usize);
        assert!(
            h.take_token("h1", p, t0),
            "another host's bucket is its own"
        );
        // Over 10 periods, 15 more.
        let later = t0 + 10 * p;
        let taken = (0..100).filter(|_| h.take_token("h0", p, later)).count();
        assert_eq!(taken, REPORT_BURST as usize, "refilled up to the burst");
        let t = later + p;
        assert!(h.take_token("h0", p, t));
        assert!(!h.take_token("h0", p, t), "one and a half a period");
    }

    #[test]
    fn a_refused_host_is_named_and_not_waited_for_until_a_report_is_taken() {
        let mut h = Hosts::default();
        let t0 = Instant::now();
        assert!(h.set_aside("h3", "clock", "ahead".into(), t0));
        assert!(
            !h.set_aside("h3", "clock", "ahead".into(), t0),
            "not news again"
        );
        h.set_aside("h4", super::super::INCONSISTENT, "inflated".into(), t0);
        let within = Duration::from_secs(1);
        assert_eq!(h.refused_now(t0, within), ["h3".to_owned()].into());
        let named = h.named(t0);
        assert_eq!(named.len(), 2);
        assert_eq!(named[0].reason, "clock");
        h.taken("h3", t0 + Duration::from_millis(10));
        assert!(
            h.refused_now(t0 + Duration::from_millis(10), within)
                .is_empty()
        );
        assert_eq!(h.named(t0 + NAMED_FOR).len(), 0);
    }
}
