//! The clients' side of the channel's mutual TLS (rustls): a client accepts only a controller
//! whose certificate chains to the fabric's CA, names the expected controller (DNS name or
//! address) and carries the identity `sopa://controller/...` (so no other certificate of the
//! fabric's CA that happens to carry that name can pose as the controller), and presents its
//! own certificate, which names its node and role (see [`crate::identity`]).
//!
//! A node's certificate folder, as `sopactl certs issue` writes it: `ca.pem` (the fabric's CA
//! certificate, never its key), `node.pem` and `node.key`. Agents, operators and the controller
//! each get one folder of their own.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use tokio_rustls::rustls::{
    self, CertificateError, DigitallySignedStruct, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject as _},
};

use crate::identity::{Role, certificate_identity};

/// The fabric's CA certificate.
pub const CA: &str = "ca.pem";
/// A node's certificate and key.
pub const NODE: (&str, &str) = ("node.pem", "node.key");
/// The name clients expect in the controller's certificate by default.
pub const CONTROLLER_NAME: &str = "sopa-controller";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{dir} holds the shared agent.pem of an older `sopactl certs init`, which no longer names a node; issue this node its own certificate: sopactl certs issue --ca CA_DIR --role ROLE --node NAME --out {dir}"
    )]
    Shared { dir: PathBuf },
    #[error("{what}: {message}")]
    Pem { what: String, message: String },
    #[error("--controller-name {0:?} is neither a DNS name nor an address")]
    Name(String),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Reads `name` from a certificate folder.
pub fn read(dir: &Path, name: &str) -> Result<Vec<u8>, TlsError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound
            && name == NODE.0
            && dir.join("agent.pem").exists()
        {
            TlsError::Shared {
                dir: dir.to_owned(),
            }
        } else {
            TlsError::Io { path, source }
        }
    })
}

/// A client's TLS: what the controller's certificate must be, and the client's own.
#[derive(Clone, Debug)]
pub struct ClientTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) name: ServerName<'static>,
}

/// A client's TLS from its certificate folder, expecting the controller under
/// `controller_name`.
pub fn client_config(dir: &Path, controller_name: &str) -> Result<ClientTls, TlsError> {
    ClientTls::from_pem(
        &read(dir, CA)?,
        Some((&read(dir, NODE.0)?, &read(dir, NODE.1)?)),
        controller_name,
    )
}

impl ClientTls {
    /// From PEM: the CA's certificate(s), the client's certificate chain and key (none: a
    /// client that presents nothing, which the controller refuses), and the controller's name.
    pub fn from_pem(
        ca: &[u8],
        identity: Option<(&[u8], &[u8])>,
        controller_name: &str,
    ) -> Result<Self, TlsError> {
        let pem = |what: &str, e: rustls::pki_types::pem::Error| TlsError::Pem {
            what: what.to_owned(),
            message: e.to_string(),
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            roots.add(cert.map_err(|e| pem(CA, e))?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| TlsError::Pem {
                what: CA.to_owned(),
                message: e.to_string(),
            })?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ControllerVerifier { webpki }));
        let mut config = match identity {
            Some((cert, key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<_, _>>()
                    .map_err(|e| pem(NODE.0, e))?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| pem(NODE.1, e))?;
                builder.with_client_auth_cert(chain, key)?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = ServerName::try_from(controller_name.to_owned())
            .map_err(|_| TlsError::Name(controller_name.to_owned()))?;
        Ok(Self {
            config: Arc::new(config),
            name,
        })
    }
}

/// The fabric CA's verification of the controller's certificate (chain, expiry, the expected
/// name), then its SOPA identity: a controller's.
#[derive(Debug)]
struct ControllerVerifier {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ControllerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        match certificate_identity(end_entity) {
            Ok((id, _)) if id.role == Role::Controller => Ok(verified),
            // Another node's certificate of the fabric's CA that carries the controller's
            // name: not the controller.
            _ => Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
