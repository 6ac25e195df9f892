//! The controller's connections: TCP or a Unix socket, with TLS terminated here rather than by
//! tonic, so the controller decides who finishes a handshake. A client's certificate must
//! chain to the fabric's CA, name one SOPA node (`sopa://ROLE/NODE`), not be on the deny list,
//! and the handshake must finish within its timeout; at most `max_connections` connections
//! are open at once, and one source address has at most `handshakes_per_source` handshakes
//! in progress. Each connection hands the services what its client proved ([`Peer`]),
//! as a request extension.

use std::{
    collections::HashMap,
    net::IpAddr,
    path::Path,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use sopa_channel::{
    identity::Role,
    tls::{CA, read},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
};
use tokio_rustls::rustls::{
    self, CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    pki_types::{CertificateDer, UnixTime, pem::PemObject as _},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};
use tokio_stream::wrappers::ReceiverStream;
use tracing::debug;

use crate::{
    auth::{DenyList, Peer, Refusal, Refusals, certificate_identity},
    own_cert::OwnCert,
};

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Files(#[from] sopa_channel::tls::TlsError),
    #[error("{file} in {dir}: {message}")]
    Pem {
        dir: String,
        file: &'static str,
        message: String,
    },
    #[error(
        "{dir}/node.pem names {found}, not a controller; issue the controller its own: sopactl certs issue --role controller --node NAME ..."
    )]
    NotAController { dir: String, found: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client verification: {0}")]
    Verifier(String),
}

/// The controller's TLS: its certificate (of role `controller`), the CA every client's must
/// chain to, and the deny list.
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    /// Serials refused at the handshake, and whose open streams are closed.
    pub deny: DenyList,
    /// The controller's own certificate, reloaded when its files change.
    pub own: Arc<OwnCert>,
}

impl ServerTls {
    /// Loads the controller's certificate folder (`ca.pem`, `node.pem`, `node.key`, from
    /// `sopactl certs issue --role controller`).
    pub fn load(dir: &Path, deny: DenyList) -> Result<Self, TransportError> {
        let d = dir.display().to_string();
        let pem = |file: &'static str, e: rustls::pki_types::pem::Error| TransportError::Pem {
            dir: d.clone(),
            file,
            message: e.to_string(),
        };
        let ca = read(dir, CA)?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca) {
            roots
                .add(cert.map_err(|e| pem(CA, e))?)
                .map_err(TransportError::Rustls)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let own = OwnCert::load(dir, provider.clone())?;
        let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| TransportError::Verifier(e.to_string()))?;
        let verifier = Arc::new(Verifier {
            webpki,
            deny: deny.clone(),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(own.clone());
        config.alpn_protocols = vec![b"h2".to_vec()];
        // No resumption: every connection presents its certificate and has it checked now
        // (expiry, the deny list), not once for a chain of resumed sessions.
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Self {
            config: Arc::new(config),
            deny,
            own,
        })
    }
}

/// The fabric CA's verification, then the SOPA identity and the deny list.
#[derive(Debug)]
struct Verifier {
    webpki: Arc<dyn ClientCertVerifier>,
    deny: DenyList,
}

impl ClientCertVerifier for Verifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)?;
        let (id, serial) = certificate_identity(end_entity).map_err(|e| {
            debug!(error = %e, "a client certificate names no SOPA node");
            rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
        })?;
        if id.role == Role::Controller {
            // A controller's certificate is a server certificate: its EKU already fails
            // webpki's client check; this keeps it so if a CA ever issued one with both.
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ));
        }
        if self.deny.contains(&serial) {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Revoked));
        }
        Ok(verified)
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

/// Bounds on connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once, handshakes included.
    pub max_connections: usize,
    /// How long a client has to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// TLS handshakes one source address may have in progress at once (the rest of its
    /// connections are closed at once): unauthenticated, one address cannot hold every slot.
    pub handshakes_per_source: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 16_384,
            handshake_timeout: Duration::from_secs(10),
            handshakes_per_source: 64,
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One accepted connection, with what its client proved; holds its slot of the limit.
pub struct Conn {
    io: Box<dyn Io>,
    peer: Peer,
    _slot: OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Where the controller listens: TCP, or a Unix socket (reachable from every network
/// namespace of a host, as a testbed's management path).
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl From<tokio::net::TcpListener> for Listener {
    fn from(l: tokio::net::TcpListener) -> Self {
        Self::Tcp(l)
    }
}

impl From<tokio::net::UnixListener> for Listener {
    fn from(l: tokio::net::UnixListener) -> Self {
        Self::Unix(l)
    }
}

impl Listener {
    async fn accept(&self) -> std::io::Result<(Box<dyn Io>, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok((Box::new(s), addr.to_string()))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept().await?;
                Ok((Box::new(s), "unix".to_owned()))
            }
        }
    }
}

