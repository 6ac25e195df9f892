//! The controller's fabric: the topology spec, which links and switches are down, and a version
//! per change, with the recent deltas kept so a reconnecting agent can catch up without a
//! snapshot.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use sopa_topology::{Topology, srv6::Encoding, topology::TopologySpec};

use sopa_channel::proto::{Change, Delta, Snapshot};

mod failures;
mod persisted;
mod spec;

pub use persisted::Checkpoint;

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

/// The end of a reported link in a state stored before the reporting ends were kept: either
/// end's report that its port is up ends it, as then.
pub const LEGACY_REPORTER: &str = "";

/// A link named by its ends, in a canonical order.
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

    /// Sets how hosts carry the path; pushed with every snapshot.
    pub fn set_encoding(&mut self, encoding: Encoding) {
        self.encoding = encoding;
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
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
mod tests;

/// An agent's view follows this fabric through its snapshots and deltas.
#[cfg(test)]
mod view_tests;
