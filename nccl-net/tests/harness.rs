//! The plugin as NCCL's proxy thread drives it: the real `.so`, `dlopen`ed with
//! `libloading`, `ncclNetPlugin_v11` looked up and called through its table. Connect
//! and accept in non-blocking loops, 32 requests in flight, receive sizes smaller than
//! posted, grouped receives with tags, close in every state, injected faults repaired
//! to the exact bytes, bad handles, a peer that closes or is killed mid-message; and
//! one round trip through each of the v10, v9 and v8 tables. Every loop has a deadline.
//!
//! The library: `$NCCL_GRDMA_PLUGIN` (tests/nccl/build-plugin.sh prints it,
//! tests/run-all.sh sets it), else built here with `--profile plugin` into
//! `target/nccl-plugin`. Scenarios that need their own environment (checks off, fault
//! injection, a panic) run in a child process: this test binary again, `--ignored child`.
#![feature(c_variadic)]

#[allow(dead_code)]
#[path = "../src/abi.rs"]
mod abi;

use abi::*;
use libloading::Library;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(30);

fn plugin_path() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        if let Some(p) = std::env::var_os("NCCL_GRDMA_PLUGIN").map(PathBuf::from) {
            assert!(
                p.is_file(),
                "NCCL_GRDMA_PLUGIN={} is not a file",
                p.display()
            );
            return p;
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            .args([
                "build",
                "-p",
                "nccl-net",
                "--profile",
                "plugin",
                "--target-dir",
                "target/nccl-plugin",
            ])
            .status()
            .expect("running cargo to build the plugin");
        assert!(status.success(), "building the plugin failed");
        root.join("target/nccl-plugin/plugin/libnccl_net_grdma.so")
    })
    .clone()
}

/// The library, loaded once per process, with the environment every test shares set
/// first (before any plugin code can read the environment).
fn lib() -> &'static Library {
    static L: OnceLock<Library> = OnceLock::new();
    L.get_or_init(|| {
        // Striped over 4 sockets whatever this machine's cores (unset, the plugin takes
        // one per two cores: a single socket on a 2-core CI machine).
        if std::env::var_os("NCCL_GRDMA_STREAMS").is_none() {
            // SAFETY: runs once, before any thread calls into the plugin (which is the
            // only other reader of the environment in this process).
            unsafe { std::env::set_var("NCCL_GRDMA_STREAMS", "4") };
        }
        // (A child over verbs brings its own: the RDMA device's interface.)
        if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
            // SAFETY: as above.
            unsafe { std::env::set_var("NCCL_SOCKET_IFNAME", "lo") };
        }
        // SAFETY: the plugin's initializers are Rust statics; loading runs no code.
        unsafe { Library::new(plugin_path()) }.expect("dlopen the plugin")
    })
}

fn table<T>(sym: &[u8]) -> &'static T {
    // SAFETY: the symbol is a static table of type T (the ABI under test).
    let s = unsafe { lib().get::<*const T>(sym) }.expect("symbol");
    // SAFETY: a static in a library that stays loaded for the process.
    unsafe { &**s }
}

fn v11() -> &'static NcclNetV11 {
    table(b"ncclNetPlugin_v11\0")
}

/// Registrations the helpers made over verbs: (comm, buffer, length, handle).
static REGS: Mutex<Vec<(usize, usize, usize, usize)>> = Mutex::new(Vec::new());

/// Whether this process drives the plugin over verbs (a child the verbs tests start).
fn over_verbs() -> bool {
    std::env::var("NCCL_GRDMA_TRANSPORT").is_ok_and(|v| v == "verbs")
}

/// Every line the plugin logged (in this process), for the assertions.
static LOG: Mutex<Vec<(c_int, String)>> = Mutex::new(Vec::new());

/// NCCL's logger as the plugin sees it: a printf-like variadic.
unsafe extern "C" fn logger(
    level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
    mut args: ...
) {
    // SAFETY: the plugin always passes "%s" and one C string.
    let text = unsafe {
        let f = CStr::from_ptr(fmt);
        if f == c"%s" {
            let s: *const c_char = args.next_arg();
            CStr::from_ptr(s).to_string_lossy().into_owned()
        } else {
            format!("(format {f:?})")
        }
    };
    eprintln!("[plugin {level}] {text}");
    LOG.lock().unwrap().push((level, text));
}

fn logged(pred: impl Fn(c_int, &str) -> bool) -> bool {
    LOG.lock().unwrap().iter().any(|(l, s)| pred(*l, s))
}

/// How many lines logged so far contain `needle`.
fn logged_count(needle: &str) -> usize {
    LOG.lock()
        .unwrap()
        .iter()
        .filter(|(_, s)| s.contains(needle))
        .count()
}

fn ok(r: NcclResult, what: &str) {
    assert_eq!(r, NcclResult::SUCCESS, "{what}");
}

struct Net {
    t: &'static NcclNetV11,
    ctx: *mut c_void,
}

impl Net {
    fn init() -> Self {
        let t = v11();
        let mut ctx = null_mut();
        let mut cfg = NcclNetCommConfig { trafficClass: -1 };
        // SAFETY: calling the table as NCCL does, with valid out-pointers.
        ok(
            unsafe { (t.init)(&mut ctx, 42, &mut cfg, Some(logger), None) },
            "init",
        );
        Net { t, ctx }
    }

    /// The plugin's table for a thread beside the one that made the comms: no context
    /// of its own, and never finalized (a `ManuallyDrop`: the comms are the caller's).
    fn for_another_thread() -> std::mem::ManuallyDrop<Net> {
        std::mem::ManuallyDrop::new(Net {
            t: v11(),
            ctx: null_mut(),
        })
    }

    fn listen(&self) -> ([u8; 128], *mut c_void) {
        let mut h = [0xAAu8; 128];
        let mut l = null_mut();
        // SAFETY: a 128-byte handle and an out-pointer.
        ok(
            unsafe { (self.t.listen)(self.ctx, 0, h.as_mut_ptr() as *mut c_void, &mut l) },
            "listen",
        );
        assert!(!l.is_null());
        (h, l)
    }

    /// One connect call.
    fn connect(&self, h: &mut [u8; 128]) -> (NcclResult, *mut c_void) {
        let mut s = null_mut();
        let mut dev = null_mut();
        // SAFETY: NCCL's handle buffer, given back on each call; out-pointers.
        let r = unsafe {
            (self.t.connect)(self.ctx, 0, h.as_mut_ptr() as *mut c_void, &mut s, &mut dev)
        };
        (r, s)
    }

    fn accept(&self, l: *mut c_void) -> (NcclResult, *mut c_void) {
        let mut r = null_mut();
        let mut dev = null_mut();
        // SAFETY: a listen comm and out-pointers.
        let res = unsafe { (self.t.accept)(l, &mut r, &mut dev) };
        (res, r)
    }

    /// Connect and accept, interleaved until both comms exist (NCCL's proxy loop).
    fn pair(&self) -> (*mut c_void, *mut c_void, *mut c_void) {
        let (mut h, l) = self.listen();
        let (mut s, mut r): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let t0 = Instant::now();
        while s.is_null() || r.is_null() {
            assert!(t0.elapsed() < DEADLINE, "connect/accept did not finish");
            if s.is_null() {
                let (res, c) = self.connect(&mut h);
                ok(res, "connect");
                s = c;
            }
            if r.is_null() {
                let (res, c) = self.accept(l);
                ok(res, "accept");
                r = c;
            }
        }
        (s, r, l)
    }

    fn irecv(&self, r: *mut c_void, bufs: &mut [Vec<u8>], tags: &[i32]) -> *mut c_void {
        let mut data: Vec<*mut c_void> = bufs
            .iter_mut()
            .map(|b| b.as_mut_ptr() as *mut c_void)
            .collect();
        let mut sizes: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        let mut tags = tags.to_vec();
        let mut mhs: Vec<*mut c_void> = bufs
            .iter_mut()
            .map(|b| self.mr(r, b.as_mut_ptr(), b.len()))
            .collect();
        let mut req = null_mut();
        // SAFETY: n-element arrays; the buffers outlive the request (the callers keep
        // them until test says done or the comm is closed).
        ok(
            unsafe {
                (self.t.irecv)(
                    r,
                    bufs.len() as c_int,
                    data.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    tags.as_mut_ptr(),
                    if over_verbs() {
                        mhs.as_mut_ptr()
                    } else {
                        null_mut()
                    },
                    null_mut(),
                    &mut req,
                )
            },
            "irecv",
        );
        req
    }

    /// One isend call (null request: not yet).
    fn isend_once(&self, s: *mut c_void, buf: &[u8], tag: i32) -> (NcclResult, *mut c_void) {
        let mut req = null_mut();
        let mh = self.mr(s, buf.as_ptr() as *mut u8, buf.len());
        // SAFETY: the buffer outlives the request (kept by the caller).
        let r = unsafe {
            (self.t.isend)(
                s,
                buf.as_ptr() as *mut c_void,
                buf.len(),
                tag,
                mh,
                null_mut(),
                &mut req,
            )
        };
        (r, req)
    }

    /// isend until it takes the message, testing `pump` (other requests) meanwhile.
    fn isend(&self, s: *mut c_void, buf: &[u8], tag: i32, pump: &[*mut c_void]) -> *mut c_void {
        let t0 = Instant::now();
        loop {
            let (r, req) = self.isend_once(s, buf, tag);
            ok(r, "isend");
            if !req.is_null() {
                return req;
            }
            for &p in pump {
                let _ = self.test(p);
            }
            assert!(t0.elapsed() < DEADLINE, "isend never took the message");
        }
    }

    /// One test call: (result, done, sizes).
    fn test(&self, req: *mut c_void) -> (NcclResult, bool, [c_int; 8]) {
        let mut done = 0;
        let mut sizes = [-1; 8];
        // SAFETY: a request in flight and out-pointers (8 sizes: maxRecvs).
        let r = unsafe { (self.t.test)(req, &mut done, sizes.as_mut_ptr()) };
        (r, done == 1, sizes)
    }

    /// Tests every request round-robin until all are done; their sizes, in order.
    fn wait_all(&self, reqs: &[*mut c_void]) -> Vec<[c_int; 8]> {
        let mut out: Vec<Option<[c_int; 8]>> = vec![None; reqs.len()];
        let t0 = Instant::now();
        while out.iter().any(Option::is_none) {
            assert!(t0.elapsed() < DEADLINE, "requests not done in time");
            for (i, &r) in reqs.iter().enumerate() {
                if out[i].is_none() {
                    let (res, done, sizes) = self.test(r);
                    ok(res, "test");
                    if done {
                        out[i] = Some(sizes);
                    }
                }
            }
        }
        out.into_iter().map(Option::unwrap).collect()
    }

