//! `cargo xtask setup`: installs, idempotently and saying what it does, everything the build and
//! the tests need that a fresh machine lacks.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// Debian packages the tests and demos use, with a command (or, starting with `/`, a file)
/// that proves each is present.
const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip"),
    ("iperf3", "iperf3"),
    ("tcpdump", "tcpdump"),
    ("ethtool", "ethtool"),
    ("bpftool", "bpftool"),
    ("iputils-ping", "ping"),
    ("util-linux", "setpriv"),
    // libFuzzer (cargo fuzz) is C++.
    ("g++", "g++"),
    // `systemd-analyze verify` checks the unit in deploy/.
    ("systemd", "systemd-analyze"),
    // The controller's etcd store: the client's build compiles etcd's protos, and the
    // replica tests run a real etcd cluster.
    ("protobuf-compiler", "protoc"),
    (
        "libprotobuf-dev",
        "/usr/include/google/protobuf/descriptor.proto",
    ),
    ("etcd-server", "etcd"),
    // The path meter's test scrapes the agents and the controller with a real Prometheus and
    // evaluates deploy/'s rules.
    ("prometheus", "prometheus"),
];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

fn say(msg: &str) {
    eprintln!("[setup] {msg}");
}

pub fn has_command(name: &str) -> bool {
    if name.starts_with('/') {
        return Path::new(name).exists();
    }
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn status(cmd: &mut Command) -> Result<()> {
    let desc = format!("{cmd:?}");
    let st = cmd.status().with_context(|| format!("running {desc}"))?;
    if !st.success() {
        bail!("{desc} failed ({st})");
    }
    Ok(())
}

/// Builds every binary the testbed starts (the agent, the controller, sopactl, sopa-traffic)
/// in the release or the debug profile, and points the testbed at them (`SOPA_*_BIN`).
/// Returns how many lines build scripts wrote as warnings (the eBPF build's, through
/// aya-build): a quiet build writes none.
pub fn build_bins(release: bool) -> Result<usize> {
    let mut args = vec!["build"];
    if release {
        args.push("--release");
    }
    args.extend([
        "-p",
        "sopa-agent",
        "-p",
        "sopa-controller",
        "-p",
        "sopa-testbed",
        "--bins",
    ]);
    let warnings = cargo_counting_script_warnings(&args)?;
    point_bins(release);
    Ok(warnings)
}

/// Runs cargo with `args` in the workspace root, its stderr passed through line by line, and
/// counts the lines a build script of the workspace wrote as warnings
/// (`warning: sopa-agent@0.1.0: …`).
fn cargo_counting_script_warnings(args: &[&str]) -> Result<usize> {
    use std::io::BufRead as _;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(cargo)
        .args(args)
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    let mut warnings = 0;
    let stderr = child.stderr.take().expect("stderr is piped");
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line.context("reading cargo's output")?;
        if is_script_warning(&line) {
            warnings += 1;
        }
        eprintln!("{line}");
    }
    let st = child.wait().context("waiting for cargo")?;
    if !st.success() {
        bail!("cargo {} failed ({st})", args.join(" "));
    }
    Ok(warnings)
}

/// `warning: sopa-agent@0.1.0: …`: a line a build script of the workspace wrote as a warning.
fn is_script_warning(line: &str) -> bool {
    line.strip_prefix("warning: sopa-")
        .and_then(|rest| rest.split_once(": "))
        .is_some_and(|(package, _)| package.contains('@'))
}

/// Points the testbed at the binaries of the release or the debug profile (`SOPA_*_BIN`).
pub fn point_bins(release: bool) {
    let dir = workspace_root()
        .join("target")
        .join(if release { "release" } else { "debug" });
    // SAFETY: no other thread of xtask reads or writes the environment; the testbed and the
    // test processes read these.
    unsafe {
        std::env::set_var("SOPA_AGENT_BIN", dir.join("sopa-agent"));
        std::env::set_var("SOPA_TRAFFIC_BIN", dir.join("sopa-traffic"));
        std::env::set_var("SOPA_CONTROLLER_BIN", dir.join("sopa-controller"));
        std::env::set_var("SOPACTL_BIN", dir.join("sopactl"));
    }
}

/// An executable cargo built for tests or benchmarks.
pub struct Executable {
    pub package: String,
    /// The target's name and kind (`lib`, `bin`, `test`, `bench`).
    pub target: String,
    pub kind: String,
    pub path: PathBuf,
    /// The package's folder: cargo runs tests and benchmarks there.
    pub dir: PathBuf,
    /// Built as a test harness (not a plain binary that tests start).
    pub harness: bool,
}

/// Runs `cargo <command> --workspace --exclude sopa-ebpf --no-run EXTRA` (`test` or `bench`)
/// and lists the executables it built.
pub fn build_executables(command: &str, extra: &[&str]) -> Result<Vec<Executable>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            command,
            "--workspace",
            "--exclude",
            "sopa-ebpf",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(extra)
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo {command} --no-run"))?;
    if !out.status.success() {
        bail!("cargo {command} --no-run failed (its messages above)");
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(path), Some(package)) = (
            msg["executable"].as_str(),
            msg["package_id"].as_str().and_then(package_name),
        ) else {
            continue;
        };
        let dir = Path::new(msg["manifest_path"].as_str().unwrap_or("."))
            .parent()
            .map_or_else(workspace_root, Path::to_path_buf);
        found.push(Executable {
            package: package.to_owned(),
            target: msg["target"]["name"].as_str().unwrap_or("?").to_owned(),
            kind: msg["target"]["kind"][0].as_str().unwrap_or("").to_owned(),
            path: PathBuf::from(path),
            dir,
            harness: msg["profile"]["test"] == true,
        });
    }
    Ok(found)
}

