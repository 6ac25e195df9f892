//! Where the entropy encoding's labels come from. `discovered` is the product: one label per
//! distinct path, learned by probing. The other two are the baselines that measure what
//! discovery is worth, on the same fabric and datapath:
//!
//! - `blind`: as many random labels per destination host as it has paths, no probing, sent round
//!   robin like discovered ones. The hash sends several of them down one path and none down
//!   others (with 8 paths, the busiest carries 2.59 times its share on average).
//! - `per-packet`: a fresh random label on every packet (random packet spraying over the hash);
//!   the datapath draws it (`sopa_common::entropy::PER_PACKET` in the label map).
//!
//! `run --labels` chooses at start; `sopa-agent labels` changes a running agent's until its next
//! start, through [`REQUEST_FILE`] in its run folder and SIGHUP.

use std::{
    fmt,
    io::ErrorKind,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::error::Error;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LabelSource {
    /// One label per distinct path, found by probing (the default).
    #[default]
    Discovered,
    /// As many random labels as the destination has paths, no probing (baseline `rr-blind`).
    Blind,
    /// A random label on every packet (baseline `random`).
    PerPacket,
}

impl LabelSource {
    pub fn name(self) -> &'static str {
        match self {
            Self::Discovered => "discovered",
            Self::Blind => "blind",
            Self::PerPacket => "per-packet",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Discovered, Self::Blind, Self::PerPacket]
            .into_iter()
            .find(|l| l.name() == s.trim())
    }
}

impl fmt::Display for LabelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The file in a running agent's run folder that names the source `sopa-agent labels` asks for;
/// the agent reads it on SIGHUP.
pub const REQUEST_FILE: &str = "labels-wanted";

fn request_path(run_dir: &Path) -> PathBuf {
    run_dir.join(REQUEST_FILE)
}

/// Asks the agent of `run_dir` for `source` (it reads it at its next SIGHUP).
pub fn request(run_dir: &Path, source: LabelSource) -> Result<(), Error> {
    let path = request_path(run_dir);
    std::fs::write(&path, format!("{source}\n"))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The source asked for, if any; a file that names none is an error naming it.
pub fn requested(run_dir: &Path) -> Result<Option<LabelSource>, Error> {
    let path = request_path(run_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => LabelSource::parse(&text).map(Some).ok_or_else(|| {
            Error::Config(format!(
                "{}: {:?} is not a label source (discovered, blind or per-packet)",
                path.display(),
                text.trim()
            ))
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
    }
}

/// Forgets a request (at start: a run-time source lasts until the agent's next start).
pub fn clear(run_dir: &Path) -> Result<(), Error> {
    let path = request_path(run_dir);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            Err(Error::io(format!("removing {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("sopa-labels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(requested(&dir).unwrap(), None);
        request(&dir, LabelSource::PerPacket).unwrap();
        assert_eq!(requested(&dir).unwrap(), Some(LabelSource::PerPacket));
        std::fs::write(request_path(&dir), "sideways").unwrap();
        let err = requested(&dir).unwrap_err().to_string();
        assert!(err.contains("\"sideways\" is not a label source"), "{err}");
        clear(&dir).unwrap();
        clear(&dir).unwrap();
        assert_eq!(requested(&dir).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_are_the_flags() {
        use clap::ValueEnum as _;
        for s in LabelSource::value_variants() {
            let name = s.to_possible_value().unwrap().get_name().to_owned();
            assert_eq!(name, s.name());
            assert_eq!(LabelSource::parse(&name), Some(*s));
        }
    }
}
