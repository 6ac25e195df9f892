//! The controller's fabric: the topology spec, which links and switches are down, and a version
//! per change, with the recent deltas kept so a reconnecting agent can catch up without a
//! snapshot.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Deserialize;
use sopa_topology::{
    Topology, inventory::Inventory, paths::Failures, srv6::Encoding, topology::TopologySpec,
};

use sopa_channel::proto::{Change, Delta, LinkChange, LinkRef, Snapshot, SwitchChange, change};

use crate::store::Persisted;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FabricError {
    #[error("topology spec {path}: {message}")]
    Spec { path: String, message: String },
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    #[error("no link between {0} and {1}")]
    NoLink(String, String),
    #[error("{0} is a host, not a switch")]
    NotASwitch(String),
    #[error(
        "taking {what} down leaves racks {a} and {b} with no path between them; give --force to \
         take it down anyway (with a --reason)"
    )]
    WouldIsolate { what: String, a: String, b: String },
    #[error("{0}")]
    BadSerial(String),
    #[error("{switch} reported link {link}, which is not one of its ports")]
    NotAnEnd { switch: String, link: String },
    #[error("invalid topology: {0}")]
    Topology(String),
    #[error(
        "the stored state belongs to another topology ({stored}); start with the topology it was written for, or move the state file away to start this one from an empty state"
    )]
    StoredForAnother { stored: String },
    #[error("the stored state names {0}, which this topology does not have: {1}")]
    StoredUnknown(String, String),
    #[error("the change was not made durable, so it was not made: {0}")]
    NotDurable(String),
}

/// The topology spec file the controller loads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    /// How hosts carry the path: `ipv4-option` (the default) or `srv6`.
    #[serde(default)]
    encoding: Encoding,
    topology: TopologySpec,
}

/// How many deltas the controller keeps for agents catching up.
pub const HISTORY: usize = 4096;

#[derive(Clone)]
pub struct Fabric {
    spec_json: String,
    /// Shared, so work that needs the topology (a Hedera round) runs without the fabric's lock.
    topology: std::sync::Arc<Topology>,
    epoch: u64,
    version: u64,
    /// Links an operator took down (drains).
    down_links: BTreeSet<(String, String)>,
    /// Links a switch reported down (a port without carrier), with the ends that report it
    /// so. A link is down for the agents while a drain or any end says so: a switch's report
    /// that its port is up again ends its own report only, never the other end's or a drain.
    /// [`LEGACY_REPORTER`] stands for an end a state stored before ends were kept named.
    reported_down: BTreeMap<(String, String), BTreeSet<String>>,
    /// Links the path meter found losing packets: drained like the others while suspect.
    suspect: BTreeSet<(String, String)>,
    /// Links an end's LLDP finds cabled otherwise than the inventory says, with those ends:
    /// kept out of every path while any end says so.
    miscabled: BTreeMap<(String, String), BTreeSet<String>>,
    down_switches: BTreeSet<String>,
    history: VecDeque<Delta>,
    /// Who made the newest changes, and why.
    audit: crate::audit::AuditLog,
    /// Certificate serials revoked through the controller.
    revoked: BTreeSet<String>,
    /// Not part of the stored state: a restart with another encoding keeps the fabric's.
    encoding: Encoding,
}

/// The fabric as it was before a change, to return to when the change cannot be stored.
pub struct Checkpoint {
    state: Persisted,
    history_len: usize,
}

/// The end of a reported link in a state stored before the reporting ends were kept: either
/// end's report that its port is up ends it, as then.
pub const LEGACY_REPORTER: &str = "";

/// A link named by its ends, in a canonical order.
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

