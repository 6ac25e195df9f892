//! The controller's own certificate and key, reloaded when their files change (cert-manager,
//! or an operator with `sopactl certs issue`, renews them in place): each new handshake takes
//! the newest pair that parses, names a controller and matches its key; the connections open
//! meanwhile keep theirs. A pair that does not load (a rename caught halfway, the wrong role)
//! leaves the previous one in force, and says so.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use sopa_channel::{
    identity::Role,
    tls::{NODE, read},
};
use tokio_rustls::rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tracing::info;

use crate::{auth::certificate_identity, transport::TransportError};

/// The pair in force, and the files' bytes it came from.
#[derive(Debug)]
pub struct OwnCert {
    dir: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// (node.pem, node.key) as last loaded, and the certificate's serial.
    loaded: Mutex<(Vec<u8>, Vec<u8>, String)>,
}

/// The certified key of `pem` and `key`, with its serial: a controller's only.
fn certified(
    dir: &Path,
    pem: &[u8],
    key: &[u8],
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, String), TransportError> {
    let d = dir.display().to_string();
    let bad = |file: &'static str, message: String| TransportError::Pem {
        dir: d.clone(),
        file,
        message,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(NODE.0, e.to_string()))?;
    let own = chain
        .first()
        .ok_or_else(|| bad(NODE.0, "no certificate in it".into()))?;
    let serial = match certificate_identity(own) {
        Ok((id, serial)) if id.role == Role::Controller => serial,
        Ok((id, _)) => {
            return Err(TransportError::NotAController {
                dir: d,
                found: id.to_string(),
            });
        }
        Err(found) => return Err(TransportError::NotAController { dir: d, found }),
    };
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad(NODE.1, e.to_string()))?;
    let certified = CertifiedKey::from_der(chain, key, provider)
        .map_err(|e| bad(NODE.1, format!("does not go with {}: {e}", NODE.0)))?;
    Ok((certified, serial))
}

impl OwnCert {
    /// Loads the pair in `dir` (`node.pem`, `node.key`).
    pub fn load(dir: &Path, provider: Arc<CryptoProvider>) -> Result<Arc<Self>, TransportError> {
        let (pem, key) = (read(dir, NODE.0)?, read(dir, NODE.1)?);
        let (certified, serial) = certified(dir, &pem, &key, &provider)?;
        Ok(Arc::new(Self {
            dir: dir.to_owned(),
            provider,
            current: RwLock::new(Arc::new(certified)),
            loaded: Mutex::new((pem, key, serial)),
        }))
    }

    /// The serial of the certificate in force.
    pub fn serial(&self) -> String {
        self.loaded.lock().expect("own cert lock").2.clone()
    }

    /// Reads the files again; `Ok(true)` when a new pair is in force.
    pub fn reload(&self) -> Result<bool, TransportError> {
        let (pem, key) = (read(&self.dir, NODE.0)?, read(&self.dir, NODE.1)?);
        let mut loaded = self.loaded.lock().expect("own cert lock");
        if loaded.0 == pem && loaded.1 == key {
            return Ok(false);
        }
        let (certified, serial) = certified(&self.dir, &pem, &key, &self.provider)?;
        *self.current.write().expect("own cert lock") = Arc::new(certified);
        info!(dir = %self.dir.display(), from = %loaded.2, to = %serial, "the controller's certificate renewed: new handshakes present it");
        *loaded = (pem, key, serial);
        Ok(true)
    }

    /// Reloads every `interval` until the returned task is dropped or aborted.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let own = Arc::clone(self);
        crate::auth::reload_every(
            interval,
            "the controller's certificate did not reload; the one in force stays",
            move || own.reload().map(drop).map_err(|e| e.to_string()),
        )
    }
}

impl ResolvesServerCert for OwnCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read().expect("own cert lock")))
    }
}
