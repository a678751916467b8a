//! The memory behind a Python object, found without a copy and held until the transfer
//! that uses it has ended:
//!
//! - a CUDA tensor or array: `__dlpack__` (DLPack's capsule; kept alive, so its producer
//!   keeps the memory), or `__cuda_array_interface__`;
//! - host memory: the buffer protocol (bytes, bytearray, memoryview, NumPy arrays,
//!   array.array), or `__dlpack__` on the CPU (torch's CPU tensors have no buffer).
//!
//! Only C-contiguous memory is taken (the bytes in order); anything else is refused with
//! a `ValueError` saying so. Items that are Python objects (NumPy's `dtype=object`) are
//! refused with a `TypeError`: their bytes are pointers into this process.

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

/// Where the bytes are.
#[derive(Debug, Clone, Copy)]
pub enum Place {
    Host(NonNull<u8>),
    /// Device memory of GPU `ordinal` (CUDA's device numbering).
    Device {
        ordinal: u32,
        ptr: u64,
    },
}

/// What keeps the memory alive and ours: released under the GIL when dropped.
enum Hold {
    /// A buffer-protocol view (`PyObject_GetBuffer`), released by `PyBuffer_Release`.
    Buffer(Box<ffi::Py_buffer>),
    /// The object that owns the memory (a DLPack capsule, whose destructor calls the
    /// producer's deleter; an object with `__cuda_array_interface__`).
    Owner(#[allow(dead_code)] Py<PyAny>),
}

/// The bytes of a Python object, held, and claimed for one transfer (see [`Claim`]).
pub struct Region {
    pub place: Place,
    pub len: usize,
    hold: Option<Hold>,
    claim: Option<Claim>,
}

/// Memory this module's transfers use now. A receive writes its target, so it must be
/// the only transfer on those bytes; sends only read theirs and may share them. Without
/// this, two receives could land in one array at once (two listeners), or a send could
/// read an array a receive is writing: the safety promise each transfer makes to the
/// library (the memory is its own until it ends) would not hold.
struct Span {
    id: u64,
    device: Option<u32>,
    start: u64,
    end: u64,
    writes: bool,
}

static IN_USE: std::sync::Mutex<(u64, Vec<Span>)> = std::sync::Mutex::new((0, Vec::new()));

fn in_use() -> std::sync::MutexGuard<'static, (u64, Vec<Span>)> {
    IN_USE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A transfer's hold on its bytes in [`IN_USE`], given back when dropped.
struct Claim(u64);

impl Claim {
    /// Claim `len` bytes at `place` (`writes`: a receive's); BufferError where a
    /// transfer already uses them in a way that conflicts.
    fn take(place: Place, len: usize, writes: bool) -> PyResult<Option<Claim>> {
        let (device, start) = match place {
            Place::Host(p) => (None, p.as_ptr() as u64),
            Place::Device { ordinal, ptr } => (Some(ordinal), ptr),
        };
        let end = start.saturating_add(len as u64);
        if len == 0 {
            return Ok(None);
        }
        let mut guard = in_use();
        let (next, spans) = &mut *guard;
        let clash = spans
            .iter()
            .find(|s| s.device == device && s.start < end && start < s.end && (writes || s.writes));
        if let Some(s) = clash {
            let what = match (writes, s.writes) {
                (true, true) => "another transfer is receiving into this memory",
                (true, false) => {
                    "a send is reading this memory (a receive into it would change what is sent)"
                }
                _ => {
                    "a receive is writing this memory (a send of it would read bytes as they land)"
                }
            };
            return Err(PyBufferError::new_err(format!(
                "{what}: wait for that transfer to end first"
            )));
        }
        *next += 1;
        spans.push(Span {
            id: *next,
            device,
            start,
            end,
            writes,
        });
        Ok(Some(Claim(*next)))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        in_use().1.retain(|s| s.id != self.0);
    }
}

// SAFETY: a Region is moved to the thread that runs its transfer. Its raw parts are plain
// addresses; what it holds is released only in `release`/Drop with the GIL taken (the
// Py_buffer's release and the owner's decref both need it, and get it there).
unsafe impl Send for Region {}

impl Region {
    /// Give the memory back to its owner (under the GIL).
    pub fn release(mut self, py: Python<'_>) {
        self.release_held(py);
    }

