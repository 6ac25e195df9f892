//! Identities and what each may do, over real mutual TLS on loopback. Every certificate names
//! one node and role (`sopa://ROLE/NODE`); the controller takes them from the certificate it
//! verified. Each rule has a test that checks the controller's state before and after: a
//! refusal is counted under its reason and changes nothing.

mod common;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::Arc,
};

use common::{Log, Lost, Running, last_version, spawn_agent_watched, start_controller_tls, until};
use sopa_channel::tls::ClientTls;
use sopa_channel::{
    identity::{Identity, Role},
    proto::{
        AgentMessage, ControllerMessage, FiveTuple, FlowReport, FlowSample, Hello, LinkChange,
        LinkRef, LinkReport, StatusRequest, SwitchChange, agent_message,
        channel::channel_client::ChannelClient, control::control_client::ControlClient,
        controller_message,
    },
    tls,
};
use sopa_controller::{
    auth::{DenyList, Refusal},
    certs::{self, IssueOptions},
    transport::ServerTls,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("sopa-identity-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA and the folders it issued.
struct Ca {
    dir: TempDir,
}

impl Ca {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        certs::init(&dir.0.join("ca"), certs::CA_DAYS).unwrap();
        Self { dir }
    }

    /// `node`'s folder as `role` (issued once, then reused).
    fn issue_with(&self, role: Role, node: &str, opts: &IssueOptions) -> (PathBuf, String) {
        let out = self
            .dir
            .0
            .join(format!("{role}-{node}-{}", opts.expired as u8));
        if out.exists() {
            let (_, serial) = certs::read_identity(&out.join(tls::NODE.0)).unwrap();
            return (out, serial);
        }
        let issued = certs::issue(
            &self.dir.0.join("ca"),
            &Identity::new(role, node).unwrap(),
            &out,
            opts,
        )
        .unwrap();
        (out, issued.serial)
    }

    fn issue(&self, role: Role, node: &str) -> PathBuf {
        self.issue_with(role, node, &IssueOptions::default()).0
    }

    fn client(&self, role: Role, node: &str) -> ClientTls {
        tls::client_config(&self.issue(role, node), "localhost").unwrap()
    }

    fn deny_file(&self) -> PathBuf {
        self.dir.0.join("revoked.txt")
    }

    /// A controller serving with this CA's controller certificate (and a deny list file).
    async fn controller(&self, epoch: u64) -> Running {
        self.controller_and_deny_list(epoch).await.0
    }

    /// The controller, and its deny list (shared: a reload here is the controller's).
    async fn controller_and_deny_list(&self, epoch: u64) -> (Running, DenyList) {
        let deny_file = self.deny_file();
        std::fs::write(&deny_file, "# revoked serials\n").unwrap();
        let deny = DenyList::load(&deny_file).unwrap();
        let server = ServerTls::load(
            &self.issue(Role::Controller, "sopa-controller"),
            deny.clone(),
        )
        .unwrap();
        let c = start_controller_tls(epoch, "127.0.0.1:0", Some(server)).await;
        (c, deny)
    }
}

fn endpoint(c: &Running) -> String {
    format!("https://{}", c.addr)
}

/// What a refusal must leave as it was.
#[derive(Debug, PartialEq)]
struct State {
    version: u64,
    down_links: Vec<(String, String)>,
    down_switches: Vec<String>,
    agents: Vec<(String, bool)>,
    elephants: usize,
}

fn state(c: &Running) -> State {
    let s = c.controller.status();
    State {
        version: s.version,
        down_links: s.down_links.into_iter().map(|l| (l.a, l.b)).collect(),
        down_switches: s.down_switches,
        agents: s
            .agents
            .into_iter()
            .map(|a| (a.node, a.connected))
            .collect(),
        elephants: c.controller.hedera_status().elephants.len(),
    }
}

/// Runs `act`, then checks that it was refused for `reason` once and changed nothing.
async fn refused_once<F: std::future::Future<Output = ()>>(c: &Running, reason: Refusal, act: F) {
    let before = state(c);
    let count = c.controller.refusals.count(reason);
    act.await;
    until(&format!("the {reason:?} refusal counted"), || {
        c.controller.refusals.count(reason) > count
    })
    .await;
    assert_eq!(c.controller.refusals.count(reason), count + 1, "{reason:?}");
    assert_eq!(state(c), before, "a {reason:?} refusal changed the state");
}

/// Opens an agent stream with `tls`, says `hello`, and returns the stream's first message or
/// its error, with a sender for more messages.
async fn open_stream(
    c: &Running,
    tls: &ClientTls,
    hello: Hello,
) -> (
    Result<ControllerMessage, tonic::Status>,
    mpsc::Sender<AgentMessage>,
    Option<tonic::Streaming<ControllerMessage>>,
) {
    let channel = sopa_channel::client::connect(&endpoint(c), Some(tls))
        .await
        .unwrap();
    let mut client = ChannelClient::new(channel);
    let (tx, rx) = mpsc::channel(16);
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Hello(hello)),
    })
    .await
    .unwrap();
    match client.stream(ReceiverStream::new(rx)).await {
        Err(status) => (Err(status), tx, None),
        Ok(r) => {
            let mut inbound = r.into_inner();
            let first = match inbound.message().await {
                Ok(Some(m)) => Ok(m),
                Ok(None) => Err(tonic::Status::unknown("the stream ended")),
                Err(s) => Err(s),
            };
            (first, tx, Some(inbound))
        }
    }
}

