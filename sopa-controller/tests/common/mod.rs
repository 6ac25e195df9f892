//! Shared by the channel suites: a controller on a runtime of its own and recording agents.
#![allow(dead_code)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use sopa_channel::tls::ClientTls;
use sopa_channel::{
    client::{self, Applier, ClientConfig},
    proto::{Delta, PeerAgents, Role, Snapshot},
    view::FabricView,
};
use sopa_controller::{
    fabric::Fabric,
    server::{self, Controller},
    transport::ServerTls,
};
use sopa_topology::topology::TopologySpec;
use tokio::sync::watch;

/// What a test agent saw: ("snapshot" | "delta", epoch, version).
pub type Log = Arc<Mutex<Vec<(&'static str, u64, u64)>>>;
/// Why each of a test agent's sessions ended or could not start.
pub type Lost = Arc<Mutex<Vec<String>>>;
/// Every host-agent state message a test agent received, in order.
pub type Peers = Arc<Mutex<Vec<PeerAgents>>>;

pub struct TestAgent {
    view: Option<FabricView>,
    log: Log,
    lost: Lost,
    peers: Peers,
    /// Versions to refuse once (a failed apply), and to swallow without applying (a lost message).
    refuse: Vec<u64>,
    swallow: Vec<u64>,
    /// The path meter's clock, as a host agent adopts it from each snapshot.
    meter_clock: Option<(u32, u64)>,
}

impl Applier for TestAgent {
    async fn snapshot(&mut self, s: &Snapshot) -> Result<(), String> {
        let view = FabricView::from_snapshot(s).map_err(|e| e.to_string())?;
        self.log
            .lock()
            .unwrap()
            .push(("snapshot", s.epoch, s.version));
        if s.meter_period_ms != 0 {
            self.meter_clock = Some((s.meter_period_ms, s.meter_epoch_ns));
        }
        self.view = Some(view);
        Ok(())
    }

    async fn delta(&mut self, d: &Delta) -> Result<(), (String, bool)> {
        if let Some(i) = self.refuse.iter().position(|v| *v == d.version) {
            self.refuse.remove(i);
            return Err(("injected apply failure".into(), false));
        }
        if let Some(i) = self.swallow.iter().position(|v| *v == d.version) {
            self.swallow.remove(i);
            return Ok(());
        }
        let view = self
            .view
            .as_mut()
            .ok_or(("no snapshot yet".to_owned(), true))?;
        view.apply_delta(d)
            .map_err(|e| (e.to_string(), e.needs_resync()))?;
        self.log.lock().unwrap().push(("delta", d.epoch, d.version));
        Ok(())
    }

    fn position(&self) -> (u64, u64) {
        self.view.as_ref().map_or((0, 0), |v| (v.epoch, v.version))
    }

    fn meter_clock(&self) -> Option<(u32, u64)> {
        self.meter_clock
    }

    fn lost(&mut self, why: &str) {
        self.lost.lock().unwrap().push(why.to_owned());
    }

    fn peers(&mut self, peers: &PeerAgents) {
        self.peers.lock().unwrap().push(peers.clone());
    }
}

/// A controller on a runtime of its own, so that stopping it ends every task it started, as a
/// process exit would.
pub struct Running {
    pub controller: Arc<Controller>,
    pub addr: std::net::SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

pub async fn start_controller(epoch: u64, addr: &str) -> Running {
    start_controller_tls(epoch, addr, None).await
}

/// A controller whose hosts stay live for `grace` after it starts and after their agent left.
pub async fn start_controller_with_grace(epoch: u64, grace: Duration) -> Running {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let opts = server::Options {
        agent_grace: grace,
        ..test_options()
    };
    running_with(epoch, addr, opts, move |c| async move {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        server::serve(c, listener, None, std::future::pending())
            .await
            .unwrap();
    })
}

/// A controller on loopback over `fabric` (a restored one, say), with `tls` and `opts`.
pub async fn start_controller_tls_fabric(
    fabric: Fabric,
    tls: ServerTls,
    opts: server::Options,
) -> Running {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    on_own_runtime(
        Controller::with_options(fabric, opts),
        addr,
        move |c| async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            server::serve(c, listener, Some(tls), std::future::pending())
                .await
                .unwrap();
        },
    )
}

/// A controller on loopback with `opts` (and `tls`).
pub async fn start_controller_opts(
    epoch: u64,
    tls: Option<ServerTls>,
    opts: server::Options,
) -> Running {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    running_with(epoch, addr, opts, move |c| async move {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        server::serve(c, listener, tls, std::future::pending())
            .await
            .unwrap();
    })
}

/// A controller of `fabric` with `opts`, plaintext on loopback.
pub async fn start_controller_fabric(fabric: Fabric, opts: server::Options) -> Running {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let controller = Controller::with_options(fabric, opts);
    on_own_runtime(controller, addr, move |c| async move {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        server::serve(c, listener, None, std::future::pending())
            .await
            .unwrap();
    })
}

/// The suites' controller: heartbeats every 200 ms.
pub fn test_options() -> server::Options {
    server::Options {
        heartbeat: Duration::from_millis(200),
        ..server::Options::default()
    }
}

pub async fn start_controller_tls(epoch: u64, addr: &str, tls: Option<ServerTls>) -> Running {
    let std_listener = std::net::TcpListener::bind(addr).unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    running(epoch, addr, move |c| async move {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        server::serve(c, listener, tls, std::future::pending())
            .await
            .unwrap();
    })
}

/// A controller listening on the Unix socket `path`.
pub async fn start_controller_unix(epoch: u64, path: &std::path::Path) -> Running {
    let _ = std::fs::remove_file(path);
    let std_listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    std_listener.set_nonblocking(true).unwrap();
    running(epoch, "0.0.0.0:0".parse().unwrap(), move |c| async move {
        let listener = tokio::net::UnixListener::from_std(std_listener).unwrap();
        server::serve(c, listener, None, std::future::pending())
            .await
            .unwrap();
    })
}

/// A k=4 controller of `epoch`, served by `serve` on a runtime of its own.
fn running<F: std::future::Future<Output = ()> + Send + 'static>(
    epoch: u64,
    addr: std::net::SocketAddr,
    serve: impl FnOnce(Arc<Controller>) -> F,
) -> Running {
    running_with(epoch, addr, test_options(), serve)
}

