//! The configuration from `FABRICOLL_*` variables (their table: `vars`). Parsed once; an invalid
//! value is an error that names the variable and the accepted values.
use crate::error::{Error, Result};
use once_cell::sync::OnceCell;
use std::time::Duration;

mod algo;
mod compress;
mod overrides;
mod timeout;
mod vars;

pub use algo::{AlgoSetting, Forced};
pub use compress::{CompressLevels, Compression};
pub use overrides::Overrides;
pub use timeout::{Timeout, TimeoutSource};
pub use vars::{Var, VARS};

/// The resolved configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub provider: Option<String>,
    pub domains: Option<Vec<String>>,
    pub timeout: Duration,
    /// Where `timeout` came from, for the errors that say it passed (`timeout_setting`).
    pub timeout_source: TimeoutSource,
    pub log: Option<String>,
    pub speed_mbps: u32,
    /// `FABRICOLL_POLL_US`; None: the transport's default (`transport::Caps::poll_window`).
    pub poll: Option<Duration>,
    /// `FABRICOLL_MR_CACHE`; None: the plugin flavour's default (`plugin::Flavour::mr_cache`).
    pub mr_cache: Option<bool>,
    /// `FABRICOLL_SHM_FASTBOX`: small shm messages through our own rings (transport::fabric).
    pub shm_fastbox: bool,
    /// `FABRICOLL_TUNER`: the tuner plugin prices CollNet (`plugin::tuner`).
    pub tuner: bool,
    /// `FABRICOLL_INPLACE_RESTORE`: a failed in-place collective restores its input (at the
    /// cost of a copy of it per call); off by default, as MPI and NCCL (`exec::Args::restore`).
    pub inplace_restore: bool,
    /// `FABRICOLL_DEVICE_DIRECT`: which of the C API's device calls move device memory without
    /// a host copy where the provider registers it (`coll::device`).
    pub device_direct: DeviceDirect,
    /// `FABRICOLL_NET_STREAMS`: endpoints per net plugin comm; None: the provider's default
    /// (`transport::Caps::net_streams`).
    pub net_streams: Option<usize>,
    /// `FABRICOLL_CALIBRATION_CACHE`: the directory where rank 0 keeps the calibrations of
    /// one-host communicators across processes, per machine and topology (`coll` calibration);
    /// None: a calibration lives as long as its process.
    pub calibration_dir: Option<std::path::PathBuf>,
    /// `FABRICOLL_ALGO`: the algorithm forced on each collective.
    pub algo: AlgoSetting,
    /// `FABRICOLL_COMPRESS` and `FABRICOLL_COMPRESS_BLOCK`: the wire format of compressed
    /// collectives (`coll` compressed; off by default).
    pub compress: Compression,
    /// `FABRICOLL_COMPRESS_LEVELS`: on hosts of several ranks each, whether compressed
    /// collectives compress the inter-host level only (shared memory in full precision) or
    /// every level alike.
    pub compress_levels: CompressLevels,
    /// `FABRICOLL_COMPRESS_CHUNK`: bytes of a compressed call's data per chunk of its
    /// pipeline (None: `compress::DEFAULT_CHUNK`; 0: one chunk, not pipelined).
    pub compress_chunk: Option<usize>,
    pub alpha_us: Option<f64>,
    pub beta_gbps: Option<f64>,
    pub gamma_gbps: Option<f64>,
    pub local_ranks: Option<usize>,
    /// `FABRICOLL_INTRA_PROVIDER`: None means one fabric for every peer ("same").
    pub intra_provider: Option<String>,
    /// `FABRICOLL_HOST`: overrides the detected host identity.
    pub host: Option<String>,
    /// `FABRICOLL_ROOT`: where rank 0 serves the bootstrap, as given (resolved when used).
    pub root: Option<String>,
    /// `FABRICOLL_ROOT_FILE`: the file rank 0 writes its unique id to.
    pub root_file: Option<std::path::PathBuf>,
    /// `FABRICOLL_JOB_ID`: the job's identity, shared by its ranks, where the launcher gives
    /// none (or in place of the launcher's).
    pub job_id: Option<String>,
    pub bootstrap_addr: Option<std::net::IpAddr>,
    /// Where `provider` came from, for errors: `FABRICOLL_PROVIDER`, `FI_PROVIDER` (read where
    /// `FABRICOLL_PROVIDER` is not set), or `config.provider` where a communicator's options
    /// set it (`with_overrides`).
    pub provider_var: &'static str,
    /// Where `intra_provider` came from: `FABRICOLL_INTRA_PROVIDER` or `config.intra_provider`.
    pub intra_provider_var: &'static str,
    /// `intra_provider` is the default (`shm`), set by no one: where it cannot be had, the
    /// provider between hosts serves every peer instead (`transport::open::engines`). One that
    /// was set and cannot be had is an error.
    pub intra_provider_default: bool,
}

