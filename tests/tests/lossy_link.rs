//! The testbed's gray link (`tc_lossy`) drops what it is told to, and only that: 20,000 UDP
//! packets over a veth pair at 0%, 2% and 0.5% loss, the drops it counts checked against the
//! rate (binomial, within 5 standard deviations) and against what arrived at the other end.
//! Needs root.

use sopa_testbed::{NetNs, lossy::LossyLink, netns::veth, run_name};

fn rx_packets(ns: &NetNs, dev: &str) -> u64 {
    let out = ns.ip(&["-s", "-j", "link", "show", dev]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap()
}

#[test]
fn a_lossy_link_drops_its_rate_and_counts_every_drop() {
    let (a, b) = (
        NetNs::new(&run_name("la")).unwrap(),
        NetNs::new(&run_name("lb")).unwrap(),
    );
    // No IPv6 (router solicitations, MLD reports): nothing but the probe crosses the link.
    for ns in [&a, &b] {
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1").unwrap();
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
            .unwrap();
    }
    veth(&a, "ab", &b, "ba").unwrap();
    a.ip(&["addr", "add", "192.168.77.1/24", "dev", "ab"])
        .unwrap();
    b.ip(&["addr", "add", "192.168.77.2/24", "dev", "ba"])
        .unwrap();
    // Static neighbours both ways (the receiver answers with port unreachables): no ARP.
    let mac = |ns: &NetNs, dev: &str| {
        let out = ns.ip(&["-j", "link", "show", dev]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["address"].as_str().unwrap().to_owned()
    };
    let (mac_a, mac_b) = (mac(&a, "ab"), mac(&b, "ba"));
    a.ip(&[
        "neigh",
        "add",
        "192.168.77.2",
        "lladdr",
        &mac_b,
        "dev",
        "ab",
        "nud",
        "permanent",
    ])
    .unwrap();
    b.ip(&[
        "neigh",
        "add",
        "192.168.77.1",
        "lladdr",
        &mac_a,
        "dev",
        "ba",
        "nud",
        "permanent",
    ])
    .unwrap();
    let mut lossy = LossyLink::attach(&a, "ab").unwrap();
    const N: u64 = 20_000;
    for percent in [0.0, 2.0, 0.5] {
        lossy.set_loss(percent).unwrap();
        let (seen0, dropped0) = lossy.counts().unwrap();
        let rx0 = rx_packets(&b, "ba");
        a.run(|| {
            let s = std::net::UdpSocket::bind("192.168.77.1:0").unwrap();
            for i in 0..N {
                s.send_to(&i.to_be_bytes(), "192.168.77.2:9").unwrap();
            }
        })
        .unwrap();
        let (seen, dropped) = lossy.counts().unwrap();
        let (seen, dropped) = (seen - seen0, dropped - dropped0);
        let arrived = rx_packets(&b, "ba") - rx0;
        let p = percent / 100.0;
        let (mean, sd) = (N as f64 * p, (N as f64 * p * (1.0 - p)).sqrt());
        eprintln!(
            "{percent}%: {dropped} of {seen} dropped ({:.3}%), {arrived} arrived",
            dropped as f64 * 100.0 / seen as f64
        );
        assert_eq!(seen, N, "{percent}%: every packet seen once");
        assert_eq!(
            arrived,
            N - dropped,
            "{percent}%: what was not dropped arrived"
        );
        assert!(
            (dropped as f64 - mean).abs() <= 5.0 * sd.max(1.0),
            "{percent}%: {dropped} dropped, expected {mean:.0} +- {:.0}",
            5.0 * sd
        );
    }
    drop(lossy);
    // Detached with the handle: nothing dropped any more.
    let rx0 = rx_packets(&b, "ba");
    a.run(|| {
        let s = std::net::UdpSocket::bind("192.168.77.1:0").unwrap();
        for i in 0..1000u64 {
            s.send_to(&i.to_be_bytes(), "192.168.77.2:9").unwrap();
        }
    })
    .unwrap();
    assert_eq!(rx_packets(&b, "ba") - rx0, 1000);
}
