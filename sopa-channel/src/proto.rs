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
    #[prost(oneof = "agent_message::Kind", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9")]
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
        #[prost(message, tag = "6")]
        Flows(super::FlowReport),
        #[prost(message, tag = "7")]
        PinAck(super::PinAck),
        #[prost(message, tag = "8")]
        Paths(super::PathReport),
        #[prost(message, tag = "9")]
        Neighbours(super::NeighbourReport),
    }

    impl From<super::NeighbourReport> for Kind {
        fn from(r: super::NeighbourReport) -> Self {
            Self::Neighbours(r)
        }
    }

    impl From<super::PathReport> for Kind {
        fn from(r: super::PathReport) -> Self {
            Self::Paths(r)
        }
    }

    impl From<super::LinkReport> for Kind {
        fn from(r: super::LinkReport) -> Self {
            Self::Report(r)
        }
    }

    impl From<super::FlowReport> for Kind {
        fn from(r: super::FlowReport) -> Self {
            Self::Flows(r)
        }
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
    /// The node's name in the topology, when it differs from `node` (which names the agent).
    #[prost(string, tag = "6")]
    pub topology_name: String,
    /// How often the agent sends a heartbeat; the controller counts it gone after three
    /// silent intervals (0: an agent from before this field, taken as 1 s).
    #[prost(uint32, tag = "7")]
    pub heartbeat_ms: u32,
    /// What the agent does without features its kernel lacks, one `feature: instead` each
    /// (at most [`MAX_FALLBACKS`]); empty from an agent before this field.
    #[prost(string, repeated, tag = "8")]
    pub fallbacks: Vec<String>,
    /// A host agent's path-meter clock now (period, epoch; zero: none yet): one that is not
    /// the controller's gets a snapshot, which carries the controller's, rather than deltas.
    #[prost(uint32, tag = "9")]
    pub meter_period_ms: u32,
    #[prost(uint64, tag = "10")]
    pub meter_epoch_ns: u64,
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
    /// The sender's heartbeat interval in milliseconds (0: a sender from before this field).
    /// The controller sends a heartbeat first thing in every session, so an agent learns how
    /// long the controller may stay silent before it counts the stream lost.
    #[prost(uint32, tag = "2")]
    pub interval_ms: u32,
}

/// What an agent's LLDP hears on its ports: the whole table, sent whenever it changes and at
/// every new session. A switch's is compared with the inventory (a port cabled otherwise
/// keeps its link out of every path); a host's is shown, never acted on.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NeighbourReport {
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<PortNeighbour>,
    /// The agent's own addresses on those ports (a host's, for `sopactl fabric discover`).
    #[prost(string, repeated, tag = "2")]
    pub addresses: Vec<String>,
}

/// Who is cabled to one port, as their LLDP frames say.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, prost::Message)]
pub struct PortNeighbour {
    /// The reporting node's port (its interface name).
    #[prost(string, tag = "1")]
    pub port: String,
    /// The neighbour's name and port.
    #[prost(string, tag = "2")]
    pub chassis: String,
    #[prost(string, tag = "3")]
    pub remote_port: String,
}

/// A port cabled otherwise than the inventory says.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Miscabled {
    /// `node:port` where it was seen.
    #[prost(string, tag = "1")]
    pub at: String,
    /// `node:port` its LLDP names.
    #[prost(string, tag = "2")]
    pub seen: String,
    /// `node:port` the inventory says (empty: the inventory has no link at this port).
    #[prost(string, tag = "3")]
    pub expected: String,
    /// The inventory's link at this port, kept out of every path while a switch says so.
    #[prost(message, optional, tag = "4")]
    pub link: Option<LinkRef>,
}

/// One agent's LLDP table, as reported.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NeighbourSeen {
    #[prost(string, tag = "1")]
    pub node: String,
    #[prost(enumeration = "Role", tag = "2")]
    pub role: i32,
    #[prost(message, repeated, tag = "3")]
    pub ports: Vec<PortNeighbour>,
    #[prost(string, repeated, tag = "4")]
    pub addresses: Vec<String>,
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

