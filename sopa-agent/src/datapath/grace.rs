//! Hash maps the programs read through a pointer, written so that no reader ever holds a value
//! that changes under it.
//!
//! A hash map's element that an update replaces, or a delete removes, goes back to the map's
//! allocator at once, and the map's next insert or update may take it and copy another value
//! into it, while a program that looked the old element up is still reading it: `tc_stamp`
//! would read a prefix's path count from one value and its hops from another key's (seen in
//! `tests/rewrite_races.rs`). The programs run inside an RCU read-side section, so the rule
//! here is: after an element is freed, no element is allocated until an RCU grace period has
//! passed, that is until every program that could hold it has returned. The agent waits for one
//! the way the kernel offers to user space: an update of a map-in-map returns only after
//! `synchronize_rcu()` ("so that user space knows that all non-sleepable programs that could
//! be running use the new map value", `maybe_wait_bpf_programs` in kernel/bpf/syscall.c).
//!
//! An entry whose value changes is therefore either replaced in place with a grace period
//! before each replacement ([`Guarded::sync_in_place`]: a reader sees the old value or the new
//! one, never a gap), or removed with its stale siblings, and put back after one grace period
//! for them all ([`Guarded::retire`], then [`Guarded::add`]), where a reader that misses the
//! key finds the same value elsewhere (the exact tables' tries).

use std::{
    collections::HashMap as StdHashMap,
    hash::Hash,
    os::fd::{AsRawFd as _, OwnedFd},
    sync::{Arc, Mutex},
};

use aya::{
    Pod,
    maps::{HashMap, MapData, MapError},
};

use super::syscall::{Attr, BPF_MAP_CREATE, BPF_MAP_UPDATE_ELEM, bpf, owned};
use crate::error::{Error, Result};

/// The map types used (linux/bpf.h).
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;

/// Waits for an RCU grace period: a one-slot array of maps, whose every update waits for one.
/// Created at the first wait (readers of the pins never wait).
#[derive(Default)]
pub struct Grace {
    maps: Mutex<Option<(OwnedFd, OwnedFd)>>,
}

