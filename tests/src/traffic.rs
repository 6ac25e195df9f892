//! TCP transfers between namespaces whose bytes are checked end to end with a digest.
//!
//! The digest is XXH3-128: a corrupted, lost or duplicated byte changes it with overwhelming
//! probability (the data is not adversarial), at about a tenth of SHA-256's CPU per byte. On a
//! 2-core machine, SHA-256 of every byte at both ends took 5.7% of the CPUs in a 25 Mbit/s
//! per-link permutation (XXH3: 0.98%), time taken from the fabric it measures.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use xxhash_rust::xxh3::Xxh3;

use crate::{Error, NetNs, Result};

/// Socket settings of the sending side.
#[derive(Clone, Debug)]
pub struct SendOptions {
    /// `TCP_CONGESTION`; cubic is the loss-based behaviour the SOPA paper argues about.
    pub congestion: &'static str,
    /// Force DF on every packet (`IP_PMTUDISC_DO`), as PMTU discovery would.
    pub dont_fragment: bool,
    /// Give up when no byte moves for this long.
    pub stall_timeout: Duration,
    /// Bind the client to this source port (to choose the flow's 5-tuple, and so its hash).
    pub source_port: Option<u16>,
    /// MPTCP sockets (`IPPROTO_MPTCP`) on both ends instead of TCP.
    pub mptcp: bool,
    /// Cap the sender's rate (`SO_MAX_PACING_RATE`, bytes per second): a flow that leaves the
    /// links below their rate.
    pub pacing_bytes_per_s: Option<u64>,
    /// Ends the transfer early, whole, once set: the sender stops after the chunk in hand and
    /// both ends hash what was sent ([`Transfer::bytes`] says how much). A phase that needs a
    /// flow only while it measures something stops it there instead of waiting for its end.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Default for SendOptions {
    fn default() -> Self {
        Self {
            congestion: "cubic",
            dont_fragment: true,
            stall_timeout: Duration::from_secs(10),
            source_port: None,
            mptcp: false,
            pacing_bytes_per_s: None,
            stop: None,
        }
    }
}

/// Sets a [`SendOptions::stop`] flag when dropped: transfers started with it end (whole) once
/// the code that needed them returns, or fails and unwinds.
pub struct StopWhenDropped(pub std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopWhenDropped {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What both ends of a transfer hash the bytes into (XXH3-128, big-endian).
pub type Digest = [u8; 16];

#[derive(Clone, Debug)]
pub struct Transfer {
    pub bytes: u64,
    pub seconds: f64,
    pub sent_digest: Digest,
    pub received_digest: Digest,
    /// The sender's TCP_INFO at the end of the transfer.
    pub tcp: TcpStats,
}

/// What the sender's kernel says about the connection (TCP_INFO).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct TcpStats {
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Reordering events the sender detected (`tcpi_reord_seen`).
    pub reord_seen: u32,
    /// The connection's reordering threshold at the end (`tcpi_reordering`).
    pub reordering: u32,
    pub segs_out: u32,
    /// Retransmission timeouts over the connection's life (`tcpi_total_rto`, Linux 6.7+).
    pub rtos: u16,
    /// MPTCP sockets: the subflows the path manager added beside the first (MPTCP_INFO), at the
    /// end of the transfer; `None` for TCP.
    pub mptcp_subflows: Option<u8>,
    /// MPTCP sockets: the connection fell back to plain TCP (the peer did not speak MPTCP).
    pub mptcp_fallback: bool,
}

/// `SOL_MPTCP` and its `MPTCP_INFO` option (linux/mptcp.h).
const SOL_MPTCP: libc::c_int = 284;
const MPTCP_INFO: libc::c_int = 1;
const MPTCP_INFO_FLAG_FALLBACK: u32 = 1;

/// (additional subflows, fallen back to TCP) of an MPTCP socket, from `struct mptcp_info`:
/// `mptcpi_subflows` is its first byte, `mptcpi_flags` the u32 at offset 8.
fn mptcp_info(fd: i32) -> Option<(u8, bool)> {
    let mut info = [0u8; 12];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: getsockopt into a buffer of the length we pass.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            SOL_MPTCP,
            MPTCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 || len < 12 {
        return None;
    }
    let flags = u32::from_ne_bytes(info[8..12].try_into().expect("4 bytes"));
    Some((info[0], flags & MPTCP_INFO_FLAG_FALLBACK != 0))
}

fn tcp_stats(fd: i32) -> TcpStats {
    // SAFETY: TCP_INFO fills a tcp_info of the size we pass.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return TcpStats::default();
    }
    TcpStats {
        total_retrans: info.tcpi_total_retrans,
        reord_seen: info.tcpi_reord_seen,
        reordering: info.tcpi_reordering,
        segs_out: info.tcpi_segs_out,
        rtos: info.tcpi_total_rto,
        mptcp_subflows: None,
        mptcp_fallback: false,
    }
}

