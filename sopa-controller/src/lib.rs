//! The SOPA controller: it owns the topology and its link and switch states, versions every
//! change, and pushes snapshots and deltas to every agent over the channel.

pub mod client;
pub mod fabric;
pub mod hedera;
pub mod proto;
pub mod server;
pub mod tls;
pub mod view;
