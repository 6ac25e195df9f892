//! Discovery through hashing routers, and the round robin it makes possible.

use std::time::{Duration, Instant};

use sopa_testbed::{
    fabric::Fabric,
    reach::all_pairs_tcp,
    traffic::{SendOptions, tcp_transfer},
};

/// Every host's discovery, once done (at most `within`).
fn summaries(f: &Fabric, within: Duration) -> Vec<(String, serde_json::Value)> {
    let hosts: Vec<String> = f
        .topo
        .graph()
        .nodes
        .iter()
        .filter(|n| !n.kind.is_switch())
        .map(|n| n.name.clone())
        .collect();
    let deadline = Instant::now() + within;
    hosts
        .into_iter()
        .map(|h| {
            loop {
                let st = f.host(&h).status().unwrap();
                if st["entropy"]["done"] == true {
                    break (h, st["entropy"].clone());
                }
                assert!(
                    Instant::now() < deadline,
                    "{h}'s discovery not done within {within:?}: {}",
                    st["entropy"]
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .collect()
}

/// Each host finds, for every destination host and next header, as many paths as the
/// topology has: 4 to a host of another pod, 2 to one of its own pod.
pub fn discovery_finds_every_path_to_every_host(f: &mut Fabric) {
    let (mut probes, mut millis, mut rows) = (0u64, 0u64, 0u64);
    for (h, e) in summaries(f, Duration::from_secs(60)) {
        assert_eq!(e["incomplete"], serde_json::json!([]), "{h}: {e}");
        let dests = e["destinations"].as_array().unwrap();
        assert_eq!(dests.len(), 14, "{h}: every host of the other racks");
        for d in dests {
            let expected = d["expected"].as_u64().unwrap();
            assert!(expected == 4 || expected == 2, "{h}: {d}");
            for class in ["ipv4", "tcp6", "udp6"] {
                assert_eq!(d["found"][class].as_u64(), Some(expected), "{h}: {d}");
            }
            probes += d["probes"].as_u64().unwrap();
            millis += d["millis"].as_u64().unwrap();
            rows += 1;
        }
    }
    eprintln!(
        "discovery: {probes} probes, {:.1} s of probing over {rows} (host, destination) pairs: \
         {:.1} probes and {:.0} ms per destination host (3 next headers)",
        millis as f64 / 1000.0,
        probes as f64 / rows as f64,
        millis as f64 / rows as f64
    );
}

/// What left a0's and a1's ports towards the cores, in core order.
fn per_core(f: &Fabric) -> Vec<u64> {
    [("a0", "c0"), ("a0", "c1"), ("a1", "c2"), ("a1", "c3")]
        .iter()
        .map(|(a, c)| f.ns(a).tx_packets(&f.link_iface(a, c)).unwrap())
        .collect()
}

/// One flow h0 -> h4 (another pod): its packets leave pod 0 equally by the four cores,
/// within 1% (the interfaces also count a few neighbour messages of the kernel's own).
pub fn one_flow_spreads_evenly_over_the_cores(f: &mut Fabric) {
    summaries(f, Duration::from_secs(60));
    let h4: std::net::Ipv4Addr = "10.1.0.2".parse().unwrap();
    let before = per_core(f);
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
    let per: Vec<u64> = per_core(f)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    let stamped = f.host("h0").status().unwrap()["stamp"]["stamped"].clone();
    eprintln!("h0 -> h4: packets out of pod 0 per core {per:?} (h0 stamped {stamped})");
    let (lo, hi) = (*per.iter().min().unwrap(), *per.iter().max().unwrap());
    assert!(lo > 1000, "{per:?}");
    assert!(hi - lo <= (lo / 100).max(8), "within 1%: {per:?}");
}

/// Every host reaches every other one over TCP, on IPv4 (in the outer header) and IPv6
/// (relabelled).
pub fn every_pair_reaches_over_ipv4_and_ipv6(f: &mut Fabric) {
    let failed = all_pairs_tcp(&f.host_addresses(), 7100).unwrap();
    assert!(failed.is_empty(), "unreachable over IPv4: {failed:?}");
    let failed = all_pairs_tcp(&f.host_addresses6(), 7101).unwrap();
    assert!(failed.is_empty(), "unreachable over IPv6: {failed:?}");
}
