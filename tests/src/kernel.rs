//! What the kernel under the testbed has, for suites that run a fallback where a feature is
//! missing (and record the check they cannot make, `crate::skipped`): the agent's own probe
//! (`sopa-agent doctor`), asked once per process.

use std::{process::Command, sync::OnceLock};

use crate::bins;

/// `sopa-agent doctor --json`'s features: name -> present ("yes", "no", "unknown").
fn features() -> &'static Vec<(String, String)> {
    static FEATURES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    FEATURES.get_or_init(|| {
        let out = Command::new(bins::sopa_agent())
            .args(["doctor", "--json"])
            .output()
            .expect("sopa-agent doctor");
        assert!(
            out.status.success(),
            "sopa-agent doctor: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor's JSON");
        report["features"]
            .as_array()
            .expect("features")
            .iter()
            .map(|f| {
                (
                    f["source"].as_str().unwrap_or_default().to_owned(),
                    f["present"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    })
}

/// Whether the kernel installs `seg6local` End routes with the NEXT-C-SID flavour
/// (`CONFIG_IPV6_SEG6_LWTUNNEL`, Linux 6.1).
pub fn has_seg6local() -> bool {
    features()
        .iter()
        .any(|(source, present)| source == "CONFIG_IPV6_SEG6_LWTUNNEL" && present == "yes")
}
