//! Durations on the command line and in the environment: `500ms`, `2s`, `1m 30s` (humantime),
//! or a bare number of milliseconds, the unit of the `*_ms` flags they replace (which stay as
//! aliases, and whose `SOPA_*_MS` variables [`env_aliases`] still reads).

use std::{fmt, str::FromStr, time::Duration};

/// A duration flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    pub const fn ms(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// A whole number of milliseconds (what travels where a period is carried in ms).
    pub fn is_whole_ms(&self) -> bool {
        self.0.subsec_nanos().is_multiple_of(1_000_000)
    }
}

impl From<Dur> for Duration {
    fn from(d: Dur) -> Self {
        d.0
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not a duration: give one with its unit (500ms, 2s, 1m) or a number of milliseconds"
)]
pub struct DurationError(String);

impl FromStr for Dur {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Ok(ms) = s.parse::<u64>() {
            return Ok(Self::ms(ms));
        }
        humantime::parse_duration(s)
            .map(Self)
            .map_err(|_| DurationError(s.to_owned()))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// Where `old` (a `SOPA_*_MS` variable of an earlier release) is set and `new` is not, sets
/// `new` to it: both parse the same (a bare number is milliseconds). Call before parsing the
/// command line, before any thread starts.
pub fn env_aliases(pairs: &[(&str, &str)]) {
    for (old, new) in pairs {
        if std::env::var_os(new).is_none()
            && let Some(v) = std::env::var_os(old)
        {
            // SAFETY: called first in main, while the process has one thread.
            unsafe { std::env::set_var(new, v) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_or_milliseconds() {
        assert_eq!("500ms".parse::<Dur>().unwrap(), Dur::ms(500));
        assert_eq!("2s".parse::<Dur>().unwrap(), Dur::ms(2000));
        assert_eq!("1m 30s".parse::<Dur>().unwrap(), Dur::ms(90_000));
        assert_eq!("1000".parse::<Dur>().unwrap(), Dur::ms(1000));
        assert_eq!(Dur::ms(1500).to_string(), "1s 500ms");
        assert_eq!(
            Dur::ms(1500).to_string().parse::<Dur>().unwrap(),
            Dur::ms(1500)
        );
        let err = "soon".parse::<Dur>().unwrap_err().to_string();
        assert!(err.contains("\"soon\"") && err.contains("500ms"), "{err}");
    }
}
