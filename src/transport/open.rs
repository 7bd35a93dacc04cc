//! Opening the collective engines' transport as the configuration asks: the network
//! provider's device for the rank's hint, and, where an intra-host provider is named and is
//! another provider, a transport over both fabrics. The provider names are compared here, in
//! the transport layer, so that the communicator takes what it gets by its typed capabilities.
use super::fabric::{self, Discovery, FabricTransport};
use super::tiered::Tiered;
use super::Transport;
use crate::config::Config;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;

/// A new endpoint for the collective engines. The network provider (FABRICOLL_PROVIDER) takes
/// device `hint mod n` of its n devices (FABRICOLL_DOMAIN lists them in order). Where
/// FABRICOLL_INTRA_PROVIDER names another provider, the endpoint is a transport over two
/// fabrics (`Tiered`): that provider for ranks whose host key is `host` (this host's), the
/// network for the rest.
/// Where no one set it and its default (shm) cannot be had (`FI_PROVIDER` hides it from
/// libfabric), the network serves every peer, and one info line per process says why; one
/// that was set and cannot be had is an error naming where it was set.
pub fn engines(cfg: &Config, hint: usize, host: u64) -> Result<Arc<dyn Transport>> {
    // A provider that was named and is not here is an error naming its variable (discover).
    let d = discovery(cfg)?;
    if d.devices.is_empty() {
        return Err(Error::System(format!(
            "no libfabric device (providers found: {})",
            if d.providers.is_empty() {
                "none".to_string()
            } else {
                d.providers.join(", ")
            }
        )));
    }
    let i = hint % d.devices.len();
    let dev = &d.devices[i];
    log::info!(
        "endpoint hint {hint}: device {i} of {} ({} / {})",
        d.devices.len(),
        dev.caps.provider,
        dev.caps.domain
    );
    let inter: Arc<dyn Transport> = Arc::new(FabricTransport::open(dev)?);
    let core = |p: &str| p.split(';').next().unwrap_or(p).to_string();
    let intra_name = match &cfg.intra_provider {
        Some(p) if core(p) != core(&dev.caps.provider) => p.clone(),
        _ => return Ok(inter),
    };
    let intra_cfg = Config {
        provider: Some(intra_name.clone()),
        provider_var: cfg.intra_provider_var,
        domains: None,
        ..cfg.clone()
    };
    let intra = discovery(&intra_cfg).and_then(|di| {
        let idev = di.devices.first().ok_or_else(|| {
            Error::System(format!(
                "no device (providers found: {})",
                di.providers.join(", ")
            ))
        })?;
        Ok(Arc::new(FabricTransport::open(idev)?) as Arc<dyn Transport>)
    });
    let intra = match intra {
        Ok(t) => t,
        Err(why) if cfg.intra_provider_default => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                log::info!(
                    "FABRICOLL_INTRA_PROVIDER is not set and its default {intra_name} cannot be had here ({why}): {} serves every peer, within this host too",
                    dev.caps.provider
                )
            });
            return Ok(inter);
        }
        Err(why) => {
            let var = cfg.intra_provider_var;
            let way_out = format!("set {var}=same to use {} for every peer", dev.caps.provider);
            return Err(match why {
                // discover's own error already names the variable and the provider
                Error::InvalidArgument(m) if m.contains(var) => {
                    Error::InvalidArgument(format!("{m}; {way_out}"))
                }
                e => Error::arg(var, format!("{intra_name}: {e}; {way_out}")),
            });
        }
    };
    Ok(Arc::new(Tiered::new(host, intra, inter)?))
}

/// What discovery finds for the engines under `cfg`'s provider, domains and fastbox setting,
/// found once per process for each.
fn discovery(cfg: &Config) -> Result<&'static Discovery> {
    // (the variable that named the provider too: a provider not found is an error naming it)
    type Key = (Option<String>, &'static str, Option<Vec<String>>, bool);
    type Found = &'static std::result::Result<Discovery, Error>;
    static CACHE: Mutex<Vec<(Key, Found)>> = Mutex::new(Vec::new());
    let key: Key = (
        cfg.provider.clone(),
        cfg.provider_var,
        cfg.domains.clone(),
        cfg.shm_fastbox,
    );
    let mut cache = CACHE.lock();
    let found = match cache.iter().find(|(k, _)| *k == key) {
        Some((_, f)) => *f,
        None => {
            let f: Found = Box::leak(Box::new(fabric::discover(cfg, fabric::Use::Engines)));
            cache.push((key, f));
            f
        }
    };
    found.as_ref().map_err(Clone::clone)
}
