//! Data-parallel training on thread ranks: forward, loss, DDP backward (rewritten by the
//! `ddp` + `sort-waits` passes), optimizer, for N steps; every rank a thread with its own
//! communication worker.

use crate::comm::thread::{CommOptions, ThreadComm, ThreadGroup};
use crate::comm::{Communicator, LinkModel, ReduceOp};
use crate::cpu::CpuBackend;
use crate::exec::backend::Backend;
use crate::exec::executor::{ExecError, Executor, RValue};
use crate::exec::metrics::{Clock, Event, Recording, StepMetrics};
use crate::exec::plan::{Plan, PlanError};
use crate::tensor::file::{save_tensors_with, TensorFile};
use crate::tensor::Tensor;
use crate::train::checkpoint::NO_GRADIENT;
use crate::train::data::{file_params, seeded_params, Batch, DataSource};
use crate::train::keep_awake::KeepAwake;
use crate::train::loss::loss_and_grad;
use crate::train::model::{Model, ModelSource};
use crate::train::optim::OptimizerKind;
use crate::train::rank_loop::{run_rank, RankOut, RankSetup};
use crate::train::shard::ShardLayout;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracepass_ir::{ops, Arg, OpRegistry, Program, Trace, ValueId};
use tracepass_passes::{
    print_pipeline, synchronizes, Ddp, DdpOptions, Fsdp, PassError, PassManager, PassRegistry,
    PassSpec, RunError,
};

/// A fault to inject (tests and `--inject-fault`): what a real failure would do to one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The rank panics in the middle of `step` (after its forward).
    Panic { rank: usize, step: usize },
    /// The rank leaves before `step`'s first collective and never comes back.
    Vanish { rank: usize, step: usize },
    /// The rank runs a backward bucketed differently from the others' (a mismatched trace).
    Mismatch { rank: usize },
    /// The rank is late: it sleeps [`Fault::SLOW_MS`] before `step`'s first backward, so the
    /// others wait for it at their first all-reduce (what `sync_wait` measures).
    Slow { rank: usize, step: usize },
}

impl Fault {
    /// How long a [`Fault::Slow`] rank sleeps, in milliseconds.
    pub const SLOW_MS: u64 = 200;

