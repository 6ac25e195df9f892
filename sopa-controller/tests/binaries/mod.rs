//! Shared by the suites that run the binaries (`sopactl`, `sopa-controller`): a scratch folder
//! removed however the test ends, certificates issued with `sopactl certs`, a free loopback
//! port, and a controller process killed on drop.
#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
};

/// `sopactl ARGS`: its exit code, stdout and stderr.
pub fn sopactl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sopactl"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sopactl ARGS`, which must succeed.
pub fn sopactl_ok(args: &[&str]) {
    let (code, _, err) = sopactl(args);
    assert_eq!(code, 0, "sopactl {args:?}: {err}");
}

/// A folder of this test's, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sopa-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// `name` in the folder, as a flag's value.
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }

    /// A CA per name of `cas` (`sopactl certs init`), then a certificate per (CA, role, node,
    /// folder) of `certs` (`sopactl certs issue`).
    pub fn issue(&self, cas: &[&str], certs: &[(&str, &str, &str, &str)]) {
        for ca in cas {
            sopactl_ok(&["certs", "init", &self.path(ca)]);
        }
        for (ca, role, node, out) in certs {
            sopactl_ok(&[
                "certs",
                "issue",
                "--ca",
                &self.path(ca),
                "--role",
                role,
                "--node",
                node,
                "--out",
                &self.path(out),
            ]);
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port the kernel just handed out and took back.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The shipped Fat-Tree k=4 spec.
pub fn spec() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/controller/fat-tree-k4.toml")
}

/// `sopa-controller` on the shipped spec, state in memory, with `args`.
pub fn controller(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sopa-controller"));
    c.arg("--topology")
        .arg(spec())
        .args(["--store", "memory"])
        .args(args)
        .env_remove("SOPA_METRICS_ALLOW")
        .stdout(std::process::Stdio::null());
    c
}

/// A process this test started, killed when dropped, however the test ends.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
