//! `cargo xtask bench fsdp`: training steps/s and each rank's peak bytes of parameters,
//! gradients and optimizer state (the runtime's `state_bytes`) for DDP, ZeRO-2 and ZeRO-3 at 2
//! and 4 thread ranks, on a generated deep MLP (8 x Linear(512, 512) + GELU, batch 8, AdamW).
//! Thunder's fsdp and PyTorch FSDP2 are not timed here.

use anyhow::Result;
use tracepass_passes::parse_pipeline;
use tracepass_runtime::train::{train, ModelSource, TrainConfig, TrainReport};

const STEPS: usize = 12;
const WARMUP: usize = 2;

/// Steps/s over the steps after the warm-up (rank 0's step times), and the largest
/// `state_bytes` any rank held in any step.
fn summary(r: &TrainReport) -> (f64, usize) {
    let timed: f64 = r.metrics[0].iter().skip(WARMUP).map(|m| m.step_s).sum();
    let steps = r.metrics[0].len().saturating_sub(WARMUP) as f64;
    let peak = r
        .metrics
        .iter()
        .flat_map(|per_rank| per_rank.iter().map(|m| m.state_bytes))
        .max()
        .unwrap_or(0);
    (steps / timed.max(f64::MIN_POSITIVE), peak)
}

pub fn bench_fsdp() -> Result<()> {
    println!(
        "## fsdp: deep MLP 8 x Linear(512, 512) + GELU, batch 8, AdamW, {STEPS} steps ({WARMUP} warm-up)"
    );
    println!("| ranks | passes | steps/s | peak state per rank (MiB) | of DDP's |");
    println!("|---|---|---|---|---|");
    for ws in [2usize, 4] {
        let mut ddp_peak = None;
        for passes in [
            format!("ddp(world_size={ws}),sort-waits"),
            format!("fsdp(world_size={ws},sharding=zero2,bucket_mb=1),sort-waits"),
            format!("fsdp(world_size={ws},sharding=zero3,bucket_mb=1),sort-waits"),
        ] {
            let cfg = TrainConfig {
                model: ModelSource::DeepMlp {
                    layers: 8,
                    width: 512,
                    batch: 8,
                },
                world_size: ws,
                steps: STEPS,
                passes: Some(parse_pipeline(&passes)?),
                ..TrainConfig::default()
            };
            let r = train(&cfg, &|_, _| {})?;
            let (rate, peak) = summary(&r);
            let base = *ddp_peak.get_or_insert(peak);
            println!(
                "| {ws} | `{passes}` | {rate:.1} | {:.2} | {:.3} |",
                peak as f64 / (1u64 << 20) as f64,
                peak as f64 / base.max(1) as f64
            );
        }
    }
    Ok(())
}