    /// `RANK:STEP:panic`, `RANK:STEP:vanish`, `RANK:STEP:slow` or `RANK:0:mismatch`.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad = || {
            format!("fault '{s}': expected RANK:STEP:panic, RANK:STEP:vanish, RANK:STEP:slow or RANK:0:mismatch")
        };
        if parts.len() != 3 {
            return Err(bad());
        }
        let rank = parts[0].parse().map_err(|_| bad())?;
        let step = parts[1].parse().map_err(|_| bad())?;
        match parts[2] {
            "panic" => Ok(Fault::Panic { rank, step }),
            "vanish" => Ok(Fault::Vanish { rank, step }),
            "mismatch" => Ok(Fault::Mismatch { rank }),
            "slow" => Ok(Fault::Slow { rank, step }),
            _ => Err(bad()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelSource,
    pub world_size: usize,
    pub steps: usize,
    /// Bucket cap in MiB (`<= 0`: one all-reduce per gradient).
    pub bucket_mb: f64,
    pub params: Option<PathBuf>,
    pub data: Option<PathBuf>,
    pub save_grads: Option<PathBuf>,
    /// Rank whose parameters all ranks take first (`None`: no broadcast).
    pub broadcast_from: Option<usize>,
    /// Micro-steps that accumulate locally before each synchronized one.
    pub no_sync_steps: usize,
    pub seed: u64,
    pub optimizer: OptimizerKind,
    pub link: Option<LinkModel>,
    pub collective_timeout: Duration,
    /// Record one event per instruction for a timeline.
    pub timeline: bool,
    /// Pipeline for the synchronized backward instead of `ddp(...),sort-waits` (a value:
    /// `parse_pipeline("...")`, or specs built from typed options such as
    /// [`DdpOptions::spec`]).
    pub passes: Option<Vec<PassSpec>>,
    /// Keep every rank's gradients and parameters in the report (tests); else rank 0's only.
    pub keep_all_ranks: bool,
    pub fault: Option<Fault>,
    /// Write a checkpoint here after the last step (and every `save_every` steps).
    pub save: Option<PathBuf>,
    pub save_every: Option<usize>,
    /// Start from this checkpoint (either form): its parameters, optimizer state and step.
    pub resume: Option<PathBuf>,
    /// The form `save` writes: a sharded run saves sharded checkpoints unless told `Whole`.
    pub save_format: crate::train::sharded_checkpoint::SaveFormat,
    /// Pin rank `r` to the `r mod n`-th CPU the process may use (see `affinity`).
    pub pin_ranks: bool,
    /// The loss instead of the model's own (an export's `export.json`; the seed's soft-target
    /// cross entropy for programs and traces).
    pub loss: Option<crate::train::model::LossKind>,
    /// The targets' name in the data file instead of the model's (`targets` for an export).
    pub targets: Option<String>,
    /// Train on through a non-finite loss, gradient norm or parameter instead of stopping at
    /// the first (a non-finite checkpoint is never written either way).
    pub allow_non_finite: bool,
    /// Threads each rank computes with: its matrix products share them through a rayon pool
    /// of its own. 0: the CPUs left over by the ranks (CPUs / ranks, at least one).
    pub threads_per_rank: usize,
}

impl TrainConfig {
    /// The threads each rank computes with: `threads_per_rank`, or when 0 the CPUs this
    /// process may use shared out among the ranks.
    pub fn rank_threads(&self) -> usize {
        if self.threads_per_rank > 0 {
            return self.threads_per_rank;
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus / self.world_size.max(1)).max(1)
    }
    /// Whether a checkpoint is written after `done` steps: after the last one, and every
    /// `save_every` steps.
    pub(crate) fn checkpoint_due(&self, done: usize) -> bool {
        done == self.steps
            || self
                .save_every
                .is_some_and(|k| k > 0 && done.is_multiple_of(k))
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelSource::Seed,
            world_size: 4,
            steps: 10,
            bucket_mb: 25.0,
            params: None,
            data: None,
            save_grads: None,
            broadcast_from: Some(0),
            no_sync_steps: 0,
            seed: 0,
            optimizer: OptimizerKind::adamw(),
            link: None,
            collective_timeout: Duration::from_secs(60),
            timeline: false,
            passes: None,
            keep_all_ranks: false,
            fault: None,
            save: None,
            save_every: None,
            resume: None,
            save_format: Default::default(),
            pin_ranks: true,
            allow_non_finite: false,
            loss: None,
            targets: None,
            threads_per_rank: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("invalid option: {0}")]
    Config(String),
    #[error(transparent)]
    Model(#[from] crate::train::model::ModelError),
    /// A pipeline that names an unknown pass or bad options.
    #[error("pipeline `{pipeline}`: {source}")]
    Pipeline {
        pipeline: String,
        #[source]
        source: Box<PassError>,
    },
    /// A pass failed on the model (the reproducer it wrote, if any, is in `source`).
    #[error("rewriting the backward with `{pipeline}`: {source}")]
    Rewrite {
        pipeline: String,
        #[source]
        source: Box<RunError>,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("{0}")]
    Input(String),
    #[error("rank {rank} failed: {message}")]
    Rank { rank: usize, message: String },
    #[error("{0}")]
    Output(String),
}

/// What a run produced.
#[derive(Debug)]
pub struct TrainReport {
    /// Per step: the loss averaged over ranks (and micro-steps).
    pub losses: Vec<f64>,
    /// `[rank][step]`.
    pub metrics: Vec<Vec<StepMetrics>>,
    pub param_names: Vec<String>,
    /// `[rank][param]`: the synchronized gradients of the first step (rank 0 only unless kept).
    pub grads_step0: Vec<Vec<Option<Tensor>>>,
    /// `[rank][param]` after the last step (rank 0 only unless kept).
    pub params: Vec<Vec<Tensor>>,
    /// Timeline events per rank (when asked for).
    pub events: Vec<(usize, Vec<Event>)>,
    /// The backward the ranks ran for synchronized steps.
    pub backward: Trace,
    pub pipeline: String,
    pub wall: Duration,
    /// The step this run started at (non-zero when resumed from a checkpoint).
    pub first_step: usize,
}

/// The divisor an exported DDP backward applies before its all-reduces: the constant of the
/// divisions whose results the all-reduces read, directly or packed into a bucket (other
/// divisions, such as an attention scale, say nothing about the world size). `None` when no
/// all-reduce reads a constant division; an error when two divisors differ.
fn exported_world_size(t: &Trace) -> Result<Option<f64>, String> {
    let reg = OpRegistry::builtin();
    let canonical = |op: &str| reg.resolve(op).unwrap_or(op).to_string();
    let mut found: Option<(f64, String)> = None;
    let mut reduced: Vec<ValueId> = Vec::new();
    for (_, n) in t.nodes() {
        if canonical(n.op.as_str()) != ops::ALL_REDUCE {
            continue;
        }
        let Some(v) = n.args().first().and_then(Arg::as_value) else {
            continue;
        };
        // a bucket: the gradients it packs
        let pack = match t.value(v).map(|x| x.def) {
            Some(tracepass_ir::Def::Node(d, _)) => t
                .node(d)
                .filter(|p| canonical(p.op.as_str()) == ops::BUCKET_PACK),
            _ => None,
        };
        match pack.and_then(|p| p.args().first().cloned()) {
            Some(Arg::List(items) | Arg::Tuple(items)) => {
                reduced.extend(items.iter().filter_map(Arg::as_value))
            }
            _ => reduced.push(v),
        }
    }
    for v in reduced {
        let producer = |v: ValueId| match t.value(v).map(|x| x.def) {
            Some(tracepass_ir::Def::Node(d, _)) => t.node(d),
            _ => None,
        };
        let Some(mut div) = producer(v) else { continue };
        // a bucket view is its first operand (Thunder's bucketing)
        if canonical(div.op.as_str()) == ops::UPDATE_BUCKET_VIEW {
            match div
                .args()
                .first()
                .and_then(Arg::as_value)
                .and_then(producer)
            {
                Some(n) => div = n,
                None => continue,
            }
        }
        let op = canonical(div.op.as_str());
        if op != ops::DIV && op != ops::TRUE_DIVIDE {
            continue;
        }
        let Some(k) = div.args().get(1).and_then(Arg::as_f64) else {
            continue;
        };
        match &found {
            None => found = Some((k, t.name(v))),
            Some((k0, v0)) if (k0 - k).abs() > 1e-9 => {
                return Err(format!(
                    "the backward's all-reduces disagree on the world size: `{v0}` is divided by {k0}, `{}` by {k}",
                    t.name(v)
                ))
            }
            Some(_) => {}
        }
    }
    Ok(found.map(|(k, _)| k))
}

fn rewrite(program: &Program, specs: &[PassSpec]) -> Result<Program, TrainError> {
    let pipeline = || print_pipeline(specs);
    let pm = PassManager::from_specs(PassRegistry::builtin(), specs).map_err(|source| {
        TrainError::Pipeline {
            pipeline: pipeline(),
            source: Box::new(source),
        }
    })?;
    let mut p = program.clone();
    pm.run(&mut p, OpRegistry::builtin())
        .map_err(|source| TrainError::Rewrite {
            pipeline: pipeline(),
            source: Box::new(source),
        })?;
    Ok(p)
}

/// The forward the trainer runs: as exported, or with its elementwise chains fused when the
/// pipeline fuses them (`fuse-elementwise`, unanchored or `forward(...)`; the pipeline itself
/// rewrites the backward). Every value the trainer reads after the forward (`results`: the
/// output, the buffers' new values, the saved tensors) stays a value of its own.
fn forward_to_run<'p>(
    p: &'p Program,
    cfg: &TrainConfig,
    results: &[Option<ValueId>],
) -> Result<std::borrow::Cow<'p, Trace>, TrainError> {
    let fuses = |s: &PassSpec| {
        s.name == "fuse-elementwise" && s.anchor != Some(tracepass_passes::Anchor::Backward)
    };
    let Some(specs) = cfg.passes.as_deref().filter(|s| s.iter().any(fuses)) else {
        return Ok(std::borrow::Cow::Borrowed(&p.forward));
    };
    let mut forward = p.forward.clone();
    let kept: Vec<ValueId> = results.iter().flatten().copied().collect();
    tracepass_passes::fuse_elementwise_keeping(&mut forward, &kept).map_err(|e| {
        TrainError::Pipeline {
            pipeline: print_pipeline(specs),
            source: Box::new(PassError::rewrite("fuse-elementwise (forward)", e)),
        }
    })?;
    Ok(std::borrow::Cow::Owned(forward))
}

/// The three backward variants a run may need, compiled.
pub(crate) struct Plans {
    pub(crate) forward: Plan,
    /// How many buffer values follow the forward's output among its results.
    pub(crate) buffers: usize,
    /// Values the forward returns as `saved_for_backward`, as a tree.
    pub(crate) saved: Arg,
    /// Local gradients (no communication): accumulation micro-steps.
    pub(crate) local: Option<Plan>,
    /// The synchronized backward.
    pub(crate) sync: Plan,
    /// For accumulation: which gradient (return position) each extra `acc_*` argument adds to.
    pub(crate) acc_targets: Vec<usize>,
    pub(crate) backward: Trace,
    pub(crate) pipeline: String,
    /// Where each parameter lives in a sharded (`fsdp`) run; `None`: every rank holds all.
    pub(crate) shards: Option<ShardLayout>,
}

/// What a forward run hands on: its output tensor, the buffers' new values (in
/// `Model::buffer_updates` order) and the saved-for-backward values.
pub(crate) struct ForwardOut<T> {
    pub(crate) output: T,
    pub(crate) buffers: Vec<T>,
    pub(crate) saved: RValue<T>,
}

