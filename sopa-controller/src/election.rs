//! Leader election among controller replicas that share an etcd store: the leader is the
//! replica whose name the key `PREFIX/leader` holds, put there under the replica's lease. A
//! replica that is not the leader waits (watching the key) and serves nothing; when the key
//! goes (the leader resigned, or its lease ran out because it died, hung or was cut off), the
//! waiting replicas try again and one wins.
//!
//! A leader keeps its lease alive; when it cannot (etcd unreachable, the lease already
//! expired), it learns so through [`Leadership::lost`], a tenth of the lease's time before
//! etcd could let another replica in, and must stop serving: the controller
//! then exits, as Kubernetes' controller managers do, and its supervisor starts it again as a
//! waiting replica. Until it notices, its writes are already refused by etcd (see
//! [`crate::store::etcd`]).

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::store::{EtcdStore, StoreError, etcd::Fence};

/// A replica standing for election.
pub struct Candidate {
    store: EtcdStore,
    name: String,
    ttl_s: i64,
}

/// This replica leads: its lease is kept alive until it is lost or resigned.
pub struct Leadership {
    pub fence: Fence,
    lost: watch::Receiver<Option<String>>,
    keepalive: tokio::task::JoinHandle<()>,
    client: Client,
}

impl Candidate {
    /// `name` identifies this replica to operators (it is what the leader key holds); `ttl`
    /// is how long the leadership outlives the last keep-alive (etcd raises it to its minimum,
    /// about 1.5 times its election timeout).
    pub fn new(store: EtcdStore, name: &str, ttl: Duration) -> Self {
        Self {
            store,
            name: name.to_owned(),
            ttl_s: ttl.as_secs().max(1) as i64,
        }
    }

    /// Waits until this replica is elected, then fences every write of the store with its
    /// leadership. etcd failing meanwhile is logged and outlasted: a waiting replica keeps
    /// waiting.
    pub async fn campaign(&self) -> Result<Leadership, StoreError> {
        let mut client = self.store.client();
        let mut following: Option<String> = None;
        loop {
            match self.stand(&mut client, &mut following).await {
                Ok(Some(leadership)) => return Ok(leadership),
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "standing for election: etcd did not answer; trying again");
                    tokio::time::sleep(RETRY * 4).await;
                }
            }
        }
    }

    /// One try: elected, or (someone else leads) back once the leader's key is gone.
    async fn stand(
        &self,
        client: &mut Client,
        following: &mut Option<String>,
    ) -> Result<Option<Leadership>, etcd_client::Error> {
        let key = self.store.leader_key();
        let granted_at = tokio::time::Instant::now();
        let ttl_s = self.ttl_s;
        let lease = self
            .store
            .retrying(|mut c| async move { c.lease_grant(ttl_s, None).await })
            .await?;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(
                key.as_str(),
                self.name.as_str(),
                Some(PutOptions::new().with_lease(lease.id())),
            )])
            .or_else(vec![TxnOp::get(key.as_str(), None)]);
        let resp = match self
            .store
            .retrying(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let _ = client.lease_revoke(lease.id()).await;
                return Err(e);
            }
        };
        if resp.succeeded() {
            let fence = Fence {
                name: self.name.clone(),
                lease: lease.id(),
            };
            info!(name = %self.name, lease = lease.id(), ttl_s = lease.ttl(), "elected leader");
            self.store.fence_with(fence.clone());
            let (tx, lost) = watch::channel(None);
            let keepalive = tokio::spawn(keep_alive(
                client.clone(),
                lease.id(),
                granted_at,
                Duration::from_secs(lease.ttl().max(1) as u64),
                tx,
            ));
            return Ok(Some(Leadership {
                fence,
                lost,
                keepalive,
                client: client.clone(),
            }));
        }
        // Someone else leads: give the lease back, and wait for their key to go.
        let _ = client.lease_revoke(lease.id()).await;
        let holder = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| {
                (
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.mod_revision(),
                )
            }),
            _ => None,
        });
        let Some((holder, revision)) = holder else {
            return Ok(None); // gone between the check and the read: try again at once
        };
        if following.as_deref() != Some(holder.as_str()) {
            info!(leader = %holder, "another replica leads; waiting, serving nothing, until it goes");
            *following = Some(holder);
        }
        let mut events = client
            .watch(
                key.as_str(),
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await?;
        loop {
            match events.message().await? {
                Some(r) if r.canceled() => return Ok(None),
                Some(r) => {
                    if r.events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(None);
                    }
                }
                None => return Ok(None),
            }
        }
    }
}

