//! Gray failure, found from SOPA's own counters: the shared Fat-Tree at 100 Mbit/s per link,
//! TCP transfers from pod 0 to the other pods running throughout, and the core link a0 -> c0
//! made to drop packets with its carrier up (`tc_lossy`, counted). No link event reports it;
//! the hosts' path meters (alternate marking, per rack and path) and the controller's
//! tomography must find it, drain it as `suspect`, trust it again after the hold-down once the
//! loss is gone, and find it again at a lighter loss. A healthy fabric under the same load
//! drains nothing.

use std::time::{Duration, Instant};

use sopa_testbed::{
    fabric::Fabric,
    gray::{
        Load, METERED, a0_c0, assert_drained_port_idle, assert_injected, drained, evidence, status,
        suspects, wait_status,
    },
    lossy::LossyLink,
    prometheus::Prometheus,
    run_name,
};

use crate::HOLD_MS;

/// The controller's count of convictions of the link a:b (`sopa_link_convictions_total`), read
/// from its metrics endpoint at `addr`.
fn convictions(addr: &str, a: &str, b: &str) -> u64 {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(addr).expect("the controller's metrics endpoint");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    let series = format!("sopa_link_convictions_total{{link=\"{a}:{b}\"}}");
    sopa_testbed::prometheus::sample(&text, &series).unwrap_or(0)
}

