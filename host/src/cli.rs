//! The command line: `host <ip> <port>` sends, `host recv` receives, `host info` lists
//! devices. Parsing only; `main.rs` turns the result into the typed configurations of
//! [`crate::transfer`] and [`crate::memory`].

use crate::memory_factory::GpuSelection;
use crate::memory_path::MemKind;
use crate::rails::NicList;
use crate::topology::PciDistance;
use crate::transport::TransportKind;
use crate::units::parse_size;
use crate::wire::Op;
use crate::wire::MAX_DEPTH;
use clap::{Args, Parser, Subcommand};
use std::net::IpAddr;
use std::time::Duration;

/// Largest chunk: one work request's length is a u32, and no device takes messages
/// beyond 2 GiB.
pub const MAX_CHUNK: u64 = 2 << 30;

#[derive(Debug, Parser)]
#[command(
    name = "host",
    version = env!("HOST_VERSION"),
    about = "Fill a buffer with a Rust GPU kernel and send it over RDMA; receive and verify it on the other side.",
    long_about = "Fill a buffer with a Rust GPU kernel and send it over RDMA (or TCP); receive and verify it on the other side.\n\n\
        Send with `host <ip> <port> [options]`, receive with `host recv [options]`; `host info` lists the devices, \
        `host doctor` says which transports work here.\n\n\
        The data is the pattern element i = 2*i (i32). Without options the sender sends 4096 values (16 KiB) \
        in one SEND, prints `Data sent successfully via ...` and the first 5 values, and reports the \
        receiver's verification of every element.",
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub send: SendArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Receive transfers, verify them against the pattern and report to each sender.
    Recv(RecvArgs),
    /// List RDMA devices and ports (state, link speed and width, link layer, MTU, GIDs),
    /// GPUs with what memory registration each supports (dma-buf, GPUDirect RDMA,
    /// nvidia-peermem), and the rails (RDMA ports) ranked for each GPU.
    Info(InfoArgs),
    /// Judge each transport for a GPU and a NIC: GPUDirect RDMA (and if not, why and the
    /// one thing to change), RDMA from host memory, TCP; which one `--transport auto`
    /// takes and which memory path `--mem auto` takes. Exit code 0 when any of them can
    /// carry a transfer, 1 when none can.
    Doctor(DoctorArgs),
    /// The GPU half alone: generate the data with the kernel, print the first values and
    /// check every element against the CPU's pattern. Needs a GPU, no RDMA device.
    GpuCheck(GpuCheckArgs),
    /// Benchmarks that print JSON with a reference measured in the same run.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Print a shell completion script for SHELL, generated from this binary's own
    /// options (e.g. `host completions bash > /etc/bash_completion.d/host`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page host(1) in roff (`host man | man -l -`), generated from this
    /// binary's own options; with --dir, write host.1 and one page per command there.
    Man {
        /// Write host.1, host-recv.1, ... into this directory instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

/// `host gpu-check`.
#[derive(Debug, Args)]
pub struct GpuCheckArgs {
    /// Bytes to generate (a multiple of 4; suffixes as for --size).
    #[arg(long, value_name = "BYTES", default_value = "16KiB", value_parser = parse_transfer_size)]
    pub size: u64,
    /// Where the kernel writes: `mapped` host memory (page-locked, mapped into the GPU) or `device` memory
    /// (then also checked by the verify kernel on the GPU).
    #[arg(long, value_enum, default_value = "mapped")]
    pub mem: crate::memory_path::CheckMemory,
    /// The GPU to use.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: u32,
    /// Print one JSON object instead of lines for people.
    #[arg(long)]
    pub json: bool,
}

/// `host info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Print one JSON object instead of lines for people.
    #[arg(long)]
    pub json: bool,
}

/// `host doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The GPU to check (0, 1, ...), or `none`: judge the transports for a sender whose
    /// CPU writes the pattern.
    #[arg(long, value_name = "N|none", default_value = "0")]
    pub gpu: GpuSelection,
    /// The RDMA device to check (`host info` lists them); without it, the device the
    /// route to --peer leaves through (as the RDMA CM resolves it), else the GPU's first
    /// rail (the ranking doctor prints), else the one nearest to the GPU on the PCIe tree.
    #[arg(long, value_name = "NAME")]
    pub nic: Option<String>,
    /// A receiver's address: then `--transport auto` is judged as a sender to it would
    /// decide (does the RDMA CM find a route to it through an RDMA device?), and the
    /// route's device is the one checked.
    #[arg(long, value_name = "IP")]
    pub peer: Option<IpAddr>,
    /// Bytes one transfer registers, judged against the locked-memory limit
    /// (RLIMIT_MEMLOCK) and the GPU's BAR1; a receiver registers its whole buffer (its
    /// --max-bytes).
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_size)]
    pub size: u64,
    #[arg(long, value_name = "LEVEL", default_value = "PXB", value_parser = parse_gpudirect_level, help = GPUDIRECT_LEVEL_HELP)]
    pub gpudirect_level: PciDistance,
    /// Print one JSON object instead of lines for people (the exit code is the same).
    #[arg(long)]
    pub json: bool,
}

