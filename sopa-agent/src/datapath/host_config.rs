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
//! the settings through it. A datapath of the previous layout held them in maps of their own
//! (`super::layout::previous_settings`): an upgrade carries them into a fresh snapshot before
//! its programs run ([`seed`]), and `status` reads them as a snapshot it cannot change.

use std::{
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
};

use aya::maps::{Array, Map, MapData};
use sopa_common::maps::{HOST_INDEX_MAP, HOST_MAP, HostConfig};

use super::grace::Grace;
use crate::error::{Error, Result};

/// The host's settings, shared by the parts of the map set that change them.
#[derive(Clone)]
pub struct SharedHost(Arc<Held>);

enum Held {
    Maps(Mutex<HostSettings>),
    /// The settings of a datapath of the previous layout, read once, not to be changed.
    Previous(HostConfig),
}

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
        Ok(Self(Arc::new(Held::Maps(Mutex::new(HostSettings {
            slots: slots.try_into().map_err(Error::map(HOST_MAP))?,
            index: index.try_into().map_err(Error::map(HOST_INDEX_MAP))?,
            grace,
            unsettled: true,
        })))))
    }

    /// The settings a datapath of the previous layout holds, to read.
    pub fn previous(settings: HostConfig) -> Self {
        Self(Arc::new(Held::Previous(settings)))
    }

    fn lock(m: &Mutex<HostSettings>) -> MutexGuard<'_, HostSettings> {
        // A writer that panicked left the maps as they were: each change is one slot's write
        // and one index's, and a slot is current only once written.
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current settings.
    pub fn get(&self) -> Result<HostConfig> {
        match &*self.0 {
            Held::Maps(m) => Self::lock(m).get(),
            Held::Previous(settings) => Ok(*settings),
        }
    }

    /// Changes the settings as `change` says, published whole (nothing, where nothing
    /// changes). On an error the programs keep reading the settings as they were.
    pub fn update(&self, change: impl FnOnce(&mut HostConfig)) -> Result<()> {
        match &*self.0 {
            Held::Maps(m) => Self::lock(m).update(change),
            Held::Previous(_) => Err(Error::Config(format!(
                "this datapath was left by an older agent and has no {HOST_MAP}: start this \
                 agent version on the node first"
            ))),
        }
    }
}

/// Writes `settings` into the fresh settings maps of the datapath pinned in `pins` (both slots
/// zero, the first current), before its programs run: what an upgrade carries over from the
/// previous layout's maps. Settings already there (this layout's agent wrote them, and the
/// previous layout's pins outlived it) are kept. Whether it wrote them.
pub fn seed(pins: &Path, settings: HostConfig) -> Result<bool> {
    let open = |name: &'static str| {
        MapData::from_pin(pins.join(name))
            .and_then(Map::from_map_data)
            .map_err(Error::map(name))
    };
    let mut slots: Array<MapData, HostConfig> =
        open(HOST_MAP)?.try_into().map_err(Error::map(HOST_MAP))?;
    let index: Array<MapData, u32> = open(HOST_INDEX_MAP)?
        .try_into()
        .map_err(Error::map(HOST_INDEX_MAP))?;
    let fresh = index.get(&0, 0).map_err(Error::map(HOST_INDEX_MAP))? == 0
        && (0..2).try_fold(true, |all, i| {
            Ok::<_, Error>(
                all && slots.get(&i, 0).map_err(Error::map(HOST_MAP))? == HostConfig::default(),
            )
        })?;
    if !fresh {
        return Ok(false);
    }
    slots.set(0, settings, 0).map_err(Error::map(HOST_MAP))?;
    Ok(true)
}

impl HostSettings {
    fn current(&self) -> Result<u32> {
        Ok(self.index.get(&0, 0).map_err(Error::map(HOST_INDEX_MAP))? & 1)
    }

    /// For readers in other processes (`status`), which no grace period protects: the slot is
    /// taken as read whole if the index names it still after the read (the agent rewrites a
    /// slot only after naming the other one).
    fn get(&self) -> Result<HostConfig> {
        let mut current = self.current()?;
        for _ in 0..8 {
            let settings = self.slots.get(&current, 0).map_err(Error::map(HOST_MAP))?;
            let now = self.current()?;
            if now == current {
                return Ok(settings);
            }
            current = now;
        }
        Err(Error::Config(format!(
            "{HOST_MAP} changed under every one of 8 reads: try again"
        )))
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
