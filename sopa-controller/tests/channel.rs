//! The push channel on loopback (no root): snapshot then deltas in order, NACK keeps the old
//! state, a controller restart brings a fresh snapshot, a version gap resyncs.

mod common;

use std::time::Duration;

use common::{
    last_version, spawn_agent, spawn_agent_with, start_controller, start_controller_unix, until,
};

#[tokio::test]
async fn snapshot_then_deltas_reach_every_agent_in_order() {
    let c = start_controller(11, "127.0.0.1:0").await;
    let agents: Vec<_> = (0..3)
        .map(|i| spawn_agent(c.addr, &format!("h{i}"), vec![], vec![]))
        .collect();
    until("every agent's snapshot", || {
        agents.iter().all(|(log, _)| last_version(log) == 1)
    })
    .await;
    for (a, b, down) in [("e0", "a0", true), ("a0", "c0", true), ("e0", "a0", false)] {
        c.controller.set_link(a, b, down).await.unwrap();
    }
    until("version 4 everywhere", || {
        agents.iter().all(|(log, _)| last_version(log) == 4)
    })
    .await;
    for (log, _) in &agents {
        assert_eq!(
            *log.lock().unwrap(),
            [
                ("snapshot", 11, 1),
                ("delta", 11, 2),
                ("delta", 11, 3),
                ("delta", 11, 4)
            ]
        );
    }
    until("every ACK recorded", || {
        c.controller.agents().values().all(|r| r.last_ack == 4)
    })
    .await;
    let status = c.controller.status();
    assert_eq!(status.agents.len(), 3);
    assert!(
        status
            .agents
            .iter()
            .all(|a| a.connected && a.applied_version == 4)
    );
    c.stop().await;
}

