//! The SRv6 encoding's maps: destinations, segment groups and the encoding setting, switched
//! without a moment in which a packet finds half of them.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    sync::Arc,
};

use aya::maps::{LpmTrie, Map, MapData, MapError, lpm_trie::Key};
use sopa_common::maps::{
    Encap, HOST_MAP, SRV6_DESTS_MAP, SRV6_SEGS_CAPACITY, SRV6_SEGS_MAP, SegKey, Segments, Srv6Dest,
    encoding, lookup,
};

use crate::{
    datapath::{
        grace::{Grace, Guarded},
        host_config::SharedHost,
    },
    error::{Error, Result},
    srv6::{Compiled, Groups, Srv6Table},
};

use super::{MapSet, key, map_err, prefix_of, remove_each};

/// The SRv6 encoding's maps (absent in the pins of a datapath an older agent left), and the
/// settings that name the encoding.
pub struct Srv6Maps {
    host: SharedHost,
    dests: LpmTrie<MapData, [u8; 4], Srv6Dest>,
    segs: Guarded<SegKey, Segments>,
}

impl Srv6Maps {
    /// The segment groups the datapath holds.
    fn groups(&self) -> Result<Groups> {
        let mut groups = Groups::new();
        for entry in self.segs.map().iter() {
            match entry {
                Ok((k, v)) => {
                    groups.entry(k.group).or_default().insert(k.hops, v);
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(SRV6_SEGS_MAP)(e)),
            }
        }
        Ok(groups)
    }

    pub(super) fn from_maps(
        host: SharedHost,
        dests: Map,
        segs: Map,
        grace: &Arc<Grace>,
    ) -> Result<Self> {
        Ok(Self {
            host,
            dests: dests.try_into().map_err(map_err(SRV6_DESTS_MAP))?,
            segs: Guarded::new(
                segs.try_into().map_err(map_err(SRV6_SEGS_MAP))?,
                SRV6_SEGS_MAP,
                Arc::clone(grace),
            ),
        })
    }

    /// The encoding and this host's SRv6 addresses (the option where none was written).
    pub(in crate::datapath) fn encap(&self) -> Result<Encap> {
        Ok(self.host.get()?.encap)
    }

    /// Sets the encoding and addresses, where they change.
    pub(in crate::datapath) fn set_encap(&mut self, encap: Encap) -> Result<()> {
        self.host.update(|h| h.encap = encap)
    }
}

impl Srv6Maps {
    /// Removes every destination and segment entry.
    fn clear(&mut self) -> Result<()> {
        let dests: Vec<Key<[u8; 4]>> = self.dests.keys().filter_map(|k| k.ok()).collect();
        remove_each(SRV6_DESTS_MAP, dests, |k| self.dests.remove(k))?;
        self.segs.retire(&StdHashMap::new())
    }
}

impl MapSet {
    /// The encoding and this host's SRv6 addresses (the IPv4 option where the datapath has no
    /// SRv6 maps).
    pub fn encap(&self) -> Result<Encap> {
        match &self.srv6 {
            Some(m) => m.encap(),
            None => Ok(Encap::default()),
        }
    }

    /// Makes the datapath encode paths as `srv6` says (`None`: the IPv4 option), without a
    /// moment in which a packet finds half of it: switching to SRv6, every uSID is in place
    /// before the encoding changes; switching back, the encoding changes first. Within SRv6,
    /// new and changed entries are written before stale ones go.
    pub fn apply_srv6(&mut self, srv6: Option<&Srv6Table>) -> Result<()> {
        let Some(m) = self.srv6.as_mut() else {
            if srv6.is_none() {
                return Ok(());
            }
            return Err(Error::Config(format!(
                "this datapath was left by an older agent and has no {HOST_MAP}: start this \
                 agent version on the node first"
            )));
        };
        let Some(table) = srv6 else {
            // Another encoding's entry is that encoding's to change.
            if m.encap()?.encoding == encoding::SRV6 {
                m.set_encap(Encap::default())?;
            }
            if let Some(x) = self.lookup.as_mut() {
                x.clear_srv6_dests()?;
            }
            return m.clear();
        };
        table.validate().map_err(Error::Config)?;
        // Numbered against the groups written now: no destination of either table meets
        // segments that changed under it while the entries change one at a time.
        let old = m.groups()?;
        let compiled = table
            .compile()
            .renumbered(&old, SRV6_SEGS_CAPACITY as usize);
        self.or_trie(lookup::SRV6_DESTS, |s| s.write_srv6(table, &compiled))
    }

    fn write_srv6(&mut self, table: &Srv6Table, compiled: &Compiled) -> Result<()> {
        let m = self.srv6.as_mut().expect("apply_srv6 checked the maps");
        let mut x = self.lookup.as_mut();
        let exact = match x.as_deref_mut() {
            Some(x) => {
                let exact = x.prepare(lookup::SRV6_DESTS, compiled.dests.keys())?;
                x.retire_srv6_dests(&compiled.dests, exact)?;
                exact
            }
            None => false,
        };
        // Renumbering gives segments that change a group of their own, so entries held keep
        // their values and new ones come in beside them. Where the table could not be
        // renumbered (the map's capacity), an entry that changes leaves first and comes back
        // after a grace period: its packets pass unencapsulated meanwhile, never with another
        // path's uSIDs.
        let segs: StdHashMap<SegKey, Segments> =
            compiled.segs.iter().map(|(k, v)| (*k, *v)).collect();
        m.segs.retire_changed(&segs)?;
        m.segs.add(&segs)?;
        // Each destination in the trie (which frees a replaced value after a grace period),
        // new and changed ones only, then in the exact table.
        let mut held = BTreeMap::new();
        for entry in m.dests.iter() {
            match entry {
                Ok((k, d)) => {
                    held.insert(prefix_of(&k), d);
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(SRV6_DESTS_MAP)(e)),
            }
        }
        for (p, d) in &compiled.dests {
            if held.get(p) != Some(d) {
                m.dests
                    .insert(&key(p), d, 0)
                    .map_err(map_err(SRV6_DESTS_MAP))?;
            }
        }
        if let Some(x) = x.as_deref_mut() {
            x.add_srv6_dests(&compiled.dests, exact)?;
        }
        m.set_encap(Encap {
            encoding: encoding::SRV6,
            _pad: 0,
            source: table.source.octets(),
            receive: table.receive.octets(),
            fabric6: table.fabric6_bytes(),
            _pad2: 0,
        })?;
        let stale: Vec<Key<[u8; 4]>> = held
            .keys()
            .filter(|p| !compiled.dests.contains_key(p))
            .map(key)
            .collect();
        remove_each(SRV6_DESTS_MAP, stale, |k| m.dests.remove(k))?;
        // Stale destinations leave both tables before the segments they name.
        if let Some(x) = x {
            x.finish_srv6_dests(&compiled.dests)?;
        }
        let stale: Vec<SegKey> = old_keys(&m.segs)?
            .into_iter()
            .filter(|k| !compiled.segs.contains_key(k))
            .collect();
        m.segs.remove(stale)
    }
}

/// The keys of a guarded map.
fn old_keys<K: aya::Pod + Eq + std::hash::Hash, V: aya::Pod + PartialEq>(
    map: &Guarded<K, V>,
) -> Result<Vec<K>> {
    Ok(map.entries()?.into_keys().collect())
}
