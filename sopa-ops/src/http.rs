//! The HTTP endpoints every SOPA process serves on its metrics address: `GET /metrics`
//! (Prometheus), `GET /healthz` (the process runs its loop: 200) and `GET /readyz` (200 when it
//! does its job, 503 with the reason while it does not). Clients outside the allow-list are
//! refused (403; over TLS closed unanswered), and with a client CA only those presenting one of
//! its certificates are served. Each scrape is rendered on a blocking thread, one at a time (a scrape that
//! waits past a scraper's usual time-out is answered busy instead of piling up).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::TcpListener,
};
use tracing::debug;

use crate::{allow::AllowList, tls::MetricsTls};

/// How long a scrape waits for the ones before it (then: 503).
pub const SCRAPE_WAIT: Duration = Duration::from_secs(5);

/// The content type of an OpenMetrics text exposition.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders the metrics.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;
/// Whether the process does its job now, or why not.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What a process serves.
#[derive(Clone)]
pub struct Endpoints {
    pub render: Render,
    pub ready: Readiness,
    pub access: Access,
}

/// Who may reach the endpoints: the allow-list's networks (loopback always), over TLS when
/// the operator gives a certificate, and with the operator's client CA only scrapers holding
/// one of its certificates ([`crate::tls`]).
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub allow: AllowList,
    /// Served over TLS; none: plain HTTP.
    pub tls: Option<MetricsTls>,
}

impl Access {
    fn verifies_clients(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.verifies_clients)
    }

    /// Something besides the address guards the endpoints: an allow-list, or client
    /// certificates.
    pub fn guarded(&self) -> bool {
        !self.allow.is_empty() || self.verifies_clients()
    }

    /// Whether a client at `ip` may go on to its request (or its handshake): one the list
    /// allows, or, with client certificates and no list, any (its certificate is checked in
    /// the handshake). A list beside client certificates applies too.
    pub fn admits(&self, ip: std::net::IpAddr) -> bool {
        (self.allow.is_empty() && self.verifies_clients()) || self.allow.allows(ip)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "--metrics-addr {addr} is not a loopback address: list who may reach it with \
         --metrics-allow CIDR[,CIDR…] (SOPA_METRICS_ALLOW; e.g. the scrapers' 10.0.0.0/8), or \
         admit only scrapers with a certificate of your CA (--metrics-tls-cert, \
         --metrics-tls-key, --metrics-client-ca), or bind a loopback address"
    )]
    NoAllowList { addr: SocketAddr },
    #[error(
        "--metrics-addr {addr} is in use by another process; choose another address or turn \
         the metrics off"
    )]
    InUse { addr: SocketAddr },
    #[error("binding --metrics-addr {addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Binds `addr`, refusing a non-loopback address that neither an allow-list nor client
/// certificates guard: done before a process changes anything, so a bad address fails a start
/// with nothing to undo.
pub async fn bind(addr: SocketAddr, access: &Access) -> Result<TcpListener, BindError> {
    if !addr.ip().is_loopback() && !access.guarded() {
        return Err(BindError::NoAllowList { addr });
    }
    TcpListener::bind(addr).await.map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            BindError::InUse { addr }
        } else {
            BindError::Io { addr, source }
        }
    })
}

