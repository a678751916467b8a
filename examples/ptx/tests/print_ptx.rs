//! The tutorial's example 1 as CI runs it: the whole module, one kernel, a wrong name.

use std::process::{Command, Output};

fn print_ptx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_print-ptx"))
        .args(args)
        .output()
        .expect("run print-ptx")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn prints_the_module_with_both_kernel_entry_points() {
    let out = print_ptx(&[]);
    assert!(out.status.success(), "print-ptx failed: {out:?}");
    let text = stdout(&out);
    assert!(
        text.starts_with("//"),
        "PTX from llc starts with its comment"
    );
    for kernel in ["generate_data", "verify_data"] {
        let line = format!(".visible .entry {kernel}(");
        assert!(
            text.lines().any(|l| l == line),
            "no `{line}` line in:\n{text}"
        );
    }
    assert!(text.contains("st.global.v4.b32"), "the 16-byte stores");
}

#[test]
fn prints_one_kernel_alone() {
    let out = print_ptx(&["generate_data"]);
    assert!(
        out.status.success(),
        "print-ptx generate_data failed: {out:?}"
    );
    let text = stdout(&out);
    assert!(text.starts_with(".visible .entry generate_data("), "{text}");
    assert!(text.trim_end().ends_with('}'), "{text}");
    assert!(!text.contains("verify_data"), "only generate_data: {text}");
}

#[test]
fn an_unknown_kernel_is_one_error_line() {
    let out = print_ptx(&["no_such_kernel"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err,
        "error: no kernel `no_such_kernel` in the PTX (its kernels: generate_data, verify_data)\n"
    );
}
