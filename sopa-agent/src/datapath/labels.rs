//! The entropy encoding's map: the flow label of each (destination host, next header, path)
//! (`crate::entropy`), and the switch between it and the other encodings.

use std::collections::HashMap as StdHashMap;

use sopa_common::maps::{EV_MAP, Encap, EvKey, HOST_MAP, encoding};

use super::maps::MapSet;
use crate::{
    entropy::EntropyTable,
    error::{Error, Result},
    path_table::PathTable,
};

impl MapSet {
    /// Makes the datapath carry paths in `table`'s encoding: the new encoding's entries and
    /// its encoding entry first, then the other encodings' entries cleared (an encoding entry
    /// is changed only by the encoding it names, so no moment passes under another).
    pub fn apply_encoding(&mut self, table: &PathTable) -> Result<()> {
        if table.entropy.is_some() {
            self.apply_entropy(table.entropy.as_ref())?;
            self.apply_srv6(None)
        } else {
            self.apply_srv6(table.srv6.as_ref())?;
            self.apply_entropy(None)
        }
    }

    /// Makes the datapath carry paths as entropy labels where `table` says so (`None`: another
    /// encoding), without a moment in which a packet finds half of it: switching to entropy,
    /// every label is in place before the encoding changes; switching away, the encoding
    /// changes first. Within entropy, no label of both tables is missing while they change.
    pub fn apply_entropy(&mut self, table: Option<&EntropyTable>) -> Result<()> {
        let (Some(srv6), Some(evs)) = (self.srv6.as_mut(), self.evs.as_mut()) else {
            if table.is_none() {
                return Ok(());
            }
            return Err(Error::Config(format!(
                "this datapath was left by an older agent and has no {EV_MAP} or {HOST_MAP}: \
                 start this agent version on the node first"
            )));
        };
        let Some(table) = table else {
            if srv6.encap()?.encoding == encoding::ENTROPY {
                srv6.set_encap(Encap::default())?;
            }
            return evs.remove(evs.entries()?.into_keys());
        };
        let want: StdHashMap<EvKey, u32> = table.labels.iter().map(|(k, v)| (*k, *v)).collect();
        evs.sync_in_place(&want)?;
        srv6.set_encap(table.encap())
    }

    /// The entropy labels the datapath holds.
    pub fn labels(&self) -> Result<StdHashMap<EvKey, u32>> {
        match &self.evs {
            Some(evs) => evs.entries(),
            None => Ok(StdHashMap::new()),
        }
    }
}
