//! Hosts that lie to the path meter, or run another clock: no single host's reports drain a
//! link or keep the meter from judging the others.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use sopa_testbed::{
    fabric::Fabric,
    gray::{Load, METERED, a0_c0, assert_injected, evidence, status, suspects, wait_status},
    lossy::LossyLink,
    resilience::pin_dir,
    traffic::StopWhenDropped,
};

/// How long the lying host lies: the 30 s in the full tier; in the fast tier 10 s,
/// two and a half of the meter's longest windows (16 periods of 250 ms).
fn lie_for() -> Duration {
    if sopa_testbed::full_tier() {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(10)
    }
}

/// The time a 2% gray link corroborated by two racks is found in (docs/security.md).
const FOUND_WITHIN: Duration = Duration::from_secs(2);

/// The meter keys (peer rack as the packet holds it, hop bytes) of `host`'s paths through
/// `a` -> `b`.
fn keys_through(f: &Fabric, host: &str, a: &str, b: &str) -> Vec<[u8; 6]> {
    let topo = &f.topo;
    let g = topo.graph();
    let h = g.find(host).unwrap();
    let mut out = Vec::new();
    for rack in topo.racks() {
        topo.paths_to_rack(h, &rack, |h0, h1, links| {
            let mut at = h;
            for &l in links {
                let next = g.links[l as usize].other(at);
                if g.name(at) == a && g.name(next) == b {
                    let o = rack.prefix.addr.octets();
                    out.push([o[0], o[1], o[2], o[3], h0, h1]);
                }
                at = next;
            }
        });
    }
    out
}

fn bpftool(args: &[&str]) -> String {
    String::from_utf8_lossy(&sopa_testbed::bpftool::run(args)).into_owned()
}

/// Hex bytes as bpftool takes them.
fn hex(bytes: &[u8]) -> Vec<String> {
    bytes.iter().map(|b| format!("0x{b:02x}")).collect()
}

/// Adds about `extra` packets (of 1,500 bytes) to every counter of `host`'s pinned sent maps
/// (both colors) whose key is one of `keys`, as root on the host could with bpftool (which
/// writes one value to every CPU's copy: each gets its share of the total). Returns the
/// counters changed.
fn inflate(f: &Fabric, host: &str, keys: &[[u8; 6]], extra: u64) -> usize {
    let mut changed = 0;
    for map in sopa_common::maps::meter::SENT_MAPS {
        let pin = pin_dir(&f.host(host).node).join(map);
        let pin = pin.to_str().unwrap();
        let dump: serde_json::Value =
            serde_json::from_str(&bpftool(&["-j", "map", "dump", "pinned", pin])).unwrap();
        let byte = |v: &serde_json::Value| {
            let s = v.as_str().unwrap();
            u8::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
        };
        for e in dump.as_array().unwrap() {
            let key: Vec<u8> = e["key"].as_array().unwrap().iter().map(byte).collect();
            if !keys.iter().any(|k| key[..6] == k[..]) {
                continue;
            }
            // An entry the agent emptied (read and deleted at its period's end) while bpftool
            // dumped the map comes without values: nothing to inflate there.
            let Some(per_cpu) = e["values"].as_array() else {
                continue;
            };
            let (mut packets, mut bytes) = (0, 0);
            for cpu in per_cpu {
                let value: Vec<u8> = cpu["value"].as_array().unwrap().iter().map(byte).collect();
                packets += u64::from_le_bytes(value[..8].try_into().unwrap());
                bytes += u64::from_le_bytes(value[8..16].try_into().unwrap());
            }
            let n = per_cpu.len() as u64;
            let packets = (packets + extra).div_ceil(n);
            let bytes = (bytes + extra * 1500).div_ceil(n);
            let value = [packets.to_le_bytes(), bytes.to_le_bytes()].concat();
            let mut args = vec!["map", "update", "pinned", pin, "key", "hex"];
            let (k, v) = (hex(&key), hex(&value));
            args.extend(k.iter().map(String::as_str));
            args.extend(["value", "hex"]);
            args.extend(v.iter().map(String::as_str));
            bpftool(&args);
            changed += 1;
        }
    }
    changed
}

