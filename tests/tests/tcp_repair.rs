//! Senders that misbehave during the repair rounds of protocol version 2 (issue 17's
//! adversary cases): each is a hand-written peer over loopback that sends a real offer
//! and real frames with one chunk's CRC32C wrong, reads the receiver's `Resend`, and
//! then stalls, resets, answers with a chunk it was not asked for, or lies about a
//! name's length. In every case the receiver must end that transfer within its
//! deadline, store nothing, and serve the next sender. Then receivers that lie to a
//! real sender, and last real transfers through a proxy that flips bits after TCP's
//! checksums ([`flip`]): the repair converges (issue 25 item 5).

mod tcp_common;

use host::integrity::crc32c;
use host::net::tcp::frames::{Frame, Hello};
use host::wire::Op;
use host::wire::{
    AcceptInfo, Ack, AckStatus, Header, Payload, Resend, VerifyMode, ACCEPT_LEN, ACK_LEN,
    REPLY_PREFIX_LEN,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tcp_common::flip::FlipProxy;
use tcp_common::*;

const CHUNK: u64 = 4096;
const CHUNKS: u64 = 3;
/// The chunk whose frame carries a wrong CRC32C on its first sending.
const BAD: u64 = 1;

/// A fresh, empty output directory of this test's own.
fn out_dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tcp-repair-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn files_in(d: &PathBuf) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The bytes of chunk `i` (any bytes will do: the payload is opaque).
fn chunk_bytes(i: u64) -> Vec<u8> {
    vec![i as u8 ^ 0x5a; CHUNK as usize]
}

/// One stream's frame of chunk `i`, with its true CRC32C or a wrong one.
fn frame(i: u64, true_crc: bool) -> Vec<u8> {
    let data = chunk_bytes(i);
    let crc = crc32c(&data) ^ if true_crc { 0 } else { 1 };
    let f = Frame {
        offset: i * CHUNK,
        len: CHUNK as u32,
        crc,
    };
    [&f.encode()[..], &data[..]].concat()
}

/// Offer an opaque, checksummed transfer of `CHUNKS` chunks on one stream, send every
/// chunk (chunk `BAD` with a wrong CRC32C) and read the receiver's request to send
/// `BAD` again. The stream, left at the point where the resent chunk is due.
fn up_to_the_resend(port: u16, named: Option<&[u8]>) -> TcpStream {
    // Opaque bytes are checked by CRC32C, with up to 16 rounds of resends: the
    // defaults. This sender does not offer pieces: it is asked for whole chunks.
    let mut header = Header::of(Op::Send, CHUNKS * CHUNK, CHUNK, 16, Payload::Opaque).unwrap();
    assert_eq!(header.verify, VerifyMode::Checksum);
    if named.is_some() {
        header = header.with_name();
    }
    let hello = Hello {
        index: 0,
        count: 1,
        rail: 0,
        token: 7,
    };
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[&header.encode()[..], &hello.encode()[..]].concat())
        .unwrap();
    if let Some(name) = named {
        s.write_all(name).unwrap();
    }
    let mut accept = [0u8; ACCEPT_LEN];
    s.read_exact(&mut accept).expect("an answer to the offer");
    AcceptInfo::decode(&accept).expect("an accept");
    for i in 0..CHUNKS {
        s.write_all(&frame(i, i != BAD)).unwrap();
    }
    let reply = read_message(&s).expect("a reply after the data");
    let (round, last, count) =
        Resend::decode_prefix(&reply, CHUNKS).expect("a resend request, not an ack");
    let body = &reply[REPLY_PREFIX_LEN..];
    let resend = Resend::decode_chunks(round, last, count, body, CHUNKS).unwrap();
    assert_eq!(
        resend.chunks,
        [BAD as u32],
        "the receiver asks for the bad chunk"
    );
    assert_eq!((round, last), (1, false));
    s
}

/// Read until the receiver closes the stream; how long that took, or `None` within
/// `limit`.
fn closed_after(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = [0u8; 256];
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(t0.elapsed()),
        }
    }
    None
}

/// A real sender's small file reaches `out` whole: the receiver serves on.
fn next_sender_is_served(r: &Receiver, out: &PathBuf, tag: &str) {
    let input = out.with_extension("next");
    std::fs::write(&input, b"served after the misbehaving peer").unwrap();
    let sent = send(
        r.port,
        &["--input", input.to_str().unwrap(), "--name", "next.bin"],
        Duration::from_secs(30),
    );
    assert_verified(&sent, tag);
    assert_eq!(files_in(out), ["next.bin"], "{tag}");
    assert_eq!(
        std::fs::read(out.join("next.bin")).unwrap(),
        std::fs::read(&input).unwrap()
    );
}

