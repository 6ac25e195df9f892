//! The files in deploy/ are checked, not just shipped: the systemd unit verifies with
//! `systemd-analyze verify`, every SOPA_* variable of the examples and the manifests is a real
//! flag, the DaemonSet is a well-formed Kubernetes object with the unit's capabilities, the
//! Prometheus rules load and pass their unit tests (`promtool`), and the agent runs with exactly
//! those capabilities (the namespace part needs root).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use sopa_testbed::{
    Process,
    arb::{A_PREFIX, Arb, B_PREFIX},
    bins,
    traffic::{SendOptions, tcp_transfer},
};
use yaml_rust2::YamlLoader;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The unit's capabilities, e.g. ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"].
fn unit_capabilities() -> Vec<String> {
    read("deploy/systemd/sopa-agent.service")
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit bounds its capabilities")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The SOPA_* variables `sopa-agent run` reads, from its help.
fn agent_variables() -> Vec<String> {
    variables(&bins::sopa_agent(), &["run", "--help"])
}

/// The SOPA_* variables a binary reads, from its help.
fn variables(bin: &Path, help_args: &[&str]) -> Vec<String> {
    let out = Command::new(bin).args(help_args).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut vars: Vec<String> = help
        .split("[env: ")
        .skip(1)
        .filter_map(|s| s.split(['=', ']']).next())
        .map(str::to_owned)
        .collect();
    // tracing's filter, read by main rather than by a flag.
    vars.push("SOPA_LOG".into());
    vars
}

/// `systemd-analyze verify` of `deploy/systemd/NAME.service` as installed, pointing at this
/// build and at the example environment, and its `systemd-analyze security` exposure no more
/// than `exposure` (of 10: the units scored 6.6 and 5.8 before their hardening).
fn verify_unit(name: &str, bin: &Path, exposure: f64) {
    let tmp = sopa_testbed::temp_dir(&format!("unit-{name}-{}", std::process::id()));
    let dir = tmp.path().to_path_buf();
    let unit = read(&format!("deploy/systemd/{name}.service"))
        .replace(
            &format!("ExecStart=/usr/bin/{name}"),
            &format!("ExecStart={}", bin.display()),
        )
        .replace(
            &format!("EnvironmentFile=/etc/sopa/{name}.env"),
            &format!(
                "EnvironmentFile={}",
                repo().join(format!("deploy/examples/{name}.env")).display()
            ),
        );
    let path = dir.join(format!("{name}.service"));
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (cargo xtask setup installs systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(&format!("{name}.service")))
        .collect();
    assert!(out.status.success() && ours.is_empty(), "{stderr}");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(format!("--threshold={}", (exposure * 10.0) as u32))
        .arg(&path)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}: exposure over {exposure}:\n{}",
        report.lines().last().unwrap_or_default()
    );
}

#[test]
fn the_systemd_units_verify() {
    verify_unit("sopa-agent", &bins::sopa_agent(), 2.8);
    assert!(
        read("deploy/systemd/sopa-agent.service").contains("Environment=SOPA_KEEP_ATTACHED=true"),
        "the unit keeps the datapath attached across restarts"
    );
    verify_unit("sopa-controller", &bins::sopa_controller(), 1.4);
    for (name, keep) in [("sopa-agent", "2 69 77 78"), ("sopa-controller", "2 77 78")] {
        let unit = read(&format!("deploy/systemd/{name}.service"));
        assert!(
            unit.contains("Type=notify"),
            "{name}: systemd waits for READY=1"
        );
        assert!(
            unit.contains(&format!("RestartPreventExitStatus={keep}")),
            "{name}: no restart for the causes a restart cannot cure"
        );
    }
    assert!(
        read("deploy/systemd/sopa-agent.service").contains("ExecReload=/bin/kill -HUP $MAINPID"),
        "reload is the agent's SIGHUP"
    );
    let controller = read("deploy/systemd/sopa-controller.service");
    assert!(
        controller.contains("StateDirectory=sopa") && !controller.contains("ca.key"),
        "the controller keeps its state, and never holds the CA key"
    );
    // Room for every connection the controller takes by default, and its own 256.
    let limit: u64 = controller
        .lines()
        .find_map(|l| l.strip_prefix("LimitNOFILE="))
        .expect("the unit sets LimitNOFILE")
        .parse()
        .unwrap();
    let help = Command::new(bins::sopa_controller())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let connections: u64 = help
        .split("--max-connections")
        .nth(1)
        .and_then(|s| s.split("[default: ").nth(1))
        .and_then(|s| s.split(']').next())
        .expect("--max-connections has a default")
        .parse()
        .unwrap();
    assert!(
        limit >= connections + 256,
        "LimitNOFILE={limit} under --max-connections {connections} + 256"
    );
}

