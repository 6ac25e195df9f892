//! Hitless restarts of the host agent on A - R - B (needs root): the datapath's links are
//! pinned, so a killed agent leaves traffic stamped and stripped, and the next agent adopts the
//! datapath by replacing the programs in place; `--keep-attached` does the same on purpose, for
//! upgrades. Every namespace is removed on drop, and what an agent leaves attached is detached
//! by a guard, also on failure.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use sopa_testbed::{
    NetNs,
    agent::Agent,
    arb::{A_PREFIX, Arb, B_PREFIX},
    bins,
    capture::{Capture, has_ipv4_options},
    traffic::{SendOptions, tcp_transfer},
};

const PATHS: u8 = 3;
const MIB: u64 = 1 << 20;

/// Runs `sopa-agent detach` for a node on drop, so nothing stays attached after the test.
struct DetachOnDrop<'a> {
    ns: &'a NetNs,
    node: String,
}

impl DetachOnDrop<'_> {
    fn detach(&self) -> std::process::Output {
        Command::new(bins::sopa_agent())
            .args(["--netns", self.ns.name(), "detach", "--node", &self.node])
            .output()
            .expect("sopa-agent detach")
    }
}

impl Drop for DetachOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

fn start_a(arb: &Arb, extra: &[&str]) -> Agent {
    Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        extra,
    )
    .expect("agent on A")
}

fn start_b(arb: &Arb) -> Agent {
    Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::path_table(A_PREFIX, PATHS),
        &["--no-metrics"],
    )
    .expect("agent on B")
}

fn prog_ids(agent: &Agent) -> (u64, u64) {
    let st = agent.status().unwrap();
    (
        st["stamp_prog_id"].as_u64().expect("a stamp program"),
        st["strip_prog_id"].as_u64().expect("a strip program"),
    )
}

/// Frames from `src` at R of protocol `proto`: (all, with an IPv4 option).
fn from_a(frames: &[Vec<u8>], src: Ipv4Addr, proto: u8) -> (usize, usize) {
    let ours: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|f| {
            f.len() >= 34
                && f[12..14] == [0x08, 0x00]
                && f[14 + 9] == proto
                && f[26..30] == src.octets()
        })
        .collect();
    let stamped = ours.iter().filter(|f| has_ipv4_options(f)).count();
    (ours.len(), stamped)
}

#[test]
fn sigkill_during_a_transfer_loses_nothing_and_the_next_agent_adopts() {
    let arb = Arb::new("k").expect("build A - R - B");
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let reordering_before = arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap();
    // Declared before the agents, so dropped after them (a guard that outlives the agent).
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let _b = start_b(&arb);
    let a = start_a(&arb, &["--no-metrics"]);
    let (stamp_before, strip_before) = prog_ids(&a);

    let (transfer, after_kill, restarted) = std::thread::scope(|s| {
        let t = s.spawn(|| {
            let opts = SendOptions {
                stall_timeout: Duration::from_secs(20),
                ..SendOptions::default()
            };
            tcp_transfer(&arb.a, &arb.b, arb.b_addr, 5101, 200 * MIB, &opts)
        });
        std::thread::sleep(Duration::from_millis(800));
        a.kill();
        // With no agent, the pinned datapath still stamps every packet.
        let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let after_kill = capture.finish().unwrap();
        let restarted = start_a(&arb, &["--no-metrics"]);
        (t.join().unwrap(), after_kill, restarted)
    });
    let transfer = transfer.expect("the transfer survives the kill (no reset, no stall)");
    assert!(transfer.intact(), "sha256 equal end to end");
    let (tcp, stamped) = from_a(&after_kill.frames, arb.a_addr, 6);
    eprintln!(
        "200 MiB in {:.2} s; while no agent ran: {tcp} TCP packets from A at R, {stamped} stamped",
        transfer.seconds
    );
    assert!(tcp > 1000, "the transfer was still running: {tcp}");
    assert_eq!(stamped, tcp, "every packet stamped while no agent ran");

    let st = restarted.status().unwrap();
    assert_eq!(st["adopted"]["how"], "crashed", "{st:#}");
    assert_eq!(st["adopted"]["stamp_prog_replaced"], stamp_before);
    assert_eq!(st["adopted"]["strip_prog_replaced"], strip_before);
    let (stamp_now, strip_now) = prog_ids(&restarted);
    assert_ne!((stamp_now, strip_now), (stamp_before, strip_before));
    assert!(restarted.log().contains("adopted the attached datapath"));
    // The adopting agent owns the first agent's changes: a clean stop restores them all.
    assert_eq!(restarted.stop(), Some(0));
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert_eq!(
        arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(),
        reordering_before
    );
    assert!(!sopa_agent_pins(arb.a.name()).exists(), "pins removed");
}

fn sopa_agent_pins(node: &str) -> std::path::PathBuf {
    std::path::Path::new("/sys/fs/bpf/sopa").join(node)
}

