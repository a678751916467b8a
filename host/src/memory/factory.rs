//! Build the sender's source and the receiver's sink from the command line's choices:
//! probe the GPU, pick the path (`select`), allocate, and say what was chosen.

use super::select::{self, GpuCapabilities, MemKind, MemoryPlan};
use super::{HostBuffer, RecvSink, SendSource};
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

/// What the sender's data needs.
#[derive(Debug, Clone, Copy)]
pub struct SourceConfig {
    pub mem: MemKind,
    pub gpu: GpuSelection,
    /// Bytes to generate (a multiple of 4).
    pub size: usize,
    /// The transfer's chunk size (the staging ring's slot size).
    pub chunk: usize,
}

/// A GPU opened for this run with what it can do, or why this machine has none. A GPU
/// that is there but fails to open (a kernel build that does not load, a broken driver)
/// is neither: it is an error, never a reason to fall back to the CPU.
#[cfg(feature = "cuda")]
type Probe = Result<(std::rc::Rc<crate::gpu::Gpu>, GpuCapabilities), String>;
#[cfg(not(feature = "cuda"))]
type Probe = Result<(std::convert::Infallible, GpuCapabilities), String>;

fn probe(selection: GpuSelection, mem: MemKind) -> Result<Probe> {
    let GpuSelection::Index(ordinal) = selection else {
        return Ok(Err("--gpu none was given".into()));
    };
    if mem == MemKind::Host {
        // Host memory needs no GPU; don't pay for a CUDA context.
        return Ok(Err("--mem host was given".into()));
    }
    open_gpu(ordinal)
}

#[cfg(feature = "cuda")]
fn open_gpu(ordinal: u32) -> Result<Probe> {
    let gpu = match crate::gpu::Gpu::open(ordinal) {
        Ok(gpu) => gpu,
        Err(e) if e.is_no_gpu() => return Ok(Err(e.to_string())),
        Err(e) => return Err(e.into()),
    };
    let caps = crate::gpu::capabilities::capabilities(gpu.raw_device())?;
    Ok(Ok((gpu, caps)))
}

#[cfg(not(feature = "cuda"))]
fn open_gpu(_ordinal: u32) -> Result<Probe> {
    Ok(Err(
        "this build has no GPU support (built without the `cuda` feature)".into(),
    ))
}

fn say(note: &Option<String>) {
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
}

/// Allocate and fill the sender's data on the path `config` asks for.
pub fn make_send_source(config: &SourceConfig) -> Result<Box<dyn SendSource>> {
    let probe = probe(config.gpu, config.mem)?;
    let plan = select::choose_send_memory(
        config.mem,
        probe.as_ref().map(|p| p.1).map_err(Clone::clone),
    )?;
    if let MemoryPlan::Host { note } = &plan {
        say(note);
        return Ok(Box::new(HostBuffer::with_pattern(config.size)?));
    }
    #[cfg(feature = "cuda")]
    {
        use crate::gpu::sources::{GpuDirectBuffer, MappedSource, StagedSource};
        let gpu = probe.map_err(anyhow::Error::msg)?.0;
        Ok(match plan {
            MemoryPlan::Host { .. } => unreachable!("handled above"),
            MemoryPlan::Mapped => Box::new(MappedSource::generate(&gpu, config.size)?),
            MemoryPlan::Staged => {
                Box::new(StagedSource::generate(&gpu, config.size, config.chunk)?)
            }
            MemoryPlan::Device(method) => {
                Box::new(GpuDirectBuffer::generate(&gpu, config.size, method)?)
            }
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = probe;
        unreachable!("without CUDA the probe always fails, so only host plans exist")
    }
}

/// Makes one receive buffer per connection; the GPU (if any) is opened once.
pub struct SinkFactory {
    plan: MemoryPlan,
    #[cfg(feature = "cuda")]
    gpu: Option<std::rc::Rc<crate::gpu::Gpu>>,
}

impl SinkFactory {
    /// Decide where received data goes (`--mem`, `--gpu` of `host recv`).
    pub fn new(mem: MemKind, gpu: GpuSelection) -> Result<Self> {
        let probe = probe(gpu, mem)?;
        #[allow(unused_mut)]
        let mut plan =
            select::choose_recv_memory(mem, probe.as_ref().map(|p| p.1).map_err(Clone::clone))?;
        #[cfg(feature = "cuda")]
        if let (MemoryPlan::Device(_), Ok((gpu, _))) = (&plan, &probe) {
            use crate::gpu::capabilities::{writes_visibility, WritesVisibility};
            if writes_visibility(gpu.raw_device()) == WritesVisibility::Unordered {
                let why = "this GPU may see the NIC's writes out of order and offers no flush (cuFlushGPUDirectRDMAWrites), so data received into its memory cannot be verified";
                if mem == MemKind::Device {
                    anyhow::bail!("--mem device: {why}; use --mem host");
                }
                plan = MemoryPlan::Host {
                    note: Some(format!("{why}; receiving into host memory")),
                };
            }
        }
        if let MemoryPlan::Host { note } = &plan {
            say(note);
        }
        Ok(SinkFactory {
            #[cfg(feature = "cuda")]
            gpu: probe.ok().map(|p| p.0),
            plan,
        })
    }

    /// A poisoned buffer of `len` bytes for one connection (nothing in it verifies
    /// before data arrives).
    pub fn make(&self, len: usize) -> Result<Box<dyn RecvSink>> {
        match &self.plan {
            #[cfg(feature = "cuda")]
            MemoryPlan::Device(method) => {
                let gpu = self.gpu.as_ref().expect("a device plan has a GPU");
                Ok(Box::new(crate::gpu::sources::GpuDirectBuffer::receive(
                    gpu, len, *method,
                )?))
            }
            _ => Ok(Box::new(HostBuffer::poisoned(len)?)),
        }
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

    #[test]
    fn cpu_sender_makes_the_pattern_without_touching_a_gpu() {
        let config = SourceConfig {
            mem: MemKind::Auto,
            gpu: GpuSelection::None,
            size: 16384,
            chunk: 4096,
        };
        let source = make_send_source(&config).unwrap();
        assert_eq!(source.first_values(5).unwrap(), [0, 2, 4, 6, 8]);
        assert_eq!(source.path(), super::super::DataPath::HostMemory);
    }

    #[test]
    fn gpu_paths_with_gpu_none_are_refused() {
        let config = SourceConfig {
            mem: MemKind::Device,
            gpu: GpuSelection::None,
            size: 16,
            chunk: 16,
        };
        let err = make_send_source(&config)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("--mem device needs a GPU"), "{err}");
    }
}
