//! The host agent's discovery in the entropy encoding: on a thread of its own, every
//! destination host of the other racks is probed for each next header the switches hash
//! (encapsulated IPv4, TCP, UDP), one destination after another; the labels found are written
//! as they come (a destination without its labels yet passes unlabelled, as plain ECMP would
//! send it), and a summary goes to `entropy.json` in the agent's run folder for `status`. A new
//! topology or failure starts it over (a hash-threshold switch moves healthy flows when a next
//! hop goes, so every label is probed again); the labels held stay until replaced. Under a
//! baseline source (`super::source`) the labels are drawn instead of probed, on the same thread
//! and schedule.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use sopa_common::{
    entropy::{NEXT_IPV4, PER_PACKET, PROBE_MARK},
    maps::EvKey,
    wire::{IPPROTO_TCP, IPPROTO_UDP},
};
use sopa_topology::{NodeId, NodeKind, Topology, entropy::Probed, paths::PathTable};
use tracing::{info, warn};

use super::{
    EntropyTable,
    discover::{Pace, Prober, Target, discover, labels},
    source::LabelSource,
};
use crate::datapath::maps::MapSet;

/// Where a running agent writes its discovery summary, in its run folder.
pub const SUMMARY_FILE: &str = "entropy.json";

/// One destination host's discovery, as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probed1 {
    pub host: String,
    #[serde(default = "unspecified")]
    pub address: Ipv4Addr,
    /// Paths the topology has to it.
    pub expected: usize,
    /// Paths found per next header ("ipv4", "tcp6", "udp6").
    pub found: BTreeMap<String, usize>,
    pub probes: u32,
    pub millis: u64,
}

fn unspecified() -> Ipv4Addr {
    Ipv4Addr::UNSPECIFIED
}

/// The discovery of one topology and set of failures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub generation: u64,
    /// Where the labels came from: probing, or a baseline's draw.
    #[serde(default)]
    pub source: LabelSource,
    pub done: bool,
    pub destinations: Vec<Probed1>,
    /// Destinations with fewer paths found than the topology has, by name: a named condition.
    pub incomplete: Vec<String>,
    /// Destinations probed again since, because a connection to them timed out
    /// (`super::loss`), in this generation.
    #[serde(default)]
    pub reprobed_for_loss: u64,
}

impl Summary {
    /// Enters `row` (replacing the destination's earlier one) and names it if incomplete.
    fn record(&mut self, row: Probed1) {
        match self.destinations.iter_mut().find(|d| d.host == row.host) {
            Some(d) => *d = row,
            None => self.destinations.push(row),
        }
        self.incomplete = self
            .destinations
            .iter()
            .filter(|d| d.found.values().any(|n| *n < d.expected))
            .map(|d| d.host.clone())
            .collect();
    }
}

/// The labels held and the discovery that finds them.
pub struct Discovery {
    table: Arc<Mutex<EntropyTable>>,
    generation: Arc<AtomicU64>,
    maps: Arc<Mutex<MapSet>>,
    summary: Arc<Mutex<Summary>>,
    summary_file: PathBuf,
    pace: Pace,
    source: Mutex<LabelSource>,
    /// What the last discovery ran for, to run again when the source changes, and its
    /// destination hosts.
    last: Mutex<Option<(Topology, NodeId, PathTable)>>,
    destinations: Mutex<BTreeSet<Ipv4Addr>>,
    /// Held while one destination host is probed: discoveries and reprobes take turns.
    probing: Arc<Mutex<()>>,
    /// Destination hosts a reprobe is under way for: asked again meanwhile, they are not
    /// queued twice.
    pending: Arc<Mutex<BTreeSet<Ipv4Addr>>>,
}

/// The next headers probed, with their names.
const CLASSES: [(u8, &str); 3] = [
    (NEXT_IPV4, "ipv4"),
    (IPPROTO_TCP, "tcp6"),
    (IPPROTO_UDP, "udp6"),
];

