//! The host datapath on a real routed path: A - R - B, R a plain Linux router, agents on A and
//! B. Needs root; every namespace, process and file is removed on drop, also on failure.

use std::{os::fd::AsRawFd as _, process::Command, time::Duration};

use sopa_testbed::{
    agent::Agent,
    arb::{A_PREFIX, Arb, B_PREFIX},
    bins,
    capture::{Capture, cycle_breaks, tcp_from},
    resilience::{PATHS, start_a, start_b},
    traffic::{SendOptions, tcp_transfer},
};

const MIB: u64 = 1 << 20;

fn metrics(agent_ns: &sopa_testbed::NetNs) -> String {
    agent_ns
        .http_get("127.0.0.1:9470", "/metrics")
        .expect("the agent serves metrics on loopback")
        .1
}

#[test]
fn option_on_the_wire_at_r_gone_at_b_transfer_intact() {
    let arb = Arb::new("h").expect("build A - R - B");
    let reordering_before = arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap();
    let routes_before = arb.a.ip(&["route"]).unwrap();
    // Per packet, the paper's unit, so the hops cycle packet by packet on the wire (the
    // default flowcell is host_resilience's).
    let agent_a = start_a(&arb, &["--granularity", "packet"]);
    let agent_b = start_b(&arb);
    assert_eq!(arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(), "10");
    assert!(
        arb.a
            .ip(&["route"])
            .unwrap()
            .contains("10.101.2.0/24 via 10.101.1.1"),
        "fabric route added"
    );
    let lowered = arb.a.ip(&["route"]).unwrap();
    assert!(
        lowered.contains("mtu 1496") && !lowered.contains("mtu lock"),
        "with the lowered MTU, not locked (a locked MTU clears DF):\n{lowered}"
    );

    let at_r = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    // What B sends, as R receives it.
    let from_b_at_r = Capture::start(&arb.r, &arb.r_b_if).unwrap();
    let at_b = Capture::start(&arb.b, &arb.b_if).unwrap();
    let transfer = tcp_transfer(
        &arb.a,
        &arb.b,
        arb.b_addr,
        5001,
        50 * MIB,
        // The socket's default (IP_PMTUDISC_WANT): DF comes from the route, which the
        // agent's MTU must leave on.
        &SendOptions {
            dont_fragment: false,
            ..SendOptions::default()
        },
    )
    .expect("50 MiB from A to B");
    let at_r = at_r.finish().unwrap();
    let from_b_at_r = from_b_at_r.finish().unwrap();
    let at_b = at_b.finish().unwrap();
    assert!(transfer.intact(), "digest differs");
    eprintln!(
        "50 MiB in {:.2} s: {:.0} Mbit/s",
        transfer.seconds,
        transfer.mbit_per_s()
    );

    // At R: every TCP packet from A carries our option, and the hop byte cycles 0, 1, 2 in the
    // order A sent the packets. R's arrival order is not that order (veth hands packets to
    // per-CPU backlogs), but the IPv4 ID, which A's socket increments per packet, is. Only
    // segments carrying data are compared: the last ACK comes from the kernel's reply socket
    // once A's socket is in TIME_WAIT, stamped like the rest but with IPv4 ID 0.
    let mut stamped = Vec::new();
    let mut data_packets = 0;
    let mut full_size = 0;
    let mut without_df = 0;
    for frame in &at_r.frames {
        let Some((options, payload)) = tcp_from(frame, arb.a_addr) else {
            continue;
        };
        assert_eq!(
            options.len(),
            4,
            "a TCP packet from A without the option at R"
        );
        assert_eq!(&options[..2], &[0x9E, 4]);
        assert_eq!(options[3], 0xFF, "single-decision paths carry hop1 = 0xFF");
        assert!(options[2] < PATHS);
        stamped.push((
            u16::from_be_bytes([frame[18], frame[19]]),
            options[2],
            payload,
        ));
        if payload > 0 {
            data_packets += 1;
            // DF (the IPv4 flags' second bit): path MTU discovery stays on over the route.
            if frame[20] & 0x40 == 0 {
                without_df += 1;
            }
        }
        // 1496 (route MTU) + 4: a full-MSS packet grown by the option.
        if u16::from_be_bytes([frame[16], frame[17]]) == 1500 {
            full_size += 1;
        }
    }
    assert!(
        data_packets > 30_000,
        "saw {data_packets} data packets at R"
    );
    assert_eq!(
        without_df, 0,
        "data packets from A without DF at R (of {data_packets})"
    );
    assert!(
        full_size > data_packets / 2,
        "full-MSS stamped packets ({full_size}) got through"
    );
    let (pairs, breaks) = cycle_breaks(&stamped, PATHS);
    assert!(pairs > 30_000, "{pairs} consecutive packets");
    assert!(
        breaks.is_empty(),
        "hop values do not cycle in send order ({pairs} consecutive pairs; (id, hop, payload) \
         around each break: {breaks:?})"
    );
    let mut per_hop = [0u64; PATHS as usize];
    stamped
        .iter()
        .for_each(|(_, h, _)| per_hop[usize::from(*h)] += 1);
    eprintln!(
        "at R: {} stamped packets, per hop {per_hop:?}, capture drops {}",
        stamped.len(),
        at_r.dropped
    );

    // B's first two packets, its SYN-ACK (from its request socket) and its first ACK (from the
    // accepted one), take consecutive paths: the accepted socket's round robin begins after
    // the path its SYN-ACK took.
    let hop_and_syn = |f: &[u8]| -> Option<(u8, bool)> {
        let (options, _) = tcp_from(f, arb.b_addr)?;
        let ip = etherparse::Ipv4HeaderSlice::from_slice(&f[14..]).ok()?;
        let tcp = etherparse::TcpHeaderSlice::from_slice(&f[14 + ip.slice().len()..]).ok()?;
        (options.len() == 4).then_some((options[2], tcp.syn()))
    };
    let from_b: Vec<(u8, bool)> = from_b_at_r
        .frames
        .iter()
        .filter_map(|f| hop_and_syn(f))
        .collect();
    let syn_ack = from_b
        .iter()
        .find(|(_, syn)| *syn)
        .expect("B's SYN-ACK at R")
        .0;
    let first_ack = from_b
        .iter()
        .find(|(_, syn)| !*syn)
        .expect("B's first ACK at R")
        .0;
    assert_eq!(
        (first_ack + PATHS - syn_ack) % PATHS,
        1,
        "B's SYN-ACK on path {syn_ack}, its first ACK on {first_ack}"
    );

    // At B's stack (the capture runs after generic XDP): no option left.
    let seen_at_b: Vec<usize> = at_b
        .frames
        .iter()
        .filter_map(|f| tcp_from(f, arb.a_addr))
        .map(|(options, _)| options.len())
        .collect();
    assert!(
        seen_at_b.len() > 30_000,
        "B saw {} packets",
        seen_at_b.len()
    );
    assert!(
        seen_at_b.iter().all(|n| *n == 0),
        "the option reached B's stack"
    );

    // The agents' own counters agree.
    let a = agent_a.status().unwrap();
    let b = agent_b.status().unwrap();
    let hop0: Vec<u64> = (0..PATHS)
        .map(|h| a["hop0"][h.to_string()].as_u64().unwrap_or(0))
        .collect();
    let (lo, hi) = (hop0.iter().min().unwrap(), hop0.iter().max().unwrap());
    // Within one packet of each other, and one more: the connection's round robin lives in its
    // socket's storage, and the ACK its time-wait socket sends (after close, the socket's storage
    // gone) takes the flow's first path outside it. The order on the wire is checked above.
    assert!(
        hi - lo <= 2,
        "one flow, round-robin: per-hop counts within one packet (and a time-wait ACK): {hop0:?}"
    );
    assert!(a["stamp"]["stamped"].as_u64().unwrap() >= stamped.len() as u64);
    // The connection's round robin, cycling above, lived in its socket's storage.
    eprintln!(
        "A's flows: {} in sockets, {}",
        a["stamp"]["socket_flows_created"], a["flow_table"]
    );
    assert_eq!(
        a["stamp"]["socket_flows_created"], 1,
        "A's one connection began its round robin in its socket"
    );
    // B accepted it: its SYN-ACK left from B's request socket on the flow's first path, its
    // ACKs from the accepted socket from the path after, one cycle throughout.
    let b_hop0: Vec<u64> = (0..PATHS)
        .map(|h| b["hop0"][h.to_string()].as_u64().unwrap_or(0))
        .collect();
    eprintln!(
        "B's flows: {} in sockets, {}; per hop {b_hop0:?}",
        b["stamp"]["socket_flows_created"], b["flow_table"]
    );
    assert_eq!(b["stamp"]["socket_flows_created"], 1);
    assert!(
        b_hop0.iter().max().unwrap() - b_hop0.iter().min().unwrap() <= 1,
        "B's acknowledgements, round-robin from its SYN-ACK on: per-hop counts within one \
         packet: {b_hop0:?}"
    );
    assert_eq!(
        a["stamp"]["too_big"], 0,
        "with the lowered route MTU every segment fits once stamped"
    );
    assert!(b["strip"]["stripped"].as_u64().unwrap() >= seen_at_b.len() as u64);
    assert_eq!(a["mode"], "sopa");
    assert_eq!(a["granularity"], "packet");

    let text = metrics(&arb.a);
    assert!(
        text.contains("sopa_stamp_packets_total{reason=\"stamped\"}"),
        "metrics:\n{text}"
    );
    assert!(
        text.contains("sopa_mode{mode=\"sopa\"} 1"),
        "metrics:\n{text}"
    );

    // SIGTERM: detach and restore everything.
    assert_eq!(agent_a.stop(), Some(0));
    assert_eq!(agent_b.stop(), Some(0));
    assert_eq!(
        arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(),
        reordering_before
    );
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert!(
        arb.a
            .ip(&["-d", "link", "show", &arb.a_if])
            .unwrap()
            .contains("gso_max_segs 65535")
    );
    assert!(
        !arb.a
            .ip(&["link", "show", &arb.a_if])
            .unwrap()
            .contains("xdp"),
        "XDP detached"
    );
}

