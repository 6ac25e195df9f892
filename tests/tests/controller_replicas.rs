//! Three controller replicas on a real three-member etcd cluster, with two host agents that know
//! all three: no change `sopactl` saw acknowledged is ever lost, whether the leader is killed in
//! the middle of a burst of changes, every replica restarts, an etcd member dies, or the leader
//! is paused past its lease and resumed. Needs root and etcd (`cargo xtask setup`).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use sopa_testbed::{
    Process, agent::Agent, bins, controller_fabric::ControllerFabric, etcd::EtcdCluster,
};

const REPLICAS: usize = 3;

fn address(i: usize) -> String {
    format!("10.200.0.2:{}", 7471 + i)
}

/// Replica `i`'s metrics and health endpoints (in the controllers' namespace).
fn metrics_address(i: usize) -> String {
    format!("127.0.0.1:{}", 9481 + i)
}

fn all_addresses() -> String {
    (0..REPLICAS)
        .map(|i| format!("http://{}", address(i)))
        .collect::<Vec<_>>()
        .join(",")
}

struct Replicas<'a> {
    f: &'a ControllerFabric,
    dir: PathBuf,
    store: String,
    procs: Vec<Option<Process>>,
    logs: Vec<PathBuf>,
    starts: usize,
}

impl<'a> Replicas<'a> {
    fn start_all(f: &'a ControllerFabric, dir: &Path, store: String) -> Self {
        std::fs::write(
            dir.join("topology.toml"),
            "[topology]\nkind = \"fat-tree\"\nk = 8\n",
        )
        .unwrap();
        let mut r = Self {
            f,
            dir: dir.to_owned(),
            store,
            procs: (0..REPLICAS).map(|_| None).collect(),
            logs: vec![PathBuf::new(); REPLICAS],
            starts: 0,
        };
        for i in 0..REPLICAS {
            r.start(i);
        }
        r
    }

