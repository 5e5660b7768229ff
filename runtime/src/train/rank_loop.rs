//! One rank's training loop, for any device and communicator: the CPU trainer runs it on a
//! thread per rank, the CUDA trainer in a process per GPU. Micro-steps without
//! synchronization (`--no-sync-steps`), buffers the forward updates, ties, checkpoints and the
//! injected faults behave the same on both. Parameters and the optimizer live on the host;
//! the traces run on the device.

use crate::comm::{CommError, Communicator, ReduceOp};
use crate::exec::backend::{Backend, Input};
use crate::exec::executor::{ExecError, Executor, RValue};
use crate::exec::kernel::{BinaryOp, Kernel, Side};
use crate::exec::metrics::{
    BucketRecord, Clock, Event, OverlapSummary, Recording, Span, StepMetrics,
};
use crate::tensor::Tensor;
use crate::train::checkpoint::Checkpoint;
use crate::train::data::DataSource;
use crate::train::loss::loss_and_grad;
use crate::train::model::Model;
use crate::train::optim::Optimizer;
use crate::train::shard::ShardLayout;
use crate::train::sharded_checkpoint::{write_manifest, ManifestInfo, RankSave, SaveFormat};
use crate::train::trainer::{add, collective_lines, Fault, Plans, TrainConfig, TrainError};
use std::time::Instant;
use tracepass_ir::DType;

/// A communicator as a rank loop drives it: after each step it may replace the host-side
/// times of the step's collectives by the device's and report a failure seen in the
/// background (an asynchronous NCCL error).
pub trait StepComm: Communicator {
    /// Called after each micro-step without synchronization (once all its collectives were
    /// waited) and once the step's work is done and the device synchronized.
    fn end_step(&mut self, recs: &mut [Recording], clock: &Clock) -> Result<(), String> {
        let _ = (recs, clock);
        match self.failure() {
            Some((rank, reason)) => Err(format!("rank {rank} failed: {reason}")),
            None => Ok(()),
        }
    }
}

/// What one rank trains with.
pub(crate) struct RankSetup<'a, B: Backend> {
    pub(crate) cfg: &'a TrainConfig,
    pub(crate) rank: usize,
    pub(crate) model: &'a Model,
    pub(crate) plans: &'a Plans,
    pub(crate) data: &'a DataSource,
    pub(crate) init: &'a [Tensor],
    pub(crate) resume: Option<&'a Checkpoint>,
    pub(crate) clock: Clock,
    pub(crate) backend: &'a B,
    /// The dtype of the loss all-reduce (f64 where the device has it).
    pub(crate) loss_dtype: DType,
    /// Keep this rank's first-step gradients and final parameters in its output.
    pub(crate) keep: bool,
}

/// What one rank gives back.
pub(crate) struct RankOut {
    pub(crate) losses: Vec<f64>,
    pub(crate) metrics: Vec<StepMetrics>,
    pub(crate) grads0: Vec<Option<Tensor>>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) events: Vec<Event>,
}

/// `a + b` on the device.
pub(crate) fn device_add<B: Backend>(
    backend: &B,
    a: &B::Tensor,
    b: &B::Tensor,
) -> Result<B::Tensor, String> {
    backend
        .run(
            &Kernel::Binary {
                op: BinaryOp::Add,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha: 1.0,
            },
            &[Input::Tensor(a), Input::Tensor(b)],
        )
        .map_err(|e| e.0)
}

/// `[loss]` as a tensor of `dtype` to all-reduce, in a pooled buffer where it can be.
fn loss_tensor(loss: f64, dtype: DType) -> Option<Tensor> {
    use crate::cpu::buffer_pool::filled;
    use crate::tensor::Storage;
    Some(match dtype {
        DType::F64 => Tensor::new([1], Storage::F64(filled(1, loss))),
        DType::F32 => Tensor::new([1], Storage::F32(filled(1, loss as f32))),
        _ => Tensor::from_f64(vec![1], vec![loss]).to_dtype(dtype)?,
    })
}

