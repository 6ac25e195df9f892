//! The fabric routes of a host: every fabric prefix routed with an MTU under the interface's by
//! what the encoding adds (4 bytes for the option, 48 for SRv6's outer header and meter mark; a fabric whose
//! links carry 48 more than the hosts' MTU loses nothing), so a full-size packet still fits once
//! stamped, and kept so while routing
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
    netlink::{self, Action6, Link, Netlink, Route, Route6},
    path_table::Prefix,
};

/// Bytes the option adds to every stamped packet (the default overhead).
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
    /// What the encoding adds to a packet.
    overhead: u32,
    /// The SRv6 encoding's /96 last given to [`Self::ensure6`], seen to again at every check.
    fabric6: Option<std::net::Ipv6Addr>,
}

/// The main table (unicast routes, and the prefixes of routes that send nothing anywhere) and
/// the journal's changes, read together.
struct Snapshot {
    routes: Vec<Route>,
    blocks: Vec<Prefix>,
    changes: Vec<Change>,
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
            overhead: OPTION_BYTES,
            fabric6: None,
        })
    }

    /// The SRv6 encoding's IPv6 side: IPv6 to the fabric's /96 (`fabric6`) must fit the
    /// interface once encapsulated, so the /96 is routed as the route that covers it, with an
    /// MTU [`Self::overhead`] under the interface's; a copy is added where that route's MTU is
    /// larger (and removed when no longer needed, or with `None`). Seen to at every table the
    /// controller or the file gives, and watched between them as the IPv4 prefixes are.
    pub async fn ensure6(&mut self, fabric6: Option<std::net::Ipv6Addr>) -> Result<()> {
        self.fabric6 = fabric6;
        let target = self.link.mtu.saturating_sub(self.overhead);
        let ours: Vec<Route6> = self
            .journal
            .changes()
            .into_iter()
            .filter_map(|c| match c {
                Change::Route6Added { route } => Some(route),
                _ => None,
            })
            .collect();
        let routes = self.netlink.routes6().await?;
        // Ours are the routes exactly as the journal has them, or with the MTU the kernel
        // clamps a route's to when its interface shrinks below it; any other, even of the same
        // prefix, belongs to someone else.
        let link_mtu = self.link.mtu;
        let is_ours = |o: &Route6, r: &Route6| {
            o.still_installed_as(r)
                || (r.mtu == Some(link_mtu)
                    && o.mtu.is_some_and(|m| m > link_mtu)
                    && o.still_installed_as(&Route6 {
                        mtu: o.mtu,
                        ..r.clone()
                    }))
        };
        let others: Vec<&Route6> = routes
            .iter()
            .filter(|r| !ours.iter().any(|o| is_ours(o, r)))
            .collect();
        let want = fabric6.and_then(|prefix| {
            let Some(base) = others
                .iter()
                .filter(|r| r.covers(prefix, 96))
                .max_by_key(|r| r.len)
            else {
                warn!(%prefix, "no IPv6 route covers the fabric's /96: its IPv6 is not encapsulated");
                return None;
            };
            let via_us = matches!(&base.action, Action6::Via { nexthops }
                if nexthops.iter().all(|(_, oif)| *oif == self.link.index));
            if !via_us {
                warn!(%prefix, route = %base.name(), "the fabric's /96 is routed through another interface; left alone");
                return None;
            }
            let mtu = base.mtu.unwrap_or(self.link.mtu);
            if base.len >= 96 {
                // A route of exactly the /96 that the agent did not add: not replaced (an
                // operator's or a daemon's), said when its MTU is too large.
                if mtu > target {
                    warn!(route = %base.name(), mtu, target, "the fabric's /96 has a route of its own with a larger MTU than encapsulated IPv6 fits: lower it to the target; the agent changes no IPv6 route it did not add");
                }
                return None;
            }
            (mtu > target).then(|| Route6 {
                dst: prefix,
                len: 96,
                action: base.action.clone(),
                mtu: Some(target),
            })
        });
        for old in &ours {
            if Some(old) != want.as_ref() {
                // Deleted only while it is as we added it: a route someone replaced it with
                // stays, and the record goes.
                if routes.iter().any(|r| is_ours(old, r)) {
                    self.netlink.delete_route6(old).await?;
                }
                let gone = old.clone();
                self.journal
                    .forget(|c| matches!(c, Change::Route6Added { route } if *route == gone))?;
            }
        }
        if let Some(r) = want
            && !ours.contains(&r)
        {
            // In the journal first: a crash in between leaves a record of a route that may not
            // exist, which the undo tolerates, never a route without a record.
            self.journal
                .push(Change::Route6Added { route: r.clone() })?;
            self.netlink.add_route6(&r).await?;
            info!(route = %r.name(), mtu = target, "IPv6 to the fabric routed with the MTU the outer header leaves");
        }
        Ok(())
    }

    /// Sets what the encoding adds to a packet; a change has the next [`Self::ensure`] see to
    /// every prefix again.
    pub fn set_overhead(&mut self, bytes: u32) {
        if bytes != self.overhead {
            self.overhead = bytes;
            self.kept.clear();
        }
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
        let mut now = self.snapshot().await?;
        for prefix in new {
            if self.keep(&now, &prefix).await? == Outcome::Changed {
                now = self.snapshot().await?;
            }
            self.kept.insert(prefix);
        }
        Ok(())
    }

    /// Checks every kept prefix against the routes as they are now and lowers again what a
    /// daemon or an operator replaced; returns the prefixes changed. A prefix that fails is
    /// logged and left for the next event.
    pub async fn reconcile(&mut self) -> Result<Vec<Prefix>> {
        self.refresh_link().await?;
        if let Err(err) = self.ensure6(self.fabric6).await {
            warn!(%err, "keeping the fabric's IPv6 route's MTU");
        }
        let mut now = self.snapshot().await?;
        let mut changed = Vec::new();
        for prefix in self.kept.clone() {
            if self.flapping(&prefix) {
                continue;
            }
            match self.keep(&now, &prefix).await {
                Ok(Outcome::Changed) => {
                    info!(%prefix, "the fabric route changed under the agent; lowered its MTU again");
                    self.count_reapply(&prefix);
                    changed.push(prefix);
                    now = self.snapshot().await?;
                }
                Ok(_) => {}
                Err(err) => {
                    // A failure counts like a change: a route the kernel keeps refusing is
                    // not retried on every event.
                    self.count_reapply(&prefix);
                    warn!(%prefix, %err, "keeping the fabric route's MTU");
                }
            }
        }
        Ok(changed)
    }

    /// Takes the interface's MTU as it is now: the routes' target follows it.
    async fn refresh_link(&mut self) -> Result<()> {
        let link = match self.netlink.link(&self.link.name).await {
            Ok(l) if l.index == self.link.index => l,
            // Gone, or another interface of that name: the agent's own checks say so.
            Ok(_) | Err(Error::UnknownInterface(_)) => return Ok(()),
            Err(err) => return Err(err),
        };
        if link.mtu != self.link.mtu {
            info!(iface = %link.name, from = self.link.mtu, to = link.mtu, "the interface's MTU changed; the fabric routes' MTU follows");
            self.link.mtu = link.mtu;
        }
        Ok(())
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

    /// The main table and the journal as they are now: read once per pass over the prefixes,
    /// and again after a change.
    async fn snapshot(&self) -> Result<Snapshot> {
        let (routes, blocks) = self.netlink.table().await?;
        Ok(Snapshot {
            routes,
            blocks,
            changes: self.journal.changes(),
        })
    }

    /// Makes `prefix` routed with the lowered MTU: its own route rewritten, or a more specific
    /// copy of the route that covers it. `now` is the main table and the journal now.
    async fn keep(&mut self, now: &Snapshot, prefix: &Prefix) -> Result<Outcome> {
        let Snapshot {
            routes,
            blocks,
            changes,
        } = now;
        let target = self.link.mtu.saturating_sub(self.overhead);
        let our_copy = |r: &Route| {
            changes
                .iter()
                .any(|c| matches!(c, Change::RouteAdded { route } if route.still_installed_as(r)))
        };
        // The routes of daemons and operators (ours rewritten among them); our copies apart.
        let (copies, others): (Vec<&Route>, Vec<&Route>) = routes.iter().partition(|r| our_copy(r));
        let copy = copies.into_iter().find(|r| r.prefix == *prefix);
        let others: Vec<Route> = others.into_iter().cloned().collect();
        let base = netlink::covering_route(&others, prefix);
        // An unreachable or blackhole route at least as specific wins: nothing to lower, and
        // no copy may take its place.
        let block = blocks
            .iter()
            .filter(|b| b.contains(prefix))
            .max_by_key(|b| b.len);
        if let Some(block) = block
            && base.is_none_or(|b| block.len >= b.prefix.len)
        {
            if let Some(copy) = copy {
                self.remove_copy(copy).await?;
            }
            if self.elsewhere.insert(*prefix) {
                warn!(%prefix, route = %block, "fabric prefix is covered by an unreachable or blackhole route; left alone");
            }
            return Ok(Outcome::Elsewhere);
        }
        let Some(base) = base else {
            if let Some(copy) = copy {
                // The route it copied was withdrawn: so is the copy.
                self.remove_copy(copy).await?;
            }
            return Err(Error::Config(format!(
                "no route to fabric prefix {prefix} in the main table; add the route to the \
                 fabric first (the agent lowers its MTU by {})",
                self.overhead
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
        // A route still carrying an MTU we set is to carry the target under the MTU it had
        // before any of our rewrites (the oldest record of the prefix has it), so that it
        // follows the interface's MTU up as well as down; any other fits at or under it.
        let ours_now = |r: &Route| {
            changes
                .iter()
                .any(|c| matches!(c, Change::RouteReplaced { new, .. } if new.holds_our_mtu(r)))
        };
        let original = changes.iter().find_map(|c| match c {
            Change::RouteReplaced { old, new }
                if new.prefix == *prefix
                    && new.priority.unwrap_or(0) == base.priority.unwrap_or(0) =>
            {
                Some(old.mtu)
            }
            _ => None,
        });
        let desired = |r: &Route| match original.filter(|_| ours_now(r)) {
            Some(mtu) => mtu.map_or(target, |m| m.min(target)),
            None => target,
        };
        let fits = |r: &Route| {
            !ours_locked(r)
                && if ours_now(r) {
                    r.mtu == Some(desired(r))
                } else {
                    r.mtu.is_some_and(|m| m <= target)
                }
        };

        if base.prefix == *prefix {
            // A daemon's own route for the prefix beside our copy (it withdrew the route and
            // put it back with another metric): the copy goes.
            let copy_gone = match copy {
                Some(copy) => {
                    self.remove_copy(copy).await?;
                    true
                }
                None => false,
            };
            if fits(base) {
                return Ok(if copy_gone {
                    Outcome::Changed
                } else {
                    Outcome::InPlace
                });
            }
            let mut new = base.clone();
            new.mtu = Some(desired(base));
            // An operator's lock stays; ours goes.
            new.mtu_locked = base.mtu_locked && !ours_locked(base);
            // A route carrying our MTU already (the interface's MTU changed): its record is
            // carried on, so that it keeps the MTU from before any of our rewrites to restore.
            let earlier = changes.iter().find(
                |c| matches!(c, Change::RouteReplaced { new: n, .. } if n.holds_our_mtu(base)),
            );
            match earlier {
                Some(prev @ Change::RouteReplaced { old: first, .. }) => {
                    let change = Change::RouteReplaced {
                        old: first.clone(),
                        new: new.clone(),
                    };
                    self.journal.replace(|c| c == prev, change.clone())?;
                    if let Err(err) = self.netlink.add_route(&new, true).await {
                        self.journal.replace(|c| *c == change, prev.clone())?;
                        return Err(err);
                    }
                }
                _ => {
                    let change = Change::RouteReplaced {
                        old: base.clone(),
                        new: new.clone(),
                    };
                    self.apply(change, self.netlink.add_route(&new, true))
                        .await?;
                }
            }
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
        // Our copy with the same metric is replaced in place; anything else is added beside
        // (exclusively: a route of that prefix and metric we cannot see is not overwritten).
        let in_place = copy.is_some_and(|c| c.priority.unwrap_or(0) == want.priority.unwrap_or(0));
        let change = Change::RouteAdded {
            route: want.clone(),
        };
        self.apply(change, self.netlink.add_route(&want, in_place))
            .await?;
        if let Some(copy) = copy {
            if !in_place {
                self.netlink.delete_route(copy).await?;
            }
            self.forget_copy(copy)?;
        }
        Ok(Outcome::Changed)
    }

    /// Records `change` (write-ahead), then makes it; a change the kernel refused leaves the
    /// journal again.
    async fn apply(
        &self,
        change: Change,
        make: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        self.journal.push(change.clone())?;
        if let Err(err) = make.await {
            self.journal.retract(&change)?;
            return Err(err);
        }
        Ok(())
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

/// Watches the main table's routes and the interfaces (rtnetlink route and link events: an
/// interface's MTU is the routes' target) and has `keeper` check its prefixes and the fabric's
/// IPv6 route after every burst of changes, and once at the start (for what changed before the
/// subscription). The task ends when aborted.
pub fn watch(keeper: Arc<tokio::sync::Mutex<RouteKeeper>>) -> Result<tokio::task::JoinHandle<()>> {
    use netlink_sys::AsyncSocket as _;
    /// `RTMGRP_LINK`, `RTMGRP_IPV4_ROUTE` and `RTMGRP_IPV6_ROUTE` of linux/rtnetlink.h.
    const RTMGRP_LINK: u32 = 0x1;
    const RTMGRP_IPV4_ROUTE: u32 = 0x40;
    const RTMGRP_IPV6_ROUTE: u32 = 0x400;
    /// Room for a daemon's burst (a full table rewritten) before the kernel drops events.
    const RECEIVE_BUFFER: usize = 4 << 20;
    /// How long a burst is gathered at most before the routes are checked.
    const BURST: Duration = Duration::from_millis(200);
    let (mut conn, _handle, mut events) = netlink::route_connection()?;
    let socket = conn.socket_mut().socket_mut();
    socket
        .set_rx_buf_sz(RECEIVE_BUFFER)
        .map_err(|e| Error::io("sizing the route event socket", e))?;
    socket
        .bind(&netlink_sys::SocketAddr::new(
            0,
            RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE,
        ))
        .map_err(|e| Error::io("subscribing to route events", e))?;
    tokio::spawn(conn);
    Ok(tokio::spawn(async move {
        let mut relevant = true;
        loop {
            if relevant && let Err(err) = keeper.lock().await.reconcile().await {
                warn!(%err, "checking the fabric routes after a route change");
            }
            let Some((event, _)) = events.next().await else {
                break;
            };
            relevant = needs_check(&event.payload);
            // A burst (a daemon rewriting a table, our own changes) is checked once.
            let until = tokio::time::Instant::now() + BURST;
            while let Ok(Some((more, _))) = tokio::time::timeout_at(until, events.next()).await {
                relevant |= needs_check(&more.payload);
            }
        }
        warn!("the route event socket closed; fabric routes are no longer watched");
    }))
}

/// A route or an interface changed, or events were lost (the socket overran): either way the
/// routes are checked.
fn needs_check(payload: &NetlinkPayload<RouteNetlinkMessage>) -> bool {
    matches!(
        payload,
        NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewRoute(_)
                | RouteNetlinkMessage::DelRoute(_)
                | RouteNetlinkMessage::NewLink(_)
        ) | NetlinkPayload::Overrun(_)
    )
}
