//! The shipped leaf-spine inventory: every pair reachable on both families, one flow's packets
//! equal over the four spines, a spine link taken down carrying none of them.

use std::time::{Duration, Instant};

use sopa_testbed::{
    fabric::{Fabric, wait, wait_for},
    reach::all_pairs_tcp,
    traffic::{SendOptions, tcp_transfer},
};

const SPINES: [&str; 4] = ["sp-1", "sp-2", "sp-3", "sp-4"];

/// Every host reaches every other one over TCP, on IPv4 and on IPv6 (the inventory's /64s).
pub fn reaches_every_pair(f: &mut Fabric) {
    let hosts = f.host_addresses();
    assert_eq!(hosts.len(), 8);
    let failed = all_pairs_tcp(&hosts, 7100).unwrap();
    assert!(failed.is_empty(), "unreachable over IPv4: {failed:?}");
    let hosts6 = f.host_addresses6();
    assert!(
        hosts6.iter().all(|(_, a)| a.segments()[0] == 0x2001),
        "the inventory's addresses: {hosts6:?}",
        hosts6 = hosts6.iter().map(|(_, a)| a).collect::<Vec<_>>()
    );
    let failed = all_pairs_tcp(&hosts6, 7101).unwrap();
    assert!(failed.is_empty(), "unreachable over IPv6: {failed:?}");
}

/// What rack-a's `tc_forward` counted for each uplink (hop0 value = spine).
fn per_spine(f: &Fabric) -> Vec<u64> {
    let s = f.switch_status("rack-a").unwrap();
    (0..4)
        .map(|i| s["uplinks"][i].as_u64().unwrap_or(0))
        .collect()
}

/// Equal within 1% (at least 4 packets): a stray packet of an earlier connection aside, one
/// flow's round robin is exact.
fn within_one_percent(per_path: &[u64]) -> bool {
    let (lo, hi) = (
        *per_path.iter().min().unwrap(),
        *per_path.iter().max().unwrap(),
    );
    hi - lo <= (lo / 100).max(4)
}

fn since(now: Vec<u64>, before: &[u64]) -> Vec<u64> {
    now.iter().zip(before).map(|(a, b)| a - b).collect()
}

fn transfer(f: &Fabric, port: u16, bytes: u64) {
    let dst = f.topo.graph().find("d-2").unwrap();
    let addr = f.topo.graph().node(dst).addr.unwrap();
    let t = tcp_transfer(
        f.ns("a-1"),
        f.ns("d-2"),
        addr,
        port,
        bytes,
        &SendOptions::default(),
    )
    .expect("a-1 -> d-2");
    assert!(t.intact());
}

/// One flow a-1 -> d-2: its packets equal over the four spines, as rack-a's `tc_forward`
/// counted them by hop value.
pub fn spreads_one_flow_evenly_over_the_spines(f: &mut Fabric) {
    let before = per_spine(f);
    transfer(f, 7000, 8 << 20);
    let per = since(per_spine(f), &before);
    eprintln!("a-1 -> d-2: packets per spine {per:?}");
    assert!(*per.iter().min().unwrap() > 1000, "{per:?}");
    assert!(within_one_percent(&per), "packets per spine equal: {per:?}");
}