/// Trains `s.cfg.steps` steps (from the checkpoint's, when resuming) as rank `s.rank`;
/// `on_step(step, loss)` is called by rank 0 as each step ends.
pub(crate) fn run_rank<B, C>(
    s: RankSetup<'_, B>,
    comm: &mut C,
    on_step: &dyn Fn(usize, f64),
) -> Result<RankOut, TrainError>
where
    B: Backend,
    C: StepComm<Tensor = B::Tensor>,
{
    let RankSetup {
        cfg,
        rank,
        model,
        plans,
        data,
        init,
        resume,
        clock,
        backend,
        loss_dtype,
        keep,
    } = s;
    let fail = |message: String| TrainError::Rank { rank, message };
    let exec_err = |e: ExecError| fail(e.to_string());
    let comm_err = |e: CommError| fail(e.to_string());
    let up = |t: &Tensor| backend.upload(t).map_err(|e| fail(format!("upload: {e}")));
    let down = |t: &B::Tensor| {
        backend
            .download(t)
            .map_err(|e| fail(format!("download: {e}")))
    };
    let mut exec: Executor<B, C> = Executor::new();
    // every rank must be about to issue the same collectives as rank 0
    crate::train::fingerprint::check(
        comm,
        backend,
        &collective_lines(plans, cfg.no_sync_steps, loss_dtype),
    )
    .map_err(comm_err)?;
    let mut params: Vec<Tensor> = init.to_vec();
    let mut dev_params: Vec<B::Tensor> = params.iter().map(&up).collect::<Result<_, _>>()?;
    if let Some(root) = cfg.broadcast_from {
        for p in dev_params.iter_mut() {
            *p = comm.broadcast(p.clone(), root).map_err(comm_err)?;
        }
        params = dev_params.iter().map(&down).collect::<Result<_, _>>()?;
    }
    // a sharded run keeps its shards of the parameters, and optimizer state for them only
    let layout = plans.shards.as_ref();
    // a sharded checkpoint resumed by a sharded run: this rank reads its own shards from the
    // saved ones (any world size), one file at a time
    let mut read_moments = None;
    if let Some(l) = layout {
        params = match resume.and_then(|c| c.sharded.as_ref()) {
            Some(s) => {
                let (p, m, v) = s
                    .local(l, rank, true)
                    .map_err(|e| TrainError::Input(e.to_string()))?;
                read_moments = Some((m, v));
                p
            }
            None => l.shard_params(&params, rank).map_err(&fail)?,
        };
        dev_params = params.iter().map(&up).collect::<Result<_, _>>()?;
    }
    let unused = model.unused_mask();
    let stateless = layout.map_or_else(|| unused.clone(), |l| l.local_mask(&unused));
    let mut opt = Optimizer::new(cfg.optimizer, &params).without_state_for(&stateless);
    let first_step = resume.map_or(0, |c| c.step);
    if let Some(ck) = resume {
        let (m, v) = match (layout, read_moments) {
            (Some(_), Some(mv)) => mv,
            (Some(l), None) => (
                l.shard_moments(&ck.exp_avg, rank),
                l.shard_moments(&ck.exp_avg_sq, rank),
            ),
            (None, _) => (ck.exp_avg.clone(), ck.exp_avg_sq.clone()),
        };
        opt.restore(ck.optimizer_step, m, v)
            .map_err(|m| TrainError::Input(format!("resuming: {m}")))?;
    }
    let names = match layout {
        Some(l) => l.local_names(model),
        None => model.param_names(),
    };
    // a tie's other members share the primary's storage: counted once
    let tie_copies: Vec<usize> = model
        .ties
        .iter()
        .flat_map(|g| g[1..].iter().copied())
        .collect();
    let n_grads = match layout {
        Some(_) => plans.sync.results.len(),
        None => model.program.gradient_values().len(),
    };
    let mut out = RankOut {
        losses: Vec::with_capacity(cfg.steps),
        metrics: Vec::with_capacity(cfg.steps),
        grads0: Vec::new(),
        params: Vec::new(),
        events: Vec::new(),
    };
    let micro_per_step = cfg.no_sync_steps + 1;
    // the loss all-reduce's buffer comes back to this thread's pool, where it is kept
    crate::cpu::buffer_pool::reserve::<f64>(1, 2);
    crate::cpu::buffer_pool::reserve::<f32>(1, 2);
    // lists kept from step to step and emptied after use: a steady step allocates none
    let mut recs: Vec<Recording> = Vec::new();
    let mut spare_recs: Vec<Recording> = Vec::new();
    let mut acc: Vec<Option<B::Tensor>> = Vec::new();
    let mut dev_data: Vec<B::Tensor> = Vec::new();
    let mut updated: Vec<B::Tensor> = Vec::new();
    let mut raw: Vec<Option<B::Tensor>> = Vec::new();
    let mut grads: Vec<Option<Tensor>> = Vec::new();
    // every step's metrics keep its bucket records: at the end of the first step, whose
    // records give their number, the lists of all steps are made at once
    let mut bucket_lists: Vec<Vec<BucketRecord>> = Vec::new();
    let mut micro_buckets: Vec<BucketRecord> = Vec::new();
    for step in first_step..cfg.steps {
        let step_start = Instant::now();
        backend.reset_pool_stats();
        spare_recs.append(&mut recs);
        acc.clear();
        acc.resize(n_grads, None);
        // finished local micro-steps, summarized as they end: a step of a million micro-steps
        // keeps no record or handle of each
        let mut local = OverlapSummary::default();
        let mut loss_sum = 0.0;
        let mut synced: Vec<RValue<B::Tensor>> = Vec::new();
        let (mut forward_s, mut backward_s, mut backward_compute_s) = (0.0, 0.0, 0.0);
        for micro in 0..micro_per_step {
            let m = step * micro_per_step + micro;
            if let Some(Fault::Vanish { rank: r, step: s }) = cfg.fault {
                if r == rank && s == step {
                    return Err(fail(format!("injected fault: left before step {step}")));
                }
            }
            let batch = data
                .batch(m, rank, model)
                .map_err(|e| TrainError::Input(format!("rank {rank}: {e}")))?;
            dev_data.clear();
            for t in &batch.data {
                dev_data.push(up(t)?);
            }
            // forward
            let mut inputs = exec.list(plans.forward.args.len());
            match layout {
                Some(l) => l.forward_inputs_into(dev_data.drain(..), &dev_params, &mut inputs),
                None => model.forward_inputs_into(dev_data.drain(..), &dev_params, &mut inputs),
            }
            let mut rec = spare_recs.pop().unwrap_or_default();
            rec.clear();
            let t_fwd = Instant::now();
            exec.set_rng(cfg.seed, rank, m);
            let mut forward = plans
                .run_forward(
                    &mut exec,
                    backend,
                    comm,
                    inputs,
                    &clock,
                    &mut rec,
                    std::mem::take(&mut updated),
                )
                .map_err(exec_err)?
                .ok_or_else(|| fail("the forward produced no output tensor".into()))?;
            forward_s += t_fwd.elapsed().as_secs_f64();
            recs.push(rec);
            let mut rec = spare_recs.pop().unwrap_or_default();
            rec.clear();
            // buffers the forward updated (running statistics) hold their new values next time
            for (u, b) in model.buffer_updates.iter().zip(forward.buffers.drain(..)) {
                params[u.param] = down(&b)?;
                // the old value's buffer takes a later step's new statistics
                let old = std::mem::replace(&mut dev_params[u.param], b);
                backend.recycle(old);
            }
            updated = forward.buffers;
            let (loss, cot) =
                loss_and_grad(model.loss, &down(&forward.output)?, batch.targets.as_ref())
                    .map_err(|e| fail(format!("loss: {e}")))?;
            // its buffer takes the next forward's output
            backend.recycle(forward.output);
            if !loss.is_finite() && !cfg.allow_non_finite {
                let at = if micro_per_step > 1 {
                    format!(" (micro-step {micro})")
                } else {
                    String::new()
                };
                return Err(fail(format!(
                    "step {step}{at}: the loss is {loss}; stopping before it reaches the parameters (a NaN or infinity in the parameters or the batch, a diverging learning rate, or no target to count); --allow-non-finite trains on"
                )));
            }
            if let Some(Fault::Panic { rank: r, step: s }) = cfg.fault {
                if r == rank && s == step {
                    panic!("injected fault: rank {rank} panics in step {step}");
                }
            }
            // the loss average travels while the backward computes
            let loss_t = loss_tensor(loss, loss_dtype)
                .ok_or_else(|| fail(format!("the loss cannot be held in {loss_dtype}")))?;
            let loss_dev = up(&loss_t)?;
            // (on the CPU the only holder is the collective's: its buffer goes back to the
            // pool after the wait)
            drop(loss_t);
            let loss_handle = comm
                .all_reduce_async(loss_dev, ReduceOp::Sum, "loss")
                .map_err(comm_err)?;
            // zeros for the model outputs the loss does not read
            let mut cotangents = exec.list(model.cotangents.len().max(1));
            model
                .cotangent_values_into(
                    up(&cot)?,
                    |t| {
                        let z = Tensor::zeros(&t.shape, t.dtype)
                            .ok_or_else(|| format!("no zeros of dtype {}", t.dtype))?;
                        up(&z).map_err(|e| e.to_string())
                    },
                    &mut cotangents,
                )
                .map_err(|e| fail(format!("cotangents: {e}")))?;
            // a device's copy of the gradient left the host's buffer unshared: to the pool
            if let Some(s) = cot.into_unshared_storage() {
                crate::cpu::buffer_pool::give_storage(s);
            }
            let mut binputs = exec.list(2 + plans.acc_targets.len());
            binputs.push(forward.saved);
            binputs.push(RValue::Seq(cotangents));
            let last = micro + 1 == micro_per_step;
            let plan = if last {
                for &pos in &plans.acc_targets {
                    binputs.push(match &acc[pos] {
                        Some(t) => RValue::Tensor(t.clone()),
                        None => RValue::None,
                    });
                }
                &plans.sync
            } else {
                plans.local.as_ref().unwrap_or(&plans.sync)
            };
            if let Some(Fault::Slow { rank: r, step: s }) = cfg.fault {
                if r == rank && s == step && micro == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(Fault::SLOW_MS));
                }
            }
            let t_bwd = Instant::now();
            let results = exec
                .run(plan, backend, comm, binputs, &clock, &mut rec)
                .map_err(exec_err)?;
            backward_s += t_bwd.elapsed().as_secs_f64();
            backward_compute_s += crate::exec::metrics::busy(&rec.compute) * 1e-6;
            recs.push(rec);
            // summed in micro-step order, as each micro-step ends
            let (t, _) = comm.wait(loss_handle).map_err(comm_err)?;
            loss_sum += down(&t)?.first_f64().unwrap_or(f64::NAN);
            backend.recycle(t);
            if last {
                synced = results;
                // the synchronising backward has added the accumulated gradients: their
                // buffers, held only here now, go back to the pool
                if layout.is_none() {
                    for a in acc.iter_mut() {
                        if let Some(t) = a.take() {
                            backend.recycle(t);
                        }
                    }
                }
            } else {
                for (a, g) in acc.iter_mut().zip(&results) {
                    if let RValue::Tensor(g) = g {
                        *a = Some(match a.take() {
                            None => g.clone(),
                            Some(prev) => {
                                let sum = device_add(backend, &prev, g).map_err(&fail)?;
                                backend.recycle(prev);
                                sum
                            }
                        });
                    }
                }
                exec.recycle_list(backend, results);
                // every collective of this micro-step has been waited: its spans lie within
                // it, so its summary adds to the others' exactly
                comm.end_step(&mut recs, &clock).map_err(&fail)?;
                let m = StepMetrics::from_recordings_into(
                    step,
                    rank,
                    Span::default(),
                    &recs,
                    std::mem::take(&mut micro_buckets),
                );
                local.add(&m);
                micro_buckets = m.buckets;
                for mut r in recs.drain(..) {
                    if clock.events {
                        out.events.append(&mut r.events);
                    }
                    spare_recs.push(r);
                }
            }
        }
        let loss = loss_sum / (cfg.world_size * micro_per_step) as f64;
        if layout.is_some() {
            // every micro-step reduce-scattered its gradients: the shards add up here
            for (g, a) in synced.iter_mut().zip(acc.iter_mut()) {
                if let (RValue::Tensor(t), Some(prev)) = (&*g, a.take()) {
                    let sum = device_add(backend, &prev, t).map_err(&fail)?;
                    backend.recycle(prev);
                    if let RValue::Tensor(t) = std::mem::replace(g, RValue::Tensor(sum)) {
                        backend.recycle(t);
                    }
                }
            }
        }
        match layout {
            Some(l) => l.local_grads_into(&synced, &mut raw),
            None => model.raw_param_grads_into(&synced, &mut raw),
        }
        grads.clear();
        for g in &raw {
            grads.push(g.as_ref().map(&down).transpose()?);
        }
        model.sum_ties_in_place(&mut grads, add).map_err(&fail)?;
        // a strided gradient (a permuted weight's, when no bucket packed it) is made contiguous
        // once, for the norm, the optimizer and a save, instead of gathered by each
        for t in grads.iter_mut().flatten() {
            if !t.is_contiguous() {
                *t = t.contiguous();
            }
        }
        match layout {
            // every rank gathers, when the run wants the whole gradients of some rank
            Some(l) if step == first_step && (cfg.save_grads.is_some() || cfg.keep_all_ranks) => {
                let whole = whole_grads(comm, backend, l, &grads).map_err(&fail)?;
                if keep {
                    out.grads0 = whole;
                }
            }
            Some(_) => {}
            None if step == first_step && keep => out.grads0 = grads.clone(),
            None => {}
        }
        if !cfg.allow_non_finite {
            let norm = crate::train::finite::grad_norm(&grads);
            if !norm.is_finite() {
                return Err(fail(format!(
                    "step {step}: the synchronized gradient norm is {norm}; stopping before the update (--allow-non-finite trains on)"
                )));
            }
        }
        // what this rank holds for the model at its fullest (the gradients are there)
        let state_bytes = params
            .iter()
            .enumerate()
            .filter(|(i, _)| !tie_copies.contains(i))
            .map(|(_, p)| p.nbytes())
            .sum::<usize>()
            + grads.iter().flatten().map(Tensor::nbytes).sum::<usize>()
            + opt.state_bytes();
        // the parameters' last other holders: the optimizer updates them in place, uncopied
        dev_params.clear();
        if layout.is_none() {
            model.release_ties(&mut params);
        }
        opt.step(&mut params, &grads).map_err(&fail)?;
        // the gradients' (and buckets') buffers go back to the pool for the next backward:
        // every other holder of them lets go first
        for g in grads.drain(..).flatten() {
            if let Some(s) = g.into_unshared_storage() {
                crate::cpu::buffer_pool::give_storage(s);
            }
        }
        raw.clear();
        exec.recycle_list(backend, synced);
        // a tie is one tensor: every member takes the primary's new value
        model.share_ties(&mut params);
        let non_finite = crate::train::finite::non_finite_param(&names, &params);
        if let (Some(what), false) = (&non_finite, cfg.allow_non_finite) {
            return Err(fail(format!(
                "step {step}: the update made {what} (is the learning rate too large?); stopping (--allow-non-finite trains on)"
            )));
        }
        for p in &params {
            dev_params.push(up(p)?);
        }
        backend.synchronize().map_err(|e| fail(e.0))?;
        comm.end_step(&mut recs, &clock).map_err(&fail)?;
        let end = Instant::now();
        if step == first_step {
            let per_step: usize = recs.iter().map(|r| r.buckets.len()).sum();
            bucket_lists = (step..cfg.steps)
                .map(|_| Vec::with_capacity(per_step))
                .collect();
        }
        let mut m = StepMetrics::from_recordings_into(
            step,
            rank,
            Span {
                start_us: clock.us(step_start),
                end_us: clock.us(end),
            },
            &recs,
            bucket_lists.pop().unwrap_or_default(),
        );
        m.add_local(&local);
        m.forward_s = forward_s;
        m.backward_s = backward_s;
        m.backward_compute_s = backward_compute_s;
        m.state_bytes = state_bytes;
        if let Some(p) = backend.pool_stats() {
            m.buffer_allocs = p.misses;
            m.pool_bytes = p.free_bytes;
        }
        // one arena serves the plans in turn: the largest of them
        m.arena_bytes = [
            Some(&plans.forward),
            Some(&plans.sync),
            plans.local.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|p| p.memory.arena_bytes)
        .max()
        .unwrap_or(0);
        out.metrics.push(m);
        if clock.events {
            for r in &mut recs {
                out.events.append(&mut r.events);
            }
        }
        out.losses.push(loss);
        // a sharded run saves shards (each rank its own, nothing gathered), or, asked for a
        // whole checkpoint, gathers its shards
        let sharded_save = layout.is_some() && cfg.save_format != SaveFormat::Whole;
        let save_start = Instant::now();
        let mut saved_bytes = 0;
        let whole = match (layout, &cfg.save) {
            (Some(l), Some(path)) if cfg.checkpoint_due(step + 1) => {
                if sharded_save {
                    let save = ShardedSave {
                        path,
                        layout: l,
                        model,
                        cfg,
                        rank,
                        step: step + 1,
                        non_finite: non_finite.as_deref(),
                    };
                    saved_bytes = save.run(comm, backend, &params, &opt)?;
                    None
                } else {
                    Some(whole_state(comm, backend, l, model, cfg, &params, &opt).map_err(&fail)?)
                }
            }
            _ => None,
        };
        if rank == 0 {
            if let (Some(path), false) = (&cfg.save, sharded_save) {
                let done = step + 1;
                if cfg.checkpoint_due(done) {
                    // a good checkpoint is never replaced by one that cannot train
                    if let Some(what) = &non_finite {
                        return Err(TrainError::Output(format!(
                            "not saving the checkpoint after step {step} to {}: {what}; the file keeps what it held",
                            path.display()
                        )));
                    }
                    let (save_params, save_opt) = match &whole {
                        Some((p, o)) => (p, o),
                        None => (&params, &opt),
                    };
                    crate::train::checkpoint::save_tied(
                        path,
                        done,
                        &model.param_names(),
                        save_params,
                        save_opt,
                        Some(cfg.world_size),
                        &model.ties,
                    )
                    .map_err(|e| TrainError::Output(format!("saving the checkpoint: {e}")))?;
                    saved_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
                }
            }
        }
        if cfg.save.is_some() && cfg.checkpoint_due(step + 1) {
            if let Some(m) = out.metrics.last_mut() {
                m.checkpoint_s = save_start.elapsed().as_secs_f64();
                m.checkpoint_bytes = saved_bytes;
            }
        }
        if rank == 0 {
            on_step(step, loss);
        }
    }
    match layout {
        Some(l) => {
            // every rank gathers; the ranks that report keep the whole parameters
            let shards = &params[l.place.len()..];
            let gathered = gather_wholes(comm, backend, shards, "params").map_err(&fail)?;
            let whole = l.unshard(&params, &gathered).map_err(&fail)?;
            if keep {
                out.params = whole;
            }
        }
        None if keep => out.params = params,
        None => {}
    }
    Ok(out)
}

