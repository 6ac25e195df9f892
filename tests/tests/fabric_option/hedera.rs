//! Hedera on the shared Fat-Tree: two long flows that the 5-tuple hash puts on the same
//! core link leave pod 0 by that one link; once the hosts report them, Global First Fit places
//! each in the scheduling round that first lists it as an elephant, on disjoint cores, and
//! their packets then leave pod 0 by two different core links. Everything is counted in
//! packets and rounds, not in time, so a busy machine changes no verdict; the rates are
//! printed (`cargo xtask bench fabric` measures them). The flows stop once that is seen.

use std::{
    net::Ipv4Addr,
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use sopa_common::{hash::flow_hash, maps::FlowKey};
use sopa_testbed::{
    experiment,
    fabric::Fabric,
    traffic::{SendOptions, StopWhenDropped, tcp_transfer},
};

/// The agents' default hash seed (`sopa-agent run --hash-seed`).
const SEED: u32 = 0x5eed;
const PORT: u16 = 5301;

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
    sopa_testbed::agent::set_mode(&f.host(host).node, mode).unwrap_or_else(|e| panic!("{e}"));
}

/// Each host's wire rate over `window`, as a fraction of `rate_mbit` (printed, not asserted).
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

/// Packets out of pod 0's four core links (a0 and a1, each hop1 port towards pod 1) while the
/// next `packets` packets leave by them: a window counted in packets, not in seconds.
fn core_share(f: &Fabric, dst: Ipv4Addr, packets: u64) -> Vec<u64> {
    let read = || -> Vec<u64> {
        ["a0", "a1"]
            .iter()
            .flat_map(|a| f.hop_ports_tx(a, dst))
            .collect()
    };
    let before = read();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = read();
        let d: Vec<u64> = now.iter().zip(&before).map(|(n, b)| n - b).collect();
        if d.iter().sum::<u64>() >= packets {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "the flows stopped sending: {d:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The shared fabric's link rate.
const RATE_MBIT: u32 = 100;

pub fn separates_two_elephants_that_collide_under_hashing(f: &mut Fabric) {
    let rate = RATE_MBIT;
    let f = &*f;
    experiment::set_mode(f, "hedera");
    // Hashing first (the same hash pinned mode falls back to), so the collision is measured.
    for h in ["h0", "h2"] {
        set_host_mode(f, h, "ecmp");
    }
    let flows = [("h0", "h4"), ("h2", "h6")];
    let ports: Vec<u16> = flows
        .iter()
        .enumerate()
        .map(|(i, (a, b))| colliding_port(addr(f, a), addr(f, b), PORT + i as u16))
        .collect();

    // Long enough for any wait below (at most 2 minutes); stopped once the placement is seen.
    let stop = Arc::new(AtomicBool::new(false));
    let (collided, elapsed, separated, status, transfers) = std::thread::scope(|s| {
        // A failed wait below ends the transfers too, or the scope would wait for them.
        let stop_on_unwind = StopWhenDropped(stop.clone());
        let handles: Vec<_> = flows
            .iter()
            .zip(&ports)
            .enumerate()
            .map(|(i, ((a, b), sport))| {
                let (sa, sb, to) = (f.ns(a), f.ns(b), addr(f, b));
                let opts = SendOptions {
                    stall_timeout: Duration::from_secs(30),
                    source_port: Some(*sport),
                    stop: Some(stop.clone()),
                    ..SendOptions::default()
                };
                s.spawn(move || tcp_transfer(sa, sb, to, PORT + i as u16, 1_500_000_000, &opts))
            })
            .collect();
        let dst = addr(f, "h4");
        let collided = core_share(f, dst, 4_000);
        let collided_rates = rates(f, &["h0", "h2"], Duration::from_secs(1), rate);
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
        eprintln!("under hashing: {hashed:?}, rates {collided_rates:.3?}");
        // Hedera takes over: pinned mode reports the elephants, the controller places them.
        let start = Instant::now();
        for h in ["h0", "h2"] {
            set_host_mode(f, h, "pinned");
        }
        let status = loop {
            let st: serde_json::Value =
                serde_json::from_str(&f.sopactl(&["hedera", "status", "--json"]).unwrap()).unwrap();
            let elephants = st["elephants"].as_array().unwrap();
            // GFF places an elephant in the round that first lists it (the links have room).
            assert!(
                elephants.iter().all(|e| e["placed"] == true),
                "an elephant listed but not placed: {st:#}"
            );
            if elephants.len() == 2 {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the two elephants were not reported within 60 s: {st:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let elapsed = start.elapsed();
        // Pins reach the hosts with the round's push: wait until both datapaths use them.
        let deadline = Instant::now() + Duration::from_secs(60);
        let pinned = |h: &str| {
            f.host(h).status().unwrap()["stamp"]["pinned"]
                .as_u64()
                .unwrap_or(0)
        };
        let pinned_before = [pinned("h0"), pinned("h2")];
        while pinned("h0") <= pinned_before[0] || pinned("h2") <= pinned_before[1] {
            assert!(Instant::now() < deadline, "the pins were not applied");
            std::thread::sleep(Duration::from_millis(20));
        }
        let separated = core_share(f, dst, 4_000);
        let separated_rates = rates(f, &["h0", "h2"], Duration::from_secs(1), rate);
        eprintln!("separated rates {separated_rates:.3?}");
        drop(stop_on_unwind);
        let transfers: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (collided, elapsed, separated, status, transfers)
    });
    eprintln!(
        "packets per core link: collided {collided:?}, placed after {elapsed:?}, separated {separated:?}\n{status:#}"
    );
    let total = |v: &[u64]| v.iter().sum::<u64>();
    let busiest = |v: &[u64]| *v.iter().max().unwrap();
    let second = |v: &[u64]| {
        let mut s = v.to_vec();
        s.sort_unstable();
        s[s.len() - 2]
    };
    assert!(
        busiest(&collided) * 100 >= total(&collided) * 95,
        "hashing puts both flows on one core link: {collided:?}"
    );
    // Both flows on links of their own: the two busiest links carry nearly everything, each a
    // good part of it.
    assert!(
        (busiest(&separated) + second(&separated)) * 100 >= total(&separated) * 95
            && second(&separated) * 100 >= total(&separated) * 25,
        "after placement the flows leave by two core links: {separated:?}"
    );
    let paths: Vec<&str> = status["elephants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    let cores: Vec<&str> = paths.iter().map(|p| p.split(' ').nth(2).unwrap()).collect();
    assert_ne!(cores[0], cores[1], "placed on disjoint cores: {paths:?}");
    for t in transfers {
        let t = t.unwrap();
        assert!(t.intact(), "digests equal end to end");
    }
    experiment::set_mode(f, "sopa");
}
