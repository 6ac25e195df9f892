//! Links and routes through rtnetlink: the interface facts the agent needs, `gso_max_segs`, and
//! the fabric routes whose MTU it lowers.

mod codec;
mod ethtool;
mod route;
mod route6;
pub mod tc;

use std::net::Ipv4Addr;

use futures::{StreamExt as _, TryStreamExt as _};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::{InfoKind, LinkAttribute, LinkInfo},
    route::{RouteHeader, RouteMessage},
};
use netlink_proto::ConnectionHandle;
use rtnetlink::Handle;

pub use self::{
    ethtool::link_speed_mbit,
    route::{KernelMessage, Route, covering_route},
    route6::{Action6, Route6},
};
use crate::{
    error::{Error, Result},
    path_table::Prefix,
};

/// `lo`'s interface index, the same in every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;

/// A netlink connection for routes, with the codec that keeps every route readable: the
/// connection (to spawn), its handle, and the messages nobody asked for (events, once the
/// socket joins a multicast group).
#[allow(clippy::type_complexity)]
pub fn route_connection() -> Result<(
    netlink_proto::Connection<RouteNetlinkMessage, netlink_sys::TokioSocket, codec::RouteCodec>,
    ConnectionHandle<RouteNetlinkMessage>,
    futures::channel::mpsc::UnboundedReceiver<(
        NetlinkMessage<RouteNetlinkMessage>,
        netlink_sys::SocketAddr,
    )>,
)> {
    netlink_proto::new_connection_with_codec(netlink_sys::protocols::NETLINK_ROUTE)
        .map_err(|err| Error::io("opening a netlink socket for routes", err))
}

