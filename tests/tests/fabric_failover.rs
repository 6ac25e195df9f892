//! Failures under traffic, in the data plane: Fat-Tree k=4 at 100 Mbit/s per link, a TCP
//! transfer h0 -> h4 running, a core link cut for real (one end set down: nothing crosses it
//! either way) in the middle of it. The switches at both ends repair `tc_forward` the moment
//! they see the carrier go (a0: hop values moved to its live core; c0: pod 0 detoured through
//! another pod), before and without the controller. Every packet h0 and h4 sent is followed
//! from a capture where it entered the fabric to one where it left it: a packet lost is one
//! that entered and never left. Needs root.

use std::{collections::BTreeSet, time::SystemTime};

use sopa_testbed::{
    NetNs,
    capture::{Capture, Captured, unwrap_ids},
    fabric::{Fabric, FabricOptions},
    traffic::{SendOptions, Transfer, tcp_transfer},
};
use sopa_topology::topology::TopologySpec;

const RATE_MBIT: u32 = 100;
const QUEUE_PACKETS: u32 = 100;

/// The packets from `src` a capture saw: unwrapped IPv4 ID and when the kernel received it.
fn packets_from(c: &Captured, src: std::net::Ipv4Addr) -> Vec<(i64, SystemTime)> {
    let mut raw = Vec::new();
    for (frame, at) in c.frames.iter().zip(&c.times) {
        if frame.len() < 34 || frame[12..14] != [8, 0] {
            continue;
        }
        let Ok(ip) = etherparse::Ipv4HeaderSlice::from_slice(&frame[14..]) else {
            continue;
        };
        if ip.source_addr() == src && ip.protocol() == etherparse::IpNumber::TCP {
            raw.push((ip.identification(), *at));
        }
    }
    let ids: Vec<(u16, u8, usize)> = raw
        .iter()
        .enumerate()
        .map(|(i, (id, _))| (*id, 0, i))
        .collect();
    unwrap_ids(&ids)
        .into_iter()
        .map(|(id, _, i)| (id, raw[i].1))
        .collect()
}

/// One direction of a flow between where it enters the fabric and where it leaves it.
struct Loss {
    what: &'static str,
    entered: usize,
    lost: Vec<(i64, SystemTime)>,
}

impl Loss {
    fn of(
        what: &'static str,
        entered: &Captured,
        left: &Captured,
        src: std::net::Ipv4Addr,
    ) -> Self {
        assert_eq!(
            (entered.dropped, left.dropped),
            (0, 0),
            "{what}: a capture could not keep up"
        );
        let entered = packets_from(entered, src);
        let arrived: BTreeSet<i64> = packets_from(left, src)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        // A packet still on its way when the captures stopped is not lost: only those sent
        // before the last one that arrived count.
        let last = arrived.iter().next_back().copied().unwrap_or(i64::MIN);
        let lost = entered
            .iter()
            .filter(|(id, _)| *id < last && !arrived.contains(id))
            .copied()
            .collect();
        Self {
            what,
            entered: entered.len(),
            lost,
        }
    }

    /// The loss window: from the first lost packet's entry to the last's, relative to `cut`
    /// (milliseconds, negative before it).
    fn window_ms(&self, cut: SystemTime) -> Option<(f64, f64)> {
        let ms = |t: SystemTime| match t.duration_since(cut) {
            Ok(d) => d.as_secs_f64() * 1e3,
            Err(e) => -e.duration().as_secs_f64() * 1e3,
        };
        let first = self.lost.iter().map(|(_, t)| *t).min()?;
        let last = self.lost.iter().map(|(_, t)| *t).max()?;
        Some((ms(first), ms(last)))
    }

    fn report(&self, cut: SystemTime) -> String {
        format!(
            "{}: {} of {} packets lost, window {:?} ms around the cut",
            self.what,
            self.lost.len(),
            self.entered,
            self.window_ms(cut)
        )
    }
}

/// Captures where h0 -> h4 enters and leaves the fabric, both directions.
struct Captures {
    h0_in: Capture,
    h4_out: Capture,
    h4_in: Capture,
    h0_out: Capture,
}