    fn start(&mut self, i: usize) {
        self.starts += 1;
        let log = self.dir.join(format!("replica-{i}-{}.log", self.starts));
        let spec = self.dir.join("topology.toml");
        let name = format!("r{i}");
        let listen = address(i);
        let metrics = metrics_address(i);
        let p = Process::spawn(
            Some(&self.f.c),
            &bins::sopa_controller(),
            &[
                "--topology",
                spec.to_str().unwrap(),
                "--listen",
                &listen,
                "--insecure",
                "--store",
                &self.store,
                "--name",
                &name,
                "--lease-ttl-s",
                "1",
                "--heartbeat-ms",
                "200",
                "--flap-limit",
                "0",
                "--metrics-addr",
                &metrics,
            ],
            &log,
        )
        .unwrap();
        self.procs[i] = Some(p);
        self.logs[i] = log;
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.logs[i]).unwrap_or_default()
    }

    fn logs(&self) -> String {
        (0..REPLICAS)
            .map(|i| format!("--- replica {i}:\n{}", self.log(i)))
            .collect()
    }

    /// The running replica that was elected (its current run's log says so), waiting for one.
    fn leader(&mut self) -> usize {
        let start = Instant::now();
        loop {
            for i in 0..REPLICAS {
                let running = self.procs[i]
                    .as_mut()
                    .is_some_and(|p| p.try_wait().is_none());
                if running && self.log(i).contains("elected leader") {
                    return i;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no replica was elected:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&mut self, i: usize, signal: i32) {
        let pid = self.procs[i].as_ref().expect("running").pid();
        // SAFETY: signalling our own child by its PID.
        assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            p.stop_with(libc::SIGKILL, Duration::from_secs(10));
        }
    }

    fn stop_all(&mut self) {
        for p in self.procs.iter_mut().filter_map(Option::take) {
            let mut p = p;
            p.stop_with(libc::SIGTERM, Duration::from_secs(10));
        }
    }
}

/// What one `sopactl` run said.
struct Said {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// `sopactl ARGS --controller LIST` in the controllers' namespace.
fn sopactl(f: &ControllerFabric, controllers: &str, args: &[&str]) -> Said {
    f.c.run(|| {
        let out = Command::new(bins::sopactl())
            .args(args)
            .args(["--controller", controllers])
            .output()
            .unwrap();
        Said {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .unwrap()
}

/// The fabric's state as the leader serves it: (version, down links as "a:b").
fn state(f: &ControllerFabric, logs: impl Fn() -> String) -> (u64, BTreeSet<String>) {
    let start = Instant::now();
    loop {
        let said = sopactl(f, &all_addresses(), &["status", "--json"]);
        if said.ok {
            let v: serde_json::Value = serde_json::from_str(&said.stdout).unwrap();
            let down = v["down_links"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap().to_owned())
                .collect();
            return (v["version"].as_u64().unwrap(), down);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no controller answered: {}\n{}",
            said.stderr,
            logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The link "a:b" as the controller names it (its ends in canonical order).
fn canonical(a: &str, b: &str) -> String {
    if a <= b {
        format!("{a}:{b}")
    } else {
        format!("{b}:{a}")
    }
}

/// 100 edge-aggregation links of the k=8 Fat-Tree, none of A's or B's own edge switch.
fn burst_links() -> Vec<(String, String)> {
    let mut links = Vec::new();
    for pod in 2..8 {
        for e in 0..4 {
            for a in 0..4 {
                links.push((format!("e{}", pod * 4 + e), format!("a{}", pod * 4 + a)));
            }
        }
    }
    for (e, a) in [(1, 0), (1, 1), (2, 0), (2, 1)] {
        links.push((format!("e{e}"), format!("a{a}")));
    }
    assert_eq!(links.len(), 100);
    links
}

fn version_of(reply: &str) -> u64 {
    reply
        .rsplit("(version ")
        .next()
        .and_then(|v| v.trim_end().trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no version in {reply:?}"))
}

fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

fn agent_version(agent: &Agent) -> Option<u64> {
    let s = agent.status().ok()?;
    (s["controller"]["connected"] == true)
        .then(|| s["controller"]["version"].as_u64())
        .flatten()
}

#[test]
fn replicas_on_etcd_never_lose_an_acknowledged_change() {
    let f = ControllerFabric::new("rep").unwrap();
    let tmp = sopa_testbed::temp_dir(&format!("rep-{}", f.c.name()));
    let dir = tmp.path().to_path_buf();
    let mut etcd = EtcdCluster::start(&f.c, &dir, 3).expect("a three-member etcd cluster");
    let mut replicas = Replicas::start_all(&f, &dir, etcd.store_flag());
    let first = replicas.leader();
    // Every replica answers on its endpoints, the standbys included: alive, ready only where
    // it leads (once it serves, just after its election), and the leader gauge tells which.
    wait_for("the leader ready", Duration::from_secs(30), || {
        f.c.http_get(&metrics_address(first), "/readyz")
            .is_ok_and(|(code, _)| code == 200)
    });
    for i in 0..REPLICAS {
        let get = |path: &str| f.c.http_get(&metrics_address(i), path).unwrap();
        assert_eq!(get("/healthz"), (200, "ok\n".into()), "replica {i}");
        let (code, metrics) = get("/metrics");
        assert_eq!(code, 200, "replica {i}");
        assert!(metrics.contains(&format!("node=\"r{i}\"")), "{metrics}");
        if i == first {
            assert_eq!(get("/readyz"), (200, "ready\n".into()));
            assert!(metrics.contains("sopa_controller_leader 1"), "{metrics}");
        } else {
            assert_eq!(
                get("/readyz"),
                (
                    503,
                    "not ready: standby: waiting for the leadership\n".into()
                )
            );
            assert!(metrics.contains("sopa_controller_leader 0"), "{metrics}");
            assert!(!metrics.contains("sopa_fabric_version"), "{metrics}");
        }
    }
    let list = all_addresses();
    let agent_a =
        Agent::start_with_controller(&f.a, f.a.name(), "h0", &f.a_if, &list, &["--no-metrics"])
            .unwrap();
    let agent_b =
        Agent::start_with_controller(&f.b, f.b.name(), "h16", &f.b_if, &list, &["--no-metrics"])
            .unwrap();
    wait_for("both agents on the leader", Duration::from_secs(30), || {
        agent_version(&agent_a).is_some() && agent_version(&agent_b).is_some()
    });

    // A burst of 100 changes; the leader is killed (SIGKILL) while the 31st is under way. A
    // change the dying leader did not acknowledge is sent again until a replica does.
    let mut acked: Vec<(String, u64)> = Vec::new();
    let mut unanswered = 0;
    let leader_pid = replicas.procs[first].as_ref().unwrap().pid() as i32;
    let (kill, killer) = std::sync::mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        if killer.recv().is_ok() {
            // SAFETY: signalling the replica this test started, by its PID.
            unsafe { libc::kill(leader_pid, libc::SIGKILL) };
        }
    });
    let mut killed_at = None;
    let mut first_after = None;
    for (a, b) in burst_links() {
        if acked.len() == 30 && killed_at.is_none() {
            let _ = kill.send(());
            killed_at = Some(Instant::now());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The burst cuts whole racks off: forced, as an operator would have to.
            let said = sopactl(
                &f,
                &list,
                &["link", "down", &a, &b, "--force", "--reason", "burst"],
            );
            if said.ok {
                acked.push((canonical(&a, &b), version_of(&said.stdout)));
                if acked.len() == 32 {
                    first_after = killed_at.map(|k| k.elapsed());
                }
                break;
            }
            unanswered += 1;
            assert!(
                Instant::now() < deadline,
                "link down {a} {b} never acknowledged: {}\n{}",
                said.stderr,
                replicas.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    drop(kill);
    killer.join().unwrap();
    replicas.kill(first);
    let second = replicas.leader();
    assert_ne!(second, first);
    let (version, down) = state(&f, || replicas.logs());
    // `sopactl status` says which replica answered: the one that leads.
    let said = sopactl(&f, &all_addresses(), &["status"]);
    assert!(
        said.stdout.contains(&format!(
            "controller replica r{second} (leads), state in etcd:"
        )),
        "status does not name the leader r{second}: {}{}",
        said.stdout,
        said.stderr
    );
    eprintln!(
        "burst: {} acknowledged, {unanswered} tries unanswered while no replica led; replica {first} killed, replica {second} leads at version {version}; the second change after the kill acknowledged {first_after:?} after it",
        acked.len()
    );
    for (link, v) in &acked {
        assert!(
            down.contains(link),
            "acknowledged {link} (version {v}) was lost"
        );
    }
    assert!(
        acked.windows(2).all(|w| w[0].1 < w[1].1),
        "versions strictly increase across the leaders: {acked:?}"
    );
    assert!(version >= acked.last().unwrap().1);
    let converged = wait_for(
        "both agents at the new leader's version",
        Duration::from_secs(30),
        || agent_version(&agent_a) == Some(version) && agent_version(&agent_b) == Some(version),
    );
    eprintln!("agents converged {converged:?} after the burst");

    // Every replica restarted: every drain stays, the version continues.
    replicas.stop_all();
    for i in 0..REPLICAS {
        replicas.start(i);
    }
    replicas.leader();
    assert_eq!(
        state(&f, || replicas.logs()),
        (version, down.clone()),
        "a full restart kept the state"
    );

    // One etcd member (not the raft leader) killed: the other two keep quorum, and changes go
    // on.
    let raft_leader = etcd.raft_leader();
    let victim = (0..3).find(|&m| m != raft_leader).unwrap();
    etcd.kill(victim);
    // Forced: the burst above left racks cut off, which any further drain keeps so.
    let said = sopactl(&f, &list, &["link", "down", "e3", "a3", "--force"]);
    assert!(
        said.ok,
        "a change with two etcd members of three: {}\n{}",
        said.stderr,
        replicas.logs()
    );
    let after_member = version_of(&said.stdout);
    assert_eq!(after_member, version + 1);
    wait_for(
        "both agents at that version",
        Duration::from_secs(30),
        || {
            agent_version(&agent_a) == Some(after_member)
                && agent_version(&agent_b) == Some(after_member)
        },
    );

    // The agents are done: their reconnections would blur which connection waits at the
    // paused replica below.
    assert_eq!(agent_a.stop(), Some(0));
    assert_eq!(agent_b.stop(), Some(0));

    // The leader paused past its lease: another replica is elected; the old one, resumed,
    // cannot write, and stops serving.
    let paused = replicas.leader();
    let elected_before: Vec<usize> = (0..REPLICAS)
        .map(|i| replicas.log(i).matches("elected leader").count())
        .collect();
    replicas.signal(paused, libc::SIGSTOP);
    let start = Instant::now();
    while !(0..REPLICAS).any(|i| {
        i != paused && replicas.log(i).matches("elected leader").count() > elected_before[i]
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no other replica elected while {paused} was paused:\n{}",
            replicas.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let old_only = format!("http://{}", address(paused));
    let port = 7471 + paused as u16;
    assert!(
        !f.c.tcp_established(port).unwrap(),
        "no connection to the paused replica yet"
    );
    let late = std::thread::scope(|s| {
        let late = s.spawn(|| sopactl(&f, &old_only, &["link", "down", "e3", "a2"]));
        // The request waits in the stopped replica's accept queue.
        wait_for(
            "the request queued at the stopped replica",
            Duration::from_secs(10),
            || f.c.tcp_established(port).unwrap_or(false),
        );
        replicas.signal(paused, libc::SIGCONT);
        late.join().unwrap()
    });
    assert!(
        !late.ok,
        "a paused ex-leader acknowledged a change: {}",
        late.stdout
    );
    eprintln!("the resumed ex-leader's answer: {}", late.stderr.trim());
    let status = replicas.procs[paused]
        .as_mut()
        .unwrap()
        .stop_with(0, Duration::from_secs(10))
        .expect("the ex-leader stops serving by itself");
    assert_eq!(
        status.code(),
        Some(75),
        "a replica that lost the leadership exits 75 (its supervisor restarts it)\n{}",
        replicas.log(paused)
    );
    let log = replicas.log(paused);
    assert!(
        log.contains("no longer the leader") || log.contains("lost the leadership"),
        "{log}"
    );
    let (v, down_now) = state(&f, || replicas.logs());
    assert_eq!(v, after_member, "nothing was written by the ex-leader");
    assert!(
        !down_now.contains("a2:e3"),
        "the ex-leader's change is not in the state"
    );
    replicas.procs[paused] = None;
}
