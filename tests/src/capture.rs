//! Packet capture on one interface of a namespace through an AF_PACKET socket: the frames the
//! interface received, truncated to their headers.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use crate::{Error, NetNs, Result};

/// Whether a captured Ethernet frame is IPv4 with options in its header (IHL above 5).
pub fn has_ipv4_options(frame: &[u8]) -> bool {
    frame.len() > 14 && frame[12..14] == [8, 0] && frame[14] & 0x0f != 5
}

/// The IPv4 options and TCP payload length of a captured TCP frame from `src`. Frames are
/// truncated to their headers, so only header slices are parsed.
pub fn tcp_from(frame: &[u8], src: std::net::Ipv4Addr) -> Option<(Vec<u8>, usize)> {
    if frame.len() < 14 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&frame[14..]).ok()?;
    if ip.source_addr() != src || ip.protocol() != etherparse::IpNumber::TCP {
        return None;
    }
    let tcp = etherparse::TcpHeaderSlice::from_slice(&frame[14 + ip.slice().len()..]).ok()?;
    let payload = usize::from(ip.total_len()).saturating_sub(ip.slice().len() + tcp.slice().len());
    Some((unmarked(ip.options()), payload))
}

/// A captured frame of the SRv6 encoding, read as its parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Srv6Frame {
    pub src: std::net::Ipv6Addr,
    /// The uSID list as the frame carried it when captured.
    pub dst: std::net::Ipv6Addr,
    pub flow_label: u32,
    /// The outer header's payload length (the mark's 8 bytes included).
    pub payload_len: u16,
    /// What is inside: 4 (IPv4) or 41 (IPv6).
    pub inner_next: u8,
    /// The path meter's mark: the path's hop bytes and the period's color.
    pub mark: Option<([u8; 2], u8)>,
    /// Where the inner packet starts in the frame.
    pub inner: usize,
}

/// An IPv6 frame with IPv4 or IPv6 inside (after the meter's mark, if it has one); `None` for
/// anything else, such as neighbour discovery.
pub fn srv6(frame: &[u8]) -> Option<Srv6Frame> {
    use sopa_common::srv6::{MARK_LEN, NEXTHDR_DEST, NEXTHDR_IPV4, NEXTHDR_IPV6, read_mark};
    const OUTER: usize = 14 + sopa_common::srv6::IPV6_HLEN;
    if frame.len() < OUTER || frame[12..14] != [0x86, 0xDD] {
        return None;
    }
    let (inner_next, mark, inner) = if frame[20] == NEXTHDR_DEST {
        let h: &[u8; MARK_LEN] = frame.get(OUTER..OUTER + MARK_LEN)?.try_into().ok()?;
        let (next, hops, color) = read_mark(h)?;
        (next, Some((hops, color)), OUTER + MARK_LEN)
    } else {
        (frame[20], None, OUTER)
    };
    if inner_next != NEXTHDR_IPV4 && inner_next != NEXTHDR_IPV6 {
        return None;
    }
    let src: [u8; 16] = frame[22..38].try_into().ok()?;
    let dst: [u8; 16] = frame[38..54].try_into().ok()?;
    Some(Srv6Frame {
        src: src.into(),
        dst: dst.into(),
        flow_label: u32::from_be_bytes([0, frame[15] & 0xF, frame[16], frame[17]]),
        payload_len: u16::from_be_bytes([frame[18], frame[19]]),
        inner_next,
        mark,
        inner,
    })
}

/// IPv4 options with the path meter's period mark taken off our option's first hop byte (the
/// path it names is the same in either period).
pub fn unmarked(options: &[u8]) -> Vec<u8> {
    let mut o = options.to_vec();
    if o.len() == 4
        && o[0] == sopa_common::wire::OPTION_TYPE
        && o[1] == sopa_common::wire::OPTION_LEN
    {
        o[2] &= !sopa_common::maps::meter::COLOR;
    }
    o
}

