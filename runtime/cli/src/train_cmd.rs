//! `tracepass train`: options, progress and output of the trainer.

use crate::input::{load_program, program_from_traces};
use crate::numbers::{count, count64, count_from_1};
use crate::outputs::Files;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Duration;
use tracepass_runtime::comm::LinkModel;
use tracepass_runtime::exec::timeline_json;
use tracepass_runtime::train::sharded_checkpoint::SaveFormat;
use tracepass_runtime::train::{
    Fault, LossKind, ModelSource, OptimizerKind, TrainConfig, TrainReport,
};

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Number of ranks (threads on this machine).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = count_from_1)]
    pub world_size: usize,
    /// Optimizer steps, counted from the start of training (a resumed run continues to it).
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = count_from_1)]
    pub steps: usize,
    /// Gradient bucket cap in MiB; 0 or less: one all-reduce per gradient.
    #[arg(long, default_value_t = 25.0, allow_negative_numbers = true)]
    pub bucket_mb: f64,
    /// Initial parameters and buffers by module path (`l1.weight`, ...); without it the export's
    /// params.safetensors, or a seeded init.
    #[arg(long, value_name = "FILE.safetensors")]
    pub params: Option<PathBuf>,
    /// Batches `<arg>.<micro-batch>.<rank>` for every data argument (`x`, `idx`, ...) and the
    /// targets (`y`, or the export's `targets`); without it the export's data.safetensors, or
    /// seeded random data.
    #[arg(long, value_name = "FILE.safetensors")]
    pub data: Option<PathBuf>,
    /// Write rank 0's synchronized gradients of the first step, by module path.
    #[arg(long, value_name = "FILE.safetensors")]
    pub save_grads: Option<PathBuf>,
    /// Rank whose parameters every rank takes before the first step, or `none`.
    #[arg(long, default_value = "0")]
    pub broadcast_from: String,
    /// Micro-steps that accumulate gradients without communication before each synchronized one.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = count)]
    pub no_sync_steps: usize,
    /// Seed for the parameter init (without --params) and the random data (without --data).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = count64)]
    pub seed: u64,
    /// `seed` (the built-in Thunder traces), `deep-mlp:LAYERS,WIDTH,BATCH`, an export directory
    /// (its parameters, data and loss come with it; see docs/EXPORT_FORMAT.md), or a program
    /// file (.tpb or .json, from `tracepass pack` or `opt --forward F -o prog.tpb`).
    #[arg(long, default_value = "seed", conflicts_with_all = ["forward", "backward"])]
    pub model: String,
    /// A forward trace to train instead of the built-in model (needs --backward); .trace, .tpb
    /// or .json.
    #[arg(long, requires = "backward")]
    pub forward: Option<PathBuf>,
    /// The backward trace belonging to --forward (plain, or Thunder's own DDP export).
    #[arg(long, requires = "forward")]
    pub backward: Option<PathBuf>,
    /// Thunder's prologue trace for --forward: names the parameters by their PyTorch names.
    #[arg(long, requires = "forward")]
    pub prologue: Option<PathBuf>,
    /// `adamw` (PyTorch defaults) or `sgd`.
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Learning rate (default: 1e-3 for AdamW, 1e-2 for SGD).
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Pipeline for the synchronized backward (default: `ddp(world_size=N,bucket_mb=B),sort-waits`).
    /// A ddp pass must have this run's world size; on more than one rank the result must
    /// synchronize the gradients.
    #[arg(long)]
    pub passes: Option<String>,
    /// Simulated network for all-reduces: `LATENCY_US,BANDWIDTH_GBPS` (ring alpha-beta model)
    /// or a name: nvlink, nvlink3, pcie5, ib-400g, ib-200g, eth-100g.
    #[arg(long, allow_hyphen_values = true)]
    pub link: Option<String>,
    /// Seconds a rank waits at a collective before it gives up with an error (a --link whose
    /// all-reduce takes longer is refused before training).
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true, value_parser = crate::numbers::seconds)]
    pub collective_timeout: f64,
    /// Write a Chrome/Perfetto timeline (open in ui.perfetto.dev).
    #[arg(long, value_name = "FILE.json")]
    pub timeline: Option<PathBuf>,
    /// Print per-step compute, communication and overlap.
    #[arg(long)]
    pub metrics: bool,
    /// Write per-step, per-rank, per-bucket metrics as JSON.
    #[arg(long, value_name = "FILE.json")]
    pub metrics_json: Option<PathBuf>,
    /// Print the rewritten backward to stderr before the first step.
    #[arg(long)]
    pub show_backward: bool,
    /// `cpu` (the only device in this build without the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Write a checkpoint (parameters, optimizer state, step) after the last step.
    #[arg(long, value_name = "FILE.safetensors")]
    pub save: Option<PathBuf>,
    /// The form of --save: `sharded` (a manifest at FILE and one file per rank in FILE.shards/,
    /// each rank writing only its shards), `whole` (one file of whole tensors), `auto` (sharded
    /// when --passes shards the run with fsdp, else whole). --resume reads either.
    #[arg(
        long,
        default_value = "auto",
        value_name = "auto|whole|sharded",
        requires = "save"
    )]
    pub checkpoint_format: String,
    /// Also write the checkpoint every N steps (N >= 1).
    #[arg(long, requires = "save", allow_negative_numbers = true, value_parser = count_from_1)]
    pub save_every: Option<usize>,
    /// Continue from a checkpoint; --steps counts from the start of training.
    #[arg(long, value_name = "FILE.safetensors", conflicts_with = "params")]
    pub resume: Option<PathBuf>,
    /// Let the OS place the rank threads instead of pinning rank r to the (r mod n)-th CPU.
    #[arg(long)]
    pub no_pin_ranks: bool,
    /// Threads per rank for matrix products; 0: the CPUs left over by the ranks (CPUs / ranks).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = count)]
    pub threads_per_rank: usize,
    /// The loss: cross_entropy (integer targets), mse, sum or output; default: the export's
    /// (export.json), or for a program file or traces the seed's soft-target cross entropy.
    #[arg(long)]
    pub loss: Option<String>,
    /// The targets' name in the data file (`<NAME>.<step>.<rank>`); default `targets` (`y` for
    /// the seed's loss).
    #[arg(long, value_name = "NAME")]
    pub targets: Option<String>,
    /// Train on through a NaN or infinite loss, gradient norm or parameter (default: stop at
    /// the first, naming the step and rank); a non-finite checkpoint is never written.
    #[arg(long)]
    pub allow_non_finite: bool,
    /// Testing aid: `RANK:STEP:panic`, `RANK:STEP:vanish`, `RANK:STEP:slow` or `RANK:0:mismatch`.
    #[arg(long, hide = true)]
    pub inject_fault: Option<String>,
}

