//! Senders that misbehave during the repair rounds of protocol version 2 (issue 17's
//! adversary cases): each is a hand-written peer over loopback that sends a real offer
//! and real frames with one chunk's CRC32C wrong, reads the receiver's `Resend`, and
//! then stalls, resets, answers with a chunk it was not asked for, or lies about a
//! name's length. In every case the receiver must end that transfer within its
//! deadline, store nothing, and serve the next sender.

mod tcp_common;

use host::integrity::crc32c;
use host::transport::tcp::frames::{Frame, Hello};
use host::wire::Op;
use host::wire::{
    AcceptInfo, Ack, AckStatus, Header, Payload, Resend, VerifyMode, ACCEPT_LEN, ACK_LEN,
    REPLY_PREFIX_LEN,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};
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
    // Opaque bytes are checked by CRC32C, with 3 rounds of resends: the defaults.
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
    let mut prefix = [0u8; REPLY_PREFIX_LEN];
    s.read_exact(&mut prefix).expect("a reply after the data");
    let (round, last, count) =
        Resend::decode_prefix(&prefix, CHUNKS).expect("a resend request, not an ack");
    let mut body = vec![0u8; count as usize * 4];
    s.read_exact(&mut body).unwrap();
    let resend = Resend::decode_chunks(round, last, count, &body, CHUNKS).unwrap();
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
        let mut prefix = [0u8; REPLY_PREFIX_LEN];
        s.read_exact(&mut prefix)
            .expect("a reply after the resent chunk");
        let (round, last, count) =
            Resend::decode_prefix(&prefix, CHUNKS).expect("a resend request, not yet the ack");
        let mut body = vec![0u8; count as usize * 4];
        s.read_exact(&mut body).unwrap();
        let resend = Resend::decode_chunks(round, last, count, &body, CHUNKS).unwrap();
        assert_eq!(resend.chunks, [BAD as u32]);
        rounds += 1;
        assert!(rounds <= 3, "more rounds than --max-resends 3");
        if last {
            break resend.chunks;
        }
    };
    let mut bytes = [0u8; ACK_LEN];
    s.read_exact(&mut bytes)
        .expect("the ack after the final list");
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
/// accepts it, reads the data, then writes `replies` (encoded messages) as long as the
/// sender reads them, at most `times` times, and reads whatever comes until the sender
/// hangs up. Its port, and how many times it wrote `replies`.
fn lying_receiver(replies: Vec<u8>, times: usize) -> (u16, std::thread::JoinHandle<usize>) {
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
    let (port, serve) = lying_receiver(last, 1_000_000);
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
    // Every round asks for every chunk; round 4 is one more than --max-resends 3.
    let replies: Vec<u8> = (1..=4)
        .flat_map(|round| {
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
        stderr.contains("resend round 4 after 3, beyond this sender's --max-resends 3"),
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
    let (port, serve) = lying_receiver([&last[..], &verified.encode()[..]].concat(), 1);
    let stderr = sender_error(port, "verified-after-last");
    assert!(
        stderr.contains("acked verified after its final resend list named 1 chunk(s)"),
        "{stderr}"
    );
    serve.join().unwrap();
}