    /// Tests `req` until it fails; the error, or a panic if it completes or hangs.
    fn wait_error(&self, req: *mut c_void, also: &[*mut c_void]) -> NcclResult {
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < DEADLINE, "no error in time (a hang)");
            let (r, done, _) = self.test(req);
            if r != NcclResult::SUCCESS {
                return r;
            }
            assert!(!done, "the request completed instead of failing");
            for &a in also {
                let _ = self.test(a);
            }
        }
    }

    /// The error a send comm `s` reports once its send `req` failed: through that
    /// request's `test`, or, where the request was done before the failure was known (a
    /// small message over TCP is done once written: the plugin keeps a copy for
    /// resends), through the comm's next call (here a send of `msg` again, as NCCL's
    /// next step would be); a panic if neither comes in time.
    fn comm_error(
        &self,
        s: *mut c_void,
        req: *mut c_void,
        msg: &[u8],
        tag: i32,
        also: &[*mut c_void],
    ) -> NcclResult {
        let t0 = Instant::now();
        let mut req = req;
        loop {
            assert!(t0.elapsed() < DEADLINE, "no error in time (a hang)");
            let rc = if req.is_null() {
                let (rc, r) = self.isend_once(s, msg, tag);
                req = r;
                rc
            } else {
                let (rc, done, _) = self.test(req);
                if done {
                    req = null_mut();
                }
                rc
            };
            if rc != NcclResult::SUCCESS {
                return rc;
            }
            for &a in also {
                let _ = self.test(a);
            }
        }
    }

    /// Over verbs (a child with `NCCL_GRDMA_TRANSPORT=verbs`), NCCL registers every
    /// buffer on the comm before it sends or receives with it: the registration of
    /// `len` bytes at `ptr` on `comm`, made once per buffer and kept until the comm
    /// closes. Over TCP none (the plugin takes a null handle there).
    fn mr(&self, comm: *mut c_void, ptr: *mut u8, len: usize) -> *mut c_void {
        if !over_verbs() {
            return null_mut();
        }
        let mut regs = REGS.lock().unwrap();
        if let Some(&(_, _, _, mh)) = regs
            .iter()
            .find(|&&(c, p, n, _)| c == comm as usize && p == ptr as usize && n == len)
        {
            return mh as *mut c_void;
        }
        let mut mh = null_mut();
        // SAFETY: a comm and a buffer the caller keeps until the comm closes.
        ok(
            unsafe { (self.t.regMr)(comm, ptr as *mut c_void, len, NCCL_PTR_HOST, &mut mh) },
            "regMr",
        );
        regs.push((comm as usize, ptr as usize, len, mh as usize));
        mh
    }

    /// Deregister the registration [`mr`](Self::mr) made of the buffer at `ptr` on
    /// `comm`, if any (before the buffer is freed).
    fn forget(&self, comm: *mut c_void, ptr: *const u8) {
        self.dereg_where(comm, Some(ptr));
    }

    /// Deregister what [`mr`](Self::mr) registered on `comm` (before it closes).
    fn dereg_all(&self, comm: *mut c_void) {
        self.dereg_where(comm, None);
    }

    /// Deregister `comm`'s registrations of the buffer at `ptr` (None: of every buffer).
    fn dereg_where(&self, comm: *mut c_void, ptr: Option<*const u8>) {
        let mut regs = REGS.lock().unwrap();
        regs.retain(|&(c, p, _, mh)| {
            if c != comm as usize || ptr.is_some_and(|ptr| p != ptr as usize) {
                return true;
            }
            // SAFETY: a registration made on this comm, deregistered once.
            ok(
                unsafe { (self.t.deregMr)(comm, mh as *mut c_void) },
                "deregMr",
            );
            false
        });
    }

    fn close_send(&self, s: *mut c_void) {
        self.dereg_all(s);
        // SAFETY: a send comm of this plugin, closed once.
        ok(unsafe { (self.t.closeSend)(s) }, "closeSend");
    }
    fn close_recv(&self, r: *mut c_void) {
        self.dereg_all(r);
        // SAFETY: as above.
        ok(unsafe { (self.t.closeRecv)(r) }, "closeRecv");
    }
    fn close_listen(&self, l: *mut c_void) {
        // SAFETY: as above.
        ok(unsafe { (self.t.closeListen)(l) }, "closeListen");
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // SAFETY: the context init gave.
        let r = unsafe { (self.t.finalize)(self.ctx) };
        if !std::thread::panicking() {
            ok(r, "finalize");
        }
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// One message each way of `size` bytes into a buffer of `posted`, checked exactly.
fn round_trip(net: &Net, s: *mut c_void, r: *mut c_void, size: usize, posted: usize, seed: u64) {
    let msg = pattern(size, seed);
    let mut bufs = vec![vec![0u8; posted]];
    let rr = net.irecv(r, &mut bufs, &[7]);
    assert!(!rr.is_null());
    let sr = net.isend(s, &msg, 7, &[rr]);
    let sizes = net.wait_all(&[sr, rr]);
    // These buffers are freed on return; the next ones may get their addresses but not
    // their pages, which a registration pinned: deregistered now (as NCCL must before
    // it frees a buffer).
    net.forget(s, msg.as_ptr());
    net.forget(r, bufs[0].as_ptr());
    assert_eq!(sizes[0][0] as usize, size, "send size");
    assert_eq!(sizes[1][0] as usize, size, "received size");
    assert!(
        bufs[0][..size] == msg[..],
        "the bytes of a {size}-byte message"
    );
    assert!(
        bufs[0][size..].iter().all(|&b| b == 0),
        "nothing past the message"
    );
}

#[test]
fn properties_are_truthful() {
    let net = Net::init();
    let t = net.t;
    // SAFETY: the table's name is a static C string.
    assert_eq!(unsafe { CStr::from_ptr(t.name) }, c"grdma");
    let mut n = 0;
    // SAFETY: an out-pointer.
    ok(unsafe { (t.devices)(&mut n) }, "devices");
    assert_eq!(n, 1, "NCCL_SOCKET_IFNAME=lo: one device");
    // SAFETY: zeroed plain data, then filled by the plugin.
    let mut p: NcclNetPropertiesV11 = unsafe { std::mem::zeroed() };
    ok(unsafe { (t.getProperties)(0, &mut p) }, "getProperties");
    assert_eq!(unsafe { CStr::from_ptr(p.name) }, c"lo");
    assert!(p.pciPath.is_null(), "lo has no PCI device");
    assert_eq!(
        p.ptrSupport, NCCL_PTR_HOST,
        "host memory only: no CUDA, no dma-buf"
    );
    assert_eq!(
        p.speed, 400_000,
        "lo has no sysfs speed: loopback's default (props::LOOPBACK_SPEED_MBPS)"
    );
    assert!(
        logged(|_, s| s.contains("[0]lo:127.0.0.1 (400000 Mbit/s from loopback's default)")),
        "the init line says the speed and where it came from"
    );
    assert_eq!(
        (p.latency, p.port, p.regIsGlobal, p.forceFlush),
        (0.0, 0, 0, 0)
    );
    assert_eq!((p.maxRecvs, p.maxComms), (8, 65536));
    assert_eq!(
        (p.netDeviceType, p.netDeviceVersion),
        (NCCL_NET_DEVICE_HOST, 0)
    );
    assert_eq!((p.vProps.ndevs, p.vProps.devs[0]), (1, 0));
    assert_eq!((p.maxP2pBytes, p.maxMultiRequestSize), (1 << 30, 1));
    assert_eq!(
        unsafe { (t.getProperties)(5, &mut p) },
        NcclResult::INVALID_ARGUMENT,
        "a device that does not exist"
    );
    assert!(logged(
        |l, s| l == NCCL_LOG_WARN && s.contains("device 5 does not exist")
    ));
    assert!(t.regMrDmaBuf.is_none() && t.getDeviceMr.is_none() && t.irecvConsumed.is_none());
    assert!(t.makeVDevice.is_none() && t.setNetAttr.is_none());

    let (s, r, l) = net.pair();
    let mut buf = vec![0u8; 4096];
    let mut mh = null_mut();
    // SAFETY: a comm, a buffer, an out-pointer.
    let rc = unsafe {
        (t.regMr)(
            s,
            buf.as_mut_ptr() as *mut c_void,
            4096,
            NCCL_PTR_CUDA,
            &mut mh,
        )
    };
    assert_eq!(rc, NcclResult::INTERNAL_ERROR, "CUDA memory is refused");
    assert!(logged(|_, s| s.contains("host memory only")));
    ok(
        unsafe {
            (t.regMr)(
                s,
                buf.as_mut_ptr() as *mut c_void,
                4096,
                NCCL_PTR_HOST,
                &mut mh,
            )
        },
        "regMr host",
    );
    assert!(!mh.is_null());
    // A buffer beyond its registration is refused.
    let mut req = null_mut();
    let rc = unsafe {
        (t.isend)(
            s,
            buf.as_mut_ptr().wrapping_add(4000) as *mut c_void,
            200,
            0,
            mh,
            null_mut(),
            &mut req,
        )
    };
    assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
    ok(unsafe { (t.deregMr)(s, mh) }, "deregMr");
    // iflush: host memory needs none; no request.
    let mut freq = std::ptr::dangling_mut::<c_void>();
    let iflush = t.iflush.expect("iflush");
    ok(
        unsafe { iflush(r, 1, null_mut(), null_mut(), null_mut(), &mut freq) },
        "iflush",
    );
    assert!(freq.is_null());
    // A request pointer that is not one of ours.
    let mut junk = [0u64; 4];
    let (rc, _, _) = net.test(junk.as_mut_ptr() as *mut c_void);
    assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

#[test]
fn sizes_round_trip_exactly() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    for (i, size) in [0usize, 1, 4095, 65537, 1 << 20, (5 << 20) + 3, 64 << 20]
        .into_iter()
        .enumerate()
    {
        round_trip(&net, s, r, size, size, i as u64);
    }
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
    // The sender's counters line at close (over verbs from the RDMA device's address).
    let (to, closed) = if over_verbs() {
        ("send comm to ", "over verbs closed: 7 messages")
    } else {
        ("send comm to 127.0.0.1", "7 messages")
    };
    assert!(logged(|l, s| l == NCCL_LOG_INFO
        && s.contains(to)
        && s.contains(closed)));
}

#[test]
fn thirty_two_in_flight_then_busy_and_out_of_order_tests() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    let msgs: Vec<Vec<u8>> = (0..32)
        .map(|i| pattern(10_000 + i * 3001, i as u64))
        .collect();
    let mut bufs: Vec<Vec<Vec<u8>>> = (0..32).map(|_| vec![vec![0u8; 200_000]]).collect();
    let rreqs: Vec<_> = bufs.iter_mut().map(|b| net.irecv(r, b, &[1])).collect();
    assert!(rreqs.iter().all(|r| !r.is_null()), "32 receives in flight");
    let mut extra = vec![vec![0u8; 16]];
    assert!(
        net.irecv(r, &mut extra, &[1]).is_null(),
        "a 33rd receive: busy, a null request"
    );
    let sreqs: Vec<_> = msgs.iter().map(|m| net.isend(s, m, 1, &[])).collect();
    let (rc, req) = net.isend_once(s, &msgs[0], 1);
    ok(rc, "isend");
    assert!(
        req.is_null(),
        "a 33rd send: busy (and no receive posted for it)"
    );
    // Test them newest first, as NCCL may not.
    let all: Vec<_> = sreqs
        .iter()
        .rev()
        .chain(rreqs.iter().rev())
        .copied()
        .collect();
    let sizes = net.wait_all(&all);
    for i in 0..32 {
        assert_eq!(sizes[32 + 31 - i][0] as usize, msgs[i].len());
        assert!(bufs[i][0][..msgs[i].len()] == msgs[i][..], "message {i}");
    }
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

/// The I/O threads move the bytes and send the ack on their own: a receive completes
/// while only it is tested (the sender's comm is never called after `isend`), and a
/// checked send completes while only it is tested (its ack needs the receiver).
#[test]
fn io_threads_move_data_and_ack_without_polling() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    let size = 64 << 20;
    let msg = pattern(size, 11);
    // Only the receive is tested.
    let mut bufs = vec![vec![0u8; size]];
    let rr = net.irecv(r, &mut bufs, &[2]);
    let sr = net.isend(s, &msg, 2, &[]);
    net.wait_all(&[rr]);
    assert!(bufs[0] == msg, "the bytes, with the sender never polled");
    net.wait_all(&[sr]);
    // Only the send is tested: done means acked, so the receiver verified every piece.
    let mut bufs = vec![vec![0u8; size]];
    let rr = net.irecv(r, &mut bufs, &[3]);
    let sr = net.isend(s, &msg, 3, &[]);
    net.wait_all(&[sr]);
    net.wait_all(&[rr]);
    assert!(
        bufs[0] == msg,
        "the bytes, with the receiver polled only at the end"
    );
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

/// NCCL's receiver posts step k+1's `irecv` only after its GPU consumed step k, and
/// its sender's GPU may only go on once the sends complete: a send must complete with
/// no receive posted (eagerly, into the receiver's bounce buffer, checked and acked
/// there), or every step waits for the other rank's GPU (two ranks on one GPU: a
/// GPU time slice per step). Here every send completes before any receive is posted;
/// the receives, posted later (one buffer each and grouped), get the exact bytes.
#[test]
fn sends_complete_before_their_receives_are_posted() {
    // Messages up to 4 MiB eager (NCCL_GRDMA_EAGER_MAX at its largest), in a child so
    // the variable is that process's own.
    let out = child(
        "sends-then-receives",
        &[("NCCL_GRDMA_EAGER_MAX", "4194304")],
    );
    assert_child_ok(&out, "sends before their receives");
}

/// Above `NCCL_GRDMA_EAGER_MAX` (1 MiB by default) a send waits for its receive: a
/// null request until the clear-to-send, then the bytes straight into the posted
/// buffer (no bounce copy).
#[test]
fn a_send_above_the_eager_limit_waits_for_its_receive() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    let big = pattern(2 << 20, 77);
    let (rc, req) = net.isend_once(s, &big, 5);
    ok(rc, "isend");
    assert!(
        req.is_null(),
        "a 2 MiB send went eagerly past the 1 MiB default"
    );
    round_trip(&net, s, r, 2 << 20, 2 << 20, 78);
    let small = pattern(1 << 20, 79);
    let (rc, req) = net.isend_once(s, &small, 5);
    ok(rc, "isend");
    assert!(
        !req.is_null(),
        "a 1 MiB send waited though it is within the eager limit"
    );
    let mut bufs = vec![vec![0u8; 1 << 20]];
    let rreq = net.irecv(r, &mut bufs, &[5]);
    net.wait_all(&[req, rreq]);
    assert_eq!(bufs[0], small);
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

/// The body of `sends_complete_before_their_receives_are_posted` (also run with
/// faults injected and the trace on, in a child).
fn sends_then_receives(net: &Net, s: *mut c_void, r: *mut c_void) {
    let lens = [
        1024usize,
        128 << 10,
        128 << 10,
        0,
        2 << 20,
        128 << 10,
        777,
        4 << 20,
    ];
    // The send buffers (scribbled over once their sends are done) and what was sent.
    let mut bufs_sent = pattern_msgs(&lens);
    let msgs = pattern_msgs(&lens);
    let t0 = Instant::now();
    let mut sreqs = Vec::new();
    for m in &bufs_sent {
        let req = loop {
            let (rc, req) = net.isend_once(s, m, 5);
            ok(rc, "isend");
            if !req.is_null() {
                break req;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "a send of {} bytes waited for its receive to be posted (isend refused while no receive was posted)",
                m.len()
            );
            std::thread::yield_now();
        };
        sreqs.push(req);
    }
    net.wait_all(&sreqs);
    // NCCL reuses a send buffer once its send is done: whatever the plugin sends from
    // now on (a corrupt piece again) must come from its own copy.
    for m in &mut bufs_sent {
        m.fill(0xee);
    }
    // Now the receives: 4 alone, then 2 groups of 2 (NCCL's grouped receives, one tag).
    let mut bufs: Vec<Vec<Vec<u8>>> = vec![
        vec![vec![0u8; 4 << 20]],
        vec![vec![0u8; 4 << 20]],
        vec![vec![0u8; 4 << 20]],
        vec![vec![0u8; 16]],
        vec![vec![0u8; 4 << 20], vec![0u8; 4 << 20]],
        vec![vec![0u8; 4 << 20], vec![0u8; 4 << 20]],
    ];
    let rreqs: Vec<_> = bufs
        .iter_mut()
        .map(|b| {
            let tags = vec![5; b.len()];
            net.irecv(r, b, &tags)
        })
        .collect();
    let sizes = net.wait_all(&rreqs);
    let mut k = 0;
    for (i, b) in bufs.iter().enumerate() {
        for (j, buf) in b.iter().enumerate() {
            assert_eq!(
                sizes[i][j] as usize, lens[k],
                "received size of message {k}"
            );
            assert!(buf[..lens[k]] == msgs[k][..], "the bytes of message {k}");
            assert!(
                buf[lens[k]..].iter().all(|&x| x == 0),
                "nothing past message {k}"
            );
            k += 1;
        }
    }
    // And the usual order (receive first) still works after the eager ones.
    round_trip(net, s, r, 100_000, 200_000, 9);
}

fn pattern_msgs(lens: &[usize]) -> Vec<Vec<u8>> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, 300 + i as u64))
        .collect()
}

