//! The corpus's traces run on the CPU kernels with their exported parameters and step 0's
//! batch of rank 0: the forward gives eager PyTorch's loss (`reference/loss.json`) and the
//! backward its gradients (`reference/grads.safetensors`), so the kernels the op table
//! registers compute what Thunder's traces ask of them (i64 and bool tensors, indexing,
//! BatchNorm's buffer updates, max-pool and embedding gradients included).

use std::path::{Path, PathBuf};
use tracepass_ir::{load_export, Arg};
use tracepass_runtime::comm::{CommOptions, ThreadComm, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::Plan;
use tracepass_runtime::exec::{Clock, Recording};
use tracepass_runtime::exec::{Executor, RValue};
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::tensor::TensorFile;
use tracepass_runtime::train::forward_output;

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name)
}

/// Mean cross-entropy of `logits` (`[..., classes]`) against integer `targets`, in f64.
fn cross_entropy(logits: &Tensor, targets: &Tensor) -> f64 {
    let c = *logits.shape().last().expect("class dimension");
    let l = logits.to_f64_vec();
    let y = targets.to_i64_vec();
    assert_eq!(l.len(), y.len() * c);
    let total: f64 = l
        .chunks(c)
        .zip(&y)
        .map(|(row, &t)| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            lse - row[t as usize]
        })
        .sum();
    total / y.len() as f64
}

/// Rebuilds a value tree shaped like `arg` from flat values, in `for_each_value` order.
fn tree(arg: &Arg, flat: &mut std::vec::IntoIter<RValue<Tensor>>) -> RValue<Tensor> {
    match arg {
        Arg::Value(_) => flat.next().unwrap_or(RValue::None),
        Arg::Tuple(items) | Arg::List(items) => {
            RValue::Seq(items.iter().map(|a| tree(a, flat)).collect())
        }
        Arg::Dict(items) => RValue::Seq(items.iter().map(|(_, v)| tree(v, flat)).collect()),
        _ => RValue::None,
    }
}

fn execute(plan: &Plan, inputs: Vec<RValue<Tensor>>, name: &str) -> Vec<RValue<Tensor>> {
    execute_on(plan, inputs, name, 1)
}

/// Runs `plan` on `ranks` thread ranks, each with the same inputs; rank 0's results.
fn execute_on(
    plan: &Plan,
    inputs: Vec<RValue<Tensor>>,
    name: &str,
    ranks: usize,
) -> Vec<RValue<Tensor>> {
    let g = ThreadGroup::new(ranks, CommOptions::default());
    let mut all: Vec<Vec<RValue<Tensor>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (mut comm, inputs) = (g.comm(rank), inputs.clone());
                s.spawn(move || {
                    let mut e: Executor<CpuBackend, ThreadComm> = Executor::new();
                    e.run(
                        plan,
                        &CpuBackend,
                        &mut comm,
                        inputs,
                        &Clock::new(false),
                        &mut Recording::default(),
                    )
                    .unwrap_or_else(|e| panic!("{name}: rank {rank}: {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank"))
            .collect()
    });
    all.swap_remove(0)
}

/// d(mean cross-entropy)/d logits: (softmax - one_hot(target)) / rows, in f32.
fn cross_entropy_grad(logits: &Tensor, targets: &Tensor) -> Tensor {
    let c = *logits.shape().last().expect("class dimension");
    let l = logits.to_f64_vec();
    let y = targets.to_i64_vec();
    let rows = y.len() as f64;
    let mut g = Vec::with_capacity(l.len());
    for (row, &t) in l.chunks(c).zip(&y) {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|x| (x - m).exp()).sum();
        for (j, x) in row.iter().enumerate() {
            let p = (x - m).exp() / z;
            let d = if j as i64 == t { p - 1.0 } else { p };
            g.push((d / rows) as f32);
        }
    }
    Tensor::from_f32(logits.shape(), g)
}

struct Run {
    loss: f64,
    reference_loss: f64,
    /// (parameter, our gradient, eager PyTorch's) for every parameter the reference holds.
    grads: Vec<(String, Tensor, Tensor)>,
}

