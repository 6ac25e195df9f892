//! Inventories: every refusal with its message; the generated Fat-Tree is the model's Fat-Tree
//! (graph, paths, switch plans, SRv6 plans); leaf-spine and unequal three-tier shapes get
//! exactly the up-down paths that exist.

use std::collections::BTreeSet;

use sopa_common::wire::HOP_NONE;
use sopa_topology::{
    Topology, forwarding,
    inventory::{
        Inventory,
        generate::{self, LeafSpine},
    },
    paths::{Failures, PathTable},
    properties, srv6,
    topology::TopologySpec,
};

/// A small leaf-spine written by hand: 2 spines, 3 leaves, a host per leaf.
const SMALL: &str = r#"
name = "small"

[[switch]]
name = "sp-1"
tier = "spine"

[[switch]]
name = "sp-2"
tier = "spine"

[[switch]]
name = "rack-a"
tier = "leaf"

[[switch]]
name = "rack-b"
tier = "leaf"

[[switch]]
name = "rack-c"
tier = "tor"

[[link]]
a = "rack-a:swp49"
b = "sp-1:swp1"
ipv4 = "100.127.0.0/31"

[[link]]
a = "rack-a:swp50"
b = "sp-2:swp1"

[[link]]
a = "rack-b:swp49"
b = "sp-1:swp2"

[[link]]
a = "rack-b:swp50"
b = "sp-2:swp2"

[[link]]
a = "rack-c:swp49"
b = "sp-1:swp3"

[[link]]
a = "rack-c:swp50"
b = "sp-2:swp3"

[[rack]]
tor = "rack-a"
ipv4 = "100.64.0.0/26"
ipv6 = "2001:db8:0:1::/64"
hosts = [{ name = "a1", ipv4 = "100.64.0.2", port = "swp1" }]

[[rack]]
tor = "rack-b"
ipv4 = "100.64.0.64/26"
hosts = [{ name = "b1", ipv4 = "100.64.0.66" }]

[[rack]]
tor = "rack-c"
ipv4 = "100.64.0.128/26"
gateway = "100.64.0.190"
hosts = [{ name = "c1", ipv4 = "100.64.0.130" }]
"#;

fn build(text: &str) -> Result<Topology, String> {
    let inv = Inventory::from_toml(text)?;
    Topology::build(&TopologySpec::Inventory(Box::new(inv))).map_err(|e| e.to_string())
}

/// `SMALL` with `from` replaced by `to` (which must be there).
fn edited(from: &str, to: &str) -> String {
    assert!(SMALL.contains(from), "{from:?} is not in the inventory");
    SMALL.replacen(from, to, 1)
}

#[test]
fn the_hand_written_inventory_builds_with_its_names_and_addresses() {
    let t = build(SMALL).unwrap();
    let g = t.graph();
    let a1 = t.resolve_host("a1").unwrap();
    assert_eq!(
        t.resolve_host("100.64.0.66").unwrap(),
        g.find("b1").unwrap()
    );
    let rack_c = t.rack_of(g.find("c1").unwrap()).unwrap();
    assert_eq!(forwarding::gateway(&t, &rack_c).to_string(), "100.64.0.190");
    let rack_a = t.rack_of(a1).unwrap();
    assert_eq!(forwarding::gateway(&t, &rack_a).to_string(), "100.64.0.1");
    // IPv6: the rack's /64 plus the host's offset; a rack without one embeds IPv4.
    assert_eq!(t.host_ipv6(a1).to_string(), "2001:db8:0:1::2");
    assert_eq!(t.gateway_ipv6(&rack_a).to_string(), "2001:db8:0:1::1");
    assert_eq!(t.rack_ipv6(&rack_a).to_string(), "2001:db8:0:1::/64");
    assert_eq!(
        t.host_ipv6(g.find("b1").unwrap()).to_string(),
        "fd00:5a::6440:42"
    );
    // Link addresses: given, or the default by link id (3 host links come first).
    let l = t.resolve_link("rack-a:sp-1").unwrap();
    assert_eq!(
        forwarding::link_addresses(&t, l),
        (
            "100.127.0.0".parse().unwrap(),
            "100.127.0.1".parse().unwrap(),
            31
        )
    );
    let l2 = t.resolve_link("rack-a:sp-2").unwrap();
    assert_eq!(
        forwarding::link_addresses(&t, l2).0.to_string(),
        "172.16.0.8"
    );
    let table = PathTable::compute(&t, a1, &Failures::none(g)).unwrap();
    assert_eq!(table.destinations.len(), 2);
    for d in &table.destinations {
        let hops: Vec<(u8, u8)> = d
            .candidates
            .iter()
            .map(|c| (c.hops.hop0, c.hops.hop1))
            .collect();
        assert_eq!(
            hops,
            [(0, HOP_NONE), (1, HOP_NONE)],
            "one byte on a leaf-spine"
        );
    }
    // The leaf decides by hop0 over its two uplinks; the spines decide nothing.
    let leaf = forwarding::plan(&t, g.find("rack-a").unwrap());
    assert_eq!(leaf.decisions.len(), 2);
    assert!(
        leaf.decisions
            .iter()
            .all(|d| d.hop_byte == 1 && d.uplinks.len() == 2)
    );
    assert!(
        forwarding::plan(&t, g.find("sp-1").unwrap())
            .decisions
            .is_empty()
    );
}