/// `path+file:///…/tests#sopa-testbed@0.1.0` or `registry…#name@1.0` -> the package name.
pub fn package_name(id: &str) -> Option<&str> {
    let (path, tail) = id.rsplit_once('#')?;
    match tail.split_once('@') {
        Some((name, _)) => Some(name),
        // The name is left out where it is the folder's.
        None => path.rsplit('/').next(),
    }
}

/// Runs cargo with `args` in the workspace root.
pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    status(Command::new(cargo).args(args).current_dir(workspace_root()))
}

pub fn run() -> Result<()> {
    nightly_rust_src()?;
    bpf_linker()?;
    debian_packages()?;
    python_packages()?;
    bpffs()?;
    Ok(())
}

/// Python packages the tests use, each with the module that proves it is present.
const PYTHON_PACKAGES: &[(&str, &str)] = &[
    // The Kubernetes schemas every manifest in deploy/kubernetes is validated against.
    ("kubernetes-validate==1.37.0", "kubernetes_validate"),
];

fn python_packages() -> Result<()> {
    for (package, module) in PYTHON_PACKAGES {
        let present = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if present {
            continue;
        }
        say(&format!("installing {package} from PyPI"));
        status(Command::new("python3").args(["-m", "pip", "install", "--quiet", package]))
            .with_context(|| format!("installing {package} (python3 -m pip install {package})"))?;
    }
    Ok(())
}

/// cargo-fuzz, for the fuzz targets in fuzz/ (`cargo xtask test` runs them time-bounded).
pub fn cargo_fuzz() -> Result<()> {
    if output("cargo", &["+nightly", "fuzz", "--version"]).is_ok() {
        return Ok(());
    }
    say("installing cargo-fuzz (about two minutes on 2 cores)");
    status(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
        .context("installing cargo-fuzz")
}

fn nightly_sysroot() -> Result<PathBuf> {
    let sysroot = output("rustc", &["+nightly", "--print", "sysroot"]).context(
        "the nightly toolchain is missing: the eBPF programs build with it \
         (install it with `rustup toolchain install nightly`)",
    )?;
    Ok(PathBuf::from(sysroot))
}

fn nightly_rust_src() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    // The file aya-build looks for (and the agent's build script with it).
    if sysroot
        .join("lib/rustlib/src/rust/library/Cargo.lock")
        .exists()
    {
        return Ok(());
    }
    say("installing rust-src for the nightly toolchain (build-std=core for the bpfel target)");
    status(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// The nightly's own libLLVM (bpf-linker must link the same LLVM the nightly emits).
fn nightly_libllvm() -> Result<PathBuf> {
    let lib = nightly_sysroot()?.join("lib");
    let found = std::fs::read_dir(&lib)
        .with_context(|| format!("listing {}", lib.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        });
    found.with_context(|| format!("no libLLVM.so.* in {}", lib.display()))
}

fn llvm_major(libllvm: &Path) -> Result<String> {
    let name = libllvm
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name.trim_start_matches("libLLVM.so.")
        .split(['.', '-'])
        .next()
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .with_context(|| format!("cannot read the LLVM version of {name}"))
}

/// Whether an installed bpf-linker runs and loads a libLLVM of the nightly's major version.
fn bpf_linker_links_llvm(major: &str) -> bool {
    let Ok(path) = output("sh", &["-c", "command -v bpf-linker"]) else {
        return false;
    };
    if output(&path, &["--version"]).is_err() {
        return false;
    }
    let Ok(libs) = output("ldd", &[&path]) else {
        return false;
    };
    libs.lines()
        .any(|l| l.contains(&format!("libLLVM.so.{major}")) && !l.contains("not found"))
}

fn bpf_linker() -> Result<()> {
    let libllvm = nightly_libllvm()?;
    let major = llvm_major(&libllvm)?;
    if bpf_linker_links_llvm(&major) {
        return Ok(());
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    // A prefix that stays: bpf-linker loads this libLLVM at run time.
    let prefix = cargo_home.join(format!("sopa-llvm-{major}"));
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for link in [
        lib.join("libLLVM.so"),
        lib.join(libllvm.file_name().expect("a file")),
    ] {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    say(&format!(
        "installing bpf-linker against the nightly's LLVM {major} (about a minute on 2 cores)"
    ));
    status(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("LLVM_PREFIX", &prefix)
            .env("LD_LIBRARY_PATH", &lib),
    )
    .context("installing bpf-linker")
}

fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, cmd)| !has_command(cmd))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "Debian packages missing: {}; install them as root: apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    say(&format!(
        "installing Debian packages: {}",
        missing.join(" ")
    ));
    status(Command::new("apt-get").args(["update", "-qq"]))?;
    status(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn bpffs() -> Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "))
    {
        return Ok(());
    }
    if !is_root() {
        say(
            "bpffs is not mounted at /sys/fs/bpf; the agent and the datapath tests need it (run as root)",
        );
        return Ok(());
    }
    say("mounting bpffs at /sys/fs/bpf");
    status(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_packages_from_ids() {
        assert_eq!(
            package_name("path+file:///x/tests#sopa-testbed@0.1.0"),
            Some("sopa-testbed")
        );
        assert_eq!(
            package_name("path+file:///x/sopa-agent#0.1.0"),
            Some("sopa-agent")
        );
    }

    #[test]
    fn reads_the_llvm_major_version() {
        assert_eq!(
            llvm_major(Path::new("/x/libLLVM.so.22.1-rust-1.97.0-nightly")).unwrap(),
            "22"
        );
        assert_eq!(llvm_major(Path::new("/x/libLLVM.so.19")).unwrap(), "19");
        assert!(llvm_major(Path::new("/x/libLLVM.so.")).is_err());
    }
}
