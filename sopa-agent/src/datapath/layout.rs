//! Map layouts across agent versions. A map whose layout changes gets a new `_Vn` name, so a
//! pin of another layout is never reused by mistake. An agent refuses a pin folder holding maps
//! of a layout it does not know, except the predecessors listed here, whose content it carries
//! over: an agent of that older layout is then replaced hitlessly (its programs are replaced in
//! place through their links and use the old maps until that moment).

use std::path::Path;

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuValues};
use sopa_common::maps::{
    Encap, FWD_STATS_MAP, HostConfig, MeterConfig, STAMP_STATS_MAP, STRIP_STATS_MAP,
    forward_reason, lookup, stamp_reason, strip_reason,
};
use tracing::{info, warn};

use crate::error::{Error, Result};

/// A per-CPU counter map of an older layout and the map of this layout that replaces it.
pub struct Predecessor {
    /// The older map's name (and pin).
    pub old: &'static str,
    /// Its counter names in its index order, frozen with that layout.
    pub old_names: &'static [&'static str],
    /// The map of this layout, and its counter names.
    pub new: &'static str,
    pub new_names: &'static [&'static str],
}

/// Every layout this agent upgrades from.
pub const PREDECESSORS: [Predecessor; 3] = [
    // V1: 15 slots; `flow_table_full` moved among the non-verdicts, `too_big`,
    // `forged_dropped` and `restamped` are new, and V2 has spare slots.
    Predecessor {
        old: "SOPA_STAMP_V1",
        old_names: &[
            "stamped",
            "not_ipv4",
            "too_short",
            "bad_header",
            "has_options",
            "fragment",
            "not_tcp_udp",
            "not_fabric",
            "no_path",
            "mode_off",
            "flow_table_full",
            "adjust_failed",
            "pinned",
            "pin_expired",
            "flows_created",
        ],
        new: STAMP_STATS_MAP,
        new_names: &stamp_reason::NAMES,
    },
    // V1: 10 slots, the same counters; V2 has spare slots.
    Predecessor {
        old: "SOPA_STRIP_V1",
        old_names: &[
            "stripped",
            "no_option",
            "foreign_option",
            "bad_length",
            "not_ipv4",
            "too_short",
            "bad_header",
            "adjust_failed",
            "tcp_data",
            "tcp_reordered",
        ],
        new: STRIP_STATS_MAP,
        new_names: &strip_reason::NAMES,
    },
    // V1: 9 slots; `untrusted` is new, and V2 has spare slots.
    Predecessor {
        old: "SOPA_FWDST_V1",
        old_names: &[
            "redirected",
            "no_option",
            "not_decision",
            "unknown_hop",
            "ttl_expired",
            "not_ipv4",
            "too_short",
            "bad_header",
            "redirect_failed",
        ],
        new: FWD_STATS_MAP,
        new_names: &forward_reason::NAMES,
    },
];

/// Maps of an older layout this agent replaces without carrying their content over: the path
/// meter's counters before they counted bytes (`SOPA_SENT_V1`) and before each color had maps
/// of its own, per CPU, emptied after each reading (`SOPA_SENT_V2`, `SOPA_RECV_V1`), whose
/// periods start anew with every agent (its first readings are baselines, not reports), so
/// nothing in them is lost; the
/// encoding as an array written in place (V1), which the agent writes again from its table;
/// the encoding as a one-entry hash (V2), the lookup slots and the meter's configuration, now
/// one snapshot of settings (`SOPA_HOST_V1`) the agent writes again from its table and its
/// options; a switch's uSID configuration without the block (V1), which the switch agent
/// writes again from its plan. Their pins are removed once this agent's programs replaced the
/// old ones.
pub const RETIRED: [&str; 8] = [
    "SOPA_SENT_V1",
    "SOPA_SENT_V2",
    "SOPA_RECV_V1",
    "SOPA_ENCAP_V1",
    "SOPA_ENCAP_V2",
    "SOPA_LOOKUP_V1",
    "SOPA_METER_V1",
    "SOPA_USIDC_V1",
];

