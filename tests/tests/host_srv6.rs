//! The SRv6 encoding on a real routed path: A - R - B, R a plain Linux SRv6 node (the kernel's
//! `seg6local` End behaviour with the NEXT-C-SID flavour, no program of ours), agents on A and
//! B, IPv4 and IPv6 inside. Needs root; every namespace, process and file is removed on drop,
//! also on failure. On a kernel without `seg6local` it is skipped, and says so.

use std::net::Ipv6Addr;

use sopa_testbed::{
    agent::Agent,
    arb::{A_ADDR6, A_PREFIX, A_RACK_USID, Arb, B_ADDR6, B_PREFIX, B_RACK_USID},
    capture::{Capture, Srv6Frame, cycle_breaks, mark_colors, srv6, tcp_from},
    traffic::{SendOptions, tcp_transfer, tcp_transfer_to},
};

const MIB: u64 = 1 << 20;
const PATHS: u8 = 3;

/// An encapsulated frame from `src6` with IPv4 inside: its outer header and mark as read, and
/// the inner packet as an Ethernet frame of IPv4.
fn outer(frame: &[u8], src6: Ipv6Addr) -> Option<(Srv6Frame, Vec<u8>)> {
    let f = srv6(frame).filter(|f| f.src == src6 && f.inner_next == 4)?;
    let mut inner = frame[..12].to_vec();
    inner.extend([0x08, 0x00]);
    inner.extend(&frame[f.inner..]);
    Some((f, inner))
}

fn main() -> std::process::ExitCode {
    const NAME: &str = "srv6_over_a_linux_usid_node_paths_cycle_and_b_sees_the_inner_packet_only";
    let suite = sopa_testbed::phases::Suite::new();
    // R is the kernel's own uSID node here, by design; without seg6local the same hosts run
    // through switches that consume their uSID in eBPF (fabric_srv6).
    if sopa_testbed::kernel::has_seg6local() {
        suite.alone(NAME, srv6_over_a_linux_usid_node)
    } else {
        suite.skip(
            NAME,
            "the kernel has no seg6local (CONFIG_IPV6_SEG6_LWTUNNEL is not set): R cannot be a \
             Linux uSID node; fabric_srv6 runs the hosts' SRv6 through uN in eBPF instead"
                .into(),
        )
    }
    .run()
}

