//! cargo xtask: benchmarks and data generation. Speed targets are checked here, never in tests.

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: alloc_count::Counting = alloc_count::Counting(mimalloc::MiMalloc);
use std::time::Instant;
use timing::{
    report_growth, report_scaling, reps_for, sizes, time, time_hot, time_on_copies, Timing,
    CACHE_STATES,
};

mod alloc_count;
mod bench_ckpt;
mod bench_fsdp;
mod bench_gemm;
mod bench_mid;
mod bench_models;
mod bench_opt;
mod cuda;
mod timing;
use tracepass_ir::synth::{mlp_program, MlpSpec};
use tracepass_ir::{codec, fsio, parse_trace, print_trace, Module, OpRegistry};
use tracepass_passes::PassManager;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a benchmark suite: ir, passes, runtime, overlap, cuda (GPU), opt (the export
    /// corpus through `opt`), models (the export corpus trained, against PyTorch), scaling
    /// (whole runs at doubling depth and micro-step counts), gemm (GEMM crates on the mid-size
    /// models' shapes), mid (mid-size exports trained, against PyTorch), fsdp (DDP, ZeRO-2 and
    /// ZeRO-3 steps/s and per-rank state), ckpt (a sharded run's checkpoint saved sharded
    /// against gathered: time and bytes per rank).
    Bench {
        suite: String,
        /// Largest size in nodes (ir, passes).
        #[arg(long, default_value_t = 1_000_000)]
        max_nodes: usize,
        /// Ranks (overlap).
        #[arg(long, default_value_t = 4)]
        ranks: usize,
        /// Linear layers of the deep MLP (overlap). The unhidden tail is about one bucket of
        /// comm, so the default gives 19 buckets of 25 MiB (64 layers give 10).
        #[arg(long, default_value_t = 128)]
        layers: usize,
    },
    /// Write synthetic programs (seed model, deep MLP) to testdata/generated/.
    GenTestdata,
    /// For the day a GPU is lent: builds with `--features cuda`, runs the GPU tests (which may
    /// not skip), trains the corpus models on one GPU against the CPU, runs `bench cuda`, and
    /// prints one table (about 10 minutes at most).
    GpuCheck {
        /// More directories of model folders (each with forward.trace and backward.trace),
        /// besides testdata/thunder and testdata/models.
        #[arg(long)]
        models: Vec<std::path::PathBuf>,
        /// Leave out `bench cuda`.
        #[arg(long)]
        skip_bench: bool,
        /// Run the GPU test binaries in this folder instead of building with cargo (for a
        /// machine without a Rust toolchain).
        #[arg(long)]
        prebuilt: Option<std::path::PathBuf>,
    },
    /// Regenerate the real-model corpus (testdata/models/) with the Python exporter in python/.
    /// Needs torch 2.9.0 and lightning-thunder 0.2.6 (python/requirements.txt) in the Python named
    /// by TRACEPASS_PYTHON (default `python3`); nothing else, CI included, needs Python.
    Corpus {
        /// Only these models, comma-separated (default: every model of the exporter's registry).
        #[arg(long)]
        models: Option<String>,
        /// Output folder.
        #[arg(long, default_value = "testdata/models")]
        out: std::path::PathBuf,
        /// Ranks of the `-ddp` exports (0: none).
        #[arg(long, default_value_t = 2)]
        ddp: usize,
    },
    /// Rewrite testdata/opinfo/README.md (the coverage table of Thunder's OpInfo samples) and
    /// coverage.json (the floor `runtime/tests/opinfo.rs` holds) from a run of that test.
    OpinfoReport,
    /// Profiling aid: decode (or parse, or run the DDP passes on) an N-node backward repeatedly.
    #[command(hide = true)]
    Repeat {
        what: String,
        #[arg(long, default_value_t = 1_000_000)]
        nodes: usize,
        #[arg(long, default_value_t = 5)]
        times: usize,
    },
    /// One run of `bench mid` in a process of its own (its figures as one JSON line).
    #[command(hide = true)]
    BenchMidOne {
        dir: std::path::PathBuf,
        #[arg(long)]
        ranks: usize,
        #[arg(long)]
        threads: usize,
        #[arg(long)]
        fused: bool,
    },
    /// Coverage-guided fuzzing with libFuzzer on the stable toolchain: parse, decode, opt or plan.
    Fuzz {
        target: String,
        /// Seconds to run.
        #[arg(long, default_value_t = 600)]
        time: u64,
    },
}

