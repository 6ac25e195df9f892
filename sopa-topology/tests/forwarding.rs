//! The switches' plans realize the model's paths: walking every candidate path of every host
//! hop by hop through the plans (decisions by hop byte, kernel routes otherwise) crosses exactly
//! the links the path model lists, and ends at the destination rack.

use sopa_common::wire::HOP_NONE;
use sopa_topology::{
    Topology,
    forwarding::{self, SwitchPlan},
    modric::ModricParams,
    paths::{Failures, PathTable},
    topology::TopologySpec,
};

fn walk(topo: &Topology, plans: &std::collections::BTreeMap<u32, SwitchPlan>) -> usize {
    let g = topo.graph();
    let none = Failures::none(g);
    let mut walked = 0;
    for src in g.nodes_of(sopa_topology::NodeKind::Host) {
        let table = PathTable::compute(topo, src, &none).unwrap();
        for d in &table.destinations {
            for c in &d.candidates {
                let links = table.links(c);
                let mut at = g.links[links[0] as usize].other(src);
                for (i, &expected) in links[1..].iter().enumerate() {
                    let plan = &plans[&at];
                    let next = match plan.decisions.iter().find(|x| x.prefix == d.prefix()) {
                        Some(dec) => {
                            let hop = if dec.hop_byte == 1 {
                                c.hops.hop0
                            } else {
                                c.hops.hop1
                            };
                            assert_ne!(
                                hop, HOP_NONE,
                                "a decision on a byte the path does not carry"
                            );
                            dec.uplinks[usize::from(hop)]
                        }
                        None => {
                            let route = plan
                                .routes
                                .iter()
                                .find(|r| r.prefix == d.prefix())
                                .unwrap_or_else(|| {
                                    panic!("{} has no route to {}", g.name(at), d.prefix())
                                });
                            assert!(
                                route.links.contains(&expected),
                                "{} routes {} away from the path (hop {i})",
                                g.name(at),
                                d.prefix()
                            );
                            expected
                        }
                    };
                    assert_eq!(
                        next,
                        expected,
                        "{}: {} -> {:?} leaves {} by the wrong link",
                        g.name(src),
                        d.prefix(),
                        c.hops,
                        g.name(at)
                    );
                    at = g.links[next as usize].other(at);
                }
                assert_eq!(at, d.rack.tor);
                walked += 1;
            }
        }
    }
    walked
}

#[test]
fn fat_tree_plans_realize_every_path() {
    for k in [4, 6] {
        let topo = Topology::build(&TopologySpec::FatTree { k }).unwrap();
        let plans = forwarding::plans(&topo);
        let walked = walk(&topo, &plans);
        let k = k as usize;
        let hosts = k * k * k / 4;
        // Per host: (k/2 - 1) racks in its pod with k/2 paths, (k-1)k/2 racks with (k/2)^2.
        assert_eq!(
            walked,
            hosts * ((k / 2 - 1) * (k / 2) + (k - 1) * (k / 2) * (k * k / 4))
        );
    }
}

#[test]
fn modric_plans_realize_every_path() {
    for (m, n, q, x) in [
        (2, 2, 1, 2),
        (2, 3, 1, 3),
        (3, 3, 1, 4),
        (2, 2, 2, 2),
        (3, 3, 2, 4),
    ] {
        let topo =
            Topology::build(&TopologySpec::Modric(ModricParams::new(m, n, q, x, 1))).unwrap();
        let plans = forwarding::plans(&topo);
        assert!(walk(&topo, &plans) > 0);
    }
}

#[test]
fn link_addresses_and_gateways() {
    let ft = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
    assert_eq!(
        forwarding::link_addresses(&ft, 0),
        (
            "172.16.0.0".parse().unwrap(),
            "172.16.0.1".parse().unwrap(),
            31
        )
    );
    assert_eq!(
        forwarding::link_addresses(&ft, 300),
        (
            "172.16.2.88".parse().unwrap(),
            "172.16.2.89".parse().unwrap(),
            31
        )
    );
    let rack = ft.racks()[3];
    assert_eq!(
        forwarding::gateway(&ft, &rack),
        "10.1.1.1".parse::<std::net::Ipv4Addr>().unwrap()
    );
    let md = Topology::build(&TopologySpec::Modric(ModricParams::new(2, 2, 1, 2, 4))).unwrap();
    let rack = md.racks()[0];
    assert_eq!(rack.prefix.to_string(), "10.0.0.0/26");
    assert_eq!(forwarding::gateway(&md, &rack).to_string(), "10.0.0.63");
}

/// With pod 0's leftmost aggregation switch down, kernel routes avoid not only its dead links
/// but every next hop that can no longer reach pod 0: pod 1's edges send pod-0 traffic only to
/// the aggregation switch whose cores still reach it, and no route anywhere uses a dead link.
#[test]
fn kernel_routes_follow_the_live_shortest_paths() {
    let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
    let g = topo.graph();
    let a0 = g.find("a0").unwrap();
    let mut failures = sopa_topology::paths::Failures::none(g);
    failures.set_node(g, a0, true);
    let pod0: Vec<_> = topo.racks().into_iter().filter(|r| r.at.0 == 0).collect();
    let e2 = g.find("e2").unwrap();
    let before = sopa_topology::forwarding::plan(&topo, e2);
    let after = sopa_topology::forwarding::plan_under(&topo, e2, &failures);
    for rack in &pod0 {
        let route = |p: &SwitchPlan| {
            p.routes
                .iter()
                .find(|r| r.prefix == rack.prefix)
                .unwrap()
                .links
                .iter()
                .map(|l| g.name(g.links[*l as usize].other(e2)).to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            route(&before),
            ["a2", "a3"],
            "both aggregation switches, all up"
        );
        assert_eq!(
            route(&after),
            ["a3"],
            "a2's cores (c0, c1) lost pod 0 with a0"
        );
    }
    assert_eq!(
        after.decisions, before.decisions,
        "decisions stay: hosts steer"
    );
    for node in g.nodes_of(sopa_topology::NodeKind::Core) {
        for r in sopa_topology::forwarding::routes(&topo, node, &failures) {
            for l in &r.links {
                assert!(
                    failures.usable(g, *l),
                    "{} routes over a dead link",
                    g.name(node)
                );
            }
        }
    }
    // c0's only way into pod 0 was a0: it now goes round through another pod (a valley),
    // which no edge switch uses since none of them routes pod-0 traffic to c0 any more.
    let c0 = g.find("c0").unwrap();
    let c0_routes = sopa_topology::forwarding::routes(&topo, c0, &failures);
    let to_pod0 = c0_routes
        .iter()
        .find(|r| r.prefix == pod0[0].prefix)
        .expect("still reachable the long way");
    assert!(
        to_pod0
            .links
            .iter()
            .all(|l| g.links[*l as usize].other(c0) != a0)
    );
}
