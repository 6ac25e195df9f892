//! The path table in the datapath: the trie and the exact table, written make-before-break.

use std::collections::BTreeMap;

use aya::maps::MapError;
use sopa_common::maps::{MAX_PATHS, PATHS_MAP, PathSet, lookup};

use crate::{
    datapath::lookup::Lookup,
    error::Result,
    path_table::{Hops, PathTable, Prefix},
};

use super::{MapSet, key, map_err, prefix_of, remove_each};

impl MapSet {
    /// Replaces the path table make-before-break: only new and changed prefixes are written,
    /// each in one element update of the trie (which frees the old value after a grace
    /// period), then the prefixes no longer present are removed. A packet sees the old or the
    /// new path set of its prefix, never a mix.
    ///
    /// Where every prefix has one length, the exact table holds the same sets and the
    /// datapath looks them up there; an entry that changes leaves it before the trie is written
    /// and comes back after a grace period (its packets find it in the trie meanwhile,
    /// [`crate::datapath::lookup`]). Its mask changes only while the trie alone is looked up
    /// (mask 0), so no packet is ever matched at a length the table does not have. A failure
    /// leaves the trie looked up.
    pub fn apply_paths(&mut self, table: &PathTable) -> Result<()> {
        self.set_meter_mask(table)?;
        self.or_trie(lookup::PATHS, |s| s.write_paths(table))
    }

    /// Runs `f`; where it fails, the exact match of `slot` is turned off (the trie, which holds
    /// everything `f` wrote, answers) before the error returns.
    pub(super) fn or_trie(
        &mut self,
        slot: u32,
        f: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let r = f(self);
        if r.is_err()
            && let Some(x) = self.lookup.as_mut()
        {
            let _ = x.off(slot);
        }
        r
    }

    fn write_paths(&mut self, table: &PathTable) -> Result<()> {
        let sets = path_sets(table);
        let exact = match self.lookup.as_mut() {
            Some(x) => {
                let exact = x.prepare(lookup::PATHS, sets.keys())?;
                x.retire_paths(&sets, exact)?;
                exact
            }
            None => false,
        };
        // The trie: new and changed sets only. It frees a replaced node after a grace period,
        // so a packet reading it in place reads one value.
        let held = self.trie_sets()?;
        for (prefix, set) in &sets {
            if held.get(prefix) != Some(set) {
                self.paths
                    .insert(&key(prefix), set, 0)
                    .map_err(map_err(PATHS_MAP))?;
            }
        }
        let stale = held
            .keys()
            .filter(|p| !sets.contains_key(p))
            .map(key)
            .collect::<Vec<_>>();
        remove_each(PATHS_MAP, stale, |k| self.paths.remove(k))?;
        match self.lookup.as_mut() {
            Some(x) => {
                x.add_paths(&sets, exact)?;
                x.finish_paths(&sets)
            }
            None => Ok(()),
        }
    }

    /// The trie's path sets.
    fn trie_sets(&self) -> Result<BTreeMap<Prefix, PathSet>> {
        let mut out = BTreeMap::new();
        for entry in self.paths.iter() {
            match entry {
                Ok((k, set)) => {
                    out.insert(prefix_of(&k), set);
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(PATHS_MAP)(e)),
            }
        }
        Ok(out)
    }

    /// Writes one prefix's path set (an empty one means every path has failed: the datapath
    /// then leaves the packets to kernel routing). See [`Self::set_some_paths`].
    pub fn set_paths(&mut self, prefix: &Prefix, hops: &[Hops]) -> Result<()> {
        let mut one = PathTable::default();
        one.destinations.insert(*prefix, hops.to_vec());
        self.set_some_paths(&one)
    }

    /// Writes the path sets of `changed`'s prefixes, leaving the others as they are: each
    /// packet reads its prefix's old set or its new one. A prefix of another length than the
    /// exact table's turns that table off (the trie is looked up) until the next whole table.
    pub fn set_some_paths(&mut self, changed: &PathTable) -> Result<()> {
        self.or_trie(lookup::PATHS, |s| {
            let sets = path_sets(changed);
            let mut exact = true;
            if let Some(x) = s.lookup.as_mut() {
                for prefix in sets.keys() {
                    exact &= x.prepare_path_set(prefix)?;
                }
                if exact {
                    x.retire_some_paths(&sets)?;
                }
            }
            for (prefix, set) in &sets {
                s.paths
                    .insert(&key(prefix), set, 0)
                    .map_err(map_err(PATHS_MAP))?;
            }
            match s.lookup.as_mut() {
                Some(x) => x.add_paths(&sets, exact),
                None => Ok(()),
            }
        })
    }

    /// The prefix length the datapath matches destinations' path sets at exactly, or `None`
    /// where it finds the longest match in the trie.
    pub fn exact_length(&self) -> Result<Option<u8>> {
        self.exact_length_of(lookup::PATHS)
    }

    /// The prefix covering every destination prefix, outside which the datapath looks nothing
    /// up (`None` where the datapath has no such setting).
    pub fn fabric_cover(&self) -> Result<Option<Prefix>> {
        self.lookup.as_ref().map(Lookup::fabric).transpose()
    }

    /// The same for table `slot` of [`lookup`].
    pub fn exact_length_of(&self, slot: u32) -> Result<Option<u8>> {
        match &self.lookup {
            Some(x) => x.length(slot),
            None => Ok(None),
        }
    }

    /// The path table as the datapath holds it.
    pub fn paths(&self) -> Result<PathTable> {
        let mut table = PathTable::default();
        for entry in self.paths.iter() {
            let (k, set) = entry.map_err(map_err(PATHS_MAP))?;
            let hops = set.hops[..(set.count as usize).min(MAX_PATHS)]
                .iter()
                .map(|[hop0, hop1]| Hops {
                    hop0: *hop0,
                    hop1: *hop1,
                })
                .collect();
            table.destinations.insert(prefix_of(&k), hops);
        }
        Ok(table)
    }
}

/// The datapath's form of every prefix's paths.
fn path_sets(table: &PathTable) -> BTreeMap<Prefix, PathSet> {
    table
        .destinations
        .iter()
        .map(|(p, hops)| (*p, path_set(hops)))
        .collect()
}

/// The datapath's form of a prefix's paths (at most [`MAX_PATHS`]).
fn path_set(hops: &[Hops]) -> PathSet {
    let mut set = PathSet::EMPTY;
    set.count = hops.len().min(MAX_PATHS) as u32;
    for (slot, h) in set.hops.iter_mut().zip(hops) {
        *slot = [h.hop0, h.hop1];
    }
    set
}