    fn release_held(&mut self, _py: Python<'_>) {
        match self.hold.take() {
            Some(Hold::Buffer(mut view)) => {
                // SAFETY: a view filled by PyObject_GetBuffer and released once (taken out
                // of the Option); the GIL is held (the token).
                unsafe { ffi::PyBuffer_Release(&mut *view) };
            }
            Some(Hold::Owner(owner)) => drop(owner),
            None => {}
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.hold.is_some() {
            Python::attach(|py| self.release_held(py));
        }
    }
}

/// DLPack's device types (dlpack.h, `DLDeviceType`).
const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// dlpack.h's `DLTensor` (the layout of DLPack 0.x and 1.x alike).
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// dlpack.h's `DLManagedTensor` (the unversioned capsule, named "dltensor").
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    // # Safety
    // Never called here (a fn pointer type, for the layout): the capsule's own
    // destructor, the producer's, calls it when the capsule goes.
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

const DLTENSOR: &CStr = c"dltensor";

/// dlpack.h's `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// dlpack.h's `DLManagedTensorVersioned` (DLPack 1.x, the capsule named
/// "dltensor_versioned"): it says whether the tensor is read-only.
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    // # Safety
    // Never called here, as for `DlManagedTensor`.
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the producer's tensor must not be written.
const DLPACK_FLAG_READ_ONLY: u64 = 1;

/// The bytes of `shape` elements of `dtype`, if the strides say C order.
fn contiguous_bytes(shape: &[i64], strides: Option<&[i64]>, item_bytes: u64) -> PyResult<u64> {
    let mut elements: u64 = 1;
    for &d in shape {
        let d = u64::try_from(d).map_err(|_| PyValueError::new_err("a negative dimension"))?;
        elements = elements
            .checked_mul(d)
            .ok_or_else(|| PyValueError::new_err("the tensor's size overflows"))?;
    }
    if let Some(strides) = strides {
        // C order: each dimension's stride is the product of the later ones (dimensions
        // of size 1 may have any stride).
        let mut expected: i64 = 1;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d != 1 && s != expected {
                return Err(PyValueError::new_err(
                    "the tensor is not contiguous (C order): call .contiguous() first",
                ));
            }
            expected = expected.saturating_mul(d);
        }
    }
    elements
        .checked_mul(item_bytes)
        .ok_or_else(|| PyValueError::new_err("the tensor's size overflows"))
}

/// Bytes per element of a DLPack dtype. Elements of less than a byte each (4-bit
/// integers and floats, packed two to a byte) are refused: counted a byte each, the
/// tensor's bytes would be overstated and a transfer would run past its memory.
fn element_bytes(dtype: DlDataType) -> PyResult<u64> {
    let bits = dtype.bits as u64 * dtype.lanes.max(1) as u64;
    if bits == 0 || !bits.is_multiple_of(8) {
        return Err(PyTypeError::new_err(format!(
            "a DLPack tensor of {}-bit elements (type code {}): only whole bytes per element are sent or received",
            dtype.bits, dtype.code
        )));
    }
    Ok(bits / 8)
}

/// The pointer a DLPack capsule holds under `name` (`dltensor` or `dltensor_versioned`),
/// never null. It stays valid while the capsule lives and is not consumed (renamed
/// `used_dltensor`), which we never do: the capsule is kept as the owner, and its
/// destructor calls the producer's deleter.
fn capsule_pointer<T>(capsule: &Bound<'_, PyCapsule>, name: &CStr) -> PyResult<*mut T> {
    // SAFETY: `capsule` is a live capsule object and `name` a NUL-terminated string;
    // a capsule of another name gives null (checked below), with a Python error set.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr()) };
    if p.is_null() {
        // Clear the error PyCapsule_GetPointer set; ours says what went wrong.
        let _ = PyErr::take(capsule.py());
        return Err(PyTypeError::new_err(
            "__dlpack__ returned a capsule that is not a DLPack tensor",
        ));
    }
    Ok(p.cast())
}

/// The memory of a DLPack capsule's tensor (the capsule is kept as the owner);
/// `writable` for a receive, which a tensor its producer marks read-only refuses.
fn from_dlpack(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Region> {
    // No stream argument: the producer orders its pending work before the capsule for
    // the default stream, and the transfer waits for the whole context on top of that.
    // DLPack 1.0 asked for first (its capsule says whether the tensor is read-only); a
    // producer that does not know `max_version` gives the unversioned one, which cannot.
    let kwargs = pyo3::types::PyDict::new(obj.py());
    kwargs.set_item("max_version", (1, 0))?;
    let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => obj.call_method0("__dlpack__")?,
        Err(e) => return Err(e),
    };
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__dlpack__ did not return a capsule"))?;
    let name = capsule.name()?;
    // SAFETY: the capsule's name, a C string it keeps while it lives (read at once).
    let versioned = name.is_some_and(|n| unsafe { n.as_cstr() } == DLTENSOR_VERSIONED);
    let t: &DlTensor = if versioned {
        let managed = capsule_pointer::<DlManagedTensorVersioned>(capsule, DLTENSOR_VERSIONED)?;
        // SAFETY: a DLManagedTensorVersioned the producer keeps valid while the capsule
        // lives; its version and flags come first whatever its minor version.
        let m = unsafe { &*managed };
        if m.version.major != 1 {
            return Err(PyTypeError::new_err(format!(
                "__dlpack__ returned a DLPack {}.{} tensor when asked for 1.0 at most",
                m.version.major, m.version.minor
            )));
        }
        if writable && m.flags & DLPACK_FLAG_READ_ONLY != 0 {
            return Err(PyValueError::new_err(
                "the target is read-only (its DLPack tensor says so): a receive writes into it",
            ));
        }
        &m.dl_tensor
    } else {
        let managed = capsule_pointer::<DlManagedTensor>(capsule, DLTENSOR)?;
        // SAFETY: a DLManagedTensor the producer keeps valid while the capsule lives.
        unsafe { &(*managed).dl_tensor }
    };
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err("bad ndim"))?;
    let shape = match ndim {
        0 => &[][..],
        // SAFETY: DLPack's contract: `shape` has `ndim` entries, valid while the capsule
        // lives (it outlives these slices: they are used in this function only).
        n => unsafe { std::slice::from_raw_parts(t.shape, n) },
    };
    let strides = match t.strides.is_null() || ndim == 0 {
        true => None,
        // SAFETY: as for `shape`: `strides`, where not null, has `ndim` entries.
        false => Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) }),
    };
    let len = contiguous_bytes(shape, strides, element_bytes(t.dtype)?)?;
    let len = usize::try_from(len).map_err(|_| PyValueError::new_err("too large"))?;
    let addr = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| PyValueError::new_err("a bad data pointer"))?;
    let place = match t.device.device_type {
        KDL_CPU | KDL_CUDA_HOST => Place::Host(
            NonNull::new(addr as *mut u8)
                .ok_or_else(|| PyValueError::new_err("a null data pointer"))?,
        ),
        KDL_CUDA => Place::Device {
            ordinal: u32::try_from(t.device.device_id)
                .map_err(|_| PyValueError::new_err("a bad device id"))?,
            ptr: addr,
        },
        other => {
            return Err(PyTypeError::new_err(format!(
                "DLPack device type {other} is neither the CPU nor a CUDA GPU"
            )))
        }
    };
    Ok(Region {
        place,
        len,
        hold: Some(Hold::Owner(capsule.clone().into_any().unbind())),
        claim: None,
    })
}

