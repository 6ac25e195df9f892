//! The models against the papers: counts, path counts for every case of DESIGN.md's table,
//! path shape and hop semantics, failures, brute-force checks of the computed properties, and
//! the MODRIC paper's cost rows.

use std::collections::{BTreeSet, HashSet};

use sopa_common::wire::HOP_NONE;
use sopa_topology::{
    Graph, NodeKind, Topology,
    cost::{self, EdgeAggLinks, Prices},
    fat_tree::FatTree,
    modric::{Modric, ModricParams},
    paths::{Failures, PathTable},
    properties::{self, bfs},
    topology::TopologySpec,
};

fn fat(k: u32) -> Topology {
    Topology::build(&TopologySpec::FatTree { k }).unwrap()
}

fn modric(m: u32, n: u32, q: u32, x: u32, y: u32) -> Topology {
    Topology::build(&TopologySpec::Modric(ModricParams::new(m, n, q, x, y))).unwrap()
}

#[test]
fn fat_tree_counts_and_ports() {
    for k in [4u32, 6, 8, 12, 24] {
        let t = fat(k);
        let c = properties::counts(t.graph());
        let k = u64::from(k);
        assert_eq!(c.hosts, k.pow(3) / 4);
        assert_eq!(c.switches.values().sum::<u64>(), 5 * k * k / 4);
        assert_eq!(
            c.switch_ports_s2,
            5 * k.pow(3) / 4,
            "every switch port used"
        );
        assert_eq!(c.links_s2, 3 * k.pow(3) / 4);
    }
    assert!(FatTree::new(5).is_err());
    assert!(FatTree::new(2).is_err());
    assert!(FatTree::new(66).is_err());
}

#[test]
fn modric_counts_and_ports() {
    for (m, n, q, x, y) in [
        (2, 2, 1, 2, 4),
        (2, 3, 2, 3, 5),
        (3, 3, 3, 4, 2),
        (1, 4, 2, 3, 3),
        (4, 4, 2, 6, 2),
    ] {
        let t = modric(m, n, q, x, y);
        let c = properties::counts(t.graph());
        let (mm, nn, q, x, y) = (
            u64::from(m),
            u64::from(n),
            u64::from(q),
            u64::from(x),
            u64::from(y),
        );
        assert_eq!(c.hosts, mm * nn * x * y);
        assert_eq!(c.switches.values().sum::<u64>(), mm * nn * (4 * q + x));
        assert_eq!(
            c.switch_ports_s2,
            mm * nn * x * y,
            "Property 5: one S2 port per host"
        );
        // x <= m+n-2: one link per adjacent EPSC pair, Property 5 with this x.
        let nb = mm + nn - 2;
        assert!(x <= nb);
        assert_eq!(
            c.switch_ports_s1,
            4 * mm * nn * (q * q + 2 * q + 2 * x + nb)
        );
        if x == nb {
            assert_eq!(
                c.switch_ports_s1,
                4 * mm * nn * (q * q + 2 * q + 3 * mm + 3 * nn - 6)
            );
        }
    }
    // x > m+n-2: parallel links give every EPSC at least x inter-container links.
    let t = modric(2, 2, 1, 5, 1);
    let Topology::Modric(m) = &t else {
        unreachable!()
    };
    assert_eq!(m.p.multiplicity(), 3);
    let g = t.graph();
    let e = m.eps(0, 0, 0);
    let inter = g
        .ports(e)
        .iter()
        .filter(|(_, v)| m.container_of(*v) != Some(0))
        .count();
    assert!(inter >= 5, "{inter}");
}

