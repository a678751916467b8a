//! The comms NCCL holds: a listen comm (`listen`, `accept`), a connection in progress
//! (`connect`, kept between calls through the handle), and the send and receive comms
//! with their requests. Each send and receive comm has its own I/O threads, one per
//! data socket and one for the control socket (`threads`), which move the bytes
//! between NCCL's buffers and the sockets, take and check the CRCs and answer the peer
//! at once; NCCL's calls (`isend`, `irecv`, `test`) only look at and change the comm's
//! shared state under its lock, and never wait on a socket.
//!
//! NCCL's contract, relied on throughout: one comm is used by one thread at a time; a
//! buffer handed to `isend`/`irecv` stays valid and untouched until `test` reports its
//! request done; at most `NCCL_NET_MAX_REQUESTS` requests per comm are in flight.

pub mod connect;
pub mod listen;
pub mod recv;
pub mod send;
pub mod threads;

use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::error::{NetError, Result};
use std::ffi::c_void;

/// The first field of each object this plugin hands NCCL as a `void*`, checked on
/// every call so that a pointer of the wrong kind is an error and not a crash later.
pub const LISTEN_MAGIC: u64 = u64::from_le_bytes(*b"grdListn");
pub const SEND_MAGIC: u64 = u64::from_le_bytes(*b"grdSendC");
pub const RECV_MAGIC: u64 = u64::from_le_bytes(*b"grdRecvC");
pub const REQUEST_MAGIC: u64 = u64::from_le_bytes(*b"grdReqst");
/// The verbs comms' (`crate::verbs`).
pub const SEND_MAGIC_VERBS: u64 = u64::from_le_bytes(*b"grdVSend");
pub const RECV_MAGIC_VERBS: u64 = u64::from_le_bytes(*b"grdVRecv");

/// Times one piece may fail its CRC before the sender gives up on the message.
pub const MAX_RESENDS: u16 = 8;

/// What NCCL holds as a request: which comm, which of its slots. Allocated once per
/// comm (all 32), freed when the comm closes; the comm's slot holds the state.
#[repr(C)]
pub struct RequestHandle {
    pub magic: u64,
    pub send: bool,
    pub comm: *mut c_void,
    pub index: usize,
}

/// The comm's request handles, at addresses that stay put while the comm lives.
pub struct Handles(*mut [RequestHandle; NCCL_NET_MAX_REQUESTS]);

impl Handles {
    pub fn new(send: bool, comm: *mut c_void) -> Self {
        let arr: [RequestHandle; NCCL_NET_MAX_REQUESTS] =
            std::array::from_fn(|index| RequestHandle {
                magic: REQUEST_MAGIC,
                send,
                comm,
                index,
            });
        // A raw pointer, not a Box field, so that a `&mut` to the comm does not claim
        // the handles NCCL reads through its own pointers.
        Self(Box::into_raw(Box::new(arr)))
    }

    pub fn ptr(&self, index: usize) -> *mut c_void {
        // SAFETY: `self.0` is a live allocation of NCCL_NET_MAX_REQUESTS handles
        // until drop; `index` is a slot number below that (the callers' slots).
        unsafe { std::ptr::addr_of_mut!((*self.0)[index]) as *mut c_void }
    }
}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: allocated by Box::into_raw in `new`, freed once here.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// Whether `a..a + a_len` and `b..b + b_len` share a byte.
pub fn overlaps(a: usize, a_len: u64, b: usize, b_len: usize) -> bool {
    let a_end = a.saturating_add(usize::try_from(a_len).unwrap_or(usize::MAX));
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a_end
}

/// Finds a free request slot.
pub fn free_slot<T>(slots: &[Option<T>]) -> Option<usize> {
    slots.iter().position(Option::is_none)
}

/// A random 64-bit value for tokens and ids (from the kernel's generator).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut c_void, 8, 0) };
    if n == 8 {
        return u64::from_le_bytes(b);
    }
    // No getrandom (very old kernels): time and address, still unlikely to collide.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((&b as *const _ as u64) << 16) ^ std::process::id() as u64
}

/// Whether `p` is a live object of ours with `magic` (the error says what it is not).
///
/// # Safety
/// `p` must be null or a pointer this plugin handed NCCL that NCCL has not closed.
unsafe fn check_magic(p: *mut c_void, magic: u64, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(NetError::invalid(format!("{what} is null")));
    }
    // SAFETY: every object we hand out starts with a u64 magic (repr(C)); reading it
    // is valid for any pointer of ours, and the caller promised it is one.
    if unsafe { *(p as *const u64) } != magic {
        return Err(NetError::invalid(format!(
            "{what} {p:?} is not a {what} of this plugin"
        )));
    }
    Ok(())
}