fn main() -> Result<()> {
    tracepass_cli::alloc::keep_freed_memory();
    match Cli::parse().cmd {
        Cmd::Bench {
            suite,
            max_nodes,
            ranks,
            layers,
        } => match suite.as_str() {
            "ir" => bench_ir(max_nodes),
            "passes" => bench_passes(max_nodes),
            "runtime" => bench_runtime(),
            "overlap" => bench_overlap(ranks, layers),
            "cuda" => cuda::bench().map(|_| ()),
            "opt" => bench_opt::bench_opt(),
            "models" => bench_models::bench_models(true),
            "scaling" => bench_scaling(),
            "gemm" => bench_gemm::bench_gemm(),
            "mid" => bench_mid::bench_mid(),
            "fsdp" => bench_fsdp::bench_fsdp(),
            "ckpt" => bench_ckpt::bench_ckpt(),
            other => {
                bail!(
                    "unknown suite `{other}`; valid: ir, passes, runtime, overlap, cuda, opt, models, scaling, gemm, mid, fsdp, ckpt"
                )
            }
        },
        Cmd::GenTestdata => gen_testdata(),
        Cmd::OpinfoReport => opinfo_report(),
        Cmd::GpuCheck {
            models,
            skip_bench,
            prebuilt,
        } => cuda::gpu_check(models, skip_bench, prebuilt),
        Cmd::Corpus { models, out, ddp } => corpus(models.as_deref(), &out, ddp),
        Cmd::Fuzz { target, time } => fuzz(&target, time),
        Cmd::BenchMidOne {
            dir,
            ranks,
            threads,
            fused,
        } => bench_mid::bench_mid_one(&dir, ranks, threads, fused),
        Cmd::Repeat { what, nodes, times } => repeat(&what, nodes, times),
    }
}

fn bench_ir(max_nodes: usize) -> Result<()> {
    println!("IR benchmark: synthetic deep-MLP backward traces (width 16), one thread; best of 3 to 300 runs (more for small sizes) with the caches hot, and as many with the caches flushed before each run (cold)");
    let mut rows: Vec<(usize, [Timing; 5], usize, usize)> = Vec::new();
    for n in sizes(max_nodes) {
        let p = mlp_program(&MlpSpec::deep_with_backward_nodes(n, 16))?;
        let t = p.backward;
        let reps = reps_for(t.node_count());
        let (tp, text) = time(reps, || print_trace(&t));
        let (tparse, parsed) = time(reps, || parse_trace(&text));
        let parsed = parsed?;
        assert!(parsed == t, "round trip failed");
        let nodes = t.node_count();
        let m = Module::Trace(t);
        let (te, bytes) = time(reps, || codec::encode(&m));
        let bytes = bytes?;
        let (td, decoded) = time(reps, || codec::decode(&bytes));
        assert!(decoded? == m, "binary round trip failed");
        // a copy of the trace in memory: the allocations and writes any decoder of this
        // layout must make, with nothing to read or check
        let (tc, copy) = time(reps, || m.clone());
        assert!(copy == m);
        // in the order of COLUMNS below
        rows.push((nodes, [td, tparse, tp, te, tc], text.len(), bytes.len()));
    }
    const COLUMNS: [&str; 5] = ["decode", "parse", "print", "encode", "copy"];
    for (state, pick) in CACHE_STATES {
        println!("{state} caches:");
        println!(
            "{:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9}",
            "nodes",
            "print ms",
            "parse ms",
            "encode ms",
            "decode ms",
            "copy ms",
            "text bytes",
            "tpb bytes",
            "parse/dec"
        );
        for (nodes, [td, tparse, tp, te, tc], text, tpb) in &rows {
            println!(
                "{:>9} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>12} {:>12} {:>8.1}x",
                nodes,
                pick(tp) * 1e3,
                pick(tparse) * 1e3,
                pick(te) * 1e3,
                pick(td) * 1e3,
                pick(tc) * 1e3,
                text,
                tpb,
                pick(tparse) / pick(td)
            );
        }
    }
    for (state, pick) in CACHE_STATES {
        for (col, what) in COLUMNS.iter().enumerate() {
            let series: Vec<(usize, f64)> = rows.iter().map(|r| (r.0, pick(&r.1[col]))).collect();
            if *what == "copy" {
                // the control: how the simplest linear work grows on this machine's caches
                report_growth(&format!("reference, {what} ({state})"), &series);
            } else {
                report_scaling(&format!("{what} ({state})"), &series);
            }
        }
    }
    if let Some((_, [td, tparse, _, _, tc], ..)) = rows.last().filter(|r| r.0 >= 1_000_000) {
        println!(
            "target: 1M-node decode < 0.5 s: {:.3} s hot, {:.3} s cold -> {}",
            td.hot_s(),
            td.cold_s(),
            if td.cold_s() < 0.5 { "met" } else { "MISSED" }
        );
        let ratio = tparse.hot_s() / td.hot_s();
        println!(
            "target: decode >= 10x faster than parse: {ratio:.1}x hot, {:.1}x cold -> {} (an in-memory copy alone is {:.1}x faster than parse)",
            tparse.cold_s() / td.cold_s(),
            if ratio >= 10.0 { "met" } else { "MISSED" },
            tparse.hot_s() / tc.hot_s()
        );
    }
    Ok(())
}

