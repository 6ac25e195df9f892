use sopa_channel::proto::PeerPaths;
use sopa_topology::topology::TopologySpec;

use super::*;

pub(crate) fn fat_tree() -> Arc<Topology> {
    Arc::new(Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap())
}

/// Every host's report of `period`: the hosts `sends` picks (by index) send to the other
/// racks `to` picks, each path's (sent, lost, bytes) from `path` (given the sender, the
/// rack and the path's links); the first host of the destination rack receives.
pub(crate) fn reports_by(
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
            // One entry per rack: a rack's hosts' packets together.
            let received = &mut out.get_mut(g.name(dst)).unwrap().received;
            match received.iter_mut().find(|p| p.rack == recv.rack) {
                Some(p) => {
                    for (i, n) in recv.packets.iter().enumerate() {
                        p.packets[i] += n;
                    }
                }
                None => received.push(recv),
            }
        }
    }
    out.into_iter().collect()
}

/// The first `senders` hosts send `per_path` packets on each path to every other rack;
/// packets on paths through `lossy` (from, to) lose about `loss` of them, and every path
/// loses `everywhere` more packets at the receiver's own link.
pub(crate) fn reports(
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
    // Pod 0's two racks send: every path through c2 -> a3 also crosses a1 -> c2. Cut,
    // c2 -> a3 is down, and its losses are its own.
    let topo = fat_tree();
    let g = topo.graph();
    let cut: Vec<LinkId> = g
        .links_between(g.find("c2").unwrap(), g.find("a3").unwrap())
        .collect();
    let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
    for p in 0..4 {
        feed(
            &mut t,
            reports(&topo, p, 400, Some(("c2", "a3", 0.05)), 0, 4),
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
    // a0 is down: pod 0 reaches pod 3 only through a1, c2 and c3, and c2's link to a7 now
    // carries more than its share and drops at its queue.
    let topo = fat_tree();
    let g = topo.graph();
    let a0 = g.find("a0").unwrap();
    let dead: Vec<LinkId> = g.ports(a0).iter().map(|(l, _)| *l).collect();
    let mut t = Tomography::new(Arc::clone(&topo), JudgeConfig::default());
    for p in 0..4 {
        feed(
            &mut t,
            reports(&topo, p, 400, Some(("c2", "a7", 0.03)), 0, 16),
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
fn reference_judge(t: &mut Tomography, window: u32, down: &dyn Fn(LinkId) -> bool) -> Vec<Verdict> {
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
                // The first judge knew no corroboration (tested on its own).
                corroborate: false,
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

#[test]
fn a_loss_one_racks_paths_alone_show_is_not_convicted() {
    let topo = fat_tree();
    // `senders` of the first hosts send: 2 are rack e0's, 4 racks e0's and e1's.
    let run = |senders: usize, corroborate: bool| {
        let config = JudgeConfig {
            corroborate,
            ..JudgeConfig::default()
        };
        let mut t = Tomography::new(Arc::clone(&topo), config);
        for p in 0..4 {
            feed(
                &mut t,
                reports(&topo, p, 200, Some(("a0", "c0", 0.05)), 0, senders),
            );
        }
        t.judge(|_| false)
    };
    assert_eq!(run(2, true), vec![], "one sender rack: not corroborated");
    assert_eq!(
        run(2, false).len(),
        1,
        "the same evidence convicts uncorroborated"
    );
    let v = run(4, true);
    assert_eq!(v.len(), 1, "two sender racks, six receiver racks: {v:?}");
    assert_eq!(t_names(&topo, v[0].link), ("a0".into(), "c0".into()));
}

#[test]
fn one_rack_claiming_bytes_cannot_keep_a_link_from_being_judged() {
    let topo = fat_tree();
    let g = topo.graph();
    let e0 = g.find("e0").unwrap();
    // Rack e0's hosts claim 40 times the bytes they sent: a0 -> c0 passes the load limit on
    // their claims alone.
    let run = |corroborate: bool| {
        let config = JudgeConfig {
            windows: vec![4],
            // Honest, a0 -> c0 carries 40% of it (and every other link less).
            link_bps: 400e6,
            corroborate,
            ..JudgeConfig::default()
        };
        let mut t = Tomography::new(Arc::clone(&topo), config);
        for p in 0..4 {
            let path = |h: NodeId, _: &Rack, links: &[LinkId]| {
                let mut at = h;
                let mut through = false;
                for &l in links {
                    let next = g.links[l as usize].other(at);
                    through |= g.name(at) == "a0" && g.name(next) == "c0";
                    at = next;
                }
                let lost = if through { 10 } else { 0 };
                let claimed = if topo.rack_of(h).unwrap().tor == e0 {
                    40
                } else {
                    1
                };
                (200, lost, Some(200 * 1000 * claimed))
            };
            feed(&mut t, reports_by(&topo, p, |i| i < 4, || true, path));
        }
        let shown = t
            .link_loss(4)
            .into_iter()
            .find(|l| t.names(l.link) == ("a0".into(), "c0".into()))
            .unwrap();
        assert!(shown.load > 0.7, "{}", shown.load);
        let v = t.judge(|_| false);
        v.iter().map(|v| t.names(v.link)).collect::<Vec<_>>()
    };
    let a0_c0 = ("a0".to_owned(), "c0".to_owned());
    assert!(
        !run(false).contains(&a0_c0),
        "taken at e0's word: over the limit, not judged"
    );
    assert_eq!(
        run(true),
        vec![a0_c0],
        "e0 counted as e1: under the limit, judged"
    );
}
