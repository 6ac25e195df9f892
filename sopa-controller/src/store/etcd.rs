//! `--store etcd:HOST:PORT,...`: the state in one etcd key (`PREFIX/state`, JSON), beside the
//! leader's key (`PREFIX/leader`, see [`crate::election`]).
//!
//! Only the elected leader writes, and every write is one etcd transaction that checks, before
//! it puts the new state, that
//! - the leader key still names this controller under this controller's lease: a leader that
//!   was paused past its lease (a stopped process, a long GC-like stall, a partition) and
//!   carries on cannot write, because etcd removed its key when the lease ran out; and
//! - the state key is at the revision this controller last read or wrote (compare-and-swap):
//!   nothing else changed it meanwhile.
//!
//! So versions strictly increase across leaders: a new leader reads the state, and continues
//! from its version.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, Txn, TxnOp, TxnOpResponse};

use super::{Persisted, StoreError};

/// How long one etcd request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a request that fails in transit is tried again.
pub const RETRY_FOR: Duration = Duration::from_secs(5);

/// Whether an etcd error is one of transit (a member unreachable, a connection cut, a request
/// the client's own timeout cancelled while the members elect a leader), after which the
/// request may be sent again, rather than etcd's answer.
pub fn in_transit(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
        ),
        _ => false,
    }
}

#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: String,
    prefix: String,
    /// The leadership every write is fenced by; `None` until elected.
    fence: Arc<Mutex<Option<Fence>>>,
    /// The state key's revision this controller last read or wrote (0: absent).
    revision: Arc<Mutex<i64>>,
}

