//! The soundness model's rules that a reader of the source can check, checked here so
//! they stay true (docs/internals.md, section "Soundness: where `unsafe` lives and why"):
//!
//! * that section's list of files that contain `unsafe` is exactly the set of such files;
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

/// The source files of the crates whose `unsafe` docs/internals.md accounts for.
fn sources() -> Vec<(String, String)> {
    sources_in(&["host/src", "gpu-kernels/src", "examples", "python/src"])
}

/// The NCCL plugin's sources (its `unsafe` is accounted for in docs/nccl-plugin.md).
fn plugin_sources() -> Vec<(String, String)> {
    sources_in(&["nccl-net/src"])
}

fn sources_in(dirs: &[&str]) -> Vec<(String, String)> {
    let root = workspace_root();
    dirs.iter()
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

/// The document that lists the files with `unsafe` (between the markers).
const LIST_DOC: &str = "docs/internals.md";

#[test]
fn the_docs_list_exactly_the_files_that_contain_unsafe() {
    let doc = std::fs::read_to_string(workspace_root().join(LIST_DOC)).unwrap();
    let section = doc
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(list, _)| list)
        .unwrap_or_else(|| panic!("{LIST_DOC} has the unsafe-files markers"));
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
        "{LIST_DOC}'s list of files with `unsafe` is out of date: add {unlisted:?}, remove {stale:?}"
    );
}

/// Whether `code` (a line without its comment) continues the statement of the line above
/// it, whose code is `above`: `let x =` / `unsafe { .. }`, a call's arguments, a chain.
fn continues(above: &str, code: &str) -> bool {
    let above = above.trim_end();
    ["=", "(", "=>", ".", "|", "&", "+", "-"]
        .iter()
        .any(|end| above.ends_with(end))
        || code.trim_start().starts_with('.')
}

/// The comment and attribute lines directly above the statement that line `i` belongs
/// to: nothing but those may stand between a note and its `unsafe`.
fn note_above<'a>(lines: &[&'a str], i: usize) -> Vec<&'a str> {
    let mut start = i;
    while start > 0 && continues(&code_of(lines[start - 1]), &code_of(lines[start])) {
        start -= 1;
    }
    let mut note = Vec::new();
    for line in lines[..start].iter().rev() {
        let t = line.trim_start();
        if t.starts_with("//") || t.starts_with("#[") {
            note.push(*line);
        } else {
            break;
        }
    }
    note
}

/// Every `unsafe` of a line that needs a note: blocks and impls a `SAFETY:` comment
/// directly above, `unsafe fn` and `unsafe trait` a `# Safety` section in their docs.
fn unnoted(path: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = code_of(line);
        if !has_word(&code, "unsafe") || is_pointer_type(&code) {
            continue;
        }
        let declares = ["unsafe fn", "unsafe extern", "unsafe trait"]
            .iter()
            .any(|d| code.contains(d));
        let want = if declares { "# Safety" } else { "SAFETY" };
        if !note_above(&lines, i).iter().any(|l| l.contains(want)) {
            missing.push(format!("{path}:{}: {}", i + 1, line.trim()));
        }
    }
    missing
}

/// Whether the `unsafe` of `code` is a function pointer's type (`unsafe extern "C"
/// fn(..)`): it declares no code, and its contract is at each function given for it.
fn is_pointer_type(code: &str) -> bool {
    // (`code_of` keeps a string's quotes only: `extern "C"` reads `extern ""`.)
    ["unsafe extern \"\" fn(", "unsafe extern fn(", "unsafe fn("]
        .iter()
        .any(|t| code.contains(t))
        && code.matches("unsafe").count() == 1
}

#[test]
fn every_unsafe_block_impl_and_fn_says_why_it_is_sound() {
    let missing: Vec<String> = sources()
        .iter()
        .chain(plugin_sources().iter())
        .flat_map(|(path, text)| unnoted(path, text))
        .collect();
    assert!(
        missing.is_empty(),
        "unsafe without its SAFETY note directly above (or a `# Safety` section):\n{}",
        missing.join("\n")
    );
}

// --- the public API, judged from rustdoc's JSON --------------------------------------------

/// rustdoc's JSON description of the `host` library (with its default features), made
/// into a target directory of its own so it does not wait on the tests' build.
fn host_api() -> serde_json::Value {
    let root = workspace_root();
    let target = root.join("target/rustdoc-json");
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["rustdoc", "-p", "host", "--lib", "--quiet", "--target-dir"])
        .arg(&target)
        .args(["--", "-Zunstable-options", "--output-format", "json"])
        .status()
        .expect("running cargo rustdoc");
    assert!(
        status.success(),
        "cargo rustdoc --output-format json failed"
    );
    let json = std::fs::read(target.join("doc/host.json")).expect("rustdoc wrote host.json");
    serde_json::from_slice(&json).expect("rustdoc's JSON parses")
}

