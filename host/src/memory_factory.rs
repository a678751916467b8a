//! Build the sender's source and the receiver's sink from the command line's choices:
//! probe the GPU, pick the path ([`crate::memory_path`]), allocate, and say what was
//! chosen. Above both [`crate::memory`] (the traits every buffer meets, and the choice)
//! and [`crate::gpu`] (the GPU's buffers), which it puts together.

use crate::memory::{HostBuffer, RecvSink, SendSource};
use crate::memory_path::{GpuCapabilities, MemKind, Method, Plan};
use anyhow::Result;
use std::fmt;
use std::str::FromStr;

/// `--gpu N|none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum GpuSelection {
    Index(u32),
    /// No GPU: the CPU writes the pattern.
    None,
}

impl FromStr for GpuSelection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(GpuSelection::None);
        }
        s.parse()
            .map(GpuSelection::Index)
            .map_err(|_| format!("expected a GPU number (0, 1, ...) or `none`, got `{s}`"))
    }
}

impl fmt::Display for GpuSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSelection::Index(i) => write!(f, "{i}"),
            GpuSelection::None => f.write_str("none"),
        }
    }
}

/// The GPU this run uses, with what it can do, or why this machine has none. A GPU that
/// is there but fails to open (a kernel build that does not load, a broken driver) is
/// neither: [`GpuChoice::open`] returns that as an error, never as a reason to fall
/// back to the CPU.
pub struct GpuChoice {
    #[cfg(feature = "cuda")]
    gpu: Option<std::rc::Rc<crate::gpu::Gpu>>,
    /// The capabilities, or why there is no GPU.
    pub caps: Result<GpuCapabilities, String>,
    /// The GPU's PCI bus id (`0000:00:06.0`), for the GPU-NIC distance.
    pub pci_bus_id: Option<String>,
}

