//! What the TCP tests share: the `host` binary, a receiver child process killed by its
//! PID when dropped, a sender run to completion within a bound, and their output.
#![allow(dead_code)] // each test file uses its own part

pub mod flip;

use integration_tests::workspace_root;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub fn host_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        for var in ["TCP_HOST_BIN", "SOFTROCE_HOST_BIN"] {
            if let Some(p) = std::env::var_os(var).map(PathBuf::from) {
                if p.is_file() {
                    return p;
                }
            }
        }
        let root = workspace_root();
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            .args([
                "build",
                "--release",
                "-p",
                "host",
                "--no-default-features",
                "--target-dir",
                "target/guest",
            ])
            .status()
            .expect("running cargo to build host");
        assert!(status.success(), "building host failed");
        root.join("target/guest/release/host")
    })
    .clone()
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock();
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The port of the first `listening on ADDRESS:PORT` line of a receiver's output.
pub fn listening_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("listening on "))?;
    let address = line
        .split("listening on ")
        .nth(1)?
        .split_whitespace()
        .next()?;
    address
        .rsplit(':')
        .next()?
        .trim_end_matches(',')
        .parse()
        .ok()
}

/// A `host recv --transport tcp` child, killed (by its PID) when dropped.
pub struct Receiver {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
}

impl Receiver {
    pub fn start(extra: &[&str]) -> Receiver {
        Receiver::start_limited(None, extra)
    }

    /// With `files`: under an open-files limit of that many (`ulimit -n`, then `exec`,
    /// so the PID is the receiver's).
    pub fn start_limited(files: Option<u32>, extra: &[&str]) -> Receiver {
        let wrapper = files.map(|n| {
            vec![
                "sh".to_string(),
                "-c".to_string(),
                format!("ulimit -n {n} && exec \"$0\" \"$@\""),
            ]
        });
        Receiver::start_wrapped(wrapper, extra)
    }

    /// Started through `wrapper` (a command that ends by `exec`ing its arguments, so
    /// the PID stays the receiver's), or directly.
    pub fn start_wrapped(wrapper: Option<Vec<String>>, extra: &[&str]) -> Receiver {
        Receiver::start_bound(wrapper, "127.0.0.1", extra)
    }

    /// As [`Receiver::start_wrapped`], listening on `bind` (`0.0.0.0`: every interface,
    /// as a receiver of several rails does).
    pub fn start_bound(wrapper: Option<Vec<String>>, bind: &str, extra: &[&str]) -> Receiver {
        // Port 0: the system picks a free port at bind time and the receiver prints it. (A
        // port found free beforehand can be taken, by another test's outgoing connection,
        // before the receiver binds it.)
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("tcp-recv-{}-{n}.log", std::process::id()));
        let file = std::fs::File::create(&log).unwrap();
        let mut command = match wrapper {
            Some(w) => {
                let mut c = Command::new(&w[0]);
                c.args(&w[1..]).arg(host_bin());
                c
            }
            None => Command::new(host_bin()),
        };
        let child = command
            .args([
                "recv",
                "--transport",
                "tcp",
                "--bind",
                bind,
                "--gpu",
                "none",
            ])
            .args(["--port", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting host recv");
        let mut r = Receiver {
            child: Some(child),
            port: 0,
            log,
        };
        r.wait_for_log("listening on", Duration::from_secs(10));
        // The line may be read before its end is written: read it again until whole.
        let t0 = Instant::now();
        r.port = loop {
            let log = r.log();
            // Only whole lines: a port cut short would read as another number.
            let whole = &log[..log.rfind('\n').map_or(0, |i| i + 1)];
            match listening_port(whole) {
                Some(port) => break port,
                _ if t0.elapsed() > Duration::from_secs(10) => {
                    panic!("the receiver does not say its port:\n{log}")
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        r
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the receiver runs").id()
    }

    /// A line of `/proc/PID/status` in KiB ("VmHWM", "VmRSS").
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Descriptors the receiver has open now.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_for_log(&self, text: &str, within: Duration) {
        let t0 = Instant::now();
        while !self.log().contains(text) {
            assert!(
                t0.elapsed() < within,
                "the receiver did not say `{text}` within {within:?}; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait for the receiver to exit; its exit code.
    pub fn exit_code(&mut self, within: Duration) -> i32 {
        let child = self.child.as_mut().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status.code().unwrap_or(-1);
            }
            assert!(
                t0.elapsed() < within,
                "the receiver did not exit within {within:?}; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Run a sender to completion within `within` (killed and failed otherwise).
pub fn send(port: u16, extra: &[&str], within: Duration) -> Output {
    let child = spawn_sender(port, extra);
    finish(child, within)
}

pub fn spawn_sender(port: u16, extra: &[&str]) -> Child {
    Command::new(host_bin())
        .args([
            "127.0.0.1",
            &port.to_string(),
            "--transport",
            "tcp",
            "--gpu",
            "none",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the sender")
}

pub fn finish(mut child: Child, within: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > within {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the sender did not finish within {within:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn assert_verified(out: &Output, what: &str) {
    let (stdout, stderr) = text(out);
    assert!(
        out.status.success() && stdout.contains("Receiver: verified"),
        "{what}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

pub const T: Duration = Duration::from_secs(60);

/// A control message as the TCP link carries it once the opening is done: its frame,
/// then its bytes (`host::net::tcp::frames`).
pub fn message(bytes: &[u8]) -> Vec<u8> {
    let frame = host::net::tcp::frames::Frame::control(bytes);
    [&frame.encode()[..], bytes].concat()
}

/// Read one control message (its frame, then its bytes) from `s`.
pub fn read_message(mut s: &std::net::TcpStream) -> std::io::Result<Vec<u8>> {
    use host::net::tcp::frames::{Frame, FrameKind, FRAME_LEN};
    use std::io::Read;
    let mut head = [0u8; FRAME_LEN];
    s.read_exact(&mut head)?;
    let FrameKind::Control { len, .. } = Frame::decode(&head).kind() else {
        return Err(std::io::Error::other("not a control message"));
    };
    let mut bytes = vec![0u8; len as usize];
    s.read_exact(&mut bytes)?;
    Ok(bytes)
}
