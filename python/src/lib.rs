//! `gpu_rdma._native`: the Python face of the `host` library (`host::api`). Every
//! transfer runs on a thread of its own with the GIL released; the calling thread waits
//! for it in short steps, so Ctrl-C is seen (and raised) at once. The memory a transfer
//! uses stays held by that thread until the transfer has ended, whatever the caller does
//! meanwhile.

mod errors;
mod incoming;
mod memory;

use host::api::{self, ErrorKind, Options};
use memory::{region_of, Place, Region};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a waiting call looks at Python's signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// How long a wait interrupted by Ctrl-C waits for its cancelled transfer to end (it
/// ends within a moment: the engine looks at its token every 50 ms; a socket's connect
/// runs to its connect timeout) before it raises KeyboardInterrupt anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// A finished transfer: its report as JSON, and (for `recv`) the bytes.
struct Finished {
    report: String,
    bytes: Option<Vec<u8>>,
}

type Outcome = Result<Finished, api::Error>;

fn resolve(address: &str) -> PyResult<SocketAddr> {
    address
        .to_socket_addrs()
        .map_err(|e| {
            PyValueError::new_err(format!("address {address:?}: {e} (expected host:port)"))
        })?
        .next()
        .ok_or_else(|| PyValueError::new_err(format!("address {address:?} resolves to nothing")))
}

/// A timeout or wait given in seconds: positive, and at most the library's longest
/// ([`api::MAX_TIMEOUT`], a day, as the command line's `--timeout`).
fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    let limit = api::MAX_TIMEOUT;
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero() && *d <= limit)
        .ok_or_else(|| {
            // 1e300 in 301 digits would hide the point.
            let shown = match value.is_finite() && value.abs() >= 1e9 {
                true => format!("{value:e}"),
                false => value.to_string(),
            };
            PyValueError::new_err(format!(
                "{what}={shown}: a positive number of seconds, at most {} (a day)",
                limit.as_secs()
            ))
        })
}

fn key_of(key_file: Option<PathBuf>) -> PyResult<Option<host::server::Key>> {
    key_file
        .map(|p| {
            host::server::Key::from_file(&p)
                .map_err(|e| PyValueError::new_err(format!("key_file: {e:#}")))
        })
        .transpose()
}

fn json_value(py: Python<'_>, json: &str) -> PyResult<Py<PyAny>> {
    Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
}

