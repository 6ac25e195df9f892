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
    /// others as a gray link's would.
    pub max_load: f64,
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

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Self) {
        self.sent += o.sent;
        self.lost += o.lost;
        self.bytes += o.bytes;
    }
}

impl std::ops::SubAssign for Counts {
    fn sub_assign(&mut self, o: Self) {
        self.sent -= o.sent;
        self.lost -= o.lost;
        self.bytes -= o.bytes;
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
    /// The hosts' period (from their reports), for a window's length in seconds.
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

    /// Takes a host's report. Returns whether a period became complete and was judged (every
    /// host of `expected` reported it), or was closed because newer periods are in.
    pub fn accept(&mut self, host: &str, report: PathReport, expected: &BTreeSet<String>) -> bool {
        if !self.host_rack.contains_key(host) {
            return false;
        }
        let period = report.period;
        self.period_ms = report.period_ms.max(1);
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
                e.sent += n;
                e.bytes += bytes;
            }
        }
        for (peer, other) in report.received.iter().zip(from) {
            let Some(other) = other else { continue };
            for (&hops, &n) in peer.hops.iter().zip(&peer.packets) {
                pending.paths.entry((other, me, hops)).or_default().received += n;
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

    /// The links the evidence convicts, over every configured window. Paths through a link
    /// that `down` says is down are explained by it first (a cut link's losses are its own,
    /// not those of the links it shares its paths with), and the links of rack pairs that lost
    /// paths to a failure are not judged (their load is skewed).
    pub fn judge(&mut self, down: impl Fn(LinkId) -> bool) -> Vec<Verdict> {
        let mut out: Vec<Verdict> = Vec::new();
        for w in self.config.windows.clone() {
            for v in self.judge_window(w, &down) {
                if !out.iter().any(|o| o.link == v.link) {
                    out.push(v);
                }
            }
        }
        out
    }

    /// One window's verdicts. Linear in the paths' links per verdict: a link's siblings (the
    /// other paths of the rack pairs it carries) are its pairs' totals less its own, each pair
    /// added once to each link its paths cross.
    fn judge_window(&mut self, window: u32, down: &impl Fn(LinkId) -> bool) -> Vec<Verdict> {
        let paths = self.window_paths(window);
        let n = self.dirs.len();
        let is_down: Vec<bool> = self.dirs.iter().map(|(l, _)| down(*l)).collect();
        let mut explained: Vec<bool> = (0..paths.keys.len())
            .map(|i| paths.of(i).iter().any(|&l| is_down[l as usize]))
            .collect();
        // A rack pair that lost candidate paths to a failure sprays over fewer: the links its
        // remaining paths cross carry more than their share, and their queues' drops read like
        // a gray link's. They are not judged while the failure lasts.
        let mut skewed = vec![false; n];
        if is_down.contains(&true) {
            for group in paths.pairs() {
                let (s, d, _) = paths.keys[group.start];
                let reduced = self
                    .links
                    .get(&(s, d))
                    .is_some_and(|all| all.values().flatten().any(|&l| is_down[l as usize]));
                if reduced {
                    for i in group {
                        for &l in paths.of(i) {
                            skewed[l as usize] = true;
                        }
                    }
                }
            }
        }
        // A link's load is what all its paths carry, explained or not: a conviction elsewhere
        // does not empty its queue.
        let mut loaded = vec![Counts::default(); n];
        for i in 0..paths.keys.len() {
            for &l in paths.of(i) {
                loaded[l as usize] += paths.counts[i];
            }
        }
        let over: Vec<bool> = loaded
            .iter()
            .map(|c| self.load(c, window) > self.config.max_load)
            .collect();
        let mut verdicts = Vec::new();
        loop {
            // Per link over the paths not yet explained: its own counts, and the totals of the
            // rack pairs it carries (each pair once).
            let mut own = vec![Counts::default(); n];
            let mut pairs = vec![Counts::default(); n];
            let mut seen = vec![usize::MAX; n];
            for (g, group) in paths.pairs().enumerate() {
                let mut total = Counts::default();
                for i in group.clone().filter(|&i| !explained[i]) {
                    total += paths.counts[i];
                }
                for i in group.filter(|&i| !explained[i]) {
                    for &l in paths.of(i) {
                        let l = l as usize;
                        own[l] += paths.counts[i];
                        if seen[l] != g {
                            seen[l] = g;
                            pairs[l] += total;
                        }
                    }
                }
            }
            let mut best: Option<Verdict> = None;
            for l in 0..n {
                let c = own[l];
                if c.sent == 0 || skewed[l] || over[l] {
                    continue;
                }
                let (s_out, l_out) = (pairs[l].sent - c.sent, pairs[l].lost - c.lost);
                let rate = c.lost as f64 / c.sent as f64;
                let rate_out = if s_out > 0 {
                    l_out as f64 / s_out as f64
                } else {
                    0.0
                };
                let expected = rate_out * c.sent as f64;
                let convicted = c.lost >= self.config.min_lost
                    && rate >= self.config.threshold
                    && rate >= 2.0 * rate_out
                    && c.lost as f64 > expected + 3.0 * expected.sqrt() + 1.0;
                if !convicted {
                    continue;
                }
                // The link that explains the most lost packets: a lossy core link's paths go
                // on through several downlinks, each of which loses at the same rate but
                // explains only its share; where two explain the same packets (one link's
                // paths are all the other's), the denser loss is the better explanation (and
                // of equals, the lower link, so the verdict does not depend on map order).
                let dir = self.dirs[l];
                let better = match &best {
                    None => true,
                    Some(b) => {
                        c.lost > b.lost
                            || (c.lost == b.lost
                                && (rate > b.loss() || (rate == b.loss() && dir < b.link)))
                    }
                };
                if better {
                    best = Some(Verdict {
                        link: dir,
                        sent: c.sent,
                        lost: c.lost,
                        window,
                    });
                }
            }
            let Some(v) = best else {
                break;
            };
            let id = self.dir_ids[&v.link];
            for (i, e) in explained.iter_mut().enumerate() {
                if paths.of(i).contains(&id) {
                    *e = true;
                }
            }
            verdicts.push(v);
        }
        verdicts
    }

    /// A directed link's ends by name: (from, to).
    pub fn names(&self, (link, from): Directed) -> (String, String) {
        let g = self.topo.graph();
        let to = g.links[link as usize].other(from);
        (g.name(from).to_owned(), g.name(to).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use sopa_channel::proto::PeerPaths;
    use sopa_topology::topology::TopologySpec;

    use super::*;

    fn fat_tree() -> Arc<Topology> {
        Arc::new(Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap())
    }

    /// Every host's report of `period`: the hosts `sends` picks (by index) send to the other
    /// racks `to` picks, each path's (sent, lost, bytes) from `path` (given the sender, the
    /// rack and the path's links); the first host of the destination rack receives.
    fn reports_by(
        topo: &Topology,
        period: u64,
        sends: impl Fn(usize) -> bool,
        to: impl Fn() -> bool,
        path: impl Fn(NodeId, &Rack, &[LinkId]) -> (u64, u64, Option<u64>),
    ) -> Vec<(String, PathReport)> {
        let g = topo.graph();
        let racks = topo.racks();
        let hosts: Vec<_> = g.nodes_of(NodeKind::Host).collect();
        let mut out: BTreeMap<String, PathReport> = hosts
            .iter()
            .map(|&h| {
                let r = PathReport {
                    period,
                    period_ms: 250,
                    ..PathReport::default()
                };
                (g.name(h).to_owned(), r)
            })
            .collect();
        for (i, &h) in hosts.iter().enumerate() {
            if !sends(i) {
                continue;
            }
            let own = topo.rack_of(h).unwrap();
            for rack in racks.iter().filter(|r| r.tor != own.tor) {
                if !to() {
                    continue;
                }
                let dst = hosts
                    .iter()
                    .copied()
                    .find(|x| topo.rack_of(*x).unwrap().tor == rack.tor)
                    .unwrap();
                let mut sent = PeerPaths {
                    rack: u32::from(rack.prefix.addr),
                    ..PeerPaths::default()
                };
                let mut recv = PeerPaths {
                    rack: u32::from(own.prefix.addr),
                    ..PeerPaths::default()
                };
                topo.paths_to_rack(h, rack, |h0, h1, links| {
                    let (n, lost, bytes) = path(h, rack, links);
                    let hops = u32::from(h0) | (u32::from(h1) << 8);
                    sent.hops.push(hops);
                    sent.packets.push(n);
                    sent.bytes.extend(bytes);
                    recv.hops.push(hops);
                    recv.packets.push(n - lost);
                });
                out.get_mut(g.name(h)).unwrap().sent.push(sent);
                out.get_mut(g.name(dst)).unwrap().received.push(recv);
            }
        }
        out.into_iter().collect()
    }

    /// The first `senders` hosts send `per_path` packets on each path to every other rack;
    /// packets on paths through `lossy` (from, to) lose about `loss` of them, and every path
    /// loses `everywhere` more packets at the receiver's own link.
    fn reports(
        topo: &Topology,
        period: u64,
        per_path: u64,
        lossy: Option<(&str, &str, f64)>,
        everywhere: u64,
        senders: usize,
    ) -> Vec<(String, PathReport)> {
        let g = topo.graph();
        let path = |h: NodeId, rack: &Rack, links: &[LinkId]| {
            let mut at = h;
            let mut through = false;
            for &l in links {
                let next = g.links[l as usize].other(at);
                if let Some((a, b, _)) = lossy
                    && g.name(at) == a
                    && g.name(next) == b
                {
                    through = true;
                }
                at = next;
            }
            // Uneven, as sampling makes it: paths into pod 1 lose one and a half times the
            // rate, the others three quarters of it.
            let share = if rack.at.0 == 1 { 1.5 } else { 0.75 };
            let lost = match lossy {
                Some((_, _, loss)) if through => (per_path as f64 * loss * share).round() as u64,
                _ => 0,
            };
            (per_path, lost + everywhere, None)
        };
        reports_by(topo, period, |i| i < senders, || true, path)
    }

    fn t_names(topo: &Arc<Topology>, link: Directed) -> (String, String) {
        Tomography::new(Arc::clone(topo), JudgeConfig::default()).names(link)
    }

    fn feed(t: &mut Tomography, reps: Vec<(String, PathReport)>) {
        let expected: BTreeSet<String> = reps.iter().map(|(h, _)| h.clone()).collect();
        for (h, r) in reps {
            t.accept(&h, r, &expected);
        }
    }

    #[test]
    fn a_lossy_core_link_is_convicted_alone() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..4 {
            feed(
                &mut t,
                reports(&topo, p, 200, Some(("a0", "c0", 0.02)), 0, 16),
            );
        }
        assert_eq!(t.last_period(), Some(3));
        let v = t.judge(|_| false);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(t.names(v[0].link), ("a0".into(), "c0".into()));
        assert!((v[0].loss() - 0.02).abs() < 0.001, "{}", v[0].loss());
    }

    #[test]
    fn a_window_not_yet_full_is_as_long_as_the_periods_it_holds() {
        let topo = fat_tree();
        let periods = |windows: Vec<u32>, link_bps: f64| {
            let config = JudgeConfig {
                windows,
                link_bps,
                ..JudgeConfig::default()
            };
            let mut t = Tomography::new(Arc::clone(&topo), config);
            for p in 0..4 {
                feed(
                    &mut t,
                    reports(&topo, p, 200, Some(("a0", "c0", 0.02)), 0, 16),
                );
            }
            t
        };
        let sent = periods(vec![4], 10e9).judge(|_| false)[0].sent;
        // a0 -> c0 at 1.5 times the limit over the 4 periods in (1 s).
        let frame = (FULL_PACKET_BYTES + FRAME_OVERHEAD_BYTES) as f64;
        let link_bps = sent as f64 * frame * 8.0 / 0.7 / 1.5;
        // A 16-period window holding 4 (as after a fabric change): over the limit, not a
        // quarter of it.
        let mut t = periods(vec![16], link_bps);
        let shown = t
            .link_loss(16)
            .into_iter()
            .find(|l| t.names(l.link) == ("a0".into(), "c0".into()))
            .unwrap();
        assert!((shown.load - 1.5 * 0.7).abs() < 1e-9, "{}", shown.load);
        assert_eq!(t.judge(|_| false), vec![]);
    }

    #[test]
    fn a_report_sent_twice_counts_once() {
        let topo = fat_tree();
        let run = |twice: bool| {
            let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
            for p in 0..4 {
                let reps = reports(&topo, p, 200, Some(("a0", "c0", 0.02)), 0, 16);
                let expected: BTreeSet<String> = reps.iter().map(|(h, _)| h.clone()).collect();
                if twice {
                    t.accept(&reps[0].0, reps[0].1.clone(), &expected);
                }
                for (h, r) in reps {
                    t.accept(&h, r, &expected);
                }
            }
            t.judge(|_| false)
        };
        let once = run(false);
        assert_eq!(once.len(), 1);
        assert_eq!(run(true), once);
    }

    #[test]
    fn a_links_load_is_the_bytes_its_senders_counted() {
        let topo = fat_tree();
        let config = JudgeConfig {
            windows: vec![4],
            ..JudgeConfig::default()
        };
        // `size` bytes for each packet sent; `None`: no bytes, as an older agent reports.
        let run = |link_bps: f64, size: Option<u64>| {
            let mut t = Tomography::new(
                Arc::clone(&topo),
                JudgeConfig {
                    link_bps,
                    ..config.clone()
                },
            );
            for p in 0..4 {
                let mut reps = reports(&topo, p, 200, Some(("a0", "c0", 0.02)), 0, 16);
                for (_, r) in &mut reps {
                    for peer in &mut r.sent {
                        peer.bytes = match size {
                            Some(b) => peer.packets.iter().map(|n| n * b).collect(),
                            None => Vec::new(),
                        };
                    }
                }
                feed(&mut t, reps);
            }
            let verdicts = t.judge(|_| false);
            // What status and the metrics show of a0 -> c0.
            let shown = t
                .link_loss(4)
                .into_iter()
                .find(|l| t.names(l.link) == ("a0".into(), "c0".into()))
                .unwrap();
            (verdicts, shown.load)
        };
        let (v, _) = run(config.link_bps, None);
        assert_eq!(v.len(), 1, "{v:?}");
        // A rate a0 -> c0's packets fill to 1.5 times the limit at full size, to half of it at
        // 500 bytes each (each frame with its 24 bytes on the wire besides).
        let frame = |b: u64| (b + FRAME_OVERHEAD_BYTES) as f64;
        let full = v[0].sent as f64 * frame(FULL_PACKET_BYTES) * 8.0 / 1.0;
        let link_bps = full / config.max_load / 1.5;
        let (v, load) = run(link_bps, None);
        assert!(v.is_empty(), "taken full-size: over the limit");
        assert!((load - 1.5 * config.max_load).abs() < 1e-9, "{load}");
        let (v, _) = run(link_bps, Some(1514));
        assert!(v.is_empty(), "counted full-size: over the limit");
        let (v, load) = run(link_bps, Some(500));
        let want = 1.5 * config.max_load * frame(500) / frame(FULL_PACKET_BYTES);
        assert!((load - want).abs() < 1e-9, "{load}, not {want}");
        assert_eq!(
            v.len(),
            1,
            "counted at 500 bytes: under the limit, judged: {v:?}"
        );
        assert_eq!(t_names(&topo, v[0].link), ("a0".into(), "c0".into()));
    }

    #[test]
    fn with_traffic_from_one_pod_the_core_link_not_its_downlinks_is_convicted() {
        // Pod 0's four hosts send: every path through c0 -> a2, a4, a6 came through a0 -> c0,
        // and loses at its rate; a0 -> c0 alone explains them all.
        let topo = fat_tree();
        for seed in 0..4 {
            let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
            for p in 0..4 {
                feed(
                    &mut t,
                    reports(&topo, p, 150 + seed * 7, Some(("a0", "c0", 0.02)), 0, 4),
                );
            }
            let v = t.judge(|_| false);
            assert_eq!(v.len(), 1, "{v:?}");
            assert_eq!(t.names(v[0].link), ("a0".into(), "c0".into()));
        }
    }

    #[test]
    fn a_link_known_down_explains_its_paths_losses_first() {
        // One sender: every path through c2 -> a3 also crosses a1 -> c2, and no other path
        // tells them apart. Cut, c2 -> a3 is down, and its losses are its own.
        let topo = fat_tree();
        let g = topo.graph();
        let cut: Vec<LinkId> = g
            .links_between(g.find("c2").unwrap(), g.find("a3").unwrap())
            .collect();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..4 {
            feed(
                &mut t,
                reports(&topo, p, 400, Some(("c2", "a3", 0.05)), 0, 1),
            );
        }
        assert!(
            !t.judge(|_| false).is_empty(),
            "the losses convict without it"
        );
        assert_eq!(t.judge(|l| cut.contains(&l)), vec![]);
    }

    #[test]
    fn links_a_failure_skews_the_load_of_are_not_judged() {
        // a0 is down: pod 0 reaches pod 3 only through a1, c2, c3 and a7, whose downlink to
        // e7 now carries more than its share and drops at its queue.
        let topo = fat_tree();
        let g = topo.graph();
        let a0 = g.find("a0").unwrap();
        let dead: Vec<LinkId> = g.ports(a0).iter().map(|(l, _)| *l).collect();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..4 {
            feed(
                &mut t,
                reports(&topo, p, 400, Some(("a7", "e7", 0.03)), 0, 16),
            );
        }
        assert!(
            !t.judge(|_| false).is_empty(),
            "without the failure it convicts"
        );
        assert_eq!(t.judge(|l| dead.contains(&l)), vec![]);
    }

    /// The judge as first written (per link, a map of the rack pairs it carries), kept to check
    /// the linear one against: one window's verdicts.
    fn reference_judge(
        t: &mut Tomography,
        window: u32,
        down: &dyn Fn(LinkId) -> bool,
    ) -> Vec<Verdict> {
        let w = t.window_paths(window);
        let paths: Vec<(PathKey, Counts, Vec<Directed>)> = (0..w.keys.len())
            .map(|i| {
                let dirs = w.of(i).iter().map(|&l| t.dirs[l as usize]).collect();
                (w.keys[i], w.counts[i], dirs)
            })
            .collect();
        let mut explained: Vec<bool> = paths
            .iter()
            .map(|(_, _, dirs)| dirs.iter().any(|(l, _)| down(*l)))
            .collect();
        let mut skewed: HashSet<Directed> = HashSet::new();
        for ((s, d, _), _, dirs) in &paths {
            let reduced = t.links[&(*s, *d)]
                .values()
                .flatten()
                .any(|&l| down(t.dirs[l as usize].0));
            if reduced {
                skewed.extend(dirs.iter().copied());
            }
        }
        // The load rule is the judge's (over all of a link's paths, each frame's overhead on).
        let mut loaded: BTreeMap<Directed, Counts> = BTreeMap::new();
        for (_, c, dirs) in &paths {
            for dir in dirs {
                *loaded.entry(*dir).or_default() += *c;
            }
        }
        let over: HashSet<Directed> = loaded
            .iter()
            .filter(|(_, c)| t.load(c, window) > t.config.max_load)
            .map(|(d, _)| *d)
            .collect();
        let mut verdicts = Vec::new();
        loop {
            let mut pairs: HashMap<(u32, u32), Counts> = HashMap::new();
            // Per link: its counts, in all and per rack pair.
            type ByPair = HashMap<(u32, u32), Counts>;
            let mut links: BTreeMap<Directed, (Counts, ByPair)> = BTreeMap::new();
            for (i, ((s, d, _), c, dirs)) in paths.iter().enumerate() {
                if explained[i] {
                    continue;
                }
                *pairs.entry((*s, *d)).or_default() += *c;
                for dir in dirs {
                    let e = links.entry(*dir).or_default();
                    e.0 += *c;
                    *e.1.entry((*s, *d)).or_default() += *c;
                }
            }
            let mut best: Option<Verdict> = None;
            for (dir, (c, by_pair)) in &links {
                if skewed.contains(dir) || over.contains(dir) {
                    continue;
                }
                let (mut s_out, mut l_out) = (0u64, 0u64);
                for (pair, inside) in by_pair {
                    s_out += pairs[pair].sent - inside.sent;
                    l_out += pairs[pair].lost - inside.lost;
                }
                let rate = c.lost as f64 / c.sent as f64;
                let rate_out = if s_out > 0 {
                    l_out as f64 / s_out as f64
                } else {
                    0.0
                };
                let expected = rate_out * c.sent as f64;
                let convicted = c.lost >= t.config.min_lost
                    && rate >= t.config.threshold
                    && rate >= 2.0 * rate_out
                    && c.lost as f64 > expected + 3.0 * expected.sqrt() + 1.0;
                let better = best
                    .as_ref()
                    .is_none_or(|b| c.lost > b.lost || (c.lost == b.lost && rate > b.loss()));
                if convicted && better {
                    best = Some(Verdict {
                        link: *dir,
                        sent: c.sent,
                        lost: c.lost,
                        window,
                    });
                }
            }
            let Some(v) = best else { break };
            for (i, (_, _, dirs)) in paths.iter().enumerate() {
                explained[i] |= dirs.contains(&v.link);
            }
            verdicts.push(v);
        }
        verdicts
    }

    #[test]
    fn the_linear_judge_convicts_what_the_first_one_did() {
        let topo = fat_tree();
        let g = topo.graph();
        let fabric: Vec<LinkId> = (0..g.links.len() as LinkId)
            .filter(|&l| {
                let link = &g.links[l as usize];
                g.node(link.a).kind.is_switch() && g.node(link.b).kind.is_switch()
            })
            .collect();
        // A small deterministic generator (xorshift), so a failure names its case.
        let state = std::cell::Cell::new(0x9e37_79b9_7f4a_7c15_u64);
        let next = |n: u64| {
            let mut x = state.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            state.set(x);
            x % n
        };
        let mut convicted = 0;
        for case in 0..60 {
            // Up to three lossy directed links at 0.5-6%, noise on every path, some hosts
            // silent, some rack pairs unused, sometimes a link down.
            let lossy: Vec<((NodeId, NodeId), f64)> = (0..1 + next(3))
                .map(|_| {
                    let l = &g.links[fabric[next(fabric.len() as u64) as usize] as usize];
                    let ends = if next(2) == 0 { (l.a, l.b) } else { (l.b, l.a) };
                    (ends, [0.005, 0.02, 0.06][next(3) as usize])
                })
                .collect();
            let down_link = (next(3) == 0).then(|| fabric[next(fabric.len() as u64) as usize]);
            let mut t = Tomography::new(
                Arc::clone(&topo),
                JudgeConfig {
                    // Sometimes low enough that some links are over the load limit.
                    link_bps: [10e9, 10e9, 30e6, 60e6][next(4) as usize],
                    ..JudgeConfig::default()
                },
            );
            for period in 0..6 {
                let path = |h: NodeId, _: &Rack, links: &[LinkId]| {
                    let n = 50 + next(300);
                    let mut keep = 1.0;
                    let mut at = h;
                    for &l in links {
                        let to = g.links[l as usize].other(at);
                        for ((a, b), loss) in &lossy {
                            if (*a, *b) == (at, to) {
                                keep *= 1.0 - loss;
                            }
                        }
                        at = to;
                    }
                    let lost = ((n as f64 * (1.0 - keep)).round() as u64 + next(2)).min(n);
                    (n, lost, Some(n * (100 + next(1400))))
                };
                let reps = reports_by(&topo, period, |_| next(4) != 0, || next(3) != 0, path);
                feed(&mut t, reps);
            }
            let down = |l: LinkId| Some(l) == down_link;
            let mut want = Vec::new();
            for w in t.config.windows.clone() {
                for v in reference_judge(&mut t, w, &down) {
                    if !want.iter().any(|o: &Verdict| o.link == v.link) {
                        want.push(v);
                    }
                }
            }
            assert_eq!(
                t.judge(down),
                want,
                "case {case}: {lossy:?}, down {down_link:?}"
            );
            convicted += want.len();
        }
        // The cases exercise convictions, not only their absence.
        assert!(convicted >= 30, "{convicted} verdicts in 60 cases");
    }

    #[test]
    fn running_window_sums_equal_the_periods_summed_again() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..21 {
            let lossy = (p % 3 == 0).then_some(("a0", "c0", 0.05));
            feed(&mut t, reports(&topo, p, 100 + p, lossy, 0, 16));
        }
        for w in [4u32, 16] {
            let mut again: PathMap<Counts> = PathMap::default();
            for (_, paths) in t.judged.iter().rev().take(w as usize) {
                add(&mut again, paths, true);
            }
            assert_eq!(t.window(w), again, "window {w}");
        }
        t.forget(2, false);
        assert!(t.window(4).is_empty());
    }

    #[test]
    fn after_a_change_evidence_waits_for_every_agent_and_starts_after_the_newest_period() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        let lossy = Some(("a0", "c0", 0.05));
        for p in 0..4 {
            feed(&mut t, reports(&topo, p, 200, None, 0, 16));
        }
        assert_eq!(t.periods_judged, 4);
        t.forget(2, true);
        // Applied by some agents only (a switch still detours what the hosts send on a0 -> c0
        // again, and the receivers count it on another path): not evidence.
        for p in 4..10 {
            feed(&mut t, reports(&topo, p, 200, lossy, 0, 16));
        }
        assert!(t.judge(|_| false).is_empty());
        assert_eq!(t.periods_judged, 4, "judged while the change was applied");
        // Applied everywhere, but a later change (3) is being applied now: still nothing.
        t.forget(3, false);
        t.settled(2);
        feed(&mut t, reports(&topo, 10, 200, lossy, 0, 16));
        assert_eq!(t.periods_judged, 4, "settled by an older version's acks");
        t.settled(3);
        // The newest period reported was 10: the next two may have begun before every agent
        // had applied the change.
        for p in 11..13 {
            feed(&mut t, reports(&topo, p, 200, lossy, 0, 16));
        }
        assert_eq!(
            t.periods_judged, 4,
            "a period begun before the change was applied"
        );
        for p in 13..17 {
            feed(&mut t, reports(&topo, p, 200, lossy, 0, 16));
        }
        let v = t.judge(|_| false);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(t.names(v[0].link), ("a0".into(), "c0".into()));
        // A second `settled` (another agent's ack) moves nothing.
        t.settled(3);
        feed(&mut t, reports(&topo, 17, 200, None, 0, 16));
        assert!(t.periods_judged > 8);
    }

    #[test]
    fn the_other_direction_and_a_downlink_are_told_apart() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..4 {
            feed(
                &mut t,
                reports(&topo, p, 200, Some(("c0", "a2", 0.05)), 0, 16),
            );
        }
        let v = t.judge(|_| false);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(t.names(v[0].link), ("c0".into(), "a2".into()));
    }

