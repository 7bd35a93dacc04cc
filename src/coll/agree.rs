//! What the ranks of a communicator must agree on, checked when it is made: each rank sends an
//! envelope (its fabricoll version, the wire format of its messages and tags, the libfabric it
//! runs, its providers between and within hosts, which levels compressed calls compress and how
//! it cuts them into chunks, its host and its transport address) through
//! the exchange of addresses, and every rank checks every envelope against rank 0's before it
//! inserts any peer. All ranks see the same envelopes, so where one differs every rank fails
//! at once with the same error, naming the rank and the value; none waits for a peer that
//! cannot understand it.
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::Transport;

/// The format of what ranks send each other: message tags (`exec::tags`), notices, the
/// envelope itself. Raise it with any change there, so that builds that differ fail at
/// creation instead of mismatching messages.
pub const WIRE_VERSION: u32 = 2;

/// What every envelope starts with.
const MAGIC: &[u8; 4] = b"FCEV";

/// The intra-host provider of a communicator over one fabric (`FABRICOLL_INTRA_PROVIDER=same`).
pub const SAME: &str = "same";

/// One rank's envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub wire: u32,
    /// fabricoll's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The libfabric the process runs (`fabric::runtime_version`).
    pub libfabric: String,
    /// The provider between hosts (the only one over one fabric).
    pub inter: String,
    /// The provider within a host, or `SAME`.
    pub intra: String,
    /// The bytes per chunk of a compressed call (`FABRICOLL_COMPRESS_CHUNK`, 0: one chunk):
    /// ranks that cut a call differently would exchange pieces of different lengths.
    pub compress_chunk: u64,
    /// Whether compressed calls compress every level (`FABRICOLL_COMPRESS_LEVELS=all`) or the
    /// inter-host level only: the two run different exchanges.
    pub compress_all_levels: bool,
    /// The rank's host (`placement::host_key`).
    pub host: u64,
    /// The rank's transport address.
    pub address: Vec<u8>,
}

impl Envelope {
    /// This rank's envelope, for its endpoint `t` under `cfg`.
    pub fn here(t: &dyn Transport, cfg: &Config) -> Envelope {
        let caps = t.caps();
        Envelope {
            wire: WIRE_VERSION,
            version: env!("CARGO_PKG_VERSION").to_string(),
            libfabric: crate::transport::fabric::runtime_version(),
            inter: caps.provider.clone(),
            intra: caps
                .intra
                .as_ref()
                .map_or_else(|| SAME.to_string(), |c| c.provider.clone()),
            compress_chunk: cfg.compress_chunk.unwrap_or(crate::compress::DEFAULT_CHUNK) as u64,
            compress_all_levels: cfg.compress_levels == crate::config::CompressLevels::All,
            host: super::placement::host_key(cfg),
            address: t.address(),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.address.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.wire.to_le_bytes());
        for s in [&self.version, &self.libfabric, &self.inter, &self.intra] {
            put(&mut b, s.as_bytes());
        }
        b.extend_from_slice(&self.compress_chunk.to_le_bytes());
        b.push(self.compress_all_levels as u8);
        b.extend_from_slice(&self.host.to_le_bytes());
        put(&mut b, &self.address);
        b
    }

    /// The envelope of `b`: Ok(None) for bytes that are no envelope of ours, Err(wire) for one
    /// of another wire format (whose rest may mean anything).
    fn from_bytes(b: &[u8]) -> std::result::Result<Option<Envelope>, u32> {
        if b.len() < 8 || &b[..4] != MAGIC {
            return Ok(None);
        }
        let wire = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
        if wire != WIRE_VERSION {
            return Err(wire);
        }
        let mut r = Reader(&b[8..]);
        let parsed = (|| {
            let mut text = || String::from_utf8(r.take()?.to_vec()).ok();
            let (version, libfabric, inter, intra) = (text()?, text()?, text()?, text()?);
            let compress_chunk = u64::from_le_bytes(r.fixed::<8>()?);
            let compress_all_levels = match r.fixed::<1>()? {
                [0] => false,
                [1] => true,
                _ => return None,
            };
            let host = u64::from_le_bytes(r.fixed::<8>()?);
            let address = r.take()?.to_vec();
            r.0.is_empty().then_some(Envelope {
                wire,
                version,
                libfabric,
                inter,
                intra,
                compress_chunk,
                compress_all_levels,
                host,
                address,
            })
        })();
        Ok(parsed)
    }
}