/// One sharded save, as every rank of a sharded run takes part in it.
struct ShardedSave<'a> {
    path: &'a std::path::Path,
    layout: &'a ShardLayout,
    model: &'a Model,
    cfg: &'a TrainConfig,
    rank: usize,
    /// Steps done.
    step: usize,
    /// This rank's parameters are not finite (what).
    non_finite: Option<&'a str>,
}

impl ShardedSave<'_> {
    /// Every rank writes its file; the ranks agree (one all-reduce) that all files are
    /// written and every value finite; rank 0 then writes the manifest. A second all-reduce
    /// before the files carries rank 0's id for this save, so the new files never replace the
    /// ones the current manifest names.
    fn run<B, C>(
        &self,
        comm: &mut C,
        backend: &B,
        params: &[Tensor],
        opt: &Optimizer,
    ) -> Result<u64, TrainError>
    where
        B: Backend,
        C: StepComm<Tensor = B::Tensor>,
    {
        let rank = self.rank;
        let fail = |message: String| TrainError::Rank { rank, message };
        let id = if rank == 0 { save_nonce() } else { 0 };
        let bad = f32::from(u8::from(self.non_finite.is_some()));
        let [bad_ranks, id] = all_reduce_sum(comm, backend, [bad, id as f32]).map_err(&fail)?;
        if bad_ranks > 0.0 {
            return Err(TrainError::Output(format!(
                "not saving the checkpoint after step {} to {}: {} rank(s) hold non-finite values{}; the checkpoint keeps what it held",
                self.step - 1,
                self.path.display(),
                bad_ranks,
                self.non_finite.map_or(String::new(), |w| format!(" (this one: {w})"))
            )));
        }
        let save_id = format!("step{:08}-{:06x}", self.step, id as u32);
        let written = RankSave {
            path: self.path,
            save_id: &save_id,
            rank,
            layout: self.layout,
            model: self.model,
            params,
            opt,
        }
        .write();
        let failed = f32::from(u8::from(written.is_err()));
        let bytes = written.as_ref().map_or(0, |b| *b);
        let [failed_ranks, _] = all_reduce_sum(comm, backend, [failed, 0.0]).map_err(&fail)?;
        if let Err(e) = written {
            return Err(TrainError::Output(format!("saving the checkpoint: {e}")));
        }
        if failed_ranks > 0.0 {
            return Err(TrainError::Output(format!(
                "saving the checkpoint: {failed_ranks} rank(s) could not write their shards; {} keeps what it held",
                self.path.display()
            )));
        }
        if rank == 0 {
            write_manifest(&ManifestInfo {
                path: self.path,
                save_id: &save_id,
                step: self.step,
                layout: self.layout,
                model: self.model,
                opt,
                sharding: sharding_of(self.cfg),
            })
            .map_err(|e| TrainError::Output(format!("saving the checkpoint: {e}")))?;
        }
        Ok(bytes)
    }
}

