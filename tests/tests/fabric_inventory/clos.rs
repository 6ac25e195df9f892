//! An unequal three-tier Clos: four super-spines in two planes (c1, c2 | c3, c4); pod 1 full
//! (two spines, each on both supers of its plane); pod 2 oversubscribed 2:1 at its spines (two
//! leaves below each, one super above); pod 3 missing its second spine. One host per leaf.
//! Each host's pushed paths are exactly the up-down paths that exist, and a flow spreads
//! equally over its pair's path set.

use sopa_testbed::{
    fabric::Fabric,
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::inventory::{HostEntry, Inventory, LinkEntry, RackEntry, SwitchEntry, Tier};

pub fn unequal() -> Inventory {
    let sw = |name: &str, tier, pod: Option<&str>| SwitchEntry {
        name: name.into(),
        tier,
        pod: pod.map(Into::into),
        usid: None,
    };
    let mut inv = Inventory {
        name: Some("unequal".into()),
        switches: vec![
            sw("c1", Tier::SuperSpine, None),
            sw("c2", Tier::SuperSpine, None),
            sw("c3", Tier::SuperSpine, None),
            sw("c4", Tier::SuperSpine, None),
            sw("p1s1", Tier::Spine, Some("1")),
            sw("p1s2", Tier::Spine, Some("1")),
            sw("p2s1", Tier::Spine, Some("2")),
            sw("p2s2", Tier::Spine, Some("2")),
            sw("p3s1", Tier::Spine, Some("3")),
            sw("p1l1", Tier::Leaf, Some("1")),
            sw("p1l2", Tier::Leaf, Some("1")),
            sw("p2l1", Tier::Leaf, Some("2")),
            sw("p2l2", Tier::Leaf, Some("2")),
            sw("p3l1", Tier::Leaf, Some("3")),
        ],
        ..Inventory::default()
    };
    let cables = [
        ("p1l1", "p1s1"),
        ("p1l1", "p1s2"),
        ("p1l2", "p1s1"),
        ("p1l2", "p1s2"),
        ("p2l1", "p2s1"),
        ("p2l1", "p2s2"),
        ("p2l2", "p2s1"),
        ("p2l2", "p2s2"),
        ("p3l1", "p3s1"),
        ("p1s1", "c1"),
        ("p1s1", "c2"),
        ("p1s2", "c3"),
        ("p1s2", "c4"),
        ("p2s1", "c1"),
        ("p2s2", "c3"),
        ("p3s1", "c1"),
        ("p3s1", "c2"),
    ];
    let mut next_port = std::collections::HashMap::<&str, u32>::new();
    let mut port = |sw: &'static str| {
        let n = next_port.entry(sw).or_insert(0);
        *n += 1;
        format!("{sw}:eth{n}")
    };
    for (a, b) in cables {
        inv.links.push(LinkEntry {
            a: port(a),
            b: port(b),
            ipv4: None,
            ipv6: None,
        });
    }
    for (i, leaf) in ["p1l1", "p1l2", "p2l1", "p2l2", "p3l1"].iter().enumerate() {
        inv.racks.push(RackEntry {
            tor: (*leaf).into(),
            ipv4: format!("192.168.{}.0/28", i + 1).parse().unwrap(),
            ipv6: None,
            gateway: None,
            hosts: vec![HostEntry {
                name: format!("{leaf}-h"),
                ipv4: format!("192.168.{}.5", i + 1).parse().unwrap(),
                ipv6: None,
                port: None,
            }],
        });
    }
    inv
}

/// The pushed hop pairs of `host` towards `prefix`, as its agent's status lists them.
fn pushed(f: &Fabric, host: &str, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = f.host(host).status().unwrap()["path_table"][prefix]
        .as_array()
        .unwrap_or_else(|| panic!("{host} has no paths to {prefix}"))
        .iter()
        .map(|h| h.as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

/// What `switch`'s `tc_forward` counted per uplink.
fn uplinks(f: &Fabric, switch: &str, n: usize) -> Vec<u64> {
    let s = f.switch_status(switch).unwrap();
    (0..n)
        .map(|i| s["uplinks"][i].as_u64().unwrap_or(0))
        .collect()
}

fn flow(f: &Fabric, from: &str, to: &str, port: u16) {
    let g = f.topo.graph();
    let addr = g.node(g.find(to).unwrap()).addr.unwrap();
    let t = tcp_transfer(
        f.ns(from),
        f.ns(to),
        addr,
        port,
        4 << 20,
        &SendOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
    assert!(t.intact());
}

fn equal(per: &[u64]) -> bool {
    let (lo, hi) = (*per.iter().min().unwrap(), *per.iter().max().unwrap());
    lo > 500 && hi - lo <= (lo / 100).max(4)
}

pub fn has_exactly_its_up_down_paths_balanced(f: &mut Fabric) {
    // Inside pod 1: both spines. Pod 1 to pod 2: only the supers that reach pod 2 (c1 over
    // p1s1, c3 over p1s2). Pod 1 to pod 3: only p1s1's supers. Pod 2 to pod 3: c1 alone.
    for (host, prefix, want) in [
        ("p1l1-h", "192.168.2.0/28", vec!["0,none", "1,none"]),
        ("p1l1-h", "192.168.3.0/28", vec!["0,0", "1,0"]),
        ("p1l1-h", "192.168.5.0/28", vec!["0,0", "0,1"]),
        ("p2l1-h", "192.168.5.0/28", vec!["0,0"]),
        ("p3l1-h", "192.168.1.0/28", vec!["0,0", "0,1"]),
        ("p2l1-h", "192.168.4.0/28", vec!["0,none", "1,none"]),
    ] {
        assert_eq!(pushed(f, host, prefix), want, "{host} to {prefix}");
    }
    // p1l1-h -> p2l1-h: hop0 takes p1s1 and p1s2 equally (p1l1's uplinks).
    let before = uplinks(f, "p1l1", 2);
    flow(f, "p1l1-h", "p2l1-h", 7200);
    let per: Vec<u64> = uplinks(f, "p1l1", 2)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    eprintln!("p1l1-h -> p2l1-h: per spine {per:?}");
    assert!(equal(&per), "{per:?}");
    // p1l1-h -> p3l1-h: all over p1s1, whose hop1 takes c1 and c2 equally.
    let before = uplinks(f, "p1s1", 2);
    let before0 = uplinks(f, "p1l1", 2);
    flow(f, "p1l1-h", "p3l1-h", 7201);
    let per: Vec<u64> = uplinks(f, "p1s1", 2)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    let leaf: Vec<u64> = uplinks(f, "p1l1", 2)
        .iter()
        .zip(&before0)
        .map(|(a, b)| a - b)
        .collect();
    eprintln!("p1l1-h -> p3l1-h: p1s1 per super {per:?}, p1l1 per spine {leaf:?}");
    assert!(equal(&per), "{per:?}");
    assert!(leaf[1] < 20, "pod 3 is not reached over p1s2: {leaf:?}");
}
