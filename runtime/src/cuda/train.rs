//! One rank of data-parallel training on one GPU (one process per GPU, started by torchrun or
//! `tracepass launch`): the executor on the CUDA backend and NCCL (no NCCL for a world of
//! one); loss head and optimizer on the host (small next to the model's kernels for the
//! models here). A failing rank aborts its communicator; the others' watchdogs end them
//! within `--collective-timeout`, each with an error naming its rank and the collective.

use super::backend::{CudaBackend, CudaTensor};
use super::nccl::{unique_id, NcclComm};
use super::solo::SoloComm;
use crate::backend::Backend;
use crate::comm::{CommError, CommTiming, Communicator, ReduceOp};
use crate::data::DataSource;
use crate::executor::{Executor, RValue};
use crate::loss::loss_and_grad;
use crate::metrics::{Clock, Recording, Span, StepMetrics};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::rendezvous::{exchange, DistEnv};
use crate::tensor::Tensor;
use crate::trainer::{
    build_plans, check_memory, collective_lines, initial_params, Plans, TrainConfig, TrainError,
    TrainReport,
};
use std::collections::VecDeque;
use std::time::Instant;
use tracepass_ir::DType;

/// A communicator of CUDA tensors that reports the device time of its collectives.
pub trait DeviceComm: Communicator<Tensor = CudaTensor> {
    /// The collectives waited on since the last call, with their device times (call once the
    /// step is synchronized).
    fn take_timings(&mut self) -> Result<Vec<(String, CommTiming)>, CommError>;
}

impl DeviceComm for NcclComm {
    fn take_timings(&mut self) -> Result<Vec<(String, CommTiming)>, CommError> {
        NcclComm::take_timings(self)
    }
}

impl DeviceComm for SoloComm<CudaTensor> {
    fn take_timings(&mut self) -> Result<Vec<(String, CommTiming)>, CommError> {
        // nothing is communicated: the times `wait` gave are exact
        Ok(Vec::new())
    }
}

/// Replaces the host-side times of each bucket's collective (taken at `wait`) by the device's
/// (`timings`, in wait order, matched by label), in the bucket records and timeline events.
pub fn apply_comm_timings(
    recs: &mut [&mut Recording],
    timings: Vec<(String, CommTiming)>,
    clock: &Clock,
) {
    let mut left: VecDeque<(String, CommTiming)> = timings.into();
    for rec in recs.iter_mut() {
        let rec: &mut Recording = rec;
        for b in rec.buckets.iter_mut() {
            let Some(pos) = left.iter().position(|(l, _)| *l == b.label) else {
                continue;
            };
            let Some((_, t)) = left.remove(pos) else {
                continue;
            };
            let old = (b.comm_start_us, b.comm_end_us);
            b.comm_start_us = clock.us(t.started);
            b.comm_end_us = clock.us(t.finished);
            let name = format!("all_reduce {}", b.label);
            for e in rec.events.iter_mut() {
                if e.comm && e.name == name && (e.span.start_us, e.span.end_us) == old {
                    e.span = Span {
                        start_us: b.comm_start_us,
                        end_us: b.comm_end_us,
                    };
                }
            }
        }
    }
}

fn rank_err(rank: usize) -> impl Fn(String) -> TrainError {
    move |message| TrainError::Rank { rank, message }
}

/// Trains as rank `env.rank` of `env.world_size` on GPU `env.local_rank`.
pub fn train(
    cfg: &TrainConfig,
    env: &DistEnv,
    on_step: &dyn Fn(usize, f64),
) -> Result<TrainReport, TrainError> {
    let rank = env.rank;
    let fail = rank_err(rank);
    if cfg.no_sync_steps > 0 {
        return Err(TrainError::Config(
            "--no-sync-steps is not supported with --device cuda yet".into(),
        ));
    }
    if cfg.fault.is_some() {
        return Err(TrainError::Config(
            "--inject-fault is for the CPU trainer".into(),
        ));
    }
    let backend = CudaBackend::new(env.local_rank)
        .map_err(|e| TrainError::Config(format!("--device cuda: {e}")))?;
    let cfg = TrainConfig {
        world_size: env.world_size,
        ..cfg.clone()
    };
    let model = Model::load(&cfg.model)?;
    let plans = build_plans(&model, &cfg)?;
    // this process makes the first copy of the parameters in host memory
    check_memory(&model, 1)?;
    let (init, resume) = initial_params(&cfg, &model)?;
    let data = crate::trainer::data_source(&cfg, &model)?;
    let setup = Setup {
        cfg: &cfg,
        rank,
        world: env.world_size,
        backend: &backend,
        model: &model,
        plans: &plans,
        init,
        resume,
        data,
    };
    if env.world_size == 1 {
        // one GPU: no NCCL (it need not be installed), nothing to communicate
        return run(setup, &mut SoloComm::default(), on_step);
    }
    // NCCL group: rank 0's id through the TCP rendezvous
    let id = if rank == 0 {
        Some(unique_id().map_err(|e| TrainError::Config(format!("--device cuda: {e}")))?)
    } else {
        None
    };
    let id =
        exchange(env, id.as_deref(), cfg.collective_timeout).map_err(|e| fail(e.to_string()))?;
    let mut comm = NcclComm::new(&backend, rank, env.world_size, &id, cfg.collective_timeout)
        .map_err(|e| fail(e.to_string()))?;
    let r = run(setup, &mut comm, on_step);
    if let Err(e) = &r {
        // the peers stop at their next collective (or their watchdog's timeout) instead of
        // waiting for this rank; the aborted communicator is not destroyed again on drop
        comm.abort(&e.to_string());
    }
    r
}

