//! LLDP for the cabling check: each agent of an inventory's fabric learns who is cabled to its
//! ports and reports it; the controller compares with the inventory. A switch agent speaks on
//! every port of its plan and listens; a host agent listens on its uplink. One thread per
//! agent on a packet socket (`AF_PACKET`, `SOCK_DGRAM`: the kernel writes the Ethernet header
//! from the group address and the port's own MAC), woken every 100 ms to send when due and to
//! expire neighbours whose TTL ran out.

pub mod frame;

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::CString,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tracing::{debug, info};

use crate::{Error, error::Result};

/// Who is cabled to one port, as its frames say.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Neighbour {
    /// This node's interface.
    pub port: String,
    /// The neighbour's name (its chassis) and its port.
    pub chassis: String,
    pub remote_port: String,
}

/// A running speaker; stopped (and its ports told TTL 0) on drop.
pub struct Speaker {
    ports: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The packet socket, closed on drop.
struct Socket(libc::c_int);

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

fn ifname(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer holds IF_NAMESIZE bytes, as the call requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    s.to_str().ok().map(str::to_owned)
}

fn sockaddr(index: u32) -> libc::sockaddr_ll {
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    a.sll_family = libc::AF_PACKET as u16;
    a.sll_protocol = frame::ETH_P_LLDP.to_be();
    a.sll_ifindex = index as i32;
    a.sll_halen = 6;
    a.sll_addr[..6].copy_from_slice(&frame::NEAREST_BRIDGE);
    a
}

impl Socket {
    fn open() -> Result<Self> {
        // SAFETY: plain socket creation.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                i32::from(frame::ETH_P_LLDP.to_be()),
            )
        };
        if fd < 0 {
            return Err(Error::io(
                "opening an LLDP packet socket (needs CAP_NET_RAW)",
                std::io::Error::last_os_error(),
            ));
        }
        let s = Socket(fd);
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: a timeval of the right size for SO_RCVTIMEO.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Ok(s)
    }

    /// Receives the group address on `index` (a real NIC filters it otherwise).
    fn join(&self, index: u32) {
        // SAFETY: all-zero is a valid packet_mreq.
        let mut m: libc::packet_mreq = unsafe { std::mem::zeroed() };
        m.mr_ifindex = index as i32;
        m.mr_type = libc::PACKET_MR_MULTICAST as u16;
        m.mr_alen = 6;
        m.mr_address[..6].copy_from_slice(&frame::NEAREST_BRIDGE);
        // SAFETY: a packet_mreq of the right size.
        unsafe {
            libc::setsockopt(
                self.0,
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                (&raw const m).cast(),
                std::mem::size_of::<libc::packet_mreq>() as u32,
            )
        };
    }

    fn send(&self, index: u32, payload: &[u8]) -> std::io::Result<()> {
        let a = sockaddr(index);
        // SAFETY: the buffer and address are valid for the call.
        let n = unsafe {
            libc::sendto(
                self.0,
                payload.as_ptr().cast(),
                payload.len(),
                0,
                (&raw const a).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// One frame and the interface it came in on; `None` on the timeout.
    fn recv(&self, buf: &mut [u8]) -> Option<(usize, u32)> {
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: the buffer and address are valid for the call.
        let n = unsafe {
            libc::recvfrom(
                self.0,
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut a).cast(),
                &mut len,
            )
        };
        // Our own frames come back as outgoing: not a neighbour.
        (n > 0 && a.sll_pkttype != libc::PACKET_OUTGOING)
            .then_some((n as usize, a.sll_ifindex as u32))
    }
}

/// What the speaker does.
#[derive(Clone, Debug)]
pub struct SpeakerOptions {
    /// The name every frame carries (the node's name in the topology).
    pub node: String,
    /// Send on the ports (a switch), or only listen (a host).
    pub send: bool,
    pub interval: Duration,
}

impl Speaker {
    /// Starts speaking and listening on `ports` (interface names); `changed` receives the
    /// whole neighbour table whenever it changes (and once at the first frame).
    pub fn start(
        opts: SpeakerOptions,
        ports: Vec<String>,
        changed: tokio::sync::mpsc::Sender<Vec<Neighbour>>,
    ) -> Result<Self> {
        let socket = Socket::open()?;
        let ports = Arc::new(Mutex::new(ports));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&ports), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("lldp".into())
            .spawn(move || run(&socket, &opts, &p, &s, &changed))
            .map_err(|e| Error::io("starting the LLDP thread", e))?;
        info!("LLDP speaking on this node's ports");
        Ok(Self {
            ports,
            stop,
            thread: Some(thread),
        })
    }

    /// The ports to speak on from now (a new plan).
    pub fn set_ports(&self, ports: Vec<String>) {
        *self.ports.lock().unwrap_or_else(|e| e.into_inner()) = ports;
    }
}

impl Drop for Speaker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    socket: &Socket,
    opts: &SpeakerOptions,
    ports: &Mutex<Vec<String>>,
    stop: &AtomicBool,
    changed: &tokio::sync::mpsc::Sender<Vec<Neighbour>>,
) {
    // Neighbours are kept four intervals without a frame, as LLDP's default hold multiplier.
    let ttl = u16::try_from((opts.interval * 4).as_secs().max(1)).unwrap_or(u16::MAX);
    let mut table: BTreeMap<String, (Neighbour, Instant)> = BTreeMap::new();
    let mut joined = BTreeSet::new();
    let mut next_send = Instant::now();
    let mut reported: Option<Vec<Neighbour>> = None;
    let mut buf = [0u8; 1600];
    let send_all = |ttl: u16, joined: &mut BTreeSet<u32>| {
        let names = ports.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for name in names {
            let Some(index) = ifindex(&name) else {
                continue;
            };
            if joined.insert(index) {
                socket.join(index);
            }
            if opts.send
                && let Err(e) = socket.send(index, &frame::encode(&opts.node, &name, ttl))
            {
                debug!(port = %name, error = %e, "LLDP frame not sent");
            }
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next_send {
            send_all(ttl, &mut joined);
            next_send = now + opts.interval;
        }
        if let Some((n, index)) = socket.recv(&mut buf)
            && let Some(du) = frame::decode(&buf[..n])
            && let Some(port) = ifname(index)
        {
            let watched = ports
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&port);
            if watched {
                if du.ttl_s == 0 {
                    table.remove(&port);
                } else {
                    let n = Neighbour {
                        port: port.clone(),
                        chassis: du.chassis,
                        remote_port: du.port,
                    };
                    table.insert(port, (n, now + Duration::from_secs(du.ttl_s.into())));
                }
            }
        }
        table.retain(|_, (_, until)| *until > Instant::now());
        let now_table: Vec<Neighbour> = table.values().map(|(n, _)| n.clone()).collect();
        if reported.as_ref() != Some(&now_table) {
            match changed.try_send(now_table.clone()) {
                Ok(()) => reported = Some(now_table),
                // Full: tried again on the next wake-up. Closed: the agent is stopping.
                Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {}
                Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => break,
            }
        }
    }
    // Leaving: the neighbours forget these ports now, not a TTL later.
    send_all(0, &mut joined);
    debug!(sent_ttl_0 = opts.send, "LLDP stopped");
}
