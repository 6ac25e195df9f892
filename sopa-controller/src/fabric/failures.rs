//! Which links and switches are down and why (drained, reported by an end, suspect,
//! miscabled), and the changes that take them down or bring them back.

use std::collections::{BTreeMap, BTreeSet};

use sopa_topology::paths::Failures;

use sopa_channel::proto::{Change, Delta, LinkChange, LinkRef, SwitchChange, change};

use super::{Fabric, FabricError, LEGACY_REPORTER, key};

/// Records that end `by` says link `k` is down (`on`) or no longer; the link leaves `map` when
/// no end says so (`also` names ends that any end's "no longer" removes too).
fn set_end(
    map: &mut BTreeMap<(String, String), BTreeSet<String>>,
    k: &(String, String),
    by: &str,
    on: bool,
    also: &[&str],
) {
    if on {
        map.entry(k.clone()).or_default().insert(by.to_owned());
    } else if let Some(ends) = map.get_mut(k) {
        ends.remove(by);
        for e in also {
            ends.remove(*e);
        }
        if ends.is_empty() {
            map.remove(k);
        }
    }
}

impl Fabric {
    /// Two racks left without any path now, if any ([`crate::isolation`]).
    pub fn isolated_racks(&self) -> Option<(String, String)> {
        crate::isolation::isolated_racks(&self.topology, &self.failures())
    }

    /// Every link that is down: drained, reported or suspect.
    pub fn down_links(&self) -> Vec<LinkRef> {
        self.all_down()
            .into_iter()
            .map(|(a, b)| LinkRef {
                a: a.clone(),
                b: b.clone(),
            })
            .collect()
    }

    /// Every link down for the agents, for any reason, once.
    fn all_down(&self) -> BTreeSet<&(String, String)> {
        self.down_links
            .iter()
            .chain(self.reported_down.keys())
            .chain(&self.suspect)
            .chain(self.miscabled.keys())
            .collect()
    }

    /// Links the path meter found lossy, drained now.
    pub fn suspect_links(&self) -> Vec<(String, String)> {
        self.suspect.iter().cloned().collect()
    }

    /// The path meter convicts a link or its hold-down ends. Returns the delta when the link's
    /// state for the agents changed.
    pub fn set_suspect(
        &mut self,
        a: &str,
        b: &str,
        suspect: bool,
    ) -> Result<Option<Delta>, FabricError> {
        self.check_link(a, b)?;
        let k = key(a, b);
        let before = self.link_down(&k);
        if suspect {
            self.suspect.insert(k.clone());
        } else {
            self.suspect.remove(&k);
        }
        Ok(self.link_delta(k, before))
    }

    pub fn down_switches(&self) -> Vec<String> {
        self.down_switches.iter().cloned().collect()
    }

    /// The down links and switches as the path computation takes them.
    pub fn failures(&self) -> Failures {
        let g = self.topology.graph();
        let mut f = Failures::none(g);
        for (a, b) in self.all_down() {
            if let (Some(na), Some(nb)) = (g.find(a), g.find(b)) {
                for l in g.links_between(na, nb).collect::<Vec<_>>() {
                    f.set_link(l, true);
                }
            }
        }
        for name in &self.down_switches {
            if let Some(n) = g.find(name) {
                f.set_node(g, n, true);
            }
        }
        f
    }

    /// Checks that `a`-`b` is a link of the topology.
    pub fn check_link(&self, a: &str, b: &str) -> Result<(), FabricError> {
        let g = self.topology.graph();
        let na = g
            .find(a)
            .ok_or_else(|| FabricError::UnknownNode(a.to_owned()))?;
        let nb = g
            .find(b)
            .ok_or_else(|| FabricError::UnknownNode(b.to_owned()))?;
        if g.links_between(na, nb).next().is_none() {
            return Err(FabricError::NoLink(a.to_owned(), b.to_owned()));
        }
        Ok(())
    }

    pub fn check_switch(&self, name: &str) -> Result<(), FabricError> {
        let g = self.topology.graph();
        let n = g
            .find(name)
            .ok_or_else(|| FabricError::UnknownNode(name.to_owned()))?;
        if !g.node(n).kind.is_switch() {
            return Err(FabricError::NotASwitch(name.to_owned()));
        }
        Ok(())
    }

