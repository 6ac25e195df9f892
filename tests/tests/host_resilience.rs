//! Hitless restarts of the host agent on A - R - B (needs root): the datapath's links are
//! pinned, so a killed agent leaves traffic stamped and stripped, and the next agent adopts the
//! datapath by replacing the programs in place; `--keep-attached` does the same on purpose, for
//! upgrades. Every namespace is removed on drop, and what an agent leaves attached is detached
//! by a guard, also on failure.

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use sopa_testbed::{
    agent::Agent,
    arb::{Arb, B_PREFIX},
    capture::Capture,
    resilience::{
        DetachOnDrop, PATHS, from_a, pin_dir, probe, prog_ids, rss_kib, short_flows, start_a,
        start_b,
    },
    traffic::{SendOptions, tcp_transfer},
};

const MIB: u64 = 1 << 20;

#[test]
fn sigkill_during_a_transfer_loses_nothing_and_the_next_agent_adopts() {
    let arb = Arb::new("k").expect("build A - R - B");
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let reordering_before = arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap();
    // Declared before the agents, so dropped after them (a guard that outlives the agent).
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let _b = start_b(&arb);
    let a = start_a(&arb, &["--no-metrics"]);
    let (stamp_before, strip_before) = prog_ids(&a);

    let (transfer, after_kill, restarted) = std::thread::scope(|s| {
        let t = s.spawn(|| {
            let opts = SendOptions {
                stall_timeout: Duration::from_secs(20),
                ..SendOptions::default()
            };
            tcp_transfer(&arb.a, &arb.b, arb.b_addr, 5101, 200 * MIB, &opts)
        });
        std::thread::sleep(Duration::from_millis(800));
        a.kill();
        // With no agent, the pinned datapath still stamps every packet.
        let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let after_kill = capture.finish().unwrap();
        let restarted = start_a(&arb, &["--no-metrics"]);
        (t.join().unwrap(), after_kill, restarted)
    });
    let transfer = transfer.expect("the transfer survives the kill (no reset, no stall)");
    assert!(transfer.intact(), "sha256 equal end to end");
    let (tcp, stamped) = from_a(&after_kill.frames, arb.a_addr, 6);
    eprintln!(
        "200 MiB in {:.2} s; while no agent ran: {tcp} TCP packets from A at R, {stamped} stamped",
        transfer.seconds
    );
    assert!(tcp > 1000, "the transfer was still running: {tcp}");
    assert_eq!(stamped, tcp, "every packet stamped while no agent ran");

    let st = restarted.status().unwrap();
    assert_eq!(st["adopted"]["how"], "crashed", "{st:#}");
    assert_eq!(st["adopted"]["stamp_prog_replaced"], stamp_before);
    assert_eq!(st["adopted"]["strip_prog_replaced"], strip_before);
    let (stamp_now, strip_now) = prog_ids(&restarted);
    assert_ne!((stamp_now, strip_now), (stamp_before, strip_before));
    assert!(restarted.log().contains("adopted the attached datapath"));
    // The adopting agent owns the first agent's changes: a clean stop restores them all.
    assert_eq!(restarted.stop(), Some(0));
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert_eq!(
        arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(),
        reordering_before
    );
    assert!(!pin_dir(arb.a.name()).exists(), "pins removed");
}

#[test]
fn keep_attached_then_a_new_agent_upgrades_in_place_without_losing_a_probe_packet() {
    let arb = Arb::new("u").expect("build A - R - B");
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let _b = start_b(&arb);
    let old = start_a(&arb, &["--no-metrics", "--keep-attached"]);
    let (stamp_before, strip_before) = prog_ids(&old);
    let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, received, kept, new) = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&arb, 10_000, Arc::clone(&stop), 5201));
        std::thread::sleep(Duration::from_millis(700));
        // SIGTERM with --keep-attached: the agent exits, the datapath stays.
        assert_eq!(old.stop(), Some(0));
        let kept = sopa_testbed::agent::status_of(arb.a.name()).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let new = start_a(&arb, &["--no-metrics", "--keep-attached"]);
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, Ordering::Relaxed);
        let (sent, received) = p.join().unwrap();
        (sent, received, kept, new)
    });
    let at_r = capture.finish().unwrap();
    let (udp, stamped) = from_a(&at_r.frames, arb.a_addr, 17);
    eprintln!("probe: {sent} sent, {received} received; at R {udp} UDP, {stamped} stamped");
    assert!(sent > 15_000, "about 10 kpps for about 2 s: {sent}");
    let snmp = arb
        .b
        .run(|| std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap())
        .unwrap();
    let udp_lines: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
    assert_eq!(
        received, sent,
        "no probe packet lost across the upgrade (B's UDP counters: {udp_lines:?})"
    );
    assert_eq!(stamped, udp, "stamped all along, with and without an agent");
    assert_eq!(kept["running"], false);
    assert_eq!(kept["attached"], true);
    assert_eq!(kept["kept_attached"], true);
    let st = new.status().unwrap();
    assert_eq!(st["adopted"]["how"], "kept attached", "{st:#}");
    let (stamp_now, strip_now) = prog_ids(&new);
    assert!(stamp_now != stamp_before && strip_now != strip_before);
    // Left attached again on purpose; `detach` removes the datapath and restores the host.
    assert_eq!(new.stop(), Some(0));
    let out = cleanup.detach();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert!(!pin_dir(arb.a.name()).exists(), "pins removed");
    let again = cleanup.detach();
    assert!(!again.status.success(), "nothing left to detach");
}