/// A hello of a test stream that sends no heartbeats: it asks for the longest interval the
/// controller grants (a minute), so it is not counted gone during the test.
fn hello(node: &str, role: sopa_channel::proto::Role) -> Hello {
    Hello {
        node: node.into(),
        role: role as i32,
        heartbeat_ms: 60_000,
        ..Hello::default()
    }
}

async fn control(c: &Running, tls: &ClientTls) -> ControlClient<tonic::transport::Channel> {
    ControlClient::new(
        sopa_channel::client::connect(&endpoint(c), Some(tls))
            .await
            .unwrap(),
    )
}

fn set_link(a: &str, b: &str) -> LinkChange {
    LinkChange {
        link: Some(LinkRef {
            a: a.into(),
            b: b.into(),
        }),
        down: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn only_certificates_of_the_fabric_ca_that_name_a_node_get_through() {
    let ca = Ca::new("handshake");
    let other = Ca::new("handshake-other");
    let c = ca.controller(21).await;
    let (ok, _, _a) = spawn_agent_watched(
        &endpoint(&c),
        "h0",
        Some(ca.client(Role::Host, "h0")),
        vec![],
        vec![],
    );
    until("the authenticated agent's snapshot", || {
        last_version(&ok) == 1
    })
    .await;

    // Another CA's host certificate (trusting our CA for the controller), an expired one, no
    // client certificate at all, plaintext, and a certificate of our CA without a SOPA
    // identity.
    let our_ca = std::fs::read(ca.dir.0.join("ca").join(tls::CA)).unwrap();
    let trust_ours = ClientTls::from_pem(&our_ca, None, "localhost").unwrap();
    let from = |dir: &Path| {
        ClientTls::from_pem(
            &our_ca,
            Some((
                &std::fs::read(dir.join(tls::NODE.0)).unwrap(),
                &std::fs::read(dir.join(tls::NODE.1)).unwrap(),
            )),
            "localhost",
        )
        .unwrap()
    };
    let other_ca = from(&other.issue(Role::Host, "h1"));
    let (expired_dir, _) = ca.issue_with(
        Role::Host,
        "h2",
        &IssueOptions {
            expired: true,
            ..IssueOptions::default()
        },
    );
    let expired = from(&expired_dir);
    // A controller's certificate is no client's.
    let server_cert = from(&ca.issue(Role::Controller, "impostor"));
    let before = c.controller.refusals.count(Refusal::Handshake);
    let refused = [
        (
            "other-ca",
            spawn_agent_watched(&endpoint(&c), "h1", Some(other_ca), vec![], vec![]),
        ),
        (
            "expired",
            spawn_agent_watched(&endpoint(&c), "h2", Some(expired), vec![], vec![]),
        ),
        (
            "no-cert",
            spawn_agent_watched(
                &endpoint(&c),
                "h3",
                Some(trust_ours.clone()),
                vec![],
                vec![],
            ),
        ),
        (
            "server-cert",
            spawn_agent_watched(&endpoint(&c), "h4", Some(server_cert), vec![], vec![]),
        ),
        (
            "plaintext",
            spawn_agent_watched(&format!("http://{}", c.addr), "h5", None, vec![], vec![]),
        ),
    ];
    for (name, (log, lost, _)) in &refused {
        refused_twice(name, log, lost).await;
    }
    // Each refused its two attempts at the handshake (ten), nothing else.
    until("ten handshakes refused", || {
        c.controller.refusals.count(Refusal::Handshake) >= before + 10
    })
    .await;
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
    let ca = Ca::new("agent-side");
    let impostor = Ca::new("impostor");
    // The controller presents a certificate of another CA.
    let c = impostor.controller(22).await;
    let (log, lost, _a) = spawn_agent_watched(
        &endpoint(&c),
        "h1",
        Some(ca.client(Role::Host, "h1")),
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

/// A server with a certificate of the fabric's CA that carries the controller's name but
/// another node's identity (`sopa://host/h9`, a server certificate, as a CA that is not
/// `sopactl`'s might issue) is not the controller: an agent ends the handshake.
#[tokio::test]
async fn agents_refuse_a_server_of_the_fabric_ca_that_is_not_the_controller() {
    use rcgen::{
        CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair, SanType, string::Ia5String,
    };
    use tokio_rustls::rustls::{
        self,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    };
    let ca = Ca::new("posing");
    let ca_dir = ca.dir.0.join("ca");
    let issuer = Issuer::from_ca_cert_pem(
        &std::fs::read_to_string(ca_dir.join(tls::CA)).unwrap(),
        KeyPair::from_pem(&std::fs::read_to_string(ca_dir.join("ca.key")).unwrap()).unwrap(),
    )
    .unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::URI(Ia5String::try_from("sopa://host/h9").unwrap()));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert.der().to_vec())],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        acceptor
            .accept(tcp)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    });
    let (log, lost, _a) = spawn_agent_watched(
        &format!("https://localhost:{}", addr.port()),
        "h1",
        Some(ca.client(Role::Host, "h1")),
        vec![],
        vec![],
    );
    let handshake = tokio::time::timeout(std::time::Duration::from_secs(5), server)
        .await
        .expect("the agent tried")
        .unwrap();
    assert!(
        handshake.is_err(),
        "the agent finished its handshake with a server that is not the controller"
    );
    until("the agent's attempt ended", || {
        !lost.lock().unwrap().is_empty()
    })
    .await;
    assert!(
        lost.lock().unwrap()[0].contains("certificate"),
        "the agent names the certificate it refused: {:?}",
        lost.lock().unwrap()
    );
    assert!(log.lock().unwrap().is_empty());
}