/// The TCP counters of `ns` (`/proc/net/netstat` TcpExt and `/proc/net/snmp` Tcp), by name.
pub fn tcp_counters(ns: &NetNs) -> Result<std::collections::BTreeMap<String, u64>> {
    ns.run(|| {
        let mut out = std::collections::BTreeMap::new();
        for file in [
            "/proc/thread-self/net/netstat",
            "/proc/thread-self/net/snmp",
        ] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for pair in lines.chunks(2) {
                let [names, values] = pair else { continue };
                let (Some((group, names)), Some((_, values))) =
                    (names.split_once(':'), values.split_once(':'))
                else {
                    continue;
                };
                for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
                    if let Ok(v) = v.parse::<u64>() {
                        out.insert(format!("{group}.{n}"), v);
                    }
                }
            }
        }
        out
    })
}

impl Transfer {
    pub fn intact(&self) -> bool {
        self.sent_digest == self.received_digest
    }

    pub fn mbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.seconds / 1e6
    }
}

fn setsockopt<T>(fd: i32, level: i32, name: i32, value: &T) -> std::io::Result<()> {
    // SAFETY: a valid fd and a pointer to a live value of the given size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Deterministic pseudo-random bytes (xorshift64), so payloads are not trivially compressible.
fn fill(buf: &mut [u8], state: &mut u64) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

const IPPROTO_MPTCP: i32 = 262;

/// A listening socket on `at`, TCP or MPTCP.
fn listen_on(at: SocketAddr, mptcp: bool) -> std::io::Result<TcpListener> {
    use std::os::fd::FromRawFd as _;
    if !mptcp {
        return TcpListener::bind(at);
    }
    let SocketAddr::V4(at) = at else {
        return Err(std::io::Error::other("IPv4 only"));
    };
    let addr = sockaddr_in(*at.ip(), at.port());
    // SAFETY: a fresh socket owned by the listener built from it; a valid sockaddr_in.
    unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            IPPROTO_MPTCP,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let listener = TcpListener::from_raw_fd(fd);
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32)?;
        if libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), SOCKADDR_LEN) != 0
            || libc::listen(fd, 64) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(listener)
    }
}

const SOCKADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;

fn sockaddr_in(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    }
}

/// How long a connect may take. SYNs dropped at a congested 10 Mbit/s queue are TCP's to
/// retry (1, 3, 7, 15 s ...), and the flow's completion time includes them, as it would for
/// an application: the bound only guards against a fabric that never answers.
const CONNECT_WITHIN: Duration = Duration::from_secs(60);

/// A connection to `to`, TCP or MPTCP, from local port `port` when given.
fn connect(port: Option<u16>, to: SocketAddr, mptcp: bool) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd as _;
    if !mptcp && port.is_none() {
        return TcpStream::connect_timeout(&to, CONNECT_WITHIN);
    }
    let SocketAddr::V4(to) = to else {
        return Err(std::io::Error::other("IPv4 only"));
    };
    let proto = if mptcp { IPPROTO_MPTCP } else { 0 };
    // SAFETY: a fresh socket owned by the stream built from it (closed on every error path by
    // that stream's drop); valid sockaddr_in values of SOCKADDR_LEN bytes.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, proto);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        if let Some(p) = port {
            setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32)?;
            let local = sockaddr_in(Ipv4Addr::UNSPECIFIED, p);
            if libc::bind(
                fd,
                (&local as *const libc::sockaddr_in).cast(),
                SOCKADDR_LEN,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        let remote = sockaddr_in(*to.ip(), to.port());
        if libc::connect(
            fd,
            (&remote as *const libc::sockaddr_in).cast(),
            SOCKADDR_LEN,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// The receiving end of one transfer: reads until EOF, hashing, then replies with the hash.
pub fn receive(mut conn: TcpStream, stall: Duration) -> Result<Digest> {
    conn.set_read_timeout(Some(stall))
        .map_err(|e| Error::io("setting a timeout", e))?;
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            // A read on a socket with a receive time-out is never restarted after a signal
            // handler ran (signal(7)), SA_RESTART or not: a child process of this one ending
            // (SIGCHLD, which a tokio runtime here handles) interrupts it.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("receiving (stalled?)", e)),
        };
        hasher.update(&buf[..n]);
    }
    let digest = hasher.digest128().to_be_bytes();
    conn.write_all(&digest)
        .map_err(|e| Error::io("replying", e))?;
    Ok(digest)
}