#[test]
fn every_refusal_names_the_entry_at_fault() {
    let cases: &[(String, &str)] = &[
        (
            edited("b = \"sp-1:swp1\"", "b = \"sp-9:swp1\""),
            "link 1 (sp-9:swp1) names a switch no [[switch]] lists",
        ),
        (
            edited("a = \"rack-a:swp49\"", "a = \"rack-a\""),
            "link 1: \"rack-a\" is not a port; write it as SWITCH:PORT",
        ),
        (
            edited("b = \"sp-1:swp2\"", "b = \"sp-1:swp1\""),
            "port sp-1:swp1 is cabled twice",
        ),
        (
            edited("b = \"sp-2:swp3\"", "b = \"sp-1:swp4\""),
            "rack-c and sp-1 are joined by 2 links (rack-c:swp49 - sp-1:swp3, rack-c:swp50 - sp-1:swp4)",
        ),
        (
            edited("b = \"sp-1:swp1\"", "b = \"rack-b:swp1\""),
            "link 1 joins rack-a and rack-b, both leafs",
        ),
        (
            edited(
                "name = \"sp-2\"\ntier = \"spine\"",
                "name = \"sp-2\"\ntier = \"super-spine\"",
            ),
            "two tiers apart",
        ),
        (
            edited("name = \"sp-2\"", "name = \"sp-1\""),
            "switch \"sp-1\" is listed twice",
        ),
        (
            edited("tor = \"rack-b\"", "tor = \"rack-x\""),
            "rack 2: its tor \"rack-x\" is not a [[switch]]",
        ),
        (
            edited("tor = \"rack-b\"", "tor = \"sp-1\""),
            "rack of sp-1: sp-1 is a spine; hosts hang off leaves",
        ),
        (
            edited("tor = \"rack-b\"", "tor = \"rack-a\""),
            "rack-a is the tor of two racks",
        ),
        (
            edited("ipv4 = \"100.64.0.64/26\"", "ipv4 = \"100.64.0.0/25\""),
            "the prefix 100.64.0.0/26 of rack-a overlaps 100.64.0.0/25 of rack-b",
        ),
        (
            edited("ipv4 = \"100.64.0.66\"", "ipv4 = \"100.64.1.66\""),
            "host b1's address 100.64.1.66 is outside its rack's prefix 100.64.0.64/26 (rack-b)",
        ),
        (
            edited(
                "ipv4 = \"100.64.0.66\" }",
                "ipv4 = \"100.64.0.66\", ipv6 = \"2001:db8::1\" }",
            ),
            "host b1 has an IPv6 address but the rack of rack-b has no ipv6 prefix",
        ),
        (
            edited(
                "{ name = \"a1\", ipv4 = \"100.64.0.2\", port = \"swp1\" }",
                "{ name = \"a1\", ipv4 = \"100.64.0.2\", ipv6 = \"2001:db8:0:2::2\" }",
            ),
            "host a1's address 2001:db8:0:2::2 is outside its rack's prefix 2001:db8:0:1::/64",
        ),
        (
            edited("name = \"b1\"", "name = \"a1\""),
            "host \"a1\" is listed twice",
        ),
        (
            edited("ipv4 = \"100.64.0.2\"", "ipv4 = \"100.64.0.1\""),
            "address 100.64.0.1 is given to both the gateway of rack-a and a1",
        ),
        (
            edited("gateway = \"100.64.0.190\"", "gateway = \"100.64.0.200\""),
            "the gateway 100.64.0.200 of the rack of rack-c is outside the rack's prefix",
        ),
        (
            edited(
                "a = \"rack-c:swp50\"\nb = \"sp-2:swp3\"",
                "a = \"rack-c:swp50\"\nb = \"sp-1:swp3\"",
            )
            .replace(
                "a = \"rack-c:swp49\"\nb = \"sp-1:swp3\"",
                "a = \"rack-c:swp49\"\nb = \"sp-1:swp4\"",
            ),
            "rack-c and sp-1 are joined by 2 links",
        ),
        (
            edited("ipv4 = \"100.127.0.0/31\"", "ipv4 = \"100.127.0.0/32\""),
            "link 1: subnet 100.127.0.0/32 holds fewer than two addresses",
        ),
        (
            edited("tier = \"spine\"", "tier = \"spine\"\nusid = 0"),
            "the uSID of sp-1 0x0 is outside the global uSIDs",
        ),
        (
            edited("tier = \"spine\"", "tier = \"spine\"\nusid = 7").replacen(
                "name = \"sp-2\"\ntier = \"spine\"",
                "name = \"sp-2\"\ntier = \"spine\"\nusid = 7",
                1,
            ),
            "the uSID of sp-2 0x7 is also sp-1's",
        ),
        (
            edited(
                "name = \"small\"",
                "name = \"small\"\nusid_block = \"2001:db8::/48\"",
            ),
            "usid_block 2001:db8::/48 is a /48: the block is the first 32 bits",
        ),
        (
            edited(
                "name = \"small\"",
                "name = \"small\"\nusid_block = \"2001:db8::/32\"",
            ),
            "usid_block 2001:db8::/32 overlaps 2001:db8:0:1::/64 of the rack of rack-a",
        ),
        (
            edited(
                "name = \"small\"",
                "name = \"small\"\nusid_block = \"fd00:5a::/32\"",
            ),
            "usid_block fd00:5a::/32 overlaps fd00:5a::/96 of the hosts' embedded IPv4 addresses",
        ),
        (
            edited(
                "name = \"small\"",
                "name = \"small\"\nusid_block = \"ff02::/32\"",
            ),
            "usid_block ff02::/32 overlaps ff00::/8 (multicast)",
        ),
        (
            edited("tier = \"spine\"", "tier = \"router\""),
            "unknown variant `router`, expected one of `leaf`, `tor`, `aggregation`, `spine`",
        ),
        (
            edited("name = \"small\"", "name = \"small\"\ncolour = \"red\""),
            "unknown field `colour`",
        ),
        (
            edited("ipv4 = \"100.64.0.0/26\"", "ipv4 = \"100.64.0.1/26\""),
            "did you mean 100.64.0.0/26?",
        ),
    ];
    for (text, needle) in cases {
        let err = build(text).expect_err(needle);
        assert!(err.contains(needle), "wanted {needle:?} in:\n{err}");
    }
    // A rack cut off from the rest.
    let cut = SMALL
        .replace("a = \"rack-c:swp49\"\nb = \"sp-1:swp3\"\n", "")
        .replace("[[link]]\na = \"rack-c:swp50\"\nb = \"sp-2:swp3\"\n", "")
        .replace("[[link]]\n\n", "");
    let err = build(&cut).unwrap_err();
    assert!(
        err.contains("no up-down path joins the racks of rack-a and rack-c"),
        "{err}"
    );
    assert!(
        err.contains("no up-down path joins the racks of rack-b and rack-c"),
        "{err}"
    );
    assert!(
        build("name = \"x\"\n")
            .unwrap_err()
            .contains("has no [[rack]]")
    );
    // Every problem is named, not only the first.
    let two =
        edited("name = \"b1\"", "name = \"a1\"").replace("tor = \"rack-c\"", "tor = \"rack-z\"");
    let err = build(&two).unwrap_err();
    assert!(
        err.contains("2 problems") && err.contains("a1") && err.contains("rack-z"),
        "{err}"
    );
}