/// One small operation at a time, ordered as NCCL orders them when the receiving
/// GPU runs only after the sending one: the sender's proxy sends and tests until done,
/// only then the receiver's proxy posts the receive and tests it, only then the next
/// send. One thread per side, yielding when idle as NCCL's proxy does. Averages well
/// under a timer tick here, unless a step waits on a timeout or on the other side.
#[test]
fn small_ops_in_nccls_order_are_not_timer_bound() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    const OPS: usize = 300;
    let (to_recv, sent) = std::sync::mpsc::channel::<()>();
    let (to_send, received) = std::sync::mpsc::channel::<()>();
    let rp = SendPtr(r);
    let recv = std::thread::spawn(move || {
        let net = Net::for_another_thread();
        let rp = rp;
        let t0 = Instant::now();
        for k in 0..OPS {
            // The sender finished op k before this side posts its receive.
            loop {
                match sent.try_recv() {
                    Ok(()) => break,
                    Err(_) => {
                        assert!(t0.elapsed() < DEADLINE, "op {k}: the send never completed");
                        std::thread::yield_now();
                    }
                }
            }
            let mut bufs = vec![vec![0u8; 4096]];
            let req = net.irecv(rp.0, &mut bufs, &[1]);
            assert!(!req.is_null());
            loop {
                let (rc, d, sz) = net.test(req);
                ok(rc, "test recv");
                if d {
                    assert_eq!(sz[0], 1024);
                    assert!(
                        bufs[0][..1024] == pattern(1024, k as u64)[..],
                        "op {k}'s bytes"
                    );
                    break;
                }
                assert!(
                    t0.elapsed() < DEADLINE,
                    "op {k}: the receive never completed"
                );
                std::thread::yield_now();
            }
            to_send.send(()).unwrap();
        }
    });
    let t0 = Instant::now();
    let mut per_op = Vec::with_capacity(OPS);
    for k in 0..OPS {
        let t_op = Instant::now();
        let msg = pattern(1024, k as u64);
        let req = loop {
            let (rc, req) = net.isend_once(s, &msg, 1);
            ok(rc, "isend");
            if !req.is_null() {
                break req;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "op {k}: the send waited for a receive that NCCL posts only after the send completed"
            );
            std::thread::yield_now();
        };
        loop {
            let (rc, d, _) = net.test(req);
            ok(rc, "test send");
            if d {
                break;
            }
            assert!(t0.elapsed() < DEADLINE, "op {k}: the send never completed");
            std::thread::yield_now();
        }
        to_recv.send(()).unwrap();
        loop {
            match received.try_recv() {
                Ok(()) => break,
                Err(_) => {
                    assert!(
                        t0.elapsed() < DEADLINE,
                        "op {k}: the receive never completed"
                    );
                    std::thread::yield_now();
                }
            }
        }
        per_op.push(t_op.elapsed().as_secs_f64() * 1e6);
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / OPS as f64;
    recv.join().unwrap();
    per_op.sort_by(f64::total_cmp);
    let (tenth, median) = (per_op[OPS / 10], per_op[OPS / 2]);
    eprintln!(
        "small_ops_in_nccls_order: {us:.1} us per 1 KiB op on average, median {median:.1}, tenth percentile {tenth:.1}"
    );
    // The tenth percentile: a wait bound to a timer (the I/O threads' 100 ms poll) or to
    // the other rank (2 ms per op under NCCL on the H200 before eager sends) slows every
    // op, the fastest too, while the other tests sharing this machine's cores stall
    // many but not nine in ten (the median once passed 1.5 ms on a 2-core machine
    // running the whole suite; 72-150 us there alone).
    assert!(
        tenth < 1500.0,
        "{tenth:.0} us per 1 KiB op at the tenth percentile (bound 1500; median {median:.0}): a step waits on a timer or on the other side"
    );
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

#[test]
fn smaller_than_posted_and_larger_refused() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    round_trip(&net, s, r, 1000, 1 << 20, 1);
    round_trip(&net, s, r, 0, 4096, 2);
    // Larger than posted: the send is refused (NCCL would have mismatched sizes).
    let mut bufs = vec![vec![0u8; 100]];
    let rr = net.irecv(r, &mut bufs, &[3]);
    let big = pattern(101, 3);
    let t0 = Instant::now();
    let mut sreq: *mut c_void = null_mut();
    let rc = loop {
        // Sent eagerly (before the clear-to-send came) the send is a request, and the
        // refusal comes through its test once the receive's size is known, or through
        // the comm's next call where the send was done once written (a copy kept).
        let rc = if sreq.is_null() {
            let (rc, req) = net.isend_once(s, &big, 3);
            sreq = req;
            rc
        } else {
            let (rc, done, _) = net.test(sreq);
            if done {
                sreq = null_mut();
            }
            rc
        };
        if rc != NcclResult::SUCCESS {
            break rc;
        }
        let (_, done, _) = net.test(rr);
        assert!(
            !done,
            "a receive completed with a message larger than posted"
        );
        assert!(t0.elapsed() < DEADLINE);
    };
    assert_eq!(rc, NcclResult::INVALID_USAGE);
    assert!(logged(
        |_, s| s.contains("message of 101 bytes for a receive of 100 bytes")
    ));
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

#[test]
fn grouped_receive_matches_tags() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    let tags: Vec<i32> = (10..18).collect();
    let lens = [0usize, 1, 777, 33_000, 70_000, 1 << 20, 3 << 20, 12];
    let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n + 100]).collect();
    let rr = net.irecv(r, &mut bufs, &tags);
    let msgs: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, 100 + i as u64))
        .collect();
    // The sender's messages come in another order than the buffers.
    let order = [5usize, 0, 7, 2, 6, 1, 4, 3];
    let sreqs: Vec<_> = order
        .iter()
        .map(|&i| net.isend(s, &msgs[i], tags[i], &[rr]))
        .collect();
    let mut all = sreqs.clone();
    all.push(rr);
    let sizes = net.wait_all(&all);
    for (k, &i) in order.iter().enumerate() {
        assert_eq!(sizes[k][0] as usize, lens[i]);
    }
    for i in 0..8 {
        assert_eq!(sizes[8][i] as usize, lens[i], "received size of buffer {i}");
        assert!(
            bufs[i][..lens[i]] == msgs[i][..],
            "buffer {i} (tag {})",
            tags[i]
        );
    }
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

#[test]
fn close_in_every_state() {
    let net = Net::init();
    // Listen only.
    let (_, l) = net.listen();
    net.close_listen(l);
    // Connected, never accepted: the listener closes with the connection pending. (Over
    // TCP only: over verbs a connection exists only once accepted.)
    if !over_verbs() {
        let (mut h, l) = net.listen();
        let t0 = Instant::now();
        let s = loop {
            let (rc, s) = net.connect(&mut h);
            ok(rc, "connect");
            if !s.is_null() {
                break s;
            }
            assert!(t0.elapsed() < DEADLINE);
        };
        net.close_send(s);
        net.close_listen(l);
    }
    // Accepted, the listener closed before the comms.
    let (s, r, l) = net.pair();
    net.close_listen(l);
    round_trip(&net, s, r, 12345, 12345, 9);
    // Receives posted, nothing sent: close both.
    let mut bufs = vec![vec![0u8; 1 << 20]];
    let _rr = net.irecv(r, &mut bufs, &[1]);
    net.close_recv(r);
    net.close_send(s);

    // The sender closes mid-message: the receiver's test fails, no hang. (Where the
    // whole message was written before the close, as the NIC may over verbs, the
    // receive is done instead, its bytes exact: the close came after them.)
    let (s, r, l) = net.pair();
    let mut bufs = vec![vec![0u8; 64 << 20]];
    let rr = net.irecv(r, &mut bufs, &[1]);
    let msg = pattern(64 << 20, 5);
    let sr = net.isend(s, &msg, 1, &[rr]);
    let mut received = false;
    for _ in 0..3 {
        let _ = net.test(sr);
        received |= !received && net.test(rr).1;
    }
    net.close_send(s);
    let t0 = Instant::now();
    while !received {
        assert!(t0.elapsed() < DEADLINE, "no error in time (a hang)");
        let (rc, done, _) = net.test(rr);
        if rc != NcclResult::SUCCESS {
            assert_eq!(rc, NcclResult::REMOTE_ERROR);
            assert!(logged(|_, s| s.contains("closed")));
            break;
        }
        received = done;
    }
    if received {
        assert!(bufs[0] == msg, "a receive done has the message's bytes");
    }
    net.close_recv(r);
    net.close_listen(l);

    // The receiver closes mid-message: the sender's test fails, no hang. (Or the send
    // is done: the receiver had the whole message and said so before it closed, as it
    // may over verbs.)
    let (s, r, l) = net.pair();
    let mut bufs = vec![vec![0u8; 64 << 20]];
    let rr = net.irecv(r, &mut bufs, &[1]);
    let sr = net.isend(s, &msg, 1, &[rr]);
    let mut sent = false;
    for _ in 0..3 {
        sent |= !sent && net.test(sr).1;
        let _ = net.test(rr);
    }
    net.close_recv(r);
    if !sent {
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < DEADLINE, "no error in time (a hang)");
            let (rc, done, _) = net.test(sr);
            if done {
                break;
            }
            if rc != NcclResult::SUCCESS {
                assert!(
                    rc == NcclResult::REMOTE_ERROR || rc == NcclResult::SYSTEM_ERROR,
                    "{rc:?}"
                );
                break;
            }
        }
    }
    net.close_send(s);
    net.close_listen(l);
}

