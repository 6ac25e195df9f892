//! The host agent and the fabric routes it lowers: every attribute a route had survives the
//! rewrite and comes back exactly after a stop, the MTU it sets keeps DF on, and routes that
//! change under the agent are lowered again. Needs root;
//! every namespace and process is removed on drop, also on failure.

use std::time::{Duration, Instant};

use serde_json::Value;
use sopa_testbed::{
    agent::Agent,
    arb::{A_ADDR6, A_RACK_USID, Arb, B_PREFIX, B_RACK_USID},
    resilience::{Probe, wait_sent},
    traffic::{SendOptions, tcp_transfer},
};

const MIB: u64 = 1 << 20;

/// A route of each kind a production host has (`ip route` arguments after the prefix), and
/// the fabric prefix the agent gets for it: each route's own prefix, or a /24 inside it (the
/// agent then adds a more specific copy, which must carry the same attributes).
fn routes(dev: &str) -> Vec<(&'static str, Vec<String>, &'static str)> {
    let args = |s: &str| -> Vec<String> {
        s.replace("DEV", dev)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    vec![
        (
            B_PREFIX,
            // A routing daemon's route (proto bgp, a metric) tuned for a data center.
            args(
                "via 10.101.1.1 dev DEV src 10.101.1.2 proto 186 metric 7 initcwnd 20 \
                 initrwnd 30 advmss 1400 congctl reno quickack 1 features ecn rto_min 50ms",
            ),
            B_PREFIX,
        ),
        (
            "10.102.0.0/24",
            args("via 10.101.1.1 dev DEV onlink congctl lock reno"),
            "10.102.0.0/24",
        ),
        ("10.103.0.0/24", args("nhid 10"), "10.103.0.0/24"),
        (
            "10.104.0.0/24",
            args("encap seg6 mode encap segs fc00::1 via 10.101.1.1 dev DEV"),
            "10.104.0.0/24",
        ),
        (
            "10.105.0.0/16",
            args("via 10.101.1.1 dev DEV src 10.101.1.2 initcwnd 15 congctl reno"),
            "10.105.1.0/24",
        ),
    ]
}

/// The agent on A with two paths to each of the fabric `prefixes`.
fn start_on_a(arb: &Arb, prefixes: &[&str]) -> Agent {
    let table: String = prefixes
        .iter()
        .map(|p| format!("[[destination]]\nprefix = \"{p}\"\npaths = [[0], [1]]\n\n"))
        .collect();
    Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &format!("version = 1\n\n{table}"),
        &["--no-metrics"],
    )
    .expect("agent on A")
}

/// `ip -d -j route show <prefix>` of the main table, each route's `mtu` metric taken out
/// (returned apart), so a lowered route compares with the original.
fn without_mtu(json: &str) -> (Value, Vec<Value>) {
    let mut routes: Value = serde_json::from_str(json).expect("ip -j prints JSON");
    let mut mtus = Vec::new();
    for route in routes.as_array_mut().expect("a list of routes") {
        let Some(metrics) = route.get_mut("metrics").and_then(Value::as_array_mut) else {
            mtus.push(Value::Null);
            continue;
        };
        for m in metrics.iter_mut() {
            mtus.push(
                m.as_object_mut()
                    .and_then(|m| m.remove("mtu"))
                    .unwrap_or(Value::Null),
            );
        }
        metrics.retain(|m| m.as_object().is_some_and(|m| !m.is_empty()));
        if metrics.is_empty() {
            route.as_object_mut().unwrap().remove("metrics");
        }
    }
    (routes, mtus)
}