/// IPv4 IDs (16 bits) of packets in capture order, unwrapped to a monotonic counter: each ID
/// is taken as the value nearest the previous one.
pub fn unwrap_ids(packets: &[(u16, u8, usize)]) -> Vec<Sent> {
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

/// A packet in send order: (unwrapped IPv4 ID, path, payload bytes).
pub type Sent = (i64, u8, usize);

/// Consecutive data packets in send order (by unwrapped IPv4 ID) from `(id, path, payload)`
/// triples, and those where the path did not advance by one (mod `paths`): the round robin's
/// breaks, with the packets around each.
pub fn cycle_breaks(stamped: &[(u16, u8, usize)], paths: u8) -> (usize, Vec<(Sent, Sent)>) {
    let mut in_send_order = unwrap_ids(stamped);
    in_send_order.retain(|&(_, _, payload)| payload > 0);
    in_send_order.sort_unstable();
    let (mut pairs, mut breaks) = (0, Vec::new());
    for w in in_send_order.windows(2) {
        if w[1].0 == w[0].0 + 1 {
            pairs += 1;
            if w[1].1 != (w[0].1 + 1) % paths {
                breaks.push((w[0], w[1]));
            }
        }
    }
    (pairs, breaks)
}

/// The TCP payload length of a data frame to `port` as a receiving stack sees it (after
/// `xdp_strip` and GRO): a plain IPv4 or IPv6 packet, its length the merged skb's (`None`:
/// another frame, or one without data).
pub fn tcp_data_to(frame: &[u8], port: u16) -> Option<usize> {
    let (ip_len, l4, total) = match frame.get(12..14)? {
        [0x08, 0x00] => {
            let ihl = usize::from(frame.get(14)? & 0x0F) * 4;
            let tot = usize::from(u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]));
            (ihl, 14 + ihl, tot)
        }
        [0x86, 0xDD] => {
            let plen = usize::from(u16::from_be_bytes([*frame.get(18)?, *frame.get(19)?]));
            (40, 54, 40 + plen)
        }
        _ => return None,
    };
    let tcp = frame.get(l4..l4 + 20)?;
    if u16::from_be_bytes([tcp[2], tcp[3]]) != port {
        return None;
    }
    let data = total.checked_sub(ip_len + usize::from(tcp[12] >> 4) * 4)?;
    (data > 0).then_some(data)
}

/// Bytes kept of every frame: Ethernet, IPv4 with options, TCP with options.
pub const SNAPLEN: u32 = 128;

pub struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Result<Captured>>>>,
}

#[derive(Debug, Default)]
pub struct Captured {
    /// Received frames (not the interface's own transmissions), in arrival order.
    pub frames: Vec<Vec<u8>>,
    /// When the kernel received each frame (`SIOCGSTAMPNS`, the realtime clock).
    pub times: Vec<std::time::SystemTime>,
    /// Frames the kernel dropped because the socket could not keep up.
    pub dropped: u32,
}

impl Capture {
    /// Starts capturing the frames `iface` in `ns` receives. Returns once the socket is bound.
    pub fn start(ns: &NetNs, iface: &str) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let iface = iface.to_owned();
        let flag = Arc::clone(&stop);
        let thread = ns.spawn(move || {
            let socket = match open(&iface) {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            read_until(&socket, &flag)
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(Error::Failed(format!("starting a capture: {e}"))),
            Err(_) => Err(Error::Failed("the capture thread died".into())),
        }
    }

    /// Stops the capture and returns what it saw.
    pub fn finish(mut self) -> Result<Captured> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("finished once");
        thread
            .join()
            .map_err(|_| Error::Failed("the capture thread panicked".into()))??
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn last_err(what: &str) -> Error {
    Error::io(what.to_owned(), std::io::Error::last_os_error())
}

fn open(iface: &str) -> Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket calls; the fd is owned right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if fd < 0 {
        return Err(last_err("socket(AF_PACKET)"));
    }
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(iface).expect("no NUL in interface names");
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(last_err(&format!("interface {iface}")));
    }
    // A one-instruction classic BPF filter: accept, truncated to SNAPLEN.
    let mut filter = [libc::sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k: SNAPLEN,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: filter.as_mut_ptr(),
    };
    let buf: i32 = 256 << 20;
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    let opts: [(i32, i32, *const libc::c_void, usize); 3] = [
        (
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const prog).cast(),
            size_of::<libc::sock_fprog>(),
        ),
        (
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const buf).cast(),
            size_of::<i32>(),
        ),
        (
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>(),
        ),
    ];
    for (level, name, value, len) in opts {
        if unsafe { libc::setsockopt(socket.as_raw_fd(), level, name, value, len as u32) } != 0 {
            return Err(last_err("setsockopt on the capture socket"));
        }
    }
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = proto;
    addr.sll_ifindex = index as i32;
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&raw const addr).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc != 0 {
        return Err(last_err("bind(AF_PACKET)"));
    }
    Ok(socket)
}

