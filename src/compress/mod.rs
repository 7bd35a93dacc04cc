//! Compressed data for collectives: the codec that turns f32 values into a wire format of
//! block-scaled codes and back (docs/compression.md describes the layout and the error bounds).
//!
//! # Wire layout (version [`WIRE_VERSION`])
//! A buffer of `n` elements is cut into blocks of `K` elements (the last may be shorter), each
//! stored as `[scale: f32 little-endian][K codes]`, blocks back to back; bf16 blocks have no
//! scale. Codes: bf16 and fp16 as little-endian u16, fp8 and int8 as one byte, int4 two per byte
//! (element 2j in the low nibble of the block's byte j; an odd block's last byte has a zero high
//! nibble). The value of element `i` of a block is `decode(code_i) * scale` (bf16:
//! `decode(code_i)`).
//!
//! # Special values
//! A block holding NaN or an infinity gets the marker scale NaN and zero codes: every element
//! of it decodes to NaN, never to a finite value. bf16 keeps NaN and infinities element by
//! element. Otherwise the scale maps the block's largest magnitude within the format's range, so
//! no code overflows; fp8 and int8 encoders saturate besides.
//!
//! # API
//! [`Codec`]`::{quantize, dequantize, accumulate}` over whole buffers, and [`Codec::wire_len`].
//!
//! # Paths
//! The loops are plain Rust that the compiler vectorizes; on x86_64 CPUs with AVX2 the same code
//! is compiled a second time for AVX2 (`simd`) and taken at run time. Both compile the same
//! operations (no FMA, no reassociation), so they give the same bits, which the tests check.
#![deny(unsafe_code)]

mod block;
mod format;
pub mod owner;
#[cfg(test)]
mod owner_tests;
mod rate;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd;
#[cfg(test)]
mod tests;

pub use format::{Format, NAMES};
pub use rate::rates;

use crate::error::{Error, Result};

/// The wire layout's version. Raise it with any change to the layout or the encoders.
pub const WIRE_VERSION: u32 = 2;

/// The default block size (elements per scale).
pub const DEFAULT_BLOCK: usize = 256;

/// Bytes of a compressed call's data per chunk of its pipeline by default
/// (`FABRICOLL_COMPRESS_CHUNK`).
pub const DEFAULT_CHUNK: usize = 4 << 20;

/// The largest block size accepted.
pub const MAX_BLOCK: usize = 1 << 20;

/// A format with its block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Codec {
    pub format: Format,
    pub block: usize,
}

impl Codec {
    /// A codec, or an error naming `block` when it is 0 or above [`MAX_BLOCK`].
    pub fn new(format: Format, block: usize) -> Result<Codec> {
        if block == 0 || block > MAX_BLOCK {
            return Err(Error::arg(
                "block",
                format!("{block} elements per scale, expected 1..={MAX_BLOCK}"),
            ));
        }
        Ok(Codec { format, block })
    }

    /// Bytes of one block's header (its scale).
    fn header(&self) -> usize {
        if self.format.scaled() {
            4
        } else {
            0
        }
    }

    /// Bytes on the wire for `n` elements.
    pub fn wire_len(&self, n: usize) -> usize {
        let (full, rest) = (n / self.block, n % self.block);
        let mut len = full * self.block_len(self.block);
        if rest > 0 {
            len += self.block_len(rest);
        }
        len
    }

    /// Bytes of one block of `n` elements: its header and codes.
    pub fn block_len(&self, n: usize) -> usize {
        self.header() + self.format.codes_len(n)
    }

    fn check(&self, n: usize, wire: usize, arg: &'static str) -> Result<()> {
        if self.format == Format::Off {
            return Err(Error::arg("format", "off has no wire codes".to_string()));
        }
        let want = self.wire_len(n);
        if wire != want {
            return Err(Error::arg(
                arg,
                format!(
                    "{wire} bytes, expected {want} for {n} elements of {} in blocks of {}",
                    self.format, self.block
                ),
            ));
        }
        Ok(())
    }

    /// Encodes `src` into `dst` (`wire_len(src.len())` bytes).
    pub fn quantize(&self, src: &[f32], dst: &mut [u8]) -> Result<()> {
        self.check(src.len(), dst.len(), "dst")?;
        #[cfg(target_arch = "x86_64")]
        if simd::quantize(self, src, dst) {
            return Ok(());
        }
        self.quantize_blocks(src, dst);
        Ok(())
    }

    /// `quantize` after the length check.
    #[inline(always)]
    fn quantize_blocks(&self, src: &[f32], dst: &mut [u8]) {
        let (f, h) = (self.format, self.header());
        let mut off = 0;
        for x in src.chunks(self.block) {
            let out = &mut dst[off..off + self.block_len(x.len())];
            off += out.len();
            if h == 0 {
                block::encode(f, x, 1.0, out);
                continue;
            }
            let (head, codes) = out.split_at_mut(h);
            match block::scales(f, block::amax_bits(x)) {
                Some((scale, mul)) => {
                    head.copy_from_slice(&scale.to_le_bytes());
                    block::encode(f, x, mul, codes);
                }
                None => {
                    head.copy_from_slice(&block::MARKER.to_le_bytes());
                    codes.fill(0);
                }
            }
        }
    }

    /// Runs `each(codes, scale, out)` over the blocks of `src` and the matching parts of `out`
    /// (lengths checked).
    #[inline(always)]
    fn blocks(&self, src: &[u8], out: &mut [f32], each: impl Fn(Format, &[u8], f32, &mut [f32])) {
        let h = self.header();
        let mut off = 0;
        for o in out.chunks_mut(self.block) {
            let b = &src[off..off + self.block_len(o.len())];
            off += b.len();
            let scale = if h == 0 {
                1.0
            } else {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            };
            each(self.format, &b[h..], scale, o);
        }
    }

    /// Decodes `src` into `dst` (`src` is `wire_len(dst.len())` bytes).
    pub fn dequantize(&self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        self.check(dst.len(), src.len(), "src")?;
        #[cfg(target_arch = "x86_64")]
        if simd::dequantize(self, src, dst) {
            return Ok(());
        }
        self.blocks(src, dst, block::decode);
        Ok(())
    }

    /// Decodes `src` and adds it to `acc`, element by element, reading `src` once.
    pub fn accumulate(&self, src: &[u8], acc: &mut [f32]) -> Result<()> {
        self.check(acc.len(), src.len(), "src")?;
        #[cfg(target_arch = "x86_64")]
        if simd::accumulate(self, src, acc) {
            return Ok(());
        }
        self.blocks(src, acc, block::accumulate);
        Ok(())
    }

    /// The portable path, whatever the CPU (for the tests that compare paths).
    #[cfg(test)]
    fn portable(&self) -> Portable<'_> {
        Portable(self)
    }
}

/// The codec's portable path, taken even where AVX2 is present (tests only).
#[cfg(test)]
struct Portable<'a>(&'a Codec);

#[cfg(test)]
impl Portable<'_> {
    fn quantize(&self, src: &[f32], dst: &mut [u8]) {
        self.0.quantize_blocks(src, dst)
    }
    fn accumulate(&self, src: &[u8], acc: &mut [f32]) {
        self.0.blocks(src, acc, block::accumulate)
    }
}
