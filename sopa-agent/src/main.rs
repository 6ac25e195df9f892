//! `sopa-agent`: the SOPA host agent.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use sopa_agent::{
    Error,
    channel::HostApplier,
    datapath::TcxOrder,
    host::{self, Granularity, Host, HostOptions, XdpAttach},
    path_table::PathTable,
    status,
};
use sopa_controller::{client::ClientConfig, proto::Role};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

/// SOPA host agent: spreads every TCP/UDP flow over all equal-cost fabric paths in strict
/// round-robin, written into a 4-byte IPv4 source-route option.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Enter this network namespace (a name under /run/netns, or a path) first. Unlike
    /// `ip netns exec`, this keeps the mount namespace, so the bpffs pins stay shared.
    #[arg(long, global = true, env = "SOPA_NETNS")]
    netns: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Attach the datapath to the fabric interface and run until SIGINT/SIGTERM.
    Run(RunArgs),
    /// The switch role: forward by the controller's topology until SIGINT/SIGTERM.
    Switch(SwitchArgs),
    /// Show a running agent's mode, path table and counters.
    Status {
        #[command(flatten)]
        node: NodeArg,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
    /// Switch a running agent's path-selection mode, without reloading its programs.
    Mode {
        #[command(flatten)]
        node: NodeArg,
        /// sopa, rps, ecmp, pinned, single or off.
        mode: String,
    },
    /// Remove a datapath left attached (`run --keep-attached`, or after a crash): detach the
    /// programs, unpin the maps and restore every host setting the agent changed.
    Detach {
        #[command(flatten)]
        node: NodeArg,
    },
    /// Validate a path table file and print it.
    CheckPaths {
        /// The TOML path table.
        file: PathBuf,
    },
}

#[derive(clap::Args)]
struct NodeArg {
    /// This node's name: the folder of its pins and state (/sys/fs/bpf/sopa/NODE, /run/sopa/NODE).
    #[arg(long, env = "SOPA_NODE", default_value_t = default_node())]
    node: String,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    node: NodeArg,
    /// The host's fabric interface.
    #[arg(long, env = "SOPA_IFACE")]
    iface: String,
    /// TOML path table: destination prefix -> candidate paths (offline mode).
    #[arg(
        long,
        env = "SOPA_PATHS",
        required_unless_present = "controller",
        conflicts_with = "controller"
    )]
    paths: Option<PathBuf>,
    /// The controller (https://HOST:7470): paths come from the topology it pushes, and this
    /// agent's --node must be a host of that topology.
    #[arg(long, env = "SOPA_CONTROLLER")]
    controller: Option<String>,
    #[command(flatten)]
    channel: ChannelFlags,
    /// This host's name in the controller's topology (e.g. h0); defaults to --node.
    #[arg(long, env = "SOPA_HOST")]
    host: Option<String>,
    /// Path selection: sopa (per-flow round-robin), rps (random per packet), ecmp (5-tuple
    /// hash), pinned (Hedera: controller pins, else the hash), single (the first path), off.
    #[arg(long, env = "SOPA_MODE", default_value = "sopa")]
    mode: String,
    /// The unit of spraying: packet (gso_max_segs 1) or burst (GSO super-packets).
    #[arg(long, env = "SOPA_GRANULARITY", value_enum, default_value_t = Granularity::Packet)]
    granularity: Granularity,
    /// How xdp_strip attaches: auto (generic on veth, native elsewhere), generic, native.
    #[arg(long, env = "SOPA_XDP_MODE", value_enum, default_value_t = XdpAttach::Auto)]
    xdp_mode: XdpAttach,
    /// net.ipv4.tcp_reordering while the agent runs (restored on exit).
    #[arg(long, env = "SOPA_TCP_REORDERING", default_value_t = 10)]
    tcp_reordering: u32,
    /// Loopback address of the Prometheus metrics endpoint (GET /metrics).
    #[arg(long, env = "SOPA_METRICS_ADDR", default_value = "127.0.0.1:9470")]
    metrics_addr: SocketAddr,
    /// Serve no metrics.
    #[arg(long, env = "SOPA_NO_METRICS")]
    no_metrics: bool,
    /// Leave the fabric routes' MTU alone (for fabrics whose links carry MTU + 4 bytes).
    /// Otherwise the agent lowers it by 4 with `mtu lock`, so full-size packets fit stamped.
    #[arg(long, env = "SOPA_KEEP_ROUTE_MTU")]
    keep_route_mtu: bool,
    /// Seed of the 5-tuple hash (ecmp mode and the stateless fallback).
    #[arg(long, env = "SOPA_HASH_SEED", default_value_t = 0x5eed)]
    hash_seed: u32,
    /// The NIC rate elephants are measured against (pinned mode): Mbit/s. Defaults to the
    /// interface's link speed.
    #[arg(long, env = "SOPA_NIC_RATE_MBIT")]
    nic_rate_mbit: Option<u64>,
    /// How often pinned mode reports elephants to the controller.
    #[arg(long, env = "SOPA_REPORT_INTERVAL_MS", default_value_t = 1000)]
    report_interval_ms: u64,
    /// On exit, leave the datapath attached and the host settings it needs in place: traffic
    /// keeps its paths while no agent runs. The next agent adopts it; `detach` removes it.
    #[arg(long, env = "SOPA_KEEP_ATTACHED")]
    keep_attached: bool,
    /// Do not adopt what a previous agent of this node left: restore it and start clean.
    #[arg(long, env = "SOPA_RESET", conflicts_with = "takeover")]
    reset: bool,
    /// Take over from a running agent of this node in place (an upgrade): it exits leaving
    /// the datapath attached, and this one adopts it, replacing the programs atomically.
    #[arg(long, env = "SOPA_TAKEOVER")]
    takeover: bool,
    /// Where tc_stamp goes among the interface's other TCX egress programs: last (others see
    /// packets as the stack sent them) or first. An adopted datapath keeps its place.
    #[arg(long, env = "SOPA_TCX_ORDER", value_enum, default_value_t = TcxOrder::Last)]
    tcx_order: TcxOrder,
}