fn response(status: &str, kind: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Connections served at once; more wait in the listen queue (descriptors are the agent's
/// to spend on netlink and maps, not a scraper's).
pub const MAX_CONNECTIONS: usize = 32;

/// How long a client may take to send its request's head, and to take the answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a refused client's 403 and the rest of its request may take.
const REFUSED_DRAIN: Duration = Duration::from_millis(200);

/// Serves the endpoints on `listener` until the task is aborted.
pub fn serve(listener: TcpListener, endpoints: Endpoints) -> tokio::task::JoinHandle<()> {
    let one_at_a_time = Arc::new(tokio::sync::Semaphore::new(1));
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let endpoints = Arc::new(endpoints);
    tokio::spawn(async move {
        loop {
            let Ok(slot) = Arc::clone(&connections).acquire_owned().await else {
                return;
            };
            let (mut stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, most likely: let some close before trying again.
                    debug!(%err, "accepting a metrics client");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Refused before a byte is read: a client outside the list holds nothing. Over TLS
            // it is closed unanswered (a plaintext 403 would reach it as garbage, and a
            // handshake would spend the CPU the list is there to save).
            if !endpoints.access.admits(peer.ip()) {
                debug!(%peer, "refused: not in the allow-list");
                if endpoints.access.tls.is_some() {
                    continue;
                }
                let out = response(
                    "403 Forbidden",
                    "text/plain",
                    "this address is not in --metrics-allow\n",
                );
                // Its slot goes back at once: refused clients never hold up allowed ones.
                drop(slot);
                tokio::spawn(async move {
                    // Answered, then drained briefly: closing on its unread request would reset
                    // the connection before it reads the answer.
                    let _ = tokio::time::timeout(REFUSED_DRAIN, async {
                        stream.write_all(out.as_bytes()).await?;
                        stream.shutdown().await?;
                        let mut sink = [0u8; 512];
                        while stream.read(&mut sink).await? > 0 {}
                        Ok::<_, std::io::Error>(())
                    })
                    .await;
                });
                continue;
            }
            let endpoints = Arc::clone(&endpoints);
            let one_at_a_time = Arc::clone(&one_at_a_time);
            tokio::spawn(async move {
                let _slot = slot;
                match &endpoints.access.tls {
                    None => answer(stream, peer, &endpoints, &one_at_a_time).await,
                    Some(tls) => {
                        // The handshake in the client's time too: one that stalls it holds
                        // a slot no longer than one that stalls its request.
                        let handshake = tls.acceptor().accept(stream);
                        match tokio::time::timeout(CLIENT_TIMEOUT, handshake).await {
                            Ok(Ok(stream)) => {
                                answer(stream, peer, &endpoints, &one_at_a_time).await;
                            }
                            Ok(Err(err)) => {
                                debug!(%peer, %err, "refused: the TLS handshake failed")
                            }
                            Err(_) => debug!(%peer, "refused: no TLS handshake in time"),
                        }
                    }
                }
            });
        }
    })
}

/// Reads one request from `stream` and answers it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    endpoints: &Endpoints,
    one_at_a_time: &tokio::sync::Semaphore,
) {
    // The request's head, however the client split its writes (up to 1 KiB; the
    // rest unread would reset the connection when it closes).
    let mut request = [0u8; 1024];
    let mut n = 0;
    let read_head = async {
        while n < request.len() {
            match stream.read(&mut request[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(got) => n += got,
            }
            if request[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    };
    if tokio::time::timeout(CLIENT_TIMEOUT, read_head)
        .await
        .is_err()
        || n == 0
    {
        return;
    }
    let text = String::from_utf8_lossy(&request[..n]);
    let mut words = text.split_ascii_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let out = if method != "GET" {
        response("405 Method Not Allowed", "text/plain", "GET only\n")
    } else {
        match path {
            "/metrics" => {
                let Ok(Ok(_turn)) =
                    tokio::time::timeout(SCRAPE_WAIT, one_at_a_time.acquire()).await
                else {
                    let busy = response(
                        "503 Service Unavailable",
                        "text/plain",
                        "a scrape before this one is still being rendered\n",
                    );
                    let _ = stream.write_all(busy.as_bytes()).await;
                    let _ = stream.shutdown().await;
                    return;
                };
                let render = Arc::clone(&endpoints.render);
                let Ok(body) = tokio::task::spawn_blocking(move || render()).await else {
                    return;
                };
                response("200 OK", OPENMETRICS, &body)
            }
            "/healthz" => response("200 OK", "text/plain", "ok\n"),
            "/readyz" => match (endpoints.ready)() {
                Ok(()) => response("200 OK", "text/plain", "ready\n"),
                Err(why) => response(
                    "503 Service Unavailable",
                    "text/plain",
                    &format!("not ready: {why}\n"),
                ),
            },
            _ => response(
                "404 Not Found",
                "text/plain",
                "try GET /metrics, /healthz or /readyz\n",
            ),
        }
    };
    // Written, then shut down: over TLS that sends the close_notify a client waits for.
    let send = async {
        stream.write_all(out.as_bytes()).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(CLIENT_TIMEOUT, send).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => debug!(%peer, %err, "metrics client went away"),
        Err(_) => debug!(%peer, "metrics client too slow to take its answer"),
    }
}

/// A GET of `path` on `addr` from this process: the status code and the body (for tests and
/// for `doctor`-style checks).
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    // In two writes, as a client may split its request.
    stream.write_all(b"GET ").await?;
    tokio::task::yield_now().await;
    stream
        .write_all(format!("{path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out);
    let code = text
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((code, body))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn access(allow: &AllowList) -> Access {
        Access {
            allow: allow.clone(),
            tls: None,
        }
    }

    fn endpoints(ready: Arc<AtomicBool>, allow: AllowList) -> Endpoints {
        Endpoints {
            render: Arc::new(|| "sopa_test 1\n".to_owned()),
            ready: Arc::new(move || {
                if ready.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("waiting for the controller's first topology".into())
                }
            }),
            access: Access { allow, tls: None },
        }
    }

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let ready = Arc::new(AtomicBool::new(false));
        let listener = bind("127.0.0.1:0".parse().unwrap(), &Access::default())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let server = serve(
            listener,
            endpoints(Arc::clone(&ready), AllowList::default()),
        );
        assert_eq!(get(addr, "/healthz").await.unwrap(), (200, "ok\n".into()));
        assert_eq!(
            get(addr, "/readyz").await.unwrap(),
            (
                503,
                "not ready: waiting for the controller's first topology\n".into()
            )
        );
        ready.store(true, Ordering::SeqCst);
        assert_eq!(
            get(addr, "/readyz?verbose").await.unwrap(),
            (200, "ready\n".into())
        );
        assert_eq!(
            get(addr, "/metrics").await.unwrap(),
            (200, "sopa_test 1\n".into())
        );
        assert_eq!(get(addr, "/").await.unwrap().0, 404);
        server.abort();
    }

    #[tokio::test]
    async fn clients_outside_the_allow_list_are_refused() {
        // Off loopback without a list: refused before binding.
        let err = bind("0.0.0.0:0".parse().unwrap(), &Access::default())
            .await
            .unwrap_err();
        assert!(matches!(err, BindError::NoAllowList { .. }), "{err}");
        assert!(err.to_string().contains("--metrics-allow"), "{err}");
        // With a list, every address binds; a client outside it is answered 403 on every
        // path, one inside it is served. (This test's clients are loopback, which a real list
        // always allows: the lists here leave it out.)
        let outside: AllowList = "10.0.0.0/8".parse().unwrap();
        let listener = bind("127.0.0.1:0".parse().unwrap(), &access(&outside))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let server = serve(
            listener,
            endpoints(Arc::new(AtomicBool::new(true)), outside.without_loopback()),
        );
        for path in ["/metrics", "/healthz", "/readyz"] {
            assert_eq!(
                get(addr, path).await.unwrap(),
                (403, "this address is not in --metrics-allow\n".into())
            );
        }
        server.abort();
        let inside: AllowList = "127.0.0.0/8".parse().unwrap();
        let listener = bind("127.0.0.1:0".parse().unwrap(), &access(&inside))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let server = serve(
            listener,
            endpoints(Arc::new(AtomicBool::new(true)), inside.without_loopback()),
        );
        assert_eq!(get(addr, "/metrics").await.unwrap().0, 200);
        server.abort();
    }

    /// TLS of a throwaway certificate, with or without a client CA (the same certificate).
    fn tls(client_ca: bool) -> MetricsTls {
        let dir =
            std::env::temp_dir().join(format!("sopa-http-tls-{}-{client_ca}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("c.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("c.key"), key.serialize_pem()).unwrap();
        let ca = dir.join("c.pem");
        let tls = MetricsTls::load(&ca, &dir.join("c.key"), client_ca.then_some(ca.as_path()));
        std::fs::remove_dir_all(&dir).unwrap();
        tls.unwrap()
    }

    #[test]
    fn client_certificates_admit_any_address_unless_a_list_narrows_it() {
        let off_host: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        let elsewhere: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let mtls = |allow: AllowList| Access {
            allow,
            tls: Some(tls(true)),
        };
        // Client certificates and no list: any address goes on to its handshake.
        let a = mtls(AllowList::default().without_loopback());
        assert!(a.guarded() && a.admits(off_host) && a.admits(elsewhere));
        // A list beside them narrows it.
        let a = mtls(
            "10.0.0.0/8"
                .parse::<AllowList>()
                .unwrap()
                .without_loopback(),
        );
        assert!(a.admits(off_host) && !a.admits(elsewhere));
        // TLS without a client CA guards nothing: the list alone decides (loopback here).
        let a = Access {
            allow: AllowList::default(),
            tls: Some(tls(false)),
        };
        assert!(!a.guarded() && !a.admits(off_host));
        assert!(a.admits("127.0.0.1".parse().unwrap()));
        let a = Access::default();
        assert!(!a.guarded() && !a.admits(off_host));
    }

    #[tokio::test]
    async fn an_address_in_use_is_named() {
        let first = bind("127.0.0.1:0".parse().unwrap(), &Access::default())
            .await
            .unwrap();
        let addr = first.local_addr().unwrap();
        let err = bind(addr, &Access::default()).await.unwrap_err();
        assert!(matches!(err, BindError::InUse { .. }), "{err}");
    }
}
