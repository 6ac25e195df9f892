//! The agent's errors, each with its exit code (`sopa_ops::exit`): configuration (bad input
//! from a file or a flag, or the node's state refuses it) 78, a kernel feature the
//! configuration needs and this kernel lacks 69, missing privileges 77, anything else 1.

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

    /// The configuration asks for a kernel feature this kernel lacks.
    #[error("{0}")]
    Kernel(String),

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
            | Self::NotRunning { .. } => sopa_ops::exit::CONFIG,
            Self::Kernel(_) | Self::NoBpffs => sopa_ops::exit::KERNEL,
            Self::Privileges(_) => sopa_ops::exit::PRIVILEGES,
            Self::TakeoverRefused { source, .. } => source.exit_code(),
            _ => sopa_ops::exit::FAILURE,
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