#[derive(clap::Args)]
struct SwitchArgs {
    #[command(flatten)]
    node: NodeArg,
    /// This switch's name in the controller's topology (e.g. e0, eps.0.0.1.0); defaults to --node.
    #[arg(long, env = "SOPA_HOST")]
    host: Option<String>,
    /// The controller: https://HOST:PORT (with --certs), http:// (with --insecure), or unix:PATH.
    #[arg(long, env = "SOPA_CONTROLLER")]
    controller: String,
    #[command(flatten)]
    channel: ChannelFlags,
    /// This switch's multipath hash seed (distinct per switch, or the fabric polarizes).
    #[arg(long, env = "SOPA_HASH_SEED")]
    hash_seed: Option<u32>,
    /// Where tc_forward goes among each port's other TCX ingress programs: last or first.
    #[arg(long, env = "SOPA_TCX_ORDER", value_enum, default_value_t = TcxOrder::Last)]
    tcx_order: TcxOrder,
}

/// How to talk to the controller, for either role.
#[derive(clap::Args)]
struct ChannelFlags {
    /// Certificate folder (ca.pem, agent.pem, agent.key) for the controller's mutual TLS.
    #[arg(long, env = "SOPA_CERTS", conflicts_with = "insecure")]
    certs: Option<PathBuf>,
    /// Talk to the controller in plaintext (http://). For tests only.
    #[arg(long, env = "SOPA_INSECURE")]
    insecure: bool,
    /// The name in the controller's certificate.
    #[arg(long, env = "SOPA_CONTROLLER_NAME", default_value = sopa_controller::tls::CONTROLLER_NAME)]
    controller_name: String,
    /// Heartbeat interval on the channel (the controller is gone after three silent ones).
    #[arg(long, env = "SOPA_HEARTBEAT_MS", default_value_t = 1000)]
    heartbeat_ms: u64,
}

