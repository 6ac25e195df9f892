//! The agent side of the push channel: connect, say hello with the last applied version, apply
//! what the controller sends through an [`Applier`], acknowledge or reject every version, keep
//! heartbeats both ways, and reconnect with jittered exponential backoff (0.5 s to 30 s). While
//! the controller is away nothing is undone: the agent keeps its last good state.
//!
//! The controller address may list replicas (`https://c1:7470,https://c2:7470`): each attempt
//! tries them in turn, starting with the one that served last, and only when none serves does
//! the backoff apply. Replicas that do not lead do not listen.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Endpoint, Uri};

use crate::tls::ClientTls;
use tracing::{info, warn};

use crate::proto::{
    self, Ack, AgentMessage, Delta, Heartbeat, Hello, Nack, PinAck, PinSet, Role, Snapshot,
    agent_message, controller_message,
};

/// What an agent does with the controller's messages.
pub trait Applier: Send {
    /// Applies a snapshot completely or not at all.
    fn snapshot(&mut self, snapshot: &Snapshot) -> impl Future<Output = Result<(), String>> + Send;
    /// Applies a delta completely or not at all; `Err((error, resync))`, where `resync` asks
    /// for a fresh snapshot (a version gap or another epoch).
    fn delta(&mut self, delta: &Delta) -> impl Future<Output = Result<(), (String, bool)>> + Send;
    /// Applies Hedera's pins for this agent's flows completely or not at all.
    fn pins(&mut self, _pins: &PinSet) -> impl Future<Output = Result<(), String>> + Send {
        std::future::ready(Err("this agent does not take pins".to_owned()))
    }
    /// The host agents' states: lost ones (they receive unstripped packets) and live ones
    /// (switches honour their option).
    fn peers(&mut self, _peers: &proto::PeerAgents) {}
    /// (epoch, version) last applied; (0, 0) for nothing.
    fn position(&self) -> (u64, u64);
    /// A host agent's path-meter clock now: (period in ms, epoch in TAI ns).
    fn meter_clock(&self) -> Option<(u32, u64)> {
        None
    }
    /// The channel came up or went down.
    fn connected(&mut self, _up: bool) {}
    /// A session ended or could not start (the controller unreachable, a refused handshake, a
    /// stream broken), with the reason; the next attempt follows after the backoff.
    fn lost(&mut self, _why: &str) {}
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub endpoint: String,
    pub node: String,
    /// The node's name in the topology, when it differs from `node`.
    pub topology_name: Option<String>,
    pub role: Role,
    pub tls: Option<ClientTls>,
    /// The certificate folder and the controller's expected name `tls` was read from: read
    /// again at every session, so a certificate renewed in place (cert-manager) is the one the
    /// next handshake presents; one that does not read leaves `tls` in use.
    pub tls_files: Option<(std::path::PathBuf, String)>,
    pub heartbeat: Duration,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// What the agent does without features its kernel lacks (`feature: instead`), told the
    /// controller in the hello.
    pub fallbacks: Vec<String>,
}

impl ClientConfig {
    pub fn new(endpoint: impl Into<String>, node: impl Into<String>, role: Role) -> Self {
        Self {
            endpoint: endpoint.into(),
            node: node.into(),
            topology_name: None,
            role,
            tls: None,
            tls_files: None,
            heartbeat: Duration::from_secs(1),
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            fallbacks: Vec::new(),
        }
    }
}

/// How often each side of a connection pings the other over HTTP/2, and how long it waits
/// for the answer before it closes the connection.
pub const KEEPALIVE: Duration = Duration::from_secs(10);

/// A small xorshift for backoff jitter (no need for a cryptographic source here).
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Self(t ^ u64::from(std::process::id()) << 32 | 1)
    }

    /// A factor in [0.5, 1.0).
    fn factor(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        0.5 + (self.0 % 1_000_000) as f64 / 2_000_000.0
    }
}

/// The delay before reconnect attempt `attempt` (0-based): min(max, min * 2^attempt), jittered.
pub fn backoff(cfg: &ClientConfig, attempt: u32, jitter: f64) -> Duration {
    let base = cfg.min_backoff.as_secs_f64() * 2f64.powi(attempt.min(16) as i32);
    Duration::from_secs_f64(base.min(cfg.max_backoff.as_secs_f64()) * jitter)
}

/// Why one session ended.
#[derive(Debug)]
enum End {
    Shutdown,
    Lost(String),
    /// No controller of the list took the connection (none listens: with replicas, an
    /// election is under way).
    NoneListens(String),
}

/// With replicas, how long an agent that finds none listening keeps retrying every
/// [`ELECTION_RETRY_EVERY`] (refused connections cost the controllers nothing) before the
/// backoff grows again.
pub const ELECTION_RETRY_FOR: Duration = Duration::from_secs(10);

