//! Forwarding by source route on the shared Fat-Tree, and what a host without a live agent
//! can do to it.

use std::time::Duration;

use sopa_testbed::{
    capture::{Capture, has_ipv4_options},
    fabric::Fabric,
    reach::{all_pairs_tcp, udp_with_ip_options},
    traffic::{SendOptions, tcp_transfer},
};

/// Packets that left a0 and a1 by the port of each hop1 value towards h4 (10.1.0.2), as the
/// interfaces counted them.
fn core_tx(f: &Fabric) -> Vec<(String, u64)> {
    ["a0", "a1"]
        .iter()
        .flat_map(|a| {
            f.hop_ports_tx(a, "10.1.0.2".parse().unwrap())
                .into_iter()
                .enumerate()
                .map(move |(h, n)| (format!("{a} hop1={h}"), n))
        })
        .collect()
}

/// Packets per core link since `before`.
fn core_tx_since(f: &Fabric, before: &[(String, u64)]) -> Vec<(String, u64)> {
    core_tx(f)
        .into_iter()
        .zip(before)
        .map(|((link, now), (_, then))| (link, now - then))
        .collect()
}

/// More than `least` on every link, and equal within 5% (at least 16 packets): the interfaces
/// also count the kernel's own messages (ARP, IPv6 router solicitations and MLD reports, at
/// times of their own), 8 of them once in a 4 MB transfer's window; a port that carried two hop
/// values, or none, is off by half or more.
fn balanced(per_link: &[(String, u64)], least: u64) -> bool {
    let counts = per_link.iter().map(|(_, n)| *n);
    let (lo, hi) = (counts.clone().min().unwrap(), counts.max().unwrap());
    lo > least && hi - lo <= (lo / 20).max(16)
}

/// Equal within 1% (at least 4 packets): what separates an even spread with a stray packet
/// of another connection from a path that carried nothing or twice its share.
fn within_one_percent(per_path: &[u64]) -> bool {
    let (lo, hi) = (
        *per_path.iter().min().unwrap(),
        *per_path.iter().max().unwrap(),
    );
    hi - lo <= (lo / 100).max(4)
}

/// What `tc_forward` on `switch` counted for uplink decision `i`.
fn up(f: &Fabric, switch: &str, i: usize) -> u64 {
    f.switch_status(switch).unwrap()["uplinks"][i]
        .as_u64()
        .unwrap_or(0)
}

