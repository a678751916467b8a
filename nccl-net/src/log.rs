//! NCCL's logger: the `logFunction` handed to `init`, kept for every later call.
//! Before `init`, or if NCCL gave none, warnings go to stderr and the rest is dropped.
//! Every line starts with `NET/grdma :`, like NCCL's own `NET/Socket :`.

use crate::abi::{NcclDebugLogger, NCCL_LOG_INFO, NCCL_LOG_WARN, NCCL_NET};
use std::ffi::{c_int, c_ulong, CString};
use std::sync::Mutex;

/// The logger NCCL gave to the last `init`. A lock, not an atomic, so that the function
/// pointer needs no cast; logging is rare (errors, setup, close).
static LOGGER: Mutex<NcclDebugLogger> = Mutex::new(None);

pub fn set_logger(f: NcclDebugLogger) {
    *LOGGER.lock().unwrap_or_else(|p| p.into_inner()) = f;
}

fn logger() -> NcclDebugLogger {
    *LOGGER.lock().unwrap_or_else(|p| p.into_inner())
}

/// One line to NCCL's log at `level`, with the source file and line NCCL prints.
pub fn emit(level: c_int, flags: c_ulong, file: &'static std::ffi::CStr, line: u32, msg: &str) {
    let text = format!("NET/grdma : {msg}");
    match logger() {
        Some(f) => {
            // A NUL inside the message would cut it; replace rather than lose it.
            let c = CString::new(text.replace('\0', "?")).unwrap_or_default();
            // SAFETY: NCCL's `ncclDebugLog` is a printf-like variadic; the format "%s"
            // consumes exactly the one `char*` passed, which lives across the call.
            unsafe {
                f(
                    level,
                    flags,
                    file.as_ptr(),
                    line as c_int,
                    c"%s".as_ptr(),
                    c.as_ptr(),
                )
            };
        }
        None if level == NCCL_LOG_WARN => eprintln!("{text}"),
        None => {}
    }
}

pub const WARN: c_int = NCCL_LOG_WARN;
pub const INFO: c_int = NCCL_LOG_INFO;
pub const NET: c_ulong = NCCL_NET;

/// `warn!("...")`: a warning line (NCCL always prints these).
macro_rules! net_warn {
    ($($arg:tt)*) => {
        $crate::log::emit($crate::log::WARN, $crate::log::NET,
            // concat! makes the file name a C string at compile time.
            match std::ffi::CStr::from_bytes_with_nul(concat!(file!(), "\0").as_bytes()) {
                Ok(c) => c, Err(_) => c"nccl-net",
            }, line!(), &format!($($arg)*))
    };
}
/// `info!(flags; "...")`: an INFO line under NCCL's subsystem `flags` (shown with
/// `NCCL_DEBUG=INFO` and a matching `NCCL_DEBUG_SUBSYS`).
macro_rules! net_info {
    ($flags:expr; $($arg:tt)*) => {
        $crate::log::emit($crate::log::INFO, $flags,
            match std::ffi::CStr::from_bytes_with_nul(concat!(file!(), "\0").as_bytes()) {
                Ok(c) => c, Err(_) => c"nccl-net",
            }, line!(), &format!($($arg)*))
    };
}
pub(crate) use {net_info as info, net_warn as warn};
