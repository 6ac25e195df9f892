//! `sopa-agent`: the SOPA host agent.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use sopa_agent::{
    Error,
    host::{self, Granularity, Host, HostOptions, XdpAttach},
    path_table::PathTable,
    status,
};
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
        /// sopa, rps, ecmp or off.
        mode: String,
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
    /// TOML path table: destination prefix -> candidate paths.
    #[arg(long, env = "SOPA_PATHS")]
    paths: PathBuf,
    /// Path selection: sopa (per-flow round-robin), rps (random per packet), ecmp (5-tuple
    /// hash), off.
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
}

fn default_node() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
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
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sopa-agent: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

async fn dispatch(command: Command) -> Result<(), Error> {
    match command {
        Command::Run(args) => run(args).await,
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

async fn run(args: RunArgs) -> Result<(), Error> {
    let opts = HostOptions {
        mode: status::parse_mode(&args.mode)?,
        paths: PathTable::load(&args.paths)?,
        paths_file: Some(std::path::absolute(&args.paths).unwrap_or(args.paths.clone())),
        node: args.node.node,
        iface: args.iface,
        granularity: args.granularity,
        xdp: args.xdp_mode,
        tcp_reordering: args.tcp_reordering,
        metrics_addr: (!args.no_metrics).then_some(args.metrics_addr),
        hash_seed: args.hash_seed,
        lower_route_mtu: !args.keep_route_mtu,
    };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::io("installing the SIGTERM handler", err))?;
    let host = Host::start(&opts).await?;
    info!("running; SIGINT or SIGTERM detaches and restores");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("SIGINT"),
        _ = sigterm.recv() => info!("SIGTERM"),
    }
    match tokio::time::timeout(GRACE, host.stop()).await {
        Ok(errors) if errors.is_empty() => {
            info!("detached and restored");
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