fn default_node() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

async fn switch(args: SwitchArgs) -> Result<(), Error> {
    let cfg = channel_config(
        &ChannelArgs {
            node: &args.node.node,
            topology_name: args.host.as_deref(),
            role: Role::Switch,
            flags: &args.channel,
        },
        &args.controller,
    )?;
    let seed = args.hash_seed.unwrap_or_else(|| {
        // A stable per-switch seed from its name.
        args.node.node.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        })
    });
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::io("installing the SIGTERM handler", err))?;
    let mut sw = sopa_agent::switch::Switch::start(&sopa_agent::switch::SwitchOptions {
        node: args.node.node.clone(),
        hash_seed: seed,
        tcx_order: args.tcx_order,
    })
    .await?;
    let name = args.host.clone().unwrap_or_else(|| args.node.node.clone());
    info!(node = %args.node.node, topology_name = %name, controller = %args.controller, "switch running");
    {
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let (reports, reports_rx) = tokio::sync::mpsc::channel(256);
        let mut applier =
            sopa_agent::switch::SwitchApplier::new(&mut sw, &name, &args.controller, reports);
        tokio::select! {
            _ = sopa_controller::client::run_with_reports(cfg, &mut applier, stopped, Some(reports_rx)) => {}
            _ = tokio::signal::ctrl_c() => info!("SIGINT"),
            _ = sigterm.recv() => info!("SIGTERM"),
        }
    }
    let errors = sw.stop().await;
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What the channel needs from either role's flags.
struct ChannelArgs<'a> {
    node: &'a str,
    /// The node's name in the controller's topology (`--host`), when given.
    topology_name: Option<&'a str>,
    role: Role,
    flags: &'a ChannelFlags,
}

/// The channel settings of `--controller URL`; configuration errors before anything runs.
fn channel_config(args: &ChannelArgs, url: &str) -> Result<ClientConfig, Error> {
    let mut cfg = ClientConfig::new(url, args.node, args.role);
    cfg.topology_name = args.topology_name.map(str::to_owned);
    if args.flags.heartbeat_ms == 0 {
        return Err(Error::Config("--heartbeat-ms must be at least 1".into()));
    }
    cfg.heartbeat = Duration::from_millis(args.flags.heartbeat_ms);
    if url.starts_with("unix:") {
        // A local socket: who may connect is decided by the socket file's permissions.
        if args.flags.certs.is_some() {
            return Err(Error::Config(format!(
                "--certs does not apply to the local socket {url}"
            )));
        }
        return Ok(cfg);
    }
    match (
        url.split_once("://").map(|(s, _)| s),
        args.flags.certs.as_ref(),
        args.flags.insecure,
    ) {
        (Some("https"), Some(dir), false) => {
            cfg.tls = Some(
                sopa_controller::tls::client_config(dir, &args.flags.controller_name)
                    .map_err(|e| Error::Config(format!("--certs {}: {e}", dir.display())))?,
            );
        }
        (Some("https"), None, _) => {
            return Err(Error::Config(format!(
                "--controller {url} needs --certs DIR (ca.pem, agent.pem, agent.key from `sopactl certs init`)"
            )));
        }
        (Some("http"), _, true) => warn!("--insecure: talking to the controller in plaintext"),
        (Some("http"), _, false) => {
            return Err(Error::Config(format!(
                "--controller {url} is plaintext; use https:// with --certs, or pass --insecure for tests"
            )));
        }
        _ => {
            return Err(Error::Config(format!(
                "--controller {url:?} is not an https://, http:// or unix: address"
            )));
        }
    }
    Ok(cfg)
}

