//! The cases both transports share (`shared_cases/mod.rs`), over TCP loopback: each a
//! receiver and a sender of `host`, judged by the same check as in the Soft-RoCE guests.

mod shared_cases;
mod tcp_common;

use shared_cases::{check, Case, Ran, CASES, STORED};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use tcp_common::{finish, host_bin, Receiver};

/// Bytes that look random (xorshift), `len` of them.
fn random_bytes(len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn run_case(case: &Case, seed: u64) -> Ran {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "shared-{}-{}",
        case.name,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let input = dir.join("in.bin");
    let data = case.file.map(|len| random_bytes(len, seed));
    if let Some(d) = &data {
        std::fs::write(&input, d).unwrap();
    }
    let out_arg = out.display().to_string();
    let mut recv: Vec<&str> = vec!["--timeout", "10", "--output", &out_arg];
    recv.extend_from_slice(case.recv);
    let receiver = Receiver::start(&recv);
    let input_arg = input.display().to_string();
    let send: Vec<&str> = case
        .send
        .iter()
        .map(|a| if *a == "FILE" { input_arg.as_str() } else { a })
        .collect();
    let mut child = Command::new(host_bin())
        .args(["127.0.0.1", &receiver.port.to_string()])
        .args([
            "--transport",
            "tcp",
            "--gpu",
            "none",
            "--timeout",
            "10",
            "--json",
        ])
        .args(&send)
        .stdin(if case.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the sender");
    if case.stdin {
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(data.as_deref().unwrap_or_default())
            .unwrap();
    }
    let done = finish(child, Duration::from_secs(120));
    drop(receiver);
    let stored_equal = data.map(|d| std::fs::read(out.join(STORED)).is_ok_and(|s| s == d));
    let _ = std::fs::remove_dir_all(&dir);
    Ran {
        rc: done.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&done.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&done.stderr).into_owned(),
        stored_equal,
    }
}

#[test]
fn every_shared_case_over_tcp_loopback() {
    let mut failed = Vec::new();
    for (k, case) in CASES.iter().enumerate() {
        let ran = run_case(case, 0x9e37_79b9 + k as u64);
        if let Err(why) = check(case, &ran) {
            failed.push(format!("{}: {why}", case.name));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases failed:\n{}",
        failed.len(),
        CASES.len(),
        failed.join("\n\n")
    );
}