/// A server for any number of transfers at once on `at` (TCP or MPTCP), one thread each, until
/// the process ends. Calls `ready` once it listens.
pub fn serve(at: SocketAddr, mptcp: bool, stall: Duration, ready: impl FnOnce()) -> Result<()> {
    let listener = listen_on(at, mptcp).map_err(|e| Error::io(format!("binding {at}"), e))?;
    ready();
    loop {
        let (conn, _) = listener.accept().map_err(|e| Error::io("accepting", e))?;
        std::thread::spawn(move || {
            // A failed transfer shows at its sender; the server goes on.
            let _ = receive(conn, stall);
        });
    }
}

/// A socket time-out (EAGAIN or ETIMEDOUT) as [`Error::Stalled`], any other error as I/O.
fn stalled_or(
    e: std::io::Error,
    what: &str,
    moved: u64,
    total: u64,
    stall: Duration,
    context: impl FnOnce() -> String,
) -> Error {
    if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        Error::Stalled {
            what: what.into(),
            moved,
            total,
            stall,
        }
    } else {
        Error::io(context(), e)
    }
}

/// Waits for one connection on `listener` for at most `within`, so a sender that never comes
/// cannot leave the server's thread blocked.
pub fn accept_within(listener: &TcpListener, within: Duration) -> Result<TcpStream> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("setting the listener non-blocking", e))?;
    let deadline = Instant::now() + within;
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false)
                    .map_err(|e| Error::io("setting the connection blocking", e))?;
                return Ok(conn);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Failed(format!(
                        "no sender connected within {within:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(Error::io("accepting", e)),
        }
    }
}

/// What the sending end saw of one transfer.
#[derive(Clone, Debug)]
pub struct Sent {
    /// Bytes sent: all that were asked, or fewer where [`SendOptions::stop`] ended it early.
    pub bytes: u64,
    pub sent_digest: Digest,
    pub echoed_digest: Digest,
    pub seconds: f64,
    pub tcp: TcpStats,
}

