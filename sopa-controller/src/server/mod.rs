//! The controller: its state (the fabric, agents' records, host agents' liveness, Hedera,
//! refusals), every change made durable then pushed, and the server of both gRPC services
//! (`channel`: every agent's stream; `control`: the operator API).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sopa_channel::proto::{
    self, AgentStatus, ChangeReply, Delta, HederaStatusReply, PinSet, RefusalCount, StatusReply,
};
use tokio::sync::broadcast;
use tracing::{info, warn};

use crate::{
    audit::Actor,
    auth::{DenyList, Refusals},
    damping::{Damper, DampingConfig},
    fabric::{Fabric, FabricError},
    hedera::{HederaConfig, Scheduler},
    meter::{Meter, MeterClock},
    store::Store,
    suspicion::{SuspicionConfig, Suspicions},
    tomography::JudgeConfig,
    transport::{self, Limits, ServerTls},
};

mod channel;
mod control;

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
mod meter;

pub use crate::transport::Listener;
pub use channel::{ChannelService, MAX_AWAITING_HELLO};
pub use control::ControlService;

/// One scheduling round's pin sets, by node.
type PinRound = Arc<BTreeMap<String, PinSet>>;

#[derive(Clone, Debug, Default)]
pub struct AgentRecord {
    pub role: i32,
    pub connected: bool,
    pub applied_version: u64,
    pub last_ack: u64,
    pub last_ack_at: Option<Instant>,
    pub last_nack: u64,
    pub last_error: String,
    pub agent_version: String,
    /// What the agent does without features its kernel lacks, as its hello said.
    pub fallbacks: Vec<String>,
    /// A version it neither acknowledged nor refused within [`crate::meter::MAX_SETTLE_PERIODS`]
    /// meter periods: the meter judges without waiting for it until it acknowledges one.
    pub lagging: Option<u64>,
    session: u64,
}

/// A replica: a standby until it is elected, then the controller it serves (its metrics
/// and readiness follow it).
pub type Replica = Arc<std::sync::OnceLock<Arc<Controller>>>;

pub struct Controller {
    fabric: Mutex<Fabric>,
    updates: broadcast::Sender<Arc<Delta>>,
    agents: Mutex<BTreeMap<String, AgentRecord>>,
    sessions: std::sync::atomic::AtomicU64,
    pub heartbeat: Duration,
    hedera: Mutex<Scheduler>,
    pins: broadcast::Sender<PinRound>,
    /// Host agents by topology name.
    hosts: Mutex<BTreeMap<String, HostSession>>,
    peers: tokio::sync::watch::Sender<Arc<proto::PeerAgents>>,
    /// How long a host whose agent left stays live (switches keep honouring its option): a
    /// restarting agent keeps its datapath, and its switches should not notice. Every host of
    /// the topology is live for as long after this controller starts, so a restart of the
    /// controller goes unnoticed too while the agents reconnect.
    pub agent_grace: Duration,
    started: Instant,
    /// The topology's host names.
    topology_hosts: Vec<String>,
    /// Refused clients, by reason.
    pub refusals: Arc<Refusals>,
    /// Agents' streams open now, and how many may be.
    sessions_open: std::sync::atomic::AtomicUsize,
    max_sessions: usize,
    /// Streams awaiting their hello, by client (`channel::MAX_AWAITING_HELLO` each).
    awaiting_hello: Mutex<std::collections::HashMap<String, usize>>,
    limits: Limits,
    store: Store,
    /// Changes are made one at a time: each is stored before the next is computed.
    writer: tokio::sync::Mutex<()>,
    /// Certificate serials revoked through this controller's state, for its deny list.
    revoked: tokio::sync::watch::Sender<Arc<std::collections::BTreeSet<String>>>,
    /// Set once this controller must stop serving (a replica whose store refused it as the
    /// leader), with the reason.
    stepped_down: tokio::sync::watch::Sender<Option<String>>,
    /// It stepped down because the store says another replica leads (or may): a restart
    /// waits for the leadership again.
    lost_leadership: std::sync::atomic::AtomicBool,
    /// Switches' port reports, damped.
    damper: Mutex<Damper>,
    /// What every agent's LLDP hears (`crate::cabling`).
    pub(crate) cabling: Mutex<crate::cabling::Cabling>,
    /// Changes refused because they could not be stored.
    unstored: std::sync::atomic::AtomicU64,
    /// The hosts' path meters and what they convict (see `meter`).
    pub(crate) meter: meter::MeterState,
}

/// How a controller runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// How often the controller sends each agent a heartbeat.
    pub heartbeat: Duration,
    pub hedera: HederaConfig,
    /// See [`Controller::agent_grace`].
    pub agent_grace: Duration,
    /// Agents' streams served at once; `None`: twice the topology's nodes, at least 64.
    pub max_sessions: Option<usize>,
    /// Connections and TLS handshakes.
    pub limits: Limits,
    /// Where every change is made durable before it is announced.
    pub store: Store,
    /// How switches' reports of flapping ports are damped.
    pub damping: DampingConfig,
    /// How the path meter's evidence is judged.
    pub judge: JudgeConfig,
    /// How long links the meter convicts stay drained.
    pub suspicion: SuspicionConfig,
    /// The path meter's period, which every host agent adopts from the snapshot.
    pub meter_period: Duration,
}

