//! `cargo xtask bench mid`: training steps/s of the mid-size exports (nanoGPT and a litgpt Llama
//! of 4 layers, n_embd 384, block 128, vocab 512, batch 4; a ResNet-18 on 64x64 images, batch
//! 8) at 1 rank x 1 thread, 1 rank x 2 threads and 2 ranks x 1 thread, against PyTorch eager /
//! DDP (gloo) with the same threads, timed in the same run. The exports are made with the
//! exporter (`python -m tracepass.export --model NAME`) into `target/mid-exports/` (never
//! committed: tens of MiB of weights) when missing; PyTorch is timed when the Python named by
//! TRACEPASS_PYTHON (default `python3`) has torch and the exporter's models. Each
//! configuration is trained twice, as exported and with the optimising passes in the
//! pipeline, `remat,conv-input-grad,fold-conv-crop,fuse-elementwise` (`fused st/s`); TRACEPASS_BENCH_MID_MODELS
//! (comma-separated) limits the models. Each of our runs is a process of its own (this binary's
//! hidden `bench-mid-one`), as each PyTorch run is: the allocator keeps freed memory, so runs in
//! one process would count the earlier runs' pages in the later runs' peak.

use crate::alloc_count::allocations;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tracepass_runtime::train::{train, ModelSource, TrainConfig, TrainReport};

const WARMUP: usize = 3;
const TIMED: usize = 10;
const MODELS: [&str; 3] = ["nanogpt-mid", "llama-mid", "resnet18-64"];
/// (ranks, threads per rank)
const CONFIGS: [(usize, usize); 3] = [(1, 1), (1, 2), (2, 1)];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python() -> String {
    std::env::var("TRACEPASS_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// The export directory of `model`, made with the exporter when missing.
fn export_dir(model: &str) -> Result<PathBuf> {
    let dir = root().join("target/mid-exports").join(model);
    if dir.join("export.json").is_file() {
        return Ok(dir);
    }
    println!("exporting {model} to {} ...", dir.display());
    let status = Command::new(python())
        .current_dir(root())
        .args(["-m", "tracepass.export", "--model", model, "--out"])
        .arg(&dir)
        .status()
        .with_context(|| format!("running {} for the exporter", python()))?;
    if !status.success() || !dir.join("export.json").is_file() {
        bail!(
            "exporting {model} failed ({status}); the exporter needs torch 2.9.0, lightning-thunder 0.2.6 and the tracepass package (`pip install ./python`) in TRACEPASS_PYTHON"
        );
    }
    Ok(dir)
}

/// Peak resident memory of this process since the last reset, in bytes (Linux).
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Ours {
    steps_per_s: f64,
    peak_rss: Option<u64>,
    /// Allocations made during one steady-state step (fewest over the timed steps).
    allocs_per_step: u64,
}

/// `--ranks R --threads T`, as both runners (ours and PyTorch's) take them.
fn config_args(ranks: usize, threads: usize) -> [String; 4] {
    [
        "--ranks".into(),
        ranks.to_string(),
        "--threads".into(),
        threads.to_string(),
    ]
}

/// One of our runs in a fresh process (this binary's `bench-mid-one`), so that its peak RSS is
/// its own.
fn run_ours_apart(dir: &Path, ranks: usize, threads: usize, fused: bool) -> Result<Ours> {
    let out = Command::new(std::env::current_exe().context("finding the xtask binary")?)
        .arg("bench-mid-one")
        .arg(dir)
        .args(config_args(ranks, threads))
        .args(fused.then_some("--fused"))
        .output()
        .context("starting bench-mid-one")?;
    if !out.status.success() {
        bail!(
            "bench-mid-one {} ({ranks}x{threads}, fused {fused}) failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("bench-mid-one printed `{line}`"))
}

/// `bench-mid-one`: one run, its figures printed as one JSON line.
pub fn bench_mid_one(dir: &Path, ranks: usize, threads: usize, fused: bool) -> Result<()> {
    let r = run_ours(dir, ranks, threads, fused)?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(())
}

fn run_ours(dir: &Path, ranks: usize, threads: usize, fused: bool) -> Result<Ours> {
    let passes = match (fused, ranks) {
        (false, _) => None,
        (true, 1) => Some("remat,conv-input-grad,fold-conv-crop,fuse-elementwise".to_string()),
        (true, n) => Some(format!(
            "remat,ddp(world_size={n}),conv-input-grad,fold-conv-crop,fuse-elementwise,sort-waits"
        )),
    };
    let cfg = TrainConfig {
        model: ModelSource::Export(dir.to_path_buf()),
        world_size: ranks,
        steps: WARMUP + TIMED,
        threads_per_rank: threads,
        passes: passes
            .map(|p| tracepass_passes::parse_pipeline(&p))
            .transpose()?,
        ..TrainConfig::default()
    };
    let last = AtomicU64::new(allocations());
    let per_step = Mutex::new(Vec::new());
    let r: TrainReport = train(&cfg, &|step, _| {
        let now = allocations();
        let before = last.swap(now, Ordering::Relaxed);
        if step >= WARMUP {
            if let Ok(mut v) = per_step.lock() {
                v.push(now - before);
            }
        }
    })
    .with_context(|| dir.display().to_string())?;
    let secs: f64 = (WARMUP..WARMUP + TIMED)
        .map(|s| {
            r.metrics
                .iter()
                .filter_map(|per_rank| per_rank.get(s))
                .map(|m| m.step_s)
                .fold(0.0, f64::max)
        })
        .sum();
    let allocs_per_step = per_step
        .into_inner()
        .ok()
        .and_then(|v| v.into_iter().min())
        .unwrap_or(0);
    Ok(Ours {
        steps_per_s: TIMED as f64 / secs,
        peak_rss: peak_rss(),
        allocs_per_step,
    })
}

/// PyTorch's (steps/s, peak RSS of rank 0's process) on `dir`, or why not.
fn run_torch(dir: &Path, ranks: usize, threads: usize) -> Result<(f64, u64), String> {
    let json =
        std::env::temp_dir().join(format!("tracepass-bench-mid-{}.json", std::process::id()));
    let out = Command::new(python())
        .current_dir(root())
        .args(["-m", "tracepass.export.bench_torch"])
        .arg(dir)
        .args(config_args(ranks, threads))
        .args([
            "--warmup",
            &WARMUP.to_string(),
            "--steps",
            &TIMED.to_string(),
            "--json",
        ])
        .arg(&json)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_string());
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&json);
    let r = &v["results"][0];
    match (r["steps_per_s"].as_f64(), r["max_rss_bytes"].as_u64()) {
        (Some(s), Some(m)) => Ok((s, m)),
        _ => Err("bench_torch wrote no result".into()),
    }
}

fn mib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.0}", b as f64 / (1 << 20) as f64)
    })
}