fn running_with<F: std::future::Future<Output = ()> + Send + 'static>(
    epoch: u64,
    addr: std::net::SocketAddr,
    opts: server::Options,
    serve: impl FnOnce(Arc<Controller>) -> F,
) -> Running {
    let fabric = Fabric::new(TopologySpec::FatTree { k: 4 }, epoch).unwrap();
    on_own_runtime(Controller::with_options(fabric, opts), addr, serve)
}

fn on_own_runtime<F: std::future::Future<Output = ()> + Send + 'static>(
    controller: Arc<Controller>,
    addr: std::net::SocketAddr,
    serve: impl FnOnce(Arc<Controller>) -> F,
) -> Running {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.spawn(serve(Arc::clone(&controller)));
    Running {
        controller,
        addr,
        runtime: Some(runtime),
    }
}

impl Running {
    pub async fn stop(mut self) {
        self.runtime.take().unwrap().shutdown_background();
    }
}

pub fn spawn_agent(
    addr: std::net::SocketAddr,
    node: &str,
    refuse: Vec<u64>,
    swallow: Vec<u64>,
) -> (Log, watch::Sender<bool>) {
    spawn_agent_with(&format!("http://{addr}"), node, None, refuse, swallow)
}

pub fn spawn_agent_with(
    endpoint: &str,
    node: &str,
    tls: Option<ClientTls>,
    refuse: Vec<u64>,
    swallow: Vec<u64>,
) -> (Log, watch::Sender<bool>) {
    let (log, _, tx) = spawn_agent_watched(endpoint, node, tls, refuse, swallow);
    (log, tx)
}

/// An agent of `role` that records every host-agent state message it receives.
pub fn spawn_agent_peers(
    addr: std::net::SocketAddr,
    node: &str,
    role: Role,
) -> (Peers, watch::Sender<bool>) {
    let peers: Peers = Arc::default();
    let mut agent = TestAgent {
        view: None,
        log: Arc::default(),
        lost: Arc::default(),
        peers: Arc::clone(&peers),
        refuse: Vec::new(),
        swallow: Vec::new(),
        meter_clock: None,
    };
    let mut cfg = ClientConfig::new(format!("http://{addr}"), node, role);
    cfg.heartbeat = Duration::from_millis(200);
    cfg.min_backoff = Duration::from_millis(100);
    cfg.max_backoff = Duration::from_millis(400);
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move { client::run(cfg, &mut agent, rx).await });
    (peers, tx)
}

