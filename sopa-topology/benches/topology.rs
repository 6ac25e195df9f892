//! `cargo xtask bench topology`: time and memory to build each fabric, to compute one host's
//! full path table, and to apply one link failure incrementally (against a full recompute).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
    time::Instant,
};

use sopa_topology::{
    Topology,
    modric::ModricParams,
    paths::{Failures, PathTable},
    topology::TopologySpec,
};

/// Counts live heap bytes and their peak.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Runs `f`, returning its result, milliseconds, and the bytes it left allocated.
fn measure<T>(f: impl FnOnce() -> T) -> (T, f64, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    let start = Instant::now();
    let out = f();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    (out, ms, LIVE.load(Ordering::Relaxed).saturating_sub(before))
}

/// The command line (`cargo xtask bench topology -- --help`).
#[derive(clap::Parser)]
#[command(
    name = "bench topology",
    about = "Building the fabric models and their paths: time and memory per size"
)]
struct Cli {
    /// The smallest fabrics only, to check the benchmark runs.
    #[arg(long)]
    smoke: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let smoke = <Cli as clap::Parser>::parse().smoke;
    let specs = if smoke {
        vec![
            TopologySpec::FatTree { k: 4 },
            TopologySpec::Modric(ModricParams::new(2, 2, 1, 2, 2)),
        ]
    } else {
        vec![
            TopologySpec::FatTree { k: 16 },
            TopologySpec::FatTree { k: 32 },
            TopologySpec::FatTree { k: 48 },
            TopologySpec::FatTree { k: 64 },
            TopologySpec::Modric(ModricParams::new(10, 10, 2, 18, 40)),
            TopologySpec::Modric(ModricParams::new(25, 25, 6, 48, 40)),
        ]
    };
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>10} {:>9} {:>8}",
        "topology",
        "hosts",
        "build ms",
        "graph MiB",
        "paths",
        "table ms",
        "tbl MiB",
        "index ms",
        "update ms",
        "full ms",
        "speedup"
    );
    for spec in specs {
        let (topo, build_ms, graph_bytes) = measure(|| Topology::build(&spec).expect("valid"));
        let g = topo.graph();
        let src = g.nodes_of(sopa_topology::NodeKind::Host).next().unwrap();
        let none = Failures::none(g);
        let (mut table, table_ms, table_bytes) =
            measure(|| PathTable::compute(&topo, src, &none).unwrap());
        let paths = table.path_count();
        // A link on the source's paths: its rack switch's first uplink.
        let tor = topo.rack_of(src).unwrap().tor;
        let uplink = g
            .ports(tor)
            .iter()
            .find(|(_, n)| g.node(*n).kind.is_switch())
            .map(|(l, _)| *l)
            .unwrap();
        let mut failures = Failures::none(g);
        // The first update builds the link -> paths index; later ones only use it.
        let changed = failures.set_link(uplink, true);
        let (_, index_ms, _) = measure(|| table.update(g, &failures, &changed));
        let changed = failures.set_link(uplink, false);
        table.update(g, &failures, &changed);
        let changed = failures.set_link(uplink, true);
        let (touched, update_ms, _) = measure(|| table.update(g, &failures, &changed));
        let (fresh, full_ms, _) = measure(|| PathTable::compute(&topo, src, &failures).unwrap());
        assert_eq!(
            fresh.hops_by_prefix(),
            table.hops_by_prefix(),
            "incremental equals full"
        );
        assert!(!touched.is_empty());
        println!(
            "{:<34} {:>9} {:>9.1} {:>9.1} {:>10} {:>9.1} {:>9.1} {:>10.1} {:>10.3} {:>9.1} {:>7.0}x",
            topo.name(),
            topo.host_count(),
            build_ms,
            mib(graph_bytes),
            paths,
            table_ms,
            mib(table_bytes),
            index_ms,
            update_ms,
            full_ms,
            full_ms / update_ms
        );
        drop((fresh, table, topo));
    }
    println!("peak heap {:.0} MiB", mib(PEAK.load(Ordering::Relaxed)));
    println!(
        "(table: one host's paths to every other rack; update: one uplink failure, re-evaluating only the paths through it)"
    );
    srv6_repair(smoke);
}

/// The SRv6 local repair of one switch: building its plan (every rack's lists walked to find
/// those that reach it, when the controller's plan or failures change) and choosing its rules
/// when a port dies (on the port event, before the maps are written).
fn srv6_repair(smoke: bool) {
    use std::collections::BTreeSet;

    use sopa_topology::srv6_failover::Plan;
    let ks: &[u32] = if smoke { &[4] } else { &[4, 8, 16] };
    println!(
        "\nSRv6 local repair, one switch:\n{:<20} {:>7} {:>9} {:>10} {:>11} {:>7} {:>11}",
        "fabric", "switch", "lists in", "plan ms", "plan MiB", "rules", "react ms"
    );
    for &k in ks {
        let topo = Topology::build(&TopologySpec::FatTree { k }).expect("valid");
        let g = topo.graph();
        for name in ["a0", "c0"] {
            let me = g.find(name).expect("a switch of every Fat-Tree");
            let (plan, plan_ms, plan_bytes) =
                measure(|| Plan::new(&topo, me, &Failures::none(g)).unwrap());
            // Its first port to another switch dies.
            let port = g
                .ports(me)
                .iter()
                .find(|(_, n)| g.node(*n).kind.is_switch())
                .map(|(l, _)| *l)
                .unwrap();
            let (r, react_ms, _) = measure(|| plan.react(&topo, &BTreeSet::from([port])));
            assert!(r.unrepaired.is_empty(), "{name} of k={k}: {r:?}");
            println!(
                "{:<20} {:>7} {:>9} {:>10.1} {:>11.1} {:>7} {:>11.3}",
                topo.name(),
                name,
                plan.arrivals(),
                plan_ms,
                mib(plan_bytes),
                r.rules.len(),
                react_ms
            );
        }
    }
    println!(
        "(lists in: the distinct uSID lists that reach the switch; react: its first switch port dead)"
    );
}