#[test]
fn bad_parameters_are_refused_with_the_reason() {
    let err = |p: ModricParams| Modric::new(p).unwrap_err().to_string();
    assert!(err(ModricParams::new(0, 2, 1, 1, 1)).contains("m = 0"));
    assert!(err(ModricParams::new(2, 2, 1, 65, 1)).contains("AS bits"));
    assert!(err(ModricParams::new(2, 2, 1, 1, 63)).contains("host bits"));
    let mut p = ModricParams::new(2, 2, 1, 1, 1);
    p.bits.host = 7;
    assert!(err(p).contains("sum to 24"));
    assert!(
        Topology::build(&TopologySpec::FatTree { k: 7 })
            .unwrap_err()
            .to_string()
            .contains("even")
    );
}

/// Checks shape and hop semantics of every path of `src`'s table and returns the path count
/// per destination rack.
fn check_table(t: &Topology, src: u32, table: &PathTable, failures: &Failures) -> Vec<usize> {
    let g = t.graph();
    let mut counts = Vec::new();
    for d in &table.destinations {
        let mut seen = HashSet::new();
        for c in &d.candidates {
            assert!(seen.insert(c.hops), "hop pair {:?} twice", c.hops);
            let links = table.links(c);
            let mut at = src;
            let mut nodes = vec![src];
            for &l in links {
                let link = g.links[l as usize];
                assert!(link.a == at || link.b == at, "path is not connected");
                at = link.other(at);
                nodes.push(at);
            }
            assert_eq!(
                at, d.rack.tor,
                "a path must end at the destination rack switch"
            );
            let unique: HashSet<_> = nodes.iter().collect();
            assert_eq!(unique.len(), nodes.len(), "a path visits a node twice");
            assert_eq!(c.alive, links.iter().all(|l| failures.usable(g, *l)));
            match t {
                Topology::FatTree(f) => {
                    let agg = nodes[2];
                    assert_eq!(g.node(agg).kind, NodeKind::Aggregation);
                    assert_eq!((agg - f.agg(0, 0)) % (f.k / 2), u32::from(c.hops.hop0));
                    if c.hops.hop1 != HOP_NONE {
                        assert_eq!(nodes.len(), 6);
                        assert_eq!(
                            nodes[3],
                            f.core(u32::from(c.hops.hop0), u32::from(c.hops.hop1))
                        );
                    } else {
                        assert_eq!(nodes.len(), 4);
                    }
                }
                Topology::Modric(m) => {
                    let first_eps = nodes[2];
                    assert_eq!(g.node(first_eps).kind, NodeKind::Eps);
                    let rank = g.name(first_eps).split('.').nth(3).unwrap();
                    assert_eq!(rank, c.hops.hop0.to_string(), "hop0 is the EPSC rank");
                    // Algorithm 1: every container on the path shares a row or a column with
                    // the previous one; diagonal paths go row-first (hop1 0) or column-first.
                    let containers: Vec<u32> = nodes[1..]
                        .iter()
                        .filter_map(|v| m.container_of(*v))
                        .collect();
                    let mut hops: Vec<u32> = containers.clone();
                    hops.dedup();
                    for w in hops.windows(2) {
                        let (a, b) = (w[0], w[1]);
                        assert!(a / m.p.n == b / m.p.n || a % m.p.n == b % m.p.n);
                    }
                    if c.hops.hop1 != HOP_NONE {
                        assert_eq!(hops.len(), 3);
                        let (s, mid) = (hops[0], hops[1]);
                        if c.hops.hop1 == 0 {
                            assert_eq!(s / m.p.n, mid / m.p.n, "row-first stays in the source row");
                        } else {
                            assert_eq!(
                                s % m.p.n,
                                mid % m.p.n,
                                "column-first stays in the source column"
                            );
                        }
                    }
                }
                Topology::Clos(clos) => {
                    // Up-down: tiers rise to one turn, then fall; the hops name the uplinks.
                    let levels: Vec<u8> = nodes.iter().map(|n| clos.level(*n)).collect();
                    let top = levels
                        .iter()
                        .position(|l| *l == *levels.iter().max().unwrap());
                    let top = top.unwrap();
                    assert!(levels[..=top].windows(2).all(|w| w[1] == w[0] + 1));
                    assert!(levels[top..].windows(2).all(|w| w[1] + 1 == w[0]));
                    let leaf = nodes[1];
                    assert_eq!(clos.uplinks(leaf)[usize::from(c.hops.hop0)].1, nodes[2]);
                    if c.hops.hop1 != HOP_NONE {
                        let up = clos.uplinks(nodes[2]);
                        assert_eq!(up[usize::from(c.hops.hop1)].1, nodes[3]);
                    }
                }
            }
        }
        counts.push(d.candidates.len());
    }
    counts
}

