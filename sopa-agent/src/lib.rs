//! The SOPA agent: loads the datapath programs, owns the path table, changes the host settings
//! the datapath needs (and restores them), and exports what the datapath counts.

pub mod changes;
pub mod channel;
pub mod datapath;
pub mod entropy;
pub mod error;
pub mod granularity;
pub mod hedera;
pub mod host;
pub mod lldp;
pub mod meter;
pub mod metrics;
pub mod netlink;
pub mod path_table;
pub mod probe;
pub mod routes;
pub mod runtime;
pub mod srv6;
pub mod status;
pub mod switch;
pub mod sysctl;

pub use error::Error;

/// Where the agents of one machine pin their maps: one folder per node.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf/sopa";
/// Where a running agent records what it changed on the host, one folder per node.
pub const RUN_ROOT: &str = "/run/sopa";
