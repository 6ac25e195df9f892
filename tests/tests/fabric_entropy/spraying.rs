//! Discovery through hashing routers, and the round robin it makes possible.

use std::time::Duration;

use sopa_testbed::{
    capture::Capture,
    fabric::{Fabric, wait_for},
    failure::transfer_cut_midway,
    lossy::LossyLink,
    reach::all_pairs_tcp,
    routers::discovered,
    traffic::{SendOptions, Transfer, tcp_counters, tcp_transfer, tcp_transfer_to},
};

/// Runs its closure when dropped: what a phase changes on the shared fabric is put back even
/// when one of its assertions fails, so the next phase fails only for its own reasons.
struct Undo<F: FnMut()>(F);

impl<F: FnMut()> Drop for Undo<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Every host's discovery, once done (at most `within`).
fn summaries(f: &Fabric, within: Duration) -> Vec<(String, serde_json::Value)> {
    discovered(f, within).unwrap()
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

/// h4's IPv4 address.
const H4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 1, 0, 2);

/// One flow h0 -> h4 of 8 MB to `to` on TCP `port`, arrived intact.
fn h0_to_h4(f: &Fabric, to: std::net::IpAddr, port: u16) -> Transfer {
    let t = tcp_transfer_to(
        f.ns("h0"),
        f.ns("h4"),
        to,
        port,
        8 << 20,
        &SendOptions::default(),
    )
    .expect("h0 -> h4");
    assert!(t.intact(), "h0 -> h4: the digest differs");
    t
}

/// One flow h0 -> h4 of 8 MB on TCP `port`, intact: what left pod 0 by each core meanwhile.
fn h0_to_h4_per_core(f: &Fabric, port: u16) -> Vec<u64> {
    let before = per_core(f);
    h0_to_h4(f, H4.into(), port);
    per_core(f)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect()
}

