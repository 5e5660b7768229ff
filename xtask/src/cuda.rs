//! `cargo xtask bench cuda` (GEMM TFLOP/s, elementwise GB/s, NCCL all-reduce bus bandwidth,
//! steps/s) and `cargo xtask gpu-check`, the one script to run the day a GPU is lent: build,
//! GPU tests, the corpus models on one GPU against the CPU, and the benchmark, in one table.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tracepass_runtime::comm::DistEnv;
use tracepass_runtime::comm::{Communicator, ReduceOp};
use tracepass_runtime::cuda::{unique_id, CudaBackend, NcclComm};
use tracepass_runtime::exec::{Backend, Input};
use tracepass_runtime::exec::{BinaryOp, Kernel, Side};
use tracepass_runtime::sim::DeviceModel;
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::train::ModelSource;
use tracepass_runtime::train::TrainConfig;

/// A line of the final table: what was checked, the verdict or figure, details.
pub type Row = (String, String, String);

fn row(what: impl Into<String>, result: impl Into<String>, detail: impl Into<String>) -> Row {
    (what.into(), result.into(), detail.into())
}

/// One rank of an all-reduce sweep.
pub trait SweepRank {
    /// Seconds per all-reduce of `elems` f32 elements, averaged over `reps` after a warm-up.
    fn time_all_reduce(&mut self, elems: usize, reps: usize) -> Result<f64>;
}

/// All-reduce time per size over ONE communicator group of `world` ranks (a thread each),
/// made from one fresh id (`new_id`) and reused for every size: each group needs its own id,
/// and a second `ncclCommInitRank` with a used id hangs. The time of a size is the slowest
/// rank's.
pub fn all_reduce_sweep<R: SweepRank>(
    world: usize,
    sizes: &[usize],
    reps: usize,
    new_id: impl FnOnce() -> Result<Vec<u8>>,
    join: impl Fn(usize, &[u8]) -> Result<R> + Sync,
) -> Result<Vec<f64>> {
    let id = new_id()?;
    let per_rank: Vec<Result<Vec<f64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (id, join) = (&id, &join);
                s.spawn(move || -> Result<Vec<f64>> {
                    let mut rank = join(r, id).with_context(|| format!("rank {r} joining"))?;
                    sizes
                        .iter()
                        .map(|&n| rank.time_all_reduce(n, reps))
                        .collect::<Result<Vec<f64>>>()
                        .with_context(|| format!("rank {r}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a rank thread panicked"))?)
            .collect()
    });
    let mut slowest = vec![0.0f64; sizes.len()];
    for r in per_rank {
        for (s, t) in slowest.iter_mut().zip(r?) {
            *s = s.max(t);
        }
    }
    Ok(slowest)
}

/// Fields drop in order: the communicator before its GPU's backend.
struct NcclRank {
    comm: NcclComm,
    backend: CudaBackend,
}

impl SweepRank for NcclRank {
    fn time_all_reduce(&mut self, elems: usize, reps: usize) -> Result<f64> {
        let b = &self.backend;
        let buf = b.upload(&Tensor::from_f32(vec![elems], vec![1.0; elems]))?;
        let h = self
            .comm
            .all_reduce_async(buf.clone(), ReduceOp::Sum, "warm")?;
        self.comm.wait(h)?;
        b.synchronize()?;
        let t = Instant::now();
        for _ in 0..reps {
            let h = self
                .comm
                .all_reduce_async(buf.clone(), ReduceOp::Sum, "bench")?;
            self.comm.wait(h)?;
        }
        b.synchronize()?;
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        self.comm.take_timings()?;
        Ok(secs)
    }
}

/// GPUs usable here (each checked without panicking).
pub fn device_count() -> usize {
    (0..64)
        .take_while(|&i| tracepass_runtime::cuda::check_available(i).is_ok())
        .count()
}

