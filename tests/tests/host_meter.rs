//! The path meter of a host agent on A - R - B with no controller (needs root): nobody takes
//! its reports, but its tables are still emptied every period, so they never fill. (A-R-B of
//! its own: the fabric suites' agents all have a controller.)

use std::time::{Duration, Instant};

use sopa_testbed::{
    arb::Arb,
    resilience::{DetachOnDrop, Probe, pin_dir, start_a, start_b},
};

/// Entries of A's pinned sent-counter maps, both colors.
fn sent_entries(node: &str) -> usize {
    sopa_common::maps::meter::SENT_MAPS
        .iter()
        .map(|map| sopa_testbed::bpftool::entries(&pin_dir(node).join(map)))
        .sum()
}

/// Polls `what` every 20 ms until it holds, for at most 10 s.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_agent_without_a_controller_still_empties_its_meter_every_period() {
    let arb = Arb::new("m").expect("build A - R - B");
    let node = arb.a.name().to_owned();
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: node.clone(),
    };
    let _b = start_b(&arb);
    let a = start_a(&arb, &["--no-metrics", "--meter-period-ms", "100"]);
    let probe = Probe::start(&arb, 2_000, 5271);
    probe.wait_received(200);
    // Counted while the probe runs...
    wait_until("A's meter counts the probe", || sent_entries(&node) > 0);
    let r = probe.finish();
    assert!(r.received.len() >= 200);
    // ...and emptied once it has stopped: each color is read and emptied half a period after
    // its period ends, report or not.
    wait_until("A's meter emptied after the traffic", || {
        sent_entries(&node) == 0
    });
    assert_eq!(a.stop(), Some(0));
}
