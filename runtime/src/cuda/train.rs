//! One rank of data-parallel training on one GPU (one process per GPU, started by torchrun or
//! `tracepass launch`): the executor on the CUDA backend and NCCL; loss head and optimizer on
//! the host (small next to the model's kernels for the models here).

use super::backend::{CudaBackend, CudaTensor};
use super::nccl::{unique_id, NcclComm};
use crate::backend::Backend;
use crate::comm::{Communicator, ReduceOp};
use crate::data::DataSource;
use crate::executor::{Executor, RValue};
use crate::loss::loss_and_grad;
use crate::metrics::{Clock, Recording, Span, StepMetrics};
use crate::model::{LossKind, Model};
use crate::optim::Optimizer;
use crate::rendezvous::{exchange, DistEnv};
use crate::tensor::Tensor;
use crate::tensorfile::TensorFile;
use crate::trainer::{
    build_plans, check_memory, collective_lines, initial_params, TrainConfig, TrainError,
    TrainReport,
};
use std::time::Instant;
use tracepass_ir::DType;

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
    let data = match &cfg.data {
        Some(path) => {
            DataSource::File(TensorFile::load(path).map_err(|e| TrainError::Input(e.to_string()))?)
        }
        None => DataSource::Seeded { seed: cfg.seed },
    };
    let y_shape = match model.loss {
        LossKind::SeedCrossEntropy => model.output_type().map(|t| t.shape),
        LossKind::Sum => None,
    };
    // NCCL group: rank 0's id through the TCP rendezvous
    let id = if rank == 0 {
        Some(unique_id().map_err(|e| TrainError::Config(format!("--device cuda: {e}")))?)
    } else {
        None
    };
    let id =
        exchange(env, id.as_deref(), cfg.collective_timeout).map_err(|e| fail(e.to_string()))?;
    let mut comm =
        NcclComm::new(&backend, rank, env.world_size, &id).map_err(|e| fail(e.to_string()))?;
    crate::fingerprint::check(
        &mut comm,
        &backend,
        &collective_lines(&plans, 0, DType::F32),
    )
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
    let mut exec: Executor<CudaBackend, NcclComm> = Executor::new();
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
        let (x, y) = data
            .batch(step, rank, &model.input.1, y_shape.as_deref())
            .map_err(|e| TrainError::Input(format!("rank {rank}: {e}")))?;
        let inputs = model.forward_inputs(up(&x)?, &dev_params);
        let mut rec_f = Recording::default();
        let (out, saved) = plans
            .run_forward(&mut exec, &backend, &mut comm, inputs, &clock, &mut rec_f)
            .map_err(|e| fail(e.to_string()))?
            .ok_or_else(|| fail("the forward produced no output".into()))?;
        let (loss, cot) = loss_and_grad(model.loss, &down(&out)?, y.as_ref())
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
                &backend,
                &mut comm,
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
        ) / env.world_size as f64;
        let host_grads: Vec<Option<Tensor>> = model
            .param_grads(&grads)
            .iter()
            .map(|g| g.as_ref().map(&down).transpose())
            .collect::<Result<_, _>>()?;
        if step == first_step {
            report.grads_step0.push(host_grads.clone());
        }
        opt.step(&mut params, &host_grads).map_err(&fail)?;
        dev_params = params.iter().map(&up).collect::<Result<_, _>>()?;
        backend.synchronize().map_err(|e| fail(e.0))?;
        let end = Instant::now();
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