/// The kernel's receive time of the frame `socket` returned last.
fn received_at(socket: &OwnedFd) -> std::time::SystemTime {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    /// `SIOCGSTAMPNS` (linux/sockios.h; libc does not define it).
    const SIOCGSTAMPNS: libc::c_ulong = 0x8907;
    // SAFETY: SIOCGSTAMPNS fills a timespec.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), SIOCGSTAMPNS as _, &raw mut ts) };
    if rc != 0 {
        return std::time::SystemTime::now();
    }
    std::time::UNIX_EPOCH + std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn read_until(socket: &OwnedFd, stop: &AtomicBool) -> Result<Captured> {
    let mut captured = Captured::default();
    let mut buf = vec![0u8; 65536];
    let mut idle_after_stop = 0;
    // When the reader first saw the stop: frames the kernel received later are not read (a
    // capture of a flow that goes on would otherwise never end).
    let mut stopped_at: Option<std::time::SystemTime> = None;
    loop {
        if stopped_at.is_none() && stop.load(Ordering::Relaxed) {
            stopped_at = Some(std::time::SystemTime::now());
        }
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: buffers we own, with their sizes.
        let n = unsafe {
            libc::recvfrom(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut from).cast(),
                &mut len,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                // Drain what is queued before honouring a stop.
                if stop.load(Ordering::Relaxed) {
                    idle_after_stop += 1;
                    if idle_after_stop >= 2 {
                        break;
                    }
                }
                continue;
            }
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("recvfrom on the capture socket", err));
        }
        let at = received_at(socket);
        if stopped_at.is_some_and(|s| at > s) {
            break;
        }
        if from.sll_pkttype != libc::PACKET_OUTGOING {
            captured.frames.push(buf[..n as usize].to_vec());
            captured.times.push(at);
        }
    }
    let mut stats = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    let mut len = size_of::<libc::tpacket_stats>() as u32;
    // SAFETY: PACKET_STATISTICS fills a tpacket_stats.
    unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&raw mut stats).cast(),
            &mut len,
        )
    };
    captured.dropped = stats.tp_drops;
    Ok(captured)
}

/// The path meter's colors in captured SRv6 frames, judged against the TAI clock: a mark's
/// color is its period's parity, which the agent turns within an eighth of a period.
#[derive(Debug, Default)]
pub struct MarkColors {
    /// Marked frames per color.
    pub colors: [u64; 2],
    /// Marks far enough from a period's turn to be judged (an eighth after it, a sixteenth
    /// before the next).
    pub judged: u64,
    /// The judged marks with the other period's color: (period, color).
    pub wrong: Vec<(i128, u8)>,
    /// From the first marked frame to the last, in nanoseconds.
    pub span_ns: i128,
}

/// Judges the colors of the frames `keep` accepts among `c`'s, for a meter of `period`.
pub fn mark_colors(
    c: &Captured,
    period: std::time::Duration,
    keep: impl Fn(&Srv6Frame) -> bool,
) -> MarkColors {
    let unix_ns = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128)
    };
    // CLOCK_TAI minus the realtime clock, read back to back: the receive times moved onto TAI.
    let offset = i128::from(sopa_agent::meter::tai_ns()) - unix_ns(std::time::SystemTime::now());
    let t = period.as_nanos() as i128;
    let mut out = MarkColors::default();
    let (mut first, mut last) = (None, 0);
    for (frame, at) in c.frames.iter().zip(&c.times) {
        let Some(f) = srv6(frame).filter(&keep) else {
            continue;
        };
        let Some((_, color)) = f.mark else {
            continue;
        };
        out.colors[usize::from(color & 1)] += 1;
        let tai = unix_ns(*at) + offset;
        first.get_or_insert(tai);
        last = tai;
        if (t / 8..t - t / 16).contains(&tai.rem_euclid(t)) {
            out.judged += 1;
            if i128::from(color) != (tai / t) & 1 {
                out.wrong.push((tai / t, color));
            }
        }
    }
    out.span_ns = first.map_or(0, |f| last - f);
    out
}

impl std::fmt::Display for MarkColors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} marks per color over {:.2} s, {} judged against TAI, {} of the other period's \
             color",
            self.colors,
            self.span_ns as f64 / 1e9,
            self.judged,
            self.wrong.len()
        )
    }
}

impl MarkColors {
    /// Panics unless every judged mark has its period's color, at least `least` were judged,
    /// and marks spanning more than two periods came in both colors.
    pub fn assert_by_tai(&self, least: u64, period: std::time::Duration) {
        assert!(
            self.wrong.is_empty(),
            "{} of {} marks carry the other period's color (period, color): {:?}",
            self.wrong.len(),
            self.judged,
            &self.wrong[..self.wrong.len().min(8)]
        );
        assert!(self.judged >= least, "{} marks judged", self.judged);
        if self.span_ns > 2 * period.as_nanos() as i128 {
            assert!(
                self.colors.iter().all(|c| *c > 0),
                "{} ns of marks, all of one color: {:?}",
                self.span_ns,
                self.colors
            );
        }
    }
}
