//! The `tracepass` command line.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = tracepass_runtime::cli::Cli::parse();
    match tracepass_runtime::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
