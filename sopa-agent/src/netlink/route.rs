//! IPv4 routes of the main table: what the agent reads of them, and how it writes one back
//! changing only what it means to change (the MTU), every other attribute kept.

use std::net::Ipv4Addr;

use netlink_packet_route::{
    AddressFamily,
    route::{
        RouteAddress, RouteAttribute, RouteFlag, RouteHeader, RouteMessage, RouteMessageBuffer,
        RouteMetric, RouteProtocol, RouteScope, RouteType,
    },
};
use netlink_packet_utils::{Emitable as _, Parseable as _, nla::Nla as _};
use serde::{Deserialize, Serialize};

use crate::path_table::Prefix;

/// `RTAX_MTU`: the bit of the route's lock mask that pins its MTU (`ip route ... mtu lock N`).
pub const RTAX_MTU_LOCK: u32 = 1 << 2;
/// `RTA_NH_ID`: the route uses a nexthop object (`ip route ... nhid N`).
const RTA_NH_ID: u16 = 30;

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
    /// The nexthop object the route uses (`nhid`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nh_id: Option<u32>,
    /// The route as the kernel reported it, every attribute kept (prefsrc, onlink, metrics
    /// such as initcwnd, advmss or congctl, nexthop objects, encap): writing the route back
    /// changes only the fields above that differ. Absent for routes the agent composes itself
    /// (a switch's) and in the records of older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelMessage>,
}

/// A route message as the kernel sent it, kept in the journal as its netlink bytes (hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelMessage(pub RouteMessage);

impl Serialize for KernelMessage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = vec![0; self.0.buffer_len()];
        self.0.emit(&mut bytes);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        s.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for KernelMessage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let hex = String::deserialize(d)?;
        if hex.len() % 2 != 0 || !hex.is_ascii() {
            return Err(D::Error::custom("a route message: odd length or not hex"));
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|e| D::Error::custom(format!("a route message: {e}")))?;
        let buf = RouteMessageBuffer::new_checked(&bytes)
            .map_err(|e| D::Error::custom(format!("a route message: {e}")))?;
        RouteMessage::parse(&buf)
            .map(KernelMessage)
            .map_err(|e| D::Error::custom(format!("a route message: {e}")))
    }
}

impl Route {
    /// Whether `current`, read from the kernel now, is still this route as we installed it:
    /// the same destination, next hops, MTU, metric and origin (as the kernel reports them
    /// back). A route a routing daemon or an operator replaced since is not.
    pub fn still_installed_as(&self, current: &Route) -> bool {
        let mut a = self.nexthops.clone();
        let mut b = current.nexthops.clone();
        a.sort_unstable();
        b.sort_unstable();
        self.prefix == current.prefix
            && self.gateway == current.gateway
            && self.oif == current.oif
            && self.priority.unwrap_or(0) == current.priority.unwrap_or(0)
            && self.protocol == current.protocol
            && self.mtu == current.mtu
            && self.mtu_locked == current.mtu_locked
            && self.multipath == current.multipath
            && self.nh_id == current.nh_id
            && a == b
    }

    /// Whether `current`, read from the kernel now, is this route's destination and metric
    /// still carrying the MTU this route set: what undoing only that MTU may write back to.
    pub fn holds_our_mtu(&self, current: &Route) -> bool {
        self.prefix == current.prefix
            && self.priority.unwrap_or(0) == current.priority.unwrap_or(0)
            && self.mtu == current.mtu
            && self.mtu_locked == current.mtu_locked
    }

