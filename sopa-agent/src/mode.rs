//! A mode set at run time (`sopa-agent mode off` during an incident) outlives the agent that
//! ran then: it is kept in the node's run folder, and the next `run` of the node keeps it
//! unless told otherwise with `--mode`.

use std::{fs, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    status::{mode_name, parse_mode},
};

const FILE: &str = "mode.json";

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
            set_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// The mode's number.
    pub fn value(&self) -> Result<u32> {
        parse_mode(&self.mode)
    }

    /// Records it in the node's run folder `run_dir` (atomically).
    pub fn save(&self, run_dir: &Path) -> Result<()> {
        fs::create_dir_all(run_dir)
            .map_err(|e| Error::io(format!("creating {}", run_dir.display()), e))?;
        let path = run_dir.join(FILE);
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).expect("serializes");
        fs::write(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// The mode set at run time for the node of `run_dir`, if any.
    pub fn load(run_dir: &Path) -> Result<Option<Self>> {
        let path = run_dir.join(FILE);
        match fs::read(&path) {
            Ok(bytes) => {
                let bad = |why: String| {
                    Error::Config(format!(
                        "{} is not a run-time mode ({why}); remove it, or start with --mode",
                        path.display()
                    ))
                };
                let m: Self = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
                m.value().map_err(|e| bad(e.to_string()))?;
                Ok(Some(m))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Whether a mode set at run time is recorded for the node of `run_dir`.
    pub fn exists(run_dir: &Path) -> bool {
        run_dir.join(FILE).exists()
    }

    /// Forgets the mode set at run time (a `--mode` given at start replaces it).
    pub fn clear(run_dir: &Path) -> Result<()> {
        let path = run_dir.join(FILE);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("removing {}", path.display()), e))
            }
            _ => {
                // The folder goes too once nothing else is in it.
                let _ = fs::remove_dir(run_dir);
                Ok(())
            }
        }
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