/// Append `s` with its length (u16).
fn put(b: &mut Vec<u8>, s: &[u8]) {
    let s = &s[..s.len().min(u16::MAX as usize)];
    b.extend_from_slice(&(s.len() as u16).to_le_bytes());
    b.extend_from_slice(s);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        let v = self.0.get(..N)?.try_into().ok()?;
        self.0 = &self.0[N..];
        Some(v)
    }

    fn take(&mut self) -> Option<&'a [u8]> {
        let len = u16::from_le_bytes(self.fixed::<2>()?) as usize;
        let v = self.0.get(..len)?;
        self.0 = &self.0[len..];
        Some(v)
    }
}

/// Every rank's envelope, once all agree with rank 0's; else the first difference, the same
/// error on every rank that sees the same envelopes.
pub fn check(all: &[Vec<u8>]) -> Result<Vec<Envelope>> {
    let mut out: Vec<Envelope> = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let e = match Envelope::from_bytes(b) {
            Ok(Some(e)) => e,
            Ok(None) => {
                return Err(differs(format!(
                    "rank {r} sent no fabricoll envelope ({} bytes): it runs another fabricoll build, or is no fabricoll rank",
                    b.len()
                )))
            }
            Err(wire) => {
                return Err(differs(format!(
                    "rank {r} speaks wire format {wire} where this fabricoll speaks {WIRE_VERSION}: every rank needs the same fabricoll build"
                )))
            }
        };
        if let Some(first) = out.first() {
            compare(r, &e, first)?;
        }
        out.push(e);
    }
    Ok(out)
}

/// Rank `r`'s envelope `e` against rank 0's.
fn compare(r: usize, e: &Envelope, first: &Envelope) -> Result<()> {
    let msg = if e.version != first.version {
        format!(
            "rank {r} runs fabricoll {} where rank 0 runs fabricoll {}: every rank needs the same fabricoll build",
            e.version, first.version
        )
    } else if e.libfabric != first.libfabric {
        format!(
            "rank {r} runs libfabric {} where rank 0 runs libfabric {}: every rank needs the same libfabric version",
            e.libfabric, first.libfabric
        )
    } else if e.inter != first.inter {
        format!(
            "rank {r} uses provider {} between hosts where rank 0 uses {} (FABRICOLL_PROVIDER)",
            e.inter, first.inter
        )
    } else if e.intra != first.intra {
        format!(
            "rank {r} uses provider {} within hosts where rank 0 uses {} (FABRICOLL_INTRA_PROVIDER; {SAME}: one provider for every peer)",
            e.intra, first.intra
        )
    } else if e.compress_all_levels != first.compress_all_levels {
        let what = |all: bool| {
            if all {
                ("every level", "all")
            } else {
                ("the inter-host level only", "inter")
            }
        };
        let (theirs, first) = (what(e.compress_all_levels), what(first.compress_all_levels));
        format!(
            "rank {r} compresses {} where rank 0 compresses {} (FABRICOLL_COMPRESS_LEVELS={} against {})",
            theirs.0, first.0, theirs.1, first.1
        )
    } else if e.compress_chunk != first.compress_chunk {
        format!(
            "rank {r} cuts compressed calls into chunks of {} bytes where rank 0 cuts them into chunks of {} (FABRICOLL_COMPRESS_CHUNK; 0: one chunk)",
            e.compress_chunk, first.compress_chunk
        )
    } else {
        return Ok(());
    };
    Err(differs(msg))
}

