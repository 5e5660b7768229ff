//! Messages through the real binary: each names what is wrong once, in the terms of the
//! command line, and nothing that would be silently ignored is accepted.

mod common;

use common::{model, run, stderr};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The command failed with a message holding every one of `want`.
fn fails_with(o: &Output, want: &[&str]) -> String {
    let err = stderr(o);
    assert!(matches!(o.status.code(), Some(1 | 2)), "{err}");
    for w in want {
        assert!(err.contains(w), "missing `{w}` in: {err}");
    }
    err
}

#[test]
fn paths_are_named_for_what_they_are() {
    let o = run(&["verify", "/nonexistent/dir"]);
    let e = fails_with(&o, &["/nonexistent/dir: No such file or directory"]);
    assert!(!e.contains("extension"), "{e}");
    let o = run(&["verify", model("").to_str().unwrap()]);
    fails_with(&o, &["is a folder without export.json"]);
    // an export directory is read as its program wherever one trace is shown
    let o = run(&["dot", model("mlp").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("digraph \"backward_fn\""));
}

#[test]
fn each_message_says_it_once_and_consistently() {
    // launch's fix keeps the user's --world-size, or gives the launched count
    let o = run(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--",
        "train",
        "--world-size",
        "2",
    ]);
    let e = fails_with(&o, &["run `tracepass train --world-size 2` instead"]);
    assert_eq!(e.matches("--world-size").count(), 1, "{e}");
    let o = run(&["launch", "--nproc-per-node", "3", "--", "train"]);
    fails_with(&o, &["run `tracepass train --world-size 3` instead"]);
    // an unknown pass is named once
    for args in [
        vec!["train", "--passes", "ddp(world_size=1),foo"],
        vec!["opt", "--passes", "foo", model("mlp").to_str().unwrap()],
    ] {
        let e = fails_with(&run(&args), &["unknown pass `foo`"]);
        assert_eq!(e.matches("unknown pass").count(), 1, "{args:?}: {e}");
    }
    // a count of at least 1 says so for a negative number as for 0
    for args in [
        vec!["train", "--world-size", "-1"],
        vec!["train", "--steps", "-1"],
        vec!["simulate", "x.trace", "--world-size", "-1"],
        vec!["launch", "--nproc-per-node", "-1", "--", "train"],
    ] {
        let e = fails_with(&run(&args), &["of at least 1"]);
        assert!(!e.contains("at least 0"), "{args:?}: {e}");
    }
    fails_with(
        &run(&["train", "--world-size", "0"]),
        &["--world-size must be at least 1"],
    );
}

#[test]
fn faults_that_would_never_fire_are_refused() {
    for (args, want) in [
        (
            vec!["--inject-fault", "2:0:panic"],
            "rank 2 is not a rank of --world-size 2",
        ),
        (
            vec!["--inject-fault", "0:3:vanish"],
            "step 3 is past the last step of --steps 3",
        ),
        (
            vec!["--inject-fault", "5:0:mismatch"],
            "rank 5 is not a rank",
        ),
    ] {
        let mut all = vec!["train", "--world-size", "2", "--steps", "3"];
        all.extend(args);
        let o = run(&all);
        fails_with(&o, &[want]);
        assert!(o.stdout.is_empty(), "trained first");
    }
    let mlp = model("mlp");
    let o = run(&[
        "opt",
        mlp.to_str().unwrap(),
        "--passes",
        "dce",
        "--inject-fault",
        "cse:panic",
    ]);
    fails_with(
        &o,
        &["--inject-fault cse:panic: the pipeline has no pass `cse`"],
    );
}

/// A copy of the mlp export with `export.json` edited by `edit`.
fn edited_export(dir: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let to = dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    for f in [
        "forward.trace",
        "backward.trace",
        "prologue.trace",
        "params.safetensors",
        "data.safetensors",
    ] {
        std::fs::copy(model("mlp").join(f), to.join(f)).unwrap();
    }
    let mut info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model("mlp").join("export.json")).unwrap()).unwrap();
    edit(&mut info);
    std::fs::write(to.join("export.json"), info.to_string()).unwrap();
    to
}

#[test]
fn verify_checks_what_training_an_export_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = edited_export(tmp.path(), "ok", |_| {});
    let o = run(&["verify", ok.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let no_params = edited_export(tmp.path(), "no-params", |_| {});
    std::fs::remove_file(no_params.join("params.safetensors")).unwrap();
    let loss = edited_export(tmp.path(), "loss", |v| v["loss"] = "cross_entrpy".into());
    let output = edited_export(tmp.path(), "output", |v| v["output"] = 3.into());
    let zero = edited_export(tmp.path(), "zero", |v| v["world_size"] = 0.into());
    let typo = edited_export(tmp.path(), "typo", |v| {
        v["world_sise"] = 2.into();
    });
    for (dir, want) in [
        (&no_params, "params.safetensors: missing"),
        (&loss, "export.json: unknown loss `cross_entrpy`"),
        (
            &output,
            "export.json: `output` 3: the forward has no model output 3",
        ),
        (&zero, "export.json: `world_size` 0"),
        (&typo, "export.json: unknown field `world_sise`"),
    ] {
        let o = run(&["verify", dir.to_str().unwrap()]);
        let e = fails_with(&o, &[want]);
        assert!(!e.contains("JSON trace"), "{e}");
        // and train refuses the same export before any step
        let o = run(&["train", "--model", dir.to_str().unwrap(), "--steps", "1"]);
        fails_with(&o, &[]);
        assert!(o.stdout.is_empty());
    }
}

/// A pipeline that changes the forward (`remat` drops saved values) says so when only the
/// backward is written or printed: alone it no longer pairs with the forward the user has.
/// One that changes the backward only (`ddp`) says nothing of the kind.
#[test]
fn a_backward_alone_after_a_forward_change_is_flagged() {
    let mlp = model("nanogpt");
    let o = run(&["opt", mlp.to_str().unwrap(), "--passes", "remat"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the pipeline changed the forward too"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "opt",
        mlp.to_str().unwrap(),
        "--passes",
        "ddp(world_size=2)",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("changed the forward"),
        "{}",
        stderr(&o)
    );
}