#[test]
fn without_the_route_mtu_fix_full_size_segments_leave_unstamped_never_dropped() {
    let arb = Arb::new("m").expect("build A - R - B");
    // Per packet, so that `too_big` (counted per packet the program sees) counts segments.
    let agent_a = start_a(
        &arb,
        &[
            "--keep-route-mtu",
            "--no-metrics",
            "--granularity",
            "packet",
        ],
    );
    // Both ends without the fix: B's lowered route MTU alone would make it advertise an MSS
    // that fits A's stamped packets.
    let _agent_b = Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::path_table(A_PREFIX, PATHS),
        &["--keep-route-mtu", "--no-metrics"],
    )
    .unwrap();
    let opts = SendOptions {
        stall_timeout: Duration::from_secs(10),
        ..SendOptions::default()
    };
    // Full-size segments are 1500 bytes: stamped they would be 1504 and dropped at R (DF).
    // tc_stamp passes them unstamped instead: the transfer completes, unsprayed, which is
    // why the agent lowers the route MTU.
    let transfer = tcp_transfer(&arb.a, &arb.b, arb.b_addr, 5002, 4 * MIB, &opts)
        .expect("nothing is dropped for the option's sake");
    assert!(transfer.intact(), "digests equal end to end");
    let stamp = agent_a.status().unwrap()["stamp"].clone();
    let full_size = 4 * MIB / 1448;
    let too_big = stamp["too_big"].as_u64().unwrap();
    assert!(
        too_big >= full_size,
        "every full-size segment ({full_size}) passed unstamped as too_big: {stamp}"
    );
}