    /// An operator drains a link or ends its drain (every parallel link between the two
    /// nodes). Returns the new version's delta, or `None` when the link's state for the agents
    /// did not change (it may still be reported down by its switch).
    pub fn set_link(&mut self, a: &str, b: &str, down: bool) -> Result<Option<Delta>, FabricError> {
        self.check_link(a, b)?;
        let k = key(a, b);
        let before = self.link_down(&k);
        if down {
            self.down_links.insert(k.clone());
        } else {
            self.down_links.remove(&k);
        }
        Ok(self.link_delta(k, before))
    }

    /// Switch `by`, an end of link `a`-`b`, reports its port's carrier. A port up again ends
    /// only that switch's report of the link: the other end's report, and an operator's drain,
    /// stay.
    pub fn report_link(
        &mut self,
        a: &str,
        b: &str,
        by: &str,
        down: bool,
    ) -> Result<Option<Delta>, FabricError> {
        self.check_end(a, b, by)?;
        let k = key(a, b);
        let before = self.link_down(&k);
        // A legacy entry is ended by either end's up.
        set_end(&mut self.reported_down, &k, by, down, &[LEGACY_REPORTER]);
        Ok(self.link_delta(k, before))
    }

    /// Checks that `a`-`b` is a link of the topology and `by` one of its ends.
    fn check_end(&self, a: &str, b: &str, by: &str) -> Result<(), FabricError> {
        self.check_link(a, b)?;
        if by != a && by != b {
            return Err(FabricError::NotAnEnd {
                switch: by.to_owned(),
                link: format!("{a}:{b}"),
            });
        }
        Ok(())
    }

    /// Switch `by`'s LLDP finds link `a`-`b` (one of its own) cabled otherwise than the
    /// inventory says, or no longer. Returns the delta when the link's state for the agents
    /// changed.
    pub fn set_miscabled(
        &mut self,
        a: &str,
        b: &str,
        by: &str,
        miscabled: bool,
    ) -> Result<Option<Delta>, FabricError> {
        self.check_end(a, b, by)?;
        let k = key(a, b);
        let before = self.link_down(&k);
        set_end(&mut self.miscabled, &k, by, miscabled, &[]);
        Ok(self.link_delta(k, before))
    }

    /// The links switch `by` finds miscabled now.
    pub fn miscabled_at(&self, by: &str) -> BTreeSet<(String, String)> {
        self.miscabled
            .iter()
            .filter(|(_, ends)| ends.contains(by))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The ends that report link `a`-`b` down.
    pub fn reporters(&self, a: &str, b: &str) -> Vec<String> {
        self.reported_down
            .get(&key(a, b))
            .map(|ends| ends.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether link `a`-`b` is down for the agents, for any reason.
    pub fn is_link_down(&self, a: &str, b: &str) -> bool {
        self.link_down(&key(a, b))
    }

    fn link_down(&self, k: &(String, String)) -> bool {
        self.down_links.contains(k)
            || self.reported_down.contains_key(k)
            || self.suspect.contains(k)
            || self.miscabled.contains_key(k)
    }

    /// The delta of link `k` if its state for the agents changed from `before`.
    fn link_delta(&mut self, k: (String, String), before: bool) -> Option<Delta> {
        let down = self.link_down(&k);
        (down != before).then(|| {
            self.record(Change {
                kind: Some(change::Kind::Link(LinkChange {
                    link: Some(LinkRef { a: k.0, b: k.1 }),
                    down,
                    ..Default::default()
                })),
            })
        })
    }

    /// The links an operator drained (a subset of [`Fabric::down_links`]).
    pub fn drained_links(&self) -> Vec<LinkRef> {
        self.down_links
            .iter()
            .map(|(a, b)| LinkRef {
                a: a.clone(),
                b: b.clone(),
            })
            .collect()
    }

    pub fn set_switch(&mut self, name: &str, down: bool) -> Result<Option<Delta>, FabricError> {
        self.check_switch(name)?;
        let changed = if down {
            self.down_switches.insert(name.to_owned())
        } else {
            self.down_switches.remove(name)
        };
        Ok(changed.then(|| {
            self.record(Change {
                kind: Some(change::Kind::Switch(SwitchChange {
                    name: name.to_owned(),
                    down,
                    ..Default::default()
                })),
            })
        }))
    }
}
