//! Links the path meter convicted (`crate::tomography`): drained for a hold-down, trusted again
//! when it ends, held twice as long each time one is convicted again soon after; an
//! operator's trust overrides the meter.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

/// A link by its ends in canonical order (as `crate::fabric` keys it).
pub type LinkKey = (String, String);

pub fn key(a: &str, b: &str) -> LinkKey {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

#[derive(Clone, Debug)]
pub struct SuspicionConfig {
    /// The first hold-down of a convicted link.
    pub hold: Duration,
    /// Holds double for a link convicted again within this long of its last release, up to it.
    pub max_hold: Duration,
    /// At most this many links suspect at once: loss everywhere is not a link's fault, and the
    /// meter never drains more of the fabric than this.
    pub max_suspects: usize,
}

impl Default for SuspicionConfig {
    fn default() -> Self {
        Self {
            hold: Duration::from_secs(60),
            max_hold: Duration::from_secs(900),
            max_suspects: 4,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Suspect {
    pub until: Instant,
    pub strikes: u32,
    pub loss: f64,
    pub lost: u64,
    pub sent: u64,
}

/// One link's suspicion, trust and history as they were, to put back when what was decided
/// about it could not be made (the change was not stored).
#[derive(Debug)]
pub struct Saved {
    suspect: Option<Suspect>,
    history: Option<(u32, Instant)>,
    trusted: bool,
}

/// Why a conviction drains nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum Spared {
    AlreadySuspect,
    Trusted,
    TooMany,
    /// A link of the same switch is suspect already: the meter never drains two links of one
    /// switch (both uplinks of a rack drained would cut it off, and congestion the first drain
    /// moves onto its neighbour would read as the next gray link).
    Adjacent,
}

#[derive(Debug)]
pub struct Suspicions {
    pub config: SuspicionConfig,
    suspects: BTreeMap<LinkKey, Suspect>,
    /// Strikes of released links, and when they were released.
    history: BTreeMap<LinkKey, (u32, Instant)>,
    trusted: BTreeSet<LinkKey>,
    /// Convictions since start, per link (for metrics).
    pub convictions: BTreeMap<LinkKey, u64>,
}

impl Suspicions {
    pub fn new(config: SuspicionConfig) -> Self {
        Self {
            config,
            suspects: BTreeMap::new(),
            history: BTreeMap::new(),
            trusted: BTreeSet::new(),
            convictions: BTreeMap::new(),
        }
    }

    /// A conviction: the link becomes suspect for its hold-down, or is spared.
    pub fn convict(
        &mut self,
        link: &LinkKey,
        (loss, lost, sent): (f64, u64, u64),
        now: Instant,
    ) -> Result<Duration, Spared> {
        if self.trusted.contains(link) {
            return Err(Spared::Trusted);
        }
        if self.suspects.contains_key(link) {
            return Err(Spared::AlreadySuspect);
        }
        if self.suspects.len() >= self.config.max_suspects {
            return Err(Spared::TooMany);
        }
        if self
            .suspects
            .keys()
            .any(|(a, b)| [a, b].iter().any(|n| **n == link.0 || **n == link.1))
        {
            return Err(Spared::Adjacent);
        }
        let strikes = match self.history.get(link) {
            Some((n, at)) if now.duration_since(*at) < self.config.max_hold => n + 1,
            _ => 1,
        };
        let hold = self
            .config
            .hold
            .saturating_mul(1 << (strikes - 1).min(16))
            .min(self.config.max_hold);
        self.suspects.insert(
            link.clone(),
            Suspect {
                until: now + hold,
                strikes,
                loss,
                lost,
                sent,
            },
        );
        *self.convictions.entry(link.clone()).or_default() += 1;
        Ok(hold)
    }

    /// `link`'s state now, for [`Suspicions::restore`].
    pub fn save(&self, link: &LinkKey) -> Saved {
        Saved {
            suspect: self.suspects.get(link).cloned(),
            history: self.history.get(link).copied(),
            trusted: self.trusted.contains(link),
        }
    }

    /// Puts `link`'s state back as it was saved (what was decided could not be made).
    pub fn restore(&mut self, link: &LinkKey, saved: Saved) {
        match saved.suspect {
            Some(s) => self.suspects.insert(link.clone(), s),
            None => self.suspects.remove(link),
        };
        match saved.history {
            Some(h) => self.history.insert(link.clone(), h),
            None => self.history.remove(link),
        };
        if saved.trusted {
            self.trusted.insert(link.clone());
        } else {
            self.trusted.remove(link);
        }
    }

    /// A suspect's release could not be made: its hold-down starts again from `now`, its
    /// strikes kept.
    pub fn postpone(&mut self, link: &LinkKey, now: Instant) {
        let hold = self.config.hold;
        if let Some(s) = self.suspects.get_mut(link) {
            s.until = now + hold;
        }
    }

    /// Undoes a conviction whose drain could not be made.
    pub fn forget(&mut self, link: &LinkKey) {
        self.suspects.remove(link);
    }

    /// A link drained as suspect when this controller started (its state was stored): held
    /// for a first hold-down from now.
    pub fn adopt(&mut self, link: &LinkKey, now: Instant) {
        self.suspects.entry(link.clone()).or_insert(Suspect {
            until: now + self.config.hold,
            strikes: 1,
            loss: 0.0,
            lost: 0,
            sent: 0,
        });
    }

    /// Suspects whose hold-down is over.
    pub fn due(&self, now: Instant) -> Vec<LinkKey> {
        self.suspects
            .iter()
            .filter(|(_, s)| s.until <= now)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Ends a suspicion (its hold-down is over, or an operator trusts the link); remembers its
    /// strikes.
    pub fn release(&mut self, link: &LinkKey, now: Instant) -> bool {
        match self.suspects.remove(link) {
            Some(s) => {
                self.history.insert(link.clone(), (s.strikes, now));
                true
            }
            None => false,
        }
    }

    /// An operator trusts a link (it is released if suspect) or hands it back to the meter.
    pub fn set_trusted(&mut self, link: &LinkKey, trusted: bool, now: Instant) -> bool {
        if trusted {
            self.trusted.insert(link.clone());
            self.release(link, now)
        } else {
            self.trusted.remove(link);
            false
        }
    }

    pub fn suspects(&self) -> &BTreeMap<LinkKey, Suspect> {
        &self.suspects
    }

    pub fn trusted(&self) -> &BTreeSet<LinkKey> {
        &self.trusted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_double_for_a_repeat_offender_and_trust_overrides() {
        let mut s = Suspicions::new(SuspicionConfig {
            hold: Duration::from_secs(10),
            max_hold: Duration::from_secs(30),
            max_suspects: 2,
        });
        let t0 = Instant::now();
        let l = key("c0", "a0");
        assert_eq!(l, ("a0".into(), "c0".into()));
        let ev = (0.02, 20, 1000);
        assert_eq!(s.convict(&l, ev, t0), Ok(Duration::from_secs(10)));
        assert_eq!(s.convict(&l, ev, t0), Err(Spared::AlreadySuspect));
        assert_eq!(
            s.convict(&key("a0", "c1"), ev, t0),
            Err(Spared::Adjacent),
            "never two links of one switch"
        );
        assert!(s.convict(&key("a1", "c2"), ev, t0).is_ok());
        assert_eq!(
            s.convict(&key("a2", "c3"), ev, t0),
            Err(Spared::TooMany),
            "never more than max_suspects drained"
        );
        assert!(s.release(&key("a1", "c2"), t0));
        assert!(s.due(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(s.due(t0 + Duration::from_secs(10)), vec![l.clone()]);
        let t1 = t0 + Duration::from_secs(10);
        assert!(s.release(&l, t1));
        assert_eq!(s.convict(&l, ev, t1), Ok(Duration::from_secs(20)));
        s.release(&l, t1);
        assert_eq!(s.convict(&l, ev, t1), Ok(Duration::from_secs(30)), "capped");
        s.release(&l, t1);
        // Long after its last release it starts over.
        assert_eq!(
            s.convict(&l, ev, t1 + Duration::from_secs(31)),
            Ok(Duration::from_secs(10))
        );
        assert!(s.set_trusted(&l, true, t1), "trust releases it");
        assert_eq!(s.convict(&l, ev, t1), Err(Spared::Trusted));
        s.set_trusted(&l, false, t1);
        assert!(s.convict(&l, ev, t1).is_ok());
    }
}
