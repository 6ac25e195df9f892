//! Senders that go around `tc_stamp`: a process with `CAP_NET_RAW` alone (what container
//! runtimes grant by default) on a host whose agent is live, so that e0 honours the option from
//! its port.

use sopa_testbed::fabric::Fabric;

/// `SOL_PACKET`, `PACKET_QDISC_BYPASS`, `SOL_XDP`, `XDP_UMEM_REG`, `AF_XDP`.
const SOL_PACKET: libc::c_int = 263;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const SOL_XDP: libc::c_int = 283;
const XDP_UMEM_REG: libc::c_int = 4;
const AF_XDP: libc::c_int = 44;
/// `CAP_NET_RAW` (linux/capability.h).
const CAP_NET_RAW: u32 = 13;
/// Frames the process tries to send.
const N: usize = 200;

/// Leaves the calling thread `CAP_NET_RAW` and nothing else (capabilities are per thread).
fn keep_only_net_raw() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let raw = 1u32 << CAP_NET_RAW;
    let data = [
        Data {
            effective: raw,
            permitted: raw,
            inheritable: 0,
        },
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: a version 3 header and its two data words, for the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

fn setsockopt(fd: libc::c_int, level: libc::c_int, name: libc::c_int, value: &[u8]) -> i32 {
    // SAFETY: a socket we opened and a buffer of the given length.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// A UDP datagram to `dst` from `src` carrying our option with hop bytes (1, 0), as an
/// Ethernet frame from `from` to `to`.
fn forged_frame(from: [u8; 6], to: [u8; 6], src: [u8; 4], dst: [u8; 4], port: u16) -> Vec<u8> {
    let payload = b"around the stamp";
    let mut ip = vec![
        0x46, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, src[0], src[1], src[2], src[3], dst[0], dst[1],
        dst[2], dst[3], 0x9E, 4, 1, 0,
    ];
    let total = (ip.len() + 8 + payload.len()) as u16;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    let sum = sopa_common::wire::ipv4_header_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut frame = Vec::new();
    frame.extend(to);
    frame.extend(from);
    frame.extend([0x08, 0x00]);
    frame.extend(ip);
    frame.extend(port.to_be_bytes());
    frame.extend(port.to_be_bytes());
    frame.extend((8 + payload.len() as u16).to_be_bytes());
    frame.extend([0, 0]);
    frame.extend(payload);
    frame
}

/// What the process on h0 got: the errno of each option it asked for (0: set), and the frames
/// it sent around the stamp.
struct Attempt {
    qdisc_bypass: i32,
    xdp_umem: i32,
    sent: usize,
}

/// A process on h0 with `CAP_NET_RAW` alone asks for `PACKET_QDISC_BYPASS` on an `AF_PACKET`
/// socket, to send frames with the option (1, 0) that `tc_stamp` never sees, and sets up an
/// `AF_XDP` socket: the guard refuses both options (`EPERM`), so it sends nothing that way, and
/// e0's uplink 1 carries none of it.
pub fn a_raw_socket_cannot_send_around_the_stamp(f: &mut Fabric) {
    let h0 = f.ns("h0");
    let links: serde_json::Value = serde_json::from_str(&h0.ip(&["-j", "link"]).unwrap()).unwrap();
    let dev = links
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["ifname"] != "lo")
        .expect("h0's interface")
        .clone();
    let (ifname, ifindex) = (
        dev["ifname"].as_str().unwrap().to_owned(),
        dev["ifindex"].as_i64().unwrap() as i32,
    );
    let mac = |s: &str| -> [u8; 6] {
        let b: Vec<u8> = s
            .split(':')
            .map(|x| u8::from_str_radix(x, 16).unwrap())
            .collect();
        b.try_into().unwrap()
    };
    let own = mac(dev["address"].as_str().unwrap());
    // The gateway's address, learned by a datagram sent the ordinary way.
    let g = f.topo.graph().clone();
    let addr = |n: &str| g.node(g.find(n).unwrap()).addr.unwrap().octets();
    let (src, dst) = (addr("h0"), addr("h4"));
    let sock = h0
        .spawn(move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            s.send_to(b"x", (std::net::Ipv4Addr::from(dst), 7400))
                .unwrap();
        })
        .join()
        .unwrap();
    sock.unwrap();
    let neigh: serde_json::Value =
        serde_json::from_str(&h0.ip(&["-j", "neigh", "show", "dev", &ifname]).unwrap()).unwrap();
    let gateway = mac(neigh[0]["lladdr"]
        .as_str()
        .unwrap_or_else(|| panic!("h0's gateway in {neigh}")));
    let uplink1 = |f: &Fabric| {
        f.switch_status("e0").unwrap()["uplinks"][1]
            .as_u64()
            .unwrap_or(0)
    };
    let before = uplink1(f);

    let attempt = h0
        .spawn(move || {
            keep_only_net_raw();
            // SAFETY: plain socket calls on descriptors this thread owns.
            unsafe {
                let fd = libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW,
                    i32::from((libc::ETH_P_ALL as u16).to_be()),
                );
                assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
                let qdisc_bypass =
                    setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &1i32.to_ne_bytes());
                let mut sent = 0;
                if qdisc_bypass == 0 {
                    let frame = forged_frame(own, gateway, src, dst, 7401);
                    let mut to: libc::sockaddr_ll = std::mem::zeroed();
                    to.sll_family = libc::AF_PACKET as u16;
                    to.sll_protocol = (libc::ETH_P_IP as u16).to_be();
                    to.sll_ifindex = ifindex;
                    to.sll_halen = 6;
                    to.sll_addr[..6].copy_from_slice(&gateway);
                    for _ in 0..N {
                        let n = libc::sendto(
                            fd,
                            frame.as_ptr().cast(),
                            frame.len(),
                            0,
                            (&to as *const libc::sockaddr_ll).cast(),
                            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                        );
                        if n == frame.len() as isize {
                            sent += 1;
                        }
                    }
                }
                libc::close(fd);
                let xsk = libc::socket(AF_XDP, libc::SOCK_RAW, 0);
                assert!(xsk >= 0, "AF_XDP: {}", std::io::Error::last_os_error());
                // struct xdp_umem_reg: addr, len, chunk_size, headroom, flags (40 bytes).
                let xdp_umem = setsockopt(xsk, SOL_XDP, XDP_UMEM_REG, &[0u8; 40]);
                libc::close(xsk);
                Attempt {
                    qdisc_bypass,
                    xdp_umem,
                    sent,
                }
            }
        })
        .join()
        .unwrap()
        .unwrap();
    let moved = uplink1(f) - before;
    eprintln!(
        "h0 with CAP_NET_RAW only: PACKET_QDISC_BYPASS errno {}, AF_XDP umem errno {}, {} frames \
         sent around the stamp; e0's uplink 1 counted {moved}",
        attempt.qdisc_bypass, attempt.xdp_umem, attempt.sent
    );
    assert_eq!(
        attempt.qdisc_bypass,
        libc::EPERM,
        "PACKET_QDISC_BYPASS was set"
    );
    assert_eq!(
        attempt.xdp_umem,
        libc::EPERM,
        "an AF_XDP umem was registered"
    );
    assert_eq!(
        (attempt.sent, moved),
        (0, 0),
        "frames with the hop bytes a process chose went around tc_stamp and e0 honoured them"
    );
}
