//! The controller: its state (the fabric, agents' records, host agents' liveness, Hedera,
//! refusals), every change made durable then pushed, and the server of both gRPC services
//! (`channel`: every agent's stream; `control`: the operator API).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sopa_channel::proto::{self, Delta, PinSet};
use tokio::sync::broadcast;

use crate::{
    auth::Refusals,
    damping::{Damper, DampingConfig},
    fabric::Fabric,
    hedera::{HederaConfig, Scheduler},
    meter::{Meter, MeterClock},
    store::Store,
    suspicion::{SuspicionConfig, Suspicions},
    tomography::JudgeConfig,
    transport::Limits,
};

mod changes;
mod channel;
mod control;
mod hedera;
mod meter;
mod peers;
mod serve;
mod status;

pub use crate::transport::Listener;
pub use channel::{ChannelService, MAX_AWAITING_HELLO};
pub use control::ControlService;
pub use serve::serve;

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
