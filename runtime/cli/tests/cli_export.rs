//! Export directories through the real binary: `verify DIR`, `show DIR`, `opt DIR -o prog.tpb`
//! (the whole program, optimisable again), `opt BW --forward FW --prologue PRO`,
//! `--allow-unregistered`, and `train --model DIR` with every option of `train`.

mod common;

use common::{bin, model, ok, run};
use std::path::Path;
use std::process::Output;
use tracepass_runtime::tensor::TensorFile;

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
    assert!(err.contains("stat ddp.buckets: 1 (pass ddp("), "{err}");
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
    // an op tracepass has no entry for is read through Thunder's printed decomposition, and
    // the command says so
    let renamed = src.replace("torch.nn.functional.silu", "torch.nn.functional.swish");
    std::fs::write(&bad, &renamed).unwrap();
    let o = run(&["verify", bad.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let note = String::from_utf8_lossy(&o.stderr);
    assert!(
        note.contains(
            "read through Thunder's printed decomposition: `torch.nn.functional.swish` (lines 132, 276)"
        ),
        "{note}"
    );
    // without a decomposition it is an unknown op
    let bare: Vec<&str> = renamed
        .lines()
        .filter(|l| !l.trim_start().starts_with("# t") || !l.starts_with("    "))
        .collect();
    std::fs::write(&bad, bare.join("\n") + "\n").unwrap();
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

fn fails(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded:\n{}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn losses(out: &str) -> Vec<(usize, f64)> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("# ")?;
            let (step, loss) = rest.split_once("-th loss: ")?;
            Some((step.parse().ok()?, loss.parse().ok()?))
        })
        .collect()
}

#[test]
fn an_export_trains_with_every_option_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let ng = model("nanogpt");
    let (out, err) = ok(&run(&[
        "train",
        "--model",
        ng.to_str().unwrap(),
        "--world-size",
        "2",
        "--steps",
        "3",
        "--bucket-mb",
        "0",
        "--no-sync-steps",
        "1",
        "--link",
        "nvlink",
        "--save-grads",
        &p("grads.safetensors"),
        "--save",
        &p("ck.safetensors"),
        "--metrics",
        "--timeline",
        &p("timeline.json"),
        "--metrics-json",
        &p("metrics.json"),
    ]));
    let l = losses(&out);
    assert_eq!(
        l.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "{out}"
    );
    assert!(
        err.contains("accumulate-grads,ddp(world_size=2,bucket_mb=0)"),
        "{err}"
    );
    assert!(out.contains("step  rank  step_ms"), "{out}");
    // gradients by PyTorch name: the tie under its first name, as named_parameters() lists it
    let g = TensorFile::load(Path::new(&p("grads.safetensors"))).unwrap();
    assert!(g.tensors.contains_key("transformer.wte.weight"));
    assert!(g.tensors.contains_key("transformer.h.0.attn.c_attn.weight"));
    assert!(!g.tensors.contains_key("lm_head.weight"));
    let reference = TensorFile::load(&ng.join("reference/grads.safetensors")).unwrap();
    let mut names: Vec<&String> = g.tensors.keys().collect();
    let mut want: Vec<&String> = reference.tensors.keys().collect();
    names.sort();
    want.sort();
    assert_eq!(names, want);
    let _: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("timeline.json")).unwrap()).unwrap();
    // resuming continues at step 3 with the same configuration
    let (out, err) = ok(&run(&[
        "train",
        "--model",
        ng.to_str().unwrap(),
        "--world-size",
        "2",
        "--steps",
        "5",
        "--no-sync-steps",
        "1",
        "--resume",
        &p("ck.safetensors"),
    ]));
    assert_eq!(
        losses(&out).iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![3, 4],
        "{out}\n{err}"
    );
}

#[test]
fn an_export_with_thunders_ddp_must_match_the_world_size_or_be_rebucketed() {
    let ddp = model("nanogpt-ddp");
    let d = ddp.to_str().unwrap();
    let err = fails(&run(&[
        "train",
        "--model",
        d,
        "--world-size",
        "4",
        "--steps",
        "1",
    ]));
    assert!(
        err.contains("world size 2") && err.contains("--world-size 4"),
        "{err}"
    );
    let (_, err) = ok(&run(&[
        "train",
        "--model",
        d,
        "--world-size",
        "2",
        "--steps",
        "1",
    ]));
    assert!(err.contains("(as exported)"), "{err}");
    let (out, err) = ok(&run(&[
        "train",
        "--model",
        d,
        "--world-size",
        "2",
        "--steps",
        "2",
        "--passes",
        "no-sync,ddp(world_size=2,bucket_mb=0.01),sort-waits",
    ]));
    assert_eq!(losses(&out).len(), 2, "{out}\n{err}");
    assert!(err.contains("backward: no-sync,ddp(world_size=2"), "{err}");
    // the export holds batches for the 2 ranks it was made for: more is an error before training
    let err = fails(&run(&[
        "train",
        "--model",
        d,
        "--world-size",
        "4",
        "--steps",
        "1",
        "--passes",
        "no-sync,ddp(world_size=4),sort-waits",
    ]));
    assert!(
        err.contains("for 2 rank(s)") && err.contains("rank 2"),
        "{err}"
    );
    assert!(!err.contains("stopped because of it"), "{err}");
}

#[test]
fn bad_export_directories_and_missing_batches_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = fails(&run(&[
        "train",
        "--model",
        dir.path().to_str().unwrap(),
        "--steps",
        "1",
    ]));
    assert!(err.contains("no export.json"), "{err}");
    // the corpus has batches for 4 ranks
    let err = fails(&run(&[
        "train",
        "--model",
        model("llama").to_str().unwrap(),
        "--world-size",
        "5",
        "--steps",
        "1",
    ]));
    assert!(
        err.contains("for 4 rank(s)") && err.contains("rank 4"),
        "{err}"
    );
    // an export's own files can be replaced; a wrong one is named
    let err = fails(&run(&[
        "train",
        "--model",
        model("llama").to_str().unwrap(),
        "--params",
        model("nanogpt")
            .join("params.safetensors")
            .to_str()
            .unwrap(),
        "--steps",
        "1",
    ]));
    assert!(err.contains("params.safetensors"), "{err}");
}

/// `--stats` says which pass reported each counter and, for a trace-level pass, which trace.
#[test]
fn stats_name_their_pass_and_trace() {
    let dir = model("mlp");
    let o = bin()
        .args([
            "opt",
            dir.to_str().unwrap(),
            "--passes",
            "ddp(world_size=2),dce",
            "--stats",
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("stat ddp.buckets: 1 (pass ddp(world_size=2"),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("stat dce.") && l.contains("(pass dce, trace ")),
        "{err}"
    );
}
