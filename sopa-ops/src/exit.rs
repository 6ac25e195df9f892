//! Exit codes by cause, the same for every SOPA binary, so a unit can tell a failure that a
//! restart cures from one it cannot (`RestartPreventExitStatus=`).
//!
//! | code | cause | restart helps? |
//! |---|---|---|
//! | 0 | done (a signal, a finished command) | |
//! | 1 | a failure at run time (I/O, netlink, a program the kernel refused) | maybe |
//! | 2 | usage: an unknown flag or a bad value (clap's) | no |
//! | 69 | the kernel lacks a feature the configuration needs, or bpffs is not mounted | no |
//! | 75 | a controller replica lost its leadership: start it again to wait for it | yes |
//! | 77 | privileges: a capability or a permission is missing | no |
//! | 78 | configuration: a file, a flag's meaning, or the node's state refuses it | no |

/// Done.
pub const OK: u8 = 0;
/// A failure at run time.
pub const FAILURE: u8 = 1;
/// A bad command line (clap exits with it).
pub const USAGE: u8 = 2;
/// The kernel lacks a feature the configuration needs (`EX_UNAVAILABLE`).
pub const KERNEL: u8 = 69;
/// A controller replica lost its leadership (`EX_TEMPFAIL`): its supervisor starts it again.
pub const LOST_LEADERSHIP: u8 = 75;
/// A capability or permission is missing (`EX_NOPERM`).
pub const PRIVILEGES: u8 = 77;
/// The configuration is refused (`EX_CONFIG`).
pub const CONFIG: u8 = 78;

/// Every code with its cause, for `--help` texts and the docs.
pub const TABLE: [(u8, &str); 7] = [
    (OK, "done"),
    (FAILURE, "a failure at run time"),
    (USAGE, "usage: an unknown flag or a bad value"),
    (
        KERNEL,
        "the kernel lacks a feature the configuration needs (or bpffs is not mounted)",
    ),
    (
        LOST_LEADERSHIP,
        "a controller replica lost its leadership (restart it)",
    ),
    (PRIVILEGES, "a capability or a permission is missing"),
    (CONFIG, "the configuration is refused"),
];

/// The exit codes as a paragraph for a binary's `--help` (`after_help`).
pub fn help() -> String {
    let mut out = String::from("Exit codes:");
    for (code, cause) in TABLE {
        out.push_str(&format!("\n  {code:>3}  {cause}"));
    }
    out
}
