//! Typed access to the datapath's maps, from the loaded object or from its pins.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    path::Path,
    sync::Arc,
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray, lpm_trie::Key},
};
use sopa_common::maps::{
    CONFIG_MAP, Config, EV_MAP, Encap, EvKey, FLOWS_MAP, FWD_MAP, FWD_STATS_MAP,
    FWD_UPLINK_STATS_MAP, FlowKey, FlowState, FwdEntry, HOP_STATS_MAP, HOST_INDEX_MAP, HOST_MAP,
    MAX_PATHS, MAX_UPLINKS, MEASURE_MAP, PATHS_EXACT_MAP, PATHS_MAP, PINS_MAP, PathSet, Pin,
    SRV6_DESTS_EXACT_MAP, SRV6_DESTS_MAP, SRV6_SEGS_CAPACITY, SRV6_SEGS_MAP, STAMP_STATS_MAP,
    START_MAP, STRIP_STATS_MAP, SegKey, Segments, Srv6Dest, TRUST_MAP, UsidRepairConfig, UsidRule,
    UsidRuleKey, encoding, forward_reason, lookup, measure, meter, stamp_reason, strip_reason,
    usid_repair,
};

use super::{
    grace::{Grace, Guarded},
    host_config::SharedHost,
    lookup::Lookup,
    meter_maps::MeterMaps,
};
use crate::{
    error::{Error, Result},
    path_table::{Hops, PathTable, Prefix},
    srv6::{Compiled, Groups, Srv6Table},
};

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

    fn from_maps(host: SharedHost, dests: Map, segs: Map, grace: &Arc<Grace>) -> Result<Self> {
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
    pub(super) fn encap(&self) -> Result<Encap> {
        Ok(self.host.get()?.encap)
    }

    /// Sets the encoding and addresses, where they change.
    pub(super) fn set_encap(&mut self, encap: Encap) -> Result<()> {
        self.host.update(|h| h.encap = encap)
    }
}

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

impl Srv6Maps {
    /// Removes every destination and segment entry.
    fn clear(&mut self) -> Result<()> {
        let dests: Vec<Key<[u8; 4]>> = self.dests.keys().filter_map(|k| k.ok()).collect();
        remove_each(SRV6_DESTS_MAP, dests, |k| self.dests.remove(k))?;
        self.segs.retire(&StdHashMap::new())
    }
}

/// Counters of one program, summed over CPUs, in index order.
pub type Counters = Vec<u64>;

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

    /// Replaces the path table make-before-break: only new and changed prefixes are written,
    /// each in one element update of the trie (which frees the old value after a grace
    /// period), then the prefixes no longer present are removed. A packet sees the old or the
    /// new path set of its prefix, never a mix.
    ///
    /// Where every prefix has one length, the exact table holds the same sets and the
    /// datapath looks them up there; an entry that changes leaves it before the trie is written
    /// and comes back after a grace period (its packets find it in the trie meanwhile,
    /// [`super::lookup`]). Its mask changes only while the trie alone is looked up (mask 0),
    /// so no packet is ever matched at a length the table does not have. A failure leaves the
    /// trie looked up.
    pub fn apply_paths(&mut self, table: &PathTable) -> Result<()> {
        self.set_meter_mask(table)?;
        self.or_trie(lookup::PATHS, |s| s.write_paths(table))
    }

    /// Runs `f`; where it fails, the exact match of `slot` is turned off (the trie, which holds
    /// everything `f` wrote, answers) before the error returns.
    fn or_trie(&mut self, slot: u32, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
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

    /// `tc_stamp`'s counters, indexed by [`stamp_reason`].
    pub fn stamp_counters(&self) -> Result<Counters> {
        by_name(
            &self.stamp_stats,
            self.stamp_names,
            &stamp_reason::NAMES,
            STAMP_STATS_MAP,
        )
    }

    /// `xdp_strip`'s counters, indexed by [`strip_reason`].
    pub fn strip_counters(&self) -> Result<Counters> {
        by_name(
            &self.strip_stats,
            self.strip_names,
            &strip_reason::NAMES,
            STRIP_STATS_MAP,
        )
    }

    /// Segments sent per hop value: `[..256]` for hop0, `[256..]` for hop1.
    pub fn hop_counters(&self) -> Result<Counters> {
        sum_all(
            &self.hop_stats,
            sopa_common::maps::HOP_STATS_LEN,
            HOP_STATS_MAP,
        )
    }
}

