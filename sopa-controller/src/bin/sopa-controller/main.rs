//! `sopa-controller`: owns the fabric's topology and link states and pushes them to every agent.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context as _, Result};
use clap::Parser;
use sopa_controller::{
    fabric::Fabric,
    hedera::HederaConfig,
    server::{self, Controller},
    tls,
};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

/// SOPA controller: serves the topology, every link and switch state, and each change as a
/// new version over an mTLS gRPC stream to every agent.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Topology spec (TOML: `[topology] kind = "fat-tree", k = 4` or `kind = "modric", ...`).
    #[arg(long, env = "SOPA_TOPOLOGY")]
    topology: PathBuf,
    /// Address to serve agents and operators on: HOST:PORT, or unix:PATH for a Unix socket.
    #[arg(long, env = "SOPA_LISTEN", default_value = "0.0.0.0:7470")]
    listen: String,
    /// Certificate folder from `sopactl certs init` (ca.pem, controller.pem, controller.key).
    #[arg(long, env = "SOPA_CERTS", required_unless_present = "insecure")]
    certs: Option<PathBuf>,
    /// Serve plaintext, accepting any client. For tests only.
    #[arg(long, env = "SOPA_INSECURE", conflicts_with = "certs")]
    insecure: bool,
    /// Heartbeat interval; agents consider the controller gone after three silent ones.
    #[arg(long, env = "SOPA_HEARTBEAT_MS", default_value_t = 1000)]
    heartbeat_ms: u64,
    /// Hedera's scheduling interval (the paper used 5 s).
    #[arg(long, env = "SOPA_HEDERA_INTERVAL_MS", default_value_t = 1000)]
    hedera_interval_ms: u64,
    /// How long a Hedera pin holds without a newer pin set from this controller.
    #[arg(long, env = "SOPA_PIN_LIFETIME_MS", default_value_t = 5000)]
    pin_lifetime_ms: u64,
    /// How long a host whose agent disconnected stays trusted: switches honour its option for
    /// this long, so a restarting agent (which keeps its datapath) goes unnoticed; after it,
    /// its edge switch neutralizes any option from that host.
    #[arg(long, env = "SOPA_AGENT_GRACE_MS", default_value_t = server::DEFAULT_AGENT_GRACE.as_millis() as u64)]
    agent_grace_ms: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("SOPA_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sopa-controller: {err:#}");
            ExitCode::from(64)
        }
    }
}

/// An epoch unique to this run: agents that see a new one start from a snapshot.
fn epoch() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (t ^ (u64::from(std::process::id()) << 40)) | 1
}

async fn run(args: Args) -> Result<()> {
    if args.heartbeat_ms == 0 {
        anyhow::bail!("--heartbeat-ms must be at least 1");
    }
    if args.hedera_interval_ms == 0 || args.pin_lifetime_ms <= args.hedera_interval_ms {
        anyhow::bail!(
            "--hedera-interval-ms {} and --pin-lifetime-ms {}: the interval must be at least 1 and pins must outlive it",
            args.hedera_interval_ms,
            args.pin_lifetime_ms
        );
    }
    let hedera = HederaConfig {
        interval: Duration::from_millis(args.hedera_interval_ms),
        pin_lifetime: Duration::from_millis(args.pin_lifetime_ms),
        ..HederaConfig::default()
    };
    let fabric = Fabric::load(&args.topology, epoch())?;
    let tls = match &args.certs {
        Some(dir) => {
            Some(tls::server_config(dir).with_context(|| format!("--certs {}", dir.display()))?)
        }
        None => {
            warn!("--insecure: serving plaintext and accepting unauthenticated agents");
            None
        }
    };
    let name = fabric.topology().name();
    let controller = Controller::with_hedera(
        fabric,
        Duration::from_millis(args.heartbeat_ms),
        hedera,
        Duration::from_millis(args.agent_grace_ms),
    );
    let listener: server::Listener = match args.listen.strip_prefix("unix:") {
        Some(path) => {
            // A socket left by a previous run would refuse the bind.
            let _ = std::fs::remove_file(path);
            tokio::net::UnixListener::bind(path)
                .with_context(|| format!("binding --listen {}", args.listen))?
                .into()
        }
        None => {
            let addr: SocketAddr = args.listen.parse().with_context(|| {
                format!("--listen {}: write HOST:PORT or unix:PATH", args.listen)
            })?;
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --listen {addr}"))?
                .into()
        }
    };
    info!(topology = %name, listen = %args.listen, tls = args.certs.is_some(), "controller serving");
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve = server::serve(controller, listener, tls, async {
        let _ = stopped.await;
    });
    tokio::pin!(serve);
    tokio::select! {
        result = &mut serve => result.context("serving")?,
        _ = tokio::signal::ctrl_c() => info!("SIGINT"),
        _ = sigterm.recv() => info!("SIGTERM"),
    }
    // Agents' streams never end by themselves: give requests a moment, then exit (agents keep
    // their state and reconnect to the next controller).
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), serve).await;
    Ok(())
}
