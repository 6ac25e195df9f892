//! `sopactl topo describe | paths | compare`.

use std::fmt::Write as _;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use serde::Serialize;
use sopa_common::wire::HOP_NONE;
use sopa_topology::{
    NodeKind, Topology,
    cost::{self, EdgeAggLinks, Prices},
    modric::{AddressBits, Modric, ModricParams},
    paths::{Failures, PathTable},
    properties,
    topology::TopologySpec,
};

#[derive(Subcommand)]
pub enum TopoCommand {
    /// Properties computed on the graph beside the papers' formulas, and the cost.
    Describe {
        #[command(flatten)]
        topo: TopoArgs,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
    /// The candidate paths between two hosts, with hop bytes, nodes and liveness.
    Paths {
        #[command(flatten)]
        topo: TopoArgs,
        /// Source host: address or name.
        #[arg(long)]
        src: String,
        /// Destination host: address or name.
        #[arg(long)]
        dst: String,
        /// A failed link, as NODE:NODE (repeatable).
        #[arg(long = "fail")]
        fail: Vec<String>,
        /// A failed switch, by name (repeatable).
        #[arg(long = "fail-switch")]
        fail_switch: Vec<String>,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
    /// Cost tables of the MODRIC paper beside this model's figures.
    Compare {
        /// Tables III and V of the MODRIC paper, row by row.
        #[arg(long, required = true)]
        paper_tables: bool,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub struct TopoArgs {
    /// A Fat-Tree of K-port switches (K even, 4 to 64).
    #[arg(
        long,
        value_name = "K",
        conflicts_with_all = ["modric", "inventory"],
        required_unless_present_any = ["modric", "inventory"]
    )]
    fat_tree: Option<u32>,
    /// An inventory file (`sopactl fabric check` says what it refuses).
    #[arg(long, value_name = "FILE", conflicts_with = "modric")]
    inventory: Option<std::path::PathBuf>,
    /// A MODRIC grid of M x N containers.
    #[arg(long, num_args = 2, value_names = ["M", "N"])]
    modric: Option<Vec<u32>>,
    /// MODRIC: EPSes per EPSC.
    #[arg(long, default_value_t = 1)]
    q: u32,
    /// MODRIC: access switches per container (default m+n-2, at least 1).
    #[arg(long)]
    x: Option<u32>,
    /// MODRIC: hosts per access switch (default 4C/c).
    #[arg(long)]
    y: Option<u32>,
    /// MODRIC: S1 link speed, Gbit/s.
    #[arg(long, default_value_t = 10.0)]
    s1: f64,
    /// MODRIC: S2 link speed, Gbit/s.
    #[arg(long, default_value_t = 1.0)]
    s2: f64,
    /// MODRIC: address bits row,col,as,host (summing to 24).
    #[arg(long, value_name = "R,C,A,H")]
    bits: Option<String>,
}

impl TopoArgs {
    fn spec(&self) -> Result<TopologySpec> {
        if let Some(k) = self.fat_tree {
            return Ok(TopologySpec::FatTree { k });
        }
        if let Some(path) = &self.inventory {
            return Ok(crate::inventory::read(path)?.0);
        }
        let Some([m, n]) = self.modric.as_deref().map(|v| [v[0], v[1]]) else {
            bail!("give --fat-tree K or --modric M N");
        };
        let mut p = ModricParams::new(m, n, self.q, 1, 1);
        p.x = self.x.unwrap_or((m + n).saturating_sub(2).max(1));
        p.s1_gbps = self.s1;
        p.s2_gbps = self.s2;
        p.y = self.y.unwrap_or((4.0 * self.s1 / self.s2).floor() as u32);
        if let Some(bits) = &self.bits {
            let v: Vec<u8> = bits
                .split(',')
                .map(|b| b.trim().parse())
                .collect::<Result<_, _>>()
                .with_context(|| format!("--bits {bits:?}: write four numbers like 6,6,6,6"))?;
            let [row, col, access, host] = v[..] else {
                bail!("--bits {bits:?}: give four numbers (row, col, as, host)");
            };
            p.bits = AddressBits {
                row,
                col,
                access,
                host,
            };
        }
        Ok(TopologySpec::Modric(p))
    }

    fn build(&self) -> Result<Topology> {
        Ok(Topology::build(&self.spec()?)?)
    }
}

pub fn run(cmd: TopoCommand) -> Result<()> {
    match cmd {
        TopoCommand::Describe { topo, json } => {
            let t = topo.build()?;
            let d = describe(&t);
            if json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                print!("{}", render(&d));
            }
            Ok(())
        }
        TopoCommand::Paths {
            topo,
            src,
            dst,
            fail,
            fail_switch,
            json,
        } => paths(&topo.build()?, &src, &dst, &fail, &fail_switch, json),
        TopoCommand::Compare { json, .. } => compare(json),
    }
}

/// One property: what the graph gives beside what the paper says.
#[derive(Serialize)]
struct Row {
    property: String,
    graph: String,
    paper: String,
}

#[derive(Serialize)]
struct Description {
    topology: String,
    counts: properties::Counts,
    rows: Vec<Row>,
    /// The papers' cost model; none for an operator's inventory.
    cost: Option<cost::Cost>,
}

fn row(property: &str, graph: impl ToString, paper: impl ToString) -> Row {
    Row {
        property: property.into(),
        graph: graph.to_string(),
        paper: paper.to_string(),
    }
}

/// Graphs above this many nodes skip the max-flow and brute-force properties.
const FLOW_LIMIT: usize = 300_000;

fn describe(t: &Topology) -> Description {
    let g = t.graph();
    let counts = properties::counts(g);
    let mut rows = Vec::new();
    let prices = Prices::default();
    let small = g.nodes.len() <= FLOW_LIMIT;
    let skipped = || format!("skipped (more than {FLOW_LIMIT} nodes)");
    match t {
        Topology::FatTree(f) => {
            let k = u64::from(f.k);
            rows.push(row(
                "hosts",
                counts.hosts,
                format!("k^3/4 = {}", k.pow(3) / 4),
            ));
            let switches: u64 = counts.switches.values().sum();
            rows.push(row(
                "switches",
                switches,
                format!("5k^2/4 = {}", 5 * k * k / 4),
            ));
            rows.push(row(
                "switch ports (all one speed)",
                counts.switch_ports_s2,
                format!("5R^3/4 = {}", 5 * k.pow(3) / 4),
            ));
            rows.push(row(
                "diameter, host to host (links)",
                properties::host_diameter_from(g, &[f.edge(0, 0)]),
                6,
            ));
            if small {
                let far = properties::disjoint_paths(g, &[f.edge(0, 0)], &[f.edge(1, 0)], true);
                rows.push(row(
                    "node-disjoint shortest paths, edge to edge in other pods",
                    far,
                    format!("k/2 = {}", k / 2),
                ));
                let pods = properties::disjoint_paths(
                    g,
                    &(0..f.k / 2)
                        .flat_map(|e| [f.edge(0, e), f.agg(0, e)])
                        .collect::<Vec<_>>(),
                    &(0..f.k / 2)
                        .flat_map(|e| [f.edge(1, e), f.agg(1, e)])
                        .collect::<Vec<_>>(),
                    true,
                );
                rows.push(row(
                    "node-disjoint shortest paths, pod to pod",
                    pods,
                    format!("(k/2)^2 = {}", k * k / 4),
                ));
            } else {
                rows.push(row("node-disjoint shortest paths", skipped(), "-"));
            }
            let mut side = vec![false; g.nodes.len()];
            for v in 0..g.nodes.len() as u32 {
                let pod = match g.node(v).kind {
                    NodeKind::Host => Some(f.host_at(v).pod),
                    NodeKind::Edge | NodeKind::Aggregation => {
                        g.node(v).addr.map(|a| u32::from(a.octets()[1]))
                    }
                    _ => None,
                };
                side[v as usize] = pod.is_some_and(|p| p < f.k / 2);
            }
            // Cores split by group: half the groups on each side.
            for a in 0..f.k / 2 {
                for j in 0..f.k / 2 {
                    side[f.core(a, j) as usize] = a < f.k / 4;
                }
            }
            let cut = g
                .links
                .iter()
                .filter(|l| side[l.a as usize] != side[l.b as usize])
                .count();
            rows.push(row(
                "bisection: links cut by a pod-halving cut",
                cut,
                format!("k^3/8 = {} (full bisection)", k.pow(3) / 8),
            ));
            Description {
                topology: t.name(),
                counts,
                rows,
                cost: Some(cost::fat_tree(k, EdgeAggLinks::Actual, &prices)),
            }
        }
        Topology::Modric(m) => {
            let p = m.p;
            let (mm, nn, q, x, y) = (
                u64::from(p.m),
                u64::from(p.n),
                u64::from(p.q),
                u64::from(p.x),
                u64::from(p.y),
            );
            let ratio = (4.0 * p.s1_gbps / p.s2_gbps).floor() as u64;
            rows.push(row(
                "hosts",
                counts.hosts,
                format!("m.n.x.y = {}", mm * nn * x * y),
            ));
            rows.push(row(
                "max hosts (Property 4)",
                "-",
                format!("m.n.(m+n-2).(4C/c) = {}", mm * nn * (mm + nn - 2) * ratio),
            ));
            let switches: u64 = counts.switches.values().sum();
            rows.push(row(
                "switches",
                switches,
                format!("m.n.(4q+x) = {}", mm * nn * (4 * q + x)),
            ));
            rows.push(row(
                "S2 switch ports (Property 5)",
                counts.switch_ports_s2,
                format!("hosts = {}", mm * nn * x * y),
            ));
            let nb = mm + nn - 2;
            rows.push(row(
                "S1 switch ports (Property 5)",
                counts.switch_ports_s1,
                format!(
                    "4mn(q^2+2q+3m+3n-6) = {} (x = m+n-2); with this x and one link per adjacent pair 4mn(q^2+2q+2x+m+n-2) = {}",
                    4 * mm * nn * (q * q + 2 * q + 3 * nb),
                    4 * mm * nn * (q * q + 2 * q + 2 * x + nb)
                ),
            ));
            rows.push(row(
                "parallel links per adjacent EPSC pair",
                p.multiplicity(),
                "extra links when x > m+n-2",
            ));
            let tors: Vec<u32> = (0..p.x).map(|a| m.access_switch(0, a)).collect();
            rows.push(row(
                "diameter, host to host (links)",
                properties::host_diameter_from(g, &tors),
                9,
            ));
            if small {
                disjoint_rows(m, &mut rows);
            } else {
                rows.push(row("node-disjoint shortest paths", skipped(), "-"));
            }
            let bisector = properties::modric_container_bisector_cut(m);
            rows.push(row(
                "container bisection, the paper's cut (S1 links)",
                bisector,
                format!("2x+4q = {}", 2 * x + 4 * q),
            ));
            if 4 * p.q + p.x <= 16 {
                rows.push(row(
                    "container bisection, min over host-halving cuts (S1 links)",
                    properties::modric_container_min_bisection(m),
                    "-",
                ));
            }
            let mult = u64::from(p.multiplicity());
            if p.m % 2 == 0 && p.m > 1 {
                rows.push(row(
                    "network bisection, horizontal cut (S1 links)",
                    properties::modric_grid_cut(m, true),
                    format!("n.m^2 = {} (x {mult} parallel)", nn * mm * mm),
                ));
            }
            if p.n % 2 == 0 && p.n > 1 {
                rows.push(row(
                    "network bisection, vertical cut (S1 links)",
                    properties::modric_grid_cut(m, false),
                    format!("m.n^2 = {} (x {mult} parallel)", mm * nn * nn),
                ));
            }
            let pr = &prices;
            rows.push(row(
                "inter-container fiber (m)",
                format!(
                    "{:.1}",
                    properties::modric_fiber_length(
                        m,
                        pr.container_l,
                        pr.container_w,
                        pr.gap_l,
                        pr.gap_w
                    )
                ),
                format!("Property 6 = {:.1}", cost::fiber_length(mm, nn, pr)),
            ));
            Description {
                topology: t.name(),
                counts,
                rows,
                cost: Some(cost::modric(mm, nn, q, x, y, false, &prices)),
            }
        }
        Topology::Clos(c) => Description {
            topology: t.name(),
            counts,
            rows: clos_rows(c),
            cost: None,
        },
    }
}

/// An inventory's shape: tiers, racks, and the spread of path counts between racks.
fn clos_rows(c: &sopa_topology::clos::Clos) -> Vec<Row> {
    let g = &c.graph;
    let mut rows = vec![
        row("tiers", c.tiers(), "-"),
        row("racks", c.racks().len(), "-"),
    ];
    for level in 1..=c.tiers() {
        let switches: Vec<_> = (0..g.nodes.len() as u32)
            .filter(|n| c.level(*n) == level)
            .collect();
        let ups: Vec<usize> = switches.iter().map(|n| c.uplinks(*n).len()).collect();
        let (lo, hi) = (ups.iter().min(), ups.iter().max());
        if let (Some(lo), Some(hi)) = (lo, hi)
            && *hi > 0
        {
            rows.push(row(
                &format!("uplinks per tier-{level} switch (min-max)"),
                format!("{lo}-{hi}"),
                "-",
            ));
        }
    }
    // Paths from one host of each rack to every other rack.
    let topo = Topology::Clos(Box::new(c.clone()));
    let (mut lo, mut hi) = (usize::MAX, 0);
    for rack in c.racks() {
        let Some(src) = (0..c.hosts())
            .find(|h| c.racks()[c.rack_index(*h).unwrap_or(0) as usize].tor == rack.tor)
        else {
            continue;
        };
        if let Ok(table) = PathTable::compute(&topo, src, &Failures::none(g)) {
            for d in &table.destinations {
                lo = lo.min(d.candidates.len());
                hi = hi.max(d.candidates.len());
            }
        }
    }
    if hi > 0 {
        rows.push(row(
            "paths between two racks (min-max)",
            format!("{lo}-{hi}"),
            "-",
        ));
    }
    rows
}

fn disjoint_rows(m: &Modric, rows: &mut Vec<Row>) {
    let g = &m.graph;
    let p = m.p;
    let container = |c: u32| -> Vec<u32> {
        (0..4)
            .flat_map(|r| (0..p.q).map(move |l| (r, l)))
            .map(|(r, l)| m.eps(c, r, l))
            .chain((0..p.x).map(|a| m.access_switch(c, a)))
            .collect()
    };
    if p.n > 1 {
        let same_row =
            properties::disjoint_paths(g, &[m.access_switch(0, 0)], &[m.access_switch(1, 0)], true);
        rows.push(row(
            "node-disjoint shortest paths, AS to AS, same row",
            same_row,
            4,
        ));
        let c = properties::disjoint_paths(g, &container(0), &container(1), true);
        rows.push(row(
            "node-disjoint shortest paths, container to container, same row",
            c,
            4,
        ));
    }
    if p.m > 1 && p.n > 1 {
        let diag = p.n + 1;
        let a = properties::disjoint_paths(
            g,
            &[m.access_switch(0, 0)],
            &[m.access_switch(diag, 0)],
            true,
        );
        rows.push(row(
            "node-disjoint shortest paths, AS to AS, diagonal",
            a,
            4,
        ));
        let c = properties::disjoint_paths(g, &container(0), &container(diag), true);
        rows.push(row(
            "node-disjoint shortest paths, container to container, diagonal",
            c,
            8,
        ));
    }
}

fn render(d: &Description) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", d.topology);
    let _ = writeln!(
        s,
        "links: {} S1, {} S2; switches: {}",
        d.counts.links_s1,
        d.counts.links_s2,
        d.counts
            .switches
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(s, "{:<62} {:>14}  paper", "property", "graph");
    for r in &d.rows {
        let _ = writeln!(s, "{:<62} {:>14}  {}", r.property, r.graph, r.paper);
    }
    if let Some(c) = &d.cost {
        let _ = writeln!(
            s,
            "cost: {} 10GbE + {} GbE ports = {:.3} M$ switches, {:.3} M$ cables, {:.3} M$ total",
            c.ports_10g, c.ports_1g, c.switches_musd, c.cables_musd, c.total_musd
        );
    }
    s
}

#[derive(Serialize)]
struct PathOut {
    hop0: u8,
    hop1: Option<u8>,
    alive: bool,
    nodes: Vec<String>,
    failed: Vec<String>,
}

fn paths(
    t: &Topology,
    src: &str,
    dst: &str,
    fail: &[String],
    fail_switch: &[String],
    json: bool,
) -> Result<()> {
    let g = t.graph();
    let s = t
        .resolve_host(src)
        .with_context(|| format!("--src {src}"))?;
    let d = t
        .resolve_host(dst)
        .with_context(|| format!("--dst {dst}"))?;
    let mut failures = Failures::none(g);
    for f in fail {
        let link = t.resolve_link(f).with_context(|| format!("--fail {f}"))?;
        failures.set_link(link, true);
    }
    for f in fail_switch {
        let node = g
            .find(f)
            .with_context(|| format!("--fail-switch {f}: no such node"))?;
        if !g.node(node).kind.is_switch() {
            bail!("--fail-switch {f}: not a switch");
        }
        failures.set_node(g, node, true);
    }
    let rack = t.rack_of(d)?;
    let table = PathTable::compute(t, s, &failures)?;
    let last = t.host_link(d);
    let mut out = Vec::new();
    if let Some(dest) = table.destinations.iter().find(|x| x.rack.tor == rack.tor) {
        for c in &dest.candidates {
            let mut links = table.links(c).to_vec();
            links.push(last);
            out.push(describe_path(g, s, &links, c.hops, &failures));
        }
    } else {
        // Same rack: one path, no option.
        let links = [t.host_link(s), last];
        let mut p = describe_path(
            g,
            s,
            &links,
            sopa_topology::Hops {
                hop0: 0,
                hop1: HOP_NONE,
            },
            &failures,
        );
        p.hop1 = None;
        out.push(p);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let alive = out.iter().filter(|p| p.alive).count();
    println!(
        "{} -> {}: {} candidate paths, {alive} alive (prefix {})",
        g.name(s),
        g.name(d),
        out.len(),
        rack.prefix
    );
    for p in &out {
        let hops = match p.hop1 {
            Some(h1) => format!("[{}, {h1}]", p.hop0),
            None if out.len() == 1 && table.destinations.iter().all(|x| x.rack.tor != rack.tor) => {
                "none".into()
            }
            None => format!("[{}]", p.hop0),
        };
        let state = if p.alive {
            "alive".to_owned()
        } else {
            format!("DEAD ({})", p.failed.join(", "))
        };
        println!("  {hops:<9} {:<6} {}", state, p.nodes.join(" > "));
    }
    Ok(())
}

fn describe_path(
    g: &sopa_topology::Graph,
    src: u32,
    links: &[u32],
    hops: sopa_topology::Hops,
    f: &Failures,
) -> PathOut {
    let mut nodes = vec![g.name(src).to_owned()];
    let mut at = src;
    let mut failed = Vec::new();
    for &l in links {
        at = g.links[l as usize].other(at);
        nodes.push(g.name(at).to_owned());
        if !f.usable(g, l) {
            failed.push(g.link_name(l));
        }
    }
    PathOut {
        hop0: hops.hop0,
        hop1: (hops.hop1 != HOP_NONE).then_some(hops.hop1),
        alive: failed.is_empty(),
        nodes,
        failed,
    }
}

fn compare(json: bool) -> Result<()> {
    let rows = cost::paper_rows(&Prices::default());
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "rows": rows, "errata": cost::PAPER_ERRATA })
            )?
        );
        return Ok(());
    }
    for table in ["III", "V"] {
        println!("MODRIC paper, Table {table}: printed | this model");
        println!(
            "{:<44} {:>17} {:>17} {:>17} {:>15} {:>15} {:>17}",
            "configuration",
            "hosts",
            "10GbE ports",
            "GbE ports",
            "switches M$",
            "cables M$",
            "total M$"
        );
        for r in rows.iter().filter(|r| r.table == table) {
            let (a, b) = (&r.paper, &r.ours);
            println!(
                "{:<44} {:>8}|{:<8} {:>8}|{:<8} {:>8}|{:<8} {:>7.3}|{:<7.3} {:>7.3}|{:<7.3} {:>8.3}|{:<8.3}",
                r.config,
                a.hosts,
                b.hosts,
                a.ports_10g,
                b.ports_10g,
                a.ports_1g,
                b.ports_1g,
                a.switches_musd,
                b.switches_musd,
                a.cables_musd,
                b.cables_musd,
                a.total_musd,
                b.total_musd
            );
            for note in &r.notes {
                println!("    note: {note}");
            }
        }
        println!();
    }
    println!("Inconsistencies in the paper:");
    for e in cost::PAPER_ERRATA {
        println!("  - {e}");
    }
    Ok(())
}