/// An inventory's uSID block begins every SRv6 address the fabric uses: locators, the
/// addresses hosts receive on, and every path's list; the fabrics without one keep
/// `fcbb:bb00::/32`.
#[test]
fn an_inventorys_usid_block_begins_every_srv6_address() {
    let t = build(&edited(
        "name = \"small\"",
        "name = \"small\"\nencoding = \"srv6\"\nusid_block = \"fd5e:a::/32\"",
    ))
    .unwrap();
    let block = [0xfd, 0x5e, 0x00, 0x0a];
    assert_eq!(t.usid_block(), block);
    assert_eq!(build(SMALL).unwrap().usid_block(), [0xfc, 0xbb, 0xbb, 0x00]);
    let g = t.graph();
    let in_block = |a: std::net::Ipv6Addr| a.octets()[..4] == block;
    let none = Failures::none(g);
    for host in ["a1", "b1", "c1"] {
        let table = PathTable::compute(&t, g.find(host).unwrap(), &none).unwrap();
        let plan = srv6::host_plan(&t, &table).unwrap();
        assert!(
            in_block(plan.receive),
            "{host} receives on {}",
            plan.receive
        );
    }
    let usids = srv6::Usids::of(&t).unwrap();
    for sw in ["sp-1", "sp-2", "rack-a", "rack-b", "rack-c"] {
        let node = g.find(sw).unwrap();
        for r in srv6::switch_routes(&t, node, &none).unwrap() {
            let addr = match r {
                srv6::Srv6Route::End { usid } | srv6::Srv6Route::Locator { usid, .. } => {
                    srv6::locator(t.usid_block(), usid).0
                }
                srv6::Srv6Route::Host { addr, .. } => addr,
                srv6::Srv6Route::Rack6 { .. } => continue,
            };
            assert!(in_block(addr), "{sw}: {r:?} at {addr}");
        }
        assert_eq!(
            srv6::locator(t.usid_block(), usids.get(node)).0,
            usids.address(&[usids.get(node)])
        );
    }
}