/// Runs the forward, and the backward when `backward` is set.
fn run_export(name: &str, backward: bool) -> Run {
    let dir = model(name);
    let export = load_export(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let p = &export.program;
    let params = TensorFile::load(&dir.join("params.safetensors")).expect("params");
    let data = TensorFile::load(&dir.join("data.safetensors")).expect("data");
    let fwd = &p.forward;
    let mut inputs: Vec<Option<Tensor>> = vec![None; fwd.args().len()];
    for q in &p.params {
        inputs[q.forward_arg] = Some(params.get(&q.fqn).expect("a parameter").clone());
    }
    for (i, slot) in inputs.iter_mut().enumerate() {
        if slot.is_none() {
            let arg = fwd.name(fwd.args()[i]);
            *slot = Some(
                data.get(&format!("{arg}.0.0"))
                    .unwrap_or_else(|e| panic!("{name}: data for `{arg}`: {e}"))
                    .clone(),
            );
        }
    }
    let out = forward_output(fwd).expect("the model output");
    let saved = match &fwd.ret {
        Arg::Tuple(items) if items.len() == 2 => items[1].clone(),
        other => panic!("{name}: the forward returns {other:?}"),
    };
    let mut results = vec![Some(out)];
    saved.for_each_value(&mut |v| results.push(Some(v)));
    let plan = Plan::compile(fwd, &results).unwrap_or_else(|e| panic!("{name}: {e}"));
    let inputs = inputs
        .into_iter()
        .map(|t| RValue::Tensor(t.expect("every argument")))
        .collect();
    let mut flat = execute(&plan, inputs, name).into_iter();
    let Some(RValue::Tensor(logits)) = flat.next() else {
        panic!("{name}: the output is not a tensor");
    };
    let targets = data
        .get(&format!("{}.0.0", export.info.targets))
        .expect("targets");
    let loss = cross_entropy(&logits, targets);
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("reference/loss.json")).expect("loss.json"),
    )
    .expect("json");
    let mut grads = Vec::new();
    if backward {
        let saved = tree(&saved, &mut flat);
        let cot = cross_entropy_grad(&logits, targets);
        let bplan = Plan::compile(&p.backward, &p.gradient_values())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // a -ddp backward all-reduces over the ranks it was exported for: each rank gets
        // the same batch, so the average is rank 0's gradient
        let ranks = export.info.world_size.unwrap_or(1);
        let g = execute_on(
            &bplan,
            vec![saved, RValue::Seq(vec![RValue::Tensor(cot)])],
            name,
            ranks,
        );
        let reference = TensorFile::load(&dir.join("reference/grads.safetensors")).expect("grads");
        let grad_of = |pos: usize, fqn: &str| match &g[pos] {
            RValue::Tensor(t) => t.to_f64_vec(),
            other => panic!("{name}: the gradient of `{fqn}` is {other:?}"),
        };
        for q in p.params.iter().filter(|q| q.tied_to.is_none()) {
            let (Some(pos), Ok(r)) = (q.grad_output, reference.get(&q.fqn)) else {
                continue;
            };
            // a tied parameter is one tensor: eager's gradient is the sum over its uses
            let mut sum = grad_of(pos, &q.fqn);
            for t in p
                .params
                .iter()
                .filter(|t| t.tied_to.as_deref() == Some(&q.fqn))
            {
                // (Thunder's DDP backward returns the sum once, and no gradient for the tie)
                let Some(pos) = t.grad_output else { continue };
                for (s, x) in sum.iter_mut().zip(grad_of(pos, &t.fqn)) {
                    *s += x;
                }
            }
            assert_eq!(sum.len(), r.numel(), "{name}: `{}`", q.fqn);
            let ours = Tensor::from_f64(r.shape(), sum);
            grads.push((q.fqn.clone(), ours, r.clone()));
        }
    }
    Run {
        loss,
        reference_loss: reference["losses"][0].as_f64().expect("a loss"),
        grads,
    }
}

#[test]
fn corpus_forwards_give_eager_pytorchs_loss() {
    // mlp and mlp-ddp draw dropout masks (prims.uniform), which needs the executor's random
    // stream (not there yet); the frozen MLPs are the same layers without dropout
    for name in [
        "bert",
        "bert-ddp",
        "cnn",
        "cnn-ddp",
        "llama",
        "llama-ddp",
        "mlp-frozen",
        "mlp-frozen-ddp",
        "nanogpt",
        "nanogpt-ddp",
    ] {
        let r = run_export(name, false);
        assert!(
            (r.loss - r.reference_loss).abs() <= 1e-4 * r.reference_loss.abs().max(1.0),
            "{name}: loss {}, eager PyTorch {}",
            r.loss,
            r.reference_loss
        );
    }
}

#[test]
fn corpus_backwards_give_eager_pytorchs_gradients() {
    // a -ddp backward runs on the 2 thread ranks it was exported for (Thunder's own
    // all-reduces and waits); mlp and mlp-ddp need dropout's random stream (see above)
    for name in [
        "bert",
        "bert-ddp",
        "cnn",
        "cnn-ddp",
        "llama",
        "llama-ddp",
        "mlp-frozen",
        "mlp-frozen-ddp",
        "nanogpt",
        "nanogpt-ddp",
    ] {
        let r = run_export(name, true);
        assert!(!r.grads.is_empty(), "{name}: no gradient compared");
        for (fqn, ours, eager) in &r.grads {
            assert_eq!(ours.shape(), eager.shape(), "{name}: {fqn}");
            let (a, b) = (ours.to_f64_vec(), eager.to_f64_vec());
            let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let err = a
                .iter()
                .zip(&b)
                .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                err <= 1e-4 * scale + 1e-6,
                "{name}: `{fqn}`: max |ours - eager| = {err:e} (max |eager| = {scale:e})"
            );
        }
    }
}
