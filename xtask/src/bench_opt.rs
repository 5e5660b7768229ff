//! `cargo xtask bench opt`: the whole `tracepass opt DIR --passes ddp,sort-waits,dce` job on
//! every export of the corpus (reading the directory included), against the time Thunder's own
//! DDP transform took on the same model when the exporter recorded it
//! (`reference/thunder_timing.json` of the `-ddp` export).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tracepass_ir::{load_export, OpRegistry};
use tracepass_passes::PassManager;

fn corpus() -> Result<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("{}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("export.json").is_file())
        .collect();
    v.sort();
    Ok(v)
}

/// Seconds Thunder's DDP trace transforms took on this model (its `ddp` pass, gradient bucketing
/// and `sort_waits`, summed), as the exporter measured them. Only the `-ddp` export records it, so a
/// plain export reads its `-ddp` sibling's.
fn thunder_seconds(dir: &Path) -> Option<f64> {
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let ddp_dir = if name.ends_with("-ddp") {
        dir.to_path_buf()
    } else {
        dir.with_file_name(format!("{name}-ddp"))
    };
    let text = std::fs::read_to_string(ddp_dir.join("reference/thunder_timing.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("ddp_trace_transforms_total_s")?.as_f64()
}

fn best_of<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

pub fn bench_opt() -> Result<()> {
    println!("opt benchmark: load the export directory (parse forward, backward, prologue) and run the pipeline; best of 20, one thread");
    println!(
        "{:<18} {:>7} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10}",
        "model", "nodes", "load ms", "passes ms", "total ms", "thunder ms", "vs passes", "vs total"
    );
    println!("(thunder ms: Thunder's ddp pass + bucketing + sort_waits on the same model, reference/thunder_timing.json)");
    for dir in corpus()? {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let first = load_export(&dir)?;
        let pipeline = match first.info.world_size {
            Some(ws) => format!("no-sync,ddp(world_size={ws}),sort-waits,dce"),
            None => "ddp(world_size=2),sort-waits,dce".to_string(),
        };
        let pm = PassManager::parse(&pipeline)?;
        let nodes = first.program.backward.node_count() + first.program.forward.node_count();
        let load = best_of(20, || Ok(load_export(&dir)?))?;
        let passes = best_of(20, || {
            let mut p = first.program.clone();
            Ok(pm.run(&mut p, OpRegistry::builtin())?)
        })?;
        let total = best_of(20, || {
            let mut e = load_export(&dir)?;
            Ok(pm.run(&mut e.program, OpRegistry::builtin())?)
        })?;
        let (thunder, speedup, speedup_total) = match thunder_seconds(&dir) {
            Some(s) => (
                format!("{:.1}", s * 1e3),
                format!("{:.0}x", s / passes),
                format!("{:.0}x", s / total),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:<18} {:>7} {:>10.3} {:>10.3} {:>10.3} {:>12} {:>10} {:>10}",
            name,
            nodes,
            load * 1e3,
            passes * 1e3,
            total * 1e3,
            thunder,
            speedup,
            speedup_total
        );
    }
    Ok(())
}