fn bench_passes(max_nodes: usize) -> Result<()> {
    let pipeline = "ddp(world_size=8,bucket_mb=25),sort-waits,dce";
    println!("passes benchmark: `{pipeline}` on synthetic deep-MLP backwards (width 64), one thread; best of 3 to 300 runs (more for small sizes) with the caches hot, and as many with the caches flushed before each run (cold)");
    println!(
        "{:>9} {:>11} {:>10} {:>11} {:>10} {:>8} {:>12}",
        "nodes", "hot ms", "ns/node", "cold ms", "ns/node", "buckets", "copy hot ms"
    );
    let mut rows = Vec::new();
    for n in sizes(max_nodes) {
        let p = mlp_program(&MlpSpec::deep_with_backward_nodes(n, 64))?;
        let mut fast = PassManager::parse(pipeline)?;
        fast.verify_each = false;
        fast.verify_at_end = false;
        let reps = reps_for(p.backward.node_count());
        let (t, out) = time_on_copies(reps, &p, |q| fast.run(q, OpRegistry::builtin()).map(|_| ()));
        let out = out?;
        // the timed runs skip verification; check the result once
        tracepass_ir::verify(&out.backward)?;
        // the control: a plain copy of the same trace, the simplest linear work there is
        let (copy, _) = time(reps, || p.backward.clone());
        let nodes = p.backward.node_count();
        let buckets = out
            .backward
            .nodes()
            .filter(|(_, n)| n.op == tracepass_ir::ops::ALL_REDUCE)
            .count();
        println!(
            "{:>9} {:>11.2} {:>10.1} {:>11.2} {:>10.1} {:>8} {:>12.2}",
            nodes,
            t.hot_s() * 1e3,
            t.hot_s() * 1e9 / nodes as f64,
            t.cold_s() * 1e3,
            t.cold_s() * 1e9 / nodes as f64,
            buckets,
            copy.hot_s() * 1e3
        );
        rows.push((nodes, t, copy));
    }
    for (state, pick) in CACHE_STATES {
        let series: Vec<(usize, f64)> = rows.iter().map(|(n, t, _)| (*n, pick(t))).collect();
        report_scaling(&format!("ddp,sort-waits,dce ({state})"), &series);
        let copies: Vec<(usize, f64)> = rows.iter().map(|(n, _, c)| (*n, pick(c))).collect();
        report_growth(
            &format!("reference, copy of the backward ({state})"),
            &copies,
        );
    }
    if let Some((_, t, _)) = rows.last().filter(|r| r.0 >= 1_000_000) {
        println!(
            "target: 1M nodes < 0.5 s: {:.3} s hot, {:.3} s cold -> {}",
            t.hot_s(),
            t.cold_s(),
            if t.cold_s() < 0.5 { "met" } else { "MISSED" }
        );
    }
    // Thunder 0.2.6's sort_waits took 4.05 s on the 10,240-node joint trace of a 256-layer MLP
    // (width 64, CPU). Same model here: forward + backward of 256 layers, width 64.
    let p = mlp_program(&MlpSpec::deep(256, 64, 8))?;
    let nodes = p.forward.node_count() + p.backward.node_count();
    let mut sw = PassManager::parse("ddp(world_size=8,bucket_mb=0),sort-waits")?;
    sw.verify_each = false;
    sw.verify_at_end = false;
    let (t_all, _) = time_on_copies(20, &p, |q| sw.run(q, OpRegistry::builtin()).map(|_| ()));
    let t_all = t_all.hot;
    let mut q = p.clone();
    PassManager::parse("ddp(world_size=8,bucket_mb=0)")?.run(&mut q, OpRegistry::builtin())?;
    // the copy each run starts from is not timed
    let (t_sort, sorted) = time_on_copies(20, &q, |r| {
        tracepass_passes::sort_waits::sort_waits(&mut r.backward, OpRegistry::builtin()).map(|_| ())
    });
    sorted?;
    let t_sort = t_sort.hot;
    println!(
        "256-layer MLP, width 64 ({nodes} nodes forward+backward, {} in the backward after ddp): sort-waits {:.3} ms, ddp+sort-waits {:.3} ms; Thunder 0.2.6 sort_waits: 4050 ms -> {:.0}x faster",
        q.backward.node_count(),
        t_sort.as_secs_f64() * 1e3,
        t_all.as_secs_f64() * 1e3,
        4.05 / t_sort.as_secs_f64()
    );
    Ok(())
}

