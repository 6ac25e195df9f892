//! All-pairs TCP reachability across a fabric: a listener in every host, a connection from every
//! host to every other.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use crate::{NetNs, Result};

/// Returns the (from, to) pairs that could not connect (IPv4 or IPv6 addresses).
pub fn all_pairs_tcp<A>(hosts: &[(&NetNs, A)], port: u16) -> Result<Vec<(A, A)>>
where
    A: Copy + PartialEq + Into<std::net::IpAddr> + Send + 'static,
{
    let mut listeners = Vec::new();
    for (ns, addr) in hosts {
        let listen = SocketAddr::from(((*addr).into(), port));
        let l = ns
            .run(move || TcpListener::bind(listen))?
            .map_err(|e| crate::Error::io(format!("listening on {listen}"), e))?;
        l.set_nonblocking(true).ok();
        listeners.push(l);
    }
    let mut failed = Vec::new();
    for (ns, from) in hosts {
        let targets: Vec<A> = hosts
            .iter()
            .map(|(_, a)| *a)
            .filter(|a| a != from)
            .collect();
        let refused = ns.run(move || {
            targets
                .into_iter()
                .filter(|to| {
                    TcpStream::connect_timeout(
                        &SocketAddr::from(((*to).into(), port)),
                        Duration::from_secs(2),
                    )
                    .is_err()
                })
                .collect::<Vec<_>>()
        })?;
        failed.extend(refused.into_iter().map(|to| (*from, to)));
    }
    drop(listeners);
    Ok(failed)
}

/// Sends `n` UDP datagrams from `src` to `addr:port` in `dst`, each from a socket of its own (a
/// new 5-tuple), each carrying the IPv4 options `options` set with `IP_OPTIONS`, as any
/// process with CAP_NET_RAW may. Returns how many arrived (waiting until all did, at most 10
/// s).
pub fn udp_with_ip_options(
    src: &NetNs,
    dst: &NetNs,
    addr: Ipv4Addr,
    port: u16,
    n: usize,
    options: &[u8],
) -> Result<usize> {
    use std::os::fd::AsRawFd as _;
    let at = SocketAddr::from((addr, port));
    let receiver = dst
        .run(move || std::net::UdpSocket::bind(at))?
        .map_err(|e| crate::Error::io(format!("binding {at}"), e))?;
    receiver
        .set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| crate::Error::io("a read timeout", e))?;
    // Room for every datagram: they are read only once all are sent.
    let bytes: libc::c_int = 16 << 20;
    // SAFETY: setsockopt with a valid fd and an int of the given size.
    let rc = unsafe {
        libc::setsockopt(
            receiver.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(crate::Error::io(
            "SO_RCVBUFFORCE",
            std::io::Error::last_os_error(),
        ));
    }
    // One plain datagram first, received before the others go: the neighbours on the way are
    // resolved, so none of the N waits in (or overflows) an ARP queue.
    src.run(move || {
        std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| s.send_to(&u64::MAX.to_be_bytes(), at))
            .map_err(|e| crate::Error::io(format!("sending to {at}"), e))
    })??;
    let mut buf = [0u8; 64];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(8) = receiver.recv(&mut buf) {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(crate::Error::Failed(format!(
                "nothing reached {at} in 10 s"
            )));
        }
    }
    let options = options.to_vec();
    src.run(move || {
        for i in 0..n {
            let sock = std::net::UdpSocket::bind("0.0.0.0:0")
                .map_err(|e| crate::Error::io("binding a sender", e))?;
            // SAFETY: setsockopt with a valid fd and a buffer of the given length.
            let rc = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_IP,
                    libc::IP_OPTIONS,
                    options.as_ptr().cast(),
                    options.len() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(crate::Error::io(
                    format!("IP_OPTIONS {options:02x?}"),
                    std::io::Error::last_os_error(),
                ));
            }
            sock.send_to(&(i as u64).to_be_bytes(), at)
                .map_err(|e| crate::Error::io(format!("sending to {at}"), e))?;
        }
        Ok(())
    })??;
    let mut seen = std::collections::HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < n && std::time::Instant::now() < deadline {
        if let Ok(8) = receiver.recv(&mut buf) {
            let i = u64::from_be_bytes(buf[..8].try_into().expect("8 bytes"));
            if i != u64::MAX {
                seen.insert(i);
            }
        }
    }
    Ok(seen.len())
}
