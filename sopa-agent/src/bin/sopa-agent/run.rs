//! `sopa-agent run`: the host role until SIGINT/SIGTERM (or SIGUSR1 from a successor).

use std::{sync::Arc, time::Duration};

use sopa_agent::{
    Error,
    channel::HostApplier,
    granularity::{Granularity, RuntimeGranularity},
    host::{Host, HostOptions},
    path_table::PathTable,
    runtime::RuntimeMode,
};
use sopa_channel::proto::Role;
use tracing::{info, warn};

use crate::{
    channel::{ChannelArgs, channel_config},
    cli::RunArgs,
};

/// Where the host role serves its metrics and health endpoints without --metrics-addr.
pub const DEFAULT_METRICS_ADDR: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9470);

/// How long teardown may take before the agent gives up on it.
const GRACE: Duration = Duration::from_secs(10);

/// Starts the host role, runs it (offline or fed by the controller) until a signal, and stops
/// it: detached and restored, or left attached for the next agent.
pub async fn run(mut args: RunArgs, netns: Option<String>) -> Result<(), Error> {
    if args.host.as_deref() == Some("auto") {
        args.host = Some(own_address(&args.iface).await?);
        info!(host = ?args.host, "--host auto: this host is the inventory's host of this address");
    }
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
    let run_dir = sopa_agent::host::run_dir(&args.node.node);
    // A --mode (or SOPA_MODE) replaces a mode set at run time; only without one is it read.
    let runtime_mode = match &args.mode {
        Some(_) => None,
        None => RuntimeMode::load(&run_dir)?,
    };
    let mode = match (&args.mode, &runtime_mode) {
        (Some(mode), _) => mode.code(),
        (None, Some(kept)) => {
            warn!(
                mode = %kept.mode,
                set_unix = kept.set_unix,
                "keeping the mode set at run time with `sopa-agent mode`; start with --mode (or SOPA_MODE) to choose another"
            );
            kept.value()?
        }
        (None, None) => sopa_common::maps::mode::SOPA,
    };
    // Likewise --granularity (or SOPA_GRANULARITY) and one set at run time.
    let granularity = match args.granularity {
        Some(g) => g,
        None => match RuntimeGranularity::load(&run_dir)? {
            Some(kept) => {
                warn!(
                    granularity = %kept.granularity,
                    set_unix = kept.set_unix,
                    "keeping the granularity set at run time with `sopa-agent granularity`; start with --granularity (or SOPA_GRANULARITY) to choose another"
                );
                kept.granularity
            }
            None => Granularity::DEFAULT,
        },
    };
    // Fixed by the flag, or the controller's once its snapshot comes (the default until then).
    let meter_period = args
        .meter_period
        .map_or(sopa_agent::meter::DEFAULT_PERIOD, Duration::from);
    let meter_clock = sopa_agent::meter::MeterClock::new(meter_period, args.meter_period.is_some());
    let opts = HostOptions {
        mode,
        paths,
        paths_file,
        node: args.node.node.clone(),
        iface: args.iface.clone(),
        granularity,
        xdp: args.xdp_mode,
        tcp_reordering: args.tcp_reordering,
        metrics_addr: args.metrics.addr(DEFAULT_METRICS_ADDR),
        metrics_access: args.metrics.access()?,
        certificate: args.channel.certs.as_ref().map(|d| d.join("node.pem")),
        hash_seed: args.hash_seed,
        lower_route_mtu: !args.keep_route_mtu,
        paths_from_controller: args.controller.is_some(),
        reset: args.reset,
        netns,
        takeover: args.takeover,
        tcx_order: args.tcx_order,
        attach: args.attach,
        forget_runtime_mode: args.mode.is_some(),
        meter_period,
        measure_reordering: args.measure_reordering,
        guard_cgroup: args.guard_cgroup.clone(),
    };
    if let Some(period) = args.meter_period
        && !period.0.is_zero()
        && (!(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&period.0)
            || !period.is_whole_ms())
    {
        return Err(Error::Config(format!(
            "--meter-period {period}: give whole milliseconds from 10ms to 60s, or 0 to turn the path meter off (or leave it out: the controller's)"
        )));
    }
    if args.report_interval.0.is_zero() || args.nic_rate_mbit == Some(0) {
        return Err(Error::Config(
            "--report-interval and --nic-rate-mbit must be positive".into(),
        ));
    }
    // Every handler before anything changes: a signal during the start is taken once it is
    // done (the default action would end the agent with nothing restored).
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|err| Error::io("installing the SIGINT handler", err))?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::io("installing the SIGTERM handler", err))?;
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .map_err(|err| Error::io("installing the SIGUSR1 handler", err))?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|err| Error::io("installing the SIGHUP handler", err))?;
    let mut host = Host::start(&opts).await?;
    if args.granularity.is_some()
        && let Err(err) = RuntimeGranularity::clear(&run_dir)
    {
        warn!(%err, "forgetting the granularity set at run time");
    }
    // The entropy encoding's labels: `--labels` until `sopa-agent labels` asks for another
    // source (on SIGHUP), which lasts until the next start.
    if let Err(err) = sopa_agent::entropy::source::clear(&run_dir) {
        warn!(%err, "forgetting the label source asked for at run time");
    }
    let discovery = Arc::new(sopa_agent::entropy::runner::Discovery::new(
        host.maps(),
        run_dir.clone(),
        sopa_agent::entropy::discover::Pace {
            interval: args.probe_interval,
            wait: args.probe_wait,
            patience: 8,
        },
        args.labels,
    ));
    // Connections that time out have their destinations probed again.
    sopa_agent::entropy::loss::start(&discovery);
    // SIGHUP: `sopa-agent granularity` recorded a new unit of spraying, or `sopa-agent labels`
    // a label source; apply them. Without the granularity's control the agent runs on,
    // refusing run-time changes (its record says so).
    let cells = host
        .granularity_control()
        .inspect_err(|err| warn!(%err, "run-time granularity changes are off"))
        .ok();
    let reload = async {
        loop {
            hup.recv().await;
            sopa_ops::notify::reloading();
            match &cells {
                Some(cells) => {
                    if let Err(err) = cells.reload().await {
                        warn!(%err, "SIGHUP: granularity not changed");
                    }
                }
                None => warn!("SIGHUP: run-time granularity changes are off"),
            }
            // A request is taken once (and the labels drawn or probed again even when the
            // source stays: its command waits for a new summary).
            let wanted = sopa_agent::entropy::source::requested(&run_dir).and_then(|w| {
                sopa_agent::entropy::source::clear(&run_dir)?;
                Ok(w)
            });
            match wanted {
                Ok(Some(wanted)) => {
                    info!(labels = %wanted, "SIGHUP: entropy labels from this source");
                    if !discovery.set_source(wanted) {
                        info!("no topology yet: the first discovery takes them");
                    }
                }
                Ok(None) => {}
                Err(err) => warn!(%err, "SIGHUP: label source not changed"),
            }
            sopa_ops::notify::ready("running (reloaded on SIGHUP)");
        }
    };
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
            _ = sigint.recv() => info!("SIGINT"),
            _ = sigterm.recv() => info!("SIGTERM"),
            _ = usr1.recv() => {
                info!("SIGUSR1: a new agent takes over; exiting with the datapath attached");
                handed_over.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    };
    // The path meter's color turns whether or not a controller takes the reports: peers count
    // what this host sends by the color it carries.
    let turns = match sopa_agent::meter::start_turning(
        &host.maps(),
        Arc::clone(&meter_clock),
        host.meter_stats(),
    ) {
        Ok(turns) => turns,
        Err(err) => {
            warn!(%err, "the path meter's color cannot be turned; metering is off");
            if let Err(err) = host.maps().lock().expect("maps lock").set_meter_period(0) {
                warn!(%err, "turning the path meter off");
            }
            None
        }
    };
    match channel {
        None => {
            info!("running; SIGINT or SIGTERM detaches and restores");
            sopa_ops::notify::ready("running with the path table of --paths");
            // No controller takes the reports, but the counters are still emptied each period
            // (peers' packets keep arriving marked): the tables must not fill.
            let meter = turns.clone().map(|turns| {
                tokio::spawn(sopa_agent::meter::report_loop(
                    host.maps(),
                    None,
                    Arc::clone(&meter_clock),
                    turns,
                    host.meter_stats(),
                ))
            });
            tokio::select! {
                _ = signal => {}
                _ = reload => {}
            }
            if let Some(meter) = meter {
                meter.abort();
            }
        }
        Some(mut cfg) => {
            cfg.fallbacks = host.fallbacks();
            info!(controller = %cfg.endpoint, node = %cfg.node, "running with paths from the controller");
            sopa_ops::notify::ready("running; paths from the controller");
            let endpoint = cfg.endpoint.clone();
            let (_stop, stopped) = tokio::sync::watch::channel(false);
            let fabric_host = args.host.clone().unwrap_or_else(|| opts.node.clone());
            let (reports, reports_rx) = tokio::sync::mpsc::channel(4);
            let reports_tx_cabling = reports.clone();
            let reporter = tokio::spawn(sopa_agent::hedera::report_loop(
                host.maps(),
                reports.clone(),
                args.report_interval.into(),
                nic_bps,
            ));
            // Reports only while the color turns (a host that counts nothing must not report).
            let meter = turns.clone().map(|turns| {
                tokio::spawn(sopa_agent::meter::report_loop(
                    host.maps(),
                    Some(reports),
                    Arc::clone(&meter_clock),
                    turns,
                    host.meter_stats(),
                ))
            });
            let mut applier = HostApplier::new(
                &mut host,
                &fabric_host,
                &endpoint,
                Some(Arc::clone(&meter_clock)),
            )
            .with_discovery(Arc::clone(&discovery));
            // The uplink's LLDP neighbour, for the controller's cabling view and `sopactl
            // fabric discover`: listened to, never sent (a host's word changes nothing).
            let addresses = own_addresses(&args.iface).await.unwrap_or_default();
            let cabling = match sopa_agent::switch::cabling::Cabling::start(
                &fabric_host,
                false,
                vec![args.iface.clone()],
                addresses,
                std::time::Duration::from_secs(5),
                reports_tx_cabling,
            ) {
                Ok(c) => {
                    applier.on_session(c.resender());
                    Some(c)
                }
                Err(err) => {
                    warn!(%err, "not listening for the uplink's LLDP: the controller will not see this host's cabling");
                    None
                }
            };
            tokio::select! {
                _ = sopa_channel::client::run_with_reports(cfg, &mut applier, stopped, Some(reports_rx)) => {}
                _ = signal => {}
                _ = reload => {}
            }
            reporter.abort();
            if let Some(meter) = meter {
                meter.abort();
            }
            drop(cabling);
        }
    }
    sopa_ops::notify::stopping();
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

