//! The one error type: an `ncclResult_t` and a line for NCCL's log.

use crate::abi::NcclResult;
use std::fmt;

/// What an entry point returns on failure: the code NCCL sees and a one-line message
/// the entry point hands to NCCL's logger (`WARN`) before returning the code.
#[derive(Clone, Debug)]
pub struct NetError {
    pub code: NcclResult,
    pub msg: String,
}

pub type Result<T> = std::result::Result<T, NetError>;

impl NetError {
    pub fn new(code: NcclResult, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
        }
    }
    /// NCCL called us wrongly (a bad pointer, device, size).
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(NcclResult::INVALID_ARGUMENT, msg)
    }
    /// NCCL's use breaks a rule (a message larger than the receive posted for it).
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::new(NcclResult::INVALID_USAGE, msg)
    }
    /// The operating system refused (socket, interfaces).
    pub fn system(msg: impl Into<String>) -> Self {
        Self::new(NcclResult::SYSTEM_ERROR, msg)
    }
    /// Something this plugin cannot do (CUDA memory) or a broken invariant.
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(NcclResult::INTERNAL_ERROR, msg)
    }
    /// The peer went away, broke the protocol, or its data could not be repaired.
    pub fn remote(msg: impl Into<String>) -> Self {
        Self::new(NcclResult::REMOTE_ERROR, msg)
    }
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

/// An I/O error as a system error naming the call.
pub fn io_err(what: impl fmt::Display, e: std::io::Error) -> NetError {
    NetError::system(format!("{what}: {e}"))
}
