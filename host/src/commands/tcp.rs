//! `host` and `host recv` over `--transport tcp`: the options that differ from verbs, then
//! the engine's TCP sender and receiver. The output is the verbs commands' own.

use super::output::iteration_error;
use anyhow::{bail, Result};
use host::cli::{RecvArgs, SendArgs};
use host::engine::connect::{choose_source, send_tcp};
use host::engine::serve::serve_tcp;
use host::engine::{RecvMemory, RecvOptions, SendOptions, TcpSendOptions};
use host::memory_factory::SendMemory;
use host::memory_path::MemKind;
use host::net::tcp::dial::{rails_of, Rail};
use host::server::admission::{Admission, Limits};
use host::transfer::{RecvOutcome, SendReport};
use host::wire::Op;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

/// The sender's options over TCP: the RDMA-only ones refused with a reason, and
/// `--mem device` too, since it asks for GPUDirect RDMA (the NIC reads GPU memory
/// directly) and no NIC reads memory for a socket. `auto_note`: why `--transport auto`
/// took tcp, when it did. `--mem auto` adapts instead (staged, then mapped).
pub fn check_send_options(args: &SendArgs, auto_note: Option<&str>) -> Result<()> {
    let why_tcp = auto_note.map(|n| format!(" ({n})")).unwrap_or_default();
    if args.raw {
        bail!("--raw (one SEND_WITH_IMM, no header) is an RDMA mode with no TCP form{why_tcp}; use --transport rdma, or drop --raw");
    }
    if args.op == Op::Write {
        bail!("--op write is an RDMA operation (WRITE into the receiver's memory){why_tcp}; over TCP the chunks are written to the socket: drop --op write");
    }
    if args.test_peer_lies.is_some() {
        bail!("--test-peer-lies breaks the verbs protocol (immediates, SEND lengths), which TCP's frames do not carry{why_tcp}: add --transport rdma");
    }
    if args.mem == MemKind::Device {
        bail!("--mem device asks for GPUDirect RDMA (the NIC reads GPU memory directly), which TCP cannot do{why_tcp}: use --mem staged (the kernel writes GPU memory, copied chunk by chunk through host memory) or --mem auto, or --transport rdma with an RDMA NIC");
    }
    Ok(())
}

/// The rails of `--bind-interfaces` and a comma list of receiver addresses; empty for
/// one rail (one address, no local addresses named).
fn rails(args: &SendArgs, peer: SocketAddr) -> Result<Vec<Rail>> {
    let ip = args.ip.as_deref().unwrap_or_default();
    let remotes = match ip.contains(',') {
        true => super::peer::resolve_all(ip, peer.port())?,
        false => vec![peer],
    };
    if remotes.len() == 1 && args.bind_interfaces.is_empty() {
        return Ok(Vec::new());
    }
    rails_of(&remotes, &args.bind_interfaces).map_err(anyhow::Error::msg)
}

/// `transfers` transfers, each on a new connection, or all on one (`--reuse-connection`):
/// `opts` with the TCP part from the options.
pub fn send(
    args: &SendArgs,
    mut opts: SendOptions,
    memory: &mut SendMemory,
    transfers: u32,
) -> Result<Vec<SendReport>> {
    let (source, log) = choose_source(memory)?;
    if let Some(k) = args.test_silent_rail {
        eprintln!("warning: TEST SILENT RAIL: rail {k} writes no end marker after its chunks (--test-silent-rail), as a link that died silently; the receiver has to notice");
    }
    opts.tcp = TcpSendOptions {
        streams: args.streams,
        rails: rails(args, opts.peer)?,
        test_silent_rail: args.test_silent_rail,
    };
    if args.reuse_connection {
        return Ok(send_tcp(&opts, source, &log, transfers)?);
    }
    let mut reports = Vec::new();
    for i in 0..transfers {
        let r = send_tcp(&opts, source, &log, 1).map_err(|e| iteration_error(e, i, transfers))?;
        reports.extend(r);
    }
    Ok(reports)
}

/// `host recv --transport tcp`.
pub fn serve(args: &RecvArgs, report: &mut dyn FnMut(&RecvOutcome)) -> Result<bool> {
    let limits = Limits::receiver(
        args.once,
        args.max_connections as usize,
        args.max_memory,
        args.max_per_peer(),
    );
    serve_with(args, &Admission::new(limits), report)
}

/// [`serve`] under an admission shared with the verbs receiver (`--transport auto`).
pub fn serve_with(
    args: &RecvArgs,
    admission: &Arc<Admission>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool> {
    if args.raw {
        bail!("--raw (one SEND_WITH_IMM, no header) is an RDMA mode with no TCP form; use --transport rdma");
    }
    let opts = recv_options(args)?;
    let memory = match args.mem {
        MemKind::Host | MemKind::Auto => RecvMemory::Host,
        MemKind::Device => device_memory(args)?,
        MemKind::Mapped | MemKind::Staged => {
            bail!("a receiver takes --mem host, device or auto (mapped and staged are ways of sending)")
        }
    };
    let listener = TcpListener::bind(opts.bind)
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (TCP): {e}", opts.bind))?;
    Ok(serve_tcp(
        listener, &opts, &memory, admission, None, report,
    )?)
}

/// The receiver's options from its command line, whichever transport.
pub fn recv_options(args: &RecvArgs) -> Result<RecvOptions> {
    Ok(RecvOptions {
        bind: SocketAddr::new(args.bind, args.port),
        once: args.once,
        max_bytes: args.max_bytes,
        timeout: args.timeout,
        max_connections: args.max_connections as usize,
        max_memory: args.max_memory,
        min_rate: args.min_rate,
        max_per_peer: args.max_per_peer(),
        allow: args.allow.clone().unwrap_or_default(),
        key: key(args.key_file.as_deref())?,
        output: args
            .output
            .as_deref()
            .map(host::transfer::store::Output::parse)
            .transpose()?,
        cancel: None,
    })
}

/// `--key-file`, read once.
fn key(path: Option<&std::path::Path>) -> Result<Option<host::server::Key>> {
    path.map(host::server::Key::from_file).transpose()
}

#[cfg(feature = "cuda")]
fn device_memory(args: &RecvArgs) -> Result<RecvMemory> {
    let gpu = host::memory_factory::GpuChoice::open(args.gpu, MemKind::Device)?;
    let gpu = gpu.gpu()?.clone();
    eprintln!("note: receiving into GPU memory: each stream's chunks are read into page-locked host slots and copied into device memory, then the verify kernel checks the whole buffer on the GPU; transfers are served at once, each on its own thread with its own copy stream, each counted against --max-memory with its page-locked ring");
    Ok(RecvMemory::Device(gpu))
}

#[cfg(not(feature = "cuda"))]
fn device_memory(_: &RecvArgs) -> Result<RecvMemory> {
    bail!("--mem device: this build has no GPU support (built without the `cuda` feature)")
}