impl Captures {
    fn start(f: &Fabric) -> Self {
        let host_if = |h: &str| f.host_ifaces[&f.topo.graph().find(h).unwrap()].clone();
        Self {
            h0_in: Capture::start(f.ns("e0"), &f.link_iface("e0", "h0")).unwrap(),
            h4_out: Capture::start(f.ns("h4"), &host_if("h4")).unwrap(),
            h4_in: Capture::start(f.ns("e2"), &f.link_iface("e2", "h4")).unwrap(),
            h0_out: Capture::start(f.ns("h0"), &host_if("h0")).unwrap(),
        }
    }

    /// (data h0 -> h4, acknowledgements h4 -> h0).
    fn finish(self) -> (Loss, Loss) {
        let (h0, h4) = ("10.0.0.2".parse().unwrap(), "10.1.0.2".parse().unwrap());
        let data = Loss::of(
            "data h0 -> h4",
            &self.h0_in.finish().unwrap(),
            &self.h4_out.finish().unwrap(),
            h0,
        );
        let acks = Loss::of(
            "acks h4 -> h0",
            &self.h4_in.finish().unwrap(),
            &self.h0_out.finish().unwrap(),
            h4,
        );
        (data, acks)
    }
}

/// Runs `bytes` h0 -> h4 and, once `a`'s port to `b` has sent `after` more packets, cuts the
/// link `a`-`b`. Returns the transfer and the time of the cut.
fn transfer_cut_midway(
    f: &Fabric,
    a: &str,
    b: &str,
    after: u64,
    bytes: u64,
) -> (Transfer, SystemTime) {
    let port = f.link_iface(a, b);
    let start = f.ns(a).tx_packets(&port).unwrap();
    std::thread::scope(|s| {
        let (h0, h4): (&NetNs, &NetNs) = (f.ns("h0"), f.ns("h4"));
        let t = s.spawn(move || {
            tcp_transfer(
                h0,
                h4,
                "10.1.0.2".parse().unwrap(),
                7300,
                bytes,
                &SendOptions::default(),
            )
        });
        // The event: this many of the flow's packets have crossed the link.
        while f.ns(a).tx_packets(&port).unwrap() < start + after {
            assert!(
                !t.is_finished(),
                "the transfer ended before {a}:{b} carried {after} packets"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let cut = f.cut_link(a, b).unwrap();
        let t = t
            .join()
            .unwrap()
            .expect("the transfer completes across the cut");
        (t, cut)
    })
}

fn counter(f: &Fabric, switch: &str, name: &str) -> u64 {
    f.switch_status(switch).unwrap()["forward"][name]
        .as_u64()
        .unwrap_or(0)
}

/// At most the packets in flight on the link: what its queue holds (its limit) and what the
/// wire carries besides (nothing on a veth), plus what is sent onto the port between the
/// carrier's loss and the repair; at 100 Mbit/s, 8 full packets a millisecond.
const IN_FLIGHT_BOUND: usize = QUEUE_PACKETS as usize + 8;

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
    let caps = Captures::start(&f);
    let (t, cut) = transfer_cut_midway(&f, "a0", "c0", 600, 16 << 20);
    let (data, acks) = caps.finish();
    assert!(t.intact(), "sha256 differs across the cut");
    eprintln!("controller away: {:.1} Mbit/s", t.mbit_per_s());
    for l in [&data, &acks] {
        eprintln!("{}", l.report(cut));
    }
    assert!(
        counter(&f, "c0", "detoured") > detoured,
        "c0 detoured none of the acknowledgements"
    );
    for l in [&data, &acks] {
        assert!(
            l.lost.len() <= IN_FLIGHT_BOUND,
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
    let caps = Captures::start(&f);
    let (t, cut) = transfer_cut_midway(&f, "c2", "a3", 600, 16 << 20);
    let (data, acks) = caps.finish();
    assert!(t.intact(), "sha256 differs across the cut");
    eprintln!("controller up: {:.1} Mbit/s", t.mbit_per_s());
    for l in [&data, &acks] {
        eprintln!("{}", l.report(cut));
        assert!(
            l.lost.len() <= IN_FLIGHT_BOUND,
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
