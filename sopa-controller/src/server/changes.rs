//! Every change to the fabric: made on a copy, stored, then published to the agents, one at a
//! time; a replica whose store refuses it steps down.

use std::sync::Arc;

use sopa_channel::proto::{ChangeReply, Delta};
use tracing::{info, warn};

use crate::{
    audit::Actor,
    fabric::{Fabric, FabricError},
    store::Store,
};

use super::{Controller, meter};

/// Refuses a change that leaves two racks with no path between them, where `check` says to.
fn refuse_isolation(
    f: &Fabric,
    check: bool,
    what: impl FnOnce() -> String,
) -> Result<(), FabricError> {
    if !check {
        return Ok(());
    }
    match f.isolated_racks() {
        Some((a, b)) => Err(FabricError::WouldIsolate { what: what(), a, b }),
        None => Ok(()),
    }
}

impl Controller {
    /// Sets a link's state and pushes the change; the fabric lock orders it with every
    /// subscription, so each agent gets every version after its snapshot exactly once.
    pub async fn set_link(&self, a: &str, b: &str, down: bool) -> Result<ChangeReply, FabricError> {
        self.set_link_as(&Actor::local(), a, b, down, true).await
    }

    pub async fn set_switch(&self, name: &str, down: bool) -> Result<ChangeReply, FabricError> {
        self.set_switch_as(&Actor::local(), name, down, true).await
    }

    /// An operator's drain (or its end), kept with who asked and why. A drain that would leave
    /// two racks with no path between them is refused unless `force`.
    pub async fn set_link_as(
        &self,
        actor: &Actor,
        a: &str,
        b: &str,
        down: bool,
        force: bool,
    ) -> Result<ChangeReply, FabricError> {
        self.change_as(actor, |f| {
            let delta = f.set_link(a, b, down)?;
            refuse_isolation(f, down && !force, || format!("link {a}:{b}"))?;
            Ok(delta)
        })
        .await
    }

    /// The same for a switch.
    pub async fn set_switch_as(
        &self,
        actor: &Actor,
        name: &str,
        down: bool,
        force: bool,
    ) -> Result<ChangeReply, FabricError> {
        self.change_as(actor, |f| {
            let delta = f.set_switch(name, down)?;
            refuse_isolation(f, down && !force, || format!("switch {name}"))?;
            Ok(delta)
        })
        .await
    }

    /// Revokes certificate `serial` (hex, any common spelling) in the controller's state, so
    /// that every replica refuses it at the next handshake and closes its open streams; kept
    /// with who asked and why.
    pub async fn revoke_as(&self, actor: &Actor, serial: &str) -> Result<ChangeReply, FabricError> {
        let serials = crate::auth::parse_deny_list(std::path::Path::new("--serial"), serial)
            .map_err(|e| FabricError::BadSerial(e.to_string()))?;
        let Ok([serial]) = <[String; 1]>::try_from(serials.into_iter().collect::<Vec<_>>()) else {
            return Err(FabricError::BadSerial(format!(
                "{serial:?}: give one certificate serial, as sopactl certs show prints it"
            )));
        };
        let reply = self
            .change_as(actor, |f| {
                f.revoke(&serial, actor);
                Ok(None)
            })
            .await?;
        let now = self.fabric.lock().expect("fabric lock").revoked().clone();
        self.revoked.send_replace(Arc::new(now));
        Ok(reply)
    }

    /// The serials revoked in the controller's state, as they change.
    pub fn revoked(&self) -> tokio::sync::watch::Receiver<Arc<std::collections::BTreeSet<String>>> {
        self.revoked.subscribe()
    }

    /// Switch `by`'s report of its port's carrier on link `a`-`b`.
    pub async fn report_link(
        &self,
        a: &str,
        b: &str,
        by: &str,
        down: bool,
    ) -> Result<ChangeReply, FabricError> {
        self.change_as(&Actor::switch(by), |f| f.report_link(a, b, by, down))
            .await
    }

    /// Makes a change, durable before anyone hears of it: it is made on a copy of the fabric,
    /// the copy stored, and only then does the copy become the fabric agents and operators see.
    /// A change that cannot be stored is refused and never made. Changes run one at a time;
    /// hellos and status reads go on meanwhile (they see the fabric before the change).
    pub(super) async fn change_as(
        &self,
        actor: &Actor,
        op: impl FnOnce(&mut Fabric) -> Result<Option<Delta>, FabricError>,
    ) -> Result<ChangeReply, FabricError> {
        self.change_or_undo(actor, op, || {}).await
    }

