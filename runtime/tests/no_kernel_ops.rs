//! Ops the runtime has no kernel for, run through the decomposition Thunder printed below them
//! (`exec::unrunnable`): an inference trace of Thunder 0.2.6 in which its torch executor runs
//! `layer_norm`, `group_norm`, `instance_norm`, `max_pool1d/2d`, `scaled_dot_product_attention`,
//! `mse_loss`, `nll_loss`, `addcdiv` and `copysign` whole (`testdata/thunder/no-kernel/make.py`)
//! gives PyTorch's outputs; an op without a printed decomposition is still refused with its
//! reason.

use std::path::{Path, PathBuf};
use tracepass_ir::{parse_trace, Trace};
use tracepass_runtime::comm::{CommOptions, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::unrunnable::{expand_unrunnable, PROVENANCE};
use tracepass_runtime::run::{run_trace, Named, RunOptions};
use tracepass_runtime::tensor::TensorFile;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/thunder/no-kernel")
}

fn trace() -> (String, Trace) {
    let text = std::fs::read_to_string(dir().join("inference.trace")).unwrap();
    let t = parse_trace(&text).unwrap();
    (text, t)
}

fn run(t: &Trace) -> Result<Named, String> {
    let inputs = TensorFile::load(&dir().join("inputs.safetensors"))
        .unwrap()
        .tensors;
    let group = ThreadGroup::new(1, CommOptions::default());
    let mut comm = group.comm(0);
    run_trace(&CpuBackend, &mut comm, t, &inputs, RunOptions::default()).map_err(|e| e.to_string())
}

/// The names the trace returns, in order.
fn returned(t: &Trace) -> Vec<String> {
    let mut names = Vec::new();
    t.ret.for_each_value(&mut |v| names.push(t.name(v)));
    names
}

#[test]
fn ops_without_kernels_give_pytorchs_numbers_through_their_decompositions() {
    let (_, t) = trace();
    let got = run(&t).unwrap();
    let expected = TensorFile::load(&dir().join("expected.safetensors"))
        .unwrap()
        .tensors;
    let names = returned(&t);
    assert_eq!(names.len(), 12);
    for (i, name) in names.iter().enumerate() {
        let (g, w) = (&got[name], &expected[&format!("out.{i}")]);
        assert_eq!(g.shape(), w.shape(), "{name}");
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (k, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale.max(1.0),
                "{name}[{k}]: {a}, PyTorch {b}"
            );
        }
    }
}

#[test]
fn the_rewritten_trace_says_which_ops_ran_through_decompositions() {
    let (_, t) = trace();
    let expanded = expand_unrunnable(&t).unwrap().expect("ops without kernels");
    let said: Vec<&str> = expanded
        .provenance
        .iter()
        .filter_map(|p| p.pass.strip_prefix(PROVENANCE))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", expanded.provenance);
    for op in [
        "torch.nn.functional.layer_norm",
        "torch.nn.functional.group_norm",
        "torch.nn.functional.instance_norm",
        "torch.nn.functional.max_pool1d",
        "torch.nn.functional.max_pool2d",
        "torch.nn.functional.scaled_dot_product_attention",
        "torch.nn.functional.mse_loss",
        "torch.nn.functional.nll_loss",
        "torch.addcdiv",
        "torch.copysign",
    ] {
        assert!(said[0].contains(op), "{op} not in {}", said[0]);
    }
    // the returned values keep their names, and nothing is left without a kernel
    assert_eq!(returned(&expanded), returned(&t));
    assert!(expand_unrunnable(&expanded).unwrap().is_none());
    // a trace whose ops all have kernels is left as it is
    let plain = parse_trace(
        "def f(a):\n  # a: \"cpu f32[2]\"\n  b = torch.neg(a)  # b: \"cpu f32[2]\"\n  return b\n",
    )
    .unwrap();
    assert!(expand_unrunnable(&plain).unwrap().is_none());
}

#[test]
fn an_op_without_kernel_or_decomposition_is_refused_with_its_reason() {
    let (text, _) = trace();
    // the layer_norm statement without the body Thunder printed below it
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("= torch.nn.functional.layer_norm("))
        .unwrap();
    let end = (at + 1..lines.len())
        .find(|&i| !(lines[i].starts_with("    ") && lines[i].trim_start().starts_with('#')))
        .unwrap();
    let stripped = [&lines[..=at], &lines[end..]].concat().join("\n") + "\n";
    let t = parse_trace(&stripped).unwrap();
    let e = run(&t).unwrap_err();
    assert!(e.contains("layer_norm"), "{e}");
    assert!(e.contains("no fused CPU kernel"), "{e}");
}