fn model_source(args: &TrainArgs) -> Result<ModelSource> {
    if let (Some(f), Some(b)) = (&args.forward, &args.backward) {
        let p = program_from_traces(f, b, args.prologue.as_deref())?;
        return Ok(ModelSource::Program(Box::new(p)));
    }
    if args.model == "seed" {
        return Ok(ModelSource::Seed);
    }
    if let Some(spec) = args.model.strip_prefix("deep-mlp:") {
        let n: Vec<usize> = spec
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .with_context(|| {
                format!(
                    "--model {}: expected deep-mlp:LAYERS,WIDTH,BATCH",
                    args.model
                )
            })?;
        if n.len() != 3 || n.contains(&0) {
            bail!(
                "--model {}: expected deep-mlp:LAYERS,WIDTH,BATCH with positive numbers",
                args.model
            );
        }
        return Ok(ModelSource::DeepMlp {
            layers: n[0],
            width: n[1],
            batch: n[2],
        });
    }
    let path = std::path::Path::new(&args.model);
    if path.is_dir() {
        if !path.join("export.json").is_file() {
            bail!(
                "--model {}: a directory must be an export directory (forward.trace, backward.trace, prologue.trace, export.json, params.safetensors, data.safetensors); it has no export.json",
                args.model
            );
        }
        return Ok(ModelSource::Export(path.to_path_buf()));
    }
    if path.exists() || path.extension().is_some() {
        let p = load_program(path).with_context(|| format!("--model {}", args.model))?;
        return Ok(ModelSource::Program(Box::new(p)));
    }
    bail!(
        "--model {}: unknown model (valid: seed, deep-mlp:LAYERS,WIDTH,BATCH, an export directory, or a program file .tpb/.json)",
        args.model
    )
}