/// Parameter names that say "an address", whatever their integer type.
const ADDRESS_NAMES: [&str; 9] = [
    "addr",
    "address",
    "ptr",
    "pointer",
    "device_ptr",
    "dptr",
    "iova",
    "remote_addr",
    "va",
];

/// Names that are an address when the value is an integer (a slice named `src` is
/// fine; a `u64` named `src` is where to read from).
const PLACE_NAMES: [&str; 10] = [
    "base",
    "src",
    "dst",
    "dest",
    "destination",
    "source",
    "location",
    "remote",
    "target",
    "at",
];

fn is_address_name(name: &str) -> bool {
    let name = name.trim_start_matches('_').to_ascii_lowercase();
    let name = name.as_str();
    ADDRESS_NAMES.contains(&name)
        || PLACE_NAMES.contains(&name)
        // Any spelling with an address's word in it: dev_ptr, devptr, raddr, gpu_va,
        // remote_iova, base_address, ptr_value...
        || ["addr", "ptr", "pointer", "iova"].iter().any(|w| name.contains(w))
        || name.ends_with("_va")
        || name.starts_with("va_")
        || PLACE_NAMES.iter().any(|p| name.starts_with(&format!("{p}_")))
}

/// A type whose name says it is a device or host address (`CUdeviceptr` from the
/// driver's bindings, cust's `DevicePointer`, an `*Addr`/`*Address` of ours), whatever it
/// is underneath: an alias from another crate is not in the index to look through.
fn is_address_type(path: &str) -> bool {
    let last = path
        .rsplit("::")
        .next()
        .unwrap_or(path)
        .to_ascii_lowercase();
    last.ends_with("ptr")
        || last.ends_with("pointer")
        || last == "cudeviceptr"
        || (last.ends_with("addr") || last.ends_with("address")) && !is_network_address(&last)
}

/// `SocketAddr`, `IpAddr`, `Ipv4Addr`, `Ipv6Addr`, `SocketAddrV4`...: a peer's network
/// address, not memory.
fn is_network_address(lowercase_name: &str) -> bool {
    lowercase_name.starts_with("socket") || lowercase_name.starts_with("ip")
}

/// Why a type (rustdoc JSON) is a raw address, looking through references, tuples,
/// slices, arrays, generic arguments, function pointers and this crate's type aliases:
/// a raw pointer, `NonNull`, or an integer under an address's name.
fn raw_address_in(
    index: &serde_json::Map<String, serde_json::Value>,
    ty: &serde_json::Value,
    name: &str,
    depth: usize,
) -> Option<String> {
    if depth > 16 {
        return None;
    }
    let inner = |t: &serde_json::Value| raw_address_in(index, t, name, depth + 1);
    // A trait of an `impl Trait` or `dyn Trait`: its generic and `Fn(..)` arguments
    // (`impl Into<u64>` named `addr`, `&dyn Fn(*const u8)`).
    let in_trait = |t: &serde_json::Value| -> Option<String> {
        let args = &t["args"];
        let angle = args["angle_bracketed"]["args"].as_array();
        let paren = args["parenthesized"]["inputs"].as_array();
        angle
            .into_iter()
            .flatten()
            .find_map(|a| a.get("type").and_then(inner))
            .or_else(|| paren.into_iter().flatten().find_map(inner))
    };
    let (kind, value) = ty.as_object()?.iter().next()?;
    match kind.as_str() {
        "raw_pointer" => Some("a raw pointer".into()),
        "primitive" => {
            let p = value.as_str()?;
            let integer = ["u64", "usize", "i64", "isize", "u128", "i128", "u32"].contains(&p);
            (integer && is_address_name(name)).then(|| format!("an integer named `{name}`"))
        }
        "impl_trait" => value
            .as_array()?
            .iter()
            .find_map(|b| in_trait(&b["trait_bound"]["trait"])),
        "dyn_trait" => value["traits"]
            .as_array()?
            .iter()
            .find_map(|t| in_trait(&t["trait"])),
        "borrowed_ref" | "slice" => inner(&value["type"]).or_else(|| inner(value)),
        "array" => inner(&value["type"]),
        "tuple" => value.as_array()?.iter().find_map(inner),
        "function_pointer" => value["sig"]["inputs"]
            .as_array()?
            .iter()
            .find_map(|p| raw_address_in(index, &p[1], p[0].as_str().unwrap_or(""), depth + 1)),
        "resolved_path" => {
            let path = value["path"].as_str().unwrap_or("");
            if path.ends_with("NonNull") {
                return Some("a NonNull pointer".into());
            }
            if is_address_type(path) {
                return Some(format!("a `{path}`, an address by its name"));
            }
            // A type alias of this crate: judge what it stands for.
            let id = value["id"].to_string();
            if let Some(alias) = index
                .get(&id)
                .and_then(|item| item["inner"].get("type_alias"))
            {
                if let Some(why) = inner(&alias["type"]) {
                    return Some(format!("{why} (through the alias `{path}`)"));
                }
            }
            let args = value["args"]["angle_bracketed"]["args"].as_array()?;
            args.iter().find_map(|a| a.get("type").and_then(inner))
        }
        "qualified_path" => inner(&value["self_type"]),
        _ => None,
    }
}