/// The retry interval while replicas elect a leader (jittered to 0.5-1 times it; the minimum
/// backoff if that is shorter): the new leader's agents arrive within this time of its start.
pub const ELECTION_RETRY_EVERY: Duration = Duration::from_millis(200);

/// Runs the channel until `shutdown` turns true.
pub async fn run<A: Applier>(cfg: ClientConfig, applier: &mut A, shutdown: watch::Receiver<bool>) {
    run_with_reports::<A, proto::LinkReport>(cfg, applier, shutdown, None).await
}

/// Like [`run`], also sending every report that arrives on `reports` (a switch agent's link
/// reports, a host agent's elephants). Reports made while the controller is away wait, up to
/// the channel's capacity.
pub async fn run_with_reports<A: Applier, R: Into<agent_message::Kind> + Send>(
    cfg: ClientConfig,
    applier: &mut A,
    mut shutdown: watch::Receiver<bool>,
    mut reports: Option<mpsc::Receiver<R>>,
) {
    let mut attempt = 0u32;
    let mut jitter = Jitter::new();
    let mut preferred = 0usize;
    let replicas = endpoints(&cfg.endpoint).len() > 1;
    let mut none_listen_since: Option<tokio::time::Instant> = None;
    loop {
        let started = tokio::time::Instant::now();
        match session(
            &cfg,
            applier,
            &mut shutdown,
            reports.as_mut(),
            &mut preferred,
        )
        .await
        {
            End::Shutdown => return,
            end => {
                let (why, none_listens) = match end {
                    End::NoneListens(why) => (why, true),
                    End::Lost(why) => (why, false),
                    End::Shutdown => return,
                };
                applier.connected(false);
                applier.lost(&why);
                // A session that lived a while resets the backoff.
                if started.elapsed() > cfg.max_backoff {
                    attempt = 0;
                }
                // Replicas none of which listens: a leader is being elected. Try again often
                // for a while, so that every agent finds the new leader soon after it serves.
                if !none_listens {
                    none_listen_since = None;
                }
                let electing = replicas
                    && none_listens
                    && none_listen_since.get_or_insert(started).elapsed() < ELECTION_RETRY_FOR;
                let delay = if electing {
                    cfg.min_backoff
                        .min(ELECTION_RETRY_EVERY)
                        .mul_f64(jitter.factor())
                } else {
                    let d = backoff(&cfg, attempt, jitter.factor());
                    attempt = attempt.saturating_add(1);
                    d
                };
                warn!(reason = %why, retry_in_ms = delay.as_millis() as u64, "controller unreachable; keeping the last good state");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Connects to `endpoint`: `http://`/`https://` over TCP, or `unix:PATH` over a Unix socket.
pub async fn connect(
    endpoint: &str,
    tls: Option<&ClientTls>,
) -> Result<tonic::transport::Channel, String> {
    if let Some(path) = endpoint.strip_prefix("unix:") {
        let path = path.to_owned();
        // The URI is a placeholder: the connector ignores it and dials the socket.
        return Endpoint::from_static("http://unix.socket")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| format!("connecting to {endpoint}: {}", source_chain(&e)));
    }
    // HTTP/2 pings find a controller that vanished (power loss, a cut link) even while
    // the stream is idle, long before TCP would.
    let keepalive = |ep: Endpoint| {
        ep.connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true)
    };
    let Some(tls) = tls else {
        let ep = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| format!("bad controller address {endpoint}: {e}"))?;
        return keepalive(ep)
            .connect()
            .await
            .map_err(|e| format!("connecting to {endpoint}: {}", source_chain(&e)));
    };
    // TLS of our own (the controller's certificate checked for its SOPA identity too), under
    // HTTP/2 that tonic speaks over it.
    let uri: Uri = endpoint
        .parse()
        .map_err(|e| format!("bad controller address {endpoint}: {e}"))?;
    let host = uri
        .host()
        .ok_or_else(|| format!("bad controller address {endpoint}: no host"))?
        .trim_matches(['[', ']'])
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let ep = Endpoint::from_shared(format!("http://{}", uri.authority().expect("a host")))
        .map_err(|e| format!("bad controller address {endpoint}: {e}"))?;
    let tls = tls.clone();
    keepalive(ep)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let (tls, host) = (tls.clone(), host.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                let stream = tokio_rustls::TlsConnector::from(tls.config)
                    .connect(tls.name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| format!("connecting to {endpoint}: {}", source_chain(&e)))
}

/// The controllers an address list names (`ADDR[,ADDR...]`), in order.
pub fn endpoints(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect()
}

/// Connects to the first controller of `list` that answers, trying them in turn from
/// `*first`; returns the channel and the index of the one that answered.
pub async fn connect_any(
    list: &str,
    tls: Option<&ClientTls>,
    first: usize,
) -> Result<(tonic::transport::Channel, usize), String> {
    let all = endpoints(list);
    if all.is_empty() {
        return Err(format!("no controller address in {list:?}"));
    }
    let mut errors = Vec::new();
    for i in 0..all.len() {
        let idx = (first + i) % all.len();
        match connect(all[idx], tls).await {
            Ok(c) => return Ok((c, idx)),
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

/// How long opening the stream may take: a controller that accepts connections but does not
/// answer (stopped, hung) is left for the next one.
fn open_timeout(cfg: &ClientConfig) -> Duration {
    (cfg.heartbeat * 3).max(Duration::from_secs(2))
}

async fn session<A: Applier, R: Into<agent_message::Kind>>(
    cfg: &ClientConfig,
    applier: &mut A,
    shutdown: &mut watch::Receiver<bool>,
    mut reports: Option<&mut mpsc::Receiver<R>>,
    preferred: &mut usize,
) -> End {
    let fresh = cfg.tls_files.as_ref().and_then(|(dir, name)| {
        crate::tls::client_config(dir, name)
            .inspect_err(|e| warn!(error = %e, "the certificate folder did not read; the certificate read before is presented"))
            .ok()
    });
    let tls = fresh.as_ref().or(cfg.tls.as_ref());
    let (channel, idx) = match connect_any(&cfg.endpoint, tls, *preferred).await {
        Ok(c) => c,
        Err(e) => return End::NoneListens(e),
    };
    // Until the stream is open, the next attempt starts with the next controller.
    *preferred = idx + 1;
    let endpoint = endpoints(&cfg.endpoint)[idx].to_owned();
    let mut client = proto::channel::channel_client::ChannelClient::new(channel)
        .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<AgentMessage>(64);
    let (epoch, version) = applier.position();
    let (meter_period_ms, meter_epoch_ns) = applier.meter_clock().unwrap_or_default();
    let hello = AgentMessage {
        kind: Some(agent_message::Kind::Hello(Hello {
            node: cfg.node.clone(),
            role: cfg.role as i32,
            epoch,
            version,
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            topology_name: cfg.topology_name.clone().unwrap_or_default(),
            heartbeat_ms: u32::try_from(cfg.heartbeat.as_millis()).unwrap_or(u32::MAX),
            fallbacks: cfg.fallbacks.clone(),
            meter_period_ms,
            meter_epoch_ns,
        })),
    };
    let _ = tx.send(hello).await;
    let opened = tokio::time::timeout(open_timeout(cfg), client.stream(ReceiverStream::new(rx)));
    let mut inbound = match opened.await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => {
            return End::Lost(format!(
                "opening the stream at {endpoint}: {}",
                status_chain(&status)
            ));
        }
        Err(_) => {
            return End::Lost(format!(
                "{endpoint} accepted the connection but did not open the stream within {} ms",
                open_timeout(cfg).as_millis()
            ));
        }
    };
    *preferred = idx;
    applier.connected(true);
    info!(%endpoint, epoch, version, "connected to the controller");
    let mut tick = tokio::time::interval(cfg.heartbeat);
    // Three of our intervals, or of the controller's once its first heartbeat says it ticks
    // more slowly (as it counts us gone after three of the longer of the two).
    let mut silence = cfg.heartbeat * 3;
    let mut last_heard = tokio::time::Instant::now();
    loop {
        let report = async {
            match reports.as_mut() {
                Some(r) => r.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.changed() => return End::Shutdown,
            Some(rep) = report => {
                let msg = AgentMessage { kind: Some(rep.into()) };
                if tx.send(msg).await.is_err() {
                    return End::Lost("stream closed".into());
                }
            }
            _ = tick.tick() => {
                if last_heard.elapsed() > silence {
                    return End::Lost(format!("no message for {} ms", silence.as_millis()));
                }
                let interval_ms = u32::try_from(cfg.heartbeat.as_millis()).unwrap_or(u32::MAX);
                let hb = AgentMessage { kind: Some(agent_message::Kind::Heartbeat(Heartbeat { unix_ms: 0, interval_ms })) };
                if tx.send(hb).await.is_err() {
                    return End::Lost("stream closed".into());
                }
            }
            msg = inbound.message() => {
                let msg = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) => return End::Lost("the controller closed the stream".into()),
                    Err(status) => return End::Lost(format!("stream: {}", status_chain(&status))),
                };
                last_heard = tokio::time::Instant::now();
                let reply = match msg.kind {
                    Some(controller_message::Kind::Snapshot(s)) => Some(match older(applier.position(), s.epoch, s.version) {
                        Some(why) => {
                            warn!(epoch = s.epoch, version = s.version, "{why}");
                            nack(s.epoch, s.version, why)
                        }
                        None => match applier.snapshot(&s).await {
                            Ok(()) => ack(s.epoch, s.version),
                            Err(e) => nack(s.epoch, s.version, e),
                        },
                    }),
                    Some(controller_message::Kind::Delta(d)) => match applier.delta(&d).await {
                        Ok(()) => Some(ack(d.epoch, d.version)),
                        Err((e, resync)) => {
                            let _ = tx.send(nack(d.epoch, d.version, e.clone())).await;
                            if resync {
                                // Reconnecting says hello with our version: the controller
                                // answers with what we lack, or a snapshot.
                                return End::Lost(format!("resync: {e}"));
                            }
                            None
                        }
                    },
                    Some(controller_message::Kind::Pins(p)) => {
                        let error = applier.pins(&p).await.err().unwrap_or_default();
                        Some(AgentMessage { kind: Some(agent_message::Kind::PinAck(PinAck { round: p.round, error })) })
                    }
                    Some(controller_message::Kind::Peers(p)) => {
                        applier.peers(&p);
                        None
                    }
                    Some(controller_message::Kind::Heartbeat(hb)) => {
                        silence = silence_for(cfg.heartbeat, hb.interval_ms);
                        None
                    }
                    None => None,
                };
                if let Some(r) = reply
                    && tx.send(r).await.is_err()
                {
                    return End::Lost("stream closed".into());
                }
            }
        }
    }
}

/// Why a snapshot of `(epoch, version)` is refused by an agent at `applied`: one of the same
/// epoch and an older version would roll it back (the controller's state went back, a
/// restored backup). Another epoch is a new controller state, taken whole.
fn older((epoch, applied): (u64, u64), e: u64, version: u64) -> Option<String> {
    (e == epoch && version < applied).then(|| {
        format!(
            "refused a snapshot of version {version}, older than the applied {applied} of epoch \
             {epoch}: the controller's state went back (a restored backup?); this agent keeps \
             its state"
        )
    })
}

/// How long the controller may stay silent: three heartbeats of the slower of the two (the
/// controller's at most a minute; 0 is a controller that does not say).
fn silence_for(ours: Duration, controllers_ms: u32) -> Duration {
    let theirs = Duration::from_millis(u64::from(controllers_ms)).min(Duration::from_secs(60));
    3 * ours.max(theirs)
}

fn ack(epoch: u64, version: u64) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::Ack(Ack { epoch, version })),
    }
}

