//! Finding one entropy value (EV) per distinct path to a destination, by probing (`super::probe`)
//! through switches that only hash: each EV tried is sent at the hop limits that tell the
//! paths apart, the routers that answer are its path's signature, and the first EV of each new
//! signature is kept. It stops when the paths the topology expects are all found, or when
//! `patience` EVs in a row found nothing new: after `m` EVs without news, a path a switch picks
//! for a share `1/n` of EVs is still unseen with probability `(1 - 1/n)^m` (with `m = 8n`, under
//! 0.04% per path). Probes are paced: routers answer each prober at a limited rate
//! (`net.ipv6.icmp.ratelimit`), and a probe left unanswered costs the EV it tried.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    net::{Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use super::probe::{ICMP6_DST_UNREACH, ICMP6_TIME_EXCEEDED, Probe, Reply, parse_reply};

/// The two raw sockets of a prober: one sends whole IPv6 packets as written, one receives the
/// ICMPv6 errors that answer them.
pub struct Prober {
    send: OwnedFd,
    recv: OwnedFd,
    next_id: u32,
}

fn check(ret: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if ret < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(ret)
    }
}

fn setsockopt<T>(fd: &OwnedFd, level: i32, name: i32, value: &T, what: &str) -> io::Result<()> {
    // SAFETY: `value` is a live T of the size given.
    let ret = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(ret, what).map(drop)
}

fn sockaddr6(addr: Ipv6Addr) -> libc::sockaddr_in6 {
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut a: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    a.sin6_family = libc::AF_INET6 as u16;
    a.sin6_addr.s6_addr = addr.octets();
    a
}

/// `ICMP6_FILTER` (RFC 3542): a set bit blocks its type.
const ICMP6_FILTER: i32 = 1;

impl Prober {
    /// Opens the sockets (CAP_NET_RAW; CAP_NET_ADMIN for the mark). Every probe carries
    /// `mark`, by which this host's `tc_stamp` leaves it as it is.
    pub fn open(mark: u32) -> io::Result<Self> {
        // SAFETY: plain socket creation; the descriptors are owned from here.
        let send = unsafe {
            OwnedFd::from_raw_fd(check(
                libc::socket(
                    libc::AF_INET6,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::IPPROTO_RAW,
                ),
                "opening a raw IPv6 socket for probes (needs CAP_NET_RAW)",
            )?)
        };
        setsockopt(
            &send,
            libc::SOL_SOCKET,
            libc::SO_MARK,
            &mark,
            "marking probes (needs CAP_NET_ADMIN)",
        )?;
        // SAFETY: as above.
        let recv = unsafe {
            OwnedFd::from_raw_fd(check(
                libc::socket(
                    libc::AF_INET6,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                    libc::IPPROTO_ICMPV6,
                ),
                "opening an ICMPv6 socket for the probes' replies (needs CAP_NET_RAW)",
            )?)
        };
        let mut filter = [u32::MAX; 8];
        for t in [ICMP6_TIME_EXCEEDED, ICMP6_DST_UNREACH] {
            filter[usize::from(t >> 5)] &= !(1 << (t & 31));
        }
        setsockopt(
            &recv,
            libc::IPPROTO_ICMPV6,
            ICMP6_FILTER,
            &filter,
            "filtering ICMPv6 to errors",
        )?;
        Ok(Self {
            send,
            recv,
            next_id: 1,
        })
    }