/// What `run` needs from the setup.
struct Setup<'a> {
    cfg: &'a TrainConfig,
    rank: usize,
    world: usize,
    backend: &'a CudaBackend,
    model: &'a Model,
    plans: &'a Plans,
    init: Vec<Tensor>,
    resume: Option<crate::checkpoint::Checkpoint>,
    data: DataSource,
}

fn run<C: DeviceComm>(
    s: Setup<'_>,
    comm: &mut C,
    on_step: &dyn Fn(usize, f64),
) -> Result<TrainReport, TrainError> {
    let Setup {
        cfg,
        rank,
        world,
        backend,
        model,
        plans,
        init,
        resume,
        data,
    } = s;
    let fail = rank_err(rank);
    crate::fingerprint::check(comm, backend, &collective_lines(plans, 0, DType::F32))
        .map_err(|e| fail(e.to_string()))?;
    let up = |t: &Tensor| backend.upload(t).map_err(|e| fail(format!("upload: {e}")));
    let down = |t: &CudaTensor| {
        backend
            .download(t)
            .map_err(|e| fail(format!("download: {e}")))
    };
    let mut params = init;
    let mut dev_params: Vec<CudaTensor> = params.iter().map(&up).collect::<Result<_, _>>()?;
    if let Some(root) = cfg.broadcast_from {
        for p in dev_params.iter_mut() {
            *p = comm
                .broadcast(p.clone(), root)
                .map_err(|e| fail(e.to_string()))?;
        }
        params = dev_params.iter().map(&down).collect::<Result<_, _>>()?;
    }
    let mut opt = Optimizer::new(cfg.optimizer, &params);
    let first_step = resume.as_ref().map_or(0, |c| c.step);
    if let Some(ck) = &resume {
        opt.restore(ck.optimizer_step, ck.exp_avg.clone(), ck.exp_avg_sq.clone())
            .map_err(|m| TrainError::Input(format!("resuming: {m}")))?;
    }
    let clock = Clock::new(cfg.timeline);
    let mut exec: Executor<CudaBackend, C> = Executor::new();
    let mut report = TrainReport {
        losses: Vec::new(),
        metrics: vec![Vec::new()],
        param_names: model.param_names(),
        grads_step0: Vec::new(),
        params: Vec::new(),
        events: Vec::new(),
        backward: plans.backward.clone(),
        pipeline: plans.pipeline.clone(),
        wall: std::time::Duration::ZERO,
        first_step,
    };
    let start = Instant::now();
    for step in first_step..cfg.steps {
        let t0 = Instant::now();
        let batch = data
            .batch(step, rank, model)
            .map_err(|e| TrainError::Input(format!("rank {rank}: {e}")))?;
        let dev_data: Vec<CudaTensor> = batch.data.iter().map(&up).collect::<Result<_, _>>()?;
        let inputs = model.forward_inputs(dev_data, &dev_params);
        let mut rec_f = Recording::default();
        exec.set_rng(cfg.seed, rank, step);
        let fwd = plans
            .run_forward(&mut exec, backend, comm, inputs, &clock, &mut rec_f)
            .map_err(|e| fail(e.to_string()))?
            .ok_or_else(|| fail("the forward produced no output".into()))?;
        for (u, b) in model.buffer_updates.iter().zip(&fwd.buffers) {
            params[u.param] = down(b)?;
        }
        let saved = fwd.saved;
        let (loss, cot) = loss_and_grad(model.loss, &down(&fwd.output)?, batch.targets.as_ref())
            .map_err(|e| fail(format!("loss: {e}")))?;
        let loss_h = comm
            .all_reduce_async(
                up(&Tensor::from_f32(vec![1], vec![loss as f32]))?,
                ReduceOp::Sum,
                "loss",
            )
            .map_err(|e| fail(e.to_string()))?;
        let mut rec_b = Recording::default();
        let grads = exec
            .run(
                &plans.sync,
                backend,
                comm,
                vec![saved, RValue::Seq(vec![RValue::Tensor(up(&cot)?)])],
                &clock,
                &mut rec_b,
            )
            .map_err(|e| fail(e.to_string()))?;
        let (loss_sum, _) = comm.wait(loss_h).map_err(|e| fail(e.to_string()))?;
        let loss_avg = f64::from(
            down(&loss_sum)?
                .to_f32_vec()
                .first()
                .copied()
                .unwrap_or(f32::NAN),
        ) / world as f64;
        let host_grads: Vec<Option<Tensor>> = model
            .raw_param_grads(&grads)
            .iter()
            .map(|g| g.as_ref().map(&down).transpose())
            .collect::<Result<_, _>>()?;
        let host_grads = model
            .sum_ties(host_grads, crate::trainer::add)
            .map_err(&fail)?;
        if step == first_step {
            report.grads_step0.push(host_grads.clone());
        }
        opt.step(&mut params, &host_grads).map_err(&fail)?;
        model.share_ties(&mut params);
        dev_params = params.iter().map(&up).collect::<Result<_, _>>()?;
        backend.synchronize().map_err(|e| fail(e.0))?;
        if let Some((r, m)) = comm.failure() {
            return Err(TrainError::Rank {
                rank: r,
                message: m,
            });
        }
        let end = Instant::now();
        let timings = comm.take_timings().map_err(|e| fail(e.to_string()))?;
        apply_comm_timings(&mut [&mut rec_f, &mut rec_b], timings, &clock);
        report.metrics[0].push(StepMetrics::from_recordings(
            step,
            rank,
            Span {
                start_us: clock.us(t0),
                end_us: clock.us(end),
            },
            &[&rec_f, &rec_b],
        ));
        report.losses.push(loss_avg);
        if let (Some(path), 0) = (&cfg.save, rank) {
            let done = step + 1;
            if cfg.checkpoint_due(done) {
                crate::checkpoint::save(path, done, &report.param_names, &params, &opt)
                    .map_err(|e| TrainError::Output(format!("saving the checkpoint: {e}")))?;
            }
        }
        if rank == 0 {
            on_step(step, loss_avg);
        }
    }
    report.wall = start.elapsed();
    report.params.push(params);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{BucketRecord, Event};
    use std::time::Duration;

    fn bucket(label: &str, start: f64, end: f64) -> BucketRecord {
        BucketRecord {
            label: label.into(),
            bytes: 4,
            ready_us: 0.0,
            launch_us: 0.0,
            comm_start_us: start,
            comm_end_us: end,
            wait_start_us: end,
            wait_end_us: end,
        }
    }

    #[test]
    fn device_times_replace_the_wait_time_guesses() {
        let clock = Clock::new(true);
        let at = |us: u64| clock.epoch + Duration::from_micros(us);
        let timing = |a: u64, b: u64| CommTiming {
            launched: at(a),
            started: at(a + 10),
            finished: at(b),
        };
        let mut fwd = Recording::default();
        let mut bwd = Recording {
            buckets: vec![bucket("b0", 1.0, 900.0), bucket("b1", 2.0, 950.0)],
            ..Recording::default()
        };
        bwd.events.push(Event {
            name: "all_reduce b1".into(),
            comm: true,
            span: Span {
                start_us: 2.0,
                end_us: 950.0,
            },
        });
        // wait order: b1 was waited first; "loss" is not a bucket of either recording
        let timings = vec![
            ("b1".to_string(), timing(100, 400)),
            ("loss".to_string(), timing(0, 50)),
            ("b0".to_string(), timing(200, 300)),
        ];
        apply_comm_timings(&mut [&mut fwd, &mut bwd], timings, &clock);
        let b = &bwd.buckets;
        assert!((b[0].comm_start_us - 210.0).abs() < 1.0, "{:?}", b[0]);
        assert!((b[0].comm_end_us - 300.0).abs() < 1.0);
        assert!((b[1].comm_start_us - 110.0).abs() < 1.0);
        assert!((b[1].comm_end_us - 400.0).abs() < 1.0);
        assert_eq!(bwd.events[0].span.start_us, b[1].comm_start_us);
        assert_eq!(bwd.events[0].span.end_us, b[1].comm_end_us);
        assert!(fwd.buckets.is_empty());
    }
}
