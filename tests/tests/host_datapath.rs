//! The host datapath on a real routed path: A - R - B, R a plain Linux router, agents on A and
//! B. Needs root; every namespace, process and file is removed on drop, also on failure.

use std::{io::Read as _, net::TcpStream, process::Command, time::Duration};

use etherparse::{Ipv4HeaderSlice, TcpHeaderSlice};
use sopa_testbed::{
    agent::Agent,
    arb::{A_PREFIX, Arb, B_PREFIX},
    bins,
    capture::Capture,
    traffic::{SendOptions, tcp_transfer},
};

const PATHS: u8 = 3;
const MIB: u64 = 1 << 20;

/// The IPv4 options and TCP payload length of a captured TCP frame from `src`. Frames are
/// truncated to their headers, so only header slices are parsed.
fn tcp_from(frame: &[u8], src: std::net::Ipv4Addr) -> Option<(Vec<u8>, usize)> {
    if frame.len() < 14 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = Ipv4HeaderSlice::from_slice(&frame[14..]).ok()?;
    if ip.source_addr() != src || ip.protocol() != etherparse::IpNumber::TCP {
        return None;
    }
    let tcp = TcpHeaderSlice::from_slice(&frame[14 + ip.slice().len()..]).ok()?;
    let payload = usize::from(ip.total_len()).saturating_sub(ip.slice().len() + tcp.slice().len());
    Some((ip.options().to_vec(), payload))
}

/// IPv4 IDs (16 bits) of packets in capture order, unwrapped to a monotonic counter: each ID
/// is taken as the value nearest the previous one.
fn unwrap_ids(packets: &[(u16, u8, usize)]) -> Vec<(i64, u8, usize)> {
    let mut last: Option<i64> = None;
    packets
        .iter()
        .map(|&(id, hop, payload)| {
            let value = match last {
                None => i64::from(id),
                Some(prev) => prev + i64::from(id.wrapping_sub(prev as u16) as i16),
            };
            last = Some(value);
            (value, hop, payload)
        })
        .collect()
}

fn metrics(agent_ns: &sopa_testbed::NetNs) -> String {
    agent_ns
        .run(|| {
            let mut conn = TcpStream::connect_timeout(
                &"127.0.0.1:9470".parse().unwrap(),
                Duration::from_secs(2),
            )
            .expect("the agent serves metrics on loopback");
            std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut body = String::new();
            conn.read_to_string(&mut body).unwrap();
            body
        })
        .unwrap()
}

#[test]
fn option_on_the_wire_at_r_gone_at_b_transfer_intact() {
    let arb = Arb::new("h").expect("build A - R - B");
    let reordering_before = arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap();
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let agent_a = Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        &[],
    )
    .expect("agent on A");
    let agent_b = Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::path_table(A_PREFIX, PATHS),
        &["--no-metrics"],
    )
    .expect("agent on B");
    assert_eq!(arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(), "10");
    assert!(
        arb.a
            .ip(&["route"])
            .unwrap()
            .contains("10.101.2.0/24 via 10.101.1.1"),
        "fabric route added"
    );
    assert!(
        arb.a.ip(&["route"]).unwrap().contains("mtu lock 1496"),
        "with the lowered MTU"
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
    .expect("50 MiB from A to B, DF set on every packet");
    let at_r = at_r.finish().unwrap();
    let at_b = at_b.finish().unwrap();
    assert!(transfer.intact(), "sha256 differs");
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
    assert!(
        full_size > data_packets / 2,
        "full-MSS stamped packets ({full_size}) got through"
    );
    let mut in_send_order = unwrap_ids(&stamped);
    in_send_order.retain(|&(_, _, payload)| payload > 0);
    in_send_order.sort_unstable();
    let (mut pairs, mut breaks) = (0, Vec::new());
    for w in in_send_order.windows(2) {
        if w[1].0 == w[0].0 + 1 {
            pairs += 1;
            if w[1].1 != (w[0].1 + 1) % PATHS {
                breaks.push((w[0], w[1]));
            }
        }
    }
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
    assert!(
        hi - lo <= 1,
        "one flow, round-robin: per-hop counts within one packet: {hop0:?}"
    );
    assert!(a["stamp"]["stamped"].as_u64().unwrap() >= stamped.len() as u64);
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
fn without_the_route_mtu_fix_full_size_df_packets_stall() {
    let arb = Arb::new("m").expect("build A - R - B");
    let _agent_a = Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        &["--keep-route-mtu", "--no-metrics"],
    )
    .unwrap();
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
        stall_timeout: Duration::from_secs(3),
        ..SendOptions::default()
    };
    let result = tcp_transfer(&arb.a, &arb.b, arb.b_addr, 5002, 4 * MIB, &opts);
    // The connection is made (small packets pass), then the first full-size segments, 1504
    // bytes once stamped, are dropped at R: the transfer stalls with data still to send. Any
    // other error (no bind, no connect, a reset) is not this failure.
    match result {
        Err(sopa_testbed::Error::Stalled { moved, total, .. }) => assert!(
            moved < total,
            "stalled only after the last byte was written ({moved} of {total})"
        ),
        other => {
            panic!("1504-byte DF packets must stall the connected transfer at R; got {other:?}")
        }
    }
    // Small packets still pass: the path itself works.
    let small = arb.a.run(|| {
        Command::new("ping")
            .args(["-q", "-c", "1", "-W", "2", "10.101.2.2"])
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
    });
    assert!(small.unwrap().success());
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
        (unknown_iface, 64, "interface \"nosuchif0\" does not exist"),
        (run(&malformed, &[]), 64, "malformed.toml"),
        (run(&bad_prefix, &[]), 64, "not a number from 0 to 32"),
        (run(&bad_hop, &[]), 64, "hop value 300 is out of range"),
        (run(&missing, &[]), 64, "cannot read it"),
        (run(&good, &["--mode", "fast"]), 64, "mode \"fast\""),
        (
            run(&good, &["--tcp-reordering", "0"]),
            64,
            "--tcp-reordering 0",
        ),
        (bad_node, 64, "node name"),
        (
            ["--netns", "sopa-no-such-netns", "status", "--node", node]
                .map(String::from)
                .to_vec(),
            64,
            "sopa-no-such-netns",
        ),
        (
            ["status", "--node", node].map(String::from).to_vec(),
            64,
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
    assert_eq!(got, 64, "{stderr}");
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
}

#[test]
fn a_stop_restores_only_what_still_holds_the_agents_value() {
    let arb = Arb::new("w").expect("build A - R - B");
    let reordering_before = arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap();
    let agent = Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        &["--no-metrics"],
    )
    .expect("agent on A");
    assert_eq!(arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(), "10");
    assert!(
        arb.a.ip(&["route"]).unwrap().contains("mtu lock 1496"),
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
