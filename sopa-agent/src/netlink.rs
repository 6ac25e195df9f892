//! Links and routes through rtnetlink: the interface facts the agent needs, `gso_max_segs`, and
//! the fabric routes whose MTU it lowers.

use std::net::Ipv4Addr;

use futures::TryStreamExt as _;
use netlink_packet_route::{
    AddressFamily,
    link::{InfoKind, LinkAttribute, LinkInfo},
    route::{
        RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteProtocol,
        RouteScope, RouteType,
    },
};
use rtnetlink::Handle;
use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    path_table::Prefix,
};

/// `RTAX_MTU`: the bit of the route's lock mask that pins its MTU (`ip route ... mtu lock N`).
const RTAX_MTU_LOCK: u32 = 1 << 2;

/// What the agent needs to know of an interface.
#[derive(Clone, Debug)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub gso_max_segs: u32,
    pub is_veth: bool,
}

/// A unicast IPv4 route of the main table, reduced to what the agent reads and writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub prefix: Prefix,
    pub gateway: Option<Ipv4Addr>,
    pub oif: Option<u32>,
    pub priority: Option<u32>,
    pub protocol: u8,
    pub scope: u8,
    pub mtu: Option<u32>,
    pub mtu_locked: bool,
    #[serde(default)]
    pub multipath: bool,
    /// Next hops of a multipath route: (gateway, interface).
    #[serde(default)]
    pub nexthops: Vec<(Ipv4Addr, u32)>,
}

impl Route {
    /// Whether `current`, read from the kernel now, is still this route as we installed it:
    /// the same destination, next hops and MTU (metric and origin compared as the kernel
    /// reports them back). A route a routing daemon or an operator replaced since is not.
    pub fn still_installed_as(&self, current: &Route) -> bool {
        let mut a = self.nexthops.clone();
        let mut b = current.nexthops.clone();
        a.sort_unstable();
        b.sort_unstable();
        self.prefix == current.prefix
            && self.gateway == current.gateway
            && self.oif == current.oif
            && self.priority.unwrap_or(0) == current.priority.unwrap_or(0)
            && self.mtu == current.mtu
            && self.mtu_locked == current.mtu_locked
            && self.multipath == current.multipath
            && a == b
    }
}

/// An IPv4 address of an interface, and its peer on a point-to-point configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Address {
    pub ifindex: u32,
    pub local: Ipv4Addr,
    pub peer: Option<Ipv4Addr>,
}

pub struct Netlink {
    handle: Handle,
}

fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => msg.code.map(|c| -c.get()),
        _ => None,
    }
}

impl Netlink {
    /// Opens a netlink socket in the current network namespace (needs a tokio runtime).
    pub fn connect() -> Result<Self> {
        let (connection, handle, _) = rtnetlink::new_connection()
            .map_err(|err| Error::io("opening a netlink socket", err))?;
        tokio::spawn(connection);
        Ok(Self { handle })
    }

