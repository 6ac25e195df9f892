//! The endpoints over TLS: a scraper that trusts the endpoints' CA is served; with the
//! operator's client CA only a scraper presenting one of its certificates is, and then an
//! address off loopback binds without an allow-list. Certificates made here with rcgen.

use std::{net::SocketAddr, path::Path, sync::Arc};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use sopa_ops::{
    allow::AllowList,
    http::{Access, BindError, Endpoints, bind, serve},
    tls::{MetricsTls, TlsError, TlsFlags},
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::{
    TlsConnector,
    rustls::{
        ClientConfig, RootCertStore,
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _},
    },
};

struct Pki {
    dir: std::path::PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// `name.pem` and `name.key` in `dir`, for `names`, signed by `issuer`.
fn leaf(dir: &Path, name: &str, names: &[&str], issuer: &CertifiedIssuer<'static, KeyPair>) {
    let params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
}

/// The endpoints' CA and certificate, the scrapers' CA and one scraper's certificate, and a
/// stranger's certificate of another CA.
fn pki(tag: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("sopa-metrics-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server_ca = ca("endpoints CA");
    std::fs::write(dir.join("server-ca.pem"), server_ca.pem()).unwrap();
    leaf(&dir, "server", &["localhost", "127.0.0.1"], &server_ca);
    let scrapers = ca("scrapers CA");
    std::fs::write(dir.join("scrapers-ca.pem"), scrapers.pem()).unwrap();
    leaf(&dir, "prometheus", &["prometheus"], &scrapers);
    leaf(&dir, "stranger", &["stranger"], &ca("another CA"));
    Pki { dir }
}

fn with(tls: &MetricsTls) -> Access {
    Access {
        allow: AllowList::default(),
        tls: Some(tls.clone()),
    }
}

fn endpoints(tls: Option<MetricsTls>) -> Endpoints {
    Endpoints {
        render: Arc::new(|| "sopa_test 1\n".to_owned()),
        ready: Arc::new(|| Ok(())),
        access: Access {
            allow: AllowList::default(),
            tls,
        },
    }
}

/// A GET over TLS trusting `pki`'s endpoints CA, as `client` (none: no certificate): the
/// status code, or the error that ended it.
async fn get_tls(
    addr: SocketAddr,
    pki: &Pki,
    client: Option<&str>,
    path: &str,
) -> std::io::Result<u16> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(pki.dir.join("server-ca.pem")).unwrap())
        .unwrap();
    let builder = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        Some(name) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(pki.dir.join(format!("{name}.pem"))).unwrap()],
                PrivateKeyDer::from_pem_file(pki.dir.join(format!("{name}.key"))).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out);
    Ok(text
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

#[tokio::test]
async fn a_scraper_that_trusts_the_endpoints_ca_is_served_over_tls() {
    let pki = pki("plain");
    let flags = TlsFlags {
        metrics_tls_cert: Some(pki.dir.join("server.pem")),
        metrics_tls_key: Some(pki.dir.join("server.key")),
        metrics_client_ca: None,
    };
    let tls = flags.load().unwrap().expect("TLS asked for");
    assert!(!tls.verifies_clients);
    // TLS without client certificates guards nothing off loopback: the allow-list still must.
    let err = bind("0.0.0.0:0".parse().unwrap(), &with(&tls))
        .await
        .unwrap_err();
    assert!(matches!(err, BindError::NoAllowList { .. }), "{err}");
    let listener = bind("127.0.0.1:0".parse().unwrap(), &with(&tls))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve(listener, endpoints(Some(tls)));
    for (path, code) in [
        ("/metrics", 200),
        ("/healthz", 200),
        ("/readyz", 200),
        ("/", 404),
    ] {
        assert_eq!(
            get_tls(addr, &pki, None, path).await.unwrap(),
            code,
            "{path}"
        );
    }
    // Plain HTTP to the TLS port gets no answer.
    let (code, _) = sopa_ops::http::get(addr, "/metrics")
        .await
        .unwrap_or((0, String::new()));
    assert_eq!(code, 0, "plain HTTP is not answered on a TLS port");
    server.abort();
}

#[tokio::test]
async fn with_the_scrapers_ca_only_its_certificates_connect_and_no_allow_list_is_needed() {
    let pki = pki("mutual");
    let tls = MetricsTls::load(
        &pki.dir.join("server.pem"),
        &pki.dir.join("server.key"),
        Some(&pki.dir.join("scrapers-ca.pem")),
    )
    .unwrap();
    assert!(tls.verifies_clients);
    // Off loopback, the client certificates are the guard.
    drop(
        bind("0.0.0.0:0".parse().unwrap(), &with(&tls))
            .await
            .expect("an address off loopback binds with client certificates"),
    );
    let listener = bind("127.0.0.1:0".parse().unwrap(), &with(&tls))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve(listener, endpoints(Some(tls)));
    assert_eq!(
        get_tls(addr, &pki, Some("prometheus"), "/metrics")
            .await
            .unwrap(),
        200
    );
    // No certificate, or one of another CA: no answer (the handshake ends it; with TLS 1.3
    // the client may learn it only when it reads).
    for client in [None, Some("stranger")] {
        let got = get_tls(addr, &pki, client, "/metrics").await;
        assert!(!matches!(got, Ok(200)), "{client:?} was served: {got:?}");
    }
    // Served still, after the refusals.
    assert_eq!(
        get_tls(addr, &pki, Some("prometheus"), "/healthz")
            .await
            .unwrap(),
        200
    );
    server.abort();
}

#[test]
fn bad_files_are_named_with_their_flag() {
    let pki = pki("bad");
    let d = &pki.dir;
    let err = MetricsTls::load(&d.join("missing.pem"), &d.join("server.key"), None).unwrap_err();
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
    assert!(err.to_string().starts_with("--metrics-tls-cert "), "{err}");
    assert!(err.to_string().contains("missing.pem"), "{err}");
    // A key file where the certificate goes: no certificate in it.
    let err = MetricsTls::load(&d.join("server.key"), &d.join("server.key"), None).unwrap_err();
    assert!(matches!(err, TlsError::Empty { .. }), "{err}");
    // Another certificate's key.
    let err = MetricsTls::load(&d.join("server.pem"), &d.join("stranger.key"), None).unwrap_err();
    assert!(matches!(err, TlsError::Pair { .. }), "{err}");
    assert!(err.to_string().contains("--metrics-tls-key"), "{err}");
    let err = MetricsTls::load(
        &d.join("server.pem"),
        &d.join("server.key"),
        Some(&d.join("nowhere.pem")),
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("--metrics-client-ca "), "{err}");
    // Without --metrics-tls-cert: plain HTTP.
    assert!(TlsFlags::default().load().unwrap().is_none());
}
