//! Undoing one change where the host still holds the value the agent set, and redoing one for
//! a record handed back.

use std::fs;

use tracing::warn;

use crate::{
    error::{Error, Result},
    netlink::Netlink,
    sysctl,
};

use super::Change;

/// Makes one recorded change again (its `new` value), for a record being handed back.
pub(super) async fn redo_one(change: &Change, netlink: &Netlink) -> Result<()> {
    match change {
        Change::Pins { .. } => Ok(()),
        Change::Sysctl { key, new, .. } => sysctl::write(key, new),
        Change::GsoMaxSegs { index, new, .. } => netlink.set_gso_max_segs(*index, *new).await,
        Change::RouteAdded { route } => netlink.add_route(route, true).await,
        Change::RouteReplaced { new, .. } => netlink.add_route(new, true).await,
        Change::Route6Added { route } => netlink.add_route6(route).await,
        // A filter comes back with its program when the role attaches; a qdisc is not taken
        // back by any agent.
        Change::Clsact { .. } | Change::TcFilter { .. } | Change::Cgroup2Mount { .. } => Ok(()),
    }
}

/// Undoes one change if the host still holds the value we set. Something another program or
/// an operator changed since is theirs now: left as it is, and said so.
pub(super) async fn undo_one(change: &Change, netlink: &Netlink) -> Result<()> {
    let not_ours = |what: &str| {
        warn!(
            ?change,
            "{what} changed since the agent set it; leaving it as it is"
        );
        Ok(())
    };
    match change {
        Change::Cgroup2Mount { dir } => crate::datapath::guard::unmount_cgroup2(dir),
        Change::Pins { dir } => match fs::remove_dir_all(dir) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("unpinning {}", dir.display()), err))
            }
            _ => Ok(()),
        },
        Change::Sysctl { key, old, new } => match sysctl::read(key) {
            Ok(now) if sysctl::same_value(&now, new) => sysctl::write(key, old),
            Ok(_) => not_ours(key),
            Err(err) => Err(err),
        },
        Change::GsoMaxSegs {
            ifname,
            index,
            old,
            new,
            before,
        } => match netlink.link(ifname).await {
            Ok(link)
                if link.index == *index
                    && (link.gso_max_segs == *new || Some(link.gso_max_segs) == *before) =>
            {
                netlink.set_gso_max_segs(*index, *old).await
            }
            Ok(link) if link.index == *index => not_ours("gso_max_segs"),
            // The interface is gone or is another one now: nothing of ours to restore.
            Ok(_) | Err(Error::UnknownInterface(_)) => Ok(()),
            Err(err) => Err(err),
        },
        Change::RouteAdded { route } => {
            if netlink
                .routes()
                .await?
                .iter()
                .any(|r| route.still_installed_as(r))
            {
                netlink.delete_route(route).await
            } else {
                not_ours("the route")
            }
        }
        // Only our change goes back: the route as it is now (whatever else an operator or a
        // daemon changed since: initcwnd, prefsrc, next hops) with its MTU as it was, where the
        // MTU is still the one we set.
        Change::RouteReplaced { old, new } => {
            let routes = netlink.routes().await?;
            match routes.iter().find(|r| new.holds_our_mtu(r)) {
                Some(current) => {
                    let mut back = current.clone();
                    back.mtu = old.mtu;
                    back.mtu_locked = old.mtu_locked;
                    netlink.add_route(&back, true).await
                }
                None => not_ours("the route's MTU"),
            }
        }
        // Removed only as we added it: a route someone replaced since stays. (A seg6local
        // route is not listed, and goes with its behaviour.)
        Change::Route6Added { route } => match route.action {
            crate::netlink::Action6::UsidEnd { .. } => netlink.delete_route6(route).await,
            crate::netlink::Action6::Via { .. } => {
                if netlink
                    .routes6()
                    .await?
                    .iter()
                    .any(|r| route.still_installed_as(r))
                {
                    netlink.delete_route6(route).await
                } else {
                    not_ours("the IPv6 route")
                }
            }
        },
        Change::TcFilter { filter } => {
            // Only a filter at our place that runs one of our programs is ours to remove.
            let listed = if netlink.has_clsact(filter.index).await.unwrap_or(false) {
                netlink.tc_filters(filter.index).await?
            } else {
                Vec::new()
            };
            match listed.iter().find(|k| k.is_at(filter)) {
                None => Ok(()),
                Some(k)
                    if k.program.as_ref().is_some_and(|(_, name)| {
                        crate::datapath::tc_hook::OUR_PROGRAMS.contains(&name.as_str())
                    }) =>
                {
                    crate::datapath::tc_hook::detach(filter)
                }
                Some(_) => not_ours("the filter at our place"),
            }
        }
        Change::Clsact { ifname, index } => {
            // The interface may be another one by now, or hold other tools' filters: only the
            // qdisc we added, once empty, goes.
            match netlink.link(ifname).await {
                Ok(link) if link.index == *index => {}
                Ok(_) | Err(Error::UnknownInterface(_)) => return Ok(()),
                Err(err) => return Err(err),
            }
            if !netlink.has_clsact(*index).await? {
                return Ok(());
            }
            if netlink.tc_filters(*index).await?.is_empty() {
                netlink.delete_clsact(*index).await
            } else {
                not_ours("the clsact qdisc (other filters are under it)")
            }
        }
    }
}