/// Builds the trainer's configuration from the command line, rejecting bad values.
pub fn config(args: &TrainArgs) -> Result<TrainConfig> {
    match args.device.as_str() {
        "cpu" => {}
        #[cfg(feature = "cuda")]
        "cuda" => {}
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!("--device cuda: this tracepass was built without the `cuda` feature (cargo build --release --features cuda)"),
        other => bail!("--device {other}: unknown device (valid: cpu, cuda)"),
    }
    let broadcast_from =
        match args.broadcast_from.as_str() {
            "none" => None,
            r => Some(r.parse::<usize>().with_context(|| {
                format!("--broadcast-from {r}: expected a rank number or `none`")
            })?),
        };
    let optimizer = match args.optimizer.as_str() {
        "adamw" => match (OptimizerKind::adamw(), args.lr) {
            (
                OptimizerKind::AdamW {
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                    ..
                },
                Some(lr),
            ) => OptimizerKind::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            },
            (k, _) => k,
        },
        "sgd" => OptimizerKind::Sgd {
            lr: args.lr.unwrap_or(1e-2),
        },
        other => bail!("--optimizer {other}: unknown optimizer (valid: adamw, sgd)"),
    };
    if let Some(lr) = args.lr {
        if !(lr.is_finite() && lr > 0.0) {
            bail!("--lr {lr}: the learning rate must be a positive number");
        }
    }
    let collective_timeout = crate::numbers::check_seconds(args.collective_timeout)
        .and_then(|s| Duration::try_from_secs_f64(s).map_err(|e| e.to_string()))
        .map_err(|e| anyhow::anyhow!("--collective-timeout {e}"))?;
    if !args.bucket_mb.is_finite() {
        bail!("--bucket-mb {}: must be a finite number", args.bucket_mb);
    }
    let link: Option<LinkModel> = match &args.link {
        Some(l) => Some(
            tracepass_runtime::sim::parse_link(l)
                .map_err(anyhow::Error::msg)
                .context("--link")?,
        ),
        None => None,
    };
    if args.steps == 0 {
        bail!("--steps 0: nothing to train (give at least 1)");
    }
    if args.save_every == Some(0) {
        bail!("--save-every 0: must be at least 1 (a checkpoint every N steps)");
    }
    let fault = match &args.inject_fault {
        Some(f) => Some(Fault::parse(f).map_err(anyhow::Error::msg)?),
        None => None,
    };
    if let Some(f) = &fault {
        let (rank, step) = match *f {
            Fault::Panic { rank, step }
            | Fault::Vanish { rank, step }
            | Fault::Slow { rank, step } => (rank, Some(step)),
            Fault::Mismatch { rank } => (rank, None),
        };
        if rank >= args.world_size {
            bail!(
                "--inject-fault {}: rank {rank} is not a rank of --world-size {} (it would never fire)",
                args.inject_fault.as_deref().unwrap_or_default(),
                args.world_size
            );
        }
        if step.is_some_and(|s| s >= args.steps) {
            bail!(
                "--inject-fault {}: step {} is past the last step of --steps {} (it would never fire)",
                args.inject_fault.as_deref().unwrap_or_default(),
                step.unwrap_or_default(),
                args.steps
            );
        }
    }
    let save_format = SaveFormat::parse(&args.checkpoint_format)
        .map_err(|e| anyhow::anyhow!("--checkpoint-format: {e}"))?;
    let passes = args
        .passes
        .as_deref()
        .map(tracepass_passes::parse_pipeline)
        .transpose()
        .context("--passes")?;
    // checked here too, for --device cuda, whose ranks start in processes of their own
    if save_format == SaveFormat::Sharded
        && !tracepass_runtime::train::shards_parameters(passes.as_deref())
    {
        bail!("--checkpoint-format sharded: only a sharded run (--passes with fsdp) saves shards; every rank of this run holds the whole model, so save it whole");
    }
    Ok(TrainConfig {
        model: model_source(args)?,
        world_size: args.world_size,
        steps: args.steps,
        bucket_mb: args.bucket_mb,
        params: args.params.clone(),
        data: args.data.clone(),
        save_grads: args.save_grads.clone(),
        broadcast_from,
        no_sync_steps: args.no_sync_steps,
        seed: args.seed,
        optimizer,
        link,
        collective_timeout,
        timeline: args.timeline.is_some(),
        passes,
        keep_all_ranks: false,
        fault,
        save: args.save.clone(),
        save_every: args.save_every,
        save_format,
        resume: args.resume.clone(),
        pin_ranks: !args.no_pin_ranks,
        allow_non_finite: args.allow_non_finite,
        loss: args
            .loss
            .as_deref()
            .map(LossKind::from_export)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--loss: {e}"))?,
        targets: args.targets.clone(),
        threads_per_rank: args.threads_per_rank,
    })
}

