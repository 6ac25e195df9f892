//! Hedera on Fat-Tree k=4 (needs root): two long flows that the 5-tuple hash puts on the same
//! core share it at about half the link rate each; once the hosts report them, Global First
//! Fit separates them within two scheduling intervals and both run at 80% of the link rate or
//! more.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use sopa_common::{hash::flow_hash, maps::FlowKey};
use sopa_testbed::{
    experiment,
    fabric::{Fabric, FabricOptions},
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::topology::TopologySpec;

/// The agents' default hash seed (`sopa-agent run --hash-seed`).
const SEED: u32 = 0x5eed;
const PORT: u16 = 5301;
/// The controller's default scheduling interval.
const INTERVAL: Duration = Duration::from_secs(1);

fn addr(f: &Fabric, host: &str) -> Ipv4Addr {
    let g = f.topo.graph();
    g.node(g.find(host).unwrap()).addr.unwrap()
}

/// A source port whose flow to `dst:dport` hashes onto path index 0 of the 4 inter-pod paths:
/// (0, 0).
fn colliding_port(src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> u16 {
    (40000..u16::MAX)
        .find(|&sport| {
            let key = FlowKey {
                saddr: u32::from_ne_bytes(src.octets()),
                daddr: u32::from_ne_bytes(dst.octets()),
                sport: sport.to_be(),
                dport: dport.to_be(),
                proto: 6,
                _pad: [0; 3],
            };
            flow_hash(&key, SEED).is_multiple_of(4)
        })
        .expect("a port")
}

fn set_host_mode(f: &Fabric, host: &str, mode: &str) {
    let out = std::process::Command::new(sopa_testbed::bins::sopa_agent())
        .args(["mode", "--node", &f.host(host).node, mode])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each host's wire rate over `window`, as a fraction of `rate_mbit`.
fn rates(f: &Fabric, hosts: &[&str], window: Duration, rate_mbit: u32) -> Vec<f64> {
    let g = f.topo.graph();
    let read = || -> Vec<u64> {
        hosts
            .iter()
            .map(|h| {
                let id = g.find(h).unwrap();
                f.ns(h).tx_bytes(&f.host_ifaces[&id]).unwrap()
            })
            .collect()
    };
    let before = read();
    std::thread::sleep(window);
    let after = read();
    before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 * 8.0 / window.as_secs_f64() / (f64::from(rate_mbit) * 1e6))
        .collect()
}

#[test]
fn hedera_separates_two_elephants_that_collide_under_hashing() {
    let opts = FabricOptions::default();
    let rate = opts.rate_mbit.unwrap();
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).unwrap();
    f.start(&opts).unwrap();
    f.wait_ready(Duration::from_secs(60)).unwrap();
    experiment::set_mode(&f, "hedera");
    // Hashing first (the same hash pinned mode falls back to), so the collision is measured.
    for h in ["h0", "h2"] {
        set_host_mode(&f, h, "ecmp");
    }
    let flows = [("h0", "h4"), ("h2", "h6")];
    let ports: Vec<u16> = flows
        .iter()
        .enumerate()
        .map(|(i, (a, b))| colliding_port(addr(&f, a), addr(&f, b), PORT + i as u16))
        .collect();

    let (collided, elapsed, separated, status, transfers) = std::thread::scope(|s| {
        let handles: Vec<_> = flows
            .iter()
            .zip(&ports)
            .enumerate()
            .map(|(i, ((a, b), sport))| {
                let (sa, sb, to) = (f.ns(a), f.ns(b), addr(&f, b));
                let opts = SendOptions {
                    stall_timeout: Duration::from_secs(30),
                    source_port: Some(*sport),
                    ..SendOptions::default()
                };
                s.spawn(move || tcp_transfer(sa, sb, to, PORT + i as u16, 150_000_000, &opts))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        let collided = rates(&f, &["h0", "h2"], Duration::from_secs(2), rate);
        let hashed: Vec<String> = ["h0", "h2"]
            .iter()
            .map(|h| {
                let st = f.host(h).status().unwrap();
                format!(
                    "{h}: mode {} hop0 {} hop1 {}",
                    st["mode"], st["hop0"], st["hop1"]
                )
            })
            .collect();
        eprintln!("under hashing: {hashed:?}");
        // Hedera takes over: pinned mode reports the elephants, the controller places them.
        let start = Instant::now();
        for h in ["h0", "h2"] {
            set_host_mode(&f, h, "pinned");
        }
        let status = loop {
            let st: serde_json::Value =
                serde_json::from_str(&f.sopactl(&["hedera", "status", "--json"]).unwrap()).unwrap();
            let placed: Vec<&serde_json::Value> = st["elephants"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["placed"].as_bool() == Some(true))
                .collect();
            if placed.len() == 2 {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "not placed within 10 s: {st:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let elapsed = start.elapsed();
        // The moved flow reorders once at the move and cubic regrows its window: let it settle
        // before measuring the separated rates.
        std::thread::sleep(Duration::from_secs(3));
        let separated = rates(&f, &["h0", "h2"], Duration::from_secs(2), rate);
        let transfers: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (collided, elapsed, separated, status, transfers)
    });
    eprintln!(
        "collided {collided:.3?}, placed after {elapsed:?}, separated {separated:.3?}\n{status:#}"
    );

    assert!(
        collided.iter().sum::<f64>() < 1.1 && collided.iter().all(|r| *r < 0.65),
        "hashing must put both flows on one core (about half the link each): {collided:?}"
    );
    assert!(
        elapsed <= 2 * INTERVAL + Duration::from_millis(500),
        "placed after {elapsed:?}: more than two scheduling intervals"
    );
    let paths: Vec<&str> = status["elephants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    let cores: Vec<&str> = paths.iter().map(|p| p.split(' ').nth(2).unwrap()).collect();
    assert_ne!(cores[0], cores[1], "placed on disjoint cores: {paths:?}");
    assert!(
        separated.iter().all(|r| *r >= 0.8),
        "after placement both flows reach 80% of the link rate: {separated:?}"
    );
    for t in transfers {
        let t = t.unwrap();
        assert!(t.intact(), "sha256 equal end to end");
    }
    // The pins are in the datapath and the packets took them.
    for h in ["h0", "h2"] {
        let st = f.host(h).status().unwrap();
        assert!(
            st["stamp"]["pinned"].as_u64().unwrap_or(0) > 0,
            "{h}: {st:#}"
        );
    }
}
