//! `serve --config FILE`'s `[serve]` table, and `statestore config check`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{FromArgMatches, Subcommand};
use statestore::config;

use super::cli_command;
use super::serve::ServeArgs;
use super::serve::options::{check_serve_args, tenant_specs};

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Check a config file (its `[serve]` options, and its tenants if it
    /// declares any) and print the settings `serve --config FILE` would run
    /// with. Exit 0 if valid, 2 with the reason (and line) if not.
    Check {
        /// The config file.
        file: PathBuf,
    },
}

/// `argv` with the `[serve]` options of the file of `serve --config FILE`
/// put before the command line's own (which override them). Unknown keys
/// and bad values are errors naming the file, the key and its line.
pub fn with_config_file(argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let Ok(matches) = cli_command().try_get_matches_from(&argv) else {
        return Ok(argv); // the real parse reports it
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok(argv);
    };
    let Some(path) = serve.get_one::<PathBuf>("config") else {
        return Ok(argv);
    };
    let file_args = config_file_args(path)?;
    let at = argv
        .iter()
        .position(|a| a == "serve")
        .map_or(argv.len(), |i| i + 1);
    let mut merged = argv[..at].to_vec();
    merged.extend(file_args);
    merged.extend_from_slice(&argv[at..]);
    Ok(merged)
}

/// Whether `key` (a file's, `_` for `-`) names `arg`: its id, its long
/// name or one of its old names.
fn names(arg: &clap::Arg, key: &str) -> bool {
    let key = key.replace('_', "-");
    arg.get_id().as_str().replace('_', "-") == key
        || arg.get_long() == Some(key.as_str())
        || arg
            .get_all_aliases()
            .is_some_and(|a| a.contains(&key.as_str()))
}

/// The `serve` flags that the `[serve]` table of `path` sets, each value
/// checked as its flag would be (so that a bad one is named by its key and
/// line, not by the flag).
fn config_file_args(path: &Path) -> Result<Vec<OsString>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let settings = config::serve_settings(&text)
        .with_context(|| format!("in the config file {}", path.display()))?;
    let cmd = cli_command();
    let serve = cmd
        .find_subcommand("serve")
        .context("no serve subcommand")?;
    let mut args = Vec::new();
    for s in settings {
        let at = || format!("in the config file {}, line {}", path.display(), s.line);
        let known = serve
            .get_arguments()
            .find(|a| a.get_long().is_some() && a.get_id() != "config" && names(a, &s.key));
        let Some(arg) = known else {
            let mut names: Vec<String> = serve
                .get_arguments()
                .filter(|a| a.get_long().is_some() && a.get_id() != "config")
                .map(|a| a.get_long().unwrap_or_default().replace('-', "_"))
                .collect();
            names.sort();
            anyhow::bail!(
                "{}: unknown key {:?} in [serve] (known: {})",
                at(),
                s.key,
                names.join(", ")
            );
        };
        let long = format!("--{}", arg.get_long().unwrap_or_default());
        let takes_value = arg.get_action().takes_values();
        let values: Vec<String> = match (&s.value, takes_value) {
            (toml::Value::Boolean(true), false) => {
                args.push(long.into());
                continue;
            }
            (toml::Value::Boolean(false), false) => continue,
            (toml::Value::String(v), true) => vec![v.clone()],
            (toml::Value::Integer(v), true) => vec![v.to_string()],
            (toml::Value::Boolean(v), true) => vec![v.to_string()],
            (toml::Value::Array(items), true) => items
                .iter()
                .map(|i| match i {
                    toml::Value::String(v) => Ok(v.clone()),
                    other => Err(anyhow::anyhow!(
                        "{}: {} holds {other}, not a string",
                        at(),
                        s.key
                    )),
                })
                .collect::<Result<_>>()?,
            (other, _) => anyhow::bail!(
                "{}: {} = {other} is not a {}",
                at(),
                s.key,
                if takes_value {
                    "value"
                } else {
                    "flag (true or false)"
                }
            ),
        };
        for v in values {
            // The value alone, parsed as its flag: only what is wrong with
            // it counts here (other flags' requirements are checked later).
            let alone = serve
                .clone()
                .try_get_matches_from(["serve", long.as_str(), v.as_str()]);
            if let Err(e) = alone {
                use clap::error::ErrorKind as K;
                if matches!(
                    e.kind(),
                    K::InvalidValue | K::ValueValidation | K::InvalidUtf8
                ) {
                    anyhow::bail!("{}: {} = {:?} is not valid: {}", at(), s.key, v, reason(&e));
                }
            }
            args.push(long.clone().into());
            args.push(v.into());
        }
    }
    Ok(args)
}

/// Why clap refused a value, without its words about flags.
fn reason(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    if let Some(source) = std::error::Error::source(e) {
        return source.to_string();
    }
    if let Some(ContextValue::Strings(valid)) = e.get(ContextKind::ValidValue) {
        return format!("it must be one of {}", valid.join(", "));
    }
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_string()
}

/// `statestore config check FILE`.
pub fn config_check(file: &std::path::Path) -> Result<()> {
    let mut argv: Vec<std::ffi::OsString> = vec![
        "statestore".into(),
        "serve".into(),
        "--config".into(),
        file.into(),
    ];
    argv.extend(config_file_args(file)?);
    let matches = cli_command()
        .try_get_matches_from(&argv)
        .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim()))?;
    let Some(("serve", m)) = matches.subcommand() else {
        anyhow::bail!("not a serve command line");
    };
    let args = ServeArgs::from_arg_matches(m).map_err(|e| anyhow::anyhow!("{e}"))?;
    check_serve_args(&args)?;
    let password = match &args.password_file {
        Some(p) => Some(config::read_secret(p)?),
        None => None,
    };
    let specs = tenant_specs(&args, password)?;
    println!(
        "# the settings of `statestore serve --config {}`",
        file.display()
    );
    println!("[serve]");
    let cmd = cli_command();
    let serve = cmd
        .find_subcommand("serve")
        .context("no serve subcommand")?;
    for arg in serve.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long().filter(|_| id != "config") else {
            continue;
        };
        let key = long.replace('-', "_");
        let source = match m.value_source(id) {
            Some(clap::parser::ValueSource::CommandLine) => "file",
            Some(clap::parser::ValueSource::EnvVariable) => "environment",
            _ => "default",
        };
        let value = m
            .get_raw(id)
            .map(|v| {
                v.map(|x| x.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .filter(|v| !v.is_empty());
        match value {
            Some(v) if v.parse::<i64>().is_ok() || v == "true" || v == "false" => {
                println!("{key} = {v}   # {source}");
            }
            Some(v) => println!("{key} = {v:?}   # {source}"),
            None => println!("# {key}: not set"),
        }
    }
    for spec in &specs {
        println!();
        println!("[[tenant]]   # effective");
        println!("name = {:?}", spec.name);
        println!(
            "memory_mib = {}",
            spec.limits.memory_bytes.map_or(4096, |b| b >> 20)
        );
        if let Some(b) = spec.store.quota.max_bytes {
            println!("max_bytes = {b}");
        }
        if let Some(b) = spec.store.quota.max_value_bytes {
            println!("max_value_bytes = {b}");
        }
        if let Some(b) = spec.store.quota.max_key_bytes {
            println!("max_key_bytes = {b}");
        }
        println!(
            "persist = {:?}",
            format!("{:?}", spec.store.persist).to_lowercase()
        );
        if let Some(d) = &spec.store.data_dir {
            println!("data_dir = {:?}", d.display().to_string());
        }
    }
    Ok(())
}