/// A host agent's path meter for one period of alternate marking: the packets it sent to and
/// received from each peer rack in that period, per path. Sent for every period, empty when
/// nothing moved, so the controller knows which hosts' counts it has. Per (rack, path), never
/// per flow or per host: its size is bounded by the racks the host talks to times their paths.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PathReport {
    /// The period's index: TAI time since `epoch_ns` divided by `period_ms`.
    #[prost(uint64, tag = "1")]
    pub period: u64,
    #[prost(uint32, tag = "2")]
    pub period_ms: u32,
    #[prost(message, repeated, tag = "3")]
    pub sent: Vec<PeerPaths>,
    #[prost(message, repeated, tag = "4")]
    pub received: Vec<PeerPaths>,
    /// The host's counts of this period are not to be judged: some packets could not be
    /// counted (the meter's table was full), or the datapath did not spray every flow evenly
    /// over its paths (a mode other than `sopa`), where congestion reads like a gray link.
    #[prost(bool, tag = "5")]
    pub incomplete: bool,
    /// The TAI nanosecond that `period` counts from: the meter clock's epoch, as the
    /// controller's snapshot gave it (0: the TAI epoch, an agent without a controller's clock).
    #[prost(uint64, tag = "6")]
    pub epoch_ns: u64,
}

/// One peer rack's packets on each path, in two parallel packed arrays.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerPaths {
    /// The rack's prefix address, as the u32 of its four octets read big-endian.
    #[prost(fixed32, tag = "1")]
    pub rack: u32,
    /// Each path as `hop0 | hop1 << 8`.
    #[prost(uint32, repeated, tag = "2")]
    pub hops: Vec<u32>,
    #[prost(uint64, repeated, tag = "3")]
    pub packets: Vec<u64>,
    /// What the packets took on the wire, in bytes, parallel to `packets`: the sender's only
    /// (a link's load is what was sent onto it). Empty from an agent that counts no bytes; the
    /// controller then takes its packets as full-size.
    #[prost(uint64, repeated, tag = "4")]
    pub bytes: Vec<u64>,
}

/// The most peer racks one path report may name per direction.
pub const MAX_REPORT_RACKS: usize = 65_536;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ControllerMessage {
    #[prost(oneof = "controller_message::Kind", tags = "1, 2, 3, 4, 5")]
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
        #[prost(message, tag = "4")]
        Pins(super::PinSet),
        #[prost(message, tag = "5")]
        Peers(super::PeerAgents),
    }
}

/// The host agents as the controller sees them. Sent to every agent on connect, before
/// anything else, and whenever either set changes.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PeerAgents {
    /// Topology names of the hosts whose agent the controller has seen and lost: they receive
    /// packets with the option still on (delivery goes on, the stack ignores it) and measure
    /// no reordering.
    #[prost(string, repeated, tag = "1")]
    pub down: Vec<String>,
    /// Topology names of the hosts whose agent is connected, or left less than the
    /// controller's grace period ago (a restart keeps its datapath): switches honour the
    /// option only on ports facing these hosts. Sent to switch agents only: a host agent
    /// receives it empty, and a message only when `down` changes.
    #[prost(string, repeated, tag = "2")]
    pub live: Vec<String>,
}

/// A flow's 5-tuple: addresses as the u32 of their four octets read big-endian, ports in host
/// order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message)]
pub struct FiveTuple {
    #[prost(fixed32, tag = "1")]
    pub saddr: u32,
    #[prost(fixed32, tag = "2")]
    pub daddr: u32,
    #[prost(uint32, tag = "3")]
    pub sport: u32,
    #[prost(uint32, tag = "4")]
    pub dport: u32,
    #[prost(uint32, tag = "5")]
    pub proto: u32,
}

impl FiveTuple {
    /// `tcp 10.0.0.2:5001 -> 10.2.0.3:80`, as logs and `sopactl hedera` show a flow.
    pub fn name(&self) -> String {
        let proto = match self.proto {
            6 => "tcp",
            17 => "udp",
            _ => "?",
        };
        format!(
            "{proto} {}:{} -> {}:{}",
            std::net::Ipv4Addr::from(self.saddr),
            self.sport,
            std::net::Ipv4Addr::from(self.daddr),
            self.dport
        )
    }
}