#[test]
fn the_prometheus_rules_load_and_their_unit_tests_pass() {
    let dir = repo().join("deploy/prometheus");
    for args in [
        &["check", "rules", "sopa-rules.yml"][..],
        &["test", "rules", "sopa-rules.test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool (Debian's prometheus package; `cargo xtask setup` installs it)");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Grafana is not installable here (neither Debian nor the package registries carry it): what
/// it would read is checked instead. The provisioned datasource is the one the dashboard's
/// panels use, the file provider points where the comments say to copy the JSON, and the panels
/// do not overlap (Grafana would move them). The gray phase of `fabric_option` evaluates every
/// panel's query in a real Prometheus.
#[test]
fn the_grafana_provisioning_loads_the_dashboard_and_its_datasource() {
    let datasources = &YamlLoader::load_from_str(&read(
        "deploy/grafana/provisioning/datasources/prometheus.yaml",
    ))
    .unwrap()[0];
    let source = &datasources["datasources"][0];
    assert_eq!(datasources["apiVersion"].as_i64(), Some(1));
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    let uid = source["uid"].as_str().expect("the datasource's uid");
    let providers =
        &YamlLoader::load_from_str(&read("deploy/grafana/provisioning/dashboards/sopa.yaml"))
            .unwrap()[0];
    let provider = &providers["providers"][0];
    assert_eq!(provider["type"].as_str(), Some("file"));
    let path = provider["options"]["path"]
        .as_str()
        .expect("the provider's path");
    assert!(
        read("deploy/grafana/provisioning/dashboards/sopa.yaml").contains(&format!("to {path}/")),
        "the comment says where to copy the dashboard: {path}"
    );

    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/sopa-fabric.json")).unwrap();
    assert!(dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    // The datasource variable defaults to the provisioned one; the node variable lists agents.
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(
        variable("datasource")["current"]["value"].as_str(),
        Some(uid)
    );
    assert_eq!(variable("instance")["label"], "node");
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(
        panels.iter().any(|p| p["title"]
            .as_str()
            .unwrap_or("")
            .starts_with("Per-path balance")),
        "a per-path balance panel"
    );
    let mut placed: Vec<(i64, i64, i64, i64, &str)> = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {title}");
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_i64().unwrap(),
            g["y"].as_i64().unwrap(),
            g["w"].as_i64().unwrap(),
            g["h"].as_i64().unwrap(),
        );
        assert!(
            x >= 0 && w > 0 && x + w <= 24 && h > 0,
            "panel {title}: {g}"
        );
        for (ox, oy, ow, oh, other) in &placed {
            let apart = x + w <= *ox || *ox + ow <= x || y + h <= *oy || *oy + oh <= y;
            assert!(apart, "panels {other} and {title} overlap");
        }
        placed.push((x, y, w, h, title));
    }
}

#[test]
fn the_controllers_example_environment_names_only_its_flags() {
    let known = variables(&bins::sopa_controller(), &["--help"]);
    let used: Vec<String> = read("deploy/examples/sopa-controller.env")
        .lines()
        .map(|l| l.trim_start_matches("# ").trim())
        .filter(|l| l.starts_with("SOPA_"))
        .filter_map(|l| l.split('=').next().map(str::to_owned))
        .collect();
    assert!(used.len() >= 4, "{used:?}");
    for v in &used {
        assert!(
            known.contains(v),
            "{v} is not a variable of sopa-controller"
        );
    }
}

#[test]
fn every_variable_in_deploy_is_a_real_flag() {
    let known = agent_variables();
    assert!(
        known.contains(&"SOPA_KEEP_ATTACHED".to_owned()),
        "{known:?}"
    );
    let mut used: Vec<String> = read("deploy/examples/sopa-agent.env")
        .lines()
        .map(|l| l.trim_start_matches("# ").trim())
        .filter(|l| l.starts_with("SOPA_"))
        .filter_map(|l| l.split('=').next().map(str::to_owned))
        .collect();
    for doc in &agent_manifests() {
        if let Some(data) = doc["data"].as_hash() {
            used.extend(data.keys().filter_map(|k| k.as_str().map(str::to_owned)));
        }
        if let Some(containers) = doc["spec"]["template"]["spec"]["containers"].as_vec() {
            for c in containers {
                for e in c["env"].as_vec().into_iter().flatten() {
                    // Variables of the pod's own (the node's address) are not the agent's.
                    let name = e["name"].as_str().unwrap();
                    if name.starts_with("SOPA_") {
                        used.push(name.to_owned());
                    }
                }
            }
        }
    }
    assert!(used.len() > 10, "{used:?}");
    for v in &used {
        assert!(
            known.contains(v),
            "{v} is not a variable of `sopa-agent run`"
        );
    }
}

/// The agent's ConfigMap and DaemonSet.
fn agent_manifests() -> Vec<yaml_rust2::Yaml> {
    ["agent-configmap.yaml", "agent-daemonset.yaml"]
        .iter()
        .flat_map(|f| YamlLoader::load_from_str(&read(&format!("deploy/kubernetes/{f}"))).unwrap())
        .collect()
}

/// Every manifest validates against the Kubernetes schemas (kubernetes-validate, strict), no
/// container mounts a host path over /proc or /sys (runc refuses them; bpffs excepted), and
/// every container has its probes: `xtask/assets/check-manifests.py`.
#[test]
fn the_manifests_validate_and_mount_nothing_runc_refuses() {
    let out = Command::new("python3")
        .arg(repo().join("xtask/assets/check-manifests.py"))
        .arg(repo().join("deploy/kubernetes"))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}{}(kubernetes-validate missing? `cargo xtask setup` installs it)",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_daemonset_is_a_well_formed_kubernetes_object() {
    let docs = agent_manifests();
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let ds = find("DaemonSet");
    let cm = find("ConfigMap");
    assert_eq!(ds["apiVersion"].as_str(), Some("apps/v1"));
    assert_eq!(cm["apiVersion"].as_str(), Some("v1"));
    for d in [ds, cm] {
        assert!(d["metadata"]["name"].as_str().is_some());
        assert!(d["metadata"]["namespace"].as_str().is_some());
    }
    // The selector must match the template's labels, or the API server refuses the object.
    let selector = ds["spec"]["selector"]["matchLabels"].as_hash().unwrap();
    let labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_hash()
        .unwrap();
    for (k, v) in selector {
        assert_eq!(
            labels.get(k),
            Some(v),
            "selector {k:?} not in the template labels"
        );
    }
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true));
    let containers = pod["containers"].as_vec().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert!(c["image"].as_str().is_some_and(|i| i.contains(':')));
    assert_eq!(
        c["envFrom"][0]["configMapRef"]["name"].as_str(),
        cm["metadata"]["name"].as_str()
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    let mut add: Vec<String> = sc["capabilities"]["add"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|c| format!("CAP_{}", c.as_str().unwrap()))
        .collect();
    let mut unit = unit_capabilities();
    add.sort();
    unit.sort();
    assert_eq!(add, unit, "the same capabilities as the systemd unit");
    // Every mount names a volume, and the host state the agent keeps is mounted.
    let volumes: Vec<&str> = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    let mounts: Vec<(&str, &str)> = c["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
            )
        })
        .collect();
    for (name, _) in &mounts {
        assert!(volumes.contains(name), "mount {name} has no volume");
    }
    for path in ["/sys/fs/bpf", "/run/sopa", "/etc/sopa/certs", "/hostproc"] {
        assert!(mounts.iter().any(|(_, p)| *p == path), "{path} not mounted");
    }
    // The host's /proc where runc allows it, named to the agent for its sysctls.
    let env = |name: &str| {
        c["env"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str())
    };
    assert_eq!(env("SOPA_PROC_ROOT"), Some("/hostproc"));
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    let certs = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str() == Some("certs"))
        .unwrap();
    assert_eq!(
        certs["hostPath"]["path"].as_str(),
        Some("/etc/sopa/certs"),
        "each node's own certificate, from the node: a Secret would be one certificate for all"
    );
    assert!(
        certs["secret"].is_badvalue(),
        "no certificate shared by every pod"
    );
    assert_eq!(
        cm["data"]["SOPA_KEEP_ATTACHED"].as_str(),
        Some("true"),
        "pod restarts keep the datapath"
    );
}