/// `all_reduce_perf`'s "Avg bus bandwidth" for 8 B .. 128 MiB on `gpus` GPUs, when nccl-tests
/// is installed (`NCCL_TESTS` names the binary, or it is on PATH).
fn nccl_tests_busbw(gpus: usize) -> Result<f64> {
    let bin = std::env::var("NCCL_TESTS").unwrap_or_else(|_| "all_reduce_perf".into());
    let out = Command::new(&bin)
        .args(["-b", "1M", "-e", "128M", "-f", "4", "-g", &gpus.to_string()])
        .output()
        .with_context(|| format!("{bin} (nccl-tests) not found; set NCCL_TESTS"))?;
    parse_busbw(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| anyhow!("{bin} printed no average bus bandwidth"))
}

/// The figure of nccl-tests' `# Avg bus bandwidth    : 123.45` line.
fn parse_busbw(text: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once("Avg bus bandwidth")?;
        rest.trim_start().strip_prefix(':')?.trim().parse().ok()
    })
}

fn device_model(name: &str) -> Result<DeviceModel> {
    let key = if name.contains("H200") {
        "h200"
    } else if name.contains("A100") {
        "a100"
    } else if name.contains("L40S") {
        "l40s"
    } else {
        "h100"
    };
    DeviceModel::named(key).ok_or_else(|| anyhow!("no device model `{key}`"))
}

