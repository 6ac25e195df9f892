//! Plain Linux SRv6 routers forwarding the hosts' uSID lists: the round robin exact on the wire,
//! drains and port flaps, reachability on MODRIC, and the switches' own repair of a cut link.

use std::time::Duration;

use sopa_testbed::{
    capture::{Capture, mark_colors},
    fabric::Fabric,
    failure::transfer_cut_midway,
    reach::all_pairs_tcp,
    traffic::{SendOptions, tcp_transfer, tcp_transfer_to},
};
use sopa_topology::srv6::embed;

/// Every host reaches every other one over TCP, on IPv4 and on IPv6.
fn all_pairs(f: &Fabric) {
    let failed = all_pairs_tcp(&f.host_addresses(), 7100).unwrap();
    assert!(failed.is_empty(), "unreachable over IPv4: {failed:?}");
    // The IPv4 addresses embedded in fd00:5a::/96.
    let hosts6 = f.host_addresses6();
    let failed = all_pairs_tcp(&hosts6, 7101).unwrap();
    assert!(failed.is_empty(), "unreachable over IPv6: {failed:?}");
}

/// Equal within 5% (at least 16 packets): the interfaces also count the kernel's own messages
/// (neighbour discovery, MLD reports).
fn balanced(per_port: &[u64], least: u64) -> bool {
    let (lo, hi) = (
        *per_port.iter().min().unwrap(),
        *per_port.iter().max().unwrap(),
    );
    lo > least && hi - lo <= (lo / 20).max(16)
}

