//! The push channel's messages (package `sopa.channel.v1`), in the convention of Envoy xDS and
//! gNMI: the agent says hello, the controller answers with a snapshot and then deltas, the agent
//! acknowledges or rejects each version. Field numbers are the wire contract: never reuse one.

pub mod channel {
    include!(concat!(env!("OUT_DIR"), "/sopa.channel.v1.Channel.rs"));
}
pub mod control {
    include!(concat!(env!("OUT_DIR"), "/sopa.channel.v1.Control.rs"));
}

/// The largest message either side accepts (a k=64 Fat-Tree snapshot is far below it).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Role {
    Unspecified = 0,
    Host = 1,
    Switch = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentMessage {
    #[prost(oneof = "agent_message::Kind", tags = "1, 2, 3, 4, 5")]
    pub kind: Option<agent_message::Kind>,
}

pub mod agent_message {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Hello(super::Hello),
        #[prost(message, tag = "2")]
        Ack(super::Ack),
        #[prost(message, tag = "3")]
        Nack(super::Nack),
        #[prost(message, tag = "4")]
        Heartbeat(super::Heartbeat),
        #[prost(message, tag = "5")]
        Report(super::LinkReport),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Hello {
    #[prost(string, tag = "1")]
    pub node: String,
    #[prost(enumeration = "Role", tag = "2")]
    pub role: i32,
    /// The epoch and version the agent last applied (0, 0 when it has nothing).
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    #[prost(uint64, tag = "4")]
    pub version: u64,
    #[prost(string, tag = "5")]
    pub agent_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub version: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Nack {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub version: u64,
    #[prost(string, tag = "3")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Heartbeat {
    #[prost(uint64, tag = "1")]
    pub unix_ms: u64,
}

/// A switch agent's observation of one of its ports.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinkReport {
    #[prost(string, tag = "1")]
    pub a: String,
    #[prost(string, tag = "2")]
    pub b: String,
    #[prost(bool, tag = "3")]
    pub down: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ControllerMessage {
    #[prost(oneof = "controller_message::Kind", tags = "1, 2, 3")]
    pub kind: Option<controller_message::Kind>,
}

pub mod controller_message {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Snapshot(super::Snapshot),
        #[prost(message, tag = "2")]
        Delta(super::Delta),
        #[prost(message, tag = "3")]
        Heartbeat(super::Heartbeat),
    }
}

/// A link by its two node names.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message)]
pub struct LinkRef {
    #[prost(string, tag = "1")]
    pub a: String,
    #[prost(string, tag = "2")]
    pub b: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Snapshot {
    /// Changes on every controller start: a new epoch means a fresh snapshot.
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub version: u64,
    /// The topology spec as JSON (`sopa_topology::topology::TopologySpec`).
    #[prost(string, tag = "3")]
    pub topology: String,
    #[prost(message, repeated, tag = "4")]
    pub down_links: Vec<LinkRef>,
    #[prost(string, repeated, tag = "5")]
    pub down_switches: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Change {
    #[prost(oneof = "change::Kind", tags = "1, 2")]
    pub kind: Option<change::Kind>,
}

pub mod change {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Link(super::LinkChange),
        #[prost(message, tag = "2")]
        Switch(super::SwitchChange),
    }
}

/// One version's changes, to be applied on top of `base_version`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Delta {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub version: u64,
    #[prost(uint64, tag = "3")]
    pub base_version: u64,
    #[prost(message, repeated, tag = "4")]
    pub changes: Vec<Change>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinkChange {
    #[prost(message, optional, tag = "1")]
    pub link: Option<LinkRef>,
    #[prost(bool, tag = "2")]
    pub down: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SwitchChange {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(bool, tag = "2")]
    pub down: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChangeReply {
    /// The version the change became (the current one when it changed nothing).
    #[prost(uint64, tag = "1")]
    pub version: u64,
    #[prost(bool, tag = "2")]
    pub changed: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AgentStatus {
    #[prost(string, tag = "1")]
    pub node: String,
    #[prost(enumeration = "Role", tag = "2")]
    pub role: i32,
    #[prost(bool, tag = "3")]
    pub connected: bool,
    #[prost(uint64, tag = "4")]
    pub applied_version: u64,
    #[prost(uint64, tag = "5")]
    pub last_ack: u64,
    #[prost(uint64, tag = "6")]
    pub last_nack: u64,
    #[prost(string, tag = "7")]
    pub last_error: String,
    #[prost(string, tag = "8")]
    pub agent_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusReply {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub version: u64,
    #[prost(string, tag = "3")]
    pub topology: String,
    #[prost(message, repeated, tag = "4")]
    pub down_links: Vec<LinkRef>,
    #[prost(string, repeated, tag = "5")]
    pub down_switches: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub agents: Vec<AgentStatus>,
}