/// a-1's paths to rack-d, as its agent's status lists them.
fn paths_to_d(f: &Fabric) -> usize {
    f.host("a-1").status().unwrap()["path_table"]["100.64.0.192/26"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Once a-1 has all four paths again, one flow a-1 -> d-2 on `port` takes them all equally,
/// `spine` (its index) among them.
fn all_four_carry_again(f: &Fabric, spine: usize, port: u16) {
    wait(
        &format!("a-1 to take {} back", SPINES[spine]),
        Duration::from_secs(10),
        || paths_to_d(f) == 4,
    )
    .unwrap();
    let before = per_spine(f);
    transfer(f, port, 4 << 20);
    let per = since(per_spine(f), &before);
    assert!(within_one_percent(&per) && per[spine] > 500, "{per:?}");
}

/// `sopactl link down rack-a sp-2`: the hosts drop its path and the flow's packets take the
/// other three spines, none the failed link (counted at rack-a by hop value and on the wire
/// of its port); up again, all four carry it.
pub fn a_failed_spine_link_carries_nothing(f: &mut Fabric) {
    let out = f.sopactl(&["link", "down", "rack-a", "sp-2"]).unwrap();
    assert!(out.contains("now down"), "{out}");
    f.wait_applied(|down| down == 1, "rack-a:sp-2 down")
        .unwrap();
    assert_eq!(paths_to_d(f), 3, "a-1 dropped the path over sp-2");
    let port = f.link_iface("rack-a", "sp-2");
    let wire_before = f.ns("rack-a").tx_packets(&port).unwrap();
    let before = per_spine(f);
    transfer(f, 7001, 4 << 20);
    let per = since(per_spine(f), &before);
    let wire = f.ns("rack-a").tx_packets(&port).unwrap() - wire_before;
    eprintln!("with rack-a:sp-2 down: packets per spine {per:?}, {wire} out of {port}");
    assert_eq!(per[1], 0, "no packet took sp-2: {per:?}");
    // The port still carries the kernel's own messages (neighbour discovery): a handful.
    assert!(wire < 20, "{wire} packets left rack-a towards sp-2");
    assert!(
        per.iter().enumerate().all(|(i, n)| i == 1 || *n > 500),
        "{per:?}"
    );
    f.sopactl(&["link", "up", "rack-a", "sp-2"]).unwrap();
    f.wait_applied(|down| down == 0, "rack-a:sp-2 back")
        .unwrap();
    all_four_carry_again(f, 1, 7002);
}

/// In SRv6 the spines forward by their IPv6 routes (or `tc_forward` consumes their uSID):
/// the flow's packets counted on the wire of rack-a's four uplinks, equal within 1% (and 8
/// packets of the kernel's own neighbour discovery).
pub fn srv6_spreads_one_flow_evenly_over_the_spines(f: &mut Fabric) {
    let ports: Vec<String> = SPINES.iter().map(|s| f.link_iface("rack-a", s)).collect();
    let tx = |f: &Fabric| -> Vec<u64> {
        ports
            .iter()
            .map(|p| f.ns("rack-a").tx_packets(p).unwrap())
            .collect()
    };
    let before = tx(f);
    transfer(f, 7003, 8 << 20);
    let per = since(tx(f), &before);
    eprintln!("a-1 -> d-2 (SRv6): packets out of each uplink of rack-a {per:?}");
    let (lo, hi) = (*per.iter().min().unwrap(), *per.iter().max().unwrap());
    assert!(lo > 1000 && hi - lo <= lo / 100 + 8, "{per:?}");
    // In the inventory's uSID block, not SOPA's: the switches route its locators, and the
    // hosts receive and send in it.
    let routes = f.ns("rack-a").ip(&["-6", "route"]).unwrap();
    let locators = routes.lines().filter(|l| l.starts_with("fd5e:a:")).count();
    assert!(
        locators >= 4 && !routes.contains("fcbb:"),
        "rack-a routes the block's locators, no other:\n{routes}"
    );
    let receive = f.host("a-1").status().unwrap()["srv6"]["receive"].clone();
    assert!(
        receive.as_str().is_some_and(|r| r.starts_with("fd5e:a:")),
        "a-1 receives in the block: {receive}"
    );
}

/// The controller's named mismatches (`sopactl status --json`), and its down links.
fn cabling(f: &Fabric) -> (Vec<String>, Vec<String>) {
    let st: serde_json::Value =
        serde_json::from_str(&f.sopactl(&["status", "--json"]).unwrap()).unwrap();
    let what = st["miscabled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["what"].as_str().unwrap().to_owned())
        .collect();
    let down = st["down_links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_owned())
        .collect();
    (what, down)
}

/// Until `done` holds of the controller's cabling view, at most `within`; returns how long.
fn until_cabling(
    f: &Fabric,
    within: Duration,
    what: &str,
    done: impl Fn(&[String], &[String]) -> bool,
) -> Duration {
    let start = Instant::now();
    wait_for(what, within, || {
        let (m, down) = cabling(f);
        if done(&m, &down) {
            Ok(())
        } else {
            Err(format!("mismatches {m:?}, down {down:?}"))
        }
    })
    .unwrap();
    start.elapsed()
}

/// Two cables swapped at sp-1 (rack-a's and rack-b's): every end names its mismatch within
/// 5 s, both links are kept out of every path (a flow from rack-a takes the three other
/// spines, none of its packets on sp-1); put back, the mismatches go and sp-1 carries again.
pub fn swapped_cables_are_named_and_kept_out_until_put_back(f: &mut Fabric) {
    f.swap_ports("sp-1", "swp1", "swp2").unwrap();
    let want = [
        "sp-1:swp1 is cabled to rack-b:swp49, the inventory says rack-a:swp49",
        "sp-1:swp2 is cabled to rack-a:swp49, the inventory says rack-b:swp49",
        "rack-a:swp49 is cabled to sp-1:swp2, the inventory says sp-1:swp1",
        "rack-b:swp49 is cabled to sp-1:swp1, the inventory says sp-1:swp2",
    ];
    let named = until_cabling(f, Duration::from_secs(5), "the four mismatches", |m, _| {
        want.iter().all(|w| m.iter().any(|x| x == w))
    });
    eprintln!("swapped at sp-1: all four mismatches named after {named:?}");
    let kept_out = until_cabling(f, Duration::from_secs(5), "both links down", |_, down| {
        ["rack-a:sp-1", "rack-b:sp-1"]
            .iter()
            .all(|l| down.iter().any(|d| d == l))
    });
    eprintln!("both links kept out after {kept_out:?}");
    let status = f.sopactl(&["status"]).unwrap();
    assert!(
        status.contains(&format!("miscabled: {}", want[0])),
        "{status}"
    );
    assert!(status.contains("rack-a:sp-1 (miscabled)"), "{status}");
    f.wait_applied(|down| down == 2, "the miscabled links out")
        .unwrap();
    assert_eq!(paths_to_d(f), 3, "a-1 dropped the path over sp-1");
    let before = per_spine(f);
    transfer(f, 7004, 4 << 20);
    let per = since(per_spine(f), &before);
    eprintln!("miscabled at sp-1: packets per spine {per:?}");
    assert_eq!(per[0], 0, "no packet took the miscabled link: {per:?}");

    f.swap_ports("sp-1", "swp1", "swp2").unwrap();
    let fixed = until_cabling(
        f,
        Duration::from_secs(10),
        "the mismatches gone",
        |m, down| m.is_empty() && down.is_empty(),
    );
    eprintln!("put back: mismatches gone and links up after {fixed:?}");
    f.wait_applied(|down| down == 0, "the links back").unwrap();
    all_four_carry_again(f, 0, 7005);
}

/// A host agent told `--host auto` finds its host in the inventory by its interface's
/// address: the controller admits it as b-1, it gets b-1's paths, and its flow is stamped and
/// spread over the four spines.
pub fn a_host_finds_itself_in_the_inventory_by_its_address(f: &mut Fabric) {
    f.stop_host("b-1");
    f.start_host_as("b-1", "auto", &[]).unwrap();
    f.wait_applied(|down| down == 0, "b-1's agent by its address")
        .unwrap();
    let st = f.host("b-1").status().unwrap();
    let prefixes: Vec<&String> = st["path_table"].as_object().unwrap().keys().collect();
    assert_eq!(
        prefixes,
        ["100.64.0.0/26", "100.64.0.128/26", "100.64.0.192/26"],
        "b-1's paths: every rack but its own"
    );
    let log = f.host("b-1").log();
    assert!(log.contains("100.64.0.74"), "{log}");
    let at_b = |f: &Fabric| -> Vec<u64> {
        let s = f.switch_status("rack-b").unwrap();
        (0..4)
            .map(|i| s["uplinks"][i].as_u64().unwrap_or(0))
            .collect()
    };
    let before = at_b(f);
    let g = f.topo.graph();
    let addr = g.node(g.find("d-2").unwrap()).addr.unwrap();
    let t = tcp_transfer(
        f.ns("b-1"),
        f.ns("d-2"),
        addr,
        7006,
        4 << 20,
        &SendOptions::default(),
    )
    .expect("b-1 -> d-2");
    assert!(t.intact());
    let per = since(at_b(f), &before);
    eprintln!("b-1 (--host auto) -> d-2: packets per spine {per:?}");
    assert!(within_one_percent(&per) && per[0] > 500, "{per:?}");
}

/// `sopactl fabric discover` drafts the fabric back from the agents' LLDP tables: the same
/// switches in the same tiers, the same cables port for port, the same racks with the same
/// prefixes and hosts (by name, address and ToR port); and the draft passes the check.
pub fn discover_drafts_the_fabric_back(f: &mut Fabric) {
    let shipped = crate::shipped_leaf_spine();
    // Every agent's table in: 8 switches and 8 hosts, each host hearing its ToR.
    let draft = wait_for("a complete draft", Duration::from_secs(10), || {
        let text = f.sopactl(&["fabric", "discover"]).unwrap_or_default();
        match sopa_topology::inventory::Inventory::from_toml(&text) {
            Ok(d)
                if d.racks.iter().map(|r| r.hosts.len()).sum::<usize>() == 8
                    && d.switches.len() == 8 =>
            {
                Ok(d)
            }
            _ => Err(text),
        }
    })
    .unwrap();
    let switches = |i: &sopa_topology::inventory::Inventory| {
        let mut v: Vec<_> = i
            .switches
            .iter()
            .map(|s| (s.name.clone(), s.tier))
            .collect();
        v.sort();
        v
    };
    assert_eq!(switches(&draft), switches(&shipped));
    let cables = |i: &sopa_topology::inventory::Inventory| {
        let mut v: Vec<_> = i
            .links
            .iter()
            .map(|l| {
                let (a, b) = (l.a.clone(), l.b.clone());
                if a <= b { (a, b) } else { (b, a) }
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(cables(&draft), cables(&shipped));
    let racks = |i: &sopa_topology::inventory::Inventory| {
        let mut v: Vec<_> = i
            .racks
            .iter()
            .map(|r| {
                let mut hosts: Vec<_> = r
                    .hosts
                    .iter()
                    .map(|h| (h.name.clone(), h.ipv4, h.port.clone()))
                    .collect();
                hosts.sort();
                (r.tor.clone(), r.ipv4, hosts)
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(racks(&draft), racks(&shipped));
    sopa_topology::Topology::build(&sopa_topology::topology::TopologySpec::Inventory(Box::new(
        draft,
    )))
    .expect("the draft passes the check");
}
