//! Runs a compiled plan on one rank: kernels on the backend, collectives on the communicator,
//! each value dropped after its last use, timings recorded as it goes.

use crate::comm::{CommError, Communicator};
use crate::exec::backend::{Backend, Input, Outputs, RngKey};
use crate::exec::metrics::{BucketRecord, Clock, Event, Recording, Span};
use crate::exec::plan::{InstrKind, Plan};
use smallvec::SmallVec;
use std::time::Instant;
use tracepass_ir::Type;

/// A runtime value.
#[derive(Clone, Debug, Default)]
pub enum RValue<T> {
    /// Not computed yet, or already freed.
    #[default]
    Empty,
    None,
    Tensor(T),
    Scalar(f64),
    Seq(Vec<RValue<T>>),
    /// An all-reduce in flight (its handle is kept by the executor).
    Future,
}

impl<T> RValue<T> {
    pub fn tensor(self) -> Option<T> {
        match self {
            RValue::Tensor(t) => Some(t),
            _ => None,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            RValue::Empty => "nothing",
            RValue::None => "None",
            RValue::Tensor(_) => "a tensor",
            RValue::Scalar(_) => "a number",
            RValue::Seq(_) => "a collection",
            RValue::Future => "a future",
        }
    }
}

/// Why a run stopped. Each names the rank, the trace and what failed there.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    #[error("rank {rank}: trace `{trace}`: `{line}`: {message}")]
    Node {
        rank: usize,
        trace: String,
        line: String,
        message: String,
    },
    #[error("rank {rank}: trace `{trace}`: `{line}`: {error}")]
    Comm {
        rank: usize,
        trace: String,
        line: String,
        error: Box<CommError>,
    },
    #[error("rank {rank}: trace `{trace}`: argument `{name}`: {message}")]
    Input {
        rank: usize,
        trace: String,
        name: String,
        message: String,
    },
}

impl ExecError {
    /// The communication error underneath, if this is one.
    pub fn comm_error(&self) -> Option<&CommError> {
        match self {
            ExecError::Comm { error, .. } => Some(&**error),
            _ => None,
        }
    }
}

/// Per-rank executor state (slot tables reused across runs).
pub struct Executor<B: Backend, C: Communicator<Tensor = B::Tensor>> {
    slots: Vec<RValue<B::Tensor>>,
    futures: Vec<Option<C::Handle>>,
    pack_started: Vec<f64>,
    buckets: Vec<Option<BucketRecord>>,
    /// The random stream of this run (seed, rank, step); each random node draws from it with
    /// its order among the trace's random nodes as the node key.
    rng: Option<RngKey>,
    /// Whether runs add up the live bytes of the buffers they write (tests).
    measure: bool,
    live_peak: u64,
    /// Measured runs: the buffers handed to collectives not yet waited on (by future slot).
    in_flight: Vec<(usize, usize, u64)>,
    /// Emptied lists of values (argument lists, unpacked collections, result lists), kept
    /// for the next ones: a steady step allocates no list.
    lists: Vec<Vec<RValue<B::Tensor>>>,
    /// An unpacked bucket's views, before they go to their slots.
    views: Vec<B::Tensor>,
    /// A bucket's members as they are packed (kept empty between packs: see [`relabel`]).
    members: Vec<&'static B::Tensor>,
}

impl<B: Backend, C: Communicator<Tensor = B::Tensor>> Default for Executor<B, C> {
    fn default() -> Self {
        Executor {
            slots: Vec::new(),
            futures: Vec::new(),
            pack_started: Vec::new(),
            buckets: Vec::new(),
            rng: None,
            measure: false,
            live_peak: 0,
            in_flight: Vec::new(),
            lists: Vec::new(),
            views: Vec::new(),
            members: Vec::new(),
        }
    }
}

/// Lists kept for reuse, at most: more are dropped (a run that unpacks many collections
/// at once keeps no more than this many).
const KEPT_LISTS: usize = 64;

/// An empty list's allocation under another element type of the same size (a list of
/// references kept from one use to the next, each with its own lifetime). Collecting a
/// `Vec`'s iterator into a `Vec` of a same-sized type reuses its buffer.
pub(crate) fn relabel<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the list is empty"))
        .collect()
}