/// The GPU benchmark; prints its tables and returns summary rows.
pub fn bench() -> Result<Vec<Row>> {
    let mut summary = Vec::new();
    let g = CudaBackend::new(0).map_err(|e| anyhow!("bench cuda needs a GPU: {e}"))?;
    let name = g.context().name().unwrap_or_else(|_| "unknown GPU".into());
    let model = device_model(&name)?;
    let (major, minor) = g.compute_capability();
    println!(
        "## {name} (sm_{major}{minor}; datasheet peaks of the {} model)",
        model.name
    );
    println!("| GEMM m x k x n | dtype | ms | TFLOP/s | % of datasheet | % of cuBLAS best |");
    println!("|---|---|---|---|---|---|");
    for d in [tracepass_ir::DType::F32, tracepass_ir::DType::BF16] {
        let mut results = Vec::new();
        // the largest square GEMM first: cuBLAS's best on this device, the reference
        for (m, k, n) in [
            (8192usize, 8192usize, 8192usize),
            (4096, 4096, 4096),
            (8, 1024, 1024),
        ] {
            let host = |r: usize, c: usize, v: f32| {
                Tensor::from_f32(vec![r, c], vec![v; r * c])
                    .to_dtype(d)
                    .ok_or_else(|| anyhow!("no {d} tensors"))
            };
            let a = g.upload(&host(m, k, 0.5)?)?;
            let b = g.upload(&host(k, n, 0.25)?)?;
            let run = || g.run(&Kernel::Matmul, &[Input::Tensor(&a), Input::Tensor(&b)]);
            run()?;
            g.synchronize()?;
            let reps = if m * k * n > 1 << 33 { 10 } else { 50 };
            let t = Instant::now();
            for _ in 0..reps {
                run()?;
            }
            g.synchronize()?;
            let per = t.elapsed().as_secs_f64() / reps as f64;
            results.push(((m, k, n), per, 2.0 * (m * k * n) as f64 / per / 1e12));
        }
        let best = results.iter().map(|r| r.2).fold(0.0, f64::max);
        for ((m, k, n), per, tf) in results {
            println!(
                "| {m} x {k} x {n} | {d} | {:.3} | {tf:.1} | {:.0}% | {:.0}% |",
                per * 1e3,
                100.0 * tf * 1e12 / model.flops_for(d),
                100.0 * tf / best
            );
            if (m, k, n) == (4096, 4096, 4096) {
                summary.push(row(
                    format!("GEMM 4096^3 {d}"),
                    format!("{tf:.1} TFLOP/s"),
                    format!(
                        "{:.0}% of cuBLAS best ({best:.1}), {:.0}% of datasheet",
                        100.0 * tf / best,
                        100.0 * tf * 1e12 / model.flops_for(d)
                    ),
                ));
            }
        }
    }
    let n = 1usize << 26;
    let x = g.upload(&Tensor::from_f32(vec![n], vec![1.0; n]))?;
    let add = Kernel::Binary {
        op: BinaryOp::Add,
        a: Side::Input(0),
        b: Side::Input(1),
        alpha: 1.0,
    };
    g.run(&add, &[Input::Tensor(&x), Input::Tensor(&x)])?;
    g.synchronize()?;
    let t = Instant::now();
    for _ in 0..20 {
        g.run(&add, &[Input::Tensor(&x), Input::Tensor(&x)])?;
    }
    g.synchronize()?;
    let gbs = 3.0 * 4.0 * n as f64 * 20.0 / t.elapsed().as_secs_f64() / 1e9;
    println!(
        "\nelementwise add of 64M f32: {gbs:.0} GB/s ({:.0}% of {:.0} GB/s)",
        100.0 * gbs * 1e9 / model.mem_bw,
        model.mem_bw / 1e9
    );
    summary.push(row(
        "elementwise add 64M f32",
        format!("{gbs:.0} GB/s"),
        format!(
            "{:.0}% of datasheet memory bandwidth",
            100.0 * gbs * 1e9 / model.mem_bw
        ),
    ));
    drop(g);

    // all-reduce bus bandwidth: one thread per GPU in this process, one communicator group
    let count = device_count();
    match (count, tracepass_runtime::cuda::nccl_available()) {
        (c, _) if c < 2 => {
            println!("\nall-reduce bus bandwidth: needs 2 or more GPUs ({c} found)");
            summary.push(row("all-reduce busbw", "skipped", format!("{c} GPU(s)")));
        }
        (_, Err(e)) => {
            println!("\nall-reduce bus bandwidth: {e}");
            summary.push(row("all-reduce busbw", "skipped", e.to_string()));
        }
        (count, Ok(())) => {
            let mib = [1usize, 4, 25, 100];
            let sizes: Vec<usize> = mib.iter().map(|m| m << 18).collect();
            let times = all_reduce_sweep(
                count,
                &sizes,
                10,
                || Ok(unique_id()?),
                |r, id| {
                    let backend = CudaBackend::new(r)?;
                    let comm = NcclComm::new(&backend, r, count, id, Duration::from_secs(120))?;
                    Ok(NcclRank { comm, backend })
                },
            )?;
            let reference = nccl_tests_busbw(count);
            println!("\n| all-reduce | GPUs | ms | busbw GB/s |\n|---|---|---|---|");
            let mut last = 0.0;
            for (mb, t) in mib.iter().zip(&times) {
                let bytes = (mb << 20) as f64;
                let busbw = bytes / t * 2.0 * (count as f64 - 1.0) / count as f64 / 1e9;
                println!("| {mb} MiB | {count} | {:.3} | {busbw:.1} |", t * 1e3);
                last = busbw;
            }
            let vs = match &reference {
                Ok(r) => format!("nccl-tests all_reduce_perf: {r:.1} GB/s average"),
                Err(e) => format!("no nccl-tests figure: {e}"),
            };
            println!("{vs}");
            summary.push(row(
                format!("all-reduce 100 MiB x {count} GPUs"),
                format!("{last:.1} GB/s busbw"),
                vs,
            ));
        }
    }

    let env = DistEnv::from_lookup(|_| None)?;
    println!("\n| model | steps/s, steady (1 GPU) | steps/s, whole run |\n|---|---|---|");
    for (label, m, steps) in [
        ("seed MLP", ModelSource::Seed, 200usize),
        (
            "deep MLP 16 x 1024, batch 8",
            ModelSource::DeepMlp {
                layers: 16,
                width: 1024,
                batch: 8,
            },
            20,
        ),
    ] {
        let cfg = TrainConfig {
            world_size: 1,
            steps,
            model: m,
            ..TrainConfig::default()
        };
        let r = tracepass_runtime::cuda::train(&cfg, &env, &|_, _| {})?;
        let whole = steps as f64 / r.wall.as_secs_f64();
        let steady = steady_steps_per_s(&r.metrics[0]);
        println!("| {label} | {steady:.1} | {whole:.1} |");
        summary.push(row(
            format!("steps/s {label}"),
            format!("{steady:.1}"),
            format!("1 GPU, the second half of {steps} steps; {whole:.1} over the whole run (NVRTC compiles, uploads)"),
        ));
    }
    Ok(summary)
}