#[test]
fn a_hundred_thousand_short_flows_lose_nothing_and_the_flow_table_evicts() {
    const FLOWS: u32 = 100_000;
    let arb = Arb::new("f").expect("build A - R - B");
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let b = start_b(&arb);
    let a = start_a(&arb, &["--no-metrics"]);
    let pid = a.status().unwrap()["pid"].as_u64().unwrap();
    let rss_before = rss_kib(pid);
    let stripped = |st: &serde_json::Value| st["strip"]["stripped"].as_u64().unwrap();
    let b_before = stripped(&b.status().unwrap());
    let start = Instant::now();
    let sent = short_flows(&arb, FLOWS, 2, 25_000);
    let took = start.elapsed();
    // Let the last packets land.
    let mut b_after = 0;
    for _ in 0..50 {
        b_after = stripped(&b.status().unwrap());
        if b_after - b_before >= sent {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = a.status().unwrap();
    let ft = &st["flow_table"];
    let rss_after = rss_kib(pid);
    eprintln!(
        "{FLOWS} flows, {sent} packets in {took:?}; B stripped {}; flow table {ft}; agent RSS {rss_before} -> {rss_after} KiB",
        b_after - b_before
    );
    assert!(took < Duration::from_secs(60), "within a minute");
    assert_eq!(
        b_after - b_before,
        sent,
        "every packet arrived, stamped and stripped"
    );
    assert_eq!(
        st["stamp"]["flow_table_full"], 0,
        "an LRU table never refuses a flow"
    );
    assert_eq!(ft["created"].as_u64().unwrap(), u64::from(FLOWS));
    // The kernel's LRU evicts in small batches from per-CPU lists, so a full table sits just
    // under its capacity.
    let (entries, capacity) = (
        ft["entries"].as_u64().unwrap(),
        ft["capacity"].as_u64().unwrap(),
    );
    assert!(
        entries <= capacity && entries * 100 >= capacity * 95,
        "the table is full: {entries} of {capacity}"
    );
    assert_eq!(
        ft["evictions"].as_u64().unwrap(),
        u64::from(FLOWS) - entries,
        "evictions = created - entries"
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "agent memory stays bounded"
    );
}

#[test]
fn pins_of_another_layout_are_refused_until_reset() {
    let arb = Arb::new("l").expect("build A - R - B");
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let pins = pin_dir(arb.a.name());
    std::fs::create_dir_all(&pins).unwrap();
    let foreign = pins.join("SOPA_PATHS_V0");
    let out = Command::new("bpftool")
        .args(["map", "create"])
        .arg(&foreign)
        .args([
            "type", "hash", "key", "4", "value", "4", "entries", "1", "name", "sopa_old",
        ])
        .output()
        .expect("bpftool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = match Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        &["--no-metrics"],
    ) {
        Ok(_) => panic!("an agent adopted pins of another layout"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("SOPA_PATHS_V0") && err.contains("--reset") && err.contains("exited"),
        "{err}"
    );
    assert!(foreign.exists(), "refusing changed nothing");
    let a = start_a(&arb, &["--no-metrics", "--reset"]);
    assert!(!foreign.exists(), "--reset removed the other layout's pins");
    assert_eq!(a.stop(), Some(0));
}

#[test]
fn a_newer_agent_started_beside_the_running_one_takes_over_without_losing_a_probe_packet() {
    let arb = Arb::new("t").expect("build A - R - B");
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let _b = start_b(&arb);
    let mut old = start_a(&arb, &["--no-metrics"]);
    let (stamp_before, strip_before) = prog_ids(&old);
    // Without --takeover a second agent of the node is refused, and changes nothing.
    let refused = match start_a_checked(&arb, &["--no-metrics"]) {
        Ok(_) => panic!("two agents ran for one node"),
        Err(e) => e,
    };
    assert!(refused.contains("--takeover"), "{refused}");
    let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, received, new, took) = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&arb, 10_000, Arc::clone(&stop), 5251));
        std::thread::sleep(Duration::from_millis(700));
        let t = Instant::now();
        let new = start_a(&arb, &["--no-metrics", "--takeover"]);
        let took = t.elapsed();
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, Ordering::Relaxed);
        let (sent, received) = p.join().unwrap();
        (sent, received, new, took)
    });
    let at_r = capture.finish().unwrap();
    let (udp, stamped) = from_a(&at_r.frames, arb.a_addr, 17);
    eprintln!(
        "takeover in {took:?}; probe: {sent} sent, {received} received; at R {udp} UDP, {stamped} stamped"
    );
    let exited = old
        .process
        .try_wait()
        .expect("the old agent exited on its own");
    assert!(exited.success(), "the old agent exits 0 after handing over");
    assert_eq!(received, sent, "no probe packet lost across the takeover");
    assert_eq!(stamped, udp, "stamped all along");
    let st = new.status().unwrap();
    assert_eq!(st["adopted"]["how"], "kept attached", "{st:#}");
    assert_eq!(st["adopted"]["stamp_prog_replaced"], stamp_before);
    assert_eq!(st["adopted"]["strip_prog_replaced"], strip_before);
    // The new agent owns everything now: a plain stop restores the host.
    assert_eq!(new.stop(), Some(0));
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert!(!pin_dir(arb.a.name()).exists());
}

fn start_a_checked(arb: &Arb, extra: &[&str]) -> Result<Agent, String> {
    Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, sopa_testbed::resilience::PATHS),
        extra,
    )
    .map_err(|e| e.to_string())
}
