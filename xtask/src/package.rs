//! `cargo xtask package`: the Debian packages (cargo-deb), with the man pages and shell
//! completions generated from the binaries; `cargo xtask image`: the OCI images of the agent
//! and the controller, built offline from those packages on a Debian base made by mmdebstrap,
//! with podman.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::setup;

/// The cargo-deb release the packages are built with.
const CARGO_DEB: &str = "3.8.0";
/// The Debian release of the images' base.
const SUITE: &str = "bookworm";
/// The base image mmdebstrap makes (kept by podman: made once).
const BASE: &str = "localhost/sopa-base:bookworm";
/// Where the images are tagged (the manifests in deploy/kubernetes pull these names).
pub const REGISTRY: &str = "ghcr.io/sopa";
/// podman's flags for every container it runs here: runc (crun refuses a host whose cgroups
/// are mounted hybrid, v1 beside a v2 tree), and limits within this host's hard ones (podman's
/// defaults ask for more open files than a service's limit may allow).
pub const PODMAN_RUNTIME: [&str; 2] = ["--runtime", "runc"];
pub const PODMAN_LIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=4096:4096",
    "--ulimit",
    "nproc=4096:4096",
];

fn run(cmd: &mut Command) -> Result<String> {
    let desc = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {desc}"))?;
    if !out.status.success() {
        bail!(
            "{desc} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn cargo_deb_installed() -> bool {
    Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(CARGO_DEB))
}

/// The man pages and completions of the three binaries, into target/assets/.
fn assets(release: &Path, out: &Path) -> Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(&completions)
        .with_context(|| format!("creating {}", completions.display()))?;
    let man_s = man.display().to_string();
    run(Command::new(release.join("sopa-agent")).args(["man", &man_s]))?;
    run(Command::new(release.join("sopactl")).args(["man", &man_s]))?;
    run(Command::new(release.join("sopa-controller")).args(["--man-dir", &man_s]))?;
    for bin in ["sopa-agent", "sopactl", "sopa-controller"] {
        for (shell, file) in [
            ("bash", format!("{bin}.bash")),
            ("zsh", format!("_{bin}")),
            ("fish", format!("{bin}.fish")),
        ] {
            let script = if bin == "sopa-controller" {
                run(Command::new(release.join(bin)).args(["--completions", shell]))?
            } else {
                run(Command::new(release.join(bin)).args(["completions", shell]))?
            };
            std::fs::write(completions.join(&file), script)
                .with_context(|| format!("writing {file}"))?;
        }
    }
    Ok(())
}

/// Builds the release binaries, their man pages and completions, and the two packages; returns
/// the packages' paths.
pub fn packages() -> Result<Vec<PathBuf>> {
    if !cargo_deb_installed() {
        eprintln!("[package] installing cargo-deb {CARGO_DEB} (a few minutes on 2 cores)");
        run(Command::new("cargo").args([
            "install",
            "cargo-deb",
            "--locked",
            "--version",
            CARGO_DEB,
        ]))
        .context("installing cargo-deb")?;
    }
    eprintln!("[package] building the release binaries");
    setup::cargo(&[
        "build",
        "--release",
        "-p",
        "sopa-agent",
        "-p",
        "sopa-controller",
        "--bins",
    ])?;
    let root = setup::workspace_root();
    let release = root.join("target/release");
    assets(&release, &root.join("target/assets"))?;
    let out = root.join("target/debian");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut debs = Vec::new();
    for package in ["sopa-agent", "sopa-controller"] {
        let path = run(Command::new("cargo")
            .args(["deb", "--no-build", "--no-strip", "-p", package, "--output"])
            .arg(&out)
            .current_dir(&root))?;
        let path = PathBuf::from(path.trim().lines().last().unwrap_or_default());
        eprintln!("[package] {}", path.display());
        debs.push(path);
    }
    Ok(debs)
}

/// The image tag of `name` (`sopa-agent`, `sopa-controller`) at this version.
pub fn tag(name: &str) -> String {
    format!("{REGISTRY}/{name}:{}", env!("CARGO_PKG_VERSION"))
}

/// The base image: Debian's minbase by mmdebstrap, imported into podman once.
fn base(work: &Path) -> Result<()> {
    let exists = Command::new("podman")
        .args(["image", "exists", BASE])
        .status()
        .is_ok_and(|s| s.success());
    if exists {
        return Ok(());
    }
    let tar = work.join("base.tar");
    eprintln!("[image] making the base: mmdebstrap --variant=minbase {SUITE} (about a minute)");
    run(Command::new("mmdebstrap")
        .args(["--quiet", "--variant=minbase", SUITE])
        .arg(&tar))?;
    run(Command::new("podman").arg("import").arg(&tar).arg(BASE))?;
    let _ = std::fs::remove_file(&tar);
    Ok(())
}

/// Builds the packages, then the agent's and the controller's images from them.
pub fn image() -> Result<Vec<String>> {
    let missing: Vec<&str> = ["podman", "mmdebstrap", "runc"]
        .into_iter()
        .filter(|p| !setup::has_command(p))
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "[image] installing {} (Debian packages)",
            missing.join(", ")
        );
        run(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))
        .context("installing podman, mmdebstrap and runc")?;
    }
    let debs = packages()?;
    let root = setup::workspace_root();
    let work = root.join("target/image");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    base(&work)?;
    let context = debs[0].parent().expect("target/debian").to_owned();
    let mut tags = Vec::new();
    for name in ["sopa-agent", "sopa-controller"] {
        let file = root.join(format!(
            "deploy/image/{}.Containerfile",
            name.trim_start_matches("sopa-")
        ));
        let tag = tag(name);
        eprintln!("[image] building {tag}");
        run(Command::new("podman")
            .args(PODMAN_RUNTIME)
            .arg("build")
            .args(PODMAN_LIMITS)
            .args(["--quiet", "--network=none", "--build-arg"])
            .arg(format!("BASE={BASE}"))
            .arg("--file")
            .arg(&file)
            .args(["--tag", &tag])
            .arg(&context))?;
        tags.push(tag);
    }
    Ok(tags)
}
