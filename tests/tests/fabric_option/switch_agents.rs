//! Switch agents stopped, restarted and upgraded in place on the shared Fat-Tree.

use std::time::Duration;

use sopa_testbed::fabric::Fabric;

/// a0's agent stopped with `--keep-attached` and started again twice (an upgrade in place): a
/// probe through a0 loses nothing, every port runs the new agent's program, the journal does
/// not grow.
pub fn restart_and_upgrade_in_place_without_losing_a_packet(f: &mut Fabric) {
    // a0's agent, now one that leaves the forwarding in place when it exits.
    assert_eq!(f.stop_switch("a0"), Some(0), "{}", f.switch_log("a0"));
    f.start_switch_with("a0", &["--keep-attached"]).unwrap();
    f.wait_switch_synced("a0", Duration::from_secs(30)).unwrap();

    // h0 -> h4 crosses the pods: half of its packets go through a0.
    let probe = sopa_testbed::resilience::Probe::between(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        5_000,
        5301,
    );
    probe.wait_received(2_000);
    let window_start = probe.mark();
    let before = f.switch_status("a0").unwrap();
    let redirected = |s: &serde_json::Value| s["forward"]["redirected"].as_u64().unwrap_or(0);
    let routes_before = f
        .ns("a0")
        .ip(&["route", "show", "proto", "static"])
        .unwrap();
    let mut changes = Vec::new();
    for round in 0..2 {
        // SIGTERM with --keep-attached: a0 forwards with no agent at all for a while.
        assert_eq!(f.stop_switch("a0"), Some(0), "{}", f.switch_log("a0"));
        let kept = f.switch_status("a0").unwrap();
        assert_eq!(kept["running"], false);
        assert_eq!(kept["kept_attached"], true, "{kept:#}");
        assert_eq!(
            f.ns("a0")
                .ip(&["route", "show", "proto", "static"])
                .unwrap(),
            routes_before,
            "the routes stay"
        );
        probe.wait_received(1_000);
        // The next agent (an upgrade) adopts it: every port's program replaced in place.
        let programs_before = f.switch_status("a0").unwrap()["forward_programs"].clone();
        f.start_switch_with("a0", &["--keep-attached"]).unwrap();
        f.wait_switch_synced("a0", Duration::from_secs(30)).unwrap();
        let now = f.switch_status("a0").unwrap();
        assert_eq!(
            now["adopted"]["how"], "kept attached",
            "round {round}: {now:#}"
        );
        let (old, new) = (
            programs_before.as_object().unwrap(),
            now["forward_programs"].as_object().unwrap(),
        );
        assert_eq!(
            old.keys().collect::<Vec<_>>(),
            new.keys().collect::<Vec<_>>(),
            "the same ports"
        );
        assert!(
            old.iter().all(|(port, id)| new[port] != *id),
            "round {round}: every port runs the new agent's program: {old:?} -> {new:?}"
        );
        changes.push(now["changes"].as_array().unwrap().len());
        probe.wait_received(1_000);
    }
    let window_end = probe.mark();
    let r = probe.finish();
    let status_now = f.switch_status("a0").unwrap();
    let through_a0 = redirected(&status_now) - redirected(&before);
    assert!(
        through_a0 > 1_000,
        "a0 redirected {through_a0} packets in the window: the probe crossed it"
    );
    // The switch's endpoints: alive, ready (its forwarding holds the topology), and its
    // forwarding counters as `status` counts them (read after it: never fewer).
    let get = |path: &str| f.ns("a0").http_get("127.0.0.1:9472", path).unwrap();
    assert_eq!(get("/healthz"), (200, "ok\n".into()));
    assert_eq!(get("/readyz"), (200, "ready\n".into()));
    let (code, metrics) = get("/metrics");
    assert_eq!(code, 200);
    let scraped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sopa_switch_forward_packets_total{reason=\"redirected\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no redirected counter in a0's metrics:\n{metrics}"));
    assert!(
        scraped >= redirected(&status_now),
        "{scraped} < {status_now:#}"
    );
    assert!(
        metrics.contains("sopa_build_info{role=\"switch\""),
        "{metrics}"
    );
    assert!(metrics.contains("sopa_controller_connected 1"), "{metrics}");
    let lost = r.lost_in(window_start..window_end);
    eprintln!(
        "probe h0 -> h4: {} in the window of two restarts of a0's agent, {lost} lost",
        window_end - window_start
    );
    assert_eq!(lost, 0, "probe packets lost across a0's restarts");
    assert_eq!(
        changes[0], changes[1],
        "the journal does not grow with restarts"
    );
    assert_eq!(
        changes[0],
        before["changes"].as_array().unwrap().len(),
        "{before:#}"
    );
    // The last one stops for good: everything it and its predecessors changed is restored.
    f.stop_switch("a0");
    f.start_switch("a0").unwrap();
    f.wait_switch_synced("a0", Duration::from_secs(30)).unwrap();
    assert_eq!(f.stop_switch("a0"), Some(0), "{}", f.switch_log("a0"));
    assert_eq!(
        f.ns("a0")
            .ip(&["route", "show", "proto", "static"])
            .unwrap(),
        "",
        "a graceful stop without --keep-attached restores a0"
    );
    f.start_switch("a0").unwrap();
    f.wait_settled(Duration::from_secs(60)).unwrap();
}

/// A graceful stop of e0's agent removes every route it installed; started again, it puts
/// them back.
pub fn a_stopped_one_removes_every_route_it_installed(f: &mut Fabric) {
    // e0 routes the other racks over both uplinks (multipath) and its own hosts directly.
    let ours = |f: &Fabric| -> Vec<String> {
        f.ns("e0")
            .ip(&["route", "show", "proto", "static"])
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with(char::is_whitespace))
            .map(str::to_owned)
            .collect()
    };
    let installed = ours(f);
    let text = f
        .ns("e0")
        .ip(&["route", "show", "proto", "static"])
        .unwrap();
    assert!(
        !installed.is_empty() && text.contains("nexthop"),
        "e0 routes the other racks, some over both uplinks:\n{text}"
    );
    let exit = f.stop_switch("e0");
    assert_eq!(exit, Some(0), "{}", f.switch_log("e0"));
    assert_eq!(
        ours(f),
        Vec::<String>::new(),
        "routes left behind by a graceful stop:\n{}",
        f.switch_log("e0")
    );
    f.start_switch("e0").unwrap();
    f.wait_settled(Duration::from_secs(60)).unwrap();
    assert_eq!(
        ours(f),
        installed,
        "started again, e0's agent installs the same routes"
    );
}