/// A steady UDP probe from A to B at `pps`; returns (sent, received distinct).
fn probe(arb: &Arb, pps: u64, stop: Arc<AtomicBool>, port: u16) -> (u64, u64) {
    let to = SocketAddr::from((arb.b_addr, port));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stop_rx = Arc::clone(&stop);
    let receiver = arb.b.spawn(move || {
        let sock = UdpSocket::bind(to).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        // A deep buffer, so a receiver thread that the machine's other work delays for a while
        // does not drop what the datapath delivered.
        let bytes: libc::c_int = 64 << 20;
        // SAFETY: setsockopt with a valid fd and an int of the given size.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_RCVBUFFORCE");
        ready_tx.send(()).unwrap();
        let mut seen = std::collections::HashSet::new();
        let mut buf = [0u8; 64];
        let mut quiet_since: Option<Instant> = None;
        loop {
            match sock.recv(&mut buf) {
                Ok(n) if n >= 8 => {
                    seen.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
                    quiet_since = None;
                }
                _ => {
                    if stop_rx.load(Ordering::Relaxed) {
                        let q = *quiet_since.get_or_insert_with(Instant::now);
                        if q.elapsed() > Duration::from_millis(500) {
                            break;
                        }
                    }
                }
            }
        }
        seen.len() as u64
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let sent = arb
        .a
        .run(move || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            let start = Instant::now();
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let due = (start.elapsed().as_secs_f64() * pps as f64) as u64;
                while seq < due {
                    let mut msg = [0u8; 32];
                    msg[..8].copy_from_slice(&seq.to_be_bytes());
                    sock.send_to(&msg, to).unwrap();
                    seq += 1;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            seq
        })
        .unwrap();
    (sent, receiver.join().unwrap().unwrap())
}

#[test]
fn keep_attached_then_a_new_agent_upgrades_in_place_without_losing_a_probe_packet() {
    let arb = Arb::new("u").expect("build A - R - B");
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let _b = start_b(&arb);
    let old = start_a(&arb, &["--no-metrics", "--keep-attached"]);
    let (stamp_before, strip_before) = prog_ids(&old);
    let capture = Capture::start(&arb.r, &arb.r_a_if).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, received, kept, new) = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&arb, 10_000, Arc::clone(&stop), 5201));
        std::thread::sleep(Duration::from_millis(700));
        // SIGTERM with --keep-attached: the agent exits, the datapath stays.
        assert_eq!(old.stop(), Some(0));
        let kept = sopa_testbed::agent::status_of(arb.a.name()).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let new = start_a(&arb, &["--no-metrics", "--keep-attached"]);
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, Ordering::Relaxed);
        let (sent, received) = p.join().unwrap();
        (sent, received, kept, new)
    });
    let at_r = capture.finish().unwrap();
    let (udp, stamped) = from_a(&at_r.frames, arb.a_addr, 17);
    eprintln!("probe: {sent} sent, {received} received; at R {udp} UDP, {stamped} stamped");
    assert!(sent > 15_000, "about 10 kpps for about 2 s: {sent}");
    let snmp = arb
        .b
        .run(|| std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap())
        .unwrap();
    let udp_lines: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
    assert_eq!(
        received, sent,
        "no probe packet lost across the upgrade (B's UDP counters: {udp_lines:?})"
    );
    assert_eq!(stamped, udp, "stamped all along, with and without an agent");
    assert_eq!(kept["running"], false);
    assert_eq!(kept["attached"], true);
    assert_eq!(kept["kept_attached"], true);
    let st = new.status().unwrap();
    assert_eq!(st["adopted"]["how"], "kept attached", "{st:#}");
    let (stamp_now, strip_now) = prog_ids(&new);
    assert!(stamp_now != stamp_before && strip_now != strip_before);
    // Left attached again on purpose; `detach` removes the datapath and restores the host.
    assert_eq!(new.stop(), Some(0));
    let out = cleanup.detach();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(arb.a.ip(&["route"]).unwrap(), routes_before);
    assert!(!sopa_agent_pins(arb.a.name()).exists(), "pins removed");
    let again = cleanup.detach();
    assert!(!again.status.success(), "nothing left to detach");
}

