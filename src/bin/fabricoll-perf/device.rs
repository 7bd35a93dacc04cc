//! `--device`: the timed calls on device buffers, through the device calls' path that the C API
//! uses (`coll::device`): blocking, or stream-ordered on one stream of the rank with `--stream`
//! (the iterations enqueued back to back, the time taken when the stream has passed the last,
//! as nccl-tests times them). `--device emulated` is CI's stand-in for a GPU (a test tool:
//! the emulated device's memory is host memory the host may not touch).
use nccl_net_fabricoll::algo::Algorithm;
use nccl_net_fabricoll::coll::device::{install, DevCall, Parts, Streams};
use nccl_net_fabricoll::coll::{Comm, Kind};
use nccl_net_fabricoll::config::{Compression, Timeout};
use nccl_net_fabricoll::device::{Device, DeviceBuffer, EmuConfig, Stream};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use std::os::raw::c_void;
use std::sync::Arc;
use std::time::Duration;

/// Which device `--device` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// CUDA device N, or (None) the local rank's: local rank modulo the devices.
    Cuda(Option<i32>),
    /// The emulated device (CI).
    Emulated,
}

/// `--device` values: cuda, cuda:N, emulated.
pub fn parse(s: &str) -> Result<Which, String> {
    match s {
        "cuda" => Ok(Which::Cuda(None)),
        "emulated" => Ok(Which::Emulated),
        _ => match s.strip_prefix("cuda:").map(str::parse::<i32>) {
            Some(Ok(n)) if n >= 0 => Ok(Which::Cuda(Some(n))),
            _ => Err(format!(
                "'{s}' is not a device: cuda, cuda:N (N a device ordinal) or emulated"
            )),
        },
    }
}

/// A rank's device, its stream, and its communicator's device calls.
pub struct OnDevice {
    dev: Device,
    stream: Stream,
    calls: Streams,
    stream_ordered: bool,
    wait: Timeout,
}

/// A device buffer and the address the calls see.
pub struct Buf {
    mem: DeviceBuffer,
}

impl OnDevice {
    /// Opens `which` for local rank `local` and binds it to this thread.
    pub fn open(
        which: Which,
        local: usize,
        stream_ordered: bool,
        wait: Timeout,
    ) -> Result<OnDevice, String> {
        let dev = match which {
            Which::Emulated => {
                // Its streams fail a flag wait after `flag_timeout`: no sooner than the
                // benchmark's own waits (a busy machine delays the ranks that write the flags).
                let cfg = EmuConfig {
                    flag_timeout: wait.limit.max(EmuConfig::default().flag_timeout),
                    ..EmuConfig::default()
                };
                let d = Device::emulated(cfg).map_err(|e| e.to_string())?;
                install(d.clone());
                d
            }
            Which::Cuda(n) => {
                let count = nccl_net_fabricoll::cuda::probe()
                    .driver()
                    .map(|d| d.devices.len())
                    .ok_or_else(|| {
                        format!(
                            "--device cuda: {}",
                            nccl_net_fabricoll::cuda::probe()
                                .why_not()
                                .unwrap_or("no CUDA driver")
                        )
                    })?;
                if count == 0 {
                    return Err("--device cuda: the driver sees no device".into());
                }
                let ordinal = n.unwrap_or((local % count) as i32);
                Device::cuda(ordinal).map_err(|e| format!("--device cuda:{ordinal}: {e}"))?
            }
        };
        dev.bind().map_err(|e| e.to_string())?;
        let stream = dev.create_stream().map_err(|e| e.to_string())?;
        Ok(OnDevice {
            dev,
            stream,
            calls: Streams::default(),
            stream_ordered,
            wait,
        })
    }

    /// What the header says of it.
    pub fn describe(&self) -> String {
        format!(
            "{:?}, {} calls",
            self.dev,
            if self.stream_ordered {
                "stream-ordered"
            } else {
                "blocking"
            }
        )
    }

