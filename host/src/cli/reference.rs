//! The CLI and config reference pages of the book (`docs/src/cli.md`'s
//! neighbours `cli-reference.md` and `config-reference.md`), generated from
//! the clap definitions so that they cannot drift: a test fails when a page
//! differs from what this module writes, and
//! `STATESTORE_WRITE_REFERENCE=1 cargo test -p statestore --bin statestore reference`
//! writes them.

use std::fmt::Write;

use clap::Command;

/// The CLI reference: every command, its usage and its options.
pub fn cli_page() -> String {
    let mut cmd = super::cli_command();
    cmd.build();
    let mut out = String::from(
        "# CLI reference\n\n\
         Generated from the command line's definitions (`host/src/cli/`); \
         `statestore <command> --help` prints the same. Durations take a unit \
         (`500ms`, `10s`, `5m`, `1h`) and sizes one (`512KiB`, `64MiB`, `1GiB`); \
         a bare number is in the unit of the option's old name (shown as *also*), \
         which is still accepted.\n",
    );
    command(&mut out, &cmd, 2);
    out
}

/// The config reference: the keys of a config file's `[serve]` table.
pub fn config_page() -> String {
    let mut cmd = super::cli_command();
    cmd.build();
    let serve = cmd
        .find_subcommand("serve")
        .expect("there is a serve command");
    let mut out = String::from(
        "# Config file reference\n\n\
         Generated from the command line's definitions (`host/src/cli/serve/args.rs`). \
         `statestore serve --config FILE` reads the `[serve]` table of FILE: every \
         `serve` option below may be set there by its name with `_` for `-` \
         (`max_packet = \"16MiB\"`; an option's old name, shown as *also*, works too). \
         Options on the command line override the file's. A flag is `true` or \
         `false`; a repeatable option takes an array of strings. The tables of \
         tenants (`[defaults]`, `[[tenant]]`) are described in the \
         [tenants chapter](tenants.md). `statestore config check FILE` checks a file \
         and prints the settings it gives, with where each comes from.\n",
    );
    let mut heading = None;
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long().filter(|_| arg.get_id() != "config") else {
            continue;
        };
        if arg.get_help_heading() != heading {
            heading = arg.get_help_heading();
            let _ = write!(out, "\n## {}\n\n", heading.unwrap_or("Options"));
        }
        let key = long.replace('-', "_");
        let aliases: Vec<String> = arg
            .get_all_aliases()
            .unwrap_or_default()
            .iter()
            .map(|a| format!("`{}`", a.replace('-', "_")))
            .collect();
        let mut facts = facts(arg);
        if !aliases.is_empty() {
            facts.insert(0, format!("also {}", aliases.join(", ")));
        }
        let _ = writeln!(out, "- `{key}`{}: {}", in_parens(&facts), help(arg));
    }
    out
}

/// `cmd` and its subcommands, with headings of `level`.
fn command(out: &mut String, cmd: &Command, level: usize) {
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let name = sub.get_bin_name().unwrap_or(sub.get_name());
        let _ = write!(out, "\n{} `{name}`\n\n", "#".repeat(level));
        let about = sub
            .get_long_about()
            .or(sub.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        let _ = writeln!(out, "{}\n", markdown(about.trim()));
        if sub.has_subcommands() {
            command(out, sub, level + 1);
            continue;
        }
        let usage = sub.clone().render_usage().to_string();
        let usage = usage.trim_start_matches("Usage: ");
        let _ = writeln!(out, "```text\n{usage}\n```");
        let mut heading = Some("-");
        for arg in sub.get_arguments() {
            if arg.get_id() == "help" || arg.get_id() == "version" || arg.is_hide_set() {
                continue;
            }
            if arg.get_help_heading() != heading {
                heading = arg.get_help_heading();
                let title = match heading {
                    Some(h) => h,
                    None if arg.is_positional() => "Arguments",
                    None => "Options",
                };
                let _ = write!(out, "\n**{title}**\n\n");
            }
            let _ = writeln!(
                out,
                "- {}{}: {}",
                spelling(arg),
                in_parens(&facts(arg)),
                help(arg)
            );
        }
    }
}

/// How `arg` is written: `--long <VALUE>`, `-s, --long`, `<NAME>`.
fn spelling(arg: &clap::Arg) -> String {
    let value = arg
        .get_value_names()
        .map(|v| {
            v.iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    if arg.is_positional() {
        return format!("`{value}`");
    }
    let mut s = String::new();
    if let Some(short) = arg.get_short() {
        let _ = write!(s, "-{short}, ");
    }
    let _ = write!(s, "--{}", arg.get_long().unwrap_or_default());
    if arg.get_action().takes_values() {
        let _ = write!(s, " {value}");
    }
    let mut out = format!("`{s}`");
    for alias in arg.get_all_aliases().unwrap_or_default() {
        let _ = write!(out, " (also `--{alias}`)");
    }
    out
}

/// Default, environment variable and possible values of `arg`.
fn facts(arg: &clap::Arg) -> Vec<String> {
    let mut facts = Vec::new();
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && arg.get_action().takes_values() {
        facts.push(format!("default `{}`", defaults.join(",")));
    }
    if let Some(env) = arg.get_env() {
        facts.push(format!("env `{}`", env.to_string_lossy()));
    }
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !values.is_empty() && arg.get_action().takes_values() {
        facts.push(format!("one of {}", values.join(", ")));
    }
    facts
}

fn in_parens(facts: &[String]) -> String {
    if facts.is_empty() {
        String::new()
    } else {
        format!(" ({})", facts.join("; "))
    }
}

/// The help of `arg`, on one line.
fn help(arg: &clap::Arg) -> String {
    let text = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    markdown(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// `text` with `<` and `>` outside code spans written as entities, so that
/// `statestore-cli-<pid>` is not taken for HTML.
fn markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut code = false;
    for c in text.chars() {
        match c {
            '`' => {
                code = !code;
                out.push(c);
            }
            '<' if !code => out.push_str("&lt;"),
            '>' if !code => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    /// The pages in the book are the ones the command line makes.
    #[test]
    fn reference_pages_match_the_command_line() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src");
        let write = std::env::var_os("STATESTORE_WRITE_REFERENCE").is_some();
        for (name, page) in [
            ("cli-reference.md", super::cli_page()),
            ("config-reference.md", super::config_page()),
        ] {
            let path = docs.join(name);
            if write {
                std::fs::write(&path, &page).expect("write the page");
                continue;
            }
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                on_disk == page,
                "docs/src/{name} is not what the command line says: run \
                 STATESTORE_WRITE_REFERENCE=1 cargo test -p statestore --bin statestore reference"
            );
        }
    }
}
