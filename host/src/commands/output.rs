//! Words for people: shared by the commands' human output. (`--json` output is built
//! from the same result values in each command.)

use host::memory::Verification;
use host::transfer::report::Integrity;
use host::wire::{printable, Payload, VerifyMode};

/// Human output: stdout normally, stderr when stdout carries JSON.
pub struct Human {
    pub to_stderr: bool,
}

impl Human {
    pub fn line(&self, text: impl AsRef<str>) {
        if self.to_stderr {
            eprintln!("{}", text.as_ref());
        } else {
            println!("{}", text.as_ref());
        }
    }
}

pub fn values_line(values: &[i32]) -> String {
    let list: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("First {} values: {}", values.len(), list.join(", "))
}

pub fn verification_words(v: &Verification) -> String {
    let crc = v
        .crc32
        .map(|c| format!(", crc32 {c:#010x}"))
        .unwrap_or_default();
    if v.ok() && v.elements == 1 {
        format!("the 1 element matches the pattern{crc}")
    } else if v.ok() {
        format!("all {} elements match the pattern{crc}", v.elements)
    } else {
        format!(
            "does not match the pattern: {} of {} elements differ (first mismatch at element {}){crc}",
            v.mismatches,
            v.elements,
            v.first_mismatch
                .map_or_else(|| "?".to_string(), |i| i.to_string())
        )
    }
}

/// The checksum lines of a transfer (version 2): what was checked, what was repaired,
/// where it was stored. Empty where nothing of it applied.
pub fn integrity_lines(i: &Integrity) -> Vec<String> {
    let mut lines = Vec::new();
    if i.verify == Some(VerifyMode::Off) {
        lines.push("checks: none (--verify off): the bytes were counted, not checked".into());
    }
    // Chunks that still failed come first: such a transfer has no digest (nothing
    // verified to take one of).
    if !i.failed_chunks.is_empty() {
        let shown: Vec<String> = i
            .failed_chunks
            .iter()
            .take(8)
            .map(|c| c.to_string())
            .collect();
        lines.push(format!(
            "checksums: {} chunk(s) still failed after the resends: {}{}",
            i.failed_chunks.len(),
            shown.join(", "),
            if i.failed_chunks.len() > 8 {
                ", ..."
            } else {
                ""
            }
        ));
    } else if let Some(digest) = i.digest {
        let repaired = match i.repaired.len() {
            0 => String::new(),
            n => format!(
                "; {n} chunk{} failed and {} repaired by sending {} again",
                if n == 1 { "" } else { "s" },
                if n == 1 { "was" } else { "were" },
                if n == 1 { "it" } else { "them" }
            ),
        };
        lines.push(format!(
            "checksums: CRC32C of every chunk matched where it landed (digest {digest:#010x}){repaired}"
        ));
    }
    // Both may hold the sender's name (or a path of the user's): escaped, so that no
    // character in it can reorder or hide what a terminal shows.
    if let Some(at) = &i.stored {
        lines.push(format!("stored: {}", printable(at)));
    }
    if let Some(e) = &i.store_error {
        lines.push(format!("not stored: {}", printable(e)));
    }
    if let Some(f) = &i.fault_injection {
        lines.push(format!(
            "TEST fault injection was on ({f} chunks corrupted on the wire)"
        ));
    }
    lines
}

/// Whether the transfer carried the user's bytes (no pattern to show values of).
pub fn is_user_data(i: &Integrity) -> bool {
    i.payload == Some(Payload::Opaque)
}

/// The error of iteration `i` (from 0) of `iters`: as it is for a single transfer, else
/// saying which iteration failed.
pub fn iteration_error(e: host::transfer::TransferError, i: u32, iters: u32) -> anyhow::Error {
    if iters == 1 {
        e.into()
    } else {
        anyhow::Error::new(e).context(format!("iteration {} of {iters}", i + 1))
    }
}

/// A striped transfer's rails: one line of what each carried, and one line per failover.
pub fn rail_lines(rails: &[host::transfer::report::RailReport]) -> Vec<String> {
    if rails.is_empty() {
        return Vec::new();
    }
    let name = |r: &host::transfer::report::RailReport| {
        format!(
            "rail {} ({})",
            r.rail,
            r.local.as_deref().unwrap_or(&r.remote)
        )
    };
    let carried: Vec<String> = rails
        .iter()
        .map(|r| match &r.left_out {
            Some(why) if r.chunks == 0 => format!("{}: none, {why}", name(r)),
            _ => format!(
                "{}: {} chunk{} ({})",
                name(r),
                r.chunks,
                if r.chunks == 1 { "" } else { "s" },
                host::units::format_bytes(r.bytes)
            ),
        })
        .collect();
    let mut lines = vec![format!("rails: {}", carried.join("; "))];
    for r in rails.iter().filter(|r| r.failures > 0) {
        let resent: Vec<String> = rails
            .iter()
            .filter(|o| o.resends > 0)
            .map(|o| format!("{} on rail {}", o.resends, o.rail))
            .collect();
        lines.push(format!(
            "failover: {} failed after {:.3} s ({}); {} chunk{} in flight moved; chunks resent: {}; stalled {:.3} s beyond the detection",
            name(r),
            r.failed_after_seconds.unwrap_or(0.0),
            r.failed.as_deref().unwrap_or("?"),
            r.moved_chunks,
            if r.moved_chunks == 1 { "" } else { "s" },
            if resent.is_empty() {
                "none".to_string()
            } else {
                resent.join(", ")
            },
            r.stall_beyond_detection_seconds.unwrap_or(0.0)
        ));
    }
    lines
}

/// What a receiver got over each rail of a striped connection, in one line.
pub fn received_rails_line(s: &host::transfer::report::StripedRecv) -> String {
    let rails: Vec<String> = s
        .rails
        .iter()
        .map(|r| {
            let mut text = format!(
                "rail {}{}: {} chunk{} ({})",
                r.rail,
                r.from
                    .as_deref()
                    .map(|f| format!(" from {f}"))
                    .unwrap_or_default(),
                r.chunks,
                if r.chunks == 1 { "" } else { "s" },
                host::units::format_bytes(r.bytes)
            );
            if r.copies_dropped > 0 {
                text += &format!(", {} copies dropped", r.copies_dropped);
            }
            if let Some(why) = &r.stopped {
                text += &format!(", stopped: {why}");
            }
            text
        })
        .collect();
    let asked = match s.asked_again {
        0 => String::new(),
        n => format!("; {n} chunks missing after a pass were asked for again"),
    };
    format!("rails: {}{asked}", rails.join("; "))
}
