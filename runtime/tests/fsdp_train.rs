//! Sharded training (`--passes 'fsdp(...)'`) on corpus exports against DDP: the same
//! parameters after 10 AdamW steps at world sizes 2 and 4 for zero2 and zero3 (a model with
//! dropout, one with frozen parameters, one with a tie, one with an unused parameter, a Llama,
//! a BERT encoder and a CNN), a zero3 rank holding about 1/N of DDP's parameters, gradients
//! and optimizer state, and a whole checkpoint written at world size 2 resumed at world size 4.

mod common;

use common::training::{assert_same_params, cfg, run};
use std::collections::BTreeMap;
use std::path::Path;
use tracepass_ir::{ops, Type};
use tracepass_runtime::tensor::{save_tensors_with, Tensor, TensorFile};
use tracepass_runtime::train::sharded_checkpoint::SaveFormat;
use tracepass_runtime::train::TrainReport;

#[test]
fn zero2_and_zero3_train_the_parameters_ddp_trains() {
    // dropout (mlp), frozen parameters (mlp-frozen), a tie (nanogpt), an unused parameter,
    // RMSNorm and rotary embeddings (llama), an encoder with buffers (bert), convolutions (cnn)
    for name in [
        "mlp",
        "mlp-frozen",
        "nanogpt",
        "unused",
        "llama",
        "bert",
        "cnn",
    ] {
        for ws in [2, 4] {
            let ddp = run(&cfg(
                name,
                ws,
                10,
                &format!("ddp(world_size={ws}),sort-waits"),
            ));
            // one bucket per parameter (padding in most), and the default single bucket
            for (sharding, mb) in [("zero3", "0"), ("zero2", "25"), ("zero3", "0.01")] {
                let passes = format!("fsdp(world_size={ws},sharding={sharding},bucket_mb={mb})");
                let fsdp = run(&cfg(name, ws, 10, &passes));
                assert_eq!(fsdp.losses.len(), 10);
                for (a, b) in fsdp.losses.iter().zip(&ddp.losses) {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{name} {passes}");
                }
                assert_same_params(&fsdp, &ddp, &format!("{name} at {ws} ranks, {passes}"));
            }
        }
    }
}

#[test]
fn frozen_parameters_are_sharded_only_when_asked_and_stay_as_they_were() {
    let ddp = run(&cfg("mlp-frozen", 2, 3, "ddp(world_size=2)"));
    let fsdp = run(&cfg(
        "mlp-frozen",
        2,
        3,
        "fsdp(world_size=2,shard_frozen=true,bucket_mb=0)",
    ));
    assert_same_params(&fsdp, &ddp, "mlp-frozen, shard_frozen=true");
}

