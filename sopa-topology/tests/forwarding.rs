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
    assert_eq!(
        forwarding::link_addresses(0),
        ("172.16.0.0".parse().unwrap(), "172.16.0.1".parse().unwrap())
    );
    assert_eq!(
        forwarding::link_addresses(300),
        (
            "172.16.2.88".parse().unwrap(),
            "172.16.2.89".parse().unwrap()
        )
    );
    let ft = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
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
