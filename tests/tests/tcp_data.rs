//! The user's own data over loopback TCP between two real `host` processes (protocol
//! version 2): files of awkward sizes and standard input arrive byte for byte (checked
//! with the system's `sha256sum`), a killed sender or a full disk leaves no file under
//! the final name, corrupted chunks are found by their CRC32C and sent again, and an
//! old peer is told so. No GPU, no RDMA device: the no-CUDA build, `--gpu none`.

mod tcp_common;

use host::transfer::faults::FaultInjector;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tcp_common::*;

/// A fresh directory of this test's own.
fn dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tcp-data-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A file of `len` random bytes (from the kernel's generator).
fn random_file(path: &Path, len: u64) {
    let status = Command::new("sh")
        .args([
            "-c",
            &format!("head -c {len} /dev/urandom > '{}'", path.display()),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(std::fs::metadata(path).unwrap().len(), len);
}

/// The system's `sha256sum` of a file.
fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The receiver serves on after a failure: a new sender's random file of `len` bytes,
/// written as `inputs/name`, is verified and becomes the only file in `stored`.
fn next_file_arrives(r: &Receiver, inputs: &Path, name: &str, len: u64, stored: &Path) {
    let file = inputs.join(name);
    random_file(&file, len);
    let after = format!("{name}, after the failure");
    assert_verified(
        &send(r.port, &["--input", file.to_str().unwrap()], T),
        &after,
    );
    assert_eq!(names(stored), [name]);
    assert_eq!(sha256(&stored.join(name)), sha256(&file));
}

/// The files in `d`, sorted.
fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    let (stdout, stderr) = text(out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

#[test]
fn files_of_1_4097_64mib_and_1gib_plus_3_bytes_arrive_with_the_same_sha256() {
    let inputs = dir("sizes-in");
    let outputs = dir("sizes-out");
    let r = Receiver::start(&["--output", outputs.to_str().unwrap(), "--max-bytes", "2GiB"]);
    for (len, streams) in [
        (1u64, "1"),
        (4097, "2"),
        (64 << 20, "4"),
        ((1 << 30) + 3, "4"),
    ] {
        let name = format!("random-{len}.bin");
        let input = inputs.join(&name);
        random_file(&input, len);
        // The receiver answers once the file is stored (written and synced): 1 GiB took
        // 4 s on a 2-core machine alone and more than the default --timeout of 10 s with
        // the other tests writing theirs, so the sender waits up to 50 s for the answer.
        let out = send(
            r.port,
            &[
                "--input",
                input.to_str().unwrap(),
                "--streams",
                streams,
                "--timeout",
                "50",
            ],
            T,
        );
        assert_verified(&out, &name);
        let (stdout, _) = text(&out);
        assert!(
            stdout.contains("checksums: CRC32C of every chunk matched"),
            "{stdout}"
        );
        let landed = outputs.join(&name);
        assert_eq!(sha256(&landed), sha256(&input), "{name}");
        std::fs::remove_file(&input).unwrap();
        std::fs::remove_file(&landed).unwrap();
    }
    assert!(names(&outputs).is_empty(), "{:?}", names(&outputs));
    r.wait_for_log("stored: ", Duration::from_secs(10));
}

#[test]
fn standard_input_arrives_in_a_file_with_the_same_sha256() {
    let d = dir("stdin");
    let input = d.join("input.bin");
    random_file(&input, 3_000_001);
    let landed = d.join("landed.bin");
    let mut r = Receiver::start(&["--output", landed.to_str().unwrap(), "--once"]);
    let child = Command::new(host_bin())
        .args(["127.0.0.1", &r.port.to_string(), "--transport", "tcp"])
        .args(["--gpu", "none", "--input", "-", "--chunk", "64KiB"])
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_verified(&finish(child, T), "standard input");
    assert_eq!(r.exit_code(Duration::from_secs(10)), 0, "{}", r.log());
    assert_eq!(sha256(&landed), sha256(&input));
    // Only the final file: no temporary one left beside it.
    assert_eq!(names(&d), ["input.bin", "landed.bin"]);
}

#[test]
fn a_sender_killed_mid_transfer_leaves_no_file_under_the_final_name() {
    let d = dir("killed");
    let input = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("killed-input.bin");
    random_file(&input, 256 << 20);
    let out = dir("killed-out");
    let r = Receiver::start(&["--output", out.to_str().unwrap(), "--max-bytes", "1GiB"]);
    // Kill the sender while its data is on the way: slow it (--chunk 4 KiB, one stream)
    // and retry with other delays until the receiver reports a transfer broken off (a
    // kill before the connection or after the ack would show nothing). The delays are
    // shares of a whole transfer of the same file, timed here first: with the other
    // tests loading the machine, fixed delays of 150-900 ms once all fell before the
    // sender had connected.
    let t = Instant::now();
    let whole = send(
        r.port,
        &[
            "--chunk",
            "4KiB",
            "--name",
            "whole.bin",
            "--input",
            input.to_str().unwrap(),
        ],
        T,
    );
    let whole_ms = t.elapsed().as_millis() as u64;
    assert_verified(&whole, "the timed whole transfer");
    std::fs::remove_file(out.join("whole.bin")).unwrap();
    let mut broken = false;
    for delay_ms in [50u64, 40, 30, 60, 20, 10].map(|pct| whole_ms * pct / 100) {
        let before = r.log().matches("incomplete transfer").count();
        let mut child = Command::new(host_bin())
            .args(["127.0.0.1", &r.port.to_string(), "--transport", "tcp"])
            .args(["--gpu", "none", "--chunk", "4KiB", "--name", "killed.bin"])
            .args(["--input", input.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if r.log().matches("incomplete transfer").count() > before {
                broken = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let stored = names(&out);
        if !broken && stored == ["killed.bin"] {
            // The kill came after the whole transfer (the machine ran faster than when
            // it was timed, the other tests' load having moved): stored whole, rightly.
            // An earlier kill is tried.
            assert_eq!(sha256(&out.join("killed.bin")), sha256(&input));
            std::fs::remove_file(out.join("killed.bin")).unwrap();
            continue;
        }
        assert!(
            stored.is_empty(),
            "after a kill at {delay_ms} ms that broke the transfer off: {stored:?}"
        );
        if broken {
            break;
        }
    }
    assert!(
        broken,
        "no kill landed mid-transfer; receiver log:\n{}",
        r.log()
    );
    next_file_arrives(&r, &d, "next.bin", 100_000, &out);
    std::fs::remove_file(&input).unwrap();
}

#[test]
fn a_name_of_255_bytes_is_stored_and_again_under_a_cut_alternative() {
    // 255 bytes is the longest name a receiver accepts and a file system takes: the
    // temporary name beside it must not be longer, and the `.1` of a second transfer
    // of the same name is cut to fit (on a character boundary: 'é' is 2 bytes).
    let inputs = dir("long-in");
    let out = dir("long-out");
    let long = format!("{}x", "é".repeat(127));
    assert_eq!(long.len(), 255);
    let input = inputs.join("input.bin");
    random_file(&input, 100_000);
    let r = Receiver::start(&["--output", out.to_str().unwrap()]);
    for _ in 0..2 {
        let sent = send(
            r.port,
            &["--input", input.to_str().unwrap(), "--name", &long],
            T,
        );
        assert_verified(&sent, "a 255-byte name");
    }
    let cut = format!("{}.1", "é".repeat(126));
    let mut want = vec![long.clone(), cut.clone()];
    want.sort();
    assert_eq!(names(&out), want, "{}", r.log());
    assert_eq!(sha256(&out.join(&long)), sha256(&input));
    assert_eq!(sha256(&out.join(&cut)), sha256(&input));
}

#[test]
fn a_full_disk_is_reported_and_the_receiver_keeps_serving() {
    // A 1 MiB tmpfs, mounted in a mount namespace of the receiver's own (`unshare`
    // execs the shell, which execs the receiver: one PID); the test reads it through
    // /proc/PID/root.
    let mount = dir("full-disk");
    let script = format!(
        "mount -t tmpfs -o size=1m none '{}' && exec \"$0\" \"$@\"",
        mount.display()
    );
    let wrapper = vec![
        "unshare".to_string(),
        "-rm".to_string(),
        "sh".to_string(),
        "-c".to_string(),
        script,
    ];
    let r = Receiver::start_wrapped(Some(wrapper), &["--output", mount.to_str().unwrap()]);
    let inputs = dir("full-disk-in");
    let big = inputs.join("big.bin");
    random_file(&big, 3 << 20);
    let out = send(r.port, &["--input", big.to_str().unwrap()], T);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "a 3 MiB file fit a 1 MiB disk?");
    assert!(
        stdout.contains("could not store it") && stderr.contains("could not store the data"),
        "{stdout}\n{stderr}"
    );
    // The receiver reports the transfer after its ack went out: wait for the line.
    r.wait_for_log("not stored:", Duration::from_secs(10));
    let log = r.log();
    assert!(
        log.contains("not stored:") && log.contains("No space left on device"),
        "{log}"
    );
    // Nothing under the final name, no temporary file left; and the next one fits.
    let inside =
        PathBuf::from(format!("/proc/{}/root", r.pid())).join(mount.strip_prefix("/").unwrap());
    assert!(names(&inside).is_empty(), "{:?}", names(&inside));
    next_file_arrives(&r, &inputs, "small.bin", 200_000, &inside);
}

/// The chunks the injector corrupts on their first sending, as the sender computes it.
fn corrupted_first(spec: &str, chunks: u64) -> Vec<u64> {
    let f = FaultInjector::parse(spec).unwrap();
    (0..chunks).filter(|&c| f.hits(c, 0)).collect()
}

#[test]
fn corrupted_chunks_are_found_and_repaired_at_1_in_10000_and_1_in_100() {
    let inputs = dir("faults-in");
    let outputs = dir("faults-out");
    let input = inputs.join("data.bin");
    // 128 MiB + 5 in 4 KiB chunks: 32769 chunks, a few of them hit at 1 in 10000.
    let len = (128u64 << 20) + 5;
    random_file(&input, len);
    let chunks = len.div_ceil(4096);
    let r = Receiver::start(&["--output", outputs.to_str().unwrap()]);
    for spec in ["1/10000", "1/100"] {
        let expected = corrupted_first(spec, chunks);
        assert!(
            !expected.is_empty(),
            "{spec}: the test needs corrupted chunks"
        );
        let out = send(
            r.port,
            &[
                "--input",
                input.to_str().unwrap(),
                "--chunk",
                "4KiB",
                "--streams",
                "4",
                "--test-inject-faults",
                spec,
                "--json",
            ],
            T,
        );
        let (_, stderr) = text(&out);
        assert!(out.status.success(), "{spec}: {stderr}");
        assert!(stderr.contains("TEST FAULT INJECTION"), "{stderr}");
        let v = json_of(&out);
        let integrity = &v["iterations"][0]["integrity"];
        let repaired: Vec<u64> = integrity["repaired"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["chunk"].as_u64().unwrap())
            .collect();
        // Every chunk corrupted on its first sending was found and sent again; no other.
        assert_eq!(repaired, expected, "{spec}");
        assert_eq!(integrity["fault_injection"], spec);
        assert_eq!(v["ok"], true);
        assert_eq!(sha256(&outputs.join("data.bin")), sha256(&input), "{spec}");
    }
}

#[test]
fn with_every_chunk_corrupted_the_transfer_fails_naming_the_chunks() {
    let inputs = dir("all-bad-in");
    let outputs = dir("all-bad-out");
    let input = inputs.join("data.bin");
    random_file(&input, 10 * 4096 + 1);
    let r = Receiver::start(&["--output", outputs.to_str().unwrap()]);
    let out = send(
        r.port,
        &[
            "--input",
            input.to_str().unwrap(),
            "--chunk",
            "4KiB",
            "--test-inject-faults",
            "1/1",
            "--max-resends",
            "2",
        ],
        T,
    );
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("11 chunk(s) still failed their CRC32C after 2 round(s) of resends")
            && stderr.contains("chunk(s) 0, 1, 2, 3, 4, 5, 6, 7, and 3 more"),
        "{stderr}"
    );
    assert!(names(&outputs).is_empty(), "{:?}", names(&outputs));
    r.wait_for_log("still failed after the resends", Duration::from_secs(5));
}

#[test]
fn the_pattern_is_checked_by_checksum_both_or_not_at_all_as_asked() {
    let r = Receiver::start(&[]);
    for (verify, expect) in [
        ("checksum", "checksums: CRC32C of every chunk matched"),
        ("both", "all 262144 elements match the pattern"),
        ("off", "checks: none (--verify off)"),
    ] {
        let out = send(
            r.port,
            &["--size", "1MiB", "--chunk", "64KiB", "--verify", verify],
            T,
        );
        assert_verified(&out, verify);
        let (stdout, _) = text(&out);
        assert!(stdout.contains(expect), "{verify}: {stdout}");
    }
    // The pattern check of the user's data makes no sense, and is refused up front.
    let d = dir("pattern-of-input");
    let input = d.join("x.bin");
    random_file(&input, 100);
    let out = send(
        r.port,
        &["--input", input.to_str().unwrap(), "--verify", "both"],
        T,
    );
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("applies to the built-in pattern"),
        "{stderr}"
    );
}

#[test]
fn a_version_1_sender_gets_a_reject_it_can_read() {
    let r = Receiver::start(&[]);
    // A version-1 offer, byte for byte as that release sent it (its header and hello).
    let header = host::wire::Header::new(host::wire::Op::Send, 4096, 4096, 1)
        .unwrap()
        .encode_with_version(1);
    let mut hello = [0u8; 20];
    hello[0..4].copy_from_slice(b"GRDS");
    hello[4..6].copy_from_slice(&1u16.to_le_bytes());
    hello[8..10].copy_from_slice(&1u16.to_le_bytes());
    let mut s = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[&header[..], &hello[..]].concat()).unwrap();
    let mut answer = [0u8; 28];
    s.read_exact(&mut answer).unwrap();
    // A reject in version 1's own layout: magic, version 1, code 1 (bad header),
    // sub-code 3 (unsupported version), the version it got.
    assert_eq!(&answer[0..4], b"GRDR");
    assert_eq!(u16::from_le_bytes([answer[4], answer[5]]), 1);
    assert_eq!(u16::from_le_bytes([answer[6], answer[7]]), 1);
    assert_eq!(u16::from_le_bytes([answer[8], answer[9]]), 3);
    assert_eq!(answer[12], 1);
    // The same through the sender's hidden --protocol-version.
    let out = send(r.port, &["--protocol-version", "1"], T);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("protocol version 1 is not supported (this side speaks version 3)"),
        "{stderr}"
    );
}

#[test]
fn output_to_standard_output_carries_the_bytes_alone() {
    let d = dir("stdout");
    let input = d.join("input.bin");
    random_file(&input, 1_000_003);
    let landed = d.join("stdout.bin");
    let errors = d.join("stderr.log");
    let mut receiver = Command::new(host_bin())
        .args([
            "recv",
            "--transport",
            "tcp",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
        ])
        .args(["--gpu", "none", "--output", "-", "--once"])
        .stdout(std::fs::File::create(&landed).unwrap())
        .stderr(std::fs::File::create(&errors).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let port = loop {
        let log = std::fs::read_to_string(&errors).unwrap_or_default();
        let whole = &log[..log.rfind('\n').map_or(0, |i| i + 1)];
        if let Some(p) = whole
            .split("listening on 127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse::<u16>().ok())
        {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_verified(
        &send(port, &["--input", input.to_str().unwrap()], T),
        "to standard output",
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = receiver.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the receiver did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    // The bytes alone on stdout; the receiver's words went to stderr.
    assert_eq!(sha256(&landed), sha256(&input));
    let words = std::fs::read_to_string(&errors).unwrap();
    assert!(words.contains("stored: -"), "{words}");
}