/// A host certificate cannot speak for another node or role, nor for a node the topology
/// does not have; an operator's cannot open an agent stream at all.
#[tokio::test]
async fn a_hello_is_held_to_the_certificate_and_the_topology() {
    use sopa_channel::proto::Role as Claimed;
    let ca = Ca::new("hello");
    let c = ca.controller(23).await;
    let h0 = ca.client(Role::Host, "h0");
    for (what, hello) in [
        ("another host", hello("h1", Claimed::Host)),
        ("its own name as a switch", hello("h0", Claimed::Switch)),
        (
            "another host as its topology name",
            Hello {
                topology_name: "h1".into(),
                ..hello("h0", Claimed::Host)
            },
        ),
    ] {
        refused_once(&c, Refusal::Impersonation, async {
            let (first, _, _) = open_stream(&c, &h0, hello).await;
            let status = first.expect_err(what);
            assert_eq!(
                status.code(),
                tonic::Code::PermissionDenied,
                "{what}: {status:?}"
            );
            assert!(status.message().contains("host/h0"), "{what}: {status:?}");
        })
        .await;
    }
    // A certificate for a node the topology does not have (h99 of a k=4 Fat-Tree).
    let stranger = ca.client(Role::Host, "h99");
    refused_once(&c, Refusal::UnknownNode, async {
        let (first, _, _) = open_stream(&c, &stranger, hello("h99", Claimed::Host)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::NotFound);
    })
    .await;
    // A switch certificate naming a host of the topology.
    let wrong_kind = ca.client(Role::Switch, "h3");
    refused_once(&c, Refusal::UnknownNode, async {
        let (first, _, _) = open_stream(&c, &wrong_kind, hello("h3", Claimed::Switch)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::NotFound);
    })
    .await;
    let operator = ca.client(Role::Operator, "alice");
    refused_once(&c, Refusal::Role, async {
        let (first, _, _) = open_stream(&c, &operator, hello("h0", Claimed::Host)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::PermissionDenied);
    })
    .await;
    // Text fields over their bounds.
    refused_once(&c, Refusal::FieldTooLong, async {
        let long = Hello {
            agent_version: "v".repeat(4096),
            ..hello("h0", Claimed::Host)
        };
        let (first, _, _) = open_stream(&c, &h0, long).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::InvalidArgument);
    })
    .await;
    // And the honest hello of the same certificate is served.
    let (first, _tx, _in) = open_stream(&c, &h0, hello("h0", Claimed::Host)).await;
    assert!(matches!(
        first.unwrap().kind,
        Some(controller_message::Kind::Peers(_))
    ));
    c.stop().await;
}

#[tokio::test]
async fn one_session_per_identity_and_a_bounded_number_of_sessions() {
    use sopa_channel::proto::Role as Claimed;
    let ca = Ca::new("sessions");
    let c = ca.controller(24).await;
    let h0 = ca.client(Role::Host, "h0");
    let (first, _tx, _in) = open_stream(&c, &h0, hello("h0", Claimed::Host)).await;
    first.unwrap();
    until("h0 connected", || {
        c.controller.agents().get("h0").is_some_and(|r| r.connected)
    })
    .await;
    refused_once(&c, Refusal::SecondSession, async {
        let (first, _, _) = open_stream(&c, &h0, hello("h0", Claimed::Host)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::AlreadyExists);
    })
    .await;
    c.stop().await;

    // A controller that takes two agent streams refuses the third.
    let server = ServerTls::load(&ca.issue(Role::Controller, "small"), DenyList::none()).unwrap();
    let c = common::start_controller_opts(
        25,
        Some(server),
        sopa_controller::server::Options {
            max_sessions: Some(2),
            ..common::test_options()
        },
    )
    .await;
    let mut held = Vec::new();
    for h in ["h1", "h2"] {
        let (first, tx, inbound) =
            open_stream(&c, &ca.client(Role::Host, h), hello(h, Claimed::Host)).await;
        first.unwrap();
        held.push((tx, inbound));
    }
    let h3 = ca.client(Role::Host, "h3");
    refused_once(&c, Refusal::TooManySessions, async {
        let (first, _, _) = open_stream(&c, &h3, hello("h3", Claimed::Host)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::ResourceExhausted);
    })
    .await;
    // One leaves: once the controller has seen it go, its slot serves the next agent.
    held.pop();
    until("h2's session ended", || {
        c.controller
            .agents()
            .get("h2")
            .is_some_and(|r| !r.connected)
    })
    .await;
    let (first, _tx, _in) = open_stream(&c, &h3, hello("h3", Claimed::Host)).await;
    assert!(
        first.is_ok(),
        "a freed slot serves the next agent: {first:?}"
    );
    c.stop().await;
}