/// NCCL's `void*` as one of our objects, after checking its magic.
///
/// # Safety
/// `p` must be null or a pointer this plugin handed NCCL that NCCL has not closed.
pub unsafe fn checked<'a, T>(p: *mut c_void, magic: u64, what: &str) -> Result<&'a mut T> {
    // SAFETY: the caller's promise, passed on.
    unsafe { check_magic(p, magic, what) }?;
    // SAFETY: the caller promised a live object of ours; the magic says it is a T (the
    // kinds share no magic). Exclusive: what is reached this way (listen comms,
    // requests, registrations, and a comm NCCL closes) NCCL uses from one thread at a
    // time. The comms, which NCCL may reach from two threads at once (regMr/deregMr on
    // its service thread while its progress thread tests), go through
    // [`checked_shared`]; a comm is taken whole only by its close, after its last use.
    Ok(unsafe { &mut *(p as *mut T) })
}

/// NCCL's `void*` as one of our objects, shared: for the comms, which NCCL may use from
/// two threads at once (`regMr`/`deregMr` on its service thread while its progress
/// thread tests), and whose methods NCCL calls take `&self` (their state behind a
/// `Mutex`).
///
/// # Safety
/// As for [`checked`].
pub unsafe fn checked_shared<'a, T>(p: *mut c_void, magic: u64, what: &str) -> Result<&'a T> {
    // SAFETY: the caller's promise, passed on.
    unsafe { check_magic(p, magic, what) }?;
    // SAFETY: a live T of ours (the magic says which kind), reached only through shared
    // references while NCCL may use it from two threads (never `&mut`: see `checked`).
    Ok(unsafe { &*(p as *const T) })
}