/// `--gpudirect-level`, the same for every command.
const GPUDIRECT_LEVEL_HELP: &str = "The farthest GPU-NIC distance at which GPUDirect RDMA is tried, in the classes of \
    `nvidia-smi topo -m` (NCCL_NET_GDR_LEVEL's, whose default PXB this is): PIX (at most one PCIe switch \
    between them), PXB (several switches), PHB (through the CPU's host bridge), NODE (through two host \
    bridges of one NUMA node), SYS (across CPU sockets). Farther pairs are not tried: GPU memory goes \
    through host memory instead. `host info` shows each pair's class";

/// `host bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The kernel's fill bandwidth against cuMemsetD32 (16 KiB, 4 MiB, 256 MiB, 1 GiB), the
    /// 4096-element launch of a default transfer, mapped-memory writes against a pinned copy, and the
    /// staged pipeline's overlap. Prints JSON.
    Gpu {
        /// The GPU to measure.
        #[arg(long, value_name = "N", default_value_t = 0)]
        gpu: u32,
    },
    /// The CPU's CRC32C of each chunk (the `crc-fast` crate, its fastest path here) on one
    /// core, against a plain read of the same random bytes, interleaved rounds. Prints JSON.
    Crc32c {
        /// Bytes of random data.
        #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_size)]
        size: u64,
        /// Bytes per chunk (one CRC each).
        #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = parse_chunk_size)]
        chunk: u64,
        /// Rounds (each runs both once, after one warm-up round); median and spread.
        #[arg(long, value_name = "N", default_value_t = 5)]
        rounds: u32,
    },
    /// This project's TCP transfer (sender and receiver in this process, over loopback)
    /// against a plain socket copy with the same chunking, interleaved rounds. Prints JSON.
    Tcp {
        /// Bytes per transfer.
        #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_transfer_size)]
        size: u64,
        /// Bytes per chunk (frame), for both.
        #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = parse_chunk_size)]
        chunk: u64,
        /// Sockets per connection for this project's transfer.
        #[arg(long, value_name = "N", default_value_t = 1)]
        streams: u16,
        /// Rounds (each runs both once); the JSON has the median and the spread.
        #[arg(long, value_name = "N", default_value_t = 5)]
        rounds: u32,
    },
    /// Rails (TCP, or RDMA with --nic): the same transfer over each rail alone and over
    /// all of them striped, rounds interleaved, to a running `host recv`; the striped rate
    /// against the sum of the single-rail rates. Every transfer is verified. Prints JSON.
    Rails(RailsBenchArgs),
}

/// `host bench rails`: the sender's addressing of a striped send, and the rounds.
#[derive(Debug, Args)]
pub struct RailsBenchArgs {
    /// The receiver's addresses, a comma list (one per rail), or one for all rails.
    pub ip: String,

    /// The receiver's port.
    pub port: u16,

    /// TCP rails: the local address of each rail, comma-separated (as for a striped
    /// send); at least two rails in all, from these or from the receiver's addresses.
    #[arg(
        long,
        value_name = "ADDR[,ADDR...]",
        value_delimiter = ',',
        conflicts_with = "nic"
    )]
    pub bind_interfaces: Vec<IpAddr>,

    /// RDMA rails instead of TCP: the RDMA device of each rail (`host info` lists them),
    /// one per receiver address, as for a striped send (`--op write`, host memory, rail
    /// k from the k-th device to the k-th address).
    #[arg(long, value_name = "NAME[,NAME...]", value_parser = crate::rails::parse_nic_list)]
    pub nic: Option<NicList>,

    /// RDMA: work requests kept in flight (as for a send).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=MAX_DEPTH as i64))]
    pub depth: u32,

    /// Bytes per transfer.
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_transfer_size)]
    pub size: u64,

    /// Bytes per chunk (frame).
    #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = parse_chunk_size)]
    pub chunk: u64,

    /// TCP: sockets per rail.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=crate::net::tcp::frames::MAX_STREAMS as i64))]
    pub streams: u16,

    /// Rounds; each sends over every rail alone, then over all rails striped.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,

    /// Seconds any single wait may take (as for a send); fractions allowed.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_timeout)]
    pub timeout: Duration,

    /// A striped rail with chunks in flight that writes none for this long has failed
    /// (as for a send; a round in which a rail failed is an error here).
    #[arg(long, value_name = "SECS", default_value = "0.5", value_parser = parse_timeout)]
    pub rail_timeout: Duration,
}

