//! MODRIC 2x2 in namespaces (q = 1, x = 2 access switches of 2 hosts per container): all-pairs
//! reachability, and flows spread equally over 8 paths between diagonal containers and 4 within
//! a row, counted by the switches. Needs root.

use std::time::Duration;

use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    reach::all_pairs_tcp,
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::{modric::ModricParams, topology::TopologySpec};

fn uplinks(f: &Fabric, switch: &str) -> Vec<u64> {
    f.switch_status(switch).unwrap()["uplinks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap_or(0))
        .collect()
}

fn spread(before: &[u64], after: &[u64]) -> Vec<u64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

#[test]
fn modric_2x2_uses_8_diagonal_and_4_row_paths_equally() {
    let opts = FabricOptions {
        rate_mbit: None,
        ..FabricOptions::default()
    };
    let spec = TopologySpec::Modric(ModricParams::new(2, 2, 1, 2, 2));
    let mut f = Fabric::build(&spec, &opts).expect("build");
    f.start(&opts).expect("start");
    f.wait_ready(Duration::from_secs(60)).expect("ready");
    let g = f.topo.graph().clone();
    let host_names: Vec<String> = g
        .nodes
        .iter()
        .filter(|n| n.kind == sopa_topology::NodeKind::Host)
        .map(|n| n.name.clone())
        .collect();
    let hosts: Vec<_> = host_names
        .iter()
        .map(|n| (f.ns(n), g.node(g.find(n).unwrap()).addr.unwrap()))
        .collect();
    let failed = all_pairs_tcp(&hosts, 7300).unwrap();
    assert!(failed.is_empty(), "unreachable: {failed:?}");

    let addr = |n: &str| g.node(g.find(n).unwrap()).addr.unwrap();
    // Diagonal: container (0,0) to (1,1): rank at the AS, row- or column-first at the EPSC.
    let eps: Vec<String> = (0..4).map(|r| format!("eps.0.0.{r}.0")).collect();
    let before: Vec<Vec<u64>> = eps.iter().map(|e| uplinks(&f, e)).collect();
    let dst = addr("h.1.1.0.0");
    let wire_before: Vec<Vec<u64>> = eps.iter().map(|e| f.hop_ports_tx(e, dst)).collect();
    let t = tcp_transfer(
        f.ns("h.0.0.0.0"),
        f.ns("h.1.1.0.0"),
        addr("h.1.1.0.0"),
        7400,
        4 << 20,
        &SendOptions::default(),
    )
    .unwrap();
    assert!(t.intact());
    let per_path: Vec<u64> = eps
        .iter()
        .zip(&before)
        .flat_map(|(e, b)| spread(b, &uplinks(&f, e))[..2].to_vec())
        .collect();
    eprintln!("diagonal: packets per path {per_path:?}");
    let (lo, hi) = (
        *per_path.iter().min().unwrap(),
        *per_path.iter().max().unwrap(),
    );
    assert!(
        lo > 200 && hi - lo <= (lo / 100).max(4),
        "8 paths, equal within 1% (a straggler of another connection counts too): {per_path:?}"
    );
    // What left each port.
    let on_wire: Vec<u64> = eps
        .iter()
        .zip(&wire_before)
        .flat_map(|(e, b)| spread(b, &f.hop_ports_tx(e, dst)))
        .collect();
    eprintln!("diagonal: packets out of each hop port {on_wire:?}");
    assert_eq!(on_wire.len(), 8, "two hop ports at each of 4 EPS");
    assert!(equal_within(&on_wire, 200), "8 ports, equal: {on_wire:?}");

    // Same row: container (0,0) to (0,1): 4 paths by rank at the AS.
    let before = uplinks(&f, "as.0.0.0");
    let row_dst = addr("h.0.1.0.0");
    let wire_before = f.hop_ports_tx("as.0.0.0", row_dst);
    let t = tcp_transfer(
        f.ns("h.0.0.0.0"),
        f.ns("h.0.1.0.0"),
        addr("h.0.1.0.0"),
        7401,
        4 << 20,
        &SendOptions::default(),
    )
    .unwrap();
    assert!(t.intact());
    let per_path = spread(&before, &uplinks(&f, "as.0.0.0"))[..4].to_vec();
    eprintln!("row: packets per path {per_path:?}");
    let (lo, hi) = (
        *per_path.iter().min().unwrap(),
        *per_path.iter().max().unwrap(),
    );
    assert!(
        lo > 200 && hi - lo <= (lo / 100).max(4),
        "4 paths, equal within 1%: {per_path:?}"
    );
    let on_wire = spread(&wire_before, &f.hop_ports_tx("as.0.0.0", row_dst));
    eprintln!("row: packets out of each hop port {on_wire:?}");
    assert_eq!(on_wire.len(), 4, "four hop ports at the AS");
    assert!(equal_within(&on_wire, 200), "4 ports, equal: {on_wire:?}");
}

/// More than `least` on each, and equal within 5% (at least 16 packets): the interfaces also
/// count the kernel's own messages (ARP, IPv6 router solicitations and MLD reports, at times of
/// their own); a port that carried two hop values, or none, is off by half or more.
fn equal_within(counts: &[u64], least: u64) -> bool {
    let (lo, hi) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
    lo > least && hi - lo <= (lo / 20).max(16)
}
