//! `tracepass run`: a trace, or a forward and its backward, executed on named tensors.

mod common;

use common::{run, stderr, testdata};
use std::path::{Path, PathBuf};
use tracepass_runtime::tensor::TensorFile;

fn sample(rel: &str) -> PathBuf {
    testdata("opinfo/add/f32-0").join(rel)
}
fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

#[test]
fn a_forward_and_backward_give_pytorchs_outputs_and_gradients() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = dir.path().join("out.safetensors");
    let (fwd, bwd, inputs) = (
        sample("forward.trace"),
        sample("backward.trace"),
        sample("inputs.safetensors"),
    );
    let o = run(&[
        "run",
        s(&fwd),
        "--backward",
        s(&bwd),
        "--inputs",
        s(&inputs),
        "-o",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = TensorFile::load(&out).expect("the results");
    let want = TensorFile::load(&sample("expected.safetensors")).expect("PyTorch's numbers");
    assert_eq!(
        got.tensors.keys().collect::<Vec<_>>(),
        want.tensors.keys().collect::<Vec<_>>()
    );
    for (name, w) in &want.tensors {
        let g = &got.tensors[name];
        assert_eq!(g.shape(), w.shape(), "{name}");
        for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{name}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn a_lone_trace_writes_what_it_returns_by_name() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = dir.path().join("out.safetensors");
    let o = run(&[
        "run",
        s(&sample("forward.trace")),
        "--inputs",
        s(&sample("inputs.safetensors")),
        "-o",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = TensorFile::load(&out).expect("the results");
    let inputs = TensorFile::load(&sample("inputs.safetensors")).expect("inputs");
    // the forward returns its output and, as `flat_args`, its arguments unchanged
    assert!(got.tensors.len() >= 3, "{:?}", got.tensors.keys());
    assert_eq!(
        got.tensors["t_0"].to_f64_vec(),
        inputs.tensors["t_0"].to_f64_vec()
    );
}

#[test]
fn a_missing_input_names_the_argument_and_the_file() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let empty = dir.path().join("empty.safetensors");
    tracepass_runtime::tensor::save_tensors(&empty, &[]).expect("an empty file");
    let out = dir.path().join("out.safetensors");
    let o = run(&[
        "run",
        s(&sample("forward.trace")),
        "--inputs",
        s(&empty),
        "-o",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("argument `t_0`"), "{e}");
    assert!(e.contains("empty.safetensors"), "{e}");
    assert!(!out.exists(), "nothing is written on failure");
}

#[test]
fn an_unknown_device_is_refused_before_any_work() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = dir.path().join("out.safetensors");
    let o = run(&[
        "run",
        s(&sample("forward.trace")),
        "--inputs",
        s(&sample("inputs.safetensors")),
        "-o",
        s(&out),
        "--device",
        "tpu",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--device tpu: unknown device"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn ops_without_a_kernel_run_through_their_decomposition_and_are_named() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = dir.path().join("out.safetensors");
    let (trace, inputs) = (
        testdata("thunder/no-kernel/inference.trace"),
        testdata("thunder/no-kernel/inputs.safetensors"),
    );
    let o = run(&["run", s(&trace), "--inputs", s(&inputs), "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("no kernel, run through Thunder's printed decomposition: torch.nn.functional.layer_norm"),
        "{e}"
    );
    assert_eq!(
        TensorFile::load(&out).expect("the results").tensors.len(),
        12
    );
}