/// A super-spine reaching a leaf through two spines cannot be carried by the option.
#[test]
fn an_ambiguous_way_down_is_refused() {
    let text = r#"
[[switch]]
name = "c"
tier = "super-spine"
[[switch]]
name = "s1"
tier = "spine"
[[switch]]
name = "s2"
tier = "spine"
[[switch]]
name = "l1"
tier = "leaf"
[[switch]]
name = "l2"
tier = "leaf"
[[link]]
a = "c:1"
b = "s1:9"
[[link]]
a = "c:2"
b = "s2:9"
[[link]]
a = "s1:1"
b = "l1:1"
[[link]]
a = "s2:1"
b = "l1:2"
[[link]]
a = "s2:2"
b = "l2:1"
[[rack]]
tor = "l1"
ipv4 = "10.1.0.0/24"
hosts = [{ name = "h1", ipv4 = "10.1.0.2" }]
[[rack]]
tor = "l2"
ipv4 = "10.2.0.0/24"
hosts = [{ name = "h2", ipv4 = "10.2.0.2" }]
"#;
    let err = build(text).unwrap_err();
    assert!(
        err.contains("c reaches l1 through 2 spines (s1, s2)"),
        "{err}"
    );
}

/// The generated Fat-Tree is the model, node for node and link for link: every host's paths
/// (hops and links), every switch's decisions and routes, every SRv6 plan.
#[test]
fn a_generated_fat_tree_is_the_fat_tree_model() {
    for k in [4, 8] {
        let model = Topology::build(&TopologySpec::FatTree { k }).unwrap();
        let inv = generate::fat_tree(k).unwrap();
        // Through the file, as an operator would hand it over.
        let text = inv.to_toml();
        let clos = build(&text).unwrap();
        let (gm, gc) = (model.graph(), clos.graph());
        // The papers' properties, computed on the graph: the same counts and diameter.
        assert_eq!(properties::counts(gm), properties::counts(gc));
        let tors = |t: &Topology| t.racks().iter().map(|r| r.tor).collect::<Vec<_>>();
        assert_eq!(
            properties::host_diameter_from(gm, &tors(&model)),
            properties::host_diameter_from(gc, &tors(&clos))
        );
        assert_eq!(gm.nodes.len(), gc.nodes.len());
        assert_eq!(gm.links.len(), gc.links.len());
        for (a, b) in gm.nodes.iter().zip(&gc.nodes) {
            assert_eq!((&a.name, a.kind), (&b.name, b.kind));
        }
        for l in 0..gm.links.len() as u32 {
            assert_eq!(gm.link_name(l), gc.link_name(l));
            assert_eq!(
                forwarding::link_addresses(&model, l),
                forwarding::link_addresses(&clos, l)
            );
        }
        assert_eq!(model.racks(), {
            let mut r = clos.racks();
            // Coordinates differ by design (rack index vs. pod, edge).
            for (x, m) in r.iter_mut().zip(model.racks()) {
                x.at = m.at;
            }
            r
        });
        let none = Failures::none(gm);
        let hosts: Vec<u32> = gm.nodes_of(sopa_topology::NodeKind::Host).collect();
        let step = if k == 4 { 1 } else { 7 };
        for &src in hosts.iter().step_by(step) {
            let a = PathTable::compute(&model, src, &none).unwrap();
            let b = PathTable::compute(&clos, src, &none).unwrap();
            assert_eq!(a.destinations.len(), b.destinations.len());
            for (da, db) in a.destinations.iter().zip(&b.destinations) {
                assert_eq!(da.prefix(), db.prefix());
                let pa: Vec<_> = da
                    .candidates
                    .iter()
                    .map(|c| (c.hops, a.links(c).to_vec()))
                    .collect();
                let pb: Vec<_> = db
                    .candidates
                    .iter()
                    .map(|c| (c.hops, b.links(c).to_vec()))
                    .collect();
                assert_eq!(pa, pb, "{k}: {} to {}", gm.name(src), da.prefix());
            }
            if k == 4 {
                assert_eq!(srv6::host_plan(&model, &a), srv6::host_plan(&clos, &b));
            }
        }
        for sw in (0..gm.nodes.len() as u32).filter(|n| gm.node(*n).kind.is_switch()) {
            assert_eq!(
                forwarding::plan(&model, sw),
                forwarding::plan(&clos, sw),
                "{k}: {}",
                gm.name(sw)
            );
            if k == 4 {
                assert_eq!(
                    srv6::switch_routes(&model, sw, &none).unwrap(),
                    srv6::switch_routes(&clos, sw, &none).unwrap()
                );
            }
        }
        // And under a failure, the same paths die.
        let mut fails = Failures::none(gm);
        let l = model.resolve_link("a0:c0").unwrap();
        fails.set_link(l, true);
        let a = PathTable::compute(&model, 4, &fails).unwrap();
        let b = PathTable::compute(&clos, 4, &fails).unwrap();
        assert_eq!(a.alive_count(), b.alive_count());
        assert!(a.alive_count() < a.path_count());
    }
}