/// Steps per second over the second half of a run's steps: the first steps compile kernels
/// (NVRTC) and fill the caches, which a steady figure leaves out.
fn steady_steps_per_s(steps: &[tracepass_runtime::exec::StepMetrics]) -> f64 {
    let tail = &steps[steps.len() / 2..];
    let secs: f64 = tail.iter().map(|m| m.step_s).sum();
    tail.len() as f64 / secs.max(f64::MIN_POSITIVE)
}

/// The workspace root (commands and model paths are relative to it): where xtask was built, or
/// the current folder when the binary runs on another machine.
fn root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    match here.parent() {
        Some(built) if built.join("Cargo.toml").is_file() => built.to_path_buf(),
        _ => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    }
}

/// Runs `cmd`, killing it past `limit`; the verdict row and whether it passed.
fn run_step(what: &str, cmd: &mut Command, limit: Duration) -> (Row, bool) {
    let start = Instant::now();
    let shown = format!("{cmd:?}");
    println!("\n### {what}: {shown}");
    let mut child = match cmd.current_dir(root()).spawn() {
        Ok(c) => c,
        Err(e) => return (row(what, "FAIL", format!("could not start: {e}")), false),
    };
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let secs = start.elapsed().as_secs_f64();
                let ok = status.success();
                let verdict = if ok { "pass" } else { "FAIL" };
                return (row(what, verdict, format!("{status} in {secs:.0} s")), ok);
            }
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(200)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let detail = format!("killed after {:.0} s", limit.as_secs_f64());
                return (row(what, "FAIL", detail), false);
            }
            Err(e) => return (row(what, "FAIL", e.to_string()), false),
        }
    }
}

/// Model directories holding `forward.trace` and `backward.trace`.
fn model_dirs(roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for root in roots {
        let Ok(rd) = std::fs::read_dir(root) else {
            continue;
        };
        let mut found: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("forward.trace").is_file() && p.join("backward.trace").is_file())
            .collect();
        found.sort();
        dirs.extend(found);
    }
    dirs
}

/// Words in an error that mean the CUDA backend lacks something, not that it is wrong.
fn unsupported(msg: &str) -> bool {
    [
        "not supported on cuda",
        "cuda handles",
        "unsupported",
        "is not supported",
    ]
    .iter()
    .any(|w| msg.contains(w))
}

/// The pipeline a fused GPU run takes: every kernel region as one NVRTC kernel, over the
/// memory plan's one device allocation.
const FUSED_PIPELINE: &str = "remat,ddp(world_size=1),fuse-elementwise,sort-waits";

/// The GPU test binaries of `tracepass-runtime` (`runtime/tests/<name>.rs`).
const GPU_TESTS: [&str; 3] = ["cuda", "cuda_model_ops", "cuda_nvrtc"];

/// A model's row in the table: its folder, and the pipeline when not the default.
fn model_row_name(dir: &Path, passes: Option<&str>) -> String {
    match passes {
        Some(p) => format!("model {} ({p})", dir.display()),
        None => format!("model {}", dir.display()),
    }
}