/// A stream of `tls`'s client that never says hello: the controller's answer, when it gives
/// one before the hello (a refusal), and the sender keeping the stream open.
async fn silent_stream(
    c: &Running,
    tls: &ClientTls,
) -> (
    tokio::task::JoinHandle<Result<(), tonic::Status>>,
    mpsc::Sender<AgentMessage>,
) {
    let channel = sopa_channel::client::connect(&endpoint(c), Some(tls))
        .await
        .unwrap();
    let mut client = ChannelClient::new(channel);
    let (tx, rx) = mpsc::channel(16);
    let answer =
        tokio::spawn(async move { client.stream(ReceiverStream::new(rx)).await.map(|_| ()) });
    (answer, tx)
}

#[tokio::test]
async fn streams_that_never_say_hello_hold_no_session_and_one_client_holds_few() {
    use sopa_channel::proto::Role as Claimed;
    use sopa_controller::server::MAX_AWAITING_HELLO;
    let ca = Ca::new("hello-less");
    let server = ServerTls::load(&ca.issue(Role::Controller, "small"), DenyList::none()).unwrap();
    let c = common::start_controller_opts(
        27,
        Some(server),
        sopa_controller::server::Options {
            max_sessions: Some(2),
            ..common::test_options()
        },
    )
    .await;
    // h1's certificate opens streams and never says hello: as many as a client may.
    let h1 = ca.client(Role::Host, "h1");
    let mut silent = Vec::new();
    for n in 1..=MAX_AWAITING_HELLO {
        silent.push(silent_stream(&c, &h1).await);
        until("the stream awaits its hello", || {
            c.controller.streams_awaiting_hello() == n
        })
        .await;
    }
    // One more of the same client is refused at once.
    refused_once(&c, Refusal::TooManySessions, async {
        let (answer, _tx) = silent_stream(&c, &h1).await;
        let refused = answer.await.unwrap().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("await their hello"),
            "{refused:?}"
        );
    })
    .await;
    // Two other hosts take both sessions the controller serves.
    let mut held = Vec::new();
    for h in ["h2", "h3"] {
        let (first, tx, inbound) =
            open_stream(&c, &ca.client(Role::Host, h), hello(h, Claimed::Host)).await;
        assert!(
            first.is_ok(),
            "{h} kept out by streams that never said hello: {first:?}"
        );
        held.push((tx, inbound));
    }
    // The sessions are theirs: a third host is refused.
    refused_once(&c, Refusal::TooManySessions, async {
        let (first, _, _) =
            open_stream(&c, &ca.client(Role::Host, "h4"), hello("h4", Claimed::Host)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::ResourceExhausted);
    })
    .await;
    assert_eq!(c.controller.streams_awaiting_hello(), MAX_AWAITING_HELLO);
    drop(silent);
    c.stop().await;
}

/// A switch reports only its own ports; a host only flows from its own address, and no
/// links at all.
#[tokio::test]
async fn agents_report_only_what_is_their_own() {
    use sopa_channel::proto::Role as Claimed;
    let ca = Ca::new("reports");
    let c = ca.controller(26).await;
    let (first, e0, _in) = open_stream(
        &c,
        &ca.client(Role::Switch, "e0"),
        hello("e0", Claimed::Switch),
    )
    .await;
    first.unwrap();
    let report = |a: &str, b: &str| AgentMessage {
        kind: Some(agent_message::Kind::Report(LinkReport {
            a: a.into(),
            b: b.into(),
            down: true,
        })),
    };
    refused_once(&c, Refusal::ForeignPort, async {
        e0.send(report("e1", "a0")).await.unwrap();
    })
    .await;
    // Pins are a host's business: a switch's acknowledgement is refused.
    refused_once(&c, Refusal::Role, async {
        e0.send(AgentMessage {
            kind: Some(agent_message::Kind::PinAck(sopa_channel::proto::PinAck {
                round: 1,
                error: "x".repeat(10_000),
            })),
        })
        .await
        .unwrap();
    })
    .await;
    // Its own port goes through (and shows the rule is not refusing everything).
    e0.send(report("e0", "a0")).await.unwrap();
    until("e0's own port down", || c.controller.version() == 2).await;

    let (first, h0, _in0) =
        open_stream(&c, &ca.client(Role::Host, "h0"), hello("h0", Claimed::Host)).await;
    first.unwrap();
    refused_once(&c, Refusal::Role, async {
        h0.send(report("h0", "e0")).await.unwrap();
    })
    .await;
    let topo =
        sopa_topology::Topology::build(&sopa_topology::topology::TopologySpec::FatTree { k: 4 })
            .unwrap();
    let addr = |name: &str| -> Ipv4Addr {
        let g = topo.graph();
        g.node(g.find(name).unwrap()).addr.unwrap()
    };
    let flows = |src: &str| AgentMessage {
        kind: Some(agent_message::Kind::Flows(FlowReport {
            interval_ms: 1000,
            nic_bps: 1_000_000_000,
            flows: vec![FlowSample {
                flow: Some(FiveTuple {
                    saddr: u32::from(addr(src)),
                    daddr: u32::from(addr("h15")),
                    sport: 5001,
                    dport: 80,
                    proto: 6,
                }),
                rate_bps: 500_000_000,
                bytes: 1 << 20,
            }],
        })),
    };
    refused_once(&c, Refusal::ForeignFlow, async {
        h0.send(flows("h1")).await.unwrap();
    })
    .await;
    // Its own flow is taken.
    h0.send(flows("h0")).await.unwrap();
    until("h0's own elephant", || {
        c.controller.hedera_status().elephants.len() == 1
    })
    .await;
    c.stop().await;
}

