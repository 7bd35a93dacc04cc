//! Provider names across libfabric versions. libfabric's native TCP RDM endpoint (xnet) is
//! called `net` in 1.17 and `tcp` from 1.18 on (1.17's `tcp` is a message endpoint that only
//! the `ofi_rxm` layer turns into an RDM one, listed as `tcp;ofi_rxm`). fabricoll keeps `net`
//! meaning that native endpoint on every version, so that one configuration, script or test
//! names the same thing on 1.17 and 2.x: where the running libfabric has no `net`, `net`
//! (and `net;ofi_rxm`) is asked for as `tcp` (`tcp;ofi_rxm`), and one info line says so.
use std::sync::atomic::{AtomicBool, Ordering};

/// `FI_VERSION(1, 18)`: the first libfabric whose native TCP endpoint is called `tcp`.
const TCP_RENAMED: u32 = (1 << 16) | 18;

/// The native TCP endpoint's name in the libfabric of `version` (`FI_VERSION(major, minor)`).
pub fn native_tcp_in(version: u32) -> &'static str {
    if version < TCP_RENAMED {
        "net"
    } else {
        "tcp"
    }
}

/// The native TCP endpoint's name in the libfabric this process runs.
pub fn native_tcp() -> &'static str {
    native_tcp_in(super::discovery::runtime_code())
}

/// The provider name to ask libfabric `version` for where the user wrote `want`: `net`, alone
/// or under a layer (`net;ofi_rxm`), becomes the native endpoint's name there; any other name
/// is passed on as written.
pub fn resolve_in(want: &str, version: u32) -> String {
    let (core, layers) = match want.split_once(';') {
        Some((c, l)) => (c, Some(l)),
        None => (want, None),
    };
    if !core.eq_ignore_ascii_case("net") {
        return want.to_string();
    }
    let native = native_tcp_in(version);
    match layers {
        Some(l) => format!("{native};{l}"),
        None => native.to_string(),
    }
}

/// Whether the provider `chosen` is what a configuration naming `want` asks for on the running
/// libfabric: `want` as resolved there (`net`: the native TCP endpoint), alone or with a layer
/// over it (`tcp` in 1.17: `tcp;ofi_rxm`).
pub fn answers(chosen: &str, want: &str) -> bool {
    let want = resolve_in(want, super::discovery::runtime_code());
    chosen == want || chosen.split(';').next() == Some(want.as_str())
}

/// `resolve_in` for the running libfabric, with one info line per process the first time a
/// name is changed, naming the variable `var` that gave it.
pub fn resolve(want: &str, var: &str) -> String {
    static SAID: AtomicBool = AtomicBool::new(false);
    let got = resolve_in(want, super::discovery::runtime_code());
    if got != want && !SAID.swap(true, Ordering::Relaxed) {
        log::info!(
            "{var}={want}: libfabric {} names the native TCP endpoint {got}; using {got}",
            super::discovery::runtime_version()
        );
    }
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_17: u32 = (1 << 16) | 17;
    const V1_18: u32 = (1 << 16) | 18;
    const V2_1: u32 = (2 << 16) | 1;

    #[test]
    fn net_is_the_native_tcp_endpoint_on_every_version() {
        assert_eq!(native_tcp_in(V1_17), "net");
        assert_eq!(native_tcp_in(V1_18), "tcp");
        assert_eq!(native_tcp_in(V2_1), "tcp");
        assert_eq!(resolve_in("net", V1_17), "net");
        assert_eq!(resolve_in("net;ofi_rxm", V1_17), "net;ofi_rxm");
        assert_eq!(resolve_in("net", V1_18), "tcp");
        assert_eq!(resolve_in("net", V2_1), "tcp");
        assert_eq!(resolve_in("NET", V2_1), "tcp");
        assert_eq!(resolve_in("net;ofi_rxm", V2_1), "tcp;ofi_rxm");
        // Every other name is passed on as written.
        for other in ["tcp", "tcp;ofi_rxm", "shm", "efa", "netx", "nosuchprov"] {
            assert_eq!(resolve_in(other, V1_17), other);
            assert_eq!(resolve_in(other, V2_1), other);
        }
        // The running libfabric: `net` reaches the name it has.
        assert_eq!(resolve("net", "FABRICOLL_PROVIDER"), native_tcp());
        assert!(answers(native_tcp(), "net"));
        assert!(answers("tcp;ofi_rxm", "tcp;ofi_rxm"));
        // `tcp` with a layer over it answers `tcp` (1.17 has only the layered one).
        assert!(answers("tcp;ofi_rxm", "tcp"));
        assert!(!answers("shm", "net") && !answers("tcp;ofi_rxm", "shm"));
    }
}
