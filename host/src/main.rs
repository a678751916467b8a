//! `host`: parse the command line and run the subcommand. Every failure ends here as one
//! line `error: ...` on stderr (and `{"ok": false, ...}` on stdout with `--json`) and a
//! non-zero exit code.

mod commands;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use host::cli::{BenchCommand, Cli, Command};
use serde_json::json;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = match &cli.command {
        None => cli.send.json,
        Some(Command::Recv(args)) => args.json,
        Some(Command::GpuCheck(args)) => args.json,
        Some(Command::Info(args)) => args.json,
        Some(Command::Doctor(args)) => args.json,
        Some(Command::Bench(_)) | Some(Command::Completions { .. }) | Some(Command::Man { .. }) => {
            false
        }
    };
    let result = match &cli.command {
        None => commands::send::run(&cli.send),
        Some(Command::Recv(args)) => commands::recv::run(args),
        Some(Command::Info(args)) => commands::info::run(args),
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
        Some(Command::Bench(BenchCommand::Rails(args))) => commands::rails_bench::run(args),
        Some(Command::Completions { shell }) => completions(*shell),
        Some(Command::Man { dir }) => man(dir.as_deref()),
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

/// `host completions SHELL`: the script clap_complete writes for this command line.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    clap_complete::generate(shell, &mut Cli::command(), "host", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

/// `host man [--dir DIR]`: host(1) on stdout, or every page into DIR.
fn man(dir: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    match dir {
        None => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .context("writing the manual page")?,
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), dir)
                .with_context(|| format!("writing the manual pages into {}", dir.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