/// A save's id: differs from the previous save's (to the microsecond, in 24 bits: what an
/// f32 all-reduce carries exactly).
fn save_nonce() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    (t % (1 << 24)) as u32
}

/// The `sharding` option of the run's `fsdp` pass, for the manifest.
fn sharding_of(cfg: &TrainConfig) -> Option<String> {
    cfg.passes
        .as_deref()?
        .iter()
        .find(|s| s.name == "fsdp")?
        .options
        .iter()
        .find(|(k, _)| k == "sharding")
        .map(|(_, v)| v.clone())
}

/// The element-wise sum over the ranks of two numbers (one f32 all-reduce).
fn all_reduce_sum<B, C>(comm: &mut C, backend: &B, x: [f32; 2]) -> Result<[f32; 2], String>
where
    B: Backend,
    C: StepComm<Tensor = B::Tensor>,
{
    let t = backend
        .upload(&Tensor::from_f32(vec![2], x.to_vec()))
        .map_err(|e| format!("upload: {e}"))?;
    let h = comm
        .all_reduce_async(t, ReduceOp::Sum, "checkpoint")
        .map_err(|e| e.to_string())?;
    let (r, _) = comm.wait(h).map_err(|e| e.to_string())?;
    let v = backend
        .download(&r)
        .map_err(|e| format!("download: {e}"))?
        .to_f32_vec();
    match v.as_slice() {
        [a, b] => Ok([*a, *b]),
        _ => Err(format!("a checkpoint all-reduce gave {} values", v.len())),
    }
}

