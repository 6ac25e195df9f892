//! The settings the agent alone writes and every packet needs (`sopa_common::maps::HostConfig`:
//! the encoding and this host's addresses in it, how destinations are looked up, the path
//! meter's period and rack mask), read once a packet as one consistent snapshot: the current
//! slot's index, then that slot, two array reads the verifier inlines. The agent never writes
//! the slot a program may still be reading (`sopa-agent/src/datapath/host_config.rs`).

use sopa_common::maps::HostConfig;

use crate::{HOST, HOST_INDEX};

/// The current settings (`None` only if the maps were not the datapath's: never in practice).
#[inline(always)]
pub fn current() -> Option<&'static HostConfig> {
    let index = HOST_INDEX.get(0).copied().unwrap_or(0);
    HOST.get(index & 1)
}
