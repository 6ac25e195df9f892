//! Helpers of the resilience tests and benchmark: a guard that detaches what an agent left
//! attached, a steady UDP probe, many short flows through a raw socket, per-packet checks of
//! captures, and an agent's memory.

use std::{
    collections::HashSet,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    NetNs,
    agent::Agent,
    arb::{A_PREFIX, Arb, B_PREFIX},
    bins,
    capture::has_ipv4_options,
};

/// Paths per destination in the A - R - B tables.
pub const PATHS: u8 = 3;

/// Runs `sopa-agent detach` for a node on drop, so nothing stays attached after the test.
pub struct DetachOnDrop<'a> {
    pub ns: &'a NetNs,
    pub node: String,
}

impl DetachOnDrop<'_> {
    pub fn detach(&self) -> std::process::Output {
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

/// Frames from `src` at R of protocol `proto`: (all, with an IPv4 option).
pub fn from_a(frames: &[Vec<u8>], src: Ipv4Addr, proto: u8) -> (usize, usize) {
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

/// A steady UDP probe from A to B at `pps`; returns (sent, received distinct).
pub fn probe(arb: &Arb, pps: u64, stop: Arc<AtomicBool>, port: u16) -> (u64, u64) {
    let p = Probe::start(arb, pps, port);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = p.finish();
    (r.sent, r.received.len() as u64)
}

/// A steady UDP probe from A to B, each packet numbered, so that the packets sent during a
/// window (a restart) can be told from the others: [`Probe::mark`] before and after the window,
/// then [`ProbeResult::lost_in`].
pub struct Probe {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    sender: Option<std::thread::JoinHandle<crate::Result<()>>>,
    receiver: Option<std::thread::JoinHandle<crate::Result<HashSet<u64>>>>,
}

impl Drop for Probe {
    /// A test that fails half-way stops the probe's threads too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a [`Probe`] sent and which of its packets arrived.
pub struct ProbeResult {
    pub sent: u64,
    pub received: HashSet<u64>,
}

impl ProbeResult {
    /// Packets numbered in `window` that did not arrive.
    pub fn lost_in(&self, window: std::ops::Range<u64>) -> u64 {
        window.filter(|seq| !self.received.contains(seq)).count() as u64
    }
}

impl Probe {
    /// Starts the receiver in B and the sender in A; returns once the receiver listens.
    pub fn start(arb: &Arb, pps: u64, port: u16) -> Self {
        Self::between(&arb.a, &arb.b, arb.b_addr, pps, port)
    }

    /// Starts the receiver in `dst` (at `addr`) and the sender in `src`; returns once the
    /// receiver listens.
    pub fn between(src: &NetNs, dst: &NetNs, addr: Ipv4Addr, pps: u64, port: u16) -> Self {
        let to = SocketAddr::from((addr, port));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let (stop_rx, count) = (Arc::clone(&stop), Arc::clone(&received));
        let receiver = dst.spawn(move || {
            let sock = UdpSocket::bind(to).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            // A deep buffer, so a receiver thread that the machine's other work delays for a
            // while does not drop what the datapath delivered.
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
            let mut seen = HashSet::new();
            let mut buf = [0u8; 64];
            let mut quiet_since: Option<Instant> = None;
            loop {
                match sock.recv(&mut buf) {
                    Ok(n) if n >= 8 => {
                        seen.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
                        count.store(seen.len() as u64, Ordering::Relaxed);
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
            seen
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the probe's receiver starts");
        let (stop_tx, sent_tx) = (Arc::clone(&stop), Arc::clone(&sent));
        let sender = src.spawn(move || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            let start = Instant::now();
            let mut seq = 0u64;
            while !stop_tx.load(Ordering::Relaxed) {
                let due = (start.elapsed().as_secs_f64() * pps as f64) as u64;
                // A sender the machine delayed catches up at most 32 packets at a time: a
                // burst of thousands would overflow the veth's backlog, a loss that is the
                // machine's, not the datapath's.
                let mut burst = 0;
                while seq < due && burst < 32 {
                    let mut msg = [0u8; 32];
                    msg[..8].copy_from_slice(&seq.to_be_bytes());
                    sock.send_to(&msg, to).unwrap();
                    seq += 1;
                    burst += 1;
                    sent_tx.store(seq, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        Self {
            stop,
            sent,
            received,
            sender: Some(sender),
            receiver: Some(receiver),
        }
    }

    /// Packets sent so far: the number the next packet will carry.
    pub fn mark(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Waits until `n` more packets than now have arrived at B (at most 30 s).
    pub fn wait_received(&self, n: u64) {
        let target = self.received.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.received.load(Ordering::Relaxed) < target {
            assert!(
                Instant::now() < deadline,
                "the probe's packets stopped arriving at B"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the sender, waits for the last packets, and returns what arrived.
    pub fn finish(mut self) -> ProbeResult {
        self.stop.store(true, Ordering::Relaxed);
        self.sender
            .take()
            .expect("running")
            .join()
            .expect("the probe's sender")
            .expect("in A");
        let received = self
            .receiver
            .take()
            .expect("running")
            .join()
            .expect("the probe's receiver")
            .expect("in B");
        ProbeResult {
            sent: self.sent.load(Ordering::Relaxed),
            received,
        }
    }
}

pub fn rss_kib(pid: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

/// `flows` UDP flows from A to B, `per_flow` packets each, every flow its own 5-tuple (source
/// port x destination port), written through a raw socket at about `pps`.
pub fn short_flows(arb: &Arb, flows: u32, per_flow: u32, pps: u64) -> u64 {
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

/// Waits until A's fabric interface has sent `bytes` more than now (the transfer runs).
pub fn wait_sent(arb: &Arb, bytes: u64) {
    let start = arb.a.tx_bytes(&arb.a_if).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while arb.a.tx_bytes(&arb.a_if).unwrap() < start + bytes {
        assert!(Instant::now() < deadline, "the transfer did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The agent on A, with the path table towards B's rack.
pub fn start_a(arb: &Arb, extra: &[&str]) -> Agent {
    Agent::start(
        &arb.a,
        arb.a.name(),
        &arb.a_if,
        &Arb::path_table(B_PREFIX, PATHS),
        extra,
    )
    .expect("agent on A")
}

/// The agent on B, with the path table towards A's rack.
pub fn start_b(arb: &Arb) -> Agent {
    Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::path_table(A_PREFIX, PATHS),
        &["--no-metrics"],
    )
    .expect("agent on B")
}

/// The (tc_stamp, xdp_strip) program ids behind an agent's pinned links.
pub fn prog_ids(agent: &Agent) -> (u64, u64) {
    let st = agent.status().unwrap();
    (
        st["stamp_prog_id"].as_u64().expect("a stamp program"),
        st["strip_prog_id"].as_u64().expect("a strip program"),
    )
}

/// The pin folder of a host agent node.
pub fn pin_dir(node: &str) -> std::path::PathBuf {
    std::path::Path::new("/sys/fs/bpf/sopa").join(node)
}