/// An agent that already holds `view` and a meter running by `meter_clock` (as if it had
/// applied them before the controller restarted).
pub fn spawn_agent_holding(
    addr: std::net::SocketAddr,
    node: &str,
    view: FabricView,
    meter_clock: Option<(u32, u64)>,
) -> Log {
    let log: Log = Arc::default();
    let mut agent = TestAgent {
        view: Some(view),
        log: Arc::clone(&log),
        lost: Arc::default(),
        peers: Arc::default(),
        refuse: Vec::new(),
        swallow: Vec::new(),
        meter_clock,
    };
    let mut cfg = ClientConfig::new(format!("http://{addr}"), node, Role::Host);
    cfg.heartbeat = Duration::from_millis(200);
    cfg.min_backoff = Duration::from_millis(100);
    cfg.max_backoff = Duration::from_millis(400);
    // The agent runs as long as the test's runtime.
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let _keep = tx;
        client::run(cfg, &mut agent, rx).await
    });
    log
}

/// Like [`spawn_agent_with`], also recording why each session ended or could not start.
pub fn spawn_agent_watched(
    endpoint: &str,
    node: &str,
    tls: Option<ClientTls>,
    refuse: Vec<u64>,
    swallow: Vec<u64>,
) -> (Log, Lost, watch::Sender<bool>) {
    spawn_watched(endpoint, node, tls, None, refuse, swallow)
}

/// [`spawn_agent_watched`], its TLS read again from `tls_files` at every session where given.
fn spawn_watched(
    endpoint: &str,
    node: &str,
    tls: Option<ClientTls>,
    tls_files: Option<&std::path::Path>,
    refuse: Vec<u64>,
    swallow: Vec<u64>,
) -> (Log, Lost, watch::Sender<bool>) {
    let log: Log = Arc::default();
    let lost: Lost = Arc::default();
    let mut agent = TestAgent {
        view: None,
        log: Arc::clone(&log),
        lost: Arc::clone(&lost),
        peers: Arc::default(),
        refuse,
        swallow,
        meter_clock: None,
    };
    let mut cfg = ClientConfig::new(endpoint, node, Role::Host);
    cfg.tls = tls;
    cfg.tls_files = tls_files.map(|d| (d.to_owned(), "localhost".to_owned()));
    cfg.heartbeat = Duration::from_millis(200);
    cfg.min_backoff = Duration::from_millis(100);
    cfg.max_backoff = Duration::from_millis(400);
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move { client::run(cfg, &mut agent, rx).await });
    (log, lost, tx)
}

/// A host agent whose TLS comes from certificate folder `dir` (read again at every session),
/// recording why each session ended.
pub fn spawn_agent_with_files(
    endpoint: &str,
    node: &str,
    dir: &std::path::Path,
) -> (Log, Lost, watch::Sender<bool>) {
    let tls = sopa_channel::tls::client_config(dir, "localhost").unwrap();
    spawn_watched(endpoint, node, Some(tls), Some(dir), Vec::new(), Vec::new())
}

/// A raw agent stream to a plaintext controller: says `hello`, reads the first message, and
/// returns the sender (keep it: the stream lasts as long) and the inbound stream.
pub async fn open_raw(
    addr: std::net::SocketAddr,
    hello: sopa_channel::proto::Hello,
) -> (
    tokio::sync::mpsc::Sender<sopa_channel::proto::AgentMessage>,
    tonic::Streaming<sopa_channel::proto::ControllerMessage>,
) {
    use sopa_channel::proto::{
        AgentMessage, agent_message, channel::channel_client::ChannelClient,
    };
    let mut client = ChannelClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Hello(hello)),
    })
    .await
    .unwrap();
    let mut inbound = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    inbound.message().await.unwrap().unwrap();
    (tx, inbound)
}

pub async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

pub fn last_version(log: &Log) -> u64 {
    log.lock().unwrap().last().map_or(0, |e| e.2)
}
