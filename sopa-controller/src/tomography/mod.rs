//! Finding lossy links from the hosts' path meters (network tomography).
//!
//! Every host reports, for each period of alternate marking, the packets it sent to and
//! received from each peer rack on each path (`sopa_channel::proto::PathReport`). Summed per
//! (source rack, destination rack, path), the two ends give each path's exact loss in that
//! period: no probe, no packet in flight counted (the period's color keeps late packets apart).
//!
//! A link is convicted when the paths through it lose clearly more than their siblings (the
//! other paths of the same rack pairs) and more than a threshold, with enough packets lost to
//! tell; greedily, the link explaining the most lost packets first, each conviction explaining
//! its paths' losses before the next link is judged (a lossy core link also makes the links
//! before and after it on its paths lose, each only a share of its packets: once the core link
//! explains those paths, their remaining paths are clean). Losses every path
//! of a rack pair shares (a host's own queue, the last hop to a host) convict nothing: they
//! show on the siblings too, and no drain would avoid them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    net::Ipv4Addr,
    sync::Arc,
};

use sopa_channel::proto::{PathReport, PeerPaths};
use sopa_topology::{LinkId, NodeId, NodeKind, Topology, topology::Rack};

/// How the meter's evidence is judged.
#[derive(Clone, Debug)]
pub struct JudgeConfig {
    /// The loss ratio above which a link is lossy.
    pub threshold: f64,
    /// Fewer packets lost than this over a window convict nothing.
    pub min_lost: u64,
    /// The windows judged after every period, in periods: a short one finds heavy loss fast,
    /// a long one light loss surely.
    pub windows: Vec<u32>,
    /// The fabric links' rate, bits per second.
    pub link_bps: f64,
    /// A link whose metered bytes fill more than this share of its rate over a window is not
    /// judged: its queue may be dropping, and congestion drops land on some paths more than
    /// others as a gray link's would. A link's heaviest sender rack counts for no more than
    /// its next heaviest: one rack's hosts could claim the bytes that fill it.
    pub max_load: f64,
    /// A verdict stands only if the evidence without any one rack's paths (as sender or as
    /// receiver) still shows the loss, so no single host's reports can make one
    /// ([`Tomography::judge`]). Off only to check the judge against its first form.
    pub corroborate: bool,
}

/// The size a metered packet is taken to have when its sender counted no bytes (an agent
/// older than the byte count).
pub const FULL_PACKET_BYTES: u64 = 1514;

/// Periods after the newest reported one that evidence restarts from once a change is applied
/// everywhere ([`Tomography::settled`]).
pub const SETTLE_PERIODS: u64 = 3;

/// What an Ethernet frame takes on the wire beyond the bytes a sender counts: preamble and
/// start delimiter (8), FCS (4), the inter-frame gap (12).
pub const FRAME_OVERHEAD_BYTES: u64 = 24;

impl Default for JudgeConfig {
    fn default() -> Self {
        Self {
            threshold: 0.003,
            min_lost: 8,
            windows: vec![4, 16],
            link_bps: 10e9,
            max_load: 0.7,
            corroborate: true,
        }
    }
}

/// A link in one direction: the link and the node the packets leave.
pub type Directed = (LinkId, NodeId);

/// A path between racks: source rack, destination rack, `hop0 | hop1 << 8`.
type PathKey = (u32, u32, u32);

/// A path's or a link's packets, and the bytes sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    sent: u64,
    lost: u64,
    bytes: u64,
}

// Saturating: reports are bounded before they are kept (`crate::meter::checks`), so no sum
// reaches the limit; if one did, it would stop there rather than wrap or panic.
impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Self) {
        self.sent = self.sent.saturating_add(o.sent);
        self.lost = self.lost.saturating_add(o.lost);
        self.bytes = self.bytes.saturating_add(o.bytes);
    }
}

impl std::ops::SubAssign for Counts {
    fn sub_assign(&mut self, o: Self) {
        self.sent = self.sent.saturating_sub(o.sent);
        self.lost = self.lost.saturating_sub(o.lost);
        self.bytes = self.bytes.saturating_sub(o.bytes);
    }
}

