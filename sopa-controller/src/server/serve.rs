//! Serving both gRPC services with TLS, health, the deny list and the background tasks tied
//! to the server's life.

use std::{sync::Arc, time::Duration};

use sopa_channel::proto::{self};

use crate::{
    auth::DenyList,
    transport::{self, ServerTls},
};

use super::{ChannelService, ControlService, Controller, Listener};

/// Serves both services on `listener` until `shutdown` resolves. With `tls`, only clients
/// whose certificate verifies against the fabric's CA, names a node and is not revoked get
/// through the handshake, and each is held to its role.
pub async fn serve(
    controller: Arc<Controller>,
    listener: impl Into<Listener>,
    tls: Option<ServerTls>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let deny = tls.as_ref().map_or_else(DenyList::none, |t| t.deny.clone());
    let _reload_deny_list = deny.watch(Duration::from_secs(1)).map(AbortOnDrop);
    // The serials revoked in the state (every replica's the same), with the file's.
    let _follow_revoked = {
        let (deny, mut revoked) = (deny.clone(), controller.revoked());
        deny.set_stored(&revoked.borrow_and_update());
        AbortOnDrop(tokio::spawn(async move {
            while revoked.changed().await.is_ok() {
                let now = revoked.borrow_and_update().clone();
                deny.set_stored(&now);
            }
        }))
    };
    let _reload_own_certificate = tls
        .as_ref()
        .map(|t| AbortOnDrop(t.own.watch(Duration::from_secs(1))));
    let mut builder = tonic::transport::Server::builder()
        // A client that vanished (power loss, a cut link) is found by its missed heartbeats,
        // and its connection closed by unanswered HTTP/2 pings, not after TCP's 15 minutes.
        .http2_keepalive_interval(Some(sopa_channel::client::KEEPALIVE))
        .http2_keepalive_timeout(Some(sopa_channel::client::KEEPALIVE));
    let require_identity = tls.is_some();
    let channel = proto::channel::channel_server::ChannelServer::new(ChannelService {
        controller: Arc::clone(&controller),
        deny: deny.clone(),
        require_identity,
    })
    .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
    .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    let scheduler = tokio::spawn(Arc::clone(&controller).run_hedera());
    let _stop_scheduler = AbortOnDrop(scheduler);
    let suspicions = tokio::spawn(Arc::clone(&controller).run_suspicions());
    let _stop_suspicions = AbortOnDrop(suspicions);
    // The hosts that have not reconnected when this controller's start-up grace ends stop
    // being live.
    let startup = {
        let c = Arc::clone(&controller);
        tokio::spawn(async move {
            tokio::time::sleep(c.agent_grace.saturating_sub(c.started.elapsed())).await;
            c.publish_peers();
        })
    };
    let _stop_startup = AbortOnDrop(startup);
    let incoming = transport::incoming(
        listener.into(),
        tls.as_ref(),
        controller.limits,
        Arc::clone(&controller.refusals),
    );
    let control = proto::control::control_server::ControlServer::new(ControlService {
        controller,
        deny,
        require_identity,
    })
    .max_decoding_message_size(proto::MAX_MESSAGE_BYTES)
    .max_encoding_message_size(proto::MAX_MESSAGE_BYTES);
    // grpc.health.v1: SERVING for the server ("") and each service while this replica leads
    // (a standby binds nothing; it answers on its metrics address, GET /readyz).
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<proto::channel::channel_server::ChannelServer<ChannelService>>()
        .await;
    health
        .set_serving::<proto::control::control_server::ControlServer<ControlService>>()
        .await;
    builder
        .add_service(health_service)
        .add_service(channel)
        .add_service(control)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Ends a task when the server it belongs to returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