fn differs(msg: String) -> Error {
    Error::InvalidUsage(format!("the ranks disagree: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(inter: &str, intra: &str, host: u64) -> Envelope {
        Envelope {
            wire: WIRE_VERSION,
            version: "1.2.3".into(),
            libfabric: "1.17".into(),
            inter: inter.into(),
            intra: intra.into(),
            compress_chunk: 4 << 20,
            compress_all_levels: false,
            host,
            address: vec![1, 2, 3, host as u8],
        }
    }

    fn all(es: &[Envelope]) -> Vec<Vec<u8>> {
        es.iter().map(Envelope::to_bytes).collect()
    }

    #[test]
    fn envelopes_round_trip_and_agreeing_ranks_pass_with_their_hosts_and_addresses() {
        let es = [
            env("net", "shm", 1),
            env("net", "shm", 1),
            env("net", "shm", 2),
        ];
        let got = check(&all(&es)).unwrap();
        assert_eq!(got, es);
        assert_eq!(got[2].address, vec![1, 2, 3, 2]);
    }

    #[test]
    fn each_difference_names_the_rank_the_value_and_the_variable() {
        let base = env("net", "shm", 1);
        let cases: Vec<(Envelope, &str)> = vec![
            (
                env("tcp;ofi_rxm", "shm", 1),
                "rank 2 uses provider tcp;ofi_rxm between hosts where rank 0 uses net (FABRICOLL_PROVIDER)",
            ),
            (
                env("net", "same", 1),
                "rank 2 uses provider same within hosts where rank 0 uses shm (FABRICOLL_INTRA_PROVIDER",
            ),
            (
                Envelope {
                    version: "9.9.9".into(),
                    ..base.clone()
                },
                "rank 2 runs fabricoll 9.9.9 where rank 0 runs fabricoll 1.2.3",
            ),
            (
                Envelope {
                    libfabric: "1.18".into(),
                    ..base.clone()
                },
                "rank 2 runs libfabric 1.18 where rank 0 runs libfabric 1.17",
            ),
            (
                Envelope {
                    compress_all_levels: true,
                    ..base.clone()
                },
                "(FABRICOLL_COMPRESS_LEVELS=all against inter)",
            ),
            (
                Envelope {
                    compress_chunk: 0,
                    ..base.clone()
                },
                "rank 2 cuts compressed calls into chunks of 0 bytes where rank 0 cuts them into chunks of 4194304 (FABRICOLL_COMPRESS_CHUNK",
            ),
            (
                Envelope {
                    wire: WIRE_VERSION + 1,
                    ..base.clone()
                },
                &*Box::leak(format!("rank 2 speaks wire format {}", WIRE_VERSION + 1).into_boxed_str()),
            ),
        ];
        for (odd, want) in cases {
            let e = check(&all(&[base.clone(), base.clone(), odd]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{want:?} not in: {e}");
        }
    }

    #[test]
    fn bytes_that_are_no_envelope_name_the_rank() {
        let good = env("net", "shm", 1).to_bytes();
        let mut long = good.clone();
        long.push(0);
        for bad in [
            b"a bare fabric address".to_vec(),
            good[..good.len() - 1].to_vec(),
            long,
            Vec::new(),
        ] {
            let e = check(&[good.clone(), bad]).unwrap_err().to_string();
            assert!(e.contains("rank 1 sent no fabricoll envelope"), "{e}");
        }
    }

    #[test]
    fn this_process_envelope_says_same_over_one_fabric() {
        let f = crate::transport::loopback::LoopbackFabric::new();
        let t = f.endpoint();
        let cfg =
            Config::from_lookup(|n| (n == "FABRICOLL_HOST").then(|| "h".to_string())).unwrap();
        let e = Envelope::here(&t, &cfg);
        assert_eq!((e.intra.as_str(), e.inter.as_str()), (SAME, "loopback"));
        assert_eq!(e.host, super::super::placement::host_key(&cfg));
        assert_eq!(e.address, t.address());
        assert_eq!(check(&[e.to_bytes()]).unwrap(), vec![e]);
    }
}
