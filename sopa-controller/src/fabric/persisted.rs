//! What a store keeps of the fabric: restoring from it, checkpoints and rollback, and the
//! audit log and revoked serials kept with it.

use std::collections::{BTreeMap, BTreeSet};

use sopa_topology::topology::TopologySpec;

use sopa_channel::proto::Delta;

use crate::store::Persisted;

use super::{Fabric, FabricError, LEGACY_REPORTER, key};

/// The fabric as it was before a change, to return to when the change cannot be stored.
pub struct Checkpoint {
    state: Persisted,
    history_len: usize,
}

impl Fabric {
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
}
