//! A timeout together with where its value came from, so that an error saying it passed names
//! the setting the user would change: `FABRICOLL_TIMEOUT_MS`, a communicator's
//! `fabricoll_config.timeout_ms` (torch's group timeout arrives this way), or neither.
use std::fmt;
use std::time::Duration;

/// Where a timeout's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutSource {
    /// The built-in default: `FABRICOLL_TIMEOUT_MS` is unset.
    Default,
    /// The environment's `FABRICOLL_TIMEOUT_MS`.
    Env,
    /// A communicator's options (`fabricoll_config.timeout_ms`).
    Config,
    /// A Rust caller passed the duration itself.
    Caller,
}

impl fmt::Display for TimeoutSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeoutSource::Default => "the default, FABRICOLL_TIMEOUT_MS unset",
            TimeoutSource::Env => "FABRICOLL_TIMEOUT_MS",
            TimeoutSource::Config => "fabricoll_config.timeout_ms",
            TimeoutSource::Caller => "the caller's timeout argument",
        })
    }
}

/// A timeout and its source; shown as "N ms (fabricoll_config.timeout_ms)" and the like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout {
    pub limit: Duration,
    pub source: TimeoutSource,
}

impl Timeout {
    pub fn new(limit: Duration, source: TimeoutSource) -> Timeout {
        Timeout { limit, source }
    }
}

/// A bare duration: its source is whoever passed it.
impl From<Duration> for Timeout {
    fn from(limit: Duration) -> Timeout {
        Timeout::new(limit, TimeoutSource::Caller)
    }
}

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms ({})", self.limit.as_millis(), self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_the_value_and_its_source() {
        let t = |ms, s| Timeout::new(Duration::from_millis(ms), s).to_string();
        assert_eq!(
            t(300, TimeoutSource::Config),
            "300 ms (fabricoll_config.timeout_ms)"
        );
        assert_eq!(t(20, TimeoutSource::Env), "20 ms (FABRICOLL_TIMEOUT_MS)");
        assert_eq!(
            t(600_000, TimeoutSource::Default),
            "600000 ms (the default, FABRICOLL_TIMEOUT_MS unset)"
        );
        let bare: Timeout = Duration::from_secs(1).into();
        assert_eq!(bare.source, TimeoutSource::Caller);
    }
}
