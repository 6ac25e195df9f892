//! The fabric routes of a host: every fabric prefix routed with an MTU 4 bytes under the
//! interface's, so a full-size packet still fits once stamped, and kept so while routing
//! daemons and operators change routes under the agent (rtnetlink route events). Every change
//! is in the journal before it is made.
//!
//! A plain `mtu`, not `mtu lock`: a locked route MTU makes the kernel clear DF on everything
//! sent over the route (`ip_dont_fragment`), which turns path MTU discovery off. Every other
//! attribute of a route (prefsrc, onlink, metrics, nexthop objects, encap) is kept, in the
//! rewrite and in what a stop restores.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use netlink_packet_core::NetlinkPayload;
use netlink_packet_route::RouteNetlinkMessage;
use tracing::{info, warn};

use crate::{
    changes::{Change, SharedJournal},
    error::{Error, Result},
    netlink::{self, Link, Netlink, Route},
    path_table::Prefix,
};

/// Bytes the option adds to every stamped packet.
const OPTION_BYTES: u32 = sopa_common::wire::OPTION_LEN as u32;
/// `RTPROT_STATIC`: the origin of the copies the agent adds.
const RTPROT_STATIC: u8 = 4;
/// A prefix whose route is changed back more often than this within [`FLAP_WINDOW`] is left
/// to whoever keeps changing it (a daemon that reinstalls its own route on every change);
/// packets that then do not fit leave unstamped (`too_big`), none is dropped.
const FLAP_LIMIT: u32 = 10;
const FLAP_WINDOW: Duration = Duration::from_secs(60);

/// Keeps the fabric prefixes' routes lowered.
pub struct RouteKeeper {
    netlink: Netlink,
    link: Link,
    journal: SharedJournal,
    /// Every fabric prefix whose route has been seen to.
    kept: BTreeSet<Prefix>,
    /// Prefixes routed through another interface (said once).
    elsewhere: HashSet<Prefix>,
    /// Re-applications per prefix in the current window.
    reapplied: HashMap<Prefix, (Instant, u32)>,
}

/// What a check of one prefix did.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    InPlace,
    Changed,
    Elsewhere,
}

impl RouteKeeper {
    pub fn new(link: Link, journal: SharedJournal) -> Result<Self> {
        Ok(Self {
            netlink: Netlink::connect()?,
            link,
            journal,
            kept: BTreeSet::new(),
            elsewhere: HashSet::new(),
            reapplied: HashMap::new(),
        })
    }

