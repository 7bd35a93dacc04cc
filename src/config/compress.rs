//! The compression setting of compressed collectives (docs/compression.md): a wire format and
//! its block size, from `FABRICOLL_COMPRESS` and `FABRICOLL_COMPRESS_BLOCK` or a communicator's
//! `fabricoll_config.compress` / `compress_block`.
use crate::compress::{Codec, Format, DEFAULT_BLOCK, MAX_BLOCK, NAMES};
use crate::error::{Error, Result};

/// A format and its block size; `Format::Off` sends data as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Compression {
    pub format: Format,
    pub block: usize,
}

impl Default for Compression {
    fn default() -> Compression {
        Compression::OFF
    }
}

impl Compression {
    pub const OFF: Compression = Compression {
        format: Format::Off,
        block: DEFAULT_BLOCK,
    };

    /// The codec, None when off.
    pub fn codec(&self) -> Option<Codec> {
        (self.format != Format::Off).then_some(Codec {
            format: self.format,
            block: self.block,
        })
    }

    /// The format named `value` of the setting `name` (a variable or a field), or an error
    /// naming it and the accepted names.
    pub fn format(name: &str, value: &str) -> Result<Format> {
        Format::parse(&value.trim().to_ascii_lowercase()).ok_or_else(|| invalid(name, value, NAMES))
    }

    /// The block size `value` of the setting `name`, or an error naming it.
    pub fn block(name: &str, value: &str) -> Result<usize> {
        match value.trim().parse::<usize>() {
            Ok(b) if (1..=MAX_BLOCK).contains(&b) => Ok(b),
            _ => Err(invalid(name, value, &format!("integer 1..={MAX_BLOCK}"))),
        }
    }

    /// The environment's setting: `FABRICOLL_COMPRESS` and `FABRICOLL_COMPRESS_BLOCK`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Compression> {
        let nonempty = |n: &str| get(n).filter(|v| !v.trim().is_empty());
        let format = match nonempty("FABRICOLL_COMPRESS") {
            None => Format::Off,
            Some(v) => Compression::format("FABRICOLL_COMPRESS", &v)?,
        };
        let block = match nonempty("FABRICOLL_COMPRESS_BLOCK") {
            None => DEFAULT_BLOCK,
            Some(v) => Compression::block("FABRICOLL_COMPRESS_BLOCK", &v)?,
        };
        Ok(Compression { format, block })
    }
}

/// Which levels of a communicator over several hosts compressed collectives compress
/// (`FABRICOLL_COMPRESS_LEVELS`; docs/compression.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CompressLevels {
    /// The inter-host level only, on several hosts of which some hold two ranks or more (any
    /// sizes): shared memory carries the data in full precision. Elsewhere every level.
    #[default]
    Inter,
    /// Every level alike, shared memory included.
    All,
}

impl CompressLevels {
    /// The environment's setting: `FABRICOLL_COMPRESS_LEVELS` (`inter` or `all`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<CompressLevels> {
        const NAME: &str = "FABRICOLL_COMPRESS_LEVELS";
        match get(NAME).map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("inter") => Ok(CompressLevels::Inter),
            Some("all") => Ok(CompressLevels::All),
            Some(_) => Err(invalid(NAME, &get(NAME).unwrap_or_default(), "inter, all")),
        }
    }
}

/// The error of a bad value of `name`: an environment variable (`FABRICOLL_*`) as the other
/// variables' errors say it, else an argument (a field of the C API's structs).
fn invalid(name: &str, value: &str, accepted: &str) -> Error {
    if name.starts_with("FABRICOLL_") {
        Error::InvalidArgument(format!(
            "environment variable {name}={value:?} is invalid; accepted values: {accepted}"
        ))
    } else {
        Error::arg(
            name,
            format!("{value:?} is invalid; accepted values: {accepted}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Compression> {
        Compression::from_lookup(|n| {
            pairs
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn off_by_default_and_every_format_by_name() {
        assert_eq!(parse(&[]).unwrap(), Compression::OFF);
        assert_eq!(parse(&[]).unwrap().codec(), None);
        for f in Format::ALL {
            let c = parse(&[("FABRICOLL_COMPRESS", f.name())]).unwrap();
            assert_eq!(c.format, f);
            assert_eq!(c.block, DEFAULT_BLOCK);
        }
        let c = parse(&[
            ("FABRICOLL_COMPRESS", "FP8E4M3"),
            ("FABRICOLL_COMPRESS_BLOCK", "64"),
        ])
        .unwrap();
        assert_eq!(c.codec(), Some(Codec::new(Format::Fp8E4m3, 64).unwrap()));
    }

    #[test]
    fn levels_default_to_inter_and_name_the_variable_when_bad() {
        let get = |v: &'static str| {
            move |n: &str| (n == "FABRICOLL_COMPRESS_LEVELS").then(|| v.to_string())
        };
        assert_eq!(
            CompressLevels::from_lookup(|_| None).unwrap(),
            CompressLevels::Inter
        );
        assert_eq!(
            CompressLevels::from_lookup(get("")).unwrap(),
            CompressLevels::Inter
        );
        assert_eq!(
            CompressLevels::from_lookup(get(" Inter ")).unwrap(),
            CompressLevels::Inter
        );
        assert_eq!(
            CompressLevels::from_lookup(get("ALL")).unwrap(),
            CompressLevels::All
        );
        let e = CompressLevels::from_lookup(get("host"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("FABRICOLL_COMPRESS_LEVELS") && e.contains("inter, all"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = parse(&[("FABRICOLL_COMPRESS", "fp4")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("FABRICOLL_COMPRESS") && e.contains("int8"),
            "{e}"
        );
        for b in ["0", "x", "1048577"] {
            let e = parse(&[("FABRICOLL_COMPRESS_BLOCK", b)])
                .unwrap_err()
                .to_string();
            assert!(e.contains("FABRICOLL_COMPRESS_BLOCK"), "{e}");
        }
    }
}