fn rss_kib(pid: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

/// `flows` UDP flows from A to B, `per_flow` packets each, every flow its own 5-tuple (source
/// port x destination port), written through a raw socket at about `pps`.
fn short_flows(arb: &Arb, flows: u32, per_flow: u32, pps: u64) -> u64 {
    let (src, dst) = (arb.a_addr, arb.b_addr);
    arb.a
        .run(move || {
            // SAFETY: a raw IPv4 socket (IP_HDRINCL implied), closed at the end of this block.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
            assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
            let to = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(dst.octets()),
                },
                sin_zero: [0; 8],
            };
            let start = Instant::now();
            let mut sent = 0u64;
            for flow in 0..flows {
                let (sport, dport) = (
                    20_000 + (flow % 40_000) as u16,
                    7000 + (flow / 40_000) as u16,
                );
                for _ in 0..per_flow {
                    let mut p = [0u8; 36];
                    p[0] = 0x45;
                    p[2..4].copy_from_slice(&36u16.to_be_bytes());
                    p[8] = 64;
                    p[9] = 17;
                    p[12..16].copy_from_slice(&src.octets());
                    p[16..20].copy_from_slice(&dst.octets());
                    p[20..22].copy_from_slice(&sport.to_be_bytes());
                    p[22..24].copy_from_slice(&dport.to_be_bytes());
                    p[24..26].copy_from_slice(&16u16.to_be_bytes());
                    p[28..36].copy_from_slice(&sent.to_be_bytes());
                    // SAFETY: sendto with a valid buffer and address of the given sizes.
                    let n = unsafe {
                        libc::sendto(
                            fd,
                            p.as_ptr().cast(),
                            p.len(),
                            0,
                            (&to as *const libc::sockaddr_in).cast(),
                            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                        )
                    };
                    assert_eq!(n, 36, "sendto: {}", std::io::Error::last_os_error());
                    sent += 1;
                    if sent.is_multiple_of(500) {
                        let due = Duration::from_secs_f64(sent as f64 / pps as f64);
                        if let Some(wait) = due.checked_sub(start.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                }
            }
            // SAFETY: our own fd.
            unsafe { libc::close(fd) };
            sent
        })
        .unwrap()
}

#[test]
fn a_hundred_thousand_short_flows_lose_nothing_and_the_flow_table_evicts() {
    const FLOWS: u32 = 100_000;
    let arb = Arb::new("f").expect("build A - R - B");
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let b = start_b(&arb);
    let a = start_a(&arb, &["--no-metrics"]);
    let pid = a.status().unwrap()["pid"].as_u64().unwrap();
    let rss_before = rss_kib(pid);
    let stripped = |st: &serde_json::Value| st["strip"]["stripped"].as_u64().unwrap();
    let b_before = stripped(&b.status().unwrap());
    let start = Instant::now();
    let sent = short_flows(&arb, FLOWS, 2, 25_000);
    let took = start.elapsed();
    // Let the last packets land.
    let mut b_after = 0;
    for _ in 0..50 {
        b_after = stripped(&b.status().unwrap());
        if b_after - b_before >= sent {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = a.status().unwrap();
    let ft = &st["flow_table"];
    let rss_after = rss_kib(pid);
    eprintln!(
        "{FLOWS} flows, {sent} packets in {took:?}; B stripped {}; flow table {ft}; agent RSS {rss_before} -> {rss_after} KiB",
        b_after - b_before
    );
    assert!(took < Duration::from_secs(60), "within a minute");
    assert_eq!(
        b_after - b_before,
        sent,
        "every packet arrived, stamped and stripped"
    );
    assert_eq!(
        st["stamp"]["flow_table_full"], 0,
        "an LRU table never refuses a flow"
    );
    assert_eq!(ft["created"].as_u64().unwrap(), u64::from(FLOWS));
    // The kernel's LRU evicts in small batches from per-CPU lists, so a full table sits just
    // under its capacity.
    let (entries, capacity) = (
        ft["entries"].as_u64().unwrap(),
        ft["capacity"].as_u64().unwrap(),
    );
    assert!(
        entries <= capacity && entries * 100 >= capacity * 95,
        "the table is full: {entries} of {capacity}"
    );
    assert_eq!(
        ft["evictions"].as_u64().unwrap(),
        u64::from(FLOWS) - entries,
        "evictions = created - entries"
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "agent memory stays bounded"
    );
}

#[test]
fn pins_of_another_layout_are_refused_until_reset() {
    let arb = Arb::new("l").expect("build A - R - B");
    let _cleanup = DetachOnDrop {
        ns: &arb.a,
        node: arb.a.name().to_owned(),
    };
    let pins = sopa_agent_pins(arb.a.name());
    std::fs::create_dir_all(&pins).unwrap();
    let foreign = pins.join("SOPA_PATHS_V0");
    let out = Command::new("bpftool")
        .args(["map", "create"])
        .arg(&foreign)
        .args([
            "type", "hash", "key", "4", "value", "4", "entries", "1", "name", "sopa_old",
        ])
        .output()
        .expect("bpftool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = match Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        &["--no-metrics"],
    ) {
        Ok(_) => panic!("an agent adopted pins of another layout"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("SOPA_PATHS_V0") && err.contains("--reset") && err.contains("exited"),
        "{err}"
    );
    assert!(foreign.exists(), "refusing changed nothing");
    let a = start_a(&arb, &["--no-metrics", "--reset"]);
    assert!(!foreign.exists(), "--reset removed the other layout's pins");
    assert_eq!(a.stop(), Some(0));
}