/// The hosts of each destination rack of `candidates`, with the rack's index: the switches
/// hash the destination address, so every host is probed.
fn destination_hosts(topo: &Topology, candidates: &PathTable) -> Vec<(usize, NodeId)> {
    let g = topo.graph();
    candidates
        .destinations
        .iter()
        .enumerate()
        .flat_map(|(i, d)| {
            (0..g.nodes.len() as NodeId)
                .filter(|h| g.node(*h).kind == NodeKind::Host)
                .filter(move |h| topo.rack_of(*h).is_ok_and(|r| r.tor == d.rack.tor))
                .map(move |h| (i, h))
        })
        .collect()
}

impl Discovery {
    /// Labels for the datapath of `maps`, its summary in `run_dir`, probing at `pace` when
    /// `source` is [`LabelSource::Discovered`].
    pub fn new(
        maps: Arc<Mutex<MapSet>>,
        run_dir: PathBuf,
        pace: Pace,
        source: LabelSource,
    ) -> Self {
        Self {
            table: Arc::new(Mutex::new(EntropyTable {
                source: Ipv6Addr::UNSPECIFIED,
                fabric6: Ipv6Addr::UNSPECIFIED,
                labels: BTreeMap::new(),
            })),
            generation: Arc::new(AtomicU64::new(0)),
            maps,
            summary: Arc::new(Mutex::new(Summary::default())),
            summary_file: run_dir.join(SUMMARY_FILE),
            pace,
            source: Mutex::new(source),
            last: Mutex::new(None),
            destinations: Mutex::new(BTreeSet::new()),
            probing: Arc::new(Mutex::new(())),
            pending: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    /// The table as it stands for host `src` of `topo`, its addresses the topology's (to
    /// write with a new path table).
    pub fn table_for(&self, topo: &Topology, src: NodeId) -> EntropyTable {
        let mut t = self.table.lock().expect("labels lock");
        t.source = topo.host_ipv6(src);
        t.fabric6 = sopa_topology::srv6::HOST6_PREFIX;
        t.clone()
    }

    /// The /96 of the fabric's IPv6 host addresses (unspecified before the first topology).
    pub fn fabric6(&self) -> Ipv6Addr {
        self.table.lock().expect("labels lock").fabric6
    }

    /// Whether `host` is a destination host of the last discovery.
    pub fn is_destination(&self, host: Ipv4Addr) -> bool {
        self.destinations
            .lock()
            .expect("destinations lock")
            .contains(&host)
    }

    /// The destination hosts found short of paths.
    pub fn incomplete(&self) -> Vec<Ipv4Addr> {
        let s = self.summary.lock().expect("summary lock");
        s.destinations
            .iter()
            .filter(|d| s.incomplete.contains(&d.host))
            .map(|d| d.address)
            .collect()
    }

    /// The labels' source.
    pub fn source(&self) -> LabelSource {
        *self.source.lock().expect("source lock")
    }

    /// Takes labels from `source` from now on: the last discovery runs again at once under it
    /// (if one ran; otherwise the first uses it). Returns whether it started one.
    pub fn set_source(&self, source: LabelSource) -> bool {
        *self.source.lock().expect("source lock") = source;
        let last = self.last.lock().expect("last lock").clone();
        match last {
            Some((topo, src, candidates)) => {
                self.restart(&topo, src, &candidates);
                true
            }
            None => false,
        }
    }

    /// Starts discovery over for `topo` as host `src` sees it under `candidates` (the paths
    /// alive); a discovery still running stops at its next destination.
    pub fn restart(&self, topo: &Topology, src: NodeId, candidates: &PathTable) {
        *self.last.lock().expect("last lock") = Some((topo.clone(), src, candidates.clone()));
        let g = topo.graph();
        *self.destinations.lock().expect("destinations lock") = destination_hosts(topo, candidates)
            .into_iter()
            .filter_map(|(_, h)| g.node(h).addr)
            .collect();
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.spawn(generation, None);
    }

    /// Stops probing and forgets the labels (the fabric left the entropy encoding): a
    /// discovery still running stops at its next destination, and nothing is probed again
    /// until the next [`Discovery::restart`].
    pub fn stop(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().expect("last lock") = None;
        self.destinations.lock().expect("destinations lock").clear();
        let mut t = self.table.lock().expect("labels lock");
        t.labels.clear();
        t.fabric6 = Ipv6Addr::UNSPECIFIED;
    }

    /// Probes the destination hosts `hosts` of the current discovery again (`for_loss`: because
    /// a connection to one timed out), each in turn with the discovery still running.
    pub fn reprobe(&self, hosts: BTreeSet<Ipv4Addr>, for_loss: bool) {
        if self.source() != LabelSource::Discovered {
            return;
        }
        let hosts: BTreeSet<Ipv4Addr> = {
            let mut pending = self.pending.lock().expect("pending lock");
            let new: BTreeSet<Ipv4Addr> = hosts.difference(&pending).copied().collect();
            pending.extend(&new);
            new
        };
        if hosts.is_empty() {
            return;
        }
        if for_loss {
            self.summary.lock().expect("summary lock").reprobed_for_loss += hosts.len() as u64;
        }
        info!(
            hosts = ?hosts,
            cause = if for_loss { "a connection timed out" } else { "paths missing" },
            "probing destinations again"
        );
        self.spawn(self.generation.load(Ordering::SeqCst), Some(hosts));
    }

    fn spawn(&self, generation: u64, only: Option<BTreeSet<Ipv4Addr>>) {
        let Some((topo, src, candidates)) = self.last.lock().expect("last lock").clone() else {
            return;
        };
        let job = Job {
            topo,
            src,
            candidates,
            generation,
            current: Arc::clone(&self.generation),
            table: Arc::clone(&self.table),
            maps: Arc::clone(&self.maps),
            summary: Arc::clone(&self.summary),
            summary_file: self.summary_file.clone(),
            pace: self.pace,
            source: self.source(),
            only,
            probing: Arc::clone(&self.probing),
            pending: Arc::clone(&self.pending),
        };
        std::thread::Builder::new()
            .name("sopa-probe".into())
            .spawn(move || job.run())
            .map(drop)
            .unwrap_or_else(|e| warn!(%e, "could not start the entropy discovery"));
    }
}

fn ev_key(dst4: Ipv4Addr, next: u8, hops: sopa_topology::paths::Hops) -> EvKey {
    EvKey {
        daddr: dst4.octets(),
        next,
        _pad: 0,
        hops: [hops.hop0, hops.hop1],
    }
}

/// The label of each of `probed`'s paths that `found` found, for next header `next` to `dst4`.
fn paths_of(
    found: &super::discover::Found,
    probed: &Probed,
    routers: &std::collections::HashMap<Ipv6Addr, NodeId>,
    dst4: Ipv4Addr,
    next: u8,
) -> BTreeMap<EvKey, u32> {
    found
        .paths
        .iter()
        .filter_map(|(signature, label)| {
            probed
                .path_of(routers, signature)
                .map(|hops| (ev_key(dst4, next, hops), *label))
        })
        .collect()
}

/// `class` with every path of `probed` it lacks (its probes died, or the routers did not
/// answer) given a found path's label, in turn: the missing path's share of the round robin
/// goes where packets arrive, not to the switches' own hash. None found: nothing (the class
/// leaves unlabelled).
fn shared(
    mut class: BTreeMap<EvKey, u32>,
    probed: &Probed,
    dst4: Ipv4Addr,
    next: u8,
) -> BTreeMap<EvKey, u32> {
    let shares: Vec<u32> = class.values().copied().collect();
    if shares.is_empty() {
        return class;
    }
    let missing: Vec<EvKey> = probed
        .paths
        .iter()
        .map(|(hops, _)| ev_key(dst4, next, *hops))
        .filter(|k| !class.contains_key(k))
        .collect();
    for (j, k) in missing.into_iter().enumerate() {
        class.insert(k, shares[j % shares.len()]);
    }
    class
}

struct Job {
    topo: Topology,
    src: NodeId,
    candidates: PathTable,
    generation: u64,
    current: Arc<AtomicU64>,
    table: Arc<Mutex<EntropyTable>>,
    maps: Arc<Mutex<MapSet>>,
    summary: Arc<Mutex<Summary>>,
    summary_file: PathBuf,
    pace: Pace,
    source: LabelSource,
    /// Only these destination hosts (a reprobe), or all (a discovery).
    only: Option<BTreeSet<Ipv4Addr>>,
    probing: Arc<Mutex<()>>,
    pending: Arc<Mutex<BTreeSet<Ipv4Addr>>>,
}

impl Drop for Job {
    /// A reprobe's hosts may be asked for again once it ends, however it ends.
    fn drop(&mut self) {
        if let Some(only) = &self.only {
            let mut pending = self.pending.lock().expect("pending lock");
            for h in only {
                pending.remove(h);
            }
        }
    }
}

impl Job {
    fn stale(&self) -> bool {
        self.current.load(Ordering::SeqCst) != self.generation
    }

    fn run(self) {
        // Only discovery probes: a baseline draws its labels.
        let mut prober = match self.source {
            LabelSource::Discovered => match Prober::open(PROBE_MARK) {
                Ok(p) => Some(p),
                Err(e) => {
                    warn!(%e, "entropy discovery cannot probe: every packet leaves unlabelled");
                    return;
                }
            },
            LabelSource::Blind | LabelSource::PerPacket => None,
        };
        if self.only.is_none() {
            *self.summary.lock().expect("summary lock") = Summary {
                generation: self.generation,
                source: self.source,
                ..Summary::default()
            };
        }
        let g = self.topo.graph();
        let routers = sopa_topology::entropy::routers(&self.topo);
        let mut seed = (self.generation as u32) ^ (std::process::id() << 12);
        // (rack index, destination host, its IPv4 address) of this job.
        let hosts: Vec<(usize, NodeId, Ipv4Addr)> = destination_hosts(&self.topo, &self.candidates)
            .into_iter()
            .map(|(i, h)| (i, h, g.node(h).addr.unwrap_or(Ipv4Addr::UNSPECIFIED)))
            .filter(|(_, _, a)| self.only.as_ref().is_none_or(|o| o.contains(a)))
            .collect();
        let mut racks: BTreeMap<usize, Probed> = BTreeMap::new();
        for (i, _, _) in &hosts {
            racks
                .entry(*i)
                .or_insert_with(|| Probed::of(&self.topo, &self.candidates, *i));
        }
        // Probing again (a connection losing, or paths missing): first the labels held, one
        // round of probes each, for every host of the job. Those whose probes still come
        // back keep their paths and take the others' shares at once; the full searches follow.
        if let (Some(prober), Some(_)) = (prober.as_mut(), &self.only) {
            for (i, dst, dst4) in &hosts {
                let probed = &racks[i];
                let _turn = self.probing.lock().expect("probing lock");
                if self.stale() {
                    return;
                }
                for (next, _) in CLASSES {
                    let held: BTreeSet<u32> = self
                        .table
                        .lock()
                        .expect("labels lock")
                        .labels
                        .iter()
                        .filter(|(k, _)| k.daddr == dst4.octets() && k.next == next)
                        .map(|(_, l)| *l)
                        .collect();
                    let target = self.target(*dst, next, probed);
                    if let Ok(found) = discover(prober, &target, &self.pace, &mut held.into_iter())
                    {
                        let kept = paths_of(&found, probed, &routers, *dst4, next);
                        self.write(shared(kept, probed, *dst4, next), *dst4, next);
                    }
                }
            }
        }
        for (i, dst, dst4) in &hosts {
            let probed = &racks[i];
            let _turn = self.probing.lock().expect("probing lock");
            if self.stale() {
                return;
            }
            let mut row = Probed1 {
                host: g.name(*dst).to_owned(),
                address: *dst4,
                expected: probed.paths.len(),
                found: BTreeMap::new(),
                probes: 0,
                millis: 0,
            };
            for (next, name) in CLASSES {
                seed = seed.wrapping_add(0x9E37_79B9);
                let Some(prober) = prober.as_mut() else {
                    // A baseline: per path a random label, or the mark of a fresh one per
                    // packet.
                    let mut drawn = labels(seed);
                    let class: BTreeMap<EvKey, u32> = probed
                        .paths
                        .iter()
                        .map(|(hops, _)| {
                            let label = match self.source {
                                LabelSource::PerPacket => PER_PACKET,
                                _ => drawn.next().expect("a million labels"),
                            };
                            (ev_key(*dst4, next, *hops), label)
                        })
                        .collect();
                    row.found.insert(name.to_owned(), class.len());
                    self.write(class, *dst4, next);
                    continue;
                };
                let target = self.target(*dst, next, probed);
                let mut found = match discover(prober, &target, &self.pace, &mut labels(seed)) {
                    Ok(f) => f,
                    Err(e) => {
                        // The class keeps the labels it has.
                        warn!(%e, host = %row.host, class = name, "probing failed");
                        row.found.insert(name.to_owned(), 0);
                        continue;
                    }
                };
                // Short of paths: once more at once, with other labels. The first replies of
                // a router can be lost while it resolves its way back (measured at a fabric's
                // start: one path of two found, every probe of the other unanswered).
                if !found.complete(&target) {
                    seed = seed.wrapping_add(0x9E37_79B9);
                    if let Ok(more) = discover(prober, &target, &self.pace, &mut labels(seed)) {
                        found.probes += more.probes;
                        found.took += more.took;
                        for (signature, label) in more.paths {
                            found.paths.entry(signature).or_insert(label);
                        }
                    }
                }
                row.probes += found.probes;
                row.millis += found.took.as_millis() as u64;
                let class = paths_of(&found, probed, &routers, *dst4, next);
                row.found.insert(name.to_owned(), class.len());
                // Nothing answered (replies lost, a router's limit): the class keeps the
                // labels it has rather than leaving unlabelled.
                if !class.is_empty() {
                    self.write(shared(class, probed, *dst4, next), *dst4, next);
                }
            }
            let mut summary = self.summary.lock().expect("summary lock");
            if summary.generation != self.generation {
                return;
            }
            summary.record(row);
            self.save(&summary);
        }
        if self.only.is_some() {
            return;
        }
        let mut summary = self.summary.lock().expect("summary lock");
        summary.done = true;
        self.save(&summary);
        info!(
            generation = self.generation,
            destinations = summary.destinations.len(),
            incomplete = summary.incomplete.len(),
            source = %self.source,
            "entropy discovery done"
        );
    }

    /// Destination host `dst` as the data of next header `next` to it travels.
    fn target(&self, dst: NodeId, next: u8, probed: &Probed) -> Target {
        let g = self.topo.graph();
        Target {
            src: self.topo.host_ipv6(self.src),
            dst: self.topo.host_ipv6(dst),
            src4: g.node(self.src).addr.unwrap_or(Ipv4Addr::UNSPECIFIED),
            dst4: g.node(dst).addr.unwrap_or(Ipv4Addr::UNSPECIFIED),
            next,
            hop_limits: probed.hop_limits.clone(),
            expected: probed.paths.len(),
        }
    }

    /// Replaces `dst4`'s labels of next header `next` with `found` in the table and the
    /// datapath; nothing once the job is stale (checked under the maps lock, so a newer
    /// discovery, or another encoding, writes after and the table is left as it set it).
    fn write(&self, found: BTreeMap<EvKey, u32>, dst4: Ipv4Addr, next: u8) {
        let mut maps = self.maps.lock().expect("maps lock");
        if self.stale() {
            return;
        }
        let table = {
            let mut t = self.table.lock().expect("labels lock");
            t.labels
                .retain(|k, _| k.daddr != dst4.octets() || k.next != next);
            t.labels.extend(found);
            t.clone()
        };
        if let Err(e) = maps.apply_entropy(Some(&table)) {
            warn!(%e, "writing the entropy labels");
        }
    }

    /// Writes the summary whole: a reader never sees half of it.
    fn save(&self, summary: &Summary) {
        let text = serde_json::to_string_pretty(summary).unwrap_or_default();
        let tmp = self.summary_file.with_extension("json.tmp");
        if let Err(e) =
            std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.summary_file))
        {
            warn!(%e, path = %self.summary_file.display(), "writing the discovery summary");
        }
    }
}

/// The pace the agent probes at: probes 2 ms apart, 300 ms for a label's replies, and (as
/// `discover` raises it to) 8 labels per expected path in a row without a new path before
/// giving up on the rest.
pub fn default_pace() -> Pace {
    Pace {
        interval: Duration::from_millis(2),
        wait: Duration::from_millis(300),
        patience: 8,
    }
}
