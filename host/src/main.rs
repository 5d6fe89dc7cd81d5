//! `statestore`: the MQTT broker state store. The command line lives in
//! `cli/`, one module per subcommand.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // rmqtt logs every connection at info.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("info,rmqtt=warn,rmqtt_net=warn")
                }),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: not in log files or journald.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    cli::run(std::env::args_os().collect())
}