#[test]
fn a_sender_that_stalls_in_a_resend_round_is_ended_within_timeout_and_nothing_is_stored() {
    let out = out_dir("stall");
    let r = Receiver::start(&["--timeout", "1", "--output", out.to_str().unwrap()]);
    let mut s = up_to_the_resend(r.port, None);
    // Silence, with the socket open: only the receiver's deadline can end this.
    let closed = closed_after(&mut s, Duration::from_secs(10))
        .expect("the receiver kept a sender stalled in a resend round past 10 s");
    eprintln!("MEASURED stalled resend round (--timeout 1): closed after {closed:?}");
    assert!(
        closed >= Duration::from_millis(900),
        "closed early: {closed:?}"
    );
    // The whole-transfer deadline (--timeout, plus the size at --min-rate) ended it.
    r.wait_for_log("too slow: 12 KiB of 12 KiB", Duration::from_secs(5));
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
    next_sender_is_served(&r, &out, "after a stalled resend round");
}

#[test]
fn a_sender_that_resets_in_a_resend_round_leaves_nothing_stored() {
    let out = out_dir("reset");
    let r = Receiver::start(&["--timeout", "5", "--output", out.to_str().unwrap()]);
    let s = up_to_the_resend(r.port, None);
    // A reset, not a clean close: linger 0 makes close() send RST.
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    let t0 = Instant::now();
    drop(s);
    r.wait_for_log(
        "(in resend round 1, 1 chunk(s) asked again: the peer reset the connection",
        Duration::from_secs(4),
    );
    eprintln!(
        "MEASURED reset in a resend round: reported after {:?}",
        t0.elapsed()
    );
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
    next_sender_is_served(&r, &out, "after a reset in a resend round");
}

#[test]
fn a_resent_chunk_that_was_not_asked_for_ends_the_transfer() {
    let out = out_dir("unasked");
    let r = Receiver::start(&["--timeout", "5", "--output", out.to_str().unwrap()]);
    let mut s = up_to_the_resend(r.port, None);
    // Chunk 2 passed its check; sending it "again" in place of chunk 1 is a lie.
    s.write_all(&frame(2, true)).unwrap();
    let closed = closed_after(&mut s, Duration::from_secs(4));
    assert!(
        closed.is_some(),
        "the receiver took a chunk it did not ask for"
    );
    r.wait_for_log(
        "at offset 8192 where chunk 1 (4096 bytes at 4096) was due",
        Duration::from_secs(4),
    );
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
    next_sender_is_served(&r, &out, "after an unasked chunk");
}

#[test]
fn a_name_shorter_than_its_length_is_ended_by_the_handshake_deadline() {
    let out = out_dir("name");
    let r = Receiver::start(&["--timeout", "1", "--output", out.to_str().unwrap()]);
    let header = Header::of(Op::Send, CHUNKS * CHUNK, CHUNK, 16, Payload::Opaque)
        .unwrap()
        .with_name();
    let hello = Hello {
        index: 0,
        count: 1,
        rail: 0,
        token: 9,
    };
    // The name message says 200 bytes and brings 3, then nothing.
    let mut name = host::wire::encode_name(&"n".repeat(200)).unwrap();
    name.truncate(name.len() - 197);
    let mut s = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
    s.write_all(&[&header.encode()[..], &hello.encode()[..], &name[..]].concat())
        .unwrap();
    let closed = closed_after(&mut s, Duration::from_secs(10))
        .expect("the receiver waited past 10 s for the rest of a name");
    eprintln!("MEASURED name cut short (--timeout 1): closed after {closed:?}");
    assert!(
        closed < Duration::from_secs(3),
        "the handshake deadline is --timeout: {closed:?}"
    );
    // A name longer than a file name may be is refused without waiting for it.
    let mut s = TcpStream::connect(("127.0.0.1", r.port)).unwrap();
    let mut lie = name[..8].to_vec();
    lie[6..8].copy_from_slice(&60_000u16.to_le_bytes());
    s.write_all(&[&header.encode()[..], &hello.encode()[..], &lie[..]].concat())
        .unwrap();
    let closed = closed_after(&mut s, Duration::from_secs(10))
        .expect("the receiver waited for a 60000-byte name");
    assert!(closed < Duration::from_millis(900), "{closed:?}");
    assert!(files_in(&out).is_empty());
    next_sender_is_served(&r, &out, "after lying names");
}

