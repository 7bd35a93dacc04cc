//! Logging: `log` macros everywhere. When NCCL passes its logger to `init`, records go to it
//! (subsystem NET, so `NCCL_DEBUG=INFO` shows ours); standalone, env_logger reads `FABRICOLL_LOG`.
use parking_lot::RwLock;
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_ulong};
use std::sync::Once;

/// NCCL's `ncclDebugLogger_t` (variadic).
pub type NcclLogger = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);

const NCCL_LOG_WARN: c_int = 2;
const NCCL_LOG_INFO: c_int = 3;
const NCCL_LOG_TRACE: c_int = 5;
/// `NCCL_NET` subsystem flag.
pub const NCCL_SUBSYS_NET: c_ulong = 0x10;

struct Logger {
    nccl: RwLock<Option<NcclLogger>>,
    fallback: env_logger::Logger,
}

impl log::Log for Logger {
    fn enabled(&self, meta: &log::Metadata) -> bool {
        meta.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        if let Some(f) = *self.nccl.read() {
            let level = match record.level() {
                log::Level::Error | log::Level::Warn => NCCL_LOG_WARN,
                log::Level::Info => NCCL_LOG_INFO,
                _ => NCCL_LOG_TRACE,
            };
            let msg = format!("fabricoll: {}", record.args()).replace('\0', " ");
            let file = CString::new(record.file().unwrap_or("fabricoll")).unwrap_or_default();
            let msg = CString::new(msg).unwrap_or_default();
            // SAFETY: `f` is the logger NCCL passed to init; NCCL keeps it valid while it uses the
            // plugin. We pass a "%s" format with one NUL-terminated string, as printf requires.
            unsafe {
                f(
                    level,
                    NCCL_SUBSYS_NET,
                    file.as_ptr(),
                    record.line().unwrap_or(0) as c_int,
                    c"%s".as_ptr(),
                    msg.as_ptr(),
                )
            };
        } else if self.fallback.matches(record) {
            self.fallback.log(record);
        }
    }

    fn flush(&self) {}
}

static LOGGER: once_cell::sync::OnceCell<&'static Logger> = once_cell::sync::OnceCell::new();
static INIT: Once = Once::new();

fn spec() -> String {
    crate::config::get()
        .ok()
        .and_then(|c| c.log.clone())
        .unwrap_or_else(|| "warn".to_string())
}

/// Install the logger once per process. `nccl` replaces the destination when NCCL gives one.
pub fn init(nccl: Option<NcclLogger>) {
    INIT.call_once(|| {
        let fallback = env_logger::Builder::new()
            .parse_filters(&spec())
            .format_timestamp_micros()
            .build();
        let max = fallback.filter();
        let logger: &'static Logger = Box::leak(Box::new(Logger {
            nccl: RwLock::new(None),
            fallback,
        }));
        if log::set_logger(logger).is_ok() {
            log::set_max_level(max);
            let _ = LOGGER.set(logger);
        }
    });
    if let (Some(f), Some(l)) = (nccl, LOGGER.get()) {
        *l.nccl.write() = Some(f);
        // With NCCL's logger, NCCL_DEBUG decides what is shown: hand it info records unless
        // FABRICOLL_LOG asked for something else explicitly.
        let explicit = crate::config::get()
            .ok()
            .and_then(|c| c.log.clone())
            .is_some();
        if !explicit && log::max_level() < log::LevelFilter::Info {
            log::set_max_level(log::LevelFilter::Info);
        }
    }
}