    /// Lowers the routes of the `prefixes` not seen to yet, and keeps them so from now on. A
    /// prefix without a route, or with a multipath one, is refused (and tried again with the
    /// next update).
    pub async fn ensure<'a>(&mut self, prefixes: impl Iterator<Item = &'a Prefix>) -> Result<()> {
        let new: Vec<Prefix> = prefixes
            .filter(|p| !self.kept.contains(p))
            .copied()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut routes = self.netlink.routes().await?;
        for prefix in new {
            if self.keep(&routes, &prefix).await? == Outcome::Changed {
                routes = self.netlink.routes().await?;
            }
            self.kept.insert(prefix);
        }
        Ok(())
    }

    /// Checks every kept prefix against the routes as they are now and lowers again what a
    /// daemon or an operator replaced; returns the prefixes changed. A prefix that fails is
    /// logged and left for the next event.
    pub async fn reconcile(&mut self) -> Result<Vec<Prefix>> {
        let mut routes = self.netlink.routes().await?;
        let mut changed = Vec::new();
        for prefix in self.kept.clone() {
            if self.flapping(&prefix) {
                continue;
            }
            match self.keep(&routes, &prefix).await {
                Ok(Outcome::Changed) => {
                    info!(%prefix, "the fabric route changed under the agent; lowered its MTU again");
                    self.count_reapply(&prefix);
                    changed.push(prefix);
                    routes = self.netlink.routes().await?;
                }
                Ok(_) => {}
                Err(err) => warn!(%prefix, %err, "keeping the fabric route's MTU"),
            }
        }
        Ok(changed)
    }

    fn flapping(&self, prefix: &Prefix) -> bool {
        self.reapplied
            .get(prefix)
            .is_some_and(|(since, n)| since.elapsed() < FLAP_WINDOW && *n >= FLAP_LIMIT)
    }

    fn count_reapply(&mut self, prefix: &Prefix) {
        let entry = self.reapplied.entry(*prefix).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FLAP_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
        if entry.1 == FLAP_LIMIT {
            warn!(
                %prefix,
                "the fabric route was changed back {FLAP_LIMIT} times within {} s; leaving it \
                 to whoever changes it for the rest of that time (packets that do not fit \
                 leave unstamped, counted too_big)",
                FLAP_WINDOW.as_secs()
            );
        }
    }

    /// Makes `prefix` routed with the lowered MTU: its own route rewritten, or a more specific
    /// copy of the route that covers it. `routes` is the main table now.
    async fn keep(&mut self, routes: &[Route], prefix: &Prefix) -> Result<Outcome> {
        let target = self.link.mtu.saturating_sub(OPTION_BYTES);
        let changes = self.journal.changes();
        let our_copy = |r: &Route| {
            changes
                .iter()
                .any(|c| matches!(c, Change::RouteAdded { route } if route.still_installed_as(r)))
        };
        // The routes of daemons and operators (ours rewritten among them); our copies apart.
        let (copies, others): (Vec<&Route>, Vec<&Route>) = routes.iter().partition(|r| our_copy(r));
        let copy = copies.into_iter().find(|r| r.prefix == *prefix);
        let others: Vec<Route> = others.into_iter().cloned().collect();
        let Some(base) = netlink::covering_route(&others, prefix) else {
            if let Some(copy) = copy {
                // The route it copied was withdrawn: so is the copy.
                self.remove_copy(copy).await?;
            }
            return Err(Error::Config(format!(
                "no route to fabric prefix {prefix} in the main table; add the route to the \
                 fabric first (the agent lowers its MTU by {OPTION_BYTES})"
            )));
        };
        if base.multipath {
            return Err(Error::Config(format!(
                "the route to fabric prefix {prefix} ({}) is multipath; the host role needs one \
                 next hop per prefix",
                base.prefix
            )));
        }
        if base.oif != Some(self.link.index) {
            if let Some(copy) = copy {
                self.remove_copy(copy).await?;
            }
            if self.elsewhere.insert(*prefix) {
                warn!(%prefix, iface = %self.link.name, "fabric prefix is not routed through the agent's interface; packets to it leave unstamped");
            }
            return Ok(Outcome::Elsewhere);
        }
        self.elsewhere.remove(prefix);
        // An older agent of this node locked the MTU (DF off): this one unlocks it.
        let ours_locked = |r: &Route| {
            changes.iter().any(|c| match c {
                Change::RouteReplaced { new, .. } | Change::RouteAdded { route: new } => {
                    new.mtu_locked && new.still_installed_as(r)
                }
                _ => false,
            })
        };
        let fits = |r: &Route| r.mtu.is_some_and(|m| m <= target) && !ours_locked(r);

        if base.prefix == *prefix {
            if fits(base) {
                return Ok(Outcome::InPlace);
            }
            let mut new = base.clone();
            new.mtu = Some(target);
            // An operator's lock stays; ours goes.
            new.mtu_locked = base.mtu_locked && !ours_locked(base);
            self.journal.push(Change::RouteReplaced {
                old: base.clone(),
                new: new.clone(),
            })?;
            self.netlink.add_route(&new, true).await?;
            // Earlier rewrites of this prefix that a daemon has replaced since are not ours to
            // undo any more.
            let now = routes;
            self.journal.forget(|c| match c {
                Change::RouteReplaced { new: earlier, .. } => {
                    earlier.prefix == *prefix
                        && *earlier != new
                        && !now.iter().any(|r| earlier.still_installed_as(r))
                }
                _ => false,
            })?;
            return Ok(Outcome::Changed);
        }

        // A more specific copy of the covering route, with the lowered MTU.
        if copy.is_none() && fits(base) {
            return Ok(Outcome::InPlace);
        }
        let mut want = base.clone();
        want.prefix = *prefix;
        want.protocol = RTPROT_STATIC;
        want.mtu = Some(base.mtu.map_or(target, |m| m.min(target)));
        want.mtu_locked = base.mtu_locked && !ours_locked(base);
        if let Some(copy) = copy
            && want.still_installed_as(copy)
        {
            return Ok(Outcome::InPlace);
        }
        self.journal.push(Change::RouteAdded {
            route: want.clone(),
        })?;
        self.netlink.add_route(&want, true).await?;
        if let Some(copy) = copy {
            // Replaced in place when it has the same metric; otherwise still there.
            if copy.priority.unwrap_or(0) != want.priority.unwrap_or(0) {
                self.netlink.delete_route(copy).await?;
            }
            self.forget_copy(copy)?;
        }
        Ok(Outcome::Changed)
    }

    async fn remove_copy(&self, copy: &Route) -> Result<()> {
        warn!(prefix = %copy.prefix, "the route the agent's copy was made from is gone; removing the copy");
        self.netlink.delete_route(copy).await?;
        self.forget_copy(copy)
    }

    fn forget_copy(&self, copy: &Route) -> Result<()> {
        self.journal
            .forget(|c| matches!(c, Change::RouteAdded { route } if route.still_installed_as(copy)))
    }
}

/// Watches the main table's IPv4 routes (rtnetlink route events) and has `keeper` check its
/// prefixes after every burst of changes. The task ends when aborted.
pub fn watch(keeper: Arc<tokio::sync::Mutex<RouteKeeper>>) -> Result<tokio::task::JoinHandle<()>> {
    use netlink_sys::AsyncSocket as _;
    /// `RTMGRP_IPV4_ROUTE` of linux/rtnetlink.h.
    const RTMGRP_IPV4_ROUTE: u32 = 0x40;
    let (mut conn, _handle, mut events) = netlink::route_connection()?;
    conn.socket_mut()
        .socket_mut()
        .bind(&netlink_sys::SocketAddr::new(0, RTMGRP_IPV4_ROUTE))
        .map_err(|e| Error::io("subscribing to route events", e))?;
    tokio::spawn(conn);
    Ok(tokio::spawn(async move {
        while let Some((event, _)) = events.next().await {
            let mut relevant = is_route_event(&event.payload);
            // A burst (a daemon rewriting a table, our own changes) is checked once.
            while let Ok(Some((more, _))) =
                tokio::time::timeout(Duration::from_millis(20), events.next()).await
            {
                relevant |= is_route_event(&more.payload);
            }
            if !relevant {
                continue;
            }
            if let Err(err) = keeper.lock().await.reconcile().await {
                warn!(%err, "checking the fabric routes after a route change");
            }
        }
        warn!("the route event socket closed; fabric routes are no longer watched");
    }))
}

fn is_route_event(payload: &NetlinkPayload<RouteNetlinkMessage>) -> bool {
    matches!(
        payload,
        NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewRoute(_) | RouteNetlinkMessage::DelRoute(_)
        )
    )
}
