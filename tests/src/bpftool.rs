//! `bpftool`, as root on a host could run it: the testbed's way to read and write pinned maps
//! from outside the agent.

/// Entries of the map pinned at `pin` (`bpftool map dump`).
pub fn entries(pin: &std::path::Path) -> usize {
    let out = run(&[
        "-j".as_ref(),
        "map".as_ref(),
        "dump".as_ref(),
        "pinned".as_ref(),
        pin.as_os_str(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out).expect("bpftool's JSON");
    v.as_array().expect("a JSON array of entries").len()
}

/// Runs `bpftool` with `args`; panics naming its error if it fails. Returns its stdout.
pub fn run<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Vec<u8> {
    let out = std::process::Command::new("bpftool")
        .args(args)
        .output()
        .expect("bpftool");
    assert!(
        out.status.success(),
        "bpftool {:?}: {}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
