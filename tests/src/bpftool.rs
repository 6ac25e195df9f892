//! `bpftool`, as root on a host could run it: the testbed's way to read and write pinned maps
//! from outside the agent.

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