/// Runs the agent binary with `args` and returns (exit code, stderr).
fn agent_exit(args: &[&str]) -> (i32, String) {
    let out = Command::new(bins::sopa_agent())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let arb = Arb::new("e").expect("build A - R - B");
    let node = arb.a.name();
    let tmp = sopa_testbed::temp_dir(&format!("bad-input-{node}"));
    let dir = tmp.path().to_path_buf();
    let good = dir.join("good.toml");
    std::fs::write(&good, Arb::path_table(B_PREFIX, 2)).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let malformed = write("malformed.toml", "[[destination]\nprefix = 1");
    let bad_prefix = write(
        "prefix.toml",
        "[[destination]]\nprefix = \"10.101.2.0/40\"\npaths = [[0]]",
    );
    let bad_hop = write(
        "hop.toml",
        "[[destination]]\nprefix = \"10.101.2.0/24\"\npaths = [[0], [300]]",
    );
    let unrouted = write(
        "unrouted.toml",
        "[[destination]]\nprefix = \"10.101.2.0/24\"\npaths = [[0]]",
    );
    let good = good.display().to_string();
    let missing = dir.join("missing.toml").display().to_string();

    let before = (
        arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(),
        arb.a.ip(&["route"]).unwrap(),
    );
    let ns = arb.a.name();
    let iface = arb.a_if.as_str();
    // `run` with a path table and extra flags, as owned arguments.
    let run = |paths: &str, extra: &[&str]| -> Vec<String> {
        [
            "--netns", ns, "run", "--node", node, "--iface", iface, "--paths", paths,
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let mut unknown_iface = run(&good, &[]);
    unknown_iface[6] = "nosuchif0".into();
    let mut bad_node = run(&good, &[]);
    bad_node[4] = "../x".into();
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (unknown_iface, 78, "interface \"nosuchif0\" does not exist"),
        (run(&malformed, &[]), 78, "malformed.toml"),
        (run(&bad_prefix, &[]), 78, "not a number from 0 to 32"),
        (run(&bad_hop, &[]), 78, "hop value 300 is out of range"),
        (run(&missing, &[]), 78, "cannot read it"),
        (
            run(&good, &["--mode", "fast"]),
            2,
            "invalid value 'fast' for '--mode",
        ),
        (
            run(&good, &["--tcp-reordering", "0"]),
            78,
            "--tcp-reordering 0",
        ),
        (bad_node, 78, "node name"),
        (
            ["--netns", "sopa-no-such-netns", "status", "--node", node]
                .map(String::from)
                .to_vec(),
            78,
            "sopa-no-such-netns",
        ),
        (
            ["status", "--node", node].map(String::from).to_vec(),
            78,
            "no agent state",
        ),
    ];
    for (args, code, needle) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (got, stderr) = agent_exit(&args);
        assert_eq!(got, *code, "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: expected {needle:?} in: {stderr}"
        );
    }

    // A prefix with no route at all: refused after the datapath loaded, and all of it undone.
    arb.a.ip(&["route", "del", "default"]).unwrap();
    let routes_without_default = arb.a.ip(&["route"]).unwrap();
    let (got, stderr) = agent_exit(&[
        "--netns", ns, "run", "--node", node, "--iface", &arb.a_if, "--paths", &unrouted,
    ]);
    assert_eq!(got, 78, "{stderr}");
    assert!(
        stderr.contains("no route to fabric prefix 10.101.2.0/24"),
        "{stderr}"
    );
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_without_default);
    arb.a
        .ip(&["route", "add", "default", "via", "10.101.1.1"])
        .unwrap();

    // Missing privileges: an unprivileged user is told so, with exit code 77.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(bins::sopa_agent())
        .args(["run", "--node", node, "--iface", "lo", "--paths", &good])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert!(stderr.contains("run as root"), "{stderr}");

    // Nothing was left behind by any of them.
    assert_eq!(
        (
            arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(),
            arb.a.ip(&["route"]).unwrap()
        ),
        before
    );
    assert!(
        !std::path::Path::new(&format!("/sys/fs/bpf/sopa/{node}")).exists(),
        "pins left behind"
    );
    assert!(
        !std::path::Path::new(&format!("/run/sopa/{node}")).exists(),
        "state left behind"
    );
    assert!(
        !arb.a
            .ip(&["link", "show", &arb.a_if])
            .unwrap()
            .contains("xdp")
    );
}

