//! What the integration tests share.
use nccl_net_fabricoll::config::Config;

/// A configuration with a fixed cost model (alpha 5 us, beta 2 GB/s, gamma 8 GB/s: nothing to
/// calibrate), a deadline of `timeout_ms`, and `provider` where given.
pub fn fixed_model(provider: Option<&str>, timeout_ms: u32) -> Config {
    let timeout = timeout_ms.to_string();
    let kv = [
        ("FABRICOLL_PROVIDER", provider),
        ("FABRICOLL_ALPHA_US", Some("5")),
        ("FABRICOLL_BETA_GBPS", Some("2")),
        ("FABRICOLL_GAMMA_GBPS", Some("8")),
        ("FABRICOLL_TIMEOUT_MS", Some(timeout.as_str())),
    ];
    Config::from_lookup(|n| {
        kv.iter()
            .find(|(k, _)| *k == n)
            .and_then(|(_, v)| v.map(String::from))
    })
    .unwrap()
}
