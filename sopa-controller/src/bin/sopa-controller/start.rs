//! Starting the controller: the fabric from the topology and the stored state, the TLS, the
//! listener.

use std::net::SocketAddr;

use anyhow::{Context as _, Result};
use sopa_controller::{
    auth::DenyList, fabric::Fabric, server::Listener, store::Store, transport::ServerTls,
};
use tracing::{info, warn};

use crate::cli::Args;

/// An epoch for a fabric that has no stored state yet: agents that see a new one start from a
/// snapshot. Stored, it stays for every later run.
fn epoch() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (t ^ (u64::from(std::process::id()) << 40)) | 1
}

/// The fabric: the stored state of this topology, or a new one (stored at once, so its epoch
/// is fixed from this run on).
pub fn fabric(args: &Args) -> Result<Fabric> {
    let spec_path = args.topology.display().to_string();
    let spec = std::fs::read_to_string(&args.topology)
        .map_err(anyhow::Error::from)
        .and_then(|text| Ok(Fabric::parse_spec(&text, &spec_path)?))
        .with_context(|| format!("--topology {spec_path}"))?;
    if let Store::File(path) = &args.store
        && let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--store {}: creating {}", args.store, dir.display()))?;
    }
    match args.store.load().context("--store")? {
        Some(state) => {
            let f =
                Fabric::restore(spec, &state).with_context(|| format!("--store {}", args.store))?;
            info!(store = %args.store, version = f.version(), down_links = f.down_links().len(), down_switches = f.down_switches().len(), "state restored");
            Ok(f)
        }
        None => {
            let f = Fabric::new(spec, epoch())?;
            args.store
                .save(&f.persisted())
                .with_context(|| format!("--store {}", args.store))?;
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