#[test]
fn native_xdp_on_veth_strips_before_the_stack() {
    let arb = Arb::new("n").expect("build A - R - B");
    let _agent_a = sopa_testbed::resilience::start_a(&arb, &["--no-metrics"]);
    let agent_b = Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::path_table(A_PREFIX, PATHS),
        &["--no-metrics", "--xdp-mode", "native"],
    )
    .expect("agent on B with native XDP");
    let link = arb.b.ip(&["-d", "link", "show", &arb.b_if]).unwrap();
    assert!(
        link.contains("prog/xdp id") && !link.contains("xdpgeneric"),
        "native XDP attached to B's veth: {link}"
    );
    let stripped = |a: &Agent| a.status().unwrap()["strip"]["stripped"].as_u64().unwrap();
    let before = stripped(&agent_b);
    let at_b = Capture::start(&arb.b, &arb.b_if).unwrap();
    let t = tcp_transfer(
        &arb.a,
        &arb.b,
        arb.b_addr,
        5011,
        8 * MIB,
        &SendOptions::default(),
    )
    .expect("8 MiB from A to B");
    assert!(t.intact());
    let at_b = at_b.finish().unwrap();
    let seen: Vec<usize> = at_b
        .frames
        .iter()
        .filter_map(|f| tcp_from(f, arb.a_addr))
        .map(|(options, _)| options.len())
        .collect();
    assert!(seen.len() > 1000, "B saw {} packets", seen.len());
    assert!(
        seen.iter().all(|n| *n == 0),
        "the option reached B's stack past native XDP"
    );
    let n = stripped(&agent_b) - before;
    assert!(
        n >= seen.len() as u64,
        "B's program stripped {n} of the {} packets its stack saw",
        seen.len()
    );

    // Reordering is measured only when asked for, and can be asked for at run time.
    let measured = |a: &Agent| {
        let st = a.status().unwrap();
        (
            st["reordering_measured"].as_bool().unwrap(),
            st["strip"]["tcp_data"].as_u64().unwrap(),
        )
    };
    assert_eq!(measured(&agent_b), (false, 0), "not measured by default");
    sopa_testbed::agent::set_reordering(arb.b.name(), true).unwrap();
    let t = tcp_transfer(
        &arb.a,
        &arb.b,
        arb.b_addr,
        5012,
        2 * MIB,
        &SendOptions::default(),
    )
    .expect("2 MiB from A to B");
    assert!(t.intact());
    let (on, data) = measured(&agent_b);
    assert!(on, "measured once turned on");
    assert!(
        data >= 2 * MIB / 1448 / 2,
        "{data} TCP data packets measured of 2 MiB"
    );
    sopa_testbed::agent::set_reordering(arb.b.name(), false).unwrap();
    assert_eq!(
        measured(&agent_b),
        (false, data),
        "off again, the count kept"
    );
}