impl Plans {
    /// Runs the forward: its output tensor (`None` when it returns none), the buffers it
    /// updated (into `buffers`, an empty list a caller may keep from step to step), and the
    /// values it saves for the backward, shaped as the backward's first argument.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_forward<B, C>(
        &self,
        exec: &mut Executor<B, C>,
        backend: &B,
        comm: &mut C,
        inputs: Vec<RValue<B::Tensor>>,
        clock: &Clock,
        rec: &mut Recording,
        mut buffers: Vec<B::Tensor>,
    ) -> Result<Option<ForwardOut<B::Tensor>>, ExecError>
    where
        B: Backend,
        C: Communicator<Tensor = B::Tensor>,
    {
        let mut results = exec.run(&self.forward, backend, comm, inputs, clock, rec)?;
        let mut res = results.drain(..);
        let Some(output) = res.next().and_then(RValue::tensor) else {
            return Ok(None);
        };
        buffers.clear();
        for _ in 0..self.buffers {
            match res.next().and_then(RValue::tensor) {
                Some(t) => buffers.push(t),
                None => return Ok(None),
            }
        }
        // the saved values' lists are the executor's, and go back to it when the backward
        // is done with them
        let saved = tree(&self.saved, &mut res, &mut |n| exec.list(n));
        drop(res);
        exec.keep_list(results);
        Ok(Some(ForwardOut {
            output,
            buffers,
            saved,
        }))
    }
}

/// Refuses a pipeline that contradicts the run: a `ddp` pass for another world size (it would
/// divide the gradients by the wrong number) or for a process group this runtime does not have,
/// an `fsdp` pass for another world size (it would cut the parameters into the wrong shards).
pub fn check_pipeline(specs: &[PassSpec], world_size: usize) -> Result<(), TrainError> {
    let pipeline = print_pipeline(specs);
    for spec in specs.iter().filter(|s| s.name == "fsdp") {
        let fsdp = Fsdp::from_spec(spec).map_err(|source| TrainError::Pipeline {
            pipeline: pipeline.clone(),
            source: Box::new(source),
        })?;
        let n = fsdp.options().world_size;
        if n != world_size {
            return Err(TrainError::Config(format!(
                "--passes `{pipeline}`: `{spec}` is for world size {n}, but this run has --world-size {world_size} (it would shard the parameters {n} ways); use fsdp(world_size={world_size},...)"
            )));
        }
    }
    for spec in specs.iter().filter(|s| s.name == "ddp") {
        let ddp = Ddp::from_spec(spec).map_err(|source| TrainError::Pipeline {
            pipeline: pipeline.clone(),
            source: Box::new(source),
        })?;
        let o = ddp.options();
        if o.world_size != world_size {
            let n = o.world_size;
            return Err(TrainError::Config(format!(
                "--passes `{pipeline}`: `{spec}` is for world size {n}, but this run has --world-size {world_size} (it would divide the gradients by {n}); use ddp(world_size={world_size},...)"
            )));
        }
        if o.group != "world" {
            return Err(TrainError::Config(format!(
                "--passes `{pipeline}`: `{spec}` names process group `{}`, but this run has only the group `world` (of --world-size {world_size})",
                o.group
            )));
        }
    }
    Ok(())
}

/// Why the trainer refuses a program fsdp rewrote already: it shards the plain model itself,
/// and needs the plain parameters to cut them into shards (and to save whole ones).
const PRESHARDED: &str = "the trainer shards the plain model itself: give the model fsdp has \
     not rewritten, with --passes 'fsdp(world_size=N,...)'";

/// Whether a pipeline shards the parameters (it holds `fsdp`).
pub fn shards_parameters(specs: Option<&[PassSpec]>) -> bool {
    specs.is_some_and(|s| s.iter().any(|s| s.name == "fsdp"))
}

/// Refuses what the trainer cannot run: a program fsdp sharded already (the pipeline's own
/// `fsdp` is what shards a run).
pub fn check_trainable(specs: Option<&[PassSpec]>, p: &Program) -> Result<(), TrainError> {
    let _ = specs;
    if p.params.iter().any(|x| x.shard.is_some())
        || tracepass_passes::fsdp::shards(&p.forward)
        || tracepass_passes::fsdp::shards(&p.backward)
    {
        return Err(TrainError::Config(format!(
            "the program is sharded (fsdp ran on it): {PRESHARDED}"
        )));
    }
    Ok(())
}

