//! How `tc_stamp` looks destinations up ([`LOOKUP_MAP`]): not at all outside the prefix that
//! covers the path table's, with one hash match in the exact tables (the path sets and SRv6
//! destinations keyed by network address) while every prefix of the table has one length (a
//! Fat-Tree's or MODRIC's rack prefixes), in the tries otherwise. The tries always hold the
//! whole tables, so a cleared slot is always right, only slower.
//!
//! A table is rewritten in three steps. [`Lookup::prepare`] clears the slot if the length
//! changes (no packet is ever matched at a length the table does not have) and widens the cover
//! to hold the new prefixes. The caller then writes each entry into the trie and, through
//! `write_*`, into the exact table right after (so the exact table is never staler than the
//! trie), and removes the trie's stale entries. `prune_*` removes the exact table's stale
//! entries, sets the slot, and narrows the cover to the new table. The caller clears the slot
//! ([`Lookup::off`]) if any step fails, so the trie answers until the next table.

use std::{
    collections::{BTreeMap, HashSet},
    net::Ipv4Addr,
};

use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData},
};
use sopa_common::maps::{
    LOOKUP_MAP, PATHS_EXACT_MAP, PathSet, SRV6_DESTS_EXACT_MAP, Srv6Dest, lookup,
};
use sopa_topology::prefix::{cover, netmask, one_length};

use crate::{
    error::{Error, Result},
    path_table::Prefix,
};

/// The lookup's settings and the exact tables (absent in the pins of a datapath an older agent
/// left: its programs look up the tries alone).
pub struct Lookup {
    slots: Array<MapData, u32>,
    paths: HashMap<MapData, [u8; 4], PathSet>,
    srv6_dests: HashMap<MapData, [u8; 4], Srv6Dest>,
}

/// The exact key of a prefix: its network address (host bits cleared whatever it was given).
fn network(prefix: &Prefix) -> [u8; 4] {
    Prefix::of(prefix.addr, prefix.len).addr.octets()
}

fn mask_of<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> u32 {
    one_length(prefixes).map_or(0, netmask)
}

impl Lookup {
    pub fn from_maps(slots: Map, paths: Map, srv6_dests: Map) -> Result<Self> {
        Ok(Self {
            slots: slots.try_into().map_err(Error::map(LOOKUP_MAP))?,
            paths: paths.try_into().map_err(Error::map(PATHS_EXACT_MAP))?,
            srv6_dests: srv6_dests
                .try_into()
                .map_err(Error::map(SRV6_DESTS_EXACT_MAP))?,
        })
    }

    fn get(&self, slot: u32) -> Result<u32> {
        self.slots.get(&slot, 0).map_err(Error::map(LOOKUP_MAP))
    }

    fn set(&mut self, slot: u32, value: u32) -> Result<()> {
        self.slots
            .set(slot, value, 0)
            .map_err(Error::map(LOOKUP_MAP))
    }

    /// The prefix length table `slot` ([`lookup::PATHS`], [`lookup::SRV6_DESTS`]) is matched
    /// at exactly, or `None`: the trie.
    pub fn length(&self, slot: u32) -> Result<Option<u8>> {
        Ok(match self.get(slot)? {
            0 => None,
            m => Some(m.count_ones() as u8),
        })
    }

    /// The prefix outside which no destination is looked up.
    pub fn fabric(&self) -> Result<Prefix> {
        let mask = self.get(lookup::FABRIC_MASK)?;
        Ok(Prefix::of(
            Ipv4Addr::from(self.get(lookup::FABRIC)?),
            mask.count_ones() as u8,
        ))
    }

    fn set_fabric(&mut self, p: Prefix) -> Result<()> {
        let (network, mask) = (u32::from(p.addr), netmask(p.len));
        if (self.get(lookup::FABRIC)?, self.get(lookup::FABRIC_MASK)?) == (network, mask) {
            return Ok(());
        }
        // The two slots cannot change at once: the mask goes to 0 first (everything covered),
        // then the network, then the new mask. A failure in between leaves everything covered.
        // The program reads the mask before and after the network (`prefix::in_fabric`).
        self.set(lookup::FABRIC_MASK, 0)?;
        self.set(lookup::FABRIC, network)?;
        self.set(lookup::FABRIC_MASK, mask)
    }