#[test]
fn a_stop_restores_only_what_still_holds_the_agents_value() {
    let arb = Arb::new("w").expect("build A - R - B");
    let reordering_before = arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap();
    let agent = start_a(&arb, &["--no-metrics"]);
    assert_eq!(arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(), "10");
    assert!(
        arb.a.ip(&["route"]).unwrap().contains("mtu 1496"),
        "the agent's lowered route"
    );
    // While it runs, an operator tunes reordering and a routing daemon rewrites the route.
    arb.a.sysctl("net.ipv4.tcp_reordering", "42").unwrap();
    arb.a
        .ip(&[
            "route",
            "replace",
            B_PREFIX,
            "via",
            "10.101.1.1",
            "mtu",
            "lock",
            "1400",
        ])
        .unwrap();
    assert_eq!(agent.stop(), Some(0));
    assert_eq!(
        arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(),
        "42",
        "the operator's value was kept, not rolled back to {reordering_before}"
    );
    let routes = arb.a.ip(&["route"]).unwrap();
    assert!(
        routes.contains(&format!("{B_PREFIX} via 10.101.1.1")) && routes.contains("mtu lock 1400"),
        "the daemon's route was kept, not deleted as the agent's:\n{routes}"
    );
}

/// How a sender on A fills the link despite the route's lowered MTU.
#[derive(Clone, Copy, Debug)]
enum BigSender {
    /// `IP_PMTUDISC_INTERFACE`: the interface's MTU, DF set.
    Interface,
    /// `IP_PMTUDISC_OMIT`: the interface's MTU, DF clear.
    Omit,
    /// `IP_PMTUDISC_INTERFACE` with UDP GSO (`UDP_SEGMENT`): two 1500-byte datagrams per send,
    /// one GSO packet at `tc_stamp`. The kernel refuses to grow a single packet past the
    /// MTU (`bpf_skb_adjust_room`), but not a GSO packet's segments.
    UdpGso,
    /// A raw socket writing its own IPv4 header (IP_HDRINCL) with DF, `IP_PMTUDISC_INTERFACE`.
    /// (A raw socket left at the default obeys the route's MTU on this kernel: EMSGSIZE with
    /// DF, fragmented before `tc_stamp` without.)
    Raw,
}

