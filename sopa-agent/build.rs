//! Builds the eBPF programs (nightly, bpfel target, bpf-linker) with aya-build and leaves the
//! object in OUT_DIR, from where the agent embeds it. `cargo xtask setup` installs the toolchain.

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=SOPA_AGENT_NO_EBPF");
    if std::env::var_os("SOPA_AGENT_NO_EBPF").is_some() {
        // Builds that never load the datapath (the cargo-fuzz targets of the loaders) skip the
        // eBPF toolchain; the embedded object is then empty and loading it fails.
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        std::fs::write(out.join("sopa"), [])?;
        return Ok(());
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sopa-agent lives inside the workspace");
    let ebpf = root.join("sopa-ebpf");
    println!(
        "cargo:rerun-if-changed={}",
        root.join("sopa-common/src").display()
    );
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "sopa-ebpf",
            root_dir: ebpf.to_str().expect("workspace path is UTF-8"),
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
