//! Helpers shared by the integration tests in `tests/tests/`.

use std::io::Write;

/// Say loudly that a test did not run and why. Written straight to the process's stderr,
/// past libtest's capture, so the reason shows in `cargo test` output (and in CI's log)
/// next to the test's `ok`.
pub fn skip(test: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}

/// The workspace root (the tests crate lives in `<root>/tests`).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}
