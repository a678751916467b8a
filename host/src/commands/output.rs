//! Words for people: shared by the commands' human output. (`--json` output is built
//! from the same result values in each command.)

use host::memory::Verification;

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

/// The error of iteration `i` (from 0) of `iters`: as it is for a single transfer, else
/// saying which iteration failed.
pub fn iteration_error(e: host::transfer::TransferError, i: u32, iters: u32) -> anyhow::Error {
    if iters == 1 {
        e.into()
    } else {
        anyhow::Error::new(e).context(format!("iteration {} of {iters}", i + 1))
    }
}
