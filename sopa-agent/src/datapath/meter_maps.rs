//! The path meter's maps: its configuration, the color `tc_stamp` marks with, the racks marks
//! are counted from, and the counters of each color (`sopa_common::maps::meter`).
//!
//! The counters are per-CPU hashes, one per color and direction. Half a period after a period
//! ends, nothing counts into its color's maps any more (its packets have arrived, the next
//! period of that color has not begun): [`MeterCounters::take`] reads them and empties them,
//! with one batched lookup-and-delete per map, on a handle of its own, holding no lock a table
//! push needs. So a map only ever holds the keys of one period, however many racks and paths
//! the host talks to over its life.

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsFd as _, BorrowedFd},
    sync::Arc,
};

use aya::maps::{Array, IterableMap, Map, MapData, MapError, PerCpuHashMap};
use sopa_common::maps::{MeterConfig, MeterKey, MeterPeer, MeterSent, meter};

use super::{
    grace::{Grace, Guarded},
    host_config::SharedHost,
    maps::{MapSet, map_err},
    syscall,
};
use crate::{
    error::{Error, Result},
    path_table::{PathTable, Prefix},
};

/// The path meter's counters of one color: (sent, received), summed over CPUs.
pub type MeterCounts = (Vec<(MeterKey, MeterSent)>, Vec<(MeterKey, u64)>);

/// The path meter's maps (absent in the pins of a datapath an older agent left).
pub struct MeterMaps {
    /// The settings that hold the meter's configuration.
    host: SharedHost,
    counters: MeterCounters,
    /// The period's color, an array of one u32 (absent where the programs read the clock
    /// themselves).
    color: Option<MapData>,
    /// The racks marks are counted from (absent in the pins of an older datapath, which counts
    /// every mark).
    peers: Option<Guarded<u32, MeterPeer>>,
}

impl MeterMaps {
    /// `sent` and `received`: each color's map, in color order.
    pub(super) fn from_maps(
        host: SharedHost,
        sent: [Map; 2],
        received: [Map; 2],
        color: Option<Map>,
        peers: Option<Map>,
        grace: &Arc<Grace>,
    ) -> Result<Self> {
        Ok(Self {
            peers: peers
                .map(|m| {
                    m.try_into()
                        .map_err(map_err(meter::PEERS_MAP))
                        .map(|m| Guarded::new(m, meter::PEERS_MAP, Arc::clone(grace)))
                })
                .transpose()?,
            host,
            counters: MeterCounters::from_maps(sent, received)?,
            color: match color {
                Some(Map::Array(data)) => Some(data),
                Some(_) => {
                    return Err(Error::map(meter::COLOR_MAP)(MapError::InvalidName {
                        name: format!("{} is not an array", meter::COLOR_MAP),
                    }));
                }
                None => None,
            },
        })
    }
}

/// The path meter's color, on a handle of its own: the agent turns it at every period's start,
/// on time whatever holds the [`MapSet`].
pub struct MeterColor(Array<MapData, u32>);

impl MeterColor {
    /// Sets the color `tc_stamp` marks and counts packets with from now on.
    pub fn set(&mut self, color: u8) -> Result<()> {
        self.0
            .set(0, u32::from(color & 1), 0)
            .map_err(map_err(meter::COLOR_MAP))
    }
}

/// The meter's counter maps of both colors, on handles of their own (see the module's words).
pub struct MeterCounters {
    sent: [PerCpuHashMap<MapData, MeterKey, MeterSent>; 2],
    received: [PerCpuHashMap<MapData, MeterKey, u64>; 2],
}

impl MeterCounters {
    fn from_maps(sent: [Map; 2], received: [Map; 2]) -> Result<Self> {
        let [s0, s1] = sent;
        let [r0, r1] = received;
        let [n0, n1] = meter::SENT_MAPS;
        let [m0, m1] = meter::RECEIVED_MAPS;
        Ok(Self {
            sent: [
                s0.try_into().map_err(map_err(n0))?,
                s1.try_into().map_err(map_err(n1))?,
            ],
            received: [
                r0.try_into().map_err(map_err(m0))?,
                r1.try_into().map_err(map_err(m1))?,
            ],
        })
    }

