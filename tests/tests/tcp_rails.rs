//! TCP rails between two network namespaces joined by two veth pairs (10.71.1.0/24 and
//! 10.71.2.0/24), each rate-limited to 1 Gbit/s so that a 256 MiB transfer lasts long
//! enough to take a link down in its middle: the receiver runs in one namespace, the
//! sender in the other with `--bind-interfaces`.
//!
//! - a striped 256 MiB transfer is verified with both rails carrying chunks (the JSON's
//!   per-rail counts);
//! - one link set down in the middle of a 256 MiB transfer: the transfer completes on
//!   the other rail and verifies, and the stall beyond detection is at most 1 s (as the
//!   sender measures it: from declaring the rail failed until chunks are done in order
//!   again, plus the rounds of asking for the chunks it lost; the whole transfer's time
//!   is printed beside a single rail's); the link back up, the next transfer uses both
//!   rails again.
//! - a rail that writes its chunks and no end marker (`--test-silent-rail`, a link dead
//!   without a FIN after its last chunk) costs the receiver about a second, not its
//!   `--timeout`;
//! - `host bench rails` (1 round, 8 MiB) prints JSON with each rail's rate, the striped
//!   rate and a finite positive ratio; it fails when a transfer is not verified;
//! - `rails_bench` (ignored; `cargo test --test tcp_rails -- --ignored --nocapture`):
//!   `host bench rails` with its defaults (5 rounds of 256 MiB, each rail alone and both
//!   striped, interleaved) between the namespaces, its JSON printed.
//!
//! Needs root (network namespaces). Where `ip netns add` is refused (EPERM), each test
//! says so and passes without running.

mod tcp_common;

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tcp_common::{finish, host_bin, text, Receiver};

/// Each link's rate: 256 MiB take about 2.2 s on one rail, 1.1 s on two.
const RATE: &str = "1gbit";
const RAIL_TIMEOUT: f64 = 0.5;

/// Two namespaces and two veth pairs, deleted when dropped.
struct Rails {
    sender_ns: String,
    receiver_ns: String,
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running ip")
}

