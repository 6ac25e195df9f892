//! The switch's own reaction to ports that lose their carrier: the moment the port watcher
//! sees one go, `tc_forward`'s entries are rewritten from `sopa_topology::failover` (hop values
//! on the dead uplink moved to a live one, destinations no longer reachable down this switch's
//! own ports detoured), without waiting for the controller, which still removes the paths for
//! every host. In the SRv6 encoding its uSID rules are written instead, from
//! `sopa_topology::srv6_failover` (lists whose next switch is behind a dead port rewritten
//! around it). A port back up restores the plan's entries. IPv4 routes need nothing here: the
//! switch runs with `ignore_routes_with_linkdown`, so the kernel skips dead next hops itself.
//! IPv6 does not get that setting: the End locator's route is anchored on a port, and would be
//! skipped with it; the uSID rules treat a route with any dead next hop as dead instead.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use sopa_common::{
    maps::{FwdEntry, MAX_UPLINKS, Uplink, UsidRule, UsidRuleKey, fwd_kind, usid_repair},
    srv6::Block,
};
use sopa_topology::{
    LinkId, NodeId, Prefix, Topology,
    failover::{self, Reaction},
    paths::Failures,
    srv6::Encoding,
    srv6_failover,
};
use tracing::{info, warn};

use super::Port;
use crate::{
    datapath::maps::ForwardMaps,
    error::{Error, Result},
};

/// What the entries were computed from: the pushed plan and this switch's ports.
struct Installed {
    topo: Topology,
    me: NodeId,
    failures: Failures,
    ports: HashMap<LinkId, Port>,
    /// In the SRv6 encoding: the lists that reach this switch.
    srv6: Option<srv6_failover::Plan>,
}

/// `tc_forward`'s entries, kept in step with the plan and with the ports' carrier.
pub(crate) struct Repair {
    maps: ForwardMaps,
    plan: Option<Installed>,
    /// Ports (ifindex) whose carrier is down.
    down: BTreeSet<u32>,
    /// How many, for the metrics (read without this lock).
    down_count: std::sync::Arc<std::sync::atomic::AtomicU64>,
    written: BTreeMap<Prefix, FwdEntry>,
    /// The uSID rules written (SRv6), and the uSID and block they were written for.
    usid_written: BTreeMap<UsidRuleKey, UsidRule>,
    usid_me: (u16, Block),
    /// `tc_forward` consumes this switch's uSID itself (the kernel has no End route for it).
    usid_shift: bool,
    last: Reaction,
}

/// What the last write installed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Links of this switch whose port is down.
    pub dead: Vec<String>,
    pub substituted: usize,
    pub detours: usize,
    pub unreachable: Vec<Prefix>,
    /// SRv6: lists that need a repair here and that no rule gets around.
    pub unrepaired: usize,
    pub took: Duration,
}

impl Repair {
    /// Takes over `maps` as they are: entries a previous agent left (an adopted datapath) count
    /// as written, so the first plan removes those it no longer has.
    pub fn new(maps: ForwardMaps, usid_shift: bool) -> Result<Self> {
        let written = maps.entries()?;
        let usid_written = maps.usid_rules().unwrap_or_default();
        Ok(Self {
            maps,
            plan: None,
            down: BTreeSet::new(),
            down_count: Default::default(),
            written,
            usid_written,
            // Not a uSID of any switch: the first write sets the configuration whatever an
            // earlier agent left in it.
            usid_me: (u16::MAX, [0; 4]),
            usid_shift,
            last: Reaction::default(),
        })
    }

    /// The count of ports without carrier, kept current for the metrics.
    pub fn down_count(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        std::sync::Arc::clone(&self.down_count)
    }

    pub fn maps(&mut self) -> &mut ForwardMaps {
        &mut self.maps
    }

    pub fn maps_ref(&self) -> &ForwardMaps {
        &self.maps
    }

    /// Installs the plan of switch `me` (`None`: no entries at all), with its SRv6 repair plan
    /// in that encoding ([`srv6_plan`], built before the repair is locked).
    pub fn install(
        &mut self,
        plan: Option<(Topology, NodeId, Failures, HashMap<LinkId, Port>)>,
        srv6: Option<srv6_failover::Plan>,
    ) -> Result<Repaired> {
        self.plan = plan.map(|(topo, me, failures, ports)| Installed {
            topo,
            me,
            failures,
            ports,
            srv6,
        });
        self.write()
    }

