//! The switch's routes: its kernel routes (IPv4, multipath) and its IPv6 and SRv6 routes,
//! each replaced atomically and recorded in the journal so that a stop removes what is
//! installed.

use super::*;

/// The IPv6 next hops of switch `me` over `links`: the far end of each link that has a port.
fn next_hops6(
    topo: &Topology,
    me: u32,
    links: &[LinkId],
    ports: &HashMap<LinkId, Port>,
) -> Vec<(std::net::Ipv6Addr, u32)> {
    links
        .iter()
        .filter_map(|l| {
            let p = ports.get(l)?;
            let (a, b, _) = plan6::link_addresses6(topo, *l);
            let theirs = if topo.graph().links[*l as usize].a == me {
                b
            } else {
                a
            };
            Some((theirs, p.ifindex))
        })
        .collect()
}

impl Switch {
    /// Makes this switch's SRv6 routes exactly those of its plan under `failures` (in the IPv4
    /// option's encoding only an inventory's IPv6 rack prefixes), each replaced atomically, the
    /// journal kept current.
    pub(super) async fn install_srv6(
        &mut self,
        topo: &Topology,
        me: u32,
        failures: &Failures,
        ports: &HashMap<LinkId, Port>,
    ) -> Result<()> {
        let mut wanted = BTreeMap::new();
        // An inventory's IPv6 racks are routed in either encoding; the option carries no
        // uSIDs, so there only the racks' routes.
        let racks_only = self.encoding != Encoding::Srv6;
        if !racks_only || topo.routes_ipv6() {
            // On a port, not `lo`: the kernel turns an IPv6 route through the loopback device
            // into a reject route (a packet to the locator then counts as InNoRoutes). A port
            // whose link is up: one set down takes its IPv6 routes with it, and the plan of that
            // failure moves the locator to another port.
            let g = topo.graph();
            let up = ports
                .iter()
                .filter(|(l, _)| failures.usable(g, **l))
                .map(|(_, p)| p.ifindex)
                .min();
            let Some(anchor) = up.or_else(|| ports.values().map(|p| p.ifindex).min()) else {
                return Err(Error::Config(
                    "no port of this switch carries its link address: nothing to route".into(),
                ));
            };
            let plan = plan6::switch_routes(topo, me, failures)
                .map_err(|e| Error::Config(e.to_string()))?;
            for r in plan {
                if racks_only && !matches!(r, Srv6Route::Rack6 { .. }) {
                    continue;
                }
                let route = match r {
                    // tc_forward consumes it: no route, no anchor.
                    Srv6Route::End { .. } if self.usid == usid::UsidEnd::Ebpf => continue,
                    Srv6Route::End { usid } => {
                        let (dst, len) = plan6::locator(topo.usid_block(), usid);
                        Route6 {
                            dst,
                            len,
                            action: Action6::UsidEnd { oif: anchor },
                            mtu: None,
                        }
                    }
                    Srv6Route::Rack6 { addr, len, links } => {
                        let nexthops = next_hops6(topo, me, &links, ports);
                        if nexthops.is_empty() {
                            continue;
                        }
                        Route6 {
                            dst: addr,
                            len,
                            action: Action6::Via { nexthops },
                            mtu: None,
                        }
                    }
                    Srv6Route::Locator { usid, links } => {
                        let nexthops = next_hops6(topo, me, &links, ports);
                        if nexthops.is_empty() {
                            warn!(usid, "no port up towards this locator");
                            continue;
                        }
                        let (dst, len) = plan6::locator(topo.usid_block(), usid);
                        Route6 {
                            dst,
                            len,
                            action: Action6::Via { nexthops },
                            mtu: None,
                        }
                    }
                    Srv6Route::Host { host, addr, link } => {
                        let Some(p) = ports.get(&link) else {
                            continue;
                        };
                        Route6 {
                            dst: addr,
                            len: 64,
                            action: Action6::Via {
                                nexthops: vec![(topo.host_ipv6(host), p.ifindex)],
                            },
                            mtu: None,
                        }
                    }
                };
                wanted.insert((route.dst, route.len), route);
            }
        }
        let journal = self.journal.as_mut().expect("running");
        let current: BTreeMap<(std::net::Ipv6Addr, u8), (usize, Route6)> = journal
            .record
            .changes
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Change::Route6Added { route } => Some(((route.dst, route.len), (i, route.clone()))),
                _ => None,
            })
            .collect();
        // What the kernel holds: a port set down takes its IPv6 routes with it (the End
        // locator's too, when it is anchored there) while the journal still lists them, and a
        // flap shorter than the controller's round trip never shows in a plan. A route the
        // journal lists but the kernel lacks is installed again.
        let present: std::collections::BTreeSet<(std::net::Ipv6Addr, u8)> = self
            .netlink
            .routes6()
            .await?
            .iter()
            .map(|r| (r.dst, r.len))
            .collect();
        // New and changed routes first (each replaced atomically), stale ones after. A route
        // through a port that is down (here, before the controller knows) is left out for now:
        // the kernel refuses it, and the plan that follows the port's return installs it.
        for (key, r) in &wanted {
            match current.get(key) {
                Some((_, old)) if old == r && present.contains(key) => {}
                Some((i, _)) => {
                    if self.netlink.add_route6_if_up(r).await? {
                        journal.record.changes[*i] = Change::Route6Added { route: r.clone() };
                    } else {
                        warn!(route = %r.name(), "its port is down: installed when it comes back");
                    }
                }
                None => {
                    if self.netlink.add_route6_if_up(r).await? {
                        journal
                            .record
                            .changes
                            .push(Change::Route6Added { route: r.clone() });
                    } else {
                        warn!(route = %r.name(), "its port is down: installed when it comes back");
                    }
                }
            }
        }
        let mut gone = Vec::new();
        for (key, (i, old)) in &current {
            if !wanted.contains_key(key) {
                self.netlink.delete_route6(old).await?;
                gone.push(*i);
            }
        }
        gone.sort_unstable();
        for i in gone.into_iter().rev() {
            journal.record.changes.remove(i);
        }
        journal.save()?;
        Ok(())
    }

    /// Makes this switch's fabric routes exactly `routes` (host /32s excepted: the kernel routes
    /// a point-to-point peer already), each replaced atomically, and keeps the journal's
    /// record of them current so that undo removes what is installed.
    pub(super) async fn install_routes(
        &mut self,
        routes: &[forwarding::KernelRoute],
        ports: &HashMap<LinkId, Port>,
    ) -> Result<()> {
        let journal = self.journal.as_mut().expect("running");
        let mut wanted = BTreeMap::new();
        for route in routes {
            if route.prefix.len == 32 {
                continue;
            }
            let hops: Vec<(Ipv4Addr, u32)> = route
                .links
                .iter()
                .filter_map(|l| ports.get(l).map(|p| (p.neighbour, p.ifindex)))
                .collect();
            if hops.is_empty() {
                warn!(prefix = %route.prefix, "no port up towards this prefix");
                continue;
            }
            wanted.insert(
                route.prefix,
                Route {
                    prefix: route.prefix,
                    gateway: (hops.len() == 1).then(|| hops[0].0),
                    oif: (hops.len() == 1).then(|| hops[0].1),
                    priority: None,
                    protocol: 4,
                    scope: 0,
                    mtu: None,
                    mtu_locked: false,
                    multipath: hops.len() > 1,
                    nexthops: if hops.len() > 1 { hops } else { Vec::new() },
                    nh_id: None,
                    kernel: None,
                },
            );
        }
        let current: BTreeMap<Prefix, (usize, Route)> = journal
            .record
            .changes
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Change::RouteAdded { route } => Some((route.prefix, (i, route.clone()))),
                _ => None,
            })
            .collect();
        let mut unrouted = Vec::new();
        for (prefix, (i, old)) in &current {
            if !wanted.contains_key(prefix) {
                self.netlink.delete_route(old).await?;
                unrouted.push(*i);
            }
        }
        // The journal is this role's record of what is installed (an unchanged entry is not
        // written again), so a route enters it once the kernel took it: write-ahead here needs
        // the kernel, not the journal, to decide what is in place.
        for (prefix, r) in &wanted {
            match current.get(prefix) {
                Some((_, old)) if old == r => {}
                Some((i, _)) => {
                    self.netlink.add_route(r, true).await?;
                    journal.record.changes[*i] = Change::RouteAdded { route: r.clone() };
                }
                None => {
                    self.netlink.add_route(r, true).await?;
                    journal
                        .record
                        .changes
                        .push(Change::RouteAdded { route: r.clone() });
                }
            }
        }
        unrouted.sort_unstable();
        for i in unrouted.into_iter().rev() {
            journal.record.changes.remove(i);
        }
        journal.save()?;
        Ok(())
    }
}
