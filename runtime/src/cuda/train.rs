//! One rank of data-parallel training on one GPU (one process per GPU, started by torchrun or
//! `tracepass launch`): the rank loop the CPU trainer runs (`rank_loop`), on the CUDA backend
//! and NCCL (no NCCL for a world of one); loss head and optimizer on the host (small next to
//! the model's kernels for the models here). A failing rank aborts its communicator; the
//! others' watchdogs end them within `--collective-timeout`, each with an error naming its
//! rank and the collective.

use super::backend::{CudaBackend, CudaTensor};
use super::nccl::{unique_id, NcclComm};
use super::solo::SoloComm;
use crate::comm::rendezvous::{exchange, DistEnv};
use crate::comm::{CommTiming, Communicator};
use crate::exec::metrics::{Clock, Recording, Span};
use crate::train::model::Model;
use crate::train::rank_loop::{run_rank, RankOut, RankSetup, StepComm};
use crate::train::trainer::{
    build_plans, check_link_timeout, check_memory, initial_params, Fault, TrainConfig, TrainError,
    TrainReport,
};
use std::collections::VecDeque;
use std::time::Instant;
use tracepass_ir::DType;

/// After each step, the device times of the step's collectives replace the host times taken
/// at `wait`, and an asynchronous NCCL error seen by the watchdog ends the rank.
impl StepComm for NcclComm {
    fn end_step(&mut self, recs: &mut [Recording], clock: &Clock) -> Result<(), String> {
        let timings = self.take_timings().map_err(|e| e.to_string())?;
        let mut refs: Vec<&mut Recording> = recs.iter_mut().collect();
        apply_comm_timings(&mut refs, timings, clock);
        match self.failure() {
            Some((rank, reason)) => Err(format!("rank {rank} failed: {reason}")),
            None => Ok(()),
        }
    }
}

/// Nothing is communicated: the times `wait` gave are exact.
impl StepComm for SoloComm<CudaTensor> {}

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
            let Some(pos) = left.iter().position(|(l, _)| l.as_str() == &*b.label) else {
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

/// Trains as rank `env.rank` of `env.world_size` on GPU `env.local_rank`.
pub fn train(
    cfg: &TrainConfig,
    env: &DistEnv,
    on_step: &dyn Fn(usize, f64),
) -> Result<TrainReport, TrainError> {
    let rank = env.rank;
    let fail = |message: String| TrainError::Rank { rank, message };
    let backend = CudaBackend::new(env.local_rank)
        .map_err(|e| TrainError::Config(format!("--device cuda: {e}")))?;
    let cfg = TrainConfig {
        world_size: env.world_size,
        ..cfg.clone()
    };
    let model = Model::load(&cfg.model)?.with_loss(cfg.loss, cfg.targets.as_deref());
    let mut plans = build_plans(&model, &cfg)?;
    if let Some(Fault::Mismatch { rank: r }) = cfg.fault {
        if r == rank {
            // this rank buckets differently from the others
            let other_mb = if cfg.bucket_mb > 0.0 { 0.0 } else { 25.0 };
            plans = build_plans(
                &model,
                &TrainConfig {
                    bucket_mb: other_mb,
                    ..cfg.clone()
                },
            )?;
        }
    }
    check_link_timeout(&plans, &cfg)?;
    // this process makes the first copy of the parameters in host memory
    check_memory(&model, plans.shards.as_ref(), 1)?;
    let (init, resume) = initial_params(&cfg, &model, plans.shards.as_ref())?;
    let data = crate::train::trainer::data_source(&cfg, &model)?;
    crate::train::trainer::check_batches(&data, &cfg, &model, resume.as_ref(), rank)?;
    let setup = RankSetup {
        cfg: &cfg,
        rank,
        model: &model,
        plans: &plans,
        data: &data,
        init: &init,
        resume: resume.as_ref(),
        clock: Clock::new(cfg.timeline),
        backend: &backend,
        // CUDA tensors have no f64
        loss_dtype: DType::F32,
        keep: true,
    };
    let start = Instant::now();
    let report = |out: RankOut| TrainReport {
        losses: out.losses,
        metrics: vec![out.metrics],
        param_names: model.param_names(),
        grads_step0: vec![out.grads0],
        params: vec![out.params],
        events: vec![(rank, out.events)],
        backward: plans.backward.clone(),
        pipeline: plans.pipeline.clone(),
        wall: start.elapsed(),
        first_step: resume.as_ref().map_or(0, |c| c.step),
    };
    if env.world_size == 1 {
        // one GPU: no NCCL (it need not be installed), nothing to communicate
        return run_rank(setup, &mut SoloComm::default(), on_step).map(report);
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
    // an injected panic must still abort the communicator, so the peers stop too
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_rank(setup, &mut comm, on_step)
    }))
    .unwrap_or_else(|p| {
        Err(fail(format!(
            "panicked: {}",
            crate::train::trainer::panic_message(p)
        )))
    });
    if let Err(e) = &r {
        // the peers stop at their next collective (or their watchdog's timeout) instead of
        // waiting for this rank; the aborted communicator is not destroyed again on drop
        comm.abort(&e.to_string());
    }
    r.map(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::metrics::{BucketRecord, Event};
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
