//! Marks no host of the fabric sent: 40,000 raw IPv6 packets with distinct forged path-meter
//! marks, written onto h0's link to its rack switch, addressed to h0's SRv6 receive address.
//! h0's meter counts only marks the fabric's paths can carry, so its received table stays
//! within the fabric's own paths and its next periods are reported complete.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use sopa_common::maps::meter::RECEIVED_MAPS;
use sopa_testbed::{
    fabric::Fabric,
    forge::{mac, marked_frame, send_frames},
    resilience::pin_dir,
};
use sopa_topology::srv6::{Usids, receive_address};

/// Forged frames sent.
const FORGED: usize = 40_000;

/// Entries of h0's pinned received-counter maps (both colors).
fn received_entries(f: &Fabric) -> usize {
    RECEIVED_MAPS
        .iter()
        .map(|map| sopa_testbed::bpftool::entries(&pin_dir(&f.host("h0").node).join(map)))
        .sum()
}

/// h0's agent's counter `name` (with its labels), from its metrics.
fn agent_metric(f: &Fabric, series: &str) -> u64 {
    let (_, text) = f
        .ns("h0")
        .http_get("127.0.0.1:9470", "/metrics")
        .expect("h0's metrics");
    sopa_testbed::prometheus::sample(&text, series)
        .unwrap_or_else(|| panic!("h0's agent exports no {series}"))
}

pub fn forged_marks_leave_a_hosts_meter_bounded_and_its_periods_complete(f: &mut Fabric) {
    let topo = &f.topo;
    let g = topo.graph();
    let h0 = g.find("h0").unwrap();
    let receive = receive_address(topo, &Usids::of(topo).unwrap(), h0).unwrap();
    let h0_addr = g.node(h0).addr.unwrap();
    // The most keys honest packets can make: both colors of every path of every other rack.
    let bound: usize = sopa_agent::meter::peers::peers(topo, h0)
        .iter()
        .map(|(_, p)| {
            2 * usize::from(p.hop_limits[0])
                * (usize::from(p.hop_limits[1]) + usize::from(p.hop1_none))
        })
        .sum();
    let port = f.link_iface("e0", "h0");
    let h0_iface = &f.host_ifaces[&h0];
    let macs = (
        mac(f.ns("h0"), h0_iface).unwrap(),
        mac(f.ns("e0"), &port).unwrap(),
    );
    // Distinct marks: sources across the fabric's racks and beyond, every hop value, both
    // colors (a small deterministic generator, so a failure is the same next time).
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let frames: Vec<Vec<u8>> = (0..FORGED)
        .map(|i| {
            let r = next();
            let src = Ipv4Addr::new(10, (r % 8) as u8, ((r >> 8) % 4) as u8, (i % 250) as u8 + 2);
            let hops = [((r >> 16) & 0x3f) as u8, (r >> 24) as u8];
            marked_frame(macs, receive, (src, h0_addr), hops, ((r >> 32) & 1) as u8)
        })
        .collect();
    let reported = "sopa_meter_readings_total{outcome=\"reported\"}";
    let full = "sopa_meter_full_packets_total";
    let foreign = "sopa_meter_foreign_packets_total";
    let (reported0, full0, foreign0) = (
        agent_metric(f, reported),
        agent_metric(f, full),
        agent_metric(f, foreign),
    );
    let entries0 = received_entries(f);
    let sent = send_frames(f.ns("e0"), &port, &frames, 500).unwrap();
    let foreign1 = agent_metric(f, foreign);
    let entries = received_entries(f);
    eprintln!(
        "{sent} forged frames sent; h0 counted {} as foreign; its received table {entries0} -> {entries} entries (the fabric's paths make at most {bound})",
        foreign1 - foreign0
    );
    assert_eq!(sent, FORGED);
    assert!(
        foreign1 - foreign0 >= (FORGED as u64) * 9 / 10,
        "{} of {FORGED} forged marks not counted: most arrived?",
        foreign1 - foreign0
    );
    assert!(
        entries <= bound,
        "h0's received table holds {entries} entries, past the {bound} the fabric's paths make"
    );
    // Its next periods: reported, and complete (nothing missed a full table).
    let start = Instant::now();
    while agent_metric(f, reported) < reported0 + 4 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "h0 reported no period after the forged marks"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        agent_metric(f, full),
        full0,
        "a packet found h0's meter table full"
    );
}
