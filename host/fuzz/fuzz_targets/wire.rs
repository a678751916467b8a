//! Everything the peer can send us goes through `transfer::header`'s decoders (the key
//! challenge and proof among them; over TCP, `transport::tcp::frames`' too): arbitrary bytes must never panic there, and whatever
//! decodes must encode back to a message that decodes to the same value.
#![no_main]

use host::transfer::header::{
    AcceptInfo, Ack, Challenge, Header, Proof, RejectReason, VerbsProof, HEADER_LEN,
};
use host::transport::tcp::frames::{Frame, Hello, FRAME_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = Header::decode(data) {
        assert_eq!(Header::decode(&header.encode()), Ok(header));
    }
    if let Ok(accept) = AcceptInfo::decode(data) {
        assert_eq!(AcceptInfo::decode(&accept.encode()), Ok(accept));
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
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
    }
    if let Ok(head) = <[u8; FRAME_LEN]>::try_from(data.get(..FRAME_LEN).unwrap_or_default()) {
        let frame = Frame::decode(&head);
        assert_eq!(Frame::decode(&frame.encode()), frame);
    }
});
