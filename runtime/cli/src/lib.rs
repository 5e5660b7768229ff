//! tracepass-cli: the `tracepass` command line over the ir, passes and runtime crates.
//!
//! One file per subcommand (`opt_cmd`, `train_cmd`, `simulate_cmd`, `verify_cmd`, `launch`),
//! [`cli`] for the arguments and their dispatch, `input` for the files every subcommand
//! reads and writes, [`alloc`] for the allocator settings the binaries share. Errors are
//! `anyhow` chains printed to stderr with a non-zero exit code.
//!
//! Running a subcommand from Rust, as the binary does (here `tracepass verify` of the seed
//! example's forward, which prints `...: ok`):
//!
//! ```
//! use clap::Parser;
//! let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/thunder/mlp/forward.trace");
//! let cli = tracepass_cli::Cli::try_parse_from(["tracepass", "verify", trace]).unwrap();
//! tracepass_cli::run(cli).unwrap();
//! assert!(tracepass_cli::Cli::try_parse_from(["tracepass", "verify"]).is_err());
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod alloc;
pub mod cli;
mod input;
mod launch;
mod numbers;
mod ops_cmd;
mod opt_cmd;
mod run_cmd;
mod simulate_cmd;
mod train_cmd;
mod verify_cmd;

pub use cli::{run, Cli};

/// Parses the process's arguments, runs the subcommand and prints an error chain to stderr.
pub fn main() -> std::process::ExitCode {
    use clap::Parser;
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