#[test]
fn every_route_attribute_survives_the_rewrite_and_a_stop_restores_it_byte_for_byte() {
    let arb = Arb::new("ra").expect("build A - R - B");
    let a = &arb.a;
    a.ip(&[
        "nexthop",
        "add",
        "id",
        "10",
        "via",
        "10.101.1.1",
        "dev",
        &arb.a_if,
    ])
    .unwrap();
    let mut routes = routes(&arb.a_if);
    // A kernel without seg6 lightweight tunnels (CONFIG_IPV6_SEG6_LWTUNNEL) cannot hold the
    // route with the seg6 encapsulation: that attribute is not checked there, and says so.
    if !sopa_testbed::kernel::has_seg6local() {
        routes.retain(|(_, args, _)| !args.iter().any(|a| a == "seg6"));
        sopa_testbed::skipped(
            "host_routes: a route with a seg6 encapsulation",
            "the kernel has no seg6 lightweight tunnels (CONFIG_IPV6_SEG6_LWTUNNEL is not set)",
        );
    }
    for (prefix, args, _) in &routes {
        let mut cmd = vec!["route", "add", prefix];
        cmd.extend(args.iter().map(String::as_str));
        a.ip(&cmd)
            .unwrap_or_else(|e| panic!("ip route add {prefix}: {e}"));
    }
    let before_json = a.ip(&["-d", "-j", "route", "show"]).unwrap();
    let before_text = a.ip(&["-d", "route", "show"]).unwrap();
    let nexthops = a.ip(&["-d", "nexthop", "show"]).unwrap();

    let fabric: Vec<&str> = routes.iter().map(|(_, _, fabric)| *fabric).collect();
    let agent = start_on_a(&arb, &fabric);

    for (prefix, args, fabric) in &routes {
        let now = a.ip(&["-d", "-j", "route", "show", fabric]).unwrap();
        let (lowered, mtus) = without_mtu(&now);
        assert_eq!(
            mtus,
            vec![Value::from(1496)],
            "{fabric}: one route, a plain mtu 1496 (DF stays on):\n{now}"
        );
        let text = a.ip(&["-d", "route", "show", fabric]).unwrap();
        assert!(
            !text.contains("mtu lock"),
            "{fabric}: the MTU is not locked:\n{text}"
        );
        if prefix == fabric {
            let (original, _) = without_mtu(&a_route_before(&before_json, prefix));
            assert_eq!(
                lowered,
                original,
                "{fabric} ({}): every attribute but the MTU as it was",
                args.join(" ")
            );
        } else {
            // The more specific copy of the covering route: its attributes, the agent's origin.
            let (mut original, _) = without_mtu(&a_route_before(&before_json, prefix));
            original[0]["dst"] = Value::from(*fabric);
            original[0]["protocol"] = Value::from("static");
            assert_eq!(
                lowered, original,
                "{fabric}: a copy of {prefix} with its attributes"
            );
        }
        if args.iter().any(|a| a == "lock") {
            assert!(
                text.contains("congctl lock reno"),
                "the congctl lock kept:\n{text}"
            );
        }
    }

    assert_eq!(agent.stop(), Some(0));
    assert_eq!(
        a.ip(&["-d", "-j", "route", "show"]).unwrap(),
        before_json,
        "the routes after a stop, byte for byte"
    );
    assert_eq!(a.ip(&["-d", "route", "show"]).unwrap(), before_text);
    assert_eq!(a.ip(&["-d", "nexthop", "show"]).unwrap(), nexthops);
}

/// The route of `prefix` in a `-j` listing of the whole table, as a one-route listing.
fn a_route_before(all: &str, prefix: &str) -> String {
    let routes: Value = serde_json::from_str(all).unwrap();
    let one: Vec<&Value> = routes
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["dst"] == prefix)
        .collect();
    assert_eq!(one.len(), 1, "{prefix} in\n{all}");
    serde_json::to_string(&one).unwrap()
}

/// Polls `ip <args>` in `ns` until its output satisfies `ok` (at most 10 s); the last output.
fn wait_for_route(ns: &sopa_testbed::NetNs, args: &[&str], ok: impl Fn(&str) -> bool) -> String {
    poll_route(ns, args, Duration::from_secs(10), ok).unwrap_or_else(|out| out)
}

