//! Training the corpus with `fuse-elementwise` in the pipeline: step-0 losses and gradients
//! equal eager PyTorch within the corpus bars (as `models_train.rs` checks without fusion),
//! and, with DDP on 2 ranks, the gradients are bit for bit those of the unfused pipeline, on
//! every rank and for every bucket size.

mod common;
use common::{corpus, json, name, same_bits, step0 as run};
use std::path::Path;
use tracepass_ir::DType;
use tracepass_runtime::tensor::TensorFile;
use tracepass_runtime::train::{Model, ModelSource, TrainReport};

fn plain_export(dir: &Path) -> bool {
    json(&dir.join("export.json"))["world_size"].is_null()
        && json(&dir.join("reference/loss.json"))["deterministic"]
            .as_bool()
            .unwrap()
}

fn low_precision(dir: &Path) -> bool {
    Model::load(&ModelSource::Export(dir.to_path_buf()))
        .unwrap()
        .program
        .params
        .iter()
        .any(|p| matches!(p.dtype, DType::BF16 | DType::F16))
}

fn rel_err(got: &[f64], want: &[f64], zero_scale: f64) -> f64 {
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let m = want.iter().map(|x| x.abs()).fold(0.0, f64::max);
    let scale = if m < 1e-6 * zero_scale { zero_scale } else { m };
    err / scale.max(f64::MIN_POSITIVE)
}

#[test]
fn fused_training_matches_eager_pytorch_and_the_unfused_bits() {
    let mut checked = 0;
    for dir in corpus().into_iter().filter(|d| plain_export(d)) {
        // one rank: against PyTorch, with the corpus bars (models_train.rs)
        let r = run(&dir, 1, "fuse-elementwise", 25.0);
        let want = json(&dir.join("reference/loss.json"))["losses"][0]
            .as_f64()
            .unwrap();
        let (loss_bar, grad_bar) = if low_precision(&dir) {
            (1e-2, 3e-2)
        } else {
            (1e-5, 1e-4)
        };
        assert!(
            ((r.losses[0] - want) / want).abs() < loss_bar,
            "{}: fused step-0 loss {} vs PyTorch {want}",
            name(&dir),
            r.losses[0]
        );
        let reference = TensorFile::load(&dir.join("reference/grads.safetensors")).unwrap();
        let largest = reference
            .tensors
            .values()
            .map(|t| t.to_f64_vec().iter().map(|x| x.abs()).fold(0.0, f64::max))
            .fold(0.0, f64::max);
        for (fqn, want) in &reference.tensors {
            let i = r.param_names.iter().position(|n| n == fqn).unwrap();
            let g = r.grads_step0[0][i].as_ref().unwrap();
            let e = rel_err(&g.to_f64_vec(), &want.to_f64_vec(), largest);
            assert!(e < grad_bar, "{}: fused `{fqn}` off by {e:e}", name(&dir));
        }
        let unfused = run(&dir, 1, "dce", 25.0);
        assert!(
            same_bits(&r.grads_step0[0], &unfused.grads_step0[0]),
            "{}",
            name(&dir)
        );
        // two ranks, every bucket size: the unfused pipeline's bits on every rank
        let plain = run(&dir, 2, "ddp(world_size=2),sort-waits", 25.0);
        for mb in [0.0, 0.001, 25.0] {
            let fused = run(
                &dir,
                2,
                &format!("ddp(world_size=2,bucket_mb={mb}),fuse-elementwise,sort-waits"),
                mb,
            );
            for rank in 0..2 {
                assert!(
                    same_bits(&fused.grads_step0[rank], &plain.grads_step0[0]),
                    "{} bucket {mb} rank {rank}: gradients differ from the unfused ones",
                    name(&dir)
                );
            }
            let bits = |r: &TrainReport| r.losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&plain), "{}", name(&dir));
        }
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} models checked");
}
