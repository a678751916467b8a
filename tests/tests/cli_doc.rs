//! docs/cli.md against the command line itself: every command has a section, every
//! option and argument of it is in that section's table with its default, and nothing
//! is listed that the command does not take. The definitions are the ones `--help`
//! prints (`host::cli`), so the page cannot go stale without this test failing.

use clap::CommandFactory;
use host::cli::Cli;
use integration_tests::workspace_root;
use std::collections::{BTreeMap, BTreeSet};

/// The sections of docs/cli.md: "## `host recv`" → its lines.
fn sections(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## `").and_then(|t| t.strip_suffix('`')) {
            current = Some(title.to_string());
            out.entry(title.to_string()).or_default();
        } else if line.starts_with("## ") {
            current = None;
        } else if let Some(c) = &current {
            out.get_mut(c).unwrap().push(line.to_string());
        }
    }
    out
}

/// The options and arguments a table row names: "`--size BYTES`" → "--size",
/// "`<IP>`" → "<IP>".
fn row_name(line: &str) -> Option<String> {
    let cell = line.strip_prefix("| `")?;
    let name: String = cell
        .chars()
        .take_while(|c| !matches!(c, ' ' | '`'))
        .collect();
    (name.starts_with("--") || name.starts_with('<')).then_some(name)
}

/// Every command with its path: ("host", cmd), ("host recv", cmd), ...
fn commands(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    out.push((path.to_string(), cmd.clone()));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        commands(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

#[test]
fn docs_cli_md_matches_the_command_line() {
    let text = std::fs::read_to_string(workspace_root().join("docs/cli.md")).unwrap();
    let docs = sections(&text);
    let mut root = Cli::command();
    root.build();
    let mut all = Vec::new();
    commands(&root, "host", &mut all);
    let mut problems = Vec::new();
    let documented: BTreeSet<&String> = docs.keys().collect();
    let real: BTreeSet<String> = all.iter().map(|(p, _)| p.clone()).collect();
    for stale in documented.iter().filter(|d| !real.contains(**d)) {
        problems.push(format!(
            "docs/cli.md has a section for `{stale}`, which is no command"
        ));
    }
    for (path, cmd) in &all {
        let Some(lines) = docs.get(path) else {
            problems.push(format!("docs/cli.md has no section \"## `{path}`\""));
            continue;
        };
        let rows: BTreeMap<String, &String> = lines
            .iter()
            .filter_map(|l| row_name(l).map(|n| (n, l)))
            .collect();
        let mut expected = BTreeSet::new();
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let name = match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => format!(
                    "<{}>",
                    arg.get_value_names()
                        .and_then(|v| v.first().map(|s| s.to_string()))
                        .unwrap_or_else(|| id.to_uppercase())
                ),
            };
            expected.insert(name.clone());
            let Some(row) = rows.get(&name) else {
                problems.push(format!("`{path}`: {name} is not in docs/cli.md"));
                continue;
            };
            // Flags' implicit "false" is no default `--help` shows.
            let defaults = if arg.get_action().takes_values() {
                arg.get_default_values()
            } else {
                &[]
            };
            for default in defaults {
                let default = format!("`{}`", default.to_string_lossy());
                if !row.contains(&default) {
                    problems.push(format!(
                        "`{path}`: the row of {name} does not give its default {default}: {row}"
                    ));
                }
            }
        }
        for listed in rows.keys().filter(|n| !expected.contains(*n)) {
            problems.push(format!(
                "`{path}`: docs/cli.md lists {listed}, which the command does not take"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/cli.md is stale:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checker_sees_what_is_missing() {
    // The parser above, on a page that lacks an option and lists one too many.
    let page = "## `host info`\n\n| option | default | meaning |\n| --- | --- | --- |\n| `--jsn` | | typo |\n";
    let s = sections(page);
    let rows: Vec<String> = s["host info"].iter().filter_map(|l| row_name(l)).collect();
    assert_eq!(rows, ["--jsn"]);
    assert_eq!(
        row_name("| `--size BYTES` | `16KiB` | x |").as_deref(),
        Some("--size")
    );
    assert_eq!(row_name("| `<SHELL>` | | x |").as_deref(), Some("<SHELL>"));
    assert_eq!(row_name("| option | default | meaning |"), None);
}