/// What the agent needs to know of an interface.
#[derive(Clone, Debug)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub gso_max_segs: u32,
    pub is_veth: bool,
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
    /// Routes go through a socket of their own, with a codec that keeps every route readable
    /// (see `codec`).
    routes: ConnectionHandle<RouteNetlinkMessage>,
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
        let (connection, routes, _) = route_connection()?;
        tokio::spawn(connection);
        Ok(Self { handle, routes })
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

    /// Sends one route request; returns the route messages of the answer.
    async fn route_request(
        &self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> std::result::Result<Vec<RouteMessage>, rtnetlink::Error> {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        let mut request = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        request.finalize();
        let mut answers = self
            .routes
            .request(request, netlink_sys::SocketAddr::new(0, 0))
            .map_err(|_| rtnetlink::Error::RequestFailed)?;
        let mut routes = Vec::new();
        while let Some(answer) = answers.next().await {
            match answer.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(route)) => {
                    routes.push(route);
                }
                NetlinkPayload::Error(err) if err.code.is_some() => {
                    return Err(rtnetlink::Error::NetlinkError(err));
                }
                _ => {}
            }
        }
        Ok(routes)
    }

    /// The unicast IPv4 routes of the main table.
    pub async fn routes(&self) -> Result<Vec<Route>> {
        Ok(self.table().await?.0)
    }

    /// The main table's IPv4 routes: the unicast ones, and the prefixes of the others
    /// (unreachable, blackhole, prohibit, throw), which route nowhere the agent could lower.
    pub async fn table(&self) -> Result<(Vec<Route>, Vec<Prefix>)> {
        let mut query = RouteMessage::default();
        query.header.address_family = AddressFamily::Inet;
        query.header.table = RouteHeader::RT_TABLE_MAIN;
        let messages = self
            .route_request(RouteNetlinkMessage::GetRoute(query), NLM_F_DUMP)
            .await
            .map_err(|err| Error::netlink("listing IPv4 routes", err))?;
        let routes = messages.iter().filter_map(Route::from_message).collect();
        let blocks = messages.iter().filter_map(route::blocking_prefix).collect();
        Ok((routes, blocks))
    }

    /// Adds `route`, or replaces the route of the same prefix and priority when `replace`.
    pub async fn add_route(&self, route: &Route, replace: bool) -> Result<()> {
        let how = if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
        self.route_request(
            RouteNetlinkMessage::NewRoute(route.to_message()),
            NLM_F_ACK | NLM_F_CREATE | how,
        )
        .await
        .map(drop)
        .map_err(|err| Error::netlink(format!("installing route {}", route.prefix), err))
    }

    /// The unicast IPv6 routes of the main table that forward over next hops.
    pub async fn routes6(&self) -> Result<Vec<Route6>> {
        let mut query = RouteMessage::default();
        query.header.address_family = AddressFamily::Inet6;
        query.header.table = RouteHeader::RT_TABLE_MAIN;
        let messages = self
            .route_request(RouteNetlinkMessage::GetRoute(query), NLM_F_DUMP)
            .await
            .map_err(|err| Error::netlink("listing IPv6 routes", err))?;
        Ok(messages.iter().filter_map(Route6::from_message).collect())
    }

    /// Adds an IPv6 route, or replaces the route of the same prefix.
    pub async fn add_route6(&self, route: &Route6) -> Result<()> {
        self.route_request(
            RouteNetlinkMessage::NewRoute(route.to_message()),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
        .map(drop)
        .map_err(|err| Error::netlink(format!("installing IPv6 route {}", route.name()), err))
    }

    /// [`Netlink::add_route6`], except that a route through a port that is down is not an
    /// error: `Ok(false)`, nothing installed (the kernel refuses such a route, and takes every
    /// route through a port that goes down with it).
    pub async fn add_route6_if_up(&self, route: &Route6) -> Result<bool> {
        match self
            .route_request(
                RouteNetlinkMessage::NewRoute(route.to_message()),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(err) if errno(&err) == Some(libc::ENETDOWN) => Ok(false),
            Err(err) => Err(Error::netlink(
                format!("installing IPv6 route {}", route.name()),
                err,
            )),
        }
    }

    /// Whether the kernel takes a `seg6local` End route with the NEXT-C-SID flavour: one is
    /// added through `lo` to `table` (which no rule names, so nothing routes by it) and removed
    /// (see `probe::seg6local`).
    pub async fn probe_seg6local(&self, table: u32) -> Result<bool> {
        let route = Route6 {
            dst: std::net::Ipv6Addr::new(0xfcbb, 0xbb00, 0xffff, 0, 0, 0, 0, 0),
            len: 48,
            action: Action6::UsidEnd {
                oif: LOOPBACK_IFINDEX,
            },
            mtu: None,
        };
        let mut msg = route.to_message();
        msg.header.table = RouteHeader::RT_TABLE_UNSPEC;
        msg.attributes
            .push(netlink_packet_route::route::RouteAttribute::Table(table));
        match self
            .route_request(
                RouteNetlinkMessage::NewRoute(msg.clone()),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            )
            .await
        {
            Ok(_) => {
                self.route_request(RouteNetlinkMessage::DelRoute(msg), NLM_F_ACK)
                    .await
                    .map_err(|err| Error::netlink("removing the seg6local probe route", err))?;
                Ok(true)
            }
            // The encapsulation was taken; only the device was refused.
            Err(err) if errno(&err) == Some(libc::ENETDOWN) => Ok(true),
            // No seg6 lightweight tunnels.
            Err(err) if errno(&err) == Some(libc::EOPNOTSUPP) => Ok(false),
            Err(err) => Err(Error::netlink("probing for seg6local", err)),
        }
    }

    pub async fn delete_route6(&self, route: &Route6) -> Result<()> {
        let request = RouteNetlinkMessage::DelRoute(route.to_message());
        match self.route_request(request, NLM_F_ACK).await {
            Ok(_) => Ok(()),
            // Already gone (the interface went away, or someone removed it): nothing to undo.
            Err(err) if errno(&err) == Some(libc::ESRCH) => Ok(()),
            Err(err) => Err(Error::netlink(
                format!("removing IPv6 route {}", route.name()),
                err,
            )),
        }
    }

    pub async fn delete_route(&self, route: &Route) -> Result<()> {
        let request = RouteNetlinkMessage::DelRoute(route.to_message());
        match self.route_request(request, NLM_F_ACK).await {
            Ok(_) => Ok(()),
            // Already gone (the interface went away, or someone removed it): nothing to undo.
            Err(err) if errno(&err) == Some(libc::ESRCH) => Ok(()),
            Err(err) => Err(Error::netlink(
                format!("removing route {}", route.prefix),
                err,
            )),
        }
    }
}
