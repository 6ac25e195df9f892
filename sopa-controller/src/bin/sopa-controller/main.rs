//! `sopa-controller`: owns the fabric's topology and link states and pushes them to every agent.

mod cli;
mod start;

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser as _;
use sopa_controller::server::{self, Controller};
use sopa_ops::exit;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

/// The `SOPA_*_MS` variables of the flags that became durations, read under their new names.
const RENAMED_VARIABLES: [(&str, &str); 11] = [
    ("SOPA_HANDSHAKE_TIMEOUT_MS", "SOPA_HANDSHAKE_TIMEOUT"),
    ("SOPA_FLAP_WINDOW_MS", "SOPA_FLAP_WINDOW"),
    ("SOPA_FLAP_HOLD_MS", "SOPA_FLAP_HOLD"),
    ("SOPA_FLAP_MAX_HOLD_MS", "SOPA_FLAP_MAX_HOLD"),
    ("SOPA_HEARTBEAT_MS", "SOPA_HEARTBEAT"),
    ("SOPA_HEDERA_INTERVAL_MS", "SOPA_HEDERA_INTERVAL"),
    ("SOPA_PIN_LIFETIME_MS", "SOPA_PIN_LIFETIME"),
    ("SOPA_AGENT_GRACE_MS", "SOPA_AGENT_GRACE"),
    (
        "SOPA_CONTROLLER_METER_PERIOD_MS",
        "SOPA_CONTROLLER_METER_PERIOD",
    ),
    ("SOPA_SUSPECT_HOLD_MS", "SOPA_SUSPECT_HOLD"),
    ("SOPA_SUSPECT_MAX_HOLD_MS", "SOPA_SUSPECT_MAX_HOLD"),
];

/// An error with the exit code of its cause (`sopa_ops::exit`).
struct Exit {
    code: u8,
    error: anyhow::Error,
}

impl Exit {
    fn config(error: anyhow::Error) -> Self {
        Self {
            code: exit::CONFIG,
            error,
        }
    }

    fn failure(error: anyhow::Error) -> Self {
        Self {
            code: exit::FAILURE,
            error,
        }
    }
}

fn main() -> ExitCode {
    sopa_ops::duration::env_aliases(&RENAMED_VARIABLES);
    let args = cli::Args::parse();
    if let Some(shell) = args.completions {
        sopa_ops::cli::print_completions(<cli::Args as clap::CommandFactory>::command(), shell);
        return ExitCode::SUCCESS;
    }
    if let Some(dir) = &args.man_dir {
        return match sopa_ops::cli::write_man_pages(
            <cli::Args as clap::CommandFactory>::command(),
            dir,
        ) {
            Ok(pages) => {
                println!("{} man pages in {}", pages.len(), dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "sopa-controller: writing the man page into {}: {e}",
                    dir.display()
                );
                ExitCode::from(exit::FAILURE)
            }
        };
    }
    sopa_ops::logging::init(args.log.log_format, "info");
    sopa_ops::logging::starting("sopa-controller", "controller");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Exit { code, error }) => {
            eprintln!("sopa-controller: {error:#}");
            ExitCode::from(code)
        }
    }
}

async fn run(args: cli::Args) -> Result<(), Exit> {
    // Every flag checked before anything is read or written.
    let mut options = args.options().map_err(Exit::config)?;
    let fds = sopa_controller::fdlimit::ensure(options.limits.max_connections)
        .map_err(|e| Exit::config(anyhow::Error::msg(e)))?;
    info!(
        file_descriptors = fds,
        max_connections = options.limits.max_connections,
        "open-file limit"
    );
    // Both handlers first: a signal during the start is taken once it is done.
    let mut sigint = signal(SignalKind::interrupt())
        .context("installing the SIGINT handler")
        .map_err(Exit::failure)?;
    let mut sigterm = signal(SignalKind::terminate())
        .context("installing the SIGTERM handler")
        .map_err(Exit::failure)?;
    let tls = start::tls(&args).map_err(Exit::config)?;
    // The endpoints first, a standby's included: its health and its place in the fleet show
    // while it waits for the leadership.
    let replica = server::Replica::default();
    let access = sopa_ops::http::Access {
        allow: args.metrics_allow.clone(),
        tls: args
            .metrics_tls
            .load()
            .map_err(|e| Exit::config(e.into()))?,
    };
    let _metrics = match args.metrics_addr {
        Some(addr) => {
            let listener = sopa_ops::http::bind(addr, &access)
                .await
                .map_err(|e| Exit::config(e.into()))?;
            Some(sopa_controller::metrics::serve_replica(
                listener,
                Arc::clone(&replica),
                &args.replica_name(),
                args.certs.as_ref().map(|d| d.join("node.pem")),
                access,
            ))
        }
        None => None,
    };
    let store = start::store(&args).await.map_err(Exit::failure)?;
    // A replica waits here, serving nothing on its listen address, until it is elected.
    sopa_ops::notify::ready("standby: waiting for the leadership");
    let mut leadership = tokio::select! {
        l = start::elect(&args, &store) => l.map_err(Exit::failure)?,
        _ = sigint.recv() => { info!("SIGINT while waiting for the leadership"); return Ok(()) }
        _ = sigterm.recv() => { info!("SIGTERM while waiting for the leadership"); return Ok(()) }
    };
    // A topology or a state that does not fit it is the operator's to fix; the store failing
    // under it (etcd away, the lease lost since the election) is not.
    let fabric = start::fabric(&args, &store).await.map_err(|error| {
        let store_error = error
            .chain()
            .find_map(|c| c.downcast_ref::<sopa_controller::store::StoreError>());
        let code = match store_error {
            Some(e) if e.ends_leadership() => exit::LOST_LEADERSHIP,
            Some(_) => exit::FAILURE,
            None => exit::CONFIG,
        };
        Exit { code, error }
    })?;
    let listener = start::listener(&args).await.map_err(Exit::config)?;
    let name = fabric.topology().name();
    options.store = store;
    let controller = Controller::with_options(fabric, options);
    let _ = replica.set(Arc::clone(&controller));
    info!(topology = %name, listen = %args.listen, tls = tls.is_some(), store = %args.store, "controller serving");
    sopa_ops::notify::ready("leading: serving the agents");
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
        result = &mut serve => result.context("serving").map_err(Exit::failure)?,
        _ = sigint.recv() => info!("SIGINT"),
        _ = sigterm.recv() => info!("SIGTERM"),
        why = lost => failure = Some((exit::LOST_LEADERSHIP, format!("lost the leadership: {why}"))),
        why = controller.stepped_down() => {
            // A state it refuses to serve (agents ahead of it) is the operator's to settle.
            let code = if controller.lost_leadership() { exit::LOST_LEADERSHIP } else { exit::CONFIG };
            failure = Some((code, why));
        }
    }
    sopa_ops::notify::stopping();
    // Agents' streams never end by themselves: give requests a moment, then exit (agents keep
    // their state and reconnect to the next controller).
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), serve).await;
    if let Some((code, why)) = failure {
        // Whatever is left of the lease goes now: a waiting replica need not wait for it.
        if let Some(l) = leadership {
            l.resign().await;
            return Err(Exit {
                code,
                error: anyhow::anyhow!(
                    "{why}; this replica stops serving (its supervisor starts it again, and it waits for the leadership)"
                ),
            });
        }
        return Err(Exit {
            code,
            error: anyhow::anyhow!("{why}"),
        });
    }
    if let Some(l) = leadership {
        l.resign().await;
    }
    Ok(())
}
