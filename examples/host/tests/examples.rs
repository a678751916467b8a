//! The tutorial's examples 2-4 as CI runs them: the TCP one end to end over loopback;
//! the GPU and RDMA ones as far as this machine allows (a run where there is a GPU; the
//! one-line error where the driver reports none, or where there is no RDMA device). The
//! RDMA loopback itself runs in a Soft-RoCE guest (tests/tests/softroce.rs).

use std::process::{Command, Output};

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .output()
        .expect("run the example")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Exit code 1 and exactly one line on stderr, starting with `prefix`; nothing on stdout.
fn one_error_line(out: &Output, prefix: &str) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
    assert!(err.starts_with(prefix), "`{prefix}...`: {err}");
    assert!(out.stdout.is_empty(), "{out:?}");
    err
}

#[test]
fn tcp_send_sends_a_buffer_and_the_receiver_verifies_it() {
    let out = run(env!("CARGO_BIN_EXE_tcp-send"), &["3MiB"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("receiver: listening on 127.0.0.1:"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("sender: 3145728 bytes in 3 chunk(s), "),
        "{stdout}"
    );
    assert!(
        lines[1].ends_with("receiver's verdict: Verified"),
        "{stdout}"
    );
    let verified =
        "receiver: verified 3145728 bytes: all 786432 elements match, first values [0, 2, 4, 6, 8]";
    assert_eq!(lines[2], verified);
}

#[test]
fn tcp_send_refuses_a_size_that_is_not_whole_elements() {
    let out = run(env!("CARGO_BIN_EXE_tcp-send"), &["6"]);
    let err = one_error_line(&out, "error: ");
    assert_eq!(
        err,
        "error: 6 bytes is not a whole number of i32 elements (at least one)\n"
    );
    let out = run(env!("CARGO_BIN_EXE_tcp-send"), &["lots"]);
    one_error_line(&out, "error: ");
}

#[test]
fn rdma_loopback_needs_an_address_and_says_so() {
    let out = run(env!("CARGO_BIN_EXE_rdma-loopback"), &[]);
    one_error_line(&out, "error: usage: rdma-loopback ADDRESS [PORT]");
    let out = run(env!("CARGO_BIN_EXE_rdma-loopback"), &["not-an-ip"]);
    one_error_line(&out, "error: `not-an-ip` is not an IP address");
}

#[test]
fn rdma_loopback_without_an_rdma_device_is_one_error_line() {
    let devices = std::fs::read_dir("/sys/class/infiniband").map_or(0, |d| d.count());
    if devices > 0 {
        eprintln!("SKIPPED rdma_loopback_without_an_rdma_device_is_one_error_line: this machine has {devices} RDMA device(s)");
        return;
    }
    let out = run(env!("CARGO_BIN_EXE_rdma-loopback"), &["127.0.0.1"]);
    one_error_line(&out, "error: no RDMA device found: look with `ibv_devices`");
}

#[cfg(feature = "cuda")]
#[test]
fn launch_kernel_verifies_on_a_gpu_or_says_the_driver_reports_none() {
    let out = run(env!("CARGO_BIN_EXE_launch-kernel"), &["4099"]);
    if out.status.success() {
        let stdout = text(&out.stdout);
        assert!(stdout.contains("first values: 0, 2, 4, 6, 8\n"), "{stdout}");
        let done = "generate_data wrote 4099 elements (16396 bytes): all match pattern::value\n";
        assert!(stdout.ends_with(done), "{stdout}");
    } else {
        // Only "the driver reports no GPU" may end it here; any other failure on a
        // machine with a GPU fails the test.
        let err = one_error_line(&out, "error: no GPU: ");
        eprintln!("SKIPPED the GPU half of launch_kernel: {}", err.trim_end());
    }
}

#[cfg(feature = "cuda")]
#[test]
fn launch_kernel_refuses_a_bad_count() {
    let out = run(env!("CARGO_BIN_EXE_launch-kernel"), &["0"]);
    one_error_line(&out, "error: `0` is not a number of elements");
}

/// A word with a digit and a dot (a time, a rate, an address with its port) as `#`: what
/// differs from run to run.
fn masked(line: &str) -> String {
    let words = line.split(' ').map(|w| {
        let varies = w.contains('.') && w.chars().any(|c| c.is_ascii_digit());
        if varies {
            "#"
        } else {
            w
        }
    });
    words.collect::<Vec<_>>().join(" ")
}

#[test]
fn the_tutorial_shows_what_tcp_send_prints() {
    // The command as docs/tutorial.md gives it (`cargo run ... --bin tcp-send`, no size).
    let out = run(env!("CARGO_BIN_EXE_tcp-send"), &[]);
    assert!(out.status.success(), "{out:?}");
    let printed: Vec<String> = text(&out.stdout).lines().map(masked).collect();
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/tutorial.md"
    ))
    .expect("read docs/tutorial.md");
    let (_, after) = doc
        .split_once("prints both ends' accounts")
        .expect("the tutorial's tcp-send section");
    let block = after
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a text block after it");
    let shown: Vec<String> = block.lines().map(masked).collect();
    assert_eq!(
        shown, printed,
        "docs/tutorial.md against the program's output"
    );
}

#[test]
fn send_buffer_and_receive_buffer_move_your_bytes_checked_at_both_ends() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut receiver = Command::new(env!("CARGO_BIN_EXE_receive-buffer"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start receive-buffer");
    let mut lines = BufReader::new(receiver.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{first}"))
        .to_string();
    let out = run(env!("CARGO_BIN_EXE_send-buffer"), &[&addr, "5000003"]);
    let sent = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        sent.contains("sent 5000003 bytes in 5 chunks") && sent.contains("receiver: Verified"),
        "{sent}"
    );
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = receiver.wait().unwrap();
    assert!(status.success(), "{rest:?}");
    assert!(
        rest[0].starts_with("received 5000003 bytes named \"send-buffer.bin\""),
        "{rest:?}"
    );
    // The same digest at both ends, and again where the bytes were placed.
    let digest = sent
        .split("digest ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    assert!(rest[0].ends_with(&format!("digest {digest}")), "{rest:?}");
    assert!(
        rest[1].starts_with("checked again in ")
            && rest[1].ends_with(&format!("digest {digest} matches")),
        "{rest:?}"
    );
}

#[test]
fn endpoint_carries_a_hundred_transfers_into_the_callers_buffers() {
    let out = run(env!("CARGO_BIN_EXE_endpoint"), &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("100 transfers over one endpoint (TCP, 1 connection), 20390050 bytes"),
        "{stdout}"
    );
    assert!(lines[1].contains("polled"), "{stdout}");
    // The GPU line: equal where there is a GPU, left out (and why) where not.
    assert!(
        lines[2].ends_with(": equal") || lines[2].contains("left out"),
        "{stdout}"
    );
}
