//! Host agents' liveness: which hosts are live or down, republished to every agent as sessions
//! come and go.

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use sopa_channel::proto::{self};

use super::{Controller, HostSession};

impl Controller {
    /// A host agent connected or left; republishes the host agents' states (and once more
    /// when a departed agent's grace period ends).
    pub(super) fn host_session(self: &Arc<Self>, name: &str, session: u64, up: bool) {
        {
            let mut hosts = self.hosts.lock().expect("hosts lock");
            match hosts.get(name) {
                // A stale session's end must not mark a reconnected agent down.
                Some(h) if !up && h.session != session => return,
                _ => {}
            }
            hosts.insert(
                name.to_owned(),
                HostSession {
                    session,
                    left: (!up).then(Instant::now),
                },
            );
            // A host that connects while already live and not down changes neither set:
            // the states are not computed again (each computation walks every host, and
            // thousands of agents reconnect at once after a failover).
            let unchanged = up && {
                let cur = self.peers.borrow();
                let has = |v: &[String]| v.binary_search_by(|n| n.as_str().cmp(name)).is_ok();
                has(&cur.live) && !has(&cur.down)
            };
            if !unchanged {
                self.publish_peers_locked(&hosts);
            }
        }
        if !up {
            let controller = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(controller.agent_grace).await;
                controller.publish_peers();
            });
        }
    }

    /// Sends every agent the host agents' states, if they changed.
    pub(super) fn publish_peers(&self) {
        let hosts = self.hosts.lock().expect("hosts lock");
        self.publish_peers_locked(&hosts);
    }

    /// [`Controller::publish_peers`] with the hosts held: states computed and sent under one
    /// lock, so two publishers never send out of order.
    fn publish_peers_locked(&self, hosts: &BTreeMap<String, HostSession>) {
        let mut live: std::collections::BTreeSet<String> = hosts
            .iter()
            .filter(|(_, h)| h.left.is_none_or(|t| t.elapsed() < self.agent_grace))
            .map(|(n, _)| n.clone())
            .collect();
        if self.started.elapsed() < self.agent_grace {
            live.extend(self.topology_hosts.iter().cloned());
        }
        let peers = proto::PeerAgents {
            down: hosts
                .iter()
                .filter(|(_, h)| h.left.is_some())
                .map(|(n, _)| n.clone())
                .collect(),
            live: live.into_iter().collect(),
        };
        self.peers.send_if_modified(|cur| {
            if **cur == peers {
                false
            } else {
                *cur = Arc::new(peers);
                true
            }
        });
    }

    /// The host agents' states as last sent to every agent.
    pub fn peers(&self) -> proto::PeerAgents {
        self.peers.borrow().as_ref().clone()
    }
}
