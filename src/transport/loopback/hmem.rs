//! Device memory on the loopback transport, for tests: a fabric made `with_device` offers
//! "FI_HMEM" for one device (the emulated one in CI), registers its memory, and moves the bytes
//! of a send or receive through a registration of it with that device's copies, as libfabric's
//! shm provider moves `FI_HMEM_CUDA` bytes with CUDA copies. The host never reads or writes
//! device memory itself.
use crate::device::{Device, HostBuffer, Span, Stream};
use crate::error::{Error, Result};
use crate::transport::{Mr, Region};
use parking_lot::Mutex;
use std::time::Duration;

/// How long a copy of a message to or from the device may take: these copies are short, and
/// the emulated device delays each by well under a millisecond.
const COPY_LIMIT: Duration = Duration::from_secs(60);

/// Bytes of the page-locked buffer that the moves stage through, a piece at a time.
const BOUNCE: usize = 1 << 20;

/// Which way `Mover::copy` moves bytes: from host memory to the device, or back into it.
enum Dir<'a> {
    Up(&'a [u8]),
    Down(&'a mut [u8]),
}

impl Dir<'_> {
    fn len(&self) -> usize {
        match self {
            Dir::Up(b) => b.len(),
            Dir::Down(b) => b.len(),
        }
    }
}

/// The device whose memory a fabric moves, and whether it registers it.
pub(super) struct Mover {
    dev: Device,
    registers: bool,
    /// The stream the moves run on and the page-locked buffer they stage through, made at the
    /// first registration (the device must be current then).
    stream: Mutex<Option<(Stream, HostBuffer)>>,
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
        // The moves' stream and buffer are made at the first registration (the probe's, at a
        // communicator's first device call), not at the first move: creating a stream and
        // allocating page-locked memory wait for every stream of the device, and by the first
        // move a caller's stream may wait for a stream-ordered call that the move serves.
        self.on_stream(|_, _| Ok(()))?;
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

    /// Runs `f` on the moves' stream and buffer, made here at the first use.
    fn on_stream<T>(&self, f: impl FnOnce(&Stream, &mut HostBuffer) -> Result<T>) -> Result<T> {
        self.dev.make_current()?;
        let mut s = self.stream.lock();
        if s.is_none() {
            *s = Some((self.dev.create_stream()?, self.dev.alloc_host(BOUNCE)?));
        }
        let (st, buf) = s.as_mut().expect("made above");
        f(st, buf)
    }

    /// Copies between device memory `span` and host memory as long (`Dir`), by the device,
    /// a piece at a time through the moves' page-locked buffer (a copy to or from pageable
    /// memory would allocate such a buffer per copy, `Stream::upload`).
    fn copy(&self, span: Span, mut host: Dir<'_>) -> Result<()> {
        self.on_stream(|st, buf| {
            for at in (0..host.len()).step_by(BOUNCE) {
                let n = BOUNCE.min(host.len() - at);
                let dev = span.slice(at..at + n)?;
                if let Dir::Up(from) = &host {
                    buf.as_mut_slice()?[..n].copy_from_slice(&from[at..at + n]);
                }
                let stage = buf.slice(0..n)?;
                match &host {
                    Dir::Up(_) => st.copy(&dev, &stage)?,
                    Dir::Down(_) => st.copy(&stage, &dev)?,
                }
                drop((stage, dev));
                st.synchronize(COPY_LIMIT)?;
                if let Dir::Down(to) = &mut host {
                    to[at..at + n].copy_from_slice(&buf.as_mut_slice()?[..n]);
                }
            }
            Ok(())
        })
    }

    /// The bytes of device memory `region`, copied by the device.
    pub fn read(&self, region: Region) -> Result<Vec<u8>> {
        let mut v = vec![0u8; region.len()];
        if !v.is_empty() {
            self.copy(self.span(region)?, Dir::Down(&mut v))?;
        }
        Ok(v)
    }

    /// Writes `data` to the start of device memory `region`, by the device.
    pub fn write(&self, region: Region, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let span = self.span(region)?.slice(0..data.len())?;
        self.copy(span, Dir::Up(data))
    }
}
