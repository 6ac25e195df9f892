//! The settings the agent alone writes and every packet reads ([`HOST_MAP`]: the encoding and
//! this host's addresses in it, how destinations are looked up, the path meter's period and
//! rack mask), designed for the programs that read them: two slots, of which
//! [`HOST_INDEX_MAP`] names the current one. A change is written whole into the other slot,
//! which is then named; a program reads the index, then that slot, so it sees the settings
//! before a change or after it, never half of one. The slot a program may still be reading is
//! written again only after an RCU grace period ([`super::grace`]), when every program that
//! read the old index has returned.
//!
//! The encoding, the lookups and the meter each hold a [`SharedHost`] and change their part of
//! the settings through it.

use std::sync::{Arc, Mutex, MutexGuard};

use aya::maps::{Array, Map, MapData};
use sopa_common::maps::{HOST_INDEX_MAP, HOST_MAP, HostConfig};

use super::grace::Grace;
use crate::error::{Error, Result};

/// The host's settings, shared by the parts of the map set that change them.
#[derive(Clone)]
pub struct SharedHost(Arc<Mutex<HostSettings>>);

pub struct HostSettings {
    slots: Array<MapData, HostConfig>,
    index: Array<MapData, u32>,
    grace: Arc<Grace>,
    /// A program may still be reading the slot that is not current: a slot was named since the
    /// last grace period. True at first: another agent may have named one a moment ago.
    unsettled: bool,
}

impl SharedHost {
    pub fn from_maps(slots: Map, index: Map, grace: Arc<Grace>) -> Result<Self> {
        Ok(Self(Arc::new(Mutex::new(HostSettings {
            slots: slots.try_into().map_err(Error::map(HOST_MAP))?,
            index: index.try_into().map_err(Error::map(HOST_INDEX_MAP))?,
            grace,
            unsettled: true,
        }))))
    }

    fn lock(&self) -> MutexGuard<'_, HostSettings> {
        // A writer that panicked left the maps as they were: each change is one slot's write
        // and one index's, and a slot is current only once written.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current settings.
    pub fn get(&self) -> Result<HostConfig> {
        self.lock().get()
    }

    /// Changes the settings as `change` says, published whole (nothing, where nothing
    /// changes). On an error the programs keep reading the settings as they were.
    pub fn update(&self, change: impl FnOnce(&mut HostConfig)) -> Result<()> {
        self.lock().update(change)
    }
}

impl HostSettings {
    fn current(&self) -> Result<u32> {
        Ok(self.index.get(&0, 0).map_err(Error::map(HOST_INDEX_MAP))? & 1)
    }

    fn get(&self) -> Result<HostConfig> {
        self.slots
            .get(&self.current()?, 0)
            .map_err(Error::map(HOST_MAP))
    }

    fn update(&mut self, change: impl FnOnce(&mut HostConfig)) -> Result<()> {
        let current = self.current()?;
        let now = self.slots.get(&current, 0).map_err(Error::map(HOST_MAP))?;
        let mut next = now;
        change(&mut next);
        if next == now {
            return Ok(());
        }
        if self.unsettled {
            self.grace.wait()?;
            self.unsettled = false;
        }
        let other = current ^ 1;
        self.slots
            .set(other, next, 0)
            .map_err(Error::map(HOST_MAP))?;
        self.index
            .set(0, other, 0)
            .map_err(Error::map(HOST_INDEX_MAP))?;
        self.unsettled = true;
        Ok(())
    }
}
