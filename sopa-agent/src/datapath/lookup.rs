//! How `tc_stamp` looks destinations up (the host's settings' [`lookup`] slots,
//! [`super::host_config`]): not at all outside the prefix that
//! covers the path table's, with one hash match in the exact tables (the path sets and SRv6
//! destinations keyed by network address) while every prefix of the table has one length (a
//! Fat-Tree's or MODRIC's rack prefixes), in the tries otherwise. The tries always hold the
//! whole tables, so a cleared slot is always right, only slower, and a key the exact table
//! lacks is looked up in the trie.
//!
//! A table is rewritten in four steps, so that no packet ever reads an exact entry that changes
//! under it ([`super::grace`]). [`Lookup::prepare`] clears the slot if the length changes (no
//! packet is ever matched at a length the table does not have) and widens the cover to hold the
//! new prefixes. `retire_*` removes the exact entries that are stale or change (their packets
//! find them in the trie). The caller writes the trie, then `add_*` puts the changed and new
//! entries in after one grace period, and `finish_*` sets the slot and narrows the cover to the
//! new table. The caller clears the slot ([`Lookup::off`]) if any step fails, so the trie
//! answers until the next table.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    net::Ipv4Addr,
    sync::Arc,
};

use aya::maps::Map;
use sopa_common::maps::{PATHS_EXACT_MAP, PathSet, SRV6_DESTS_EXACT_MAP, Srv6Dest, lookup};
use sopa_topology::prefix::{cover, netmask, one_length};

use super::{
    grace::{Grace, Guarded},
    host_config::SharedHost,
};
use crate::{
    error::{Error, Result},
    path_table::Prefix,
};

/// The lookup's settings and the exact tables (absent in the pins of a datapath an older agent
/// left: its programs look up the tries alone).
pub struct Lookup {
    host: SharedHost,
    paths: Guarded<[u8; 4], PathSet>,
    srv6_dests: Guarded<[u8; 4], Srv6Dest>,
}

/// The exact key of a prefix: its network address (host bits cleared whatever it was given).
fn network(prefix: &Prefix) -> [u8; 4] {
    Prefix::of(prefix.addr, prefix.len).addr.octets()
}

fn mask_of<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> u32 {
    one_length(prefixes).map_or(0, netmask)
}

impl Lookup {
    pub fn from_maps(
        host: SharedHost,
        paths: Map,
        srv6_dests: Map,
        grace: Arc<Grace>,
    ) -> Result<Self> {
        Ok(Self {
            host,
            paths: Guarded::new(
                paths.try_into().map_err(Error::map(PATHS_EXACT_MAP))?,
                PATHS_EXACT_MAP,
                Arc::clone(&grace),
            ),
            srv6_dests: Guarded::new(
                srv6_dests
                    .try_into()
                    .map_err(Error::map(SRV6_DESTS_EXACT_MAP))?,
                SRV6_DESTS_EXACT_MAP,
                grace,
            ),
        })
    }

    fn get(&self, slot: u32) -> Result<u32> {
        Ok(self.host.get()?.lookup[slot as usize])
    }

    fn set(&mut self, slot: u32, value: u32) -> Result<()> {
        self.host.update(|h| h.lookup[slot as usize] = value)
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
        // Both from one snapshot.
        let slots = self.host.get()?.lookup;
        Ok(Prefix::of(
            Ipv4Addr::from(slots[lookup::FABRIC as usize]),
            slots[lookup::FABRIC_MASK as usize].count_ones() as u8,
        ))
    }

    fn set_fabric(&mut self, p: Prefix) -> Result<()> {
        let (network, mask) = (u32::from(p.addr), netmask(p.len));
        // Both at once: a program reads them from one snapshot of the settings.
        self.host.update(|h| {
            h.lookup[lookup::FABRIC as usize] = network;
            h.lookup[lookup::FABRIC_MASK as usize] = mask;
        })
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

    /// Before the trie of [`lookup::PATHS`] is written: removes the exact entries that are
    /// not `sets`' (all of them where `exact` is false) or change (their packets are looked up
    /// in the trie meanwhile).
    pub fn retire_paths(&mut self, sets: &BTreeMap<Prefix, PathSet>, exact: bool) -> Result<()> {
        self.paths.retire(&keyed(sets, exact))
    }

    /// Before some prefixes' path sets are written into the trie (a failure's update): their
    /// exact entries that change are removed.
    pub fn retire_some_paths(&mut self, sets: &BTreeMap<Prefix, PathSet>) -> Result<()> {
        self.paths.retire_changed(&keyed(sets, true))
    }

    /// After the trie was written: the exact entries the table lacks, after a grace period.
    pub fn add_paths(&mut self, sets: &BTreeMap<Prefix, PathSet>, exact: bool) -> Result<()> {
        self.paths.add(&keyed(sets, exact))
    }

    /// Once the exact table holds `sets` (or nothing where they have several lengths): it is
    /// matched at their length, and the cover narrows to them.
    pub fn finish_paths<V>(&mut self, sets: &BTreeMap<Prefix, V>) -> Result<()> {
        self.set(lookup::PATHS, mask_of(sets.keys()))?;
        self.set_fabric(cover(sets.keys()))
    }

    /// [`Self::retire_paths`] for the SRv6 destinations.
    pub fn retire_srv6_dests(
        &mut self,
        dests: &BTreeMap<Prefix, Srv6Dest>,
        exact: bool,
    ) -> Result<()> {
        self.srv6_dests.retire(&keyed(dests, exact))
    }

    /// [`Self::add_paths`] for the SRv6 destinations.
    pub fn add_srv6_dests(
        &mut self,
        dests: &BTreeMap<Prefix, Srv6Dest>,
        exact: bool,
    ) -> Result<()> {
        self.srv6_dests.add(&keyed(dests, exact))
    }

    /// [`Self::finish_paths`] for the SRv6 destinations (no cover: they are looked up only for
    /// a destination that has paths).
    pub fn finish_srv6_dests<V>(&mut self, dests: &BTreeMap<Prefix, V>) -> Result<()> {
        self.set(lookup::SRV6_DESTS, mask_of(dests.keys()))
    }

    /// Removes every SRv6 destination from the exact table and turns its match off.
    pub fn clear_srv6_dests(&mut self) -> Result<()> {
        self.off(lookup::SRV6_DESTS)?;
        self.srv6_dests.retire(&StdHashMap::new())
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

/// The exact table's form of `table` (empty where it is not to be written).
fn keyed<V: Copy>(table: &BTreeMap<Prefix, V>, exact: bool) -> StdHashMap<[u8; 4], V> {
    if !exact {
        return StdHashMap::new();
    }
    table.iter().map(|(p, v)| (network(p), *v)).collect()
}