fn create(map_type: u32, inner: Option<&OwnedFd>) -> std::io::Result<OwnedFd> {
    let mut attr = Attr::zeroed();
    // map_type, key_size, value_size, max_entries, map_flags, inner_map_fd.
    attr.0[..4].copy_from_slice(&[map_type, 4, 4, 1]);
    if let Some(inner) = inner {
        attr.0[5] = inner.as_raw_fd() as u32;
    }
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

impl Grace {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Returns once every program that was running when it was called has returned.
    pub fn wait(&self) -> Result<()> {
        let mut maps = self.maps.lock().expect("grace lock");
        if maps.is_none() {
            let inner = create(BPF_MAP_TYPE_ARRAY, None);
            let outer = inner
                .as_ref()
                .map_err(|e| std::io::Error::from(e.kind()))
                .and_then(|i| create(BPF_MAP_TYPE_ARRAY_OF_MAPS, Some(i)));
            match (inner, outer) {
                (Ok(i), Ok(o)) => *maps = Some((o, i)),
                (Err(e), _) | (_, Err(e)) => {
                    return Err(Error::io(
                        "creating the array of maps the agent waits for RCU grace periods with",
                        e,
                    ));
                }
            }
        }
        let (outer, inner) = maps.as_ref().expect("created above");
        let key = 0u32;
        let value = inner.as_raw_fd() as u32;
        let mut attr = Attr::zeroed();
        // map_fd, pad, key (u64 pointer), value (u64 pointer), flags.
        attr.0[0] = outer.as_raw_fd() as u32;
        attr.set_u64(2, &key as *const u32 as u64);
        attr.set_u64(4, &value as *const u32 as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr)
            .map(drop)
            .map_err(|e| Error::io("waiting for an RCU grace period", e))
    }
}

/// A hash map whose freed elements wait out a grace period before the map allocates again.
pub struct Guarded<K, V> {
    map: HashMap<MapData, K, V>,
    name: &'static str,
    grace: Arc<Grace>,
    /// An element was freed since the last grace period. True at first: whoever wrote the
    /// map before (another agent, a moment ago) may have freed one.
    freed: bool,
}

impl<K: Pod + Eq + Hash, V: Pod + PartialEq> Guarded<K, V> {
    pub fn new(map: HashMap<MapData, K, V>, name: &'static str, grace: Arc<Grace>) -> Self {
        Self {
            map,
            name,
            grace,
            freed: true,
        }
    }

    /// The map, to read.
    pub fn map(&self) -> &HashMap<MapData, K, V> {
        &self.map
    }

    /// Every entry (an entry removed while the keys are walked is left out).
    pub fn entries(&self) -> Result<StdHashMap<K, V>> {
        let mut out = StdHashMap::new();
        for k in self.map.keys() {
            let k = k.map_err(Error::map(self.name))?;
            match self.map.get(&k, 0) {
                Ok(v) => {
                    out.insert(k, v);
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(Error::map(self.name)(e)),
            }
        }
        Ok(out)
    }

    /// Before an allocation: a grace period if an element was freed since the last one.
    fn before_alloc(&mut self) -> Result<()> {
        if self.freed {
            self.grace.wait()?;
            self.freed = false;
        }
        Ok(())
    }

    /// Removes `keys` (a key already gone is not an error).
    pub fn remove(&mut self, keys: impl IntoIterator<Item = K>) -> Result<()> {
        for k in keys {
            match self.map.remove(&k) {
                Ok(()) => self.freed = true,
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(Error::map(self.name)(e)),
            }
        }
        Ok(())
    }

    /// Writes one entry, in place where it exists (one grace period first if needed).
    pub fn set(&mut self, k: &K, v: &V) -> Result<()> {
        self.before_alloc()?;
        let replaced = self.map.get(k, 0).is_ok();
        self.map.insert(k, v, 0).map_err(Error::map(self.name))?;
        self.freed |= replaced;
        Ok(())
    }

    /// Removes the entries `want` does not hold with this value: stale ones, and changed ones
    /// (to be put back by [`Self::add`] after a grace period).
    pub fn retire(&mut self, want: &StdHashMap<K, V>) -> Result<()> {
        let cur = self.entries()?;
        let out: Vec<K> = cur
            .into_iter()
            .filter(|(k, v)| want.get(k) != Some(v))
            .map(|(k, _)| k)
            .collect();
        self.remove(out)
    }

    /// Removes the keys of `want` the map holds with another value (the others are left as
    /// they are).
    pub fn retire_changed(&mut self, want: &StdHashMap<K, V>) -> Result<()> {
        let mut out = Vec::new();
        for (k, v) in want {
            match self.map.get(k, 0) {
                Ok(old) if old != *v => out.push(*k),
                Ok(_) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(Error::map(self.name)(e)),
            }
        }
        self.remove(out)
    }

    /// Inserts the entries of `want` the map lacks, after one grace period if an element was
    /// freed since the last (entries it holds already are left as they are).
    pub fn add(&mut self, want: &StdHashMap<K, V>) -> Result<()> {
        let cur = self.entries()?;
        let missing: Vec<(&K, &V)> = want.iter().filter(|(k, _)| !cur.contains_key(k)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        self.before_alloc()?;
        for (k, v) in missing {
            self.map.insert(k, v, 0).map_err(Error::map(self.name))?;
        }
        Ok(())
    }

    /// Makes the map exactly `want` with no moment in which a key of both is missing: new
    /// entries first, then each changed one replaced in place (a grace period before each),
    /// then the stale ones removed.
    pub fn sync_in_place(&mut self, want: &StdHashMap<K, V>) -> Result<()> {
        let cur = self.entries()?;
        self.add(want)?;
        for (k, v) in want {
            if cur.get(k).is_some_and(|old| old != v) {
                self.set(k, v)?;
            }
        }
        let stale: Vec<K> = cur.into_keys().filter(|k| !want.contains_key(k)).collect();
        self.remove(stale)
    }
}