    /// The controller's failures changed: the simulation of the rest of the fabric follows, and
    /// in the SRv6 encoding the repair plan built for them ([`srv6_plan`]).
    pub fn set_failures(
        &mut self,
        failures: &Failures,
        srv6: Option<srv6_failover::Plan>,
    ) -> Result<Repaired> {
        match self.plan.as_mut() {
            Some(p) => {
                p.failures = failures.clone();
                p.srv6 = srv6;
            }
            None => return Ok(Repaired::default()),
        }
        self.write()
    }

    /// Port `ifindex`'s carrier is `up`; `Ok(None)` if nothing changed.
    pub fn port(&mut self, ifindex: u32, up: bool) -> Result<Option<Repaired>> {
        let changed = if up {
            self.down.remove(&ifindex)
        } else {
            self.down.insert(ifindex)
        };
        if !changed {
            return Ok(None);
        }
        self.down_count
            .store(self.down.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.write().map(Some)
    }

    /// Entries for the plan and the dead ports, written new and changed first, then the stale
    /// ones removed: a destination keeps an entry throughout unless it no longer has one.
    fn write(&mut self) -> Result<Repaired> {
        let started = Instant::now();
        let Some(p) = &self.plan else {
            self.replace(BTreeMap::new())?;
            self.replace_usid((0, [0; 4]), BTreeMap::new())?;
            self.last = Reaction::default();
            return Ok(Repaired::default());
        };
        let g = p.topo.graph();
        // Ports without carrier, and links of the plan no interface here carries (nothing can
        // be sent by them either).
        let dead: BTreeSet<LinkId> = g
            .ports(p.me)
            .iter()
            .map(|(l, _)| *l)
            .filter(|l| {
                p.ports
                    .get(l)
                    .is_none_or(|port| self.down.contains(&port.ifindex))
            })
            .collect();
        if let Some(plan) = &p.srv6 {
            let reaction = plan.react(&p.topo, &dead);
            let rules = reaction
                .rules
                .iter()
                .map(|r| {
                    let mut with = [0; usid_repair::MAX_WITH];
                    for (w, u) in with.iter_mut().zip(&r.with) {
                        *w = *u;
                    }
                    (
                        UsidRuleKey {
                            next: r.next,
                            after: r.after,
                        },
                        UsidRule {
                            replace: r.replace,
                            len: r.with.len().min(usid_repair::MAX_WITH) as u8,
                            detour: u8::from(r.detour),
                            _pad: 0,
                            with,
                        },
                    )
                })
                .collect();
            let dead: Vec<String> = dead.iter().map(|l| p.topo.graph().link_name(*l)).collect();
            let me = (plan.usid(), p.topo.usid_block());
            self.replace(BTreeMap::new())?;
            self.replace_usid(me, rules)?;
            if !reaction.unrepaired.is_empty() {
                warn!(
                    ?dead,
                    lists = reaction.unrepaired.len(),
                    "no rewrite gets these uSID lists around the dead ports: their packets are lost here until the controller moves the hosts' paths"
                );
            }
            self.last = Reaction::default();
            return Ok(Repaired {
                dead,
                substituted: reaction.substituted(),
                detours: reaction.detours(),
                unreachable: Vec::new(),
                unrepaired: reaction.unrepaired.len(),
                took: started.elapsed(),
            });
        }
        let reaction = failover::react(&p.topo, p.me, &p.failures, &dead);
        let uplink = |l: &LinkId| {
            p.ports
                .get(l)
                .map(|port| Uplink {
                    ifindex: port.ifindex,
                    nexthop: u32::from_ne_bytes(port.neighbour.octets()),
                })
                .ok_or_else(|| {
                    Error::Config(format!(
                        "the plan names link {} that has no port here",
                        g.link_name(*l)
                    ))
                })
        };
        let mut entries = BTreeMap::new();
        for d in &reaction.decisions {
            let mut e = FwdEntry::PASS;
            e.hop_byte = d.hop_byte;
            e.count = d.uplinks.len().min(MAX_UPLINKS) as u8;
            for (slot, l) in e.uplinks.iter_mut().zip(&d.uplinks) {
                *slot = uplink(l)?;
            }
            entries.insert(d.prefix, e);
        }
        for d in &reaction.detours {
            let mut e = FwdEntry::PASS;
            e.kind = fwd_kind::DETOUR;
            e.count = 1;
            if let Some((byte, value)) = d.rewrite {
                e.hop_byte = byte;
                e.value = value;
            }
            e.uplinks[0] = uplink(&d.link)?;
            entries.insert(d.prefix, e);
        }
        for prefix in &reaction.unreachable {
            let mut e = FwdEntry::PASS;
            e.kind = fwd_kind::UNREACHABLE;
            entries.insert(*prefix, e);
        }
        let dead: Vec<String> = dead.iter().map(|l| g.link_name(*l)).collect();
        self.replace_usid((0, [0; 4]), BTreeMap::new())?;
        self.replace(entries)?;
        let repaired = Repaired {
            dead,
            substituted: reaction.substituted,
            detours: reaction.detours.len(),
            unreachable: reaction.unreachable.clone(),
            unrepaired: 0,
            took: started.elapsed(),
        };
        if !repaired.unreachable.is_empty() && repaired.unreachable != self.last.unreachable {
            warn!(
                dead = ?repaired.dead,
                unreachable = ?repaired.unreachable,
                "no live way from this switch to these destinations: their packets are dropped here until the controller moves the hosts' paths"
            );
        }
        self.last = reaction;
        Ok(repaired)
    }

    /// Makes the uSID rules `rules` for this switch's uSID and block `me` (unchanged ones are
    /// not written again).
    fn replace_usid(
        &mut self,
        me: (u16, Block),
        rules: BTreeMap<UsidRuleKey, UsidRule>,
    ) -> Result<()> {
        if (me, &rules) == (self.usid_me, &self.usid_written) {
            return Ok(());
        }
        self.maps
            .set_usid_rules(me.0, me.1, self.usid_shift, &rules)?;
        self.usid_me = me;
        self.usid_written = rules;
        Ok(())
    }

    fn replace(&mut self, entries: BTreeMap<Prefix, FwdEntry>) -> Result<()> {
        for (prefix, e) in &entries {
            if self.written.get(prefix) != Some(e) {
                self.maps.set(prefix, e)?;
                self.written.insert(*prefix, *e);
            }
        }
        let stale: Vec<Prefix> = self
            .written
            .keys()
            .filter(|p| !entries.contains_key(p))
            .copied()
            .collect();
        for prefix in stale {
            self.maps.remove(&prefix)?;
            self.written.remove(&prefix);
        }
        Ok(())
    }
}

/// The SRv6 repair's plan of switch `me` under `failures` in `encoding` (`None` in the
/// option's). Built before the repair is locked: it takes long at scale (0.7 s at k=16), and
/// a port event waits for the lock.
pub(crate) fn srv6_plan(
    topo: &Topology,
    me: NodeId,
    failures: &Failures,
    encoding: Encoding,
) -> Result<Option<srv6_failover::Plan>> {
    if encoding != Encoding::Srv6 {
        return Ok(None);
    }
    srv6_failover::Plan::new(topo, me, failures)
        .map(Some)
        .map_err(|e| Error::Config(format!("the SRv6 repair of this switch: {e}")))
}

/// Logs one repair of the port watcher: `received` when the link event arrived. The wall
/// clock times let a benchmark set the repair against the moment it failed the port.
pub(crate) fn log(port: &str, up: bool, r: &Repaired, received: std::time::SystemTime) {
    let us = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    };
    info!(
        port,
        up,
        dead = ?r.dead,
        substituted = r.substituted,
        detours = r.detours,
        unrepaired = r.unrepaired,
        took_us = r.took.as_micros() as u64,
        received_unix_us = us(received),
        written_unix_us = us(std::time::SystemTime::now()),
        "port changed: tc_forward repaired locally"
    );
}
