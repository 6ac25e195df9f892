//! Discovery through routers that only hash (needs root): a diamond of plain Linux routers,
//! A - S - {R1, R2} - T - B, where S spreads IPv6 to B over R1 and R2 by its multipath hash
//! (policy 0: addresses, next header, flow label; a seed of its own). From A, the prober finds
//! one label per path (the router that answers hop limit 2 tells them apart), and data sent
//! with each label takes exactly the path its probe found. A namespace set of its own: no
//! testbed fabric has routers without a switch agent yet. Routers answer without an ICMP rate
//! limit here (`net.ipv6.icmp.ratelimit` 0), so the result does not hang on timing; pacing
//! under the default limits is the benchmark's to measure.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use sopa_agent::entropy::{
    discover::{Pace, Prober, Target, discover, labels},
    probe::Probe,
};
use sopa_common::entropy::{NEXT_IPV4, PROBE_MARK};
use sopa_testbed::netns::{NetNs, run_name, veth};

struct Diamond {
    a: NetNs,
    s: NetNs,
    // Kept for their drop: the namespaces go with the guards.
    _r: [NetNs; 2],
    _t: NetNs,
    _b: NetNs,
}

const A: &str = "2001:db8:a::2";
const B: &str = "2001:db8:b::2";

fn diamond() -> Diamond {
    let tag = run_name("ev");
    let ns = |n: &str| NetNs::new(&format!("{tag}{n}")).unwrap();
    let (a, s, r1, r2, t, b) = (ns("a"), ns("s"), ns("r1"), ns("r2"), ns("t"), ns("b"));
    for n in [&a, &s, &r1, &r2, &t, &b] {
        n.sysctl("net.ipv6.conf.all.accept_dad", "0").unwrap();
        n.sysctl("net.ipv6.conf.default.accept_dad", "0").unwrap();
        n.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
        n.sysctl("net.ipv6.icmp.ratelimit", "0").unwrap();
    }
    // S's own hash seed (every namespace shares the boot seed otherwise).
    s.sysctl("net.ipv4.fib_multipath_hash_seed", "7919")
        .unwrap();
    veth(&a, "a0", &s, "s0").unwrap();
    veth(&s, "s1", &r1, "r0").unwrap();
    veth(&s, "s2", &r2, "r0").unwrap();
    veth(&r1, "r1", &t, "t1").unwrap();
    veth(&r2, "r1", &t, "t2").unwrap();
    veth(&t, "t0", &b, "b0").unwrap();
    let addr = |n: &NetNs, a: &str, dev: &str| {
        n.ip(&["-6", "addr", "add", a, "dev", dev, "nodad"])
            .unwrap();
    };
    addr(&a, "2001:db8:a::2/64", "a0");
    addr(&s, "2001:db8:a::1/64", "s0");
    addr(&s, "2001:db8:1::1/64", "s1");
    addr(&s, "2001:db8:2::1/64", "s2");
    addr(&r1, "2001:db8:1::2/64", "r0");
    addr(&r2, "2001:db8:2::2/64", "r0");
    addr(&r1, "2001:db8:3::1/64", "r1");
    addr(&r2, "2001:db8:4::1/64", "r1");
    addr(&t, "2001:db8:3::2/64", "t1");
    addr(&t, "2001:db8:4::2/64", "t2");
    addr(&t, "2001:db8:b::1/64", "t0");
    addr(&b, "2001:db8:b::2/64", "b0");
    let route = |n: &NetNs, args: &[&str]| {
        let mut all = vec!["-6", "route", "add"];
        all.extend(args);
        n.ip(&all).unwrap();
    };
    route(&a, &["default", "via", "2001:db8:a::1"]);
    route(&b, &["default", "via", "2001:db8:b::1"]);
    route(
        &s,
        &[
            "2001:db8:b::/64",
            "nexthop",
            "via",
            "2001:db8:1::2",
            "nexthop",
            "via",
            "2001:db8:2::2",
        ],
    );
    route(&r1, &["2001:db8:b::/64", "via", "2001:db8:3::2"]);
    route(&r2, &["2001:db8:b::/64", "via", "2001:db8:4::2"]);
    route(&r1, &["2001:db8:a::/64", "via", "2001:db8:1::1"]);
    route(&r2, &["2001:db8:a::/64", "via", "2001:db8:2::1"]);
    route(
        &t,
        &[
            "2001:db8:a::/64",
            "nexthop",
            "via",
            "2001:db8:3::1",
            "nexthop",
            "via",
            "2001:db8:4::1",
        ],
    );
    Diamond {
        a,
        s,
        _r: [r1, r2],
        _t: t,
        _b: b,
    }
}

fn target() -> Target {
    Target {
        src: A.parse().unwrap(),
        dst: B.parse().unwrap(),
        src4: Ipv4Addr::new(10, 0, 0, 2),
        dst4: Ipv4Addr::new(10, 1, 0, 2),
        next: NEXT_IPV4,
        hop_limits: vec![2],
        expected: 2,
    }
}

#[test]
fn one_label_per_path_is_found_and_data_with_it_takes_that_path() {
    let d = diamond();
    let t = target();
    let pace = Pace {
        interval: Duration::from_millis(2),
        wait: Duration::from_millis(500),
        patience: 16,
    };
    let found =
        d.a.run(|| {
            let mut prober = Prober::open(PROBE_MARK).unwrap();
            discover(&mut prober, &t, &pace, &mut labels(1)).unwrap()
        })
        .unwrap();
    eprintln!(
        "found {} paths with {} probes in {:?} ({} unanswered)",
        found.paths.len(),
        found.probes,
        found.took,
        found.unanswered
    );
    let routers: BTreeSet<Vec<Ipv6Addr>> = found.paths.keys().cloned().collect();
    let r1: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
    let r2: Ipv6Addr = "2001:db8:2::2".parse().unwrap();
    assert_eq!(
        routers,
        BTreeSet::from([vec![r1], vec![r2]]),
        "each path once, by the router that answered hop limit 2"
    );
    // Data with each label (hop limit 64: it reaches B) leaves S by that label's path only.
    for (path, label) in &found.paths {
        let (dev, other) = if path[0] == r1 {
            ("s1", "s2")
        } else {
            ("s2", "s1")
        };
        let before = (d.s.tx_packets(dev).unwrap(), d.s.tx_packets(other).unwrap());
        d.a.run(|| {
            let prober = Prober::open(0).unwrap();
            for i in 0..100 {
                prober
                    .send(&Probe {
                        src: t.src,
                        dst: t.dst,
                        src4: t.src4,
                        dst4: t.dst4,
                        next: t.next,
                        label: *label,
                        hop_limit: 64,
                        id: i,
                    })
                    .unwrap();
            }
        })
        .unwrap();
        let after = (d.s.tx_packets(dev).unwrap(), d.s.tx_packets(other).unwrap());
        assert!(
            after.0 - before.0 >= 100,
            "label {label:#x}: {} of 100 left by {dev}",
            after.0 - before.0
        );
        // Nothing of A's leaves by the other (a neighbour solicitation or two aside).
        assert!(
            after.1 - before.1 < 5,
            "label {label:#x}: {} packets left by {other}",
            after.1 - before.1
        );
    }
}
