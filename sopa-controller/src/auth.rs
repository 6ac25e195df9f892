//! Who may do what. A client's identity comes from the certificate the controller verified
//! (its `sopa://ROLE/NODE` URI SAN), never from what the client says; the rules:
//!
//! - a host agent streams its own node's state and reports only flows that start at its own
//!   address; a switch agent streams its own node's state and reports only its own ports;
//! - only an `operator` changes link or switch states; an `operator` or a `viewer` reads status;
//! - a node that is not in the topology, a second session of one identity, a text field over
//!   its bound, and more sessions than the controller takes are refused;
//! - a certificate whose serial is on the deny list is refused at its next handshake, and its
//!   open streams are closed.
//!
//! Every refusal is counted by reason (in `sopactl status`), logged with the identity, and
//! changes nothing. A plaintext client (`--insecure`, or a Unix socket without TLS: a test
//! fabric's management path) has no identity and is trusted as it presents itself.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use sopa_channel::identity::{Identity, Role};
use tokio::sync::watch;
use tracing::{info, warn};

use sopa_channel::identity::serial_hex;

/// Why a client was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// The identity's role may not do this.
    Role,
    /// A hello that claims another node or role than the certificate's.
    Impersonation,
    /// A node name that is not a node of the topology (of the claimed kind).
    UnknownNode,
    /// The identity already has a live session.
    SecondSession,
    /// The controller already serves as many sessions as it takes.
    TooManySessions,
    /// A text field longer than its bound.
    FieldTooLong,
    /// A flow report with a flow that does not start at the reporter's address.
    ForeignFlow,
    /// A switch's report of a port that is not its own.
    ForeignPort,
    /// A certificate on the deny list.
    Revoked,
    /// A certificate that names no SOPA identity.
    NoIdentity,
    /// A TLS handshake that failed or did not finish in time.
    Handshake,
    /// A connection over the connection limit.
    ConnectionLimit,
    /// An agent that applied a newer version of this epoch than the controller's state holds
    /// (the state went back): the controller steps down rather than roll the agents back.
    Rollback,
}

impl Refusal {
    pub const ALL: [Refusal; 13] = [
        Refusal::Role,
        Refusal::Impersonation,
        Refusal::UnknownNode,
        Refusal::SecondSession,
        Refusal::TooManySessions,
        Refusal::FieldTooLong,
        Refusal::ForeignFlow,
        Refusal::ForeignPort,
        Refusal::Revoked,
        Refusal::NoIdentity,
        Refusal::Handshake,
        Refusal::ConnectionLimit,
        Refusal::Rollback,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Role => "role",
            Refusal::Impersonation => "impersonation",
            Refusal::UnknownNode => "unknown_node",
            Refusal::SecondSession => "second_session",
            Refusal::TooManySessions => "too_many_sessions",
            Refusal::FieldTooLong => "field_too_long",
            Refusal::ForeignFlow => "foreign_flow",
            Refusal::ForeignPort => "foreign_port",
            Refusal::Revoked => "revoked",
            Refusal::NoIdentity => "no_identity",
            Refusal::Handshake => "handshake",
            Refusal::ConnectionLimit => "connection_limit",
            Refusal::Rollback => "rollback",
        }
    }
}

/// Refusals counted by reason.
#[derive(Debug, Default)]
pub struct Refusals(Mutex<BTreeMap<Refusal, u64>>);

impl Refusals {
    /// Counts and logs one refusal of `who` (an identity, or an address when there is none).
    pub fn refuse(&self, reason: Refusal, who: &dyn std::fmt::Display, detail: &str) {
        *self
            .0
            .lock()
            .expect("refusals lock")
            .entry(reason)
            .or_default() += 1;
        warn!(client = %who, reason = reason.as_str(), detail, "refused");
    }

    pub fn counts(&self) -> BTreeMap<Refusal, u64> {
        self.0.lock().expect("refusals lock").clone()
    }

    pub fn count(&self, reason: Refusal) -> u64 {
        self.counts().get(&reason).copied().unwrap_or(0)
    }
}

/// What a connection's client proved in its handshake.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    /// Where it connected from (`unix` for a Unix socket).
    pub addr: String,
    /// Its identity; `None` on a plaintext connection.
    pub identity: Option<Identity>,
    /// Its certificate's serial, as the deny list names it.
    pub serial: Option<String>,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.identity {
            Some(id) => write!(f, "{id} ({})", self.addr),
            None => write!(f, "unauthenticated client ({})", self.addr),
        }
    }
}

pub use sopa_channel::identity::certificate_identity;

/// Whether `peer` may do what takes one of `roles`; a plaintext peer may do anything.
pub fn allowed(peer: &Peer, roles: &[Role]) -> bool {
    peer.identity
        .as_ref()
        .is_none_or(|id| roles.contains(&id.role))
}

#[derive(Debug, thiserror::Error)]
pub enum DenyListError {
    #[error("deny list {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "deny list {path}, line {line}: {text:?} is not a serial number (hex digits, ':' allowed; as `sopactl certs issue` prints it)"
    )]
    Line {
        path: PathBuf,
        line: usize,
        text: String,
    },
}