/// Since `before`, per element.
fn since(now: Vec<u64>, before: &[u64]) -> Vec<u64> {
    now.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// Who consumes `switch`'s uSID: "kernel" or "ebpf" (its status).
fn usid(f: &Fabric, switch: &str) -> String {
    f.switch_status(switch).unwrap()["usid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// With every port up, no switch's `tc_forward` rewrote a list: the switches' SRv6 routes
/// forwarded every packet, each switch's own uSID consumed by its kernel's End route or, where
/// `tc_forward` consumes it, by the uN shift alone (the program counted the uSID packets it
/// left as they were, and those it shifted).
fn only_linux_forwarded(f: &Fabric) {
    let (mut intact, mut shifted, mut ebpf) = (0, 0, false);
    for n in f.topo.graph().nodes.iter().filter(|n| n.kind.is_switch()) {
        let s = f.switch_status(&n.name).unwrap();
        ebpf |= s["usid"] == "ebpf";
        if s["usid"] == "kernel" {
            assert_eq!(s["forward"]["usid_shifted"], 0, "{}: shifted", n.name);
        }
        assert_eq!(
            s["forward"]["usid_last"], 0,
            "{}: a list ended here",
            n.name
        );
        for rewrite in [
            "usid_repaired",
            "usid_detoured",
            "usid_detour_refused",
            "usid_no_room",
        ] {
            assert_eq!(s["forward"][rewrite], 0, "{}: {rewrite}", n.name);
        }
        assert_eq!(s["usid_rules"], 0, "{}: rules with no port down", n.name);
        intact += s["forward"]["usid_intact"].as_u64().unwrap_or(0);
        shifted += s["forward"]["usid_shifted"].as_u64().unwrap_or(0);
    }
    assert!(intact + shifted > 0, "tc_forward saw no uSID packet");
    if ebpf {
        assert!(shifted > 0, "no switch's tc_forward consumed its uSID");
    }
}

/// `switch`'s `tc_forward` counter `name`.
fn counter(f: &Fabric, switch: &str, name: &str) -> u64 {
    f.switch_status(switch).unwrap()["forward"][name]
        .as_u64()
        .unwrap_or(0)
}

/// The number of paths `host`'s datapath holds for `prefix`.
fn paths(f: &Fabric, host: &str, prefix: &str) -> usize {
    f.host(host).status().unwrap()["path_table"][prefix]
        .as_array()
        .map_or(0, Vec::len)
}

/// Every switch's own locator is a uSID End route, or, where `tc_forward` consumes the uSID,
/// no route at all; every pair reaches every other over IPv4 and IPv6; an inter-pod flow
/// leaves every port of its paths equally; a link drained or a port flapped moves the hosts off
/// it and back.
pub fn carries_the_round_robin_exactly(f: &mut Fabric) {
    let f = &*f;
    let e0 = f.ns("e0").ip(&["-6", "route", "show"]).unwrap();
    let end = "encap seg6local action End flavors next-csid lblen 32 nflen 16";
    let kernel_end = usid(f, "e0") == "kernel";
    // The controller shows what each switch does without a feature its kernel lacks: a kernel
    // without seg6local has every switch consume its uSID in tc_forward, and says so.
    let fallback = !sopa_testbed::kernel::has_seg6local();
    let st: serde_json::Value =
        serde_json::from_str(&f.sopactl(&["status", "--json"]).unwrap()).expect("status JSON");
    for a in st["agents"].as_array().unwrap() {
        let said = a["fallbacks"].as_array().is_some_and(|l| {
            l.iter()
                .any(|x| x.as_str().is_some_and(|x| x.starts_with("seg6local: ")))
        });
        assert_eq!(
            said,
            fallback && a["role"] == "switch",
            "{}'s fallbacks in the controller's status: {}",
            a["node"],
            a["fallbacks"]
        );
    }
    assert_eq!(
        e0.contains(end),
        kernel_end,
        "e0's own locator is a uSID End route where the kernel consumes its uSID, and no route \
         where tc_forward does ({}):\n{e0}",
        usid(f, "e0")
    );
    all_pairs(f);

    // h0 -> h4 (inter-pod): four paths, each leaving e0 by its aggregation switch and a0/a1
    // by its core; what left each port is equal.
    let h4: std::net::Ipv4Addr = "10.1.0.2".parse().unwrap();
    let ports = |f: &Fabric| {
        let mut v = f.hop_ports_tx("e0", h4);
        v.extend(f.hop_ports_tx("a0", h4));
        v.extend(f.hop_ports_tx("a1", h4));
        v
    };
    let g = f.topo.graph().clone();
    let before = ports(f);
    let at_h4 = Capture::start(f.ns("h4"), &f.host_ifaces[&g.find("h4").unwrap()]).unwrap();
    // And where a0 receives from e0: the path meter's marks on the wire.
    let at_a0 = Capture::start(f.ns("a0"), &f.link_iface("a0", "e0")).unwrap();
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        h4,
        7000,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4");
    assert!(t.intact());
    let on_wire = at_a0.finish().unwrap();
    let h0 = embed(g.node(g.find("h0").unwrap()).addr.unwrap());
    let period = sopa_agent::meter::DEFAULT_PERIOD;
    let colors = mark_colors(&on_wire, period, |fr| fr.src == h0);
    eprintln!("h0's marks at a0: {colors}");
    colors.assert_by_tai(1000, period);
    let frames = at_h4.finish().unwrap().frames;
    let outer = frames
        .iter()
        .filter(|fr| sopa_testbed::capture::srv6(fr).is_some())
        .count();
    assert!(
        frames.len() > 1000 && outer == 0,
        "{outer} of {} frames at h4's stack still had the outer header",
        frames.len()
    );
    let sent = since(ports(f), &before);
    eprintln!(
        "h0 -> h4: {:.0} Mbit/s; out of e0's 2 uplinks, a0's 2 and a1's 2: {sent:?}",
        t.mbit_per_s()
    );
    assert!(balanced(&sent[..2], 2000), "e0's uplinks: {sent:?}");
    assert!(balanced(&sent[2..], 1000), "the four core ports: {sent:?}");
    let status = f.host("h0").status().unwrap();
    assert_eq!(status["encoding"], "srv6");
    assert_eq!(status["stamp"]["too_big"], 0);

    // The same over IPv6: the paths of the IPv4 address h4's IPv6 one embeds.
    let before = ports(f);
    let t = tcp_transfer_to(
        f.ns("h0"),
        f.ns("h4"),
        embed(h4).into(),
        7002,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4 over IPv6");
    assert!(t.intact());
    let sent = since(ports(f), &before);
    eprintln!(
        "h0 -> h4 over IPv6: {:.0} Mbit/s; out of e0's 2 uplinks, a0's 2 and a1's 2: {sent:?}",
        t.mbit_per_s()
    );
    assert!(balanced(&sent[..2], 2000), "e0's uplinks: {sent:?}");
    assert!(balanced(&sent[2..], 1000), "the four core ports: {sent:?}");
    assert_eq!(f.host("h0").status().unwrap()["stamp"]["too_big"], 0);
    only_linux_forwarded(f);

    // e0 - a0 down: the hosts drop its paths and no packet crosses it.
    let out = f.sopactl(&["link", "down", "e0", "a0"]).unwrap();
    assert!(out.contains("now down"), "{out}");
    f.wait_applied(|down| down == 1, "the drain").unwrap();
    assert_eq!(
        paths(f, "h0", "10.1.0.0/24"),
        2,
        "h0 dropped the failed paths"
    );
    let before = f.hop_ports_tx("e0", h4);
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        h4,
        7001,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4 with e0:a0 down");
    assert!(t.intact());
    let sent = since(f.hop_ports_tx("e0", h4), &before);
    // A drained link's carrier stays up: the kernel's own messages may still cross it.
    assert!(sent[0] < 16, "packets crossed the failed link: {sent:?}");
    assert!(sent[1] > 4000, "the flow went through a1: {sent:?}");
    f.sopactl(&["link", "up", "e0", "a0"]).unwrap();
    f.wait_applied(|down| down == 0, "the undrain").unwrap();
    assert_eq!(paths(f, "h0", "10.1.0.0/24"), 4, "h0 restored the paths");

    // The port itself set down and up again: the kernel flushes every IPv6 route through it
    // (e0's End locator among them when it is anchored there); the switches report the
    // carrier, and the plans of the failure and of the repair put every route back.
    let dev = f.link_iface("e0", "a0");
    // No duplicate address detection on the port (see below).
    let key = format!("net.ipv6.conf.{dev}.accept_dad");
    let dad = sopa_testbed::netns::run(
        "ip",
        &["netns", "exec", f.ns("e0").name(), "sysctl", "-n", &key],
    )
    .unwrap();
    assert_eq!(dad.trim(), "0", "e0's agent left DAD on its port {dev}");
    f.ns("e0").ip(&["link", "set", &dev, "down"]).unwrap();
    f.wait_applied(|down| down == 1, "the port down").unwrap();
    assert_eq!(paths(f, "h0", "10.1.0.0/24"), 2, "h0 dropped the paths");
    f.ns("e0").ip(&["link", "set", &dev, "up"]).unwrap();
    f.wait_applied(|down| down == 0, "the port up").unwrap();
    assert_eq!(paths(f, "h0", "10.1.0.0/24"), 4, "h0 restored the paths");
    // Every switch ACKed the repair, so its routes are in place.
    let e0 = f.ns("e0").ip(&["-6", "route"]).unwrap();
    let a0 = f.ns("a0").ip(&["-6", "route"]).unwrap();
    assert!(
        e0.contains("fcbb:bb00:9::/48 via fd00:5b::")
            && e0.contains("seg6local") == kernel_end
            && a0.contains("fcbb:bb00:1::/48 via"),
        "the routes the port took did not come back:\ne0:\n{e0}\na0:\n{a0}"
    );
    let before = f.hop_ports_tx("e0", h4);
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        h4,
        7003,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4 after the port came back");
    assert!(t.intact());
    let sent = since(f.hop_ports_tx("e0", h4), &before);
    // A port back from a flap forwards at once: while its link-local address was tentative
    // (duplicate address detection, 1-2 s) no neighbour could be resolved through it, the
    // transfer crawled, and the path meter drained the link as gray.
    let status: serde_json::Value =
        serde_json::from_str(&f.sopactl(&["status", "--json"]).unwrap()).unwrap();
    assert_eq!(
        status["suspect_links"],
        serde_json::json!([]),
        "the flapped port lost packets after its return ({:.0} Mbit/s)",
        t.mbit_per_s()
    );
    assert!(
        balanced(&sent, 2000),
        "e0's uplinks after the flap: {sent:?}"
    );
}

/// MODRIC 2x2 of Linux SRv6 routers: every pair reaches every other over IPv4 and IPv6,
/// routed by the kernel (each uSID consumed by its End route, or by `tc_forward` without one).
pub fn modric_reaches_every_pair(f: &mut Fabric) {
    all_pairs(f);
    only_linux_forwarded(f);
}

/// The controller stopped, a core link cut for real in the middle of h0 -> h4 (one end set
/// down): a0 names c1 instead of c0 in h0's lists (the data going up), c0 takes h4's
/// acknowledgements down to pod 0 through another pod and c1, marked. Without that repair a
/// quarter of every direction's packets would be lost until the controller came back (seen once
/// with the rules left unwritten: the transfer stalled). The rules go when the link comes back.
pub fn a_core_link_cut_mid_transfer_is_repaired_by_the_switches_at_both_ends(f: &mut Fabric) {
    f.stop_controller();
    let (repaired, detoured) = (
        counter(f, "a0", "usid_repaired"),
        counter(f, "c0", "usid_detoured"),
    );
    let (t, _) = transfer_cut_midway(
        f,
        ("h0", "h4", "10.1.0.2".parse().unwrap(), 7400),
        ("a0", "c0"),
        600,
        16 << 20,
    )
    .expect("the transfer completes across the cut");
    assert!(t.intact(), "digest differs across the cut");
    eprintln!("controller away: {:.1} Mbit/s", t.mbit_per_s());
    let (repaired, detoured) = (
        counter(f, "a0", "usid_repaired") - repaired,
        counter(f, "c0", "usid_detoured") - detoured,
    );
    eprintln!("a0 rewrote {repaired} lists, c0 detoured {detoured}");
    assert!(repaired > 1000, "a0 rewrote {repaired} of h0's lists");
    assert!(
        detoured > 100,
        "c0 detoured {detoured} of h4's acknowledgements"
    );
    for s in ["a0", "c0"] {
        assert!(
            f.switch_status(s).unwrap()["usid_rules"].as_u64() > Some(0),
            "{s}"
        );
    }
    f.mend_link("a0", "c0").unwrap();
    // The port's return is an event the switches see; their rules go with it.
    for s in ["a0", "c0"] {
        sopa_testbed::fabric::wait(
            &format!("{s} to drop its rules after the link came back"),
            Duration::from_secs(60),
            || f.switch_status(s).unwrap()["usid_rules"] == 0,
        )
        .unwrap();
    }
    // Back as it was: the controller again, every link up.
    f.start_controller().unwrap();
    f.wait_applied(|down| down == 0, "the controller's return")
        .unwrap();
}