#[test]
fn fat_tree_path_counts_per_case() {
    for k in [4u32, 6, 8] {
        let t = fat(k);
        let Topology::FatTree(f) = &t else {
            unreachable!()
        };
        let none = Failures::none(t.graph());
        let src = f.host(0, 0, 0);
        let table = PathTable::compute(&t, src, &none).unwrap();
        let counts = check_table(&t, src, &table, &none);
        // Own edge: no entry (one path, no option).
        assert!(
            table
                .destinations
                .iter()
                .all(|d| d.rack.tor != f.edge(0, 0))
        );
        assert_eq!(table.destinations.len() as u32, k * k / 2 - 1);
        for (d, n) in table.destinations.iter().zip(counts) {
            let expect = if d.rack.at.0 == 0 { k / 2 } else { k * k / 4 };
            assert_eq!(n as u32, expect, "to {}", d.prefix());
        }
    }
}

#[test]
fn modric_path_counts_per_case() {
    for (m, n, q, x) in [(2, 2, 1, 2), (2, 3, 2, 3), (3, 3, 2, 4), (1, 3, 3, 2)] {
        let t = modric(m, n, q, x, 2);
        let Topology::Modric(md) = &t else {
            unreachable!()
        };
        let none = Failures::none(t.graph());
        let src = md.host(0, 0, 0);
        let table = PathTable::compute(&t, src, &none).unwrap();
        let counts = check_table(&t, src, &table, &none);
        assert_eq!(table.destinations.len() as u32, m * n * x - 1);
        for (d, count) in table.destinations.iter().zip(counts) {
            let (c, _) = d.rack.at;
            let expect = if c == 0 || c / n == 0 || c % n == 0 {
                4
            } else {
                8
            };
            assert_eq!(count, expect, "to container {c}");
        }
    }
}

#[test]
fn failures_remove_exactly_the_paths_that_cross_them() {
    let t = fat(4);
    let Topology::FatTree(f) = &t else {
        unreachable!()
    };
    let g = t.graph();
    let src = f.host(0, 0, 0);
    let mut failures = Failures::none(g);
    let mut table = PathTable::compute(&t, src, &failures).unwrap();
    assert_eq!(table.alive_count(), table.path_count());
    // The leftmost aggregation switch of pod 0 down (the paper's failure experiment).
    let changed = failures.set_node(g, f.agg(0, 0), true);
    let touched = table.update(g, &failures, &changed);
    assert_eq!(
        touched.len(),
        table.destinations.len(),
        "every destination lost the hop0 = 0 paths"
    );
    for d in &table.destinations {
        assert!(d.alive_hops().all(|h| h.hop0 == 1));
        assert_eq!(d.alive as usize, d.candidates.len() / 2);
    }
    check_table(&t, src, &table, &failures);
    // A core link in the destination pod: only paths through that core to that pod die.
    let link = f.core_link(2, 1, 0);
    let changed = failures.set_link(link, true);
    let touched = table.update(g, &failures, &changed);
    let dead_pod2: BTreeSet<u32> = touched
        .iter()
        .map(|i| table.destinations[*i].rack.at.0)
        .collect();
    assert_eq!(dead_pod2, BTreeSet::from([2]));
    for d in table.destinations.iter().filter(|d| d.rack.at.0 == 2) {
        let alive: Vec<_> = d.alive_hops().map(|h| (h.hop0, h.hop1)).collect();
        assert_eq!(alive, [(1, 1)]);
    }
    // The incremental result equals a full recompute; restoring brings every path back.
    let fresh = PathTable::compute(&t, src, &failures).unwrap();
    assert_eq!(fresh.hops_by_prefix(), table.hops_by_prefix());
    let mut changed = failures.set_link(link, false);
    changed.extend(failures.set_node(g, f.agg(0, 0), false));
    table.update(g, &failures, &changed);
    assert_eq!(table.alive_count(), table.path_count());
}

