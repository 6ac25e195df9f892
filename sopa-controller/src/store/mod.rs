//! Where the controller's state outlives the controller: the epoch, the version, and every link
//! and switch that is down (an operator's drain or a switch's report). A change is durable
//! before anyone hears of it: the controller writes it here first, and a change that cannot be
//! written is undone and refused. A restarted controller continues from the stored state: the
//! same epoch and the next version, so agents that are up to date need no snapshot.
//!
//! `file:PATH` keeps it in one JSON file, replaced atomically (a new file written and synced
//! beside it, then renamed over it); `memory` keeps nothing (tests, throwaway fabrics).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

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
    pub down_switches: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("--store {0:?}: write file:PATH or memory")]
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
}

/// Where the state is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    Memory,
    File(PathBuf),
}

impl std::str::FromStr for Store {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        match s.split_once(':') {
            _ if s == "memory" => Ok(Store::Memory),
            Some(("file", path)) if !path.is_empty() => Ok(Store::File(path.into())),
            _ => Err(StoreError::Spec(s.to_owned())),
        }
    }
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Memory => f.write_str("memory"),
            Store::File(p) => write!(f, "file:{}", p.display()),
        }
    }
}

impl Store {
    /// The stored state, if there is one.
    pub fn load(&self) -> Result<Option<Persisted>, StoreError> {
        let Store::File(path) = self else {
            return Ok(None);
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StoreError::Io {
                    path: path.clone(),
                    source,
                });
            }
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StoreError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })
    }

    /// Makes `state` durable: when this returns `Ok`, a crash right after loses nothing.
    pub fn save(&self, state: &Persisted) -> Result<(), StoreError> {
        let Store::File(path) = self else {
            return Ok(());
        };
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let tmp = temp_path(path);
        let bytes = serde_json::to_vec_pretty(state).expect("the state serializes");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)?;
        // The rename itself is durable once the folder is synced. The file already holds the
        // new state: a failure here is reported, not turned into a refusal (which would undo
        // in memory what the file keeps).
        if let Err(e) = std::fs::File::open(&dir).and_then(|d| d.sync_all()) {
            tracing::warn!(path = %path.display(), error = %e, "syncing the state's folder failed");
        }
        Ok(())
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_parse_and_a_file_round_trips_atomically() {
        assert_eq!("memory".parse::<Store>().unwrap(), Store::Memory);
        assert!("file:".parse::<Store>().is_err());
        assert!("etcd".parse::<Store>().is_err());
        let dir = std::env::temp_dir().join(format!("sopa-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let store: Store = format!("file:{}", path.display()).parse().unwrap();
        assert_eq!(store.load().unwrap(), None, "no file yet: no state");
        let state = Persisted {
            topology: "{}".into(),
            epoch: 9,
            version: 3,
            down_links: vec![("a0".into(), "e0".into())],
            reported_down: vec![("a1".into(), "e1".into())],
            down_switches: vec!["c1".into()],
        };
        store.save(&state).unwrap();
        assert_eq!(store.load().unwrap(), Some(state));
        assert!(!temp_path(&path).exists(), "no temporary file left");
        std::fs::write(&path, "{\"epoch\": ").unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("does not parse"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