/// Every bucket's padded whole from the ranks' `shards` (one all-gather each, in order).
fn gather_wholes<B, C>(
    comm: &mut C,
    backend: &B,
    shards: &[Tensor],
    label: &str,
) -> Result<Vec<Tensor>, String>
where
    B: Backend,
    C: StepComm<Tensor = B::Tensor>,
{
    let mut out = Vec::with_capacity(shards.len());
    for s in shards {
        let t = backend.upload(s).map_err(|e| format!("upload: {e}"))?;
        let h = comm.all_gather_async(t, label).map_err(|e| e.to_string())?;
        let (w, _) = comm.wait(h).map_err(|e| e.to_string())?;
        out.push(backend.download(&w).map_err(|e| format!("download: {e}"))?);
    }
    Ok(out)
}

/// Whole gradients (one per parameter, as an unsharded run has them: a tie's at its
/// primary) from a sharded run's local ones.
fn whole_grads<B, C>(
    comm: &mut C,
    backend: &B,
    l: &ShardLayout,
    grads: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>, String>
where
    B: Backend,
    C: StepComm<Tensor = B::Tensor>,
{
    let n = l.place.len();
    let shards: Vec<Tensor> = l
        .buckets
        .iter()
        .enumerate()
        .map(|(bi, b)| match grads.get(n + bi).cloned().flatten() {
            Some(g) => Ok(g),
            None => Tensor::zeros(vec![b.shard_numel(l.world_size)], b.dtype)
                .ok_or_else(|| format!("bucket {}: no {} tensors", b.name, b.dtype)),
        })
        .collect::<Result<_, String>>()?;
    let gathered = gather_wholes(comm, backend, &shards, "grads")?;
    let local: Vec<Tensor> = (0..n)
        .map(|j| {
            grads[j]
                .clone()
                .unwrap_or_else(|| Tensor::from_f32(vec![0], Vec::new()))
        })
        .collect();
    let whole = l.unshard(&local, &gathered)?;
    Ok(whole
        .into_iter()
        .enumerate()
        .map(|(j, g)| match l.place[j] {
            None => grads[j].as_ref().map(|_| g),
            Some((bi, _)) => {
                let b = &l.buckets[bi];
                (b.grad_output.is_some() && b.members.iter().any(|m| m.0 == j)).then_some(g)
            }
        })
        .collect())
}

/// The whole parameters and an optimizer over them (state gathered from the shards) for a
/// checkpoint of a sharded run, which loads at any world size and into an unsharded run.
fn whole_state<B, C>(
    comm: &mut C,
    backend: &B,
    l: &ShardLayout,
    model: &Model,
    cfg: &TrainConfig,
    params: &[Tensor],
    opt: &Optimizer,
) -> Result<(Vec<Tensor>, Optimizer), String>
where
    B: Backend,
    C: StepComm<Tensor = B::Tensor>,
{
    let n = l.place.len();
    let gathered = gather_wholes(comm, backend, &params[n..], "checkpoint")?;
    let whole = l.unshard(params, &gathered)?;
    let (step, m, v) = opt.state();
    let mut moments = Vec::with_capacity(2);
    for local in [m, v] {
        let shards: Vec<Tensor> = local[n..]
            .iter()
            .map(|x| Tensor::from_f32(vec![x.len()], x.clone()))
            .collect();
        let gathered: Vec<Vec<f32>> = gather_wholes(comm, backend, &shards, "checkpoint")?
            .iter()
            .map(Tensor::to_f32_vec)
            .collect();
        moments.push(l.unshard_moments(local, &gathered));
    }
    let v_whole = moments.pop().unwrap_or_default();
    let m_whole = moments.pop().unwrap_or_default();
    let mut full = Optimizer::new(cfg.optimizer, &whole).without_state_for(&model.unused_mask());
    full.restore(step, m_whole, v_whole)?;
    Ok((whole, full))
}