/// a0 -> c0 drops 2% with its carrier up: found, drained, trusted again after the hold-down,
/// and found again at 0.5% on its second strike; a real Prometheus sees it with deploy/'s rules.
pub fn a_gray_core_link_is_found_drained_and_trusted_again(f: &mut Fabric) {
    // The path meter's evidence and the conviction counter start from nothing here.
    f.restart_controller().unwrap();
    let metrics = f
        .controller_metrics_addr()
        .expect("the suite's controller serves metrics")
        .to_owned();
    let f = &*f;
    // A real Prometheus scrapes the controller (in this namespace) and another h0's agent (on
    // the loopback of h0's namespace), both with deploy/'s rules.
    let dir = std::env::temp_dir().join(run_name("gray"));
    let prom = Prometheus::start(None, &dir, &[("sopa-controller", metrics.clone())]).unwrap();
    let prom_h0 = Prometheus::start(
        Some(f.ns("h0")),
        &dir.with_extension("h0"),
        &[("sopa-agent", "127.0.0.1:9470".into())],
    )
    .unwrap();
    let up = |job: &str| format!("up{{job=\"{job}\"}} == 1");
    prom.wait(Duration::from_secs(30), "the controller scraped", |p| {
        Ok(p.query(&up("sopa-controller"))?.len() == 1)
    })
    .unwrap();
    prom_h0
        .wait(Duration::from_secs(30), "h0's agent scraped", |p| {
            // OpenMetrics counters carry `_total`.
            Ok(p.query(&up("sopa-agent"))?.len() == 1
                && !p.query("sopa_stamp_packets_total")?.is_empty()
                && !p.query("sopa_meter_full_packets_total")?.is_empty())
        })
        .unwrap();
    let mut lossy = LossyLink::attach(f.ns("a0"), &f.link_iface("a0", "c0")).unwrap();
    std::thread::scope(|scope| {
        let load = Load::start(scope, f, 7400);

        // Healthy, under load: the meter sees a0 -> c0 carry packets and lose none worth a drain.
        let s = wait_status(
            f,
            Duration::from_secs(30),
            "metered packets on a0 -> c0",
            |s| a0_c0(s).0 >= METERED,
        );
        eprintln!("healthy: a0 -> c0 {:?} (sent, lost)", a0_c0(&s));
        assert_eq!(suspects(&s), Vec::<String>::new(), "a healthy link drained");

        // 2%: found and drained.
        let (seen0, dropped0) = lossy.counts().unwrap();
        lossy.set_loss(2.0).unwrap();
        let onset = Instant::now();
        let s = wait_status(f, Duration::from_secs(20), "a0:c0 suspect at 2%", drained);
        let found = onset.elapsed();
        let (seen, dropped) = lossy.counts().unwrap();
        let (seen, dropped) = (seen - seen0, dropped - dropped0);
        eprintln!(
            "2%: a0:c0 suspect {:.2} s after the onset; tc_lossy dropped {dropped} of {seen} ({:.2}%); {}",
            found.as_secs_f64(),
            100.0 * dropped as f64 / seen.max(1) as f64,
            s["suspect_links"]
        );
        // The injected loss is what was asked.
        assert_injected(seen, dropped, 2.0);
        // Healed now, while the hold-down runs: what follows (Prometheus, the drain's effect on
        // the port) may outlast the hold-down on a busy machine, and a link released while still
        // lossy is rightly convicted again (its second strike), which is not what this phase tests.
        lossy.set_loss(0.0).unwrap();
        let held = status(f);
        assert!(
            drained(&held) && held["suspect_links"][0]["strikes"] == 1,
            "a0:c0 still held on its first strike once healed (the hold-down of {HOLD_MS} ms \
         ended before the test could heal it): {}",
            held["suspect_links"]
        );
        // Where operators look: the metric, the recorded loss ratio and the alert of deploy/'s
        // rules (over the last minutes: the hold-down may end before a scrape is judged here).
        let seen =
            |p: &Prometheus, q: &str| -> sopa_testbed::Result<bool> { Ok(!p.query(q)?.is_empty()) };
        prom.wait(
        Duration::from_secs(20),
        "Prometheus sees a0:c0 suspect, its loss and the alert firing",
        |p| {
            Ok(seen(
                p,
                "max_over_time(sopa_link_suspect{link=\"a0:c0\"}[5m]) == 1",
            )? && seen(
                p,
                "max_over_time(sopa:link_loss_ratio{from=\"a0\",to=\"c0\"}[5m]) > 0",
            )? && seen(
                p,
                "max_over_time(ALERTS{alertname=\"SopaLinkSuspect\",alertstate=\"firing\"}[5m])",
            )?)
        },
    )
    .unwrap();
        // Every series the dashboard in deploy/ draws exists in one of the two.
        let dashboard = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/grafana/sopa-fabric.json"),
        )
        .unwrap();
        let names: std::collections::BTreeSet<String> = dashboard
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| w.starts_with("sopa_") || w.starts_with("sopa:"))
            .map(str::to_owned)
            .collect();
        assert!(names.len() >= 10, "{names:?}");
        for name in &names {
            let q = format!("max_over_time({{__name__=\"{name}\"}}[5m])");
            let found =
                !prom.query(&q).unwrap().is_empty() || !prom_h0.query(&q).unwrap().is_empty();
            assert!(found, "the dashboard draws {name}, which nothing exports");
        }
        // And every panel's query is one Prometheus evaluates, its variables as Grafana fills
        // them (all nodes, a rate window of a minute).
        let board: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
        // A row's panels (collapsed rows hold theirs) as well as the top level's.
        let top = board["panels"].as_array().unwrap();
        let nested = top
            .iter()
            .flat_map(|p| p["panels"].as_array().into_iter().flatten());
        let mut queries = 0;
        for panel in top.iter().chain(nested) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_else(|| {
                    panic!("panel {}: a target without a query", panel["title"])
                });
                let expr = expr
                    .replace("$instance", ".+")
                    .replace("$__rate_interval", "1m");
                for p in [&prom, &prom_h0] {
                    if let Err(e) = p.query(&expr) {
                        panic!("panel {}: {e}", panel["title"]);
                    }
                }
                queries += 1;
            }
        }
        assert!(queries >= 15, "{queries} panel queries");
        // The evidence: a window that began before the onset, so diluted, but never more packets
        // lost than were dropped.
        let x = &s["suspect_links"][0];
        let (loss, lost) = (x["loss"].as_f64().unwrap(), x["lost"].as_u64().unwrap());
        assert!(
            (0.003..0.04).contains(&loss) && lost <= dropped,
            "convicted on {lost} lost ({loss}) with {dropped} dropped"
        );
        assert!(
            s["down_links"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l == "a0:c0"),
            "a suspect link is down for the agents"
        );
        // Drained: the hosts stop sending on it.
        assert_drained_port_idle(f, &load);

        // Healed (above): trusted again when the hold-down ends, and not convicted again.
        // Both halves of the release: the meter forgets the suspicion, then the change that gives
        // the link back to the agents is stored and pushed (a status between the two shows the
        // first only).
        wait_status(
            f,
            Duration::from_millis(HOLD_MS + 10_000),
            "a0:c0 trusted after the hold-down and back for the agents",
            |s| {
                suspects(s).is_empty()
                    && !s["down_links"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|l| l == "a0:c0")
            },
        );
        let s = wait_status(f, Duration::from_secs(30), "a0 -> c0 in use again", |s| {
            a0_c0(s).0 >= METERED
        });
        assert_eq!(
            suspects(&s),
            Vec::<String>::new(),
            "a healed link drained again: {}",
            evidence(f, &s)
        );
        // Nor convicted and released again in between: the controller's count of convictions,
        // not a sample of its suspects.
        assert_eq!(
            convictions(&metrics, "a0", "c0"),
            1,
            "a0:c0 convicted again before the 0.5% phase (healed, it must not be): {}",
            evidence(f, &status(f))
        );

        // 0.5%: found again (the long window), held twice as long (its second strike).
        lossy.set_loss(0.5).unwrap();
        let onset = Instant::now();
        let s = wait_status(f, Duration::from_secs(30), "a0:c0 suspect at 0.5%", drained);
        eprintln!(
            "0.5%: a0:c0 suspect {:.2} s after the onset; {}",
            onset.elapsed().as_secs_f64(),
            s["suspect_links"]
        );
        assert_eq!(s["suspect_links"][0]["strikes"], 2);
        assert!(s["suspect_links"][0]["remaining_ms"].as_u64().unwrap() > HOLD_MS);

        // The operator's override ends it at once.
        let out = f.sopactl(&["link", "trust", "a0", "c0"]).unwrap();
        assert!(out.contains("suspicion ended"), "{out}");
        let s = status(f);
        assert_eq!(suspects(&s), Vec::<String>::new());
        assert_eq!(s["trusted_links"][0], "a0:c0");

        let transfers = load.finish();
        eprintln!("{transfers:?} transfers of 4 MiB per flow completed, every one whole");
    });
    // Back as it was: the lossy program gone, the operator's trust ended, every link up.
    drop(lossy);
    f.sopactl(&["link", "untrust", "a0", "c0"]).unwrap();
    f.wait_applied(|down| down == 0, "every link up again")
        .unwrap();
}
