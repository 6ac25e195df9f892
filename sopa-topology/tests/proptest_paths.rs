//! Property-based: over random Fat-Trees and MODRICs and random sets of failed links and
//! switches, no live path crosses a failure, every dead path crosses one, and the incremental
//! update equals a full recompute after every step.

use proptest::prelude::*;
use sopa_topology::{
    Topology,
    modric::ModricParams,
    paths::{Failures, PathTable},
    topology::TopologySpec,
};

fn spec() -> impl Strategy<Value = TopologySpec> {
    prop_oneof![
        (2u32..=4).prop_map(|h| TopologySpec::FatTree { k: 2 * h }),
        (1u32..=3, 1u32..=3, 1u32..=3, 1u32..=4, 1u32..=2)
            .prop_map(|(m, n, q, x, y)| TopologySpec::Modric(ModricParams::new(m, n, q, x, y))),
    ]
}

/// A failure event: a link (by index modulo the link count) or a switch, down or up.
#[derive(Clone, Debug)]
enum Event {
    Link(usize, bool),
    Switch(usize, bool),
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(
        prop_oneof![
            (any::<usize>(), any::<bool>()).prop_map(|(i, d)| Event::Link(i, d)),
            (any::<usize>(), any::<bool>()).prop_map(|(i, d)| Event::Switch(i, d)),
        ],
        1..12,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn failures_and_incremental_updates(spec in spec(), src_pick in any::<usize>(), events in events()) {
        let topo = Topology::build(&spec).unwrap();
        let g = topo.graph();
        let hosts: Vec<u32> = g.nodes_of(sopa_topology::NodeKind::Host).collect();
        let switches: Vec<u32> = g.nodes.iter().enumerate().filter(|(_, n)| n.kind.is_switch()).map(|(i, _)| i as u32).collect();
        let src = hosts[src_pick % hosts.len()];
        let mut failures = Failures::none(g);
        let mut table = PathTable::compute(&topo, src, &failures).unwrap();
        for event in events {
            let changed = match event {
                Event::Link(i, down) => failures.set_link((i % g.links.len()) as u32, down),
                Event::Switch(i, down) => failures.set_node(g, switches[i % switches.len()], down),
            };
            table.update(g, &failures, &changed);
            for d in &table.destinations {
                let mut alive = 0;
                for c in &d.candidates {
                    let crosses = table.links(c).iter().any(|l| !failures.usable(g, *l));
                    prop_assert_eq!(c.alive, !crosses);
                    alive += u32::from(c.alive);
                }
                prop_assert_eq!(alive, d.alive);
            }
            let fresh = PathTable::compute(&topo, src, &failures).unwrap();
            prop_assert_eq!(fresh.hops_by_prefix(), table.hops_by_prefix());
        }
    }
}