/// Host-to-host diameter by BFS from every host (brute force).
fn brute_diameter(g: &Graph) -> u32 {
    let hosts: Vec<u32> = g.nodes_of(NodeKind::Host).collect();
    hosts
        .iter()
        .map(|h| {
            let d = bfs(g, &[*h]);
            hosts.iter().map(|o| d[*o as usize]).max().unwrap()
        })
        .max()
        .unwrap()
}

#[test]
fn diameter_matches_brute_force() {
    let t = fat(4);
    let Topology::FatTree(f) = &t else {
        unreachable!()
    };
    assert_eq!(
        properties::host_diameter_from(t.graph(), &[f.edge(0, 0)]),
        6
    );
    assert_eq!(brute_diameter(t.graph()), 6);
    for (m, n, q, x) in [
        (2, 2, 1, 2),
        (2, 3, 1, 3),
        (2, 2, 2, 2),
        (3, 3, 2, 4),
        (2, 3, 3, 3),
    ] {
        let t = modric(m, n, q, x, 1);
        let Topology::Modric(md) = &t else {
            unreachable!()
        };
        let tors: Vec<u32> = (0..x).map(|a| md.access_switch(0, a)).collect();
        let fast = properties::host_diameter_from(t.graph(), &tors);
        assert_eq!(fast, brute_diameter(t.graph()), "{m}x{n} q={q} x={x}");
        if q == 1 {
            // AS - EPS - EPS - EPS - AS plus two host links: the paper's 9 counts intra-EPSC hops
            // that a single-EPS cluster does not have.
            assert_eq!(fast, 6);
        } else {
            assert!(fast <= 9, "{fast}");
        }
    }
}

/// The most internally node- and link-disjoint paths among `paths` (brute force).
fn max_disjoint(paths: &[Vec<u32>], endpoints: &HashSet<u32>) -> usize {
    fn go(
        i: usize,
        paths: &[Vec<u32>],
        used: &mut HashSet<u32>,
        ends: &HashSet<u32>,
        links: &mut HashSet<(u32, u32)>,
    ) -> usize {
        if i == paths.len() {
            return 0;
        }
        let skip = go(i + 1, paths, used, ends, links);
        let p = &paths[i];
        let inner: Vec<u32> = p.iter().copied().filter(|v| !ends.contains(v)).collect();
        let edges: Vec<(u32, u32)> = p
            .windows(2)
            .map(|w| (w[0].min(w[1]), w[0].max(w[1])))
            .collect();
        if inner.iter().any(|v| used.contains(v)) || edges.iter().any(|e| links.contains(e)) {
            return skip;
        }
        inner.iter().for_each(|v| {
            used.insert(*v);
        });
        edges.iter().for_each(|e| {
            links.insert(*e);
        });
        let take = 1 + go(i + 1, paths, used, ends, links);
        inner.iter().for_each(|v| {
            used.remove(v);
        });
        edges.iter().for_each(|e| {
            links.remove(e);
        });
        skip.max(take)
    }
    go(
        0,
        paths,
        &mut HashSet::new(),
        endpoints,
        &mut HashSet::new(),
    )
}

