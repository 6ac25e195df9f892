//! The controller's state as operators read it: status, agents, the change history.

use std::{collections::BTreeMap, time::Instant};

use sopa_channel::proto::{self, AgentStatus, RefusalCount, StatusReply};

use super::{AgentRecord, Controller};

impl Controller {
    /// The newest changes, newest last: at most `limit` (0: all kept).
    pub fn history(&self, limit: usize) -> Vec<crate::audit::AuditRecord> {
        let f = self.fabric.lock().expect("fabric lock");
        let all = f.audit().to_vec();
        let skip = if limit == 0 {
            0
        } else {
            all.len().saturating_sub(limit)
        };
        all.into_iter().skip(skip).collect()
    }

    pub fn version(&self) -> u64 {
        self.fabric.lock().expect("fabric lock").version()
    }

    /// Agent streams open now that have not said hello yet (they hold no session slot).
    pub fn streams_awaiting_hello(&self) -> usize {
        self.awaiting_hello
            .lock()
            .expect("awaiting lock")
            .values()
            .sum()
    }

    pub fn agents(&self) -> BTreeMap<String, AgentRecord> {
        self.agents.lock().expect("agents lock").clone()
    }

    /// What `sopactl status` shows. The fabric's lock is held only to copy its state; the
    /// meter's links come from its last judged period, computed then, not for each viewer.
    pub fn status(&self) -> StatusReply {
        let (epoch, version, topology, down_links, drained_links, down_switches) = {
            let f = self.fabric.lock().expect("fabric lock");
            (
                f.epoch(),
                f.version(),
                f.spec_json().to_owned(),
                f.down_links(),
                f.drained_links(),
                f.down_switches(),
            )
        };
        let agents = self
            .agents
            .lock()
            .expect("agents lock")
            .iter()
            .map(|(node, r)| AgentStatus {
                node: node.clone(),
                role: r.role,
                connected: r.connected,
                applied_version: r.applied_version,
                last_ack: r.last_ack,
                last_nack: r.last_nack,
                last_error: r.last_error.clone(),
                agent_version: r.agent_version.clone(),
                fallbacks: r.fallbacks.clone(),
                lagging_version: r.lagging.unwrap_or(0),
            })
            .collect();
        StatusReply {
            epoch,
            version,
            topology,
            down_links,
            drained_links,
            held_links: self
                .damper
                .lock()
                .expect("damper lock")
                .held(Instant::now())
                .into_iter()
                .map(|((a, b), left, up_pending)| proto::HeldLink {
                    link: Some(proto::LinkRef { a, b }),
                    remaining_ms: left.as_millis() as u64,
                    up_pending,
                })
                .collect(),
            down_switches,
            agents,
            refusals: self
                .refusals
                .counts()
                .into_iter()
                .map(|(r, count)| RefusalCount {
                    reason: r.as_str().to_owned(),
                    count,
                })
                .collect(),
            store: self.store.to_string(),
            leader: self.store.leader().unwrap_or_default(),
            changes_not_stored: self.unstored.load(std::sync::atomic::Ordering::Relaxed),
            suspect_links: self.meter.suspect_links(),
            trusted_links: self.meter.trusted_links(),
            link_loss: self.meter.link_loss(),
            meter_hosts: self.meter.named_hosts(),
            miscabled: {
                let topo = self.fabric.lock().expect("fabric lock").shared_topology();
                self.cabling.lock().expect("cabling lock").mismatches(&topo)
            },
            neighbours: self.cabling.lock().expect("cabling lock").tables(),
        }
    }
}