/// The switch role's maps: forwarding decisions, the ports trusted to bring the option, and
/// the counters.
pub struct ForwardMaps {
    fwd: LpmTrie<MapData, [u8; 4], FwdEntry>,
    /// Absent when reading the pins of an older layout's datapath (status only).
    trust: Option<HashMap<MapData, u32, u32>>,
    stats: PerCpuArray<MapData, u64>,
    /// The counter names of `stats`' layout (this one's, or a predecessor's).
    stats_names: &'static [&'static str],
    uplinks: PerCpuArray<MapData, u64>,
    /// The SRv6 repair's rules and their configuration; absent in an older layout's pins.
    usid: Option<UsidMaps>,
}

struct UsidMaps {
    config: Array<MapData, UsidRepairConfig>,
    rules: HashMap<MapData, UsidRuleKey, UsidRule>,
}

impl ForwardMaps {
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self> {
        let mut take = |name: &'static str| -> Result<Map> {
            ebpf.take_map(name).ok_or_else(|| {
                Error::map(name)(MapError::InvalidName {
                    name: name.to_owned(),
                })
            })
        };
        Ok(Self {
            fwd: take(FWD_MAP)?.try_into().map_err(map_err(FWD_MAP))?,
            trust: Some(take(TRUST_MAP)?.try_into().map_err(map_err(TRUST_MAP))?),
            stats: take(FWD_STATS_MAP)?
                .try_into()
                .map_err(map_err(FWD_STATS_MAP))?,
            stats_names: &forward_reason::NAMES,
            uplinks: take(FWD_UPLINK_STATS_MAP)?
                .try_into()
                .map_err(map_err(FWD_UPLINK_STATS_MAP))?,
            usid: Some(UsidMaps {
                config: take(usid_repair::CONFIG_MAP)?
                    .try_into()
                    .map_err(map_err(usid_repair::CONFIG_MAP))?,
                rules: take(usid_repair::RULES_MAP)?
                    .try_into()
                    .map_err(map_err(usid_repair::RULES_MAP))?,
            }),
        })
    }

    /// Opens the forwarding maps a switch agent pinned in `dir`; the counters of a datapath
    /// an agent of the previous layout left attached are read by their names.
    pub fn from_pins(dir: &Path) -> Result<Self> {
        let open = |name: &'static str| {
            MapData::from_pin(dir.join(name))
                .and_then(Map::from_map_data)
                .map_err(map_err(name))
        };
        let (stats_pin, stats_names) = match super::layout::PREDECESSORS.iter().find(|p| {
            p.new == FWD_STATS_MAP && !dir.join(p.new).exists() && dir.join(p.old).exists()
        }) {
            Some(p) => (p.old, p.old_names),
            None => (FWD_STATS_MAP, &forward_reason::NAMES[..]),
        };
        Ok(Self {
            fwd: open(FWD_MAP)?.try_into().map_err(map_err(FWD_MAP))?,
            trust: match open(TRUST_MAP) {
                Ok(m) => Some(m.try_into().map_err(map_err(TRUST_MAP))?),
                Err(_) => None,
            },
            stats: open(stats_pin)?.try_into().map_err(map_err(stats_pin))?,
            stats_names,
            uplinks: open(FWD_UPLINK_STATS_MAP)?
                .try_into()
                .map_err(map_err(FWD_UPLINK_STATS_MAP))?,
            usid: match (open(usid_repair::CONFIG_MAP), open(usid_repair::RULES_MAP)) {
                (Ok(config), Ok(rules)) => Some(UsidMaps {
                    config: config
                        .try_into()
                        .map_err(map_err(usid_repair::CONFIG_MAP))?,
                    rules: rules.try_into().map_err(map_err(usid_repair::RULES_MAP))?,
                }),
                _ => None,
            },
        })
    }

    /// Sets the decision for destinations in `prefix`.
    pub fn set(&mut self, prefix: &Prefix, entry: &FwdEntry) -> Result<()> {
        self.fwd
            .insert(&key(prefix), *entry, 0)
            .map_err(map_err(FWD_MAP))
    }

    /// Every entry of the forwarding map.
    pub fn entries(&self) -> Result<std::collections::BTreeMap<Prefix, FwdEntry>> {
        self.fwd
            .iter()
            .map(|e| e.map(|(k, v)| (prefix_of(&k), v)).map_err(map_err(FWD_MAP)))
            .collect()
    }

    /// Removes the entry of `prefix` (destinations in it go back to the kernel's routes).
    pub fn remove(&mut self, prefix: &Prefix) -> Result<()> {
        match self.fwd.remove(&key(prefix)) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(FWD_MAP)(e)),
        }
    }

    /// Makes the trusted ports exactly `ports` (ifindex -> [`sopa_common::maps::trust`]):
    /// new and changed entries first, then the ports no longer trusted removed, so a port that
    /// stays trusted never leaves the map.
    pub fn set_trusted(&mut self, ports: &std::collections::BTreeMap<u32, u32>) -> Result<()> {
        let trust = self.trust.as_mut().ok_or_else(|| {
            Error::map(TRUST_MAP)(MapError::InvalidName {
                name: TRUST_MAP.to_owned(),
            })
        })?;
        for (port, kind) in ports {
            if trust.get(port, 0).ok() != Some(*kind) {
                trust.insert(port, kind, 0).map_err(map_err(TRUST_MAP))?;
            }
        }
        let stale: Vec<u32> = trust
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| !ports.contains_key(k))
            .collect();
        remove_each(TRUST_MAP, stale, |k| trust.remove(k))?;
        Ok(())
    }

    /// Makes the SRv6 repair's rules exactly `rules`, for a switch whose uSID is `me` in
    /// `block` (which `tc_forward` consumes itself where `shift`): new and changed rules first, the count
    /// raised before and lowered after, stale rules last, so a packet never finds the count
    /// saying "none" while a rule it needs is written.
    pub fn set_usid_rules(
        &mut self,
        me: u16,
        block: sopa_common::srv6::Block,
        shift: bool,
        rules: &std::collections::BTreeMap<UsidRuleKey, UsidRule>,
    ) -> Result<()> {
        let usid = self.usid.as_mut().ok_or_else(|| {
            Error::map(usid_repair::RULES_MAP)(MapError::InvalidName {
                name: usid_repair::RULES_MAP.to_owned(),
            })
        })?;
        let old: Vec<UsidRuleKey> = usid.rules.keys().filter_map(|k| k.ok()).collect();
        let config = |rules: usize| UsidRepairConfig {
            me,
            shift: u16::from(shift),
            rules: rules as u32,
            block,
        };
        let most = old.len().max(rules.len());
        usid.config
            .set(0, config(most), 0)
            .map_err(map_err(usid_repair::CONFIG_MAP))?;
        for (key, rule) in rules {
            if usid.rules.get(key, 0).ok() != Some(*rule) {
                usid.rules
                    .insert(key, rule, 0)
                    .map_err(map_err(usid_repair::RULES_MAP))?;
            }
        }
        remove_each(
            usid_repair::RULES_MAP,
            old.iter().filter(|k| !rules.contains_key(k)),
            |k| usid.rules.remove(*k),
        )?;
        usid.config
            .set(0, config(rules.len()), 0)
            .map_err(map_err(usid_repair::CONFIG_MAP))
    }

    /// The SRv6 repair's rules, if this layout has them.
    pub fn usid_rules(&self) -> Option<std::collections::BTreeMap<UsidRuleKey, UsidRule>> {
        let usid = self.usid.as_ref()?;
        Some(usid.rules.iter().filter_map(|e| e.ok()).collect())
    }

    /// The trusted ports (ifindex -> kind), if this layout has the map.
    pub fn trusted(&self) -> Option<std::collections::BTreeMap<u32, u32>> {
        let trust = self.trust.as_ref()?;
        Some(trust.iter().filter_map(|e| e.ok()).collect())
    }

    pub fn counters(&self) -> Result<Counters> {
        by_name(
            &self.stats,
            self.stats_names,
            &forward_reason::NAMES,
            FWD_STATS_MAP,
        )
    }

    /// Redirected packets per uplink index.
    pub fn uplink_counters(&self) -> Result<Counters> {
        sum_all(&self.uplinks, MAX_UPLINKS as u32, FWD_UPLINK_STATS_MAP)
    }
}

