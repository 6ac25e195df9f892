//! Loss the host's own TCP sees, in the entropy encoding. A link that drops without going down
//! is heard of by no controller, and the labels whose paths cross it lose every packet: with
//! four paths, a quarter of each flow's. The agent reads its connections' TCP state every
//! [`PERIOD`] (sock_diag, the interface `ss` uses) and takes a connection to a host of the
//! fabric as losing when its retransmission timer has fired again (`tcpi_backoff` up since
//! the last period), or when it
//! retransmitted at least [`LOSS_SHARE`] of the segments it sent in the period (and at least
//! [`MIN_RETRANS`]): measured through such a black hole, a flow retransmitted a quarter of its
//! segments with no timeout at all, recovering each loss by SACK. Its destination host is
//! probed again at once (at most every [`HOLD`]): a path whose probes die is not found, and its
//! share of the round robin goes to the paths that were (`super::runner`). Destinations found
//! short of paths are probed again every [`RETRY_INCOMPLETE`], so a path that comes back is
//! taken again.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::{Duration, Instant},
};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags, nlas::Nla},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};
use tracing::warn;

use super::runner::Discovery;

/// How often the agent reads its TCP connections.
pub const PERIOD: Duration = Duration::from_millis(200);
/// A connection that retransmitted this share of what it sent in a period is losing (spraying
/// reorders: about 3% of segments are retransmitted spuriously at 10 Mbit/s per link).
pub const LOSS_SHARE: f64 = 0.05;
/// ... and at least this many segments.
pub const MIN_RETRANS: u32 = 4;
/// A destination probed again for loss is not probed again for it before this.
pub const HOLD: Duration = Duration::from_secs(2);
/// How often destinations found short of paths are probed again.
pub const RETRY_INCOMPLETE: Duration = Duration::from_secs(30);

/// What one connection's `tcp_info` says, for [`Losing`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Backoffs of the retransmission timer since the last progress (0: none fired).
    pub backoff: u8,
    pub total_retrans: u32,
    pub segs_out: u32,
}

/// A connection: its source port, destination address and port.
pub type Conn = (u16, IpAddr, u16);

/// The connections' last samples.
#[derive(Default)]
pub struct Losing {
    last: HashMap<Conn, Sample>,
}

impl Losing {
    /// The destinations of the connections in `now` that are losing, against their samples of
    /// the last period; remembers `now` for the next.
    pub fn update(&mut self, now: Vec<(Conn, Sample)>) -> BTreeSet<IpAddr> {
        let mut losing = BTreeSet::new();
        let mut next = HashMap::with_capacity(now.len());
        for (key, s) in now {
            // The timer fired again since the last period (a backoff that stays up is a peer
            // gone or a zero window, asked about once).
            let timed_out = s.backoff > self.last.get(&key).map_or(0, |was| was.backoff);
            let share = self.last.get(&key).is_some_and(|was| {
                let retrans = s.total_retrans.wrapping_sub(was.total_retrans);
                let sent = s.segs_out.wrapping_sub(was.segs_out).max(1);
                retrans >= MIN_RETRANS && f64::from(retrans) >= LOSS_SHARE * f64::from(sent)
            });
            if timed_out || share {
                losing.insert(key.1);
            }
            next.insert(key, s);
        }
        self.last = next;
        losing
    }
}

