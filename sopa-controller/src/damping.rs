//! Flap damping for switches' port reports, as routing protocols damp flapping routes (RFC
//! 2439): a port that goes down `limit` times within `window` is held down, and its reports
//! that it is up again are not applied until the hold ends. Each hold that follows another
//! within the window doubles (up to `max_hold`); a link that stays quiet for a window starts
//! again from `hold`. Going down is always applied at once: only coming back is held, so a
//! flapping link costs the agents one version, not one per flap.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::{Duration, Instant},
};

/// The damping rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DampingConfig {
    /// Downs within `window` that make a flapping link.
    pub limit: usize,
    pub window: Duration,
    /// The first hold; each next one doubles.
    pub hold: Duration,
    pub max_hold: Duration,
}

impl Default for DampingConfig {
    fn default() -> Self {
        Self {
            limit: 3,
            window: Duration::from_secs(30),
            hold: Duration::from_secs(5),
            max_hold: Duration::from_secs(300),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct LinkDamping {
    downs: VecDeque<Instant>,
    held_until: Option<Instant>,
    /// The last hold, doubled by the next one within the window.
    last_hold: Option<(Instant, Duration)>,
    /// The ends whose last report was "up" while held: applied when the hold ends.
    up_pending: BTreeSet<String>,
    /// The last state reported: a down counts as a flap only after an up (both switches of a
    /// link report it, and every switch reports all its ports on each new session).
    last_down: Option<bool>,
}

/// What to do with a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Apply it now.
    Apply,
    /// Apply it now, and the link is held down until `until` from now on.
    ApplyAndHold { until: Instant },
    /// Do not apply it (the link is held down); ask again at `until`.
    Held { until: Instant },
}

/// One link's damping state as it was, to put back when what was decided from a report could
/// not be made (the change was not stored).
#[derive(Debug)]
pub struct Saved(Option<LinkDamping>);

/// Damping state of every link, keyed by its canonical name.
#[derive(Debug, Default)]
pub struct Damper {
    pub config: DampingConfig,
    links: BTreeMap<(String, String), LinkDamping>,
}

impl Damper {
    pub fn new(config: DampingConfig) -> Self {
        Self {
            config,
            links: BTreeMap::new(),
        }
    }

    /// `link`'s state now, for [`Damper::restore`].
    pub fn save(&self, link: &(String, String)) -> Saved {
        Saved(self.links.get(link).cloned())
    }

    /// Puts `link`'s state back as it was saved.
    pub fn restore(&mut self, link: &(String, String), saved: Saved) {
        match saved.0 {
            Some(d) => {
                self.links.insert(link.clone(), d);
            }
            None => {
                self.links.remove(link);
            }
        }
    }

    /// Switch `by` reported `link` down or up at `now`.
    pub fn report(
        &mut self,
        link: &(String, String),
        by: &str,
        down: bool,
        now: Instant,
    ) -> Verdict {
        let c = self.config;
        let d = self.links.entry(link.clone()).or_default();
        let held = d.held_until.filter(|t| *t > now);
        let again = d.last_down == Some(down);
        d.last_down = Some(down);
        if !down {
            return match held {
                Some(until) => {
                    d.up_pending.insert(by.to_owned());
                    Verdict::Held { until }
                }
                None => {
                    d.up_pending.remove(by);
                    Verdict::Apply
                }
            };
        }
        d.up_pending.remove(by);
        if again {
            // Still down: nothing new to count.
            return Verdict::Apply;
        }
        while d
            .downs
            .front()
            .is_some_and(|t| now.duration_since(*t) > c.window)
        {
            d.downs.pop_front();
        }
        d.downs.push_back(now);
        if d.downs.len() < c.limit || c.limit == 0 {
            return Verdict::Apply;
        }
        let hold = match d.last_hold {
            Some((at, h)) if now.duration_since(at) <= c.window + h => (h * 2).min(c.max_hold),
            _ => c.hold,
        };
        let until = now + hold;
        d.last_hold = Some((now, hold));
        d.held_until = Some(until);
        d.downs.clear();
        Verdict::ApplyAndHold { until }
    }

    /// `link`'s hold may have ended at `now`: the ends whose pending "up" is to be applied.
    pub fn release(&mut self, link: &(String, String), now: Instant) -> BTreeSet<String> {
        let Some(d) = self.links.get_mut(link) else {
            return BTreeSet::new();
        };
        if d.held_until.is_some_and(|t| t > now) {
            return BTreeSet::new();
        }
        d.held_until = None;
        std::mem::take(&mut d.up_pending)
    }

    /// Links held down now: the time left, and whether an up waits for its end.
    pub fn held(&self, now: Instant) -> Vec<((String, String), Duration, bool)> {
        self.links
            .iter()
            .filter_map(|(k, d)| {
                d.held_until
                    .filter(|t| *t > now)
                    .map(|t| (k.clone(), t - now, !d.up_pending.is_empty()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> (String, String) {
        ("a0".into(), "e0".into())
    }

    #[test]
    fn a_flapping_link_is_held_down_longer_each_time_and_a_quiet_one_is_not() {
        let mut d = Damper::new(DampingConfig::default());
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let l = link();
        // Two flaps: applied as they come.
        for i in 0..2 {
            assert_eq!(d.report(&l, "e0", true, t0 + s(i * 2)), Verdict::Apply);
            assert_eq!(d.report(&l, "e0", false, t0 + s(i * 2 + 1)), Verdict::Apply);
        }
        // The third down within 30 s: held for 5 s; its "up" waits.
        assert_eq!(
            d.report(&l, "e0", true, t0 + s(4)),
            Verdict::ApplyAndHold { until: t0 + s(9) }
        );
        assert_eq!(
            d.report(&l, "e0", false, t0 + s(5)),
            Verdict::Held { until: t0 + s(9) }
        );
        assert!(d.release(&l, t0 + s(8)).is_empty(), "still held");
        assert_eq!(d.held(t0 + s(8)), [(l.clone(), s(1), true)]);
        assert_eq!(
            d.release(&l, t0 + s(9)),
            BTreeSet::from(["e0".to_owned()]),
            "the pending up is applied at the end"
        );
        assert!(d.release(&l, t0 + s(9)).is_empty(), "once");
        // Three more downs soon after: held twice as long.
        for i in 0..2 {
            assert_eq!(d.report(&l, "e0", true, t0 + s(10 + i * 2)), Verdict::Apply);
            assert_eq!(
                d.report(&l, "e0", false, t0 + s(11 + i * 2)),
                Verdict::Apply
            );
        }
        assert_eq!(
            d.report(&l, "e0", true, t0 + s(14)),
            Verdict::ApplyAndHold { until: t0 + s(24) }
        );
        // Down again while held: still held, nothing pending.
        assert_eq!(
            d.report(&l, "e0", false, t0 + s(15)),
            Verdict::Held { until: t0 + s(24) }
        );
        assert!(matches!(
            d.report(&l, "e0", true, t0 + s(16)),
            Verdict::Apply
        ));
        assert!(
            d.release(&l, t0 + s(24)).is_empty(),
            "the last report was down: nothing to apply"
        );
        // Long quiet: three downs start again from the first hold.
        let later = t0 + s(1000);
        d.report(&l, "e0", false, later - s(1));
        for i in 0..2 {
            d.report(&l, "e0", true, later + s(i * 2));
            d.report(&l, "e0", false, later + s(i * 2 + 1));
        }
        assert_eq!(
            d.report(&l, "e0", true, later + s(4)),
            Verdict::ApplyAndHold {
                until: later + s(9)
            }
        );
        // A down reported again (the link's other switch, or a switch's new session) is not
        // another flap.
        let mut d2 = Damper::new(DampingConfig::default());
        for i in 0..10 {
            assert_eq!(d2.report(&l, "e0", true, t0 + s(i)), Verdict::Apply, "{i}");
        }
        // Downs spread wider than the window never hold.
        let mut d = Damper::new(DampingConfig::default());
        for i in 0..10 {
            assert_eq!(d.report(&l, "e0", true, t0 + s(i * 40)), Verdict::Apply);
            assert_eq!(
                d.report(&l, "e0", false, t0 + s(i * 40 + 1)),
                Verdict::Apply
            );
        }
    }

    #[test]
    fn a_restored_link_decides_as_if_the_reports_since_were_never_made() {
        let mut d = Damper::new(DampingConfig::default());
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let l = link();
        for i in 0..2 {
            d.report(&l, "e0", true, t0 + s(i * 2));
            d.report(&l, "e0", false, t0 + s(i * 2 + 1));
        }
        let saved = d.save(&l);
        // The third flap holds the link; its change is then not stored and put back.
        assert!(matches!(
            d.report(&l, "e0", true, t0 + s(4)),
            Verdict::ApplyAndHold { .. }
        ));
        d.restore(&l, saved);
        assert!(d.held(t0 + s(5)).is_empty(), "no hold left behind");
        // The same report again decides the same way: the lost one counted for nothing.
        assert_eq!(
            d.report(&l, "e0", true, t0 + s(4)),
            Verdict::ApplyAndHold { until: t0 + s(9) }
        );
        // A link never seen before is forgotten again.
        let other = ("a1".to_owned(), "e1".to_owned());
        let saved = d.save(&other);
        d.report(&other, "e0", true, t0);
        d.restore(&other, saved);
        assert_eq!(d.save(&other).0, None);
    }

    #[test]
    fn each_end_s_pending_up_is_its_own() {
        let config = DampingConfig {
            limit: 1,
            ..DampingConfig::default()
        };
        let mut d = Damper::new(config);
        let (t0, s) = (Instant::now(), Duration::from_secs);
        let l = link();
        assert!(matches!(
            d.report(&l, "e0", true, t0),
            Verdict::ApplyAndHold { .. }
        ));
        d.report(&l, "a0", true, t0);
        // Both ends up while held; then e0 down again: only a0's up is pending.
        d.report(&l, "a0", false, t0 + s(1));
        d.report(&l, "e0", false, t0 + s(1));
        d.report(&l, "e0", true, t0 + s(2));
        assert_eq!(d.release(&l, t0 + s(60)), BTreeSet::from(["a0".to_owned()]));
    }

    #[test]
    fn holds_stop_growing_at_the_maximum() {
        let config = DampingConfig {
            limit: 1,
            window: Duration::from_secs(30),
            hold: Duration::from_secs(100),
            max_hold: Duration::from_secs(300),
        };
        let mut d = Damper::new(config);
        let l = link();
        let mut t = Instant::now();
        let mut holds = Vec::new();
        for _ in 0..4 {
            let Verdict::ApplyAndHold { until } = d.report(&l, "e0", true, t) else {
                panic!("a single down holds with limit 1");
            };
            holds.push((until - t).as_secs());
            t = until;
            d.release(&l, t);
            d.report(&l, "e0", false, t);
        }
        assert_eq!(holds, [100, 200, 300, 300]);
    }
}
