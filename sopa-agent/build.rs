//! Builds the eBPF programs (nightly, bpfel target, bpf-linker) with aya-build and leaves the
//! object in OUT_DIR, from where the agent embeds it. `cargo xtask setup` installs the toolchain.
//!
//! Without that toolchain (a fresh machine, where `cargo xtask` itself must build before it can
//! install anything) the object is left empty, with a warning; loading it then fails with a
//! message that says to run `cargo xtask setup`, and the next build, once the toolchain is
//! there, builds the programs (this script runs again on every build until then).

use std::path::{Path, PathBuf};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=SOPA_AGENT_NO_EBPF");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    if std::env::var_os("SOPA_AGENT_NO_EBPF").is_some() {
        // Builds that never load the datapath (the cargo-fuzz targets of the loaders) skip the
        // eBPF toolchain; the embedded object is then empty and loading it fails.
        std::fs::write(out.join("sopa"), [])?;
        return Ok(());
    }
    let missing = missing_toolchain();
    if !missing.is_empty() {
        println!(
            "cargo:warning=the eBPF programs are not built ({}): run `cargo xtask setup`, then \
             build again; until then this agent cannot load its datapath",
            missing.join("; ")
        );
        // A file that never exists: cargo runs this script again on every build, so the
        // programs are built as soon as the toolchain is installed.
        println!(
            "cargo:rerun-if-changed={}",
            out.join("ebpf-toolchain-missing").display()
        );
        // Written once: rewriting it on every build would rebuild the agent every time.
        let object = out.join("sopa");
        if std::fs::metadata(&object).map_or(true, |m| m.len() != 0) {
            std::fs::write(object, [])?;
        }
        return Ok(());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sopa-agent lives inside the workspace");
    let ebpf = root.join("sopa-ebpf");
    println!(
        "cargo:rerun-if-changed={}",
        root.join("sopa-common/src").display()
    );
    // aya-build hands every line the inner cargo writes to stderr to the outer one as a
    // `cargo:warning`: about forty `warning: sopa-agent@…: Compiling …` lines on a first build.
    // Quiet, the inner cargo writes only what goes wrong (its compiler messages still come
    // through), and the outer build shows its one progress line.
    // SAFETY: a build script is one thread; the inner cargo inherits the variable.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "sopa-ebpf",
            root_dir: ebpf.to_str().expect("workspace path is UTF-8"),
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}

/// What the eBPF build needs and this machine lacks: the nightly toolchain, its `rust-src`
/// (build-std=core for the bpfel target), and `bpf-linker` on the PATH.
fn missing_toolchain() -> Vec<String> {
    let mut missing = Vec::new();
    let sysroot = std::process::Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match sysroot {
        None => missing.push("no nightly toolchain".to_owned()),
        Some(s) if !s.join("lib/rustlib/src/rust/library/Cargo.lock").exists() => {
            missing.push("the nightly has no rust-src".to_owned())
        }
        Some(_) => {}
    }
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("bpf-linker").is_file())
    });
    if !on_path {
        missing.push("no bpf-linker on the PATH".to_owned());
    }
    missing
}
