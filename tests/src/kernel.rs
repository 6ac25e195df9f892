//! What the kernel under the testbed has, for suites that run a fallback where a feature is
//! missing (and record the check they cannot make, `crate::skipped`).

use crate::{NetNs, run_name};

/// Whether the kernel installs `seg6local` routes (`CONFIG_IPV6_SEG6_LWTUNNEL`): one is added in
/// a namespace of its own and the namespace removed.
pub fn has_seg6local() -> bool {
    let Ok(ns) = NetNs::new(&run_name("k6")) else {
        return false;
    };
    ns.ip(&[
        "-6",
        "route",
        "add",
        "fcbb:bb00:ffff::/48",
        "encap",
        "seg6local",
        "action",
        "End",
        "dev",
        "lo",
        "table",
        "4242",
    ])
    .is_ok()
}