/// A leader's name and lease, as its key in etcd holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub name: String,
    pub lease: i64,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to etcd (any of `endpoints`, over TLS with `tls`); keys live under `prefix`.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        tls: Option<etcd_client::TlsOptions>,
    ) -> Result<Self, StoreError> {
        let joined = endpoints.join(",");
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| StoreError::Etcd {
                endpoints: joined.clone(),
                message: e.to_string(),
            })?;
        let store = Self {
            client,
            endpoints: joined,
            prefix: prefix.trim_end_matches('/').to_owned(),
            fence: Arc::default(),
            revision: Arc::default(),
        };
        // The connection is lazy: one read proves etcd answers before anything else starts.
        store
            .client
            .clone()
            .get(store.leader_key(), None)
            .await
            .map_err(|e| store.etcd_error(e))?;
        Ok(store)
    }

    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn state_key(&self) -> String {
        format!("{}/state", self.prefix)
    }

    pub fn leader_key(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    pub(crate) fn etcd_error(&self, e: etcd_client::Error) -> StoreError {
        StoreError::Etcd {
            endpoints: self.endpoints.clone(),
            message: e.to_string(),
        }
    }

    /// The name this controller was elected under, once it was.
    pub fn leader(&self) -> Option<String> {
        self.fence
            .lock()
            .expect("fence lock")
            .as_ref()
            .map(|f| f.name.clone())
    }

    /// The folder of keys the state and the leader key live under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// From now on every write is fenced by `fence` (this controller was elected).
    pub fn fence_with(&self, fence: Fence) {
        *self.fence.lock().expect("fence lock") = Some(fence);
    }

    /// The stored state, and its revision for the next compare-and-swap.
    pub async fn load(&self) -> Result<Option<Persisted>, StoreError> {
        let key = self.state_key();
        let resp = self
            .retrying(|mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await
            .map_err(|e| self.etcd_error(e))?;
        let Some(kv) = resp.kvs().first() else {
            *self.revision.lock().expect("revision lock") = 0;
            return Ok(None);
        };
        let state: Persisted =
            serde_json::from_slice(kv.value()).map_err(|e| StoreError::Corrupt {
                key: key.clone(),
                message: e.to_string(),
            })?;
        *self.revision.lock().expect("revision lock") = kv.mod_revision();
        Ok(Some(state))
    }

    /// Writes `state` if this controller still leads and nothing else wrote since its last
    /// read or write. A transaction that fails in transit is sent again (see
    /// [`EtcdStore::retrying`]): the compare-and-swap makes that safe, as a first send that
    /// landed after all makes the next one fail its compare and find this very state stored.
    /// Only an outcome still unknown after [`RETRY_FOR`] is an error, one that ends the
    /// leadership.
    pub async fn save(&self, state: &Persisted) -> Result<(), StoreError> {
        let fence = self
            .fence
            .lock()
            .expect("fence lock")
            .clone()
            .ok_or_else(|| StoreError::NotLeader {
                holder: "another controller (this one was never elected)".into(),
            })?;
        let revision = *self.revision.lock().expect("revision lock");
        let (leader, key) = (self.leader_key(), self.state_key());
        let bytes = serde_json::to_vec(state).expect("the state serializes");
        let txn = Txn::new()
            .when(vec![
                Compare::lease(leader.as_str(), CompareOp::Equal, fence.lease),
                Compare::value(leader.as_str(), CompareOp::Equal, fence.name.as_str()),
                Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
            ])
            .and_then(vec![TxnOp::put(key.as_str(), bytes.clone(), None)])
            .or_else(vec![
                TxnOp::get(leader.as_str(), None),
                TxnOp::get(key.as_str(), None),
            ]);
        let resp = self
            .retrying(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| self.etcd_error(e))?;
        self.outcome(&resp, &fence, revision, &bytes)
    }

    /// Runs an etcd request again, every 50 ms for up to [`RETRY_FOR`], while it fails in
    /// transit: the client spreads requests over every member, and goes on picking one that
    /// died (it refuses at once) among the live ones.
    pub async fn retrying<T, F, Fut>(&self, mut request: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            match request(self.client.clone()).await {
                Err(e) if in_transit(&e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// What a write transaction's answer means.
    fn outcome(
        &self,
        resp: &etcd_client::TxnResponse,
        fence: &Fence,
        revision: i64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        if resp.succeeded() {
            let written = resp.header().map_or(revision, |h| h.revision());
            *self.revision.lock().expect("revision lock") = written;
            return Ok(());
        }
        let gets: Vec<Option<(Vec<u8>, i64, i64)>> = resp
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| (kv.value().to_vec(), kv.lease(), kv.mod_revision())),
                _ => None,
            })
            .collect();
        let holder = gets.first().cloned().flatten();
        let stored = gets.get(1).cloned().flatten();
        match holder {
            Some((name, lease, _)) if name == fence.name.as_bytes() && lease == fence.lease => {
                // Still the leader: either an earlier try of this very write landed, or
                // something else wrote the state.
                match stored {
                    Some((value, _, at)) if value == bytes => {
                        *self.revision.lock().expect("revision lock") = at;
                        Ok(())
                    }
                    _ => Err(StoreError::Conflict),
                }
            }
            Some((name, _, _)) => Err(StoreError::NotLeader {
                holder: String::from_utf8_lossy(&name).into_owned(),
            }),
            None => Err(StoreError::NotLeader {
                holder: "nobody yet (this controller's lease ran out)".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_cut_or_timed_out_in_transit_is_tried_again_and_an_answer_is_not() {
        let status = |code| etcd_client::Error::GRpcStatus(tonic::Status::new(code, "x"));
        // The client's own timeout, while the members elect a leader after theirs died: the
        // request is sent again (before, every change failed for as long as the bench ran).
        assert!(in_transit(&status(tonic::Code::Cancelled)));
        assert!(in_transit(&status(tonic::Code::Unavailable)));
        assert!(in_transit(&status(tonic::Code::DeadlineExceeded)));
        // etcd's answers are final.
        assert!(!in_transit(&status(tonic::Code::FailedPrecondition)));
        assert!(!in_transit(&status(tonic::Code::PermissionDenied)));
    }
}
