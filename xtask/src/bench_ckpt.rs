//! `cargo xtask bench ckpt`: what a checkpoint of a sharded (zero3) run costs each rank, saved
//! sharded (each rank writes its own shards, rank 0 the manifest) against saved whole (every
//! rank gathers, rank 0 writes one file): the median of each rank's `checkpoint_s` over a save
//! after every step (the first save left out: it creates the files), and the bytes each rank
//! writes (`checkpoint_bytes`), on nanoGPT and a generated deep MLP at 4 thread ranks.

use anyhow::Result;
use std::path::Path;
use tracepass_passes::parse_pipeline;
use tracepass_runtime::train::sharded_checkpoint::SaveFormat;
use tracepass_runtime::train::{train, ModelSource, TrainConfig, TrainReport};

const STEPS: usize = 11;
const WORLD: usize = 4;

/// Per rank: the median save time (ms) after the first save, and the bytes of the last save.
fn per_rank(r: &TrainReport) -> Vec<(f64, u64)> {
    r.metrics
        .iter()
        .map(|steps| {
            let mut t: Vec<f64> = steps.iter().skip(1).map(|m| m.checkpoint_s * 1e3).collect();
            t.sort_by(f64::total_cmp);
            let median = t.get(t.len() / 2).copied().unwrap_or(0.0);
            (median, steps.last().map_or(0, |m| m.checkpoint_bytes))
        })
        .collect()
}

pub fn bench_ckpt() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tracepass-bench-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let nanogpt = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/nanogpt");
    println!(
        "## checkpoints of fsdp(world_size={WORLD},sharding=zero3,bucket_mb=1), a save after each of {STEPS} steps"
    );
    println!("| model | form | rank | median save (ms) | MB written |");
    println!("|---|---|---|---|---|");
    for (label, model) in [
        ("nanoGPT", ModelSource::Export(nanogpt)),
        (
            "deep MLP 8 x 1024, batch 64",
            ModelSource::DeepMlp {
                layers: 8,
                width: 1024,
                batch: 64,
            },
        ),
    ] {
        for (form, format) in [
            ("sharded", SaveFormat::Sharded),
            ("whole", SaveFormat::Whole),
        ] {
            let cfg = TrainConfig {
                model: model.clone(),
                world_size: WORLD,
                steps: STEPS,
                passes: Some(parse_pipeline(&format!(
                    "fsdp(world_size={WORLD},sharding=zero3,bucket_mb=1)"
                ))?),
                save: Some(dir.join(format!("ck-{form}"))),
                save_every: Some(1),
                save_format: format,
                threads_per_rank: 1,
                ..TrainConfig::default()
            };
            let r = train(&cfg, &|_, _| {})?;
            for (rank, (ms, bytes)) in per_rank(&r).into_iter().enumerate() {
                println!(
                    "| {label} | {form} | {rank} | {ms:.1} | {:.3} |",
                    bytes as f64 / 1e6
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