/// The previous layout's maps of the settings `SOPA_HOST_V1` now holds in one snapshot.
const PREVIOUS_ENCAP: &str = "SOPA_ENCAP_V2";
const PREVIOUS_LOOKUP: &str = "SOPA_LOOKUP_V1";
const PREVIOUS_METER: &str = "SOPA_METER_V1";

/// The settings a datapath of the previous layout holds in maps of their own (the encoding, a
/// one-entry hash; the lookup slots; the meter's configuration), as one snapshot; `None` where
/// its pins hold none of them.
pub fn previous_settings(pins: &Path) -> Result<Option<HostConfig>> {
    let [encap, slots, meter] =
        [PREVIOUS_ENCAP, PREVIOUS_LOOKUP, PREVIOUS_METER].map(|name| pins.join(name));
    if !encap.exists() && !slots.exists() && !meter.exists() {
        return Ok(None);
    }
    let open = |pin: &Path, name: &'static str| {
        MapData::from_pin(pin)
            .and_then(Map::from_map_data)
            .map_err(Error::map(name))
    };
    let mut settings = HostConfig::default();
    if encap.exists() {
        let map: HashMap<MapData, u32, Encap> = open(&encap, PREVIOUS_ENCAP)?
            .try_into()
            .map_err(Error::map(PREVIOUS_ENCAP))?;
        match map.get(&0, 0) {
            Ok(e) => settings.encap = e,
            // No entry: the IPv4 option, as a fresh snapshot says.
            Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(Error::map(PREVIOUS_ENCAP)(e)),
        }
    }
    if slots.exists() {
        let map: Array<MapData, u32> = open(&slots, PREVIOUS_LOOKUP)?
            .try_into()
            .map_err(Error::map(PREVIOUS_LOOKUP))?;
        for slot in 0..lookup::SLOTS {
            settings.lookup[slot as usize] =
                map.get(&slot, 0).map_err(Error::map(PREVIOUS_LOOKUP))?;
        }
    }
    if meter.exists() {
        let map: Array<MapData, MeterConfig> = open(&meter, PREVIOUS_METER)?
            .try_into()
            .map_err(Error::map(PREVIOUS_METER))?;
        settings.meter = map.get(&0, 0).map_err(Error::map(PREVIOUS_METER))?;
    }
    Ok(Some(settings))
}

/// Refuses pins of an unknown layout in the node's pin folder: a map of another `_Vn` would be
/// ignored by this agent while the old programs kept using it. Maps of a predecessor layout
/// are accepted (see [`Carry`]).
pub fn check(pins: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(pins) else {
        return Ok(());
    };
    let foreign: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("SOPA_"))
        .filter(|n| !super::MAP_NAMES.contains(&n.as_str()))
        .filter(|n| !PREDECESSORS.iter().any(|p| p.old == n))
        .filter(|n| !RETIRED.contains(&n.as_str()))
        .collect();
    if foreign.is_empty() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{} holds maps of another datapath layout ({}); stop the agent version that made them \
             with `sopa-agent detach`, or start this one with --reset to remove them",
            pins.display(),
            foreign.join(", ")
        )))
    }
}