    /// Other handles on the same maps.
    pub fn try_clone(&self) -> Result<Self> {
        fn dup<V: aya::Pod>(
            map: &PerCpuHashMap<MapData, MeterKey, V>,
            name: &'static str,
        ) -> Result<PerCpuHashMap<MapData, MeterKey, V>> {
            let fd = map_fd(map)
                .try_clone_to_owned()
                .map_err(|e| Error::io(format!("duplicating the fd of {name}"), e))?;
            let data = MapData::from_fd(fd).map_err(map_err(name))?;
            PerCpuHashMap::try_from(Map::PerCpuHashMap(data)).map_err(map_err(name))
        }
        let (s, r) = (meter::SENT_MAPS, meter::RECEIVED_MAPS);
        Ok(Self {
            sent: [dup(&self.sent[0], s[0])?, dup(&self.sent[1], s[1])?],
            received: [dup(&self.received[0], r[0])?, dup(&self.received[1], r[1])?],
        })
    }

    /// The counters of `color` as they stand, left in place.
    pub fn peek(&self, color: u8) -> Result<MeterCounts> {
        fn read<V: aya::Pod + Default + Copy>(
            map: &PerCpuHashMap<MapData, MeterKey, V>,
            name: &'static str,
            add: impl Fn(&mut V, V),
        ) -> Result<Vec<(MeterKey, V)>> {
            map.iter()
                // An entry the reader emptied between listing its key and reading it is gone.
                .filter(|e| !matches!(e, Err(MapError::KeyNotFound)))
                .map(|e| {
                    e.map(|(k, per_cpu)| {
                        let mut sum = V::default();
                        for v in per_cpu.iter() {
                            add(&mut sum, *v);
                        }
                        (k, sum)
                    })
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(map_err(name))
        }
        let c = usize::from(color & 1);
        Ok((
            read(&self.sent[c], meter::SENT_MAPS[c], add_sent)?,
            read(&self.received[c], meter::RECEIVED_MAPS[c], |s, v| *s += v)?,
        ))
    }

    /// Reads the counters of `color` and empties its maps: one batched lookup-and-delete
    /// per map (and another per 4,096 keys). Only while nothing counts into that color (half a
    /// period after its period ended): a packet counted between the reading of its key and
    /// the delete would be lost.
    pub fn take(&self, color: u8) -> Result<MeterCounts> {
        let c = usize::from(color & 1);
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| Error::io(what.to_owned(), e))?;
        Ok((
            take(&self.sent[c], meter::SENT_MAPS[c], cpus, add_sent)?,
            take(&self.received[c], meter::RECEIVED_MAPS[c], cpus, |s, v| {
                *s += v
            })?,
        ))
    }
}

fn add_sent(sum: &mut MeterSent, v: MeterSent) {
    sum.packets += v.packets;
    sum.bytes += v.bytes;
}

fn map_fd<V: aya::Pod>(map: &PerCpuHashMap<MapData, MeterKey, V>) -> BorrowedFd<'_> {
    IterableMap::map(map).fd().as_fd()
}

/// Every entry of a per-CPU map of `cpus` CPUs, summed over them, removed from the map.
fn take<V: aya::Pod + Default + Copy>(
    map: &PerCpuHashMap<MapData, MeterKey, V>,
    name: &'static str,
    cpus: usize,
    add: impl Fn(&mut V, V),
) -> Result<Vec<(MeterKey, V)>> {
    let stride = size_of::<V>().next_multiple_of(8);
    let mut out = Vec::new();
    syscall::lookup_and_delete_batch(
        map_fd(map),
        size_of::<MeterKey>(),
        stride * cpus,
        |keys, values| {
            // A hash map returns each key once: each batch's values are summed over the CPUs
            // as it comes, in the one buffer the batches reuse.
            out.extend(
                keys.chunks_exact(size_of::<MeterKey>())
                    .zip(values.chunks_exact(stride * cpus))
                    .map(|(key, per_cpu)| {
                        // SAFETY: MeterKey and V are plain integers (Pod); the chunks are
                        // their sizes (read unaligned: the buffers are bytes).
                        let key: MeterKey =
                            unsafe { std::ptr::read_unaligned(key.as_ptr().cast()) };
                        let mut sum = V::default();
                        for cpu in per_cpu.chunks_exact(stride) {
                            // SAFETY: as above.
                            add(&mut sum, unsafe {
                                std::ptr::read_unaligned(cpu.as_ptr().cast())
                            });
                        }
                        (key, sum)
                    }),
            )
        },
    )
    .map_err(|e| Error::io(format!("reading and emptying {name}"), e))?;
    Ok(out)
}

