//! The etcd store and the replicas' election against a real etcd (one member on loopback, the
//! distribution's `etcd`; `cargo xtask setup` installs it): a write fenced by a lost lease is
//! refused and changes nothing, a waiting replica takes over when the leader resigns and the
//! old leader can no longer write, and a writer whose revision is stale is refused.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use sopa_controller::{
    election::Candidate,
    store::{EtcdStore, Persisted, StoreError},
};

/// One etcd member on free loopback ports, killed (and its data removed) on drop.
struct Etcd {
    child: Child,
    dir: PathBuf,
    endpoint: String,
}

/// One test at a time: each picks free ports, and two at once could pick the same.
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    fn start(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sopa-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("127.0.0.1:{client}");
        let log = dir.join("etcd.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("etcd")
            .args([
                "--name",
                "m0",
                "--data-dir",
                dir.join("data").to_str().unwrap(),
                "--listen-client-urls",
                &format!("http://{endpoint}"),
                "--advertise-client-urls",
                &format!("http://{endpoint}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("m0=http://127.0.0.1:{peer}"),
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--logger",
                "zap",
            ])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("etcd is missing: `cargo xtask setup` installs it (Debian's etcd-server)");
        let etcd = Self {
            child,
            dir,
            endpoint,
        };
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("serving client traffic") {
                return etcd;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcd did not serve: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn state(version: u64) -> Persisted {
    Persisted {
        topology: "{\"fat-tree\":4}".into(),
        epoch: 7,
        version,
        down_links: vec![("a0".into(), "e0".into())],
        reported_down: Vec::new(),
        reported_by: Vec::new(),
        down_switches: Vec::new(),
        suspect: Vec::new(),
        miscabled: Vec::new(),
        audit: Vec::new(),
        revoked: Vec::new(),
    }
}

async fn store(etcd: &Etcd) -> EtcdStore {
    EtcdStore::connect(std::slice::from_ref(&etcd.endpoint), "/sopa-test", None)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_write_fenced_by_a_lost_lease_is_refused_and_changes_nothing() {
    let _serial = one_at_a_time().await;
    let etcd = Etcd::start("fence");
    let s = store(&etcd).await;
    assert!(
        matches!(s.save(&state(1)).await, Err(StoreError::NotLeader { .. })),
        "a replica never elected cannot write"
    );
    let mut leadership = Candidate::new(s.clone(), "r0", Duration::from_secs(1))
        .campaign()
        .await
        .unwrap();
    assert_eq!(s.load().await.unwrap(), None);
    s.save(&state(2)).await.unwrap();
    // The lease ends (as it does when the leader is paused past it): etcd removes the key.
    s.client()
        .lease_revoke(leadership.fence.lease)
        .await
        .unwrap();
    let err = s.save(&state(3)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotLeader { .. }), "{err}");
    assert!(err.ends_leadership());
    assert_eq!(
        s.load().await.unwrap(),
        Some(state(2)),
        "nothing was written"
    );
    // And the leader learns it from its next renewal.
    let why = tokio::time::timeout(Duration::from_secs(10), leadership.lost())
        .await
        .expect("the lost lease noticed");
    assert!(
        why.contains("expired") || why.contains("not renewed"),
        "{why}"
    );
}

/// A leader that cannot renew its lease (etcd gone) counts it lost before the lease could run
/// out: by its own clock, a tenth of the time to live early.
#[tokio::test]
async fn a_leader_cut_off_from_etcd_counts_its_leadership_lost_before_the_lease_runs_out() {
    let _serial = one_at_a_time().await;
    let etcd = Etcd::start("cutoff");
    let s = store(&etcd).await;
    let mut leadership = Candidate::new(s.clone(), "r0", Duration::from_secs(2))
        .campaign()
        .await
        .unwrap();
    let ttl = Duration::from_secs(2);
    drop(etcd);
    let cut = std::time::Instant::now();
    let why = tokio::time::timeout(Duration::from_secs(10), leadership.lost())
        .await
        .expect("the leadership counted lost");
    let after = cut.elapsed();
    assert!(why.contains("not renewed"), "{why}");
    assert!(
        after < ttl,
        "noticed {after:?} after etcd went, past the lease's {ttl:?}"
    );
}

#[tokio::test]
async fn a_waiting_replica_takes_over_when_the_leader_resigns_and_the_old_one_cannot_write() {
    let _serial = one_at_a_time().await;
    let etcd = Etcd::start("takeover");
    let (a, b) = (store(&etcd).await, store(&etcd).await);
    let leader = Candidate::new(a.clone(), "r0", Duration::from_secs(5))
        .campaign()
        .await
        .unwrap();
    a.save(&state(2)).await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            Candidate::new(b, "r1", Duration::from_secs(5))
                .campaign()
                .await
        }
    });
    // While r0 leads, r1 waits. A check that something does not happen: it gives r1 time to
    // win wrongly (a slow machine only makes it weaker, never red without cause); what the
    // test waits on below is the event itself, r1's election.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a second leader while r0 leads");
    let fence = leader.fence.clone();
    leader.resign().await;
    let _next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("r1 elected once r0 resigned")
        .unwrap()
        .unwrap();
    assert_eq!(
        b.load().await.unwrap(),
        Some(state(2)),
        "r1 reads r0's state"
    );
    b.save(&state(3)).await.unwrap();
    // r0 still holds its old fence: refused, naming the leader.
    a.fence_with(fence);
    match a.save(&state(4)).await {
        Err(StoreError::NotLeader { holder }) => assert_eq!(holder, "r1"),
        other => panic!("the old leader wrote: {other:?}"),
    }
    assert_eq!(b.load().await.unwrap(), Some(state(3)));
}

#[tokio::test]
async fn a_writer_with_a_stale_revision_is_refused() {
    let _serial = one_at_a_time().await;
    let etcd = Etcd::start("cas");
    let (a, b) = (store(&etcd).await, store(&etcd).await);
    let leader = Candidate::new(a.clone(), "r0", Duration::from_secs(5))
        .campaign()
        .await
        .unwrap();
    // Another writer under the same fence (a copy of this replica, or a hand-made write).
    b.fence_with(leader.fence.clone());
    assert_eq!(b.load().await.unwrap(), None);
    a.save(&state(2)).await.unwrap();
    let err = b.save(&state(9)).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict), "{err}");
    assert_eq!(a.load().await.unwrap(), Some(state(2)));
}
