//! Structural properties computed on the built graph, to print beside the papers' formulas:
//! counts and ports by speed, diameter between hosts (BFS), node-disjoint shortest paths
//! (max-flow), bisection cuts and inter-container fiber length.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::{
    graph::{Graph, NodeId, NodeKind, Speed},
    modric::Modric,
};

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub hosts: u64,
    pub switches: BTreeMap<String, u64>,
    pub links_s1: u64,
    pub links_s2: u64,
    /// Switch ports in use, by link speed (host NICs not counted).
    pub switch_ports_s1: u64,
    pub switch_ports_s2: u64,
}

pub fn counts(g: &Graph) -> Counts {
    let mut c = Counts::default();
    for n in &g.nodes {
        if n.kind == NodeKind::Host {
            c.hosts += 1;
        } else {
            *c.switches
                .entry(format!("{:?}", n.kind).to_lowercase())
                .or_default() += 1;
        }
    }
    for l in &g.links {
        let switch_ends =
            u64::from(g.node(l.a).kind.is_switch()) + u64::from(g.node(l.b).kind.is_switch());
        match l.speed {
            Speed::S1 => {
                c.links_s1 += 1;
                c.switch_ports_s1 += switch_ends;
            }
            Speed::S2 => {
                c.links_s2 += 1;
                c.switch_ports_s2 += switch_ends;
            }
        }
    }
    c
}

/// Hop distances from `sources` over switches (hosts are endpoints only); u32::MAX unreachable.
pub fn bfs(g: &Graph, sources: &[NodeId]) -> Vec<u32> {
    let mut dist = vec![u32::MAX; g.nodes.len()];
    let mut queue = VecDeque::new();
    for &s in sources {
        dist[s as usize] = 0;
        queue.push_back(s);
    }
    while let Some(u) = queue.pop_front() {
        let next = dist[u as usize] + 1;
        if g.node(u).kind == NodeKind::Host && dist[u as usize] > 0 {
            continue;
        }
        for &(_, v) in g.ports(u) {
            if dist[v as usize] == u32::MAX {
                dist[v as usize] = next;
                queue.push_back(v);
            }
        }
    }
    dist
}

/// The largest host-to-host distance (in links) from the hosts of the racks `from_tors` to
/// any host. For vertex-transitive fabrics, one representative rack switch per class suffices.
pub fn host_diameter_from(g: &Graph, from_tors: &[NodeId]) -> u32 {
    let tors: Vec<NodeId> = g
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| {
            n.kind.is_switch()
                && g.ports(*i as NodeId)
                    .iter()
                    .any(|(_, v)| g.node(*v).kind == NodeKind::Host)
        })
        .map(|(i, _)| i as NodeId)
        .collect();
    let mut worst = 0;
    for &t in from_tors {
        let d = bfs(g, &[t]);
        for &u in &tors {
            worst = worst.max(d[u as usize]);
        }
    }
    // Host -> its switch, and the other switch -> host.
    worst + 2
}

/// Max-flow (Dinic) on unit capacities.
struct Flow {
    head: Vec<usize>,
    next: Vec<usize>,
    to: Vec<usize>,
    cap: Vec<u32>,
}

const NIL: usize = usize::MAX;
const INF: u32 = u32::MAX / 4;

impl Flow {
    fn new(nodes: usize) -> Self {
        Self {
            head: vec![NIL; nodes],
            next: Vec::new(),
            to: Vec::new(),
            cap: Vec::new(),
        }
    }

    fn edge(&mut self, u: usize, v: usize, c: u32) {
        for (a, b, cap) in [(u, v, c), (v, u, 0)] {
            self.next.push(self.head[a]);
            self.to.push(b);
            self.cap.push(cap);
            self.head[a] = self.to.len() - 1;
        }
    }

    fn max_flow(&mut self, s: usize, t: usize) -> u32 {
        let n = self.head.len();
        let mut total = 0;
        loop {
            let mut level = vec![u32::MAX; n];
            level[s] = 0;
            let mut q = VecDeque::from([s]);
            while let Some(u) = q.pop_front() {
                let mut e = self.head[u];
                while e != NIL {
                    if self.cap[e] > 0 && level[self.to[e]] == u32::MAX {
                        level[self.to[e]] = level[u] + 1;
                        q.push_back(self.to[e]);
                    }
                    e = self.next[e];
                }
            }
            if level[t] == u32::MAX {
                return total;
            }
            let mut it = self.head.clone();
            loop {
                let f = self.augment(s, t, INF, &level, &mut it);
                if f == 0 {
                    break;
                }
                total += f;
            }
        }
    }

    fn augment(&mut self, u: usize, t: usize, f: u32, level: &[u32], it: &mut [usize]) -> u32 {
        if u == t {
            return f;
        }
        while it[u] != NIL {
            let e = it[u];
            let v = self.to[e];
            if self.cap[e] > 0 && level[v] == level[u] + 1 {
                let pushed = self.augment(v, t, f.min(self.cap[e]), level, it);
                if pushed > 0 {
                    self.cap[e] -= pushed;
                    self.cap[e ^ 1] += pushed;
                    return pushed;
                }
            }
            it[u] = self.next[e];
        }
        0
    }
}