    /// [`Controller::change_as`], with `undo` run when the change is not made (`op` failed, or
    /// its result could not be stored) before the next change begins: it puts back what `op`
    /// changed outside the fabric.
    pub(super) async fn change_or_undo(
        &self,
        actor: &Actor,
        op: impl FnOnce(&mut Fabric) -> Result<Option<Delta>, FabricError>,
        undo: impl FnOnce(),
    ) -> Result<ChangeReply, FabricError> {
        let _one_at_a_time = self.writer.lock().await;
        if let Some(why) = self.stepped_down.borrow().clone() {
            return Err(FabricError::NotDurable(why));
        }
        let mut next = self.fabric.lock().expect("fabric lock").clone();
        let before = next.checkpoint();
        let delta = match op(&mut next) {
            Ok(d) => d,
            Err(e) => {
                undo();
                return Err(e);
            }
        };
        if let Some(d) = &delta {
            next.note(actor, d);
            info!(version = d.version, who = %actor.who, what = %crate::audit::describe(d), reason = %actor.reason, "change");
        }
        if next.changed_since(&before)
            && let Err(e) = self.store.save(&next.persisted()).await
        {
            warn!(error = %e, "a change could not be stored; not made");
            self.unstored
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            undo();
            if e.ends_leadership() {
                self.lost_leadership
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                self.step_down(e.to_string());
            }
            return Err(FabricError::NotDurable(e.to_string()));
        }
        let mut f = self.fabric.lock().expect("fabric lock");
        *f = next;
        Ok(self.publish(&f, delta))
    }

    /// Whether this controller is one of several replicas (its state is in etcd).
    pub fn replicated(&self) -> bool {
        matches!(self.store, Store::Etcd(_))
    }

    /// Stops taking changes, and tells whoever runs this controller to stop serving.
    pub fn step_down(&self, why: String) {
        warn!(reason = %why, "stepping down: no further changes are taken");
        self.stepped_down.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// Whether it stepped down because it lost (or may have lost) the leadership, rather than
    /// for a state it refuses to serve.
    pub fn lost_leadership(&self) -> bool {
        self.lost_leadership
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Resolves with the reason once this controller stepped down.
    pub async fn stepped_down(&self) -> String {
        let mut rx = self.stepped_down.subscribe();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                return "the controller ended".into();
            }
        }
    }

    fn publish(&self, f: &Fabric, delta: Option<Delta>) -> ChangeReply {
        /// Whether a change brings a link or a switch back (hosts may send on it before a
        /// switch stops detouring around it).
        fn gives_back(d: &Delta) -> bool {
            use sopa_channel::proto::change::Kind;
            d.changes.iter().any(|c| match &c.kind {
                Some(Kind::Link(l)) => !l.down,
                Some(Kind::Switch(s)) => !s.down,
                None => false,
            })
        }
        let changed = delta.is_some();
        if let Some(d) = delta {
            info!(version = d.version, "fabric changed");
            // The path meter's evidence straddles the change (paths moved, a failure's losses
            // are in it): it starts again once every agent has applied it.
            self.meter.evidence.lock().expect("meter lock").changed(
                d.version,
                gives_back(&d),
                meter::tai_ns(),
            );
            // No subscribers is fine: nobody to tell.
            let _ = self.updates.send(Arc::new(d));
        }
        ChangeReply {
            version: f.version(),
            changed,
        }
    }

    /// Switch `by`'s LLDP table says `links` (of its own) are miscabled now: each link whose
    /// state for `by` changed is changed, one at a time, like every other change.
    pub async fn set_cabling(
        &self,
        by: &str,
        links: &std::collections::BTreeSet<(String, String)>,
    ) {
        let before = self.fabric.lock().expect("fabric lock").miscabled_at(by);
        let changed = before
            .symmetric_difference(links)
            .map(|k| (k.clone(), links.contains(k)))
            .collect::<Vec<_>>();
        for ((a, b), on) in changed {
            let actor = Actor::new(
                format!("switch {by}"),
                if on {
                    "LLDP: cabled otherwise than the inventory says"
                } else {
                    "LLDP: cabled as the inventory says again"
                },
            );
            match self
                .change_as(&actor, |f| f.set_miscabled(&a, &b, by, on))
                .await
            {
                Ok(_) if on => {
                    warn!(link = %format!("{a}:{b}"), by, "miscabled: kept out of every path")
                }
                Ok(_) => {
                    info!(link = %format!("{a}:{b}"), by, "cabled as the inventory says again")
                }
                Err(e) => {
                    warn!(link = %format!("{a}:{b}"), by, error = %e, "a cabling change was not made")
                }
            }
        }
    }
}