#[test]
fn a_chunk_that_fails_on_every_attempt_is_not_counted_repaired_and_the_ack_has_no_digest() {
    let out = out_dir("always-bad");
    let r = Receiver::start(&[
        "--timeout",
        "5",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    let mut s = up_to_the_resend(r.port, None);
    // Chunk BAD comes again with a wrong CRC32C in every round the receiver asks for.
    let mut rounds = 0;
    let given_up = loop {
        s.write_all(&frame(BAD, false)).unwrap();
        let reply = read_message(&s).expect("a reply after the resent chunk");
        let (round, last, count) =
            Resend::decode_prefix(&reply, CHUNKS).expect("a resend request, not yet the ack");
        let body = &reply[REPLY_PREFIX_LEN..];
        let resend = Resend::decode_chunks(round, last, count, body, CHUNKS).unwrap();
        assert_eq!(resend.chunks, [BAD as u32]);
        rounds += 1;
        assert!(rounds <= 16, "more rounds than --max-resends 16");
        if last {
            break resend.chunks;
        }
    };
    let bytes = read_message(&s).expect("the ack after the final list");
    assert_eq!(bytes.len(), ACK_LEN);
    let ack = Ack::decode(&bytes).unwrap();
    eprintln!(
        "MEASURED a chunk failing on every attempt: final list {given_up:?} after {rounds} rounds; ack {:?}, {} repaired, digest {:?}",
        ack.status, ack.repaired, ack.digest
    );
    assert_eq!(ack.status, AckStatus::ChecksumFailed);
    assert_eq!(
        ack.repaired, 0,
        "a chunk that never passed counted as repaired"
    );
    assert_eq!(ack.digest, None, "a digest of bytes that did not verify");
    // The receiver's own report says the same.
    r.wait_for_log("\"failed_chunks\":[1]", Duration::from_secs(5));
    let log = r.log();
    assert!(log.contains("\"repaired\":[]"), "{log}");
    assert!(log.contains("\"digest\":null"), "{log}");
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
}

// --- a receiver that misbehaves in the repair rounds ------------------------------------

/// A hand-written receiver on loopback: takes one offer of `CHUNKS` chunks on one stream,
/// accepts it, reads the data, then writes `replies` (encoded messages, each framed as a
/// control message) as long as the sender reads them, at most `times` times, and reads
/// whatever comes until the sender hangs up. Its port, and how many times it wrote
/// `replies`.
fn lying_receiver(replies: Vec<Vec<u8>>, times: usize) -> (u16, std::thread::JoinHandle<usize>) {
    let replies: Vec<u8> = replies.iter().flat_map(|r| message(r)).collect();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let serve = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut offer = [0u8; 32 + 20];
        s.read_exact(&mut offer).unwrap();
        let header = Header::decode(&offer[..32]).unwrap();
        let accept = AcceptInfo {
            addr: 0,
            rkey: 0,
            len: header.total_bytes,
        };
        s.write_all(&accept.encode()).unwrap();
        let mut data = vec![0u8; (CHUNKS * (16 + CHUNK)) as usize];
        s.read_exact(&mut data).unwrap();
        let written = (0..times)
            .take_while(|_| s.write_all(&replies).is_ok())
            .count();
        // Take what the sender sends again until it hangs up (within the read timeout).
        let mut sink = [0u8; 1 << 16];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        written
    });
    (port, serve)
}

/// Send `CHUNKS` chunks of a file to a lying receiver on `port`: the sender's error,
/// which there must be.
fn sender_error(port: u16, tag: &str) -> String {
    let input = out_dir(tag).join("three-chunks.bin");
    std::fs::write(&input, vec![7u8; (CHUNKS * CHUNK) as usize]).unwrap();
    let args = ["--chunk", "4KiB", "--streams", "1", "--input"];
    let input = input.to_str().unwrap();
    let out = send(
        port,
        &[&args[..], &[input]].concat(),
        Duration::from_secs(20),
    );
    assert!(
        !out.status.success(),
        "the sender believed a lying receiver"
    );
    text(&out).1
}