/// Every IPv4 address of `iface`.
async fn own_addresses(iface: &str) -> Result<Vec<String>, Error> {
    let index = std::ffi::CString::new(iface)
        .ok()
        // SAFETY: a valid C string.
        .map(|c| unsafe { libc::if_nametoindex(c.as_ptr()) })
        .unwrap_or(0);
    let netlink = sopa_agent::netlink::Netlink::connect()?;
    Ok(netlink
        .addresses()
        .await?
        .into_iter()
        .filter(|a| a.ifindex == index)
        .map(|a| a.local.to_string())
        .collect())
}

/// `--host auto`: the first IPv4 address of `iface`, by which the controller and the pushed
/// inventory know this host.
async fn own_address(iface: &str) -> Result<String, Error> {
    let index = std::ffi::CString::new(iface)
        .ok()
        // SAFETY: a valid C string.
        .map(|c| unsafe { libc::if_nametoindex(c.as_ptr()) })
        .filter(|i| *i != 0)
        .ok_or_else(|| Error::Config(format!("--host auto: no interface {iface:?} (--iface)")))?;
    let netlink = sopa_agent::netlink::Netlink::connect()?;
    netlink
        .addresses()
        .await?
        .into_iter()
        .find(|a| a.ifindex == index)
        .map(|a| a.local.to_string())
        .ok_or_else(|| {
            Error::Config(format!(
                "--host auto: {iface} has no IPv4 address to find this host by in the inventory; \
                 give it its address first, or name the host with --host NAME"
            ))
        })
}