/// A model on one GPU against the CPU, under the default pipeline or `passes`: the verdict row.
fn check_model(dir: &Path, steps: usize, passes: Option<&str>) -> Row {
    let name = model_row_name(dir, passes);
    let passes = match passes.map(tracepass_passes::parse_pipeline).transpose() {
        Ok(p) => p,
        Err(e) => return row(name, "FAIL", e.to_string()),
    };
    let cfg = TrainConfig {
        passes,
        world_size: 1,
        steps,
        // an export directory trains with its own parameters, data and loss
        model: if dir.join("export.json").is_file() {
            ModelSource::Export(dir.to_path_buf())
        } else {
            ModelSource::Files {
                forward: dir.join("forward.trace"),
                backward: dir.join("backward.trace"),
            }
        },
        ..TrainConfig::default()
    };
    let cpu = match tracepass_runtime::train::train(&cfg, &|_, _| {}) {
        Ok(r) => r,
        // a DDP export for more ranks, as exported: one GPU cannot run it (its fused row
        // re-buckets it for one rank)
        Err(e @ tracepass_runtime::train::TrainError::Config(_)) => {
            return row(name, "skip", format!("not a one-rank run as exported: {e}"))
        }
        Err(e) => {
            return row(
                name,
                "skip",
                format!("the CPU trainer cannot run it yet: {e}"),
            )
        }
    };
    let env = match DistEnv::from_lookup(|_| None) {
        Ok(e) => e,
        Err(e) => return row(name, "FAIL", e.to_string()),
    };
    let gpu = match tracepass_runtime::cuda::train(&cfg, &env, &|_, _| {}) {
        Ok(r) => r,
        Err(e) if unsupported(&e.to_string()) => {
            return row(
                name,
                "skip",
                format!("the CUDA backend cannot run it yet: {e}"),
            )
        }
        Err(e) => return row(name, "FAIL", e.to_string()),
    };
    let worst = gpu
        .losses
        .iter()
        .zip(&cpu.losses)
        .map(|(g, c)| (g - c).abs() / c.abs().max(1.0))
        .fold(0.0f64, f64::max);
    let same_len = gpu.losses.len() == cpu.losses.len();
    // a bf16 or f16 model's values carry 8 or 11 significant bits, and the GPU rounds them at
    // other points (cuBLAS, fused kernels): the bar is the one the corpus test holds the CPU
    // to against PyTorch
    // (the CPU run's parameters tell, without loading the model again)
    let low_precision = cpu.params.iter().flatten().any(|p| {
        matches!(
            p.dtype(),
            tracepass_ir::DType::BF16 | tracepass_ir::DType::F16
        )
    });
    let bar = if low_precision { 1e-2 } else { 1e-3 };
    if same_len && worst <= bar {
        row(
            name,
            "pass",
            format!("{steps} steps, loss within {worst:.1e} of the CPU (bar {bar:.0e})"),
        )
    } else {
        row(
            name,
            "FAIL",
            format!("losses gpu {:?} vs cpu {:?}", gpu.losses, cpu.losses),
        )
    }
}

/// The longest one GPU test binary may run in `gpu-check`.
const STEP_LIMIT: Duration = Duration::from_secs(150);

/// The longest one corpus model's check (CPU and GPU run together) may take in `gpu-check`.
const MODEL_LIMIT: Duration = Duration::from_secs(60);

/// [`check_model`] on a thread of its own, given up as FAIL after `limit`: a model that hangs
/// on the GPU (a wait that never completes) must not stop the check of the others. The thread
/// given up on is left running; the process ends when the check does.
fn check_model_within(dir: &Path, steps: usize, passes: Option<&str>, limit: Duration) -> Row {
    let (tx, rx) = std::sync::mpsc::channel();
    let (d, p) = (dir.to_path_buf(), passes.map(str::to_owned));
    std::thread::spawn(move || {
        let _ = tx.send(check_model(&d, steps, p.as_deref()));
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        let detail = format!("no result within {} s", limit.as_secs());
        row(model_row_name(dir, passes), "FAIL", detail)
    })
}