    /// The interface named `name`, or [`Error::UnknownInterface`].
    pub async fn link(&self, name: &str) -> Result<Link> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        let msg = match links.try_next().await {
            Ok(Some(msg)) => msg,
            Ok(None) => return Err(Error::UnknownInterface(name.to_owned())),
            Err(err) if errno(&err) == Some(libc::ENODEV) => {
                return Err(Error::UnknownInterface(name.to_owned()));
            }
            Err(err) => return Err(Error::netlink(format!("looking up interface {name}"), err)),
        };
        let mut link = Link {
            index: msg.header.index,
            name: name.to_owned(),
            mtu: 1500,
            gso_max_segs: u32::from(u16::MAX),
            is_veth: false,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::Mtu(mtu) => link.mtu = mtu,
                LinkAttribute::GsoMaxSegs(segs) => link.gso_max_segs = segs,
                LinkAttribute::LinkInfo(infos) => {
                    link.is_veth = infos
                        .iter()
                        .any(|info| matches!(info, LinkInfo::Kind(InfoKind::Veth)));
                }
                _ => {}
            }
        }
        Ok(link)
    }

    /// Every IPv4 address of every interface.
    pub async fn addresses(&self) -> Result<Vec<Address>> {
        use netlink_packet_route::address::AddressAttribute;
        let msgs: Vec<netlink_packet_route::address::AddressMessage> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|err| Error::netlink("listing addresses", err))?;
        Ok(msgs
            .iter()
            .filter_map(|m| {
                let mut local = None;
                let mut address = None;
                for a in &m.attributes {
                    match a {
                        AddressAttribute::Local(std::net::IpAddr::V4(v)) => local = Some(*v),
                        AddressAttribute::Address(std::net::IpAddr::V4(v)) => address = Some(*v),
                        _ => {}
                    }
                }
                // Point-to-point: IFA_LOCAL is ours and IFA_ADDRESS the peer; otherwise only
                // IFA_ADDRESS (ours) may be given.
                let ours = local.or(address)?;
                let peer = address.filter(|p| *p != ours);
                Some(Address {
                    ifindex: m.header.index,
                    local: ours,
                    peer,
                })
            })
            .collect())
    }

    /// The name of interface `index`.
    pub async fn link_name(&self, index: u32) -> Result<String> {
        let mut links = self.handle.link().get().match_index(index).execute();
        match links.try_next().await {
            Ok(Some(msg)) => msg
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                })
                .ok_or_else(|| Error::UnknownInterface(format!("ifindex {index}"))),
            Ok(None) => Err(Error::UnknownInterface(format!("ifindex {index}"))),
            Err(err) => Err(Error::netlink(format!("looking up ifindex {index}"), err)),
        }
    }

    /// Sets the most segments one GSO packet of the interface may carry (1: per-packet units).
    pub async fn set_gso_max_segs(&self, index: u32, segs: u32) -> Result<()> {
        let mut req = self.handle.link().set(index);
        req.message_mut()
            .attributes
            .push(LinkAttribute::GsoMaxSegs(segs));
        req.execute().await.map_err(|err| {
            Error::netlink(
                format!("setting gso_max_segs {segs} on ifindex {index}"),
                err,
            )
        })
    }

    /// The unicast IPv4 routes of the main table.
    pub async fn routes(&self) -> Result<Vec<Route>> {
        let mut req = self.handle.route().get(rtnetlink::IpVersion::V4);
        req.message_mut().header.table = RouteHeader::RT_TABLE_MAIN;
        let messages: Vec<RouteMessage> = req
            .execute()
            .try_collect()
            .await
            .map_err(|err| Error::netlink("listing IPv4 routes", err))?;
        Ok(messages.iter().filter_map(Route::from_message).collect())
    }

    /// Adds `route`, or replaces the route of the same prefix and priority when `replace`.
    pub async fn add_route(&self, route: &Route, replace: bool) -> Result<()> {
        let mut req = self.handle.route().add().v4();
        *req.message_mut() = route.to_message();
        let req = if replace { req.replace() } else { req };
        req.execute()
            .await
            .map_err(|err| Error::netlink(format!("installing route {}", route.prefix), err))
    }

    pub async fn delete_route(&self, route: &Route) -> Result<()> {
        match self.handle.route().del(route.to_message()).execute().await {
            Ok(()) => Ok(()),
            // Already gone (the interface went away, or someone removed it): nothing to undo.
            Err(err) if errno(&err) == Some(libc::ESRCH) => Ok(()),
            Err(err) => Err(Error::netlink(
                format!("removing route {}", route.prefix),
                err,
            )),
        }
    }
}

