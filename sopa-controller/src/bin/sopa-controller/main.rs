//! `sopa-controller`: owns the fabric's topology and link states and pushes them to every agent.

mod cli;
mod start;

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::Parser as _;
use sopa_controller::server::{self, Controller};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("SOPA_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = cli::Args::parse();
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

async fn run(args: cli::Args) -> Result<()> {
    // Every flag checked before anything is read or written.
    let mut options = args.options()?;
    let fds = sopa_controller::fdlimit::ensure(options.limits.max_connections)
        .map_err(anyhow::Error::msg)?;
    info!(
        file_descriptors = fds,
        max_connections = options.limits.max_connections,
        "open-file limit"
    );
    // Both handlers first: a signal during the start is taken once it is done.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let tls = start::tls(&args)?;
    let store = start::store(&args).await?;
    // A replica waits here, serving nothing, until it is elected.
    let mut leadership = tokio::select! {
        l = start::elect(&args, &store) => l?,
        _ = sigint.recv() => { info!("SIGINT while waiting for the leadership"); return Ok(()) }
        _ = sigterm.recv() => { info!("SIGTERM while waiting for the leadership"); return Ok(()) }
    };
    let fabric = start::fabric(&args, &store).await?;
    let listener = start::listener(&args).await?;
    let name = fabric.topology().name();
    options.store = store;
    let controller = Controller::with_options(fabric, options);
    let _metrics = match args.metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --metrics-addr {addr}"))?;
            Some(sopa_controller::metrics::serve(
                listener,
                Arc::clone(&controller),
            ))
        }
        None => None,
    };
    info!(topology = %name, listen = %args.listen, tls = tls.is_some(), store = %args.store, "controller serving");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve = server::serve(Arc::clone(&controller), listener, tls, async {
        let _ = stopped.await;
    });
    tokio::pin!(serve);
    let lost = async {
        match leadership.as_mut() {
            Some(l) => l.lost().await,
            None => std::future::pending().await,
        }
    };
    let mut failure = None;
    tokio::select! {
        result = &mut serve => result.context("serving")?,
        _ = sigint.recv() => info!("SIGINT"),
        _ = sigterm.recv() => info!("SIGTERM"),
        why = lost => failure = Some(format!("lost the leadership: {why}")),
        why = controller.stepped_down() => failure = Some(why),
    }
    // Agents' streams never end by themselves: give requests a moment, then exit (agents keep
    // their state and reconnect to the next controller).
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), serve).await;
    if let Some(why) = failure {
        // Whatever is left of the lease goes now: a waiting replica need not wait for it.
        if let Some(l) = leadership {
            l.resign().await;
            bail!(
                "{why}; this replica stops serving (its supervisor starts it again, and it waits for the leadership)"
            );
        }
        bail!("{why}");
    }
    if let Some(l) = leadership {
        l.resign().await;
    }
    Ok(())
}
