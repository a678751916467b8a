//! Everything the peer can send us goes through `wire`'s decoders, one family of messages
//! after another (offer, answers, acks, repair, pieces, auth, names; over TCP,
//! `net::tcp::frames`' too): arbitrary bytes must never panic there, and whatever
//! decodes must encode back to a message that decodes to the same value.
#![no_main]

use host::net::tcp::frames::{Frame, Hello, FRAME_LEN};
use host::wire::pieces::{self, PieceResend, PIECES_MAGIC, QUERY_MAGIC};
use host::wire::{
    checked_name, decode_name_prefix, AcceptInfo, Ack, Challenge, ChunkChecksums, Header, Join, NextOffer,
    Proof, RejectReason, Resend, StripedAccept, VerbsProof, HEADER_LEN, NAME_PREFIX_LEN,
    REPLY_PREFIX_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = Header::decode(data) {
        assert_eq!(Header::decode(&header.encode()), Ok(header));
    }
    if let Ok(next) = NextOffer::decode(data) {
        let again = next.encode().expect("a decoded next offer encodes");
        assert_eq!(NextOffer::decode(&again), Ok(next));
    }
    if let Ok(accept) = AcceptInfo::decode(data) {
        assert_eq!(AcceptInfo::decode(&accept.encode()), Ok(accept));
    }
    // Striped verbs transfers: rail 0's accept with its token, a further rail's join.
    if let Ok(accept) = StripedAccept::decode(data) {
        assert_eq!(StripedAccept::decode(&accept.encode()), Ok(accept));
    }
    if let Ok(join) = Join::decode(data) {
        assert_eq!(Join::decode(&join.encode()), Ok(join));
    }
    if let Some(reason) = RejectReason::decode(data) {
        assert_eq!(RejectReason::decode(&reason.encode()), Some(reason));
    }
    if let Ok(ack) = Ack::decode(data) {
        assert_eq!(Ack::decode(&ack.encode()), Ok(ack));
    }
    if let Ok(challenge) = Challenge::decode(data) {
        assert_eq!(Challenge::decode(&challenge.encode()), Ok(challenge));
    }
    if let Ok(proof) = Proof::decode(data) {
        assert_eq!(Proof::decode(&proof.encode()), Ok(proof));
    }
    if let Some(proof) = VerbsProof::decode(data) {
        let data = proof.private_data(&[0u8; HEADER_LEN]);
        assert_eq!(VerbsProof::decode(&data), Some(proof));
    }
    // Version 2's messages: a resend request (its count checked against a transfer of
    // 1000 chunks before the list is read), chunk checksums, a name.
    if let Ok((round, last, count)) = Resend::decode_prefix(data, 1000) {
        let body = data.get(REPLY_PREFIX_LEN..).unwrap_or_default();
        if let Ok(resend) = Resend::decode_chunks(round, last, count, body, 1000) {
            let again = resend.encode();
            let (r, l, c) = Resend::decode_prefix(&again, 1000).unwrap();
            let back = Resend::decode_chunks(r, l, c, &again[REPLY_PREFIX_LEN..], 1000);
            assert_eq!(back, Ok(resend));
        }
    }
    // The repair in pieces (a transfer of 64 MiB in 1 MiB chunks): a piece request, a
    // query (the same layout), the sender's answer.
    let (total, chunk) = (64 << 20, 1 << 20);
    for magic in [PIECES_MAGIC, QUERY_MAGIC] {
        if let Ok((round, shift, n)) = PieceResend::decode_head_as(data, magic, total, chunk) {
            let body = data.get(REPLY_PREFIX_LEN..).unwrap_or_default();
            if let Ok(p) = PieceResend::decode_pieces(round, shift, n, body, total) {
                let again = match magic == PIECES_MAGIC {
                    true => p.encode(),
                    false => p.encode_query(),
                };
                let head = PieceResend::decode_head_as(&again, magic, total, chunk);
                assert_eq!(head, Ok((round, shift, n)));
                let back =
                    PieceResend::decode_pieces(round, shift, n, &again[REPLY_PREFIX_LEN..], total);
                assert_eq!(back, Ok(p));
            }
        }
    }
    if data.len() >= REPLY_PREFIX_LEN {
        let count = u32::from_le_bytes([data[12], data[13], data[14], data[15]]);
        let round = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
        if pieces::decode_crcs_head(data, round, count).is_ok() {
            let body = &data[REPLY_PREFIX_LEN..];
            if body.len() >= count as usize * 4 {
                let crcs = pieces::decode_crcs(&body[..count as usize * 4]);
                let again = pieces::encode_crcs(round, &crcs);
                assert_eq!(pieces::decode_crcs(&again[REPLY_PREFIX_LEN..]), crcs);
            }
        }
    }
    if let Ok(sums) = ChunkChecksums::decode(data, 1 << 20) {
        assert_eq!(ChunkChecksums::decode(&sums.encode(), 1 << 20), Ok(sums));
    }
    if let Ok(len) = decode_name_prefix(data) {
        if let Some(Ok(name)) = data
            .get(NAME_PREFIX_LEN..NAME_PREFIX_LEN + len)
            .map(checked_name)
        {
            assert!(!name.contains('/') && name != ".." && !name.is_empty());
        }
    }
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
    }
    if let Ok(head) = <[u8; FRAME_LEN]>::try_from(data.get(..FRAME_LEN).unwrap_or_default()) {
        let frame = Frame::decode(&head);
        assert_eq!(Frame::decode(&frame.encode()), frame);
    }
});