    #[test]
    fn loss_on_every_path_of_a_pair_and_a_healthy_fabric_convict_nothing() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..16 {
            feed(&mut t, reports(&topo, p, 200, None, 3, 16));
        }
        assert_eq!(t.judge(|_| false), vec![]);
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..16 {
            feed(&mut t, reports(&topo, p, 200, None, 0, 16));
        }
        assert_eq!(t.judge(|_| false), vec![]);
    }

    #[test]
    fn light_loss_is_convicted_with_enough_packets() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        // 0.5% of 200 per path per period: one packet per path per period.
        for p in 0..4 {
            feed(
                &mut t,
                reports(&topo, p, 200, Some(("a0", "c0", 0.005)), 0, 16),
            );
        }
        let short: Vec<_> = t
            .judge(|_| false)
            .into_iter()
            .filter(|v| v.window == 4)
            .collect();
        assert!(short.len() <= 1);
        for p in 4..16 {
            feed(
                &mut t,
                reports(&topo, p, 200, Some(("a0", "c0", 0.005)), 0, 16),
            );
        }
        let v = t.judge(|_| false);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(t.names(v[0].link), ("a0".into(), "c0".into()));
    }

    #[test]
    fn a_missing_report_blinds_its_rack_and_a_late_period_is_closed() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        let reps = reports(&topo, 0, 200, None, 0, 16);
        let expected: BTreeSet<String> = reps.iter().map(|(h, _)| h.clone()).collect();
        let missing = reps[0].0.clone();
        for (h, r) in reps.into_iter().skip(1) {
            assert!(
                !t.accept(&h, r, &expected),
                "not complete without {missing}"
            );
        }
        // Two periods later the first is closed without it, its rack left out (else every
        // path into it would look lossy).
        for p in 1..3 {
            for (h, r) in reports(&topo, p, 200, None, 0, 16).into_iter().skip(1) {
                t.accept(&h, r, &expected);
            }
        }
        assert_eq!(t.last_period(), Some(0));
        assert_eq!(t.periods_partial, 1);
        assert_eq!(t.judge(|_| false), vec![]);
        assert!(t.link_loss(4).iter().all(|l| l.lost == 0));
    }
}
