//! The link speed a driver reports (`ethtool`), for the pinned mode's elephant threshold.

/// The link speed of `iface` in Mbit/s as ethtool reports it (`ETHTOOL_GSET`), or `None` when
/// the driver does not know it.
pub fn link_speed_mbit(iface: &str) -> Option<u64> {
    /// `struct ethtool_cmd` of linux/ethtool.h (the legacy, fixed-size query).
    #[repr(C)]
    #[derive(Default)]
    struct EthtoolCmd {
        cmd: u32,
        supported: u32,
        advertising: u32,
        speed: u16,
        duplex: u8,
        port: u8,
        phy_address: u8,
        transceiver: u8,
        autoneg: u8,
        mdio_support: u8,
        maxtxpkt: u32,
        maxrxpkt: u32,
        speed_hi: u16,
        eth_tp_mdix: u8,
        eth_tp_mdix_ctrl: u8,
        lp_advertising: u32,
        reserved: [u32; 2],
    }
    /// `struct ifreq` with its union as the data pointer.
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut EthtoolCmd,
        _pad: [u8; 16],
    }
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GSET: u32 = 1;
    if iface.len() >= libc::IFNAMSIZ {
        return None;
    }
    let mut cmd = EthtoolCmd {
        cmd: ETHTOOL_GSET,
        ..EthtoolCmd::default()
    };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: &mut cmd,
        _pad: [0; 16],
    };
    req.name[..iface.len()].copy_from_slice(iface.as_bytes());
    // SAFETY: a datagram socket for the ioctl, closed below; the request points at live,
    // correctly laid out structures for the duration of the call.
    let ok = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let r = libc::ioctl(fd, SIOCETHTOOL as _, &mut req);
        libc::close(fd);
        r == 0
    };
    let speed = (u32::from(cmd.speed_hi) << 16) | u32::from(cmd.speed);
    (ok && speed != 0 && speed != u32::MAX && cmd.speed != u16::MAX).then_some(u64::from(speed))
}
