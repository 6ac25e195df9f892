//! The controller binary's endpoints over mutual TLS, as an operator sets them up: the
//! controller's own certificate (the fabric's CA, `sopactl certs`) as the endpoints', a CA of
//! the scrapers' own (`--metrics-client-ca`) and Prometheus's certificate of it, the endpoints
//! bound off loopback with no allow-list, and curl as the scraper. A scraper without a
//! certificate, or with one of the fabric's CA (a host's), is not served; a bad TLS file stops
//! the start with the configuration's code, naming its flag.

mod binaries;

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use binaries::{Running, Scratch, free_port};

/// The controller on a Unix socket in `dir` (plaintext: the endpoints are what is tested),
/// with `extra` flags.
fn controller(dir: &Path, extra: &[&str]) -> Command {
    let mut c = binaries::controller(&["--insecure", "--listen"]);
    c.arg(format!("unix:{}", dir.join("c.sock").display()))
        .args(extra)
        .stderr(Stdio::piped());
    c
}

fn curl(port: u16, dir: &Path, client: Option<&str>, path: &str) -> Output {
    let mut c = Command::new("curl");
    c.args(["--silent", "--show-error", "--max-time", "5"])
        .args(["--write-out", "%{http_code}", "--output", "/dev/null"])
        .arg("--cacert")
        .arg(dir.join("ca/ca.pem"))
        // The controller's certificate names 127.0.0.1 and localhost.
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")]);
    if let Some(name) = client {
        c.arg("--cert")
            .arg(dir.join(name).join("node.pem"))
            .arg("--key")
            .arg(dir.join(name).join("node.key"));
    }
    c.arg(format!("https://localhost:{port}{path}"))
        .output()
        .expect("curl")
}

#[test]
fn the_controllers_endpoints_serve_scrapers_with_a_certificate_of_the_operators_ca() {
    let scratch = Scratch::new("ctl-metrics-tls");
    let dir = scratch.0.clone();
    let d = |p: &str| scratch.path(p);
    scratch.issue(
        &["ca", "scrapers"],
        &[
            ("ca", "controller", "ctl", "srv"),
            ("ca", "host", "h0", "h0"),
            ("scrapers", "viewer", "prometheus", "prom"),
        ],
    );
    let port = free_port();
    let tls = [
        "--metrics-tls-cert".to_owned(),
        d("srv/node.pem"),
        "--metrics-tls-key".to_owned(),
        d("srv/node.key"),
        "--metrics-client-ca".to_owned(),
        d("scrapers/ca.pem"),
    ];
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    // Off loopback with neither an allow-list nor client certificates: refused at start, 78.
    let out = controller(&dir, &["--metrics-addr", &format!("0.0.0.0:{port}")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("--metrics-client-ca"), "{err}");
    // A key that is not the certificate's: refused at start, named, 78.
    let bad_key = d("ca/ca.key");
    let mut bad = tls.clone();
    bad[3] = &bad_key;
    let out = controller(
        &dir,
        &[&["--metrics-addr", &format!("0.0.0.0:{port}")], &bad[..]].concat(),
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("--metrics-tls-key"), "{err}");
    // Off loopback, guarded by the client certificates alone.
    let addr = format!("0.0.0.0:{port}");
    let running = Running(
        controller(
            &dir,
            &[&["--metrics-addr", addr.as_str()], &tls[..]].concat(),
        )
        .spawn()
        .unwrap(),
    );
    // Served once it listens (the controller binds its endpoints first thing).
    let start = Instant::now();
    let code = loop {
        let out = curl(port, &dir, Some("prom"), "/readyz");
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        if code == "200" || start.elapsed() > Duration::from_secs(20) {
            break code;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code, "200", "a scraper with the CA's certificate, /readyz");
    let out = curl(port, &dir, Some("prom"), "/metrics");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    // Without a certificate, or with a host's of the fabric's CA: the handshake refuses it,
    // nothing is served.
    for client in [None, Some("h0")] {
        let out = curl(port, &dir, client, "/metrics");
        assert_ne!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "{client:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{client:?}");
    }
    drop(running);
}
