//! The switch's ports: found by the addresses each link gives this end, and watched for
//! carrier changes, which are repaired around at once and reported to the controller.

use super::*;

/// One port of this switch: the interface and the neighbour behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Port {
    pub(super) ifindex: u32,
    pub(super) neighbour: Ipv4Addr,
}

/// Switch `me`'s ports, by link, from the interface addresses it has: a host link by the
/// rack's gateway address with the host as peer, a switch link by this end's /31 address of
/// the link. A link no interface carries is left out (and logged).
pub(super) fn ports_from(
    topo: &Topology,
    me: u32,
    addrs: &[crate::netlink::Address],
) -> Result<HashMap<LinkId, Port>> {
    let g = topo.graph();
    let mut ports = HashMap::new();
    for &(link, other) in g.ports(me) {
        let found = if g.node(other).kind == NodeKind::Host {
            let host = g.node(other).addr.expect("hosts have addresses");
            let rack = topo
                .rack_of(other)
                .map_err(|e| Error::Config(e.to_string()))?;
            let gw = forwarding::gateway(topo, &rack);
            addrs
                .iter()
                .find(|a| a.local == gw && a.peer == Some(host))
                .map(|a| Port {
                    ifindex: a.ifindex,
                    neighbour: host,
                })
        } else {
            let (a, b, _) = forwarding::link_addresses(topo, link);
            let (mine, theirs) = if g.links[link as usize].a == me {
                (a, b)
            } else {
                (b, a)
            };
            addrs.iter().find(|x| x.local == mine).map(|x| Port {
                ifindex: x.ifindex,
                neighbour: theirs,
            })
        };
        match found {
            Some(p) => {
                ports.insert(link, p);
            }
            None => {
                warn!(link = %g.link_name(link), "no interface carries this link's address; leaving it out")
            }
        }
    }
    Ok(ports)
}

impl Switch {
    /// This switch's ports, by link: found by the address each link gives this end.
    pub(super) async fn ports(&self, topo: &Topology, me: u32) -> Result<HashMap<LinkId, Port>> {
        let addrs = self.netlink.addresses().await?;
        ports_from(topo, me, &addrs)
    }

