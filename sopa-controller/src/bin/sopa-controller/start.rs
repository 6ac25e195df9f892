//! Starting the controller: the store (and with etcd, the election), the fabric from the
//! topology and the stored state, the TLS, the listener.

use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, Result};
use sopa_controller::{
    auth::DenyList,
    election::{Candidate, Leadership},
    fabric::Fabric,
    server::Listener,
    store::{EtcdStore, Store, StoreSpec},
    transport::ServerTls,
};
use tracing::{info, warn};

use crate::cli::Args;

/// An epoch for a fabric that has no stored state yet: agents that see a new one start from a
/// snapshot. Stored, it stays for every later run (and every later leader).
fn epoch() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (t ^ (u64::from(std::process::id()) << 40)) | 1
}

/// The store `--store` names, open.
pub async fn store(args: &Args) -> Result<Store> {
    match &args.store {
        StoreSpec::Memory => Ok(Store::Memory),
        StoreSpec::File(path) => {
            if let Some(dir) = path.parent()
                && !dir.as_os_str().is_empty()
            {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("--store {}: creating {}", args.store, dir.display())
                })?;
            }
            Ok(Store::File(path.clone()))
        }
        StoreSpec::Etcd(endpoints) => Ok(Store::Etcd(Box::new(
            EtcdStore::connect(endpoints, &args.etcd_prefix, etcd_tls(args)?)
                .await
                .with_context(|| {
                    format!(
                        "--store {}: is etcd running there (`etcdctl --endpoints {} endpoint health`)?",
                        args.store,
                        endpoints.join(",")
                    )
                })?,
        ))),
    }
}

/// The TLS to etcd that --etcd-ca, --etcd-cert and --etcd-key describe, if any.
fn etcd_tls(args: &Args) -> Result<Option<etcd_client::TlsOptions>> {
    let (Some(ca), Some(cert), Some(key)) = (&args.etcd_ca, &args.etcd_cert, &args.etcd_key) else {
        return Ok(None);
    };
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))
    };
    Ok(Some(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read("--etcd-ca", ca)?))
            .identity(etcd_client::Identity::from_pem(
                read("--etcd-cert", cert)?,
                read("--etcd-key", key)?,
            )),
    ))
}

/// With an etcd store, waits until this replica is elected; `None` for the other stores.
pub async fn elect(args: &Args, store: &Store) -> Result<Option<Leadership>> {
    let Store::Etcd(etcd) = store else {
        return Ok(None);
    };
    let candidate = Candidate::new(
        etcd.as_ref().clone(),
        &args.replica_name(),
        Duration::from_secs(args.lease_ttl_s),
    );
    let leadership = candidate
        .campaign()
        .await
        .with_context(|| format!("--store {}: standing for election", args.store))?;
    Ok(Some(leadership))
}

/// The fabric: the stored state of this topology, or a new one (stored at once, so its epoch
/// is fixed from this run on).
pub async fn fabric(args: &Args, store: &Store) -> Result<Fabric> {
    let topology = args
        .topology
        .as_ref()
        .context("--topology is required to serve")?;
    let spec_path = topology.display().to_string();
    let (spec, encoding) = std::fs::read_to_string(topology)
        .map_err(anyhow::Error::from)
        .and_then(|text| Ok(Fabric::parse_spec_file(&text, &spec_path)?))
        .with_context(|| format!("--topology {spec_path}"))?;
    info!(%encoding, "hosts carry the path in this encoding");
    match store.load().await.context("--store")? {
        Some(state) => {
            let mut f =
                Fabric::restore(spec, &state).with_context(|| format!("--store {store}"))?;
            f.set_encoding(encoding);
            if args.accept_rollback {
                f.renew_epoch(epoch());
                store
                    .save(&f.persisted())
                    .await
                    .with_context(|| format!("--store {store}"))?;
                warn!(store = %store, version = f.version(), epoch = f.epoch(), "--accept-rollback: the stored state is served under a new epoch; every agent takes it as a snapshot");
            }
            info!(store = %store, version = f.version(), down_links = f.down_links().len(), down_switches = f.down_switches().len(), "state restored");
            Ok(f)
        }
        None => {
            let mut f = Fabric::new(spec, epoch())?;
            f.set_encoding(encoding);
            store
                .save(&f.persisted())
                .await
                .with_context(|| format!("--store {store}"))?;
            Ok(f)
        }
    }
}

/// The controller's TLS and deny list, or none with --insecure.
pub fn tls(args: &Args) -> Result<Option<ServerTls>> {
    let Some(dir) = &args.certs else {
        warn!("--insecure: serving plaintext and accepting unauthenticated agents");
        return Ok(None);
    };
    let deny = match &args.revoked {
        Some(path) => DenyList::load(path).context("--revoked")?,
        None => DenyList::none(),
    };
    let tls = ServerTls::load(dir, deny).with_context(|| format!("--certs {}", dir.display()))?;
    Ok(Some(tls))
}

pub async fn listener(args: &Args) -> Result<Listener> {
    match args.listen.strip_prefix("unix:") {
        Some(path) => {
            // A socket left by a previous run would refuse the bind.
            let _ = std::fs::remove_file(path);
            Ok(tokio::net::UnixListener::bind(path)
                .with_context(|| format!("binding --listen {}", args.listen))?
                .into())
        }
        None => {
            let addr: SocketAddr = args.listen.parse().with_context(|| {
                format!("--listen {}: write HOST:PORT or unix:PATH", args.listen)
            })?;
            Ok(tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --listen {addr}"))?
                .into())
        }
    }
}