/// `FABRICOLL_DEVICE_DIRECT`: which device calls may go direct (no host copy) where the
/// provider registers device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceDirect {
    /// Every call is staged through page-locked host memory.
    Off,
    /// Blocking, non-blocking and grouped calls; stream-ordered ones are staged.
    Auto,
    /// Stream-ordered calls too (the callers' streams must be non-blocking).
    Streams,
}

fn bad(name: &str, value: &str) -> Error {
    let accepted = VARS
        .iter()
        // FI_PROVIDER stands in for FABRICOLL_PROVIDER and takes what it takes.
        .find(|v| v.name == name || (name == "FI_PROVIDER" && v.name == "FABRICOLL_PROVIDER"))
        .map(|v| v.accepted)
        .unwrap_or("?");
    Error::InvalidArgument(format!(
        "environment variable {name}={value:?} is invalid; accepted values: {accepted}"
    ))
}

fn int(name: &str, value: &str, lo: u64, hi: u64) -> Result<u64> {
    match value.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(bad(name, value)),
    }
}

impl Config {
    /// Parse from any lookup (the environment in production, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let nonempty = |n: &str| get(n).filter(|v| !v.trim().is_empty());
        // libfabric's own FI_PROVIDER stands in for FABRICOLL_PROVIDER, and errors name it.
        let (provider, provider_var) = match nonempty("FABRICOLL_PROVIDER") {
            Some(p) => (Some(p), "FABRICOLL_PROVIDER"),
            None => match nonempty("FI_PROVIDER") {
                Some(p) => (Some(p), "FI_PROVIDER"),
                None => (None, "FABRICOLL_PROVIDER"),
            },
        };
        if let Some(p) = &provider {
            if !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_;-".contains(c))
            {
                return Err(bad(provider_var, p));
            }
        }
        let domains = match nonempty("FABRICOLL_DOMAIN") {
            None => None,
            Some(v) => {
                let list: Vec<String> = v
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                if list.is_empty() {
                    return Err(bad("FABRICOLL_DOMAIN", &v));
                }
                Some(list)
            }
        };
        let (timeout, timeout_source) = match nonempty("FABRICOLL_TIMEOUT_MS") {
            None => (Duration::from_millis(600_000), TimeoutSource::Default),
            Some(v) => (
                Duration::from_millis(int("FABRICOLL_TIMEOUT_MS", &v, 1, 86_400_000)?),
                TimeoutSource::Env,
            ),
        };
        let log = nonempty("FABRICOLL_LOG");
        if let Some(l) = &log {
            // Accept env_logger's syntax: level, or module=level pairs.
            let ok = l.split(',').all(|part| {
                let lvl = part.rsplit('=').next().unwrap_or("").trim();
                matches!(
                    lvl.to_ascii_lowercase().as_str(),
                    "off" | "error" | "warn" | "info" | "debug" | "trace"
                )
            });
            if !ok {
                return Err(bad("FABRICOLL_LOG", l));
            }
        }
        let speed_mbps = match nonempty("FABRICOLL_SPEED_MBPS") {
            None => 10_000,
            Some(v) => int("FABRICOLL_SPEED_MBPS", &v, 1, 10_000_000)? as u32,
        };
        let poll = match nonempty("FABRICOLL_POLL_US") {
            None => None,
            Some(v) => Some(Duration::from_micros(int(
                "FABRICOLL_POLL_US",
                &v,
                0,
                1_000_000,
            )?)),
        };
        let mr_cache = match nonempty("FABRICOLL_MR_CACHE").as_deref().map(str::trim) {
            None => None,
            Some("1") => Some(true),
            Some("0") => Some(false),
            Some(v) => return Err(bad("FABRICOLL_MR_CACHE", v)),
        };
        let shm_fastbox = match nonempty("FABRICOLL_SHM_FASTBOX").as_deref().map(str::trim) {
            None | Some("1") => true,
            Some("0") => false,
            Some(v) => return Err(bad("FABRICOLL_SHM_FASTBOX", v)),
        };
        let tuner = match nonempty("FABRICOLL_TUNER").as_deref().map(str::trim) {
            None | Some("1") => true,
            Some("0") => false,
            Some(v) => return Err(bad("FABRICOLL_TUNER", v)),
        };
        let inplace_restore = match nonempty("FABRICOLL_INPLACE_RESTORE")
            .as_deref()
            .map(str::trim)
        {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(bad("FABRICOLL_INPLACE_RESTORE", v)),
        };
        let device_direct = match nonempty("FABRICOLL_DEVICE_DIRECT")
            .as_deref()
            .map(str::trim)
        {
            None | Some("auto") => DeviceDirect::Auto,
            Some("streams") => DeviceDirect::Streams,
            Some("off") => DeviceDirect::Off,
            Some(v) => return Err(bad("FABRICOLL_DEVICE_DIRECT", v)),
        };
        let net_streams = match nonempty("FABRICOLL_NET_STREAMS") {
            None => None,
            Some(v) => Some(int("FABRICOLL_NET_STREAMS", &v, 1, 8)? as usize),
        };
        let algo = match nonempty("FABRICOLL_ALGO") {
            None => AlgoSetting::default(),
            Some(v) => AlgoSetting::parse("FABRICOLL_ALGO", &v)?,
        };
        let positive = |name: &str| -> Result<Option<f64>> {
            match nonempty(name) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                    _ => Err(bad(name, &v)),
                },
            }
        };
        let alpha_us = positive("FABRICOLL_ALPHA_US")?;
        let beta_gbps = positive("FABRICOLL_BETA_GBPS")?;
        let gamma_gbps = positive("FABRICOLL_GAMMA_GBPS")?;
        let local_ranks = match nonempty("FABRICOLL_LOCAL_RANKS") {
            None => None,
            Some(v) => Some(int("FABRICOLL_LOCAL_RANKS", &v, 1, 1 << 20)? as usize),
        };
        let provider_name = |name: &str, v: &str| -> Result<()> {
            if v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_;-".contains(c))
            {
                Ok(())
            } else {
                Err(bad(name, v))
            }
        };
        let intra_provider_default = nonempty("FABRICOLL_INTRA_PROVIDER").is_none();
        let intra_provider =
            match nonempty("FABRICOLL_INTRA_PROVIDER").map(|v| v.trim().to_string()) {
                None => Some("shm".to_string()),
                Some(v) if v.eq_ignore_ascii_case("same") => None,
                Some(v) => {
                    provider_name("FABRICOLL_INTRA_PROVIDER", &v)?;
                    Some(v)
                }
            };
        let host = nonempty("FABRICOLL_HOST").map(|v| v.trim().to_string());
        let root = match nonempty("FABRICOLL_ROOT").map(|v| v.trim().to_string()) {
            None => None,
            Some(v) => match v.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) => Some(v),
                _ => return Err(bad("FABRICOLL_ROOT", &v)),
            },
        };
        let root_file = nonempty("FABRICOLL_ROOT_FILE").map(|v| std::path::PathBuf::from(v.trim()));
        let job_id = nonempty("FABRICOLL_JOB_ID").map(|v| v.trim().to_string());
        // Unset: the user's cache directory, as XDG says; "0": none.
        let calibration_dir = match nonempty("FABRICOLL_CALIBRATION_CACHE")
            .as_deref()
            .map(str::trim)
        {
            Some("0") => None,
            Some(dir) => Some(std::path::PathBuf::from(dir)),
            None => nonempty("XDG_CACHE_HOME")
                .map(std::path::PathBuf::from)
                .or_else(|| nonempty("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
                .map(|d| d.join("fabricoll")),
        };
        let bootstrap_addr = match nonempty("FABRICOLL_BOOTSTRAP_ADDR") {
            None => None,
            Some(v) => Some(
                v.trim()
                    .parse()
                    .map_err(|_| bad("FABRICOLL_BOOTSTRAP_ADDR", &v))?,
            ),
        };
        Ok(Config {
            algo,
            compress: Compression::from_lookup(&get)?,
            compress_levels: CompressLevels::from_lookup(&get)?,
            compress_chunk: match nonempty("FABRICOLL_COMPRESS_CHUNK") {
                None => None,
                Some(v) => Some(int("FABRICOLL_COMPRESS_CHUNK", &v, 0, 1 << 40)? as usize),
            },
            alpha_us,
            beta_gbps,
            gamma_gbps,
            local_ranks,
            intra_provider,
            host,
            root,
            root_file,
            job_id,
            bootstrap_addr,
            provider,
            provider_var,
            intra_provider_var: "FABRICOLL_INTRA_PROVIDER",
            intra_provider_default,
            domains,
            timeout,
            timeout_source,
            log,
            speed_mbps,
            poll,
            mr_cache,
            shm_fastbox,
            tuner,
            inplace_restore,
            device_direct,
            net_streams,
            calibration_dir,
        })
    }

    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|n| std::env::var(n).ok())
    }

    /// `timeout` with where it came from: what the waits bounded by it carry, so that their
    /// errors name the setting to change.
    pub fn timeout_setting(&self) -> Timeout {
        Timeout::new(self.timeout, self.timeout_source)
    }
}