/// Starts the agent on A with only `caps` (names like CAP_BPF), as the unit would.
fn agent_with_caps(arb: &Arb, caps: &[String], log: &Path, paths: &Path) -> Process {
    let list: Vec<String> = caps
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let set = format!("-all,{}", list.join(","));
    let agent = bins::sopa_agent();
    let args = [
        format!("--bounding-set={set}"),
        format!("--inh-caps={set}"),
        format!("--ambient-caps={set}"),
        agent.display().to_string(),
        "run".into(),
        "--node".into(),
        arb.a.name().into(),
        "--iface".into(),
        arb.a_if.clone(),
        "--paths".into(),
        paths.display().to_string(),
        "--no-metrics".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Process::spawn(Some(&arb.a), Path::new("/usr/bin/setpriv"), &args, log).unwrap()
}

#[test]
fn the_agent_runs_with_exactly_the_units_capabilities() {
    let arb = Arb::new("cap").expect("build A - R - B");
    let tmp = sopa_testbed::temp_dir(&format!("caps-{}", arb.a.name()));
    let dir = tmp.path().to_path_buf();
    let paths = dir.join("paths.toml");
    std::fs::write(&paths, Arb::path_table(B_PREFIX, 3)).unwrap();
    let _b = sopa_testbed::agent::Agent::start(
        &arb.b,
        arb.b.name(),
        &arb.b_if,
        &Arb::path_table(A_PREFIX, 3),
        &["--no-metrics"],
    )
    .unwrap();
    let routes_before = arb.a.ip(&["route"]).unwrap();
    let caps = unit_capabilities();

    // Without CAP_PERFMON the verifier would refuse the programs: the unit needs all three,
    // and the agent says which one is missing before it loads anything.
    let without: Vec<String> = caps
        .iter()
        .filter(|c| *c != "CAP_PERFMON")
        .cloned()
        .collect();
    let mut p = agent_with_caps(&arb, &without, &dir.join("without.log"), &paths);
    let mut status = None;
    for _ in 0..100 {
        status = p.try_wait();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = p.log_text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the agent ran without CAP_PERFMON: drop it from the unit\n{log}"
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(77),
        "a missing privilege is exit 77\n{log}"
    );
    assert!(
        log.contains("missing CAP_PERFMON"),
        "the missing capability named, before the verifier refuses anything:\n{log}"
    );
    assert_eq!(
        arb.a.ip(&["route"]).unwrap(),
        routes_before,
        "a refused start changes nothing"
    );

    let mut p = agent_with_caps(&arb, &caps, &dir.join("with.log"), &paths);
    let node = arb.a.name().to_owned();
    let mut up = false;
    for _ in 0..100 {
        if sopa_testbed::agent::status_of(&node)
            .is_ok_and(|s| s["running"] == true && s["programs"].is_object())
        {
            up = true;
            break;
        }
        assert!(p.try_wait().is_none(), "exited:\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(up, "{}", p.log_text());
    let t = tcp_transfer(
        &arb.a,
        &arb.b,
        arb.b_addr,
        5401,
        8 << 20,
        &SendOptions::default(),
    )
    .unwrap();
    assert!(t.intact());
    let st = sopa_testbed::agent::status_of(&node).unwrap();
    assert!(st["stamp"]["stamped"].as_u64().unwrap() > 1000, "{st:#}");
    let exit = p.stop();
    assert!(exit.is_some_and(|s| s.success()), "{}", p.log_text());
    assert_eq!(
        arb.a.ip(&["route"]).unwrap(),
        routes_before,
        "restored on exit"
    );
}

/// The agent that runs on every host carries the channel and nothing of the controller: no
/// server, no Hedera scheduler, no certificate issuing.
#[test]
fn the_agent_binary_holds_no_controller_code() {
    let agent = std::fs::read(bins::sopa_agent()).unwrap();
    let holds = |needle: &[u8]| agent.windows(needle.len()).any(|w| w == needle);
    // The channel is there (its client), so the search itself works on this binary. (The
    // metric sopa_controller_connected is the agent's own: symbols and source paths are
    // searched, not the word.)
    assert!(
        holds(b"sopa-channel/src"),
        "the agent links the channel crate"
    );
    for needle in [&b"15sopa_controller"[..], b"sopa-controller/src", b"rcgen"] {
        assert!(
            !holds(needle),
            "the agent binary contains {:?}",
            String::from_utf8_lossy(needle)
        );
    }
}

/// Each cause of failure exits with its own code (`sopa_ops::exit`), so a unit can tell those a
/// restart cures from those it cannot.
#[test]
fn exit_codes_name_their_cause() {
    let tmp = sopa_testbed::temp_dir(&format!("exit-{}", std::process::id()));
    let dir = tmp.path();
    let code = |bin: &Path, args: &[&str]| {
        let out = Command::new(bin).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Usage: clap's 2, for both binaries.
    let (c, err) = code(&bins::sopa_agent(), &["run", "--no-such-flag"]);
    assert_eq!(c, Some(2), "{err}");
    let (c, err) = code(&bins::sopa_controller(), &["--no-such-flag"]);
    assert_eq!(c, Some(2), "{err}");
    // Configuration: 78, named.
    let bad = dir.join("paths.toml");
    std::fs::write(&bad, "not a path table").unwrap();
    let (c, err) = code(
        &bins::sopa_agent(),
        &[
            "run",
            "--iface",
            "lo",
            "--paths",
            bad.to_str().unwrap(),
            "--no-metrics",
        ],
    );
    assert_eq!(c, Some(78), "{err}");
    assert!(err.contains("paths.toml"), "{err}");
    let spec = dir.join("topology.toml");
    std::fs::write(&spec, "[topology]\nkind = \"fat-tree\"\nk = 4\n").unwrap();
    let (c, err) = code(
        &bins::sopa_controller(),
        &[
            "--topology",
            spec.to_str().unwrap(),
            "--insecure",
            "--store",
            "memory",
            "--loss-threshold",
            "2",
        ],
    );
    assert_eq!(c, Some(78), "{err}");
    assert!(err.contains("--loss-threshold"), "{err}");
    // A duration without a unit the parser knows is usage, and says how to write one.
    let (c, err) = code(
        &bins::sopa_controller(),
        &["--topology", spec.to_str().unwrap(), "--heartbeat", "soon"],
    );
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("500ms"), "{err}");
    // Both name the codes in their help.
    for bin in [bins::sopa_agent(), bins::sopa_controller()] {
        let out = Command::new(&bin).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("Exit codes:") && help.contains(" 78  "),
            "{help}"
        );
    }
}
