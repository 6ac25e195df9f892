//! Failures under traffic, in the data plane: Fat-Tree k=4 at 100 Mbit/s per link, a TCP
//! transfer h0 -> h4 running, a core link cut for real (one end set down: nothing crosses it
//! either way) in the middle of it. The switches at both ends repair `tc_forward` the moment
//! they see the carrier go (a0: hop values moved to its live core; c0: pod 0 detoured through
//! another pod), before and without the controller. Every packet h0 and h4 sent is followed
//! from a capture where it entered the fabric to one where it left it: a packet lost is one
//! that entered and never left. Needs root.

use std::time::SystemTime;

use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    failure::{Element, element_links, paths_through, transfer_cut_midway},
    loss::{FlowCaptures, Loss},
    traffic::{SendOptions, tcp_transfer},
};
use sopa_topology::topology::TopologySpec;

const RATE_MBIT: u32 = 100;
const QUEUE_PACKETS: u32 = 100;

/// h0 -> h4 (10.1.0.2) on TCP port `port`.
fn h0_to_h4(port: u16) -> (&'static str, &'static str, std::net::Ipv4Addr, u16) {
    ("h0", "h4", std::net::Ipv4Addr::new(10, 1, 0, 2), port)
}

/// Both directions of h0 -> h4, in the order [`captures`] reports them.
const FLOWS: [(&str, &str); 2] = [("h0", "h4"), ("h4", "h0")];

/// Captures of both directions of h0 -> h4 where they enter and leave the fabric.
fn captures(f: &Fabric) -> FlowCaptures {
    FlowCaptures::start(f, &[("h0".into(), "h4".into()), ("h4".into(), "h0".into())]).unwrap()
}

/// The packets of `l` (flow `src -> dst`) lost on a path through the link `a`-`b` that entered
/// the fabric at most [`IN_FLIGHT_MS`] before the cut: the cut's cost (a queue's drop on
/// another path, or long before, is not).
fn cost(
    f: &Fabric,
    l: &Loss,
    (src, dst): (&str, &str),
    (a, b): (&str, &str),
    cut: SystemTime,
) -> usize {
    let dead = element_links(f, &Element::Link(a.into(), b.into()));
    let through: Vec<(u8, u8)> = paths_through(f, src, dst, &dead)
        .into_iter()
        .filter(|(_, t)| *t)
        .map(|(h, _)| h)
        .collect();
    l.lost
        .iter()
        .filter(|p| sopa_testbed::loss::ms_after(p.at, cut) >= -IN_FLIGHT_MS)
        .filter(|p| p.hops.is_none_or(|h| through.contains(&(h.0 & 0x7f, h.1))))
        .count()
}

fn counter(f: &Fabric, switch: &str, name: &str) -> u64 {
    f.switch_status(switch).unwrap()["forward"][name]
        .as_u64()
        .unwrap_or(0)
}

/// At most the packets in flight on the link: what its queue holds (its limit; the wire of a
/// veth holds nothing), plus what the flow sends onto the port between the carrier's loss and
/// the repair: a quarter of a flow of at most 100 Mbit/s, 2 full packets a millisecond, so 8
/// allow 4 ms, and the queue, never full on this uncongested link, leaves room for a repair
/// that waits tens of milliseconds to be scheduled. Measured: 2-7 per direction.
const IN_FLIGHT_BOUND: usize = QUEUE_PACKETS as usize + 8;

/// How long before the cut a packet still in flight can have entered: a full queue of the
/// link, 100 packets at 100 Mbit/s, drains in 12 ms. Losses before that are the queues' own
/// (the flow fills the receiver's link), not the cut's.
const IN_FLIGHT_MS: f64 = 25.0;

#[test]
fn a_core_link_cut_mid_transfer_costs_only_the_packets_in_flight() {
    let opts = FabricOptions {
        rate_mbit: Some(RATE_MBIT),
        queue_packets: QUEUE_PACKETS,
        ..FabricOptions::default()
    };
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).expect("build the fabric");
    f.start(&opts).expect("start controller and agents");
    f.wait_ready(std::time::Duration::from_secs(60))
        .expect("every agent ready");

    // 1. The controller unreachable: only the switches' own reaction stands between the flow
    // and a quarter of its packets lost for good. a0 loses its port to c0 (h0's data going up
    // by c0 moves to c1), c0 its port to pod 0 (h4's acknowledgements coming down by c0 are
    // detoured through another pod and c1).
    f.stop_controller();
    let detoured = counter(&f, "c0", "detoured");
    let caps = captures(&f);
    let (t, cut) = transfer_cut_midway(&f, h0_to_h4(7300), ("a0", "c0"), 600, 16 << 20)
        .expect("the transfer completes across the cut");
    let lost = caps.finish().unwrap();
    assert!(t.intact(), "digest differs across the cut");
    eprintln!("controller away: {:.1} Mbit/s", t.mbit_per_s());
    for l in &lost {
        eprintln!("{}", l.report(cut));
        assert_eq!(
            l.capture_drops, 0,
            "{}: a capture could not keep up",
            l.what
        );
    }
    assert!(
        counter(&f, "c0", "detoured") > detoured,
        "c0 detoured none of the acknowledgements"
    );
    for (l, flow) in lost.iter().zip(FLOWS) {
        let n = cost(&f, l, flow, ("a0", "c0"), cut);
        eprintln!("  {}: {n} on paths through a0:c0", l.what);
        assert!(
            n <= IN_FLIGHT_BOUND,
            "{} (at most {IN_FLIGHT_BOUND})",
            l.report(cut)
        );
    }
    f.mend_link("a0", "c0").unwrap();

    // 2. With the controller: the switches repair at once, then the hosts' paths move off the
    // link, after which nothing needs a detour any more.
    f.start_controller().unwrap();
    f.wait_applied(|down| down == 0, "the controller's return")
        .unwrap();
    let caps = captures(&f);
    let (t, cut) = transfer_cut_midway(&f, h0_to_h4(7302), ("c2", "a3"), 600, 16 << 20)
        .expect("the transfer completes across the cut");
    let lost = caps.finish().unwrap();
    assert!(t.intact(), "digest differs across the cut");
    eprintln!("controller up: {:.1} Mbit/s", t.mbit_per_s());
    for l in &lost {
        eprintln!("{}", l.report(cut));
        assert_eq!(
            l.capture_drops, 0,
            "{}: a capture could not keep up",
            l.what
        );
    }
    for (l, flow) in lost.iter().zip(FLOWS) {
        let n = cost(&f, l, flow, ("c2", "a3"), cut);
        eprintln!("  {}: {n} on paths through c2:a3", l.what);
        assert!(
            n <= IN_FLIGHT_BOUND,
            "{} (at most {IN_FLIGHT_BOUND})",
            l.report(cut)
        );
    }
    f.wait_applied(|down| down == 1, "the cut").unwrap();
    let detoured = counter(&f, "c2", "detoured");
    let t = tcp_transfer(
        f.ns("h0"),
        f.ns("h4"),
        "10.1.0.2".parse().unwrap(),
        7301,
        4 << 20,
        &SendOptions::default(),
    )
    .unwrap();
    assert!(t.intact());
    assert_eq!(
        counter(&f, "c2", "detoured"),
        detoured,
        "the hosts still send by c2 to pod 1 after the controller moved their paths"
    );
    f.mend_link("c2", "a3").unwrap();
    f.wait_applied(|down| down == 0, "the mend").unwrap();
}