    /// Widens the cover to hold `prefix` too.
    fn widen(&mut self, prefix: &Prefix) -> Result<()> {
        let now = self.fabric()?;
        if now.contains(prefix) {
            return Ok(());
        }
        self.set_fabric(cover([&now, prefix]))
    }

    /// Turns the exact match of `slot` off (the trie answers).
    pub fn off(&mut self, slot: u32) -> Result<()> {
        self.set(slot, 0)
    }

    /// Before the trie of `slot` is rewritten with `prefixes`: a length that changes turns the
    /// exact match off first, and the path sets' cover widens to hold them. Whether the exact
    /// table is to be written (the prefixes have one length).
    pub fn prepare<'a>(
        &mut self,
        slot: u32,
        prefixes: impl IntoIterator<Item = &'a Prefix> + Clone,
    ) -> Result<bool> {
        let mask = mask_of(prefixes.clone());
        if self.get(slot)? != mask {
            self.off(slot)?;
        }
        if slot == lookup::PATHS {
            self.widen(&cover(prefixes))?;
        }
        Ok(mask != 0)
    }

    /// One path set, in the exact table.
    pub fn write_path_set(&mut self, prefix: &Prefix, set: &PathSet) -> Result<()> {
        self.paths
            .insert(network(prefix), set, 0)
            .map_err(Error::map(PATHS_EXACT_MAP))
    }

    /// One SRv6 destination, in the exact table.
    pub fn write_srv6_dest(&mut self, prefix: &Prefix, dest: &Srv6Dest) -> Result<()> {
        self.srv6_dests
            .insert(network(prefix), dest, 0)
            .map_err(Error::map(SRV6_DESTS_EXACT_MAP))
    }

    /// After the path sets were written and the trie's stale ones removed: the exact table
    /// keeps the prefixes of `sets` only (none where they have several lengths), is matched at
    /// their length, and the cover narrows to them.
    pub fn prune_paths<V>(&mut self, sets: &BTreeMap<Prefix, V>) -> Result<()> {
        let mask = mask_of(sets.keys());
        prune(&mut self.paths, PATHS_EXACT_MAP, sets, mask != 0)?;
        self.set(lookup::PATHS, mask)?;
        self.set_fabric(cover(sets.keys()))
    }

    /// The same for the SRv6 destinations (no cover: they are looked up only for a
    /// destination that has paths).
    pub fn prune_srv6_dests<V>(&mut self, dests: &BTreeMap<Prefix, V>) -> Result<()> {
        let mask = mask_of(dests.keys());
        prune(&mut self.srv6_dests, SRV6_DESTS_EXACT_MAP, dests, mask != 0)?;
        self.set(lookup::SRV6_DESTS, mask)
    }

    /// Before one prefix's path set reaches the trie alone (a failure's update): the cover
    /// widens to hold it, and a length other than the exact table's turns that table off until
    /// the next whole table. Whether it is to be written in the exact table too.
    pub fn prepare_path_set(&mut self, prefix: &Prefix) -> Result<bool> {
        self.widen(prefix)?;
        match self.length(lookup::PATHS)? {
            Some(len) if len == prefix.len => Ok(true),
            Some(_) => self.off(lookup::PATHS).map(|()| false),
            None => Ok(false),
        }
    }
}

/// Removes every entry of `map` that `keep` does not hold (every one, unless `kept`).
fn prune<V: Pod, W>(
    map: &mut HashMap<MapData, [u8; 4], V>,
    name: &'static str,
    keep: &BTreeMap<Prefix, W>,
    kept: bool,
) -> Result<()> {
    let keep: HashSet<[u8; 4]> = if kept {
        keep.keys().map(network).collect()
    } else {
        HashSet::new()
    };
    let stale: Vec<[u8; 4]> = map
        .keys()
        .filter_map(|k| k.ok())
        .filter(|k| !keep.contains(k))
        .collect();
    super::maps::remove_each(name, stale, |k| map.remove(k))
}
