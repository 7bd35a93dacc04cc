//! Device memory on the loopback transport, for tests: a fabric made `with_device` offers
//! "FI_HMEM" for one device (the emulated one in CI), registers its memory, and moves the bytes
//! of a send or receive through a registration of it with that device's copies, as libfabric's
//! shm provider moves `FI_HMEM_CUDA` bytes with CUDA copies. The host never reads or writes
//! device memory itself.
use crate::device::{Device, Span, Stream};
use crate::error::{Error, Result};
use crate::transport::{Mr, Region};
use parking_lot::Mutex;
use std::time::Duration;

/// How long a copy of a message to or from the device may take: these copies are short, and
/// the emulated device delays each by well under a millisecond.
const COPY_LIMIT: Duration = Duration::from_secs(60);

/// The device whose memory a fabric moves, and whether it registers it.
pub(super) struct Mover {
    dev: Device,
    registers: bool,
    /// The stream the moves run on, made at the first (the device must be current then).
    stream: Mutex<Option<Stream>>,
}

impl Mover {
    pub fn new(dev: Device, registers: bool) -> Mover {
        Mover {
            dev,
            registers,
            stream: Mutex::new(None),
        }
    }

    /// `Transport::register_device` on a fabric with this mover.
    pub fn register(&self, provider: &str, region: Region, ordinal: i32) -> Result<Mr> {
        if !self.registers {
            return Err(Error::System(format!(
                "{provider}: registering device memory failed (a fabric made to refuse it)"
            )));
        }
        if ordinal != self.dev.ordinal() {
            return Err(Error::arg(
                "ordinal",
                format!(
                    "device {ordinal}: this fabric moves the memory of device {}",
                    self.dev.ordinal()
                ),
            ));
        }
        self.span(region)?;
        Ok(Mr {
            desc: 0,
            region,
            keep: None,
            key: None,
            device: Some(ordinal),
        })
    }

    fn span(&self, region: Region) -> Result<Span> {
        self.dev.make_current()?;
        // SAFETY: a region registered as device memory is valid device memory while the
        // operation that names it runs (`Region`'s contract); from_raw checks its kind.
        unsafe { Span::from_raw(&self.dev, region.addr() as u64, region.len(), "region") }
    }

    /// Runs `f` on the movers' stream, made here at the first use.
    fn on_stream<T>(&self, f: impl FnOnce(&Stream) -> Result<T>) -> Result<T> {
        self.dev.make_current()?;
        let mut s = self.stream.lock();
        if s.is_none() {
            *s = Some(self.dev.create_stream()?);
        }
        f(s.as_ref().expect("made above"))
    }

    /// The bytes of device memory `region`, copied by the device.
    pub fn read(&self, region: Region) -> Result<Vec<u8>> {
        let mut v = vec![0u8; region.len()];
        if v.is_empty() {
            return Ok(v);
        }
        let span = self.span(region)?;
        self.on_stream(|s| s.download(&mut v, &span, COPY_LIMIT))?;
        Ok(v)
    }

    /// Writes `data` to the start of device memory `region`, by the device.
    pub fn write(&self, region: Region, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let span = self.span(region)?.slice(0..data.len())?;
        self.on_stream(|s| s.upload(&span, data, COPY_LIMIT))
    }
}
