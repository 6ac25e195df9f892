//! `sopactl`'s exit codes by cause, so a script can tell "try again" from "the controller said
//! no" from "fix what you gave": the causes every SOPA binary shares (`sopa_ops::exit`) and two
//! of a client's own.

use sopa_ops::exit::{CONFIG, FAILURE, OK, PRIVILEGES, USAGE};

/// The controller refused the request and said why (`EX_DATAERR`): an unknown link, a drain
/// that would cut a rack off, a revoked serial.
pub const REFUSED: u8 = 65;
/// No controller answered: none runs or leads, or none answered within --timeout
/// (`EX_TEMPFAIL`): trying again may succeed.
pub const UNAVAILABLE: u8 = 75;

/// Every code with its cause, for `--help` and the docs.
pub const TABLE: [(u8, &str); 7] = [
    (OK, "done"),
    (
        FAILURE,
        "a failure at run time (I/O, an answer it could not read)",
    ),
    (USAGE, "usage: an unknown flag or a bad value"),
    (REFUSED, "the controller refused the request (it says why)"),
    (
        UNAVAILABLE,
        "no controller answered (none runs or leads, or none in time): try again",
    ),
    (
        PRIVILEGES,
        "the controller refused this identity or certificate, or a file's permissions did",
    ),
    (
        CONFIG,
        "what was given is refused: a topology, an inventory, certificates, an address",
    ),
];

/// The exit codes as a paragraph for `--help`.
pub fn help() -> String {
    let mut out = String::from("Exit codes:");
    for (code, cause) in TABLE {
        out.push_str(&format!("\n  {code:>3}  {cause}"));
    }
    out
}

/// An error with its exit code, for the causes the error's place knows (the controller's
/// answer, the connection's settings).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Coded {
    pub code: u8,
    pub message: String,
}

impl Coded {
    pub fn error(code: u8, message: impl Into<String>) -> anyhow::Error {
        Coded {
            code,
            message: message.into(),
        }
        .into()
    }
}

/// The code of `err`: the one its place gave it ([`Coded`]), else by an I/O error in its chain
/// (a permission: [`PRIVILEGES`]; a file not found: `otherwise`; another, such as a full disk:
/// [`FAILURE`]), else `otherwise`: [`CONFIG`] for the commands that only read what they were
/// given (`topo`, `fabric`, `certs init|issue`), [`FAILURE`] for those that ask a controller.
pub fn code(err: &anyhow::Error, otherwise: u8) -> u8 {
    if let Some(c) = err.chain().find_map(|e| e.downcast_ref::<Coded>()) {
        return c.code;
    }
    match err
        .chain()
        .find_map(|e| e.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind)
    {
        Some(std::io::ErrorKind::PermissionDenied) => PRIVILEGES,
        Some(std::io::ErrorKind::NotFound) | None => otherwise,
        Some(_) => FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    use super::*;

    #[test]
    fn the_place_that_knows_the_cause_decides_then_io_then_the_command() {
        let refused = Err::<(), _>(Coded::error(REFUSED, "no link a0:zz"))
            .context("sopactl link down")
            .unwrap_err();
        assert_eq!(code(&refused, FAILURE), REFUSED);
        let denied =
            anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
                .context("reading ca.key");
        assert_eq!(code(&denied, CONFIG), PRIVILEGES);
        let io = |kind| anyhow::Error::from(std::io::Error::from(kind)).context("topology.toml");
        assert_eq!(code(&io(std::io::ErrorKind::NotFound), CONFIG), CONFIG);
        assert_eq!(code(&io(std::io::ErrorKind::StorageFull), CONFIG), FAILURE);
        assert_eq!(
            code(&anyhow::anyhow!("--fail e0: NODE:NODE"), CONFIG),
            CONFIG
        );
        assert_eq!(code(&anyhow::anyhow!("an answer"), FAILURE), FAILURE);
        assert!(help().contains(" 65  the controller refused"));
    }
}