const MIB: f64 = (1u64 << 20) as f64;

fn print_metrics(report: &TrainReport) -> String {
    let mut s = String::from(
        "step  rank  step_ms  compute_ms  comm_ms  overlap_ms  overlap%  exposed_ms  sync_wait_ms  other_ms  buckets  state_mib  gather_exposed_ms  scatter_exposed_ms  allocs  pool_MiB  arena_MiB\n",
    );
    for per_rank in &report.metrics {
        for m in per_rank {
            s += &format!(
                "{:>4}  {:>4}  {:>7.3}  {:>10.3}  {:>7.3}  {:>10.3}  {:>8.1}  {:>10.3}  {:>12.3}  {:>8.3}  {:>7}  {:>9.3}  {:>17.3}  {:>18.3}  {:>6}  {:>8.2}  {:>9.2}\n",
                m.step,
                m.rank,
                m.step_s * 1e3,
                m.compute_s * 1e3,
                m.comm_s * 1e3,
                m.overlap_s * 1e3,
                m.overlap_pct,
                m.exposed_comm_s * 1e3,
                m.sync_wait_s * 1e3,
                m.other_s * 1e3,
                m.buckets.iter().filter(|b| &*b.label != "loss").count(),
                m.state_bytes as f64 / (1u64 << 20) as f64,
                m.exposed_gather_s * 1e3,
                m.exposed_scatter_s * 1e3,
                m.buffer_allocs,
                m.pool_bytes as f64 / MIB,
                m.arena_bytes as f64 / MIB
            );
        }
    }
    s
}

/// Refuses CPU training in a process that a launcher started as one rank of several: CPU ranks
/// are threads of one process, so each such process would train alone.
fn check_not_launched_on_cpu(args: &TrainArgs) -> Result<()> {
    if args.device != "cpu" {
        return Ok(());
    }
    if let Some(ws) = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|w| w.trim().parse::<usize>().ok())
    {
        if ws > 1 {
            bail!(
                "--device cpu in a process launched as one of {ws} ranks (WORLD_SIZE={ws}): CPU ranks are threads of one process, so each process would train alone; run `tracepass train --world-size {ws}` once, without launch or torchrun (or use --device cuda)"
            );
        }
    }
    Ok(())
}

