//! `host`: parse the command line and run the subcommand. Every failure ends here as one
//! line `error: ...` on stderr (and `{"ok": false, ...}` on stdout with `--json`) and a
//! non-zero exit code.

mod commands;

use clap::Parser;
use host::cli::{BenchCommand, Cli, Command};
use serde_json::json;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = match &cli.command {
        None => cli.send.json,
        Some(Command::Recv(args)) => args.json,
        Some(Command::GpuCheck(args)) => args.json,
        Some(Command::Info) | Some(Command::Doctor(_)) | Some(Command::Bench(_)) => false,
    };
    let result = match &cli.command {
        None => commands::send::run(&cli.send),
        Some(Command::Recv(args)) => commands::recv::run(args),
        Some(Command::Info) => commands::info::run(),
        Some(Command::Doctor(args)) => commands::doctor::run(args),
        Some(Command::GpuCheck(args)) => commands::gpu::check(args),
        Some(Command::Bench(BenchCommand::Gpu { gpu })) => commands::gpu::bench(*gpu),
        Some(Command::Bench(BenchCommand::Crc32c {
            size,
            chunk,
            rounds,
        })) => commands::crc_bench::run(*size, *chunk, *rounds),
        Some(Command::Bench(BenchCommand::Tcp {
            size,
            chunk,
            streams,
            rounds,
        })) => commands::tcp_bench::run(*size, *chunk, *streams, *rounds),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let text = format!("{e:#}");
            eprintln!("error: {text}");
            if json {
                println!("{}", json!({ "ok": false, "error": text }));
            }
            ExitCode::FAILURE
        }
    }
}
