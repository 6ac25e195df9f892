//! Map layouts across agent versions. A map whose layout changes gets a new `_Vn` name, so a
//! pin of another layout is never reused by mistake. An agent refuses a pin folder holding maps
//! of a layout it does not know, except the predecessors listed here, whose content it carries
//! over: an agent of that older layout is then replaced hitlessly (its programs are replaced in
//! place through their links and use the old maps until that moment).

use std::path::Path;

use aya::maps::{Map, MapData, PerCpuArray, PerCpuValues};
use sopa_common::maps::{STAMP_STATS_MAP, STRIP_STATS_MAP, stamp_reason, strip_reason};
use tracing::info;

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
pub const PREDECESSORS: [Predecessor; 2] = [
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
];

/// Refuses pins of an unknown layout in the node's pin folder: a map of another `_Vn` would be
/// ignored by this agent while the old programs kept using it. Maps of a predecessor layout
/// are accepted (see [`carry_over`]).
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

/// Carries the counters of every predecessor map pinned in `pins` over into this layout's map
/// (by counter name, CPU by CPU), and removes the old pin. Call it once this agent's programs
/// have replaced the old ones, so nothing counts into the old map any more. The old pin goes
/// before the counts are added: a crash in between loses those counts, never doubles them.
/// Returns the names of the maps carried over.
pub fn carry_over(pins: &Path) -> Result<Vec<&'static str>> {
    let mut done = Vec::new();
    for p in &PREDECESSORS {
        let old_pin = pins.join(p.old);
        if !old_pin.exists() {
            continue;
        }
        let old = open(&old_pin, p.old)?;
        let mut carried = Vec::with_capacity(p.old_names.len());
        for (i, name) in p.old_names.iter().enumerate() {
            let values = old.get(&(i as u32), 0).map_err(Error::map(p.old))?;
            if let Some(j) = p.new_names.iter().position(|n| n == name) {
                carried.push((j as u32, values.iter().copied().collect::<Vec<u64>>()));
            }
        }
        drop(old);
        std::fs::remove_file(&old_pin)
            .map_err(|e| Error::io(format!("removing {}", old_pin.display()), e))?;
        let mut new = open(&pins.join(p.new), p.new)?;
        for (j, old_values) in carried {
            let current = new.get(&j, 0).map_err(Error::map(p.new))?;
            let sum: Vec<u64> = current
                .iter()
                .zip(old_values.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a + b)
                .collect();
            let sum = PerCpuValues::try_from(sum)
                .map_err(|e| Error::io(format!("counters of {}", p.new), e))?;
            new.set(j, sum, 0).map_err(Error::map(p.new))?;
        }
        info!(
            from = p.old,
            to = p.new,
            "counters carried over to this layout"
        );
        done.push(p.old);
    }
    Ok(done)
}

fn open(pin: &Path, name: &'static str) -> Result<PerCpuArray<MapData, u64>> {
    MapData::from_pin(pin)
        .and_then(Map::from_map_data)
        .map_err(Error::map(name))?
        .try_into()
        .map_err(Error::map(name))
}
