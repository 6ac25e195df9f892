//! The fabric model every part of SOPA shares: an operator's Clos fabric from an inventory file,
//! and the Fat-Tree (Al-Fares) and MODRIC topologies of the papers, as graphs of nodes, ports
//! and links with their addressing; the candidate paths of a host
//! (hop bytes and the exact links each crosses), recomputed incrementally under link and switch
//! failures; the papers' structural properties computed on the graph; and MODRIC's cost model.

pub mod clos;
pub mod cost;
pub mod entropy;
pub mod failover;
pub mod fat_tree;
pub mod forwarding;
pub mod graph;
pub mod inventory;
pub mod modric;
pub mod paths;
pub mod prefix;
pub mod prefix6;
pub mod properties;
pub mod srv6;
pub mod srv6_failover;
pub mod topology;

pub use graph::{Graph, LinkId, NodeId, NodeKind, Speed};
pub use paths::{Hops, PathTable};
pub use prefix::Prefix;
pub use topology::Topology;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("invalid topology: {0}")]
    Invalid(String),
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    #[error("no link between {0} and {1}")]
    NoLink(String, String),
    #[error("{0} is not a host")]
    NotAHost(String),
    #[error("{0}")]
    Inventory(#[from] inventory::Refusals),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