/// Sends `bytes` of reproducible pseudo-random data to `to` and waits for the receiver's hash.
/// Runs in the calling thread's network namespace.
pub fn send(to: SocketAddr, bytes: u64, opts: &SendOptions) -> Result<Sent> {
    let start = Instant::now();
    let mut conn = connect(opts.source_port, to, opts.mptcp)
        .map_err(|e| Error::io(format!("connecting to {to}"), e))?;
    let fd = conn.as_raw_fd();
    let cc = opts.congestion.as_bytes();
    // SAFETY: TCP_CONGESTION takes the name's bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as u32,
        )
    };
    if rc != 0 {
        return Err(Error::io(
            format!("TCP_CONGESTION {}", opts.congestion),
            std::io::Error::last_os_error(),
        ));
    }
    // MPTCP sockets take no IP_MTU_DISCOVER (the subflows do PMTU discovery themselves).
    // IPv6 never fragments in the network: the option is IPv4's.
    if opts.dont_fragment && !opts.mptcp && to.is_ipv4() {
        setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &libc::IP_PMTUDISC_DO,
        )
        .map_err(|e| Error::io("IP_MTU_DISCOVER", e))?;
    }
    if let Some(rate) = opts.pacing_bytes_per_s {
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE, &rate)
            .map_err(|e| Error::io("SO_MAX_PACING_RATE", e))?;
    }
    conn.set_write_timeout(Some(opts.stall_timeout))
        .map_err(|e| Error::io("timeout", e))?;
    conn.set_read_timeout(Some(opts.stall_timeout))
        .map_err(|e| Error::io("timeout", e))?;
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ bytes;
    let mut left = bytes;
    let stopped = || {
        opts.stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
    };
    while left > 0 && !stopped() {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n], &mut state);
        hasher.update(&buf[..n]);
        conn.write_all(&buf[..n]).map_err(|e| {
            stalled_or(
                e,
                "sending",
                bytes - left,
                bytes,
                opts.stall_timeout,
                || format!("sending ({} of {bytes} bytes sent)", bytes - left),
            )
        })?;
        left -= n as u64;
    }
    // MPTCP subflows close once the data is acknowledged: count them while the data flows.
    let mptcp_before = opts.mptcp.then(|| mptcp_info(conn.as_raw_fd()));
    conn.shutdown(std::net::Shutdown::Write)
        .map_err(|e| Error::io("shutdown", e))?;
    let mut echoed = Digest::default();
    conn.read_exact(&mut echoed).map_err(|e| {
        stalled_or(
            e,
            "waiting for the receiver's hash",
            bytes,
            bytes,
            opts.stall_timeout,
            || "waiting for the receiver's hash".into(),
        )
    })?;
    let mut tcp = tcp_stats(conn.as_raw_fd());
    if let Some(before) = mptcp_before {
        // A socket whose MPTCP_INFO cannot be read counts as fallen back: the column must not
        // silently measure TCP. The most subflows seen, before the end or at it.
        let after = mptcp_info(conn.as_raw_fd());
        let subflows = before.into_iter().chain(after).map(|i| i.0).max();
        let fallback = before.is_none_or(|i| i.1) && after.is_none_or(|i| i.1);
        tcp.mptcp_subflows = Some(subflows.unwrap_or(0));
        tcp.mptcp_fallback = fallback;
    }
    Ok(Sent {
        bytes: bytes - left,
        sent_digest: hasher.digest128().to_be_bytes(),
        echoed_digest: echoed,
        seconds: start.elapsed().as_secs_f64(),
        tcp,
    })
}

/// Sends `bytes` from `src` to a server in `dst` listening on `addr:port`, and returns what both
/// ends hashed. The server replies with its hash after the sender's EOF, so a returned transfer
/// has fully arrived.
pub fn tcp_transfer(
    src: &NetNs,
    dst: &NetNs,
    addr: Ipv4Addr,
    port: u16,
    bytes: u64,
    opts: &SendOptions,
) -> Result<Transfer> {
    tcp_transfer_to(src, dst, addr.into(), port, bytes, opts)
}

/// [`tcp_transfer`] to an address of either family.
pub fn tcp_transfer_to(
    src: &NetNs,
    dst: &NetNs,
    addr: std::net::IpAddr,
    port: u16,
    bytes: u64,
    opts: &SendOptions,
) -> Result<Transfer> {
    let listen = SocketAddr::from((addr, port));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stall = opts.stall_timeout;
    let mptcp = opts.mptcp;
    let server = dst.spawn(move || -> Result<Digest> {
        let listener =
            listen_on(listen, mptcp).map_err(|e| Error::io(format!("binding {listen}"), e))?;
        let _ = ready_tx.send(());
        // The sender connects within its connect time-out (5 s; a blocking connect from a
        // chosen port or over MPTCP gives up after the kernel's SYN retries, about 2 min).
        let conn = accept_within(&listener, Duration::from_secs(150))?;
        receive(conn, stall)
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| Error::Failed(format!("the server on {listen} did not start")))?;
    let opts = opts.clone();
    let sent = src.run(move || send(listen, bytes, &opts))?;
    let received = server
        .join()
        .map_err(|_| Error::Failed("the server thread panicked".into()))?
        .and_then(|r| r);
    // A failed sender names what its receiver saw too (it ends within its stall time-out).
    let (sent, received) = match (sent, received) {
        (Ok(s), Ok(r)) => (s, r),
        (Err(e), Ok(_)) => return Err(e),
        (Err(e), Err(r)) => {
            return Err(Error::Failed(format!("{e}; the receiver: {r}")));
        }
        (Ok(_), Err(r)) => return Err(r),
    };
    if sent.echoed_digest != received {
        return Err(Error::Failed(
            "the receiver's reply does not match its own hash".into(),
        ));
    }
    Ok(Transfer {
        bytes: sent.bytes,
        seconds: sent.seconds,
        sent_digest: sent.sent_digest,
        received_digest: received,
        tcp: sent.tcp,
    })
}
