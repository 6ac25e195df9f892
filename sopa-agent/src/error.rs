//! The agent's errors. Configuration errors (bad input from a file or a flag) exit with 64,
//! missing privileges with 77 (sysexits' EX_USAGE/EX_CONFIG family and EX_NOPERM).

use std::{io, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("path table {path}: {message}")]
    PathTable { path: PathBuf, message: String },

    #[error(
        "interface {0:?} does not exist in this network namespace; list the interfaces with `ip link`"
    )]
    UnknownInterface(String),

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error(
        "another agent for node {node:?} is running (pid {pid}); stop it, choose another --node, or take over from it in place with --takeover"
    )]
    AlreadyRunning { node: String, pid: u32 },

    #[error(
        "--takeover: this agent's datapath did not load, so agent {pid} keeps running and \
         nothing was handed over: {source}"
    )]
    TakeoverRefused {
        pid: u32,
        #[source]
        source: Box<Error>,
    },

    #[error("{0}: run as root (or with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN)")]
    Privileges(String),

    #[error(
        "no agent state for node {node:?} at {dir}: is `sopa-agent run --node {node}` running?"
    )]
    NotRunning { node: String, dir: PathBuf },

    #[error("bpffs is not mounted at /sys/fs/bpf; mount it with `mount -t bpf bpf /sys/fs/bpf`")]
    NoBpffs,

    #[error("loading the eBPF object: {0}")]
    Ebpf(Box<aya::EbpfError>),

    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },

    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },

    #[error("netlink: {context}: {source}")]
    Netlink {
        context: String,
        #[source]
        source: Box<rtnetlink::Error>,
    },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::PathTable { .. }
            | Self::UnknownInterface(_)
            | Self::Config(_)
            | Self::AlreadyRunning { .. }
            | Self::NotRunning { .. } => 64,
            Self::Privileges(_) => 77,
            Self::TakeoverRefused { source, .. } => source.exit_code(),
            _ => 1,
        }
    }

    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::PermissionDenied {
            return Self::Privileges(format!("{}: {source}", context.into()));
        }
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub fn program(name: &'static str) -> impl Fn(aya::programs::ProgramError) -> Self {
        move |source| Self::Program {
            name,
            source: Box::new(source),
        }
    }

    pub fn map(name: &'static str) -> impl Fn(aya::maps::MapError) -> Self {
        move |source| Self::Map {
            name,
            source: Box::new(source),
        }
    }

    pub fn netlink(context: impl Into<String>, source: rtnetlink::Error) -> Self {
        Self::Netlink {
            context: context.into(),
            source: Box::new(source),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