#[tokio::test]
async fn a_nack_keeps_the_last_good_state() {
    let c = start_controller(12, "127.0.0.1:0").await;
    let (log, _stop) = spawn_agent(c.addr, "h5", vec![3], vec![]);
    until("snapshot", || last_version(&log) == 1).await;
    c.controller.set_link("e0", "a0", true).await.unwrap();
    until("version 2", || last_version(&log) == 2).await;
    c.controller.set_link("e0", "a1", true).await.unwrap();
    until("the NACK of 3", || {
        c.controller.agents()["h5"].last_nack == 3
    })
    .await;
    let record = &c.controller.agents()["h5"];
    assert_eq!(record.last_error, "injected apply failure");
    assert_eq!(record.applied_version, 2, "the agent keeps version 2");
    assert_eq!(last_version(&log), 2);
    // The next version does not build on what the agent has: it resyncs and catches up.
    c.controller.set_link("a0", "c0", true).await.unwrap();
    until("version 4 after resync", || last_version(&log) == 4).await;
    let seen: Vec<u64> = log.lock().unwrap().iter().map(|e| e.2).collect();
    assert_eq!(
        seen,
        [1, 2, 3, 4],
        "the refused version arrives again after the resync"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_version_gap_triggers_a_resync() {
    let c = start_controller(13, "127.0.0.1:0").await;
    let (log, _stop) = spawn_agent(c.addr, "h6", vec![], vec![2]);
    until("snapshot", || last_version(&log) == 1).await;
    c.controller.set_link("e0", "a0", true).await.unwrap(); // version 2: lost on the way
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.controller.set_link("e0", "a1", true).await.unwrap(); // version 3: a gap
    until("version 3", || last_version(&log) == 3).await;
    let seen: Vec<(&str, u64)> = log.lock().unwrap().iter().map(|e| (e.0, e.2)).collect();
    assert_eq!(
        seen,
        [("snapshot", 1), ("delta", 2), ("delta", 3)],
        "resync by the deltas it lacked"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_restarted_controller_sends_a_fresh_snapshot() {
    let c = start_controller(14, "127.0.0.1:0").await;
    let addr = c.addr;
    let (log, _stop) = spawn_agent(addr, "h7", vec![], vec![]);
    until("snapshot", || last_version(&log) == 1).await;
    c.controller.set_link("e0", "a0", true).await.unwrap();
    until("version 2", || last_version(&log) == 2).await;
    c.stop().await;
    // Away for a while: the agent keeps its state and retries with backoff.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(last_version(&log), 2);
    let c = start_controller(15, &addr.to_string()).await;
    until("the new epoch's snapshot", || {
        log.lock().unwrap().last().is_some_and(|e| e.1 == 15)
    })
    .await;
    assert_eq!(*log.lock().unwrap().last().unwrap(), ("snapshot", 15, 1));
    c.stop().await;
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_refused_and_changes_nothing() {
    use sopa_channel::proto::{
        self, AgentMessage, Hello, agent_message, channel::channel_client::ChannelClient,
    };
    let c = start_controller(16, "127.0.0.1:0").await;
    let mut client = ChannelClient::connect(format!("http://{}", c.addr))
        .await
        .unwrap()
        .max_encoding_message_size(64 << 20);
    let hello = AgentMessage {
        kind: Some(agent_message::Kind::Hello(Hello {
            node: "x".repeat(proto::MAX_MESSAGE_BYTES + 1),
            role: 1,
            ..Hello::default()
        })),
    };
    let result = client.stream(tokio_stream::iter([hello])).await;
    let refused = match result {
        Err(status) => status,
        Ok(response) => response
            .into_inner()
            .message()
            .await
            .expect_err("the controller must refuse it"),
    };
    assert!(
        matches!(
            refused.code(),
            tonic::Code::ResourceExhausted | tonic::Code::OutOfRange | tonic::Code::InvalidArgument
        ),
        "{refused:?}"
    );
    assert!(c.controller.agents().is_empty(), "nothing recorded");
    assert_eq!(c.controller.version(), 1);
    c.stop().await;
}

#[tokio::test]
async fn the_channel_runs_over_a_unix_socket() {
    let path = std::env::temp_dir().join(format!("sopa-channel-{}.sock", std::process::id()));
    let c = start_controller_unix(17, &path).await;
    let (log, _stop) = spawn_agent_with(
        &format!("unix:{}", path.display()),
        "h9",
        None,
        vec![],
        vec![],
    );
    until("snapshot over the socket", || last_version(&log) == 1).await;
    c.controller.set_link("e0", "a0", true).await.unwrap();
    until("delta over the socket", || last_version(&log) == 2).await;
    c.stop().await;
    let _ = std::fs::remove_file(&path);
}

/// What switches are told about host agents, in order: every host of the topology is live for
/// the grace period after the controller starts (agents still reconnecting), then only hosts
/// with an agent; a host whose agent leaves is down at once and live for one more grace period.
/// Host agents are told only who is down, and only when that changes.
#[tokio::test]
async fn hosts_stay_live_for_a_grace_period_after_the_start_and_after_their_agent_leaves() {
    let grace = Duration::from_secs(3);
    let c = common::start_controller_with_grace(21, grace).await;
    let mut all: Vec<String> = (0..16).map(|i| format!("h{i}")).collect();
    all.sort();
    let (switch, _switch_stop) =
        common::spawn_agent_peers(c.addr, "e0", sopa_channel::proto::Role::Switch);
    let (_h0, h0_stop) = common::spawn_agent_peers(c.addr, "h0", sopa_channel::proto::Role::Host);
    let (h1, _h1_stop) = common::spawn_agent_peers(c.addr, "h1", sopa_channel::proto::Role::Host);
    let seen = |n: usize| {
        let switch = std::sync::Arc::clone(&switch);
        move || switch.lock().unwrap().len() >= n
    };
    until("the start's message", seen(1)).await;
    until("the start-up grace's end", seen(2)).await;
    let h0 = vec!["h0".to_owned()];
    let h01 = vec!["h0".to_owned(), "h1".to_owned()];
    let h1_only = vec!["h1".to_owned()];
    h0_stop.send(true).unwrap();
    until("h0's agent gone", seen(3)).await;
    until("h0's grace over", seen(4)).await;
    let got: Vec<(Vec<String>, Vec<String>)> = switch
        .lock()
        .unwrap()
        .iter()
        .map(|p| (p.down.clone(), p.live.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (vec![], all),
            (vec![], h01.clone()),
            (h0.clone(), h01),
            (h0, h1_only),
        ],
        "(down, live) in the order sent"
    );
    // A host agent reads only who is down: it gets that alone, and only when it changes (the
    // ends of both grace periods change only the live set).
    until("h1 told that h0 is down", || h1.lock().unwrap().len() >= 2).await;
    let got: Vec<(Vec<String>, Vec<String>)> = h1
        .lock()
        .unwrap()
        .iter()
        .map(|p| (p.down.clone(), p.live.clone()))
        .collect();
    assert_eq!(
        got,
        vec![(vec![], vec![]), (vec!["h0".to_owned()], vec![])],
        "(down, live) in the order sent to host h1"
    );
    c.stop().await;
}

/// An agent whose host lost power sends nothing more, and its connection does not close: the
/// controller counts it gone after three of its heartbeat intervals, and tells the others.
#[tokio::test]
async fn an_agent_that_falls_silent_is_gone_after_three_missed_heartbeats() {
    use sopa_channel::proto::Hello;
    let c = start_controller(18, "127.0.0.1:0").await;
    // The controller hears the hello after this instant, and nothing after the hello: the
    // stream stays open (tx is kept), and nothing more is sent.
    let hello_sent = std::time::Instant::now();
    let (tx, _inbound) = common::open_raw(
        c.addr,
        Hello {
            node: "h6".into(),
            role: 1,
            heartbeat_ms: 200,
            ..Hello::default()
        },
    )
    .await;
    until("h6 connected", || {
        c.controller.agents().get("h6").is_some_and(|r| r.connected)
    })
    .await;
    until("h6 gone", || {
        c.controller
            .agents()
            .get("h6")
            .is_some_and(|r| !r.connected)
    })
    .await;
    assert!(
        hello_sent.elapsed() > Duration::from_millis(600),
        "gone {:?} after its hello, before three 200 ms intervals",
        hello_sent.elapsed()
    );
    until("h6 down for its peers", || {
        c.controller.peers().down.contains(&"h6".to_owned())
    })
    .await;
    drop(tx);
    c.stop().await;
}

/// A controller that heartbeats four times more slowly than its agents (4,000 ms against the
/// agents' 1,000 ms default, here 800 against 200) keeps them connected: its first heartbeat
/// says its interval, and an agent waits three of the slower one before counting it lost.
#[tokio::test]
async fn agents_stay_connected_to_a_controller_that_heartbeats_more_slowly() {
    let c = common::start_controller_opts(
        36,
        None,
        sopa_controller::server::Options {
            heartbeat: Duration::from_millis(800),
            ..common::test_options()
        },
    )
    .await;
    let endpoint = format!("http://{}", c.addr);
    let (log, lost, _stop) = common::spawn_agent_watched(&endpoint, "h3", None, vec![], vec![]);
    until("h3 connected", || !log.lock().unwrap().is_empty()).await;
    // Ten of the controller's intervals (40 s at 4 s); an agent that waits three of its own
    // loses the stream within the first.
    let end = std::time::Instant::now() + 10 * Duration::from_millis(800);
    while std::time::Instant::now() < end {
        let lost = lost.lock().unwrap().clone();
        assert!(lost.is_empty(), "sessions lost: {lost:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "one snapshot, no reconnection: {:?}",
        log.lock().unwrap()
    );
    c.stop().await;
}

/// Every change is durable before it is announced: a controller started again on the same
/// state file has every drain and reported failure, the same epoch and the next version, and an
/// agent that was up to date resumes without a snapshot. A change that cannot be stored is
/// refused and undone.
#[tokio::test]
async fn a_restarted_controller_keeps_every_change_and_continues_the_versions() {
    use sopa_controller::{fabric::Fabric, store::Store};
    use sopa_topology::topology::TopologySpec;
    let dir = std::env::temp_dir().join(format!("sopa-durable-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::File(dir.join("state.json"));
    let start = |epoch: u64| {
        let store = store.clone();
        async move {
            let spec = TopologySpec::FatTree { k: 4 };
            let fabric = match store.load().await.unwrap() {
                Some(state) => Fabric::restore(spec, &state).unwrap(),
                None => Fabric::new(spec, epoch).unwrap(),
            };
            common::start_controller_fabric(
                fabric,
                sopa_controller::server::Options {
                    store,
                    ..common::test_options()
                },
            )
            .await
        }
    };
    let c = start(31).await;
    let (log, _stop) = spawn_agent(c.addr, "h2", vec![], vec![]);
    until("snapshot", || last_version(&log) == 1).await;
    c.controller.set_link("e0", "a0", true).await.unwrap();
    c.controller.set_switch("c1", true).await.unwrap();
    until("both changes applied", || last_version(&log) == 3).await;
    c.stop().await;

    // The same state file, another process's epoch would be 32: the stored one wins.
    let c = start(32).await;
    let s = c.controller.status();
    assert_eq!((s.epoch, s.version), (31, 3));
    assert_eq!(
        s.down_links
            .iter()
            .map(|l| (l.a.as_str(), l.b.as_str()))
            .collect::<Vec<_>>(),
        [("a0", "e0")]
    );
    assert_eq!(s.down_switches, ["c1"]);
    let held = Fabric::restore(
        TopologySpec::FatTree { k: 4 },
        &store.load().await.unwrap().unwrap(),
    )
    .unwrap()
    .snapshot();
    // The meter's clock is the controller's (period 250 ms, epoch 0) and survives restarts:
    // an agent that holds it and the stored version needs nothing but the next delta, one
    // whose meter runs by another clock (an older controller's) is given the whole state.
    let period_ms = sopa_controller::server::DEFAULT_METER_PERIOD.as_millis() as u32;
    let view = || sopa_channel::view::FabricView::from_snapshot(&held).unwrap();
    let log = common::spawn_agent_holding(c.addr, "h2", view(), Some((period_ms, 0)));
    let other = common::spawn_agent_holding(c.addr, "h3", view(), Some((period_ms, 1_000_000)));
    until("h2 and h3 back", || {
        let agents = c.controller.agents();
        ["h2", "h3"]
            .iter()
            .all(|h| agents.get(*h).is_some_and(|r| r.connected))
    })
    .await;
    c.controller.set_link("e0", "a0", false).await.unwrap();
    until("version 4", || {
        last_version(&log) == 4 && last_version(&other) == 4
    })
    .await;
    assert_eq!(
        *log.lock().unwrap(),
        [("delta", 31, 4)],
        "an agent that was up to date needs no snapshot"
    );
    let other = other.lock().unwrap().clone();
    assert_eq!(
        other.first().map(|e| e.0),
        Some("snapshot"),
        "an agent whose meter runs by another clock is given it: {other:?}"
    );

    // A store that cannot be written: the change is refused and nothing moves.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, "a file where the state's folder was").unwrap();
    let err = c.controller.set_link("e1", "a1", true).await.unwrap_err();
    assert!(err.to_string().contains("not made durable"), "{err}");
    let s = c.controller.status();
    assert_eq!(s.version, 4);
    assert!(s.down_links.is_empty());
    c.stop().await;
    let _ = std::fs::remove_file(&dir);
}

/// A state file restored from a backup would take the agents back: the first agent that holds
/// a newer version of the same epoch stops the controller, which says why and serves nothing,
/// and the agent keeps its state. With --accept-rollback (a new epoch for the stored state)
/// the agents take it as a fresh snapshot.
#[tokio::test]
async fn a_controller_whose_state_went_back_refuses_to_roll_agents_back() {
    use sopa_controller::{fabric::Fabric, store::Store};
    use sopa_topology::topology::TopologySpec;
    let dir = std::env::temp_dir().join(format!("sopa-rollback-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (file, backup) = (dir.join("state.json"), dir.join("backup.json"));
    let store = Store::File(file.clone());
    let start = |renew: Option<u64>| {
        let store = store.clone();
        async move {
            let spec = TopologySpec::FatTree { k: 4 };
            let mut fabric = match store.load().await.unwrap() {
                Some(state) => Fabric::restore(spec, &state).unwrap(),
                None => Fabric::new(spec, 41).unwrap(),
            };
            if let Some(epoch) = renew {
                // What the controller's start does with --accept-rollback.
                fabric.renew_epoch(epoch);
                store.save(&fabric.persisted()).await.unwrap();
            }
            common::start_controller_fabric(
                fabric,
                sopa_controller::server::Options {
                    store,
                    ..common::test_options()
                },
            )
            .await
        }
    };
    let c = start(None).await;
    c.controller.set_link("e0", "a0", true).await.unwrap();
    std::fs::copy(&file, &backup).unwrap();
    c.controller.set_switch("c1", true).await.unwrap();
    c.stop().await;
    let newest = Fabric::restore(
        TopologySpec::FatTree { k: 4 },
        &store.load().await.unwrap().unwrap(),
    )
    .unwrap()
    .snapshot();
    assert_eq!((newest.epoch, newest.version), (41, 3));
    let view = || sopa_channel::view::FabricView::from_snapshot(&newest).unwrap();
    let clock = Some((
        sopa_controller::server::DEFAULT_METER_PERIOD.as_millis() as u32,
        0,
    ));

    // The backup (version 2) put back.
    std::fs::copy(&backup, &file).unwrap();
    let c = start(None).await;
    let log = common::spawn_agent_holding(c.addr, "h2", view(), clock);
    let why = tokio::time::timeout(Duration::from_secs(5), c.controller.stepped_down())
        .await
        .expect("the controller stepped down");
    assert!(
        why.contains("--accept-rollback") && why.contains("version 3") && why.contains("h2"),
        "{why}"
    );
    let refused = c.controller.status().refusals;
    assert!(
        refused
            .iter()
            .any(|r| r.reason == "rollback" && r.count >= 1),
        "{refused:?}"
    );
    // Nothing was served: the hello was refused before anything was sent.
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
    c.stop().await;

    // Accepted: a new epoch, taken as a snapshot.
    let c = start(Some(42)).await;
    let log = common::spawn_agent_holding(c.addr, "h2", view(), clock);
    until("the snapshot of the new epoch", || {
        log.lock().unwrap().first() == Some(&("snapshot", 42, 2))
    })
    .await;
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An operator's trust whose change cannot be stored is not taken: the suspect link stays
/// suspect (and drained, with its hold-down to end it), not trusted yet drained with nothing
/// left to release it. Once the store is back the same trust releases it.
#[tokio::test]
async fn a_trust_that_cannot_be_stored_leaves_the_suspicion_as_it_was() {
    use sopa_controller::{fabric::Fabric, store::Store, suspicion::SuspicionConfig};
    use sopa_topology::topology::TopologySpec;
    let dir = std::env::temp_dir().join(format!("sopa-trust-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut f = Fabric::new(TopologySpec::FatTree { k: 4 }, 37).unwrap();
    f.set_suspect("a0", "c0", true).unwrap();
    let c = common::start_controller_fabric(
        f,
        sopa_controller::server::Options {
            store: Store::File(dir.join("state.json")),
            suspicion: SuspicionConfig {
                hold: Duration::from_secs(600),
                ..SuspicionConfig::default()
            },
            ..common::test_options()
        },
    )
    .await;
    until("the stored suspect adopted", || {
        c.controller.status().suspect_links.len() == 1
    })
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, "a file where the state's folder was").unwrap();
    let err = c.controller.set_trust("a0", "c0", true).await.unwrap_err();
    assert!(err.to_string().contains("not made durable"), "{err}");
    let s = c.controller.status();
    assert_eq!(s.suspect_links.len(), 1, "the suspicion was dropped: {s:?}");
    assert!(
        s.trusted_links.is_empty(),
        "trusted though not stored: {s:?}"
    );
    assert_eq!(s.down_links.len(), 1, "{s:?}");
    // The store back: the same trust is taken.
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let reply = c.controller.set_trust("a0", "c0", true).await.unwrap();
    assert!(reply.changed);
    let s = c.controller.status();
    assert!(
        s.suspect_links.is_empty() && s.down_links.is_empty(),
        "{s:?}"
    );
    assert_eq!(s.trusted_links.len(), 1, "{s:?}");
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connected agent that never acknowledges does not stop the meter for good: after a change
/// that gives a link back, the evidence waits for the agents at most 16 meter periods, then
/// sets the silent one aside as lagging (shown in status) and judges without it.
#[tokio::test]
async fn an_agent_that_never_acknowledges_is_set_aside_as_lagging() {
    use sopa_channel::proto::Hello;
    let c = common::start_controller_opts(
        38,
        None,
        sopa_controller::server::Options {
            meter_period: Duration::from_millis(20),
            ..common::test_options()
        },
    )
    .await;
    let (log, _stop) = spawn_agent(c.addr, "h1", vec![], vec![]);
    until("h1's snapshot", || last_version(&log) == 1).await;
    // h2 says hello and nothing more: no ack, ever (its heartbeat is slow, so it stays).
    let (_silent, _inbound) = common::open_raw(
        c.addr,
        Hello {
            node: "h2".into(),
            role: 1,
            heartbeat_ms: 60_000,
            ..Hello::default()
        },
    )
    .await;
    until("h2 connected", || {
        c.controller.agents().get("h2").is_some_and(|r| r.connected)
    })
    .await;
    c.controller.set_link("e0", "a0", true).await.unwrap();
    c.controller.set_link("e0", "a0", false).await.unwrap();
    until("h1 applied both", || last_version(&log) == 3).await;
    until("the meter judges again", || {
        c.controller.meter_settling().is_none()
    })
    .await;
    let agents = c.controller.agents();
    assert_eq!(agents["h2"].lagging, Some(3), "the silent agent");
    assert_eq!(agents["h1"].lagging, None, "the agent that acknowledged");
    let status = c.controller.status();
    let h2 = status.agents.iter().find(|a| a.node == "h2").unwrap();
    assert_eq!(h2.lagging_version, 3);
    c.stop().await;
}

/// A raw stream of switch e0 (a slow heartbeat of its own: the test sends only reports).
async fn switch_e0(
    addr: std::net::SocketAddr,
) -> (
    tokio::sync::mpsc::Sender<sopa_channel::proto::AgentMessage>,
    tonic::Streaming<sopa_channel::proto::ControllerMessage>,
) {
    switch(addr, "e0").await
}

/// e0's report of its port towards a0.
fn e0_a0_report(down: bool) -> sopa_channel::proto::AgentMessage {
    report("e0", "a0", down)
}

/// A raw switch session of `node`.
async fn switch(
    addr: std::net::SocketAddr,
    node: &str,
) -> (
    tokio::sync::mpsc::Sender<sopa_channel::proto::AgentMessage>,
    tonic::Streaming<sopa_channel::proto::ControllerMessage>,
) {
    common::open_raw(
        addr,
        sopa_channel::proto::Hello {
            node: node.into(),
            role: 2,
            heartbeat_ms: 60_000,
            ..Default::default()
        },
    )
    .await
}

/// A switch's report of link `a`-`b`.
fn report(a: &str, b: &str, down: bool) -> sopa_channel::proto::AgentMessage {
    use sopa_channel::proto::{AgentMessage, LinkReport, agent_message};
    AgentMessage {
        kind: Some(agent_message::Kind::Report(LinkReport {
            a: a.into(),
            b: b.into(),
            down,
        })),
    }
}

/// Each end's report of a link is its own: a0, restarted, reports every port up again, and the
/// link e0 reports down stays down.
#[tokio::test]
async fn a_switch_reporting_its_ports_up_leaves_the_other_ends_report_of_a_link_down() {
    let c = common::start_controller(35, "127.0.0.1:0").await;
    let (e0, _e0_in) = switch_e0(c.addr).await;
    e0.send(e0_a0_report(true)).await.unwrap();
    until("e0's report applied", || c.controller.version() == 2).await;
    // a0's agent restarts: a session, then another, which reports each port's carrier.
    let (a0, a0_in) = switch(c.addr, "a0").await;
    drop((a0, a0_in));
    let (a0, _a0_in) = switch(c.addr, "a0").await;
    a0.send(report("a0", "e0", false)).await.unwrap();
    // A session's reports are applied in order: once its next one is, this one was.
    a0.send(report("a0", "c0", true)).await.unwrap();
    until("a0's reports applied", || c.controller.version() == 3).await;
    let s = c.controller.status();
    let down: Vec<(String, String)> = s
        .down_links
        .iter()
        .map(|l| (l.a.clone(), l.b.clone()))
        .collect();
    assert!(
        down.contains(&("a0".to_owned(), "e0".to_owned())),
        "e0's report of a0:e0 down was ended by a0's up: {down:?}"
    );
    // e0's own up ends it.
    e0.send(e0_a0_report(false)).await.unwrap();
    until("e0's up applied", || c.controller.version() == 4).await;
    drop((e0, a0));
    c.stop().await;
}

/// A port report whose change cannot be stored counts for nothing in the damping: no hold is
/// left behind, and once the store is back the same report is judged as if the lost one had
/// never come.
#[tokio::test]
async fn a_report_that_cannot_be_stored_leaves_the_damping_as_it_was() {
    use sopa_controller::{damping::DampingConfig, fabric::Fabric, store::Store};
    use sopa_topology::topology::TopologySpec;
    let dir = std::env::temp_dir().join(format!("sopa-damping-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let c = common::start_controller_fabric(
        Fabric::new(TopologySpec::FatTree { k: 4 }, 34).unwrap(),
        sopa_controller::server::Options {
            store: Store::File(dir.join("state.json")),
            damping: DampingConfig {
                limit: 2,
                window: Duration::from_secs(60),
                hold: Duration::from_secs(60),
                max_hold: Duration::from_secs(60),
            },
            ..common::test_options()
        },
    )
    .await;
    let (tx, _inbound) = switch_e0(c.addr).await;
    tx.send(e0_a0_report(true)).await.unwrap();
    tx.send(e0_a0_report(false)).await.unwrap();
    until("the first flap applied", || c.controller.version() == 3).await;
    // The second down would hold the link; it cannot be stored.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, "a file where the state's folder was").unwrap();
    tx.send(e0_a0_report(true)).await.unwrap();
    until("the report refused", || {
        c.controller.status().changes_not_stored == 1
    })
    .await;
    let s = c.controller.status();
    assert_eq!(s.version, 3);
    assert!(s.down_links.is_empty(), "{s:?}");
    assert!(
        s.held_links.is_empty(),
        "a hold decided from a report that was not made: {s:?}"
    );
    // The store back: the same down is the link's second flap, applied and held.
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    tx.send(e0_a0_report(true)).await.unwrap();
    until("the down applied", || c.controller.version() == 4).await;
    let s = c.controller.status();
    assert_eq!(s.down_links.len(), 1, "{s:?}");
    assert_eq!(
        s.held_links.len(),
        1,
        "the second flap holds the link: {s:?}"
    );
    drop(tx);
    c.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A port that flaps is held down: its downs are applied at once, its ups only when the hold
/// ends, and `status` shows it held meanwhile.
#[tokio::test]
async fn a_flapping_port_is_held_down_until_its_hold_ends() {
    use sopa_controller::{damping::DampingConfig, fabric::Fabric};
    use sopa_topology::topology::TopologySpec;
    let c = common::start_controller_fabric(
        Fabric::new(TopologySpec::FatTree { k: 4 }, 33).unwrap(),
        sopa_controller::server::Options {
            damping: DampingConfig {
                limit: 2,
                window: Duration::from_secs(60),
                hold: Duration::from_secs(2),
                max_hold: Duration::from_secs(10),
            },
            ..common::test_options()
        },
    )
    .await;
    let (tx, _inbound) = switch_e0(c.addr).await;
    // One flap: down and up, both applied.
    tx.send(e0_a0_report(true)).await.unwrap();
    tx.send(e0_a0_report(false)).await.unwrap();
    until("the first flap applied", || c.controller.version() == 3).await;
    // The second down within the window: applied, and the link held down.
    tx.send(e0_a0_report(true)).await.unwrap();
    until("the second down applied", || c.controller.version() == 4).await;
    tx.send(e0_a0_report(false)).await.unwrap();
    until("the up taken and held", || {
        c.controller
            .status()
            .held_links
            .iter()
            .any(|h| h.up_pending)
    })
    .await;
    let s = c.controller.status();
    assert_eq!(s.version, 4, "the up of a held link waits");
    assert_eq!(s.down_links.len(), 1);
    // The hold ends: the pending up is applied.
    until("the link up after its hold", || c.controller.version() == 5).await;
    let s = c.controller.status();
    assert!(s.down_links.is_empty() && s.held_links.is_empty(), "{s:?}");
    drop(tx);
    c.stop().await;
}

/// The gRPC health service answers beside the channel: SERVING for the server and each of its
/// services, and NotFound for a service it does not have.
#[tokio::test]
async fn the_grpc_health_service_says_serving() {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let c = start_controller(11, "127.0.0.1:0").await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "sopa.channel.v1.Channel", "sopa.channel.v1.Control"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("{service:?}: {s:?}"));
        assert_eq!(
            reply.into_inner().status,
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    c.stop().await;
}