    /// Watches this switch's ports with rtnetlink link events and sends a report for every
    /// change of carrier to `reports` (the controller turns it into a link state). Every port's
    /// state is sent once at the start and again whenever `resend` is notified (each new
    /// session with the controller), so a controller that restarted, or missed a change while
    /// it was away, learns every port as it is.
    pub fn watch_ports(
        &self,
        reports: tokio::sync::mpsc::Sender<sopa_channel::proto::agent_message::Kind>,
        resend: std::sync::Arc<tokio::sync::Notify>,
    ) -> Result<()> {
        use futures::{StreamExt as _, TryStreamExt as _};
        use netlink_packet_route::{RouteNetlinkMessage, link::LinkFlag};
        use netlink_sys::AsyncSocket as _;
        let (mut conn, handle, mut messages) =
            rtnetlink::new_connection().map_err(|e| Error::io("opening a netlink socket", e))?;
        conn.socket_mut()
            .socket_mut()
            .bind(&netlink_sys::SocketAddr::new(
                0,
                rtnetlink::constants::RTMGRP_LINK,
            ))
            .map_err(|e| Error::io("subscribing to link events", e))?;
        tokio::spawn(conn);
        let ports = self.port_links.clone();
        let repair = Arc::clone(&self.repair);
        let react = move |index: u32, running: bool, name: &str| {
            let received = std::time::SystemTime::now();
            let mut r = repair.lock().unwrap_or_else(|e| e.into_inner());
            match r.port(index, running) {
                Ok(Some(done)) => failover::log(name, running, &done, received),
                Ok(None) => {}
                Err(err) => warn!(port = name, %err, "repairing tc_forward's entries failed"),
            }
        };
        tokio::spawn(async move {
            let report = |index: u32, running: bool| {
                ports.get(&index).map(|(a, b)| LinkReport {
                    a: a.clone(),
                    b: b.clone(),
                    down: !running,
                })
            };
            // Subscribed first, then every port as it is now: no change falls in between.
            let mut up: BTreeMap<u32, bool> = BTreeMap::new();
            match handle.link().get().execute().try_collect::<Vec<_>>().await {
                Ok(links) => {
                    for l in links {
                        if let Some((a, b)) = ports.get(&l.header.index) {
                            let running = l.header.flags.contains(&LinkFlag::Running);
                            up.insert(l.header.index, running);
                            if !running {
                                react(l.header.index, running, &format!("{a}:{b}"));
                            }
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %e, "listing the ports failed; reporting their changes only")
                }
            }
            let mut send_all = true;
            loop {
                if send_all {
                    send_all = false;
                    info!(ports = up.len(), "reporting every port's state");
                    for (index, running) in &up {
                        if let Some(r) = report(*index, *running)
                            && reports.send(r.into()).await.is_err()
                        {
                            return;
                        }
                    }
                }
                tokio::select! {
                    _ = resend.notified() => send_all = true,
                    msg = messages.next() => {
                        let Some((msg, _)) = msg else { return };
                        let netlink_packet_core::NetlinkPayload::InnerMessage(
                            RouteNetlinkMessage::NewLink(link),
                        ) = msg.payload
                        else {
                            continue;
                        };
                        let index = link.header.index;
                        let running = link.header.flags.contains(&LinkFlag::Running);
                        let Some(r) = report(index, running) else {
                            continue;
                        };
                        if up.insert(index, running) == Some(running) {
                            continue;
                        }
                        // The data plane first, then the report to the controller.
                        react(index, running, &format!("{}:{}", r.a, r.b));
                        info!(link = %format!("{}:{}", r.a, r.b), up = running, "port changed; reporting it");
                        if reports.send(r.into()).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sopa_topology::topology::TopologySpec;

    use super::*;
    use crate::netlink::Address;

    /// The addresses the testbed gives switch `name`'s interfaces, ifindex 10 + port number.
    fn addresses(topo: &Topology, name: &str) -> Vec<Address> {
        let g = topo.graph();
        let me = g.find(name).unwrap();
        g.ports(me)
            .iter()
            .enumerate()
            .map(|(i, &(link, other))| {
                let ifindex = 10 + i as u32;
                if g.node(other).kind == NodeKind::Host {
                    let rack = topo.rack_of(other).unwrap();
                    Address {
                        ifindex,
                        local: forwarding::gateway(topo, &rack),
                        peer: g.node(other).addr,
                    }
                } else {
                    let (a, b, _) = forwarding::link_addresses(topo, link);
                    let mine = if g.links[link as usize].a == me { a } else { b };
                    Address {
                        ifindex,
                        local: mine,
                        peer: None,
                    }
                }
            })
            .collect()
    }

    #[test]
    fn every_link_maps_to_the_interface_that_carries_its_address() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let g = topo.graph();
        for name in ["e0", "a0", "c0", "e7"] {
            let me = g.find(name).unwrap();
            let ports = ports_from(&topo, me, &addresses(&topo, name)).unwrap();
            assert_eq!(ports.len(), g.ports(me).len(), "{name}: every port found");
            let mut ifindexes: Vec<u32> = ports.values().map(|p| p.ifindex).collect();
            ifindexes.sort_unstable();
            ifindexes.dedup();
            assert_eq!(
                ifindexes.len(),
                ports.len(),
                "{name}: one interface per link"
            );
            for (i, &(link, other)) in g.ports(me).iter().enumerate() {
                let p = ports[&link];
                assert_eq!(p.ifindex, 10 + i as u32, "{name}: {}", g.link_name(link));
                let neighbour = if g.node(other).kind == NodeKind::Host {
                    g.node(other).addr.unwrap()
                } else {
                    let (a, b, _) = forwarding::link_addresses(&topo, link);
                    if g.links[link as usize].a == me { b } else { a }
                };
                assert_eq!(
                    p.neighbour, neighbour,
                    "{name}: the next hop is the far end"
                );
            }
        }
    }

    #[test]
    fn a_link_without_its_address_is_left_out_and_others_are_not_confused() {
        let topo = Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap();
        let g = topo.graph();
        let me = g.find("a0").unwrap();
        let mut addrs = addresses(&topo, "a0");
        let (gone_link, _) = g.ports(me)[0];
        addrs.remove(0);
        // The far end's address of another link on some interface of ours is not our port.
        let (other_link, _) = g.ports(me)[1];
        let (a, b, _) = forwarding::link_addresses(&topo, other_link);
        let theirs = if g.links[other_link as usize].a == me {
            b
        } else {
            a
        };
        addrs.retain(|x| x.ifindex != 11);
        addrs.push(Address {
            ifindex: 99,
            local: theirs,
            peer: None,
        });
        let ports = ports_from(&topo, me, &addrs).unwrap();
        assert!(!ports.contains_key(&gone_link));
        assert!(!ports.contains_key(&other_link), "{ports:?}");
        assert_eq!(ports.len(), g.ports(me).len() - 2);
    }
}