/// `host <ip> <port>`: send.
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
    /// The receiver's address: an IPv4 or IPv6 address (or a host name) on an RDMA network;
    /// over TCP a comma list gives one per rail (--bind-interfaces).
    #[arg(required = true)]
    pub ip: Option<String>,

    /// The receiver's port (`host recv` and rdma-core's rdma_server listen on 7471).
    #[arg(required = true)]
    pub port: Option<u16>,

    /// Bytes to send: a multiple of 4 (whole i32 elements), with an optional binary unit:
    /// 16384, 64KiB, 1MiB, 1GiB (K, M, G mean KiB, MiB, GiB).
    #[arg(long, value_name = "BYTES", default_value = "16KiB", value_parser = parse_transfer_size)]
    pub size: u64,

    /// How each chunk travels.
    #[arg(long, value_enum, default_value_t = Op::Send)]
    pub op: Op,

    /// Where the data lives when it is sent. `device` is strict: GPUDirect RDMA only (the
    /// NIC reads GPU memory), an error when it cannot be had, also over TCP; `auto` adapts
    /// (dma-buf, peermem, staged, mapped over RDMA; staged, mapped over TCP).
    #[arg(long, value_enum, default_value_t = MemKind::Auto)]
    pub mem: MemKind,

    /// The GPU that generates the data (0, 1, ...), or `none`: the CPU writes the pattern.
    #[arg(long, value_name = "N|none", default_value = "0")]
    pub gpu: GpuSelection,

    /// The rails to send through, comma-separated: RDMA devices (`mlx5_0`: its active
    /// ports) or ports (`mlx5_0:1`); `host info` lists them, ranked for each GPU. With
    /// one receiver address per rail (`<IP>` a comma list, rail k to the k-th), the
    /// transfer is striped over them (chunks to the rail with the fewest in flight; a
    /// failed rail's chunks move to the others, see --rail-timeout); with --raw or
    /// --key-file only the first rail carries it (a note says so). The
    /// first device's facts (dma-buf probe, distance to the GPU) decide the memory
    /// path, and the route to each rail's receiver address must leave through its
    /// device. Without --nic and --rails, with a GPU, the memory path is
    /// decided for the device the route to the receiver leaves through (as the RDMA CM
    /// resolves it), else for the one nearest to the GPU; the connection itself always
    /// goes where the route goes.
    #[arg(long, value_name = "NAME[,NAME...]", value_parser = crate::rails::parse_nic_list)]
    pub nic: Option<NicList>,

    /// Take the first N rails of the GPU's ranking (`host info` shows it: active ports
    /// first, then the PCIe distance class, then speed; GPUs with equal rails take turns
    /// at its head). The GPU's default set, which `host info` marks, is every active rail
    /// at its best distance class. Striped as --nic says (one receiver address per
    /// rail, --op write); otherwise the first rail carries the transfer (a note says so
    /// when N > 1), and the route to the receiver must leave through it. More rails than
    /// can carry traffic is an error.
    #[arg(long, value_name = "N", conflicts_with = "nic", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub rails: Option<u32>,

    #[arg(long, value_name = "LEVEL", default_value = "PXB", value_parser = parse_gpudirect_level, help = GPUDIRECT_LEVEL_HELP)]
    pub gpudirect_level: PciDistance,

    /// Chunks kept in flight (1..=4096): RDMA work requests posted and not yet
    /// completed; over TCP, chunks handed to the socket writers.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=MAX_DEPTH as i64))]
    pub depth: u32,

    /// Bytes per chunk (more than --size means one chunk). Over RDMA a chunk is one work
    /// request, at most the device's largest message (`host info` shows it; Soft-RoCE:
    /// 8 MiB); over TCP one frame.
    #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = parse_chunk_size)]
    pub chunk: u64,

    /// Repeat the transfer N times, each on a new connection (so each is verified on its
    /// own); prints each iteration's and the aggregate throughput.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,

    /// Transfers made (and verified) before the measured --iters, not counted in the
    /// results; on the same connection with --reuse-connection.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub warmup: u32,

    /// Measure every power of two from MIN to MAX (e.g. 4KiB..1GiB; MIN a power of two,
    /// MAX at least MIN): --iters transfers of each after --warmup, one connection per
    /// size with --reuse-connection (a connection offers one size). Prints a table (and
    /// with --json one object with every size) instead of the per-transfer lines.
    #[arg(long, value_name = "MIN..MAX", value_parser = parse_sweep, conflicts_with_all = ["raw", "size"])]
    pub sweep: Option<(u64, u64)>,

    /// Report rates in Gb/s (10^9 bits per second, as link speeds are given) instead
    /// of GB/s (10^9 bytes per second). --json carries both.
    #[arg(long)]
    pub report_gbits: bool,

    /// With --iters N: make the N transfers on one connection instead of one each. The
    /// receiver verifies and acks every transfer, and the next starts after the ack, so
    /// each iteration's round trip (first chunk out to the receiver's verdict) is
    /// measured without connection setup. Needs a receiver that knows the mode.
    #[arg(long, conflicts_with = "raw")]
    pub reuse_connection: bool,

    /// Seconds any single wait may take (address resolution, connection, each completion,
    /// the receiver's verdict); fractions allowed.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_timeout)]
    pub timeout: Duration,

    /// Spin on the completion queue instead of sleeping until a completion arrives
    /// (lower latency, one CPU core busy).
    #[arg(long)]
    pub busy_poll: bool,

    /// Raw mode, RDMA only: no header, one SEND_WITH_IMM (immediate 0x1234) of the
    /// whole buffer, then up to 1 s for an optional reply. For rdma-core's rdma_server
    /// (which takes 16 bytes: use --size 16) or `host recv --raw`.
    #[arg(long)]
    pub raw: bool,

    /// Print one JSON object with all results on stdout (human lines go to stderr).
    #[arg(long)]
    pub json: bool,

    /// What carries the data: `rdma` (verbs), `tcp` (sockets: any machine; GPU memory
    /// goes through the staged ring) or `auto` (rdma when the RDMA CM finds a route to
    /// the receiver through an RDMA device, else tcp; a note says which and why).
    #[arg(long, value_enum, default_value_t = TransportKind::Auto)]
    pub transport: TransportKind,

    /// TCP only: sockets per connection, chunks spread over them round-robin (as NCCL's
    /// NCCL_NSOCKS_PERTHREAD), for links one socket cannot fill. `auto`: from this
    /// machine (a note says why where it picks more than one): at most half the cores, one per 25 Gbit/s of the
    /// interface the route to the receiver leaves by, 8 to this machine itself, 4 where
    /// the speed is not known, never more than 8.
    #[arg(long = "streams", value_name = "N|auto", default_value = "auto", value_parser = parse_streams)]
    pub streams_asked: Streams,

    /// The streams this transfer uses: `--streams`, with `auto` decided from the machine
    /// and the route to the receiver (`commands::send` sets it before anything is sent).
    #[arg(skip)]
    pub streams: u16,

    /// Why `auto` chose more than one stream, said once before the first TCP transfer.
    #[arg(skip)]
    pub streams_note: Option<String>,

    /// TCP only: stripe the transfer over several local interfaces (rails), one socket
    /// set (--streams each) per local address, rail k from the k-th address to the k-th
    /// receiver address of <IP> (a comma list), or to the one. Chunks go to whichever
    /// rail has room; a rail that fails mid-transfer has its chunks sent on the others,
    /// and rests (1 s, doubling per failure in a row, at most 60 s) before later
    /// transfers try it again. A comma list in <IP> without this option stripes too,
    /// each rail from the route's source address.
    // The text is clap's help too, where <IP> is the argument's name, not HTML.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_name = "ADDR[,ADDR...]", value_delimiter = ',')]
    pub bind_interfaces: Vec<IpAddr>,

    /// Striped (TCP or RDMA): a rail with chunks in flight that completes none for this
    /// long (TCP: writes none; RDMA: while another rail completes) has failed (its
    /// chunks go to the other rails); fractions allowed.
    #[arg(long, value_name = "SECS", default_value = "0.5", value_parser = parse_timeout)]
    pub rail_timeout: Duration,

    /// Protocol version to put into the header (tests of the receiver's version check).
    #[arg(long, hide = true, default_value_t = crate::wire::VERSION)]
    pub protocol_version: u16,

    /// A shared secret (a file of at least 16 bytes): prove to a receiver started with
    /// the same --key-file that this sender may send (HMAC-SHA256 over the offer and the
    /// receiver's fresh nonce; the key never crosses the network), over either transport.
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<std::path::PathBuf>,

    /// Send this file, or standard input (`-`), instead of the built-in pattern: any
    /// length (read into memory first; with a GPU it is placed in GPU memory and travels
    /// from there by the same paths as the pattern). Checked by CRC32C per chunk unless
    /// --verify says otherwise.
    #[arg(long, value_name = "FILE|-", conflicts_with_all = ["size", "sweep", "raw"])]
    pub input: Option<String>,

    /// The name a receiver writing into a directory (`host recv --output DIR`) gives the
    /// file: no path separators, control or invisible Unicode format characters (such
    /// as U+202E), `.` or `..` (default: the --input file's own name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// What the receiver checks: `pattern` (every element against the built-in pattern;
    /// the default for it), `checksum` (CRC32C of every chunk computed by the sender,
    /// checked where the chunk landed, a failed chunk sent again; the default for
    /// --input), `both`, or `off`.
    #[arg(long, value_enum, value_name = "CHECKS")]
    pub verify: Option<crate::wire::VerifyMode>,

    /// The most rounds of resends of chunks whose checksum failed, before the transfer
    /// fails naming them (0..=16); over TCP failed chunks come again in smaller pieces,
    /// and the rounds also end when the next would send more again than the transfer's
    /// size, or after --timeout without a repair.
    #[arg(long, value_name = "N", default_value_t = crate::wire::DEFAULT_MAX_RESENDS, value_parser = clap::value_parser!(u8).range(0..=crate::wire::MAX_RESENDS as i64))]
    pub max_resends: u8,

    /// TEST ONLY: flip one bit in one chunk in N (`1/N`) after its checksum was taken,
    /// on this side of the wire, to show that the receiver finds and repairs it. Says so
    /// on stderr and in the JSON; never use it for real data.
    #[arg(long, value_name = "1/N", help_heading = "Testing")]
    pub test_inject_faults: Option<String>,

    /// TEST ONLY, striped TCP: rail K (0-based, among the rails that connected) writes no
    /// end marker after its chunks, as if its link had died silently (no FIN) right after
    /// its last chunk, to show how long the receiver waits for it. Says so on stderr;
    /// never use it for real data.
    #[arg(long, value_name = "K", help_heading = "Testing")]
    pub test_silent_rail: Option<usize>,

    /// TEST ONLY, RDMA verbs: break the protocol in the first sending of the chunks, as a
    /// peer that lies over a queue pair: `index` (immediates that name no chunk of the
    /// transfer), `oversize` (the first SEND one byte longer than its chunk). Shows that
    /// the receiver stops such a peer at once, naming the lie, and serves on. Says so on
    /// stderr; never use it for real data.
    #[arg(long, value_name = "HOW", help_heading = "Testing", value_parser = crate::transfer::faults::PeerLie::parse)]
    pub test_peer_lies: Option<crate::transfer::faults::PeerLie>,
}