pub(crate) fn build_plans(model: &Model, cfg: &TrainConfig) -> Result<Plans, TrainError> {
    let p = &model.program;
    if let Some(pl) = &cfg.passes {
        check_pipeline(pl, cfg.world_size)?;
    }
    check_trainable(cfg.passes.as_deref(), p)?;
    if shards_parameters(cfg.passes.as_deref()) {
        return build_sharded_plans(model, cfg);
    }
    // `remat` changes what the forward saves, so the forward that runs is its output too; it
    // runs first (it reads only the saved values, which no other pass here changes), and
    // again in the pipeline, where it then finds nothing more to do
    let rematted;
    let p = match cfg.passes.as_deref() {
        Some(specs) if specs.iter().any(|s| s.name == "remat") => {
            rematted = rewrite(p, &[PassSpec::new("remat")])?;
            &rematted
        }
        _ => p,
    };
    let ret = match &p.forward.ret {
        Arg::Tuple(items) if items.len() == 2 => items[1].clone(),
        _ => {
            return Err(TrainError::Input(
                "the forward must return (outputs, saved_for_backward)".into(),
            ))
        }
    };
    // the model output, the buffers' values after the forward, then the saved tensors
    let mut fwd_results = vec![Some(model.output)];
    fwd_results.extend(model.buffer_updates.iter().map(|u| Some(u.value)));
    ret.for_each_value(&mut |v| fwd_results.push(Some(v)));
    let forward = Plan::compile(&*forward_to_run(p, cfg, &fwd_results)?, &fwd_results)?;
    let already = synchronizes(&p.backward);
    let ws = cfg.world_size;
    let ddp: Vec<PassSpec> = vec![
        DdpOptions {
            world_size: ws,
            bucket_mb: cfg.bucket_mb,
            ..DdpOptions::default()
        }
        .spec(),
        PassSpec::new("sort-waits"),
    ];
    let ddp_text = print_pipeline(&ddp);
    let (local_prog, sync_pipeline) = if already {
        // Thunder's own DDP backward: run it as exported; strip it for local micro-steps.
        // The world size is what the backward divides by; export.json must agree with it.
        let traced = exported_world_size(&p.backward).map_err(TrainError::Input)?;
        if let (Some(w), Some(d)) = (model.exported_world_size, traced) {
            if (d - w as f64).abs() > 1e-9 {
                return Err(TrainError::Input(format!(
                    "export.json says world_size {w}, but the backward divides the gradients by {d} before its all-reduces (Thunder's DDP for {d} ranks); fix export.json (`\"world_size\": {d}`)"
                )));
            }
        }
        if cfg.passes.is_none() {
            if let Some(d) = traced {
                if (d - ws as f64).abs() > 1e-9 {
                    return Err(TrainError::Config(format!(
                        "the backward was exported with DDP for world size {d} (it divides gradients by {d}), but this run has --world-size {ws}; train with --world-size {d}, or re-bucket it with --passes 'no-sync,{ddp_text}'"
                    )));
                }
            } else if let Some(w) = model.exported_world_size {
                if w != ws {
                    return Err(TrainError::Config(format!(
                        "the export's backward holds Thunder's DDP for world size {w} (export.json), but this run has --world-size {ws}; train with --world-size {w}, or re-bucket it with --passes 'no-sync,{ddp_text}'"
                    )));
                }
            }
        }
        (
            rewrite(p, &[PassSpec::new("no-sync")])?,
            cfg.passes.clone().unwrap_or_default(),
        )
    } else {
        (p.clone(), cfg.passes.clone().unwrap_or_else(|| ddp.clone()))
    };
    let acc_pipeline = |base: &[PassSpec]| {
        let mut specs = vec![PassSpec::new("accumulate-grads")];
        specs.extend_from_slice(base);
        specs
    };
    let accumulates = |specs: &[PassSpec]| specs.iter().any(|s| s.name == "accumulate-grads");
    if cfg.no_sync_steps == 0 && accumulates(&sync_pipeline) {
        return Err(TrainError::Config(format!(
            "--passes `{}` accumulates gradients (accumulate-grads adds the earlier micro-steps' gradients), but --no-sync-steps is 0, so there are none; give --no-sync-steps K (K >= 1), or leave accumulate-grads out",
            print_pipeline(&sync_pipeline)
        )));
    }
    let (sync_prog, pipeline) = if cfg.no_sync_steps > 0 {
        let base = if already && cfg.passes.is_none() {
            ddp.clone()
        } else {
            sync_pipeline.clone()
        };
        // a pipeline that accumulates already (as the docs' own example does) runs as given
        let pl = if accumulates(&base) {
            base
        } else {
            acc_pipeline(&base)
        };
        (rewrite(&local_prog, &pl)?, print_pipeline(&pl))
    } else if sync_pipeline.is_empty() {
        (p.clone(), "(as exported)".to_string())
    } else {
        let src = if already { p } else { &local_prog };
        (
            rewrite(src, &sync_pipeline)?,
            print_pipeline(&sync_pipeline),
        )
    };
    if cfg.world_size > 1 && !synchronizes(&sync_prog.backward) {
        let what = if pipeline == "(as exported)" {
            "the backward as given (an empty --passes pipeline)".to_string()
        } else {
            format!("the backward after `{pipeline}`")
        };
        return Err(TrainError::Config(format!(
            "{what} has no all-reduce, so {} ranks would each train their own model on their own data; add the ddp pass (--passes 'ddp(world_size={ws},bucket_mb={}),sort-waits', the default) or train with --world-size 1",
            cfg.world_size, cfg.bucket_mb
        )));
    }
    let grads_of = |prog: &Program| -> Vec<Option<ValueId>> { prog.gradient_values() };
    let sync = Plan::compile(&sync_prog.backward, &grads_of(&sync_prog))?;
    let local = if cfg.no_sync_steps > 0 {
        Some(Plan::compile(&local_prog.backward, &grads_of(&local_prog))?)
    } else {
        None
    };
    // acc_<grad name> arguments -> the gradient position they add to
    let mut acc_targets = Vec::new();
    if cfg.no_sync_steps > 0 {
        let local_grads = local_prog.gradient_values();
        for a in sync_prog.backward.args().iter().skip(2) {
            let name = sync_prog.backward.name(*a);
            let base = name
                .trim_start_matches('_')
                .strip_prefix("acc_")
                .unwrap_or(&name)
                .to_string();
            let pos = local_grads
                .iter()
                .position(|g| g.is_some_and(|g| local_prog.backward.name(g) == base))
                .ok_or_else(|| {
                    TrainError::Input(format!(
                        "accumulation argument `{name}` matches no gradient"
                    ))
                })?;
            acc_targets.push(pos);
        }
    }
    Ok(Plans {
        forward,
        buffers: model.buffer_updates.len(),
        saved: ret,
        local,
        sync,
        acc_targets,
        backward: sync_prog.backward.clone(),
        pipeline,
        shards: None,
    })
}

/// The plans of a sharded run: the forward and backward `fsdp` rewrote (the forward gathers
/// the shards it takes, the backward reduce-scatters the gradients), and where every
/// parameter lives. Micro-steps without synchronization run the same backward: each
/// reduce-scatters, and the rank adds up its gradient shards (a shard's worth of memory, not
/// a whole gradient's, which is what sharding is for).
fn build_sharded_plans(model: &Model, cfg: &TrainConfig) -> Result<Plans, TrainError> {
    let p = &model.program;
    let specs = cfg.passes.clone().unwrap_or_default();
    let pipeline = print_pipeline(&specs);
    if let Some(s) = specs
        .iter()
        .find(|s| s.name == "ddp" || s.name == "accumulate-grads")
    {
        return Err(TrainError::Config(format!(
            "--passes `{pipeline}`: `{}` does not go with fsdp (fsdp reduce-scatters the gradients instead of all-reducing them, and a sharded run adds up its gradient shards over --no-sync-steps itself); leave it out",
            s.name
        )));
    }
    // Thunder's own DDP backward: fsdp takes the plain one
    let plain = if synchronizes(&p.backward) {
        rewrite(p, &[PassSpec::new("no-sync")])?
    } else {
        p.clone()
    };
    let sharded = rewrite(&plain, &specs)?;
    let layout = ShardLayout::of(model, &sharded)
        .map_err(|m| TrainError::Input(format!("after `{pipeline}`: {m}")))?
        .ok_or_else(|| TrainError::Config(format!("--passes `{pipeline}` sharded no parameter")))?;
    let ret = match &sharded.forward.ret {
        Arg::Tuple(items) if items.len() == 2 => items[1].clone(),
        _ => {
            return Err(TrainError::Input(
                "the forward must return (outputs, saved_for_backward)".into(),
            ))
        }
    };
    // the rewrite renumbers the forward's values: the output and the buffers' new values
    // are found again by name
    let renamed = |v: ValueId| -> Result<Option<ValueId>, TrainError> {
        let name = p.forward.name(v);
        sharded.forward.find_value(&name).map(Some).ok_or_else(|| {
            TrainError::Input(format!(
                "after `{pipeline}`: the forward lost its value `{name}`"
            ))
        })
    };
    let mut fwd_results = vec![renamed(model.output)?];
    for u in &model.buffer_updates {
        fwd_results.push(renamed(u.value)?);
    }
    ret.for_each_value(&mut |v| fwd_results.push(Some(v)));
    let forward = Plan::compile(&sharded.forward, &fwd_results)?;
    let sync = Plan::compile(&sharded.backward, &sharded.gradient_values())?;
    Ok(Plans {
        forward,
        buffers: model.buffer_updates.len(),
        saved: ret,
        local: None,
        sync,
        acc_targets: Vec::new(),
        backward: sharded.backward.clone(),
        pipeline,
        shards: Some(layout),
    })
}

/// Rebuilds a value tree shaped like `arg` from the flat results, in `for_each_value` order.
/// Each list comes from `list(n)` (an empty one to fill with `n` values).
fn tree<T>(
    arg: &Arg,
    flat: &mut impl Iterator<Item = RValue<T>>,
    list: &mut impl FnMut(usize) -> Vec<RValue<T>>,
) -> RValue<T> {
    let mut seq = |items: &mut dyn ExactSizeIterator<Item = &Arg>| {
        let mut out = list(items.len());
        for a in items {
            let v = tree(a, flat, list);
            out.push(v);
        }
        RValue::Seq(out)
    };
    match arg {
        Arg::Value(_) => flat.next().unwrap_or(RValue::None),
        Arg::Tuple(items) | Arg::List(items) => seq(&mut items.iter()),
        Arg::Dict(items) => seq(&mut items.iter().map(|(_, v)| v)),
        _ => RValue::None,
    }
}

