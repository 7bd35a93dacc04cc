//! What each provider's protocols mean for the layers above, as typed capabilities
//! (`Caps::eager_bytes`, `slice_bytes`, `poll_window`, `receiver_copies`, `net_streams`,
//! `latency_us`). This is the one
//! place that turns a provider's name into policy; `docs/performance.md` has the measurements
//! behind each value.
use crate::transport::{Caps, DEFAULT_POLL_WINDOW, DEFAULT_SLICE_BYTES};
use std::time::Duration;

/// Slice size over shm: the receiver copies each message itself, in one `process_vm_readv`
/// inside its own progress call, so smaller slices overlap nothing on the receiving side and
/// each costs a handshake under the peer's lock.
const SHM_SLICE_BYTES: usize = 4 << 20;

/// Poll window under ofi_rxm: data moves only inside our progress calls, and a large message
/// makes no completion for a long while, so a short window puts the sender to sleep with its
/// socket full.
const RXM_POLL_WINDOW: Duration = Duration::from_micros(1000);

/// Fill in the protocol capabilities of `caps` from its provider (`caps.provider`, a
/// `;`-separated stack such as `tcp;ofi_rxm`).
pub(super) fn apply(caps: &mut Caps) {
    let rxm = caps.provider.split(';').any(|p| p == "ofi_rxm");
    let shm = caps.provider.split(';').next() == Some("shm");
    // ofi_rxm sends up to its eager limit eagerly and larger messages by rendezvous. Other
    // providers are not modelled: shm's large messages need no handshake before the receiver
    // can copy, and net writes every message straight onto the connection's stream.
    caps.eager_bytes = if rxm {
        rxm_eager_limit(|name| std::env::var(name).ok())
    } else {
        usize::MAX
    };
    caps.slice_bytes = if shm {
        SHM_SLICE_BYTES
    } else {
        DEFAULT_SLICE_BYTES
    };
    // Over shm a longer window was no faster: spinning ranks take the cores of the ones that
    // copy.
    caps.poll_window = if rxm {
        RXM_POLL_WINDOW
    } else {
        DEFAULT_POLL_WINDOW
    };
    caps.receiver_copies = shm;
    // Socket providers give each endpoint pair its own TCP connection, so the net plugin may
    // stripe over several endpoints. One stays the default: on the 2-core machine striping lost
    // on an idle machine (docs/performance.md, "The net plugin against plain TCP streams").
    let sockets = matches!(caps.provider.split(';').next(), Some("net" | "tcp"));
    caps.net_streams = if sockets { SOCKET_NET_STREAMS } else { 0 };
    caps.socket_addresses = sockets;
    // The native TCP endpoint drops a connection's unmatched messages when its sender closes
    // it, and shm keeps small unexpected messages in the sender's memory before 1.19: every
    // provider is taken to lose what its peer has not yet taken.
    caps.close_loses = true;
    caps.reads_local_peers = shm;
    // Seen with 2.1; 1.17's shm reports truncation as an error completion.
    caps.truncation_crashes = shm && super::discovery::runtime_code() >= 2 << 16;
    caps.latency_us = match caps.provider.split(';').next() {
        Some("shm") => 1.0,
        Some("efa") => 15.0,
        Some("tcp" | "net") => 20.0,
        _ => 0.0,
    };
}

/// Endpoints per device of the net plugin over socket providers when `FABRICOLL_NET_STREAMS` is
/// not set.
const SOCKET_NET_STREAMS: usize = 1;

/// ofi_rxm's eager limit, from its own parameters as rxm reads them (`env` looks one up):
/// `FI_OFI_RXM_EAGER_LIMIT`, else `FI_OFI_RXM_BUFFER_SIZE`, else rxm's default of 16 KiB.
/// Only read, never set: the library writes no one else's variables.
fn rxm_eager_limit(env: impl Fn(&str) -> Option<String>) -> usize {
    let param = |name: &str| {
        env(name)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&v| v > 0)
    };
    param("FI_OFI_RXM_EAGER_LIMIT")
        .or_else(|| param("FI_OFI_RXM_BUFFER_SIZE"))
        .unwrap_or(16 << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps_of(provider: &str) -> Caps {
        let mut c = Caps {
            provider: provider.into(),
            ..Default::default()
        };
        apply(&mut c);
        c
    }

    #[test]
    fn rxm_eager_limit_follows_rxm_parameters() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(rxm_eager_limit(env(&[])), 16 << 10);
        assert_eq!(
            rxm_eager_limit(env(&[("FI_OFI_RXM_BUFFER_SIZE", "65536")])),
            65536
        );
        let both = env(&[
            ("FI_OFI_RXM_BUFFER_SIZE", "65536"),
            ("FI_OFI_RXM_EAGER_LIMIT", " 131072 "),
        ]);
        assert_eq!(rxm_eager_limit(both), 131072);
        // Values rxm itself would not take fall back to the next source.
        let bad = env(&[
            ("FI_OFI_RXM_EAGER_LIMIT", "lots"),
            ("FI_OFI_RXM_BUFFER_SIZE", "0"),
        ]);
        assert_eq!(rxm_eager_limit(bad), 16 << 10);
    }

    #[test]
    fn each_provider_gets_its_protocol_capabilities() {
        let shm = caps_of("shm");
        assert_eq!(shm.eager_bytes, usize::MAX);
        assert_eq!(shm.slice_bytes, SHM_SLICE_BYTES);
        assert_eq!(shm.poll_window, DEFAULT_POLL_WINDOW);
        assert!(shm.receiver_copies);
        assert_eq!(shm.net_streams, 0, "shm is never striped");
        assert!(shm.close_loses && shm.reads_local_peers && !shm.socket_addresses);
        assert_eq!(shm.latency_us, 1.0);

        let rxm = caps_of("tcp;ofi_rxm");
        assert!(rxm.eager_bytes < usize::MAX);
        assert_eq!(rxm.slice_bytes, DEFAULT_SLICE_BYTES);
        assert_eq!(rxm.poll_window, RXM_POLL_WINDOW);
        assert!(!rxm.receiver_copies);
        assert_eq!(rxm.net_streams, SOCKET_NET_STREAMS);
        assert_eq!(rxm.latency_us, 20.0);

        let net = caps_of("net");
        assert_eq!(net.eager_bytes, usize::MAX);
        assert_eq!(net.slice_bytes, DEFAULT_SLICE_BYTES);
        assert_eq!(net.poll_window, DEFAULT_POLL_WINDOW);
        assert!(!net.receiver_copies);
        assert_eq!(net.net_streams, 1);
        assert!(net.close_loses && !net.reads_local_peers && net.socket_addresses);
        assert_eq!(net.latency_us, 20.0);

        assert_eq!(caps_of("efa").latency_us, 15.0);
        assert_eq!(caps_of("psm3").latency_us, 0.0, "unknown: NCCL's default");
    }
}