    /// A fresh probe id.
    pub fn id(&mut self) -> u32 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    pub fn send(&self, p: &Probe) -> io::Result<()> {
        let bytes = p.bytes();
        let to = sockaddr6(p.dst);
        // SAFETY: buffer and address are valid for the call.
        let n = unsafe {
            libc::sendto(
                self.send.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                0,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next reply to a probe of ours before `until`.
    pub fn recv(&self, until: Instant) -> io::Result<Option<Reply>> {
        let mut buf = [0u8; 1280];
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.recv.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if ready == 0 {
                return Ok(None);
            }
            // SAFETY: all-zero is a valid sockaddr_in6.
            let mut from: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            let mut len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            // SAFETY: buffer and address are valid for the call.
            let n = unsafe {
                libc::recvfrom(
                    self.recv.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&raw mut from).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let from = Ipv6Addr::from(from.sin6_addr.s6_addr);
            if let Some(r) = parse_reply(from, &buf[..n as usize]) {
                return Ok(Some(r));
            }
        }
    }
}

/// What to probe: one destination host as the data to it travels.
#[derive(Clone, Debug)]
pub struct Target {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub src4: Ipv4Addr,
    pub dst4: Ipv4Addr,
    /// The next header the switches hash (`entropy::NEXT_IPV4`, TCP, UDP).
    pub next: u8,
    /// The hop limits whose routers tell the paths apart.
    pub hop_limits: Vec<u8>,
    /// How many distinct paths the topology says there are.
    pub expected: usize,
}

/// How fast to probe and how long to keep trying.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Between two probes.
    pub interval: Duration,
    /// For the replies to one EV's probes, after its last probe.
    pub wait: Duration,
    /// EVs in a row that found no new path before giving up on the rest: at least 8 per
    /// expected path (see the module's bound).
    pub patience: usize,
}

/// What probing one target found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Per distinct path (the routers that answered, by hop limit), the first EV that took it.
    pub paths: BTreeMap<Vec<Ipv6Addr>, u32>,
    pub probes: u32,
    /// EVs some of whose probes went unanswered (rate-limited, lost): they count as EVs tried.
    pub unanswered: u32,
    pub took: Duration,
}

impl Found {
    pub fn complete(&self, t: &Target) -> bool {
        self.paths.len() >= t.expected
    }
}

/// Probes `t` with EVs from `labels` until every expected path has one, or `pace.patience` EVs
/// in a row found nothing new, or `labels` runs out.
pub fn discover(
    prober: &mut Prober,
    t: &Target,
    pace: &Pace,
    labels: &mut impl Iterator<Item = u32>,
) -> io::Result<Found> {
    let start = Instant::now();
    let mut found = Found::default();
    let mut since_new = 0;
    let patience = pace.patience.max(8 * t.expected);
    while !found.complete(t) && since_new < patience {
        let Some(label) = labels.next() else { break };
        let mut ids: HashMap<u32, usize> = HashMap::new();
        for (i, hop_limit) in t.hop_limits.iter().enumerate() {
            let id = prober.id();
            ids.insert(id, i);
            prober.send(&Probe {
                src: t.src,
                dst: t.dst,
                src4: t.src4,
                dst4: t.dst4,
                next: t.next,
                label,
                hop_limit: *hop_limit,
                id,
            })?;
            found.probes += 1;
            std::thread::sleep(pace.interval);
        }
        let mut routers: Vec<Option<Ipv6Addr>> = vec![None; t.hop_limits.len()];
        let until = Instant::now() + pace.wait;
        while routers.iter().any(Option::is_none) {
            let Some(r) = prober.recv(until)? else { break };
            // Replies to an earlier EV's probes, late, are not this one's.
            if let Some(&i) = ids.get(&r.id)
                && r.label == label
            {
                routers[i] = Some(r.from);
            }
        }
        let Some(signature) = routers.into_iter().collect::<Option<Vec<_>>>() else {
            found.unanswered += 1;
            since_new += 1;
            continue;
        };
        if let std::collections::btree_map::Entry::Vacant(e) = found.paths.entry(signature) {
            e.insert(label);
            since_new = 0;
        } else {
            since_new += 1;
        }
    }
    found.took = start.elapsed();
    Ok(found)
}

/// EVs to try, spread over the 20 bits (an odd multiplier visits each value once), never 0
/// (the label of a flow that sets none).
pub fn labels(seed: u32) -> impl Iterator<Item = u32> {
    (1..=sopa_common::entropy::LABEL_MASK)
        .map(move |i| (i.wrapping_mul(0x9E37B) ^ seed) & sopa_common::entropy::LABEL_MASK)
        .filter(|l| *l != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_20_bit_values_without_zero() {
        let first: Vec<u32> = labels(7).take(50_000).collect();
        let set: std::collections::BTreeSet<u32> = first.iter().copied().collect();
        assert_eq!(set.len(), first.len(), "no label twice");
        assert!(first.iter().all(|l| *l != 0 && *l <= 0xF_FFFF));
        // Spread: the first 64 fall in at least half of the 64 buckets of their top 6 bits.
        let buckets: std::collections::BTreeSet<u32> =
            first[..64].iter().map(|l| l >> 14).collect();
        assert!(buckets.len() >= 32, "{buckets:?}");
    }
}