struct Shared<'a> {
    cfg: &'a TrainConfig,
    model: &'a Model,
    plans: &'a Plans,
    /// A rank that runs other plans (the `Mismatch` fault).
    other: Option<(usize, &'a Plans)>,
    data: &'a DataSource,
    init: &'a [Tensor],
    resume: Option<&'a crate::train::checkpoint::Checkpoint>,
    clock: Clock,
}

/// `a + b` on the CPU backend.
pub(crate) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    crate::train::rank_loop::device_add(&CpuBackend, a, b)
}

fn rank_main(
    rank: usize,
    mut comm: ThreadComm,
    sh: &Shared,
    on_step: &(dyn Fn(usize, f64) + Sync),
) -> Result<RankOut, TrainError> {
    let plans = match sh.other {
        Some((r, p)) if r == rank => p,
        _ => sh.plans,
    };
    let setup = RankSetup {
        cfg: sh.cfg,
        rank,
        model: sh.model,
        plans,
        data: sh.data,
        init: sh.init,
        resume: sh.resume,
        clock: sh.clock,
        backend: &CpuBackend,
        loss_dtype: tracepass_ir::DType::F64,
        keep: rank == 0 || sh.cfg.keep_all_ranks,
    };
    run_rank(setup, &mut comm, on_step)
}

/// The collectives one training step issues, in order: the loss average of every micro-step,
/// then the synchronized backward's all-reduces.
pub(crate) fn collective_lines(
    plans: &Plans,
    no_sync_steps: usize,
    loss_dtype: tracepass_ir::DType,
) -> Vec<String> {
    let loss = crate::exec::plan::CollectiveInfo {
        kind: crate::exec::plan::CollectiveKind::AllReduce,
        label: "loss".into(),
        op: ReduceOp::Sum,
        dtype: loss_dtype,
        numel: 1,
        group: "world".into(),
    };
    // one line for the loss of every micro-step: a million micro-steps make no million lines
    let describe = crate::train::fingerprint::describe;
    let mut lines: Vec<String> = describe(&[loss])
        .into_iter()
        .map(|l| format!("{l}, once in each of {} micro-steps", no_sync_steps + 1))
        .collect();
    lines.extend(describe(&plans.forward.collectives));
    lines.extend(describe(&plans.sync.collectives));
    lines
}

/// The message of a caught panic's payload (a `&str` or `String`; otherwise a placeholder).
pub fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".into()
    }
}

/// Refuses a run whose modelled link (`--link`) makes an all-reduce last longer than
/// `--collective-timeout`: every step would stop at that collective's wait.
pub(crate) fn check_link_timeout(plans: &Plans, cfg: &TrainConfig) -> Result<(), TrainError> {
    let Some(link) = cfg.link else {
        return Ok(());
    };
    let worst = plans
        .sync
        .collectives
        .iter()
        .map(|c| {
            let bytes = c.numel.saturating_mul(c.dtype.size_bytes());
            (link.all_reduce_time(bytes, cfg.world_size), bytes, &c.label)
        })
        .max_by_key(|(t, _, _)| *t);
    match worst {
        Some((t, bytes, label)) if t > cfg.collective_timeout => Err(TrainError::Config(format!(
            "--link {},{}: all-reduce `{label}` ({bytes} bytes on {} ranks) takes {:.3} s on this link, longer than --collective-timeout {} s; raise --collective-timeout above {:.3} or use a faster link",
            link.latency_us,
            link.bandwidth_gbps,
            cfg.world_size,
            t.as_secs_f64(),
            cfg.collective_timeout.as_secs_f64(),
            t.as_secs_f64()
        ))),
        _ => Ok(()),
    }
}

/// What a run needs in memory at least, counted before anything is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoryNeed {
    /// Elements and bytes of the model's parameters.
    pub(crate) elements: u64,
    pub(crate) bytes: u64,
    /// One rank's parameters, gradients and optimizer moments: a shard of each sharded
    /// bucket (and the largest bucket gathered whole), the rest whole.
    pub(crate) per_rank: u64,
    /// What the process needs: the larger of the first copy of the parameters and every rank's
    /// `per_rank`.
    pub(crate) total: u64,
}

/// Counts what `world_size` ranks need for `model` (sharded as `shards` says, when it does).
/// What it counts is a floor, so it never refuses a model that could run without swapping
/// (swap does not count as available): the larger of the first copy of the parameters (made
/// in f64, 8 bytes an element, next to the converted copy) and every rank's parameters,
/// gradients and optimizer moments (two f32 an element, whatever the optimizer). Under
/// `fsdp` a rank holds a shard of each bucket of those three, and a gathered bucket while it
/// computes with it: the largest one is counted (zero3 and prefetching gather more at once,
/// zero2 keeps what the backward reads; the floor does not guess which).
pub(crate) fn memory_need(
    model: &Model,
    shards: Option<&ShardLayout>,
    world_size: usize,
) -> Result<MemoryNeed, TrainError> {
    let (mut elements, mut bytes) = (0u64, 0u64);
    let (mut local_elements, mut local_bytes) = (0u64, 0u64);
    for (i, p) in model.program.params.iter().enumerate() {
        let n = p
            .shape
            .iter()
            .try_fold(1u64, |n, d| n.checked_mul(*d as u64));
        let b = n.and_then(|n| n.checked_mul(p.dtype.size_bytes() as u64));
        let (Some(n), Some(b)) = (n, b) else {
            return Err(TrainError::Input(format!(
                "parameter `{}` has shape {:?}: too many elements to count",
                p.fqn, p.shape
            )));
        };
        elements = elements.saturating_add(n);
        bytes = bytes.saturating_add(b);
        if shards.is_none_or(|l| l.place.get(i).copied().flatten().is_none()) {
            local_elements = local_elements.saturating_add(n);
            local_bytes = local_bytes.saturating_add(b);
        }
    }
    let mut gathered = 0u64;
    if let Some(l) = shards {
        for b in &l.buckets {
            let n = b.shard_numel(l.world_size) as u64;
            local_elements = local_elements.saturating_add(n);
            local_bytes = local_bytes.saturating_add(n.saturating_mul(b.dtype.size_bytes() as u64));
        }
        gathered = l.largest_bucket_bytes() as u64;
    }
    let first_copy = elements.saturating_mul(8).saturating_add(bytes);
    let per_rank = local_bytes
        .saturating_mul(2)
        .saturating_add(local_elements.saturating_mul(8))
        .saturating_add(gathered);
    Ok(MemoryNeed {
        elements,
        bytes,
        per_rank,
        total: first_copy.max(per_rank.saturating_mul(world_size as u64)),
    })
}

