//! The push channel's service: each agent's stream, from its hello (held to the identity its
//! certificate names and to the topology) through snapshots, deltas, pins and heartbeats, to
//! its end (it left, fell silent for three heartbeats, or its certificate was revoked).

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sopa_channel::{
    identity,
    proto::{
        self, AgentMessage, ChangeReply, ControllerMessage, Delta, Heartbeat, MAX_TEXT_BYTES, Role,
        agent_message, bounded, controller_message,
    },
};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use super::{AgentRecord, Controller};
use crate::{
    audit::Actor,
    auth::{DenyList, Peer, Refusal},
    damping::{Damper, Verdict},
    fabric::{Fabric, FabricError},
    meter::MeterClock,
};

/// How long an agent has to say hello after opening the stream.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// One agent's stream, as the controller knows it.
struct Session {
    /// The key of the agent's record: its node from the certificate, or (plaintext) the node
    /// named in its hello.
    node: String,
    /// Its node in the topology.
    name: String,
    role: i32,
    id: u64,
    peer: Peer,
    /// This session's port reports, applied in order by a task of their own, so that a slow
    /// store never holds up the stream's heartbeats and deltas.
    reports: tokio::sync::mpsc::Sender<PortEvent>,
    /// When the session began (its hello taken).
    started: std::time::Instant,
}

/// What a switch's session tells about its ports, applied in order.
enum PortEvent {
    /// A port's carrier on link (a, b).
    Carrier(String, String, bool),
    /// The links its LLDP finds miscabled now.
    Cabling(std::collections::BTreeSet<(String, String)>),
}

