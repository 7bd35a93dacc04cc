//! What the command-line tools (fabricoll-perf, fabricoll-sim) share: parsers of their values
//! (sizes with K/M/G suffixes, collective and algorithm names, host layouts) and nccl-tests'
//! rules for a row's size and bus bandwidth. Parsers return a message without the flag's
//! name: clap adds it.
use crate::algo::{Algorithm, Collective};

/// A size in bytes, with an optional K, M or G suffix (powers of 1024).
pub fn size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(mul))
        .ok_or_else(|| format!("not a size: {s:?}"))
}

/// A collective by name (`Collective::NAMES`).
pub fn collective(s: &str) -> Result<Collective, String> {
    Collective::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Collective::NAMES.iter().map(|(n, _)| *n).collect();
        format!("unknown collective {s:?}; accepted: {}", names.join(", "))
    })
}

/// An algorithm by name (`Algorithm::ALL`).
pub fn algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Algorithm::ALL.iter().map(|x| x.name()).collect();
        format!("unknown algorithm {s:?}; accepted: {}", names.join(", "))
    })
}

/// Ranks per host: HOSTSxRANKS (`512x8`) or a list (`3,2,1`); no host may be empty.
pub fn hosts(s: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("{s:?} is neither HOSTSxRANKS (512x8) nor a list (3,2,1)");
    let v: Vec<usize> = if let Some((h, r)) = s.split_once('x') {
        let (h, r) = (h.trim().parse::<usize>(), r.trim().parse::<usize>());
        let (h, r) = (h.map_err(|_| bad())?, r.map_err(|_| bad())?);
        vec![r; h]
    } else {
        s.split(',')
            .map(|x| x.trim().parse::<usize>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?
    };
    if v.is_empty() || v.contains(&0) {
        return Err(format!("{s:?} names an empty host"));
    }
    Ok(v)
}

/// For a row of `bytes` (nccl-tests' size column: AllGather's and AllToAll's output,
/// ReduceScatter's input) of `elem`-byte elements on `n` ranks: the elements of the whole
/// vector, and the per-call count (`algo::Problem`'s).
pub fn counts(coll: Collective, bytes: usize, elem: usize, n: usize) -> (usize, usize) {
    let total = bytes / elem;
    match coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            (total / n * n, total / n)
        }
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (total, total),
    }
}

/// nccl-tests' bus bandwidth factor: busbw = algbw x this.
pub fn bus_factor(coll: Collective, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(size("8"), Ok(8));
        assert_eq!(size(" 64M"), Ok(64 << 20));
        assert_eq!(size("1k"), Ok(1024));
        assert_eq!(size("2G"), Ok(2 << 30));
        for bad in ["", "M", "1X", "-1", "1.5K", "99999999999999999999G"] {
            assert!(size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hosts_are_a_product_or_a_list() {
        assert_eq!(hosts("512x8"), Ok(vec![8; 512]));
        assert_eq!(hosts("3, 2,1"), Ok(vec![3, 2, 1]));
        for bad in ["", "0x8", "2x0", "3,0", "ax2", "3,,1", "2x3x4"] {
            assert!(hosts(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_round_trip() {
        for (n, c) in Collective::NAMES {
            assert_eq!(collective(n), Ok(c));
        }
        for a in Algorithm::ALL {
            assert_eq!(algorithm(a.name()), Ok(a));
        }
        assert!(collective("gather").unwrap_err().contains("allreduce"));
        assert!(algorithm("nope").unwrap_err().contains("ring"));
    }

    #[test]
    fn counts_follow_nccl_tests() {
        assert_eq!(counts(Collective::AllReduce, 1024, 4, 3), (256, 256));
        assert_eq!(counts(Collective::AllGather, 1024, 4, 3), (255, 85));
        assert_eq!(counts(Collective::AllToAll, 8, 4, 4), (0, 0));
        assert_eq!(bus_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Collective::ReduceScatter, 4), 0.75);
        assert_eq!(bus_factor(Collective::Broadcast, 4), 1.0);
    }
}
