//! `sopa-agent switch`: the switch role until SIGINT/SIGTERM.

use std::time::Duration;

use sopa_agent::Error;
use sopa_channel::proto::Role;
use tracing::{info, warn};

use crate::{
    channel::{ChannelArgs, channel_config},
    cli::SwitchArgs,
};

/// Where the switch role serves its metrics and health endpoints without --metrics-addr.
const DEFAULT_METRICS_ADDR: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9472);

pub async fn switch(args: SwitchArgs, netns: Option<String>) -> Result<(), Error> {
    if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&args.lldp_interval.0) {
        return Err(Error::Config(format!(
            "--lldp-interval {}: give 100ms to 1h",
            args.lldp_interval
        )));
    }
    let mut cfg = channel_config(
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
    // Both handlers before anything changes: a signal during the start is taken once it is
    // done (the default action would end the agent with nothing restored).
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|err| Error::io("installing the SIGINT handler", err))?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| Error::io("installing the SIGTERM handler", err))?;
    // Bound before anything changes: an address in use fails with nothing to undo.
    let access = args.metrics.access()?;
    let metrics = match args.metrics.addr(DEFAULT_METRICS_ADDR) {
        Some(addr) => Some(sopa_agent::metrics::bind(addr, &access).await?),
        None => None,
    };
    let mut sw = sopa_agent::switch::Switch::start(&sopa_agent::switch::SwitchOptions {
        node: args.node.node.clone(),
        hash_seed: seed,
        reset: args.reset,
        netns,
        tcx_order: args.tcx_order,
        usid: args.usid,
        attach: args.attach,
        lldp: args.lldp,
        lldp_interval: args.lldp_interval.into(),
    })
    .await?;
    // The forwarding runs now: a registry that cannot open its maps costs the metrics, not the
    // switch (nor its teardown).
    let pins = sopa_agent::host::pin_dir(&args.node.node);
    let registry = metrics.and_then(|listener| {
        sopa_agent::switch::metrics::registry(&pins, sw.gauges(), &args.node.node)
            .inspect_err(|err| warn!(%err, "serving no metrics"))
            .ok()
            .map(|r| (listener, r))
    });
    let _metrics = match registry {
        Some((listener, mut registry)) => {
            if let Some(dir) = &args.channel.certs {
                sopa_agent::metrics::register_cert_expiry(
                    &mut registry,
                    "switch",
                    &dir.join("node.pem"),
                );
            }
            Some(sopa_agent::metrics::serve(
                listener,
                registry,
                sw.gauges().readiness(),
                access,
            ))
        }
        None => None,
    };
    cfg.fallbacks = sw.fallbacks();
    let name = args.host.clone().unwrap_or_else(|| args.node.node.clone());
    info!(node = %args.node.node, topology_name = %name, controller = %args.controller, "switch running");
    sopa_ops::notify::ready("switch running");
    {
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let (reports, reports_rx) = tokio::sync::mpsc::channel(256);
        let mut applier =
            sopa_agent::switch::SwitchApplier::new(&mut sw, &name, &args.controller, reports);
        tokio::select! {
            _ = sopa_channel::client::run_with_reports(cfg, &mut applier, stopped, Some(reports_rx)) => {}
            _ = sigint.recv() => info!("SIGINT"),
            _ = sigterm.recv() => info!("SIGTERM"),
        }
    }
    sopa_ops::notify::stopping();
    let errors = sw.stop(args.keep_attached).await;
    if errors.is_empty() {
        if args.keep_attached {
            info!(
                "exiting with the forwarding in place (--keep-attached); the next agent adopts it, `sopa-agent detach` removes it"
            );
        } else {
            info!("detached and restored");
        }
    }
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
