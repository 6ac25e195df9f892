//! The traffic tool (`sopa-traffic`) between two namespaces (needs root): a schedule with flows
//! at once, at an offset and after the previous one, over TCP and MPTCP; a JSON line per flow
//! with the receiver's hash checked; a bad schedule refused with its file and line named.

use std::{path::Path, time::Duration};

use sopa_testbed::{Process, arb::Arb, bins};

fn serve(arb: &Arb, port: u16, mptcp: bool, log: &Path) -> Process {
    let listen = format!("{}:{port}", arb.b_addr);
    let mut args = vec!["serve", "--listen", listen.as_str()];
    if mptcp {
        args.push("--mptcp");
    }
    let p = Process::spawn(Some(&arb.b), &bins::sopa_traffic(), &args, log).unwrap();
    for _ in 0..200 {
        if std::fs::read_to_string(log).is_ok_and(|t| t.contains("serving on")) {
            return p;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the server did not start: {}", p.log_text());
}

/// Runs a schedule from A; returns (exit code, JSON lines, all output).
fn run(
    arb: &Arb,
    schedule: &str,
    mptcp: bool,
    dir: &Path,
) -> (i32, Vec<serde_json::Value>, String) {
    let file = dir.join(format!("schedule-{mptcp}.json"));
    std::fs::write(&file, schedule).unwrap();
    let file = file.display().to_string();
    let mut args = vec!["run", "--schedule", file.as_str()];
    if mptcp {
        args.push("--mptcp");
    }
    let log = dir.join(format!("run-{mptcp}.log"));
    let mut p = Process::spawn(Some(&arb.a), &bins::sopa_traffic(), &args, &log).unwrap();
    let status = loop {
        if let Some(st) = p.try_wait() {
            break st;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = p.log_text();
    let lines = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (status.code().unwrap_or(-1), lines, text)
}

#[test]
fn a_schedule_runs_as_written_and_reports_every_flow() {
    let arb = Arb::new("tt").unwrap();
    let tmp = sopa_testbed::temp_dir(&format!("traffic-test-{}", arb.a.name()));
    let dir = tmp.path().to_path_buf();
    for (mptcp, port) in [(false, 7100), (true, 7101)] {
        let _server = serve(&arb, port, mptcp, &dir.join(format!("serve-{mptcp}.log")));
        let to = format!("{}:{port}", arb.b_addr);
        let schedule = format!(
            r#"[{{"to": "{to}", "bytes": 2000000}},
                {{"to": "{to}", "bytes": 1000000, "start_ms": 300}},
                {{"to": "{to}", "bytes": 500000, "after_previous": true}}]"#
        );
        let (code, mut lines, text) = run(&arb, &schedule, mptcp, &dir);
        assert_eq!(code, 0, "{text}");
        assert_eq!(lines.len(), 3, "{text}");
        lines.sort_by_key(|l| l["index"].as_u64());
        for l in &lines {
            assert_eq!(l["intact"], true, "{l}");
            assert!(l["fct_s"].as_f64().unwrap() > 0.0 && l["mbit_per_s"].as_f64().unwrap() > 0.0);
            for k in ["total_retrans", "reord_seen", "reordering", "rtos"] {
                assert!(l[k].is_u64(), "{k} in {l}");
            }
            // Both ends' digests, as XXH3-128 in hex, and equal.
            for k in ["sent_digest", "received_digest"] {
                let hex = l[k].as_str().unwrap_or_default();
                assert!(
                    hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{k} in {l}"
                );
            }
            assert_eq!(l["sent_digest"], l["received_digest"], "{l}");
            // An MPTCP flow is MPTCP end to end, not a TCP fallback; a TCP flow says it is not.
            if mptcp {
                assert_eq!(l["mptcp_fallback"], false, "MPTCP negotiated: {l}");
                assert!(l["mptcp_subflows"].is_u64(), "{l}");
            } else {
                assert!(l["mptcp_subflows"].is_null(), "{l}");
            }
        }
        let start = |i: usize| lines[i]["start_s"].as_f64().unwrap();
        let end = |i: usize| start(i) + lines[i]["fct_s"].as_f64().unwrap();
        assert!(
            start(0) < start(1),
            "flow 0 starts at once, before flow 1's 300 ms"
        );
        assert!(start(1) >= 0.3, "flow 1 waits its 300 ms");
        assert!(start(2) >= end(1) - 1e-3, "flow 2 follows flow 1");
    }
    // A bad schedule is refused before anything is sent, naming the file and the problem.
    let (code, lines, text) = run(
        &arb,
        r#"[{"to": "10.101.2.2:7100", "bytez": 5}]"#,
        false,
        &dir,
    );
    assert_eq!(code, 64, "{text}");
    assert!(lines.is_empty());
    assert!(
        text.contains("schedule-false.json") && text.contains("bytez"),
        "{text}"
    );
    let (code, _, text) = run(
        &arb,
        r#"[{"to": "10.101.2.2:7100", "bytes": 5, "after_previous": true}]"#,
        false,
        &dir,
    );
    assert_eq!(code, 64, "{text}");
    assert!(
        text.contains("after_previous needs a previous flow"),
        "{text}"
    );
}
