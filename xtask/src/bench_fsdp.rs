//! `cargo xtask bench fsdp`: training steps/s and each rank's peak bytes of parameters,
//! gradients and optimizer state (the runtime's `state_bytes`) for DDP, ZeRO-2 and ZeRO-3 at 2
//! and 4 thread ranks, on a generated deep MLP (8 x Linear(512, 512) + GELU, batch 8, AdamW);
//! then, when the Python named by TRACEPASS_PYTHON (default `python3`) has torch, the same
//! model under PyTorch DDP, PyTorch FSDP2 (`fully_shard`) and Thunder's fsdp (ZeRO-2 and
//! ZeRO-3 each) on gloo CPU ranks (`python/tracepass/bench_fsdp.py`, one process per rank):
//! the same steps, the same per-rank state count, and each rank process's peak RSS. A way that
//! cannot run on CPU is a row with its error.

use anyhow::Result;
use std::path::Path;
use std::process::Command;
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
    println!(
        "| ranks | way | steps/s | peak state per rank (MiB) | of DDP's | peak RSS per rank (MiB) |"
    );
    println!("|---|---|---|---|---|---|");
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
                "| {ws} | tracepass `{passes}` | {rate:.1} | {:.2} | {:.3} | - |",
                peak as f64 / (1u64 << 20) as f64,
                peak as f64 / base.max(1) as f64
            );
        }
        python_rows(ws);
    }
    Ok(())
}

/// PyTorch's and Thunder's rows at `ws` ranks, or a note saying why there are none.
fn python_rows(ws: usize) {
    let python = std::env::var("TRACEPASS_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/tracepass/bench_fsdp.py");
    let out = Command::new(&python)
        .arg(&script)
        .args([
            "--worlds",
            &ws.to_string(),
            "--steps",
            &(STEPS - WARMUP).to_string(),
            "--warmup",
            &WARMUP.to_string(),
            "--json",
        ])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("failed");
            println!("| {ws} | PyTorch / Thunder not timed: {python}: {last} | | | | |");
            return;
        }
        Err(e) => {
            println!("| {ws} | PyTorch / Thunder not timed: cannot run {python}: {e} | | | | |");
            return;
        }
    };
    let mut ddp_state = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let way = v["way"].as_str().unwrap_or("?");
        if let Some(e) = v["error"].as_str() {
            println!("| {ws} | {way} | cannot run: {e} | | | |");
            continue;
        }
        let (rate, state, rss) = (
            v["steps_per_s"].as_f64().unwrap_or(f64::NAN),
            v["state_mib"].as_f64().unwrap_or(f64::NAN),
            v["peak_rss_mib"].as_f64().unwrap_or(f64::NAN),
        );
        let base = *ddp_state.get_or_insert(state);
        println!(
            "| {ws} | {way} | {rate:.1} | {state:.2} | {:.3} | {rss:.0} |",
            state / base
        );
    }
}