/// Every host reaches every other; an inter-pod flow takes its four paths equally and no option
/// reaches the receiver's stack; a link down moves the hosts off it; a killed switch agent
/// leaves its forwarding as it was; ports that go down are reported, also to a restarted
/// controller and to one that lost its state.
pub fn forwards_by_source_route(f: &mut Fabric) {
    // Every host reaches every other host over TCP.
    let g = f.topo.graph().clone();
    let hosts: Vec<_> = (0..16)
        .map(|i| {
            let name = format!("h{i}");
            (f.ns(&name), g.node(g.find(&name).unwrap()).addr.unwrap())
        })
        .collect();
    let failed = all_pairs_tcp(&hosts, 7100).unwrap();
    assert!(failed.is_empty(), "unreachable: {failed:?}");

    // An inter-pod flow h0 -> h4 takes the four paths equally; the option never reaches h4's stack.
    let paths = |f: &Fabric| {
        [
            up(f, "a0", 0),
            up(f, "a0", 1),
            up(f, "a1", 0),
            up(f, "a1", 1),
        ]
    };
    let before = paths(f);
    let wire_before = core_tx(f);
    let at_h4 = Capture::start(f.ns("h4"), &f.host_ifaces[&g.find("h4").unwrap()]).unwrap();
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        7000,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4");
    assert!(t.intact());
    let frames = at_h4.finish().unwrap().frames;
    let with_options = frames.iter().filter(|fr| has_ipv4_options(fr)).count();
    assert!(
        frames.len() > 1000 && with_options == 0,
        "{with_options} of {} frames at h4 carried options",
        frames.len()
    );
    let after = paths(f);
    let per_path: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    let lo = per_path.iter().min().unwrap();
    eprintln!(
        "h0 -> h4: {:.0} Mbit/s, packets per path {per_path:?}",
        t.mbit_per_s()
    );
    assert!(*lo > 1000, "{per_path:?}");
    // One flow alone would be equal within one (the fixtures and host_datapath check the
    // cycle itself); these counters also see a straggler of an earlier connection (a FIN
    // or ACK from TIME_WAIT) now and then: within 1% (the wire below gets more room for the
    // kernel's own messages).
    assert!(
        within_one_percent(&per_path),
        "packets per path equal: {per_path:?}"
    );
    // What left each core port: the four hop values went out of four different interfaces,
    // equally.
    let on_wire = core_tx_since(f, &wire_before);
    eprintln!("packets out of each core port of a0 and a1: {on_wire:?}");
    assert_eq!(on_wire.len(), 4, "a0 and a1 have two core links each");
    assert!(
        balanced(&on_wire, 1000),
        "packets out of each core port equal: {on_wire:?}"
    );

    // e0 - a0 down: the hosts drop its paths, no packet crosses it, the transfer arrives intact.
    let out = f.sopactl(&["link", "down", "e0", "a0"]).unwrap();
    assert!(out.contains("now down"), "{out}");
    let h0 = f.host("h0");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h0.status().unwrap()["path_table"]["10.1.0.0/24"]
        .as_array()
        .map_or(0, Vec::len)
        != 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "h0 did not drop the failed paths"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (e0_a0, e0_a1) = (up(f, "e0", 0), up(f, "e0", 1));
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        7001,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4 with e0:a0 down");
    assert!(t.intact());
    assert_eq!(up(f, "e0", 0), e0_a0, "no packet crossed the failed link");
    assert!(up(f, "e0", 1) > e0_a1 + 1000, "the flow went through a1");
    f.sopactl(&["link", "up", "e0", "a0"]).unwrap();
    // Every agent, not h0 alone: e0 sends hop 0 around a0 until it has the link back (a CI run
    // that waited for h0 only saw a0's paths carry 39 packets each, a1's 1,423).
    f.wait_applied(|down| down == 0, "e0:a0 back").unwrap();
    assert_eq!(
        h0.status().unwrap()["path_table"]["10.1.0.0/24"]
            .as_array()
            .map_or(0, Vec::len),
        4,
        "h0 restored the paths"
    );

    // Killing a switch agent leaves its forwarding as it was.
    f.kill_switch("a0");
    let before = paths(f);
    let wire_before = core_tx(f);
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        7002,
        4 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4 with a0's agent dead");
    assert!(t.intact());
    let per_path: Vec<u64> = paths(f).iter().zip(before).map(|(a, b)| a - b).collect();
    let lo = per_path.iter().min().unwrap();
    assert!(
        *lo > 500 && within_one_percent(&per_path),
        "a0 still forwards by hop1 without its agent: {per_path:?}"
    );
    let on_wire = core_tx_since(f, &wire_before);
    assert!(
        balanced(&on_wire, 500),
        "a0 still sends each hop value out of its own port without its agent: {on_wire:?}"
    );
    // Restarted, it adopts the pinned forwarding and resyncs with the controller.
    f.start_switch("a0").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f.switch_status("a0").is_ok_and(|s| {
        s["running"] == true && s["controller"]["version"].as_u64().unwrap_or(0) >= 1
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "a0's agent did not resync:\n{}",
            f.switch_log("a0")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = f.switch_log("a0");
    assert!(log.contains("adopting the forwarding"), "{log}");

    // A port going down is seen by the switch agents (rtnetlink link events) and reported: the
    // controller marks the link down and the hosts drop its paths; up again, they return.
    let e0 = g.find("e0").unwrap();
    let l = g.links_between(e0, g.find("a1").unwrap()).next().unwrap();
    let dev = f.dev(l, e0);
    f.ns("e0").ip(&["link", "set", &dev, "down"]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f.host("h0").status().unwrap()["path_table"]["10.1.0.0/24"]
        .as_array()
        .map_or(0, Vec::len)
        != 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the port's failure did not reach h0:\n{}",
            f.switch_log("e0")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = f.sopactl(&["status", "--json"]).unwrap();
    assert!(status.contains("a1:e0"), "{status}");
    f.ns("e0").ip(&["link", "set", &dev, "up"]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f.host("h0").status().unwrap()["path_table"]["10.1.0.0/24"]
        .as_array()
        .map_or(0, Vec::len)
        != 4
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the port's recovery did not reach h0"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A port that goes down while the controller is away is not in its stored state: the
    // switch reports every port again on its next session, and the restarted controller
    // learns it.
    let paths_to_b = |f: &Fabric| {
        f.host("h0").status().unwrap()["path_table"]["10.1.0.0/24"]
            .as_array()
            .map_or(0, Vec::len)
    };
    f.stop_controller();
    f.ns("e0").ip(&["link", "set", &dev, "down"]).unwrap();
    f.start_controller().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while paths_to_b(f) != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted controller did not learn the port that went down while it was away:\n{}",
            f.switch_log("e0")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A controller that lost its state (a new one, or one run with --store memory) learns
    // every port that is down from the switches: each reports all its ports on every new
    // session, not only changes.
    let status = |f: &Fabric| -> serde_json::Value {
        serde_json::from_str(&f.sopactl(&["status", "--json"]).unwrap()).unwrap()
    };
    let epoch_before = status(f)["epoch"].clone();
    f.stop_controller();
    std::fs::remove_file(f.controller_state_file()).unwrap();
    f.start_controller().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(f);
        if st["epoch"] != epoch_before
            && st["down_links"]
                .as_array()
                .is_some_and(|d| d.iter().any(|l| l == "a1:e0"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a controller without state did not learn the port that is down: {st:#}\n{}",
            f.switch_log("e0")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while paths_to_b(f) != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "h0 did not get the new controller's failure"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    f.ns("e0").ip(&["link", "set", &dev, "up"]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while paths_to_b(f) != 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the port's recovery did not reach h0 after the controller's restart"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        7003,
        4 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4 after the restart");
    assert!(t.intact());
}

/// A process with CAP_NET_RAW on a host sets our option itself (`IP_OPTIONS`), hop bytes
/// (1, 1): every datagram asks for e0's uplink 1 and that aggregation switch's core 1. With
/// the host's agent live, `tc_stamp` replaces the hop bytes with its own choice; once the agent
/// is gone (and with it the program), e0 stops trusting the port: the option is neutralized
/// there, the kernel's ECMP spreads the datagrams over both uplinks, and all of them arrive.
pub fn a_host_without_a_live_agent_cannot_steer_the_fabric(f: &mut Fabric) {
    const N: usize = 200;
    let forged = [0x9E, 4, 1, 1];
    let h4: std::net::Ipv4Addr = "10.1.0.2".parse().unwrap();
    let forward = |f: &Fabric, reason: &str| {
        f.switch_status("e0").unwrap()["forward"][reason]
            .as_u64()
            .unwrap()
    };
    let restamped = |f: &Fabric| {
        f.host("h0").status().unwrap()["stamp"]["restamped"]
            .as_u64()
            .unwrap()
    };

    // The agent is live: the host re-stamps, e0 honours its choice.
    let (restamped0, redirected0, untrusted0) = (
        restamped(f),
        forward(f, "redirected"),
        forward(f, "untrusted"),
    );
    let arrived = udp_with_ip_options(f.ns("h0"), f.ns("h4"), h4, 7300, N, &forged).unwrap();
    assert_eq!(arrived, N, "every datagram arrives");
    assert_eq!(restamped(f) - restamped0, N as u64, "h0 re-stamped each");
    assert!(forward(f, "redirected") - redirected0 >= N as u64);
    assert_eq!(
        forward(f, "untrusted"),
        untrusted0,
        "{}",
        f.switch_log("e0")
    );

    // A real Prometheus with deploy/'s rules scrapes h0's agent: its agent-down alert goes
    // pending the moment the agent is gone (it fires after its minute, which the rules' unit
    // tests check).
    let dir = std::env::temp_dir().join(sopa_testbed::run_name("agent-down"));
    // A handle of its own on h0's namespace: the fabric keeps owning it.
    let h0 = sopa_testbed::NetNs::adopt(f.ns("h0").name());
    let prom = sopa_testbed::prometheus::Prometheus::start(
        Some(&h0),
        &dir,
        &[("sopa-agent", "127.0.0.1:9470".into())],
    )
    .unwrap();
    prom.wait(Duration::from_secs(30), "h0's agent scraped", |p| {
        Ok(p.query("up{job=\"sopa-agent\"} == 1")?.len() == 1)
    })
    .unwrap();
    // Before its first scrape the target counted as absent: that pending alert resolves.
    let alert = "ALERTS{alertname=\"SopaAgentDown\",job=\"sopa-agent\"}";
    prom.wait(
        Duration::from_secs(20),
        "no agent-down alert while h0's agent runs",
        |p| Ok(p.query(alert)?.is_empty()),
    )
    .unwrap();

    // The agent stops (its programs go with it): once the controller's grace period is over,
    // e0 stops trusting h0's port.
    assert_eq!(f.stop_host("h0"), Some(0));
    // The target's own alert (the absent-target one has no instance).
    let down = "ALERTS{alertname=\"SopaAgentDown\",instance=\"127.0.0.1:9470\"}";
    prom.wait(
        Duration::from_secs(20),
        "SopaAgentDown pending for h0's stopped agent",
        |p| Ok(!p.query(down)?.is_empty()),
    )
    .unwrap();
    drop(prom);
    let start = std::time::Instant::now();
    while f.switch_status("e0").unwrap()["controller"]["untrusted_hosts"]
        != serde_json::json!(["h0"])
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "e0 still trusts h0's port: {}",
            f.switch_log("e0")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (untrusted0, redirected0) = (forward(f, "untrusted"), forward(f, "redirected"));
    let redirected_at = |f: &Fabric, a: &str| {
        f.switch_status(a).unwrap()["forward"]["redirected"]
            .as_u64()
            .unwrap()
    };
    let aggregation0 = [redirected_at(f, "a0"), redirected_at(f, "a1")];
    let ports0 = f.hop_ports_tx("e0", h4);
    let arrived = udp_with_ip_options(f.ns("h0"), f.ns("h4"), h4, 7301, N, &forged).unwrap();
    assert_eq!(
        arrived, N,
        "neutralized, not dropped: every datagram arrives"
    );
    assert_eq!(
        forward(f, "untrusted") - untrusted0,
        N as u64,
        "e0 neutralized each option"
    );
    assert_eq!(
        forward(f, "redirected"),
        redirected0,
        "e0 honoured a hop byte the sender chose"
    );
    let per_port: Vec<u64> = f
        .hop_ports_tx("e0", h4)
        .iter()
        .zip(&ports0)
        .map(|(now, then)| now - then)
        .collect();
    // Honoured, all N would leave by uplink 1; ECMP over N 5-tuples gives each port about
    // half (fewer than N/8 on one is a chance below 1e-20).
    assert!(
        per_port.iter().all(|n| *n >= (N / 8) as u64) && per_port.iter().sum::<u64>() >= N as u64,
        "e0's uplinks carried {per_port:?} of {N} datagrams"
    );
    // Further on, nothing carries the option: the aggregation switches, which decide by hop1
    // for h4's pod, redirected none of them.
    assert_eq!(
        [redirected_at(f, "a0"), redirected_at(f, "a1")],
        aggregation0,
        "an aggregation switch honoured the forged hop1"
    );
    // Back as it was: h0's agent again, and e0 trusts its port once more.
    f.start_host("h0").unwrap();
    f.wait_settled(Duration::from_secs(60)).unwrap();
}
