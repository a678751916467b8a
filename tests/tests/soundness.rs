//! The soundness model's rules that a reader of the source can check, checked here so
//! they stay true (README, section "Soundness: where `unsafe` lives and why"):
//!
//! * the README's list of files that contain `unsafe` is exactly the set of such files;
//! * every `unsafe` block, `unsafe impl` and `unsafe fn` carries its `SAFETY` note (or,
//!   for an `unsafe fn` or trait, a `# Safety` section);
//! * no safe public function of `host` takes a raw pointer or a raw device or
//!   registration address (`u64` named as one).

use integration_tests::workspace_root;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- unsafe-files:begin -->";
const END: &str = "<!-- unsafe-files:end -->";

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The code of a line: without its `//` comment and the contents of string literals
/// (enough for this source tree: no `//` or quotes inside char literals).
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            if c == '\\' {
                chars.next();
            } else if c == '"' {
                in_string = false;
                out.push('"');
            }
            continue;
        }
        if c == '"' {
            in_string = true;
            out.push('"');
            continue;
        }
        if c == '/' && chars.peek() == Some(&'/') {
            break;
        }
        out.push(c);
    }
    out
}

fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// The source files of the crates whose `unsafe` the README accounts for.
fn sources() -> Vec<(String, String)> {
    let root = workspace_root();
    ["host/src", "gpu-kernels/src"]
        .iter()
        .flat_map(|dir| rust_files(&root.join(dir)))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, text)
        })
        .collect()
}

#[test]
fn the_readme_lists_exactly_the_files_that_contain_unsafe() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let section = readme
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(list, _)| list)
        .expect("README.md has the unsafe-files markers");
    let listed: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(path, _)| path.to_string())
        .collect();
    let found: BTreeSet<String> = sources()
        .into_iter()
        .filter(|(_, text)| text.lines().any(|l| has_word(&code_of(l), "unsafe")))
        .map(|(path, _)| path)
        .collect();
    let unlisted: Vec<_> = found.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&found).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "README.md's list of files with `unsafe` is out of date: add {unlisted:?}, remove {stale:?}"
    );
}

#[test]
fn every_unsafe_block_impl_and_fn_says_why_it_is_sound() {
    let mut missing = Vec::new();
    for (path, text) in sources() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = code_of(line);
            if !has_word(&code, "unsafe") {
                continue;
            }
            // Look back over the comment and attribute lines just above (and the line
            // itself, and the statement it continues, a few lines up).
            let window = &lines[i.saturating_sub(12)..=i];
            let declares = ["unsafe fn", "unsafe extern", "unsafe trait"]
                .iter()
                .any(|d| code.contains(d));
            let noted = if declares {
                window.iter().any(|l| l.contains("# Safety"))
            } else {
                window.iter().any(|l| l.contains("SAFETY"))
            };
            if !noted {
                missing.push(format!("{path}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "unsafe without its SAFETY note (or `# Safety` section):\n{}",
        missing.join("\n")
    );
}

/// The parameters of a signature that starts at `lines[i]` (up to its `{` or `;`).
fn signature(lines: &[&str], i: usize) -> String {
    let mut sig = String::new();
    for line in &lines[i..] {
        let code = code_of(line);
        sig.push_str(&code);
        sig.push(' ');
        if code.contains('{') || code.trim_end().ends_with(';') {
            break;
        }
    }
    sig
}

/// The parameter list of a signature: from its first `(` to the matching `)` (the
/// return type may have parentheses of its own).
fn parameters(sig: &str) -> &str {
    let Some(open) = sig.find('(') else { return "" };
    let mut depth = 0;
    for (i, c) in sig[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &sig[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    ""
}

#[test]
fn no_safe_public_function_takes_a_raw_address() {
    const ADDRESS_NAMES: [&str; 6] = [
        "addr",
        "address",
        "ptr",
        "device_ptr",
        "iova",
        "remote_addr",
    ];
    let mut offenders = Vec::new();
    for (path, text) in sources() {
        if !path.starts_with("host/") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        // Declarations inside `extern "C" { ... }` are foreign functions: calling them is
        // `unsafe` whatever their signature says.
        let mut in_extern = false;
        for (i, line) in lines.iter().enumerate() {
            let code = code_of(line);
            let trimmed = code.trim_start();
            // (code_of has emptied the ABI string: `extern "" {`.)
            if trimmed.starts_with("extern \"") || trimmed.starts_with("unsafe extern \"") {
                in_extern = !trimmed.contains('}');
                continue;
            }
            if in_extern {
                in_extern = code.trim_end() != "}";
                continue;
            }
            if !trimmed.starts_with("pub fn ") {
                continue; // unsafe fns, pub(crate) and private functions are not this rule's
            }
            let sig = signature(&lines, i);
            let params = parameters(&sig);
            let raw_pointer = params.contains("*mut") || params.contains("*const");
            let raw_address = params.split(',').any(|p| {
                p.split_once(':').is_some_and(|(name, ty)| {
                    let name = name.trim().trim_start_matches("mut ");
                    ty.trim() == "u64" && ADDRESS_NAMES.contains(&name)
                })
            });
            if raw_pointer || raw_address {
                offenders.push(format!("{path}:{}: {}", i + 1, sig.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "safe public functions that take raw addresses (make them unsafe with a contract, or take a typed buffer):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_look_for() {
    // The scanners themselves: a comment or a string is not code.
    assert!(has_word(&code_of("    unsafe { x }"), "unsafe"));
    assert!(!has_word(&code_of("    // unsafe { x }"), "unsafe"));
    assert!(!has_word(&code_of(r#"    let s = "unsafe";"#), "unsafe"));
    assert!(!has_word(&code_of("    let unsafely = 1;"), "unsafe"));
    let lines = ["pub fn f(", "    addr: u64,", ") -> u64 {"];
    assert!(signature(&lines, 0).contains("addr: u64"));
    assert_eq!(
        parameters("pub fn g(x: (u8, u8)) -> impl Iterator<Item = (*mut T, u8)> {"),
        "x: (u8, u8)"
    );
}