/// Port reports one switch may have waiting to be applied.
const REPORT_QUEUE: usize = 1024;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Controller {
    /// A switch's port report, through flap damping: a down is applied at once; an up of a
    /// link held down waits for the end of its hold. The verdict and the change are made
    /// within one change (changes run one at a time), so a hold that ends never overtakes a
    /// later down.
    async fn damped_report(self: &Arc<Self>, a: &str, b: &str, by: &str, down: bool) {
        let key = if a <= b {
            (a.to_owned(), b.to_owned())
        } else {
            (b.to_owned(), a.to_owned())
        };
        let mut hold = None;
        let result = self
            .damped_change(&Actor::switch(by), &key, |f, damper| {
                f.check_link(a, b)?;
                match damper.report(&key, by, down, Instant::now()) {
                    Verdict::Held { until } => {
                        info!(link = %format!("{a}:{b}"), held_ms = until.saturating_duration_since(Instant::now()).as_millis() as u64, "a flapping link is up again; held down until its hold ends");
                        Ok(None)
                    }
                    Verdict::ApplyAndHold { until } => {
                        hold = Some(until);
                        f.report_link(a, b, by, down)
                    }
                    Verdict::Apply => f.report_link(a, b, by, down),
                }
            })
            .await;
        if let Err(e) = result {
            warn!(error = %e, "a switch's port report was not applied");
            return;
        }
        let Some(until) = hold else {
            return;
        };
        warn!(link = %format!("{a}:{b}"), hold_ms = until.saturating_duration_since(Instant::now()).as_millis() as u64, "link flapping: held down");
        let c = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(until.into()).await;
            // Until the hold's end is made (a change that cannot be stored is tried again
            // each second, the hold kept meanwhile), or this controller stepped down.
            loop {
                let result = c
                    .damped_change(
                        &Actor::new("controller", "a flapping link's hold ended"),
                        &key,
                        |f, damper| {
                            let mut delta = None;
                            for by in damper.release(&key, Instant::now()) {
                                delta = f.report_link(&key.0, &key.1, &by, false)?.or(delta);
                            }
                            Ok(delta)
                        },
                    )
                    .await;
                let Err(e) = result else { break };
                if c.stepped_down.borrow().is_some() {
                    break;
                }
                warn!(error = %e, link = %format!("{}:{}", key.0, key.1), "ending a flapping link's hold; trying again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    /// [`Controller::change_as`] made of what the damper decides about `key`: if the change is
    /// not made, the damper's state for that link is put back, so a report that was not made
    /// counts for nothing.
    async fn damped_change(
        &self,
        actor: &Actor,
        key: &(String, String),
        op: impl FnOnce(&mut Fabric, &mut Damper) -> Result<Option<Delta>, FabricError>,
    ) -> Result<ChangeReply, FabricError> {
        let saved = Mutex::new(None);
        self.change_or_undo(
            actor,
            |f| {
                let mut damper = self.damper.lock().expect("damper lock");
                *saved.lock().expect("saved lock") = Some(damper.save(key));
                op(f, &mut damper)
            },
            || {
                if let Some(s) = saved.lock().expect("saved lock").take() {
                    self.damper.lock().expect("damper lock").restore(key, s);
                }
            },
        )
        .await
    }

    /// One message of an agent's stream.
    fn handle(self: &Arc<Self>, s: &Session, msg: AgentMessage) {
        let (node, session) = (s.node.as_str(), s.id);
        match msg.kind {
            Some(agent_message::Kind::Ack(a)) => {
                self.record(node, session, |r| {
                    r.applied_version = a.version;
                    r.last_ack = a.version;
                    r.last_ack_at = Some(Instant::now());
                    if r.lagging.is_some_and(|v| a.version >= v) {
                        info!(node, version = a.version, "a lagging agent caught up");
                        r.lagging = None;
                    }
                });
                self.settle_meter();
            }
            Some(agent_message::Kind::Nack(n)) => {
                let error = bounded(&n.error, MAX_TEXT_BYTES);
                warn!(node, version = n.version, error = %error, "agent rejected a version");
                self.record(node, session, |r| {
                    r.last_nack = n.version;
                    r.last_error = error;
                });
                self.settle_meter();
            }
            Some(agent_message::Kind::Report(rep)) if s.role == Role::Switch as i32 => {
                if rep.a != s.name && rep.b != s.name {
                    self.refusals.refuse(
                        Refusal::ForeignPort,
                        &s.peer_name(),
                        &format!(
                            "a report of {}:{}, not a port of {}",
                            bounded(&rep.a, 64),
                            bounded(&rep.b, 64),
                            s.name
                        ),
                    );
                } else if s
                    .reports
                    .try_send(PortEvent::Carrier(rep.a, rep.b, rep.down))
                    .is_err()
                {
                    warn!(
                        node,
                        "more than {REPORT_QUEUE} port reports waiting; one dropped (the switch reports every port again when it reconnects)"
                    );
                }
            }
            Some(agent_message::Kind::Neighbours(rep)) => {
                let role = if s.role == Role::Switch as i32 {
                    Role::Switch
                } else {
                    Role::Host
                };
                let topology = self.fabric.lock().expect("fabric lock").shared_topology();
                let ports = {
                    let mut c = self.cabling.lock().expect("cabling lock");
                    c.set(&s.name, role, &rep);
                    c.tables()
                        .into_iter()
                        .find(|t| t.node == s.name)
                        .map(|t| t.ports)
                        .unwrap_or_default()
                };
                for m in crate::cabling::mismatches(&topology, &s.name, &ports) {
                    warn!(node, "{}", crate::cabling::describe(&m));
                }
                // A switch's word keeps a link out; a host's is shown only.
                if role == Role::Switch && crate::cabling::checkable(&topology) {
                    let links = crate::cabling::miscabled_links(&topology, &s.name, &ports);
                    if s.reports.try_send(PortEvent::Cabling(links)).is_err() {
                        warn!(
                            node,
                            "port reports queue full; an LLDP table dropped (sent again at the next change or session)"
                        );
                    }
                }
            }
            Some(agent_message::Kind::Report(_)) => self.refusals.refuse(
                Refusal::Role,
                &s.peer_name(),
                "a link report from a host agent",
            ),
            Some(agent_message::Kind::Flows(rep)) => {
                if s.role != Role::Host as i32 {
                    self.refusals.refuse(
                        Refusal::Role,
                        &s.peer_name(),
                        "a flow report from a switch agent",
                    );
                    return;
                }
                let topology = self.fabric.lock().expect("fabric lock").shared_topology();
                let result = self.hedera.lock().expect("hedera lock").accept_report(
                    &topology,
                    &s.name,
                    &rep,
                    Instant::now(),
                );
                match result {
                    Ok(()) => {}
                    Err(e @ crate::hedera::ReportError::NotFromReporter(..)) => self
                        .refusals
                        .refuse(Refusal::ForeignFlow, &s.peer_name(), &e.to_string()),
                    Err(e) => warn!(node, error = %e, "flow report refused"),
                }
            }
            Some(agent_message::Kind::PinAck(_)) if s.role != Role::Host as i32 => {
                self.refusals.refuse(
                    Refusal::Role,
                    &s.peer_name(),
                    "a pin acknowledgement from a switch agent",
                )
            }
            Some(agent_message::Kind::PinAck(mut ack)) => {
                ack.error = bounded(&ack.error, MAX_TEXT_BYTES);
                if !ack.error.is_empty() {
                    warn!(node, round = ack.round, error = %ack.error, "an agent refused its pins");
                }
                self.hedera
                    .lock()
                    .expect("hedera lock")
                    .pin_ack(&s.name, &ack);
            }
            Some(agent_message::Kind::Paths(_)) if s.role != Role::Host as i32 => {
                self.refusals.refuse(
                    Refusal::Role,
                    &s.peer_name(),
                    "a path report from a switch agent",
                )
            }
            Some(agent_message::Kind::Paths(rep)) => self.accept_paths(
                crate::meter::Reporter {
                    host: &s.name,
                    session_age: s.started.elapsed(),
                },
                rep,
            ),
            Some(agent_message::Kind::Hello(_)) => {
                warn!(node, "a second hello on one stream ignored")
            }
            Some(agent_message::Kind::Heartbeat(_)) | None => {}
        }
    }
}

impl Session {
    /// Who this is, for a refusal's log line.
    fn peer_name(&self) -> String {
        match &self.peer.identity {
            Some(id) => format!("{id} ({})", self.peer.addr),
            None => format!("{} ({}, unauthenticated)", self.node, self.peer.addr),
        }
    }
}

/// `f`'s snapshot, with the path meter's clock every host agent adopts.
fn snapshot_msg(f: &Fabric, clock: &MeterClock) -> ControllerMessage {
    let snapshot = proto::Snapshot {
        meter_period_ms: clock.period_ms(),
        meter_epoch_ns: clock.epoch_ns(),
        ..f.snapshot()
    };
    ControllerMessage {
        kind: Some(controller_message::Kind::Snapshot(snapshot)),
    }
}

fn delta_msg(d: Delta) -> ControllerMessage {
    ControllerMessage {
        kind: Some(controller_message::Kind::Delta(d)),
    }
}

/// The push channel service.
pub struct ChannelService {
    pub controller: Arc<Controller>,
    /// Certificates refused from now on; their open streams close.
    pub deny: DenyList,
    /// Served over TLS: a request without a verified identity is refused.
    pub require_identity: bool,
}

type Outbound = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

/// An admitted agent stream's place in the controller's session count: taken after its
/// hello, so streams that never say one hold none.
struct SessionSlot(Arc<Controller>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0
            .sessions_open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Streams one client (a certificate's identity, or an address without one) may hold open
/// awaiting their hello.
pub const MAX_AWAITING_HELLO: usize = 4;

/// A stream awaiting its hello, counted against its client's [`MAX_AWAITING_HELLO`].
struct AwaitingHello {
    controller: Arc<Controller>,
    /// `None`: a client no count holds (a Unix socket's, without a certificate: local).
    client: Option<String>,
}

impl AwaitingHello {
    fn take(controller: &Arc<Controller>, client: Option<String>) -> Option<Self> {
        if let Some(c) = &client {
            let mut waiting = controller.awaiting_hello.lock().expect("awaiting lock");
            let n = waiting.entry(c.clone()).or_default();
            if *n >= MAX_AWAITING_HELLO {
                return None;
            }
            *n += 1;
        }
        Some(Self {
            controller: Arc::clone(controller),
            client,
        })
    }
}

impl Drop for AwaitingHello {
    fn drop(&mut self) {
        let Some(c) = &self.client else {
            return;
        };
        let mut waiting = self
            .controller
            .awaiting_hello
            .lock()
            .expect("awaiting lock");
        if let Some(n) = waiting.get_mut(c) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(c);
            }
        }
    }
}

impl ChannelService {
    /// Refuses (counted, logged) with `status`.
    fn refuse(&self, reason: Refusal, who: &dyn std::fmt::Display, status: Status) -> Status {
        self.controller
            .refusals
            .refuse(reason, who, status.message());
        status
    }

    /// Checks a hello against the peer's certificate and the topology; returns the agent's
    /// record key and its topology name.
    fn admit(&self, peer: &Peer, hello: &proto::Hello) -> Result<(String, String), Status> {
        let c = &self.controller;
        if let Err(why) = hello.check_fields() {
            return Err(self.refuse(Refusal::FieldTooLong, peer, Status::invalid_argument(why)));
        }
        let name = if hello.topology_name.is_empty() {
            hello.node.clone()
        } else {
            hello.topology_name.clone()
        };
        let claimed = match Role::try_from(hello.role) {
            Ok(Role::Host) => Some(identity::Role::Host),
            Ok(Role::Switch) => Some(identity::Role::Switch),
            _ => None,
        };
        let node = match &peer.identity {
            Some(id) => {
                if claimed != Some(id.role) || name != id.node {
                    return Err(self.refuse(
                        Refusal::Impersonation,
                        peer,
                        Status::permission_denied(format!(
                            "the hello claims {}/{name}, but this certificate is {id}",
                            claimed.map_or("?", identity::Role::as_str)
                        )),
                    ));
                }
                id.node.clone()
            }
            None => hello.node.clone(),
        };
        let Some(claimed) = claimed else {
            return Err(self.refuse(
                Refusal::Role,
                peer,
                Status::invalid_argument("hello: the role must be host or switch"),
            ));
        };
        // A host may be known by its address (`--host auto`; a certificate may name the
        // address too): it is the topology's host of that address, by the topology's name.
        let name = match name.parse::<std::net::Ipv4Addr>() {
            Ok(addr) if claimed == identity::Role::Host => c.host_by_addr(addr).unwrap_or(name),
            _ => name,
        };
        let kind_ok = c.node_kind(&name).is_some_and(|k| match claimed {
            identity::Role::Host => k == sopa_topology::NodeKind::Host,
            _ => k.is_switch(),
        });
        if !kind_ok {
            return Err(self.refuse(
                Refusal::UnknownNode,
                peer,
                Status::not_found(format!(
                    "{name} is not a {claimed} of this controller's topology"
                )),
            ));
        }
        if peer.identity.is_some()
            && c.agents
                .lock()
                .expect("agents lock")
                .get(&node)
                .is_some_and(|r| r.connected)
        {
            return Err(self.refuse(
                Refusal::SecondSession,
                peer,
                Status::already_exists(format!(
                    "{node} already has a session; a second one is refused while it lasts"
                )),
            ));
        }
        Ok((node, name))
    }
}

#[tonic::async_trait]
impl proto::channel::channel_server::Channel for ChannelService {
    type StreamStream = Outbound;

    async fn stream(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Outbound>, Status> {
        let peer = request
            .extensions()
            .get::<Peer>()
            .cloned()
            .unwrap_or_default();
        if let Some(why) = self.controller.stepped_down.borrow().clone() {
            return Err(Status::unavailable(format!(
                "this controller stepped down and serves nothing: {why}"
            )));
        }
        if self.require_identity && peer.identity.is_none() {
            return Err(self.refuse(
                Refusal::NoIdentity,
                &peer,
                Status::unauthenticated("no verified certificate on this connection"),
            ));
        }
        // Subscribed before the check: a revocation while the hello is awaited still closes
        // the stream.
        let mut revoked = self.deny.subscribe();
        if let Some(serial) = &peer.serial
            && revoked.borrow_and_update().contains(serial)
        {
            return Err(self.refuse(
                Refusal::Revoked,
                &peer,
                Status::permission_denied("this certificate is revoked"),
            ));
        }
        if let Some(id) = &peer.identity
            && !matches!(id.role, identity::Role::Host | identity::Role::Switch)
        {
            return Err(self.refuse(
                Refusal::Role,
                &peer,
                Status::permission_denied(format!(
                    "{id} may not open an agent stream: only host and switch certificates do"
                )),
            ));
        }
        let controller = Arc::clone(&self.controller);
        // A client (by its certificate, or its address without one) may keep only a few
        // streams waiting for their hello; none of them holds a session slot.
        // (A Unix socket's clients without a certificate share no address: local, uncounted.)
        let client = match &peer.identity {
            Some(id) => Some(id.to_string()),
            None => peer.addr.rsplit_once(':').map(|(ip, _)| ip.to_owned()),
        };
        let Some(awaiting) = AwaitingHello::take(&controller, client) else {
            return Err(self.refuse(
                Refusal::TooManySessions,
                &peer,
                Status::resource_exhausted(format!(
                    "{MAX_AWAITING_HELLO} streams of this client already await their hello"
                )),
            ));
        };
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
        let (node, name) = self.admit(&peer, &hello)?;
        drop(awaiting);
        let session = controller
            .sessions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (initial, mut updates, mut last_sent) = {
            let f = controller.fabric.lock().expect("fabric lock");
            // A replica whose agents are ahead of it lost the leadership and has not noticed
            // yet: its snapshot would take them back. Every version was stored before it was
            // sent, so the leader has it.
            if hello.epoch == f.epoch() && hello.version > f.version() {
                if controller.replicated() {
                    return Err(Status::unavailable(format!(
                        "this controller replica is behind (version {}, the agent has {}): another replica leads",
                        f.version(),
                        hello.version
                    )));
                }
                // A store of one replica that went back (a state file restored from a
                // backup): serving it would roll every agent back. Nothing is served.
                let why = format!(
                    "agent {} has applied version {} of epoch {}, newer than this controller's \
                     state (--store {}, version {}): the state went back, a backup restored? \
                     Serving it would roll the agents back, so this controller stops. Put the \
                     newest state back, or start with --accept-rollback to serve this one under \
                     a new epoch (every agent then takes it as a fresh snapshot)",
                    bounded(&hello.node, 64),
                    hello.version,
                    hello.epoch,
                    controller.store,
                    f.version()
                );
                drop(f);
                controller.refusals.refuse(Refusal::Rollback, &peer, &why);
                controller.step_down(why.clone());
                return Err(Status::failed_precondition(why));
            }
            let updates = controller.updates.subscribe();
            // A host agent whose meter runs by another clock (a flag fixed the agent's, or a
            // controller of another `--meter-period-ms` ran before) gets a snapshot: it
            // carries the controller's clock.
            let clock = &controller.meter.clock;
            let meter_clock_differs = hello.role == Role::Host as i32
                && (hello.meter_period_ms, hello.meter_epoch_ns)
                    != (clock.period_ms(), clock.epoch_ns());
            let initial = match f.deltas_since(hello.epoch, hello.version) {
                Some(deltas) if !meter_clock_differs => deltas.into_iter().map(delta_msg).collect(),
                _ => vec![snapshot_msg(&f, clock)],
            };
            (initial, updates, f.version())
        };
        let slot = {
            let mut agents = controller.agents.lock().expect("agents lock");
            // Checked again under the lock: two sessions of one identity racing through
            // `admit` must not both get in.
            if peer.identity.is_some() && agents.get(&node).is_some_and(|r| r.connected) {
                drop(agents);
                return Err(self.refuse(
                    Refusal::SecondSession,
                    &peer,
                    Status::already_exists(format!("{node} already has a session")),
                ));
            }
            // The session's slot, taken once it said who it is (and only once per identity).
            let open = controller
                .sessions_open
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let slot = SessionSlot(Arc::clone(&controller));
            if open >= controller.max_sessions {
                drop(agents);
                drop(slot);
                return Err(self.refuse(
                    Refusal::TooManySessions,
                    &peer,
                    Status::resource_exhausted(format!(
                        "this controller serves at most {} agent sessions",
                        controller.max_sessions
                    )),
                ));
            }
            agents.insert(
                node.clone(),
                AgentRecord {
                    role: hello.role,
                    connected: true,
                    applied_version: hello.version,
                    agent_version: hello.agent_version.clone(),
                    fallbacks: hello.fallbacks.clone(),
                    session,
                    ..AgentRecord::default()
                },
            );
            slot
        };
        controller.settle_meter();
        info!(node = %node, peer = %peer, version = hello.version, snapshot = initial.len() == 1 && matches!(initial[0].kind, Some(controller_message::Kind::Snapshot(_))), "agent connected");
        let mut pins = controller.pins.subscribe();
        let mut peers = controller.peers.subscribe();
        let (tx, rx) = mpsc::channel::<Result<ControllerMessage, Status>>(64);
        let role = hello.role;
        let is_host = role == Role::Host as i32;
        // Three of the agent's heartbeat intervals without a word: it is gone.
        let agent_heartbeat = match hello.heartbeat_ms {
            0 => Duration::from_secs(1),
            ms => Duration::from_millis(u64::from(ms)).min(Duration::from_secs(60)),
        };
        let silence = 3 * agent_heartbeat.max(controller.heartbeat);
        let (reports, mut queued) = tokio::sync::mpsc::channel::<PortEvent>(REPORT_QUEUE);
        {
            // Ends once the session's sender is gone and every queued report is applied.
            let (c, by) = (Arc::clone(&controller), name.clone());
            tokio::spawn(async move {
                while let Some(event) = queued.recv().await {
                    match event {
                        PortEvent::Carrier(a, b, down) => c.damped_report(&a, &b, &by, down).await,
                        PortEvent::Cabling(links) => c.set_cabling(&by, &links).await,
                    }
                }
            });
        }
        let s = Session {
            node,
            name,
            role,
            id: session,
            peer,
            reports,
            started: std::time::Instant::now(),
        };
        if is_host {
            controller.host_session(&s.name, session, true);
        }
        tokio::spawn(async move {
            // An agent that stops reading (its connection still answering pings) is dropped
            // once a message waits for three heartbeat intervals, not waited on forever.
            let send = |m: ControllerMessage| tx.send_timeout(Ok(m), silence);
            // A switch needs both sets (it honours the option only towards live hosts); a
            // host agent reads only who is down, so it is sent that alone, and only when it
            // changes: the live set names every host of the fabric, and a message of it to
            // each of thousands of hosts on every connect would cost the controller more
            // than all else it sends them.
            let mut down_sent: Option<Vec<String>> = None;
            let mut peers_msg = |p: &Arc<proto::PeerAgents>| {
                let peers = if is_host {
                    if down_sent.as_ref() == Some(&p.down) {
                        return None;
                    }
                    down_sent = Some(p.down.clone());
                    proto::PeerAgents {
                        down: p.down.clone(),
                        live: Vec::new(),
                    }
                } else {
                    p.as_ref().clone()
                };
                Some(ControllerMessage {
                    kind: Some(controller_message::Kind::Peers(peers)),
                })
            };
            // The host agents' states come first: a switch installs its plan with its trusted
            // ports already known.
            let current = peers.borrow_and_update().clone();
            let first = peers_msg(&current);
            let sent_initial = async {
                if let Some(m) = first {
                    send(m).await?;
                }
                for m in initial {
                    send(m).await?;
                }
                Ok::<_, mpsc::error::SendTimeoutError<_>>(())
            };
            let mut why = "the agent left";
            if sent_initial.await.is_ok() {
                let mut tick = tokio::time::interval(controller.heartbeat);
                let mut last_heard = Instant::now();
                let mut watching_deny_list = true;
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
                                    snapshot_msg(&f, &controller.meter.clock)
                                };
                                if send(snap).await.is_err() { break; }
                            }
                            Err(broadcast::error::RecvError::Closed) => break,
                        },
                        round = pins.recv() => match round {
                            Ok(sets) => if let Some(set) = sets.get(&s.name) {
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
                            if let Some(m) = peers_msg(&current)
                                && send(m).await.is_err() { break; }
                        },
                        changed = revoked.changed(), if watching_deny_list => {
                            if changed.is_err() { watching_deny_list = false; continue; }
                            let now_revoked = s.peer.serial.as_ref().is_some_and(|serial| revoked.borrow_and_update().contains(serial));
                            if now_revoked {
                                controller.refusals.refuse(Refusal::Revoked, &s.peer_name(), "its certificate was revoked: the stream is closed");
                                let _ = tx.try_send(Err(Status::permission_denied("this certificate was revoked")));
                                why = "its certificate was revoked";
                                break;
                            }
                        },
                        msg = inbound.message() => match msg {
                            Ok(Some(m)) => {
                                last_heard = Instant::now();
                                controller.handle(&s, m);
                            }
                            Ok(None) | Err(_) => break,
                        },
                        _ = tick.tick() => {
                            if last_heard.elapsed() > silence {
                                why = "it missed three heartbeats";
                                break;
                            }
                            let hb = ControllerMessage { kind: Some(controller_message::Kind::Heartbeat(Heartbeat { unix_ms: now_ms(), interval_ms: u32::try_from(controller.heartbeat.as_millis()).unwrap_or(u32::MAX) })) };
                            if send(hb).await.is_err() { break; }
                        }
                    }
                }
            }
            // The slot is free before the record says so: a client that sees the agent gone
            // finds room for the next one.
            drop(slot);
            controller.record(&s.node, session, |r| r.connected = false);
            controller.settle_meter();
            if is_host {
                controller.host_session(&s.name, session, false);
            }
            info!(node = %s.node, reason = why, "agent disconnected");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