/// Polls `ip <args>` in `ns` until its output satisfies `ok`: `Ok` with it, or `Err` with the
/// last output once `within` has passed.
fn poll_route(
    ns: &sopa_testbed::NetNs,
    args: &[&str],
    within: Duration,
    ok: impl Fn(&str) -> bool,
) -> Result<String, String> {
    let deadline = Instant::now() + within;
    loop {
        let out = ns.ip(args).unwrap();
        if ok(&out) {
            return Ok(out);
        }
        if Instant::now() > deadline {
            return Err(out);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn routes_a_daemon_replaces_under_traffic_are_lowered_again_and_copies_follow_their_route() {
    let arb = Arb::new("rb").expect("build A - R - B");
    let a = &arb.a;
    // The fabric route as a routing daemon installs it, and a second fabric prefix that only
    // the default route covers (the agent adds a copy of it), and a third that an unreachable
    // route covers (nothing to lower, and no copy may take its place).
    a.ip(&[
        "route",
        "add",
        B_PREFIX,
        "via",
        "10.101.1.1",
        "proto",
        "bgp",
    ])
    .unwrap();
    a.ip(&["route", "add", "unreachable", UNREACHABLE]).unwrap();
    arb.r
        .ip(&["addr", "add", "10.101.1.3/24", "dev", &arb.r_a_if])
        .unwrap();
    let agent = start_on_a(&arb, &[B_PREFIX, OTHER, UNREACHABLE]);
    let lowered = |out: &str| out.contains(" mtu 1496") && !out.contains("mtu lock");
    assert!(lowered(&a.ip(&["route", "show", B_PREFIX]).unwrap()));
    assert_eq!(
        a.ip(&["route", "show", UNREACHABLE]).unwrap().trim(),
        format!("unreachable {UNREACHABLE}"),
        "the unreachable route is left as it is"
    );

    // Traffic all along: a numbered UDP probe (its losses counted) and a full-size transfer.
    let probe = Probe::start(&arb, 2_000, 5202);
    probe.wait_received(500);
    std::thread::scope(|s| {
        let transfer = s.spawn(|| {
            tcp_transfer(
                a,
                &arb.b,
                arb.b_addr,
                5001,
                64 * MIB,
                &SendOptions {
                    dont_fragment: false,
                    ..SendOptions::default()
                },
            )
        });
        // The transfer runs: A's interface has sent 4 MiB more than before.
        wait_sent(&arb, 4 * MIB);
        // The daemon refreshes its route with another setting: the lowered MTU is gone.
        a.ip(&[
            "route",
            "replace",
            B_PREFIX,
            "via",
            "10.101.1.1",
            "proto",
            "bgp",
            "initcwnd",
            "12",
        ])
        .unwrap();
        let now = wait_for_route(a, &["route", "show", B_PREFIX], lowered);
        assert!(
            lowered(&now) && now.contains("proto bgp") && now.contains("initcwnd 12"),
            "the daemon's route lowered again, all else as the daemon set it:\n{now}"
        );
        let t = transfer.join().unwrap().expect("the transfer");
        assert!(t.intact(), "digest differs");
    });
    probe.wait_received(500);

    // The daemon withdraws its route (the default route's copy takes over, lowered) and puts
    // it back with another metric: the copy goes, the daemon's route is lowered.
    a.ip(&["route", "del", B_PREFIX]).unwrap();
    let copy = wait_for_route(a, &["route", "show", B_PREFIX], |o| {
        o.contains("proto static") && lowered(o)
    });
    assert!(copy.contains("proto static") && lowered(&copy), "{copy}");
    a.ip(&[
        "route",
        "add",
        B_PREFIX,
        "via",
        "10.101.1.1",
        "proto",
        "bgp",
        "metric",
        "20",
    ])
    .unwrap();
    let back = wait_for_route(a, &["route", "show", B_PREFIX], |o| {
        !o.contains("proto static") && lowered(o)
    });
    assert!(
        !back.contains("proto static") && back.contains("metric 20") && lowered(&back),
        "the copy gave way to the daemon's route, lowered:\n{back}"
    );
    probe.wait_received(500);
    let r = probe.finish();
    assert_eq!(
        r.lost_in(0..r.sent),
        0,
        "probe packets lost while routes changed ({} sent)",
        r.sent
    );

    // The default route moves to another gateway: the copy follows it, lowered.
    let copy = a.ip(&["route", "show", OTHER]).unwrap();
    assert!(copy.contains("via 10.101.1.1") && lowered(&copy), "{copy}");
    a.ip(&["route", "replace", "default", "via", "10.101.1.3"])
        .unwrap();
    let copy = wait_for_route(a, &["route", "show", OTHER], |o| {
        o.contains("via 10.101.1.3")
    });
    assert!(
        copy.contains("via 10.101.1.3") && lowered(&copy),
        "the copy of the default route follows its gateway:\n{copy}"
    );
    // The default route is withdrawn: so is the copy.
    a.ip(&["route", "del", "default"]).unwrap();
    let copy = wait_for_route(a, &["route", "show", OTHER], |o| o.trim().is_empty());
    assert!(
        copy.trim().is_empty(),
        "the copy outlived its route:\n{copy}"
    );

    // Each change was answered once: our own changes did not set off more.
    let log = agent.log();
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(
        log.matches("lowered its MTU again").count(),
        4,
        "the daemon's refresh, the copy after the withdrawal, the daemon's route back, the \
         copy following the default route:\n{log}"
    );
    let routes = a.ip(&["route"]).unwrap();
    assert!(
        routes.contains(&format!(
            "{B_PREFIX} via 10.101.1.1 dev {} proto bgp metric 20",
            arb.a_if
        )) && !routes.contains("mtu"),
        "the daemon's latest route, as it installed it:\n{routes}"
    );
    assert!(
        routes.contains(&format!("unreachable {UNREACHABLE}")),
        "{routes}"
    );
    assert!(!routes.contains(&OTHER[..9]), "{routes}");
}

const OTHER: &str = "10.109.0.0/24";
const UNREACHABLE: &str = "10.110.0.0/24";

/// Gives A the fabric's IPv6: its address in the /96 and a default route via R.
fn ipv6_on_a(arb: &Arb) {
    arb.a
        .ip(&[
            "-6",
            "addr",
            "add",
            &format!("{A_ADDR6}/120"),
            "dev",
            &arb.a_if,
            "nodad",
        ])
        .unwrap();
    arb.a
        .ip(&["-6", "route", "add", "default", "via", "fd00:5a::a65:101"])
        .unwrap();
}

/// The agent on A in the SRv6 encoding (its /96 routed with the MTU the outer header leaves),
/// two paths to B's rack.
fn start_srv6_on_a(arb: &Arb) -> Agent {
    Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::srv6_path_table(A_ADDR6, A_RACK_USID, B_PREFIX, B_RACK_USID, 2),
        &["--no-metrics"],
    )
    .expect("agent on A")
}

/// `ip <args>` in `ns` once its output satisfies `ok`, waiting at most `within`; fails naming
/// what it saw.
fn route_within(
    ns: &sopa_testbed::NetNs,
    args: &[&str],
    within: Duration,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    poll_route(ns, args, within, ok)
        .unwrap_or_else(|out| panic!("{what} within {within:?}; `ip {}`:\n{out}", args.join(" ")))
}

/// A stop undoes the agent's own change only: an operator's edit of a route the agent lowered
/// (initcwnd) survives it, the MTU going back to what it was; and an IPv6 route the operator
/// put in place of the agent's /96 stays.
#[test]
fn a_stop_undoes_only_the_agents_own_change_and_keeps_the_operators_edits() {
    let arb = Arb::new("ru").expect("build A - R - B");
    let a = &arb.a;
    a.ip(&[
        "route",
        "add",
        B_PREFIX,
        "via",
        "10.101.1.1",
        "proto",
        "bgp",
    ])
    .unwrap();
    let agent = start_on_a(&arb, &[B_PREFIX]);
    route_within(
        a,
        &["route", "show", B_PREFIX],
        Duration::from_secs(10),
        "lowered",
        |o| o.contains(" mtu 1496"),
    );
    // The operator tunes the route, restating the MTU it has (so nothing is lowered again).
    a.ip(&[
        "route",
        "change",
        B_PREFIX,
        "via",
        "10.101.1.1",
        "proto",
        "bgp",
        "mtu",
        "1496",
        "initcwnd",
        "20",
    ])
    .unwrap();
    assert_eq!(agent.stop(), Some(0));
    let after = a.ip(&["route", "show", B_PREFIX]).unwrap();
    assert!(
        after.contains("initcwnd 20") && !after.contains("mtu"),
        "the operator's initcwnd kept, the agent's MTU gone: {after}"
    );

    // IPv6: the agent routes the /96 with its MTU; the operator replaces that route.
    ipv6_on_a(&arb);
    let agent = start_srv6_on_a(&arb);
    let six = ["-6", "route", "show", "fd00:5a::/96"];
    route_within(a, &six, Duration::from_secs(10), "the /96 routed", |o| {
        o.contains("mtu 1452")
    });
    a.ip(&[
        "-6",
        "route",
        "replace",
        "fd00:5a::/96",
        "via",
        "fd00:5a::a65:101",
        "dev",
        &arb.a_if,
        "proto",
        "static",
        "mtu",
        "1400",
    ])
    .unwrap();
    assert_eq!(agent.stop(), Some(0));
    let after = a.ip(&six).unwrap();
    assert!(
        after.contains("mtu 1400"),
        "the operator's /96 route was removed with the agent's: {after:?}"
    );
}

/// The routes' MTU follows the interface's: raised while the agent runs, the fabric routes
/// (the prefix's own, rewritten, and the /96 the agent added) take the new target within a
/// second, and a stop gives the routes back as they were.
#[test]
fn the_fabric_routes_follow_the_interfaces_mtu() {
    let arb = Arb::new("rm").expect("build A - R - B");
    let a = &arb.a;
    a.ip(&[
        "route",
        "add",
        B_PREFIX,
        "via",
        "10.101.1.1",
        "proto",
        "bgp",
    ])
    .unwrap();
    let before = a.ip(&["route", "show", B_PREFIX]).unwrap();
    ipv6_on_a(&arb);
    let agent = start_srv6_on_a(&arb);
    let four = ["route", "show", B_PREFIX];
    let six = ["-6", "route", "show", "fd00:5a::/96"];
    let ten = Duration::from_secs(10);
    route_within(a, &four, ten, "lowered", |o| o.contains(" mtu 1452"));
    route_within(a, &six, ten, "the /96 routed", |o| o.contains("mtu 1452"));
    for (mtu, target) in [("9000", "8952"), ("4000", "3952")] {
        a.ip(&["link", "set", &arb.a_if, "mtu", mtu]).unwrap();
        let second = Duration::from_secs(1);
        let what = format!("the interface at {mtu}: routes at {target}");
        route_within(a, &four, second, &what, |o| {
            o.contains(&format!(" mtu {target}"))
        });
        route_within(a, &six, second, &what, |o| {
            o.contains(&format!("mtu {target}"))
        });
    }
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(a.ip(&["route", "show", B_PREFIX]).unwrap(), before);
    assert_eq!(a.ip(&six).unwrap().trim(), "", "the agent's /96 removed");
}