fn gen_testdata() -> Result<()> {
    let dir = std::path::Path::new("testdata/generated");
    std::fs::create_dir_all(dir)?;
    for (name, spec) in [
        ("seed_mlp", MlpSpec::seed()),
        ("deep_mlp_16x1024", MlpSpec::deep(16, 1024, 8)),
    ] {
        let p = mlp_program(&spec)?;
        fsio::save(
            &dir.join(format!("{name}.forward.trace")),
            &Module::Trace(p.forward.clone()),
        )?;
        fsio::save(
            &dir.join(format!("{name}.backward.trace")),
            &Module::Trace(p.backward.clone()),
        )?;
        fsio::save(&dir.join(format!("{name}.tpb")), &Module::Program(p))?;
        println!(
            "wrote {}/{name}.{{forward,backward}}.trace and {name}.tpb",
            dir.display()
        );
    }
    Ok(())
}

/// Runs the OpInfo test in report mode: it writes the table and the new floor.
fn opinfo_report() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = std::process::Command::new(cargo)
        .args([
            "test",
            "-p",
            "tracepass-runtime",
            "--test",
            "opinfo",
            "--",
            "opinfo_samples_match_pytorch",
        ])
        .env("TRACEPASS_OPINFO_REPORT", "1")
        .status()?;
    if !status.success() {
        bail!("the OpInfo test failed ({status})");
    }
    println!("wrote testdata/opinfo/README.md and testdata/opinfo/coverage.json");
    Ok(())
}

