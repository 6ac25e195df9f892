//! Who did what: every change to the fabric is kept with the identity that made it (an
//! operator's certificate, a switch, the path meter) and the reason given, stored with the
//! fabric's state (so it is replicated with etcd and survives restarts), the newest
//! [`AUDIT_KEEP`]; `sopactl history` shows it.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use sopa_channel::proto::{Delta, change};

/// Changes kept.
pub const AUDIT_KEEP: usize = 1000;
/// The longest reason kept, in bytes.
pub const MAX_REASON_BYTES: usize = 256;

/// One change: its version, when (Unix ms), who made it, what it was, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub version: u64,
    pub unix_ms: u64,
    pub who: String,
    pub what: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Who makes a change, and why.
#[derive(Clone, Debug, Default)]
pub struct Actor {
    pub who: String,
    pub reason: String,
}

impl Actor {
    pub fn new(who: impl Into<String>, reason: impl Into<String>) -> Self {
        let mut reason: String = reason.into();
        if reason.len() > MAX_REASON_BYTES {
            let mut end = MAX_REASON_BYTES;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason.truncate(end);
        }
        Self {
            who: who.into(),
            reason,
        }
    }

    /// A caller inside the controller's process (tests, tools linking the library).
    pub fn local() -> Self {
        Self::new("controller API", "")
    }

    /// A switch's report of its port.
    pub fn switch(name: &str) -> Self {
        Self::new(format!("switch {name}"), "port report")
    }

    /// The path meter.
    pub fn meter(reason: impl Into<String>) -> Self {
        Self::new("path meter", reason)
    }
}

/// What a delta changed, in words (`link a0:c0 down`, `switch c1 up`).
pub fn describe(delta: &Delta) -> String {
    delta
        .changes
        .iter()
        .filter_map(|c| match &c.kind {
            Some(change::Kind::Link(l)) => l.link.as_ref().map(|r| {
                format!(
                    "link {}:{} {}",
                    r.a,
                    r.b,
                    if l.down { "down" } else { "up" }
                )
            }),
            Some(change::Kind::Switch(s)) => Some(format!(
                "switch {} {}",
                s.name,
                if s.down { "down" } else { "up" }
            )),
            None => None,
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The newest [`AUDIT_KEEP`] changes, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditLog(VecDeque<AuditRecord>);

impl AuditLog {
    pub fn from_stored(records: Vec<AuditRecord>) -> Self {
        let mut log = Self(records.into());
        log.trim();
        log
    }

    fn trim(&mut self) {
        while self.0.len() > AUDIT_KEEP {
            self.0.pop_front();
        }
    }

    /// Keeps `delta` as made by `actor`.
    pub fn note(&mut self, actor: &Actor, delta: &Delta) {
        self.note_what(actor, delta.version, describe(delta));
    }

    /// Keeps a change the agents need not hear of (it makes no version: `version` is the
    /// fabric's at the time), as made by `actor`.
    pub fn note_what(&mut self, actor: &Actor, version: u64, what: String) {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.0.push_back(AuditRecord {
            version,
            unix_ms,
            who: actor.who.clone(),
            what,
            reason: actor.reason.clone(),
        });
        self.trim();
    }

    pub fn records(&self) -> impl DoubleEndedIterator<Item = &AuditRecord> {
        self.0.iter()
    }

    pub fn to_vec(&self) -> Vec<AuditRecord> {
        self.0.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sopa_channel::proto::{Change, LinkChange, LinkRef};

    fn delta(version: u64) -> Delta {
        Delta {
            epoch: 1,
            version,
            base_version: version - 1,
            changes: vec![Change {
                kind: Some(change::Kind::Link(LinkChange {
                    link: Some(LinkRef {
                        a: "a0".into(),
                        b: "c0".into(),
                    }),
                    down: true,
                    ..LinkChange::default()
                })),
            }],
        }
    }

    #[test]
    fn the_newest_changes_are_kept_with_who_and_why() {
        let mut log = AuditLog::default();
        for v in 2..(AUDIT_KEEP as u64 + 12) {
            log.note(&Actor::new("operator/alice", "maintenance"), &delta(v));
        }
        assert_eq!(log.records().count(), AUDIT_KEEP);
        let last = log.records().next_back().unwrap();
        assert_eq!(
            (last.who.as_str(), last.what.as_str(), last.reason.as_str()),
            ("operator/alice", "link a0:c0 down", "maintenance")
        );
        assert_eq!(log.records().next().unwrap().version, 12);
        let long = Actor::new("x", "é".repeat(200));
        assert!(long.reason.len() <= MAX_REASON_BYTES);
    }
}
