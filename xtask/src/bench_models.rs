//! `cargo xtask bench models`: training steps/s of every plain corpus export on 1, 2 and 4 CPU
//! ranks, against PyTorch eager with DistributedDataParallel (gloo, one thread per process) on
//! the same batches, as `python/tracepass/export/bench_torch.py` measured it
//! (`testdata/models/torch_baseline.json`). Same protocol: 5 warm-up steps, 30 timed, AdamW.
//! With `--breakdown`, the ops that take most of a one-rank step.

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tracepass_runtime::train::ModelSource;
use tracepass_runtime::train::{train, TrainConfig, TrainReport};

const WARMUP: usize = 5;
const TIMED: usize = 30;

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models")
}

/// PyTorch's steps/s per (export, world size).
fn torch_baseline() -> Result<HashMap<(String, usize), f64>> {
    let path = models_dir().join("torch_baseline.json");
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| path.display().to_string())?,
    )?;
    let mut out = HashMap::new();
    for r in v["results"].as_array().into_iter().flatten() {
        if let (Some(e), Some(w), Some(s)) = (
            r["export"].as_str(),
            r["world_size"].as_u64(),
            r["steps_per_s"].as_f64(),
        ) {
            out.insert((e.to_string(), w as usize), s);
        }
    }
    Ok(out)
}

fn run(dir: &Path, world_size: usize, timeline: bool) -> Result<TrainReport> {
    let cfg = TrainConfig {
        model: ModelSource::Export(dir.to_path_buf()),
        world_size,
        steps: WARMUP + TIMED,
        timeline,
        ..TrainConfig::default()
    };
    train(&cfg, &|_, _| {}).with_context(|| dir.display().to_string())
}

/// Steps/s over the timed steps: a step ends when its slowest rank ends it.
fn steps_per_s(r: &TrainReport) -> f64 {
    let secs: f64 = (WARMUP..WARMUP + TIMED)
        .map(|s| {
            r.metrics
                .iter()
                .filter_map(|per_rank| per_rank.get(s))
                .map(|m| m.step_s)
                .fold(0.0, f64::max)
        })
        .sum();
    TIMED as f64 / secs
}

/// The ops with the largest share of rank 0's compute over the timed steps.
fn breakdown(r: &TrainReport) -> Vec<(String, f64)> {
    let mut by_op: HashMap<String, f64> = HashMap::new();
    let mut total = 0.0;
    let Some((_, events)) = r.events.first() else {
        return Vec::new();
    };
    // waits are communication the compute did not hide, not an op
    for e in events
        .iter()
        .filter(|e| !e.comm && !e.name.starts_with("wait "))
    {
        let us = e.span.end_us - e.span.start_us;
        *by_op.entry(e.name.clone()).or_default() += us;
        total += us;
    }
    let mut v: Vec<(String, f64)> = by_op
        .into_iter()
        .map(|(k, us)| (k, us / total.max(1e-9)))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.truncate(4);
    v
}

pub fn bench_models(show_breakdown: bool) -> Result<()> {
    let baseline = torch_baseline()?;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(models_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("export.json").is_file())
        .filter(|p| !p.to_string_lossy().ends_with("-ddp"))
        .collect();
    dirs.sort();
    println!("models benchmark: `train --model DIR` steps/s, {WARMUP} warm-up + {TIMED} timed steps, AdamW, each export's batches; PyTorch: eager + DDP (gloo), one thread per process (testdata/models/torch_baseline.json, measured on this machine class)");
    println!(
        "{:<12} {:>5} {:>14} {:>14} {:>8}",
        "model", "ranks", "tracepass st/s", "pytorch st/s", "ratio"
    );
    for dir in &dirs {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for world in [1usize, 2, 4] {
            let r = match run(dir, world, false) {
                Ok(r) => r,
                Err(e) => {
                    println!("{name:<12} {world:>5}  cannot train: {e:#}");
                    break;
                }
            };
            let ours = steps_per_s(&r);
            let (theirs, ratio) = match baseline.get(&(name.clone(), world)) {
                Some(t) => (format!("{t:.1}"), format!("{:.1}x", ours / t)),
                None => ("-".into(), "-".into()),
            };
            println!("{name:<12} {world:>5} {ours:>14.1} {theirs:>14} {ratio:>8}");
        }
        if show_breakdown {
            let Ok(r) = run(dir, 1, true) else { continue };
            let top: Vec<String> = breakdown(&r)
                .into_iter()
                .map(|(op, share)| format!("{op} {:.0}%", share * 100.0))
                .collect();
            println!(
                "{:<12}   one rank, share of compute: {}",
                "",
                top.join(", ")
            );
        }
    }
    Ok(())
}
