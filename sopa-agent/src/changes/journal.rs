//! The journal file, written before every change, and its shared handle.

use std::{
    fs,
    path::{Path, PathBuf},
};

use tracing::{info, warn};

use crate::{
    error::{Error, Result},
    netlink::Netlink,
};

use super::{
    Change, ControllerState, Record,
    undo::{redo_one, undo_one},
};

pub struct Journal {
    path: PathBuf,
    pub record: Record,
}

pub const JOURNAL_FILE: &str = "state.json";

impl Journal {
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(JOURNAL_FILE)
    }

    /// Reads the record a previous or running agent left in `dir`, if any.
    pub fn read(dir: &Path) -> Result<Option<Record>> {
        let path = Self::path_in(dir);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|err| {
                Error::Config(format!(
                    "{} is not an agent record ({err}); remove it if no agent runs",
                    path.display()
                ))
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(Error::io(format!("reading {}", path.display()), err)),
        }
    }

    /// Starts a journal in `dir` (created if missing).
    pub fn create(dir: &Path, record: Record) -> Result<Self> {
        fs::create_dir_all(dir)
            .map_err(|err| Error::io(format!("creating {}", dir.display()), err))?;
        let journal = Self {
            path: Self::path_in(dir),
            record,
        };
        journal.persist()?;
        Ok(journal)
    }

    /// Resumes the journal of a run that did not exit cleanly, to undo it.
    pub fn resume(dir: &Path, record: Record) -> Self {
        Self {
            path: Self::path_in(dir),
            record,
        }
    }

    fn persist(&self) -> Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&self.record).expect("record serializes");
        fs::write(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, &self.path))
            .map_err(|err| Error::io(format!("writing {}", self.path.display()), err))
    }

    /// Marks the record as left attached on purpose (`--keep-attached`) and saves it: the next
    /// agent adopts what it lists, `sopa-agent detach` undoes it.
    pub fn leave_attached(mut self) -> Result<()> {
        self.record.kept_attached = true;
        self.persist()
    }

    /// Rewrites the record (after changing fields other than the change list).
    pub fn save(&self) -> Result<()> {
        self.persist()
    }

    pub fn set_controller(&mut self, state: ControllerState) -> Result<()> {
        self.record.controller = Some(state);
        self.persist()
    }

    /// Records a change about to be made (write-ahead): a crash right after the change still
    /// finds it in the journal, and a change that then failed or never happened is skipped at
    /// undo, which restores only what still holds the value we set.
    pub fn push(&mut self, change: Change) -> Result<()> {
        self.record.changes.push(change);
        self.persist()
    }

    /// Undoes every change, newest first, and removes the journal. Failures are logged and
    /// returned; undo goes on with the rest.
    pub async fn undo(mut self, netlink: &Netlink) -> Vec<Error> {
        let mut errors = Vec::new();
        while let Some(change) = self.record.changes.pop() {
            if let Err(err) = undo_one(&change, netlink).await {
                warn!(?change, %err, "could not undo a change");
                errors.push(err);
            } else {
                info!(?change, "restored");
            }
            if let Err(err) = self.persist() {
                errors.push(err);
            }
        }
        if let Err(err) = fs::remove_file(&self.path)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            errors.push(Error::io(format!("removing {}", self.path.display()), err));
        }
        if let Some(dir) = self.path.parent() {
            // Only succeeds when empty, which is what we want.
            let _ = fs::remove_dir(dir);
        }
        errors
    }
}

/// A running agent's journal, shared by the role and the tasks that change the host on their
/// own (the route keeper). The lock is never held across an await.
#[derive(Clone)]
pub struct SharedJournal(std::sync::Arc<std::sync::Mutex<Option<Journal>>>);

impl SharedJournal {
    pub fn new(journal: Journal) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(Some(journal))))
    }

    /// Runs `f` on the journal; `None` once it was taken (the agent is stopping).
    pub fn with<R>(&self, f: impl FnOnce(&mut Journal) -> R) -> Option<R> {
        self.0.lock().expect("journal lock").as_mut().map(f)
    }

    /// Records a change about to be made (write-ahead, see [`Journal::push`]).
    pub fn push(&self, change: Change) -> Result<()> {
        self.with(|j| j.push(change)).unwrap_or_else(|| {
            Err(Error::Config(
                "the agent is stopping; no further changes are made".into(),
            ))
        })
    }

    /// The changes recorded so far.
    pub fn changes(&self) -> Vec<Change> {
        self.with(|j| j.record.changes.clone()).unwrap_or_default()
    }

    /// Drops the recorded changes `gone` says are no longer in effect, and saves.
    pub fn forget(&self, gone: impl Fn(&Change) -> bool) -> Result<()> {
        self.with(|j| {
            let before = j.record.changes.len();
            j.record.changes.retain(|c| !gone(c));
            if j.record.changes.len() == before {
                Ok(())
            } else {
                j.save()
            }
        })
        .unwrap_or(Ok(()))
    }

    /// Replaces the records `old` matches with `change` (appended if none matched), in one
    /// save: a setting changed again keeps one record, with the value from before any agent.
    pub fn replace(&self, old: impl Fn(&Change) -> bool, change: Change) -> Result<()> {
        self.with(|j| {
            let at = j.record.changes.iter().position(&old);
            j.record.changes.retain(|c| !old(c));
            let at = at.unwrap_or(j.record.changes.len());
            j.record.changes.insert(at, change);
            j.save()
        })
        .unwrap_or_else(|| {
            Err(Error::Config(
                "the agent is stopping; no further changes are made".into(),
            ))
        })
    }

    /// Drops the newest record of `change` (a change that was refused, so never made), and
    /// saves.
    pub fn retract(&self, change: &Change) -> Result<()> {
        self.with(
            |j| match j.record.changes.iter().rposition(|c| c == change) {
                Some(i) => {
                    j.record.changes.remove(i);
                    j.save()
                }
                None => Ok(()),
            },
        )
        .unwrap_or(Ok(()))
    }

    /// Takes the journal out (to undo it or leave it for the next agent).
    pub fn take(&self) -> Option<Journal> {
        self.0.lock().expect("journal lock").take()
    }
}

impl Journal {
    /// Undoes the changes that are not in `keep`, newest first, and leaves `keep` as the
    /// record: an agent that could not adopt a datapath undoes its own changes only, so the
    /// datapath stays as the previous agent left it, adoptable by the next.
    pub async fn undo_beyond(mut self, netlink: &Netlink, keep: Record) -> Vec<Error> {
        let mut errors = Vec::new();
        let own: Vec<Change> = self
            .record
            .changes
            .iter()
            .filter(|c| !keep.changes.contains(c))
            .cloned()
            .collect();
        for change in own.iter().rev() {
            match undo_one(change, netlink).await {
                Ok(()) => info!(?change, "restored"),
                Err(err) => {
                    warn!(?change, %err, "could not undo a change");
                    errors.push(err);
                }
            }
        }
        // What this agent took back of the adopted state (GSO given back, a copied route
        // replaced) is put back as the previous agent left it.
        let taken: Vec<Change> = keep
            .changes
            .iter()
            .filter(|c| !self.record.changes.contains(c))
            .cloned()
            .collect();
        for change in &taken {
            match redo_one(change, netlink).await {
                Ok(()) => info!(?change, "put back as the previous agent left it"),
                Err(err) => {
                    warn!(?change, %err, "could not put a change back");
                    errors.push(err);
                }
            }
        }
        self.record = keep;
        if let Err(err) = self.persist() {
            errors.push(err);
        }
        errors
    }
}