impl std::ops::Sub for Counts {
    type Output = Self;

    fn sub(mut self, o: Self) -> Self {
        self -= o;
        self
    }
}

/// A map by path, with a fast hash (a period holds a path of every rack pair in use: 663,552
/// at k=48 when every rack sends to one other).
type PathMap<V> = HashMap<PathKey, V, foldhash::fast::RandomState>;

/// One judged period: each path's counts.
type Period = (u64, PathMap<Counts>);

/// A rack pair's paths' links, by `hop0 | hop1 << 8`, as directed-link indices.
type PairLinks = HashMap<u32, Box<[u32]>>;

/// A window's paths with packets, in key order (a rack pair's paths together), with their
/// links.
#[derive(Default)]
struct WindowPaths {
    keys: Vec<PathKey>,
    counts: Vec<Counts>,
    /// Path `i`'s links are `links[starts[i]..starts[i + 1]]`.
    starts: Vec<u32>,
    links: Vec<u32>,
}

impl WindowPaths {
    fn of(&self, i: usize) -> &[u32] {
        &self.links[self.starts[i] as usize..self.starts[i + 1] as usize]
    }

    /// The index ranges of each rack pair's paths.
    fn pairs(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            let first = *self.keys.get(at)?;
            let start = at;
            while self
                .keys
                .get(at)
                .is_some_and(|k| (k.0, k.1) == (first.0, first.1))
            {
                at += 1;
            }
            Some(start..at)
        })
    }
}

/// A link the evidence convicts.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub link: Directed,
    pub sent: u64,
    pub lost: u64,
    /// Over how many periods.
    pub window: u32,
}

/// A directed link over a window: its metered packets, those lost on its paths, and the share of
/// its rate the packets took (over [`JudgeConfig::max_load`] it is not judged).
#[derive(Clone, Debug, PartialEq)]
pub struct LinkWindow {
    pub link: Directed,
    pub sent: u64,
    pub lost: u64,
    pub load: f64,
}

impl Verdict {
    pub fn loss(&self) -> f64 {
        self.lost as f64 / self.sent.max(1) as f64
    }
}

/// What the reports in so far say of one path in one period.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    sent: u64,
    bytes: u64,
    received: u64,
}

/// One period's reports, summed per path as they come in, until every host's is in.
#[derive(Default)]
struct Pending {
    /// The hosts that reported, and whether their counts were complete.
    hosts: HashMap<String, bool>,
    paths: PathMap<Tally>,
}

/// The meter's evidence and its judge.
pub struct Tomography {
    topo: Arc<Topology>,
    racks: Vec<Rack>,
    /// Rack index by host name, and one host of each rack (paths are computed from it).
    host_rack: HashMap<String, u32>,
    rack_host: Vec<Option<NodeId>>,
    /// Links of each path, by rack pair then hops, as indices into `dirs`; computed when first
    /// needed.
    links: HashMap<(u32, u32), PairLinks>,
    /// Every directed link some path crosses, and its index there.
    dirs: Vec<Directed>,
    dir_ids: HashMap<Directed, u32>,
    /// Rack index by prefix address (what reports name racks by).
    rack_ids: HashMap<u32, u32>,
    pending: BTreeMap<u64, Pending>,
    /// The version of a change that brought something back, while some agent has not applied
    /// it yet ([`Self::settled`]): reports of periods after `before_change` are left out.
    waiting_for: Option<u64>,
    /// Once settled, reports of periods after `before_change` and before this one are left
    /// out: they straddle that change.
    fresh_from: u64,
    /// The newest period any report named (kept across a change).
    newest_seen: u64,
    /// The newest period reported before that change: it and older ones ended before it.
    before_change: u64,
    /// The judged periods, newest last: each path's counts.
    judged: VecDeque<Period>,
    /// Each configured window's sums over its periods, kept as periods come and go (summing
    /// 16 periods of every path at each judgement is what large fabrics cannot afford).
    sums: Vec<(u32, PathMap<Counts>)>,
    keep: usize,
    pub config: JudgeConfig,
    /// Periods judged, and those given up on (a host's report missing).
    pub periods_judged: u64,
    pub periods_partial: u64,
    /// The meter's period, for a window's length in seconds.
    period_ms: u32,
}