impl MapSet {
    fn meter_maps(&self) -> Option<&MeterMaps> {
        self.meter.as_ref()
    }

    /// The path meter's configuration (off where the datapath has no meter).
    pub fn meter_config(&self) -> Result<MeterConfig> {
        match self.meter_maps() {
            Some(m) => Ok(m.host.get()?.meter),
            None => Ok(MeterConfig::default()),
        }
    }

    /// Sets the meter's period (0: off), keeping its rack mask.
    pub fn set_meter_period(&mut self, period_ns: u64) -> Result<()> {
        let Some(m) = self.meter.as_mut() else {
            return Ok(());
        };
        m.host.update(|h| h.meter.period_ns = period_ns)
    }

    /// Sets the meter's rack mask from a path table: the longest of its prefixes, so no two
    /// racks share a counter (an address under a shorter prefix is counted by several keys,
    /// which the agent adds up again).
    pub(super) fn set_meter_mask(&mut self, table: &PathTable) -> Result<()> {
        let Some(m) = self.meter.as_mut() else {
            return Ok(());
        };
        let len = table.destinations.keys().map(|p| p.len).max().unwrap_or(32);
        let mask = u32::from(sopa_topology::prefix::mask(
            std::net::Ipv4Addr::BROADCAST,
            len,
        ));
        // Network order, as the packet holds the address.
        m.host
            .update(|h| h.meter.rack_mask = u32::from_ne_bytes(mask.to_be_bytes()))
    }

    /// Sets the racks the meter counts marks from: each rack's prefix, as the rack mask cuts
    /// it (a rack under a shorter prefix than the mask is one entry per masked prefix, as its
    /// counters are), with the hop limits of its paths here. Entries of racks no longer given
    /// are removed after the new ones are in (a packet finds its rack's entry throughout), and
    /// a changed entry is replaced whole ([`super::grace`]).
    pub fn set_meter_peers(&mut self, peers: &[(Prefix, MeterPeer)]) -> Result<()> {
        let Some(m) = self.meter.as_mut() else {
            return Ok(());
        };
        let config = m.host.get()?.meter;
        let Some(map) = m.peers.as_mut() else {
            return Ok(());
        };
        let mask_len = u32::from_be_bytes(config.rack_mask.to_ne_bytes()).leading_ones() as u8;
        let mut want = StdHashMap::new();
        for (prefix, peer) in peers {
            let base = u32::from(prefix.addr);
            let extra = mask_len.saturating_sub(prefix.len);
            if extra > 12 {
                return Err(Error::Config(format!(
                    "rack {prefix} is 2^{extra} meter keys under the /{mask_len} rack mask: give the fabric's racks prefixes of one length"
                )));
            }
            for i in 0..(1u32 << extra) {
                let addr = base | (i << (32 - u32::from(mask_len)));
                want.insert(u32::from_ne_bytes(addr.to_be_bytes()), *peer);
            }
        }
        map.sync_in_place(&want)
    }

    /// Whether this datapath meters paths (the pins of an older agent's do not).
    pub fn has_meter(&self) -> bool {
        self.meter.is_some()
    }

    /// A handle of its own on the meter's color, where the programs take the color from the
    /// agent (`None`: no meter, or programs that read the clock themselves).
    pub fn meter_color(&self) -> Result<Option<MeterColor>> {
        let Some(color) = self.meter_maps().and_then(|m| m.color.as_ref()) else {
            return Ok(None);
        };
        let fd = color
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::io(format!("duplicating the fd of {}", meter::COLOR_MAP), e))?;
        let data = MapData::from_fd(fd).map_err(map_err(meter::COLOR_MAP))?;
        let map = Array::try_from(Map::Array(data)).map_err(map_err(meter::COLOR_MAP))?;
        Ok(Some(MeterColor(map)))
    }

    /// Handles of their own on the meter's counters (`None`: no meter), for its reader.
    pub fn meter_counters(&self) -> Result<Option<MeterCounters>> {
        self.meter_maps()
            .map(|m| m.counters.try_clone())
            .transpose()
    }

    /// The meter's counters of `color` as they stand: (sent, received).
    pub fn meter_counts(&self, color: u8) -> Result<MeterCounts> {
        match self.meter_maps() {
            Some(m) => m.counters.peek(color),
            None => Ok((Vec::new(), Vec::new())),
        }
    }
}
