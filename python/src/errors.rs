//! The module's exceptions: one class per [`ErrorKind`], all under `TransferError`, each
//! carrying the command line's one-line message.

use host::api::{self, ErrorKind};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    gpu_rdma,
    TransferError,
    PyException,
    "A transfer failed; the subclass says how, the message says what happened."
);
create_exception!(
    gpu_rdma,
    Rejected,
    TransferError,
    "The peer refused the transfer before any data: too large, the wrong size for the buffer it receives into, busy, not allowed, or a key that did not match."
);
create_exception!(
    gpu_rdma,
    ChecksumFailed,
    TransferError,
    "Chunks still failed their CRC32C after every resend allowed (max_resends)."
);
create_exception!(
    gpu_rdma,
    TimedOut,
    TransferError,
    "A wait ran out: nothing moved for `timeout`, a sender below `min_rate`, or no transfer within a receive's `timeout`."
);
create_exception!(
    gpu_rdma,
    PeerGone,
    TransferError,
    "The peer closed or reset the connection before the transfer ended."
);
create_exception!(
    gpu_rdma,
    Unreachable,
    TransferError,
    "Nobody accepts connections at the address."
);

create_exception!(
    gpu_rdma,
    Cancelled,
    TransferError,
    "The caller cancelled the transfer (Handle.cancel()); Ctrl-C cancels it too and raises KeyboardInterrupt."
);

/// The exception for a library error: its kind's class, its message.
pub fn to_py(e: api::Error) -> PyErr {
    let message = e.message().to_string();
    match e.kind() {
        ErrorKind::Rejected => Rejected::new_err(message),
        ErrorKind::ChecksumFailed => ChecksumFailed::new_err(message),
        ErrorKind::TimedOut => TimedOut::new_err(message),
        ErrorKind::PeerGone => PeerGone::new_err(message),
        ErrorKind::Unreachable => Unreachable::new_err(message),
        ErrorKind::InvalidArgument => PyValueError::new_err(message),
        ErrorKind::Cancelled => Cancelled::new_err(message),
        ErrorKind::Other => TransferError::new_err(message),
    }
}

/// Add the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TransferError", py.get_type::<TransferError>())?;
    m.add("Rejected", py.get_type::<Rejected>())?;
    m.add("ChecksumFailed", py.get_type::<ChecksumFailed>())?;
    m.add("TimedOut", py.get_type::<TimedOut>())?;
    m.add("PeerGone", py.get_type::<PeerGone>())?;
    m.add("Unreachable", py.get_type::<Unreachable>())?;
    m.add("Cancelled", py.get_type::<Cancelled>())?;
    Ok(())
}