fn key(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

impl Fabric {
    /// A fabric at version 1 with everything up; `epoch` identifies this controller run.
    pub fn new(spec: TopologySpec, epoch: u64) -> Result<Self, FabricError> {
        let topology = Topology::build(&spec).map_err(|e| FabricError::Topology(e.to_string()))?;
        Ok(Self {
            spec_json: serde_json::to_string(&spec).expect("specs serialize"),
            topology: std::sync::Arc::new(topology),
            epoch,
            version: 1,
            down_links: BTreeSet::new(),
            reported_down: BTreeMap::new(),
            suspect: BTreeSet::new(),
            miscabled: BTreeMap::new(),
            down_switches: BTreeSet::new(),
            history: VecDeque::new(),
            audit: crate::audit::AuditLog::default(),
            revoked: BTreeSet::new(),
            encoding: Encoding::default(),
        })
    }

    /// Parses a topology spec file:
    ///
    /// ```toml
    /// [topology]
    /// kind = "fat-tree"      # or "modric" with m, n, q, x, y [, s1_gbps, s2_gbps, [topology.bits]]
    /// k = 4
    /// ```
    pub fn parse_spec(text: &str, path: &str) -> Result<TopologySpec, FabricError> {
        Self::parse_spec_file(text, path).map(|(spec, _)| spec)
    }

    /// Parses a topology spec file with the fabric's encoding: an inventory
    /// (`sopa_topology::inventory`), or a generated fabric's spec:
    ///
    /// ```toml
    /// encoding = "srv6"      # or "ipv4-option", the default
    /// [topology]
    /// kind = "fat-tree"
    /// k = 4
    /// ```
    pub fn parse_spec_file(
        text: &str,
        path: &str,
    ) -> Result<(TopologySpec, Encoding), FabricError> {
        let syntax = |e: String| FabricError::Spec {
            path: path.to_owned(),
            message: e.trim().to_owned(),
        };
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
        // A file without a [topology] table is an operator's inventory.
        let file = if table.contains_key("topology") {
            toml::from_str::<SpecFile>(text).map_err(|e| syntax(e.to_string()))?
        } else {
            let inv = Inventory::from_toml(text).map_err(syntax)?;
            SpecFile {
                encoding: inv.encoding.unwrap_or_default(),
                topology: TopologySpec::Inventory(Box::new(inv)),
            }
        };
        // Building it is the consistency check.
        let topology = Topology::build(&file.topology).map_err(|e| FabricError::Spec {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        if file.encoding == Encoding::Srv6 {
            sopa_topology::srv6::Usids::of(&topology).map_err(|e| FabricError::Spec {
                path: path.to_owned(),
                message: format!("encoding \"srv6\": {e}"),
            })?;
        }
        if file.encoding == Encoding::Entropy {
            sopa_topology::entropy::check(&topology).map_err(|e| FabricError::Spec {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        }
        Ok((file.topology, file.encoding))
    }

    /// Sets how hosts carry the path; pushed with every snapshot.
    pub fn set_encoding(&mut self, encoding: Encoding) {
        self.encoding = encoding;
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// The fabric of a stored state: its epoch, its version (the next change is one more),
    /// and its down links and switches. The state must belong to `spec`.
    pub fn restore(spec: TopologySpec, state: &Persisted) -> Result<Self, FabricError> {
        let mut f = Self::new(spec, state.epoch)?;
        if state.topology != f.spec_json {
            return Err(FabricError::StoredForAnother {
                stored: state.topology.clone(),
            });
        }
        for (a, b) in &state.down_links {
            f.check_link(a, b)
                .map_err(|e| FabricError::StoredUnknown(format!("link {a}:{b}"), e.to_string()))?;
            f.down_links.insert(key(a, b));
        }
        for (a, b, by) in &state.reported_by {
            f.check_link(a, b)
                .map_err(|e| FabricError::StoredUnknown(format!("link {a}:{b}"), e.to_string()))?;
            f.reported_down
                .entry(key(a, b))
                .or_default()
                .insert(by.clone());
        }
        for (a, b) in &state.reported_down {
            f.check_link(a, b)
                .map_err(|e| FabricError::StoredUnknown(format!("link {a}:{b}"), e.to_string()))?;
            // A state stored before the reporting ends were kept: either end's up ends it.
            f.reported_down
                .entry(key(a, b))
                .or_insert_with(|| BTreeSet::from([LEGACY_REPORTER.to_owned()]));
        }
        for (a, b) in &state.suspect {
            f.check_link(a, b)
                .map_err(|e| FabricError::StoredUnknown(format!("link {a}:{b}"), e.to_string()))?;
            f.suspect.insert(key(a, b));
        }
        for (a, b, by) in &state.miscabled {
            f.check_link(a, b)
                .map_err(|e| FabricError::StoredUnknown(format!("link {a}:{b}"), e.to_string()))?;
            f.miscabled.entry(key(a, b)).or_default().insert(by.clone());
        }
        for name in &state.down_switches {
            f.check_switch(name)
                .map_err(|e| FabricError::StoredUnknown(format!("switch {name}"), e.to_string()))?;
            f.down_switches.insert(name.clone());
        }
        f.version = state.version.max(1);
        f.audit = crate::audit::AuditLog::from_stored(state.audit.clone());
        f.revoked = state.revoked.iter().cloned().collect();
        Ok(f)
    }

    /// Serves this state under `epoch` from now on: agents of another epoch take a snapshot,
    /// whatever version they hold. The kept deltas, of the old epoch, go.
    pub fn renew_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.history.clear();
    }

    /// What a store keeps of this fabric.
    pub fn persisted(&self) -> Persisted {
        Persisted {
            topology: self.spec_json.clone(),
            epoch: self.epoch,
            version: self.version,
            down_links: self.down_links.iter().cloned().collect(),
            reported_down: self.reported_down.keys().cloned().collect(),
            reported_by: self.reported_by(),
            down_switches: self.down_switches.iter().cloned().collect(),
            suspect: self.suspect.iter().cloned().collect(),
            miscabled: self.miscabled_by(),
            audit: self.audit.to_vec(),
            revoked: self.revoked.iter().cloned().collect(),
        }
    }

    /// Revokes certificate `serial` (kept in the audit log as made by `actor`); whether it
    /// was not revoked before.
    pub fn revoke(&mut self, serial: &str, actor: &crate::audit::Actor) -> bool {
        let new = self.revoked.insert(serial.to_owned());
        if new {
            self.audit
                .note_what(actor, self.version, format!("revoke certificate {serial}"));
        }
        new
    }

    /// Certificate serials revoked through the controller.
    pub fn revoked(&self) -> &BTreeSet<String> {
        &self.revoked
    }

    /// Keeps `delta` in the audit log as made by `actor`.
    pub fn note(&mut self, actor: &crate::audit::Actor, delta: &Delta) {
        self.audit.note(actor, delta);
    }

    /// Who made the newest changes, and why.
    pub fn audit(&self) -> &crate::audit::AuditLog {
        &self.audit
    }

    /// Two racks left without any path now, if any ([`crate::isolation`]).
    pub fn isolated_racks(&self) -> Option<(String, String)> {
        crate::isolation::isolated_racks(&self.topology, &self.failures())
    }

    /// Where the fabric is now, to [`Fabric::rollback`] to.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            state: self.persisted(),
            history_len: self.history.len(),
        }
    }

    /// Whether anything a store keeps changed since `c`.
    pub fn changed_since(&self, c: &Checkpoint) -> bool {
        self.persisted() != c.state
    }

    /// Returns to `c`, undoing every change since (changes that could not be stored).
    pub fn rollback(&mut self, c: Checkpoint) {
        let s = c.state;
        self.version = s.version;
        self.down_links = s.down_links.into_iter().collect();
        self.reported_down = BTreeMap::new();
        for (a, b, by) in s.reported_by {
            self.reported_down.entry((a, b)).or_default().insert(by);
        }
        for k in s.reported_down {
            self.reported_down
                .entry(k)
                .or_insert_with(|| BTreeSet::from([LEGACY_REPORTER.to_owned()]));
        }
        self.down_switches = s.down_switches.into_iter().collect();
        self.suspect = s.suspect.into_iter().collect();
        self.miscabled = BTreeMap::new();
        for (a, b, by) in s.miscabled {
            self.miscabled.entry((a, b)).or_default().insert(by);
        }
        self.audit = crate::audit::AuditLog::from_stored(s.audit);
        self.revoked = s.revoked.into_iter().collect();
        // A change adds at most one delta; one dropped from the front meanwhile is not
        // brought back (agents that far behind take a snapshot).
        self.history.truncate(c.history_len);
        while self
            .history
            .back()
            .is_some_and(|d| d.version > self.version)
        {
            self.history.pop_back();
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The topology, to use after the fabric's lock is released (it never changes).
    pub fn shared_topology(&self) -> std::sync::Arc<Topology> {
        std::sync::Arc::clone(&self.topology)
    }

    pub fn spec_json(&self) -> &str {
        &self.spec_json
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

    /// Each (link, end) that finds the link miscabled.
    fn miscabled_by(&self) -> Vec<(String, String, String)> {
        self.miscabled
            .iter()
            .flat_map(|((a, b), ends)| ends.iter().map(move |e| (a.clone(), b.clone(), e.clone())))
            .collect()
    }

    /// Each (link, end) that reports the link down.
    fn reported_by(&self) -> Vec<(String, String, String)> {
        self.reported_down
            .iter()
            .flat_map(|((a, b), ends)| {
                ends.iter()
                    .filter(|e| *e != LEGACY_REPORTER)
                    .map(move |e| (a.clone(), b.clone(), e.clone()))
            })
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

    fn record(&mut self, change: Change) -> Delta {
        let delta = Delta {
            epoch: self.epoch,
            version: self.version + 1,
            base_version: self.version,
            changes: vec![change],
        };
        self.version += 1;
        self.history.push_back(delta.clone());
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        delta
    }

    /// The fabric's snapshot (the path meter's clock, which is the controller's and not the
    /// fabric's, is the channel's to add).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            epoch: self.epoch,
            version: self.version,
            topology: self.spec_json.clone(),
            down_links: self.down_links(),
            down_switches: self.down_switches(),
            encoding: self.encoding.name().to_owned(),
            meter_period_ms: 0,
            meter_epoch_ns: 0,
        }
    }

    /// The deltas that bring an agent at (`epoch`, `version`) up to date, or `None` when it
    /// needs a snapshot (another epoch, or older than the history, or ahead of us).
    pub fn deltas_since(&self, epoch: u64, version: u64) -> Option<Vec<Delta>> {
        if epoch != self.epoch || version > self.version || version == 0 {
            return None;
        }
        if version == self.version {
            return Some(Vec::new());
        }
        let first = self.history.front()?.base_version;
        if version < first {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|d| d.base_version >= version)
                .cloned()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sopa_channel::view::FabricView;

    fn fabric() -> Fabric {
        Fabric::new(TopologySpec::FatTree { k: 4 }, 7).unwrap()
    }

    #[test]
    fn every_change_is_a_version() {
        let mut f = fabric();
        assert_eq!(f.version(), 1);
        let d = f.set_link("e0", "a0", true).unwrap().unwrap();
        assert_eq!((d.base_version, d.version, d.epoch), (1, 2, 7));
        assert!(
            f.set_link("a0", "e0", true).unwrap().is_none(),
            "already down, either order"
        );
        let d = f.set_switch("c0", true).unwrap().unwrap();
        assert_eq!(d.version, 3);
        assert_eq!(
            f.snapshot().down_links,
            vec![LinkRef {
                a: "a0".into(),
                b: "e0".into()
            }]
        );
        assert_eq!(f.snapshot().down_switches, vec!["c0".to_owned()]);
        f.set_link("e0", "a0", false).unwrap().unwrap();
        assert!(f.snapshot().down_links.is_empty());
    }

    #[test]
    fn bad_changes_are_refused_and_change_nothing() {
        let mut f = fabric();
        assert_eq!(
            f.set_link("e0", "c0", true),
            Err(FabricError::NoLink("e0".into(), "c0".into()))
        );
        assert_eq!(
            f.set_link("e0", "zz", true),
            Err(FabricError::UnknownNode("zz".into()))
        );
        assert_eq!(
            f.set_switch("h0", true),
            Err(FabricError::NotASwitch("h0".into()))
        );
        assert_eq!(f.version(), 1);
    }

    #[test]
    fn a_port_up_again_ends_only_its_switchs_report_never_a_drain() {
        let mut f = fabric();
        let down = |f: &Fabric| f.down_links().len();
        // Reported down, then up: two versions.
        assert!(f.report_link("e0", "a0", "e0", true).unwrap().is_some());
        assert!(f.report_link("a0", "e0", "e0", false).unwrap().is_some());
        assert_eq!((f.version(), down(&f)), (3, 0));
        // Drained, then reported down and up: the link stays down, no version for the reports.
        assert!(f.set_link("e0", "a0", true).unwrap().is_some());
        assert!(f.report_link("e0", "a0", "e0", true).unwrap().is_none());
        assert!(f.report_link("e0", "a0", "e0", false).unwrap().is_none());
        assert_eq!((f.version(), down(&f)), (4, 1));
        // Reported down while drained: ending the drain leaves it down.
        f.report_link("e0", "a0", "e0", true).unwrap();
        assert!(f.set_link("e0", "a0", false).unwrap().is_none());
        assert_eq!((f.version(), down(&f)), (4, 1));
        assert!(f.drained_links().is_empty());
        assert!(f.report_link("e0", "a0", "e0", false).unwrap().is_some());
        assert_eq!((f.version(), down(&f)), (5, 0));
    }

    #[test]
    fn a_link_is_up_only_when_no_end_reports_it_down() {
        let mut f = fabric();
        assert!(f.report_link("e0", "a0", "e0", true).unwrap().is_some());
        // a0 (restarted) reports its ports: its end is up, e0's is not.
        assert!(f.report_link("a0", "e0", "a0", false).unwrap().is_none());
        assert!(f.is_link_down("a0", "e0"));
        assert!(f.report_link("a0", "e0", "a0", true).unwrap().is_none());
        assert!(f.report_link("e0", "a0", "e0", false).unwrap().is_none());
        assert_eq!(f.reporters("a0", "e0"), ["a0"]);
        assert!(f.report_link("a0", "e0", "a0", false).unwrap().is_some());
        assert!(!f.is_link_down("a0", "e0"));
        // Only an end reports.
        assert!(matches!(
            f.report_link("a0", "e0", "c0", true),
            Err(FabricError::NotAnEnd { .. })
        ));
        // Both ends survive a store and a restore; a state stored before ends were named is
        // ended by either end.
        f.report_link("a0", "e0", "a0", true).unwrap();
        f.report_link("a0", "e0", "e0", true).unwrap();
        let stored = f.persisted();
        assert_eq!(stored.reported_by.len(), 2);
        let mut legacy = stored.clone();
        legacy.reported_by.clear();
        let mut g = Fabric::restore(TopologySpec::FatTree { k: 4 }, &legacy).unwrap();
        assert!(g.report_link("a0", "e0", "e0", false).unwrap().is_some());
        let mut h = Fabric::restore(TopologySpec::FatTree { k: 4 }, &stored).unwrap();
        assert!(h.report_link("a0", "e0", "e0", false).unwrap().is_none());
        assert_eq!(h.reporters("a0", "e0"), ["a0"]);
    }

    #[test]
    fn a_rollback_returns_to_the_checkpoint_and_a_restore_to_the_stored_state() {
        let mut f = fabric();
        f.set_link("e0", "a0", true).unwrap();
        let stored = f.persisted();
        let before = f.checkpoint();
        f.report_link("e1", "a1", "e1", true).unwrap();
        f.set_switch("c0", true).unwrap();
        assert!(f.changed_since(&before));
        f.rollback(before);
        assert_eq!(f.persisted(), stored);
        assert_eq!(
            f.deltas_since(7, 1).unwrap().len(),
            1,
            "the rolled-back deltas are gone"
        );
        let g = Fabric::restore(TopologySpec::FatTree { k: 4 }, &stored).unwrap();
        assert_eq!(g.persisted(), stored);
        let other = Fabric::restore(TopologySpec::FatTree { k: 6 }, &stored);
        assert!(matches!(other, Err(FabricError::StoredForAnother { .. })));
    }

    #[test]
    fn deltas_since_or_snapshot() {
        let mut f = fabric();
        for (a, b) in [("e0", "a0"), ("e0", "a1"), ("a0", "c0")] {
            f.set_link(a, b, true).unwrap();
        }
        assert_eq!(f.deltas_since(7, 4).unwrap().len(), 0);
        let catch_up = f.deltas_since(7, 2).unwrap();
        assert_eq!(
            catch_up.iter().map(|d| d.version).collect::<Vec<_>>(),
            [3, 4]
        );
        assert!(f.deltas_since(8, 2).is_none(), "another epoch: snapshot");
        assert!(f.deltas_since(7, 9).is_none(), "ahead of us: snapshot");
        assert!(f.deltas_since(7, 0).is_none(), "nothing applied: snapshot");
    }

    #[test]
    fn the_encoding_is_read_from_the_spec_file_and_pushed_with_every_snapshot() {
        let (spec, enc) = Fabric::parse_spec_file(
            "encoding = \"srv6\"\n[topology]\nkind = \"fat-tree\"\nk = 4\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(enc, Encoding::Srv6);
        let mut f = Fabric::new(spec, 1).unwrap();
        assert_eq!(f.snapshot().encoding, "ipv4-option", "the default");
        f.set_encoding(enc);
        assert_eq!(f.snapshot().encoding, "srv6");
        let view = FabricView::from_snapshot(&f.snapshot()).unwrap();
        assert_eq!(view.encoding, Encoding::Srv6);
        let e = Fabric::parse_spec_file(
            "encoding = \"mpls\"\n[topology]\nkind = \"fat-tree\"\nk = 4\n",
            "t.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("t.toml") && e.contains("mpls"), "{e}");
        // A controller older than the encoding sends none: the option.
        let old = Snapshot {
            encoding: String::new(),
            ..f.snapshot()
        };
        assert_eq!(
            FabricView::from_snapshot(&old).unwrap().encoding,
            Encoding::Ipv4Option
        );
    }

    #[test]
    fn the_shipped_specs_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/controller");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            Fabric::parse_spec_file(&text, &path.display().to_string())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
        assert!(seen >= 3, "{seen} specs in {}", dir.display());
    }

    #[test]
    fn an_inventory_is_a_spec_file_with_its_encoding() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/controller/leaf-spine-inventory.toml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let (spec, enc) = Fabric::parse_spec_file(&text, "dc1.toml").unwrap();
        assert_eq!(enc, Encoding::Ipv4Option);
        let TopologySpec::Inventory(inv) = &spec else {
            panic!("{spec:?}")
        };
        assert_eq!(inv.name.as_deref(), Some("dc1-leaf-spine"));
        let six = text.replace("encoding = \"ipv4-option\"", "encoding = \"srv6\"");
        assert_eq!(
            Fabric::parse_spec_file(&six, "dc1.toml").unwrap().1,
            Encoding::Srv6
        );
        // It travels to agents as JSON and comes back the same fabric.
        let f = Fabric::new(spec.clone(), 1).unwrap();
        let view = FabricView::from_snapshot(&f.snapshot()).unwrap();
        assert_eq!(view.spec, spec);
        assert!(view.topology.resolve_host("d-2").is_ok());
        // A refused inventory names the file and every fault.
        let bad = text
            .replace("tor = \"rack-b\"", "tor = \"rack-q\"")
            .replace("b = \"sp-1:swp1\"", "b = \"sp-1:swp2\"");
        let e = Fabric::parse_spec_file(&bad, "dc1.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dc1.toml")
                && e.contains("rack-q")
                && e.contains("sp-1:swp2 is cabled twice"),
            "{e}"
        );
    }

    #[test]
    fn spec_files_parse_and_are_checked() {
        let ft = Fabric::parse_spec("[topology]\nkind = \"fat-tree\"\nk = 4\n", "t.toml").unwrap();
        assert_eq!(ft, TopologySpec::FatTree { k: 4 });
        let m = Fabric::parse_spec(
            "[topology]\nkind = \"modric\"\nm = 2\nn = 2\nq = 1\nx = 2\ny = 4\n[topology.bits]\nrow = 4\ncol = 4\naccess = 8\nhost = 8\n",
            "m.toml",
        )
        .unwrap();
        assert!(matches!(m, TopologySpec::Modric(p) if p.bits.access == 8));
        for (text, needle) in [
            ("[topology]\nkind = \"fat-tree\"\nk = 5\n", "k must be even"),
            ("[topology]\nkind = \"torus\"\n", "torus"),
            (
                "[topology]\nkind = \"fat-tree\"\nk = 4\nextra = 1\n",
                "extra",
            ),
            ("[topology\n", "line 1"),
            (
                "[topology]\nkind = \"modric\"\nm = 2\nn = 2\nq = 1\nx = 2\ny = 70\n",
                "host bits",
            ),
        ] {
            let err = Fabric::parse_spec(text, "bad.toml")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("bad.toml") && err.contains(needle),
                "{text:?}: {err}"
            );
        }
    }
}

/// An agent's view follows this fabric through its snapshots and deltas.
#[cfg(test)]
mod view_tests {
    use sopa_channel::{
        proto::{LinkRef, Snapshot, change},
        view::{FabricView, ViewError},
    };
    use sopa_topology::topology::TopologySpec;

    use super::Fabric;

    #[test]
    fn snapshot_then_deltas_track_the_controller() {
        let mut f = Fabric::new(TopologySpec::FatTree { k: 4 }, 3).unwrap();
        f.set_link("e0", "a0", true).unwrap();
        let mut view = FabricView::from_snapshot(&f.snapshot()).unwrap();
        assert_eq!(view.version, 2);
        let g = view.topology.graph();
        let link = g
            .links_between(g.find("e0").unwrap(), g.find("a0").unwrap())
            .next()
            .unwrap();
        assert!(!view.failures.usable(g, link));
        let d = f.set_link("e0", "a0", false).unwrap().unwrap();
        let changed = view.apply_delta(&d).unwrap();
        assert_eq!(changed, vec![link]);
        assert!(view.failures.usable(view.topology.graph(), link));
        let d = f.set_switch("a1", true).unwrap().unwrap();
        assert_eq!(
            view.apply_delta(&d).unwrap().len(),
            4,
            "a switch of a k=4 Fat-Tree has 4 ports"
        );
    }

    #[test]
    fn bad_deltas_change_nothing() {
        let mut f = Fabric::new(TopologySpec::FatTree { k: 4 }, 3).unwrap();
        let mut view = FabricView::from_snapshot(&f.snapshot()).unwrap();
        let good = f.set_link("e0", "a0", true).unwrap().unwrap();
        let mut unknown = good.clone();
        if let Some(change::Kind::Link(l)) = &mut unknown.changes[0].kind {
            l.link = Some(LinkRef {
                a: "e0".into(),
                b: "c0".into(),
            });
        }
        // One good change and one unknown link: the whole delta is refused.
        let mut mixed = good.clone();
        mixed.changes.push(unknown.changes[0].clone());
        assert_eq!(
            view.apply_delta(&mixed),
            Err(ViewError::UnknownLink("e0".into(), "c0".into()))
        );
        assert_eq!(view.version, 1);
        assert!(view.failures.down_links().next().is_none());
        let mut other_epoch = good.clone();
        other_epoch.epoch = 4;
        assert!(view.apply_delta(&other_epoch).unwrap_err().needs_resync());
        let mut gap = good.clone();
        gap.base_version = 5;
        gap.version = 6;
        assert!(view.apply_delta(&gap).unwrap_err().needs_resync());
        view.apply_delta(&good).unwrap();
        assert_eq!(
            view.apply_delta(&good),
            Err(ViewError::Stale {
                have: 2,
                version: 2
            }),
            "duplicate"
        );
        let bad_spec = Snapshot {
            topology: "{\"kind\":\"torus\"}".into(),
            ..f.snapshot()
        };
        assert!(matches!(
            FabricView::from_snapshot(&bad_spec),
            Err(ViewError::BadSpec(_))
        ));
    }
}