#[test]
fn a_generated_leaf_spine_has_one_path_per_spine() {
    let p = LeafSpine {
        leaves: 8,
        spines: 4,
        hosts_per_leaf: 16,
        prefix: "10.20.0.0/16".parse().unwrap(),
        prefix6: Some("2001:db8::/32".parse().unwrap()),
        links: "10.255.0.0/24".parse().unwrap(),
        links6: Some("2001:db8:ffff::/48".parse().unwrap()),
    };
    let inv = generate::leaf_spine(&p).unwrap();
    let t = build(&inv.to_toml()).unwrap();
    let g = t.graph();
    assert_eq!(t.host_count(), 128);
    assert_eq!(t.racks()[1].prefix.to_string(), "10.20.0.32/27");
    let h = t.resolve_host("leaf2-h3").unwrap();
    assert_eq!(g.node(h).addr.unwrap().to_string(), "10.20.0.36");
    assert_eq!(t.host_ipv6(h).to_string(), "2001:db8:0:1::4");
    let table = PathTable::compute(&t, h, &Failures::none(g)).unwrap();
    for d in &table.destinations {
        let spines: BTreeSet<String> = d
            .candidates
            .iter()
            .map(|c| g.link_name(table.links(c)[1]))
            .collect();
        assert_eq!(spines.len(), 4);
        assert!(d.candidates.iter().all(|c| c.hops.hop1 == HOP_NONE));
    }
    let l = t.resolve_link("leaf1:spine1").unwrap();
    let (a, b, len) = forwarding::link_addresses(&t, l);
    assert_eq!(
        (a.to_string(), b.to_string(), len),
        ("10.255.0.0".into(), "10.255.0.1".into(), 31)
    );
    let (a6, _, len6) = srv6::link_addresses6(&t, l);
    assert_eq!((a6.to_string(), len6), ("2001:db8:ffff::".into(), 127));
    // Too small a prefix is said.
    let small = LeafSpine {
        prefix: "10.20.0.0/26".parse().unwrap(),
        ..p
    };
    let e = generate::leaf_spine(&small).unwrap_err().to_string();
    assert!(
        e.contains("8 racks of /27 (16 hosts each) do not fit in 10.20.0.0/26"),
        "{e}"
    );
}

