//! The `distlock` command.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod compare;

/// Distributed locks from the shell, and a side-by-side comparison of
/// lock backends.
#[derive(Parser, Debug)]
#[command(name = "distlock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the conformance suite and a latency benchmark against each
    /// backend and print one row per backend.
    ///
    /// With no --url, compares the embedded backends (no server needed).
    ///
    /// Examples:
    ///   distlock compare
    ///   distlock compare --url redis://127.0.0.1:6379 --json report.json
    Compare {
        /// Embedded backends to include (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "memory")]
        backends: Vec<String>,
        /// Also compare the backend at this URL (repeatable).
        #[arg(long = "url")]
        urls: Vec<String>,
        /// Fewer iterations.
        #[arg(long)]
        quick: bool,
        /// Write every figure as JSON to this file.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Compare {
            backends,
            urls,
            quick,
            json,
        } => {
            let mut candidates = match compare::embedded(&backends) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("distlock: {e}");
                    return ExitCode::from(2);
                }
            };
            candidates.extend(compare::from_urls(&urls));
            let rows = compare::run(candidates, quick).await;
            compare::print_table(&rows);
            if let Some(path) = json {
                let doc = serde_json::json!({ "backends": rows });
                if let Err(e) = std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap_or_default()) {
                    eprintln!("distlock: cannot write {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            if rows.iter().any(|r| !r.suite.passed()) {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}
