//! The simulated machine's parameters: per-level links, reduction and copy speeds, memory
//! bandwidth and core taper; built from the cost model's parameters or from the line a
//! communicator logs after calibration.
#![forbid(unsafe_code)]

use crate::algo::Hosts;
use crate::tune::{gbps_to_us_per_byte, Model};

/// One level's link: latency (us), per-byte cost (us per byte) and a CPU's cost per message
/// (us), the sender's and the receiver's each (LogGP's `o`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Level {
    pub alpha_us: f64,
    pub beta_us_per_byte: f64,
    pub o_us: f64,
}

/// Everything the simulator needs to know about the machine besides the layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// Messages between ranks of one host (shared memory).
    pub intra: Level,
    /// Messages between hosts (the network; a host's NIC under contention).
    pub inter: Level,
    /// Reduction cost, us per byte.
    pub gamma_us_per_byte: f64,
    /// Local copy cost, us per byte (the closed-form model has none: 0 reproduces it).
    pub copy_us_per_byte: f64,
    /// Share NICs among a host's ranks, memory bandwidth and the core (false: every rank has
    /// its own links, the closed-form model's assumption).
    pub contention: bool,
    /// A host's memory bandwidth shared by the messages among its ranks, us per byte (None:
    /// unlimited). Only under contention.
    pub mem_us_per_byte: Option<f64>,
    /// Core oversubscription: the core carries `hosts / taper` NICs' worth (1: none). Only
    /// under contention.
    pub taper: f64,
    /// A token bucket on each direction of every NIC (None: none, as a NIC's wire). Only under
    /// contention.
    pub burst: Option<Burst>,
}

/// A NIC direction shaped by a token bucket (`bucket`), as `tbf` shapes the emulated hosts'
/// links: `bytes` of tokens, filling at the NIC's rate, each passing at `peak_us_per_byte`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Burst {
    pub bytes: f64,
    pub peak_us_per_byte: f64,
}

impl Params {
    /// The cost model's parameters for ranks on `hosts`: on one host, its one level (the
    /// network fields, `o = alpha/2`) for every message; on several, its two levels.
    pub fn from_model(m: &Model, hosts: Hosts) -> Params {
        let e = m.inter();
        let inter = Level {
            alpha_us: e.alpha_us,
            beta_us_per_byte: e.beta_us_per_byte,
            o_us: e.o_us,
        };
        let intra = if hosts.is_one() || hosts.count() == 1 {
            inter
        } else {
            Level {
                alpha_us: m.intra.alpha_us,
                beta_us_per_byte: m.intra.beta_us_per_byte,
                o_us: m.intra.o_us,
            }
        };
        Params {
            intra,
            inter,
            gamma_us_per_byte: m.gamma_us_per_byte,
            copy_us_per_byte: 0.0,
            contention: false,
            mem_us_per_byte: None,
            taper: 1.0,
            burst: None,
        }
    }

    /// The cost model these parameters describe (the inverse of `from_model`, for `auto`).
    pub fn model(&self) -> Model {
        let gbps = |b: f64| 1.0 / (b * 1e3);
        let mut m = Model::new(
            self.inter.alpha_us,
            gbps(self.inter.beta_us_per_byte),
            gbps(self.gamma_us_per_byte),
        );
        m.inter_o_us = Some(self.inter.o_us);
        m.intra.alpha_us = self.intra.alpha_us;
        m.intra.beta_us_per_byte = self.intra.beta_us_per_byte;
        m.intra.o_us = self.intra.o_us;
        m
    }

    /// Check that every figure is usable, naming the first that is not.
    pub fn validate(&self) -> Result<(), String> {
        let pos = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{name}: must be positive and finite, got {v}"))
            }
        };
        let non_neg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{name}: must be at least 0 and finite, got {v}"))
            }
        };
        for (lvl, l) in [("intra", self.intra), ("inter", self.inter)] {
            non_neg(&format!("{lvl} alpha"), l.alpha_us)?;
            pos(&format!("{lvl} beta"), l.beta_us_per_byte)?;
            non_neg(&format!("{lvl} o"), l.o_us)?;
        }
        non_neg("gamma", self.gamma_us_per_byte)?;
        non_neg("copy", self.copy_us_per_byte)?;
        if let Some(m) = self.mem_us_per_byte {
            pos("memory bandwidth", m)?;
        }
        if let Some(b) = self.burst {
            pos("burst", b.bytes)?;
            pos("burst peak", b.peak_us_per_byte)?;
            if b.peak_us_per_byte >= self.inter.beta_us_per_byte {
                return Err(format!(
                    "burst peak: must be faster than the link ({} GB/s), got {} GB/s",
                    1e-3 / self.inter.beta_us_per_byte,
                    1e-3 / b.peak_us_per_byte
                ));
            }
        }
        if !(self.taper.is_finite() && self.taper >= 1.0) {
            return Err(format!("taper: must be at least 1, got {}", self.taper));
        }
        Ok(())
    }
}

