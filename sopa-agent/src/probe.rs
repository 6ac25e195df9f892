//! What this kernel has, probed in one place: each role asks here at start for what it needs,
//! and `sopa-agent doctor` prints all of it, with what SOPA does where a feature is missing.
//! A probe asks the kernel itself where that is harmless (a route added to a table nothing
//! reads and removed, a sleep on a clock, a file in `/sys`); where only attaching would tell,
//! the kernel's version (the release that added the feature, named) and its published
//! configuration (`/proc/config.gz`) stand in.

use std::io::Read as _;

use aya::util::KernelVersion;
use serde::Serialize;

use crate::{
    error::{Error, Result},
    netlink::Netlink,
};

/// The kernel's version, as aya reads it.
pub fn kernel_version() -> Result<KernelVersion> {
    KernelVersion::current().map_err(|e| {
        Error::io(
            "reading the kernel version",
            std::io::Error::other(e.to_string()),
        )
    })
}

/// TCX, the TC hook for BPF links (Linux 6.6, "bpf: Add fd-based tcx multi-prog infra with
/// link support").
pub const TCX_SINCE: (u32, u8) = (6, 6);

/// Whether the kernel attaches TC programs as TCX links.
pub fn tcx(v: KernelVersion) -> bool {
    v >= KernelVersion::new(TCX_SINCE.0 as u8, TCX_SINCE.1, 0)
}

/// A table no route lookup reads (no rule names it): the `seg6local` probe's route goes there
/// for the instant it exists.
const PROBE_TABLE: u32 = 0x50A_5EED;

/// The NEXT-C-SID flavour of `seg6local` End (Linux 6.1, "seg6: add NEXT-C-SID support for
/// SRv6 End behavior"). Before it, the kernel takes the route and silently ignores the
/// flavour (its parser skips attributes it does not know): End without it drops every packet
/// of this fabric (no routing header), so the version decides there.
pub const NEXT_CSID_SINCE: (u8, u8) = (6, 1);

/// Whether the kernel can install a `seg6local` End route with the NEXT-C-SID flavour
/// (`CONFIG_IPV6_SEG6_LWTUNNEL` and [`NEXT_CSID_SINCE`]): one is added to a table nothing reads,
/// through `lo`, and removed. A kernel without seg6 lightweight tunnels refuses the
/// encapsulation type (EOPNOTSUPP) before it looks at the device.
pub async fn seg6local(netlink: &Netlink) -> Result<bool> {
    let (major, minor) = NEXT_CSID_SINCE;
    Ok(kernel_version()? >= KernelVersion::new(major, minor, 0)
        && netlink.probe_seg6local(PROBE_TABLE).await?)
}

/// Whether a thread can sleep on `CLOCK_TAI` (`clock_nanosleep`), as the path meter's color
/// does; without it the color sleeps on the monotonic clock, to the same instants read on TAI.
pub fn clock_tai_sleep() -> bool {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000,
    };
    // SAFETY: a relative sleep of 1 us; the remainder is not asked for.
    unsafe { libc::clock_nanosleep(libc::CLOCK_TAI, 0, &ts, std::ptr::null_mut()) == 0 }
}

/// Whether the kernel publishes its BTF (`/sys/kernel/btf/vmlinux`).
pub fn btf() -> bool {
    std::path::Path::new("/sys/kernel/btf/vmlinux").exists()
}

/// Whether this network namespace has IPv6 (its `all.forwarding` setting exists).
pub fn ipv6() -> bool {
    std::path::Path::new("/proc/sys/net/ipv6/conf/all/forwarding").exists()
}

/// The kernel's published configuration (`/proc/config.gz`), where it publishes one.
pub struct KernelConfig(Option<String>);

impl KernelConfig {
    pub fn read() -> Self {
        let text = std::fs::File::open("/proc/config.gz").ok().and_then(|f| {
            let mut text = String::new();
            flate2::read::GzDecoder::new(f)
                .read_to_string(&mut text)
                .ok()
                .map(|_| text)
        });
        Self(text)
    }

    /// `Some(true)` for an option set `y` or `m`, `Some(false)` for one not set, `None` where
    /// the kernel publishes no configuration.
    pub fn option(&self, name: &str) -> Option<bool> {
        let text = self.0.as_ref()?;
        Some(text.lines().any(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('='))
                .is_some_and(|v| v == "y" || v == "m")
        }))
    }
}

/// What a finding says of a feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    Yes,
    No,
    /// Nothing here could tell (no published configuration, say).
    Unknown,
}

impl Presence {
    fn of(b: Option<bool>) -> Self {
        match b {
            Some(true) => Self::Yes,
            Some(false) => Self::No,
            None => Self::Unknown,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Yes => "yes",
            Self::No => "no",
            Self::Unknown => "unknown",
        }
    }
}

/// One line of `sopa-agent doctor`.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub feature: &'static str,
    /// The kernel option or release that brings it.
    pub source: &'static str,
    pub present: Presence,
    /// What SOPA does without it.
    pub without: &'static str,
}

/// Whether this kernel's verifier passes every program of both roles: they are loaded, with
/// their maps pinned in a folder of this probe's own under bpffs, and let go. `Err` with the
/// verifier's or the loader's words.
pub fn programs_load() -> std::result::Result<(), String> {
    let dir = std::path::Path::new(crate::BPFFS_ROOT)
        .parent()
        .unwrap_or(std::path::Path::new("/sys/fs/bpf"))
        .join(format!("sopa-doctor-{}", std::process::id()));
    let loaded = crate::datapath::Datapath::verify_all(&dir).map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    loaded
}

