//! The operator API behind `sopactl`: link and switch changes for operators, status for
//! operators and viewers.

use std::sync::Arc;

use sopa_channel::{
    identity::{self, Identity},
    proto::{
        self, ChangeReply, HederaStatusReply, HederaStatusRequest, LinkChange, StatusReply,
        StatusRequest, SwitchChange,
    },
};
use tonic::{Request, Response, Status};

use super::Controller;
use crate::{
    audit::Actor,
    auth::{self, DenyList, Peer, Refusal},
    fabric::FabricError,
};

fn to_status(e: FabricError) -> Status {
    match e {
        FabricError::UnknownNode(_) | FabricError::NoLink(..) => Status::not_found(e.to_string()),
        FabricError::NotDurable(_) => Status::unavailable(e.to_string()),
        FabricError::WouldIsolate { .. } => Status::failed_precondition(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

/// The operator API.
pub struct ControlService {
    pub controller: Arc<Controller>,
    pub deny: DenyList,
    /// Served over TLS: a request without a verified identity is refused.
    pub require_identity: bool,
}

impl ControlService {
    /// The caller, if it may do what takes one of `roles`.
    fn authorize<T>(
        &self,
        request: &Request<T>,
        roles: &[identity::Role],
        what: &str,
    ) -> Result<Peer, Status> {
        let peer = request
            .extensions()
            .get::<Peer>()
            .cloned()
            .unwrap_or_default();
        let refusals = &self.controller.refusals;
        if self.require_identity && peer.identity.is_none() {
            let status = Status::unauthenticated("no verified certificate on this connection");
            refusals.refuse(Refusal::NoIdentity, &peer, status.message());
            return Err(status);
        }
        if let Some(serial) = &peer.serial
            && self.deny.contains(serial)
        {
            let status = Status::permission_denied("this certificate is revoked");
            refusals.refuse(Refusal::Revoked, &peer, status.message());
            return Err(status);
        }
        if !auth::allowed(&peer, roles) {
            let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
            let status = Status::permission_denied(format!(
                "{} may not {what}: that takes a certificate of role {}",
                peer.identity
                    .as_ref()
                    .map(Identity::to_string)
                    .unwrap_or_default(),
                names.join(" or ")
            ));
            refusals.refuse(Refusal::Role, &peer, status.message());
            return Err(status);
        }
        Ok(peer)
    }
}

/// Who asks, for the history: the certificate's identity, or (a plaintext controller) the
/// connection's address.
fn actor(peer: &Peer, reason: &str) -> Actor {
    let who = match &peer.identity {
        Some(id) => id.to_string(),
        None if peer.addr.is_empty() => "an unauthenticated client".to_owned(),
        None => format!("an unauthenticated client at {}", peer.addr),
    };
    Actor::new(who, reason)
}

const OPERATORS: &[identity::Role] = &[identity::Role::Operator];
const READERS: &[identity::Role] = &[identity::Role::Operator, identity::Role::Viewer];

#[tonic::async_trait]
impl proto::control::control_server::Control for ControlService {
    async fn set_link(
        &self,
        request: Request<LinkChange>,
    ) -> Result<Response<ChangeReply>, Status> {
        let peer = self.authorize(&request, OPERATORS, "change a link's state")?;
        let change = request.into_inner();
        let link = change
            .link
            .ok_or_else(|| Status::invalid_argument("no link given"))?;
        self.controller
            .set_link_as(
                &actor(&peer, &change.reason),
                &link.a,
                &link.b,
                change.down,
                change.force,
            )
            .await
            .map(Response::new)
            .map_err(to_status)
    }

    async fn set_switch(
        &self,
        request: Request<SwitchChange>,
    ) -> Result<Response<ChangeReply>, Status> {
        let peer = self.authorize(&request, OPERATORS, "change a switch's state")?;
        let change = request.into_inner();
        self.controller
            .set_switch_as(
                &actor(&peer, &change.reason),
                &change.name,
                change.down,
                change.force,
            )
            .await
            .map(Response::new)
            .map_err(to_status)
    }

    async fn set_trust(
        &self,
        request: Request<proto::TrustChange>,
    ) -> Result<Response<ChangeReply>, Status> {
        let peer = self.authorize(&request, OPERATORS, "trust a link")?;
        let change = request.into_inner();
        let link = change
            .link
            .ok_or_else(|| Status::invalid_argument("no link given"))?;
        self.controller
            .set_trust_as(
                &actor(&peer, &change.reason),
                &link.a,
                &link.b,
                change.trust,
            )
            .await
            .map(Response::new)
            .map_err(to_status)
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusReply>, Status> {
        self.authorize(&request, READERS, "read the status")?;
        Ok(Response::new(self.controller.status()))
    }

    async fn revoke(
        &self,
        request: Request<proto::RevokeRequest>,
    ) -> Result<Response<ChangeReply>, Status> {
        let peer = self.authorize(&request, OPERATORS, "revoke a certificate")?;
        let r = request.into_inner();
        self.controller
            .revoke_as(&actor(&peer, &r.reason), &r.serial)
            .await
            .map(Response::new)
            .map_err(to_status)
    }

    async fn history(
        &self,
        request: Request<proto::HistoryRequest>,
    ) -> Result<Response<proto::HistoryReply>, Status> {
        self.authorize(&request, READERS, "read the history")?;
        let limit = request.into_inner().limit as usize;
        let entries = self
            .controller
            .history(limit)
            .into_iter()
            .map(|r| proto::HistoryEntry {
                version: r.version,
                unix_ms: r.unix_ms,
                who: r.who,
                what: r.what,
                reason: r.reason,
            })
            .collect();
        Ok(Response::new(proto::HistoryReply { entries }))
    }

    async fn hedera_status(
        &self,
        request: Request<HederaStatusRequest>,
    ) -> Result<Response<HederaStatusReply>, Status> {
        self.authorize(&request, READERS, "read Hedera's status")?;
        Ok(Response::new(self.controller.hedera_status()))
    }
}
