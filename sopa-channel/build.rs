//! Generates the gRPC service glue for the push channel and the operator API. The messages are
//! plain `prost` derives in `src/proto.rs`, so no protoc is needed.

fn method(
    name: &str,
    route: &str,
    input: &str,
    output: &str,
) -> tonic_build::manual::MethodBuilder {
    tonic_build::manual::Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::proto::{input}"))
        .output_type(format!("crate::proto::{output}"))
        .codec_path("tonic_prost::ProstCodec")
}

fn main() {
    let channel = tonic_build::manual::Service::builder()
        .name("Channel")
        .package("sopa.channel.v1")
        .method(
            method("stream", "Stream", "AgentMessage", "ControllerMessage")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .build();
    let control = tonic_build::manual::Service::builder()
        .name("Control")
        .package("sopa.channel.v1")
        .method(method("set_link", "SetLink", "LinkChange", "ChangeReply").build())
        .method(method("set_switch", "SetSwitch", "SwitchChange", "ChangeReply").build())
        .method(method("status", "Status", "StatusRequest", "StatusReply").build())
        .method(method("set_trust", "SetTrust", "TrustChange", "ChangeReply").build())
        .method(method("history", "History", "HistoryRequest", "HistoryReply").build())
        .method(method("revoke", "Revoke", "RevokeRequest", "ChangeReply").build())
        .method(
            method(
                "hedera_status",
                "HederaStatus",
                "HederaStatusRequest",
                "HederaStatusReply",
            )
            .build(),
        )
        .build();
    tonic_build::manual::Builder::new().compile(&[channel, control]);
}