/// Every safe function or method of `host`'s public API (free functions, inherent and
/// trait methods) that takes a raw address: `(where, why)`.
fn safe_functions_taking_addresses(api: &serde_json::Value) -> Vec<String> {
    let index = api["index"].as_object().expect("an index");
    let mut offenders = Vec::new();
    for item in index.values() {
        if item["crate_id"] != 0 {
            continue;
        }
        let Some(function) = item["inner"].get("function") else {
            continue;
        };
        // Public, or a trait's method (its visibility is the trait's: "default").
        let public = matches!(item["visibility"].as_str(), Some("public" | "default"));
        if !public || function["header"]["is_unsafe"] == true {
            continue;
        }
        for param in function["sig"]["inputs"].as_array().into_iter().flatten() {
            let name = param[0].as_str().unwrap_or("");
            if let Some(why) = raw_address_in(index, &param[1], name, 0) {
                let file = item["span"]["filename"].as_str().unwrap_or("?");
                let line = item["span"]["begin"][0].as_u64().unwrap_or(0);
                offenders.push(format!(
                    "{file}:{line}: `{}` takes `{name}`: {why}",
                    item["name"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    offenders.sort();
    offenders
}

#[test]
fn no_safe_public_function_takes_a_raw_address_in_any_spelling() {
    let api = host_api();
    // The check sees what it looks for: these spellings in the real API would be caught.
    let probe = serde_json::json!({"index": {}});
    let index = probe["index"].as_object().unwrap();
    let cases = [
        (
            serde_json::json!({"raw_pointer": {"is_mutable": false, "type": {"primitive": "u8"}}}),
            "x",
        ),
        (serde_json::json!({"primitive": "usize"}), "addr"),
        (serde_json::json!({"primitive": "u64"}), "remote_ptr"),
        (
            serde_json::json!({"tuple": [{"primitive": "u8"}, {"primitive": "u64"}]}),
            "iova",
        ),
        (
            serde_json::json!({"resolved_path": {"path": "std::ptr::NonNull", "id": 1, "args": null}}),
            "p",
        ),
        (
            serde_json::json!({"borrowed_ref": {"type": {"slice": {"raw_pointer": {"is_mutable": true, "type": {"primitive": "u8"}}}}}}),
            "xs",
        ),
        // The spellings the second audit passed the check with.
        (serde_json::json!({"primitive": "u64"}), "devptr"),
        (serde_json::json!({"primitive": "u64"}), "DevPtr"),
        (serde_json::json!({"primitive": "u64"}), "raddr"),
        (serde_json::json!({"primitive": "u64"}), "gpu_va"),
        (serde_json::json!({"primitive": "u64"}), "base"),
        (serde_json::json!({"primitive": "usize"}), "dst"),
        (serde_json::json!({"primitive": "u128"}), "src"),
        (serde_json::json!({"primitive": "u64"}), "remote_iova"),
        (serde_json::json!({"primitive": "u64"}), "base_offset"),
        (
            serde_json::json!({"resolved_path": {"path": "cust_raw::CUdeviceptr", "id": 9, "args": null}}),
            "x",
        ),
        (
            serde_json::json!({"resolved_path": {"path": "DevicePointer", "id": 9, "args": null}}),
            "x",
        ),
        (
            serde_json::json!({"resolved_path": {"path": "Option", "id": 9, "args": {"angle_bracketed": {"args": [{"type": {"primitive": "u64"}}], "constraints": []}}}}),
            "addr",
        ),
        (
            serde_json::json!({"impl_trait": [{"trait_bound": {"trait": {"path": "Into", "id": 9, "args": {"angle_bracketed": {"args": [{"type": {"primitive": "u64"}}], "constraints": []}}}, "generic_params": [], "modifier": "none"}}]}),
            "addr",
        ),
        (
            serde_json::json!({"borrowed_ref": {"is_mutable": false, "lifetime": null, "type": {"dyn_trait": {"lifetime": null, "traits": [{"trait": {"path": "Fn", "id": 9, "args": {"parenthesized": {"inputs": [{"raw_pointer": {"is_mutable": false, "type": {"primitive": "u8"}}}], "output": null}}}, "generic_params": []}]}}}}),
            "f",
        ),
    ];
    for (ty, name) in &cases {
        assert!(raw_address_in(index, ty, name, 0).is_some(), "{ty} {name}");
    }
    for name in ["len", "offset", "count", "chunk", "index"] {
        let ty = serde_json::json!({"primitive": "usize"});
        assert!(raw_address_in(index, &ty, name, 0).is_none(), "{name}");
    }
    for path in ["std::net::SocketAddr", "IpAddr", "std::net::Ipv6Addr"] {
        let ty = serde_json::json!({"resolved_path": {"path": path, "id": 9, "args": null}});
        assert!(raw_address_in(index, &ty, "peer", 0).is_none(), "{path}");
    }
    let functions = api["index"]
        .as_object()
        .unwrap()
        .values()
        .filter(|i| i["crate_id"] == 0 && i["inner"].get("function").is_some())
        .count();
    assert!(
        functions > 300,
        "rustdoc's JSON lists only {functions} functions of host"
    );
    let offenders = safe_functions_taking_addresses(&api);
    assert!(
        offenders.is_empty(),
        "safe public functions that take raw addresses (make them unsafe with a contract, or take a typed buffer):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_host_crate_calls_no_driver_entry_point_declared_with_an_enum_result() {
    // cust_raw declares CUresult as a Rust enum: a newer driver's code outside it would be
    // undefined behaviour. Every call goes through gpu/ffi.rs's raw declarations instead.
    let offenders: Vec<String> = sources()
        .iter()
        .filter(|(path, _)| path.starts_with("host/"))
        .flat_map(|(path, text)| {
            text.lines().enumerate().filter_map(move |(i, line)| {
                let code = code_of(line);
                let calls_cust = [
                    "cust::sys::cu",
                    "cu::cu",
                    "cust_raw::",
                    "launch!",
                    "cust::prelude",
                ]
                .iter()
                .any(|p| code.contains(p));
                calls_cust.then(|| format!("{path}:{}: {}", i + 1, line.trim()))
            })
        })
        .collect();
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

#[test]
fn the_checks_see_what_they_look_for() {
    // The scanners themselves: a comment or a string is not code.
    assert!(has_word(&code_of("    unsafe { x }"), "unsafe"));
    assert!(!has_word(&code_of("    // unsafe { x }"), "unsafe"));
    assert!(!has_word(&code_of(r#"    let s = "unsafe";"#), "unsafe"));
    assert!(!has_word(&code_of("    let unsafely = 1;"), "unsafe"));
    // A note must stand directly above its own block: one note does not cover the next.
    let ok = "fn f() {\n    // SAFETY: fine.\n    unsafe { a() };\n    let x =\n        // SAFETY: also fine.\n        unsafe { b() };\n}\n";
    assert!(unnoted("x.rs", ok).is_empty(), "{:?}", unnoted("x.rs", ok));
    let continued =
        "fn f() {\n    // SAFETY: covers the statement.\n    let x =\n        unsafe { b() };\n}\n";
    assert!(unnoted("x.rs", continued).is_empty());
    let second =
        "fn f() {\n    // SAFETY: for a only.\n    unsafe { a() };\n    unsafe { b() };\n}\n";
    assert_eq!(unnoted("x.rs", second).len(), 1);
    let far = "fn f() {\n    // SAFETY: too far up.\n    let y = 1;\n    unsafe { a() };\n}\n";
    assert_eq!(unnoted("x.rs", far).len(), 1);
    let func = "/// Does it.\n///\n/// # Safety\n/// Rules.\n#[inline]\npub unsafe fn g() {}\n";
    assert!(unnoted("x.rs", func).is_empty());
    assert_eq!(
        unnoted("x.rs", "/// Undocumented.\npub unsafe fn g() {}\n").len(),
        1
    );
    // An entry point C calls is a function like any other; the type of a pointer to
    // one declares nothing.
    let entry = "unsafe extern \"C\" fn listen(h: *mut u8) -> i32 { 0 }\n";
    assert_eq!(unnoted("x.rs", entry).len(), 1);
    let pointer = "pub type ListenFn = unsafe extern \"C\" fn(h: *mut u8) -> i32;\n";
    assert!(unnoted("x.rs", pointer).is_empty());
}