/// The most elephants one flow report may carry (the datapath pins at most 16,384 flows).
pub const MAX_FLOWS: usize = 16_384;

/// A host agent's elephants of the last interval (Hedera): the flows it sent at 10% of its NIC
/// rate or more.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FlowReport {
    #[prost(uint32, tag = "1")]
    pub interval_ms: u32,
    /// The sending host's NIC rate, the unit of every demand.
    #[prost(uint64, tag = "2")]
    pub nic_bps: u64,
    #[prost(message, repeated, tag = "3")]
    pub flows: Vec<FlowSample>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FlowSample {
    #[prost(message, optional, tag = "1")]
    pub flow: Option<FiveTuple>,
    /// Bits per second over the last interval.
    #[prost(uint64, tag = "2")]
    pub rate_bps: u64,
    /// Bytes sent since the flow started.
    #[prost(uint64, tag = "3")]
    pub bytes: u64,
}

/// The controller's placements for one host agent: exactly the flows to pin, each with its
/// path. Every round sends the whole set again, refreshing each pin's lifetime.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PinSet {
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// How long the pins hold without a newer set.
    #[prost(uint32, tag = "2")]
    pub lifetime_ms: u32,
    #[prost(message, repeated, tag = "3")]
    pub pins: Vec<FlowPin>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FlowPin {
    #[prost(message, optional, tag = "1")]
    pub flow: Option<FiveTuple>,
    #[prost(uint32, tag = "2")]
    pub hop0: u32,
    #[prost(uint32, tag = "3")]
    pub hop1: u32,
}