/// A TLS handshake in progress, counted against its source address's
/// [`Limits::handshakes_per_source`].
struct Handshake {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    source: Option<IpAddr>,
}

impl Handshake {
    fn take(
        counts: &Arc<Mutex<HashMap<IpAddr, usize>>>,
        source: Option<IpAddr>,
        limits: Limits,
    ) -> Option<Self> {
        if let Some(ip) = source {
            let mut c = counts.lock().expect("handshakes lock");
            let n = c.entry(ip).or_default();
            if *n >= limits.handshakes_per_source {
                return None;
            }
            *n += 1;
        }
        Some(Self {
            counts: Arc::clone(counts),
            source,
        })
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        if let Some(ip) = self.source {
            let mut c = self.counts.lock().expect("handshakes lock");
            if let Some(n) = c.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    c.remove(&ip);
                }
            }
        }
    }
}

/// Accepts connections on `listener` until the returned stream is dropped: each one takes a
/// slot of the limit (or is closed at once when none is free), and with `tls` finishes its
/// handshake (concurrently with others, within the timeout) before it is handed on.
pub fn incoming(
    listener: Listener,
    tls: Option<&ServerTls>,
    limits: Limits,
    refusals: Arc<Refusals>,
) -> ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = mpsc::channel::<std::io::Result<Conn>>(64);
    let acceptor = tls.map(|t| tokio_rustls::TlsAcceptor::from(Arc::clone(&t.config)));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let handshaking: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = tx.closed() => return,
            };
            let (io, addr) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: tell the log, keep serving.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                refusals.refuse(
                    Refusal::ConnectionLimit,
                    &addr,
                    &format!("{} connections are open", limits.max_connections),
                );
                continue;
            };
            let Some(acceptor) = acceptor.clone() else {
                let peer = Peer {
                    addr,
                    identity: None,
                    serial: None,
                };
                if tx
                    .send(Ok(Conn {
                        io,
                        peer,
                        _slot: slot,
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            };
            // Handshakes in progress from its address (a Unix socket's peers have none).
            let source = addr.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
            let Some(_handshake) = Handshake::take(&handshaking, source, limits) else {
                refusals.refuse(
                    Refusal::ConnectionLimit,
                    &addr,
                    &format!(
                        "{} handshakes from this address are in progress",
                        limits.handshakes_per_source
                    ),
                );
                continue;
            };
            let tx = tx.clone();
            let refusals = Arc::clone(&refusals);
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io))
                    .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let revoked = matches!(
                            e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
                            Some(rustls::Error::InvalidCertificate(CertificateError::Revoked))
                        );
                        let reason = if revoked {
                            Refusal::Revoked
                        } else {
                            Refusal::Handshake
                        };
                        refusals.refuse(reason, &addr, &e.to_string());
                        return;
                    }
                    Err(_) => {
                        refusals.refuse(
                            Refusal::Handshake,
                            &addr,
                            &format!(
                                "no handshake within {} ms",
                                limits.handshake_timeout.as_millis()
                            ),
                        );
                        return;
                    }
                };
                drop(_handshake);
                let leaf = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| certificate_identity(c));
                let Some(Ok((identity, serial))) = leaf else {
                    // The verifier requires both; a handshake without them is a bug.
                    refusals.refuse(Refusal::NoIdentity, &addr, "no verified certificate");
                    return;
                };
                let peer = Peer {
                    addr,
                    identity: Some(identity),
                    serial: Some(serial),
                };
                let _ = tx
                    .send(Ok(Conn {
                        io: Box::new(tls),
                        peer,
                        _slot: slot,
                    }))
                    .await;
            });
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_holds_at_most_its_handshakes_and_others_are_not_held_to_its_count() {
        let counts = Arc::default();
        let limits = Limits {
            handshakes_per_source: 2,
            ..Limits::default()
        };
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = Handshake::take(&counts, Some(a), limits).expect("a's first");
        let _second = Handshake::take(&counts, Some(a), limits).expect("a's second");
        assert!(
            Handshake::take(&counts, Some(a), limits).is_none(),
            "a's third"
        );
        let _b = Handshake::take(&counts, Some(b), limits).expect("b is not held to a's count");
        // A Unix socket's peer has no address: only the listener's limit holds it.
        assert!(Handshake::take(&counts, None, limits).is_some());
        drop(first);
        assert!(
            Handshake::take(&counts, Some(a), limits).is_some(),
            "a's slot back"
        );
    }
}