pub fn run(args: TrainArgs) -> Result<()> {
    check_not_launched_on_cpu(&args)?;
    // every output is checked before the first step, so no run trains only to fail at the end
    let model = std::path::Path::new(&args.model);
    let model_is_path = args.model != "seed" && !args.model.starts_with("deep-mlp:");
    Files::new()
        .input("--model", model_is_path.then_some(model))
        .input("--forward", args.forward.as_deref())
        .input("--backward", args.backward.as_deref())
        .input("--prologue", args.prologue.as_deref())
        .input("--params", args.params.as_deref())
        .input("--data", args.data.as_deref())
        .input_replaced_by("--resume", args.resume.as_deref(), "--save")
        .output("--save", args.save.as_deref())
        .output("--save-grads", args.save_grads.as_deref())
        .output("--timeline", args.timeline.as_deref())
        .output("--metrics-json", args.metrics_json.as_deref())
        .check()?;
    let cfg = config(&args)?;
    // the bar (stderr, terminals only) counts this run's steps; every loss line goes to stdout
    let bar = (cfg.steps >= 100).then(|| {
        let pb = indicatif::ProgressBar::with_draw_target(
            Some(cfg.steps as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} steps  {per_sec}  eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let on_step = |step: usize, loss: f64| {
        let line = format!(
            "# {step}-th loss: {}",
            tracepass_ir::pyfloat::repr(loss as f32 as f64)
        );
        match &bar {
            Some(pb) => {
                if pb.position() == 0 {
                    pb.set_position(step as u64);
                }
                pb.suspend(|| println!("{line}"));
                pb.inc(1);
            }
            None => println!("{line}"),
        }
    };
    let show = args.show_backward;
    let on_ready = |backward: &tracepass_ir::Trace, _pipeline: &str| {
        if show {
            eprintln!("{}", tracepass_ir::print_trace(backward));
        }
    };
    let report = if args.device == "cuda" {
        run_cuda(&cfg, &on_step)?
    } else {
        tracepass_runtime::train::train_with(&cfg, &on_ready, &on_step)?
    };
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    if args.show_backward && args.device == "cuda" {
        eprintln!("{}", tracepass_ir::print_trace(&report.backward));
    }
    if args.metrics {
        print!("{}", print_metrics(&report));
    }
    if let Some(path) = &args.metrics_json {
        let json = serde_json::to_vec_pretty(&report.metrics)?;
        tracepass_ir::fsio::write_atomic(path, &json)?;
    }
    if let Some(path) = &args.timeline {
        let json = serde_json::to_vec(&timeline_json(&report.events))?;
        tracepass_ir::fsio::write_atomic(path, &json)?;
    }
    let secs = report.wall.as_secs_f64();
    let ran = cfg.steps.saturating_sub(report.first_step);
    let resumed = if report.first_step > 0 {
        format!(
            " (steps {}..{}, resumed from step {})",
            report.first_step,
            cfg.steps - 1,
            report.first_step
        )
    } else {
        String::new()
    };
    eprintln!(
        "trained {ran} step{}{resumed} on {} rank(s) in {:.3} s ({:.1} steps/s); backward: {}",
        if ran == 1 { "" } else { "s" },
        cfg.world_size,
        secs,
        ran as f64 / secs.max(1e-12),
        report.pipeline
    );
    Ok(())
}

/// One GPU rank per process; the torchrun environment (or its absence: one rank) says which.
#[cfg(feature = "cuda")]
fn run_cuda(cfg: &TrainConfig, on_step: &dyn Fn(usize, f64)) -> Result<TrainReport> {
    let env = tracepass_runtime::comm::DistEnv::from_env()?;
    Ok(tracepass_runtime::cuda::train(cfg, &env, on_step)?)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_: &TrainConfig, _: &dyn Fn(usize, f64)) -> Result<TrainReport> {
    bail!("--device cuda: this tracepass was built without the `cuda` feature")
}