/// `cargo xtask gpu-check`. With `prebuilt`, a folder holding the GPU test binaries (built
/// elsewhere: `cargo test --release -p tracepass-runtime --features cuda --no-run`), nothing is
/// built and no cargo is needed, as on a lent machine without a Rust toolchain.
pub fn gpu_check(
    extra_models: Vec<PathBuf>,
    skip_bench: bool,
    prebuilt: Option<PathBuf>,
) -> Result<()> {
    let budget = Duration::from_secs(600);
    let start = Instant::now();
    if let Err(e) = tracepass_runtime::cuda::check_available(0) {
        bail!("gpu-check needs a GPU: {e}");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut rows: Vec<Row> = Vec::new();
    let mut ok = true;
    let left = |start: Instant| {
        budget
            .saturating_sub(start.elapsed())
            .max(Duration::from_secs(30))
    };

    // the GPU tests may not skip here: a missing GPU, NCCL or NVRTC is a failure
    let require = [
        ("TRACEPASS_REQUIRE_GPU", "1"),
        ("TRACEPASS_REQUIRE_NVRTC", "1"),
    ];
    let mut steps: Vec<(String, Command)> = Vec::new();
    if let Some(dir) = &prebuilt {
        for test in GPU_TESTS {
            let mut cmd = Command::new(dir.join(test));
            cmd.envs(require);
            steps.push((format!("GPU test {test} (prebuilt)"), cmd));
        }
    } else {
        let mut build = Command::new(&cargo);
        build.args([
            "build",
            "--release",
            "-p",
            "tracepass-cli",
            "--features",
            "cuda",
        ]);
        steps.push(("build --release --features cuda".into(), build));
        let mut test = Command::new(&cargo);
        test.args([
            "test",
            "--release",
            "-p",
            "tracepass-runtime",
            "--features",
            "cuda",
        ])
        .args(GPU_TESTS.iter().flat_map(|t| ["--test", t]))
        .envs(require);
        steps.push((format!("GPU tests ({})", GPU_TESTS.join(", ")), test));
    }
    for (what, mut cmd) in steps {
        // capped, so that a hung test leaves time for the models and the benchmark
        let (r, pass) = run_step(&what, &mut cmd, left(start).min(STEP_LIMIT));
        rows.push(r);
        ok &= pass;
    }

    let mut roots = vec![
        root().join("testdata/thunder"),
        root().join("testdata/models"),
    ];
    roots.extend(extra_models);
    let dirs = model_dirs(&roots);
    if dirs.is_empty() {
        rows.push(row(
            "corpus models",
            "skip",
            format!("none found under {roots:?}"),
        ));
    }
    for dir in dirs {
        for passes in [None, Some(FUSED_PIPELINE)] {
            let r = check_model_within(&dir, 3, passes, MODEL_LIMIT);
            ok &= r.1 != "FAIL";
            println!("{} | {} | {}", r.0, r.1, r.2);
            rows.push(r);
        }
    }

    if skip_bench {
        rows.push(row("bench cuda", "skip", "--skip-bench"));
    } else {
        match bench() {
            Ok(summary) => rows.extend(summary),
            Err(e) => {
                ok = false;
                rows.push(row("bench cuda", "FAIL", format!("{e:#}")));
            }
        }
    }
    let total = start.elapsed();
    let within = total <= budget;
    rows.push(row(
        "total time",
        format!("{:.0} s", total.as_secs_f64()),
        if within {
            "within 10 minutes"
        } else {
            "OVER 10 minutes"
        },
    ));
    println!("\n## gpu-check\n| check | result | detail |\n|---|---|---|");
    for (w, r, d) in &rows {
        println!("| {w} | {r} | {} |", d.replace('|', "/").replace('\n', " "));
    }
    if !ok {
        bail!("gpu-check found failures (table above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_pipeline_fits_a_one_gpu_run() {
        let specs = tracepass_passes::parse_pipeline(FUSED_PIPELINE).expect("parses");
        tracepass_runtime::train::check_pipeline(&specs, 1).expect("fits world size 1");
    }
    use std::sync::Mutex;

    /// A fake NCCL: an id may start one group only (a second init with a used id would hang
    /// on NCCL, here it is an error), and every rank of a group must bring the same id.
    struct FakeNccl {
        used: Mutex<Vec<Vec<u8>>>,
        joined: Mutex<Vec<(usize, Vec<u8>)>>,
        ids: Mutex<u8>,
    }

    struct FakeRank;
    impl SweepRank for FakeRank {
        fn time_all_reduce(&mut self, elems: usize, _reps: usize) -> Result<f64> {
            Ok(elems as f64 * 1e-9)
        }
    }

    impl FakeNccl {
        fn new() -> FakeNccl {
            FakeNccl {
                used: Mutex::new(Vec::new()),
                joined: Mutex::new(Vec::new()),
                ids: Mutex::new(0),
            }
        }
        fn new_id(&self) -> Result<Vec<u8>> {
            let mut n = self.ids.lock().unwrap();
            *n += 1;
            Ok(vec![*n; 128])
        }
        fn join(&self, rank: usize, id: &[u8]) -> Result<FakeRank> {
            let mut joined = self.joined.lock().unwrap();
            if rank == 0 {
                let mut used = self.used.lock().unwrap();
                if used.iter().any(|u| u == id) {
                    bail!("ncclCommInitRank with a used id: would hang");
                }
                used.push(id.to_vec());
            }
            joined.push((rank, id.to_vec()));
            Ok(FakeRank)
        }
    }

    #[test]
    fn the_sweep_makes_one_group_from_one_fresh_id_for_all_sizes() {
        let nccl = FakeNccl::new();
        let sizes = [1 << 18, 1 << 20, 25 << 18, 100 << 18];
        let t = all_reduce_sweep(4, &sizes, 3, || nccl.new_id(), |r, id| nccl.join(r, id)).unwrap();
        assert_eq!(t.len(), sizes.len());
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*nccl.ids.lock().unwrap(), 1, "one id for one group");
        let joined = nccl.joined.lock().unwrap();
        assert_eq!(joined.len(), 4, "each rank joins once, not once per size");
        let mut ranks: Vec<usize> = joined.iter().map(|j| j.0).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, [0, 1, 2, 3]);
        assert!(
            joined.iter().all(|j| j.1 == joined[0].1),
            "one id per group"
        );
        drop(joined);
        // a second sweep (a second group) gets a fresh id and does not hit the used one
        all_reduce_sweep(2, &sizes, 1, || nccl.new_id(), |r, id| nccl.join(r, id)).unwrap();
        assert_eq!(*nccl.ids.lock().unwrap(), 2);
        // reusing the first id is what the fake refuses (and NCCL would hang on)
        let reused = all_reduce_sweep(2, &sizes, 1, || Ok(vec![1; 128]), |r, id| nccl.join(r, id));
        assert!(reused.is_err());
    }

    #[test]
    fn a_rank_that_fails_to_join_fails_the_sweep_with_its_rank() {
        let e = all_reduce_sweep(
            2,
            &[4],
            1,
            || Ok(vec![0; 128]),
            |r, _| {
                if r == 1 {
                    bail!("no GPU 1")
                } else {
                    Ok(FakeRank)
                }
            },
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("rank 1"), "{e:#}");
    }

    #[test]
    fn nccl_tests_output_is_read() {
        let out = "#  Out of bounds values : 0 OK\n# Avg bus bandwidth    : 371.254 \n#\n";
        assert_eq!(parse_busbw(out), Some(371.254));
        assert_eq!(parse_busbw("no figure here"), None);
        assert_eq!(parse_busbw("# Avg bus bandwidth : n/a"), None);
    }

    #[test]
    fn missing_features_are_skips_and_other_errors_failures() {
        assert!(unsupported(
            "rank 0 failed: dtype i64 is not supported on cuda (f32, bf16, f16)"
        ));
        assert!(unsupported(
            "permutation [0, 1, 2, 3, 4, 5, 6] of rank 7 (cuda handles rank <= 6)"
        ));
        assert!(!unsupported(
            "rank 0 failed: cuBLAS gemm: CUBLAS_STATUS_EXECUTION_FAILED"
        ));
        assert!(!unsupported("loss: NaN"));
    }

    #[test]
    fn model_dirs_need_both_traces() {
        let dirs = model_dirs(&[PathBuf::from("../testdata/thunder")]);
        let names: Vec<String> = dirs
            .iter()
            .filter_map(|d| Some(d.file_name()?.to_str()?.to_string()))
            .collect();
        assert!(names.contains(&"mlp".to_string()), "{names:?}");
        assert!(names.contains(&"mlp-ddp".to_string()), "{names:?}");
        assert!(model_dirs(&[PathBuf::from("no/such/dir")]).is_empty());
    }
}
