//! Mutual TLS on the channel: an agent with a certificate of the fabric's CA is served; a
//! plaintext client, a client without a certificate, one from another CA and one with an
//! expired certificate are refused, and the controller's state is untouched; an agent refuses a
//! controller whose certificate does not verify.

mod common;

use std::path::PathBuf;

use common::{Log, Lost, last_version, spawn_agent_watched, start_controller_tls, until};
use sopa_controller::tls::{self, InitOptions};
use tonic::transport::{Certificate, ClientTlsConfig};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("sopa-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn certs(tag: &str, expired: bool) -> TempDir {
    let dir = TempDir::new(tag);
    tls::init(
        &dir.0,
        &InitOptions {
            expired,
            ..InitOptions::default()
        },
    )
    .unwrap();
    dir
}

#[tokio::test]
async fn only_agents_of_the_fabric_ca_get_through() {
    let good = certs("good", false);
    let other = certs("other", false);
    let expired = certs("expired", true);
    let c = start_controller_tls(
        21,
        "127.0.0.1:0",
        Some(tls::server_config(&good.0).unwrap()),
    )
    .await;
    let endpoint = format!("https://{}", c.addr);

    let client = |dir: &PathBuf| tls::client_config(dir, "localhost").unwrap();
    let (ok, _, _a) = spawn_agent_watched(&endpoint, "h0", Some(client(&good.0)), vec![], vec![]);
    until("the authenticated agent's snapshot", || {
        last_version(&ok) == 1
    })
    .await;

    // Another CA's agent certificate (trusting our CA for the controller), an expired agent
    // certificate, no client certificate at all, and plaintext.
    let mut other_ca_agent = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(good.0.join(tls::CA)).unwrap(),
        ))
        .domain_name("localhost");
    let no_cert = other_ca_agent.clone();
    other_ca_agent = other_ca_agent.identity(tonic::transport::Identity::from_pem(
        std::fs::read(other.0.join(tls::AGENT.0)).unwrap(),
        std::fs::read(other.0.join(tls::AGENT.1)).unwrap(),
    ));
    let expired_agent = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(good.0.join(tls::CA)).unwrap(),
        ))
        .identity(tonic::transport::Identity::from_pem(
            std::fs::read(expired.0.join(tls::AGENT.0)).unwrap(),
            std::fs::read(expired.0.join(tls::AGENT.1)).unwrap(),
        ))
        .domain_name("localhost");
    let refused = [
        spawn_agent_watched(&endpoint, "other-ca", Some(other_ca_agent), vec![], vec![]),
        spawn_agent_watched(&endpoint, "expired", Some(expired_agent), vec![], vec![]),
        spawn_agent_watched(&endpoint, "no-cert", Some(no_cert), vec![], vec![]),
        spawn_agent_watched(
            &format!("http://{}", c.addr),
            "plaintext",
            None,
            vec![],
            vec![],
        ),
    ];
    // Each client tried and was turned away twice (the second attempt after its backoff):
    // only then does "nothing received" say something.
    for (name, (log, lost, _)) in ["other-ca", "expired", "no-cert", "plaintext"]
        .iter()
        .zip(&refused)
    {
        refused_twice(name, log, lost).await;
    }
    let agents = c.controller.agents();
    assert_eq!(
        agents.keys().collect::<Vec<_>>(),
        ["h0"],
        "refused clients leave no record"
    );
    assert_eq!(c.controller.version(), 1);
    c.stop().await;
}

#[tokio::test]
async fn agents_refuse_a_controller_they_cannot_verify() {
    let good = certs("agent-side", false);
    let impostor = certs("impostor", false);
    // The controller presents a certificate of another CA.
    let c = start_controller_tls(
        22,
        "127.0.0.1:0",
        Some(tls::server_config(&impostor.0).unwrap()),
    )
    .await;
    let (log, lost, _a) = spawn_agent_watched(
        &format!("https://{}", c.addr),
        "h1",
        Some(tls::client_config(&good.0, "localhost").unwrap()),
        vec![],
        vec![],
    );
    refused_twice("the agent of an impostor controller", &log, &lost).await;
    assert!(
        lost.lock().unwrap()[0].contains("certificate"),
        "the agent names the certificate it could not verify: {:?}",
        lost.lock().unwrap()
    );
    assert!(c.controller.agents().is_empty());
    c.stop().await;
}

/// Waits until `name`'s client has had two sessions end without a single message applied.
async fn refused_twice(name: &str, log: &Log, lost: &Lost) {
    until(&format!("{name}: two refused attempts"), || {
        lost.lock().unwrap().len() >= 2 || !log.lock().unwrap().is_empty()
    })
    .await;
    assert!(
        log.lock().unwrap().is_empty(),
        "{name} got through: {:?}",
        log.lock().unwrap()
    );
}

#[test]
fn init_refuses_to_overwrite_and_keeps_keys_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = certs("init", false);
    let err = tls::init(&dir.0, &InitOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("already exists"), "{err}");
    for key in [tls::CA_KEY, tls::CONTROLLER.1, tls::AGENT.1] {
        let mode = std::fs::metadata(dir.0.join(key))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }
}