/// The agent's answer to a pin set: applied (empty error) or refused whole.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PinAck {
    #[prost(uint64, tag = "1")]
    pub round: u64,
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HederaStatusRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Elephant {
    #[prost(message, optional, tag = "1")]
    pub flow: Option<FiveTuple>,
    #[prost(string, tag = "2")]
    pub src: String,
    #[prost(string, tag = "3")]
    pub dst: String,
    /// Measured rate and estimated natural demand, as fractions of the sender's NIC rate.
    #[prost(double, tag = "4")]
    pub measured: f64,
    #[prost(double, tag = "5")]
    pub demand: f64,
    #[prost(bool, tag = "6")]
    pub placed: bool,
    #[prost(uint32, tag = "7")]
    pub hop0: u32,
    #[prost(uint32, tag = "8")]
    pub hop1: u32,
    /// The placed path's switches, e.g. "e0 a0 c0 a2 e2".
    #[prost(string, tag = "9")]
    pub path: String,
    /// The round the flow was placed in.
    #[prost(uint64, tag = "10")]
    pub since_round: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HederaAgent {
    #[prost(string, tag = "1")]
    pub node: String,
    #[prost(uint64, tag = "2")]
    pub reports: u64,
    #[prost(uint64, tag = "3")]
    pub reports_refused: u64,
    #[prost(uint64, tag = "4")]
    pub pins_refused: u64,
    #[prost(string, tag = "5")]
    pub last_error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HederaStatusReply {
    #[prost(uint64, tag = "1")]
    pub round: u64,
    #[prost(uint32, tag = "2")]
    pub interval_ms: u32,
    #[prost(message, repeated, tag = "3")]
    pub elephants: Vec<Elephant>,
    #[prost(message, repeated, tag = "4")]
    pub agents: Vec<HederaAgent>,
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
    /// How the hosts carry the path (`sopa_topology::srv6::Encoding`): `ipv4-option`, `srv6`;
    /// empty (a controller older than the SRv6 encoding) is `ipv4-option`.
    #[prost(string, tag = "6")]
    pub encoding: String,
    /// The path meter's clock, which every host agent numbers and colors its periods by (one
    /// that a flag overrides has its reports refused): the period in milliseconds (0: a
    /// controller older than the meter's clock; the agent keeps its own), and the TAI
    /// nanosecond period 0 begins at, a multiple of two periods (so a host that adopts it
    /// keeps its period boundaries and colors; only the numbers change).
    #[prost(uint32, tag = "7")]
    pub meter_period_ms: u32,
    #[prost(uint64, tag = "8")]
    pub meter_epoch_ns: u64,
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
    /// An operator's request only: why (kept in the history), and whether a drain that leaves
    /// two racks with no path between them is made anyway.
    #[prost(string, tag = "3")]
    pub reason: String,
    #[prost(bool, tag = "4")]
    pub force: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SwitchChange {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(bool, tag = "2")]
    pub down: bool,
    /// As [`LinkChange`]'s.
    #[prost(string, tag = "3")]
    pub reason: String,
    #[prost(bool, tag = "4")]
    pub force: bool,
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
    /// The agent's fallbacks, as its hello said them.
    #[prost(string, repeated, tag = "9")]
    pub fallbacks: Vec<String>,
    /// A version this connected agent neither acknowledged nor refused within the meter's
    /// bound (0: none): the path meter judges without waiting for it until it acknowledges.
    #[prost(uint64, tag = "10")]
    pub lagging_version: u64,
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
    /// Clients refused since the controller started, by reason (`role`, `impersonation`, ...).
    #[prost(message, repeated, tag = "7")]
    pub refusals: Vec<RefusalCount>,
    /// The links of `down_links` an operator drained (the others their switch reported down).
    #[prost(message, repeated, tag = "8")]
    pub drained_links: Vec<LinkRef>,
    /// Flapping links held down, whatever their switch reports, for the time left.
    #[prost(message, repeated, tag = "9")]
    pub held_links: Vec<HeldLink>,
    /// Where the controller keeps its state (`memory`, `file:PATH`, `etcd:ENDPOINTS ...`).
    #[prost(string, tag = "10")]
    pub store: String,
    /// With replicas on etcd, the name of the replica that answered, which leads (replicas
    /// that do not lead serve nothing); empty for a single controller.
    #[prost(string, tag = "11")]
    pub leader: String,
    /// Changes (an operator's, a switch's report) refused since the controller started because
    /// they could not be stored.
    #[prost(uint64, tag = "12")]
    pub changes_not_stored: u64,
    /// Links the path meter found losing packets, drained until their hold-down ends.
    #[prost(message, repeated, tag = "13")]
    pub suspect_links: Vec<SuspectLink>,
    /// Links an operator trusts: never drained on the path meter's evidence.
    #[prost(message, repeated, tag = "14")]
    pub trusted_links: Vec<LinkRef>,
    /// The path meter's judgement of every link that carried metered packets in the last
    /// window, worst first (at most 64).
    #[prost(message, repeated, tag = "15")]
    pub link_loss: Vec<LinkLoss>,
    /// Hosts whose path reports the meter sets aside now: refused (another period length,
    /// a clock off the controller's, paths the topology lacks, too many reports) or
    /// inconsistent (claims its own spraying cannot produce).
    #[prost(message, repeated, tag = "16")]
    pub meter_hosts: Vec<MeterHost>,
    /// Ports whose LLDP neighbour is not the inventory's (an inventory's fabric only).
    #[prost(message, repeated, tag = "17")]
    pub miscabled: Vec<Miscabled>,
    /// Every agent's LLDP table.
    #[prost(message, repeated, tag = "18")]
    pub neighbours: Vec<NeighbourSeen>,
}

/// A host whose path reports the meter sets aside, and why.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MeterHost {
    #[prost(string, tag = "1")]
    pub host: String,
    /// The reason, as the refusal metric's label (`period`, `clock`, `topology`,
    /// `implausible`, `rate`, `inconsistent`, ...).
    #[prost(string, tag = "2")]
    pub reason: String,
    /// What its last such report said, in words.
    #[prost(string, tag = "3")]
    pub detail: String,
    /// Its reports set aside since the controller started.
    #[prost(uint64, tag = "4")]
    pub reports: u64,
    /// How long ago the last one came.
    #[prost(uint64, tag = "5")]
    pub last_ms_ago: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SuspectLink {
    #[prost(message, optional, tag = "1")]
    pub link: Option<LinkRef>,
    /// The loss that convicted it (lost / sent over the window that did).
    #[prost(double, tag = "2")]
    pub loss: f64,
    #[prost(uint64, tag = "3")]
    pub lost: u64,
    #[prost(uint64, tag = "4")]
    pub sent: u64,
    /// Until it is trusted again.
    #[prost(uint64, tag = "5")]
    pub remaining_ms: u64,
    /// Times it was found lossy within the memory of the hold-down (each doubles the hold).
    #[prost(uint32, tag = "6")]
    pub strikes: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinkLoss {
    /// The direction measured: from `a` to `b`.
    #[prost(message, optional, tag = "1")]
    pub link: Option<LinkRef>,
    #[prost(uint64, tag = "2")]
    pub sent: u64,
    #[prost(uint64, tag = "3")]
    pub lost: u64,
    /// The share of the link's rate (`--link-rate-mbit`) its metered bytes took over the window.
    #[prost(double, tag = "4")]
    pub load: f64,
    /// Its load passes `--max-load`, so the meter does not judge it (a full queue's drops
    /// would read as a gray link's).
    #[prost(bool, tag = "5")]
    pub over_load: bool,
}

/// An operator's word on a link the path meter judges: `trust` clears a suspicion and keeps
/// the link from being drained on the meter's evidence; `trust = false` hands it back to the
/// meter.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrustChange {
    #[prost(message, optional, tag = "1")]
    pub link: Option<LinkRef>,
    #[prost(bool, tag = "2")]
    pub trust: bool,
    /// Why (kept in the history).
    #[prost(string, tag = "3")]
    pub reason: String,
}

/// A certificate to revoke, by serial, and why.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RevokeRequest {
    #[prost(string, tag = "1")]
    pub serial: String,
    #[prost(string, tag = "2")]
    pub reason: String,
}

/// The newest changes to ask for (0: every one kept).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HistoryRequest {
    #[prost(uint32, tag = "1")]
    pub limit: u32,
}

