//! Fat-Tree k=4 in namespaces: 16 hosts, 20 software switches running the switch role, a
//! controller, host agents. Needs root.

use std::{process::Command, time::Duration};

use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::topology::TopologySpec;

fn ping(f: &Fabric, from: &str, to: &str) -> bool {
    let to = f
        .topo
        .graph()
        .node(f.topo.graph().find(to).unwrap())
        .addr
        .unwrap()
        .to_string();
    f.ns(from)
        .run(|| {
            Command::new("ping")
                .args(["-q", "-c", "1", "-W", "1", &to])
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .unwrap()
}

#[test]
fn fat_tree_k4_forwards_by_source_route() {
    let opts = FabricOptions {
        rate_mbit: None,
        ..FabricOptions::default()
    };
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).expect("build the fabric");
    f.start(&opts).expect("start controller and agents");
    f.wait_ready(Duration::from_secs(60))
        .expect("every agent ready");

    // Every host reaches every other host.
    let hosts: Vec<String> = (0..16).map(|i| format!("h{i}")).collect();
    let mut unreachable = Vec::new();
    for a in &hosts {
        for b in &hosts {
            if a != b && !ping(&f, a, b) {
                unreachable.push(format!("{a}->{b}"));
            }
        }
    }
    assert!(unreachable.is_empty(), "unreachable: {unreachable:?}");

    // An inter-pod flow h0 -> h4: four paths, each taking a quarter of the packets.
    let before_e0 = f.switch_status("e0").unwrap()["uplinks"].clone();
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        7000,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4");
    assert!(t.intact());
    let e0 = f.switch_status("e0").unwrap();
    let a0 = f.switch_status("a0").unwrap();
    let a1 = f.switch_status("a1").unwrap();
    eprintln!(
        "e0 {} a0 {} a1 {} ({:.0} Mbit/s)",
        e0["uplinks"],
        a0["uplinks"],
        a1["uplinks"],
        t.mbit_per_s()
    );
    let up = |v: &serde_json::Value, i: usize| v["uplinks"][i].as_u64().unwrap_or(0);
    let per_path = [up(&a0, 0), up(&a0, 1), up(&a1, 0), up(&a1, 1)];
    let (lo, hi) = (
        per_path.iter().min().unwrap(),
        per_path.iter().max().unwrap(),
    );
    assert!(*lo > 1000, "{per_path:?}");
    assert!(
        hi - lo <= 1,
        "packets per path equal within one: {per_path:?}"
    );
    let _ = before_e0;
}