/// `cargo xtask corpus`: runs `python -m tracepass.export.corpus` from the workspace root, after
/// checking that the Python has torch, Thunder and the tracepass package (`pip install ./python`:
/// the exporter is `tracepass.export`, whose package needs its native module built).
fn corpus(models: Option<&str>, out: &std::path::Path, ddp: usize) -> Result<()> {
    use anyhow::Context;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent folder")?;
    let python = std::env::var("TRACEPASS_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let probe = std::process::Command::new(&python)
        .args([
            "-c",
            "import torch, thunder, safetensors, tracepass.export; print(torch.__version__, thunder.__version__)",
        ])
        .output()
        .with_context(|| format!("cannot run `{python}` (set TRACEPASS_PYTHON to a Python with the exporter's requirements)"))?;
    if !probe.status.success() {
        let err = String::from_utf8_lossy(&probe.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        bail!(
            "`{python}` lacks the exporter's packages ({last}); install torch 2.9.0 and lightning-thunder \
             0.2.6 with `pip install -r python/requirements.txt`, then the package with `pip install ./python`, \
             and point TRACEPASS_PYTHON at that Python"
        );
    }
    println!(
        "corpus: {python} has torch/thunder {}",
        String::from_utf8_lossy(&probe.stdout).trim()
    );
    let out = if out.is_absolute() {
        out.to_path_buf()
    } else {
        root.join(out)
    };
    let mut cmd = std::process::Command::new(&python);
    cmd.current_dir(root)
        .args(["-m", "tracepass.export.corpus", "--out"])
        .arg(&out)
        .args(["--ddp", &ddp.to_string()]);
    if let Some(m) = models {
        cmd.args(["--models", m]);
    }
    let status = cmd
        .status()
        .with_context(|| format!("cannot run `{python} -m tracepass.export.corpus`"))?;
    if !status.success() {
        bail!("the exporter failed ({status}); see its output above");
    }
    Ok(())
}

/// Single-core f32 peak estimate: nominal clock (`cpu MHz`) x FLOP/cycle of the vector ISA: two
/// FMA pipes x lanes x 2 = 64 with AVX-512 (Zen 5, Intel server cores), 32 with AVX2+FMA.
/// Boost clocks run above the nominal one, so a large GEMM can exceed 100% of this estimate.
fn peak_gflops() -> (f64, String) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mhz = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(2000.0);
    let model = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let per_cycle = if info.contains(" avx512f") {
        64.0
    } else if info.contains(" fma") {
        32.0
    } else {
        8.0
    };
    (
        mhz / 1000.0 * per_cycle,
        format!("{model}, {mhz:.0} MHz, {per_cycle} f32 FLOP/cycle"),
    )
}

fn bench_runtime() -> Result<()> {
    use tracepass_runtime::cpu;
    use tracepass_runtime::tensor::Tensor;
    use tracepass_runtime::train::ModelSource;
    use tracepass_runtime::train::{train, TrainConfig};

    let (peak, cpu_desc) = peak_gflops();
    println!("## GEMM (the `gemm` crate, one thread; peak estimate {peak:.1} GFLOP/s: {cpu_desc})");
    println!("| m x k x n | ms | GFLOP/s | % of peak |");
    println!("|---|---|---|---|");
    for (m, k, n) in [
        (8, 1024, 1024),
        (1024, 8, 1024),
        (256, 256, 256),
        (1024, 1024, 1024),
    ] {
        let a = Tensor::from_f32(
            vec![m, k],
            (0..m * k).map(|i| (i % 17) as f32 * 0.01).collect(),
        );
        let b = Tensor::from_f32(
            vec![k, n],
            (0..k * n).map(|i| (i % 13) as f32 * 0.01).collect(),
        );
        let reps = ((2e9 / (2.0 * (m * k * n) as f64)) as usize).clamp(3, 200);
        let (t, _) = time_hot(5, || {
            for _ in 0..reps {
                std::hint::black_box(cpu::kernels::matmul(&a, &b).expect("fits"));
            }
        });
        let per = t.as_secs_f64() / reps as f64;
        let gf = 2.0 * (m * k * n) as f64 / per / 1e9;
        println!(
            "| {m} x {k} x {n} | {:.3} | {gf:.1} | {:.0}% |",
            per * 1e3,
            100.0 * gf / peak
        );
    }
    let quiet = |_: usize, _: f64| {};
    let steps_per_s = |cfg: &TrainConfig| -> Result<f64> {
        // best of 3 runs, whole runs timed (thread start and parameter broadcast included)
        let mut best = 0.0f64;
        for _ in 0..3 {
            let r = train(cfg, &quiet)?;
            best = best.max(cfg.steps as f64 / r.wall.as_secs_f64());
        }
        Ok(best)
    };
    println!();
    println!("## Training steps/s (DDP, bucket_mb=25, AdamW; ranks are threads on this machine)");
    println!("| model | ranks | steps | steps/s | PyTorch DDP (gloo) | ratio | target |");
    println!("|---|---|---|---|---|---|---|");
    for (world, torch) in [(1usize, 613.0), (2, 309.0), (4, 87.0)] {
        let cfg = TrainConfig {
            world_size: world,
            steps: 2000,
            ..TrainConfig::default()
        };
        let sps = steps_per_s(&cfg)?;
        println!(
            "| seed MLP | {world} | 2000 | {sps:.0} | {torch} | {:.1}x | >= 10x |",
            sps / torch
        );
    }
    for (world, torch) in [(1usize, 3.6), (2, 3.3), (4, 1.9)] {
        let cfg = TrainConfig {
            world_size: world,
            steps: 10,
            model: ModelSource::DeepMlp {
                layers: 16,
                width: 1024,
                batch: 8,
            },
            ..TrainConfig::default()
        };
        let sps = steps_per_s(&cfg)?;
        println!("| deep MLP 16 x 1024, batch 8, loss sum | {world} | 10 | {sps:.2} | {torch} | {:.2}x | >= 1x |", sps / torch);
    }
    Ok(())
}

/// Whole runs (model built, passes, plans, one step) at doubling sizes: a part of the run
/// that grows faster than the size shows as a ratio well over 2.
fn bench_scaling() -> Result<()> {
    use tracepass_runtime::train::{train, ModelSource, TrainConfig};
    let quiet = &|_: usize, _: f64| {};
    println!("## Scaling: one whole run per size, 1 rank, 1 step (target: each doubling <= 2.5x the time)");
    println!("| run | size | s | ratio to half the size | target |");
    println!("|---|---|---|---|---|");
    let run = |what: &str, sizes: &[usize], cfg: &dyn Fn(usize) -> TrainConfig| -> Result<()> {
        let mut before: Option<f64> = None;
        for &n in sizes {
            let start = std::time::Instant::now();
            train(&cfg(n), quiet)?;
            let s = start.elapsed().as_secs_f64();
            let ratio = before.map(|b| s / b);
            println!(
                "| {what} | {n} | {s:.2} | {} | {} |",
                ratio.map_or("-".to_string(), |r| format!("{r:.2}x")),
                match ratio {
                    Some(r) if r > 2.5 => "FAIL (> 2.5x)",
                    Some(_) => "ok",
                    None => "-",
                }
            );
            before = Some(s);
        }
        Ok(())
    };
    run(
        "deep-mlp:L,4,4 (L layers)",
        &[2500, 5000, 10000, 20000],
        &|layers| TrainConfig {
            model: ModelSource::DeepMlp {
                layers,
                width: 4,
                batch: 4,
            },
            steps: 1,
            ..TrainConfig::default()
        },
    )?;
    run(
        "seed, --no-sync-steps K",
        &[25_000, 50_000, 100_000],
        &|k| TrainConfig {
            no_sync_steps: k,
            steps: 1,
            ..TrainConfig::default()
        },
    )
}

/// Mean over ranks and the steady-state steps of (backward, backward compute, comm, overlap).
fn steady(r: &tracepass_runtime::train::TrainReport, skip: usize) -> (f64, f64, f64, f64, usize) {
    let mut acc = (0.0, 0.0, 0.0, 0.0, 0usize);
    let mut n = 0.0;
    for per_rank in &r.metrics {
        for m in per_rank.iter().skip(skip) {
            acc.0 += m.backward_s;
            acc.1 += m.backward_compute_s;
            acc.2 += m.comm_s;
            acc.3 += m.overlap_s;
            acc.4 = m.buckets.len();
            n += 1.0;
        }
    }
    (acc.0 / n, acc.1 / n, acc.2 / n, acc.3 / n, acc.4)
}

fn bench_overlap(world: usize, layers: usize) -> Result<()> {
    use tracepass_runtime::comm::LinkModel;
    use tracepass_runtime::train::ModelSource;
    use tracepass_runtime::train::OptimizerKind;
    use tracepass_runtime::train::{train, TrainConfig};
    let (width, steps, skip) = (1024usize, 20usize, 4usize);
    if world < 2 {
        bail!("--ranks must be at least 2 for an overlap benchmark");
    }
    let quiet = |_: usize, _: f64| {};
    let base = TrainConfig {
        model: ModelSource::DeepMlp {
            layers,
            width,
            batch: 8,
        },
        world_size: world,
        steps,
        optimizer: OptimizerKind::Sgd { lr: 1e-3 },
        ..TrainConfig::default()
    };
    // 1. the backward's compute time on this machine, without a network
    let r = train(&base, &quiet)?;
    let (_, compute, _, _, _) = steady(&r, skip);
    // 2. a link on which the ring all-reduce of all gradients takes that long
    let grad_bytes = (layers * (width * width + width) * 4) as f64;
    let n = world as f64;
    let bytes_per_s = 2.0 * (n - 1.0) / n * grad_bytes / compute;
    let mut link = LinkModel {
        latency_us: 10.0,
        bandwidth_gbps: bytes_per_s * 8.0 / 1e9,
    };
    // 3. corrections: measured comm includes the host reduction, measured compute the
    //    contention with it, and compute drifts by 10-20% between runs on this machine. Run
    //    schedule (c) and rescale the bandwidth until a run has comm within 5% of compute (the
    //    benchmark's premise); that run is (c)'s row.
    let c_pipeline = format!("ddp(world_size={world},bucket_mb=25),sort-waits");
    let mut rounds = 0;
    let c_run = loop {
        rounds += 1;
        let run = train(
            &TrainConfig {
                link: Some(link),
                passes: Some(tracepass_passes::parse_pipeline(&c_pipeline)?),
                ..base.clone()
            },
            &quiet,
        )?;
        let (_, c_compute, c_comm, _, _) = steady(&run, skip);
        if (c_comm / c_compute - 1.0).abs() <= 0.05 || rounds == 6 {
            break run;
        }
        link.bandwidth_gbps *= c_comm / c_compute;
    };
    let c_compute = steady(&c_run, skip).1;
    println!(
        "deep MLP {layers} x Linear({width},{width}) + GELU, batch 8, {world} thread ranks on {} cores; {:.0} MiB of gradients",
        std::thread::available_parallelism().map_or(1, |c| c.get()),
        grad_bytes / (1 << 20) as f64
    );
    println!(
        "link {:.1} us, {:.2} Gb/s: all gradients take {:.1} ms to all-reduce, the backward computes for {:.1} ms",
        link.latency_us,
        link.bandwidth_gbps,
        link.all_reduce_time(grad_bytes as usize, world).as_secs_f64() * 1e3,
        c_compute * 1e3
    );
    println!(
        "({rounds} calibration run(s) of (c); the last is (c)'s row) steady state: mean over ranks and steps {skip}..{steps}\n"
    );
    println!("| schedule | pipeline | all-reduces | backward ms | compute ms | comm ms | overlap % | exposed ms | backward / max(compute, comm) | speedup vs (a) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let schedules = [
        (
            "(a) Thunder 0.2.6",
            format!("ddp(world_size={world},bucket_mb=0,launch=end)"),
        ),
        (
            "(b) ours, bucket_mb=0",
            format!("ddp(world_size={world},bucket_mb=0),sort-waits"),
        ),
        ("(c) ours, default bucket", c_pipeline.clone()),
        (
            "(d) ours, PyTorch-style 1 MiB first bucket",
            format!("ddp(world_size={world},bucket_mb=25,first_bucket_mb=1),sort-waits"),
        ),
    ];
    let mut first = None;
    let mut c_run = Some(c_run);
    for (name, pipeline) in schedules {
        let measured = if pipeline == c_pipeline {
            c_run.take()
        } else {
            None
        };
        let r = match measured {
            Some(r) => r,
            None => train(
                &TrainConfig {
                    link: Some(link),
                    passes: Some(tracepass_passes::parse_pipeline(&pipeline)?),
                    ..base.clone()
                },
                &quiet,
            )?,
        };
        let (bwd, compute, comm, overlap, buckets) = steady(&r, skip);
        let a = *first.get_or_insert(bwd);
        println!(
            "| {name} | `{pipeline}` | {buckets} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2}x |",
            bwd * 1e3,
            compute * 1e3,
            comm * 1e3,
            100.0 * overlap / comm.max(1e-12),
            (comm - overlap) * 1e3,
            bwd / compute.max(comm),
            a / bwd
        );
    }
    println!("\ntargets for (c): overlap >= 80%, backward <= 1.15 x max(compute, comm), >= 1.5x faster than (a)");
    Ok(())
}

const FUZZ_TARGETS: &[&str] = &["parse", "decode", "opt", "plan"];

/// Every trace under testdata/thunder, as (file stem, text).
fn seed_traces() -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let root = std::path::Path::new("testdata/thunder");
    for dir in std::fs::read_dir(root)? {
        let dir = dir?.path();
        if !dir.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&dir)? {
            let f = f?.path();
            if f.extension().is_some_and(|e| e == "trace") {
                let name = format!(
                    "{}_{}",
                    dir.file_name().unwrap_or_default().to_string_lossy(),
                    f.file_stem().unwrap_or_default().to_string_lossy()
                );
                out.push((name, std::fs::read_to_string(&f)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Builds the fuzz target with libFuzzer's coverage instrumentation (stable rustc flags; no
/// sanitizer, so no nightly) and runs it for `secs` seconds on a corpus seeded from testdata.
fn fuzz(target: &str, secs: u64) -> Result<()> {
    if !FUZZ_TARGETS.contains(&target) {
        bail!(
            "unknown fuzz target `{target}`; valid: {}",
            FUZZ_TARGETS.join(", ")
        );
    }
    let corpus = std::path::PathBuf::from(format!("target/fuzz/corpus/{target}"));
    let artifacts = std::path::PathBuf::from(format!("target/fuzz/artifacts/{target}"));
    std::fs::create_dir_all(&corpus)?;
    std::fs::create_dir_all(&artifacts)?;
    for (name, text) in seed_traces()? {
        let bytes = match target {
            "parse" => text.into_bytes(),
            "opt" => {
                let mut b = vec![3u8, 0, 5, 0];
                b.extend(text.as_bytes());
                b
            }
            // the first byte picks the pipeline (1: ddp + sort-waits) and the pairing
            "plan" => {
                let mut b = vec![1u8];
                b.extend(text.as_bytes());
                b
            }
            _ => {
                let t = parse_trace(&text)?;
                let file = codec::encode(&Module::Trace(t))?;
                // also the bare payload behind an odd byte: the target adds a valid header
                let mut payload = vec![1u8];
                payload.extend_from_slice(&file[24..]);
                std::fs::write(corpus.join(format!("seed_payload_{name}")), payload)?;
                file
            }
        };
        std::fs::write(corpus.join(format!("seed_{name}")), bytes)?;
    }
    if target == "decode" {
        // version-1 payloads too (the encoder writes only the current version): first byte 3
        for entry in std::fs::read_dir("testdata/compat")? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "tpb") {
                let file = std::fs::read(&path)?;
                let mut payload = vec![3u8];
                payload.extend_from_slice(file.get(24..).unwrap_or_default());
                let name = path.file_stem().unwrap_or_default().to_string_lossy();
                std::fs::write(corpus.join(format!("seed_payload_{name}")), payload)?;
            }
        }
    }
    let host = String::from_utf8(
        std::process::Command::new("rustc")
            .arg("-vV")
            .output()?
            .stdout,
    )?
    .lines()
    .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
    .unwrap_or_else(|| "x86_64-unknown-linux-gnu".into());
    let flags = [
        "-Cpasses=sancov-module",
        "-Cllvm-args=-sanitizer-coverage-level=4",
        "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
        "-Cllvm-args=-sanitizer-coverage-pc-table",
        "-Cllvm-args=-sanitizer-coverage-trace-compares",
        "--cfg=fuzzing",
    ]
    .join(" ");
    println!("building fuzz target `{target}` ({host}, coverage-instrumented)");
    let status = std::process::Command::new("cargo")
        .args([
            "build",
            "--release",
            "--manifest-path",
            "xtask/fuzz/Cargo.toml",
            "--target-dir",
            "target/fuzz/build",
            "--target",
            &host,
            "--bin",
            target,
        ])
        .env("RUSTFLAGS", flags)
        .status()?;
    if !status.success() {
        bail!("building the fuzz target failed");
    }
    let bin = format!("target/fuzz/build/{host}/release/{target}");
    println!(
        "fuzzing `{target}` for {secs} s; corpus {}, crashes go to {}",
        corpus.display(),
        artifacts.display()
    );
    let status = std::process::Command::new(&bin)
        .arg(format!("-max_total_time={secs}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .arg("-max_len=65536")
        .arg(&corpus)
        .status()?;
    if !status.success() {
        bail!(
            "fuzz target `{target}` found a crash (see {})",
            artifacts.display()
        );
    }
    println!("no crash in {secs} s");
    Ok(())
}

fn repeat(what: &str, nodes: usize, times: usize) -> Result<()> {
    let p = mlp_program(&MlpSpec::deep_with_backward_nodes(nodes, 16))?;
    let m = Module::Trace(p.backward.clone());
    let bytes = codec::encode(&m)?;
    let text = print_trace(&p.backward);
    let mut best = f64::MAX;
    for _ in 0..times {
        let s = Instant::now();
        // each result is kept past the clock read: its drop is not the work being timed
        let _result: Option<Box<dyn std::any::Any>> = match what {
            "decode" => Some(Box::new(codec::decode(&bytes)?)),
            "verify" => Some(Box::new(tracepass_ir::verify(&p.backward)?)),
            "print" => Some(Box::new(print_trace(&p.backward))),
            "encode" => Some(Box::new(codec::encode(&m)?)),
            "parse" => Some(Box::new(parse_trace(&text)?)),
            "copy" => Some(Box::new(m.clone())),
            "passes" => {
                let mut q = p.clone();
                let mut pm = PassManager::parse("ddp(world_size=8,bucket_mb=25),sort-waits,dce")?;
                pm.verify_each = false;
                pm.verify_at_end = false;
                let s = Instant::now();
                let r = pm.run(&mut q, OpRegistry::builtin())?;
                let per: Vec<String> = r
                    .timings
                    .iter()
                    .map(|t| format!("{} {:.1} us", t.pass, t.time.as_secs_f64() * 1e6))
                    .collect();
                println!(
                    "  run {:.1} ms: {}",
                    s.elapsed().as_secs_f64() * 1e3,
                    per.join(", ")
                );
                None
            }
            other => bail!("unknown `{other}`: decode, parse, print, encode, copy, verify, passes"),
        };
        let took = s.elapsed().as_secs_f64();
        best = best.min(took);
        println!("{what}: {:.1} ms", took * 1e3);
    }
    println!("{what}: best {:.1} ms of {times}", best * 1e3);
    Ok(())
}
