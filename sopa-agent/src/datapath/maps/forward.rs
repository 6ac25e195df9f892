//! The switch role's maps: forwarding decisions, trusted ports, the SRv6 repair's rules and
//! their counters.

use std::path::Path;

use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray},
};
use sopa_common::maps::{
    FWD_MAP, FWD_STATS_MAP, FWD_UPLINK_STATS_MAP, FwdEntry, MAX_UPLINKS, TRUST_MAP,
    UsidRepairConfig, UsidRule, UsidRuleKey, forward_reason, usid_repair,
};

use crate::{
    error::{Error, Result},
    path_table::Prefix,
};

use super::{
    Counters,
    counters::{by_name, sum_all},
    key, map_err, prefix_of, remove_each,
};

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
        let (stats_pin, stats_names) =
            match crate::datapath::layout::PREDECESSORS.iter().find(|p| {
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