impl GpuChoice {
    /// Open the GPU `selection` names, unless `mem` needs none.
    pub fn open(selection: GpuSelection, mem: MemKind) -> Result<GpuChoice> {
        let none = |why: &str| GpuChoice {
            #[cfg(feature = "cuda")]
            gpu: None,
            caps: Err(why.to_string()),
            pci_bus_id: None,
        };
        let GpuSelection::Index(ordinal) = selection else {
            return Ok(none("--gpu none was given"));
        };
        if mem == MemKind::Host {
            // Host memory needs no GPU; don't pay for a CUDA context.
            return Ok(none("--mem host was given"));
        }
        #[cfg(feature = "cuda")]
        {
            use crate::gpu::{capabilities, Gpu};
            let gpu = match Gpu::open(ordinal) {
                Ok(gpu) => gpu,
                Err(e) if e.is_no_gpu() => return Ok(none(&e.to_string())),
                Err(e) => return Err(e.into()),
            };
            let caps = capabilities::capabilities(gpu.raw_device())?;
            let pci_bus_id = capabilities::pci_bus_id(gpu.raw_device()).ok();
            Ok(GpuChoice {
                gpu: Some(gpu),
                caps: Ok(caps),
                pci_bus_id,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Ok(none(
                "this build has no GPU support (built without the `cuda` feature)",
            ))
        }
    }

    /// The raw `CUdevice` of the GPU in use, if there is one.
    #[cfg(feature = "cuda")]
    pub fn raw_device(&self) -> Option<i32> {
        self.gpu.as_ref().map(|g| g.raw_device())
    }

    /// The GPU in use, or why there is none.
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> Result<&std::rc::Rc<crate::gpu::Gpu>> {
        match (&self.gpu, &self.caps) {
            (Some(gpu), _) => Ok(gpu),
            (None, Err(why)) => anyhow::bail!("no GPU: {why}"),
            (None, Ok(_)) => anyhow::bail!("no GPU"),
        }
    }
}

/// The sender's data on each path of a [`Plan`], made when the walk first asks for it
/// (a path the NIC refuses costs one generation) and kept.
pub struct SendMemory {
    plan: Plan,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    gpu: GpuChoice,
    /// Bytes to generate (a multiple of 4).
    size: usize,
    /// The transfer's chunk size (the staging ring's slot size).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    chunk: usize,
    made: Vec<(Method, Box<dyn SendSource>)>,
    /// Time spent making (allocating and generating) sources, so far.
    making: std::time::Duration,
    /// The user's bytes (`--input`, a library caller's buffer) instead of the pattern:
    /// the host-memory source is this buffer itself; GPU sources get a copy uploaded.
    user_data: Option<HostBuffer>,
    /// The user's buffer was moved into the host-memory source.
    made_from_user: bool,
}

impl SendMemory {
    pub fn new(plan: Plan, gpu: GpuChoice, size: usize, chunk: usize) -> SendMemory {
        SendMemory {
            plan,
            gpu,
            size,
            chunk,
            made: Vec::new(),
            making: std::time::Duration::ZERO,
            user_data: None,
            made_from_user: false,
        }
    }

    /// The user's `data` (any length) instead of the pattern, placed on each path of
    /// `plan` when asked: host memory as it is, GPU memory by an upload.
    pub fn user(plan: Plan, gpu: GpuChoice, data: HostBuffer, chunk: usize) -> SendMemory {
        let size = data.len();
        SendMemory {
            user_data: Some(data),
            ..SendMemory::new(plan, gpu, size, chunk)
        }
    }

    /// Bytes of the data.
    pub fn len(&self) -> usize {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Whether the data is the user's (opaque bytes) rather than the pattern.
    pub fn is_user_data(&self) -> bool {
        self.user_data.is_some() || self.made_from_user
    }

    /// What to try, in order.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The data on `method`'s path.
    pub fn source(&mut self, method: Method) -> Result<&dyn SendSource> {
        let index = match self.made.iter().position(|(m, _)| *m == method) {
            Some(i) => i,
            None => {
                let started = std::time::Instant::now();
                let made = self.make(method)?;
                self.making += started.elapsed();
                self.made.push((method, made));
                self.made.len() - 1
            }
        };
        Ok(self.made[index].1.as_ref())
    }

    fn make(&mut self, method: Method) -> Result<Box<dyn SendSource>> {
        if self.is_user_data() {
            return self.place_user_data(method);
        }
        if method == Method::Host {
            return Ok(Box::new(HostBuffer::with_pattern(self.size)?));
        }
        #[cfg(feature = "cuda")]
        {
            use crate::gpu::sources::{GpuDirectBuffer, MappedSource, StagedSource};
            let gpu = self.gpu.gpu()?;
            Ok(match method {
                Method::Mapped => Box::new(MappedSource::generate(gpu, self.size)?),
                Method::Staged => Box::new(StagedSource::generate(gpu, self.size, self.chunk)?),
                Method::DmaBuf | Method::PeerMem => {
                    let registration = method.device_registration().expect("GPUDirect");
                    Box::new(GpuDirectBuffer::generate(gpu, self.size, registration)?)
                }
                Method::Host => unreachable!("handled above"),
            })
        }
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!(
            "{}: this build has no GPU support (built without the `cuda` feature)",
            method.name()
        )
    }

    /// The user's bytes on `method`'s path.
    fn place_user_data(&mut self, method: Method) -> Result<Box<dyn SendSource>> {
        let Some(data) = self.user_data.as_mut() else {
            anyhow::bail!(
                "{}: the data was already placed in host memory, and only there",
                method.name()
            );
        };
        if method == Method::Host {
            self.made_from_user = true;
            let data = self.user_data.take().expect("checked above");
            return Ok(Box::new(data));
        }
        #[cfg(feature = "cuda")]
        {
            use crate::gpu::allocations::DeviceBuffer;
            use crate::gpu::sources::{GpuDirectBuffer, StagedSource};
            let gpu = self.gpu.gpu()?;
            let bytes = data.as_bytes();
            Ok(match method {
                Method::Staged => {
                    let mut device = DeviceBuffer::new(gpu, bytes.len())?;
                    device.write(0, bytes)?;
                    Box::new(StagedSource::over(device, self.chunk)?)
                }
                Method::DmaBuf | Method::PeerMem => {
                    let registration = method.device_registration().expect("GPUDirect");
                    let mut device = DeviceBuffer::page_aligned(gpu, bytes.len())?;
                    device.write(0, bytes)?;
                    Box::new(GpuDirectBuffer::prepare(device, registration)?)
                }
                Method::Mapped => anyhow::bail!(
                    "mapped: the user's data is placed in device memory or sent from host memory, not mapped"
                ),
                Method::Host => unreachable!("handled above"),
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = data;
            anyhow::bail!(
                "{}: this build has no GPU support (built without the `cuda` feature)",
                method.name()
            )
        }
    }

    /// Time spent making sources so far: the sender leaves it out of connection setup.
    pub fn making_time(&self) -> std::time::Duration {
        self.making
    }

    /// `method` worked: later connections go straight to it, and the rest is freed.
    pub fn settle(&mut self, method: Method) {
        self.plan = Plan {
            attempts: vec![method],
            left_out: Vec::new(),
        };
        self.made.retain(|(m, _)| *m == method);
    }

    /// The source of the method the last walk settled on.
    pub fn settled(&self) -> Option<&dyn SendSource> {
        match self.plan.attempts.as_slice() {
            [only] => self
                .made
                .iter()
                .find(|(m, _)| m == only)
                .map(|(_, s)| s.as_ref()),
            _ => None,
        }
    }
}

/// Makes the receiver's buffer for each connection, on a method of its [`Plan`]; the
/// GPU (if any) is opened once.
pub struct SinkFactory {
    plan: std::cell::RefCell<Plan>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    gpu: GpuChoice,
}

impl SinkFactory {
    pub fn new(plan: Plan, gpu: GpuChoice) -> SinkFactory {
        SinkFactory {
            plan: std::cell::RefCell::new(plan),
            gpu,
        }
    }

    /// What to try for the next connection, in order.
    pub fn plan(&self) -> Plan {
        self.plan.borrow().clone()
    }

    /// A poisoned buffer of `len` bytes for one connection on `method`'s path (nothing
    /// in it verifies before data arrives).
    pub fn make(&self, method: Method, len: usize) -> Result<Box<dyn RecvSink>> {
        match method {
            Method::Host => Ok(Box::new(HostBuffer::poisoned(len)?)),
            #[cfg(feature = "cuda")]
            Method::DmaBuf | Method::PeerMem => {
                let registration = method.device_registration().expect("GPUDirect");
                Ok(Box::new(crate::gpu::sources::GpuDirectBuffer::receive(
                    self.gpu.gpu()?,
                    len,
                    registration,
                )?))
            }
            other => anyhow::bail!("a receiver cannot take {} memory", other.name()),
        }
    }

    /// `method` worked: later connections try it first (the rest stay as fallbacks:
    /// a later, larger buffer may not fit where a smaller one did).
    pub fn settle(&self, method: Method) {
        let mut plan = self.plan.borrow_mut();
        if let Some(i) = plan.attempts.iter().position(|m| *m == method) {
            plan.attempts[..=i].rotate_right(1);
        }
    }

    /// Whether any connection's buffer could be in GPU memory.
    pub fn may_use_gpu(&self) -> bool {
        self.plan.borrow().attempts.iter().any(|m| m.is_gpudirect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_selection_parses_numbers_and_none() {
        assert_eq!("0".parse(), Ok(GpuSelection::Index(0)));
        assert_eq!("none".parse(), Ok(GpuSelection::None));
        assert_eq!("NONE".parse(), Ok(GpuSelection::None));
        assert!("gpu0"
            .parse::<GpuSelection>()
            .unwrap_err()
            .contains("`gpu0`"));
    }

    fn host_only() -> Plan {
        Plan {
            attempts: vec![Method::Host],
            left_out: Vec::new(),
        }
    }

    #[test]
    fn cpu_sender_makes_the_pattern_without_touching_a_gpu() {
        let gpu = GpuChoice::open(GpuSelection::None, MemKind::Auto).unwrap();
        assert_eq!(gpu.caps, Err("--gpu none was given".to_string()));
        let mut memory = SendMemory::new(host_only(), gpu, 16384, 4096);
        let source = memory.source(Method::Host).unwrap();
        assert_eq!(source.first_values(5).unwrap(), [0, 2, 4, 6, 8]);
        assert_eq!(source.path(), crate::memory::DataPath::HostMemory);
        memory.settle(Method::Host);
        assert!(memory.settled().is_some());
    }

    #[test]
    fn gpu_paths_without_a_gpu_are_an_error_not_a_crash() {
        let gpu = GpuChoice::open(GpuSelection::None, MemKind::Auto).unwrap();
        let mut memory = SendMemory::new(host_only(), gpu, 16, 16);
        for method in [Method::DmaBuf, Method::Staged, Method::Mapped] {
            assert!(memory.source(method).is_err(), "{method:?}");
        }
    }

    #[test]
    fn receivers_start_with_what_worked_and_keep_the_rest() {
        let gpu = GpuChoice::open(GpuSelection::None, MemKind::Auto).unwrap();
        let plan = Plan {
            attempts: vec![Method::DmaBuf, Method::PeerMem, Method::Host],
            left_out: Vec::new(),
        };
        let factory = SinkFactory::new(plan, gpu);
        factory.settle(Method::Host);
        assert_eq!(
            factory.plan().attempts,
            [Method::Host, Method::DmaBuf, Method::PeerMem]
        );
        let sink = factory.make(Method::Host, 64).unwrap();
        assert_eq!(sink.verify(64).unwrap().first_mismatch, Some(0));
        assert!(factory.make(Method::Staged, 64).is_err());
    }
}