/// Parses a deny list: one certificate serial per line, in hex (colons allowed, any case);
/// `#` starts a comment.
pub fn parse_deny_list(path: &Path, text: &str) -> Result<BTreeSet<String>, DenyListError> {
    let mut out = BTreeSet::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let hex: String = line.chars().filter(|c| *c != ':').collect();
        if hex.is_empty() || hex.len() > 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(DenyListError::Line {
                path: path.to_owned(),
                line: i + 1,
                text: line.to_owned(),
            });
        }
        // An odd count of digits reads as a leading zero.
        let hex = if hex.len() % 2 == 1 {
            format!("0{hex}")
        } else {
            hex
        };
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|j| u8::from_str_radix(&hex[j..j + 2], 16).expect("checked hex digits"))
            .collect();
        out.insert(serial_hex(&bytes));
    }
    Ok(out)
}

/// The deny list the controller enforces, reloaded whenever its file changes. A file that does
/// not parse is reported and the list in force stays as it was.
#[derive(Clone, Debug)]
pub struct DenyList {
    path: Option<PathBuf>,
    /// The union of the file's serials and the store's: what is refused.
    current: watch::Sender<Arc<BTreeSet<String>>>,
    /// Each part: (the file's, the store's).
    parts: Arc<std::sync::Mutex<(BTreeSet<String>, BTreeSet<String>)>>,
}

impl DenyList {
    /// No deny list.
    pub fn none() -> Self {
        Self {
            path: None,
            current: watch::channel(Arc::default()).0,
            parts: Arc::default(),
        }
    }

    /// Loads `path`; a missing or bad file is an error at start.
    pub fn load(path: &Path) -> Result<Self, DenyListError> {
        let list = Self {
            path: Some(path.to_owned()),
            ..Self::none()
        };
        list.reload()?;
        Ok(list)
    }

    pub fn contains(&self, serial: &str) -> bool {
        self.current.borrow().contains(serial)
    }

    /// The list in force, changing on every reload.
    pub fn subscribe(&self) -> watch::Receiver<Arc<BTreeSet<String>>> {
        self.current.subscribe()
    }

    /// Reads the file again; `Ok(true)` when the list in force changed.
    pub fn reload(&self) -> Result<bool, DenyListError> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let io = |source| DenyListError::Io {
            path: path.clone(),
            source,
        };
        // Read on every call (a rewrite can keep size, inode and the mtime tick), and only
        // a read the file did not change under (a rewrite in place caught halfway): replace
        // the file with a rename to change it at once.
        let stamp = |m: &std::fs::Metadata| {
            (
                m.modified().ok(),
                m.len(),
                std::os::unix::fs::MetadataExt::ino(m),
            )
        };
        let before = std::fs::metadata(path).map_err(io)?;
        let text = std::fs::read_to_string(path).map_err(io)?;
        let after = std::fs::metadata(path).map_err(io)?;
        if stamp(&before) != stamp(&after) {
            return Ok(false);
        }
        let list = parse_deny_list(path, &text)?;
        let changed = {
            let mut parts = self.parts.lock().expect("deny list lock");
            parts.0 = list;
            self.publish(&parts)
        };
        if changed {
            info!(path = %path.display(), serials = self.current.borrow().len(), "deny list loaded");
        }
        Ok(changed)
    }

    /// The serials revoked through the controller, as its state holds them (every replica's
    /// the same); `true` when the list in force changed.
    pub fn set_stored(&self, serials: &BTreeSet<String>) -> bool {
        let mut parts = self.parts.lock().expect("deny list lock");
        parts.1 = serials.clone();
        self.publish(&parts)
    }

    /// Puts the union of the parts in force.
    fn publish(&self, (file, stored): &(BTreeSet<String>, BTreeSet<String>)) -> bool {
        let list: BTreeSet<String> = file.union(stored).cloned().collect();
        self.current.send_if_modified(|cur| {
            if **cur == list {
                false
            } else {
                *cur = Arc::new(list);
                true
            }
        })
    }

    /// Reloads every `interval` until the returned task is dropped or aborted.
    pub fn watch(&self, interval: Duration) -> Option<tokio::task::JoinHandle<()>> {
        self.path.as_ref()?;
        let list = self.clone();
        Some(reload_every(
            interval,
            "the deny list did not reload; the previous one stays in force",
            move || list.reload().map(drop).map_err(|e| e.to_string()),
        ))
    }
}

/// Runs `reload` every `interval` until the returned task is dropped or aborted; an error is
/// logged with `failed` once per distinct error, not once a tick (what was loaded before stays
/// in force).
pub(crate) fn reload_every(
    interval: Duration,
    failed: &'static str,
    mut reload: impl FnMut() -> Result<(), String> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_error = String::new();
        loop {
            tick.tick().await;
            match reload() {
                Ok(()) => last_error.clear(),
                Err(e) if e != last_error => {
                    warn!(error = %e, "{failed}");
                    last_error = e;
                }
                Err(_) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_lists_read_serials_in_any_common_spelling_and_name_a_bad_line() {
        let p = Path::new("deny.txt");
        let list = parse_deny_list(
            p,
            "# revoked 2026-12-01\n0A:1b:2C\n00ff  # leading zeros\n\n7\n  abc \n",
        )
        .unwrap();
        assert_eq!(
            list.into_iter().collect::<Vec<_>>(),
            ["7", "a1b2c", "abc", "ff"]
        );
        let err = parse_deny_list(p, "0a1b\nxyz\n").unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("xyz"), "{err}");
    }

    #[test]
    fn a_plaintext_peer_is_trusted_and_an_identified_one_by_its_role() {
        let plain = Peer::default();
        assert!(allowed(&plain, &[Role::Operator]));
        let host = Peer {
            identity: Some(Identity::new(Role::Host, "h0").unwrap()),
            ..Peer::default()
        };
        assert!(!allowed(&host, &[Role::Operator]));
        assert!(allowed(&host, &[Role::Host, Role::Switch]));
    }
}
