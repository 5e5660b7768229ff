//! `tracepass train --model DIR` through the real binary: an export directory trains with its
//! own parameters, data and loss, and every option of `train` works with it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tracepass_runtime::tensorfile::TensorFile;

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
