//! The receiver's checks by checksum over verbs (filled in below).
