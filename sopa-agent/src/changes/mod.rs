//! The journal of what a running agent changed on its host, persisted before every change
//! (write-ahead) so that a clean exit, a failed start and the next start after a crash can all
//! undo it exactly, restoring only what still holds the value the agent set.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::netlink::Route;

mod journal;
mod process;
mod record;
mod undo;

pub use journal::{JOURNAL_FILE, Journal, SharedJournal};
pub use process::{process_start_time, signal_agent};
pub use record::{Adoption, ControllerState, ProgramIds, Record, RecordNamespace};

/// One change to the host, with what is needed to undo it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// Maps pinned under `dir` (undo: unpin them).
    Pins {
        dir: PathBuf,
    },
    Sysctl {
        key: String,
        old: String,
        new: String,
    },
    GsoMaxSegs {
        ifname: String,
        index: u32,
        old: u32,
        new: u32,
        /// The value the agent had set before `new` (a granularity changed at run time): the
        /// record is written before the interface changes, so an agent that stopped between
        /// the two left the interface at this value, which is ours too.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<u32>,
    },
    RouteAdded {
        route: Route,
    },
    RouteReplaced {
        old: Route,
        new: Route,
    },
    /// An IPv6 route a switch installed (SRv6 encoding; undo: remove it).
    Route6Added {
        route: crate::netlink::Route6,
    },
    /// A clsact qdisc the agent added for its filters (a kernel without TCX; undo: remove it,
    /// once no filter but the agent's own is under it).
    Clsact {
        ifname: String,
        index: u32,
    },
    /// A cls_bpf filter of the agent's (undo: remove it).
    TcFilter {
        filter: crate::netlink::tc::Filter,
    },
    /// The cgroup v2 hierarchy, mounted for the socket-option guard on a host that has no
    /// mount of it (undo: unmount it; the guard's pinned link holds the cgroup itself).
    Cgroup2Mount {
        dir: PathBuf,
    },
}

#[cfg(test)]
mod tests;