/// Every shortest path (as node lists) from the set `s` to the set `t`, over switches.
fn shortest_paths(g: &Graph, s: &[u32], t: &[u32]) -> Vec<Vec<u32>> {
    let (ds, dt) = (bfs(g, s), bfs(g, t));
    let d = t.iter().map(|v| ds[*v as usize]).min().unwrap();
    let mut out = Vec::new();
    fn walk(
        g: &Graph,
        v: u32,
        d: u32,
        ds: &[u32],
        dt: &[u32],
        path: &mut Vec<u32>,
        out: &mut Vec<Vec<u32>>,
    ) {
        if dt[v as usize] == 0 {
            out.push(path.clone());
            return;
        }
        for &(_, w) in g.ports(v) {
            if g.node(w).kind != NodeKind::Host
                && ds[w as usize] == ds[v as usize] + 1
                && ds[w as usize] + dt[w as usize] == d
            {
                path.push(w);
                walk(g, w, d, ds, dt, path, out);
                path.pop();
            }
        }
    }
    for &v in s {
        if ds[v as usize] + dt[v as usize] == d {
            walk(g, v, d, &ds, &dt, &mut vec![v], &mut out);
        }
    }
    out
}

#[test]
fn disjoint_paths_match_brute_force() {
    for (m, n, q, x) in [(2, 2, 1, 2), (2, 2, 2, 2), (1, 3, 1, 2)] {
        let t = modric(m, n, q, x, 1);
        let Topology::Modric(md) = &t else {
            unreachable!()
        };
        let g = t.graph();
        let container = |c: u32| -> Vec<u32> {
            (0..4)
                .flat_map(|r| (0..q).map(move |l| (r, l)))
                .map(|(r, l)| md.eps(c, r, l))
                .chain((0..x).map(|a| md.access_switch(c, a)))
                .collect()
        };
        let mut pairs = vec![
            (vec![md.access_switch(0, 0)], vec![md.access_switch(1, 0)]),
            (container(0), container(1)),
        ];
        if m > 1 {
            pairs.push((
                vec![md.access_switch(0, 0)],
                vec![md.access_switch(n + 1, 1)],
            ));
            pairs.push((container(0), container(n + 1)));
        }
        for (s, d) in pairs {
            let flow = properties::disjoint_paths(g, &s, &d, true);
            let ends: HashSet<u32> = s.iter().chain(&d).copied().collect();
            let brute = max_disjoint(&shortest_paths(g, &s, &d), &ends);
            assert_eq!(flow as usize, brute, "{m}x{n} q={q}");
        }
    }
    // Property 2 with q = 1 and single inter-container links: 4 between ASes, 4 between
    // containers in a row, 8 between diagonal containers.
    let t = modric(2, 2, 1, 2, 1);
    let Topology::Modric(md) = &t else {
        unreachable!()
    };
    let g = t.graph();
    let all = |c: u32| -> Vec<u32> {
        (0..4)
            .map(|r| md.eps(c, r, 0))
            .chain((0..2).map(|a| md.access_switch(c, a)))
            .collect()
    };
    assert_eq!(
        properties::disjoint_paths(
            g,
            &[md.access_switch(0, 0)],
            &[md.access_switch(3, 0)],
            true
        ),
        4
    );
    assert_eq!(properties::disjoint_paths(g, &all(0), &all(1), true), 4);
    assert_eq!(properties::disjoint_paths(g, &all(0), &all(3), true), 8);
}