#[test]
fn a_receiver_that_repeats_its_final_resend_list_is_refused_not_served_for_ever() {
    let last = Resend {
        round: 4,
        last: true,
        missing: false,
        chunks: vec![1],
    }
    .encode();
    // Eight copies: a sender that took every list would, after the eighth, wait for an
    // ack that never comes and fail otherwise (tried: "the peer closed the connection
    // while waiting for the receiver's reply"). Fewer than the inbox's MAX_WAITING (64),
    // so its flood bound cannot answer first: with a million copies it did once, on a
    // loaded machine (a local CI run of 3686675), while the sender was still ending its
    // pass; a correct refusal too, but not the one this test is about (the flood has its
    // own tests in engine/inbox.rs and api).
    let copies = 8;
    assert!(copies < host::engine::inbox::MAX_WAITING);
    let (port, serve) = lying_receiver(vec![last], copies);
    let t0 = Instant::now();
    let stderr = sender_error(port, "repeated-last");
    assert!(stderr.contains("a second final resend list"), "{stderr}");
    eprintln!(
        "MEASURED repeated final resend lists: sender ended after {:?}, {} lists written",
        t0.elapsed(),
        serve.join().unwrap()
    );
}

#[test]
fn a_receiver_that_asks_for_more_rounds_than_offered_is_refused() {
    // Every round asks for every chunk; round 17 is one more than --max-resends 16.
    let replies: Vec<Vec<u8>> = (1..=17)
        .map(|round| {
            Resend {
                round,
                last: false,
                missing: false,
                chunks: vec![0, 1, 2],
            }
            .encode()
        })
        .collect();
    let (port, serve) = lying_receiver(replies, 1);
    let stderr = sender_error(port, "extra-round");
    assert!(
        stderr.contains("resend round 17 after 16, beyond this sender's --max-resends 16"),
        "{stderr}"
    );
    serve.join().unwrap();
}

#[test]
fn a_receiver_that_acks_verified_after_its_final_resend_list_is_not_believed() {
    // The final list names chunk 1 as still failing; then an ack that says every chunk
    // verified, with the very digest the sender computed (the receiver had its CRC32Cs)
    // and nothing repaired: only a checksum-failed ack fits after that list.
    let data = vec![7u8; (CHUNKS * CHUNK) as usize];
    let crcs: Vec<u32> = data.chunks(CHUNK as usize).map(crc32c).collect();
    let digest = host::integrity::digest(&crcs, CHUNK, CHUNKS * CHUNK);
    let last = Resend {
        round: 4,
        last: true,
        missing: false,
        chunks: vec![1],
    }
    .encode();
    let verified = Ack::checked(CHUNKS * CHUNK, None, Some(digest), 0);
    assert_eq!(verified.status, AckStatus::Verified);
    let (port, serve) = lying_receiver(vec![last, verified.encode().to_vec()], 1);
    let stderr = sender_error(port, "verified-after-last");
    assert!(
        stderr.contains("acked verified after its final resend list named 1 chunk(s)"),
        "{stderr}"
    );
    serve.join().unwrap();
}

#[test]
fn a_receiver_that_asks_for_pieces_its_chunks_cannot_be_cut_into_is_refused() {
    // The sender offers pieces (it checksums), but 4 KiB chunks are the floor: no piece
    // of 4 KiB is smaller than its chunk.
    let bad = host::wire::pieces::PieceResend {
        round: 1,
        shift: 12,
        pieces: vec![0],
    }
    .encode();
    let (port, serve) = lying_receiver(vec![bad], 1);
    let stderr = sender_error(port, "bad-pieces");
    assert!(
        stderr.contains("invalid request for pieces: inconsistent message: a piece request whose pieces are not"),
        "{stderr}"
    );
    serve.join().unwrap();
}

// --- repair that converges on a path that flips bits ------------------------------------

/// `len` pseudo-random bytes (xorshift64*, seeded): incompressible, reproducible.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The receiver's report line of the last transfer, in its JSON log.
fn last_json_line(log: &str) -> String {
    log.lines()
        .rev()
        .find(|l| l.contains("\"integrity\""))
        .unwrap_or_default()
        .to_string()
}

/// Send `input` through a proxy that flips a bit in `share` of its 64 KiB reads to a
/// receiver storing into `out`, over 4 streams: the sender's output and how long it
/// took, with the proxy's flips.
fn through_flips(
    r: &Receiver,
    input: &std::path::Path,
    name: &str,
    share: f64,
    seed: u64,
) -> (std::process::Output, Duration, u64) {
    let proxy = FlipProxy::start(r.port, share, seed);
    let t0 = Instant::now();
    let out = send(
        proxy.port,
        &[
            "--input",
            input.to_str().unwrap(),
            "--streams",
            "4",
            "--name",
            name,
            "--timeout",
            "10",
        ],
        Duration::from_secs(120),
    );
    let took = t0.elapsed();
    (out, took, proxy.flips())
}