fn report_json<T: serde::Serialize>(report: &T) -> String {
    serde_json::to_string(report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Run `work` on a thread of its own, with `region` (if any) held there until it ends
/// and then given back under the GIL; `cancel` is the token its transfer stops by.
fn spawn(
    name: &str,
    region: Option<Region>,
    cancel: api::Cancel,
    work: impl FnOnce(Option<&Region>) -> Outcome + Send + 'static,
) -> PyResult<Handle> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let outcome = work(region.as_ref());
            // The memory goes back before the result is seen: a caller that reads its
            // buffer after `wait` returns reads it alone.
            if let Some(region) = region {
                Python::attach(|py| region.release(py));
            }
            let _ = tx.send(outcome);
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a transfer thread: {e}")))?;
    Ok(Handle {
        rx: Mutex::new(Some(rx)),
        result: Mutex::new(None),
        cancel,
    })
}

/// A transfer in progress (from `send_async`, `recv_into_async`). Dropped before its
/// transfer ended, it cancels it: keep it until `wait`.
// Its locks are never held while Python code runs or the GIL is awaited: another
// thread may poll the same handle meanwhile.
#[pyclass(module = "gpu_rdma")]
pub struct Handle {
    rx: Mutex<Option<mpsc::Receiver<Outcome>>>,
    result: Mutex<Option<Arc<Outcome>>>,
    cancel: api::Cancel,
}

/// A handle dropped before its transfer ended (garbage-collected, or unwound past by an
/// exception) cancels it: nobody can learn its outcome any more, and a receive with no
/// wait would otherwise hold its thread, its listener and its buffer for ever.
impl Drop for Handle {
    fn drop(&mut self) {
        let ended = self
            .result
            .get_mut()
            .map_or_else(|p| p.get_ref().is_some(), |r| r.is_some());
        if !ended {
            self.cancel.cancel();
        }
    }
}

impl Handle {
    /// Look for the outcome, waiting up to `step`; whether it is there.
    fn poll(&self, step: Duration) -> bool {
        let mut result = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if result.is_some() {
            return true;
        }
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(receiver) = rx.as_ref() else {
            return false;
        };
        match receiver.recv_timeout(step) {
            Ok(outcome) => {
                *result = Some(Arc::new(outcome));
                *rx = None;
                true
            }
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                *result = Some(Arc::new(Err(api::Error::new(
                    ErrorKind::Other,
                    "the transfer thread ended without a result",
                ))));
                *rx = None;
                true
            }
        }
    }

    /// Wait (GIL released) until the transfer ends or `timeout` passes; whether it
    /// ended. Ctrl-C cancels the transfer, waits for it to end (up to [`CANCEL_GRACE`]:
    /// its memory is then free) and raises KeyboardInterrupt.
    fn wait_done(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        // A wait longer than the clock can count (inf, 1e300) is a wait without end, as
        // None is.
        let deadline = match timeout {
            Some(t) if t >= 0.0 => Duration::try_from_secs_f64(t)
                .ok()
                .and_then(|d| Instant::now().checked_add(d)),
            Some(t) => {
                return Err(PyValueError::new_err(format!(
                    "timeout={t}: a number of seconds, not negative"
                )))
            }
            None => None,
        };
        loop {
            let step = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SIGNAL_POLL),
                None => SIGNAL_POLL,
            };
            if py.detach(|| self.poll(step)) {
                return Ok(true);
            }
            if let Err(interrupt) = py.check_signals() {
                self.cancel.cancel();
                py.detach(|| self.poll(CANCEL_GRACE));
                return Err(interrupt);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    /// The outcome, once there: the report (and bytes), or the exception.
    fn take(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, Option<Py<PyAny>>)> {
        // Out of the lock before any Python code runs (json.loads may let another thread
        // in, which may poll this handle).
        let result = self
            .result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match result.as_deref() {
            Some(Ok(f)) => {
                let bytes = f
                    .bytes
                    .as_ref()
                    .map(|b| PyBytes::new(py, b).into_any().unbind());
                Ok((json_value(py, &f.report)?, bytes))
            }
            Some(Err(e)) => Err(errors::to_py(e.clone())),
            None => Err(PyRuntimeError::new_err("the transfer has not ended")),
        }
    }
}

#[pymethods]
impl Handle {
    /// Whether the transfer has ended (never waits).
    fn done(&self, py: Python<'_>) -> bool {
        // Without the GIL: a thread in `wait` may hold the lock for a polling step.
        py.detach(|| self.poll(Duration::ZERO))
    }

    /// Stop the transfer: it ends within a moment (the connection broken off) unless it
    /// ended already, and `wait` then raises Cancelled. Never waits.
    fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Wait for the transfer to end (at most `timeout` seconds; None: until it ends,
    /// which its own timeouts bound) and return its report as a dict; raise its
    /// exception if it failed, TimedOut if `timeout` passed first (the transfer goes on:
    /// call wait again).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        if !self.wait_done(py, timeout)? {
            return Err(errors::TimedOut::new_err(format!(
                "the transfer did not end within {:.3} s (it goes on: wait again)",
                timeout.unwrap_or_default()
            )));
        }
        Ok(self.take(py)?.0)
    }

    /// The report, if the transfer ended well; None while it runs.
    #[getter]
    fn report(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if !py.detach(|| self.poll(Duration::ZERO)) {
            return Ok(None);
        }
        Ok(Some(self.take(py)?.0))
    }
}

/// A bound TCP receiver: `address` is its host:port. Each `recv`/`recv_into` takes one
/// transfer; call again for the next.
#[pyclass(module = "gpu_rdma")]
pub struct Listener {
    inner: api::Listener,
}

impl Listener {
    fn options_with_wait(&self, timeout: Option<f64>) -> PyResult<Options> {
        let mut opts = self.inner.options().clone();
        if let Some(t) = timeout {
            opts.wait = Some(seconds(t, "timeout")?);
        }
        Ok(opts)
    }

    /// A handle on the listener for one call, with its wait and the token that cancels
    /// the call.
    fn listener_for(&self, timeout: Option<f64>) -> PyResult<(api::Listener, api::Cancel)> {
        let mut opts = self.options_with_wait(timeout)?;
        let cancel = api::Cancel::new();
        opts.cancel = Some(cancel.clone());
        let clone = self.inner.try_clone().map_err(errors::to_py)?;
        Ok((clone.with_options(&opts), cancel))
    }
}

#[pymethods]
impl Listener {
    /// The bound address, "host:port".
    #[getter]
    fn address(&self) -> String {
        self.inner.local_addr().to_string()
    }

    /// The bound port.
    #[getter]
    fn port(&self) -> u16 {
        self.inner.local_addr().port()
    }

