//! The controller's gRPC services: the push channel every agent holds open, and the operator
//! API behind `sopactl`.

use std::{
    collections::BTreeMap,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use crate::{
    fabric::{Fabric, FabricError},
    hedera::{HederaConfig, Scheduler},
    proto::{
        self, AgentMessage, AgentStatus, ChangeReply, ControllerMessage, Delta, Heartbeat,
        HederaStatusReply, HederaStatusRequest, LinkChange, PinSet, Role, StatusReply,
        StatusRequest, SwitchChange, agent_message, controller_message,
    },
};

/// One scheduling round's pin sets, by node.
type PinRound = Arc<BTreeMap<String, PinSet>>;

/// How long an agent has to say hello after opening the stream.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

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
    session: u64,
}

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

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn to_status(e: FabricError) -> Status {
    match e {
        FabricError::UnknownNode(_) | FabricError::NoLink(..) => Status::not_found(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

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
        Arc::new(Self {
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
            self.publish_peers_locked(&hosts);
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
            let sets = {
                let f = self.fabric.lock().expect("fabric lock");
                let failures = f.failures();
                self.hedera.lock().expect("hedera lock").round(
                    f.topology(),
                    &failures,
                    Instant::now(),
                )
            };
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
    pub fn set_link(&self, a: &str, b: &str, down: bool) -> Result<ChangeReply, FabricError> {
        let mut f = self.fabric.lock().expect("fabric lock");
        let delta = f.set_link(a, b, down)?;
        Ok(self.publish(&f, delta))
    }

    pub fn set_switch(&self, name: &str, down: bool) -> Result<ChangeReply, FabricError> {
        let mut f = self.fabric.lock().expect("fabric lock");
        let delta = f.set_switch(name, down)?;
        Ok(self.publish(&f, delta))
    }

    fn publish(&self, f: &Fabric, delta: Option<Delta>) -> ChangeReply {
        let changed = delta.is_some();
        if let Some(d) = delta {
            info!(version = d.version, "fabric changed");
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

    pub fn agents(&self) -> BTreeMap<String, AgentRecord> {
        self.agents.lock().expect("agents lock").clone()
    }

    pub fn status(&self) -> StatusReply {
        let f = self.fabric.lock().expect("fabric lock");
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
            })
            .collect();
        StatusReply {
            epoch: f.epoch(),
            version: f.version(),
            topology: f.spec_json().to_owned(),
            down_links: f.down_links(),
            down_switches: f.down_switches(),
            agents,
        }
    }

    fn record(&self, node: &str, session: u64, f: impl FnOnce(&mut AgentRecord)) {
        let mut agents = self.agents.lock().expect("agents lock");
        if let Some(r) = agents.get_mut(node)
            && r.session == session
        {
            f(r);
        }
    }

    /// `node` names the agent; `name` is its node in the topology.
    fn handle(&self, node: &str, name: &str, role: i32, session: u64, msg: AgentMessage) {
        match msg.kind {
            Some(agent_message::Kind::Ack(a)) => self.record(node, session, |r| {
                r.applied_version = a.version;
                r.last_ack = a.version;
                r.last_ack_at = Some(Instant::now());
            }),
            Some(agent_message::Kind::Nack(n)) => {
                warn!(node, version = n.version, error = %n.error, "agent rejected a version");
                self.record(node, session, |r| {
                    r.last_nack = n.version;
                    r.last_error = n.error.clone();
                });
            }
            Some(agent_message::Kind::Report(rep)) if role == Role::Switch as i32 => {
                if let Err(e) = self.set_link(&rep.a, &rep.b, rep.down) {
                    warn!(node, error = %e, "a switch agent reported an unknown link");
                }
            }
            Some(agent_message::Kind::Report(_)) => {
                warn!(node, "link report from a non-switch agent ignored")
            }
            Some(agent_message::Kind::Flows(rep)) => {
                let f = self.fabric.lock().expect("fabric lock");
                let result = self.hedera.lock().expect("hedera lock").accept_report(
                    f.topology(),
                    name,
                    &rep,
                    Instant::now(),
                );
                if let Err(e) = result {
                    warn!(node, error = %e, "flow report refused");
                }
            }
            Some(agent_message::Kind::PinAck(ack)) => {
                if !ack.error.is_empty() {
                    warn!(node, round = ack.round, error = %ack.error, "an agent refused its pins");
                }
                self.hedera.lock().expect("hedera lock").pin_ack(name, &ack);
            }
            Some(agent_message::Kind::Hello(_)) => {
                warn!(node, "a second hello on one stream ignored")
            }
            Some(agent_message::Kind::Heartbeat(_)) | None => {}
        }
    }
}

fn snapshot_msg(f: &Fabric) -> ControllerMessage {
    ControllerMessage {
        kind: Some(controller_message::Kind::Snapshot(f.snapshot())),
    }
}

fn delta_msg(d: Delta) -> ControllerMessage {
    ControllerMessage {
        kind: Some(controller_message::Kind::Delta(d)),
    }
}

/// The push channel service.
pub struct ChannelService(pub Arc<Controller>);

type Outbound = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl proto::channel::channel_server::Channel for ChannelService {
    type StreamStream = Outbound;

    async fn stream(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Outbound>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within 10 s"))??
            .ok_or_else(|| Status::invalid_argument("the stream ended before a hello"))?;
        let Some(agent_message::Kind::Hello(hello)) = first.kind else {
            return Err(Status::invalid_argument(
                "the first message must be a hello",
            ));
        };
        if hello.node.is_empty() || hello.node.len() > 128 || hello.topology_name.len() > 128 {
            return Err(Status::invalid_argument(
                "hello: the node name must be 1 to 128 bytes (the topology name at most 128)",
            ));
        }
        let controller = Arc::clone(&self.0);
        let session = controller
            .sessions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (initial, mut updates, mut last_sent) = {
            let f = controller.fabric.lock().expect("fabric lock");
            let updates = controller.updates.subscribe();
            let initial = match f.deltas_since(hello.epoch, hello.version) {
                Some(deltas) => deltas.into_iter().map(delta_msg).collect(),
                None => vec![snapshot_msg(&f)],
            };
            (initial, updates, f.version())
        };
        controller.agents.lock().expect("agents lock").insert(
            hello.node.clone(),
            AgentRecord {
                role: hello.role,
                connected: true,
                applied_version: hello.version,
                agent_version: hello.agent_version.clone(),
                session,
                ..AgentRecord::default()
            },
        );
        info!(node = %hello.node, version = hello.version, snapshot = initial.len() == 1 && matches!(initial[0].kind, Some(controller_message::Kind::Snapshot(_))), "agent connected");
        let mut pins = controller.pins.subscribe();
        let mut peers = controller.peers.subscribe();
        let (tx, rx) = mpsc::channel::<Result<ControllerMessage, Status>>(64);
        let name = if hello.topology_name.is_empty() {
            hello.node.clone()
        } else {
            hello.topology_name.clone()
        };
        let node = hello.node;
        let role = hello.role;
        let is_host = role == Role::Host as i32;
        if is_host {
            controller.host_session(&name, session, true);
        }
        tokio::spawn(async move {
            let send = |m: ControllerMessage| tx.send(Ok(m));
            let peers_msg = |p: &Arc<proto::PeerAgents>| ControllerMessage {
                kind: Some(controller_message::Kind::Peers(p.as_ref().clone())),
            };
            // The host agents' states come first: a switch installs its plan with its trusted
            // ports already known.
            let current = peers.borrow_and_update().clone();
            let sent_initial = async {
                send(peers_msg(&current)).await?;
                for m in initial {
                    send(m).await?;
                }
                Ok::<_, mpsc::error::SendError<_>>(())
            };
            if sent_initial.await.is_err() {
                controller.record(&node, session, |r| r.connected = false);
                if is_host {
                    controller.host_session(&name, session, false);
                }
                return;
            }
            let mut tick = tokio::time::interval(controller.heartbeat);
            loop {
                tokio::select! {
                    update = updates.recv() => match update {
                        Ok(d) if d.version > last_sent => {
                            last_sent = d.version;
                            if send(delta_msg((*d).clone())).await.is_err() { break; }
                        }
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let snap = {
                                let f = controller.fabric.lock().expect("fabric lock");
                                last_sent = f.version();
                                snapshot_msg(&f)
                            };
                            if send(snap).await.is_err() { break; }
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                    round = pins.recv() => match round {
                        Ok(sets) => if let Some(set) = sets.get(&name) {
                            let m = ControllerMessage { kind: Some(controller_message::Kind::Pins(set.clone())) };
                            if send(m).await.is_err() { break; }
                        },
                        // A missed round is superseded by the next one.
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                    changed = peers.changed() => {
                        if changed.is_err() { break; }
                        let current = peers.borrow_and_update().clone();
                        if send(peers_msg(&current)).await.is_err() { break; }
                    },
                    msg = inbound.message() => match msg {
                        Ok(Some(m)) => controller.handle(&node, &name, role, session, m),
                        Ok(None) | Err(_) => break,
                    },
                    _ = tick.tick() => {
                        let hb = ControllerMessage { kind: Some(controller_message::Kind::Heartbeat(Heartbeat { unix_ms: now_ms() })) };
                        if send(hb).await.is_err() { break; }
                    }
                }
            }
            controller.record(&node, session, |r| r.connected = false);
            if is_host {
                controller.host_session(&name, session, false);
            }
            info!(node = %node, "agent disconnected");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The operator API.
pub struct ControlService(pub Arc<Controller>);

#[tonic::async_trait]
impl proto::control::control_server::Control for ControlService {
    async fn set_link(
        &self,
        request: Request<LinkChange>,
    ) -> Result<Response<ChangeReply>, Status> {
        let change = request.into_inner();
        let link = change
            .link
            .ok_or_else(|| Status::invalid_argument("no link given"))?;
        self.0
            .set_link(&link.a, &link.b, change.down)
            .map(Response::new)
            .map_err(to_status)
    }

    async fn set_switch(
        &self,
        request: Request<SwitchChange>,
    ) -> Result<Response<ChangeReply>, Status> {
        let change = request.into_inner();
        self.0
            .set_switch(&change.name, change.down)
            .map(Response::new)
            .map_err(to_status)
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        Ok(Response::new(self.0.status()))
    }

    async fn hedera_status(
        &self,
        _: Request<HederaStatusRequest>,
    ) -> Result<Response<HederaStatusReply>, Status> {
        Ok(Response::new(self.0.hedera_status()))
    }
}

/// Where the controller listens: TCP, or a Unix socket (reachable from every network
/// namespace of a host, as a testbed's management path).
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Serves both services on `listener` until `shutdown` resolves. With `tls`, only clients
/// whose certificate verifies against its client CA get through the handshake.
pub async fn serve(
    controller: Arc<Controller>,
    listener: impl Into<Listener>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let channel =
        proto::channel::channel_server::ChannelServer::new(ChannelService(Arc::clone(&controller)))
            .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    let scheduler = tokio::spawn(Arc::clone(&controller).run_hedera());
    let _stop_scheduler = AbortOnDrop(scheduler);
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
    let control = proto::control::control_server::ControlServer::new(ControlService(controller))
        .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    let router = builder.add_service(channel).add_service(control);
    match listener.into() {
        Listener::Tcp(l) => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(l),
                    shutdown,
                )
                .await
        }
        Listener::Unix(l) => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(l),
                    shutdown,
                )
                .await
        }
    }
}

/// Ends a task when the server it belongs to returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl From<tokio::net::TcpListener> for Listener {
    fn from(l: tokio::net::TcpListener) -> Self {
        Self::Tcp(l)
    }
}

impl From<tokio::net::UnixListener> for Listener {
    fn from(l: tokio::net::UnixListener) -> Self {
        Self::Unix(l)
    }
}
