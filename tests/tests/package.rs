//! The packages and the images as an operator installs and runs them: the .debs into a clean
//! Debian (the images' base) with their binaries, units, man pages and completions; the agent's
//! image under podman in a namespace of the testbed, with the host's network of that namespace,
//! the unit's capabilities, bpffs and the host's /proc at /hostproc, until it stamps; stopped,
//! it leaves the datapath attached, and removing the package (its prerm) detaches it and
//! restores the host. The full tier builds them first (`cargo xtask image`); elsewhere these checks are skipped and say so.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use sopa_testbed::{
    arb::{Arb, B_PREFIX},
    bins,
};

/// The Debian base `cargo xtask image` makes with mmdebstrap.
const BASE: &str = "localhost/sopa-base:bookworm";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The two packages `cargo xtask package` built, or why this check cannot run.
fn packages(check: &str) -> Option<Vec<PathBuf>> {
    if !sopa_testbed::full_tier() {
        sopa_testbed::skipped(
            check,
            "the full tier's (`cargo xtask test --full` builds the packages and images first)",
        );
        return None;
    }
    let dir = repo().join("target/debian");
    let debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    let find = |name: &str| {
        debs.iter()
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb"))
            })
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no {name} package in {}: run `cargo xtask package`",
                    dir.display()
                )
            })
    };
    Some(vec![find("sopa-agent"), find("sopa-controller")])
}

/// `podman ARGS` with runc (crun refuses hosts whose cgroups are mounted hybrid), as `cargo
/// xtask image` builds with it.
fn podman(args: &[&str]) -> (bool, String) {
    let out = Command::new("podman")
        .args(["--runtime", "runc"])
        .args(args)
        .output()
        .expect("podman");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_packages_install_into_a_clean_debian_with_units_pages_and_completions() {
    let Some(debs) = packages("the packages install into a clean Debian") else {
        return;
    };
    let dir = debs[0].parent().unwrap().display().to_string();
    let script = "set -e
        dpkg -i /debs/sopa-agent_*.deb /debs/sopa-controller_*.deb
        sopa-agent --version; sopa-controller --version; sopactl --version
        sopa-agent doctor
        for f in /lib/systemd/system/sopa-agent.service /lib/systemd/system/sopa-controller.service \
                 /etc/sopa/sopa-agent.env /etc/sopa/sopa-controller.env \
                 /usr/share/man/man1/sopa-agent-run.1.gz /usr/share/man/man1/sopa-controller.1.gz \
                 /usr/share/man/man1/sopactl-link.1.gz \
                 /usr/share/bash-completion/completions/sopa-agent \
                 /usr/share/bash-completion/completions/sopactl \
                 /usr/share/zsh/vendor-completions/_sopa-controller \
                 /usr/share/doc/sopa-agent/copyright; do
            test -s $f || { echo missing $f; exit 1; }
        done
        grep -q '^ExecStart=/usr/bin/sopa-agent run' /lib/systemd/system/sopa-agent.service
        dpkg -r sopa-agent sopa-controller
        test ! -e /usr/bin/sopa-agent && test -e /etc/sopa/sopa-agent.env
        echo installed-and-removed";
    let (ok, out) = podman(&[
        "run",
        "--rm",
        "--ulimit=nofile=4096:4096",
        "--ulimit=nproc=4096:4096",
        "--network=none",
        "-v",
        &format!("{dir}:/debs:ro"),
        BASE,
        "sh",
        "-c",
        script,
    ]);
    assert!(ok, "{out}");
    let version = env!("CARGO_PKG_VERSION");
    for bin in ["sopa-agent", "sopa-controller", "sopactl"] {
        assert!(out.contains(&format!("{bin} {version}")), "{out}");
    }
    assert!(out.contains("installed-and-removed"), "{out}");
}

/// `podman run` options that put a container where the DaemonSet puts the agent: the host's
/// network (here the namespace `node`), bpffs and /run/sopa shared with the host, the host's
/// /proc at /hostproc, the unit's three capabilities, and the host's PIDs (the journal records
/// the agent's).
fn as_the_daemonset(node: &str) -> Vec<String> {
    [
        "--ulimit=nofile=4096:4096",
        "--ulimit=nproc=4096:4096",
        &format!("--network=ns:/run/netns/{node}"),
        "--pid=host",
        // As the DaemonSet's seccompProfile: a runtime's default profile refuses bpf(2).
        "--security-opt=seccomp=unconfined",
        "--cap-drop=all",
        "--cap-add=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN",
        "--volume=/sys/fs/bpf:/sys/fs/bpf",
        "--volume=/run/sopa:/run/sopa",
        "--volume=/proc:/hostproc",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Removes the container on drop, whatever the test did.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "5", &self.0]);
    }
}

