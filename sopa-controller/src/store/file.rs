//! `--store file:PATH`: the state in one JSON file, replaced atomically (a new file written and
//! synced beside it, then renamed over it, then the folder synced).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use super::{Persisted, StoreError};

/// The state in `path`, if there is one.
pub fn load(path: &Path) -> Result<Option<Persisted>, StoreError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| StoreError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// Makes `state` durable in `path`.
pub fn save(path: &Path, state: &Persisted) -> Result<(), StoreError> {
    let io = |source| StoreError::Io {
        path: path.to_owned(),
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

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_round_trips_atomically_and_a_broken_one_is_named() {
        let dir = std::env::temp_dir().join(format!("sopa-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        assert_eq!(load(&path).unwrap(), None, "no file yet: no state");
        let state = Persisted {
            topology: "{}".into(),
            epoch: 9,
            version: 3,
            down_links: vec![("a0".into(), "e0".into())],
            reported_down: vec![("a1".into(), "e1".into())],
            reported_by: vec![("a1".into(), "e1".into(), "e1".into())],
            down_switches: vec!["c1".into()],
            suspect: vec![("a2".into(), "c0".into())],
            miscabled: vec![("a3".into(), "c1".into(), "a3".into())],
            audit: Vec::new(),
            revoked: Vec::new(),
        };
        save(&path, &state).unwrap();
        assert_eq!(load(&path).unwrap(), Some(state));
        assert!(!temp_path(&path).exists(), "no temporary file left");
        std::fs::write(&path, "{\"epoch\": ").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("does not parse"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