/// `host recv`.
#[derive(Debug, Clone, Args)]
pub struct RecvArgs {
    /// Local address to listen on (0.0.0.0: every RDMA-capable interface).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0")]
    pub bind: IpAddr,

    /// Port to listen on.
    #[arg(long, default_value_t = 7471)]
    pub port: u16,

    /// Exit after one transfer; the exit code is 0 only if its data verified.
    #[arg(long)]
    pub once: bool,

    /// Write each verified transfer out: to a file (replaced, atomically, by each
    /// transfer), into a directory (a file per transfer, named by the sender's --name or
    /// after the peer and a counter; a name taken gets .1, .2, ...: nothing there is
    /// replaced), or to standard output (`-`). A transfer reaches its final name only
    /// once every byte verified: it is written under a temporary name in the same
    /// directory, flushed, then renamed (a directory: hard-linked).
    #[arg(long, value_name = "PATH|-")]
    pub output: Option<String>,

    /// Raw mode, RDMA only: accept any connection, take one message into one
    /// receive of --max-bytes (at most the device's largest message), report its length
    /// and immediate data, verify it, and send a 16-byte reply (rdma-core's rdma_client
    /// waits for one).
    #[arg(long)]
    pub raw: bool,

    /// Largest transfer accepted; bigger offers are rejected with the reason.
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_transfer_size)]
    pub max_bytes: u64,

    /// Where received data goes: `host`, `device` (GPU memory, verified by a GPU kernel;
    /// over RDMA strictly GPUDirect RDMA, the NIC writes GPU memory; over TCP each chunk
    /// is copied from a host buffer into GPU memory) or `auto` (over RDMA GPUDirect where
    /// possible, else host; over TCP host).
    #[arg(long, value_enum, default_value_t = MemKind::Auto)]
    pub mem: MemKind,

    /// The GPU to receive into (0, 1, ...), or `none`.
    #[arg(long, value_name = "N|none", default_value = "0")]
    pub gpu: GpuSelection,

    /// The RDMA device whose facts (dma-buf probe, distance to the GPU) decide where
    /// received data goes (`host info` lists them); without it, the one nearest to the
    /// GPU. Each connection's own device then has the last word when it registers the
    /// memory.
    #[arg(long, value_name = "NAME")]
    pub nic: Option<String>,

    #[arg(long, value_name = "LEVEL", default_value = "PXB", value_parser = parse_gpudirect_level, help = GPUDIRECT_LEVEL_HELP)]
    pub gpudirect_level: PciDistance,

    /// Seconds any single wait may take; while data flows it restarts on progress, so a
    /// sender that vanishes is given up after this long.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_timeout)]
    pub timeout: Duration,

    /// Spin on the completion queue instead of sleeping.
    #[arg(long)]
    pub busy_poll: bool,

    /// What carries the data: `rdma`, `tcp` or `auto` (rdma when this machine has an RDMA
    /// device, else tcp; a note says which). TCP listens on the same port number (TCP
    /// ports and RDMA CM ports are separate).
    #[arg(long, value_enum, default_value_t = TransportKind::Auto)]
    pub transport: TransportKind,

    /// Senders served at once, over either transport (each on its own thread, with its
    /// own buffer and deadlines); one more is rejected at once with "receiver busy".
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_connections: u32,

    /// Receive buffers held at once, all connections together; an offer that would go
    /// over is rejected at once with "receiver busy".
    #[arg(long, value_name = "BYTES", default_value = "2GiB", value_parser = parse_size)]
    pub max_memory: u64,

    /// The slowest a transfer may average, in bytes per second (suffixes as for
    /// --max-bytes): one of N bytes must be done within --timeout + N / RATE, else the
    /// receiver ends it as "sender too slow", whatever the per-wait --timeout says. 0
    /// turns the rule off.
    #[arg(long, value_name = "BYTES/S", default_value = "1MiB", value_parser = parse_size)]
    pub min_rate: u64,

    /// Transfers served at once for one sender address (its share of --max-connections;
    /// default: all of it); more from that address are rejected at once with "receiver
    /// busy". Handshakes are capped per address anyway (80 sockets at once).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_per_peer: Option<u32>,

    /// Serve only senders whose address is in one of these networks (`10.0.0.0/8`,
    /// `192.0.2.7`, `fd00::/16`, comma-separated); others are refused before anything
    /// is read or allocated. Without it every address that reaches --bind is served.
    #[arg(long, value_name = "CIDR[,CIDR...]", value_parser = crate::server::AllowList::parse)]
    pub allow: Option<crate::server::AllowList>,

    /// A shared secret (a file of at least 16 bytes): serve only senders started with the
    /// same --key-file, which prove it with HMAC-SHA256 over their offer and a fresh
    /// nonce from this receiver (a recorded offer replayed later does not get in), on both
    /// transports.
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<std::path::PathBuf>,

    /// One JSON object per line on stdout for each event (listening, completed,
    /// rejected, failed); human lines go to stderr.
    #[arg(long)]
    pub json: bool,
}