impl Leadership {
    /// Resolves with the reason once the leadership is lost.
    pub async fn lost(&mut self) -> String {
        loop {
            if let Some(why) = self.lost.borrow_and_update().clone() {
                return why;
            }
            if self.lost.changed().await.is_err() {
                return "the lease keeper ended".into();
            }
        }
    }

    /// Gives the leadership up at once (the key goes with the lease), so that a waiting
    /// replica takes over without waiting for the lease to run out.
    pub async fn resign(mut self) {
        self.keepalive.abort();
        match tokio::time::timeout(
            Duration::from_secs(2),
            self.client.lease_revoke(self.fence.lease),
        )
        .await
        {
            Ok(Ok(_)) => info!("resigned the leadership"),
            Ok(Err(e)) => warn!(error = %e, "resigning; the lease runs out by itself"),
            Err(_) => warn!("resigning timed out; the lease runs out by itself"),
        }
    }
}

impl Drop for Leadership {
    /// A leadership dropped without [`Leadership::resign`] stops renewing its lease: it runs
    /// out, as a dead leader's does.
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// How soon a failed renewal is tried again.
const RETRY: Duration = Duration::from_millis(50);

/// Renews the lease every third of its time to live. The leadership counts as lost a tenth of
/// the time to live before the lease could run out unrenewed (by this clock, measured from
/// before each renewal was asked for), or as soon as etcd says the lease is gone: the leader
/// stops serving before another can be elected.
async fn keep_alive(
    mut client: Client,
    lease: i64,
    granted_at: tokio::time::Instant,
    ttl: Duration,
    lost: watch::Sender<Option<String>>,
) {
    let period = ttl / 3;
    let margin = ttl / 10;
    let mut valid_until = granted_at + ttl;
    let mut keeper = None;
    let mut last_error = String::new();
    loop {
        // After a failed renewal the next comes soon: it may reach another etcd member (a
        // dead one refuses at once, and the client may pick it again).
        let wait = if last_error.is_empty() {
            period
        } else {
            RETRY.min(period)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = tokio::time::sleep_until(valid_until - margin) => {}
        }
        if tokio::time::Instant::now() >= valid_until - margin {
            let why = if last_error.is_empty() {
                format!("lease {lease:x} not renewed in time")
            } else {
                format!("lease {lease:x} not renewed in time ({last_error})")
            };
            let _ = lost.send(Some(why));
            return;
        }
        let sent = tokio::time::Instant::now();
        let renew = async {
            if keeper.is_none() {
                keeper = Some(client.lease_keep_alive(lease).await?);
            }
            let (k, stream) = keeper.as_mut().expect("opened above");
            k.keep_alive().await?;
            stream.message().await
        };
        match tokio::time::timeout(period, renew).await {
            Ok(Ok(Some(r))) if r.ttl() > 0 => {
                valid_until = sent + Duration::from_secs(r.ttl() as u64);
                last_error.clear();
            }
            Ok(Ok(Some(_))) => {
                let _ = lost.send(Some(format!("lease {lease:x} expired in etcd")));
                return;
            }
            Ok(Ok(None)) => {
                keeper = None;
                last_error = "the keep-alive stream ended".into();
            }
            Ok(Err(e)) => {
                keeper = None;
                last_error = e.to_string();
            }
            Err(_) => {
                keeper = None;
                last_error = "etcd did not answer".into();
            }
        }
    }
}
