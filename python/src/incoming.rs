//! `Listener.accept()`'s result: an offer seen before it is taken (`host::api::Incoming`),
//! with its size, name and peer, taken with `recv`/`recv_into` or refused with
//! `decline`. Dropping it undecided declines it too.

use crate::memory::{region_of, Place};
use crate::{errors, report_json, spawn, Finished, Handle};
use host::api;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::Mutex;

/// An offer waiting for its receiver's decision (from `Listener.accept`): `size` bytes
/// named `name` from `peer`. Take it with `recv()` or `recv_into(target)` (a target of
/// exactly `size` bytes), or refuse it with `decline()`, within the listener's
/// `timeout`: after that the sender is told it was declined.
#[pyclass(module = "gpu_rdma")]
pub struct Incoming {
    inner: Mutex<Option<api::Incoming>>,
    /// The token of the listener's call that heard it: it cancels the receive.
    cancel: api::Cancel,
    peer: String,
    size: u64,
    chunk: u64,
    name: Option<String>,
}

impl Incoming {
    pub fn new(inner: api::Incoming, cancel: api::Cancel) -> Incoming {
        Incoming {
            cancel,
            peer: inner.peer().to_string(),
            size: inner.len(),
            chunk: inner.chunk(),
            name: inner.name().map(str::to_string),
            inner: Mutex::new(Some(inner)),
        }
    }

    /// The offer, taken out: each offer is decided once.
    fn take(&self) -> PyResult<api::Incoming> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this offer was taken or declined already"))
    }
}

#[pymethods]
impl Incoming {
    /// The sender's "host:port".
    #[getter]
    fn peer(&self) -> String {
        self.peer.clone()
    }

    /// The transfer's size in bytes: a target for `recv_into` holds exactly this.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The sender's chunk size in bytes (one CRC32C each).
    #[getter]
    fn chunk(&self) -> u64 {
        self.chunk
    }

    /// The sender's name for the transfer, or None.
    #[getter]
    fn name(&self) -> Option<String> {
        self.name.clone()
    }

    /// Take the transfer and return its bytes (with `report=True`, the bytes and the
    /// report).
    #[pyo3(signature = (report=false))]
    fn recv(&self, py: Python<'_>, report: bool) -> PyResult<Py<PyAny>> {
        let incoming = self.take()?;
        let handle = spawn("gpu-rdma-recv", None, self.cancel.clone(), move |_| {
            let got = incoming.receive()?;
            Ok(Finished {
                report: report_json(&got.report),
                bytes: Some(got.bytes),
            })
        })?;
        handle.wait_done(py, None)?;
        let (got, bytes) = handle.take(py)?;
        let bytes = bytes.ok_or_else(|| PyRuntimeError::new_err("no bytes"))?;
        match report {
            true => Ok((bytes, got).into_pyobject(py)?.into_any().unbind()),
            false => Ok(bytes),
        }
    }

    /// Take the transfer in place into `target` (a writable buffer, NumPy array or torch
    /// tensor, CPU or CUDA) of exactly `size` bytes, and return the report. A target of
    /// another size raises ValueError and leaves the offer undecided.
    fn recv_into(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.recv_into_async(target)?.wait(py, None)
    }

    /// `recv_into` that returns a Handle at once.
    fn recv_into_async(&self, target: &Bound<'_, PyAny>) -> PyResult<Handle> {
        let region = region_of(target, true)?;
        if region.len as u64 != self.size {
            return Err(PyValueError::new_err(format!(
                "the offer is {} bytes and the target {} bytes: a target of exactly the offer's size takes it",
                self.size, region.len
            )));
        }
        let incoming = self.take()?;
        spawn(
            "gpu-rdma-recv",
            Some(region),
            self.cancel.clone(),
            move |region| {
                let region = region.expect("a region");
                let place = match region.place {
                    Place::Host(ptr) => host::memory::lent::LentPlace::Host(ptr),
                    Place::Device { ordinal, ptr } => {
                        host::memory::lent::LentPlace::Device { ordinal, ptr }
                    }
                };
                // SAFETY: as in `Listener.recv_into_async`: the region holds the object's
                // memory until this closure has returned (`spawn` releases it after), valid
                // for reads and writes of `len` bytes; `receive_lent` returns only after
                // every use of it has ended.
                let report = unsafe { incoming.receive_lent(place, region.len) }?;
                Ok(Finished {
                    report: report_json(&report),
                    bytes: None,
                })
            },
        )
    }

    /// Refuse the transfer: its sender gets Rejected ("declined").
    fn decline(&self, py: Python<'_>) -> PyResult<()> {
        let incoming = self.take()?;
        py.detach(move || incoming.decline());
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpu_rdma.Incoming {} bytes from {}{}>",
            self.size,
            self.peer,
            self.name
                .as_ref()
                .map(|n| format!(" named {n:?}"))
                .unwrap_or_default()
        )
    }
}

/// `Listener.accept`'s wait: on a thread of its own, the GIL released, Ctrl-C seen.
pub fn accept(py: Python<'_>, listener: api::Listener, cancel: api::Cancel) -> PyResult<Incoming> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gpu-rdma-accept".into())
        .spawn(move || {
            // A caller gone (Ctrl-C) drops the offer with the failed send: declined.
            let _ = tx.send(listener.accept());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
    let mut rx = rx;
    loop {
        // The receiver is Send, not Sync: it goes to the GIL-free closure and back.
        let (back, got) = py.detach(move || {
            let got = rx.recv_timeout(crate::SIGNAL_POLL);
            (rx, got)
        });
        rx = back;
        match got {
            Ok(Ok(incoming)) => return Ok(Incoming::new(incoming, cancel)),
            Ok(Err(e)) => return Err(errors::to_py(e)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    // The wait for an offer ends with the call.
                    cancel.cancel();
                    return Err(interrupt);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err("the accept ended without a result"))
            }
        }
    }
}