pub fn bench_mid() -> Result<()> {
    println!(
        "mid benchmark: `train --model DIR` steps/s, {WARMUP} warm-up + {TIMED} timed steps, AdamW; PyTorch eager (1 rank) / DDP gloo (2 ranks), torch.set_num_threads = threads, same batches and protocol; peak = process peak RSS, each run a process of its own (tracepass: all ranks in one process; PyTorch: rank 0's process, Python and torch included)"
    );
    println!(
        "{:<12} {:>5} {:>7} {:>10} {:>10} {:>10} {:>7} {:>11} {:>9} {:>13}",
        "model",
        "ranks",
        "threads",
        "ours st/s",
        "fused st/s",
        "torch st/s",
        "fused/torch",
        "peak MiB",
        "torch MiB",
        "allocs/step"
    );
    println!("{:>78}{:>35}", "(ours/fused)", "(ours/fused)");
    let only = std::env::var("TRACEPASS_BENCH_MID_MODELS").ok();
    let chosen = |m: &str| only.as_ref().is_none_or(|o| o.split(',').any(|x| x == m));
    for model in MODELS.into_iter().filter(|m| chosen(m)) {
        let dir = export_dir(model)?;
        for (ranks, threads) in CONFIGS {
            let ours = run_ours_apart(&dir, ranks, threads, false)?;
            let fused = run_ours_apart(&dir, ranks, threads, true)?;
            let (theirs, ratio, their_mem) = match run_torch(&dir, ranks, threads) {
                Ok((s, m)) => (
                    format!("{s:.2}"),
                    format!("{:.2}x", fused.steps_per_s / s),
                    mib(Some(m)),
                ),
                Err(e) => {
                    eprintln!("PyTorch not timed for {model} ({ranks}x{threads}): {e}");
                    ("-".into(), "-".into(), "-".into())
                }
            };
            println!(
                "{model:<12} {ranks:>5} {threads:>7} {:>10.2} {:>10.2} {theirs:>10} {ratio:>7} {:>11} {their_mem:>9} {:>13}",
                ours.steps_per_s,
                fused.steps_per_s,
                format!("{}/{}", mib(ours.peak_rss), mib(fused.peak_rss)),
                format!("{}/{}", ours.allocs_per_step, fused.allocs_per_step)
            );
        }
    }
    Ok(())
}