/// Refuses a run whose [`MemoryNeed`] exceeds `available` bytes (`None`: unknown, passes).
pub(crate) fn check_memory_within(
    need: MemoryNeed,
    world_size: usize,
    sharded: bool,
    available: Option<u64>,
) -> Result<(), TrainError> {
    let gib = crate::train::memory::gib;
    match available {
        Some(avail) if need.total > avail => Err(TrainError::Input(format!(
            "the model does not fit in memory: its {} parameters ({}) need at least {} ({} on each of {world_size} rank(s), or the first copy in f64), and {} is available",
            need.elements,
            gib(need.bytes),
            gib(need.total),
            if sharded {
                "shards of the parameters, gradients and optimizer moments and the largest gathered bucket"
            } else {
                "parameters, gradients and optimizer moments"
            },
            gib(avail)
        ))),
        _ => Ok(()),
    }
}

/// Refuses a model whose parameters cannot fit in this machine's memory, before allocating
/// any of them ([`memory_need`]; under `fsdp`, the sharded sizes).
pub(crate) fn check_memory(
    model: &Model,
    shards: Option<&ShardLayout>,
    world_size: usize,
) -> Result<(), TrainError> {
    let need = memory_need(model, shards, world_size)?;
    check_memory_within(
        need,
        world_size,
        shards.is_some(),
        crate::train::memory::available_bytes(),
    )
}

/// The parameters a run starts from (checkpoint, file or seeded init) and the checkpoint, if
/// it resumes one.
pub(crate) fn initial_params(
    cfg: &TrainConfig,
    model: &Model,
    shards: Option<&ShardLayout>,
) -> Result<(Vec<Tensor>, Option<crate::train::checkpoint::Checkpoint>), TrainError> {
    let resume = match &cfg.resume {
        Some(path) => {
            let dtypes: Vec<tracepass_ir::DType> =
                model.program.params.iter().map(|p| p.dtype).collect();
            // a sharded run reads a sharded checkpoint's shards rank by rank, never whole
            let ck = crate::train::checkpoint::load_any(
                path,
                &model.param_names(),
                &model.param_shapes(),
                Some(&dtypes),
                cfg.optimizer,
                shards,
            )
            .map_err(|e| TrainError::Input(e.to_string()))?;
            // a sharded run cuts the whole tensors of a checkpoint into its own shards, so it
            // resumes one written at any world size
            let resharded = shards_parameters(cfg.passes.as_deref());
            if let (Some(w), false) = (ck.world_size, resharded) {
                if w != cfg.world_size {
                    return Err(TrainError::Config(format!(
                        "{} was trained on {w} rank(s), but this run has --world-size {}; resume with --world-size {w} (each rank's data depends on the world size, so another one is not the same run)",
                        path.display(),
                        cfg.world_size
                    )));
                }
            }
            if ck.step >= cfg.steps {
                return Err(TrainError::Config(format!(
                    "{} is at step {}; --steps {} leaves nothing to do (steps count from the start of training)",
                    path.display(),
                    ck.step,
                    cfg.steps
                )));
            }
            Some(ck)
        }
        None => None,
    };
    let (init, from) = match (&resume, &cfg.params) {
        (Some(ck), _) => (ck.params.clone(), cfg.resume.clone()),
        (None, params) => match params.as_ref().or(model.default_params.as_ref()) {
            Some(path) => {
                let f = TensorFile::load(path).map_err(|e| TrainError::Input(e.to_string()))?;
                let init = file_params(&model.program.params, &f).map_err(TrainError::Input)?;
                (init, Some(path.clone()))
            }
            None => {
                let mut init =
                    seeded_params(&model.program.params, cfg.seed).map_err(TrainError::Input)?;
                // a tie is one tensor: its members start from one draw
                model.share_ties(&mut init);
                (init, None)
            }
        },
    };
    if let Some(path) = from {
        check_tied_values(model, &init, &path)?;
        if !cfg.allow_non_finite {
            if let Some(what) = crate::train::finite::non_finite_param(&model.param_names(), &init)
            {
                return Err(TrainError::Input(format!(
                    "{}: {what}; training would only produce NaN (--allow-non-finite trains anyway)",
                    path.display()
                )));
            }
        }
    }
    Ok((init, resume))
}

/// Refuses a file whose tied parameters hold different values: they are one tensor, so the
/// first step would read both and the update then silently keep only the primary's.
fn check_tied_values(model: &Model, params: &[Tensor], path: &Path) -> Result<(), TrainError> {
    let names = model.param_names();
    for group in &model.ties {
        let primary = group[0];
        for &i in &group[1..] {
            if !params[i].bitwise_eq(&params[primary]) {
                let (a, b) = (params[primary].to_f64_vec(), params[i].to_f64_vec());
                let at = a
                    .iter()
                    .zip(&b)
                    .position(|(x, y)| x.to_bits() != y.to_bits())
                    .unwrap_or(0);
                return Err(TrainError::Input(format!(
                    "{}: `{}` and `{}` are tied (one tensor, export.json `tied`), but their values differ (first at element {at}: {} and {}); store one value for both",
                    path.display(),
                    names[primary],
                    names[i],
                    a.get(at).copied().unwrap_or(f64::NAN),
                    b.get(at).copied().unwrap_or(f64::NAN)
                )));
            }
        }
    }
    Ok(())
}

/// Where a run's batches come from: `--data`, else the export's `data.safetensors`, else
/// seeded random data.
pub(crate) fn data_source(cfg: &TrainConfig, model: &Model) -> Result<DataSource, TrainError> {
    let (path, wrap) = match (&cfg.data, &model.default_data) {
        (Some(p), _) => (Some(p), model.default_data.is_some()),
        (None, Some(p)) => (Some(p), true),
        (None, None) => (None, false),
    };
    Ok(match path {
        Some(path) => DataSource::File {
            file: TensorFile::load(path).map_err(|e| TrainError::Input(e.to_string()))?,
            wrap,
        },
        None => DataSource::Seeded { seed: cfg.seed },
    })
}

/// Checks, before any rank starts, every batch `rank` reads in this run (a resumed run starts
/// at the checkpoint's step): it is there and fits the model, and a cycling file has no holes.
pub(crate) fn check_batches(
    data: &DataSource,
    cfg: &TrainConfig,
    model: &Model,
    resume: Option<&crate::train::checkpoint::Checkpoint>,
    rank: usize,
) -> Result<(), TrainError> {
    let per_step = cfg.no_sync_steps + 1;
    let first_micro = resume.map_or(0, |c| c.step) * per_step;
    let end = cfg.steps.saturating_mul(per_step).max(first_micro + 1);
    data.check_run(model, rank, cfg.world_size, first_micro, end)
        .map_err(|e| TrainError::Input(format!("rank {rank}: {e}")))
}

/// Trains on `cfg.world_size` thread ranks; `on_step(step, loss)` is called by rank 0 as each
/// step ends.
pub fn train(
    cfg: &TrainConfig,
    on_step: &(dyn Fn(usize, f64) + Sync),
) -> Result<TrainReport, TrainError> {
    train_with(cfg, &|_, _| {}, on_step)
}