/// The memory of an object with `__cuda_array_interface__` (version 2 or 3).
fn from_cuda_array_interface(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Region> {
    let cai = obj.getattr("__cuda_array_interface__")?;
    let cai = cai
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("__cuda_array_interface__ is not a dict"))?;
    let get = |k: &str| {
        cai.get_item(k)?
            .ok_or_else(|| PyValueError::new_err(format!("__cuda_array_interface__ has no {k:?}")))
    };
    let data = get("data")?;
    let data = data
        .cast::<PyTuple>()
        .map_err(|_| PyTypeError::new_err("data is not a tuple"))?;
    let ptr: u64 = data.get_item(0)?.extract()?;
    let readonly: bool = data.get_item(1)?.extract()?;
    if writable && readonly {
        return Err(PyBufferError::new_err("the array is read-only"));
    }
    let shape: Vec<i64> = get("shape")?.extract()?;
    let typestr: String = get("typestr")?.extract()?;
    if typestr.get(1..2) == Some("O") {
        return Err(PyTypeError::new_err(format!(
            "cannot send or receive an array of Python objects (typestr {typestr:?})"
        )));
    }
    let item: u64 = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| PyValueError::new_err(format!("typestr {typestr:?}")))?;
    let strides: Option<Vec<i64>> = match cai.get_item("strides")? {
        Some(s) if !s.is_none() => Some(s.extract()?),
        _ => None,
    };
    // The interface's strides are in bytes.
    let element_strides =
        strides.map(|s| s.iter().map(|b| b / item.max(1) as i64).collect::<Vec<_>>());
    let len = contiguous_bytes(&shape, element_strides.as_deref(), item)?;
    // Which GPU: the object's `device.id` where it has one (CuPy, Numba), else 0.
    let ordinal: u32 = obj
        .getattr("device")
        .and_then(|d| d.getattr("id"))
        .and_then(|id| id.extract())
        .unwrap_or(0);
    Ok(Region {
        place: Place::Device { ordinal, ptr },
        len: usize::try_from(len).map_err(|_| PyValueError::new_err("too large"))?,
        hold: Some(Hold::Owner(obj.clone().unbind())),
        claim: None,
    })
}

