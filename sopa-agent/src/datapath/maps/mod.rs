//! Typed access to the datapath's maps, from the loaded object or from its pins.

use std::{path::Path, sync::Arc};

use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray, lpm_trie::Key},
};
use sopa_common::maps::{
    CONFIG_MAP, Config, EV_MAP, EvKey, FLOWS_MAP, FlowKey, FlowState, HOP_STATS_MAP,
    HOST_INDEX_MAP, HOST_MAP, MEASURE_MAP, PATHS_EXACT_MAP, PATHS_MAP, PINS_MAP, PathSet, Pin,
    SRV6_DESTS_EXACT_MAP, SRV6_DESTS_MAP, SRV6_SEGS_MAP, STAMP_STATS_MAP, START_MAP,
    STRIP_STATS_MAP, measure, meter, stamp_reason, strip_reason,
};

use super::{
    grace::{Grace, Guarded},
    host_config::SharedHost,
    lookup::Lookup,
    meter_maps::MeterMaps,
};
use crate::{
    error::{Error, Result},
    path_table::Prefix,
};

mod counters;
mod forward;
mod paths;
mod srv6;

pub use counters::Counters;
pub use forward::ForwardMaps;
pub use srv6::Srv6Maps;

pub struct MapSet {
    config: Array<MapData, Config>,
    /// Absent in the pins of a datapath an older agent left (it starts flows at their hash).
    start: Option<Array<MapData, u32>>,
    /// Absent likewise (it measured reordering always).
    measure: Option<Array<MapData, u32>>,
    paths: LpmTrie<MapData, [u8; 4], PathSet>,
    stamp_stats: PerCpuArray<MapData, u64>,
    hop_stats: PerCpuArray<MapData, u64>,
    strip_stats: PerCpuArray<MapData, u64>,
    /// The counter names of the stats maps' layout, in their index order: this layout's, or a
    /// predecessor's when reading the pins of a datapath an older agent left attached.
    stamp_names: &'static [&'static str],
    strip_names: &'static [&'static str],
    flows: HashMap<MapData, FlowKey, FlowState>,
    pins: Guarded<FlowKey, Pin>,
    pub(super) srv6: Option<Srv6Maps>,
    /// The entropy encoding's labels (absent in the pins of a datapath an older agent left).
    pub(super) evs: Option<Guarded<EvKey, u32>>,
    pub(super) meter: Option<MeterMaps>,
    lookup: Option<Lookup>,
    /// How the writers wait for the programs that may hold a value they free.
    pub(super) grace: Arc<Grace>,
}

pub(super) fn map_err(name: &'static str) -> impl Fn(MapError) -> Error {
    Error::map(name)
}

/// A setting of a map that the datapath an older agent left does not have.
fn older_agent(name: &str) -> Error {
    Error::Config(format!(
        "this datapath was left by an older agent and has no {name}: start this agent version \
         on the node first"
    ))
}

