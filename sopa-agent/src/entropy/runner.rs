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
    collections::BTreeMap,
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probed1 {
    pub host: String,
    /// Paths the topology has to it.
    pub expected: usize,
    /// Paths found per next header ("ipv4", "tcp6", "udp6").
    pub found: BTreeMap<String, usize>,
    pub probes: u32,
    pub millis: u64,
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
}

/// The labels held and the discovery that finds them.
pub struct Discovery {
    table: Arc<Mutex<EntropyTable>>,
    generation: Arc<AtomicU64>,
    maps: Arc<Mutex<MapSet>>,
    summary: PathBuf,
    pace: Pace,
    source: Mutex<LabelSource>,
    /// What the last discovery ran for, to run again when the source changes.
    last: Mutex<Option<(Topology, NodeId, PathTable)>>,
}

/// The next headers probed, with their names.
const CLASSES: [(u8, &str); 3] = [
    (NEXT_IPV4, "ipv4"),
    (IPPROTO_TCP, "tcp6"),
    (IPPROTO_UDP, "udp6"),
];

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
            summary: run_dir.join(SUMMARY_FILE),
            pace,
            source: Mutex::new(source),
            last: Mutex::new(None),
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
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let job = Job {
            topo: topo.clone(),
            src,
            candidates: candidates.clone(),
            generation,
            current: Arc::clone(&self.generation),
            table: Arc::clone(&self.table),
            maps: Arc::clone(&self.maps),
            summary: self.summary.clone(),
            pace: self.pace,
            source: self.source(),
        };
        std::thread::Builder::new()
            .name("sopa-probe".into())
            .spawn(move || job.run())
            .map(drop)
            .unwrap_or_else(|e| warn!(%e, "could not start the entropy discovery"));
    }
}

struct Job {
    topo: Topology,
    src: NodeId,
    candidates: PathTable,
    generation: u64,
    current: Arc<AtomicU64>,
    table: Arc<Mutex<EntropyTable>>,
    maps: Arc<Mutex<MapSet>>,
    summary: PathBuf,
    pace: Pace,
    source: LabelSource,
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
        let g = self.topo.graph();
        let routers = sopa_topology::entropy::routers(&self.topo);
        let src6 = self.topo.host_ipv6(self.src);
        let src4 = g.node(self.src).addr.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let mut summary = Summary {
            generation: self.generation,
            source: self.source,
            ..Summary::default()
        };
        let mut seed = self.generation as u32;
        for (i, d) in self.candidates.destinations.iter().enumerate() {
            let probed = Probed::of(&self.topo, &self.candidates, i);
            // Every host of the rack: the switches hash the destination address too.
            let hosts: Vec<NodeId> = (0..g.nodes.len() as NodeId)
                .filter(|h| g.node(*h).kind == NodeKind::Host)
                .filter(|h| self.topo.rack_of(*h).is_ok_and(|r| r.tor == d.rack.tor))
                .collect();
            for dst in hosts {
                if self.stale() {
                    return;
                }
                let dst4 = g.node(dst).addr.unwrap_or(Ipv4Addr::UNSPECIFIED);
                let mut row = Probed1 {
                    host: g.name(dst).to_owned(),
                    expected: probed.paths.len(),
                    ..Probed1::default()
                };
                let mut found_labels = BTreeMap::new();
                for (next, name) in CLASSES {
                    seed = seed.wrapping_add(0x9E37_79B9);
                    let key = |hops: sopa_topology::paths::Hops| EvKey {
                        daddr: dst4.octets(),
                        next,
                        _pad: 0,
                        hops: [hops.hop0, hops.hop1],
                    };
                    let Some(prober) = prober.as_mut() else {
                        // A baseline: per path a random label, or the mark of a fresh one per
                        // packet.
                        let mut drawn = labels(seed);
                        let mut n = 0;
                        for (hops, _) in &probed.paths {
                            let label = match self.source {
                                LabelSource::PerPacket => PER_PACKET,
                                _ => drawn.next().expect("a million labels"),
                            };
                            found_labels.insert(key(*hops), label);
                            n += 1;
                        }
                        row.found.insert(name.to_owned(), n);
                        continue;
                    };
                    let target = Target {
                        src: src6,
                        dst: self.topo.host_ipv6(dst),
                        src4,
                        dst4,
                        next,
                        hop_limits: probed.hop_limits.clone(),
                        expected: probed.paths.len(),
                    };
                    let found = match discover(prober, &target, &self.pace, &mut labels(seed)) {
                        Ok(f) => f,
                        Err(e) => {
                            warn!(%e, host = %row.host, "probing failed");
                            continue;
                        }
                    };
                    row.probes += found.probes;
                    row.millis += found.took.as_millis() as u64;
                    let mut n = 0;
                    for (signature, label) in &found.paths {
                        if let Some(hops) = probed.path_of(&routers, signature) {
                            found_labels.insert(key(hops), *label);
                            n += 1;
                        }
                    }
                    row.found.insert(name.to_owned(), n);
                }
                if row.found.values().any(|n| *n < row.expected) {
                    summary.incomplete.push(row.host.clone());
                }
                self.write(found_labels, dst4);
                summary.destinations.push(row);
                self.save(&summary);
            }
        }
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

    /// Replaces `dst4`'s labels with `found` in the table and the datapath.
    fn write(&self, found: BTreeMap<EvKey, u32>, dst4: Ipv4Addr) {
        let table = {
            let mut t = self.table.lock().expect("labels lock");
            t.labels.retain(|k, _| k.daddr != dst4.octets());
            t.labels.extend(found);
            t.clone()
        };
        if self.stale() {
            return;
        }
        let mut maps = self.maps.lock().expect("maps lock");
        if let Err(e) = maps.apply_entropy(Some(&table)) {
            warn!(%e, "writing the entropy labels");
        }
    }

    fn save(&self, summary: &Summary) {
        let text = serde_json::to_string_pretty(summary).unwrap_or_default();
        if let Err(e) = std::fs::write(&self.summary, text) {
            warn!(%e, path = %self.summary.display(), "writing the discovery summary");
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