/// Only an operator changes link and switch states; a viewer and an operator read status;
/// hosts and switches do neither.
#[tokio::test]
async fn only_operators_change_state_and_viewers_only_read() {
    let ca = Ca::new("control");
    let c = ca.controller(27).await;
    for (role, node) in [
        (Role::Host, "h0"),
        (Role::Switch, "c0"),
        (Role::Viewer, "grafana"),
    ] {
        let mut client = control(&c, &ca.client(role, node)).await;
        refused_once(&c, Refusal::Role, async {
            let e = client.set_link(set_link("e0", "a0")).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{role}");
        })
        .await;
        refused_once(&c, Refusal::Role, async {
            let e = client
                .set_switch(SwitchChange {
                    name: "c0".into(),
                    down: true,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{role}");
        })
        .await;
    }
    for (role, node) in [(Role::Host, "h0"), (Role::Switch, "c0")] {
        let mut client = control(&c, &ca.client(role, node)).await;
        refused_once(&c, Refusal::Role, async {
            let e = client.status(StatusRequest {}).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{role}");
        })
        .await;
    }
    let mut viewer = control(&c, &ca.client(Role::Viewer, "dashboards")).await;
    let status = viewer.status(StatusRequest {}).await.unwrap().into_inner();
    assert!(
        status
            .refusals
            .iter()
            .any(|r| r.reason == "role" && r.count == 8),
        "{:?}",
        status.refusals
    );
    let mut operator = control(&c, &ca.client(Role::Operator, "alice")).await;
    let reply = operator
        .set_link(set_link("e0", "a0"))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.changed && reply.version == 2);
    operator.status(StatusRequest {}).await.unwrap();
    c.stop().await;
}

/// Every change is kept with who made it and why: an operator's drain with the certificate's
/// identity and its reason, a switch's report with the switch, shown oldest first by the
/// history call (`sopactl history`); a drain that would cut a rack off is refused unless forced.
#[tokio::test]
async fn every_change_is_kept_with_who_made_it_and_why() {
    use sopa_channel::proto::{HistoryRequest, agent_message};
    let ca = Ca::new("history");
    let c = ca.controller(28).await;
    let mut alice = control(&c, &ca.client(Role::Operator, "alice")).await;
    alice
        .set_link(LinkChange {
            reason: "replacing the optic".into(),
            ..set_link("e0", "a0")
        })
        .await
        .unwrap();
    // e0's other uplink too would leave e0's rack with no path: refused, changing nothing.
    let refused = alice
        .set_link(LinkChange {
            reason: "both optics".into(),
            ..set_link("e0", "a1")
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("--force") && refused.message().contains("e0"),
        "{}",
        refused.message()
    );
    assert_eq!(
        c.controller.version(),
        2,
        "the refused drain made no version"
    );
    // Forced, it is made.
    alice
        .set_link(LinkChange {
            reason: "both optics, rack empty".into(),
            force: true,
            ..set_link("e0", "a1")
        })
        .await
        .unwrap();
    // A switch's report of its port.
    let (first, tx, _inbound) = open_stream(
        &c,
        &ca.client(Role::Switch, "c0"),
        hello("c0", sopa_channel::proto::Role::Switch),
    )
    .await;
    first.unwrap();
    tx.send(sopa_channel::proto::AgentMessage {
        kind: Some(agent_message::Kind::Report(
            sopa_channel::proto::LinkReport {
                a: "c0".into(),
                b: "a0".into(),
                down: true,
            },
        )),
    })
    .await
    .unwrap();
    common::until("c0's report applied", || c.controller.version() == 4).await;
    let mut viewer = control(&c, &ca.client(Role::Viewer, "dashboards")).await;
    let h = viewer
        .history(HistoryRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .entries;
    let got: Vec<(u64, &str, &str, &str)> = h
        .iter()
        .map(|e| {
            (
                e.version,
                e.who.as_str(),
                e.what.as_str(),
                e.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                2,
                "operator/alice",
                "link a0:e0 down",
                "replacing the optic"
            ),
            (
                3,
                "operator/alice",
                "link a1:e0 down",
                "both optics, rack empty"
            ),
            (4, "switch c0", "link a0:c0 down", "port report"),
        ]
    );
    let last = viewer
        .history(HistoryRequest { limit: 1 })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].version, 4);
    c.stop().await;
}

/// A serial on the deny list is refused at the next handshake, and the open stream of that
/// certificate is closed; a deny list that does not parse leaves the one in force.
#[tokio::test]
async fn a_revoked_certificate_is_refused_and_its_stream_closed() {
    let ca = Ca::new("revoke");
    let (c, deny) = ca.controller_and_deny_list(28).await;
    let (h0_dir, h0_serial) = ca.issue_with(Role::Host, "h0", &IssueOptions::default());
    let h0 = tls::client_config(&h0_dir, "localhost").unwrap();
    let (log, lost, _a) = spawn_agent_watched(&endpoint(&c), "h0", Some(h0), vec![], vec![]);
    until("h0's snapshot", || last_version(&log) == 1).await;
    // h1 stays served throughout.
    let (log1, _, _b) = spawn_agent_watched(
        &endpoint(&c),
        "h1",
        Some(ca.client(Role::Host, "h1")),
        vec![],
        vec![],
    );
    until("h1's snapshot", || last_version(&log1) == 1).await;

    let revoked_before = c.controller.refusals.count(Refusal::Revoked);
    std::fs::write(
        ca.deny_file(),
        format!("# h0, lost 2026-12-02\n{h0_serial}\n"),
    )
    .unwrap();
    until("h0's stream closed", || {
        c.controller
            .agents()
            .get("h0")
            .is_some_and(|r| !r.connected)
    })
    .await;
    // Its reconnection attempts are refused at the handshake.
    until("h0's reconnection refused", || {
        c.controller.refusals.count(Refusal::Revoked) >= revoked_before + 2
    })
    .await;
    assert!(
        c.controller
            .agents()
            .get("h0")
            .is_some_and(|r| !r.connected),
        "a revoked certificate never gets back in"
    );
    // The stream was closed with the reason; the attempts after it failed in the TLS
    // handshake, before any request the service would have answered with "this certificate
    // is revoked". (With TLS 1.3 the client may or may not read the server's alert before
    // the connection closes, so what it names varies.)
    until("two attempts after the revocation", || {
        lost.lock().unwrap().len() >= 3
    })
    .await;
    let reasons = lost.lock().unwrap().clone();
    assert!(reasons[0].contains("was revoked"), "{reasons:?}");
    assert!(
        reasons[1..].iter().all(|r| !r.contains("is revoked")),
        "{reasons:?}"
    );
    // A deny list that does not parse changes nothing: h0 stays out, h1 stays in.
    std::fs::write(ca.deny_file(), "not a serial\n").unwrap();
    let err = deny.reload().unwrap_err().to_string();
    assert!(err.contains("line 1"), "{err}");
    assert!(deny.contains(&h0_serial), "the list in force stays");
    assert!(
        c.controller
            .agents()
            .get("h0")
            .is_some_and(|r| !r.connected)
    );
    assert!(c.controller.agents().get("h1").is_some_and(|r| r.connected));
    c.stop().await;
}

/// Renews `role`/`node`'s certificate in `dir` in place, as cert-manager does (the new files
/// renamed over the old); returns the new serial.
fn renew(ca: &Ca, role: Role, node: &str, dir: &Path, names: Vec<String>) -> String {
    let fresh = ca.dir.0.join(format!("{role}-{node}-renewed"));
    let _ = std::fs::remove_dir_all(&fresh);
    let issued = certs::issue(
        &ca.dir.0.join("ca"),
        &Identity::new(role, node).unwrap(),
        &fresh,
        &IssueOptions {
            names,
            ..IssueOptions::default()
        },
    )
    .unwrap();
    for f in [tls::NODE.0, tls::NODE.1] {
        std::fs::rename(fresh.join(f), dir.join(f)).unwrap();
    }
    issued.serial
}

/// A host's certificate renewed in place: its session stays up, and its next handshake presents
/// the new certificate (the old one revoked then closes the session, and the agent is back at
/// once on the new one; presenting the old one, it would stay out).
#[tokio::test]
async fn a_renewed_host_certificate_is_presented_at_the_next_handshake() {
    let ca = Ca::new("renew-host");
    let (c, _deny) = ca.controller_and_deny_list(29).await;
    let (dir, old) = ca.issue_with(Role::Host, "h0", &IssueOptions::default());
    let (log, lost, _a) = common::spawn_agent_with_files(&endpoint(&c), "h0", &dir);
    until("h0's snapshot", || last_version(&log) == 1).await;
    let new = renew(&ca, Role::Host, "h0", &dir, Vec::new());
    assert_ne!(new, old);
    // The session goes on: the next change reaches h0 on it.
    c.controller.set_link("e0", "a0", true).await.unwrap();
    until("the change on the same session", || last_version(&log) == 2).await;
    assert!(
        lost.lock().unwrap().is_empty(),
        "{:?}",
        lost.lock().unwrap()
    );
    let revoked_before = c.controller.refusals.count(Refusal::Revoked);
    std::fs::write(ca.deny_file(), format!("{old}\n")).unwrap();
    until("the old certificate's session closed", || {
        !lost.lock().unwrap().is_empty()
    })
    .await;
    until("h0 back on its new certificate", || {
        c.controller.agents().get("h0").is_some_and(|r| r.connected)
    })
    .await;
    assert_eq!(
        c.controller.refusals.count(Refusal::Revoked),
        revoked_before + 1,
        "only the old session was refused (closed); no handshake presented the old certificate"
    );
    c.stop().await;
}

/// The controller's certificate renewed in place: reloaded within a second, presented at the
/// next handshake, while the sessions open meanwhile stay up.
#[tokio::test]
async fn a_renewed_controller_certificate_is_presented_at_new_handshakes() {
    use tokio_rustls::rustls::{
        self,
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _},
    };
    let ca = Ca::new("renew-ctl");
    let deny = DenyList::none();
    let ctl_dir = ca.issue(Role::Controller, "sopa-controller");
    let server = ServerTls::load(&ctl_dir, deny).unwrap();
    let own = Arc::clone(&server.own);
    let c = start_controller_tls(30, "127.0.0.1:0", Some(server)).await;
    let (log, lost, _a) = spawn_agent_watched(
        &endpoint(&c),
        "h1",
        Some(ca.client(Role::Host, "h1")),
        vec![],
        vec![],
    );
    until("h1's snapshot", || last_version(&log) == 1).await;
    let before = own.serial();
    let new = renew(
        &ca,
        Role::Controller,
        "sopa-controller",
        &ctl_dir,
        vec!["localhost".into()],
    );
    until("the controller's certificate reloaded", || {
        own.serial() == new
    })
    .await;
    assert_ne!(before, new);
    // A new handshake is presented the new certificate.
    let viewer = ca.issue(Role::Viewer, "dashboards");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca.dir.0.join("ca").join(tls::CA)).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(viewer.join(tls::NODE.0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    let key = PrivateKeyDer::from_pem_file(viewer.join(tls::NODE.1)).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(c.addr).await.unwrap();
    let tls_stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let presented = tls_stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (_, serial) = sopa_controller::auth::certificate_identity(&presented).unwrap();
    assert_eq!(
        serial, new,
        "the new handshake was presented the renewed certificate"
    );
    // h1's session, opened before, is still the one it had.
    c.controller.set_link("e0", "a0", true).await.unwrap();
    until("the change on h1's session", || last_version(&log) == 2).await;
    assert!(
        lost.lock().unwrap().is_empty(),
        "{:?}",
        lost.lock().unwrap()
    );
    c.stop().await;
}

/// A certificate revoked through the controller is kept in its state: refused at once (its
/// stream closed), and by the next controller on that state (another replica, or this one
/// restarted) with no deny-list file of its own; the history says who revoked it and why.
#[tokio::test]
async fn a_certificate_revoked_through_one_controller_is_refused_by_the_next() {
    use sopa_channel::proto::{HistoryRequest, RevokeRequest};
    use sopa_controller::{fabric::Fabric, store::Store};
    use sopa_topology::topology::TopologySpec;
    let ca = Ca::new("revoke-stored");
    let store = Store::File(ca.dir.0.join("state.json"));
    let start = |epoch: u64| {
        let (store, ca_dir) = (store.clone(), ca.issue(Role::Controller, "sopa-controller"));
        async move {
            let spec = TopologySpec::FatTree { k: 4 };
            let fabric = match store.load().await.unwrap() {
                Some(state) => Fabric::restore(spec, &state).unwrap(),
                None => Fabric::new(spec, epoch).unwrap(),
            };
            let tls = ServerTls::load(&ca_dir, DenyList::none()).unwrap();
            common::start_controller_tls_fabric(
                fabric,
                tls,
                sopa_controller::server::Options {
                    store,
                    ..common::test_options()
                },
            )
            .await
        }
    };
    let c = start(31).await;
    let (h0_dir, h0_serial) = ca.issue_with(Role::Host, "h0", &IssueOptions::default());
    let h0 = tls::client_config(&h0_dir, "localhost").unwrap();
    let (log, _lost, _a) =
        spawn_agent_watched(&endpoint(&c), "h0", Some(h0.clone()), vec![], vec![]);
    until("h0's snapshot", || last_version(&log) == 1).await;
    let mut alice = control(&c, &ca.client(Role::Operator, "alice")).await;
    let bad = alice
        .revoke(RevokeRequest {
            serial: "not a serial".into(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        bad.code(),
        tonic::Code::InvalidArgument,
        "{}",
        bad.message()
    );
    alice
        .revoke(RevokeRequest {
            serial: h0_serial.to_uppercase(),
            reason: "h0's disk left the building".into(),
        })
        .await
        .unwrap();
    until("h0's stream closed", || {
        c.controller
            .agents()
            .get("h0")
            .is_some_and(|r| !r.connected)
    })
    .await;
    c.stop().await;

    // The next controller on that state, no deny-list file: h0 stays out, h1 gets in.
    let c = start(32).await;
    let (log0, _lost0, _b) = spawn_agent_watched(&endpoint(&c), "h0", Some(h0), vec![], vec![]);
    let (log1, _lost1, _c) = spawn_agent_watched(
        &endpoint(&c),
        "h1",
        Some(ca.client(Role::Host, "h1")),
        vec![],
        vec![],
    );
    until("h0 refused at the handshake", || {
        c.controller.refusals.count(Refusal::Revoked) >= 1
    })
    .await;
    until("h1's snapshot", || last_version(&log1) == 1).await;
    assert!(log0.lock().unwrap().is_empty(), "the revoked h0 was served");
    let mut viewer = control(&c, &ca.client(Role::Viewer, "dashboards")).await;
    let h = viewer
        .history(HistoryRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .entries;
    let revoke = h
        .iter()
        .find(|e| e.what.starts_with("revoke"))
        .expect("the revocation");
    assert_eq!(
        (
            revoke.who.as_str(),
            revoke.what.as_str(),
            revoke.reason.as_str()
        ),
        (
            "operator/alice",
            format!("revoke certificate {h0_serial}").as_str(),
            "h0's disk left the building"
        )
    );
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
fn certificates_are_never_overwritten_keys_stay_private_and_no_node_folder_holds_the_ca_key() {
    use std::os::unix::fs::PermissionsExt as _;
    let ca = Ca::new("files");
    let err = certs::init(&ca.dir.0.join("ca"), certs::CA_DAYS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("already exists"), "{err}");
    let out = ca.issue(Role::Host, "h0");
    let again = certs::issue(
        &ca.dir.0.join("ca"),
        &Identity::new(Role::Host, "h0").unwrap(),
        &out,
        &IssueOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(again.contains("already exists"), "{again}");
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["ca.pem", "node.key", "node.pem"]);
    for key in [
        ca.dir.0.join("ca").join(certs::CA_KEY),
        out.join(tls::NODE.1),
    ] {
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }
    // The identity is in the certificate, as the controller reads it.
    let (id, serial) = certs::read_identity(&out.join(tls::NODE.0)).unwrap();
    assert_eq!(id.uri(), "sopa://host/h0");
    assert!(!serial.is_empty());
    // Names are for controllers only.
    let err = certs::issue(
        &ca.dir.0.join("ca"),
        &Identity::new(Role::Host, "h1").unwrap(),
        &ca.dir.0.join("h1"),
        &IssueOptions {
            names: vec!["h1.example".into()],
            ..IssueOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("h1.example"), "{err}");
}

/// A host certificate may name the host's address (`--host auto` claims it): admitted as the
/// topology's host of that address, by its name, so a switch trusts that host's port; an
/// address no host has is refused, and the certificate of one address cannot claim another.
#[tokio::test]
async fn a_host_known_by_its_address_is_its_topology_host() {
    use sopa_channel::proto::Role as Claimed;
    let ca = Ca::new("by-address");
    let c = ca.controller(29).await;
    // h1 of Fat-Tree k=4 is 10.0.0.3.
    let by_addr = ca.client(Role::Host, "10.0.0.3");
    let (first, _tx, _in) = open_stream(&c, &by_addr, hello("10.0.0.3", Claimed::Host)).await;
    assert!(matches!(
        first.unwrap().kind,
        Some(controller_message::Kind::Peers(_))
    ));
    // A switch's first message lists the live hosts: h1, by its name.
    let e0 = ca.client(Role::Switch, "e0");
    let (first, _tx2, _in2) = open_stream(&c, &e0, hello("e0", Claimed::Switch)).await;
    let Some(controller_message::Kind::Peers(p)) = first.unwrap().kind else {
        panic!("a switch hears the live hosts first")
    };
    assert!(p.live.contains(&"h1".to_owned()), "{:?}", p.live);
    let stranger = ca.client(Role::Host, "10.9.9.9");
    refused_once(&c, Refusal::UnknownNode, async {
        let (first, _, _) = open_stream(&c, &stranger, hello("10.9.9.9", Claimed::Host)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::NotFound);
    })
    .await;
    let other = ca.client(Role::Host, "10.0.0.2");
    refused_once(&c, Refusal::Impersonation, async {
        let claim = Hello {
            topology_name: "10.0.0.4".into(),
            ..hello("10.0.0.2", Claimed::Host)
        };
        let (first, _, _) = open_stream(&c, &other, claim).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::PermissionDenied);
    })
    .await;
    c.stop().await;
}
