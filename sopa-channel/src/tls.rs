//! The clients' side of the channel's mutual TLS (rustls through tonic): a client accepts only
//! a controller whose certificate chains to the fabric's CA and names the expected controller,
//! and presents its own certificate, which names its node and role (see [`crate::identity`]).
//!
//! A node's certificate folder, as `sopactl certs issue` writes it: `ca.pem` (the fabric's CA
//! certificate, never its key), `node.pem` and `node.key`. Agents, operators and the controller
//! each get one folder of their own.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

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

/// A client's TLS: the CA the controller's certificate must chain to, the client's own
/// certificate, and the name expected in the controller's certificate.
pub fn client_config(dir: &Path, controller_name: &str) -> Result<ClientTlsConfig, TlsError> {
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(dir, CA)?))
        .identity(Identity::from_pem(read(dir, NODE.0)?, read(dir, NODE.1)?))
        .domain_name(controller_name))
}