/// The counters of a map whose slots are named `names`, summed over CPUs and placed by name
/// at their index in `wanted` (a counter `names` lacks reads 0).
fn by_name(
    map: &PerCpuArray<MapData, u64>,
    names: &[&str],
    wanted: &[&str],
    map_name: &'static str,
) -> Result<Counters> {
    let values = sum_all(map, names.len() as u32, map_name)?;
    Ok(wanted
        .iter()
        .map(|w| names.iter().position(|n| n == w).map_or(0, |i| values[i]))
        .collect())
}

fn sum_all(map: &PerCpuArray<MapData, u64>, len: u32, name: &'static str) -> Result<Counters> {
    (0..len)
        .map(|i| {
            map.get(&i, 0)
                .map(|values| values.iter().sum())
                .map_err(map_err(name))
        })
        .collect()
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

/// The keys of a guarded map.
fn old_keys<K: aya::Pod + Eq + std::hash::Hash, V: aya::Pod + PartialEq>(
    map: &Guarded<K, V>,
) -> Result<Vec<K>> {
    Ok(map.entries()?.into_keys().collect())
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

fn key(prefix: &Prefix) -> Key<[u8; 4]> {
    Key::new(u32::from(prefix.len), prefix.addr.octets())
}

fn prefix_of(key: &Key<[u8; 4]>) -> Prefix {
    Prefix {
        addr: key.data().into(),
        len: key.prefix_len() as u8,
    }
}