/// As [`train`]; `on_ready(backward, pipeline)` is called once every check has passed, before
/// the first step, with the backward the ranks will run for synchronized steps.
pub fn train_with(
    cfg: &TrainConfig,
    on_ready: &dyn Fn(&Trace, &str),
    on_step: &(dyn Fn(usize, f64) + Sync),
) -> Result<TrainReport, TrainError> {
    if cfg.world_size == 0 {
        return Err(TrainError::Config("--world-size must be at least 1".into()));
    }
    if let Some(max) = crate::train::rank_threads::max_ranks() {
        if cfg.world_size > max {
            return Err(TrainError::Config(format!(
                "--world-size {}: ranks are threads of this process ({} each), and this machine allows at most {max} ranks (threads-max, RLIMIT_NPROC, vm.max_map_count)",
                cfg.world_size,
                crate::train::rank_threads::THREADS_PER_RANK
            )));
        }
    }
    if !cfg.bucket_mb.is_finite() {
        return Err(TrainError::Config(format!(
            "--bucket-mb must be a finite number, got {}",
            cfg.bucket_mb
        )));
    }
    if cfg.save_format == crate::train::sharded_checkpoint::SaveFormat::Sharded
        && !shards_parameters(cfg.passes.as_deref())
    {
        return Err(TrainError::Config(
            "--checkpoint-format sharded: only a sharded run (--passes with fsdp) saves shards; every rank of this run holds the whole model, so save it whole".into(),
        ));
    }
    if cfg.save_every == Some(0) {
        return Err(TrainError::Config(
            "--save-every 0: must be at least 1 (a checkpoint every N steps)".into(),
        ));
    }
    if let Some(r) = cfg.broadcast_from {
        if r >= cfg.world_size {
            return Err(TrainError::Config(format!(
                "--broadcast-from {r} is not a rank of a world of {} (ranks 0..{})",
                cfg.world_size,
                cfg.world_size - 1
            )));
        }
    }
    let model = Model::load(&cfg.model)?.with_loss(cfg.loss, cfg.targets.as_deref());
    let plans = build_plans(&model, cfg)?;
    check_link_timeout(&plans, cfg)?;
    check_memory(&model, plans.shards.as_ref(), cfg.world_size)?;
    let (init, resume) = initial_params(cfg, &model, plans.shards.as_ref())?;
    let data = data_source(cfg, &model)?;
    for rank in 0..cfg.world_size {
        check_batches(&data, cfg, &model, resume.as_ref(), rank)?;
    }
    let group = ThreadGroup::new(
        cfg.world_size,
        CommOptions {
            timeout: cfg.collective_timeout,
            link: cfg.link,
        },
    );
    let other_plans = match cfg.fault {
        Some(Fault::Mismatch { rank }) => {
            let other_mb = if cfg.bucket_mb > 0.0 { 0.0 } else { 25.0 };
            Some((
                rank,
                build_plans(
                    &model,
                    &TrainConfig {
                        bucket_mb: other_mb,
                        ..cfg.clone()
                    },
                )?,
            ))
        }
        _ => None,
    };
    let shared = Shared {
        cfg,
        model: &model,
        plans: &plans,
        other: other_plans.as_ref().map(|(r, p)| (*r, p)),
        data: &data,
        init: &init,
        resume: resume.as_ref(),
        clock: Clock::new(cfg.timeline),
    };
    on_ready(&plans.backward, &plans.pipeline);
    let start = Instant::now();
    let results: Vec<Result<RankOut, TrainError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.world_size)
            .map(|rank| {
                let comm = group.comm(rank);
                let group = group.clone();
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(s, move || {
                        let threads = shared.cfg.rank_threads();
                        if shared.cfg.pin_ranks {
                            // best effort: an unpinned rank is slower to line up, not wrong
                            let _ = crate::train::affinity::pin_current_thread_to(rank, threads);
                        }
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            if threads <= 1 {
                                return rank_main(rank, comm, shared, on_step);
                            }
                            // the pool's threads inherit this rank's CPUs
                            match rayon::ThreadPoolBuilder::new()
                                .num_threads(threads)
                                .thread_name(move |i| format!("rank-{rank}-worker-{i}"))
                                .build()
                            {
                                Ok(pool) => pool.install(|| {
                                    let _awake =
                                        KeepAwake::worth_it(shared.cfg.world_size, threads)
                                            .then(KeepAwake::start);
                                    rank_main(rank, comm, shared, on_step)
                                }),
                                Err(e) => Err(TrainError::Rank {
                                    rank,
                                    message: format!("cannot start {threads} threads: {e}"),
                                }),
                            }
                        }));
                        let r = match r {
                            Ok(r) => r,
                            Err(p) => Err(TrainError::Rank {
                                rank,
                                message: format!("panicked: {}", panic_message(p)),
                            }),
                        };
                        if let Err(e) = &r {
                            group.abort(rank, &e.to_string());
                        }
                        r
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|p| {
                    Err(TrainError::Rank {
                        rank,
                        message: format!("panicked: {}", panic_message(p)),
                    })
                }),
                Err(e) => Err(TrainError::Rank {
                    rank,
                    message: format!("could not start its thread: {e}"),
                }),
            })
            .collect()
    });
    let wall = start.elapsed();
    if results.iter().any(Result::is_err) {
        // report the first failure (the cause), not the ranks it stopped
        if let Some((rank, reason)) = group.failure() {
            let others: Vec<usize> = results
                .iter()
                .enumerate()
                .filter(|(r, res)| *r != rank && res.is_err())
                .map(|(r, _)| r)
                .collect();
            let tail = if others.is_empty() {
                String::new()
            } else {
                format!(" (ranks {others:?} stopped because of it)")
            };
            let mut reason = reason.as_str();
            for prefix in [format!("rank {rank} failed: "), format!("rank {rank}: ")] {
                reason = reason.strip_prefix(&prefix).unwrap_or(reason);
            }
            let reason = reason.to_string();
            return Err(TrainError::Rank {
                rank,
                message: format!("{reason}{tail}"),
            });
        }
    }
    let outs: Vec<RankOut> = results.into_iter().collect::<Result<_, _>>()?;
    let losses = outs.first().map(|o| o.losses.clone()).unwrap_or_default();
    let names = model.param_names();
    if let Some(path) = &cfg.save_grads {
        let g: Vec<(String, Tensor)> = names
            .iter()
            .zip(outs.first().map(|o| o.grads0.clone()).unwrap_or_default())
            .filter_map(|(n, g)| g.map(|g| (n.clone(), g)))
            .collect();
        // parameters the backward gives no gradient are named in the metadata, not written as
        // zeros
        let unused = model.program.unused_params();
        let meta: std::collections::BTreeMap<String, String> = (!unused.is_empty())
            .then(|| (NO_GRADIENT.to_string(), unused.join(",")))
            .into_iter()
            .collect();
        save_tensors_with(path, &g, &meta).map_err(|e| TrainError::Output(e.to_string()))?;
    }
    let mut report = TrainReport {
        losses,
        metrics: Vec::new(),
        param_names: names,
        grads_step0: Vec::new(),
        params: Vec::new(),
        events: Vec::new(),
        backward: plans.backward.clone(),
        pipeline: plans.pipeline.clone(),
        wall,
        first_step: resume.as_ref().map_or(0, |c| c.step),
    };
    for (rank, o) in outs.into_iter().enumerate() {
        report.metrics.push(o.metrics);
        if !o.grads0.is_empty() {
            report.grads_step0.push(o.grads0);
        }
        if !o.params.is_empty() {
            report.params.push(o.params);
        }
        if cfg.timeline {
            report.events.push((rank, o.events));
        }
    }
    Ok(report)
}

