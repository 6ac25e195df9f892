//! The SOPA controller: it owns the topology and its link and switch states, versions every
//! change, and pushes snapshots and deltas to every agent over the channel (`sopa-channel`).
//! It holds every client to the node and role its certificate names.

pub mod audit;
pub mod auth;
pub mod cabling;
pub mod certs;
pub mod damping;
pub mod election;
pub mod fabric;
pub mod fdlimit;
pub mod hedera;
pub mod isolation;
pub mod meter;
pub mod metrics;
pub mod own_cert;
pub mod server;
pub mod store;
pub mod suspicion;
pub mod tomography;
pub mod transport;