/// `ncclCommAbort` with a receive in flight: NCCL deregisters its buffers and frees them
/// before it closes the comm, and has no call to cancel a request. Over TCP the
/// plugin's threads land the bytes themselves, so once `deregMr` returns none may write
/// that memory. Here the memory gets a new owner's bytes right after `deregMr` (as freed
/// memory would), then the sender sends into the receive: not one of them may change
/// (before, the comm's readers went on landing the message there).
#[test]
fn tcp_a_buffer_deregistered_with_a_receive_in_flight_is_never_written_after() {
    if over_verbs() {
        eprintln!("skipped: a case of the TCP comms (NCCL_GRDMA_TRANSPORT=verbs)");
        return;
    }
    const LEN: usize = 8 << 20;
    let net = Net::init();
    let (s, r, l) = net.pair();
    let mut buf = vec![0u8; LEN];
    let mut mh = null_mut();
    // SAFETY: a receive comm and a buffer kept until the comm closes; out-pointers.
    let rc = unsafe {
        (net.t.regMr)(
            r,
            buf.as_mut_ptr() as *mut c_void,
            LEN,
            NCCL_PTR_HOST,
            &mut mh,
        )
    };
    ok(rc, "regMr");
    let (mut data, mut sizes, mut tags, mut mhs) =
        ([buf.as_mut_ptr() as *mut c_void], [LEN], [7], [mh]);
    let mut rr = null_mut();
    // SAFETY: one-element arrays; the buffer outlives the comm.
    let rc = unsafe {
        (net.t.irecv)(
            r,
            1,
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            null_mut(),
            &mut rr,
        )
    };
    ok(rc, "irecv");
    assert!(!rr.is_null());
    // SAFETY: the registration just made on this comm, deregistered once.
    ok(
        unsafe { (net.t.deregMr)(r, mh) },
        "deregMr with a receive in flight",
    );
    assert!(logged(
        |_, s| s.contains("deregMr of a buffer a receive in flight")
    ));
    buf.fill(0x5A);
    // The sender tries for a while: its send fails, or waits for ever for a receiver
    // that stopped.
    let msg = pattern(LEN, 9);
    let t0 = Instant::now();
    let mut sr: *mut c_void = null_mut();
    while t0.elapsed() < Duration::from_secs(2) {
        if sr.is_null() {
            let (rc, req) = net.isend_once(s, &msg, 7);
            if rc != NcclResult::SUCCESS {
                break;
            }
            sr = req;
        } else {
            let (rc, done, _) = net.test(sr);
            if rc != NcclResult::SUCCESS || done {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(300));
    let changed = buf.iter().filter(|&&b| b != 0x5A).count();
    assert_eq!(
        changed, 0,
        "{changed} bytes landed in memory deregistered before"
    );
    let (rc, done, _) = net.test(rr);
    assert!(rc != NcclResult::SUCCESS && !done, "{rc:?} {done}");
    net.close_recv(r);
    net.close_send(s);
    net.close_listen(l);
}

/// `ncclCommAbort` with a send in flight (over TCP): once `deregMr` returns, no thread
/// of the plugin reads the send's buffer (a child process, as a read would crash it).
#[test]
fn tcp_a_buffer_deregistered_with_a_send_in_flight_is_never_read_after() {
    if over_verbs() {
        eprintln!("skipped: a case of the TCP comms (NCCL_GRDMA_TRANSPORT=verbs)");
        return;
    }
    let out = child("dereg_send_in_flight", &[]);
    assert_child_ok(&out, "deregMr with a send in flight");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("was not read after"), "{said}");
}

#[test]
fn bad_handles_are_errors() {
    let net = Net::init();
    let (h, l) = net.listen();
    // Not a handle of this plugin.
    let mut bad = h;
    bad[0] ^= 0xff;
    let (rc, s) = net.connect(&mut bad);
    assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
    assert!(s.is_null());
    assert!(logged(|_, s| s.contains("bad handle")));
    // A handle of this plugin with another listener's token: connects, then the
    // listener refuses it and the sender's isend fails.
    let mut wrong = h;
    wrong[32] ^= 1;
    let t0 = Instant::now();
    let s = loop {
        let (rc, s) = net.connect(&mut wrong);
        ok(rc, "connect");
        if !s.is_null() {
            break s;
        }
        assert!(t0.elapsed() < DEADLINE);
    };
    let t0 = Instant::now();
    let mut sreq: *mut c_void = null_mut();
    let rc = loop {
        let (rc, r) = net.accept(l);
        ok(rc, "accept");
        assert!(r.is_null(), "accepted a connection with a wrong token");
        // The send may go eagerly (a request): then its test reports the refusal, or,
        // done once written (a copy kept), the comm's next send does.
        let rc = if sreq.is_null() {
            let (rc, req) = net.isend_once(s, b"x", 0);
            sreq = req;
            rc
        } else {
            let (rc, done, _) = net.test(sreq);
            if done {
                sreq = null_mut();
            }
            rc
        };
        if rc != NcclResult::SUCCESS {
            break rc;
        }
        assert!(t0.elapsed() < DEADLINE, "no error for a wrong token");
    };
    assert_eq!(rc, NcclResult::REMOTE_ERROR);
    assert!(logged(|_, s| s.contains("refused this connection")));
    net.close_send(s);
    net.close_listen(l);
    // A port nobody listens on.
    let (mut h2, l2) = net.listen();
    net.close_listen(l2);
    let t0 = Instant::now();
    let rc = loop {
        let (rc, s) = net.connect(&mut h2);
        assert!(s.is_null());
        if rc != NcclResult::SUCCESS {
            break rc;
        }
        assert!(t0.elapsed() < DEADLINE);
    };
    assert_eq!(rc, NcclResult::SYSTEM_ERROR);
    assert!(
        h2[120..].iter().all(|&b| b == 0),
        "connect's progress slot cleared after failing"
    );
}

#[test]
fn older_tables_round_trip() {
    let _keep = Net::init(); // the logger, for the lines below
    let buf_len = 300_000;
    // v10
    {
        let t: &NcclNetV10 = table(b"ncclNetPlugin_v10\0");
        assert_eq!(unsafe { CStr::from_ptr(t.name) }, c"grdma");
        ok(unsafe { (t.init)(Some(logger), None) }, "v10 init");
        let mut p: NcclNetPropertiesV9 = unsafe { std::mem::zeroed() };
        ok(unsafe { (t.getProperties)(0, &mut p) }, "v10 props");
        assert_eq!((p.ptrSupport, p.maxRecvs), (NCCL_PTR_HOST, 8));
        let mut h = [0u8; 128];
        let mut l = null_mut();
        ok(
            unsafe { (t.listen)(0, h.as_mut_ptr() as *mut c_void, &mut l) },
            "v10 listen",
        );
        let (mut s, mut r): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let mut cfg = NcclNetCommConfig { trafficClass: -1 };
        let t0 = Instant::now();
        while s.is_null() || r.is_null() {
            assert!(t0.elapsed() < DEADLINE);
            if s.is_null() {
                ok(
                    unsafe {
                        (t.connect)(
                            0,
                            &mut cfg,
                            h.as_mut_ptr() as *mut c_void,
                            &mut s,
                            &mut null_mut(),
                        )
                    },
                    "v10 connect",
                );
            }
            if r.is_null() {
                ok(
                    unsafe { (t.accept)(l, &mut r, &mut null_mut()) },
                    "v10 accept",
                );
            }
        }
        let msg = pattern(buf_len, 10);
        let mut buf = vec![0u8; buf_len];
        let (mut rr, mut sr): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let mut data = [buf.as_mut_ptr() as *mut c_void];
        let mut sizes = [buf_len];
        let mut tags = [5];
        ok(
            unsafe {
                (t.irecv)(
                    r,
                    1,
                    data.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    tags.as_mut_ptr(),
                    null_mut(),
                    null_mut(),
                    &mut rr,
                )
            },
            "v10 irecv",
        );
        drive_v(
            t.test,
            &mut || {
                if sr.is_null() {
                    ok(
                        unsafe {
                            (t.isend)(
                                s,
                                msg.as_ptr() as *mut c_void,
                                buf_len,
                                5,
                                null_mut(),
                                null_mut(),
                                &mut sr,
                            )
                        },
                        "v10 isend",
                    );
                }
                sr
            },
            rr,
        );
        assert!(buf == msg, "v10 bytes");
        ok(unsafe { (t.closeSend)(s) }, "v10 closeSend");
        ok(unsafe { (t.closeRecv)(r) }, "v10 closeRecv");
        ok(unsafe { (t.closeListen)(l) }, "v10 closeListen");
    }
    // v9
    {
        let t: &NcclNetV9 = table(b"ncclNetPlugin_v9\0");
        ok(unsafe { (t.init)(Some(logger)) }, "v9 init");
        let mut p: NcclNetPropertiesV9 = unsafe { std::mem::zeroed() };
        ok(unsafe { (t.getProperties)(0, &mut p) }, "v9 props");
        assert_eq!(p.maxCollBytes, MAX_COLLNET_SIZE);
        let mut h = [0u8; 128];
        let mut l = null_mut();
        ok(
            unsafe { (t.listen)(0, h.as_mut_ptr() as *mut c_void, &mut l) },
            "v9 listen",
        );
        let (mut s, mut r): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let t0 = Instant::now();
        while s.is_null() || r.is_null() {
            assert!(t0.elapsed() < DEADLINE);
            if s.is_null() {
                ok(
                    unsafe {
                        (t.connect)(0, h.as_mut_ptr() as *mut c_void, &mut s, &mut null_mut())
                    },
                    "v9 connect",
                );
            }
            if r.is_null() {
                ok(
                    unsafe { (t.accept)(l, &mut r, &mut null_mut()) },
                    "v9 accept",
                );
            }
        }
        let msg = pattern(buf_len, 9);
        let mut buf = vec![0u8; buf_len];
        let (mut rr, mut sr): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let mut data = [buf.as_mut_ptr() as *mut c_void];
        let mut sizes = [buf_len];
        let mut tags = [5];
        ok(
            unsafe {
                (t.irecv)(
                    r,
                    1,
                    data.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    tags.as_mut_ptr(),
                    null_mut(),
                    &mut rr,
                )
            },
            "v9 irecv",
        );
        drive_v(
            t.test,
            &mut || {
                if sr.is_null() {
                    ok(
                        unsafe {
                            (t.isend)(
                                s,
                                msg.as_ptr() as *mut c_void,
                                buf_len,
                                5,
                                null_mut(),
                                &mut sr,
                            )
                        },
                        "v9 isend",
                    );
                }
                sr
            },
            rr,
        );
        assert!(buf == msg, "v9 bytes");
        ok(unsafe { (t.closeSend)(s) }, "v9 closeSend");
        ok(unsafe { (t.closeRecv)(r) }, "v9 closeRecv");
        ok(unsafe { (t.closeListen)(l) }, "v9 closeListen");
    }
    // v8: int sizes
    {
        let t: &NcclNetV8 = table(b"ncclNetPlugin_v8\0");
        ok(unsafe { (t.init)(Some(logger)) }, "v8 init");
        let mut p: NcclNetPropertiesV8 = unsafe { std::mem::zeroed() };
        ok(unsafe { (t.getProperties)(0, &mut p) }, "v8 props");
        assert_eq!((p.ptrSupport, p.speed), (NCCL_PTR_HOST, 400_000));
        let mut h = [0u8; 128];
        let mut l = null_mut();
        ok(
            unsafe { (t.listen)(0, h.as_mut_ptr() as *mut c_void, &mut l) },
            "v8 listen",
        );
        let (mut s, mut r): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let t0 = Instant::now();
        while s.is_null() || r.is_null() {
            assert!(t0.elapsed() < DEADLINE);
            if s.is_null() {
                ok(
                    unsafe {
                        (t.connect)(0, h.as_mut_ptr() as *mut c_void, &mut s, &mut null_mut())
                    },
                    "v8 connect",
                );
            }
            if r.is_null() {
                ok(
                    unsafe { (t.accept)(l, &mut r, &mut null_mut()) },
                    "v8 accept",
                );
            }
        }
        let msg = pattern(buf_len - 1000, 8);
        let mut buf = vec![0u8; buf_len];
        let (mut rr, mut sr): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let mut data = [buf.as_mut_ptr() as *mut c_void];
        let mut sizes = [buf_len as c_int];
        let mut tags = [5];
        ok(
            unsafe {
                (t.irecv)(
                    r,
                    1,
                    data.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    tags.as_mut_ptr(),
                    null_mut(),
                    &mut rr,
                )
            },
            "v8 irecv",
        );
        let got = drive_v(
            t.test,
            &mut || {
                if sr.is_null() {
                    ok(
                        unsafe {
                            (t.isend)(
                                s,
                                msg.as_ptr() as *mut c_void,
                                msg.len() as c_int,
                                5,
                                null_mut(),
                                &mut sr,
                            )
                        },
                        "v8 isend",
                    );
                }
                sr
            },
            rr,
        );
        assert_eq!(got as usize, msg.len(), "v8 received size");
        assert!(buf[..msg.len()] == msg[..], "v8 bytes");
        ok(unsafe { (t.closeSend)(s) }, "v8 closeSend");
        ok(unsafe { (t.closeRecv)(r) }, "v8 closeRecv");
        ok(unsafe { (t.closeListen)(l) }, "v8 closeListen");
    }
}

/// Drives one send (posted by `post` until it returns a request) and the receive `rr`
/// to completion with `test`; the received size.
fn drive_v(test: TestFn, post: &mut dyn FnMut() -> *mut c_void, rr: *mut c_void) -> c_int {
    let t0 = Instant::now();
    let (mut sdone, mut rdone, mut got) = (false, false, -1);
    while !(sdone && rdone) {
        assert!(t0.elapsed() < DEADLINE, "round trip not done");
        let sr = post();
        let mut d = 0;
        let mut sz = [0 as c_int; 8];
        if !sr.is_null() && !sdone {
            ok(unsafe { test(sr, &mut d, sz.as_mut_ptr()) }, "test send");
            sdone = d == 1;
        }
        if !rdone {
            ok(unsafe { test(rr, &mut d, sz.as_mut_ptr()) }, "test recv");
            if d == 1 {
                rdone = true;
                got = sz[0];
            }
        }
    }
    got
}

// ---- scenarios in a child process, with their own environment ----

/// Runs this test binary again as a child doing `scenario` under `env`; its output.
fn child(scenario: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "child_scenario",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("GRDMA_CHILD", scenario)
    .env("NCCL_GRDMA_PLUGIN", plugin_path())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut c = cmd.spawn().unwrap();
    // Drained while the child runs: a child that logs more than a pipe holds (the
    // trace) would block on a full pipe otherwise.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out_t = drain(c.stdout.take().map(|x| Box::new(x) as _));
    let err_t = drain(c.stderr.take().map(|x| Box::new(x) as _));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > DEADLINE * 2 {
            // The child this test spawned, by its handle.
            let _ = c.kill();
            let _ = c.wait();
            panic!(
                "child {scenario} hung: {}",
                String::from_utf8_lossy(&err_t.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

#[test]
#[ignore = "a child process of the other tests (GRDMA_CHILD names what it does)"]
fn child_scenario() {
    let which = std::env::var("GRDMA_CHILD").expect("GRDMA_CHILD");
    match which.as_str() {
        "speed" => {
            let t = v11();
            let mut ctx = null_mut();
            let mut cfg = NcclNetCommConfig { trafficClass: -1 };
            // SAFETY: as NCCL calls it, with valid out-pointers.
            let r = unsafe { (t.init)(&mut ctx, 42, &mut cfg, Some(logger), None) };
            println!("init={}", r.0);
            if r == NcclResult::SUCCESS {
                // SAFETY: zeroed plain data, then filled by the plugin.
                let mut p: NcclNetPropertiesV11 = unsafe { std::mem::zeroed() };
                ok(unsafe { (t.getProperties)(0, &mut p) }, "getProperties");
                println!("speed={}", p.speed);
                ok(unsafe { (t.finalize)(ctx) }, "finalize");
            }
        }
        "repair" => {
            let net = Net::init();
            let (s, r, l) = net.pair();
            for (i, size) in [1usize, 40_000, 1 << 20, 9 << 20, 32 << 20]
                .into_iter()
                .enumerate()
            {
                for k in 0..4 {
                    round_trip(&net, s, r, size, size, (i * 10 + k) as u64);
                }
            }
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
        }
        "sends-then-receives" => {
            let net = Net::init();
            let (s, r, l) = net.pair();
            sends_then_receives(&net, s, r);
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
        }
        "eager" => {
            let net = Net::init();
            let (s, r, l) = net.pair();
            sends_then_receives(&net, s, r);
            // Past the trace's bound (200 requests per comm).
            for k in 0..220 {
                round_trip(&net, s, r, 100, 100, k);
            }
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
        }
        "eager_in_place" => {
            // Three 4 MiB eager messages, then one of 300 KiB, sent before any of their
            // receives is posted (eager: no clear-to-send yet), the receives posted at
            // once after: the later messages' pieces wait behind megabytes on every
            // socket, so their receives are posted before their first piece is read
            // and they land in place by number. Until 4 did (the trace says), at most
            // 50 rounds; every byte checked.
            let net = Net::init();
            let (s, r, l) = net.pair();
            let in_place = || logged_count("landed in place in buffer");
            let sizes = [4 << 20, 4 << 20, 4 << 20, 300 << 10];
            for k in 0..50u64 {
                if in_place() >= 4 {
                    break;
                }
                let msgs: Vec<Vec<u8>> = (sizes.iter().enumerate())
                    .map(|(i, &n)| pattern(n, 90 + 4 * k + i as u64))
                    .collect();
                let mut reqs: Vec<*mut c_void> =
                    msgs.iter().map(|m| net.isend(s, m, 7, &[])).collect();
                let mut bufs: Vec<Vec<Vec<u8>>> =
                    sizes.iter().map(|&n| vec![vec![0u8; n]]).collect();
                for b in bufs.iter_mut() {
                    reqs.push(net.irecv(r, b, &[7]));
                }
                let got = net.wait_all(&reqs);
                for (i, (m, b)) in msgs.iter().zip(&bufs).enumerate() {
                    assert_eq!(got[4 + i][0] as usize, m.len(), "received size");
                    assert!(b[0] == *m, "the bytes of message {i} of round {k}");
                    net.forget(s, m.as_ptr());
                    net.forget(r, b[0].as_ptr());
                }
            }
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
        }
        "close_after_kept_sends" => {
            // A send done before its ack (a copy kept), its buffer scribbled over, the
            // comm closed at once: close waits for the ack, sending corrupt pieces
            // again from the copy, so the receive still completes exactly.
            // Which send is done before its ack depends on the threads' timing: go on
            // until 8 were (the trace says), at most 200 rounds.
            let net = Net::init();
            let kept = || logged_count("test done (before the ack: a copy is kept)");
            for k in 0..200u64 {
                if kept() >= 8 {
                    break;
                }
                let (s, r, l) = net.pair();
                let size = 200 << 10;
                let mut bufs = vec![vec![0u8; size]];
                let rr = net.irecv(r, &mut bufs, &[1]);
                let mut msg = pattern(size, 40 + k);
                let sr = net.isend(s, &msg, 1, &[rr]);
                net.wait_all(&[sr]);
                msg.fill(0xee);
                net.close_send(s);
                net.wait_all(&[rr]);
                assert!(bufs[0] == pattern(size, 40 + k), "the bytes of message {k}");
                net.close_recv(r);
                net.close_listen(l);
            }
            assert!(
                kept() >= 8,
                "fewer than 8 sends in 200 were done before their ack"
            );
        }
        "staging_full" => {
            // Over verbs with the checks on, a receive of 1 MiB buffers is staged (NCCL
            // may send such a message under LL or LL128); 8 buffers a request, so four
            // requests hold the comm's 32 MiB of staging buffers. A fifth irecv is busy
            // (a null request: NCCL posts it again) rather than posted unstaged, until
            // the first four are done and gave theirs back; then it posts, and every byte
            // of the five arrives.
            let net = Net::init();
            let (s, r, l) = net.pair();
            let tags: Vec<i32> = (0..8).collect();
            let mut bufs: Vec<Vec<Vec<u8>>> = (0..5)
                .map(|_| (0..8).map(|_| vec![0u8; 1 << 20]).collect())
                .collect();
            let msgs: Vec<Vec<Vec<u8>>> = (0..5u64)
                .map(|q| (0..8u64).map(|i| pattern(1 << 20, 10 * q + i)).collect())
                .collect();
            let mut rreqs = Vec::new();
            for (q, b) in bufs.iter_mut().take(4).enumerate() {
                let rr = net.irecv(r, b, &tags);
                assert!(!rr.is_null(), "receive {q} of the first four was busy");
                rreqs.push(rr);
            }
            let fifth = net.irecv(r, &mut bufs[4], &tags);
            assert!(
                fifth.is_null(),
                "a fifth receive of 8 staged MiB was posted past the 32 MiB of staging: it would land unstaged"
            );
            let mut reqs = rreqs.clone();
            for group in msgs.iter().take(4) {
                for (i, m) in group.iter().enumerate() {
                    reqs.push(net.isend(s, m, tags[i], &[]));
                }
            }
            net.wait_all(&reqs);
            let t0 = Instant::now();
            let fifth = loop {
                let rr = net.irecv(r, &mut bufs[4], &tags);
                if !rr.is_null() {
                    break rr;
                }
                assert!(t0.elapsed() < DEADLINE, "the fifth receive stayed busy");
            };
            let mut reqs = vec![fifth];
            for (i, m) in msgs[4].iter().enumerate() {
                reqs.push(net.isend(s, m, tags[i], &[]));
            }
            net.wait_all(&reqs);
            for (q, (got, sent)) in bufs.iter().zip(&msgs).enumerate() {
                for (i, (b, m)) in got.iter().zip(sent).enumerate() {
                    assert!(b == m, "buffer {i} of receive {q}");
                }
            }
            println!("staging full: the fifth receive waited, every byte arrived");
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
        }
        "every_piece_corrupt" => {
            let net = Net::init();
            let (s, r, l) = net.pair();
            let mut bufs = vec![vec![0u8; 100_000]];
            let rr = net.irecv(r, &mut bufs, &[0]);
            let msg = pattern(100_000, 1);
            let sr = net.isend(s, &msg, 0, &[rr]);
            let rc = net.comm_error(s, sr, &msg, 0, &[rr]);
            assert_eq!(rc, NcclResult::REMOTE_ERROR);
            let (_, done, _) = net.test(rr);
            assert!(!done, "the receive never completes with bad data");
            // Over TCP the send was done before its ack (a small one, its copy kept), so
            // NCCL may never call the sending comm again: the receiver learns of the
            // failure from the connection, not from a close that may not come (it waited
            // for ever). Over verbs a send is done only at its ack, so the sender's own
            // `test` fails and NCCL closes both ends: nothing more to ask there.
            let over_verbs = std::env::var("NCCL_GRDMA_TRANSPORT").as_deref() == Ok("verbs");
            let t0 = Instant::now();
            loop {
                if over_verbs {
                    break;
                }
                let (rc, done, _) = net.test(rr);
                assert!(!done, "the receive never completes with bad data");
                if rc != NcclResult::SUCCESS {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "the receiver was not told its sender gave up"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            // A message this small is one NCCL may send under LL or LL128, whose GPU
            // reads the buffer as the bytes come: no byte that failed its CRC32C may have
            // reached it (over TCP the injector flips bits of the bytes themselves; over
            // verbs it sends a wrong CRC32C, so there bytes written straight into the
            // buffer would be there, intact, and staged ones are not).
            assert!(
                bufs[0].iter().all(|&b| b == 0),
                "bytes that failed their CRC32C reached NCCL's buffer"
            );
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
        }
        "killed_receiver" => {
            // The test's body in a child over verbs (its own receiver, a grandchild,
            // inherits the same environment).
            a_killed_receiver_is_an_error_not_a_hang();
            println!("killed receiver seen");
        }
        "verbs_basics" => {
            // The cases whose rules are the same over both transports, over verbs.
            sizes_round_trip_exactly();
            let net = Net::init();
            // Another listener's token: refused by the listener, an error for the connector.
            let (mut h, l) = net.listen();
            h[32] ^= 0xff;
            let t0 = Instant::now();
            let rc = loop {
                assert!(
                    t0.elapsed() < DEADLINE,
                    "a wrong token neither refused nor failed"
                );
                let (rc, c) = net.connect(&mut h);
                assert!(c.is_null(), "connected with a wrong token");
                if rc != NcclResult::SUCCESS {
                    break rc;
                }
                let (ra, r) = net.accept(l);
                ok(ra, "accept");
                assert!(r.is_null(), "accepted a wrong token");
            };
            assert_eq!(rc, NcclResult::REMOTE_ERROR);
            assert!(logged(|_, s| s.contains("refused a connection from")));
            assert!(logged(
                |_, s| s.contains("the listener refused the connection")
            ));
            net.close_listen(l);
            // A port nobody listens on: an error (the CM's rejection), the handle's
            // progress slot cleared.
            let (mut h2, l2) = net.listen();
            net.close_listen(l2);
            let t0 = Instant::now();
            let rc = loop {
                assert!(
                    t0.elapsed() < DEADLINE,
                    "connect to nobody: no error in time"
                );
                let (rc, c) = net.connect(&mut h2);
                assert!(c.is_null());
                if rc != NcclResult::SUCCESS {
                    break rc;
                }
            };
            assert!(
                rc == NcclResult::REMOTE_ERROR || rc == NcclResult::SYSTEM_ERROR,
                "{rc:?}"
            );
            assert!(h2[120..].iter().all(|&b| b == 0), "progress slot cleared");
            thirty_two_in_flight_then_busy_and_out_of_order_tests();
            smaller_than_posted_and_larger_refused();
            grouped_receive_matches_tags();
            close_in_every_state();
            println!("verbs basics passed");
        }
        "dereg_send_in_flight" => {
            // The send side of `tcp_a_buffer_deregistered_...`: the send's buffer is made
            // unreadable right after its deregMr (as memory NCCL freed may be unmapped):
            // a writer thread still reading it (its CRC32C) would crash this process.
            const LEN: usize = 64 << 20;
            // SAFETY: a fresh private mapping of LEN bytes, ours alone.
            let p = unsafe {
                libc::mmap(
                    null_mut(),
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: the mapping just made, readable and writable until the mprotect
            // below, which comes after this slice's last use.
            let msg = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, LEN) };
            msg.copy_from_slice(&pattern(LEN, 11));
            let net = Net::init();
            let (s, r, l) = net.pair();
            let mut bufs = vec![vec![0u8; LEN]];
            let rr = net.irecv(r, &mut bufs, &[1]);
            let mut mh = null_mut();
            // SAFETY: a send comm and a buffer kept mapped until after its deregMr.
            let rc = unsafe { (net.t.regMr)(s, p, LEN, NCCL_PTR_HOST, &mut mh) };
            ok(rc, "regMr");
            let t0 = Instant::now();
            let sr = loop {
                assert!(t0.elapsed() < DEADLINE, "isend never took the message");
                let mut req = null_mut();
                // SAFETY: the registered buffer, mapped until after its deregMr.
                let rc = unsafe { (net.t.isend)(s, p, LEN, 1, mh, null_mut(), &mut req) };
                ok(rc, "isend");
                if !req.is_null() {
                    break req;
                }
                let _ = net.test(rr);
            };
            // SAFETY: the registration just made on this comm, deregistered once.
            ok(
                unsafe { (net.t.deregMr)(s, mh) },
                "deregMr with a send in flight",
            );
            // SAFETY: our own mapping; nothing of ours reads it after this.
            assert_eq!(unsafe { libc::mprotect(p, LEN, libc::PROT_NONE) }, 0);
            // A writer still reading the buffer faults within this.
            std::thread::sleep(Duration::from_millis(300));
            let (rc, done, _) = net.test(sr);
            assert!(rc != NcclResult::SUCCESS && !done, "{rc:?} {done}");
            // The receive fails (its sender stopped mid-message) or waits: not done.
            let (_, done, _) = net.test(rr);
            assert!(
                !done,
                "a receive whose sender was stopped mid-message completed"
            );
            net.close_recv(r);
            net.close_send(s);
            net.close_listen(l);
            assert!(logged(
                |_, s| s.contains("deregMr of a buffer a send in flight")
            ));
            println!("a send's buffer deregistered in flight was not read after");
        }
        "checks_off" => {
            let net = Net::init();
            let (s, r, l) = net.pair();
            for (i, size) in [0usize, 5, 1 << 20, 7 << 20].into_iter().enumerate() {
                round_trip(&net, s, r, size, size + 10, i as u64);
            }
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
            // Checks off, a send is done once written: a sender that closes the moment
            // its sends are done, before the receiver looked, still has every message
            // received, exact. (Over verbs the last frames and the disconnect came in
            // one poll, and the frames were dropped: "closed the connection".)
            let (s, r, l) = net.pair();
            let sizes = [5usize, 4096, 1 << 20];
            let msgs = pattern_msgs(&sizes);
            let mut bufs: Vec<Vec<Vec<u8>>> = sizes.iter().map(|&n| vec![vec![0u8; n]]).collect();
            let rrs: Vec<_> = (bufs.iter_mut().enumerate())
                .map(|(i, b)| net.irecv(r, b, &[i as i32]))
                .collect();
            let srs: Vec<_> = (msgs.iter().enumerate())
                .map(|(i, m)| net.isend(s, m, i as i32, &[]))
                .collect();
            net.wait_all(&srs);
            net.close_send(s);
            let got = net.wait_all(&rrs);
            for (i, b) in bufs.iter().enumerate() {
                assert_eq!(got[i][0], sizes[i] as c_int, "message {i}'s size");
                assert!(b[0] == msgs[i], "message {i}'s bytes");
            }
            net.close_recv(r);
            net.close_listen(l);
            println!("a sender that closed at once: every message received");
        }
        "panic" => {
            let net = Net::init();
            let mut n = 0;
            // SAFETY: an out-pointer.
            let rc = unsafe { (net.t.devices)(&mut n) };
            assert_eq!(rc, NcclResult::INTERNAL_ERROR);
            assert!(logged(|l, s| l == NCCL_LOG_WARN && s.contains("panic")));
            println!("still alive after the panic");
        }
        "panic_writer" => {
            let net = Net::init();
            let (s, r, l) = net.pair();
            let mut bufs = vec![vec![0u8; 4096]];
            let rr = net.irecv(r, &mut bufs, &[0]);
            let sr = net.isend(s, &pattern(4096, 1), 0, &[rr]);
            assert_eq!(net.wait_error(sr, &[rr]), NcclResult::INTERNAL_ERROR);
            assert!(logged(
                |l, s| l == NCCL_LOG_WARN && s.contains("panicked: NCCL_GRDMA_TEST_PANIC=writer")
            ));
            net.close_send(s);
            net.close_recv(r);
            net.close_listen(l);
            println!("still alive after the writer's panic");
        }
        "refcount" => {
            let a = Net::init();
            let b = Net::init();
            drop(a);
            assert!(
                !logged(|_, s| s.contains("finalized")),
                "finalized with an init still open"
            );
            drop(b);
            assert!(logged(
                |l, s| l == NCCL_LOG_INFO && s.contains("finalized: sent")
            ));
        }
        "receiver_to_kill" => {
            let net = Net::init();
            let (h, l) = net.listen();
            let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
            println!("HANDLE {hex}");
            let t0 = Instant::now();
            let r = loop {
                let (rc, r) = net.accept(l);
                ok(rc, "accept");
                if !r.is_null() {
                    break r;
                }
                assert!(t0.elapsed() < DEADLINE);
            };
            let mut bufs = vec![vec![0u8; 256 << 20]];
            let rr = net.irecv(r, &mut bufs, &[1]);
            println!("POSTED");
            // Receive slowly until killed.
            let t0 = Instant::now();
            while t0.elapsed() < DEADLINE {
                let _ = net.test(rr);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn assert_child_ok(out: &std::process::Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{err}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

#[test]
fn injected_faults_are_repaired_exactly() {
    let out = child("repair", &[("NCCL_GRDMA_TEST_INJECT_FAULTS", "3")]);
    let err = assert_child_ok(&out, "repair at 1 in 3");
    let line = err
        .lines()
        .find(|l| l.contains("receive comm from") && l.contains("closed"))
        .expect("the receiver's counters line");
    let repaired: u64 = line
        .split(" pieces sent again after a failed CRC32C")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect(line);
    assert!(repaired > 5, "{line}");
    assert!(
        err.contains("corrupted on purpose"),
        "the sender counts its injections"
    );
}

/// Small sends are done once written (the plugin keeps a copy until the ack): with 1
/// piece in 3 corrupted, each send's buffer scribbled over once it is done and its
/// comm closed at once, every receive still completes exactly, repaired from the copy.
#[test]
fn a_send_done_before_its_ack_is_repaired_from_its_copy() {
    let out = child(
        "close_after_kept_sends",
        &[
            ("NCCL_GRDMA_TEST_INJECT_FAULTS", "3"),
            ("NCCL_GRDMA_TRACE", "1"),
        ],
    );
    let err = assert_child_ok(&out, "kept copies with faults, closed at once");
    let repaired: u64 = err
        .lines()
        .filter(|l| l.contains("receive comm from") && l.contains("closed"))
        .filter_map(|l| {
            l.split(" pieces sent again after a failed CRC32C")
                .next()
                .and_then(|s| s.rsplit(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum();
    assert!(repaired > 0, "nothing was repaired:\n{err}");
}

/// Eager messages (sent before their receive) with 1 piece in 3 corrupted: repaired
/// from the bounce buffer before the send completes, placed exactly (the child checks
/// the bytes); with NCCL_GRDMA_TRACE=1 each request's steps are in NCCL's log, for the
/// first 200 requests of a comm only. Placed by the sender's match frames (the default).
#[test]
fn eager_sends_are_repaired_and_traced() {
    eager_sends_traced(
        &[],
        &[
            // The sender's match frame says where each eager message goes.
            "eager 0 matched to 1/0",
            "match frame to 1/0 written",
        ],
    );
}

/// The same with `NCCL_GRDMA_EAGER_BY_NUMBER=1`: an eager message for a receive of one
/// buffer is placed by the receiver by its number, a grouped receive's by a match frame.
#[test]
fn eager_sends_placed_by_number_are_repaired_and_traced() {
    eager_sends_traced(
        &[("NCCL_GRDMA_EAGER_BY_NUMBER", "1")],
        &[
            // A receive of one buffer: the receiver places its eager message by number.
            "eager 0 matched to 1/0 (placed by the receiver)",
            "eager 0 is message 0: buffer 0 of receive 1",
            // A grouped receive (5 and 6 are): the sender's match frame says which buffer.
            "eager 4 matched to 5/0",
            "match frame to 5/0 written",
        ],
    );
}

/// By number, an eager message whose receive was posted before its first piece lands
/// in NCCL's buffer directly (no bounce buffer, no copy); its corrupt pieces are sent
/// again into the same place, and every message arrives exactly (the child checks).
#[test]
fn eager_messages_whose_receive_is_posted_land_in_place_and_are_repaired_there() {
    let out = child(
        "eager_in_place",
        &[
            ("NCCL_GRDMA_EAGER_BY_NUMBER", "1"),
            ("NCCL_GRDMA_EAGER_MAX", "4194304"),
            ("NCCL_GRDMA_TEST_INJECT_FAULTS", "3"),
            ("NCCL_GRDMA_TRACE", "1"),
        ],
    );
    let err = assert_child_ok(&out, "eager messages in place with faults");
    let in_place = err.matches("landed in place in buffer").count();
    assert!(
        in_place >= 4,
        "fewer than 4 eager messages landed in place in 50 rounds:\n{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("receive comm from") && l.contains("closed"))
        .expect("the receiver's counters line");
    assert!(
        !line.contains(" 0 pieces sent again after a failed CRC32C"),
        "{line}"
    );
}

fn eager_sends_traced(env: &[(&str, &str)], placing: &[&str]) {
    let mut all = vec![
        ("NCCL_GRDMA_TEST_INJECT_FAULTS", "3"),
        ("NCCL_GRDMA_TRACE", "1"),
        ("NCCL_GRDMA_EAGER_MAX", "4194304"),
    ];
    all.extend_from_slice(env);
    let out = child("eager", &all);
    let err = assert_child_ok(&out, "eager sends with faults and the trace");
    let line = err
        .lines()
        .find(|l| l.contains("receive comm from") && l.contains("closed"))
        .expect("the receiver's counters line");
    assert!(
        !line.contains(" 0 pieces sent again after a failed CRC32C"),
        "{line}"
    );
    for want in [
        "trace send req 0 +",
        "isend 1024 B tag 5 eager 0/255",
        "first byte written",
        "last byte written",
        "ack received",
        "clear-to-send 1 received",
        "trace recv req 0 +",
        "clear-to-send 1 sent",
        "last byte read into the bounce buffer, ack sent",
        "eager 0 copied into buffer 0",
        "first byte read",
        "test done",
        "trace send req 199 +",
    ]
    .iter()
    .chain(placing)
    {
        assert!(err.contains(want), "no trace line with {want:?}");
    }
    // Each line names its comm, and the send comm's lines are not the receive comm's.
    let comm_of = |side: &str| {
        let line = (err.lines())
            .find(|l| l.contains(&format!("trace {side} req 0 +")))
            .unwrap_or_default();
        let at = line.find("[comm ").map(|i| &line[i..]).unwrap_or_default();
        at.split(']').next().unwrap_or_default().to_string()
    };
    let (send, recv) = (comm_of("send"), comm_of("recv"));
    assert!(
        send.starts_with("[comm ") && recv.starts_with("[comm ") && send != recv,
        "the trace's comm numbers: send {send:?}, receive {recv:?}"
    );
    if env.is_empty() {
        assert!(
            !err.contains("placed by the receiver"),
            "placed by number while NCCL_GRDMA_EAGER_BY_NUMBER is unset"
        );
    }
    assert!(
        !err.contains("trace send req 200 ") && !err.contains("trace recv req 200 "),
        "traced past the first 200 requests"
    );
}

#[test]
fn every_piece_corrupt_fails_in_bounded_time() {
    let out = child(
        "every_piece_corrupt",
        &[("NCCL_GRDMA_TEST_INJECT_FAULTS", "1")],
    );
    let err = assert_child_ok(&out, "inject 1 in 1");
    assert!(
        err.contains("failed its CRC32C at the receiver 9 times"),
        "{err}"
    );
}

/// As above with nothing sent eagerly, so the message goes to its posted receive's
/// buffer (not a bounce buffer): every attempt's bytes are corrupt, and none may reach
/// NCCL's buffer (`comm::recv`'s `must_stage`; read in place, they did).
#[test]
fn corrupt_bytes_never_reach_a_posted_buffer() {
    let out = child(
        "every_piece_corrupt",
        &[
            ("NCCL_GRDMA_TEST_INJECT_FAULTS", "1"),
            ("NCCL_GRDMA_EAGER_MAX", "0"),
        ],
    );
    let err = assert_child_ok(&out, "inject 1 in 1, nothing eager");
    assert!(
        err.contains("failed its CRC32C at the receiver 9 times"),
        "{err}"
    );
}

#[test]
fn checks_off_still_carries_data() {
    let out = child(
        "checks_off",
        &[
            ("NCCL_GRDMA_CHECKS", "0"),
            ("NCCL_GRDMA_TEST_INJECT_FAULTS", "2"),
        ],
    );
    let err = assert_child_ok(&out, "checks off");
    assert!(err.contains("checks off"), "{err}");
    assert!(
        err.contains("INJECT_FAULTS ignored"),
        "no corruption without the checks"
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("a sender that closed at once: every message received"),
        "{said}"
    );
}

#[test]
fn a_panic_becomes_an_internal_error() {
    let out = child("panic", &[("NCCL_GRDMA_TEST_PANIC", "devices")]);
    assert_child_ok(&out, "panic");
    assert!(String::from_utf8_lossy(&out.stdout).contains("still alive after the panic"));
}

#[test]
fn a_panic_in_an_io_thread_fails_the_comm() {
    let out = child("panic_writer", &[("NCCL_GRDMA_TEST_PANIC", "writer")]);
    assert_child_ok(&out, "a writer thread's panic");
    assert!(String::from_utf8_lossy(&out.stdout).contains("still alive after the writer's panic"));
}

/// `NCCL_GRDMA_SPEED` sets the speed of an interface without one in sysfs (`lo` here);
/// a value that is not Mbit/s fails `init` with a line that says so.
#[test]
fn the_speed_of_an_interface_without_one_can_be_given() {
    let out = child("speed", &[("NCCL_GRDMA_SPEED", "25000")]);
    assert_child_ok(&out, "speed");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("init=0") && said.contains("speed=25000"),
        "{said}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("[0]lo:127.0.0.1 (25000 Mbit/s from NCCL_GRDMA_SPEED)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = child("speed", &[("NCCL_GRDMA_SPEED", "fast")]);
    assert_child_ok(&out, "speed");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        !said.contains("init=0") && !said.contains("speed="),
        "{said}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NCCL_GRDMA_SPEED=\"fast\": expected Mbit/s"),
        "{err}"
    );
}

#[test]
fn init_is_reference_counted() {
    let out = child("refcount", &[]);
    assert_child_ok(&out, "refcount");
}

#[test]
fn a_killed_receiver_is_an_error_not_a_hang() {
    use std::io::BufRead;
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_scenario",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GRDMA_CHILD", "receiver_to_kill")
        .env("NCCL_GRDMA_PLUGIN", plugin_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(c.stdout.take().unwrap()).lines();
    let handle_line = lines
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.contains("HANDLE "))
        .expect("the child's handle");
    // libtest's "test child_scenario ... " may precede it on the line.
    let hex = handle_line.split("HANDLE ").nth(1).unwrap().trim();
    let mut h = [0u8; 128];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let net = Net::init();
    let t0 = Instant::now();
    let s = loop {
        let (rc, s) = net.connect(&mut h);
        ok(rc, "connect");
        if !s.is_null() {
            break s;
        }
        assert!(t0.elapsed() < DEADLINE);
    };
    assert!(lines.any(|l| l.unwrap().contains("POSTED")));
    let msg = pattern(256 << 20, 3);
    let sr = net.isend(s, &msg, 1, &[]);
    // Part of the message goes out, then the receiver dies. (Its reader threads drain
    // the sockets on their own, so the kill comes early: 256 MiB take longer than this.)
    for _ in 0..5 {
        let (rc, done, _) = net.test(sr);
        ok(rc, "test before the kill");
        assert!(!done);
        std::thread::sleep(Duration::from_millis(1));
    }
    // SIGKILL to the child this test spawned (its pid, nothing else).
    c.kill().expect("kill the receiver");
    let _ = c.wait();
    let rc = net.wait_error(sr, &[]);
    assert!(
        rc == NcclResult::REMOTE_ERROR || rc == NcclResult::SYSTEM_ERROR,
        "{rc:?}"
    );
    net.close_send(s);
}

/// Raw comm pointers moved to the thread that drives them (one thread per comm, as
/// NCCL's proxy threads do).
struct SendPtr(*mut c_void);
// SAFETY: a comm is used by one thread at a time; the pointer only moves.
unsafe impl Send for SendPtr {}

/// Loopback throughput, a sender thread and a receiver thread, `depth` messages in
/// flight as NCCL keeps them (`NCCL_STEPS` = 8). Prints one JSON line per size.
/// Not a CI test (numbers depend on the machine): `cargo test -p nccl-net --test
/// harness -- --ignored bench_loopback --nocapture`.
#[test]
#[ignore = "a benchmark: run by hand"]
fn bench_loopback() {
    let net = Net::init();
    let (s, r, l) = net.pair();
    // (size, bytes in all, messages in flight): the first row is one small message at a
    // time, a round trip's latency (NCCL's small sends); the rest NCCL's 8 steps.
    // GRDMA_BENCH_SCALE=N divides the bytes of every row (a slow machine, a guest).
    let scale: usize = std::env::var("GRDMA_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    for (size, total, depth) in [
        (4usize << 10, 40usize << 20, 1usize),
        (128 << 10, 1 << 30, 8),
        (512 << 10, 2 << 30, 8),
        (4 << 20, 2 << 30, 8),
        (64 << 20, 2 << 30, 8),
    ] {
        let iters = (total / scale / size).max(depth);
        let (sp, rp) = (SendPtr(s), SendPtr(r));
        // The buffers made (and, over verbs, registered) before the clock starts, as
        // NCCL's are before its first message.
        let mut bufs: Vec<Vec<Vec<u8>>> = (0..depth).map(|_| vec![vec![0u8; size]]).collect();
        let msg = pattern(size, 1);
        for b in bufs.iter_mut() {
            net.mr(r, b[0].as_mut_ptr(), size);
        }
        net.mr(s, msg.as_ptr() as *mut u8, size);
        let t0 = Instant::now();
        let recv = std::thread::spawn(move || {
            let net = Net::for_another_thread();
            let rp = rp;
            let mut bufs = bufs;
            let mut inflight: Vec<Option<*mut c_void>> = vec![None; depth];
            let (mut posted, mut done) = (0, 0);
            while done < iters {
                let mut moved = false;
                for k in 0..depth {
                    match inflight[k] {
                        None if posted < iters => {
                            let req = net.irecv(rp.0, &mut bufs[k], &[0]);
                            if !req.is_null() {
                                inflight[k] = Some(req);
                                posted += 1;
                                moved = true;
                            }
                        }
                        Some(req) => {
                            let (rc, d, _) = net.test(req);
                            ok(rc, "test recv");
                            if d {
                                inflight[k] = None;
                                done += 1;
                                moved = true;
                            }
                        }
                        None => {}
                    }
                }
                if !moved {
                    // NCCL's proxy thread yields when a round progressed nothing.
                    std::thread::yield_now();
                }
            }
            bufs
        });
        let mut inflight: Vec<Option<*mut c_void>> = vec![None; depth];
        let (mut posted, mut done) = (0, 0);
        while done < iters {
            let mut moved = false;
            for slot in inflight.iter_mut() {
                match *slot {
                    None if posted < iters => {
                        let (rc, req) = net.isend_once(sp.0, &msg, 0);
                        ok(rc, "isend");
                        if !req.is_null() {
                            *slot = Some(req);
                            posted += 1;
                            moved = true;
                        }
                    }
                    Some(req) => {
                        let (rc, d, _) = net.test(req);
                        ok(rc, "test send");
                        if d {
                            *slot = None;
                            done += 1;
                            moved = true;
                        }
                    }
                    None => {}
                }
            }
            if !moved {
                std::thread::yield_now();
            }
        }
        let bufs = recv.join().unwrap();
        let secs = t0.elapsed().as_secs_f64();
        let gbps = (size * iters) as f64 / secs / 1e9;
        let plain = plain_socket_gbps(size, size * iters, depth);
        println!(
            "{{\"size\": {size}, \"depth\": {depth}, \"messages\": {iters}, \"seconds\": {secs:.3}, \"us_per_message\": {:.1}, \"GBps\": {gbps:.3}, \"plain_socket_GBps\": {plain:.3}, \"vs_plain_socket\": {:.2}}}",
            secs * 1e6 / iters as f64,
            gbps / plain
        );
        // The row's buffers go: their registrations first.
        for b in &bufs {
            net.forget(r, b[0].as_ptr());
        }
        net.forget(s, msg.as_ptr());
        drop(bufs);
    }
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

/// The benchmarks' reference, run beside them: one plain TCP socket over loopback
/// carrying `bytes` in messages of `size`, the reader answering each with one byte and
/// the writer keeping at most `depth` unanswered (as the plugin's requests complete
/// when the receiver acks); no CRC, no threads but the two: the kernel's bound for one
/// stream doing the same exchange on this machine, in GB/s (the best of three runs: on
/// a small machine one run may share a core with the other's thread).
fn plain_socket_gbps(size: usize, bytes: usize, depth: usize) -> f64 {
    (0..3)
        .map(|_| plain_socket_once(size, bytes, depth))
        .fold(0.0, f64::max)
}

fn plain_socket_once(size: usize, bytes: usize, depth: usize) -> f64 {
    use std::io::{Read, Write as _};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let messages = bytes.div_ceil(size);
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = vec![0u8; size];
        for k in 0..messages {
            let n = (bytes - k * size).min(size);
            s.read_exact(&mut buf[..n]).unwrap();
            s.write_all(&[1]).unwrap();
        }
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let msg = pattern(size, 3);
    let t0 = Instant::now();
    let mut acked = 0;
    let mut ack = [0u8; 1];
    for k in 0..messages {
        if k - acked >= depth {
            s.read_exact(&mut ack).unwrap();
            acked += 1;
        }
        s.write_all(&msg[..(bytes - k * size).min(size)]).unwrap();
    }
    while acked < messages {
        s.read_exact(&mut ack).unwrap();
        acked += 1;
    }
    reader.join().unwrap();
    bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// NCCL's pipeline at its defaults, as the plugin sees it: 128 KiB messages, 8 steps in
/// flight on each side; the receiver posts the receive of step k only once the "GPU"
/// consumed step k-8 (a wait of `GRDMA_BENCH_CONSUME_US`, 20 by default, per step,
/// one step after another), so the sender runs ahead of the receives and its messages
/// go eagerly, into the receiver's bounce buffers, as they do under NCCL. Prints one
/// JSON line. Not a CI test: `cargo test --release -p nccl-net --test harness --
/// --ignored bench_steps --nocapture` (`NCCL_GRDMA_PLUGIN` picks the build to try).
#[test]
#[ignore = "a benchmark: run by hand"]
fn bench_steps() {
    let env = |k: &str, d: usize| -> usize {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (size, depth) = (env("GRDMA_BENCH_SIZE", 128 << 10), 8usize);
    let iters = env("GRDMA_BENCH_BYTES", 1 << 30) / size;
    let consume = Duration::from_micros(env("GRDMA_BENCH_CONSUME_US", 20) as u64);
    let net = Net::init();
    let (s, r, l) = net.pair();
    let (sp, rp) = (SendPtr(s), SendPtr(r));
    let mut bufs: Vec<Vec<Vec<u8>>> = (0..depth).map(|_| vec![vec![0u8; size]]).collect();
    let msgs: Vec<Vec<u8>> = (0..depth).map(|k| pattern(size, k as u64)).collect();
    for b in bufs.iter_mut() {
        net.mr(r, b[0].as_mut_ptr(), size);
    }
    for m in &msgs {
        net.mr(s, m.as_ptr() as *mut u8, size);
    }
    let t0 = Instant::now();
    let recv = std::thread::spawn(move || {
        let net = Net::for_another_thread();
        let rp = rp;
        let mut bufs = bufs;
        // Step k uses slot k % depth; it may be posted once step k - depth was consumed.
        let mut free_at: Vec<Instant> = vec![Instant::now(); depth];
        let mut gpu_free = Instant::now();
        let mut posted: std::collections::VecDeque<(usize, *mut c_void)> = Default::default();
        let (mut next, mut done) = (0usize, 0usize);
        while done < iters {
            assert!(t0.elapsed() < DEADLINE * 4, "bench_steps did not finish");
            let mut moved = false;
            if next < iters && posted.len() < depth && Instant::now() >= free_at[next % depth] {
                let k = next % depth;
                let req = net.irecv(rp.0, &mut bufs[k], &[0]);
                if !req.is_null() {
                    posted.push_back((next, req));
                    next += 1;
                    moved = true;
                }
            }
            if let Some(&(step, req)) = posted.front() {
                let (rc, d, sizes) = net.test(req);
                ok(rc, "test recv");
                if d {
                    assert_eq!(sizes[0] as usize, size);
                    posted.pop_front();
                    gpu_free = gpu_free.max(Instant::now()) + consume;
                    free_at[step % depth] = gpu_free;
                    done += 1;
                    moved = true;
                }
            }
            if !moved {
                std::thread::yield_now();
            }
        }
        bufs
    });
    let mut inflight: std::collections::VecDeque<*mut c_void> = Default::default();
    let (mut posted, mut done) = (0usize, 0usize);
    while done < iters {
        let mut moved = false;
        if posted < iters && inflight.len() < depth {
            let (rc, req) = net.isend_once(sp.0, &msgs[posted % depth], 0);
            ok(rc, "isend");
            if !req.is_null() {
                inflight.push_back(req);
                posted += 1;
                moved = true;
            }
        }
        if let Some(&req) = inflight.front() {
            let (rc, d, _) = net.test(req);
            ok(rc, "test send");
            if d {
                inflight.pop_front();
                done += 1;
                moved = true;
            }
        }
        if !moved {
            std::thread::yield_now();
        }
    }
    let bufs = recv.join().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    for (k, b) in bufs.iter().enumerate() {
        // The last message each slot took: step iters-depth+j went to slot (that) % depth.
        let last = (0..iters).rev().find(|i| i % depth == k).unwrap();
        assert!(b[0] == msgs[last % depth], "slot {k} holds the wrong bytes");
    }
    let gbps = (size * iters) as f64 / secs / 1e9;
    let plain = plain_socket_gbps(size, size * iters, depth);
    println!(
        "{{\"bench\": \"steps\", \"size\": {size}, \"depth\": {depth}, \"consume_us\": {}, \"messages\": {iters}, \"seconds\": {secs:.3}, \"us_per_message\": {:.1}, \"GBps\": {gbps:.3}, \"plain_socket_GBps\": {plain:.3}, \"plugin\": {:?}}}",
        consume.as_micros(),
        secs * 1e6 / iters as f64,
        plugin_path().display().to_string()
    );
    for b in &bufs {
        net.forget(r, b[0].as_ptr());
    }
    for m in &msgs {
        net.forget(s, m.as_ptr());
    }
    net.close_send(s);
    net.close_recv(r);
    net.close_listen(l);
}

// ---- Over RDMA verbs: the same scenarios in a child whose plugin goes over verbs ----

/// The first RDMA device's network interface, where there is one (Soft-RoCE in the
/// guests of tests/nccl/verbs-guest.sh; a real NIC elsewhere). None: no RDMA device
/// on this machine, and the verbs tests say so and skip.
fn rdma_interface() -> Option<String> {
    let devs = std::fs::read_dir("/sys/class/infiniband").ok()?;
    for d in devs.flatten() {
        let ndev = d.path().join("ports/1/gid_attrs/ndevs/0");
        if let Ok(name) = std::fs::read_to_string(ndev) {
            let name = name.trim().to_string();
            if !name.is_empty() {
                return Some(name);
            }
        }
    }
    None
}

/// A child scenario over verbs on the RDMA device's interface, with `env` besides;
/// None (and a line saying why) where this machine has no RDMA device.
fn verbs_child(scenario: &str, env: &[(&str, &str)]) -> Option<std::process::Output> {
    let Some(ifname) = rdma_interface() else {
        // Straight to stderr, past libtest's capture (as tests/src/lib.rs's `skip`), so
        // the reason shows beside the test's `ok`.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {scenario} over verbs: no RDMA device here (/sys/class/infiniband has \
             none with a network interface); tests/nccl/verbs-guest.sh runs it in a \
             Soft-RoCE guest"
        );
        return None;
    };
    let mut all = vec![
        ("NCCL_GRDMA_TRANSPORT", "verbs"),
        ("NCCL_SOCKET_IFNAME", ifname.as_str()),
    ];
    all.extend_from_slice(env);
    Some(child(scenario, &all))
}

#[test]
fn verbs_sizes_in_flight_tags_and_refusals() {
    let Some(out) = verbs_child("verbs_basics", &[]) else {
        return;
    };
    let err = assert_child_ok(&out, "the shared cases over verbs");
    assert!(
        err.contains("(verbs on "),
        "the devices were verbs ones: {err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("verbs basics passed"));
}

#[test]
fn verbs_injected_faults_are_repaired_exactly() {
    let Some(out) = verbs_child("repair", &[("NCCL_GRDMA_TEST_INJECT_FAULTS", "3")]) else {
        return;
    };
    // The child checked every byte of 20 messages; over verbs a message is checked and
    // written again whole (its bytes go straight from NCCL's buffer), so at 1 in 3 about
    // 7 of them are repaired, each counted once by both ends.
    let err = assert_child_ok(&out, "repair at 1 in 3 over verbs");
    let counted = |who: &str| -> (u64, String) {
        let line = err
            .lines()
            .find(|l| l.contains(who) && l.contains("over verbs closed"))
            .unwrap_or_else(|| panic!("no counters line of the {who}: {err}"))
            .to_string();
        let n = line
            .split(" pieces sent again after a failed CRC32C")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .expect(&line);
        (n, line)
    };
    let (received, line) = counted("receive comm from");
    let (sent, sline) = counted("send comm to");
    assert!(received >= 1, "{line}");
    assert_eq!(
        received, sent,
        "both ends count the same repairs: {line} / {sline}"
    );
    let injected: u64 = sline
        .split(" corrupted on purpose")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the sender counts its injections: {sline}"));
    assert!(injected >= received, "{sline}");
}

#[test]
fn verbs_every_message_corrupt_fails_in_bounded_time() {
    let Some(out) = verbs_child(
        "every_piece_corrupt",
        &[("NCCL_GRDMA_TEST_INJECT_FAULTS", "1")],
    ) else {
        return;
    };
    let err = assert_child_ok(&out, "inject 1 in 1 over verbs");
    assert!(
        err.contains("failed its CRC32C at the receiver 9 times"),
        "{err}"
    );
}

#[test]
fn verbs_small_receives_past_the_staging_buffers_wait_then_land_exact() {
    let Some(out) = verbs_child("staging_full", &[]) else {
        return;
    };
    let err = assert_child_ok(&out, "receives past the staging buffers over verbs");
    assert!(err.contains("a further small receive waits"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("every byte arrived"));
}

#[test]
fn verbs_checks_off_still_carries_data() {
    let Some(out) = verbs_child("checks_off", &[("NCCL_GRDMA_CHECKS", "0")]) else {
        return;
    };
    let err = assert_child_ok(&out, "checks off over verbs");
    assert!(err.contains("checks off"), "{err}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("a sender that closed at once: every message received"),
        "{said}"
    );
}

#[test]
fn verbs_a_killed_receiver_is_an_error_not_a_hang() {
    let Some(out) = verbs_child("killed_receiver", &[]) else {
        return;
    };
    assert_child_ok(&out, "a receiver killed mid-message over verbs");
    assert!(String::from_utf8_lossy(&out.stdout).contains("killed receiver seen"));
}
