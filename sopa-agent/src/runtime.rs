//! Settings an operator changes at run time (`sopa-agent mode off` during an incident,
//! `sopa-agent granularity flowcell:8`) outlive the agent that ran then: each is kept in a
//! file of the node's run folder, and the next `run` of the node keeps it unless told
//! otherwise with its flag (`--mode`, `--granularity`).

use std::{fs, path::Path};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{
    error::{Error, Result},
    status::{mode_name, parse_mode},
};

const FILE: &str = "mode.json";

/// Seconds since the Unix epoch (0 on a clock before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Records `value` as `file` in the run folder `run_dir` (atomically).
pub fn save(run_dir: &Path, file: &str, value: &impl Serialize) -> Result<()> {
    fs::create_dir_all(run_dir)
        .map_err(|e| Error::io(format!("creating {}", run_dir.display()), e))?;
    let path = run_dir.join(file);
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(value).expect("serializes");
    fs::write(&tmp, bytes)
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The setting recorded as `file` in `run_dir`, if any; one that does not parse names the
/// file and `flag`, which replaces it.
pub fn load<T: DeserializeOwned>(run_dir: &Path, file: &str, flag: &str) -> Result<Option<T>> {
    let path = run_dir.join(file);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::Config(format!(
                "{} is not a setting made at run time ({e}); remove it, or start with {flag}",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
    }
}

/// Forgets the setting recorded as `file` (its flag given at start replaces it); the run
/// folder goes too once nothing else is in it.
pub fn clear(run_dir: &Path, file: &str) -> Result<()> {
    let path = run_dir.join(file);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("removing {}", path.display()), e))
        }
        _ => {
            let _ = fs::remove_dir(run_dir);
            Ok(())
        }
    }
}

/// The mode an operator set at run time, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeMode {
    pub mode: String,
    pub set_unix: u64,
}

impl RuntimeMode {
    pub fn new(mode: u32) -> Self {
        Self {
            mode: mode_name(mode).to_owned(),
            set_unix: unix_now(),
        }
    }

    /// The mode's number.
    pub fn value(&self) -> Result<u32> {
        parse_mode(&self.mode)
    }

    /// Records it in the node's run folder `run_dir` (atomically).
    pub fn save(&self, run_dir: &Path) -> Result<()> {
        save(run_dir, FILE, self)
    }

    /// The mode set at run time for the node of `run_dir`, if any.
    pub fn load(run_dir: &Path) -> Result<Option<Self>> {
        let m: Option<Self> = load(run_dir, FILE, "--mode")?;
        if let Some(m) = &m {
            m.value().map_err(|e| {
                Error::Config(format!(
                    "{} is not a run-time mode ({e}); remove it, or start with --mode",
                    run_dir.join(FILE).display()
                ))
            })?;
        }
        Ok(m)
    }

    /// Whether a mode set at run time is recorded for the node of `run_dir`.
    pub fn exists(run_dir: &Path) -> bool {
        run_dir.join(FILE).exists()
    }

    /// Forgets the mode set at run time (a `--mode` given at start replaces it).
    pub fn clear(run_dir: &Path) -> Result<()> {
        clear(run_dir, FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_time_mode_is_saved_read_back_and_cleared() {
        let dir = tempfile::Builder::new()
            .prefix("sopa-mode-")
            .tempdir()
            .unwrap();
        let node = dir.path().join("h0");
        assert_eq!(RuntimeMode::load(&node).unwrap(), None);
        let m = RuntimeMode::new(sopa_common::maps::mode::OFF);
        m.save(&node).unwrap();
        assert_eq!(RuntimeMode::load(&node).unwrap(), Some(m.clone()));
        assert_eq!(m.value().unwrap(), sopa_common::maps::mode::OFF);
        RuntimeMode::clear(&node).unwrap();
        assert_eq!(RuntimeMode::load(&node).unwrap(), None);
        assert!(!node.exists(), "the empty run folder goes");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(node.join(FILE), "{\"mode\":\"warp\",\"set_unix\":1}").unwrap();
        let err = RuntimeMode::load(&node).unwrap_err().to_string();
        assert!(err.contains("warp"), "{err}");
    }
}