static CONFIG: OnceCell<Result<Config>> = OnceCell::new();

/// The process-wide configuration, parsed from the environment on first use.
pub fn get() -> Result<&'static Config> {
    CONFIG
        .get_or_init(Config::from_env)
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    pub(super) fn parse(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|n| m.get(n).cloned())
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(600));
        assert_eq!(c.timeout_source, TimeoutSource::Default);
        assert_eq!(c.provider, None);
        assert_eq!(c.mr_cache, None);
        assert!(c.shm_fastbox);
        assert!(
            !parse(&[("FABRICOLL_SHM_FASTBOX", "0")])
                .unwrap()
                .shm_fastbox
        );
        assert_eq!(c.speed_mbps, 10_000);
        assert_eq!(c.net_streams, None);
        let four = parse(&[("FABRICOLL_NET_STREAMS", "4")]).unwrap();
        assert_eq!(four.net_streams, Some(4));
        assert_eq!(c.intra_provider.as_deref(), Some("shm"));
        assert!(
            !parse(&[]).unwrap().inplace_restore,
            "MPI's and NCCL's default"
        );
        assert!(
            parse(&[("FABRICOLL_INPLACE_RESTORE", "1")])
                .unwrap()
                .inplace_restore
        );
        let same = parse(&[("FABRICOLL_INTRA_PROVIDER", "same")]).unwrap();
        assert_eq!(same.intra_provider, None);
        let root = parse(&[("FABRICOLL_ROOT", "[::1]:29500")]).unwrap();
        assert_eq!(root.root.as_deref(), Some("[::1]:29500"));
    }

    #[test]
    fn provider_falls_back_to_fi_provider() {
        assert_eq!(
            parse(&[("FI_PROVIDER", "shm")])
                .unwrap()
                .provider
                .as_deref(),
            Some("shm")
        );
        // Errors about the provider name the variable that gave it.
        assert_eq!(
            parse(&[("FI_PROVIDER", "shm")]).unwrap().provider_var,
            "FI_PROVIDER"
        );
        let c = parse(&[("FI_PROVIDER", "shm"), ("FABRICOLL_PROVIDER", "tcp")]).unwrap();
        assert_eq!(c.provider.as_deref(), Some("tcp"));
        assert_eq!(c.provider_var, "FABRICOLL_PROVIDER");
        let e = parse(&[("FI_PROVIDER", "a b")]).unwrap_err().to_string();
        assert!(
            e.contains("FI_PROVIDER=\"a b\"") && e.contains("efa"),
            "{e}"
        );
    }

    #[test]
    fn the_intra_provider_is_the_default_only_where_no_one_set_it() {
        let unset = parse(&[]).unwrap();
        assert!(unset.intra_provider_default);
        let named = parse(&[("FABRICOLL_INTRA_PROVIDER", "shm")]).unwrap();
        assert_eq!(named.intra_provider, unset.intra_provider);
        assert!(!named.intra_provider_default);
        let o = Overrides {
            intra_provider: Some("shm".into()),
            ..Overrides::default()
        };
        assert!(!unset.with_overrides(&o).unwrap().intra_provider_default);
        assert!(
            unset
                .with_overrides(&Overrides::default())
                .unwrap()
                .intra_provider_default
        );
    }

    #[test]
    fn invalid_values_name_the_variable_and_accepted_values() {
        for (k, v) in [
            ("FABRICOLL_TIMEOUT_MS", "soon"),
            ("FABRICOLL_TIMEOUT_MS", "0"),
            ("FABRICOLL_MR_CACHE", "yes"),
            ("FABRICOLL_SHM_FASTBOX", "on"),
            ("FABRICOLL_INPLACE_RESTORE", "yes"),
            ("FABRICOLL_LOG", "loud"),
            ("FABRICOLL_SPEED_MBPS", "-1"),
            ("FABRICOLL_NET_STREAMS", "0"),
            ("FABRICOLL_NET_STREAMS", "9"),
            ("FABRICOLL_POLL_US", "9999999999"),
            ("FABRICOLL_PROVIDER", "tcp rm -rf"),
            ("FABRICOLL_DOMAIN", ",,"),
            ("FABRICOLL_ALGO", "fastest"),
            ("FABRICOLL_ALPHA_US", "0"),
            ("FABRICOLL_BETA_GBPS", "nan"),
            ("FABRICOLL_LOCAL_RANKS", "0"),
            ("FABRICOLL_BOOTSTRAP_ADDR", "localhost:1"),
            ("FABRICOLL_INTRA_PROVIDER", "shm net"),
            ("FABRICOLL_ROOT", "10.0.0.1"),
            ("FABRICOLL_ROOT", "10.0.0.1:0"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
            assert!(e.contains("accepted values"), "{e}");
        }
    }

    #[test]
    fn domains_list() {
        let c = parse(&[("FABRICOLL_DOMAIN", "lo, eth0")]).unwrap();
        assert_eq!(c.domains, Some(vec!["lo".to_string(), "eth0".to_string()]));
    }

    #[test]
    fn every_parsed_variable_is_in_the_table() {
        // Each name the parser reads must be documented in VARS (and so in the README).
        let src = include_str!("config.rs");
        for cap in src.split("nonempty(\"").skip(1) {
            let name = cap.split('"').next().unwrap();
            if name.starts_with("FABRICOLL_") {
                assert!(
                    VARS.iter().any(|v| v.name == name),
                    "{name} missing in VARS"
                );
            }
        }
    }
}