fn nack(epoch: u64, version: u64, error: String) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::Nack(Nack {
            epoch,
            version,
            error,
        })),
    }
}

/// A status's message with the causes under it (a TLS alert under "transport error": a
/// revoked or refused certificate is named).
pub fn status_chain(status: &tonic::Status) -> String {
    let mut s = status.message().to_owned();
    let mut cur = std::error::Error::source(status);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// An error with its causes, for messages that name the real reason (a TLS failure, a refused
/// connection).
pub fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_minimum_up_to_the_maximum_jittered() {
        let cfg = ClientConfig::new("http://x", "h0", Role::Host);
        let ms = |attempt, jitter| backoff(&cfg, attempt, jitter).as_millis();
        assert_eq!(
            (0..8).map(|a| ms(a, 1.0)).collect::<Vec<_>>(),
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]
        );
        // Far past the cap, and at the largest attempt count, still the cap.
        assert_eq!(ms(40, 1.0), 30000);
        assert_eq!(ms(u32::MAX, 1.0), 30000);
        assert_eq!(ms(0, 0.5), 250);
        assert_eq!(ms(10, 0.5), 15000);
    }

    #[test]
    fn a_snapshot_older_than_what_was_applied_in_its_epoch_is_refused() {
        // Applied version 5 of epoch 7.
        let at = (7, 5);
        let why = older(at, 7, 3).expect("an older version of the same epoch");
        assert!(
            why.contains("version 3") && why.contains("applied 5"),
            "{why}"
        );
        assert_eq!(older(at, 7, 5), None, "the same version (a reconnection)");
        assert_eq!(older(at, 7, 6), None);
        assert_eq!(
            older(at, 8, 1),
            None,
            "another epoch: a new state, taken whole"
        );
        assert_eq!(older((0, 0), 7, 1), None, "nothing applied yet");
    }

    #[test]
    fn jitter_stays_in_its_range_and_varies() {
        let mut j = Jitter::new();
        let v: Vec<f64> = (0..1000).map(|_| j.factor()).collect();
        assert!(v.iter().all(|f| (0.5..1.0).contains(f)), "{v:?}");
        let distinct: std::collections::BTreeSet<u64> =
            v.iter().map(|f| (f * 1e6) as u64).collect();
        assert!(distinct.len() > 900, "agents must not retry in lockstep");
    }
}