/// The bytes of the largest bucket a trace all-gathers whole.
fn largest_gather(r: &TrainReport) -> usize {
    r.backward
        .nodes()
        .filter(|(_, n)| n.op == ops::ALL_GATHER)
        .filter_map(|(_, n)| match r.backward.ty(n.outputs()[0]) {
            Some(Type::Future(tt)) => Some(tt.numel() * tt.dtype.size_bytes()),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// The most bytes of parameters, gradients and optimizer state a rank held in any step.
fn peak_state(r: &TrainReport, rank: usize) -> usize {
    r.metrics[rank]
        .iter()
        .map(|m| m.state_bytes)
        .max()
        .unwrap_or(0)
}

#[test]
fn a_zero3_rank_holds_a_world_size_share_of_ddps_state() {
    for name in ["mlp", "nanogpt"] {
        for ws in [2usize, 4] {
            let ddp = run(&cfg(name, ws, 2, &format!("ddp(world_size={ws})")));
            let zero3 = run(&cfg(
                name,
                ws,
                2,
                &format!("fsdp(world_size={ws},sharding=zero3,bucket_mb=0.01)"),
            ));
            let whole = peak_state(&ddp, 0);
            // parameters, gradients and two AdamW moments: more than the parameters alone
            assert!(whole > 0);
            let bucket = largest_gather(&zero3);
            assert!(bucket > 0, "zero3 gathers again in the backward");
            let bound = whole as f64 * (1.0 / ws as f64 + 0.05) + bucket as f64;
            for rank in 0..ws {
                let held = peak_state(&zero3, rank);
                assert!(
                    (held as f64) <= bound,
                    "{name} at {ws} ranks: rank {rank} holds {held} bytes, DDP {whole} (bound {bound})"
                );
                // and not nothing: a shard of everything
                assert!(held * ws >= whole / 2, "{name}: rank {rank} holds {held}");
            }
        }
    }
}

/// The checkpoint at `path` as if written by `world_size` ranks (what an unsharded run
/// requires to resume it).
fn relabel(path: &Path, world_size: usize) {
    let f = TensorFile::load(path).expect("checkpoint");
    let mut meta: BTreeMap<String, String> = f.metadata.clone();
    meta.insert("world_size".into(), world_size.to_string());
    let tensors: Vec<(String, Tensor)> = f.tensors.into_iter().collect();
    save_tensors_with(path, &tensors, &meta).expect("relabelled");
}

#[test]
fn a_checkpoint_written_at_two_ranks_resumes_at_four() {
    let dir = tempfile::tempdir().expect("tmp");
    let ck = dir.path().join("ck.safetensors");
    for name in ["nanogpt", "mlp"] {
        // 5 steps sharded at 2 ranks, saved whole (gathered; sharded_checkpoint.rs tests the
        // sharded form, the default)
        let mut first = cfg(
            name,
            2,
            5,
            "fsdp(world_size=2,sharding=zero3,bucket_mb=0.01)",
        );
        first.save = Some(ck.clone());
        first.save_format = SaveFormat::Whole;
        run(&first);
        let saved = TensorFile::load(&ck).expect("saved");
        assert_eq!(saved.metadata.get("step").map(String::as_str), Some("5"));
        // every parameter whole, with its optimizer moments
        let names = run(&cfg(name, 1, 1, "ddp(world_size=1)")).param_names;
        for n in &names {
            assert!(saved.tensors.contains_key(&format!("param.{n}")), "{n}");
        }
        // 5 more at 4 ranks, sharded another way, against DDP at 4 ranks from the same state
        let mut sharded = cfg(name, 4, 10, "fsdp(world_size=4,sharding=zero2,bucket_mb=0)");
        sharded.resume = Some(ck.clone());
        let resumed = run(&sharded);
        assert_eq!(resumed.first_step, 5);
        relabel(&ck, 4);
        let mut ddp = cfg(name, 4, 10, "ddp(world_size=4)");
        ddp.resume = Some(ck.clone());
        let reference = run(&ddp);
        assert_same_params(&resumed, &reference, &format!("{name} resumed at 4 ranks"));
    }
}

/// Accumulation reduce-scatters every micro-step and adds the shards, where DDP adds the local
/// gradients and all-reduces once: the same sum, rounded differently. AdamW turns a gradient
/// that is zero in exact arithmetic (nanoGPT's key bias) into steps of `lr` whatever its
/// rounding noise, so that model is compared under SGD; the MLP under AdamW.
#[test]
fn gradient_accumulation_adds_up_the_gradient_shards() {
    for (name, sgd) in [("nanogpt", true), ("mlp-frozen", false)] {
        let with = |passes: &str| {
            let mut c = cfg(name, 2, 4, passes);
            c.no_sync_steps = 2;
            if sgd {
                c.optimizer = tracepass_runtime::train::OptimizerKind::Sgd { lr: 1e-2 };
            }
            run(&c)
        };
        let ddp = with("ddp(world_size=2)");
        for sharding in ["zero2", "zero3"] {
            let fsdp = with(&format!(
                "fsdp(world_size=2,sharding={sharding},bucket_mb=0)"
            ));
            assert_same_params(
                &fsdp,
                &ddp,
                &format!("{name}, {sharding}, 2 micro-steps without sync"),
            );
        }
    }
}
