//! Export directories through the real binary: `verify DIR`, `show DIR`, `opt DIR -o prog.tpb`
//! (the whole program, optimisable again), `opt BW --forward FW --prologue PRO`, and
//! `--allow-unregistered`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name)
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tracepass"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> (String, String) {
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "failed:\n{out}\n{err}");
    (out, err)
}

#[test]
fn verify_and_show_take_an_export_directory() {
    let cnn = model("cnn");
    let (out, _) = ok(&run(&["verify", cnn.to_str().unwrap()]));
    // the CNN's first conv is printed as bare `weight`/`bias`: still two of the 10 parameters
    assert!(
        out.contains("ok: 10 parameters (10 trainable, 0 frozen, 0 tied), 6 buffers, data x"),
        "{out}"
    );
    let (out, _) = ok(&run(&["show", cnn.to_str().unwrap()]));
    assert!(out.contains("def backward_fn("), "{out}");
    let (out, _) = ok(&run(&["show", "--forward", cnn.to_str().unwrap()]));
    assert!(out.contains("def computation("), "{out}");
    // a folder that is not an export directory is named as such
    let o = run(&["verify", model("").to_str().unwrap()]);
    assert!(!o.status.success());
}

#[test]
fn opt_writes_the_whole_program_and_reads_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("ng.tpb");
    let ng = model("nanogpt");
    let (_, err) = ok(&run(&[
        "opt",
        ng.to_str().unwrap(),
        "--passes",
        "ddp(world_size=2,bucket_mb=0.1),sort-waits,dce",
        "--stats",
        "-o",
        first.to_str().unwrap(),
    ]));
    assert!(
        err.contains("note ddp.tied: transformer.wte.weight = lm_head.weight"),
        "{err}"
    );
    assert!(err.contains("note ddp.inputs: idx"), "{err}");
    // the program file keeps the forward and the parameters: it can be re-bucketed
    let second = dir.path().join("ng2.tpb");
    let (_, err) = ok(&run(&[
        "opt",
        first.to_str().unwrap(),
        "--passes",
        "no-sync,ddp(world_size=4,bucket_mb=25),sort-waits",
        "--stats",
        "-o",
        second.to_str().unwrap(),
    ]));
    assert!(err.contains("stat ddp.buckets: 1"), "{err}");
    assert!(err.contains("stat ddp.gradients: 28"), "{err}");
}

#[test]
fn a_prologue_names_the_parameters_of_loose_traces() {
    let cnn = model("cnn");
    let f = |n: &str| cnn.join(n).to_str().unwrap().to_string();
    let (_, err) = ok(&run(&[
        "opt",
        &f("backward.trace"),
        "--forward",
        &f("forward.trace"),
        "--prologue",
        &f("prologue.trace"),
        "--passes",
        "ddp(world_size=2,bucket_mb=0)",
        "--stats",
    ]));
    // all 10 trainable parameters, the bare `weight` and `bias` included
    assert!(err.contains("stat ddp.gradients: 10"), "{err}");
    assert!(
        err.contains("note ddp.buffers: bn1.num_batches_tracked"),
        "{err}"
    );
    // pack keeps what the prologue said: the program re-reads with the buffers named
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("cnn.tpb");
    ok(&run(&[
        "pack",
        &f("forward.trace"),
        &f("backward.trace"),
        "--prologue",
        &f("prologue.trace"),
        "-o",
        prog.to_str().unwrap(),
    ]));
    let (_, err) = ok(&run(&[
        "opt",
        prog.to_str().unwrap(),
        "--passes",
        "ddp(world_size=2)",
        "--stats",
    ]));
    assert!(
        err.contains("note ddp.buffers: bn1.num_batches_tracked"),
        "{err}"
    );
    // without the prologue, Thunder's names are all there is, and the tool says so
    let (_, err) = ok(&run(&[
        "opt",
        &f("backward.trace"),
        "--forward",
        &f("forward.trace"),
        "--passes",
        "dce",
    ]));
    assert!(err.contains("no --prologue"), "{err}");
}

#[test]
fn unknown_ops_are_listed_or_kept_opaque_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(model("mlp").join("forward.trace")).unwrap();
    let bad = dir.path().join("f.trace");
    std::fs::write(
        &bad,
        src.replace("torch.nn.functional.silu", "torch.nn.functional.swish"),
    )
    .unwrap();
    let o = run(&["verify", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown op: `torch.nn.functional.swish`"),
        "{err}"
    );
    let (out, _) = ok(&run(&[
        "--allow-unregistered",
        "verify",
        bad.to_str().unwrap(),
    ]));
    assert!(out.contains("ok"), "{out}");
}