impl RecvArgs {
    /// `--max-per-peer`, by default `--max-connections`.
    pub fn max_per_peer(&self) -> usize {
        self.max_per_peer.unwrap_or(self.max_connections) as usize
    }
}

/// A transfer size: at least one element and whole elements.
fn parse_transfer_size(text: &str) -> Result<u64, String> {
    let n = parse_size(text)?;
    if n < 4 {
        return Err(format!("{n} bytes is less than one element (4 bytes)"));
    }
    if !n.is_multiple_of(4) {
        return Err(format!(
            "{n} bytes is not a whole number of i32 elements (a multiple of 4)"
        ));
    }
    if usize::try_from(n).is_err() {
        return Err(format!("{n} bytes do not fit this machine's address space"));
    }
    Ok(n)
}

/// `--sweep MIN..MAX`: two transfer sizes, MIN a power of two and MIN <= MAX.
fn parse_sweep(text: &str) -> Result<(u64, u64), String> {
    let (min, max) = text
        .split_once("..")
        .ok_or_else(|| format!("`{text}` is not MIN..MAX (e.g. 4KiB..1GiB)"))?;
    let (min, max) = (parse_transfer_size(min)?, parse_transfer_size(max)?);
    if !min.is_power_of_two() {
        return Err(format!("{min} bytes (MIN) is not a power of two"));
    }
    if max < min {
        return Err(format!("MAX {max} bytes is less than MIN {min} bytes"));
    }
    Ok((min, max))
}