/// The controller's word on `host`'s reports: (reason, detail), when it names it.
fn named(s: &serde_json::Value, host: &str) -> Option<(String, String)> {
    s["meter_hosts"].as_array().unwrap().iter().find_map(|h| {
        (h["host"] == host).then(|| {
            (
                h["reason"].as_str().unwrap().to_owned(),
                h["detail"].as_str().unwrap().to_owned(),
            )
        })
    })
}

/// h0 inflates its sent counters for its paths through a0 -> c0 (a few thousand packets it
/// never sent, every 100 ms): no link is drained, the controller names h0 inconsistent; then a
/// real 2% loss on a1 -> c2 is found and drained as fast as ever.
pub fn a_host_inflating_its_sent_counters_drains_nothing_and_is_named(f: &mut Fabric) {
    let f = &*f;
    let keys = keys_through(f, "h0", "a0", "c0");
    assert!(!keys.is_empty());
    let mut lossy = LossyLink::attach(f.ns("a1"), &f.link_iface("a1", "c2")).unwrap();
    std::thread::scope(|scope| {
        let load = Load::start(scope, f, 7600);
        wait_status(
            f,
            Duration::from_secs(30),
            "metered packets on a0 -> c0",
            |s| a0_c0(s).0 >= METERED,
        );
        // The lie, from a thread of its own for `lie_for`.
        let stop = Arc::new(AtomicBool::new(false));
        let liar = {
            let stop = Arc::clone(&stop);
            let keys = &keys;
            scope.spawn(move || {
                let mut changed = 0;
                while !stop.load(Ordering::Relaxed) {
                    changed += inflate(f, "h0", keys, 1000);
                    std::thread::sleep(Duration::from_millis(100));
                }
                changed
            })
        };
        // A failing check below stops the lie too (the scope waits for the thread).
        let _stop_lying = StopWhenDropped(Arc::clone(&stop));
        let start = Instant::now();
        let mut named_at = None;
        while start.elapsed() < lie_for() {
            let s = status(f);
            assert_eq!(
                suspects(&s),
                Vec::<String>::new(),
                "a link drained on h0's lie: {}",
                evidence(f, &s)
            );
            if named_at.is_none()
                && let Some((reason, detail)) = named(&s, "h0")
            {
                assert_eq!(reason, "inconsistent", "{detail}");
                eprintln!(
                    "h0 named {:.2} s into its lie: {detail}",
                    start.elapsed().as_secs_f64()
                );
                named_at = Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        stop.store(true, Ordering::Relaxed);
        let changed = liar.join().unwrap();
        assert!(
            changed > 0,
            "h0's counters of paths through a0 -> c0 never inflated"
        );
        assert!(
            named_at.is_some(),
            "h0 never named inconsistent: {}",
            serde_json::to_string_pretty(&status(f)["meter_hosts"]).unwrap()
        );
        // Honest again. A real 2% loss on a1 -> c2, which both flows cross (two sender racks,
        // two receiver racks): found and drained within the time docs/security.md states.
        wait_status(
            f,
            Duration::from_secs(30),
            "metered packets on a1 -> c2",
            |s| link(s, "a1", "c2").0 >= METERED,
        );
        let (seen0, dropped0) = lossy.counts().unwrap();
        lossy.set_loss(2.0).unwrap();
        let onset = Instant::now();
        let s = wait_status(f, Duration::from_secs(20), "a1:c2 suspect at 2%", |s| {
            suspects(s) == ["a1:c2"]
        });
        let found = onset.elapsed();
        lossy.set_loss(0.0).unwrap();
        let (seen, dropped) = lossy.counts().unwrap();
        assert_injected(seen - seen0, dropped - dropped0, 2.0);
        eprintln!(
            "2% on a1 -> c2 after the lie: suspect {:.2} s after the onset; {}",
            found.as_secs_f64(),
            s["suspect_links"]
        );
        assert!(
            found <= FOUND_WITHIN,
            "a1:c2 found {:.2} s after the onset, past {FOUND_WITHIN:?}: {}",
            found.as_secs_f64(),
            evidence(f, &s)
        );
        load.finish();
    });
    drop(lossy);
    // Back as it was: the suspicion ended by the operator's word, then handed back to the meter.
    f.sopactl(&["link", "trust", "a1", "c2"]).unwrap();
    f.sopactl(&["link", "untrust", "a1", "c2"]).unwrap();
    f.wait_applied(|down| down == 0, "every link up again")
        .unwrap();
}

/// The metered (sent, lost) of `a` -> `b` in the controller's shortest window.
fn link(s: &serde_json::Value, a: &str, b: &str) -> (u64, u64) {
    s["link_loss"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["from"] == a && x["to"] == b)
        .map_or((0, 0), |x| {
            (x["sent"].as_u64().unwrap(), x["lost"].as_u64().unwrap())
        })
}

/// The controller's count of judged periods, from its metrics.
fn judged(f: &Fabric) -> u64 {
    use std::io::{Read as _, Write as _};
    let addr = f
        .controller_metrics_addr()
        .expect("the suite's controller serves metrics");
    let mut conn = std::net::TcpStream::connect(addr).expect("the controller's metrics endpoint");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    sopa_testbed::prometheus::sample(&text, "sopa_meter_periods_judged_total").unwrap_or(0)
}

/// h6's agent restarted with `--meter-period-ms 50` among agents on the controller's 250 ms:
/// its reports are refused and it is named; the meter goes on judging the others' periods.
pub fn an_agent_on_another_meter_period_is_refused_while_the_rest_are_judged(f: &mut Fabric) {
    f.stop_host("h6");
    f.start_host_with("h6", &["--meter-period-ms", "50"])
        .unwrap();
    let s = wait_status(f, Duration::from_secs(20), "h6 named", |s| {
        named(s, "h6").is_some()
    });
    let (reason, detail) = named(&s, "h6").unwrap();
    eprintln!("h6: {reason}: {detail}");
    assert_eq!(reason, "period", "{detail}");
    assert!(detail.contains("periods of 50 ms"), "{detail}");
    // The others' periods are judged at the controller's pace (four a second), their links
    // metered, while h6 goes on being refused.
    std::thread::scope(|scope| {
        let load = Load::start(scope, f, 7700);
        wait_status(
            f,
            Duration::from_secs(30),
            "metered packets on a0 -> c0",
            |s| a0_c0(s).0 >= METERED,
        );
        // Eight more periods judged within 4 s (two seconds of the controller's 250 ms
        // periods, with as long again to spare): periods that waited for h6 would close only
        // as late ones, far slower.
        let (n0, t0) = (judged(f), Instant::now());
        let mut n1 = n0;
        while n1 < n0 + 8 && t0.elapsed() < Duration::from_secs(4) {
            std::thread::sleep(Duration::from_millis(50));
            n1 = judged(f);
        }
        eprintln!(
            "judged {} periods in {:.2} s with h6 refused",
            n1 - n0,
            t0.elapsed().as_secs_f64()
        );
        assert!(
            n1 >= n0 + 8,
            "{} periods judged in 4 s with h6 refused (the controller's clock gives 16)",
            n1 - n0
        );
        let s = status(f);
        let h6 = s["meter_hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["host"] == "h6")
            .expect("h6 still named");
        assert_eq!(h6["reason"], "period");
        assert!(
            h6["last_ms_ago"].as_u64().unwrap() < 1000,
            "h6's reports refused still: {h6}"
        );
        load.finish();
    });
    // Back on the controller's clock.
    f.stop_host("h6");
    f.start_host("h6").unwrap();
    f.wait_settled(Duration::from_secs(30)).unwrap();
}
