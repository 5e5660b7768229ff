//! Training the corpus with `remat` in the pipeline: the backward recomputes what the forward
//! stopped saving, with the forward's own ops, so every loss and every gradient keeps its bits:
//! on one rank, with the regions `fuse-elementwise` makes of the copies, and under DDP on two
//! ranks; and several steps of AdamW end on the same losses, DDP or sharded.

mod common;
use common::{corpus, json, name, same_bits, step0};
use std::path::Path;
use tracepass_runtime::train::{train, ModelSource, OptimizerKind, TrainConfig, TrainReport};

fn deterministic(dir: &Path) -> bool {
    json(&dir.join("reference/loss.json"))["deterministic"]
        .as_bool()
        .unwrap_or(false)
}

fn loss_bits(r: &TrainReport) -> Vec<u64> {
    r.losses.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn remat_keeps_every_loss_and_gradient_bit() {
    let mut checked = 0;
    for dir in corpus().into_iter().filter(|d| deterministic(d)) {
        let plain_export = json(&dir.join("export.json"))["world_size"].is_null();
        let pairs: &[(&str, &str)] = if plain_export {
            &[
                ("dce", "remat"),
                ("fuse-elementwise", "remat,fuse-elementwise"),
            ]
        } else {
            // Thunder's own DDP backward: remat reads the forward, the DDP stays as exported
            &[("no-sync", "remat,no-sync")]
        };
        for (without, with) in pairs {
            let a = step0(&dir, 1, without, 25.0);
            let b = step0(&dir, 1, with, 25.0);
            assert!(
                same_bits(&a.grads_step0[0], &b.grads_step0[0]),
                "{} `{with}`: gradients differ from `{without}`",
                name(&dir)
            );
            assert_eq!(loss_bits(&a), loss_bits(&b), "{} `{with}`", name(&dir));
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} models checked");
}

#[test]
fn remat_under_ddp_and_adamw_keeps_the_bits() {
    for model in ["nanogpt", "llama", "resnet"] {
        let dir = corpus()
            .into_iter()
            .find(|d| name(d) == model)
            .expect("corpus model");
        let run = |pipeline: &str| {
            let c = TrainConfig {
                model: ModelSource::Export(dir.clone()),
                world_size: 2,
                steps: 3,
                keep_all_ranks: true,
                pin_ranks: false,
                optimizer: OptimizerKind::adamw(),
                passes: Some(tracepass_passes::parse_pipeline(pipeline).expect("pipeline")),
                ..TrainConfig::default()
            };
            train(&c, &|_, _| {}).unwrap_or_else(|e| panic!("{model} `{pipeline}`: {e}"))
        };
        // sharded: the forward gathers, the backward reduce-scatters; remat before or after
        let sharded = run("fsdp(world_size=2)");
        for pipeline in ["remat,fsdp(world_size=2)", "fsdp(world_size=2),remat"] {
            assert_eq!(
                loss_bits(&sharded),
                loss_bits(&run(pipeline)),
                "{model} `{pipeline}`"
            );
        }
        let plain = run("ddp(world_size=2,bucket_mb=0.001),sort-waits");
        let remat = run("remat,ddp(world_size=2,bucket_mb=0.001),fuse-elementwise,sort-waits");
        assert_eq!(loss_bits(&plain), loss_bits(&remat), "{model}");
        for rank in 0..2 {
            assert!(
                same_bits(&plain.grads_step0[rank], &remat.grads_step0[rank]),
                "{model} rank {rank}"
            );
        }
    }
}