fn check_input<B: Backend>(backend: &B, ty: &Type, v: &RValue<B::Tensor>) -> Result<(), String> {
    match (ty, v) {
        (Type::Tensor(tt), RValue::Tensor(t)) => {
            let (shape, dtype) = (backend.shape(t), backend.dtype(t));
            if shape != tt.shape.as_slice() || dtype != tt.dtype {
                return Err(format!(
                    "the trace expects {} {:?} but was given {} {:?}",
                    tt.dtype, tt.shape, dtype, shape
                ));
            }
            Ok(())
        }
        (Type::Tensor(tt), other) => Err(format!(
            "the trace expects a {} {:?} tensor but was given {}",
            tt.dtype,
            tt.shape,
            other.kind()
        )),
        (Type::Collection, RValue::Seq(_)) => Ok(()),
        (Type::Collection, other) => Err(format!(
            "the trace expects a collection but was given {}",
            other.kind()
        )),
        (Type::Int(_) | Type::Float(_) | Type::Bool(_), RValue::Scalar(_)) => Ok(()),
        (Type::Int(_) | Type::Float(_) | Type::Bool(_), other) => Err(format!(
            "the trace expects a number but was given {}",
            other.kind()
        )),
        _ => Ok(()),
    }
}

impl<B: Backend, C: Communicator<Tensor = B::Tensor>> Executor<B, C> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys the random nodes of the next runs (dropout's `uniform`) by (seed, rank, step) and
    /// each node's order among the trace's random nodes:
    /// without a key they are an error, never an unseeded draw.
    pub fn set_rng(&mut self, seed: u64, rank: usize, step: usize) {
        self.rng = Some(RngKey {
            seed,
            rank: rank as u64,
            step: step as u64,
            node: 0,
        });
    }

    /// From now on, each run measures the largest sum of the bytes of the distinct buffers
    /// it wrote that its slots hold after an instruction (its frees not yet done): what the
    /// memory plan predicts as [`crate::exec::MemoryPlan::live_peak_bytes`]. Slow: for tests.
    pub fn measure_live_bytes(&mut self) {
        self.measure = true;
    }

    /// The last run's measured peak ([`Executor::measure_live_bytes`]); 0 when not measured.
    pub fn live_peak_bytes(&self) -> u64 {
        self.live_peak
    }

    /// Bytes of the distinct buffers in planned slots, other than `given`'s.
    fn live_bytes(&self, plan: &Plan, backend: &B, given: &[usize]) -> u64 {
        let mut seen: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for &(_, id, b) in &self.in_flight {
            if !given.contains(&id) && !seen.contains(&id) {
                seen.push(id);
                bytes += b;
            }
        }
        for (s, v) in self.slots.iter().enumerate() {
            let RValue::Tensor(t) = v else { continue };
            if plan.memory.buffer_of.get(s).copied().flatten().is_none() {
                continue;
            }
            if let Some((id, b)) = backend.buffer_of(t) {
                if !given.contains(&id) && !seen.contains(&id) {
                    seen.push(id);
                    bytes += b;
                }
            }
        }
        bytes
    }

    /// An empty list of values for a run's arguments or a collection among them: one this
    /// executor was given back ([`Executor::recycle`]) when it has one, so that a steady step
    /// allocates none.
    /// The kept list that best fits `n` values is taken: the smallest with room for them,
    /// else the largest, so that lists settle to the sizes their uses need and stop growing.
    pub(crate) fn list(&mut self, n: usize) -> Vec<RValue<B::Tensor>> {
        let cap = |i: &usize| self.lists[*i].capacity();
        let fits = (0..self.lists.len())
            .filter(|i| cap(i) >= n)
            .min_by_key(cap)
            .or_else(|| (0..self.lists.len()).max_by_key(cap));
        let mut v = fits.map_or_else(Vec::new, |i| self.lists.swap_remove(i));
        v.reserve(n);
        v
    }

    /// Hands back a value a caller is done with: its tensors to the backend's pool, its lists
    /// (emptied) to this executor for [`Executor::list`] and the next run's results.
    fn recycle(&mut self, backend: &B, v: RValue<B::Tensor>) {
        match v {
            RValue::Tensor(t) => backend.recycle(t),
            RValue::Seq(items) => self.recycle_list(backend, items),
            _ => {}
        }
    }

    /// [`Executor::recycle`] for a list of values (a run's results).
    pub(crate) fn recycle_list(&mut self, backend: &B, mut items: Vec<RValue<B::Tensor>>) {
        for v in items.drain(..) {
            self.recycle(backend, v);
        }
        self.keep_list(items);
    }

    /// Keeps an emptied list for [`Executor::list`] (a list the caller drained).
    pub(crate) fn keep_list(&mut self, mut v: Vec<RValue<B::Tensor>>) {
        if v.capacity() > 0 && self.lists.len() < KEPT_LISTS {
            v.clear();
            self.lists.push(v);
        }
    }

    /// Runs `plan` once with `inputs` (one per trace argument); returns the plan's results.
    pub fn run(
        &mut self,
        plan: &Plan,
        backend: &B,
        comm: &mut C,
        inputs: Vec<RValue<B::Tensor>>,
        clock: &Clock,
        rec: &mut Recording,
    ) -> Result<Vec<RValue<B::Tensor>>, ExecError> {
        let rank = comm.rank();
        let r = self.run_inner(plan, backend, comm, inputs, clock, rec);
        // drop everything this run held, whatever happened
        self.slots.iter_mut().for_each(|s| *s = RValue::Empty);
        self.futures.iter_mut().for_each(|f| *f = None);
        r.map_err(|e| match e {
            Failure::Node(i, message) => ExecError::Node {
                rank,
                trace: plan.trace_name.clone(),
                line: plan.instrs[i].line.clone(),
                message,
            },
            Failure::Comm(i, error) => ExecError::Comm {
                rank,
                trace: plan.trace_name.clone(),
                line: plan.instrs[i].line.clone(),
                error: Box::new(error),
            },
            Failure::Input(name, message) => ExecError::Input {
                rank,
                trace: plan.trace_name.clone(),
                name,
                message,
            },
        })
    }

    fn run_inner(
        &mut self,
        plan: &Plan,
        backend: &B,
        comm: &mut C,
        inputs: Vec<RValue<B::Tensor>>,
        clock: &Clock,
        rec: &mut Recording,
    ) -> Result<Vec<RValue<B::Tensor>>, Failure> {
        if inputs.len() != plan.args.len() {
            return Err(Failure::Input(
                plan.args
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                format!(
                    "the trace takes {} arguments but was given {}",
                    plan.args.len(),
                    inputs.len()
                ),
            ));
        }
        self.slots.resize_with(plan.slots, Default::default);
        self.futures.resize_with(plan.slots, || None);
        self.pack_started.clear();
        self.pack_started.resize(plan.slots, 0.0);
        self.buckets.clear();
        self.buckets.resize(plan.collectives.len(), None);
        backend.prepare_memory(&plan.memory);
        rec.compute.reserve(plan.instrs.len());
        let mut inputs = inputs;
        for (spec, v) in plan.args.iter().zip(inputs.drain(..)) {
            check_input(backend, &spec.ty, &v).map_err(|m| Failure::Input(spec.name.clone(), m))?;
            self.slots[spec.slot] = v;
        }
        self.keep_list(inputs);
        // the buffers the caller gave (measured runs only)
        let mut given: Vec<usize> = Vec::new();
        // and the values themselves, held so that no buffer written later reuses an address
        let mut held: Vec<RValue<B::Tensor>> = Vec::new();
        self.live_peak = 0;
        self.in_flight.clear();
        if self.measure {
            fn ids<B: Backend>(b: &B, v: &RValue<B::Tensor>, out: &mut Vec<usize>) {
                match v {
                    RValue::Tensor(t) => out.extend(b.buffer_of(t).map(|x| x.0)),
                    RValue::Seq(items) => items.iter().for_each(|v| ids(b, v, out)),
                    _ => {}
                }
            }
            for spec in &plan.args {
                ids(backend, &self.slots[spec.slot], &mut given);
                held.push(self.slots[spec.slot].clone());
            }
        }
        // random nodes are keyed by their order among the trace's random nodes, not by their
        // position: a pass that adds other nodes (fsdp's gathers) leaves the draws as they were
        let mut draws = 0u64;
        for (i, ins) in plan.instrs.iter().enumerate() {
            let t0 = Instant::now();
            let mut computed = true;
            match &ins.kind {
                InstrKind::Compute(k) => {
                    let out = {
                        // on the stack: a step allocates nothing for its operand lists
                        let mut args: SmallVec<[Input<'_, B::Tensor>; 8]> = SmallVec::new();
                        for &s in &ins.inputs {
                            args.push(match &self.slots[s] {
                                RValue::Tensor(t) => Input::Tensor(t),
                                RValue::Scalar(x) => Input::Scalar(*x),
                                other => {
                                    return Err(Failure::Node(
                                        i,
                                        format!(
                                            "operand `{}` is {}",
                                            plan.slot_names[s],
                                            other.kind()
                                        ),
                                    ))
                                }
                            });
                        }
                        if k.is_random() {
                            let key = self.rng.ok_or_else(|| {
                                Failure::Node(
                                    i,
                                    "a random node needs a stream keyed by (seed, rank, step); this run has none".into(),
                                )
                            })?;
                            draws += 1;
                            let draws = draws - 1;
                            Produced::One(
                                backend
                                    .random(k, RngKey { node: draws, ..key })
                                    .map_err(|e| Failure::Node(i, e.0))?,
                            )
                        } else if k.outputs() > 1 {
                            Produced::Many(
                                backend
                                    .run_multi(k, &args)
                                    .map_err(|e| Failure::Node(i, e.0))?,
                            )
                        } else {
                            Produced::One(backend.run(k, &args).map_err(|e| Failure::Node(i, e.0))?)
                        }
                    };
                    match out {
                        Produced::One(t) => self.slots[ins.outputs[0]] = RValue::Tensor(t),
                        Produced::Many(outs) => {
                            if outs.len() != ins.outputs.len() {
                                return Err(Failure::Node(
                                    i,
                                    format!(
                                        "the kernel gave {} tensors for {} outputs",
                                        outs.len(),
                                        ins.outputs.len()
                                    ),
                                ));
                            }
                            for (&o, t) in ins.outputs.iter().zip(outs) {
                                self.slots[o] = RValue::Tensor(t);
                            }
                        }
                    }
                }
                InstrKind::Region(region) => {
                    // on the stack for a usual region (no heap allocation per call)
                    let mut args: smallvec::SmallVec<[Input<'_, B::Tensor>; 8]> =
                        smallvec::SmallVec::with_capacity(ins.inputs.len());
                    for &s in &ins.inputs {
                        args.push(match &self.slots[s] {
                            RValue::Tensor(t) => Input::Tensor(t),
                            RValue::Scalar(x) => Input::Scalar(*x),
                            other => {
                                return Err(Failure::Node(
                                    i,
                                    format!("operand `{}` is {}", plan.slot_names[s], other.kind()),
                                ))
                            }
                        });
                    }
                    let out = backend
                        .run_region(region, &args)
                        .map_err(|e| Failure::Node(i, e.0))?;
                    drop(args);
                    self.slots[ins.outputs[0]] = RValue::Tensor(out);
                }
                InstrKind::UnpackSequence => {
                    let src = ins
                        .inputs
                        .first()
                        .map(|&s| std::mem::take(&mut self.slots[s]));
                    let items = match src {
                        Some(RValue::Seq(items)) => items,
                        Some(other) => {
                            return Err(Failure::Node(i, format!("cannot unpack {}", other.kind())))
                        }
                        None => return Err(Failure::Node(i, "nothing to unpack".into())),
                    };
                    if items.len() != ins.outputs.len() {
                        return Err(Failure::Node(
                            i,
                            format!(
                                "the collection holds {} items but {} names unpack it",
                                items.len(),
                                ins.outputs.len()
                            ),
                        ));
                    }
                    let mut items = items;
                    for (&o, v) in ins.outputs.iter().zip(items.drain(..)) {
                        self.slots[o] = v;
                    }
                    self.keep_list(items);
                    // the collection was moved out; put an empty one back for later readers
                    if let Some(&s) = ins.inputs.first() {
                        self.slots[s] = RValue::Seq(Vec::new());
                    }
                    computed = false;
                }
                InstrKind::Nop => computed = false,
                InstrKind::Item => {
                    let value = match ins.inputs.first().map(|&s| &self.slots[s]) {
                        Some(RValue::Tensor(t)) => {
                            let host = backend.download(t).map_err(|e| Failure::Node(i, e.0))?;
                            match host.to_f64_vec().as_slice() {
                                [x] => *x,
                                _ => {
                                    return Err(Failure::Node(
                                        i,
                                        format!(
                                            "item of a tensor of shape {:?}: one element is needed",
                                            host.shape()
                                        ),
                                    ))
                                }
                            }
                        }
                        Some(other) => {
                            return Err(Failure::Node(i, format!("item of {}", other.kind())))
                        }
                        None => return Err(Failure::Node(i, "item of nothing".into())),
                    };
                    self.slots[ins.outputs[0]] = RValue::Scalar(value);
                }
                InstrKind::Alias => {
                    for (&o, &s) in ins.outputs.iter().zip(&ins.inputs) {
                        self.slots[o] = self.slots[s].clone();
                    }
                    computed = false;
                }
                InstrKind::Pack { divisors } => {
                    self.pack_started[ins.outputs[0]] = clock.us(t0);
                    let out = {
                        let mut members: Vec<&B::Tensor> =
                            relabel(std::mem::take(&mut self.members));
                        for &s in &ins.inputs {
                            match &self.slots[s] {
                                RValue::Tensor(t) => members.push(t),
                                other => {
                                    return Err(Failure::Node(
                                        i,
                                        format!(
                                            "bucket member `{}` is {}",
                                            plan.slot_names[s],
                                            other.kind()
                                        ),
                                    ))
                                }
                            }
                        }
                        let packed = backend.pack_divided(&members, divisors);
                        self.members = relabel(members);
                        packed.map_err(|e| Failure::Node(i, e.0))?
                    };
                    self.slots[ins.outputs[0]] = RValue::Tensor(out);
                }
                InstrKind::AllReduce { bucket, .. }
                | InstrKind::AllGather { bucket }
                | InstrKind::ReduceScatter { bucket, .. } => {
                    let s = ins.inputs[0];
                    // an all-reduce runs in place on its buffer; the sharded ones read theirs
                    // (a shard argument or a bucket other nodes may still read)
                    let buf = match &ins.kind {
                        InstrKind::AllReduce { .. } => std::mem::take(&mut self.slots[s]),
                        _ => self.slots[s].clone(),
                    };
                    let buf = match buf {
                        RValue::Tensor(t) => t,
                        other => {
                            return Err(Failure::Node(
                                i,
                                format!("cannot communicate {}", other.kind()),
                            ))
                        }
                    };
                    if self.measure {
                        if let Some((id, b)) = backend.buffer_of(&buf) {
                            self.in_flight.push((ins.outputs[0], id, b));
                        }
                    }
                    let bytes = backend.shape(&buf).iter().product::<usize>()
                        * backend.dtype(&buf).size_bytes();
                    let launch = clock.us(t0);
                    let ready = if self.pack_started[s] > 0.0 {
                        self.pack_started[s]
                    } else {
                        launch
                    };
                    let info = &plan.collectives[*bucket];
                    let h = match &ins.kind {
                        InstrKind::AllGather { .. } => comm.all_gather_async(buf, &info.label),
                        InstrKind::ReduceScatter { op, .. } => {
                            comm.reduce_scatter_async(buf, *op, &info.label)
                        }
                        _ => comm.all_reduce_async(buf, info.op, &info.label),
                    }
                    .map_err(|e| Failure::Comm(i, e))?;
                    self.futures[ins.outputs[0]] = Some(h);
                    self.slots[ins.outputs[0]] = RValue::Future;
                    self.buckets[*bucket] = Some(BucketRecord {
                        label: info.label.clone(),
                        bytes,
                        ready_us: ready,
                        launch_us: launch,
                        comm_start_us: 0.0,
                        comm_end_us: 0.0,
                        wait_start_us: 0.0,
                        wait_end_us: 0.0,
                    });
                    computed = false;
                }
                InstrKind::Wait { bucket } => {
                    let f = ins.inputs[0];
                    let h = self.futures[f].take().ok_or_else(|| {
                        Failure::Node(i, format!("`{}` was already waited on", plan.slot_names[f]))
                    })?;
                    self.in_flight.retain(|x| x.0 != f);
                    let wait_start = clock.us(t0);
                    let (t, timing) = comm.wait(h).map_err(|e| Failure::Comm(i, e))?;
                    let wait_end = clock.us(Instant::now());
                    if let Some(b) = self.buckets[*bucket].as_mut() {
                        b.comm_start_us = clock.us(timing.started);
                        b.comm_end_us = clock.us(timing.finished);
                        b.wait_start_us = wait_start;
                        b.wait_end_us = wait_end;
                        if clock.events {
                            let kind = plan.collectives[*bucket].kind.name();
                            rec.events.push(Event {
                                name: format!("{kind} {}", b.label),
                                comm: true,
                                span: Span {
                                    start_us: b.comm_start_us,
                                    end_us: b.comm_end_us,
                                },
                            });
                            rec.events.push(Event {
                                name: format!("wait {}", b.label),
                                comm: false,
                                span: Span {
                                    start_us: wait_start,
                                    end_us: wait_end,
                                },
                            });
                        }
                    }
                    self.slots[ins.outputs[0]] = RValue::Tensor(t);
                    computed = false;
                }
                InstrKind::Unpack { offsets, shapes } => {
                    let mut views = std::mem::take(&mut self.views);
                    views.clear();
                    match &self.slots[ins.inputs[0]] {
                        RValue::Tensor(t) => backend
                            .unpack(t, offsets, shapes, &mut views)
                            .map_err(|e| Failure::Node(i, e.0))?,
                        other => {
                            return Err(Failure::Node(i, format!("cannot unpack {}", other.kind())))
                        }
                    };
                    for (&o, v) in ins.outputs.iter().zip(views.drain(..)) {
                        self.slots[o] = RValue::Tensor(v);
                    }
                    self.views = views;
                }
            }
            if self.measure {
                self.live_peak = self.live_peak.max(self.live_bytes(plan, backend, &given));
            }
            for &s in &ins.free {
                let v = std::mem::take(&mut self.slots[s]);
                self.recycle(backend, v);
            }
            if computed {
                let span = Span {
                    start_us: clock.us(t0),
                    end_us: clock.us(Instant::now()),
                };
                rec.compute.push(span);
                if clock.events {
                    let name = ins
                        .line
                        .split_once(" = ")
                        .map_or(ins.line.as_str(), |(_, r)| r);
                    let name = name.split('(').next().unwrap_or(name);
                    rec.events.push(Event {
                        name: name.to_string(),
                        comm: false,
                        span,
                    });
                }
            }
        }
        if let Some(s) = self.futures.iter().position(Option::is_some) {
            return Err(Failure::Input(
                plan.slot_names[s].clone(),
                "an all-reduce was started but never waited on".into(),
            ));
        }
        rec.buckets.extend(self.buckets.drain(..).flatten());
        let mut results = self.list(plan.results.len());
        results.extend(plan.results.iter().map(|r| match r {
            Some(s) => self.slots[*s].clone(),
            None => RValue::None,
        }));
        // every slot lets go now, not when a later run overwrites it: a reference left here
        // (to a result, or to a bucket its gradients view) keeps that buffer from the pool
        for s in 0..self.slots.len() {
            let v = std::mem::take(&mut self.slots[s]);
            self.recycle(backend, v);
        }
        Ok(results)
    }
}

enum Failure {
    Node(usize, String),
    Comm(usize, CommError),
    Input(String, String),
}

/// What a compute instruction gave: one tensor, or one per output of a multi-output kernel.
enum Produced<T> {
    One(T),
    Many(Outputs<T>),
}
