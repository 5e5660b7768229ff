//! The `tracepass` command line.

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;

fn main() -> ExitCode {
    tracepass_runtime::alloc::keep_freed_memory();
    let cli = tracepass_runtime::cli::Cli::parse();
    match tracepass_runtime::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