/// One flow h0 -> h4 (another pod): its packets leave pod 0 equally by the four cores,
/// within 1% (the interfaces also count a few neighbour messages of the kernel's own).
pub fn one_flow_spreads_evenly_over_the_cores(f: &mut Fabric) {
    summaries(f, Duration::from_secs(60));
    let per = h0_to_h4_per_core(f, 7000);
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

/// The row of destination host `host` in a discovery summary, if it was probed.
fn row_of(e: &serde_json::Value, host: &str) -> Option<serde_json::Value> {
    e["destinations"]
        .as_array()?
        .iter()
        .find(|d| d["host"] == host)
        .cloned()
}

/// h0's discovery of h4, once a discovery newer than `after` is done (at most `within`): its
/// generation, expected paths and paths found per next header.
fn h4_as_h0_probed(f: &Fabric, after: u64, within: Duration) -> (u64, serde_json::Value) {
    let what = format!("h0's discovery after generation {after}");
    wait_for(&what, within, || {
        let e = f.host("h0").status().unwrap()["entropy"].clone();
        let generation = e["generation"].as_u64().unwrap_or(0);
        if generation <= after || e["done"] != true {
            return Err(e.to_string());
        }
        Ok((generation, row_of(&e, "h4").expect("h4 probed")))
    })
    .unwrap()
}

/// a0-c0 cut while h0 sends to h4 (the routers drop the dead next hop, the testbed tells the
/// controller): the transfer completes intact; h0 probes again and finds exactly the 3 paths
/// left; a flow then takes c1, c2 and c3 equally and c0 not at all. Mended, all 4 again.
pub fn a_core_link_cut_mid_transfer_is_probed_around(f: &mut Fabric) {
    summaries(f, Duration::from_secs(60));
    let generation = f.host("h0").status().unwrap()["entropy"]["generation"]
        .as_u64()
        .unwrap();
    let (t, _) = transfer_cut_midway(f, ("h0", "h4", H4, 7400), ("a0", "c0"), 600, 16 << 20)
        .expect("the transfer completes across the cut");
    assert!(t.intact(), "digest differs across the cut");
    f.wait_applied(|down| down == 1, "a0:c0 down").unwrap();
    // The fabric's routing converged (the testbed's stand-in for BGP): the other pods'
    // aggregation switches no longer send pod 0's traffic to c0, which cannot take it down.
    let to_e0 = |sw: &str| f.ns(sw).ip(&["route", "show", "10.0.0.0/24"]).unwrap();
    assert!(
        !to_e0("a4").contains(&f.link_iface("a4", "c0")),
        "a4: {}",
        to_e0("a4")
    );
    let (after_cut, row) = h4_as_h0_probed(f, generation, Duration::from_secs(30));
    eprintln!("cut at {:.1} Mbit/s; probed again: {row}", t.mbit_per_s());
    assert_eq!(row["expected"], 3, "{row}");
    for class in ["ipv4", "tcp6", "udp6"] {
        assert_eq!(row["found"][class], 3, "{class}: {row}");
    }
    let per = h0_to_h4_per_core(f, 7401);
    eprintln!("around the cut, per core {per:?}");
    assert!(per[0] < 8, "the cut core link carried {per:?}");
    let (lo, hi) = (
        *per[1..].iter().min().unwrap(),
        *per[1..].iter().max().unwrap(),
    );
    assert!(lo > 1000 && hi - lo <= (lo / 100).max(8), "{per:?}");
    f.mend_link("a0", "c0").unwrap();
    f.wait_applied(|down| down == 0, "a0:c0 up").unwrap();
    assert!(
        to_e0("a4").contains(&f.link_iface("a4", "c0")),
        "a4: {}",
        to_e0("a4")
    );
    let (_, row) = h4_as_h0_probed(f, after_cut, Duration::from_secs(30));
    assert_eq!(row["found"]["ipv4"], 4, "mended: {row}");
}

/// h0's discovery summary once its labels come from `source` (the command returns once they
/// are all in place).
fn h0_labels_from(f: &Fabric, source: &str) -> serde_json::Value {
    sopa_testbed::agent::set_labels(&f.host("h0").node, source).unwrap();
    let e = f.host("h0").status().unwrap()["entropy"].clone();
    assert_eq!(e["source"], source, "{e}");
    assert_eq!(e["done"], true, "{e}");
    assert_eq!(e["incomplete"], serde_json::json!([]), "{e}");
    e
}

/// The baselines, on one host at run time (`sopa-agent labels`): `blind` and `per-packet`
/// put a label (or the per-packet mark) on every path to every host without a probe; under
/// `per-packet` a flow still arrives intact and its packets leave by all four cores; back to
/// `discovered`, h0 probes again and finds every path.
pub fn the_baselines_take_their_labels_at_run_time(f: &mut Fabric) {
    let f: &Fabric = f;
    summaries(f, Duration::from_secs(60));
    let _undo = Undo(|| {
        if f.host("h0").status().unwrap()["entropy"]["source"] != "discovered" {
            let _ = sopa_testbed::agent::set_labels(&f.host("h0").node, "discovered");
        }
    });
    for source in ["blind", "per-packet"] {
        let e = h0_labels_from(f, source);
        for d in e["destinations"].as_array().unwrap() {
            assert_eq!(d["probes"], 0, "{source}: {d}");
            for class in ["ipv4", "tcp6", "udp6"] {
                assert_eq!(d["found"][class], d["expected"], "{source}: {d}");
            }
        }
    }
    let per = h0_to_h4_per_core(f, 7200);
    eprintln!("h0 -> h4 with a random label per packet: per core {per:?}");
    assert!(per.iter().all(|n| *n > 500), "{per:?}");
    let e = h0_labels_from(f, "discovered");
    let probes: u64 = e["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["probes"].as_u64().unwrap())
        .sum();
    assert!(probes > 0, "discovered again by probing: {e}");
}

/// h0's loss reprobes so far, and its row for h4.
fn h0_reprobes(f: &Fabric) -> (u64, serde_json::Value) {
    let e = f.host("h0").status().unwrap()["entropy"].clone();
    let row = row_of(&e, "h4").unwrap_or_default();
    (e["reprobed_for_loss"].as_u64().unwrap_or(0), row)
}

/// a0 drops everything it sends to c0 while the link stays up: a black hole nobody reports, so
/// the controller pushes nothing. h0's connection to h4 retransmits a quarter of its segments,
/// h0 probes h4 again at once and finds the 3 paths left, whose labels take the dead path's share of the round robin: the
/// transfer completes intact, and a flow then leaves pod 0 by c1, c2 and c3 only. Healed and
/// probed again, all 4.
pub fn a_silent_black_hole_is_probed_around(f: &mut Fabric) {
    summaries(f, Duration::from_secs(60));
    let (before, _) = h0_reprobes(f);
    let rtos = |f: &Fabric| tcp_counters(f.ns("h0")).unwrap()["TcpExt.TCPTimeouts"];
    let timeouts = rtos(f);
    let mut hole = LossyLink::attach(f.ns("a0"), &f.link_iface("a0", "c0")).unwrap();
    hole.set_loss(100.0).unwrap();
    // The hole's drops sampled meanwhile: when the last one came (a measurement, not a wait).
    let done = std::sync::atomic::AtomicBool::new(false);
    let onset = std::time::Instant::now();
    let (t, last_drop) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let (mut last, mut at) = (0, Duration::ZERO);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let (_, dropped) = hole.counts().unwrap();
                if dropped > last {
                    (last, at) = (dropped, onset.elapsed());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            at
        });
        // Not `h0_to_h4`, which panics: the sampler must be told to stop whatever happens.
        let t = tcp_transfer(
            f.ns("h0"),
            f.ns("h4"),
            H4,
            7500,
            8 << 20,
            &SendOptions::default(),
        );
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (t, sampler.join().unwrap())
    });
    let t = t.expect("h0 -> h4 through the black hole");
    assert!(t.intact(), "digest differs");
    let (seen, dropped) = hole.counts().unwrap();
    eprintln!(
        "through the black hole: {:.1} Mbit/s, {} RTOs at h0, the hole dropped {dropped} of \
         {seen}, the last {} ms after the onset",
        t.mbit_per_s(),
        rtos(f) - timeouts,
        last_drop.as_millis()
    );
    let (reprobes, row) = wait_for(
        "h0's reprobe of h4 for loss",
        Duration::from_secs(30),
        || {
            let (n, row) = h0_reprobes(f);
            if n > before && row["found"]["ipv4"] == 3 {
                Ok((n, row))
            } else {
                Err(format!("{n} reprobes, h4: {row}"))
            }
        },
    )
    .unwrap();
    eprintln!(
        "{} reprobes for loss; h4 probed again: {row}",
        reprobes - before
    );
    assert_eq!(row["expected"], 4, "the controller heard of nothing: {row}");
    // What h0 retransmits says whether its packets still go into the hole (a0's counter
    // towards c0 does not: tc_lossy drops them before it counts).
    let counters = |f: &Fabric| {
        let c = tcp_counters(f.ns("h0")).unwrap();
        (c["Tcp.OutSegs"], c["Tcp.RetransSegs"])
    };
    let (out0, re0) = counters(f);
    let per = h0_to_h4_per_core(f, 7501);
    let (out1, re1) = counters(f);
    let (sent, resent) = (out1 - out0, re1 - re0);
    eprintln!("around the black hole, per core {per:?}; h0 retransmitted {resent} of {sent}");
    assert!(
        resent * 100 <= sent,
        "h0 retransmitted {resent} of {sent} segments: its labels still lead into the hole"
    );
    drop(hole);
    let e = h0_labels_from(f, "discovered");
    let h4_row = row_of(&e, "h4").expect("h4 probed");
    assert_eq!(h4_row["found"]["ipv4"], 4, "healed: {h4_row}");
}

