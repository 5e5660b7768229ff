//! What every test of the `tracepass` binary does: run it, read what it printed, find the
//! test data. Each test file uses some of these, so the unused rest is allowed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `tracepass` binary, as a command to add arguments to.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tracepass"))
}

/// Runs the binary with `args` and waits for it.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("the tracepass binary")
}

/// Runs the binary with `args` in the folder `dir`.
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    bin()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the tracepass binary")
}

/// What it printed to stdout.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What it printed to stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts that it succeeded; what it printed to stdout and to stderr.
pub fn ok(o: &Output) -> (String, String) {
    let (out, err) = (stdout(o), stderr(o));
    assert!(o.status.success(), "failed:\n{out}\n{err}");
    (out, err)
}

/// A path under the repository's `testdata` folder.
pub fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(rel)
}

/// A corpus export (`testdata/models/<name>`).
pub fn model(name: &str) -> PathBuf {
    testdata("models").join(name)
}