/// The model a communicator printed after calibration (`FABRICOLL_LOG=info`): the one-level
/// line "calibration on N ranks: alpha A us, beta B GB/s, gamma G GB/s" or the two-level one
/// "calibration on N ranks, hosts of [..] ranks: intra alpha A us, beta B GB/s, o O us; inter
/// ...; gamma G GB/s". Returns the model and, for the two-level line, the ranks per host.
pub fn parse_calibration(line: &str) -> Result<(Model, Option<Vec<usize>>), String> {
    let at = line
        .find("calibration on ")
        .ok_or("calibration line: no 'calibration on' in it")?;
    let line = &line[at..];
    let num = |text: &str, key: &str, unit: &str| -> Result<f64, String> {
        // Keys are whole words: " o " is not the end of "alpha ".
        let spaced = format!(" {text}");
        let i = spaced
            .find(&format!(" {key} "))
            .ok_or(format!("calibration line: no '{key}' in '{text}'"))?;
        let rest = &spaced[i + key.len() + 2..];
        let v = rest.split(' ').next().unwrap_or("");
        if !rest[v.len()..].trim_start().starts_with(unit) {
            return Err(format!("calibration line: '{key} {v}' is not in {unit}"));
        }
        v.parse::<f64>()
            .map_err(|_| format!("calibration line: '{key} {v}' is not a number"))
    };
    let gamma = num(line, "gamma", "GB/s")?;
    if let Some(i) = line.find("intra ") {
        let hosts_text = line
            .split_once("hosts of [")
            .and_then(|(_, r)| r.split_once(']'))
            .map(|(h, _)| h)
            .ok_or("calibration line: no 'hosts of [..]' in the two-level line")?;
        let sizes = hosts_text
            .split(',')
            .map(|s| s.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| format!("calibration line: hosts '[{hosts_text}]' are not numbers"))?;
        let rest = &line[i..];
        let (intra, inter) = rest
            .split_once("; inter ")
            .ok_or("calibration line: no '; inter' level")?;
        let level = |t: &str| -> Result<(f64, f64, f64), String> {
            Ok((
                num(t, "alpha", "us")?,
                num(t, "beta", "GB/s")?,
                num(t, "o", "us")?,
            ))
        };
        let (ia, ib, io) = level(intra)?;
        let (ea, eb, eo) = level(inter.split(';').next().unwrap_or(inter))?;
        let mut m = Model::new(ea, eb, gamma);
        m.inter_o_us = Some(eo);
        m.intra.alpha_us = ia;
        m.intra.beta_us_per_byte = gbps_to_us_per_byte(ib);
        m.intra.o_us = io;
        return Ok((m, Some(sizes)));
    }
    let m = Model::new(num(line, "alpha", "us")?, num(line, "beta", "GB/s")?, gamma);
    Ok((m, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_calibration_lines() {
        let (m, h) = parse_calibration(
            "[INFO] calibration on 4 ranks: alpha 12.50 us, beta 1.250 GB/s, gamma 6.00 GB/s",
        )
        .unwrap();
        assert_eq!(h, None);
        assert_eq!(m.alpha_us, 12.5);
        assert!((m.beta_us_per_byte - 1.0 / 1250.0).abs() < 1e-15);
        let (m, h) = parse_calibration(
            "calibration on 8 ranks, hosts of [4, 4] ranks: intra alpha 1.20 us, beta 5.000 \
             GB/s, o 0.40 us; inter alpha 30.00 us, beta 1.100 GB/s, o 3.00 us; gamma 7.50 GB/s",
        )
        .unwrap();
        assert_eq!(h, Some(vec![4, 4]));
        assert_eq!((m.intra.alpha_us, m.intra.o_us), (1.2, 0.4));
        assert_eq!((m.alpha_us, m.inter().o_us), (30.0, 3.0));
        assert!((m.gamma_us_per_byte - 1.0 / 7500.0).abs() < 1e-15);
    }

    #[test]
    fn bad_lines_name_what_is_wrong() {
        let e = parse_calibration("alpha 1 us").unwrap_err();
        assert!(e.contains("calibration on"), "{e}");
        let e = parse_calibration("calibration on 2 ranks: alpha x us, beta 1 GB/s, gamma 1 GB/s")
            .unwrap_err();
        assert!(e.contains("'alpha x'"), "{e}");
        let e = Params::from_model(&Model::new(1.0, 1.0, 1.0), Hosts::ONE);
        let bad = Params { taper: 0.5, ..e };
        assert!(bad.validate().unwrap_err().starts_with("taper"));
    }
}