/// Counters of predecessor maps being carried over into this layout's maps.
///
/// [`Carry::start`] runs after this agent loaded its programs and before it attaches them,
/// while nothing counts into this layout's maps yet: each carried counter is set to the old
/// one's value. [`Carry::finish`] runs once this agent's programs replaced the old ones: what
/// the old programs counted in between is added, and the old pins are removed. A crash in
/// between is repaired by the next start, which sets the counters again (counts are lost, never
/// doubled); the add can miss the increments of the few microseconds between reading and
/// writing a slot.
pub struct Carry {
    pins: std::path::PathBuf,
    /// Per predecessor present: the old values copied, per old index and CPU.
    copied: Vec<(&'static Predecessor, Vec<Vec<u64>>)>,
}

impl Carry {
    pub fn start(pins: &Path) -> Result<Self> {
        // The previous layout's settings, into this layout's fresh snapshot: until this agent
        // writes its own (at once from its table, or from the controller's first push when it
        // adopts a datapath), its programs carry paths as the old ones did.
        // Not fatal, as counters are not: this agent writes its own settings anyway.
        match previous_settings(pins).and_then(|s| {
            s.map_or(Ok(None), |s| {
                super::host_config::seed(pins, s).map(|w| w.then_some(s))
            })
        }) {
            Ok(Some(settings)) => info!(
                encoding = settings.encap.encoding,
                "the settings of the older datapath layout carried over"
            ),
            Ok(None) => {}
            Err(err) => {
                warn!(%err, "the settings of an older datapath layout could not be carried over")
            }
        }
        let mut copied = Vec::new();
        for p in &PREDECESSORS {
            let old_pin = pins.join(p.old);
            if !old_pin.exists() {
                continue;
            }
            let values = read_all(&open(&old_pin, p.old)?, p)?;
            let mut new = open(&pins.join(p.new), p.new)?;
            for (i, old_values) in values.iter().enumerate() {
                if let Some(j) = new_index(p, i) {
                    write(&mut new, p.new, j, old_values.clone())?;
                }
            }
            copied.push((p, values));
        }
        Ok(Self {
            pins: pins.to_owned(),
            copied,
        })
    }

    /// Adds what the old programs counted since [`Carry::start`] and removes the old pins,
    /// those of [`RETIRED`] maps too. Returns the names of the maps carried over.
    pub fn finish(self) -> Result<Vec<&'static str>> {
        let mut done = Vec::new();
        for (p, copied) in self.copied {
            let old_pin = self.pins.join(p.old);
            let now = read_all(&open(&old_pin, p.old)?, p)?;
            std::fs::remove_file(&old_pin)
                .map_err(|e| Error::io(format!("removing {}", old_pin.display()), e))?;
            let mut new = open(&self.pins.join(p.new), p.new)?;
            for (i, (now, then)) in now.iter().zip(&copied).enumerate() {
                let Some(j) = new_index(p, i) else { continue };
                if now == then {
                    continue;
                }
                let current = new.get(&j, 0).map_err(Error::map(p.new))?;
                let sum = current
                    .iter()
                    .zip(now.iter().zip(then))
                    .map(|(c, (n, t))| c + n.saturating_sub(*t))
                    .collect();
                write(&mut new, p.new, j, sum)?;
            }
            info!(
                from = p.old,
                to = p.new,
                "counters carried over to this layout"
            );
            done.push(p.old);
        }
        // Last: a retired pin left behind is harmless (accepted, removed at the next start).
        for name in RETIRED {
            let pin = self.pins.join(name);
            match std::fs::remove_file(&pin) {
                Ok(()) => info!(map = name, "a map of an older layout retired"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn!(map = name, %e, "a map of an older layout could not be removed"),
            }
        }
        Ok(done)
    }
}

/// This layout's index of the predecessor's counter `i`, by name.
fn new_index(p: &Predecessor, i: usize) -> Option<u32> {
    let name = p.old_names[i];
    p.new_names
        .iter()
        .position(|n| *n == name)
        .map(|j| j as u32)
}

/// Every counter of a predecessor map, per CPU.
fn read_all(map: &PerCpuArray<MapData, u64>, p: &Predecessor) -> Result<Vec<Vec<u64>>> {
    (0..p.old_names.len() as u32)
        .map(|i| {
            map.get(&i, 0)
                .map(|v| v.iter().copied().collect())
                .map_err(Error::map(p.old))
        })
        .collect()
}

fn write(
    map: &mut PerCpuArray<MapData, u64>,
    name: &'static str,
    index: u32,
    values: Vec<u64>,
) -> Result<()> {
    let values =
        PerCpuValues::try_from(values).map_err(|e| Error::io(format!("counters of {name}"), e))?;
    map.set(index, values, 0).map_err(Error::map(name))
}

fn open(pin: &Path, name: &'static str) -> Result<PerCpuArray<MapData, u64>> {
    MapData::from_pin(pin)
        .and_then(Map::from_map_data)
        .map_err(Error::map(name))?
        .try_into()
        .map_err(Error::map(name))
}
