//! All-pairs TCP reachability across a fabric: a listener in every host, a connection from every
//! host to every other.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use crate::{NetNs, Result};

/// Returns the (from, to) pairs that could not connect.
pub fn all_pairs_tcp(hosts: &[(&NetNs, Ipv4Addr)], port: u16) -> Result<Vec<(Ipv4Addr, Ipv4Addr)>> {
    let mut listeners = Vec::new();
    for (ns, addr) in hosts {
        let listen = SocketAddr::from((*addr, port));
        let l = ns
            .run(move || TcpListener::bind(listen))?
            .map_err(|e| crate::Error::io(format!("listening on {listen}"), e))?;
        l.set_nonblocking(true).ok();
        listeners.push(l);
    }
    let mut failed = Vec::new();
    for (ns, from) in hosts {
        let targets: Vec<Ipv4Addr> = hosts
            .iter()
            .map(|(_, a)| *a)
            .filter(|a| a != from)
            .collect();
        let refused = ns.run(move || {
            targets
                .into_iter()
                .filter(|to| {
                    TcpStream::connect_timeout(
                        &SocketAddr::from((*to, port)),
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