fn must(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Rails {
    /// The namespaces, or `None` (with the reason printed) where this process may not
    /// make them.
    fn new() -> Option<Rails> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let base = format!("grdm-rails-{}-{n}", std::process::id());
        let rails = Rails {
            sender_ns: format!("{base}-s"),
            receiver_ns: format!("{base}-r"),
        };
        let out = ip(&["netns", "add", &rails.sender_ns]);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("Operation not permitted") || err.contains("Permission denied") {
                eprintln!("SKIP: cannot make a network namespace here: {}", err.trim());
                return None;
            }
            panic!("ip netns add: {err}");
        }
        must(&["netns", "add", &rails.receiver_ns]);
        let (s, r) = (&rails.sender_ns, &rails.receiver_ns);
        for k in 1..=2 {
            let (vs, vr) = (format!("vs{k}"), format!("vr{k}"));
            must(&[
                "-n", s, "link", "add", &vs, "type", "veth", "peer", "name", &vr, "netns", r,
            ]);
            must(&[
                "-n",
                s,
                "addr",
                "add",
                &format!("10.71.{k}.1/24"),
                "dev",
                &vs,
            ]);
            must(&[
                "-n",
                r,
                "addr",
                "add",
                &format!("10.71.{k}.2/24"),
                "dev",
                &vr,
            ]);
            must(&["-n", s, "link", "set", &vs, "up"]);
            must(&["-n", r, "link", "set", &vr, "up"]);
            let tc = Command::new("ip")
                .args(["netns", "exec", s, "tc", "qdisc", "add", "dev", &vs, "root"])
                .args(["tbf", "rate", RATE, "burst", "256kb", "latency", "100ms"])
                .output()
                .expect("running tc");
            assert!(
                tc.status.success(),
                "tc: {}",
                String::from_utf8_lossy(&tc.stderr)
            );
        }
        for ns in [s, r] {
            must(&["-n", ns, "link", "set", "lo", "up"]);
        }
        Some(rails)
    }

    fn receiver(&self) -> Receiver {
        let wrapper = ["ip", "netns", "exec", &self.receiver_ns]
            .map(String::from)
            .to_vec();
        Receiver::start_bound(Some(wrapper), "0.0.0.0", &[])
    }

    /// `host` with `args`, then `--rail-timeout` and `extra`, in the sender's namespace.
    fn spawn_host(&self, args: &[&str], extra: &[&str]) -> std::process::Child {
        Command::new("ip")
            .args(["netns", "exec", &self.sender_ns])
            .arg(host_bin())
            .args(args)
            .args(["--rail-timeout", &RAIL_TIMEOUT.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting host in the sender's namespace")
    }

    /// A sender in the sender's namespace to `to` (a comma list) with `extra`.
    fn spawn_sender(&self, to: &str, port: u16, extra: &[&str]) -> std::process::Child {
        let port = port.to_string();
        let args = [to, &port, "--transport", "tcp", "--gpu", "none", "--json"];
        self.spawn_host(&args, extra)
    }

    /// Both rails, 256 MiB; its JSON and stderr.
    fn striped(&self, port: u16) -> (serde_json::Value, String) {
        let child = self.spawn_sender(
            "10.71.1.2,10.71.2.2",
            port,
            &[
                "--size",
                "256MiB",
                "--bind-interfaces",
                "10.71.1.1,10.71.2.1",
            ],
        );
        verified(finish(child, Duration::from_secs(60)), "striped")
    }

    /// `host bench rails` in the sender's namespace over both rails, with `extra`.
    fn spawn_bench(&self, port: u16, extra: &[&str]) -> std::process::Child {
        let port = port.to_string();
        let args = ["bench", "rails", "10.71.1.2,10.71.2.2", &port];
        let both = ["--bind-interfaces", "10.71.1.1,10.71.2.1"];
        self.spawn_host(&args, &[&both[..], extra].concat())
    }

    /// Rail `k` (1 or 2) alone, 256 MiB.
    fn single(&self, port: u16, k: u32) -> (serde_json::Value, String) {
        let to = format!("10.71.{k}.2");
        let child = self.spawn_sender(&to, port, &["--size", "256MiB"]);
        verified(finish(child, Duration::from_secs(60)), "one rail")
    }

    /// Wait (at most 20 s) until a connection from `local` is established in the
    /// sender's namespace.
    fn wait_for_connection(&self, local: &str) {
        let t0 = Instant::now();
        loop {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.sender_ns,
                    "ss",
                    "-Htn",
                    "state",
                    "established",
                ])
                .args(["src", local])
                .output()
                .expect("running ss");
            if !out.stdout.is_empty() {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no connection from {local}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn link(&self, k: u32, state: &str) {
        must(&[
            "-n",
            &self.receiver_ns,
            "link",
            "set",
            &format!("vr{k}"),
            state,
        ]);
    }
}

impl Drop for Rails {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth ends (and so their peers).
        for ns in [&self.sender_ns, &self.receiver_ns] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// The sender's JSON and stderr, after checking that it verified.
fn verified(out: Output, what: &str) -> (serde_json::Value, String) {
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let json: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{stdout}\n{stderr}"));
    assert_eq!(json["ok"], true, "{what}: {json}");
    (json, stderr)
}

/// The receiver's last `rails: ...` line (printed), once its log says `start`.
fn receivers_rails_line(receiver: &Receiver, start: &str) -> String {
    receiver.wait_for_log(start, Duration::from_secs(10));
    let log = receiver.log();
    let line = log
        .lines()
        .rev()
        .find(|l| l.starts_with("rails: "))
        .unwrap_or_default()
        .to_string();
    println!("receiver: {line}");
    line
}

fn chunks_per_rail(json: &serde_json::Value) -> Vec<u64> {
    json["iterations"][0]["rails"]
        .as_array()
        .expect("per-rail counts in the JSON")
        .iter()
        .map(|r| r["chunks"].as_u64().unwrap())
        .collect()
}

fn round_trip(json: &serde_json::Value) -> f64 {
    json["iterations"][0]["round_trip_seconds"]
        .as_f64()
        .unwrap()
}

#[test]
fn a_striped_256_mib_transfer_verifies_with_both_rails_carrying_chunks() {
    let Some(rails) = Rails::new() else { return };
    let receiver = rails.receiver();
    let (json, _) = rails.striped(receiver.port);
    let chunks = chunks_per_rail(&json);
    println!("chunks per rail: {chunks:?}");
    assert_eq!(chunks.len(), 2);
    assert!(chunks.iter().all(|&c| c > 0), "{chunks:?}");
    assert!(chunks.iter().sum::<u64>() >= 256, "{chunks:?}");
}

#[test]
fn a_link_down_mid_transfer_fails_over_and_the_next_transfer_uses_both_rails() {
    let Some(rails) = Rails::new() else { return };
    let receiver = rails.receiver();
    let (one, _) = rails.single(receiver.port, 1);
    let one_rail = round_trip(&one);

    let t0 = Instant::now();
    let child = rails.spawn_sender(
        "10.71.1.2,10.71.2.2",
        receiver.port,
        &[
            "--size",
            "256MiB",
            "--bind-interfaces",
            "10.71.1.1,10.71.2.1",
        ],
    );
    // In the middle: once rail 2's sockets are up (the sender generates its data
    // first), and 0.7 s later (the receiver prepares its buffer, then the data flows):
    // about a third of the way in.
    rails.wait_for_connection("10.71.2.1");
    std::thread::sleep(Duration::from_millis(700));
    rails.link(2, "down");
    let down_at = t0.elapsed().as_secs_f64();
    let (json, stderr) = verified(finish(child, Duration::from_secs(60)), "failover");
    let it = &json["iterations"][0];
    let failed = &it["rails"][1];
    assert_eq!(failed["failures"], 1, "{json}");
    let failover_rt = round_trip(&json);
    let stall_beyond = failed["stall_beyond_detection_seconds"].as_f64().unwrap();
    println!(
        "link down at {down_at:.3} s; one rail {one_rail:.3} s, failover transfer {failover_rt:.3} s; \
         rail 1 failed after {:.3} s ({}); {} chunks moved, resends on rail 0: {}; \
         stall beyond detection {stall_beyond:.3} s",
        failed["failed_after_seconds"].as_f64().unwrap_or(-1.0),
        failed["failed"],
        failed["moved_chunks"],
        it["rails"][0]["resends"],
    );
    assert!(
        stall_beyond <= 1.0,
        "stall beyond detection {stall_beyond:.3} s"
    );
    // However measured, the whole transfer may not be worse than one rail, detection
    // and that second.
    assert!(
        failover_rt <= one_rail + RAIL_TIMEOUT + 1.0,
        "{failover_rt} s"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("failover: rail 1 (10.71.2.1) failed after")),
        "{stderr}"
    );

    // The receiver's line for the connection names what came over each rail (and, where
    // rail 1's streams had joined, why they stopped).
    receivers_rails_line(&receiver, "rails: rail 0 from 10.71.1.1");

    rails.link(2, "up");
    std::thread::sleep(Duration::from_millis(300));
    let (json, _) = rails.striped(receiver.port);
    let chunks = chunks_per_rail(&json);
    println!("after the link came back, chunks per rail: {chunks:?}");
    assert!(chunks.iter().all(|&c| c > 0), "{chunks:?}");
}

#[test]
fn the_control_rails_link_down_mid_transfer_the_conversation_moves_to_the_other_rail() {
    // Rail 0 carried the offer and, until it fails, the receiver's messages. Its link
    // goes down mid-transfer: the sender gives it up, its chunks move to rail 1, the
    // receiver asks for what never came and acks over rail 1, and the data verifies.
    let Some(rails) = Rails::new() else { return };
    let receiver = rails.receiver();
    let child = rails.spawn_sender(
        "10.71.1.2,10.71.2.2",
        receiver.port,
        &[
            "--size",
            "256MiB",
            "--bind-interfaces",
            "10.71.1.1,10.71.2.1",
        ],
    );
    rails.wait_for_connection("10.71.2.1");
    std::thread::sleep(Duration::from_millis(700));
    rails.link(1, "down");
    let (json, stderr) = verified(finish(child, Duration::from_secs(60)), "control failover");
    rails.link(1, "up");
    let it = &json["iterations"][0];
    let control = &it["rails"][0];
    println!(
        "rail 0 (the control rail) failed after {:.3} s ({}); {} chunks moved; rail 1 carried {} chunks",
        control["failed_after_seconds"].as_f64().unwrap_or(-1.0),
        control["failed"],
        control["moved_chunks"],
        it["rails"][1]["chunks"],
    );
    assert_eq!(control["failures"], 1, "{json}");
    assert!(it["rails"][1]["chunks"].as_u64().unwrap() > 0, "{json}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("failover: rail 0 (10.71.1.1) failed after")),
        "{stderr}"
    );
    // The receiver served it whole, its rail 0 stopped.
    let line = receivers_rails_line(&receiver, "rails: rail 0 from 10.71.1.1");
    assert!(
        line.contains("stopped") || line.contains("gave it up"),
        "{line}"
    );
}

#[test]
fn a_rail_that_does_not_connect_is_left_out_and_rests_for_the_next_transfers() {
    let Some(rails) = Rails::new() else { return };
    let receiver = rails.receiver();
    rails.link(2, "down");
    let child = rails.spawn_sender(
        "10.71.1.2,10.71.2.2",
        receiver.port,
        &[
            "--size",
            "16MiB",
            "--iters",
            "3",
            "--bind-interfaces",
            "10.71.1.1,10.71.2.1",
        ],
    );
    let (json, _) = verified(
        finish(child, Duration::from_secs(60)),
        "rail down from the start",
    );
    let left_out: Vec<String> = (0..3)
        .map(|i| {
            json["iterations"][i]["rails"][1]["left_out"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    println!("rail 1 left out: {left_out:?}");
    assert!(left_out[0].contains("no connection"), "{left_out:?}");
    // The next transfers start within its 1 s cooldown: it is not tried again.
    assert!(
        left_out[1].starts_with("resting after a failure"),
        "{left_out:?}"
    );
    for i in 0..3 {
        assert_eq!(json["iterations"][i]["rails"][0]["chunks"], 16, "{json}");
    }
}

#[test]
fn a_striped_transfer_with_checksums_repairs_corrupt_chunks_over_loopback() {
    // Two local addresses of the loopback interface are two rails without namespaces.
    let receiver = Receiver::start_bound(None, "0.0.0.0", &[]);
    let child = spawn_over_loopback(
        receiver.port,
        &["--size", "64MiB", "--chunk", "256KiB", "--streams", "2"],
        &["--verify", "checksum", "--test-inject-faults", "1/20"],
    );
    let (json, _) = verified(
        finish(child, Duration::from_secs(60)),
        "striped with faults",
    );
    let it = &json["iterations"][0];
    assert!(
        !it["integrity"]["repaired"].as_array().unwrap().is_empty(),
        "{json}"
    );
    let chunks = chunks_per_rail(&json);
    assert!(chunks.iter().all(|&c| c > 0), "{chunks:?}");
}

#[test]
fn one_bind_interface_is_one_rail_from_that_address() {
    let receiver = Receiver::start_bound(None, "0.0.0.0", &[]);
    let out = std::process::Command::new(host_bin())
        .args(["127.0.0.1", &receiver.port.to_string()])
        .args([
            "--transport",
            "tcp",
            "--gpu",
            "none",
            "--size",
            "1MiB",
            "--streams",
            "2",
        ])
        .args(["--bind-interfaces", "127.0.0.2"])
        .output()
        .unwrap();
    tcp_common::assert_verified(&out, "one bound rail");
    receiver.wait_for_log("received 1 MiB from 127.0.0.2:", Duration::from_secs(10));
    assert!(
        !receiver.log().contains("rails:"),
        "one rail is not striped"
    );
}

#[test]
fn a_rail_silent_after_its_last_chunk_costs_the_receiver_about_a_second_not_its_timeout() {
    // Rail 1 writes its chunks but no end marker (--test-silent-rail 1): a link that
    // died without a FIN right after its last chunk. Every chunk lands; the receiver
    // used to wait its --timeout (10 s here) on rail 1's stream for the marker. Now it
    // waits at most 1 s of silence after the last chunk landed, shuts that stream and
    // ends the transfer. Over two loopback addresses (no namespaces needed).
    let receiver = Receiver::start_bound(None, "0.0.0.0", &["--timeout", "10"]);
    let t0 = Instant::now();
    let child = spawn_over_loopback(
        receiver.port,
        &["--size", "64MiB", "--timeout", "10"],
        &["--test-silent-rail", "1"],
    );
    let (json, stderr) = verified(finish(child, Duration::from_secs(60)), "silent rail");
    let took = t0.elapsed().as_secs_f64();
    let chunks = chunks_per_rail(&json);
    println!(
        "silent rail 1: verified in {took:.3} s (sender's whole run); chunks per rail {chunks:?}"
    );
    assert!(stderr.contains("TEST SILENT RAIL"), "{stderr}");
    assert!(
        chunks[1] > 0,
        "rail 1 carried no chunk, so this tests nothing: {chunks:?}"
    );
    assert!(
        took < 5.0,
        "{took:.3} s: the receiver waited for the silent rail's end marker"
    );
    let line = receivers_rails_line(&receiver, "rails: rail 0 from");
    assert!(line.contains("no end marker"), "{line}");
}

/// A striped sender (JSON) over loopback: two local addresses are two rails.
fn spawn_over_loopback(port: u16, sizes: &[&str], extra: &[&str]) -> std::process::Child {
    Command::new(host_bin())
        .args(["127.0.0.1,127.0.0.2", &port.to_string()])
        .args(["--transport", "tcp", "--gpu", "none", "--json"])
        .args(["--bind-interfaces", "127.0.0.1,127.0.0.2"])
        .args(sizes)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the sender")
}

/// `host bench rails` over loopback: two local addresses are two rails.
fn bench_over_loopback(receiver: &Receiver, extra: &[&str]) -> Output {
    Command::new(host_bin())
        .args(["bench", "rails", "127.0.0.1,127.0.0.2"])
        .arg(receiver.port.to_string())
        .args(["--bind-interfaces", "127.0.0.1,127.0.0.2"])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("running host bench rails")
}

#[test]
fn bench_rails_prints_each_rail_the_striped_rate_and_a_positive_ratio() {
    // Between the namespaces where they can be made (the links the benchmark is for),
    // else over loopback: the JSON's shape is the same.
    let rails = Rails::new();
    let receiver = match &rails {
        Some(r) => r.receiver(),
        None => Receiver::start_bound(None, "0.0.0.0", &[]),
    };
    let extra = ["--rounds", "1", "--size", "8MiB"];
    let out = match &rails {
        Some(r) => finish(
            r.spawn_bench(receiver.port, &extra),
            Duration::from_secs(60),
        ),
        None => bench_over_loopback(&receiver, &extra),
    };
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    let json: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"));
    let single = json["single_rail"].as_array().expect("single_rail");
    assert_eq!(single.len(), 2, "{json}");
    for r in single {
        assert_eq!(
            r["rounds_gb_per_s"].as_array().map(Vec::len),
            Some(1),
            "{json}"
        );
        assert!(r["median_gb_per_s"].as_f64().unwrap() > 0.0, "{json}");
    }
    assert!(
        json["striped"]["median_gb_per_s"].as_f64().unwrap() > 0.0,
        "{json}"
    );
    assert!(
        json["sum_of_single_rail_medians_gb_per_s"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{json}"
    );
    let ratio = json["ratio_striped_to_sum"].as_f64().expect("a ratio");
    assert!(ratio.is_finite() && ratio > 0.0, "{json}");
    assert_eq!(
        (json["rounds"].as_u64(), json["bytes"].as_u64()),
        (Some(1), Some(8 << 20))
    );
    println!("{json}");
}

#[test]
fn bench_rails_fails_when_a_transfer_is_not_verified() {
    // The receiver refuses offers above 1 MiB: the first transfer fails, so does the run.
    let receiver = Receiver::start_bound(None, "0.0.0.0", &["--max-bytes", "1MiB"]);
    let out = bench_over_loopback(&receiver, &["--rounds", "1", "--size", "4MiB"]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.is_empty(), "no JSON for a failed run: {stdout}");
    assert!(stderr.contains("rail 0 (127.0.0.1) alone"), "{stderr}");
}

#[test]
#[ignore = "a benchmark: cargo test --test tcp_rails -- --ignored --nocapture"]
fn rails_bench() {
    let Some(rails) = Rails::new() else { return };
    let receiver = rails.receiver();
    // `host bench rails`'s defaults: 5 rounds of 256 MiB.
    let out = finish(
        rails.spawn_bench(receiver.port, &[]),
        Duration::from_secs(600),
    );
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    println!("rate per link: {RATE}\n{stdout}");
}