    /// `len` bytes of device memory (at least one, so that every buffer has an address).
    pub fn alloc(&self, len: usize) -> Result<Buf, String> {
        let mem = self.dev.alloc(len.max(1)).map_err(|e| e.to_string())?;
        Ok(Buf { mem })
    }

    /// Writes `data` at byte `off` of `b`.
    pub fn write(&self, b: &Buf, off: usize, data: &[u8]) -> Result<(), String> {
        if data.is_empty() {
            return Ok(());
        }
        let span = b.mem.span();
        let dst = span
            .slice(off..off + data.len())
            .map_err(|e| e.to_string())?;
        self.stream
            .upload(&dst, data, self.wait)
            .map_err(|e| e.to_string())
    }

    /// `len` bytes at byte `off` of `b`.
    pub fn read(&self, b: &Buf, off: usize, len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len];
        if len > 0 {
            let span = b.mem.span();
            let src = span.slice(off..off + len).map_err(|e| e.to_string())?;
            self.stream
                .download(&mut out, &src, self.wait)
                .map_err(|e| e.to_string())?;
        }
        Ok(out)
    }

    /// Runs (blocking) or enqueues (stream-ordered) one call of `kind` from byte `send_off` of
    /// `send` to byte `recv_off` of `recv`, with `compress` of its own (None: the
    /// communicator's).
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &self,
        comm: &Arc<Comm>,
        kind: Kind,
        (send, send_off): (&Buf, usize),
        (recv, recv_off): (&Buf, usize),
        count: usize,
        (dtype, op): (DataType, RedOp),
        root: usize,
        algo: Option<Algorithm>,
        compress: Option<Compression>,
    ) -> Result<(), String> {
        let parts = Parts {
            kind,
            send: (send.mem.addr() as usize + send_off) as *const c_void,
            recv: (recv.mem.addr() as usize + recv_off) as *mut c_void,
            count,
            dtype,
            op,
            root,
            algo,
        };
        // SAFETY: both buffers live until the end of the size's rows, after `finish` has
        // waited for the stream to pass every call on them (blocking calls return done).
        let call = unsafe { DevCall::classify(&parts, self.stream_ordered) }
            .map_err(|e| e.to_string())?
            .ok_or("the buffers are not device memory")?;
        let call = match compress {
            Some(c) => call.with_compression(c),
            None => call,
        };
        if self.stream_ordered {
            // SAFETY: the stream is this rank's own and outlives every call (`finish` waits
            // for it before the buffers go).
            unsafe { self.calls.submit(comm, call, self.stream.handle()) }
        } else {
            self.calls.run(comm, call)
        }
        .map_err(|e| e.to_string())
    }

    /// Waits for the stream to pass every call enqueued on it, and reports a stream-ordered
    /// call's failure.
    pub fn finish(&self) -> Result<(), String> {
        if self.stream_ordered {
            self.stream
                .synchronize(self.wait)
                .map_err(|e| e.to_string())?;
            if let Some(e) = self.calls.error() {
                return Err(e.to_string());
            }
        }
        Ok(())
    }

    /// Ends the communicator's device calls (before it is destroyed).
    pub fn close(&self, comm: &Comm) {
        self.calls.shutdown(comm);
    }
}

/// A generous deadline for the benchmark's own waits (uploads, downloads, the stream).
pub fn deadline(comm_timeout: Duration) -> Timeout {
    Timeout::from(comm_timeout.max(Duration::from_secs(60)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_or_say_what_is_wrong() {
        assert_eq!(parse("cuda"), Ok(Which::Cuda(None)));
        assert_eq!(parse("cuda:3"), Ok(Which::Cuda(Some(3))));
        assert_eq!(parse("emulated"), Ok(Which::Emulated));
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x"] {
            assert!(parse(bad).unwrap_err().contains("not a device"), "{bad}");
        }
    }
}