/// One transfer h0 -> h4 of 8 MB on `port` (IPv6 when `v6`): the skbs with data h4's stack
/// received per segment h0 sent (1 when GRO merged nothing).
fn skbs_per_segment(f: &Fabric, v6: bool, port: u16) -> f64 {
    let sent = |f: &Fabric| tcp_counters(f.ns("h0")).unwrap()["Tcp.OutSegs"];
    let capture = Capture::start(f.ns("h4"), &f.link_iface("h4", "e2")).unwrap();
    let before = sent(f);
    let to: std::net::IpAddr = if v6 {
        f.topo.host_ipv6(f.topo.graph().find("h4").unwrap()).into()
    } else {
        H4.into()
    };
    h0_to_h4(f, to, port);
    let segments = sent(f) - before;
    let got = capture.finish().unwrap();
    assert_eq!(got.dropped, 0, "the capture kept up");
    let skbs = got
        .frames
        .iter()
        .filter(|fr| sopa_testbed::capture::tcp_data_to(fr, port).is_some())
        .count();
    skbs as f64 / segments as f64
}

/// GRO kept: h4's stack receives as many skbs per segment with h0 spraying over four labels
/// (IPv6 relabelled, IPv4 in an outer header) as with h0 changing nothing (mode off), at most
/// 1.1 times that or a flowcell's share (see below), because `xdp_strip` zeroes the label and
/// removes the outer header before GRO.
/// veth hands GRO one segment per poll here unless its flush waits (`gro_flush_timeout`, as
/// a NIC's interrupt moderation batches): h4's interface holds GRO for 2 ms, so merging is
/// there to lose.
pub fn the_receiver_merges_as_without_sopa(f: &mut Fabric) {
    summaries(f, Duration::from_secs(60));
    let iface = f.link_iface("h4", "e2");
    // GRO on, its flush held 2 ms (veth's is off by default), and back as it was.
    let set_gro = |on: bool| {
        let (gro, ns) = if on { ("on", "2000000") } else { ("off", "0") };
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", f.ns("h4").name(), "sh", "-c"])
            .arg(format!(
                "ethtool -K {iface} gro {gro} && echo {ns} > /sys/class/net/{iface}/gro_flush_timeout"
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    set_gro(true);
    let h0 = f.host("h0").node.clone();
    let _undo = Undo(|| {
        let _ = sopa_testbed::agent::set_mode_with(&h0, "sopa", &[]);
        set_gro(false);
    });
    let mut rows = Vec::new();
    for (v6, name) in [(false, "ipv4"), (true, "ipv6")] {
        let mut by_mode = Vec::new();
        for (i, mode) in ["off", "sopa"].iter().enumerate() {
            sopa_testbed::agent::set_mode_with(&h0, mode, &[]).unwrap();
            by_mode.push(skbs_per_segment(f, v6, 7300 + 2 * u16::from(v6) + i as u16));
        }
        rows.push((name, by_mode[0], by_mode[1]));
    }
    eprintln!("skbs per segment at h4 (without SOPA, with): {rows:?}");
    // h0 sends flowcells of 4 segments in both modes (the agent's granularity), and h4 merges
    // at least each flowcell's segments: 0.25 skbs per segment. Across flowcells it merges
    // sometimes, without SOPA as with it (0.217-0.262 in four runs each way): the bound is 1.1
    // times the larger of the two, so that luck across flowcells decides nothing. GRO lost
    // would be about 1 skb per segment.
    const FLOWCELL: f64 = 0.25;
    for (name, off, sopa) in rows {
        assert!(
            off < 0.9,
            "{name}: GRO merged little even without SOPA ({off:.3})"
        );
        assert!(
            sopa <= 1.1 * off.max(FLOWCELL),
            "{name}: {sopa:.3} skbs per segment with SOPA, {off:.3} without"
        );
    }
}