/// Every feature the agent uses, as this kernel has it, and what the verifier said of the
/// programs where it refused them. `netlink` is the agent's namespace's route socket (for the
/// `seg6local` probe).
pub async fn findings(netlink: &Netlink) -> Result<(Vec<Finding>, Option<String>)> {
    let v = kernel_version()?;
    let config = KernelConfig::read();
    let at_least = |major: u8, minor: u8| Some(v >= KernelVersion::new(major, minor, 0));
    let verifier = programs_load().err();
    let findings = vec![
        Finding {
            feature: "the datapath's programs pass the verifier",
            source: "this kernel",
            present: Presence::of(Some(verifier.is_none())),
            without: "the agent refuses to start, with the verifier's words (sopa-agent doctor --json)",
        },
        Finding {
            feature: "TCX links for TC programs",
            source: "Linux 6.6",
            present: Presence::of(Some(tcx(v))),
            without: "the TC programs attach as cls_bpf filters on a clsact qdisc (--attach tc)",
        },
        Finding {
            feature: "cls_bpf filters, direct action",
            source: "CONFIG_NET_CLS_BPF",
            present: Presence::of(config.option("CONFIG_NET_CLS_BPF")),
            without: "needed only without TCX: then the agent refuses to start",
        },
        Finding {
            feature: "clsact qdisc",
            source: "CONFIG_NET_SCH_INGRESS",
            present: Presence::of(config.option("CONFIG_NET_SCH_INGRESS")),
            without: "needed only without TCX: then the agent refuses to start",
        },
        Finding {
            feature: "XDP, generic (skb) mode",
            source: "Linux 4.12",
            present: Presence::of(at_least(4, 12)),
            without: "the agent refuses to start (xdp_strip removes the path before the stack)",
        },
        Finding {
            feature: "bpf_check_mtu",
            source: "Linux 5.12",
            present: Presence::of(at_least(5, 12)),
            without: "the agent refuses to start (tc_stamp checks the stamped size with it)",
        },
        Finding {
            feature: "bpf_skb_adjust_room with encapsulation flags",
            source: "Linux 5.2",
            present: Presence::of(at_least(5, 2)),
            without: "the agent refuses to start (the SRv6 outer header is made with it)",
        },
        Finding {
            feature: "BTF of the kernel",
            source: "CONFIG_DEBUG_INFO_BTF",
            present: Presence::of(Some(btf())),
            without: "nothing: the programs need no CO-RE relocation",
        },
        Finding {
            feature: "seg6local End, NEXT-C-SID flavour",
            source: "CONFIG_IPV6_SEG6_LWTUNNEL",
            // A probe that could not ask (no CAP_NET_ADMIN, say) knows nothing either way.
            present: Presence::of(seg6local(netlink).await.ok()),
            without: "SRv6 switches consume their uSID in tc_forward (--usid ebpf)",
        },
        Finding {
            feature: "sleeping on CLOCK_TAI",
            source: "Linux 3.10",
            present: Presence::of(Some(clock_tai_sleep())),
            without: "the path meter's color sleeps on the monotonic clock to the TAI instants",
        },
        Finding {
            feature: "IPv6",
            source: "CONFIG_IPV6",
            present: Presence::of(Some(ipv6())),
            without: "the SRv6 encoding is refused",
        },
    ];
    Ok((findings, verifier))
}

/// The table `sopa-agent doctor` prints.
pub fn table(findings: &[Finding]) -> String {
    let width = |f: fn(&Finding) -> usize, head: &str| {
        findings.iter().map(f).max().unwrap_or(0).max(head.len())
    };
    let (wf, ws) = (
        width(|f| f.feature.len(), "feature"),
        width(|f| f.source.len(), "from"),
    );
    let mut out = format!(
        "{:<wf$}  {:<ws$}  {:<7}  without it\n",
        "feature", "from", "present"
    );
    for f in findings {
        out += &format!(
            "{:<wf$}  {:<ws$}  {:<7}  {}\n",
            f.feature,
            f.source,
            f.present.name(),
            if f.present == Presence::Yes {
                "-"
            } else {
                f.without
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_says_y_m_or_not_set() {
        let c = KernelConfig(Some(
            "CONFIG_A=y\nCONFIG_AB=m\n# CONFIG_B is not set\nCONFIG_C=\"x\"\n".into(),
        ));
        assert_eq!(c.option("CONFIG_A"), Some(true));
        assert_eq!(c.option("CONFIG_AB"), Some(true));
        assert_eq!(c.option("CONFIG_B"), Some(false));
        assert_eq!(c.option("CONFIG_C"), Some(false));
        assert_eq!(KernelConfig(None).option("CONFIG_A"), None);
    }

    #[test]
    fn tcx_from_6_6() {
        assert!(tcx(KernelVersion::new(6, 6, 0)));
        assert!(tcx(KernelVersion::new(6, 18, 44)));
        assert!(!tcx(KernelVersion::new(6, 1, 0)));
        assert!(!tcx(KernelVersion::new(5, 15, 0)));
    }
}
