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

/// Skip `test` for `reason` (as [`skip`] does), except under CI: where the environment
/// variable `CI` is set (CI services set it), a test whose test bed is missing must fail,
/// not pass silently, so this panics instead.
pub fn skip_unless_ci(test: &str, reason: &str) {
    let ci = std::env::var("CI").unwrap_or_default();
    if !ci.is_empty() && ci != "0" && !ci.eq_ignore_ascii_case("false") {
        panic!("{test} cannot run, and CI (the environment variable CI is set) must not skip it: {reason}");
    }
    skip(test, reason);
}
