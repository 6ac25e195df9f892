//! Logs: to stderr (journald and `kubectl logs` take them from there), as text or as one JSON
//! object per line (`--log-format json`), coloured only on a terminal and never with
//! `NO_COLOR` set, filtered by `SOPA_LOG` (an `EnvFilter`: `info`, `sopa_agent=debug`, …).

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per event (timestamp, level, target, fields), for log collectors.
    Json,
}

/// The logging flags every binary takes.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// How log lines are written to stderr: text, or one JSON object per line. Colour only on
    /// a terminal and without NO_COLOR; the filter is SOPA_LOG (e.g. `info`, `debug`,
    /// `sopa_agent=debug`).
    #[arg(long, env = "SOPA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

/// Colour: only on a terminal, and never when `NO_COLOR` is set to anything but empty
/// (<https://no-color.org>).
pub fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the subscriber: `default_filter` where `SOPA_LOG` is unset or invalid.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_env("SOPA_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter));
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// The first line every process logs: what it is and which version.
pub fn starting(binary: &str, role: &str) {
    tracing::info!(
        version = crate::build_info::VERSION,
        role,
        pid = std::process::id(),
        "{binary} starting"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(!colour(false, None));
        assert!(!colour(true, Some(OsStr::new("1"))));
        // An empty NO_COLOR does not count (no-color.org).
        assert!(colour(true, Some(OsStr::new(""))));
    }
}