/// Sends `count` times datagrams of 1472 bytes (1500 of IP) from A port `sport` to B:5003 the
/// `how` way, one send at a time, each waiting for B's one-byte echoes; returns how many
/// echoes came back.
fn big_datagrams(arb: &Arb, how: BigSender, sport: u16, count: usize) -> usize {
    let (a_addr, b_addr) = (arb.a_addr, arb.b_addr);
    arb.a
        .run(move || {
            let echo = std::net::UdpSocket::bind((a_addr, sport)).unwrap();
            echo.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let raw = matches!(how, BigSender::Raw).then(|| {
                // SAFETY: plain socket calls on a descriptor this closure owns.
                let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
                assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
                unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
            });
            if matches!(how, BigSender::UdpGso) {
                let size: i32 = 1472;
                // SAFETY: setsockopt with an int option on a live socket.
                let rc = unsafe {
                    libc::setsockopt(
                        echo.as_raw_fd(),
                        libc::SOL_UDP,
                        libc::UDP_SEGMENT,
                        (&size as *const i32).cast(),
                        size_of::<i32>() as u32,
                    )
                };
                assert_eq!(rc, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
            }
            let (mode, sender) = match (how, &raw) {
                (BigSender::Omit, _) => (libc::IP_PMTUDISC_OMIT, echo.as_raw_fd()),
                (_, Some(fd)) => (libc::IP_PMTUDISC_INTERFACE, fd.as_raw_fd()),
                _ => (libc::IP_PMTUDISC_INTERFACE, echo.as_raw_fd()),
            };
            {
                // SAFETY: setsockopt with an int option on a live socket.
                let rc = unsafe {
                    libc::setsockopt(
                        sender,
                        libc::IPPROTO_IP,
                        libc::IP_MTU_DISCOVER,
                        (&mode as *const i32).cast(),
                        size_of::<i32>() as u32,
                    )
                };
                assert_eq!(
                    rc,
                    0,
                    "IP_MTU_DISCOVER: {}",
                    std::io::Error::last_os_error()
                );
            }
            let payload = [0x5a; 2 * 1472];
            let (payload, per_send) = match how {
                BigSender::UdpGso => (&payload[..], 2),
                _ => (&payload[..1472], 1),
            };
            let mut back = 0;
            let mut buf = [0u8; 16];
            for _ in 0..count {
                match &raw {
                    None => {
                        echo.send_to(payload, (b_addr, 5003)).unwrap();
                    }
                    Some(fd) => {
                        let mut ip = etherparse::Ipv4Header::new(
                            0,
                            64,
                            etherparse::IpNumber::UDP,
                            a_addr.octets(),
                            b_addr.octets(),
                        )
                        .unwrap();
                        ip.dont_fragment = true;
                        let mut datagram = Vec::new();
                        etherparse::PacketBuilder::ip(etherparse::IpHeaders::Ipv4(
                            ip,
                            Default::default(),
                        ))
                        .udp(sport, 5003)
                        .write(&mut datagram, payload)
                        .unwrap();
                        assert_eq!(datagram.len(), 1500);
                        let to = libc::sockaddr_in {
                            sin_family: libc::AF_INET as u16,
                            sin_port: 0,
                            sin_addr: libc::in_addr {
                                s_addr: u32::from_ne_bytes(b_addr.octets()),
                            },
                            sin_zero: [0; 8],
                        };
                        // SAFETY: sendto with a live buffer and address of the given sizes.
                        let sent = unsafe {
                            libc::sendto(
                                fd.as_raw_fd(),
                                datagram.as_ptr().cast(),
                                datagram.len(),
                                0,
                                (&to as *const libc::sockaddr_in).cast(),
                                size_of::<libc::sockaddr_in>() as u32,
                            )
                        };
                        assert_eq!(sent, 1500, "raw send: {}", std::io::Error::last_os_error());
                    }
                }
                for _ in 0..per_send {
                    if echo.recv(&mut buf).is_ok() {
                        back += 1;
                    }
                }
            }
            back
        })
        .unwrap()
}

#[test]
fn senders_that_ignore_the_route_mtu_get_through_unstamped() {
    let arb = Arb::new("u").expect("build A - R - B");
    let agent_a = start_a(&arb, &["--no-metrics"]);
    let _agent_b = start_b(&arb);
    // B echoes one byte for every full-size datagram, until told to stop.
    let b_addr = arb.b_addr;
    let echo = arb
        .b
        .run(|| std::net::UdpSocket::bind((b_addr, 5003)).unwrap())
        .unwrap();
    // A bound on a hang: the test's own stop message could be lost too.
    echo.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut full = 0usize;
        loop {
            let Ok((n, from)) = echo.recv_from(&mut buf) else {
                return full;
            };
            if n == 1 {
                return full;
            }
            if n == 1472 && buf[..n].iter().all(|&b| b == 0x5a) {
                full += 1;
                echo.send_to(b"k", from).unwrap();
            }
        }
    });
    let frag_creates = |ns: &sopa_testbed::NetNs| -> u64 {
        let snmp = ns
            .run(|| std::fs::read_to_string("/proc/net/snmp").unwrap())
            .unwrap();
        let mut lines = snmp.lines().filter(|l| l.starts_with("Ip:"));
        let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
        let i = names
            .split_whitespace()
            .position(|n| n == "FragCreates")
            .unwrap();
        values.split_whitespace().nth(i).unwrap().parse().unwrap()
    };
    let r_frags = frag_creates(&arb.r);
    const EACH: usize = 20;
    let mut too_big = agent_a.status().unwrap()["stamp"]["too_big"]
        .as_u64()
        .unwrap();
    let senders = [
        (BigSender::Interface, 1),
        (BigSender::Omit, 1),
        (BigSender::Raw, 1),
        (BigSender::UdpGso, 2),
    ];
    for (i, (how, datagrams)) in senders.into_iter().enumerate() {
        let back = big_datagrams(&arb, how, 5010 + i as u16, EACH);
        let stamp = agent_a.status().unwrap()["stamp"].clone();
        let now = stamp["too_big"].as_u64().unwrap();
        assert_eq!(
            (back, now - too_big),
            (EACH * datagrams, EACH as u64),
            "{how:?}: every 1500-byte datagram must arrive, each send passed unstamped as \
             too_big (echoes, too_big); A's tc_stamp counted {stamp}"
        );
        too_big = now;
    }
    assert_eq!(
        frag_creates(&arb.r),
        r_frags,
        "R fragmented a packet: one left A 4 bytes too long"
    );
    arb.a
        .run(|| {
            std::net::UdpSocket::bind((arb.a_addr, 0))
                .unwrap()
                .send_to(b"q", (b_addr, 5003))
                .unwrap()
        })
        .unwrap();
    assert_eq!(server.join().unwrap(), 5 * EACH);
}
