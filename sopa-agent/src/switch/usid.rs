//! Who consumes this switch's own uSID in the SRv6 encoding: the kernel's `seg6local` End route
//! (NEXT-C-SID flavour), or `tc_forward` itself (the uN behaviour in eBPF, `usid_shift`) where
//! the kernel has no `seg6local` (`CONFIG_IPV6_SEG6_LWTUNNEL` unset). Chosen once at start,
//! from a probe, or forced with `--usid`.

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    error::{Error, Result},
    netlink::Netlink,
    probe,
};

/// `--usid`: how the switch chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UsidMode {
    /// The kernel's End route where the kernel has `seg6local`, `tc_forward` otherwise.
    #[default]
    Auto,
    /// The kernel's End route; refused at start on a kernel without `seg6local`.
    Kernel,
    /// `tc_forward` consumes the uSID (on any kernel; for testing where the kernel has both).
    Ebpf,
}

/// Who consumes the switch's uSID, as chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsidEnd {
    Kernel,
    Ebpf,
}

impl UsidEnd {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Ebpf => "ebpf",
        }
    }
}

/// What `mode` comes to on this kernel (logged, with why); and, where the kernel's lack of
/// `seg6local` made the choice, the words of that fallback for the record and the operator.
pub async fn choose(mode: UsidMode, netlink: &Netlink) -> Result<(UsidEnd, Option<String>)> {
    let has = probe::seg6local(netlink).await?;
    let chosen = match (mode, has) {
        (UsidMode::Kernel, false) => {
            return Err(Error::Kernel(
                "--usid kernel: this kernel has no seg6local End (CONFIG_IPV6_SEG6_LWTUNNEL is \
                 not set); run with --usid auto or ebpf, where tc_forward consumes the switch's \
                 uSID itself"
                    .into(),
            ));
        }
        (UsidMode::Kernel, true) | (UsidMode::Auto, true) => (
            UsidEnd::Kernel,
            "the kernel's seg6local End route (NEXT-C-SID)".to_owned(),
        ),
        (UsidMode::Auto, false) => (
            UsidEnd::Ebpf,
            "tc_forward (uN in eBPF): the kernel has no seg6local End \
             (CONFIG_IPV6_SEG6_LWTUNNEL is not set)"
                .to_owned(),
        ),
        (UsidMode::Ebpf, _) => (
            UsidEnd::Ebpf,
            "tc_forward (uN in eBPF), as --usid ebpf asks".to_owned(),
        ),
    };
    let fallback = (chosen.0 == UsidEnd::Ebpf && !has).then(|| {
        warn!(consumer = %chosen.1, "the SRv6 encoding's uSID");
        chosen.1.clone()
    });
    if fallback.is_none() {
        info!(consumer = %chosen.1, "the SRv6 encoding's uSID");
    }
    Ok((chosen.0, fallback))
}
