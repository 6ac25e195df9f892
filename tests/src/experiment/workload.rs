//! The experiments' workloads: who sends to whom and how much (the permutation, the
//! production workload's VL2 sizes, the sequential runs' flows), and the failure experiment's
//! failed switch.

use std::collections::BTreeMap;

use sopa_topology::NodeKind;

use crate::fabric::Fabric;

/// The largest flow counted as short (about half of the production workload's flows).
pub const SHORT_FLOW_BYTES: u64 = 100_000;

/// xorshift64 for reproducible random permutations.
pub fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Every host of the fabric, by name, in node order.
fn host_names(f: &Fabric) -> Vec<String> {
    f.topo
        .graph()
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Host)
        .map(|n| n.name.clone())
        .collect()
}

/// (source, destination) host names of one round of the experiment.
pub fn flows(f: &Fabric, experiment: &str, seed: u64) -> Vec<(String, String)> {
    let g = f.topo.graph();
    let hosts = host_names(f);
    match experiment {
        "sec4.2" => {
            assert!(
                hosts.len() == 16 && f.topo.name().starts_with("Fat-Tree"),
                "sec4.2 is defined on Fat-Tree k=4"
            );
            [("h0", "h4"), ("h0", "h5"), ("h1", "h4"), ("h1", "h5")]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        }
        // The granularity sweep runs on the permutation.
        "permutation" | "granularity" => {
            // A random permutation without fixed points: every host sends to one other host and
            // receives from one.
            let mut next = rng(seed);
            let n = hosts.len();
            let mut perm: Vec<usize> = (0..n).collect();
            loop {
                for i in (1..n).rev() {
                    perm.swap(i, (next() % (i as u64 + 1)) as usize);
                }
                if perm.iter().enumerate().all(|(i, p)| i != *p) {
                    break;
                }
            }
            (0..n)
                .map(|i| (hosts[i].clone(), hosts[perm[i]].clone()))
                .collect()
        }
        "modric-1to1" | "modric-all" => {
            // The MODRIC paper's experiment set 3 on its container grid: one-to-one pairs each
            // container with the one diagonally across (every flow crosses a row and a column);
            // all-to-all sends host i of a container to host i of another container, the
            // containers taken in turn, so every container talks to every other.
            let sopa_topology::topology::TopologySpec::Modric(p) = f.topo.spec() else {
                panic!("{experiment} is defined on MODRIC");
            };
            let containers = p.m * p.n;
            let at = |h: &str| {
                let r = f.topo.rack_of(g.find(h).unwrap()).unwrap();
                r.at.0
            };
            let mut by_container: BTreeMap<u32, Vec<String>> = BTreeMap::new();
            for h in &hosts {
                by_container.entry(at(h)).or_default().push(h.clone());
            }
            let mut out = Vec::new();
            for (c, members) in &by_container {
                for (i, h) in members.iter().enumerate() {
                    let to = if experiment == "modric-1to1" {
                        containers - 1 - c
                    } else {
                        (c + 1 + (i as u32) % (containers - 1)) % containers
                    };
                    out.push((h.clone(), by_container[&to][i].clone()));
                }
            }
            out
        }
        other => panic!(
            "experiment {other:?}: sec4.2, permutation, production, failure, modric-1to1 or modric-all"
        ),
    }
}

/// The switch the failure experiment takes down: the leftmost aggregation switch of pod 0.
pub const FAILED_SWITCH: &str = "a0";

/// A flow size from a VL2-like distribution: 95% under 1 MB (10 KB to 1 MB), 3.5% from 1 to
/// 10 MB, 1.5% from 10 to 30 MB, each log-uniform.
pub fn vl2_size(next: &mut impl FnMut() -> u64) -> u64 {
    let u = (next() % 1_000_000) as f64 / 1e6;
    let v = (next() % 1_000_000) as f64 / 1e6;
    let (lo, hi): (f64, f64) = if u < 0.95 {
        (10e3, 1e6)
    } else if u < 0.985 {
        (1e6, 10e6)
    } else {
        (10e6, 30e6)
    };
    (lo * (hi / lo).powf(v)) as u64
}

/// The production workload: every host sends `per_host` flows one after the other, each to a
/// random other host, sizes from [`vl2_size`].
pub fn production(f: &Fabric, seed: u64, per_host: u32) -> Vec<(String, Vec<(String, u64)>)> {
    let hosts = host_names(f);
    let mut next = rng(seed ^ 0x5052_4f44);
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let flows = (0..per_host)
                .map(|_| {
                    let mut d = (next() % (hosts.len() as u64 - 1)) as usize;
                    if d >= i {
                        d += 1;
                    }
                    (hosts[d].clone(), vl2_size(&mut next))
                })
                .collect();
            (h.clone(), flows)
        })
        .collect()
}

/// Takes switch `name` down for real: every one of its interfaces down, so its neighbours'
/// switch agents see the ports go and report them; waits until the controller knows and the
/// hosts' path tables have dropped the paths through it. Returns the interfaces.
pub fn fail_switch(f: &Fabric, name: &str) -> Vec<String> {
    let g = f.topo.graph();
    let n = g.find(name).expect("a switch");
    let ifaces: Vec<String> = g
        .ports(n)
        .iter()
        .map(|(_, peer)| f.link_iface(name, g.name(*peer)))
        .collect();
    for i in &ifaces {
        f.ns(name)
            .ip(&["link", "set", i, "down"])
            .expect("link down");
    }
    let ports = ifaces.len();
    f.wait_applied(|down| down >= ports, "the failure")
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{name} down: {ports} links reported down by its neighbours");
    ifaces
}

pub fn restore_switch(f: &Fabric, name: &str, ifaces: &[String]) {
    for i in ifaces {
        f.ns(name).ip(&["link", "set", i, "up"]).expect("link up");
    }
    f.wait_applied(|down| down == 0, "the restore")
        .unwrap_or_else(|e| panic!("{e}"));
}