    /// Wait for the next sender's offer (`timeout`: seconds to wait for one; None: the
    /// listener's `wait`) and return it as an Incoming before anything is allocated for
    /// it: its `size`, `name` and `peer`, to take with `recv()`/`recv_into(target)` or
    /// refuse with `decline()`.
    #[pyo3(signature = (timeout=None))]
    fn accept(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<incoming::Incoming> {
        let (listener, cancel) = self.listener_for(timeout)?;
        incoming::accept(py, listener, cancel)
    }

    /// Receive one transfer and return its bytes (with `report=True`, the bytes and the
    /// report). `timeout`: seconds to wait for a sender (None: the listener's `wait`, by
    /// default as long as none comes).
    #[pyo3(signature = (timeout=None, report=false))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>, report: bool) -> PyResult<Py<PyAny>> {
        let (listener, cancel) = self.listener_for(timeout)?;
        let handle = spawn("gpu-rdma-recv", None, cancel, move |_| {
            let got = listener.receive()?;
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

    /// Receive one transfer in place into `target` (a writable buffer, NumPy array, or
    /// torch tensor on the CPU or a CUDA GPU: no copy, no allocation of its size) and
    /// return the report. Only a transfer of exactly `target`'s size in bytes is taken;
    /// the sender of any other gets Rejected before a byte lands.
    #[pyo3(signature = (target, timeout=None))]
    fn recv_into(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let handle = self.recv_into_async(target, timeout)?;
        handle.wait(py, None)
    }

    /// `recv_into` that returns a Handle at once.
    #[pyo3(signature = (target, timeout=None))]
    fn recv_into_async(&self, target: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<Handle> {
        let region = region_of(target, true)?;
        let (listener, cancel) = self.listener_for(timeout)?;
        spawn("gpu-rdma-recv", Some(region), cancel, move |region| {
            let region = region.expect("a region");
            let place = match region.place {
                Place::Host(ptr) => host::memory::lent::LentPlace::Host(ptr),
                // Else every offer is refused (no room for the upload ring) and a
                // receive with no wait waits for ever.
                #[cfg(not(feature = "cuda"))]
                Place::Device { .. } => return Err(no_gpu_support()),
                #[cfg(feature = "cuda")]
                Place::Device { ordinal, ptr } => {
                    host::memory::lent::LentPlace::Device { ordinal, ptr }
                }
            };
            // SAFETY: the region holds the object's memory (its buffer view or its owner;
            // a torch tensor's capsule holds its storage object, and a caller who resizes
            // that storage meanwhile frees the memory: documented, not preventable here)
            // until this closure has returned (`spawn` releases it after), valid for
            // reads and writes of `len` bytes (writable asked); no other transfer of this
            // module touches it meanwhile (the region's claim: a second receive into it,
            // or a send of it, is refused while this one runs). A caller that writes the
            // object while it is being
            // received into races with the transfer on bytes only, as with any I/O
            // into a buffer; Rust code holds no reference to it.
            let report = unsafe { listener.receive_lent(place, region.len) }?;
            Ok(Finished {
                report: report_json(&report),
                bytes: None,
            })
        })
    }
}

/// A peer to send to, and the options every send to it uses.
#[pyclass(module = "gpu_rdma")]
pub struct Endpoint {
    inner: api::Endpoint,
}

#[pymethods]
impl Endpoint {
    /// The peer's address, "host:port".
    #[getter]
    fn address(&self) -> String {
        self.inner.peer().to_string()
    }

    /// Sockets per transfer.
    #[getter]
    fn streams(&self) -> u16 {
        self.inner.streams()
    }

    /// Send `obj` (bytes, a buffer, a NumPy array, a torch tensor on the CPU or a CUDA
    /// GPU, read in place; or a file path, str or os.PathLike) and return the report once
    /// the receiver has verified every chunk.
    #[pyo3(signature = (obj, name=None))]
    fn send(
        &self,
        py: Python<'_>,
        obj: &Bound<'_, PyAny>,
        name: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let handle = self.send_async(obj, name)?;
        handle.wait(py, None)
    }

    /// `send` that returns a Handle at once.
    #[pyo3(signature = (obj, name=None))]
    fn send_async(&self, obj: &Bound<'_, PyAny>, name: Option<String>) -> PyResult<Handle> {
        let cancel = api::Cancel::new();
        let endpoint = self.inner.with_cancel(&cancel);
        let is_path = obj.is_instance_of::<pyo3::types::PyString>()
            || obj
                .py()
                .import("os")?
                .getattr("PathLike")
                .and_then(|p| obj.is_instance(&p))?;
        if is_path {
            let path: PathBuf = obj.extract()?;
            return spawn("gpu-rdma-send", None, cancel, move |_| {
                let report = endpoint.send_file(&path, name.as_deref())?;
                Ok(Finished {
                    report: report_json(&report),
                    bytes: None,
                })
            });
        }
        let region = region_of(obj, false)?;
        spawn("gpu-rdma-send", Some(region), cancel, move |region| {
            let region = region.expect("a region");
            let report = match region.place {
                Place::Host(ptr) => {
                    // SAFETY: the region holds the object's memory, readable for `len`
                    // bytes, until this closure returns (`spawn` releases it after); no
                    // receive of this module writes it meanwhile (the region's claim).
                    let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), region.len) };
                    endpoint.send(bytes, name.as_deref())?
                }
                #[cfg(not(feature = "cuda"))]
                Place::Device { .. } => return Err(no_gpu_support()),
                #[cfg(feature = "cuda")]
                Place::Device { ordinal, ptr } => {
                    // SAFETY: the region holds the tensor (its DLPack capsule or its
                    // owner), device memory of that GPU's primary context where CUDA's
                    // runtime and torch allocate, until this closure returns; the send
                    // waits for the context's queued work before it reads. A capsule
                    // holds torch's storage object, not its allocation: a caller who
                    // resizes the storage meanwhile frees it under the transfer, which
                    // nothing here can stop (docs/python.md says so).
                    unsafe { endpoint.send_device_lent(ordinal, ptr, region.len, name.as_deref()) }?
                }
            };
            Ok(Finished {
                report: report_json(&report),
                bytes: None,
            })
        })
    }
}

/// The error of a build without the `cuda` feature given GPU memory.
#[cfg(not(feature = "cuda"))]
fn no_gpu_support() -> api::Error {
    api::Error::new(
        ErrorKind::InvalidArgument,
        "this gpu_rdma was built without GPU support (the cuda feature): it moves host memory only",
    )
}

/// Listen on `address` ("host:port"; port 0 picks a free one) for transfers.
#[pyfunction]
#[pyo3(signature = (address="127.0.0.1:0", *, timeout=10.0, wait=None, max_bytes=1<<30, min_rate=1<<20, key_file=None))]
#[allow(clippy::too_many_arguments)]
fn listen(
    py: Python<'_>,
    address: &str,
    timeout: f64,
    wait: Option<f64>,
    max_bytes: u64,
    min_rate: u64,
    key_file: Option<PathBuf>,
) -> PyResult<Listener> {
    let opts = Options {
        timeout: seconds(timeout, "timeout")?,
        wait: wait.map(|w| seconds(w, "wait")).transpose()?,
        max_bytes,
        min_rate,
        key: key_of(key_file)?,
        ..Options::default()
    };
    // A name lookup, and with an RDMA device its listener: without the GIL.
    let inner = py.detach(|| {
        let addr = resolve(address)?;
        api::Listener::bind(addr, &opts).map_err(errors::to_py)
    })?;
    Ok(Listener { inner })
}

/// `transport=`: "auto" (RDMA verbs where this machine has an RDMA device and a route to
/// the peer, else TCP), "tcp", or "rdma".
fn transport_of(transport: &str) -> PyResult<api::TransportKind> {
    match transport {
        "auto" => Ok(api::TransportKind::Auto),
        "tcp" => Ok(api::TransportKind::Tcp),
        "rdma" | "verbs" => Ok(api::TransportKind::Rdma),
        other => Err(PyValueError::new_err(format!(
            "transport={other:?}: expected \"auto\", \"tcp\" or \"rdma\""
        ))),
    }
}

/// An endpoint for the receiver at `address` ("host:port").
#[pyfunction]
#[pyo3(signature = (address, *, transport="auto", streams=None, key_file=None, chunk=1<<20, timeout=10.0, max_resends=16, test_inject_faults=None))]
#[allow(clippy::too_many_arguments)]
fn connect(
    py: Python<'_>,
    address: &str,
    transport: &str,
    streams: Option<u16>,
    key_file: Option<PathBuf>,
    chunk: u64,
    timeout: f64,
    max_resends: u8,
    test_inject_faults: Option<String>,
) -> PyResult<Endpoint> {
    let transport = transport_of(transport)?;
    let faults = test_inject_faults
        .map(|s| host::transfer::faults::FaultInjector::parse(&s).map_err(PyValueError::new_err))
        .transpose()?;
    let opts = Options {
        chunk,
        timeout: seconds(timeout, "timeout")?,
        max_resends,
        key: key_of(key_file)?,
        test_inject_faults: faults,
        transport,
        // `None`: as the command line's `--streams auto`, chosen by `api::connect` from
        // this machine's cores and the link the peer is reached by.
        streams,
        ..Options::default()
    };
    // A name lookup, the link's speed, and with an RDMA device a route probe (up to
    // seconds): without the GIL, so other threads run and nothing waits on this one.
    let inner = py.detach(|| {
        let peer = resolve(address)?;
        api::connect(peer, &opts).map_err(errors::to_py)
    })?;
    Ok(Endpoint { inner })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(listen, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_class::<Listener>()?;
    m.add_class::<Endpoint>()?;
    m.add_class::<Handle>()?;
    m.add_class::<incoming::Incoming>()?;
    errors::register(m)?;
    Ok(())
}
