//! `sopa-agent doctor` against the kernel it runs on: every feature it names by a kernel option
//! is present exactly where `/proc/config.gz` sets that option (the probes ask the kernel
//! itself, the configuration says what was built); the table and the JSON say the same. Needs
//! root (the probes add a route and load the programs).

use std::process::Command;

fn doctor(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sopa-agent"))
        .arg("doctor")
        .args(args)
        .output()
        .expect("sopa-agent doctor");
    assert!(
        out.status.success(),
        "sopa-agent doctor {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `/proc/config.gz` as text, where the kernel publishes it.
fn kernel_config() -> Option<String> {
    let out = Command::new("zcat").arg("/proc/config.gz").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_table_matches_the_kernels_configuration() {
    let report: serde_json::Value = serde_json::from_str(&doctor(&["--json"])).unwrap();
    let features = report["features"].as_array().unwrap();
    assert!(features.len() >= 10, "{report:#}");
    let config = kernel_config().expect("this kernel publishes /proc/config.gz");
    let mut checked = 0;
    for f in features {
        let option = f["source"].as_str().unwrap();
        if !option.starts_with("CONFIG_") {
            continue;
        }
        let set = config
            .lines()
            .any(|l| l == format!("{option}=y") || l == format!("{option}=m"));
        assert_eq!(
            f["present"],
            if set { "yes" } else { "no" },
            "{}: the kernel's configuration says {option} is {}",
            f["feature"],
            if set { "set" } else { "not set" }
        );
        checked += 1;
    }
    assert!(checked >= 5, "{checked} options checked");
    // The programs pass this kernel's verifier (the suite runs on kernels the agent supports).
    assert_eq!(features[0]["present"], "yes", "{report:#}");
    // The table says what the JSON says.
    let table = doctor(&[]);
    for f in features {
        let line = table
            .lines()
            .find(|l| l.starts_with(f["feature"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{} is not in the table:\n{table}", f["feature"]));
        assert!(
            line.contains(&format!("  {}  ", f["present"].as_str().unwrap())),
            "{line}"
        );
    }
}