/// The path meter's period unless the controller is told otherwise.
pub const DEFAULT_METER_PERIOD: Duration = Duration::from_millis(250);

impl Default for Options {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(1),
            hedera: HederaConfig::default(),
            agent_grace: DEFAULT_AGENT_GRACE,
            max_sessions: None,
            limits: Limits::default(),
            store: Store::Memory,
            damping: DampingConfig::default(),
            judge: JudgeConfig::default(),
            suspicion: SuspicionConfig::default(),
            meter_period: DEFAULT_METER_PERIOD,
        }
    }
}

/// A host agent as the controller last saw it.
#[derive(Clone, Copy, Debug)]
struct HostSession {
    /// The session that holds the name.
    session: u64,
    /// When that session ended; `None` while connected.
    left: Option<Instant>,
}

/// How long a host stays live after its agent left, unless the controller is told otherwise.
pub const DEFAULT_AGENT_GRACE: Duration = Duration::from_secs(10);

impl Controller {
    pub fn new(fabric: Fabric, heartbeat: Duration) -> Arc<Self> {
        Self::with_hedera(
            fabric,
            heartbeat,
            HederaConfig::default(),
            DEFAULT_AGENT_GRACE,
        )
    }

    pub fn with_hedera(
        fabric: Fabric,
        heartbeat: Duration,
        hedera: HederaConfig,
        agent_grace: Duration,
    ) -> Arc<Self> {
        Self::with_options(
            fabric,
            Options {
                heartbeat,
                hedera,
                agent_grace,
                ..Options::default()
            },
        )
    }