/// Every TCP connection of this thread's network namespace that can have data in flight, with
/// its `tcp_info`. Each dump request carries a sequence number of its own (from `seq`): what is
/// left on the socket of a dump an error cut short is skipped.
pub fn connections(socket: &Socket, seq: &mut u32) -> io::Result<Vec<(Conn, Sample)>> {
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        *seq = seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = *seq;
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::INFO,
                states: StateFlags::ESTABLISHED
                    | StateFlags::FIN_WAIT1
                    | StateFlags::CLOSE_WAIT
                    | StateFlags::LAST_ACK,
                socket_id: if family == AF_INET {
                    SocketId::new_v4()
                } else {
                    SocketId::new_v6()
                },
            })
            .into(),
        );
        request.finalize();
        let mut buf = vec![0; request.buffer_len()];
        request.serialize(&mut buf);
        socket.send(&buf, 0)?;
        let mut rx = Vec::with_capacity(64 * 1024);
        'dump: loop {
            rx.clear();
            let n = socket.recv(&mut rx, 0)?;
            let mut at = 0;
            while at < n {
                let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&rx[at..n])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = msg.header.length as usize;
                if len == 0 {
                    break;
                }
                // Messages are 4-byte aligned.
                at += (len + 3) & !3;
                if msg.header.sequence_number != *seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => break 'dump,
                    NetlinkPayload::Error(e) => {
                        return Err(io::Error::other(format!("sock_diag: {e:?}")));
                    }
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        let info = r.nlas.iter().find_map(|n| match n {
                            Nla::TcpInfo(t) => Some(t),
                            _ => None,
                        });
                        if let Some(t) = info {
                            let id = &r.header.socket_id;
                            out.push((
                                (id.source_port, id.destination_address, id.destination_port),
                                Sample {
                                    backoff: t.backoff,
                                    total_retrans: t.total_retrans,
                                    segs_out: t.segs_out,
                                },
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

/// The fabric host an address names: an IPv4 address (or one mapped into IPv6), or the IPv4
/// address an IPv6 one of the fabric's /96 (`fabric6`) embeds.
pub fn fabric_host(addr: IpAddr, fabric6: Ipv6Addr) -> Option<Ipv4Addr> {
    match addr {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return Some(v4);
            }
            let o = a.octets();
            (o[..12] == fabric6.octets()[..12] && fabric6 != Ipv6Addr::UNSPECIFIED)
                .then(|| Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        }
    }
}

/// Reads this thread's network namespace's TCP connections every [`PERIOD`] and has
/// `discovery` probe again the destination hosts of those losing, and every
/// [`RETRY_INCOMPLETE`] those found short of paths; ends when `discovery` is dropped.
fn watch(discovery: std::sync::Weak<Discovery>, socket: Socket) {
    let mut losing = Losing::default();
    let mut held: BTreeMap<Ipv4Addr, Instant> = BTreeMap::new();
    let mut retried = Instant::now();
    let mut failing = false;
    let mut seq = 0;
    loop {
        std::thread::sleep(PERIOD);
        let Some(d) = discovery.upgrade() else { return };
        // Not (yet) in the entropy encoding: nothing to probe, nothing to read.
        let fabric6 = d.fabric6();
        if fabric6 == Ipv6Addr::UNSPECIFIED {
            continue;
        }
        let now = Instant::now();
        held.retain(|_, until| *until > now);
        let peers = match connections(&socket, &mut seq) {
            Ok(c) => {
                failing = false;
                losing.update(c)
            }
            Err(e) => {
                if !failing {
                    warn!(%e, "reading the TCP connections for loss");
                }
                failing = true;
                BTreeSet::new()
            }
        };
        let losing: BTreeSet<Ipv4Addr> = peers
            .into_iter()
            .filter_map(|a| fabric_host(a, fabric6))
            .filter(|h| d.is_destination(*h) && !held.contains_key(h))
            .collect();
        for h in &losing {
            held.insert(*h, now + HOLD);
        }
        if !losing.is_empty() {
            d.reprobe(losing, true);
        }
        if now.duration_since(retried) >= RETRY_INCOMPLETE {
            retried = now;
            let short: BTreeSet<Ipv4Addr> = d.incomplete().into_iter().collect();
            if !short.is_empty() {
                d.reprobe(short, false);
            }
        }
    }
}

/// Starts the loss watch of `discovery` on a thread of its own, in the caller's network
/// namespace.
pub fn start(discovery: &Arc<Discovery>) {
    let weak = Arc::downgrade(discovery);
    let socket = Socket::new(NETLINK_SOCK_DIAG).and_then(|mut s| {
        s.bind_auto()?;
        s.connect(&SocketAddr::new(0, 0))?;
        Ok(s)
    });
    let started = socket.and_then(|socket| {
        std::thread::Builder::new()
            .name("sopa-loss".into())
            .spawn(move || watch(weak, socket))
    });
    if let Err(e) = started {
        warn!(%e, "no loss watch: labels over a link that drops silently stay until the next topology");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(backoff: u8, total_retrans: u32, segs_out: u32) -> Sample {
        Sample {
            backoff,
            total_retrans,
            segs_out,
        }
    }

    #[test]
    fn a_connection_is_losing_by_timeout_or_by_its_share_of_retransmissions() {
        let a: IpAddr = Ipv4Addr::new(10, 1, 0, 2).into();
        let b: IpAddr = Ipv4Addr::new(10, 1, 0, 3).into();
        let mut l = Losing::default();
        // First sight: only a timeout counts (no period to compare with).
        let first = l.update(vec![
            ((1, a, 7000), sample(0, 50, 1000)),
            ((2, b, 7000), sample(1, 0, 10)),
        ]);
        assert_eq!(first, BTreeSet::from([b]));
        // a: 30 of 400 sent retransmitted (7.5%); b's timer still backed off once: not again.
        let second = l.update(vec![
            ((1, a, 7000), sample(0, 80, 1400)),
            ((2, b, 7000), sample(1, 0, 10)),
        ]);
        assert_eq!(second, BTreeSet::from([a]));
        // a: 10 of 400 (2.5%, reordering's spurious retransmissions): not losing; nor 3 of 10.
        let third = l.update(vec![
            ((1, a, 7000), sample(0, 90, 1800)),
            ((2, b, 7000), sample(1, 0, 10)),
        ]);
        assert!(third.is_empty());
        let fourth = l.update(vec![
            ((1, a, 7000), sample(0, 93, 1810)),
            ((2, b, 7000), sample(1, 0, 10)),
        ]);
        assert!(fourth.is_empty(), "under MIN_RETRANS");
        // b's timer fired again: losing again.
        let again = l.update(vec![((2, b, 7000), sample(2, 0, 10))]);
        assert_eq!(again, BTreeSet::from([b]));
    }

    #[test]
    fn fabric_addresses_name_their_host() {
        let fabric6: Ipv6Addr = "fd00:5a::".parse().unwrap();
        let v6: Ipv6Addr = "fd00:5a::a01:2".parse().unwrap();
        let h = Some(Ipv4Addr::new(10, 1, 0, 2));
        assert_eq!(fabric_host(v6.into(), fabric6), h);
        assert_eq!(fabric_host(Ipv4Addr::new(10, 1, 0, 2).into(), fabric6), h);
        let mapped: Ipv6Addr = "::ffff:10.1.0.2".parse().unwrap();
        assert_eq!(fabric_host(mapped.into(), fabric6), h);
        assert_eq!(fabric_host(v6.into(), "fd00:5b::".parse().unwrap()), None);
        assert_eq!(fabric_host(v6.into(), Ipv6Addr::UNSPECIFIED), None);
    }

    /// Needs only a network namespace (any): the dump parses, and a connection of this test's
    /// own, on loopback, is in it.
    #[test]
    fn the_dump_reads_this_namespaces_connections() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let mut s = Socket::new(NETLINK_SOCK_DIAG).unwrap();
        s.bind_auto().unwrap();
        s.connect(&SocketAddr::new(0, 0)).unwrap();
        let all = connections(&s, &mut 0).unwrap();
        assert!(
            all.iter()
                .any(|((_, dst, dport), _)| *dport == port && dst.is_loopback()),
            "{all:?}"
        );
    }
}
