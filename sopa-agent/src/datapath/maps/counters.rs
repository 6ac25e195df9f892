//! Per-CPU counter maps summed over CPUs, and read by name across datapath layouts.

use aya::maps::{MapData, PerCpuArray};
use sopa_common::maps::{
    HOP_STATS_MAP, STAMP_STATS_MAP, STRIP_STATS_MAP, stamp_reason, strip_reason,
};

use crate::error::Result;

use super::{MapSet, map_err};

/// Counters of one program, summed over CPUs, in index order.
pub type Counters = Vec<u64>;

impl MapSet {
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

/// The counters of a map whose slots are named `names`, summed over CPUs and placed by name
/// at their index in `wanted` (a counter `names` lacks reads 0).
pub(super) fn by_name(
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

pub(super) fn sum_all(
    map: &PerCpuArray<MapData, u64>,
    len: u32,
    name: &'static str,
) -> Result<Counters> {
    (0..len)
        .map(|i| {
            map.get(&i, 0)
                .map(|values| values.iter().sum())
                .map_err(map_err(name))
        })
        .collect()
}