/// Whether a buffer's struct format (PEP 3118, as `memoryview.format` shows it) has
/// Python objects among its items (`O`): their bytes are this process's pointers, which
/// a send would give away and a receive would overwrite with a peer's bytes (a crash, or
/// worse, at the next use of the array). Field names (`T{i:Ok:}`) are not codes.
fn holds_python_objects(format: &[u8]) -> bool {
    let mut in_name = false;
    format.iter().any(|&c| {
        if c == b':' {
            in_name = !in_name;
        }
        !in_name && c == b'O'
    })
}

/// Why a buffer was not taken.
enum NotTaken {
    /// The object gave no buffer of that kind (none at all, not contiguous, read-only).
    NoBuffer(PyErr),
    /// Its items are Python objects: refused, whatever else the object offers.
    Objects(PyErr),
}

/// The memory of a buffer-protocol object, C-contiguous (writable if asked), of plain
/// values (no Python objects, see [`holds_python_objects`]).
fn from_buffer(obj: &Bound<'_, PyAny>, writable: bool) -> Result<Region, NotTaken> {
    // SAFETY: Py_buffer is a C struct of pointers and integers, for which all zeroes is a
    // valid (empty) value; PyObject_GetBuffer fills it.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    // The format too: to refuse items that are Python objects.
    let flags = ffi::PyBUF_C_CONTIGUOUS
        | ffi::PyBUF_FORMAT
        | if writable { ffi::PyBUF_WRITABLE } else { 0 };
    // SAFETY: a live object (borrowed for the call) and a zeroed view to fill; on success
    // the view holds a reference and is released exactly once (Region's release, or just
    // below when its items are Python objects).
    let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
    if rc != 0 {
        return Err(NotTaken::NoBuffer(PyErr::fetch(obj.py())));
    }
    let format = match view.format.is_null() {
        true => &b"B"[..],
        // SAFETY: a filled view's format, where not null, is a NUL-terminated string
        // that lives as long as the view (which is released only after this use).
        false => unsafe { CStr::from_ptr(view.format) }.to_bytes(),
    };
    if holds_python_objects(format) {
        let format = String::from_utf8_lossy(format).into_owned();
        // SAFETY: the view just filled, released once, here (it is not kept).
        unsafe { ffi::PyBuffer_Release(&mut *view) };
        let kind = obj
            .get_type()
            .name()
            .map_or_else(|_| "buffer".to_string(), |n| n.to_string());
        return Err(NotTaken::Objects(PyTypeError::new_err(format!(
            "cannot send or receive a {kind} of Python objects (format {format:?}): its bytes are this process's pointers, not data; convert it to plain values (NumPy: .astype(...)) first"
        ))));
    }
    let len = usize::try_from(view.len).unwrap_or(0);
    let ptr = NonNull::new(view.buf.cast::<u8>()).unwrap_or(NonNull::dangling());
    Ok(Region {
        place: Place::Host(ptr),
        len,
        hold: Some(Hold::Buffer(view)),
        claim: None,
    })
}