/// Three tiers, unequal: pod 2 has two leaves under one spine (2:1), pod 1 lacks its second
/// spine. Paths are exactly the up-down ones that exist.
#[test]
fn an_unequal_three_tier_clos_has_exactly_its_up_down_paths() {
    let t = build(UNEQUAL).unwrap();
    let g = t.graph();
    let src = t.resolve_host("p1a-h").unwrap();
    let table = PathTable::compute(&t, src, &Failures::none(g)).unwrap();
    let paths = |prefix: &str| -> Vec<String> {
        let d = table
            .destinations
            .iter()
            .find(|d| d.prefix().to_string() == prefix)
            .unwrap();
        d.candidates
            .iter()
            .map(|c| {
                let mut at = src;
                let mut names = vec![];
                for l in table.links(c) {
                    at = g.links[*l as usize].other(at);
                    names.push(g.name(at).to_owned());
                }
                format!("{} {}", c.hops, names.join(">"))
            })
            .collect()
    };
    // Same pod, one spine: one path, one choice.
    assert_eq!(paths("10.1.1.0/24"), ["[0] p1a>p1s1>p1b"]);
    // Pod 2: p1s1 reaches both super-spines; each reaches pod 2 through its own spine.
    assert_eq!(
        paths("10.2.0.0/24"),
        ["[0, 0] p1a>p1s1>c1>p2s1>p2a", "[0, 1] p1a>p1s1>c2>p2s2>p2a"]
    );
    // p2b hangs off p2s1 only (the 2:1 pod): only c1 reaches it.
    assert_eq!(paths("10.2.1.0/24"), ["[0, 0] p1a>p1s1>c1>p2s1>p2b"]);
    // From p2a (two spines) to p2b: inside the pod, over p2s1 only.
    let from = t.resolve_host("p2a-h").unwrap();
    let t2 = PathTable::compute(&t, from, &Failures::none(g)).unwrap();
    let d = t2
        .destinations
        .iter()
        .find(|d| d.prefix().to_string() == "10.2.1.0/24")
        .unwrap();
    assert_eq!(d.candidates.len(), 1);
    // p2s2 decides by hop1 for p2b (it cannot reach it going down), p2s1 does not.
    let plan = forwarding::plan(&t, g.find("p2s2").unwrap());
    assert!(
        plan.decisions
            .iter()
            .any(|d| d.prefix.to_string() == "10.2.1.0/24" && d.hop_byte == 2)
    );
    let plan = forwarding::plan(&t, g.find("p2s1").unwrap());
    assert!(
        !plan
            .decisions
            .iter()
            .any(|d| d.prefix.to_string() == "10.2.1.0/24")
    );
}

const UNEQUAL: &str = r#"
name = "unequal"
[[switch]]
name = "c1"
tier = "core"
[[switch]]
name = "c2"
tier = "core"
[[switch]]
name = "p1s1"
tier = "aggregation"
pod = "1"
[[switch]]
name = "p2s1"
tier = "spine"
pod = "2"
[[switch]]
name = "p2s2"
tier = "spine"
pod = "2"
[[switch]]
name = "p1a"
tier = "leaf"
[[switch]]
name = "p1b"
tier = "leaf"
[[switch]]
name = "p2a"
tier = "leaf"
[[switch]]
name = "p2b"
tier = "leaf"
[[link]]
a = "p1a:up1"
b = "p1s1:d1"
[[link]]
a = "p1b:up1"
b = "p1s1:d2"
[[link]]
a = "p2a:up1"
b = "p2s1:d1"
[[link]]
a = "p2a:up2"
b = "p2s2:d1"
[[link]]
a = "p2b:up1"
b = "p2s1:d2"
[[link]]
a = "p1s1:up1"
b = "c1:d1"
[[link]]
a = "p1s1:up2"
b = "c2:d1"
[[link]]
a = "p2s1:up1"
b = "c1:d2"
[[link]]
a = "p2s2:up1"
b = "c2:d2"
[[rack]]
tor = "p1a"
ipv4 = "10.1.0.0/24"
hosts = [{ name = "p1a-h", ipv4 = "10.1.0.2" }]
[[rack]]
tor = "p1b"
ipv4 = "10.1.1.0/24"
hosts = [{ name = "p1b-h", ipv4 = "10.1.1.2" }]
[[rack]]
tor = "p2a"
ipv4 = "10.2.0.0/24"
hosts = [{ name = "p2a-h", ipv4 = "10.2.0.2" }]
[[rack]]
tor = "p2b"
ipv4 = "10.2.1.0/24"
hosts = [{ name = "p2b-h", ipv4 = "10.2.1.2" }]
"#;
