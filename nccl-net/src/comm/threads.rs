//! The I/O threads of one comm: spawned with the comm, stopped and joined when it
//! closes, within a bound. A thread that panics records why (the comm's next call
//! fails with it) instead of leaving the comm to hang.

use crate::log::warn;
use socket2::Socket;
use std::net::Shutdown;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long `close` waits for a comm's threads. Each looks at its stop flag at least
/// every `sock::POLL_MS`, and `close` shuts the sockets down, which wakes them at
/// once; a thread still running after this is left behind (and logged), never waited
/// on forever.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct Workers {
    handles: Vec<JoinHandle<()>>,
    exited: Arc<(Mutex<usize>, Condvar)>,
}

struct ExitMark(Arc<(Mutex<usize>, Condvar)>);

impl Drop for ExitMark {
    fn drop(&mut self) {
        let (m, c) = &*self.0;
        *m.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        c.notify_all();
    }
}

impl Workers {
    /// Starts `body` on a thread named `name`; a panic in it goes to `on_panic`.
    pub fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
        on_panic: impl FnOnce(String) + Send + 'static,
    ) -> std::io::Result<()> {
        let mark = ExitMark(self.exited.clone());
        let h = std::thread::Builder::new().name(name).spawn(move || {
            let _mark = mark;
            if let Err(p) = catch_unwind(AssertUnwindSafe(body)) {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown".into());
                on_panic(msg);
            }
        })?;
        self.handles.push(h);
        Ok(())
    }

    /// Waits up to `JOIN_TIMEOUT` for every thread (the caller raised their stop flag
    /// first); the number still running when it gave up (0: all joined).
    pub fn join(self) -> usize {
        let left = self.wait_exited();
        if left == 0 {
            for h in self.handles {
                let _ = h.join();
            }
        }
        left
    }

    /// Waits up to `JOIN_TIMEOUT` until every thread has left its body (the caller
    /// raised their stop flag first), without joining them; the number still running.
    pub fn wait_exited(&self) -> usize {
        let n = self.handles.len();
        let (m, c) = &*self.exited;
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut done = m.lock().unwrap_or_else(|p| p.into_inner());
        while *done < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return n - *done;
            }
            done = c
                .wait_timeout(done, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        0
    }
}

/// Halts a comm's threads from a shared reference (`deregMr` of a buffer a request in
/// flight uses): as [`stop_comm`], but the threads are waited for, not joined (`close`
/// joins them later). The error where some still run after [`JOIN_TIMEOUT`]: the memory
/// they may touch must not be freed.
pub fn halt_comm(
    stop: &AtomicBool,
    wake: &Condvar,
    socks: &[Arc<Socket>],
    workers: Option<&Workers>,
    comm: std::fmt::Arguments<'_>,
) -> crate::error::Result<()> {
    stop.store(true, Ordering::Relaxed);
    wake.notify_all();
    for s in socks {
        let _ = s.shutdown(Shutdown::Both);
    }
    match workers.map_or(0, Workers::wait_exited) {
        0 => Ok(()),
        left => Err(crate::error::NetError::internal(format!(
            "{comm}: {left} I/O threads still running {} s after their stop; the buffer must stay allocated",
            JOIN_TIMEOUT.as_secs()
        ))),
    }
}

/// Stops a comm's threads: its `stop` flag raised, `wake` notified (threads waiting for
/// work), its sockets shut down (which ends any wait on them at once), then a bounded
/// join; threads still running after [`JOIN_TIMEOUT`] are left behind with a warning
/// naming `comm` ("send comm to 10.0.0.6:41234").
pub fn stop_comm(
    stop: &AtomicBool,
    wake: &Condvar,
    socks: &[Arc<Socket>],
    workers: &mut Option<Workers>,
    comm: std::fmt::Arguments<'_>,
) {
    stop.store(true, Ordering::Relaxed);
    wake.notify_all();
    for s in socks {
        let _ = s.shutdown(Shutdown::Both);
    }
    if let Some(w) = workers.take() {
        let left = w.join();
        if left > 0 {
            warn!(
                "{comm}: {left} I/O threads still running {} s after close; left behind",
                JOIN_TIMEOUT.as_secs()
            );
        }
    }
}

/// How many CPUs the calling thread may run on (its threads inherit the set): for the
/// log, since NCCL runs `connect` and `accept` on its proxy threads, whose affinity it
/// may narrow. 0 if the kernel does not say.
pub fn cpus_allowed() -> usize {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most
    // its size into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 0;
        }
        libc::CPU_COUNT(&set) as usize
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpus_allowed_follows_the_threads_affinity() {
        assert!(super::cpus_allowed() >= 1);
        // A thread narrowed to the first CPU it may use sees exactly one.
        let one = std::thread::spawn(|| {
            // SAFETY: a set built with the libc macros, set on this thread only.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
                let first = (0..libc::CPU_SETSIZE as usize)
                    .find(|&c| libc::CPU_ISSET(c, &set))
                    .unwrap();
                libc::CPU_ZERO(&mut set);
                libc::CPU_SET(first, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                    0
                );
            }
            super::cpus_allowed()
        })
        .join()
        .unwrap();
        assert_eq!(one, 1);
    }
}
