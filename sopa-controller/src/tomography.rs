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

use sopa_channel::proto::PathReport;
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
    /// A link whose metered packets (taken as full-size) fill more than this share of its rate
    /// over a window is not judged: its queue may be dropping, and congestion drops land on
    /// some paths more than others as a gray link's would.
    pub max_load: f64,
}

/// The size a metered packet is taken to have when a link's load is estimated.
pub const FULL_PACKET_BITS: f64 = 1514.0 * 8.0;

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

/// Packets (sent, lost).
type Counts = (u64, u64);

/// One judged period: each path's counts.
type Period = (u64, HashMap<PathKey, Counts>);

/// A link's counts over unexplained paths, in all and per rack pair.
type LinkCounts = (u64, u64, HashMap<(u32, u32), Counts>);

/// A link the evidence convicts.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub link: Directed,
    pub sent: u64,
    pub lost: u64,
    /// Over how many periods.
    pub window: u32,
}

impl Verdict {
    pub fn loss(&self) -> f64 {
        self.lost as f64 / self.sent.max(1) as f64
    }
}

/// One period's reports, until every host's is in.
#[derive(Default)]
struct Pending {
    reports: HashMap<String, PathReport>,
}

/// The meter's evidence and its judge.
pub struct Tomography {
    topo: Arc<Topology>,
    racks: Vec<Rack>,
    /// Rack index by host name, and one host of each rack (paths are computed from it).
    host_rack: HashMap<String, u32>,
    rack_host: Vec<Option<NodeId>>,
    /// Links of each path, by rack pair then hops; computed when first needed.
    links: HashMap<(u32, u32), HashMap<u32, Vec<Directed>>>,
    pending: BTreeMap<u64, Pending>,
    /// The judged periods, newest last: each path's (sent, lost).
    judged: VecDeque<Period>,
    /// Each configured window's sums over its periods, kept as periods come and go (summing
    /// 16 periods of every path at each judgement is what large fabrics cannot afford).
    sums: Vec<(u32, HashMap<PathKey, Counts>)>,
    keep: usize,
    pub config: JudgeConfig,
    /// Periods judged, and those given up on (a host's report missing).
    pub periods_judged: u64,
    pub periods_partial: u64,
    /// The hosts' period (from their reports), for a window's length in seconds.
    period_ms: u32,
}