impl Route {
    fn from_message(msg: &RouteMessage) -> Option<Self> {
        if msg.header.kind != RouteType::Unicast || msg.header.address_family != AddressFamily::Inet
        {
            return None;
        }
        let mut table = u32::from(msg.header.table);
        let mut route = Route {
            prefix: Prefix {
                addr: Ipv4Addr::UNSPECIFIED,
                len: msg.header.destination_prefix_length,
            },
            gateway: None,
            oif: None,
            priority: None,
            protocol: msg.header.protocol.into(),
            scope: msg.header.scope.into(),
            mtu: None,
            mtu_locked: false,
            multipath: false,
            nexthops: Vec::new(),
        };
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Destination(RouteAddress::Inet(addr)) => route.prefix.addr = *addr,
                RouteAttribute::Gateway(RouteAddress::Inet(addr)) => route.gateway = Some(*addr),
                RouteAttribute::Oif(oif) => route.oif = Some(*oif),
                RouteAttribute::Priority(p) => route.priority = Some(*p),
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::MultiPath(hops) => {
                    route.multipath = true;
                    route.nexthops = hops
                        .iter()
                        .filter_map(|hop| {
                            hop.attributes.iter().find_map(|a| match a {
                                RouteAttribute::Gateway(RouteAddress::Inet(gw)) => {
                                    Some((*gw, hop.interface_index))
                                }
                                _ => None,
                            })
                        })
                        .collect();
                }
                RouteAttribute::Metrics(metrics) => {
                    for metric in metrics {
                        match metric {
                            RouteMetric::Mtu(mtu) => route.mtu = Some(*mtu),
                            RouteMetric::Lock(mask) => route.mtu_locked = mask & RTAX_MTU_LOCK != 0,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        (table == u32::from(RouteHeader::RT_TABLE_MAIN)).then_some(route)
    }

    fn to_message(&self) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.destination_prefix_length = self.prefix.len;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::from(self.protocol);
        msg.header.scope = RouteScope::from(self.scope);
        msg.header.kind = RouteType::Unicast;
        if self.prefix.len > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::Inet(
                    self.prefix.addr,
                )));
        }
        if let Some(gw) = self.gateway {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::Inet(gw)));
        }
        if let Some(oif) = self.oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(p) = self.priority {
            msg.attributes.push(RouteAttribute::Priority(p));
        }
        if !self.nexthops.is_empty() {
            let hops = self
                .nexthops
                .iter()
                .map(|(gw, oif)| {
                    let mut hop = netlink_packet_route::route::RouteNextHop::default();
                    hop.interface_index = *oif;
                    hop.attributes = vec![RouteAttribute::Gateway(RouteAddress::Inet(*gw))];
                    hop
                })
                .collect();
            msg.attributes.push(RouteAttribute::MultiPath(hops));
        }
        let mut metrics = Vec::new();
        if let Some(mtu) = self.mtu {
            metrics.push(RouteMetric::Mtu(mtu));
        }
        if self.mtu_locked {
            metrics.push(RouteMetric::Lock(RTAX_MTU_LOCK));
        }
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        msg
    }
}

/// The route the kernel would use for `prefix`: the longest main-table prefix containing it
/// (lowest priority value among equals).
pub fn covering_route<'a>(routes: &'a [Route], prefix: &Prefix) -> Option<&'a Route> {
    routes
        .iter()
        .filter(|r| r.prefix.contains(prefix))
        .max_by(|a, b| {
            a.prefix
                .len
                .cmp(&b.prefix.len)
                .then(b.priority.unwrap_or(0).cmp(&a.priority.unwrap_or(0)))
        })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn route(prefix: &str, priority: Option<u32>) -> Route {
        Route {
            prefix: prefix.parse().unwrap(),
            gateway: None,
            oif: Some(2),
            priority,
            protocol: 4,
            scope: 0,
            mtu: None,
            mtu_locked: false,
            multipath: false,
            nexthops: Vec::new(),
        }
    }

    #[test]
    fn covering_route_is_longest_prefix() {
        let routes = vec![
            route("0.0.0.0/0", None),
            route("10.0.0.0/8", Some(100)),
            route("10.0.0.0/8", Some(10)),
            route("10.1.0.0/16", None),
        ];
        let p: Prefix = "10.1.2.0/24".parse().unwrap();
        assert_eq!(covering_route(&routes, &p).unwrap().prefix.len, 16);
        let p: Prefix = "10.2.2.0/24".parse().unwrap();
        assert_eq!(covering_route(&routes, &p).unwrap().priority, Some(10));
        let p: Prefix = "11.2.2.0/24".parse().unwrap();
        assert_eq!(covering_route(&routes, &p).unwrap().prefix.len, 0);
        assert!(covering_route(&routes[1..], &p).is_none());
    }

    #[test]
    fn route_message_round_trip() {
        let mut r = route("10.1.2.0/24", Some(5));
        r.gateway = Some(Ipv4Addr::new(10, 0, 0, 1));
        r.mtu = Some(1496);
        r.mtu_locked = true;
        assert_eq!(Route::from_message(&r.to_message()), Some(r));
    }

    #[test]
    fn a_multipath_route_reads_back_with_its_next_hops() {
        // A switch's route: read back as written, so undo finds it still installed.
        let mut r = route("10.1.0.0/16", None);
        r.protocol = 4;
        r.multipath = true;
        r.nexthops = vec![
            (Ipv4Addr::new(172, 16, 0, 1), 7),
            (Ipv4Addr::new(172, 16, 0, 5), 9),
        ];
        let back = Route::from_message(&r.to_message()).unwrap();
        assert_eq!(back, r);
        assert!(r.still_installed_as(&back));
        let mut other = back.clone();
        other.nexthops.pop();
        assert!(!r.still_installed_as(&other), "a next hop gone: not ours");
    }
}
