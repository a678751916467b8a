//! A loopback TCP proxy that flips bits after TCP's checksums: it relays every
//! connection to a target port both ways and, in the sender-to-receiver direction only,
//! flips one bit in a given share of its 64 KiB reads, as a faulty NIC, switch or
//! memory would. Only that direction: it carries the data frames, whose CRC32Cs are
//! there to catch this; the other carries only the receiver's short control messages
//! (accept, resend requests, ack), which carry no checksum of their own (TCP's is their
//! protection), so flipping them would only test protocol errors. A read shorter than
//! 64 KiB is hit with its share of the chance (`share * len / 64 KiB`), so the error
//! rate per byte is the same however the kernel splits the stream: at 3%, a bit error
//! every ~2 MiB.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The size of a read the share is counted in.
pub const READ: usize = 64 << 10;
/// How long a relay waits for bytes before it gives its connection up.
const IDLE: Duration = Duration::from_secs(60);

pub struct FlipProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
    flips: Arc<AtomicU64>,
    accept: Option<JoinHandle<()>>,
}

impl FlipProxy {
    /// Relay connections on a port of its own to `target` on loopback, flipping one bit
    /// in `share` (0.0 to 1.0) of the 64 KiB reads from the connecting side.
    pub fn start(target: u16, share: f64, seed: u64) -> FlipProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let flips = Arc::new(AtomicU64::new(0));
        let (stop2, flips2) = (stop.clone(), flips.clone());
        let accept = std::thread::spawn(move || {
            let mut conn = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let client = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(_) => break,
                };
                conn += 1;
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                for s in [&client, &server] {
                    s.set_read_timeout(Some(IDLE)).unwrap();
                    let _ = s.set_nodelay(true);
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let rng = Rng(seed ^ conn.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                let flips = flips2.clone();
                std::thread::spawn(move || relay(client, server, share, rng, &flips));
                let none = Arc::new(AtomicU64::new(0));
                std::thread::spawn(move || relay(s2, c2, 0.0, Rng(1), &none));
            }
        });
        FlipProxy {
            port,
            stop,
            flips,
            accept: Some(accept),
        }
    }

    /// Bits flipped so far, all connections together.
    pub fn flips(&self) -> u64 {
        self.flips.load(Ordering::Relaxed)
    }
}

impl Drop for FlipProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// xorshift64*: reproducible, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Copy `from` to `to` until either ends, flipping one bit in `share` of the reads;
/// then pass the end on (a half close, so the other direction finishes its bytes).
fn relay(mut from: TcpStream, mut to: TcpStream, share: f64, mut rng: Rng, flips: &AtomicU64) {
    let mut buf = vec![0u8; READ];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if share > 0.0 && rng.unit() < share * n as f64 / READ as f64 {
            let bit = rng.next() % (n as u64 * 8);
            buf[(bit / 8) as usize] ^= 1 << (bit % 8);
            flips.fetch_add(1, Ordering::Relaxed);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