/// The most paths from the node set `sources` to the node set `sinks` that share no link and
/// no node outside those sets. With `shortest_only`, only paths of the minimum length count.
pub fn disjoint_paths(g: &Graph, sources: &[NodeId], sinks: &[NodeId], shortest_only: bool) -> u32 {
    let n = g.nodes.len();
    let mut endpoint = vec![false; n];
    sources
        .iter()
        .chain(sinks)
        .for_each(|v| endpoint[*v as usize] = true);
    let (ds, dt) = (bfs(g, sources), bfs(g, sinks));
    let d = sinks
        .iter()
        .map(|t| ds[*t as usize])
        .min()
        .unwrap_or(u32::MAX);
    if d == u32::MAX {
        return 0;
    }
    // in(v) = 2v, out(v) = 2v + 1; super source 2n, super sink 2n + 1.
    let (s, t) = (2 * n, 2 * n + 1);
    let mut flow = Flow::new(2 * n + 2);
    for (v, &is_end) in endpoint.iter().enumerate() {
        let internal_host = g.nodes[v].kind == NodeKind::Host && !is_end;
        let cap = if is_end {
            INF
        } else if internal_host {
            0
        } else {
            1
        };
        flow.edge(2 * v, 2 * v + 1, cap);
    }
    for l in &g.links {
        for (u, v) in [(l.a, l.b), (l.b, l.a)] {
            let on_shortest = ds[u as usize] != u32::MAX
                && dt[v as usize] != u32::MAX
                && ds[u as usize] + 1 + dt[v as usize] == d;
            if shortest_only && !on_shortest {
                continue;
            }
            flow.edge(2 * u as usize + 1, 2 * v as usize, 1);
        }
    }
    for &v in sources {
        flow.edge(s, 2 * v as usize, INF);
    }
    for &v in sinks {
        flow.edge(2 * v as usize + 1, t, INF);
    }
    flow.max_flow(s, t)
}

/// The capacity (in S1 links) of the cut between `side` (true) and the rest, S1 links only.
pub fn cut_s1_links(g: &Graph, side: &[bool]) -> u64 {
    g.links
        .iter()
        .filter(|l| l.speed == Speed::S1 && side[l.a as usize] != side[l.b as usize])
        .count() as u64
}

/// Property 3's container bisector: EPSC ranks 0 and 1 with the first x/2 ASes (and their
/// hosts) against the rest, in container 0. Returns the S1 links it cuts inside the container.
pub fn modric_container_bisector_cut(m: &Modric) -> u64 {
    let g = &m.graph;
    let mut side = vec![false; g.nodes.len()];
    for r in 0..2 {
        for l in 0..m.p.q {
            side[m.eps(0, r, l) as usize] = true;
        }
    }
    for a in 0..m.p.x / 2 {
        side[m.access_switch(0, a) as usize] = true;
        for i in 0..m.p.y {
            side[m.host(0, a, i) as usize] = true;
        }
    }
    // Only links inside container 0 count towards the container's bisection.
    let in_container = |v: NodeId| m.container_of(v) == Some(0);
    g.links
        .iter()
        .filter(|l| l.speed == Speed::S1 && in_container(l.a) && in_container(l.b))
        .filter(|l| side[l.a as usize] != side[l.b as usize])
        .count() as u64
}

/// The minimum, over every split of container 0's switches that puts half its ASes (with their
/// hosts) on each side, of the S1 links cut inside the container. Brute force: small q and x.
pub fn modric_container_min_bisection(m: &Modric) -> u64 {
    let (q, x) = (m.p.q, m.p.x);
    let eps: Vec<NodeId> = (0..4)
        .flat_map(|r| (0..q).map(move |l| (r, l)))
        .map(|(r, l)| m.eps(0, r, l))
        .collect();
    let access: Vec<NodeId> = (0..x).map(|a| m.access_switch(0, a)).collect();
    let switches: Vec<NodeId> = eps.iter().chain(&access).copied().collect();
    assert!(switches.len() <= 20, "brute force is for small containers");
    let g = &m.graph;
    let mut best = u64::MAX;
    for mask in 0u32..(1 << switches.len()) {
        let as_bits = mask >> eps.len();
        if as_bits.count_ones() != x / 2 {
            continue;
        }
        let mut side = vec![false; g.nodes.len()];
        for (i, v) in switches.iter().enumerate() {
            side[*v as usize] = mask & (1 << i) != 0;
        }
        let cut = g
            .links
            .iter()
            .filter(|l| {
                l.speed == Speed::S1
                    && m.container_of(l.a) == Some(0)
                    && m.container_of(l.b) == Some(0)
            })
            .filter(|l| side[l.a as usize] != side[l.b as usize])
            .count() as u64;
        best = best.min(cut);
    }
    best
}

/// Inter-container fiber on the graph: each inter-container link's length in a grid of
/// containers L x W spaced dL, dW apart (Property 6's geometry).
pub fn modric_fiber_length(m: &Modric, l: f64, w: f64, dl: f64, dw: f64) -> f64 {
    let g = &m.graph;
    g.links
        .iter()
        .filter_map(|link| {
            let (ca, cb) = (m.container_of(link.a)?, m.container_of(link.b)?);
            (ca != cb).then(|| {
                let (ra, cola) = (ca / m.p.n, ca % m.p.n);
                let (rb, colb) = (cb / m.p.n, cb % m.p.n);
                f64::from(cola.abs_diff(colb)) * (l + dl) + f64::from(ra.abs_diff(rb)) * (w + dw)
            })
        })
        .sum()
}

/// Appendix A-C's cut of the whole grid between rows (`horizontal`: the first m/2 rows against
/// the rest) or columns, without cutting any container: the S1 links it cuts.
pub fn modric_grid_cut(m: &Modric, horizontal: bool) -> u64 {
    let g = &m.graph;
    let (rows, cols) = (m.p.m, m.p.n);
    let first_half = |c: u32| {
        if horizontal {
            c / cols < rows / 2
        } else {
            c % cols < cols / 2
        }
    };
    g.links
        .iter()
        .filter(|l| l.speed == Speed::S1)
        .filter_map(|l| Some((m.container_of(l.a)?, m.container_of(l.b)?)))
        .filter(|(a, b)| first_half(*a) != first_half(*b))
        .count() as u64
}
