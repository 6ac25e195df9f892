//! How `tc_stamp` looks destinations up ([`LOOKUP_MAP`]): not at all outside the prefix that
//! covers the path table's, with one hash match in the exact tables (the path sets and SRv6
//! destinations keyed by network address) while every prefix of the table has one length (a
//! Fat-Tree's or MODRIC's rack prefixes), in the tries otherwise. The tries always hold the
//! whole tables, so a cleared slot is always right, only slower.
//!
//! A table is rewritten in three steps: [`Lookup::prepare`] clears the exact match if the
//! length changes (no packet is ever matched at a length the table does not have) and widens
//! the cover to hold the new prefixes, the caller rewrites the trie, and `fill_*` writes the
//! exact entries, removes the stale ones, sets the length and narrows the cover to the new
//! table. A failure leaves the exact match cleared and the cover as wide as it was.

use std::{
    collections::{BTreeMap, HashSet},
    net::Ipv4Addr,
};

use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData, MapError},
};
use sopa_common::maps::{
    LOOKUP_MAP, PATHS_EXACT_MAP, PathSet, SRV6_DESTS_EXACT_MAP, Srv6Dest, lookup,
};

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

/// The netmask every prefix of a table has, where they all have one length (and the table
/// has any); `None` where the datapath must find the longest match.
pub fn one_length_mask<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> Option<u32> {
    let mut lengths = prefixes.into_iter().map(|p| p.len);
    let len = lengths.next()?;
    if len == 0 || lengths.any(|l| l != len) {
        return None;
    }
    Some(netmask(len))
}

/// The longest prefix holding every one of `prefixes` (0/0 for none).
pub fn cover<'a>(prefixes: impl IntoIterator<Item = &'a Prefix>) -> Prefix {
    let mut it = prefixes.into_iter();
    let Some(first) = it.next() else {
        return Prefix::of(Ipv4Addr::UNSPECIFIED, 0);
    };
    it.fold(Prefix::of(first.addr, first.len), |c, p| {
        let common = (u32::from(c.addr) ^ u32::from(p.addr)).leading_zeros() as u8;
        Prefix::of(c.addr, c.len.min(p.len).min(common))
    })
}

fn netmask(len: u8) -> u32 {
    match len {
        0 => 0,
        len => u32::MAX << (32 - u32::from(len.min(32))),
    }
}

/// The exact key of a prefix: its network address (host bits cleared whatever it was given).
fn network(prefix: &Prefix) -> [u8; 4] {
    Prefix::of(prefix.addr, prefix.len).addr.octets()
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
            self.get(lookup::FABRIC)?.into(),
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
    /// exact match off first, and the path sets' cover widens to hold them.
    pub fn prepare<'a>(
        &mut self,
        slot: u32,
        prefixes: impl IntoIterator<Item = &'a Prefix> + Clone,
    ) -> Result<()> {
        if self.get(slot)? != one_length_mask(prefixes.clone()).unwrap_or(0) {
            self.off(slot)?;
        }
        if slot == lookup::PATHS {
            self.widen(&cover(prefixes))?;
        }
        Ok(())
    }

    /// After the trie of the path sets was rewritten: the exact table holds `sets`, is matched
    /// at their one length if they have one, and the cover is theirs.
    pub fn fill_paths(&mut self, sets: &BTreeMap<Prefix, PathSet>) -> Result<()> {
        let filled = fill(&mut self.paths, PATHS_EXACT_MAP, sets);
        self.finish(lookup::PATHS, sets.keys(), filled)?;
        self.set_fabric(cover(sets.keys()))
    }

    /// The same for the SRv6 destinations (no cover: they are looked up only for a
    /// destination that has paths).
    pub fn fill_srv6_dests(&mut self, dests: &BTreeMap<Prefix, Srv6Dest>) -> Result<()> {
        let filled = fill(&mut self.srv6_dests, SRV6_DESTS_EXACT_MAP, dests);
        self.finish(lookup::SRV6_DESTS, dests.keys(), filled)
    }

    fn finish<'a>(
        &mut self,
        slot: u32,
        prefixes: impl IntoIterator<Item = &'a Prefix>,
        filled: Result<()>,
    ) -> Result<()> {
        let mask = one_length_mask(prefixes).unwrap_or(0);
        filled.and_then(|()| self.set(slot, mask)).inspect_err(|_| {
            let _ = self.off(slot);
        })
    }

    /// Before one prefix's path set reaches the trie alone (a failure's update): the cover
    /// widens to hold it, and a length other than the exact table's turns that table off until
    /// the next whole table.
    pub fn before_path_set(&mut self, prefix: &Prefix) -> Result<()> {
        self.widen(prefix)?;
        match self.length(lookup::PATHS)? {
            Some(len) if len != prefix.len => self.off(lookup::PATHS),
            _ => Ok(()),
        }
    }

    /// After it did: written in the exact table too where that is matched at its length.
    pub fn set_path_set(&mut self, prefix: &Prefix, set: &PathSet) -> Result<()> {
        if self.length(lookup::PATHS)? != Some(prefix.len) {
            return Ok(());
        }
        self.paths
            .insert(network(prefix), set, 0)
            .map_err(Error::map(PATHS_EXACT_MAP))
            .inspect_err(|_| {
                let _ = self.off(lookup::PATHS);
            })
    }
}

/// Writes every entry of `values` into `map` when they share one length, and removes every
/// other entry (all of them when the lengths differ: the trie answers then).
fn fill<V: Pod>(
    map: &mut HashMap<MapData, [u8; 4], V>,
    name: &'static str,
    values: &BTreeMap<Prefix, V>,
) -> Result<()> {
    let mut keep = HashSet::new();
    if one_length_mask(values.keys()).is_some() {
        for (prefix, v) in values {
            let key = network(prefix);
            map.insert(key, v, 0).map_err(Error::map(name))?;
            keep.insert(key);
        }
    }
    let stale: Vec<[u8; 4]> = map
        .keys()
        .filter_map(|k| k.ok())
        .filter(|k| !keep.contains(k))
        .collect();
    for k in stale {
        match map.remove(&k) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(source) => return Err(Error::map(name)(source)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    #[test]
    fn the_cover_is_the_longest_prefix_holding_them_all() {
        assert_eq!(cover([&p("10.3.1.0/24")]), p("10.3.1.0/24"));
        assert_eq!(
            cover([&p("10.3.1.0/24"), &p("10.3.2.0/24")]),
            p("10.3.0.0/22")
        );
        assert_eq!(
            cover([&p("10.0.0.0/24"), &p("10.47.23.0/24")]),
            p("10.0.0.0/10")
        );
        assert_eq!(
            cover([&p("10.3.0.0/16"), &p("10.3.9.0/24")]),
            p("10.3.0.0/16")
        );
        assert_eq!(
            cover([&p("10.0.0.0/8"), &p("192.168.0.0/16")]),
            p("0.0.0.0/0")
        );
        assert_eq!(cover(&[] as &[Prefix]), p("0.0.0.0/0"));
    }

    #[test]
    fn one_length_or_none() {
        assert_eq!(
            one_length_mask([&p("10.3.1.0/24"), &p("10.3.2.0/24")]),
            Some(0xffff_ff00)
        );
        assert_eq!(
            one_length_mask([&p("10.3.0.0/16"), &p("10.3.2.0/24")]),
            None
        );
        assert_eq!(one_length_mask([&p("0.0.0.0/0")]), None);
        assert_eq!(one_length_mask(&[] as &[Prefix]), None);
    }
}