/// Adds `period` into `sum`, or takes it out (a path whose counts reach zero leaves).
fn add(sum: &mut PathMap<Counts>, period: &PathMap<Counts>, into: bool) {
    for (k, c) in period {
        if into {
            *sum.entry(*k).or_default() += *c;
        } else if let Some(e) = sum.get_mut(k) {
            *e -= *c;
            if *e == Counts::default() {
                sum.remove(k);
            }
        }
    }
}

impl Tomography {
    pub fn new(topo: Arc<Topology>, config: JudgeConfig) -> Self {
        let racks = topo.racks();
        let g = topo.graph();
        let mut host_rack = HashMap::new();
        let mut rack_host = vec![None; racks.len()];
        for h in g.nodes_of(NodeKind::Host) {
            if let Ok(r) = topo.rack_of(h)
                && let Some(i) = racks.iter().position(|x| x.tor == r.tor)
            {
                host_rack.insert(g.name(h).to_owned(), i as u32);
                rack_host[i].get_or_insert(h);
            }
        }
        let keep = config.windows.iter().copied().max().unwrap_or(1).max(1) as usize;
        let rack_ids = racks
            .iter()
            .enumerate()
            .map(|(i, r)| (u32::from(r.prefix.addr), i as u32))
            .collect();
        Self {
            topo,
            racks,
            host_rack,
            rack_host,
            links: HashMap::new(),
            dirs: Vec::new(),
            dir_ids: HashMap::new(),
            rack_ids,
            pending: BTreeMap::new(),
            waiting_for: None,
            fresh_from: 0,
            newest_seen: 0,
            before_change: 0,
            judged: VecDeque::new(),
            sums: config
                .windows
                .iter()
                .map(|w| (*w, PathMap::default()))
                .collect(),
            keep,
            config,
            periods_judged: 0,
            periods_partial: 0,
            period_ms: 250,
        }
    }

    /// The rack whose prefix holds `addr`.
    fn rack_of_addr(&self, addr: u32) -> Option<u32> {
        // Reports name a rack by its prefix's address, unless racks' prefixes differ in length.
        if let Some(&i) = self.rack_ids.get(&addr) {
            return Some(i);
        }
        let addr = Ipv4Addr::from(addr);
        self.racks
            .iter()
            .position(|r| r.prefix.contains_addr(addr))
            .map(|i| i as u32)
    }

    /// Sets the meter's period (the controller's clock), for windows' lengths in seconds.
    pub fn set_period_ms(&mut self, period_ms: u32) {
        self.period_ms = period_ms.max(1);
    }

