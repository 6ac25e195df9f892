//! TLS on a process's HTTP endpoints, for scrapers off the host: the endpoints' certificate and
//! key (`--metrics-tls-cert`, `--metrics-tls-key`) and, as the operator chooses, the CA whose
//! client certificates alone may connect (`--metrics-client-ca`: Prometheus' `tls_config`
//! `cert_file`/`key_file`). With that CA the certificate is the guard, and an address off
//! loopback needs no allow-list; without it TLS keeps the metrics private on the wire, and the
//! allow-list still decides who may connect.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use tokio_rustls::rustls::{
    self, RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    server::WebPkiClientVerifier,
};

/// The TLS flags every role shares.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsFlags {
    /// Serve the metrics and health endpoints over TLS with this certificate chain (PEM);
    /// needs --metrics-tls-key.
    #[arg(long, env = "SOPA_METRICS_TLS_CERT", requires = "metrics_tls_key")]
    pub metrics_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --metrics-tls-cert.
    #[arg(long, env = "SOPA_METRICS_TLS_KEY", requires = "metrics_tls_cert")]
    pub metrics_tls_key: Option<PathBuf>,
    /// Only clients with a certificate of this CA (PEM) may connect (mutual TLS); then an
    /// address off loopback needs no --metrics-allow. Needs --metrics-tls-cert.
    #[arg(long, env = "SOPA_METRICS_CLIENT_CA", requires = "metrics_tls_cert")]
    pub metrics_client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag} {path}: {message}")]
    Pem {
        flag: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{flag} {path} holds no certificate")]
    Empty { flag: &'static str, path: PathBuf },
    #[error("--metrics-tls-cert {cert} with --metrics-tls-key {key}: {message}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
}

/// A process's endpoints' TLS, loaded and checked at start.
#[derive(Clone)]
pub struct MetricsTls {
    pub(crate) config: Arc<ServerConfig>,
    /// Clients must present a certificate of the operator's CA.
    pub verifies_clients: bool,
}

impl std::fmt::Debug for MetricsTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsTls")
            .field("verifies_clients", &self.verifies_clients)
            .finish_non_exhaustive()
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

fn certificates(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(&read(flag, path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            flag,
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            flag,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

impl TlsFlags {
    /// The TLS the flags ask for (none without --metrics-tls-cert), every file read and checked
    /// now: a bad one fails the start, naming its flag.
    pub fn load(&self) -> Result<Option<MetricsTls>, TlsError> {
        let (Some(cert), Some(key)) = (&self.metrics_tls_cert, &self.metrics_tls_key) else {
            return Ok(None);
        };
        MetricsTls::load(cert, key, self.metrics_client_ca.as_deref()).map(Some)
    }
}

impl MetricsTls {
    /// From PEM files: the certificate chain, its key, and optionally the clients' CA.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsError> {
        let chain = certificates("--metrics-tls-cert", cert)?;
        let key_der =
            PrivateKeyDer::from_pem_slice(&read("--metrics-tls-key", key)?).map_err(|e| {
                TlsError::Pem {
                    flag: "--metrics-tls-key",
                    path: key.to_owned(),
                    message: e.to_string(),
                }
            })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions");
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certificates("--metrics-client-ca", ca)? {
                    roots.add(c).map_err(|e| TlsError::Pem {
                        flag: "--metrics-client-ca",
                        path: ca.to_owned(),
                        message: e.to_string(),
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| TlsError::Pem {
                            flag: "--metrics-client-ca",
                            path: ca.to_owned(),
                            message: e.to_string(),
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key_der)
            .map_err(|e| TlsError::Pair {
                cert: cert.to_owned(),
                key: key.to_owned(),
                message: e.to_string(),
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            verifies_clients: client_ca.is_some(),
        })
    }

    /// The acceptor of this configuration.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config))
    }
}