fn parse_gpudirect_level(text: &str) -> Result<PciDistance, String> {
    text.parse()
}

fn parse_chunk_size(text: &str) -> Result<u64, String> {
    let n = parse_size(text)?;
    if n == 0 {
        return Err("a chunk of 0 bytes".into());
    }
    if n > MAX_CHUNK {
        return Err(format!(
            "{n} bytes is more than the 2 GiB one work request can carry"
        ));
    }
    Ok(n)
}

/// `--streams`: a count, or `auto` (decided from the machine, `net::tcp::streams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    Auto,
    Count(u16),
}

fn parse_streams(text: &str) -> Result<Streams, String> {
    let max = crate::net::tcp::frames::MAX_STREAMS;
    if text.trim().eq_ignore_ascii_case("auto") {
        return Ok(Streams::Auto);
    }
    match text.trim().parse::<u16>() {
        Ok(n) if (1..=max).contains(&n) => Ok(Streams::Count(n)),
        _ => Err(format!(
            "`{text}` is not `auto` or a number of streams in 1..={max}"
        )),
    }
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{text} s is outside (0, 86400]"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("host").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_default_command_sends_16_kib_by_send() {
        let cli = parse(&["192.0.2.1", "7471"]).unwrap();
        assert!(cli.command.is_none());
        let s = cli.send;
        assert_eq!(s.ip.as_deref(), Some("192.0.2.1"));
        assert_eq!(s.port, Some(7471));
        assert_eq!(s.size, 16384);
        assert_eq!(s.op, Op::Send);
        assert_eq!(s.mem, MemKind::Auto);
        assert_eq!(s.gpu, GpuSelection::Index(0));
        assert_eq!((s.depth, s.chunk, s.iters), (16, 1 << 20, 1));
        assert_eq!(s.timeout, Duration::from_secs(10));
        assert!(!s.raw && !s.json && !s.busy_poll && !s.reuse_connection);
        assert_eq!(
            (s.transport, s.streams_asked),
            (TransportKind::Auto, Streams::Auto)
        );
        assert_eq!(s.nic, None);
        assert_eq!(s.rails, None);
        assert_eq!(s.gpudirect_level, PciDistance::Pxb);
    }

    #[test]
    fn nic_takes_a_list_and_rails_a_count_not_both() {
        let s = parse(&["192.0.2.1", "7471", "--nic", "mlx5_1,mlx5_0:2"])
            .unwrap()
            .send;
        let nic = s.nic.unwrap();
        assert_eq!(nic.first_device(), "mlx5_1");
        assert_eq!(nic.to_string(), "mlx5_1,mlx5_0:2");
        let s = parse(&["192.0.2.1", "7471", "--rails", "2"]).unwrap().send;
        assert_eq!(s.rails, Some(2));
        assert!(parse(&["192.0.2.1", "7471", "--rails", "0"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--nic", "mlx5_0,"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--nic", "mlx5_0", "--rails", "1"]).is_err());
    }

    #[test]
    fn reuse_connection_is_a_framed_option() {
        let s = parse(&["192.0.2.1", "7471", "--iters", "100", "--reuse-connection"])
            .unwrap()
            .send;
        assert!(s.reuse_connection);
        assert_eq!(s.iters, 100);
        assert!(parse(&["192.0.2.1", "7471", "--reuse-connection", "--raw"]).is_err());
    }

    #[test]
    fn every_send_option() {
        let cli = parse(&[
            "fe80::1",
            "9000",
            "--size",
            "1GiB",
            "--op",
            "write",
            "--mem",
            "staged",
            "--gpu",
            "none",
            "--depth",
            "64",
            "--chunk",
            "4M",
            "--iters",
            "3",
            "--timeout",
            "2.5",
            "--busy-poll",
            "--raw",
            "--json",
            "--nic",
            "mlx5_1",
            "--gpudirect-level",
            "sys",
        ])
        .unwrap();
        let s = cli.send;
        assert_eq!(
            s.nic.as_ref().map(|n| n.to_string()).as_deref(),
            Some("mlx5_1")
        );
        assert_eq!(s.gpudirect_level, PciDistance::Sys);
        assert_eq!(s.size, 1 << 30);
        assert_eq!(s.op, Op::Write);
        assert_eq!(s.mem, MemKind::Staged);
        assert_eq!(s.gpu, GpuSelection::None);
        assert_eq!((s.depth, s.chunk, s.iters), (64, 4 << 20, 3));
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert!(s.raw && s.json && s.busy_poll);
    }

    #[test]
    fn bad_sizes_are_refused() {
        for bad in ["6", "0", "2", "1.5MiB", "64MB", "lots", "-4"] {
            let arg = format!("--size={bad}");
            let e = parse(&["192.0.2.1", "7471", &arg]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        }
        assert!(parse(&["192.0.2.1", "7471", "--chunk", "0"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--chunk", "3GiB"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--depth", "0"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--depth", "5000"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--iters", "0"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--timeout", "0"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--timeout", "soon"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--gpu", "first"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--op", "read"]).is_err());
    }

    #[test]
    fn address_and_port_are_required_to_send() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["192.0.2.1"]).is_err());
        assert!(parse(&["192.0.2.1", "port"]).is_err());
        assert!(parse(&["192.0.2.1", "70000"]).is_err());
    }

    #[test]
    fn recv_defaults_and_options() {
        let cli = parse(&["recv"]).unwrap();
        let Some(Command::Recv(r)) = cli.command else {
            panic!("expected recv")
        };
        assert_eq!(r.bind.to_string(), "0.0.0.0");
        assert_eq!(r.port, 7471);
        assert_eq!(r.max_bytes, 1 << 30);
        assert!(!r.once && !r.raw && !r.json);
        assert_eq!(
            (r.nic.as_deref(), r.gpudirect_level),
            (None, PciDistance::Pxb)
        );
        let cli = parse(&[
            "recv",
            "--bind",
            "192.0.2.1",
            "--port",
            "9000",
            "--once",
            "--raw",
            "--max-bytes",
            "64KiB",
            "--mem",
            "host",
            "--gpu",
            "none",
            "--timeout",
            "30",
            "--json",
            "--nic",
            "rxe0",
            "--gpudirect-level",
            "Phb",
        ])
        .unwrap();
        let Some(Command::Recv(r)) = cli.command else {
            panic!("expected recv")
        };
        assert_eq!(r.nic.as_deref(), Some("rxe0"));
        assert_eq!(r.gpudirect_level, PciDistance::Phb);
        assert_eq!((r.port, r.max_bytes), (9000, 65536));
        assert!(r.once && r.raw && r.json);
        assert_eq!(r.mem, MemKind::Host);
        assert!(parse(&["recv", "--max-bytes", "5"]).is_err());
        assert!(parse(&["recv", "--bind", "not-an-ip"]).is_err());
    }

    #[test]
    fn who_may_send_options() {
        let Some(Command::Recv(r)) = parse(&["recv"]).unwrap().command else {
            panic!("expected recv")
        };
        assert_eq!((r.allow.clone(), r.key_file.clone()), (None, None));
        assert_eq!(r.max_per_peer(), 16, "by default all of --max-connections");
        let Some(Command::Recv(r)) = parse(&[
            "recv",
            "--allow",
            "10.0.0.0/8,192.0.2.7",
            "--max-per-peer",
            "2",
            "--key-file",
            "/etc/k",
        ])
        .unwrap()
        .command
        else {
            panic!("expected recv")
        };
        let allow = r.allow.clone().unwrap();
        assert!(allow.permits("10.1.2.3".parse().unwrap()));
        assert!(!allow.permits("192.0.2.8".parse().unwrap()));
        assert_eq!(r.max_per_peer(), 2);
        assert_eq!(r.key_file.as_deref(), Some(std::path::Path::new("/etc/k")));
        assert!(parse(&["recv", "--allow", "10.0.0.0/40"]).is_err());
        assert!(parse(&["recv", "--max-per-peer", "0"]).is_err());
        let s = parse(&["127.0.0.1", "7471", "--key-file", "k"])
            .unwrap()
            .send;
        assert_eq!(s.key_file.as_deref(), Some(std::path::Path::new("k")));
    }

    #[test]
    fn transport_options() {
        let s = parse(&["127.0.0.1", "7471", "--transport", "tcp", "--streams", "4"])
            .unwrap()
            .send;
        assert_eq!(
            (s.transport, s.streams_asked),
            (TransportKind::Tcp, Streams::Count(4))
        );
        assert!(parse(&["127.0.0.1", "7471", "--streams", "0"]).is_err());
        assert!(parse(&["127.0.0.1", "7471", "--streams", "65"]).is_err());
        assert!(parse(&["127.0.0.1", "7471", "--transport", "udp"]).is_err());
        let Some(Command::Recv(r)) = parse(&["recv"]).unwrap().command else {
            panic!("expected recv")
        };
        assert_eq!((r.transport, r.max_connections), (TransportKind::Auto, 16));
        let Some(Command::Recv(r)) =
            parse(&["recv", "--transport", "rdma", "--max-connections", "2"])
                .unwrap()
                .command
        else {
            panic!("expected recv")
        };
        assert_eq!((r.transport, r.max_connections), (TransportKind::Rdma, 2));
    }

    #[test]
    fn info_takes_json_only() {
        assert!(matches!(
            parse(&["info"]).unwrap().command,
            Some(Command::Info(InfoArgs { json: false }))
        ));
        assert!(matches!(
            parse(&["info", "--json"]).unwrap().command,
            Some(Command::Info(InfoArgs { json: true }))
        ));
        assert!(parse(&["info", "extra"]).is_err());
    }

    #[test]
    fn doctor_defaults_and_options() {
        let Some(Command::Doctor(d)) = parse(&["doctor"]).unwrap().command else {
            panic!("expected doctor")
        };
        assert_eq!(
            (d.gpu, d.nic, d.gpudirect_level),
            (GpuSelection::Index(0), None, PciDistance::Pxb)
        );
        assert_eq!((d.peer, d.size, d.json), (None, 1 << 30, false));
        let Some(Command::Doctor(d)) = parse(&["doctor", "--gpu", "none", "--json"])
            .unwrap()
            .command
        else {
            panic!("expected doctor")
        };
        assert_eq!((d.gpu, d.json), (GpuSelection::None, true));
        assert!(parse(&["doctor", "--peer", "somewhere"]).is_err());
        let Some(Command::Doctor(d)) = parse(&[
            "doctor",
            "--peer",
            "192.0.2.1",
            "--size",
            "64MiB",
            "--gpu",
            "3",
            "--nic",
            "mlx5_2",
            "--gpudirect-level",
            "NODE",
        ])
        .unwrap()
        .command
        else {
            panic!("expected doctor")
        };
        assert_eq!(
            (d.gpu, d.nic.as_deref(), d.gpudirect_level),
            (GpuSelection::Index(3), Some("mlx5_2"), PciDistance::Node)
        );
        assert_eq!(
            (d.peer.map(|p| p.to_string()), d.size),
            (Some("192.0.2.1".to_string()), 64 << 20)
        );
    }

    #[test]
    fn gpudirect_levels_are_the_five_classes() {
        for bad in ["LOC", "NV1", "", "2"] {
            let arg = format!("--gpudirect-level={bad}");
            let e = parse(&["192.0.2.1", "7471", &arg]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            assert!(parse(&["doctor", &arg]).is_err(), "{bad}");
        }
        let help = Cli::command()
            .find_subcommand_mut("recv")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("--gpudirect-level <LEVEL>"), "{help}");
        assert!(help.contains("NCCL_NET_GDR_LEVEL"), "{help}");
        assert!(help.contains("--nic <NAME>"), "{help}");
    }

    #[test]
    fn the_version_names_the_commit_and_the_features() {
        let v = Cli::command().render_version();
        assert!(v.starts_with("host 0.1.0 (commit "), "{v}");
        #[cfg(feature = "cuda")]
        assert!(v.trim_end().ends_with(", features: cuda)"), "{v}");
        #[cfg(not(feature = "cuda"))]
        assert!(v.contains(", features: none (built without `cuda`"), "{v}");
    }

    #[test]
    fn completions_and_man_take_their_arguments() {
        let Some(Command::Completions { shell }) = parse(&["completions", "zsh"]).unwrap().command
        else {
            panic!("expected completions")
        };
        assert_eq!(shell, clap_complete::Shell::Zsh);
        assert!(parse(&["completions", "tcsh"]).is_err());
        assert!(parse(&["completions"]).is_err());
        assert!(matches!(
            parse(&["man"]).unwrap().command,
            Some(Command::Man { dir: None })
        ));
    }

    #[test]
    fn benchmark_options() {
        let s = parse(&["192.0.2.1", "7471"]).unwrap().send;
        assert_eq!((s.warmup, s.sweep, s.report_gbits), (0, None, false));
        let s = parse(&[
            "192.0.2.1",
            "7471",
            "--sweep",
            "4KiB..1GiB",
            "--warmup",
            "10",
            "--report-gbits",
        ])
        .unwrap()
        .send;
        assert_eq!(s.sweep, Some((4096, 1 << 30)));
        assert_eq!((s.warmup, s.report_gbits), (10, true));
        assert_eq!(parse_sweep("4..4"), Ok((4, 4)));
        for bad in [
            "4KiB",
            "12KiB..1MiB",
            "1MiB..4KiB",
            "0..4KiB",
            "4KiB..lots",
            "..",
        ] {
            assert!(parse_sweep(bad).is_err(), "{bad}");
        }
        assert!(parse(&["192.0.2.1", "7471", "--sweep", "4..8", "--raw"]).is_err());
        assert!(parse(&["192.0.2.1", "7471", "--sweep", "4..8", "--size", "8"]).is_err());
    }

    #[test]
    fn timeouts_take_fractions() {
        assert_eq!(parse_timeout("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_timeout("3s"), Ok(Duration::from_secs(3)));
        assert!(parse_timeout("-1").is_err());
        assert!(parse_timeout("NaN").is_err());
    }
}