/// One change to the fabric: its version, when, who made it (an operator's identity, a
/// switch, the path meter), what it was and why.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HistoryEntry {
    #[prost(uint64, tag = "1")]
    pub version: u64,
    #[prost(uint64, tag = "2")]
    pub unix_ms: u64,
    #[prost(string, tag = "3")]
    pub who: String,
    #[prost(string, tag = "4")]
    pub what: String,
    #[prost(string, tag = "5")]
    pub reason: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HistoryReply {
    /// Oldest first.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<HistoryEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeldLink {
    #[prost(message, optional, tag = "1")]
    pub link: Option<LinkRef>,
    #[prost(uint64, tag = "2")]
    pub remaining_ms: u64,
    /// Its switch reports it up: it comes back when the hold ends.
    #[prost(bool, tag = "3")]
    pub up_pending: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RefusalCount {
    #[prost(string, tag = "1")]
    pub reason: String,
    #[prost(uint64, tag = "2")]
    pub count: u64,
}

/// The longest text an agent's message may carry in a field the controller keeps (a NACK's
/// error, an agent's version); longer ones are cut there.
pub const MAX_TEXT_BYTES: usize = 512;

/// The most fallbacks a hello may list (each at most [`MAX_TEXT_BYTES`]).
pub const MAX_FALLBACKS: usize = 16;

/// Cuts `s` to at most `max` bytes, at a character boundary.
pub fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl Hello {
    /// Why a hello's fields are out of bounds, if they are: the node name 1 to
    /// [`crate::identity::MAX_NODE_LEN`] bytes, the topology name at most that, the agent
    /// version at most [`MAX_TEXT_BYTES`], at most [`MAX_FALLBACKS`] fallbacks of at most
    /// [`MAX_TEXT_BYTES`] each.
    pub fn check_fields(&self) -> Result<(), String> {
        use crate::identity::MAX_NODE_LEN;
        if self.node.is_empty()
            || self.node.len() > MAX_NODE_LEN
            || self.topology_name.len() > MAX_NODE_LEN
            || self.agent_version.len() > MAX_TEXT_BYTES
            || self.fallbacks.len() > MAX_FALLBACKS
            || self.fallbacks.iter().any(|f| f.len() > MAX_TEXT_BYTES)
        {
            return Err(format!(
                "hello: the node name must be 1 to {MAX_NODE_LEN} bytes, the topology name at most {MAX_NODE_LEN}, the agent version at most {MAX_TEXT_BYTES}, at most {MAX_FALLBACKS} fallbacks of at most {MAX_TEXT_BYTES} each"
            ));
        }
        Ok(())
    }
}