/// Adds `period` into `sum`, or takes it out (a path whose counts reach zero leaves).
fn add(sum: &mut HashMap<PathKey, Counts>, period: &HashMap<PathKey, Counts>, into: bool) {
    for (k, (s, l)) in period {
        if into {
            let e = sum.entry(*k).or_default();
            e.0 += s;
            e.1 += l;
        } else if let Some(e) = sum.get_mut(k) {
            e.0 -= s;
            e.1 -= l;
            if e.0 == 0 && e.1 == 0 {
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
        Self {
            topo,
            racks,
            host_rack,
            rack_host,
            links: HashMap::new(),
            pending: BTreeMap::new(),
            judged: VecDeque::new(),
            sums: config
                .windows
                .iter()
                .map(|w| (*w, HashMap::new()))
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
        if self.judged.back().is_some_and(|(p, _)| *p >= period) {
            // Too late: that period is judged already.
            return false;
        }
        self.pending
            .entry(period)
            .or_default()
            .reports
            .insert(host.to_owned(), report);
        let mut closed = false;
        while let Some((&first, pending)) = self.pending.first_key_value() {
            // Counted first: checking every name on every report would cost hosts squared.
            let complete = pending.reports.len() >= expected.len()
                && expected.iter().all(|h| pending.reports.contains_key(h));
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

    /// Sums a period's reports per path. A rack is judged only if every host of it reported
    /// the period completely: a host that did not (its agent away, reconnecting, never
    /// started) may still have received packets others counted as sent, which would read as
    /// lost.
    fn close(&mut self, period: u64, pending: Pending) {
        let mut blind: HashSet<u32> = HashSet::new();
        for (h, &r) in &self.host_rack {
            let ok = pending.reports.get(h).is_some_and(|r| !r.incomplete);
            if !ok {
                blind.insert(r);
            }
        }
        if !blind.is_empty() {
            self.periods_partial += 1;
        }
        let mut sent: HashMap<PathKey, u64> = HashMap::new();
        let mut received: HashMap<PathKey, u64> = HashMap::new();
        for (host, report) in &pending.reports {
            let me = self.host_rack[host];
            if blind.contains(&me) {
                continue;
            }
            for (into, list, outgoing) in [
                (&mut sent, &report.sent, true),
                (&mut received, &report.received, false),
            ] {
                for peer in list {
                    let Some(other) = self.rack_of_addr(peer.rack) else {
                        continue;
                    };
                    if blind.contains(&other) || other == me {
                        continue;
                    }
                    let (s, d) = if outgoing { (me, other) } else { (other, me) };
                    for (&hops, &n) in peer.hops.iter().zip(&peer.packets) {
                        *into.entry((s, d, hops)).or_default() += n;
                    }
                }
            }
        }
        let paths = sent
            .into_iter()
            .map(|(k, s)| {
                let r = received.get(&k).copied().unwrap_or(0);
                (k, (s, s.saturating_sub(r)))
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
    /// of it once it is back).
    pub fn forget(&mut self) {
        self.judged.clear();
        for (_, sum) in &mut self.sums {
            sum.clear();
        }
    }

    /// The newest judged period.
    pub fn last_period(&self) -> Option<u64> {
        self.judged.back().map(|(p, _)| *p)
    }

    /// Each path's (sent, lost) over the last `window` periods.
    fn window(&self, window: u32) -> HashMap<PathKey, (u64, u64)> {
        if let Some((_, sum)) = self.sums.iter().find(|(w, _)| *w == window) {
            return sum.clone();
        }
        let mut sum: HashMap<PathKey, (u64, u64)> = HashMap::new();
        for (_, paths) in self.judged.iter().rev().take(window as usize) {
            for (k, (s, l)) in paths {
                let e = sum.entry(*k).or_default();
                e.0 += s;
                e.1 += l;
            }
        }
        sum
    }

    /// The fabric links (switch to switch) a path crosses, in order, each with the node it
    /// leaves; empty for a path the topology does not have.
    fn path_links(&mut self, (s, d, hops): PathKey) -> Vec<Directed> {
        let (Some(src), Some(rack)) = (
            self.rack_host.get(s as usize).copied().flatten(),
            self.racks.get(d as usize).copied(),
        ) else {
            return Vec::new();
        };
        let topo = Arc::clone(&self.topo);
        let by_hops = self.links.entry((s, d)).or_insert_with(|| {
            let g = topo.graph();
            let mut out = HashMap::new();
            topo.paths_to_rack(src, &rack, |hop0, hop1, links| {
                let mut at = src;
                let mut dirs = Vec::new();
                for &l in links {
                    let next = g.links[l as usize].other(at);
                    if g.node(at).kind.is_switch() && g.node(next).kind.is_switch() {
                        dirs.push((l, at));
                    }
                    at = next;
                }
                out.insert(u32::from(hop0) | (u32::from(hop1) << 8), dirs);
            });
            out
        });
        by_hops.get(&hops).cloned().unwrap_or_default()
    }

    /// Every directed link's (sent, lost) over the last `window` periods, worst loss first.
    pub fn link_loss(&mut self, window: u32) -> Vec<(Directed, u64, u64)> {
        let mut links: HashMap<Directed, (u64, u64)> = HashMap::new();
        for (k, (s, l)) in self.window(window) {
            for dir in self.path_links(k) {
                let e = links.entry(dir).or_default();
                e.0 += s;
                e.1 += l;
            }
        }
        let mut out: Vec<_> = links.into_iter().map(|(d, (s, l))| (d, s, l)).collect();
        out.sort_by(|a, b| {
            let ra = a.2 as f64 / a.1.max(1) as f64;
            let rb = b.2 as f64 / b.1.max(1) as f64;
            rb.total_cmp(&ra).then(a.0.cmp(&b.0))
        });
        out
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

    fn judge_window(&mut self, window: u32, down: &impl Fn(LinkId) -> bool) -> Vec<Verdict> {
        let paths: Vec<(PathKey, u64, u64, Vec<Directed>)> = {
            let w = self.window(window);
            let mut keys: Vec<_> = w.into_iter().filter(|(_, (s, _))| *s > 0).collect();
            keys.sort_by_key(|(k, _)| *k);
            keys.into_iter()
                .map(|(k, (s, l))| (k, s, l, self.path_links(k)))
                .collect()
        };
        let mut explained: Vec<bool> = paths
            .iter()
            .map(|(_, _, _, dirs)| dirs.iter().any(|(l, _)| down(*l)))
            .collect();
        // A rack pair that lost candidate paths to a failure sprays over fewer: the links its
        // remaining paths cross carry more than their share, and their queues' drops read like
        // a gray link's. They are not judged while the failure lasts.
        let mut reduced: HashMap<(u32, u32), bool> = HashMap::new();
        let mut skewed: HashSet<Directed> = HashSet::new();
        for ((s, d, _), _, _, dirs) in &paths {
            let pair = (*s, *d);
            let is_reduced = *reduced.entry(pair).or_insert_with(|| {
                self.links
                    .get(&pair)
                    .is_some_and(|all| all.values().flatten().any(|(l, _)| down(*l)))
            });
            if is_reduced {
                skewed.extend(dirs.iter().copied());
            }
        }
        let mut verdicts = Vec::new();
        loop {
            // Per rack pair and per link, over the paths not yet explained.
            let mut pairs: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
            let mut links: BTreeMap<Directed, LinkCounts> = BTreeMap::new();
            for (i, ((s, d, _), sent, lost, dirs)) in paths.iter().enumerate() {
                if explained[i] {
                    continue;
                }
                let p = pairs.entry((*s, *d)).or_default();
                p.0 += sent;
                p.1 += lost;
                for dir in dirs {
                    let e = links.entry(*dir).or_default();
                    e.0 += sent;
                    e.1 += lost;
                    let q = e.2.entry((*s, *d)).or_default();
                    q.0 += sent;
                    q.1 += lost;
                }
            }
            let mut best: Option<Verdict> = None;
            for (dir, (sent, lost, by_pair)) in &links {
                if skewed.contains(dir) {
                    continue;
                }
                let seconds = f64::from(window) * f64::from(self.period_ms) / 1e3;
                if *sent as f64 * FULL_PACKET_BITS / seconds
                    > self.config.max_load * self.config.link_bps
                {
                    continue;
                }
                let (mut s_out, mut l_out) = (0u64, 0u64);
                for (pair, (s_in, l_in)) in by_pair {
                    let (s_all, l_all) = pairs[pair];
                    s_out += s_all - s_in;
                    l_out += l_all - l_in;
                }
                let rate = *lost as f64 / *sent as f64;
                let rate_out = if s_out > 0 {
                    l_out as f64 / s_out as f64
                } else {
                    0.0
                };
                let expected = rate_out * *sent as f64;
                let convicted = *lost >= self.config.min_lost
                    && rate >= self.config.threshold
                    && rate >= 2.0 * rate_out
                    && *lost as f64 > expected + 3.0 * expected.sqrt() + 1.0;
                if !convicted {
                    continue;
                }
                // The link that explains the most lost packets: a lossy core link's paths go
                // on through several downlinks, each of which loses at the same rate but
                // explains only its share; where two explain the same packets (one link's
                // paths are all the other's), the denser loss is the better explanation.
                let better = match &best {
                    None => true,
                    Some(b) => *lost > b.lost || (*lost == b.lost && rate > b.loss()),
                };
                if better {
                    best = Some(Verdict {
                        link: *dir,
                        sent: *sent,
                        lost: *lost,
                        window,
                    });
                }
            }
            let Some(v) = best else {
                break;
            };
            for (i, (_, _, _, dirs)) in paths.iter().enumerate() {
                if dirs.contains(&v.link) {
                    explained[i] = true;
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
        let racks = topo.racks();
        let mut out: BTreeMap<String, PathReport> = BTreeMap::new();
        let hosts: Vec<_> = g.nodes_of(NodeKind::Host).collect();
        for &h in &hosts {
            out.insert(
                g.name(h).to_owned(),
                PathReport {
                    period,
                    period_ms: 250,
                    ..PathReport::default()
                },
            );
        }
        for &h in hosts.iter().take(senders) {
            let own = topo.rack_of(h).unwrap();
            for rack in &racks {
                if rack.tor == own.tor {
                    continue;
                }
                // The receiver: the first host of the destination rack.
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
                    let hops = u32::from(h0) | (u32::from(h1) << 8);
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
                    // Uneven, as sampling makes it: paths into pod 1 lose one and a half times
                    // the rate, the others three quarters of it.
                    let share = if rack.at.0 == 1 { 1.5 } else { 0.75 };
                    let lost = match lossy {
                        Some((_, _, loss)) if through => {
                            (per_path as f64 * loss * share).round() as u64
                        }
                        _ => 0,
                    };
                    sent.hops.push(hops);
                    sent.packets.push(per_path);
                    recv.hops.push(hops);
                    recv.packets.push(per_path - lost - everywhere);
                });
                out.get_mut(g.name(h)).unwrap().sent.push(sent);
                out.get_mut(g.name(dst)).unwrap().received.push(recv);
            }
        }
        out.into_iter().collect()
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

    #[test]
    fn running_window_sums_equal_the_periods_summed_again() {
        let topo = fat_tree();
        let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
        for p in 0..21 {
            let lossy = (p % 3 == 0).then_some(("a0", "c0", 0.05));
            feed(&mut t, reports(&topo, p, 100 + p, lossy, 0, 16));
        }
        for w in [4u32, 16] {
            let mut again: HashMap<PathKey, Counts> = HashMap::new();
            for (_, paths) in t.judged.iter().rev().take(w as usize) {
                add(&mut again, paths, true);
            }
            assert_eq!(t.window(w), again, "window {w}");
        }
        t.forget();
        assert!(t.window(4).is_empty());
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
        assert!(t.link_loss(4).iter().all(|(_, _, lost)| *lost == 0));
    }
}