/// The tests that push 64 MiB through the flipping proxy take this lock, so that the
/// timed one is not measured against another's load: the other tests of this binary
/// run beside them on the same cores (a CI run with the 100% case running beside the
/// 10% case measured 2.25x; alone, 1.24x).
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_64_mib_file_through_bit_flips_in_3_and_10_percent_of_reads_arrives_whole_in_at_most_twice_the_clean_time(
) {
    let _alone = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let out = out_dir("flips");
    let input = out.with_extension("input");
    let data = random_bytes(64 << 20, 25);
    std::fs::write(&input, &data).unwrap();
    let r = Receiver::start(&[
        "--timeout",
        "10",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    for (share, seed) in [(0.03, 3u64), (0.10, 10)] {
        // Each flipped run is paired with a clean run through the same proxy, flipping
        // nothing, just before it, and the best of three pairs is compared: what else
        // the machine is doing then weighs on both sides alike.
        let mut clean = Duration::MAX;
        let mut took = Duration::MAX;
        let mut flips = 0;
        for k in 0..3 {
            let name = format!("clean-{seed}-{k}.bin");
            let (sent, t, f) = through_flips(&r, &input, &name, 0.0, 1);
            assert_verified(&sent, "clean");
            assert_eq!(f, 0);
            assert!(std::fs::read(out.join(&name)).unwrap() == data);
            clean = clean.min(t);

            let name = format!("flips-{seed}-{k}.bin");
            let (sent, t, f) = through_flips(&r, &input, &name, share, seed + k);
            assert_verified(&sent, &format!("{share} of reads flipped"));
            let stored = std::fs::read(out.join(&name)).unwrap();
            assert!(stored == data, "the stored file differs from the input");
            took = took.min(t);
            flips += f;
        }
        let report = last_json_line(&r.log());
        eprintln!(
            "MEASURED 64 MiB over 4 streams, one bit flipped in {:.0}% of 64 KiB reads ({flips} flips in three runs): best {took:?}, clean best {clean:?} ({:.2}x)",
            share * 100.0,
            took.as_secs_f64() / clean.as_secs_f64()
        );
        assert!(flips > 0, "the proxy flipped nothing");
        assert!(report.contains("\"repaired\":[{"), "{report}");
        assert!(
            took <= clean * 2,
            "{share}: {took:?}, more than twice the clean {clean:?}"
        );
    }
}

#[test]
fn bit_flips_in_every_read_end_in_a_clear_error_in_bounded_time_and_nothing_is_stored() {
    let _alone = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let out = out_dir("flip-all");
    let input = out.with_extension("input");
    std::fs::write(&input, random_bytes(64 << 20, 100)).unwrap();
    let r = Receiver::start(&[
        "--timeout",
        "10",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    let (sent, took, flips) = through_flips(&r, &input, "all.bin", 1.0, 100);
    let (_, stderr) = text(&sent);
    eprintln!(
        "MEASURED every 64 KiB read flipped ({flips} flips): failed after {took:?}: {stderr}"
    );
    assert!(!sent.status.success());
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{stderr}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    if stderr.contains("still failed their CRC32C after") {
        assert!(stderr.contains("they stopped repairing"), "{stderr}");
        r.wait_for_log("\"failed_chunks\":[", Duration::from_secs(5));
    } else {
        // A flip that lands in a frame's header (its offset or length: 16 bytes in each
        // chunk's or piece's frame) is a protocol error, not a repair, and one in a
        // control message (a query's answer, say: framed with a CRC32C of its own) fails
        // that CRC32C: either way the receiver names it and ends the connection, and the
        // sender's one line says the connection ended. With every read flipped that
        // happens in about half the runs.
        eprintln!(
            "MEASURED a frame's header or a message was hit: the receiver's log:\n{}",
            r.log()
        );
        r.wait_for_log("error: incomplete transfer", Duration::from_secs(5));
        let log = r.log();
        assert!(
            log.contains("protocol error")
                || log.contains("a message from the sender failed its CRC32C"),
            "the receiver names what was hit: {log}"
        );
        // What it says arrived is never more than the transfer (resent bytes are not).
        let log = r.log();
        if let Some((_, rest)) = log.split_once("got ") {
            let mut words = rest.split_whitespace();
            let got: u64 = words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            assert!(
                got <= 64 << 20,
                "the receiver claims {got} bytes of 64 MiB: {log}"
            );
        }
    }
    assert!(files_in(&out).is_empty(), "{:?}", files_in(&out));
    next_sender_is_served(&r, &out, "after a path that flips every read");
}