/// The memory of `obj`, held and claimed for one transfer; `writable` for a receive
/// (which no other transfer of this module may touch meanwhile; sends may share).
///
/// # Errors
/// What [`held_region`] refuses; BufferError where a transfer already uses the memory
/// in a way that conflicts.
pub fn region_of(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Region> {
    let mut region = held_region(obj, writable)?;
    region.claim = Claim::take(region.place, region.len, writable)?;
    Ok(region)
}

/// The memory of `obj`, held; `writable` for a receive.
fn held_region(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Region> {
    if obj.hasattr("__dlpack_device__")? && obj.hasattr("__dlpack__")? {
        let (device_type, _): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
        if device_type == KDL_CUDA {
            return from_dlpack(obj, writable);
        }
    }
    let e = match from_buffer(obj, writable) {
        Ok(r) => return Ok(r),
        Err(NotTaken::Objects(e)) => return Err(e),
        Err(NotTaken::NoBuffer(e)) => e,
    };
    match e {
        e if obj.hasattr("__dlpack__")? && e.is_instance_of::<PyTypeError>(obj.py()) => {
            from_dlpack(obj, writable)
        }
        e if obj.hasattr("__cuda_array_interface__")? => {
            let _ = e;
            from_cuda_array_interface(obj, writable)
        }
        e if e.is_instance_of::<PyTypeError>(obj.py()) => Err(PyTypeError::new_err(format!(
            "cannot send or receive a {}: give bytes, a bytearray, a memoryview, a NumPy array, a torch tensor (CPU or CUDA), any object with the buffer protocol, __dlpack__ or __cuda_array_interface__, or a file path",
            obj.get_type().name()?
        ))),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::{element_bytes, holds_python_objects, DlDataType};

    #[test]
    fn dlpack_elements_of_whole_bytes_only() {
        let t = |code, bits, lanes| DlDataType { code, bits, lanes };
        assert_eq!(element_bytes(t(2, 32, 1)).unwrap(), 4);
        assert_eq!(element_bytes(t(6, 8, 1)).unwrap(), 1); // bool
        assert_eq!(element_bytes(t(5, 64, 1)).unwrap(), 8); // complex64
        assert_eq!(element_bytes(t(2, 16, 4)).unwrap(), 8); // 4 lanes of half
        assert!(element_bytes(t(0, 4, 1)).is_err()); // int4: two to a byte
        assert!(element_bytes(t(1, 1, 1)).is_err());
        assert!(element_bytes(t(2, 0, 1)).is_err());
    }

    #[test]
    fn python_objects_are_told_from_names_and_plain_codes() {
        for objects in [
            "O",
            "<O",
            "2O",
            "T{i:a:O:b:}",
            "T{O:Ok:}",
            "T{T{O:x:}:inner:}",
        ] {
            assert!(holds_python_objects(objects.as_bytes()), "{objects}");
        }
        for plain in ["B", "<i", "d", "T{i:Ok:}", "T{i:a:d:OO:}", "", "?", "Zd"] {
            assert!(!holds_python_objects(plain.as_bytes()), "{plain}");
        }
    }
}