#[test]
fn the_agent_image_attaches_in_a_namespace_and_stamps() {
    let Some(debs) = packages("the agent image runs in a namespace") else {
        return;
    };
    let arb = Arb::new("img").expect("build A - R - B");
    let node = arb.a.name().to_owned();
    let tmp = sopa_testbed::temp_dir(&format!("img-{node}"));
    let paths = tmp.path().join("paths.toml");
    std::fs::write(&paths, Arb::path_table(B_PREFIX, 3)).unwrap();
    let image = format!("ghcr.io/sopa/sopa-agent:{}", env!("CARGO_PKG_VERSION"));
    // The host's cgroup v2 tree, for the socket-option guard (as the DaemonSet mounts it): a
    // container may not mount one itself.
    let cgroup2 = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_owned())
        })
        .expect("a cgroup v2 mount on this host");
    let reordering = arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap();
    // Dropped in reverse: the container goes first (its agent exits, leaving the datapath
    // attached as told), then the detach takes the datapath off whatever the test did.
    let _detach = sopa_testbed::resilience::DetachOnDrop {
        ns: &arb.a,
        node: node.clone(),
    };
    let container = Container(format!("sopa-test-{node}"));
    let daemonset = as_the_daemonset(&node);
    let daemonset: Vec<&str> = daemonset.iter().map(String::as_str).collect();
    let (ok, out) = podman(
        &[
            &["run", "--detach", "--name", &container.0][..],
            &daemonset,
            &[
                // As the DaemonSet's configmap: a pod that exits (an upgrade) leaves the
                // datapath.
                "--env=SOPA_KEEP_ATTACHED=true",
                "-v",
                &format!("{}:/etc/sopa/paths.toml:ro", paths.display()),
                "-v",
                &format!("{cgroup2}:/host/cgroup:ro"),
                &image,
                "run",
                "--guard-cgroup",
                "/host/cgroup",
                "--node",
                &node,
                "--iface",
                &arb.a_if,
                "--paths",
                "/etc/sopa/paths.toml",
            ],
        ]
        .concat(),
    );
    assert!(ok, "{out}");
    let logs = || podman(&["logs", &container.0]).1;
    // Attached: the host's `sopa-agent status` reads the pins and the journal the container
    // wrote.
    let status = || {
        Command::new(bins::sopa_agent())
            .args(["status", "--node", &node, "--json"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
    };
    let start = Instant::now();
    loop {
        if status().is_some_and(|s| s["running"] == true && s["attached"] == true) {
            break;
        }
        let (_, running) = podman(&["inspect", "--format", "{{.State.Running}}", &container.0]);
        assert!(
            running.trim() == "true",
            "the image's agent exited at start:\n{}",
            logs()
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the image's agent did not attach:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        arb.a.http_get("127.0.0.1:9470", "/readyz").unwrap(),
        (200, "ready\n".into()),
        "{}",
        logs()
    );
    // Stamping: a UDP probe to B's rack carries a path in every packet.
    let stamped = |s: &serde_json::Value| s["stamp"]["stamped"].as_u64().unwrap_or(0);
    let before = stamped(&status().unwrap());
    let probe = sopa_testbed::resilience::Probe::start(&arb, 200, 5401);
    probe.wait_received(100);
    let sent = probe.finish().sent;
    let after = stamped(&status().unwrap());
    assert!(
        after >= before + sent.min(100),
        "stamped {before} -> {after} of {sent} sent\n{}",
        logs()
    );
    // The sysctl went through /hostproc into A's namespace.
    assert_eq!(arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(), "10");
    let (ok, out) = podman(&["stop", "--time", "15", &container.0]);
    assert!(ok, "{out}");
    let (_, code) = podman(&["inspect", "--format", "{{.State.ExitCode}}", &container.0]);
    assert_eq!(code.trim(), "0", "a stop is a clean exit\n{}", logs());
    let left = status().expect("status after the stop");
    assert!(
        left["running"] == false && left["attached"] == true && left["kept_attached"] == true,
        "the stopped agent leaves the datapath attached: {left}"
    );
    // Removing the package takes the datapath off: its prerm runs `sopa-agent detach` for the
    // node its env file names, in the host's network (A's namespace) with bpffs and /run/sopa.
    let dir = debs[0].parent().unwrap().display().to_string();
    let script = format!(
        "set -e
        dpkg -i /debs/sopa-agent_*.deb
        echo SOPA_NODE={node} >> /etc/sopa/sopa-agent.env
        dpkg -r sopa-agent
        echo removed"
    );
    let (ok, out) = podman(
        &[
            &["run", "--rm"][..],
            &daemonset,
            &[
                // A container's /proc/sys is read-only: the detach restores sysctls through the
                // host's.
                "--env=SOPA_PROC_ROOT=/hostproc",
                "-v",
                &format!("{dir}:/debs:ro"),
                BASE,
                "sh",
                "-c",
                &script,
            ],
        ]
        .concat(),
    );
    assert!(ok && out.contains("removed"), "{out}");
    assert!(out.contains(&format!("node {node}: detached")), "{out}");
    for gone in [
        format!("/sys/fs/bpf/sopa/{node}"),
        format!("/run/sopa/{node}"),
    ] {
        assert!(
            !Path::new(&gone).exists(),
            "{gone} is left after the removal"
        );
    }
    assert_eq!(
        arb.a.read_sysctl("net.ipv4.tcp_reordering").unwrap(),
        reordering,
        "the removal restored the sysctl the agent set"
    );
}
