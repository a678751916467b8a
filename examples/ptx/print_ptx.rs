//! Tutorial example 1 (docs/tutorial.md, step 3): the PTX that the Rust kernels become.
//!
//! ```sh
//! cargo run -p example-ptx                       # the whole module, both kernels
//! cargo run -p example-ptx -- generate_data      # one kernel's entry point and body
//! ```
//!
//! Nothing here runs on a GPU. The build script (`build.rs`) compiled the `no_std` crate
//! `gpu-kernels` with rustc's nvptx64 target through `ptx-builder`; this program only
//! prints the text it made. PTX is what the CUDA driver receives: it compiles it for the
//! GPU at hand when the host program loads the module (`cuModuleLoadData`).

use std::process::ExitCode;

/// The PTX, embedded at compile time: the file build.rs wrote to OUT_DIR.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            print!("{PTX}");
            ExitCode::SUCCESS
        }
        [kernel] => match entry(PTX, kernel) {
            Some(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            None => {
                let names = entries(PTX).join(", ");
                eprintln!("error: no kernel `{kernel}` in the PTX (its kernels: {names})");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("usage: print-ptx [KERNEL]  (no KERNEL: the whole module)");
            ExitCode::from(2)
        }
    }
}

/// The names of the kernels: every `.entry NAME(` line. A kernel is an *entry point*:
/// the host can launch it by name (`cuModuleGetFunction`); other `.func`s are callable
/// only from device code (here there are none: `opt` inlined everything into the
/// kernels).
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines().filter_map(entry_name).collect()
}

fn entry_name(line: &str) -> Option<&str> {
    let rest = line.split(".entry").nth(1)?.trim_start();
    Some(rest.split('(').next()?.trim_end())
}

/// One kernel's text: from its `.entry` line to the `}` that closes its body (a line
/// of its own, at the start, in what `llc` writes).
fn entry<'p>(ptx: &'p str, kernel: &str) -> Option<&'p str> {
    let start = ptx
        .match_indices(".visible .entry")
        .map(|(i, _)| i)
        .find(|&i| entry_name(ptx[i..].lines().next().unwrap_or("")) == Some(kernel))?;
    let len = ptx[start..].find("\n}")? + 2;
    Some(&ptx[start..start + len])
}
