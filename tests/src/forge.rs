//! Frames no host of the fabric sent: SRv6 packets to a host's receive address carrying forged
//! path-meter marks (RFC 9343's option), written straight onto a link with an AF_PACKET socket
//! from the namespace at its other end (past its qdisc, as a misbehaving neighbour would).

use std::net::{Ipv4Addr, Ipv6Addr};

use sopa_common::srv6::{
    ETH_P_IPV6, MARK_LEN, NEXTHDR_DEST, NEXTHDR_IPV4, mark_header, outer_header,
};

use crate::{Error, Result, netns::NetNs};

/// A frame from `src_mac` to `dst_mac`: an outer IPv6 header to `receive`, the meter's mark of
/// path `hops` in period color `color`, and an inner UDP packet from `inner_src` to
/// `inner_dst` (port 9, 8 bytes).
pub fn marked_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    receive: Ipv6Addr,
    (inner_src, inner_dst): (Ipv4Addr, Ipv4Addr),
    hops: [u8; 2],
    color: u8,
) -> Vec<u8> {
    let mut inner = vec![0u8; 20 + 8 + 8];
    inner[0] = 0x45;
    let len = inner.len() as u16;
    inner[2..4].copy_from_slice(&len.to_be_bytes());
    inner[8] = 64;
    inner[9] = 17;
    inner[12..16].copy_from_slice(&inner_src.octets());
    inner[16..20].copy_from_slice(&inner_dst.octets());
    let sum = (0..10)
        .map(|i| u32::from(u16::from_be_bytes([inner[2 * i], inner[2 * i + 1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    inner[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    inner[22..24].copy_from_slice(&9u16.to_be_bytes());
    inner[24..26].copy_from_slice(&16u16.to_be_bytes());
    let outer = outer_header(
        (MARK_LEN + inner.len()) as u16,
        NEXTHDR_DEST,
        0,
        0,
        &forged_source().octets(),
        &receive.octets(),
    );
    let mut f = Vec::with_capacity(14 + outer.len() + MARK_LEN + inner.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    f.extend_from_slice(&outer);
    f.extend_from_slice(&mark_header(NEXTHDR_IPV4, hops, color));
    f.extend_from_slice(&inner);
    f
}

/// The outer source of forged frames: an address of no host.
fn forged_source() -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xbad)
}

/// An interface's MAC address in `ns`.
pub fn mac(ns: &NetNs, iface: &str) -> Result<[u8; 6]> {
    let out = ns.ip(&["-j", "link", "show", iface])?;
    let v: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| Error::Failed(format!("ip -j link: {e}")))?;
    let text = v[0]["address"]
        .as_str()
        .ok_or_else(|| Error::Failed(format!("no address of {iface}: {out}")))?;
    let mut mac = [0u8; 6];
    for (i, part) in text.split(':').enumerate().take(6) {
        mac[i] = u8::from_str_radix(part, 16)
            .map_err(|e| Error::Failed(format!("{iface}'s address {text}: {e}")))?;
    }
    Ok(mac)
}

/// Writes `frames` onto `iface` of `ns`, past its qdisc, `batch` at a time with a pause of
/// 5 ms between (the peer's backlog takes a burst, not all at once). Returns the frames sent.
pub fn send_frames(ns: &NetNs, iface: &str, frames: &[Vec<u8>], batch: usize) -> Result<usize> {
    let iface = std::ffi::CString::new(iface).expect("an interface name");
    ns.run(|| -> Result<usize> {
        // SAFETY: plain socket calls on a descriptor this closure owns and closes.
        unsafe {
            let proto = (libc::ETH_P_ALL as u16).to_be();
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto));
            if fd < 0 {
                return Err(Error::Failed(format!(
                    "an AF_PACKET socket: {}",
                    std::io::Error::last_os_error()
                )));
            }
            let one: libc::c_int = 1;
            libc::setsockopt(
                fd,
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                (&raw const one).cast(),
                size_of::<libc::c_int>() as u32,
            );
            let mut addr: libc::sockaddr_ll = std::mem::zeroed();
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = proto;
            addr.sll_ifindex = libc::if_nametoindex(iface.as_ptr()) as i32;
            let bound = libc::bind(
                fd,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            );
            if addr.sll_ifindex == 0 || bound != 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                return Err(Error::Failed(format!("binding to {iface:?}: {e}")));
            }
            let mut sent = 0;
            for chunk in frames.chunks(batch.max(1)) {
                for f in chunk {
                    if libc::send(fd, f.as_ptr().cast(), f.len(), 0) == f.len() as isize {
                        sent += 1;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            libc::close(fd);
            Ok(sent)
        }
    })?
}