/// How long teardown may take before the agent gives up on it.
const GRACE: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("SOPA_LOG")
                .unwrap_or_else(|_| EnvFilter::new("info,netlink_packet_route=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Before any thread exists: threads inherit the namespace of the one that spawns them.
    if let Some(netns) = &cli.netns
        && let Err(err) = host::enter_netns(netns)
    {
        eprintln!("sopa-agent: {err}");
        return ExitCode::from(err.exit_code());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(dispatch(cli.command, cli.netns)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sopa-agent: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

async fn dispatch(command: Command, netns: Option<String>) -> Result<(), Error> {
    match command {
        Command::Run(args) => run(args, netns).await,
        Command::Detach { node } => detach(&node.node, netns.as_deref()).await,
        Command::Switch(args) => switch(args).await,
        Command::Status { node, json } => {
            host::validate_node(&node.node)?;
            let status = status::read(
                &node.node,
                &host::run_dir(&node.node),
                &host::pin_dir(&node.node),
            )?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status).expect("status serializes")
                );
            } else {
                print!("{}", status.render());
            }
            Ok(())
        }
        Command::Mode { node, mode } => {
            host::validate_node(&node.node)?;
            let mode = status::parse_mode(&mode)?;
            let pins = host::pin_dir(&node.node);
            if !pins.exists() {
                return Err(Error::NotRunning {
                    node: node.node.clone(),
                    dir: pins,
                });
            }
            let mut maps = sopa_agent::datapath::MapSet::from_pins(&pins)?;
            let mut config = maps.config()?;
            config.mode = mode;
            maps.set_config(config)?;
            println!("node {}: mode {}", node.node, status::mode_name(mode));
            Ok(())
        }
        Command::CheckPaths { file } => {
            let table = PathTable::load(&file)?;
            println!("{}: {} prefixes", file.display(), table.len());
            for (prefix, hops) in &table.destinations {
                let hops: Vec<String> = hops.iter().map(ToString::to_string).collect();
                println!("  {prefix:<18} {}", hops.join(" "));
            }
            Ok(())
        }
    }
}

/// `sopa-agent detach`: undo what a stopped agent left attached.
async fn detach(node: &str, netns: Option<&str>) -> Result<(), Error> {
    host::validate_node(node)?;
    let run_dir = host::run_dir(node);
    let Some(record) = sopa_agent::changes::Journal::read(&run_dir)? else {
        let pins = host::pin_dir(node);
        if pins.exists() {
            std::fs::remove_dir_all(&pins)
                .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
            println!("node {node}: removed {} (no agent record)", pins.display());
            return Ok(());
        }
        return Err(Error::NotRunning {
            node: node.to_owned(),
            dir: pins,
        });
    };
    if record.is_live() {
        return Err(Error::Config(format!(
            "node {node}: agent {} is running; stop it (SIGTERM) instead",
            record.pid
        )));
    }
    if let Some(ns) = &record.netns
        && netns.is_none()
        && !std::path::Path::new("/run/netns").join(ns).exists()
    {
        // The namespace is gone, and with it the interface, its routes and settings: only
        // the pins and the record are left.
        let pins = host::pin_dir(node);
        for (what, result) in [
            ("pins", std::fs::remove_dir_all(&pins)),
            ("record", std::fs::remove_dir_all(&run_dir)),
        ] {
            if let Err(e) = result
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::io(format!("removing the {what} of {node}"), e));
            }
        }
        println!("node {node}: network namespace {ns:?} is gone; removed its pins and record");
        return Ok(());
    }
    if let Some(ns) = &record.netns
        && netns != Some(ns.as_str())
    {
        return Err(Error::Config(format!(
            "node {node} ran in network namespace {ns:?}: run `sopa-agent --netns {ns} detach --node {node}`"
        )));
    }
    host::check_privileges()?;
    let netlink = sopa_agent::netlink::Netlink::connect()?;
    let changes = record.changes.len();
    let errors = sopa_agent::changes::Journal::resume(&run_dir, record)
        .undo(&netlink)
        .await;
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => {
            println!("node {node}: detached, {changes} changes restored");
            Ok(())
        }
    }
}

