//! The `tracepass` binary end to end: outputs, exit codes and error messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tracepass"))
}
fn td(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/thunder")
        .join(rel)
}
fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}
fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn show_prints_with_and_without_subsymbols() {
    let p = td("mlp/backward.trace");
    let o = run(&["show", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("      # t130 = prims.reshape(t64, (8, 4))"));
    let o = run(&["show", p.to_str().unwrap(), "--no-subsymbols"]);
    assert!(!stdout(&o).contains("prims.reshape"));
    assert!(stdout(&o).contains("t130 = torch.reshape(t64, (-1, 4))"));
}

#[test]
fn convert_round_trips_binary_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let src = td("mlp-ddp/backward.trace");
    let tpb = dir.path().join("b.tpb");
    let json = dir.path().join("b.json");
    let back = dir.path().join("b.trace");
    for (a, b) in [
        (src.as_path(), tpb.as_path()),
        (&tpb, &json),
        (&json, &back),
    ] {
        let o = run(&["convert", a.to_str().unwrap(), b.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let orig = stdout(&run(&["show", src.to_str().unwrap()]));
    assert_eq!(stdout(&run(&["show", back.to_str().unwrap()])), orig);
}

#[test]
fn verify_and_dot() {
    let p = td("mlp/joint.trace");
    let o = run(&["verify", p.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(stdout(&o).ends_with(": ok\n"));
    let o = run(&["dot", p.to_str().unwrap()]);
    assert!(stdout(&o).starts_with("digraph \"computation\" {"));
    assert!(stdout(&o).contains("[label=\"t18\"]"));
}

#[test]
fn bad_inputs_fail_with_a_message_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.trace");
    std::fs::write(
        &bad,
        std::fs::read_to_string(td("mlp/backward.trace"))
            .unwrap()
            .replace("torch.permute", "torch.permutate"),
    )
    .unwrap();
    let o = run(&["verify", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bad.trace: line 45, column 10: unknown op `torch.permutate`"),
        "{}",
        stderr(&o)
    );
    let corrupt = dir.path().join("c.tpb");
    std::fs::write(&corrupt, b"TRACEPB\0garbage").unwrap();
    let o = run(&["show", corrupt.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("c.tpb: file too short for the 24-byte header"),
        "{}",
        stderr(&o)
    );
    let o = run(&["show", "/nonexistent/x.trace"]);
    assert!(stderr(&o).contains("/nonexistent/x.trace"));
    let o = run(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn opt_rewrites_for_ddp() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ddp.trace");
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--forward",
        td("mlp/forward.trace").to_str().unwrap(),
        "--passes",
        "ddp(world_size=4,bucket_mb=0),sort-waits,dce",
        "-o",
        out.to_str().unwrap(),
        "--timing",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("sort-waits"), "timing table on stderr");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.matches("dist.all_reduce_async(").count(), 4);
    assert_eq!(text.matches("prims.div(").count(), 4);
    // the written file is valid and re-verifies
    assert!(run(&["verify", out.to_str().unwrap()]).status.success());
}

#[test]
fn opt_errors_and_reproducer() {
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--passes",
        "ddp(world_size=0)",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad value `0` for `world_size`: must be at least 1"));
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--passes",
        "dce,unroll",
    ]);
    assert!(stderr(&o)
        .contains("unknown pass `unroll`; valid passes: ddp, sort-waits, no-sync, accumulate-grads, dce, cse"));
    // ddp without the forward fails, leaving a reproducer that replays the failure
    let dir = tempfile::tempdir().unwrap();
    let o = run(&[
        "opt",
        td("mlp/backward.trace").to_str().unwrap(),
        "--passes",
        "ddp(world_size=2)",
        "--reproducer-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("no parameter metadata"), "{err}");
    let repro = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(err.contains(&repro.display().to_string()));
    let o = run(&["opt", "--reproduce", repro.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("replaying `ddp(world_size=2,bucket_mb=25)`"));
    assert!(stderr(&o).contains("no parameter metadata"));
}