/// NCCL's `void*` taken back as the box it was made from, after checking its magic:
/// NCCL is closing it.
///
/// # Safety
/// As for [`checked`]; besides, `p` came from `Box::into_raw` of a `Box<T>` (every
/// object this plugin hands NCCL does), and nothing uses it after this (NCCL closes an
/// object once).
pub unsafe fn taken<T>(p: *mut c_void, magic: u64, what: &str) -> Result<Box<T>> {
    // SAFETY: the caller's promise, as checked() asks it.
    let r: &mut T = unsafe { checked(p, magic, what)? };
    // SAFETY: made by Box::into_raw (the caller's promise), used by nobody after.
    Ok(unsafe { Box::from_raw(r as *mut T) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges_overlap_only_where_they_share_a_byte() {
        use super::overlaps;
        assert!(overlaps(100, 10, 105, 1));
        assert!(overlaps(100, 10, 90, 11));
        assert!(!overlaps(100, 10, 90, 10));
        assert!(!overlaps(100, 10, 110, 5));
        assert!(!overlaps(100, 0, 100, 5));
        assert!(overlaps(usize::MAX - 4, 10, usize::MAX - 1, 1));
    }

    use super::recv::RecvComm;
    use super::send::SendComm;
    use crate::config::Config;
    use crate::wire::Handle;
    use socket2::Socket;
    use std::net::{TcpListener, TcpStream};

    /// `n` connected loopback pairs, non-blocking as connect and accept make them.
    fn pairs(n: usize) -> (Vec<Socket>, Vec<Socket>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            for x in [&c, &s] {
                x.set_nonblocking(true).unwrap();
            }
            a.push(Socket::from(c));
            b.push(Socket::from(s));
        }
        (a, b)
    }

    /// The sizes receive 0 of `r` took, once it is done (within 10 s).
    fn done(r: &RecvComm) -> Vec<u64> {
        let t0 = std::time::Instant::now();
        loop {
            match r.test(0) {
                Ok(Some(sizes)) => return sizes,
                Ok(None) => {}
                Err(e) => panic!("the receive failed: {e}"),
            }
            assert!(t0.elapsed().as_secs() < 10, "the receive never completed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_dropped_comm_stops_its_threads() {
        let (mut tx, mut rx) = pairs(3);
        let cfg = Config {
            streams: Some(2),
            checks: true,
            inject_one_in: None,
            eager_max: crate::config::DEFAULT_EAGER_MAX,
            eager_by_number: false,
        };
        let handle = Handle {
            addr: "127.0.0.1:9".parse().unwrap(),
            streams: 2,
            token: 1,
            verbs: false,
            by_number: false,
        };
        let s = SendComm::new(tx.remove(0), tx, handle, cfg).unwrap();
        let r = RecvComm::new(rx.remove(0), rx, false).unwrap();
        let (ws, wr) = (s.shared_weak(), r.shared_weak());
        // Dropped, not closed (an error path): the threads, which hold the shared
        // state, must be gone when the drop returns.
        drop(s);
        drop(r);
        assert!(ws.upgrade().is_none(), "a send comm's threads outlived it");
        assert!(
            wr.upgrade().is_none(),
            "a receive comm's threads outlived it"
        );
    }

    /// A sender that sent an eager message, then its match frame, then closed: one of
    /// its data sockets (an empty one) is seen closed before the other delivers the
    /// match frame. The receive still completes with the bytes; the comm counts as
    /// closed only once every data socket is (CI caught the receive failing first).
    #[test]
    fn a_sender_closing_after_its_last_message_does_not_fail_that_receive() {
        use crate::wire::{PieceHeader, EAGER_SLOT};
        use std::io::Write;
        let (mut tx, mut rx) = pairs(3);
        let mut r = RecvComm::new(rx.remove(0), rx, false).unwrap();
        let msg: Vec<u8> = (0..100u8).collect();
        let piece = PieceHeader {
            matched: false,
            checked: true,
            slot: EAGER_SLOT,
            attempt: 0,
            cts_id: 0,
            piece: 0,
            pieces: 1,
            total: 100,
            offset: 0,
            len: 100,
            crc: crate::integrity::crc32c(&msg),
            index: 0,
            tag: 5,
        };
        let (ctrl, a, b) = (tx.remove(0), tx.remove(0), tx.remove(0));
        (&a).write_all(&piece.encode()).unwrap();
        (&a).write_all(&msg).unwrap();
        let mut buf = vec![0u8; 4096];
        let req = r.irecv(&[(buf.as_mut_ptr(), 4096, 5)]).unwrap();
        assert!(req.is_some(), "irecv took the receive");
        // The empty socket closes first, and only then the match frame comes.
        drop(b);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let frame = PieceHeader {
            matched: true,
            checked: false,
            slot: 0,
            cts_id: 1,
            offset: 0,
            pieces: 0,
            total: 0,
            len: 0,
            crc: 0,
            tag: 0,
            ..piece
        };
        (&a).write_all(&frame.encode()).unwrap();
        drop(a);
        drop(ctrl);
        assert_eq!(done(&r), vec![100]);
        assert_eq!(&buf[..100], &msg[..]);
        r.close();
    }

    /// Under NCCL's LL and LL128 protocols the receiving GPU reads a buffer as soon as
    /// each line's flag is there, before `test` says done: the bytes of a piece that
    /// fails its CRC32C must never reach NCCL's buffer, only the resend's good ones.
    /// (Read straight into the buffer and checked there, as before, the corrupt bytes sat
    /// in it until the resend came.)
    #[test]
    fn a_corrupt_piece_of_a_small_message_never_reaches_nccls_buffer() {
        use crate::wire::{Ctrl, PieceHeader};
        use std::io::{Read, Write};
        use std::time::{Duration, Instant};
        let (mut tx, mut rx) = pairs(2);
        let mut r = RecvComm::new(rx.remove(0), rx, false).unwrap();
        let (mut ctrl, data) = (tx.remove(0), tx.remove(0));
        // The next control frame the receiver sends (within 10 s).
        let mut got: Vec<u8> = Vec::new();
        let mut next_ctrl = || -> Ctrl {
            let t0 = Instant::now();
            loop {
                if let Some((frame, used)) = Ctrl::decode(&got).unwrap() {
                    got.drain(..used);
                    return frame;
                }
                let mut b = [0u8; 256];
                match ctrl.read(&mut b) {
                    Ok(0) => panic!("the receiver closed its control socket"),
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => panic!("reading the control socket: {e}"),
                }
                assert!(t0.elapsed().as_secs() < 10, "no control frame came");
            }
        };
        let mut buf = vec![0u8; 4096];
        let req = r.irecv(&[(buf.as_mut_ptr(), 4096, 5)]).unwrap();
        assert!(req.is_some(), "irecv took the receive");
        let Ctrl::Cts { id, .. } = next_ctrl() else {
            panic!("the first frame is not the clear-to-send")
        };
        let msg: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 1) as u8).collect();
        let good = PieceHeader {
            matched: false,
            checked: true,
            slot: 0,
            attempt: 0,
            cts_id: id,
            piece: 0,
            pieces: 1,
            total: msg.len() as u64,
            offset: 0,
            len: msg.len() as u32,
            crc: crate::integrity::crc32c(&msg),
            index: 0,
            tag: 5,
        };
        let mut corrupt = msg.clone();
        corrupt[500] ^= 0x10;
        (&data).write_all(&good.encode()).unwrap();
        (&data).write_all(&corrupt).unwrap();
        match next_ctrl() {
            Ctrl::Nack { pieces, .. } => assert_eq!(pieces, vec![0]),
            other => panic!("a corrupt piece answered with {other:?}"),
        }
        // The NACK is sent after the reader is done with the piece: whatever reached
        // NCCL's buffer is there now.
        assert!(
            buf[..msg.len()].iter().all(|&b| b == 0),
            "the corrupt piece's bytes reached NCCL's buffer before their resend"
        );
        let again = PieceHeader { attempt: 1, ..good };
        (&data).write_all(&again.encode()).unwrap();
        (&data).write_all(&msg).unwrap();
        assert_eq!(done(&r), vec![msg.len() as u64]);
        assert_eq!(&buf[..msg.len()], &msg[..]);
        r.close();
    }
}