async fn run(args: RunArgs, netns: Option<String>) -> Result<(), Error> {
    let channel = match &args.controller {
        None => None,
        Some(url) => Some(channel_config(
            &ChannelArgs {
                node: &args.node.node,
                topology_name: args.host.as_deref(),
                role: Role::Host,
                flags: &args.channel,
            },
            url,
        )?),
    };
    let (paths, paths_file) = match &args.paths {
        Some(file) => (
            PathTable::load(file)?,
            Some(std::path::absolute(file).unwrap_or(file.clone())),
        ),
        None => (PathTable::default(), None),
    };
    let opts = HostOptions {
        mode: status::parse_mode(&args.mode)?,
        paths,
        paths_file,
        node: args.node.node.clone(),
        iface: args.iface.clone(),
        granularity: args.granularity,
        xdp: args.xdp_mode,
        tcp_reordering: args.tcp_reordering,
        metrics_addr: (!args.no_metrics).then_some(args.metrics_addr),
        hash_seed: args.hash_seed,
        lower_route_mtu: !args.keep_route_mtu,
        paths_from_controller: args.controller.is_some(),
        reset: args.reset,
        netns,
        takeover: args.takeover,
        tcx_order: args.tcx_order,
    };
    if args.report_interval_ms == 0 || args.nic_rate_mbit == Some(0) {
        return Err(Error::Config(
            "--report-interval-ms and --nic-rate-mbit must be positive".into(),
        ));
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::io("installing the SIGTERM handler", err))?;
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .map_err(|err| Error::io("installing the SIGUSR1 handler", err))?;
    let mut host = Host::start(&opts).await?;
    let handed_over = std::sync::atomic::AtomicBool::new(false);
    let nic_bps = match args.nic_rate_mbit {
        Some(m) => m * 1_000_000,
        None => match sopa_agent::netlink::link_speed_mbit(&args.iface) {
            Some(m) => m * 1_000_000,
            None => {
                warn!(iface = %args.iface, "link speed unknown; pinned mode measures elephants against 10 Gbit/s (set --nic-rate-mbit)");
                10_000_000_000
            }
        },
    };
    let signal = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => info!("SIGINT"),
            _ = sigterm.recv() => info!("SIGTERM"),
            _ = usr1.recv() => {
                info!("SIGUSR1: a new agent takes over; exiting with the datapath attached");
                handed_over.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    };
    match channel {
        None => {
            info!("running; SIGINT or SIGTERM detaches and restores");
            signal.await;
        }
        Some(cfg) => {
            info!(controller = %cfg.endpoint, node = %cfg.node, "running with paths from the controller");
            let endpoint = cfg.endpoint.clone();
            let (_stop, stopped) = tokio::sync::watch::channel(false);
            let fabric_host = args.host.clone().unwrap_or_else(|| opts.node.clone());
            let (reports, reports_rx) = tokio::sync::mpsc::channel(2);
            let reporter = tokio::spawn(sopa_agent::hedera::report_loop(
                host.maps(),
                reports,
                std::time::Duration::from_millis(args.report_interval_ms),
                nic_bps,
            ));
            let mut applier = HostApplier::new(&mut host, &fabric_host, &endpoint);
            tokio::select! {
                _ = sopa_controller::client::run_with_reports(cfg, &mut applier, stopped, Some(reports_rx)) => {}
                _ = signal => {}
            }
            reporter.abort();
        }
    }
    let keep = args.keep_attached || handed_over.load(std::sync::atomic::Ordering::Relaxed);
    match tokio::time::timeout(GRACE, host.stop(keep)).await {
        Ok(errors) if errors.is_empty() => {
            if keep {
                info!(
                    "exiting with the datapath attached (--keep-attached); the next agent adopts it, `sopa-agent detach` removes it"
                );
            } else {
                info!("detached and restored");
            }
            Ok(())
        }
        Ok(mut errors) => {
            for err in &errors {
                warn!(%err, "teardown");
            }
            Err(errors.swap_remove(0))
        }
        Err(_) => Err(Error::Config(format!(
            "teardown did not finish within {} s; the next start restores what is left",
            GRACE.as_secs()
        ))),
    }
}
