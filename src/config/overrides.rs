//! A communicator's own settings over the environment's (`Overrides`, the C API's
//! `fabricoll_config`), and the configuration they make (`Config::with_overrides`).
use super::{AlgoSetting, Compression, Config, TimeoutSource};
use crate::error::{Error, Result};
use std::time::Duration;

/// A communicator's own settings over the environment's (the C API's `fabricoll_config`):
/// each `Some` replaces what the environment says; `None` keeps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Milliseconds, 1..=86400000: the communicator's deadline, and its bootstrap's.
    pub timeout_ms: Option<i64>,
    /// The communicator's default algorithm.
    pub algo: Option<crate::algo::Algorithm>,
    /// The provider of its fabric (a libfabric provider name).
    pub provider: Option<String>,
    /// The provider between ranks of one host, or "same" (one fabric for every peer).
    pub intra_provider: Option<String>,
    /// The address (IPv4 or IPv6 of this host) a unique id's bootstrap root listens on.
    pub bootstrap_addr: Option<String>,
    /// Whether a failed in-place collective restores its input.
    pub inplace_restore: Option<bool>,
    /// The compressed collectives' format and block size.
    pub compress: Option<crate::compress::Format>,
    pub compress_block: Option<usize>,
}

impl Config {
    /// This configuration with `o`'s settings in place of its own. A bad setting is an
    /// invalid argument naming its field (`config.timeout_ms`, ...).
    pub fn with_overrides(&self, o: &Overrides) -> Result<Config> {
        let mut c = self.clone();
        let field = |name: &str, v: &str, accepted: &str| {
            Error::arg(
                name,
                format!("{v:?} is invalid; accepted values: {accepted}"),
            )
        };
        if let Some(ms) = o.timeout_ms {
            if !(1..=86_400_000).contains(&ms) {
                return Err(field(
                    "config.timeout_ms",
                    &ms.to_string(),
                    "0 (FABRICOLL_TIMEOUT_MS) or 1..=86400000",
                ));
            }
            c.timeout = Duration::from_millis(ms as u64);
            c.timeout_source = TimeoutSource::Config;
        }
        if let Some(a) = o.algo {
            c.algo = AlgoSetting::everywhere(Some(a));
        }
        if let Some(r) = o.inplace_restore {
            c.inplace_restore = r;
        }
        if let Some(f) = o.compress {
            c.compress.format = f;
        }
        if let Some(b) = o.compress_block {
            c.compress.block = Compression::block("config.compress_block", &b.to_string())?;
        }
        let provider_name = |name: &str, v: &str| -> Result<String> {
            let v = v.trim();
            if !v.is_empty()
                && v.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "_;-".contains(ch))
            {
                Ok(v.to_string())
            } else {
                Err(field(
                    name,
                    v,
                    "a libfabric provider name: efa, tcp, net, shm, ...",
                ))
            }
        };
        if let Some(p) = &o.provider {
            c.provider = Some(provider_name("config.provider", p)?);
            c.provider_var = "config.provider";
        }
        if let Some(p) = &o.intra_provider {
            c.intra_provider = if p.trim().eq_ignore_ascii_case("same") {
                None
            } else {
                Some(provider_name("config.intra_provider", p)?)
            };
            c.intra_provider_var = "config.intra_provider";
            c.intra_provider_default = false;
        }
        if let Some(a) = &o.bootstrap_addr {
            c.bootstrap_addr = Some(a.trim().parse().map_err(|_| {
                field(
                    "config.bootstrap_addr",
                    a,
                    "an IPv4 or IPv6 address of this host",
                )
            })?);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::parse;

    #[test]
    fn overrides_replace_the_environment_field_by_field() {
        let env = parse(&[
            ("FABRICOLL_TIMEOUT_MS", "600000"),
            ("FABRICOLL_ALGO", "ring"),
        ])
        .unwrap();
        assert_eq!(env.with_overrides(&Overrides::default()).unwrap(), env);
        let c = env
            .with_overrides(&Overrides {
                timeout_ms: Some(250),
                provider: Some("tcp;ofi_rxm".into()),
                intra_provider: Some("same".into()),
                bootstrap_addr: Some("::1".into()),
                ..Overrides::default()
            })
            .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert_eq!(
            c.timeout_setting().to_string(),
            "250 ms (fabricoll_config.timeout_ms)"
        );
        assert_eq!(
            env.timeout_setting().to_string(),
            "600000 ms (FABRICOLL_TIMEOUT_MS)"
        );
        assert_eq!(c.algo, env.algo, "unset fields keep the environment's");
        assert_eq!(c.provider.as_deref(), Some("tcp;ofi_rxm"));
        assert_eq!(c.provider_var, "config.provider");
        assert_eq!(c.intra_provider, None);
        assert_eq!(c.bootstrap_addr, Some("::1".parse().unwrap()));
        assert_eq!(env.provider_var, "FABRICOLL_PROVIDER");
    }

    #[test]
    fn bad_overrides_name_the_field() {
        let env = parse(&[]).unwrap();
        let with = |set: fn(&mut Overrides)| {
            let mut o = Overrides::default();
            set(&mut o);
            o
        };
        for (o, name) in [
            (with(|o| o.timeout_ms = Some(-1)), "config.timeout_ms"),
            (
                with(|o| o.timeout_ms = Some(86_400_001)),
                "config.timeout_ms",
            ),
            (
                with(|o| o.provider = Some("shm net".into())),
                "config.provider",
            ),
            (
                with(|o| o.provider = Some(String::new())),
                "config.provider",
            ),
            (
                with(|o| o.intra_provider = Some("a/b".into())),
                "config.intra_provider",
            ),
            (
                with(|o| o.bootstrap_addr = Some("localhost".into())),
                "config.bootstrap_addr",
            ),
        ] {
            let e = env.with_overrides(&o).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            assert!(e.to_string().contains(name), "{e}");
        }
    }
}
