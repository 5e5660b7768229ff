//! tracepass-cli: the `tracepass` command line over the ir, passes and runtime crates.
//!
//! One file per subcommand (`opt_cmd`, `train_cmd`, `simulate_cmd`, `verify_cmd`, `launch`),
//! [`cli`] for the arguments and their dispatch, `input` for the files every subcommand
//! reads and writes, `outputs` for keeping outputs off the inputs, `signals` for removing a
//! write's temporary file on SIGINT or SIGTERM, [`alloc`] for the allocator settings the
//! binaries share. Errors are `anyhow` chains printed to stderr with a non-zero exit code.
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
mod outputs;
mod run_cmd;
mod signals;
mod simulate_cmd;
mod train_cmd;
mod verify_cmd;

pub use cli::{run, Cli};

/// Parses the process's arguments, runs the subcommand and prints an error chain to stderr.
pub fn main() -> std::process::ExitCode {
    use clap::Parser;
    let cli = Cli::parse();
    signals::remove_temp_files_on_signal();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `a: b: c`, leaving out a cause whose text is already
/// there: a library error that prints its source in its own message (`pipeline `x`: unknown
/// pass ...`) would otherwise name it twice.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("inner `x`")]
        struct Inner;
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {source}")]
        struct Outer {
            source: Inner,
        }
        let e = anyhow::Error::new(Outer { source: Inner });
        assert_eq!(super::error_text(&e), "outer: inner `x`");
        let e = anyhow::Error::new(Inner).context("reading f");
        assert_eq!(super::error_text(&e), "reading f: inner `x`");
    }
}
