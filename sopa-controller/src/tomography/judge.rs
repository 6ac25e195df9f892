//! The judge: which links the evidence convicts, and only on evidence no single rack's hosts
//! could have made up.

use sopa_topology::LinkId;

use super::*;

/// A link's counts with one rack's share taken out: its own paths', and its rack pairs'.
type Shares = HashMap<u32, (Counts, Counts)>;

impl Tomography {
    /// The links the evidence convicts, over every configured window. Paths through a link
    /// that `down` says is down are explained by it first (a cut link's losses are its own,
    /// not those of the links it shares its paths with), and the links of rack pairs that lost
    /// paths to a failure are not judged (their load is skewed).
    ///
    /// A verdict must be corroborated: the loss must still show, against the siblings, with
    /// the paths of any one rack left out, as sender or as receiver. A host's reports touch
    /// only paths its own rack is an end of, so no single host (nor one rack's hosts) can get
    /// a link convicted; it takes loss seen between several sender racks and several receiver
    /// racks. A link every path of which starts or ends at one rack (a leaf's own uplinks
    /// and downlinks) cannot be corroborated so, and is never convicted.
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
        let over = self.over_load(&paths, window);
        // Links whose verdict the evidence without some rack does not bear out.
        let mut uncorroborated = vec![false; n];
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
                if c.sent == 0 || skewed[l] || over[l] || uncorroborated[l] {
                    continue;
                }
                let rate = c.lost as f64 / c.sent as f64;
                if !self.convicts(c, pairs[l]) {
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
            if self.config.corroborate
                && !self.corroborated(&paths, &explained, id, own[id as usize], pairs[id as usize])
            {
                // Its losses stay unexplained: the next best link is judged on them.
                uncorroborated[id as usize] = true;
                continue;
            }
            for (i, e) in explained.iter_mut().enumerate() {
                if paths.of(i).contains(&id) {
                    *e = true;
                }
            }
            verdicts.push(v);
        }
        verdicts
    }

    /// Whether a link's own counts `c` convict it against its rack pairs' totals `pairs`: it
    /// loses at the threshold or more, at twice its siblings' rate or more, enough packets to
    /// tell, and more than its siblings' rate explains (three standard deviations).
    fn convicts(&self, c: Counts, pairs: Counts) -> bool {
        let (rate, rate_out) = rates(c, pairs);
        let expected = rate_out * c.sent as f64;
        c.lost >= self.config.min_lost
            && rate >= self.config.threshold
            && rate >= 2.0 * rate_out
            && c.lost as f64 > expected + 3.0 * expected.sqrt() + 1.0
    }

    /// Whether the loss convicting directed link `id` (its own counts `own`, its pairs'
    /// `pairs`, over the paths not yet explained) still shows with any one rack's paths left
    /// out: at least half the packets a conviction needs lost, at the threshold, at twice the
    /// siblings' rate.
    fn corroborated(
        &self,
        paths: &WindowPaths,
        explained: &[bool],
        id: u32,
        own: Counts,
        pairs: Counts,
    ) -> bool {
        let mut shares: Shares = HashMap::new();
        for group in paths.pairs() {
            let (s, d, _) = paths.keys[group.start];
            let mut total = Counts::default();
            let mut inside = Counts::default();
            for i in group.filter(|&i| !explained[i]) {
                total += paths.counts[i];
                if paths.of(i).contains(&id) {
                    inside += paths.counts[i];
                }
            }
            if inside.sent == 0 {
                continue;
            }
            for rack in [s, d] {
                let e = shares.entry(rack).or_default();
                e.0 += inside;
                e.1 += total;
            }
        }
        let need = self.config.min_lost.div_ceil(2).max(1);
        shares.values().all(|&(inside, total)| {
            let (c, p) = (own - inside, pairs - total);
            let (rate, rate_out) = rates(c, p);
            c.lost >= need && rate >= self.config.threshold && rate >= 2.0 * rate_out
        })
    }

    /// Which links are too loaded to judge over `window`: their metered bytes fill more than
    /// the limit of their rate. Bytes are what senders claim, so a link's heaviest sender rack
    /// counts for no more than its next heaviest: one rack's hosts cannot claim a link full
    /// (and keep a gray link on it from being judged), while several racks loading it alike
    /// keep their full load.
    fn over_load(&self, paths: &WindowPaths, window: u32) -> Vec<bool> {
        let n = self.dirs.len();
        // A link's load is what all its paths carry, explained or not: a conviction elsewhere
        // does not empty its queue.
        let mut loaded = vec![Counts::default(); n];
        for i in 0..paths.keys.len() {
            for &l in paths.of(i) {
                loaded[l as usize] += paths.counts[i];
            }
        }
        let mut over: Vec<bool> = loaded
            .iter()
            .map(|c| self.load(c, window) > self.config.max_load)
            .collect();
        if !self.config.corroborate || !over.contains(&true) {
            return over;
        }
        // Per over-loaded link, each sender rack's share (few links are over: a map of them).
        let mut by_rack: HashMap<(u32, u32), Counts> = HashMap::new();
        for i in 0..paths.keys.len() {
            let (s, _, _) = paths.keys[i];
            for &l in paths.of(i).iter().filter(|&&l| over[l as usize]) {
                *by_rack.entry((l, s)).or_default() += paths.counts[i];
            }
        }
        let wire = |c: &Counts| {
            c.bytes
                .saturating_add(c.sent.saturating_mul(FRAME_OVERHEAD_BYTES))
        };
        // The heaviest and the next heaviest sender rack of each.
        let mut top = vec![(Counts::default(), Counts::default()); n];
        for ((l, _), c) in by_rack {
            let t = &mut top[l as usize];
            if wire(&c) > wire(&t.0) {
                t.1 = t.0;
                t.0 = c;
            } else if wire(&c) > wire(&t.1) {
                t.1 = c;
            }
        }
        for l in 0..n {
            let (heaviest, next) = top[l];
            if over[l] && next.sent > 0 {
                let mut fair = loaded[l] - heaviest;
                fair += next;
                over[l] = self.load(&fair, window) > self.config.max_load;
            }
        }
        over
    }
}

/// A link's loss rate, and its siblings' (its pairs' other paths).
fn rates(c: Counts, pairs: Counts) -> (f64, f64) {
    let rate = c.lost as f64 / c.sent.max(1) as f64;
    let out = pairs - c;
    let rate_out = if out.sent > 0 {
        out.lost as f64 / out.sent as f64
    } else {
        0.0
    };
    (rate, rate_out)
}