impl MapSet {
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name).ok_or_else(|| {
                Error::map(name)(MapError::InvalidName {
                    name: name.to_owned(),
                })
            })
        };
        let start = take(START_MAP)?;
        let measure = take(MEASURE_MAP)?;
        let (slots, index) = (take(HOST_MAP)?, take(HOST_INDEX_MAP)?);
        let mut set = Self::from_maps(
            take(CONFIG_MAP)?,
            take(PATHS_MAP)?,
            take(STAMP_STATS_MAP)?,
            take(HOP_STATS_MAP)?,
            take(STRIP_STATS_MAP)?,
            take(FLOWS_MAP)?,
            take(PINS_MAP)?,
        )?;
        set.start = Some(start.try_into().map_err(map_err(START_MAP))?);
        set.measure = Some(measure.try_into().map_err(map_err(MEASURE_MAP))?);
        let host = SharedHost::from_maps(slots, index, Arc::clone(&set.grace))?;
        set.srv6 = Some(Srv6Maps::from_maps(
            host.clone(),
            take(SRV6_DESTS_MAP)?,
            take(SRV6_SEGS_MAP)?,
            &set.grace,
        )?);
        set.evs = Some(Guarded::new(
            take(EV_MAP)?.try_into().map_err(map_err(EV_MAP))?,
            EV_MAP,
            Arc::clone(&set.grace),
        ));
        set.meter = Some(MeterMaps::from_maps(
            host.clone(),
            [take(meter::SENT_MAPS[0])?, take(meter::SENT_MAPS[1])?],
            [
                take(meter::RECEIVED_MAPS[0])?,
                take(meter::RECEIVED_MAPS[1])?,
            ],
            Some(take(meter::COLOR_MAP)?),
            Some(take(meter::PEERS_MAP)?),
            &set.grace,
        )?);
        set.lookup = Some(Lookup::from_maps(
            host,
            take(PATHS_EXACT_MAP)?,
            take(SRV6_DESTS_EXACT_MAP)?,
            Arc::clone(&set.grace),
        )?);
        Ok(set)
    }

    /// Opens the maps a running agent pinned in `dir`. The counters of a datapath an agent of
    /// the previous layout left attached are read by their names.
    pub fn from_pins(dir: &Path) -> Result<Self> {
        let open = |name: &'static str| {
            MapData::from_pin(dir.join(name))
                .and_then(Map::from_map_data)
                .map_err(map_err(name))
        };
        let stats =
            |name: &'static str, names: &'static [&'static str]| match super::layout::PREDECESSORS
                .iter()
                .find(|p| p.new == name && !dir.join(name).exists() && dir.join(p.old).exists())
            {
                Some(p) => Ok((open(p.old)?, p.old_names)),
                None => Ok::<_, Error>((open(name)?, names)),
            };
        let (stamp, stamp_names) = stats(STAMP_STATS_MAP, &stamp_reason::NAMES)?;
        let (strip, strip_names) = stats(STRIP_STATS_MAP, &strip_reason::NAMES)?;
        let mut set = Self::from_maps(
            open(CONFIG_MAP)?,
            open(PATHS_MAP)?,
            stamp,
            open(HOP_STATS_MAP)?,
            strip,
            open(FLOWS_MAP)?,
            open(PINS_MAP)?,
        )?;
        set.stamp_names = stamp_names;
        set.strip_names = strip_names;
        set.start = match open(START_MAP) {
            Ok(m) => Some(m.try_into().map_err(map_err(START_MAP))?),
            Err(_) => None,
        };
        set.measure = match open(MEASURE_MAP) {
            Ok(m) => Some(m.try_into().map_err(map_err(MEASURE_MAP))?),
            Err(_) => None,
        };
        // A datapath of the previous layout held its settings in maps of their own: read as a
        // snapshot this reader cannot change.
        let host = match (open(HOST_MAP), open(HOST_INDEX_MAP)) {
            (Ok(s), Ok(i)) => Some(SharedHost::from_maps(s, i, Arc::clone(&set.grace))?),
            _ => super::layout::previous_settings(dir)?.map(SharedHost::previous),
        };
        set.srv6 = match (host.clone(), open(SRV6_DESTS_MAP), open(SRV6_SEGS_MAP)) {
            (Some(h), Ok(d), Ok(s)) => Some(Srv6Maps::from_maps(h, d, s, &set.grace)?),
            _ => None,
        };
        set.evs = match open(EV_MAP) {
            Ok(m) => Some(Guarded::new(
                m.try_into().map_err(map_err(EV_MAP))?,
                EV_MAP,
                Arc::clone(&set.grace),
            )),
            Err(_) => None,
        };
        // An older datapath's meter (one map of both colors, never emptied) is not read.
        set.meter = match (
            host.clone(),
            open(meter::SENT_MAPS[0]),
            open(meter::SENT_MAPS[1]),
            open(meter::RECEIVED_MAPS[0]),
            open(meter::RECEIVED_MAPS[1]),
        ) {
            (Some(h), Ok(s0), Ok(s1), Ok(r0), Ok(r1)) => Some(MeterMaps::from_maps(
                h,
                [s0, s1],
                [r0, r1],
                open(meter::COLOR_MAP).ok(),
                open(meter::PEERS_MAP).ok(),
                &set.grace,
            )?),
            _ => None,
        };
        set.lookup = match (host, open(PATHS_EXACT_MAP), open(SRV6_DESTS_EXACT_MAP)) {
            (Some(h), Ok(p), Ok(d)) => Some(Lookup::from_maps(h, p, d, Arc::clone(&set.grace))?),
            _ => None,
        };
        Ok(set)
    }

    fn from_maps(
        config: Map,
        paths: Map,
        stamp: Map,
        hops: Map,
        strip: Map,
        flows: Map,
        pins: Map,
    ) -> Result<Self> {
        let grace = Grace::new();
        Ok(Self {
            config: config.try_into().map_err(map_err(CONFIG_MAP))?,
            start: None,
            measure: None,
            paths: paths.try_into().map_err(map_err(PATHS_MAP))?,
            stamp_stats: stamp.try_into().map_err(map_err(STAMP_STATS_MAP))?,
            hop_stats: hops.try_into().map_err(map_err(HOP_STATS_MAP))?,
            strip_stats: strip.try_into().map_err(map_err(STRIP_STATS_MAP))?,
            stamp_names: &stamp_reason::NAMES,
            strip_names: &strip_reason::NAMES,
            flows: flows.try_into().map_err(map_err(FLOWS_MAP))?,
            pins: Guarded::new(
                pins.try_into().map_err(map_err(PINS_MAP))?,
                PINS_MAP,
                Arc::clone(&grace),
            ),
            srv6: None,
            evs: None,
            meter: None,
            lookup: None,
            grace,
        })
    }

    /// Every flow the sender's datapath tracks, with its packet and byte counts.
    pub fn flows(&self) -> Result<Vec<(FlowKey, FlowState)>> {
        self.flows
            .iter()
            // An entry evicted between listing its key and reading it is simply gone.
            .filter(|e| !matches!(e, Err(MapError::KeyNotFound)))
            .collect::<std::result::Result<_, _>>()
            .map_err(map_err(FLOWS_MAP))
    }

    /// Entries in the flow table now (one key walk: about 50 ms when it is full).
    pub fn flow_entries(&self) -> usize {
        self.flows.keys().filter(|k| k.is_ok()).count()
    }

    /// The Hedera pins the datapath holds.
    pub fn pins(&self) -> Result<Vec<(FlowKey, Pin)>> {
        self.pins
            .map()
            .iter()
            .filter(|e| !matches!(e, Err(MapError::KeyNotFound)))
            .collect::<std::result::Result<_, _>>()
            .map_err(map_err(PINS_MAP))
    }

    /// Makes the pins exactly `pins`: new pins first, then each changed one replaced whole (a
    /// packet of the flow reads its old pin or its new one, never another flow's), then the
    /// flows no longer pinned removed ([`super::grace`]).
    pub fn replace_pins(&mut self, pins: &[(FlowKey, Pin)]) -> Result<()> {
        self.pins.sync_in_place(&pins.iter().copied().collect())
    }

    pub fn config(&self) -> Result<Config> {
        self.config.get(&0, 0).map_err(map_err(CONFIG_MAP))
    }

    pub fn set_config(&mut self, config: Config) -> Result<()> {
        self.config.set(0, config, 0).map_err(map_err(CONFIG_MAP))
    }

    /// Where new flows start their round robin ([`sopa_common::maps::first_path`]).
    pub fn first_path(&self) -> Result<u32> {
        match &self.start {
            Some(m) => m.get(&0, 0).map_err(map_err(START_MAP)),
            None => Ok(sopa_common::maps::first_path::HASH),
        }
    }

    /// Whether this datapath has the setting (the pins of an older agent's do not).
    pub fn has_first_path(&self) -> bool {
        self.start.is_some()
    }

    pub fn set_first_path(&mut self, first: u32) -> Result<()> {
        let m = self.start.as_mut().ok_or_else(|| older_agent(START_MAP))?;
        m.set(0, first, 0).map_err(map_err(START_MAP))
    }

    /// Whether `xdp_strip` measures reordering (`measure::REORDERING`). The datapath of an
    /// older agent has no setting and always did.
    pub fn reordering_measured(&self) -> Result<bool> {
        match &self.measure {
            Some(m) => Ok(m.get(&0, 0).map_err(map_err(MEASURE_MAP))? & measure::REORDERING != 0),
            None => Ok(true),
        }
    }

    /// Turns the measurement of reordering on or off (the counters and the flows' state stay).
    pub fn set_reordering_measured(&mut self, on: bool) -> Result<()> {
        let m = self
            .measure
            .as_mut()
            .ok_or_else(|| older_agent(MEASURE_MAP))?;
        let bits = m.get(&0, 0).map_err(map_err(MEASURE_MAP))?;
        let bits = if on {
            bits | measure::REORDERING
        } else {
            bits & !measure::REORDERING
        };
        m.set(0, bits, 0).map_err(map_err(MEASURE_MAP))
    }
}

/// Removes each of `keys` from the map named `name` with `remove`; a key already gone is not an
/// error.
pub(super) fn remove_each<K>(
    name: &'static str,
    keys: impl IntoIterator<Item = K>,
    mut remove: impl FnMut(&K) -> std::result::Result<(), MapError>,
) -> Result<()> {
    for k in keys {
        match remove(&k) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(source) => return Err(Error::map(name)(source)),
        }
    }
    Ok(())
}

fn key(prefix: &Prefix) -> Key<[u8; 4]> {
    Key::new(u32::from(prefix.len), prefix.addr.octets())
}

fn prefix_of(key: &Key<[u8; 4]>) -> Prefix {
    Prefix {
        addr: key.data().into(),
        len: key.prefix_len() as u8,
    }
}