#[test]
fn container_bisection_and_fiber() {
    // (q, x, minimum over host-halving cuts). The paper's (2x+4q) is the capacity of its
    // particular cut, not the minimum: with q = 1, keeping all four EPSCs on one side cuts only
    // the 2x uplinks of the other side's ASes; with q = 2, splitting by EPS layer (each AS is
    // wired to one layer) cuts only the 4 intra-EPSC links.
    for (q, x, min) in [(1, 2, 4), (1, 4, 8), (2, 2, 4), (2, 4, 4)] {
        let t = modric(1, 1, q, x, 2);
        let Topology::Modric(md) = &t else {
            unreachable!()
        };
        assert_eq!(
            properties::modric_container_bisector_cut(md),
            u64::from(2 * x + 4 * q),
            "the paper's cut"
        );
        assert_eq!(
            properties::modric_container_min_bisection(md),
            min,
            "q={q} x={x}"
        );
    }
    // Appendix A-C: with m and n even, the cut between halves of the rows cuts n.m^2 S1 links,
    // between halves of the columns m.n^2 (one link per adjacent EPSC pair).
    for (m, n) in [(2, 2), (2, 4), (4, 4), (4, 2)] {
        let t = modric(m, n, 1, 2, 1);
        let Topology::Modric(md) = &t else {
            unreachable!()
        };
        assert_eq!(md.p.multiplicity(), 1);
        assert_eq!(properties::modric_grid_cut(md, true), u64::from(n * m * m));
        assert_eq!(properties::modric_grid_cut(md, false), u64::from(m * n * n));
    }
    let p = Prices::default();
    for (m, n) in [(2, 3), (3, 3), (4, 2)] {
        let t = modric(m, n, 1, m + n - 2, 1);
        let Topology::Modric(md) = &t else {
            unreachable!()
        };
        let graph =
            properties::modric_fiber_length(md, p.container_l, p.container_w, p.gap_l, p.gap_w);
        let formula = cost::fiber_length(u64::from(m), u64::from(n), &p);
        assert!(
            (graph - formula).abs() < 1e-6,
            "{m}x{n}: {graph} vs {formula}"
        );
    }
}

#[test]
fn cost_tables_reproduce_the_paper() {
    let p = Prices::default();
    for row in cost::paper_rows(&p) {
        let (a, b) = (&row.paper, &row.ours);
        assert_eq!(
            (a.hosts, a.ports_10g, a.ports_1g),
            (b.hosts, b.ports_10g, b.ports_1g),
            "{}",
            row.config
        );
        assert!(
            (a.switches_musd - b.switches_musd).abs() < 0.005,
            "{}: switches {} vs {}",
            row.config,
            a.switches_musd,
            b.switches_musd
        );
        // Cable costs follow the section VII-B rules to within 3.5% (rows noted otherwise).
        assert!(
            (a.cables_musd - b.cables_musd).abs() / a.cables_musd < 0.035,
            "{}: cables {} vs {}",
            row.config,
            a.cables_musd,
            b.cables_musd
        );
    }
    let ft = cost::fat_tree(66, EdgeAggLinks::AsPrinted, &p);
    assert!((ft.cables_musd - 0.571).abs() < 0.0005);
    let md = cost::mdcube(15, 15, 33, 1, 4, &p);
    assert!((md.cables_musd - 6.491).abs() < 0.0015);
    let mo = cost::modric(25, 25, 6, 48, 40, false, &p);
    assert!((mo.cables_musd - 38.799).abs() < 0.0015);
}

/// Inventories' paths pass the same checks as the models': valid walks from the source to the
/// destination rack, no node twice, alive exactly when their links are, up-down with the hops
/// naming the uplinks taken.
#[test]
fn inventory_paths_are_checked_like_the_models() {
    use sopa_topology::inventory::generate;
    let leaf_spine = generate::leaf_spine(&generate::LeafSpine {
        leaves: 5,
        spines: 3,
        hosts_per_leaf: 2,
        prefix: "100.64.0.0/24".parse().unwrap(),
        prefix6: None,
        links: "100.127.0.0/24".parse().unwrap(),
        links6: None,
    })
    .unwrap();
    for inv in [leaf_spine, generate::fat_tree(4).unwrap()] {
        let t = Topology::build(&TopologySpec::Inventory(Box::new(inv))).unwrap();
        let g = t.graph();
        let mut failures = Failures::none(g);
        let spine = g.nodes_of(NodeKind::Aggregation).next().unwrap();
        failures.set_link(g.ports(spine)[0].0, true);
        for src in g.nodes_of(NodeKind::Host) {
            let table = PathTable::compute(&t, src, &failures).unwrap();
            check_table(&t, src, &table, &failures);
        }
    }
}