/// Loss and local gradients (by parameter, in `model.program.params` order) of one batch on one
/// rank, with no communication: the reference DDP results are checked against.
pub fn local_gradients(
    model: &Model,
    params: &[Tensor],
    batch: Batch,
) -> Result<(f64, Vec<Option<Tensor>>), TrainError> {
    local_gradients_at(model, params, batch, (0, 0, 0))
}

/// As [`local_gradients`], with random nodes (dropout) drawing the stream of `(seed, rank,
/// step)`, as that rank draws it in training with `--seed seed`.
pub fn local_gradients_at(
    model: &Model,
    params: &[Tensor],
    batch: Batch,
    (seed, rank, step): (u64, usize, usize),
) -> Result<(f64, Vec<Option<Tensor>>), TrainError> {
    let cfg = TrainConfig {
        world_size: 1,
        passes: Some(Vec::new()),
        ..TrainConfig::default()
    };
    let p = &model.program;
    let local_prog = if synchronizes(&p.backward) {
        rewrite(p, &[PassSpec::new("no-sync")])?
    } else {
        p.clone()
    };
    let local = Model {
        program: local_prog,
        ..model.clone()
    };
    let plans = build_plans(&local, &cfg)?;
    let group = ThreadGroup::new(1, CommOptions::default());
    let mut comm = group.comm(0);
    let backend = CpuBackend;
    let clock = Clock::new(false);
    let mut exec: Executor<CpuBackend, ThreadComm> = Executor::new();
    let err = |e: ExecError| TrainError::Rank {
        rank: 0,
        message: e.to_string(),
    };
    let inputs = model.forward_inputs(batch.data, params);
    let mut rec = Recording::default();
    exec.set_rng(seed, rank, step);
    let fwd = plans
        .run_forward(
            &mut exec,
            &backend,
            &mut comm,
            inputs,
            &clock,
            &mut rec,
            Vec::new(),
        )
        .map_err(err)?
        .ok_or_else(|| TrainError::Input("the forward produced no output".into()))?;
    let saved = fwd.saved;
    let (loss, cot) = loss_and_grad(model.loss, &fwd.output, batch.targets.as_ref())
        .map_err(TrainError::Input)?;
    let cotangents = model
        .cotangent_values(cot, |t| {
            Tensor::zeros(&t.shape, t.dtype).ok_or_else(|| format!("no zeros of dtype {}", t.dtype))
        })
        .map_err(TrainError::Input)?;
    let grads = exec
        .run(
            &plans.sync,
            &backend,
            &mut comm,
            vec![saved, cotangents],
            &clock,
            &mut rec,
        )
        .map_err(err)?;
    let grads = model.param_grads(&grads, add).map_err(TrainError::Input)?;
    Ok((loss, grads))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collectives_fingerprint_does_not_grow_with_micro_steps() {
        let model = Model::load(&ModelSource::Seed).expect("seed");
        let cfg = TrainConfig {
            world_size: 2,
            no_sync_steps: 1,
            ..TrainConfig::default()
        };
        let plans = build_plans(&model, &cfg).expect("plans");
        let few = collective_lines(&plans, 1, tracepass_ir::DType::F64);
        let many = collective_lines(&plans, 1_000_000, tracepass_ir::DType::F64);
        assert_eq!(few.len(), many.len());
        // the count is still part of what the ranks compare
        assert_ne!(few, many);
        assert!(many[0].contains("1000001 micro-steps"), "{}", many[0]);
    }

    /// `fuse-elementwise` in the pipeline fuses the forward the trainer runs too (not under
    /// `backward(...)`), and the values read after the forward stay values: the plan compiles.
    #[test]
    fn a_fusing_pipeline_fuses_the_forward_it_runs() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/nanogpt");
        let model = Model::load(&ModelSource::Export(dir)).expect("nanogpt");
        let regions = |passes: Option<&str>| {
            let cfg = TrainConfig {
                world_size: 1,
                passes: passes.map(|p| tracepass_passes::parse_pipeline(p).expect("pipeline")),
                ..TrainConfig::default()
            };
            let plans = build_plans(&model, &cfg).expect("plans");
            let count = |plan: &Plan| {
                plan.instrs
                    .iter()
                    .filter(|i| matches!(i.kind, crate::exec::plan::InstrKind::Region(_)))
                    .count()
            };
            (count(&plans.forward), count(&plans.sync))
        };
        let (fwd, bwd) = regions(Some("fuse-elementwise"));
        assert!(fwd > 0 && bwd > 0, "{fwd} forward, {bwd} backward regions");
        assert_eq!(regions(Some("forward(fuse-elementwise)")).0, fwd);
        let (fwd_b, bwd_b) = regions(Some("backward(fuse-elementwise)"));
        assert_eq!((fwd_b, bwd_b), (0, bwd));
        assert_eq!(regions(None), (0, 0));
    }

    /// The pre-check counts a sharded rank's share: a run at 4 ranks that fits only when
    /// sharded is refused as DDP and accepted under fsdp (zero3 and zero2 alike), with the
    /// memory available set between the two needs.
    #[test]
    fn the_memory_check_counts_shards_under_fsdp() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/nanogpt");
        let model = Model::load(&ModelSource::Export(dir)).expect("nanogpt");
        let plans_of = |passes: &str| {
            let cfg = TrainConfig {
                world_size: 4,
                passes: Some(tracepass_passes::parse_pipeline(passes).expect("pipeline")),
                ..TrainConfig::default()
            };
            build_plans(&model, &cfg).expect("plans")
        };
        let ddp = memory_need(&model, None, 4).expect("counts");
        assert_eq!(
            ddp.per_rank,
            2 * ddp.bytes + 8 * ddp.elements,
            "DDP: whole parameters, gradients and moments"
        );
        for sharding in ["zero3", "zero2"] {
            let plans = plans_of(&format!(
                "fsdp(world_size=4,sharding={sharding},bucket_mb=0.05)"
            ));
            let layout = plans.shards.as_ref().expect("sharded");
            let need = memory_need(&model, Some(layout), 4).expect("counts");
            // a quarter of the sharded state, the unsharded rest whole, one bucket gathered
            let bucket = layout.largest_bucket_bytes() as u64;
            assert!(
                bucket > 0 && bucket < ddp.bytes,
                "{sharding}: several buckets"
            );
            let shards: u64 = layout
                .buckets
                .iter()
                .map(|b| (b.shard_numel(4) * (2 * b.dtype.size_bytes() + 8)) as u64)
                .sum();
            assert!(need.per_rank >= shards + bucket);
            assert!(
                (need.per_rank as f64) < 0.3 * ddp.per_rank as f64 + bucket as f64,
                "{sharding}: {} of DDP's {}",
                need.per_rank,
                ddp.per_rank
            );
            assert!(need.total < ddp.total);
            // what fits only sharded: DDP is refused, fsdp accepted
            let avail = Some(need.total);
            let e = check_memory_within(ddp, 4, false, avail).expect_err("DDP does not fit");
            assert!(e.to_string().contains("does not fit in memory"), "{e}");
            check_memory_within(need, 4, true, avail).expect("fits sharded");
            let e =
                check_memory_within(need, 4, true, Some(need.total - 1)).expect_err("a byte short");
            assert!(e.to_string().contains("largest gathered bucket"), "{e}");
        }
    }
}
