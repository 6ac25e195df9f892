//! Where the controller's state outlives the controller: the epoch, the version, and every link
//! and switch that is down (an operator's drain or a switch's report). A change is durable
//! before anyone hears of it: the controller writes it here first, and a change that cannot be
//! written is refused and never made. A restarted controller (or a newly elected leader)
//! continues from the stored state: the same epoch and the next version, so agents that are up
//! to date need no snapshot.
//!
//! - `file:PATH` ([`file`]): one JSON file, replaced atomically; one controller.
//! - `etcd:HOST:PORT,...` ([`etcd`]): one key in etcd, written by compare-and-swap and fenced
//!   by the writer's leadership lease ([`crate::election`]); two or three controller replicas.
//! - `memory`: nothing kept (tests, throwaway fabrics).

pub mod etcd;
pub mod file;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use etcd::EtcdStore;

/// The stored state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Persisted {
    /// The topology spec (JSON) the state belongs to.
    pub topology: String,
    pub epoch: u64,
    pub version: u64,
    /// Links an operator drained.
    pub down_links: Vec<(String, String)>,
    /// Links their switch reported down.
    #[serde(default)]
    pub reported_down: Vec<(String, String)>,
    /// Which end reports each of them down: (link a, link b, the end). A link of
    /// `reported_down` with none here was stored before the ends were kept.
    #[serde(default)]
    pub reported_by: Vec<(String, String, String)>,
    pub down_switches: Vec<String>,
    /// Links the path meter found losing packets (drained until their hold-down ends).
    #[serde(default)]
    pub suspect: Vec<(String, String)>,
    /// Links an end's LLDP found miscabled against the inventory: (link a, link b, the end).
    #[serde(default)]
    pub miscabled: Vec<(String, String, String)>,
    /// Who made the newest changes, and why (`crate::audit`).
    #[serde(default)]
    pub audit: Vec<crate::audit::AuditRecord>,
    /// Certificate serials revoked through the controller (`sopactl certs revoke`): with the
    /// state, so every replica refuses them.
    #[serde(default)]
    pub revoked: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("--store {0:?}: write file:PATH, etcd:HOST:PORT[,HOST:PORT...] or memory")]
    Spec(String),
    #[error("state file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state file {path} does not parse ({message}); restore it from a backup, or move it away to start from an empty state"
    )]
    Parse { path: PathBuf, message: String },
    #[error(
        "etcd at {endpoints} did not answer or confirm ({message}); a write under way may or may not have been made"
    )]
    Etcd { endpoints: String, message: String },
    #[error(
        "etcd key {key} does not hold a controller state ({message}); restore it from a backup (`etcdctl snapshot restore`), or delete the key to start from an empty state"
    )]
    Corrupt { key: String, message: String },
    #[error(
        "this controller is no longer the leader (the leader is {holder}); nothing was written"
    )]
    NotLeader { holder: String },
    #[error(
        "the state in etcd changed under this controller (another writer?); nothing was written"
    )]
    Conflict,
}

impl StoreError {
    /// Whether this controller must stop serving after the error: a replica that lost its
    /// leadership, or whose last write may or may not have landed, no longer knows the state.
    pub fn ends_leadership(&self) -> bool {
        matches!(
            self,
            StoreError::NotLeader { .. } | StoreError::Conflict | StoreError::Etcd { .. }
        )
    }
}

/// Where the state is kept, as `--store` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    Memory,
    File(PathBuf),
    /// etcd's client endpoints (HOST:PORT).
    Etcd(Vec<String>),
}

impl std::str::FromStr for StoreSpec {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        match s.split_once(':') {
            _ if s == "memory" => Ok(StoreSpec::Memory),
            Some(("file", path)) if !path.is_empty() => Ok(StoreSpec::File(path.into())),
            Some(("etcd", list)) => {
                let endpoints: Vec<String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(str::to_owned)
                    .collect();
                let valid = |e: &String| {
                    e.rsplit_once(':')
                        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
                };
                if endpoints.is_empty() || !endpoints.iter().all(valid) {
                    return Err(StoreError::Spec(s.to_owned()));
                }
                Ok(StoreSpec::Etcd(endpoints))
            }
            _ => Err(StoreError::Spec(s.to_owned())),
        }
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Memory => f.write_str("memory"),
            StoreSpec::File(p) => write!(f, "file:{}", p.display()),
            StoreSpec::Etcd(e) => write!(f, "etcd:{}", e.join(",")),
        }
    }
}

/// An open store.
#[derive(Clone, Debug)]
pub enum Store {
    Memory,
    File(PathBuf),
    /// Boxed: the client is large, the other variants small.
    Etcd(Box<EtcdStore>),
}

impl Store {
    /// The stored state, if there is one.
    pub async fn load(&self) -> Result<Option<Persisted>, StoreError> {
        match self {
            Store::Memory => Ok(None),
            Store::File(path) => file::load(path),
            Store::Etcd(e) => e.load().await,
        }
    }

    /// Makes `state` durable: when this returns `Ok`, a crash right after loses nothing.
    pub async fn save(&self, state: &Persisted) -> Result<(), StoreError> {
        match self {
            Store::Memory => Ok(()),
            Store::File(path) => file::save(path, state),
            Store::Etcd(e) => e.save(state).await,
        }
    }

    /// With replicas, the name this controller leads under (`None` until it is elected, and
    /// for a single controller).
    pub fn leader(&self) -> Option<String> {
        match self {
            Store::Etcd(e) => e.leader(),
            Store::Memory | Store::File(_) => None,
        }
    }
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Memory => f.write_str("memory"),
            Store::File(p) => write!(f, "file:{}", p.display()),
            Store::Etcd(e) => write!(f, "etcd:{} (keys under {})", e.endpoints(), e.prefix()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_specs_parse_and_name_the_bad_one() {
        assert_eq!("memory".parse::<StoreSpec>().unwrap(), StoreSpec::Memory);
        assert_eq!(
            "file:/x/y.json".parse::<StoreSpec>().unwrap(),
            StoreSpec::File("/x/y.json".into())
        );
        assert_eq!(
            "etcd:10.0.0.1:2379, 10.0.0.2:2379"
                .parse::<StoreSpec>()
                .unwrap(),
            StoreSpec::Etcd(vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()])
        );
        for bad in [
            "file:",
            "etcd",
            "etcd:",
            "etcd:host",
            "etcd:host:port",
            "s3:x",
        ] {
            let err = bad.parse::<StoreSpec>().unwrap_err().to_string();
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }
}