    pub(crate) fn from_message(msg: &RouteMessage) -> Option<Self> {
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
            nh_id: None,
            kernel: Some(KernelMessage(msg.clone())),
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
                            RouteMetric::Mtu(mtu) if *mtu != 0 => route.mtu = Some(*mtu),
                            RouteMetric::Lock(mask) => route.mtu_locked = mask & RTAX_MTU_LOCK != 0,
                            _ => {}
                        }
                    }
                }
                RouteAttribute::Other(nla) if nla.kind() == RTA_NH_ID => {
                    let mut id = [0u8; 4];
                    if nla.value_len() == 4 {
                        nla.emit_value(&mut id);
                        route.nh_id = Some(u32::from_ne_bytes(id));
                    }
                }
                _ => {}
            }
        }
        (table == u32::from(RouteHeader::RT_TABLE_MAIN)).then_some(route)
    }

    /// The request that installs this route: the kernel's message it was read from with the
    /// prefix, origin and MTU of this one (everything else as it was), or, for a route the
    /// agent composed, a message of its fields.
    pub(crate) fn to_message(&self) -> RouteMessage {
        match &self.kernel {
            Some(kernel) => self.rewrite(&kernel.0),
            None => self.compose(),
        }
    }

    fn rewrite(&self, kernel: &RouteMessage) -> RouteMessage {
        let mut msg = kernel.clone();
        msg.header.destination_prefix_length = self.prefix.len;
        msg.header.protocol = RouteProtocol::from(self.protocol);
        // The flags the kernel reports of the next hop's state (dead, linkdown, offloaded) are
        // not the route's to set; onlink and pervasive are.
        msg.header
            .flags
            .retain(|f| matches!(f, RouteFlag::Onlink | RouteFlag::Pervasive));
        let nexthop_object = self.nh_id.is_some();
        let mut metrics = Vec::new();
        let mut lock = 0;
        msg.attributes.retain(|attr| match attr {
            RouteAttribute::Destination(_) | RouteAttribute::CacheInfo(_) => false,
            RouteAttribute::Metrics(m) => {
                for metric in m {
                    match metric {
                        RouteMetric::Mtu(_) => {}
                        RouteMetric::Lock(mask) => lock = *mask,
                        other => metrics.push(other.clone()),
                    }
                }
                false
            }
            // A nexthop object carries these; the kernel reports them as well (nexthop
            // compat mode) but refuses them beside `nhid` in a request.
            RouteAttribute::Oif(_)
            | RouteAttribute::Gateway(_)
            | RouteAttribute::MultiPath(_)
            | RouteAttribute::Encap(_)
            | RouteAttribute::EncapType(_)
            | RouteAttribute::Via(_) => !nexthop_object,
            _ => true,
        });
        if self.prefix.len > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::Inet(
                    self.prefix.addr,
                )));
        }
        let lock = if self.mtu_locked {
            lock | RTAX_MTU_LOCK
        } else {
            lock & !RTAX_MTU_LOCK
        };
        let mut all = Vec::new();
        if lock != 0 {
            all.push(RouteMetric::Lock(lock));
        }
        // Always said, 0 for none: the kernel keeps the metrics of a route replaced by an
        // otherwise identical one that carries none (seen with `nhid` routes), so restoring
        // a route that had no MTU must say so.
        all.push(RouteMetric::Mtu(self.mtu.unwrap_or(0)));
        all.extend(metrics);
        msg.attributes.push(RouteAttribute::Metrics(all));
        msg
    }

    fn compose(&self) -> RouteMessage {
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

/// The prefix of a main-table IPv4 route that sends nothing anywhere (`unreachable`,
/// `blackhole`, `prohibit`, `throw`).
pub(crate) fn blocking_prefix(msg: &RouteMessage) -> Option<Prefix> {
    let blocking = matches!(
        msg.header.kind,
        RouteType::Unreachable | RouteType::BlackHole | RouteType::Prohibit | RouteType::Throw
    );
    if !blocking || msg.header.address_family != AddressFamily::Inet {
        return None;
    }
    let mut table = u32::from(msg.header.table);
    let mut addr = Ipv4Addr::UNSPECIFIED;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(a)) => addr = *a,
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    (table == u32::from(RouteHeader::RT_TABLE_MAIN)).then_some(Prefix {
        addr,
        len: msg.header.destination_prefix_length,
    })
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

#[cfg(test)]
mod tests {
    use netlink_packet_utils::nla::DefaultNla;

    use super::*;
    use crate::netlink::codec::CC_ALGO_PARKED;

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
            nh_id: None,
            kernel: None,
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

    /// What the agent read back of `r` (with the kernel's message kept), fields compared.
    fn read_back(r: &Route) -> Route {
        let mut back = Route::from_message(&r.to_message()).unwrap();
        back.kernel = None;
        back
    }

    #[test]
    fn route_message_round_trip() {
        let mut r = route("10.1.2.0/24", Some(5));
        r.gateway = Some(Ipv4Addr::new(10, 0, 0, 1));
        r.mtu = Some(1496);
        r.mtu_locked = true;
        assert_eq!(read_back(&r), r);
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
        let back = read_back(&r);
        assert_eq!(back, r);
        assert!(r.still_installed_as(&back));
        let mut other = back.clone();
        other.nexthops.pop();
        assert!(!r.still_installed_as(&other), "a next hop gone: not ours");
    }

    /// A kernel's route with attributes the agent does not model: prefsrc, onlink, other
    /// metrics (a locked one among them), congctl as the route codec parks it.
    fn rich_kernel_route() -> RouteMessage {
        let mut r = route("10.7.0.0/16", Some(7));
        r.gateway = Some(Ipv4Addr::new(10, 0, 0, 1));
        r.protocol = 186;
        let mut msg = r.to_message();
        msg.header.flags = vec![RouteFlag::Onlink, RouteFlag::Linkdown];
        msg.attributes
            .push(RouteAttribute::PrefSource(RouteAddress::Inet(
                Ipv4Addr::new(10, 0, 0, 2),
            )));
        msg.attributes.push(RouteAttribute::Metrics(vec![
            RouteMetric::Lock(1 << 11),
            RouteMetric::InitCwnd(20),
            RouteMetric::Advmss(1400),
            RouteMetric::Other(DefaultNla::new(CC_ALGO_PARKED, b"reno\0".to_vec())),
        ]));
        msg
    }

    #[test]
    fn a_rewrite_changes_the_mtu_and_keeps_every_other_attribute() {
        let kernel = rich_kernel_route();
        let mut lowered = Route::from_message(&kernel).unwrap();
        lowered.mtu = Some(1496);
        let msg = lowered.to_message();
        assert_eq!(
            msg.header.flags,
            vec![RouteFlag::Onlink],
            "linkdown is the kernel's"
        );
        assert!(
            msg.attributes
                .contains(&RouteAttribute::PrefSource(RouteAddress::Inet(
                    Ipv4Addr::new(10, 0, 0, 2)
                )))
        );
        let metrics = msg
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Metrics(m) => Some(m.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            metrics,
            vec![
                RouteMetric::Lock(1 << 11),
                RouteMetric::Mtu(1496),
                RouteMetric::InitCwnd(20),
                RouteMetric::Advmss(1400),
                RouteMetric::Other(DefaultNla::new(CC_ALGO_PARKED, b"reno\0".to_vec())),
            ],
            "the MTU set, the initcwnd lock and every other metric kept"
        );
        let back = Route::from_message(&msg).unwrap();
        assert_eq!(back.mtu, Some(1496));
        assert!(!back.mtu_locked, "plain mtu: DF stays on");
        assert!(lowered.still_installed_as(&back));

        // Restoring the kernel's original is its own message again (less the state flag).
        let original = Route::from_message(&kernel).unwrap();
        let mut want = kernel.clone();
        want.header.flags = vec![RouteFlag::Onlink];
        let mut got = original.to_message();
        for attr in &mut got.attributes {
            if let RouteAttribute::Metrics(m) = attr {
                let none = RouteMetric::Mtu(0);
                assert!(m.contains(&none), "no MTU said as MTU 0: {m:?}");
                m.retain(|x| *x != none);
            }
        }
        let sorted = |m: &mut RouteMessage| {
            m.attributes.sort_by_key(|a| a.kind());
        };
        sorted(&mut want);
        sorted(&mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn a_nexthop_object_route_is_written_with_its_nhid_alone() {
        let mut kernel = route("10.8.0.0/16", None).to_message();
        kernel
            .attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(
                10, 0, 0, 1,
            ))));
        kernel
            .attributes
            .push(RouteAttribute::Other(DefaultNla::new(
                RTA_NH_ID,
                10u32.to_ne_bytes().to_vec(),
            )));
        let mut r = Route::from_message(&kernel).unwrap();
        assert_eq!(r.nh_id, Some(10));
        assert_eq!(r.oif, Some(2), "compat mode: the device is reported too");
        r.mtu = Some(1496);
        let msg = r.to_message();
        assert!(
            !msg.attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::Oif(_) | RouteAttribute::Gateway(_))),
            "the kernel refuses a device or gateway beside nhid: {msg:?}"
        );
    }

    #[test]
    fn the_journal_keeps_the_kernels_message() {
        let r = Route::from_message(&rich_kernel_route()).unwrap();
        let json = serde_json::to_string(&r).unwrap();
        let back: Route = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        // A record of an older agent: no message, the fields alone.
        let mut old = serde_json::to_value(&r).unwrap();
        old.as_object_mut().unwrap().remove("kernel");
        old.as_object_mut().unwrap().remove("nh_id");
        let back: Route = serde_json::from_value(old).unwrap();
        assert_eq!(back.kernel, None);
        assert_eq!(back.prefix, r.prefix);
    }
}