    pub fn with_options(fabric: Fabric, opts: Options) -> Arc<Self> {
        let Options {
            heartbeat,
            hedera,
            agent_grace,
            max_sessions,
            limits,
            store,
            damping,
            judge,
            suspicion,
            meter_period,
        } = opts;
        let max_sessions =
            max_sessions.unwrap_or_else(|| (2 * fabric.topology().graph().nodes.len()).max(64));
        let (updates, _) = broadcast::channel(1024);
        let (pins, _) = broadcast::channel(16);
        let g = fabric.topology().graph();
        let topology_hosts: Vec<String> = g
            .nodes
            .iter()
            .filter(|n| n.kind == sopa_topology::NodeKind::Host)
            .map(|n| n.name.clone())
            .collect();
        // In the order every later message lists them (sorted), so an unchanged set is never
        // sent again.
        let peers = proto::PeerAgents {
            down: Vec::new(),
            live: topology_hosts
                .iter()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        let meter = meter::MeterState::new(
            Meter::new(
                fabric.shared_topology(),
                judge,
                MeterClock::new(meter_period, 0),
            ),
            Suspicions::new(suspicion),
        );
        let revoked = tokio::sync::watch::channel(Arc::new(fabric.revoked().clone())).0;
        Arc::new(Self {
            revoked,
            meter,
            fabric: Mutex::new(fabric),
            updates,
            agents: Mutex::new(BTreeMap::new()),
            sessions: std::sync::atomic::AtomicU64::new(1),
            heartbeat,
            hedera: Mutex::new(Scheduler::new(hedera)),
            pins,
            hosts: Mutex::new(BTreeMap::new()),
            peers: tokio::sync::watch::channel(Arc::new(peers)).0,
            agent_grace,
            started: Instant::now(),
            topology_hosts,
            refusals: Arc::default(),
            sessions_open: std::sync::atomic::AtomicUsize::new(0),
            awaiting_hello: Mutex::default(),
            max_sessions,
            limits,
            store,
            writer: tokio::sync::Mutex::new(()),
            stepped_down: tokio::sync::watch::channel(None).0,
            lost_leadership: std::sync::atomic::AtomicBool::new(false),
            damper: Mutex::new(Damper::new(damping)),
            cabling: Mutex::default(),
            unstored: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A host agent connected or left; republishes the host agents' states (and once more
    /// when a departed agent's grace period ends).
    fn host_session(self: &Arc<Self>, name: &str, session: u64, up: bool) {
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
    fn publish_peers(&self) {
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

    /// Runs Hedera's scheduling rounds forever: each round places the reported elephants and
    /// pushes every reporting agent its pins.
    pub async fn run_hedera(self: Arc<Self>) {
        let interval = self.hedera.lock().expect("hedera lock").config.interval;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // The round runs without the fabric's lock, which every hello and every change
            // takes: only the failures of this moment are copied under it.
            let (topology, failures) = {
                let f = self.fabric.lock().expect("fabric lock");
                (f.shared_topology(), f.failures())
            };
            let sets = self.hedera.lock().expect("hedera lock").round(
                &topology,
                &failures,
                Instant::now(),
            );
            if !sets.is_empty() {
                let _ = self.pins.send(Arc::new(sets));
            }
        }
    }

    pub fn hedera_status(&self) -> HederaStatusReply {
        self.hedera.lock().expect("hedera lock").status()
    }

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
    async fn change_as(
        &self,
        actor: &Actor,
        op: impl FnOnce(&mut Fabric) -> Result<Option<Delta>, FabricError>,
    ) -> Result<ChangeReply, FabricError> {
        self.change_or_undo(actor, op, || {}).await
    }

    /// [`Controller::change`], with `undo` run when the change is not made (`op` failed, or
    /// its result could not be stored) before the next change begins: it puts back what `op`
    /// changed outside the fabric.
    async fn change_or_undo(
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

    /// The name of the host with address `addr`, if the topology has one.
    fn host_by_addr(&self, addr: std::net::Ipv4Addr) -> Option<String> {
        let f = self.fabric.lock().expect("fabric lock");
        let t = f.topology();
        t.host_by_addr(addr).map(|n| t.graph().name(n).to_owned())
    }

    /// What kind of node `name` is in the topology, if it is one.
    fn node_kind(&self, name: &str) -> Option<sopa_topology::NodeKind> {
        let f = self.fabric.lock().expect("fabric lock");
        let g = f.topology().graph();
        g.find(name).map(|n| g.node(n).kind)
    }

    fn record(&self, node: &str, session: u64, f: impl FnOnce(&mut AgentRecord)) {
        let mut agents = self.agents.lock().expect("agents lock");
        if let Some(r) = agents.get_mut(node)
            && r.session == session
        {
            f(r);
        }
    }
}

/// Serves both services on `listener` until `shutdown` resolves. With `tls`, only clients
/// whose certificate verifies against the fabric's CA, names a node and is not revoked get
/// through the handshake, and each is held to its role.
pub async fn serve(
    controller: Arc<Controller>,
    listener: impl Into<Listener>,
    tls: Option<ServerTls>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let deny = tls.as_ref().map_or_else(DenyList::none, |t| t.deny.clone());
    let _reload_deny_list = deny.watch(Duration::from_secs(1)).map(AbortOnDrop);
    // The serials revoked in the state (every replica's the same), with the file's.
    let _follow_revoked = {
        let (deny, mut revoked) = (deny.clone(), controller.revoked());
        deny.set_stored(&revoked.borrow_and_update());
        AbortOnDrop(tokio::spawn(async move {
            while revoked.changed().await.is_ok() {
                let now = revoked.borrow_and_update().clone();
                deny.set_stored(&now);
            }
        }))
    };
    let _reload_own_certificate = tls
        .as_ref()
        .map(|t| AbortOnDrop(t.own.watch(Duration::from_secs(1))));
    let mut builder = tonic::transport::Server::builder()
        // A client that vanished (power loss, a cut link) is found by its missed heartbeats,
        // and its connection closed by unanswered HTTP/2 pings, not after TCP's 15 minutes.
        .http2_keepalive_interval(Some(sopa_channel::client::KEEPALIVE))
        .http2_keepalive_timeout(Some(sopa_channel::client::KEEPALIVE));
    let require_identity = tls.is_some();
    let channel = proto::channel::channel_server::ChannelServer::new(ChannelService {
        controller: Arc::clone(&controller),
        deny: deny.clone(),
        require_identity,
    })
    .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
    .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    let scheduler = tokio::spawn(Arc::clone(&controller).run_hedera());
    let _stop_scheduler = AbortOnDrop(scheduler);
    let suspicions = tokio::spawn(Arc::clone(&controller).run_suspicions());
    let _stop_suspicions = AbortOnDrop(suspicions);
    // The hosts that have not reconnected when this controller's start-up grace ends stop
    // being live.
    let startup = {
        let c = Arc::clone(&controller);
        tokio::spawn(async move {
            tokio::time::sleep(c.agent_grace.saturating_sub(c.started.elapsed())).await;
            c.publish_peers();
        })
    };
    let _stop_startup = AbortOnDrop(startup);
    let incoming = transport::incoming(
        listener.into(),
        tls.as_ref(),
        controller.limits,
        Arc::clone(&controller.refusals),
    );
    let control = proto::control::control_server::ControlServer::new(ControlService {
        controller,
        deny,
        require_identity,
    })
    .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
    .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    // grpc.health.v1: SERVING for the server ("") and each service while this replica leads
    // (a standby binds nothing; it answers on its metrics address, GET /readyz).
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<proto::channel::channel_server::ChannelServer<ChannelService>>()
        .await;
    health
        .set_serving::<proto::control::control_server::ControlServer<ControlService>>()
        .await;
    builder
        .add_service(health_service)
        .add_service(channel)
        .add_service(control)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Ends a task when the server it belongs to returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