    /// Whether `host` is a host of the topology and every rack and path its report names is
    /// one of the topology's: peer racks other than its own, paths between the two racks.
    /// Checked before anything of the report is kept.
    pub fn check(&mut self, host: &str, report: &PathReport) -> Result<(), crate::meter::Refused> {
        use crate::meter::{Refused, checks::path_name};
        let Some(&me) = self.host_rack.get(host) else {
            return Err(Refused::Topology(format!(
                "{host} is not a host of the topology"
            )));
        };
        for (list, sent) in [(&report.sent, true), (&report.received, false)] {
            for peer in list {
                let addr = Ipv4Addr::from(peer.rack);
                let other = match self.rack_of_addr(peer.rack) {
                    Some(r) if r != me => r,
                    Some(_) => {
                        return Err(Refused::Topology(format!(
                            "rack {addr} is {host}'s own: the meter counts only other racks"
                        )));
                    }
                    None => {
                        return Err(Refused::Topology(format!(
                            "{addr} is not a rack of the topology"
                        )));
                    }
                };
                let (s, d) = if sent { (me, other) } else { (other, me) };
                if let Some(&h) = peer.hops.iter().find(|&&h| !self.has_path((s, d, h))) {
                    return Err(Refused::Topology(format!(
                        "path {} {} rack {addr} is not one of the topology's",
                        path_name(h),
                        if sent { "to" } else { "from" }
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether the topology has the path `key`.
    fn has_path(&mut self, key: PathKey) -> bool {
        self.path_links(key);
        self.links
            .get(&(key.0, key.1))
            .is_some_and(|by_hops| by_hops.contains_key(&key.2))
    }

    /// Takes a host's report. Returns whether a period became complete and was judged (every
    /// host of `expected` reported it), or was closed because newer periods are in.
    pub fn accept(&mut self, host: &str, report: PathReport, expected: &BTreeSet<String>) -> bool {
        if !self.host_rack.contains_key(host) {
            return false;
        }
        let period = report.period;
        self.newest_seen = self.newest_seen.max(period);
        if period > self.before_change && (self.waiting_for.is_some() || period < self.fresh_from) {
            // Straddles the fabric's last change (or a change not yet applied everywhere).
            return false;
        }
        if self.judged.back().is_some_and(|(p, _)| *p >= period) {
            // Too late: that period is judged already.
            return false;
        }
        self.fold(host, &report);
        let mut closed = false;
        while let Some((&first, pending)) = self.pending.first_key_value() {
            // Counted first: checking every name on every report would cost hosts squared.
            let complete = pending.hosts.len() >= expected.len()
                && expected.iter().all(|h| pending.hosts.contains_key(h));
            // A period two behind the newest is closed whatever is missing: its hosts' reports
            // come half a period after it ends.
            let newest = *self.pending.keys().next_back().expect("not empty");
            if !complete && newest < first + 2 {
                break;
            }
            let pending = self.pending.remove(&first).expect("present");
            self.close(first, pending);
            closed = true;
        }
        closed
    }

    /// Adds a host's report into its period's sums per path. A second report of a period from
    /// one host is left out (its packets are counted already).
    fn fold(&mut self, host: &str, report: &PathReport) {
        let me = self.host_rack[host];
        // Each peer's rack, looked up before the period's sums are borrowed.
        let racks = |list: &[PeerPaths]| -> Vec<Option<u32>> {
            list.iter()
                .map(|peer| self.rack_of_addr(peer.rack).filter(|&r| r != me))
                .collect()
        };
        let (to, from) = (racks(&report.sent), racks(&report.received));
        let pending = self.pending.entry(report.period).or_default();
        if pending.hosts.contains_key(host) {
            return;
        }
        pending.hosts.insert(host.to_owned(), !report.incomplete);
        for (peer, other) in report.sent.iter().zip(to) {
            let Some(other) = other else { continue };
            for (i, (&hops, &n)) in peer.hops.iter().zip(&peer.packets).enumerate() {
                let full = n.saturating_mul(FULL_PACKET_BYTES);
                let bytes = peer.bytes.get(i).copied().unwrap_or(full);
                let e = pending.paths.entry((me, other, hops)).or_default();
                e.sent = e.sent.saturating_add(n);
                e.bytes = e.bytes.saturating_add(bytes);
            }
        }
        for (peer, other) in report.received.iter().zip(from) {
            let Some(other) = other else { continue };
            for (&hops, &n) in peer.hops.iter().zip(&peer.packets) {
                let e = pending.paths.entry((other, me, hops)).or_default();
                e.received = e.received.saturating_add(n);
            }
        }
    }

    /// Closes a period. A rack is judged only if every host of it reported the period
    /// completely: a host that did not (its agent away, reconnecting, never started) may still
    /// have received packets others counted as sent, which would read as lost. So the paths of
    /// a rack pair with a blind end are left out.
    fn close(&mut self, period: u64, pending: Pending) {
        let mut blind: HashSet<u32> = HashSet::new();
        for (h, &r) in &self.host_rack {
            if !pending.hosts.get(h).copied().unwrap_or(false) {
                blind.insert(r);
            }
        }
        if !blind.is_empty() {
            self.periods_partial += 1;
        }
        let paths = pending
            .paths
            .into_iter()
            .filter(|((s, d, _), t)| t.sent > 0 && !blind.contains(s) && !blind.contains(d))
            .map(|(k, t)| {
                let lost = t.sent.saturating_sub(t.received);
                let c = Counts {
                    sent: t.sent,
                    lost,
                    bytes: t.bytes,
                };
                (k, c)
            })
            .collect();
        self.judged.push_back((period, paths));
        // Each window's running sums: the new period in, the one leaving the window out.
        let newest = self.judged.len() - 1;
        for (w, sum) in &mut self.sums {
            add(sum, &self.judged[newest].1, true);
            if let Some(leaving) = newest.checked_sub(*w as usize) {
                add(sum, &self.judged[leaving].1, false);
            }
        }
        while self.judged.len() > self.keep {
            self.judged.pop_front();
        }
        self.periods_judged += 1;
    }

    /// Forgets every judged period (evidence gathered while a link was drained says nothing
    /// of it once it is back), and takes no report of a period that did not end before the
    /// change until [`Self::settled`]: while a change is applied, hosts may already send on a
    /// path a switch still detours, and a detour rewrites the path the receiver counts the
    /// packet on, which reads as loss. (Periods that ended before it are still judged: what
    /// convicted a link goes on showing while it is drained, which cannot convict it again.)
    ///
    /// Only a change that gives something `back` (a link or switch up, a suspect released)
    /// waits: one that takes something away is applied by the hosts first, who stop sending
    /// before any switch detours. A change during a wait extends it to that change.
    pub fn forget(&mut self, version: u64, back: bool) {
        self.judged.clear();
        for (_, sum) in &mut self.sums {
            sum.clear();
        }
        if back || self.waiting_for.is_some() {
            if self.waiting_for.is_none() {
                self.before_change = self.newest_seen;
            }
            self.waiting_for = Some(version);
        }
    }

    /// Every agent has applied version `version`: if that is the last change, evidence starts
    /// again with the first period surely begun since (a later change waits for its own). The
    /// newest report is of a period that ended half a period ago or more, so the one in
    /// progress is at most two after it.
    pub fn settled(&mut self, version: u64) {
        if self.waiting_for == Some(version) {
            self.waiting_for = None;
            self.fresh_from = self.newest_seen.saturating_add(SETTLE_PERIODS);
        }
    }

    /// The version of a change not yet applied everywhere, if evidence waits for one.
    pub fn settling(&self) -> Option<u64> {
        self.waiting_for
    }

    /// The newest judged period.
    pub fn last_period(&self) -> Option<u64> {
        self.judged.back().map(|(p, _)| *p)
    }

    /// Each path's counts over the last `window` periods.
    fn window(&self, window: u32) -> PathMap<Counts> {
        if let Some((_, sum)) = self.sums.iter().find(|(w, _)| *w == window) {
            return sum.clone();
        }
        let mut sum: PathMap<Counts> = PathMap::default();
        for (_, paths) in self.judged.iter().rev().take(window as usize) {
            for (k, c) in paths {
                *sum.entry(*k).or_default() += *c;
            }
        }
        sum
    }

    /// The fabric links (switch to switch) a path crosses, in order, each as the index of the
    /// direction it is crossed in ([`Tomography::dirs`]); empty for a path the topology does
    /// not have. A rack pair's paths are computed together when first needed.
    fn path_links(&mut self, (s, d, hops): PathKey) -> &[u32] {
        let (Some(src), Some(rack)) = (
            self.rack_host.get(s as usize).copied().flatten(),
            self.racks.get(d as usize).copied(),
        ) else {
            return &[];
        };
        let Self {
            topo,
            links,
            dirs,
            dir_ids,
            ..
        } = self;
        let by_hops = links.entry((s, d)).or_insert_with(|| {
            let g = topo.graph();
            let mut out = HashMap::new();
            topo.paths_to_rack(src, &rack, |hop0, hop1, path| {
                let mut at = src;
                let mut ids = Vec::new();
                for &l in path {
                    let next = g.links[l as usize].other(at);
                    if g.node(at).kind.is_switch() && g.node(next).kind.is_switch() {
                        let id = *dir_ids.entry((l, at)).or_insert_with(|| {
                            dirs.push((l, at));
                            dirs.len() as u32 - 1
                        });
                        ids.push(id);
                    }
                    at = next;
                }
                out.insert(u32::from(hop0) | (u32::from(hop1) << 8), ids.into());
            });
            out
        });
        by_hops.get(&hops).map_or(&[], |ids| ids)
    }

    /// The paths with packets over the last `window` periods, in key order (a rack pair's
    /// together), each with its links.
    fn window_paths(&mut self, window: u32) -> WindowPaths {
        let mut keys: Vec<(PathKey, Counts)> = match self.sums.iter().find(|(w, _)| *w == window) {
            Some((_, sum)) => sum
                .iter()
                .filter(|(_, c)| c.sent > 0)
                .map(|(k, c)| (*k, *c))
                .collect(),
            None => self
                .window(window)
                .into_iter()
                .filter(|(_, c)| c.sent > 0)
                .collect(),
        };
        keys.sort_unstable_by_key(|(k, _)| *k);
        let mut out = WindowPaths {
            starts: Vec::with_capacity(keys.len() + 1),
            links: Vec::with_capacity(keys.len() * 4),
            ..WindowPaths::default()
        };
        out.starts.push(0);
        for (k, c) in keys {
            let ids = self.path_links(k);
            out.links.extend_from_slice(ids);
            out.starts.push(out.links.len() as u32);
            out.keys.push(k);
            out.counts.push(c);
        }
        out
    }

    /// Every directed link's packets and losses over the last `window` periods, and the share
    /// of its rate its metered bytes took, worst loss first.
    pub fn link_loss(&mut self, window: u32) -> Vec<LinkWindow> {
        let paths = self.window_paths(window);
        let mut links = vec![Counts::default(); self.dirs.len()];
        for i in 0..paths.keys.len() {
            for &l in paths.of(i) {
                links[l as usize] += paths.counts[i];
            }
        }
        let mut out: Vec<_> = links
            .into_iter()
            .enumerate()
            .filter(|(_, c)| c.sent > 0)
            .map(|(l, c)| LinkWindow {
                link: self.dirs[l],
                sent: c.sent,
                lost: c.lost,
                load: self.load(&c, window),
            })
            .collect();
        out.sort_by(|a, b| {
            let ra = a.lost as f64 / a.sent.max(1) as f64;
            let rb = b.lost as f64 / b.sent.max(1) as f64;
            rb.total_cmp(&ra).then(a.link.cmp(&b.link))
        });
        out
    }

    /// The share of a link's rate that `c`'s packets take over the last `window` periods:
    /// their bytes, and what each frame takes on the wire besides (preamble, delimiter, FCS,
    /// inter-frame gap). A window not yet full (after a fabric change made the evidence start
    /// again) is as long as the periods it holds.
    fn load(&self, c: &Counts, window: u32) -> f64 {
        let periods = (window as usize).min(self.judged.len()).max(1);
        let seconds = periods as f64 * f64::from(self.period_ms) / 1e3;
        let bytes = c.bytes + c.sent * FRAME_OVERHEAD_BYTES;
        bytes as f64 * 8.0 / seconds / self.config.link_bps
    }

    /// A directed link's ends by name: (from, to).
    pub fn names(&self, (link, from): Directed) -> (String, String) {
        let g = self.topo.graph();
        let to = g.links[link as usize].other(from);
        (g.name(from).to_owned(), g.name(to).to_owned())
    }
}

mod judge;
#[cfg(test)]
pub(crate) mod tests;