fn srv6_over_a_linux_usid_node() {
    let arb = Arb::new("s").expect("build A - R - B");
    // Fabric links 48 bytes above the hosts' 1500: the outer header and the path meter's mark
    // cost no goodput.
    arb.make_srv6(usize::from(PATHS), 1548)
        .expect("R as an SRv6 node");
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let agent_a = Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::srv6_path_table(A_ADDR6, A_RACK_USID, B_PREFIX, B_RACK_USID, PATHS.into()),
        // Per packet, the paper's unit, so the paths cycle packet by packet on the wire.
        &["--granularity", "packet"],
    )
    .expect("agent on A");
    let agent_b = Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::srv6_path_table(B_ADDR6, B_RACK_USID, A_PREFIX, A_RACK_USID, PATHS.into()),
        &["--no-metrics"],
    )
    .expect("agent on B");
    let routes = arb.a.ip(&["route"]).unwrap();
    assert!(
        routes.contains("10.101.2.0/24 via 10.101.1.1") && routes.contains("mtu 1500"),
        "the fabric route at the interface's 1548 less the outer header's 40 and the mark's 8:\n{routes}"
    );
    let routes6 = arb.a.ip(&["-6", "route"]).unwrap();
    assert!(
        routes6.contains("fd00:5a::/96 via fd00:5a::a65:101") && routes6.contains("mtu 1500"),
        "IPv6 to the fabric's /96 as the default route goes, at 1548 less 48:\n{routes6}"
    );

    let at_r = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let at_b = Capture::start(&arb.b, &arb.b_if).unwrap();
    let transfer = tcp_transfer(
        &arb.a,
        &arb.b,
        arb.b_addr,
        5001,
        50 * MIB,
        &SendOptions::default(),
    )
    .expect("50 MiB from A to B");
    let at_r = at_r.finish().unwrap();
    let at_b = at_b.finish().unwrap();
    assert!(transfer.intact(), "digest differs");
    eprintln!(
        "50 MiB in {:.2} s: {:.0} Mbit/s",
        transfer.seconds,
        transfer.mbit_per_s()
    );

    // At R: every TCP packet from A is inside an outer IPv6 header from A's address to a
    // uSID list naming one of R's path uSIDs, then B's rack and B; the lists cycle in the
    // order A sent the packets (the inner IPv4 ID).
    let a6: Ipv6Addr = A_ADDR6.parse().unwrap();
    let lists: Vec<Ipv6Addr> = (0..PATHS)
        .map(|i| {
            format!(
                "fcbb:bb00:{:x}:{B_RACK_USID:x}:e002::",
                0x100 + u16::from(i)
            )
            .parse()
            .unwrap()
        })
        .collect();
    // The capture socket shares the frame's header with R's own processing, which shifts the
    // list in place (the clone's header is writable): a frame read after that shows the list
    // R made of it, which names no path any more.
    let shifted: Ipv6Addr = format!("fcbb:bb00:{B_RACK_USID:x}:e002::").parse().unwrap();
    let (mut sent, mut labels, mut full_size, mut plain, mut read_late) =
        (Vec::new(), Vec::new(), 0, 0, 0);
    for frame in &at_r.frames {
        if tcp_from(frame, arb.a_addr).is_some() {
            plain += 1;
            continue;
        }
        let Some((f, inner)) = outer(frame, a6) else {
            continue;
        };
        let (dst, label) = (f.dst, f.flow_label);
        let Some((options, payload)) = tcp_from(&inner, arb.a_addr) else {
            continue;
        };
        if dst == shifted {
            read_late += 1;
            continue;
        }
        assert!(options.is_empty(), "no option inside");
        let path = lists
            .iter()
            .position(|l| *l == dst)
            .unwrap_or_else(|| panic!("outer destination {dst} is none of the paths' lists"));
        // The path meter runs (every 250 ms by default): each packet carries RFC 9343's mark
        // naming the path its list takes, in one color or the other.
        let (hops, _) = f
            .mark
            .unwrap_or_else(|| panic!("a packet to {dst} without the meter's mark"));
        assert_eq!(hops[0], path as u8, "the mark names the path of {dst}");
        sent.push((
            u16::from_be_bytes([inner[18], inner[19]]),
            path as u8,
            payload,
        ));
        labels.push(label);
        if f.payload_len == 1508 {
            full_size += 1;
        }
    }
    assert_eq!(plain, 0, "TCP packets from A at R without the outer header");
    assert!(
        read_late * 100 < sent.len(),
        "{read_late} frames read after R shifted their list, of {}",
        sent.len()
    );
    // The mark's color is the parity of its period on the TAI clock.
    let period = sopa_agent::meter::DEFAULT_PERIOD;
    let judged = mark_colors(&at_r, period, |f| f.src == a6 && f.dst != shifted);
    eprintln!("marks at R: {judged}");
    judged.assert_by_tai(10_000, period);
    let (pairs, breaks) = cycle_breaks(&sent, PATHS);
    assert!(pairs > 30_000, "{pairs} consecutive packets");
    assert!(
        breaks.is_empty(),
        "the uSID lists do not cycle in send order ({pairs} consecutive pairs; around each \
         break: {breaks:?})"
    );
    assert!(
        full_size > sent.len() / 2,
        "full-size inner packets (1500, in an outer payload of 1508 with the mark): {full_size} of {}",
        sent.len()
    );
    // The label is the flow's hash (the socket's txhash): one flow keeps one, except where
    // the kernel rehashes the socket to move it (after a timeout or a spurious retransmission,
    // as IPv6 flow-label repathing does).
    labels.sort_unstable();
    labels.dedup();
    assert!(
        labels.len() <= 4,
        "one flow, one flow label save a rehash or two: {labels:x?}"
    );
    eprintln!("flow labels at R: {labels:x?}");

    // At B's stack (the capture runs after XDP): the inner packets only.
    let (mut inner_at_b, mut outer_at_b) = (0, 0);
    for f in &at_b.frames {
        if tcp_from(f, arb.a_addr).is_some() {
            inner_at_b += 1;
        }
        // (Neighbour discovery is IPv6 too: only encapsulated packets count.)
        if srv6(f).is_some() {
            outer_at_b += 1;
        }
    }
    assert!(inner_at_b > 30_000, "B saw {inner_at_b} packets");
    assert_eq!(outer_at_b, 0, "encapsulated packets reached B's stack");

    let a = agent_a.status().unwrap();
    let b = agent_b.status().unwrap();
    assert_eq!(a["encoding"], "srv6");
    assert_eq!(a["srv6"]["source"], A_ADDR6);
    assert!(a["stamp"]["stamped"].as_u64().unwrap() >= sent.len() as u64);
    assert_eq!(
        a["stamp"]["too_big"], 0,
        "every packet fit once encapsulated"
    );
    assert!(b["strip"]["decapsulated"].as_u64().unwrap() >= inner_at_b);
    let hop0: Vec<u64> = (0..PATHS)
        .map(|h| a["hop0"][h.to_string()].as_u64().unwrap_or(0))
        .collect();
    let (lo, hi) = (hop0.iter().min().unwrap(), hop0.iter().max().unwrap());
    assert!(hi - lo <= 1, "one flow, round robin: {hop0:?}");

    // IPv6 inside: the same paths, the outer header's next header 41.
    let before = agent_a.status().unwrap()["stamp"]["stamped"]
        .as_u64()
        .unwrap();
    let at_r = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let transfer = tcp_transfer_to(
        &arb.a,
        &arb.b,
        B_ADDR6.parse::<Ipv6Addr>().unwrap().into(),
        5002,
        50 * MIB,
        &SendOptions::default(),
    )
    .expect("50 MiB from A to B over IPv6");
    let at_r = at_r.finish().unwrap();
    assert!(transfer.intact(), "digest differs over IPv6");
    eprintln!(
        "IPv6: 50 MiB in {:.2} s: {:.0} Mbit/s",
        transfer.seconds,
        transfer.mbit_per_s()
    );
    // Per path, the IPv6-in-IPv6 frames from A (a frame read after R shifted its list, see
    // above, names none).
    let mut per_path = [0u64; PATHS as usize];
    let mut plain6 = 0;
    for f in &at_r.frames {
        if f.len() < 54 || f[12..14] != [0x86, 0xDD] || f[22..38] != a6.octets() {
            continue;
        }
        match srv6(f) {
            Some(o) if o.inner_next == 41 => {
                if let Some(p) = lists.iter().position(|l| *l == o.dst) {
                    per_path[p] += 1;
                    assert_eq!(o.mark.map(|m| m.0[0]), Some(p as u8), "IPv6 inside: marked");
                }
            }
            _ if f[20] == 6 => plain6 += 1,
            _ => {}
        }
    }
    eprintln!("IPv6 in IPv6 at R per path: {per_path:?}");
    assert_eq!(
        plain6, 0,
        "TCP over IPv6 from A at R without the outer header"
    );
    let (lo, hi) = (
        per_path.iter().min().unwrap(),
        per_path.iter().max().unwrap(),
    );
    assert!(*lo > 10_000 && hi - lo <= lo / 100, "{per_path:?}");
    let a = agent_a.status().unwrap();
    assert!(a["stamp"]["stamped"].as_u64().unwrap() - before >= per_path.iter().sum::<u64>());
    assert_eq!(
        a["stamp"]["too_big"], 0,
        "every IPv6 packet fit once encapsulated"
    );

    assert_eq!(agent_a.stop(), Some(0));
    assert_eq!(agent_b.stop(), Some(0));
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert!(
        !arb.a.ip(&["-6", "route"]).unwrap().contains("fd00:5a::/96"),
        "the stop removed the IPv6 route it added"
    );
}
