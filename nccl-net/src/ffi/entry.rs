//! What every entry point shares: [`guard`] (an error or a panic becomes a logged
//! `ncclResult_t`, never an unwind into NCCL's C++) and [`out`] (an output argument NCCL
//! passed, checked for null).

use crate::abi::NcclResult;
use crate::error::{NetError, Result};
use crate::log::warn;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs an entry point: its error or panic becomes a logged `ncclResult_t`.
pub(super) fn guard(what: &str, f: impl FnOnce() -> Result<()>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NcclResult::SUCCESS,
        Ok(Err(e)) => {
            warn!("{what}: {e}");
            e.code
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            warn!("{what}: internal error (a panic: {msg}); the call failed, the process goes on");
            NcclResult::INTERNAL_ERROR
        }
    }
}

/// An output argument NCCL passed, as a reference; null is an error.
///
/// # Safety
/// `p` is null or points at a `T` this call may write and nothing else touches while
/// the reference lives (NCCL's output arguments, for the entry point's call).
pub(super) unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: the caller's contract; null is refused.
    unsafe { p.as_mut() }.ok_or_else(|| NetError::invalid(format!("{what} is null")))
}
