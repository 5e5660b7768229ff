//! Ranks as threads of one process. Each rank has a communication worker thread, so an
//! all-reduce runs while the rank computes. The reduction adds the ranks' buffers in rank order
//! (0, 1, 2, ...) for every element, so every rank gets the same bits, whatever the bucketing.
//! A reduce-scatter is that all-reduce with each rank keeping its own slice (the same bits as
//! the all-reduce); an all-gather concatenates the ranks' buffers in rank order.

use crate::comm::reduction::Reduction;
use crate::comm::{CommError, CommTiming, Communicator, LinkModel, ReduceOp};
use crate::tensor::Tensor;
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Settings shared by a group's ranks.
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// How long a rank waits for the others at a collective before it gives up.
    pub timeout: Duration,
    /// Simulated network; `None` completes a collective as soon as the data is reduced.
    pub link: Option<LinkModel>,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(60),
            link: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
    Broadcast(usize),
    Barrier,
}

/// What one rank brought to a collective; all ranks must bring the same description.
#[derive(Clone, Debug, PartialEq)]
struct Signature {
    kind: Kind,
    dtype: Option<tracepass_ir::DType>,
    numel: usize,
    /// Shared, not copied: a rank interns its labels ([`ThreadComm::label`]).
    label: Arc<str>,
}

impl Signature {
    fn describe(&self) -> String {
        match self.kind {
            Kind::Barrier => "barrier".into(),
            Kind::Broadcast(r) => format!(
                "broadcast from {r} of {} {:?} ({})",
                self.numel, self.dtype, self.label
            ),
            Kind::AllReduce(op) => format!(
                "all_reduce {op:?} of {} x {} ({})",
                self.numel,
                self.dtype.map_or("?".into(), |d| d.to_string()),
                self.label
            ),
            Kind::AllGather => format!(
                "all_gather of {} x {} ({})",
                self.numel,
                self.dtype.map_or("?".into(), |d| d.to_string()),
                self.label
            ),
            Kind::ReduceScatter(op) => format!(
                "reduce_scatter {op:?} of {} x {} ({})",
                self.numel,
                self.dtype.map_or("?".into(), |d| d.to_string()),
                self.label
            ),
        }
    }
}

struct Slot {
    signature: Signature,
    first_rank: usize,
    /// Each rank's buffer as it arrives; after an all-reduce or a reduce-scatter, each rank's
    /// result (its own buffer, holding the reduced elements) until it takes it.
    contribs: Vec<Option<Tensor>>,
    arrived: usize,
    /// All-reduce: once all arrived, the reduction in which each rank's worker reduces its
    /// own chunk.
    reduction: Option<Arc<Reduction>>,
    chunk_done: Vec<bool>,
    /// The result every rank takes a copy of (all-gather, broadcast, barrier).
    result: Option<Tensor>,
    /// The results are there to take.
    finished: bool,
    /// When the last rank arrived (the transfer's start).
    ready_at: Option<Instant>,
    taken: usize,
}

impl Slot {
    /// A slot for collective `sig` first reached by `rank`, in the lists of `spare` (a slot
    /// done with) when there is one: a steady step's collectives allocate no slot.
    fn new(spare: Option<Slot>, sig: &Signature, rank: usize, world: usize) -> Slot {
        // only its lists are worth keeping from a spare slot
        let (mut contribs, mut chunk_done) =
            spare.map_or_else(Default::default, |s| (s.contribs, s.chunk_done));
        contribs.clear();
        contribs.resize(world, None);
        chunk_done.clear();
        chunk_done.resize(world, false);
        Slot {
            signature: sig.clone(),
            first_rank: rank,
            contribs,
            arrived: 0,
            reduction: None,
            chunk_done,
            result: None,
            finished: false,
            ready_at: None,
            taken: 0,
        }
    }
}

#[derive(Default)]
struct State {
    slots: HashMap<u64, Slot>,
    failed: Option<(usize, String)>,
    /// Slots and reductions done with, kept for the next collectives.
    spare_slots: Vec<Slot>,
    spare_reductions: Vec<Arc<Reduction>>,
}

struct Shared {
    world: usize,
    options: CommOptions,
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock leaves consistent data (every update is
        // completed before unlocking), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self, rank: usize, reason: String) {
        self.record_failure(self.lock(), rank, reason);
    }

    /// Records `reason` as the group's failure unless one is recorded already, then wakes every
    /// waiting rank so it sees it.
    fn record_failure(&self, mut st: MutexGuard<'_, State>, rank: usize, reason: String) {
        if st.failed.is_none() {
            st.failed = Some((rank, reason));
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Deposits this rank's part of collective `seq` and blocks until the result is ready;
    /// returns it and when the last rank arrived (the transfer's start). An all-reduce is
    /// reduced in `world` chunks, one by each rank's worker (as in a ring's reduce-scatter), so
    /// no rank carries all the reduction work.
    fn collective(
        &self,
        rank: usize,
        seq: u64,
        sig: Signature,
        data: Option<Tensor>,
    ) -> Result<(Delivery, Instant), CommError> {
        let world = self.world;
        let deadline = after(Instant::now(), self.options.timeout);
        let mut st = self.lock();
        if let Some((failed, reason)) = &st.failed {
            return Err(CommError::PeerFailed {
                rank,
                failed: *failed,
                reason: reason.clone(),
            });
        }
        if !st.slots.contains_key(&seq) {
            let spare = st.spare_slots.pop();
            st.slots.insert(seq, Slot::new(spare, &sig, rank, world));
        }
        let State {
            slots,
            spare_reductions,
            ..
        } = &mut *st;
        let Some(slot) = slots.get_mut(&seq) else {
            return Err(CommError::Invalid {
                rank,
                message: format!("collective #{seq}: its slot is gone"),
            });
        };
        if slot.signature != sig {
            let err = CommError::Mismatch {
                seq,
                a: slot.first_rank,
                what_a: slot.signature.describe(),
                b: rank,
                what_b: sig.describe(),
            };
            self.record_failure(st, rank, err.to_string());
            return Err(err);
        }
        slot.contribs[rank] = data;
        slot.arrived += 1;
        if slot.arrived == world {
            slot.ready_at = Some(Instant::now());
            let prepared = match sig.kind {
                Kind::AllReduce(op) | Kind::ReduceScatter(op) => {
                    check_parts(&slot.contribs).map(|()| {
                        let mut r = spare_reductions.pop().unwrap_or_default();
                        let parts = slot.contribs.iter_mut().filter_map(Option::take);
                        // an all-reduce's ranks each get the result in their own buffer; a
                        // reduce-scatter's each get their own slice of it in theirs
                        let everyone = matches!(sig.kind, Kind::AllReduce(_));
                        match Arc::get_mut(&mut r) {
                            Some(r) => r.start(op, parts, world, everyone),
                            None => {
                                let mut fresh = Reduction::default();
                                fresh.start(op, parts, world, everyone);
                                r = Arc::new(fresh);
                            }
                        }
                        slot.reduction = Some(r);
                    })
                }
                // each rank concatenates the parts into a buffer of its own when it waits
                Kind::AllGather => check_parts(&slot.contribs).map(|()| {
                    slot.finished = true;
                }),
                kind => pick(&kind, &mut slot.contribs).map(|r| {
                    slot.result = Some(r);
                    slot.finished = true;
                }),
            };
            if let Err(message) = prepared {
                let msg = format!(
                    "collective #{seq} ({}): {message} (seen on rank {rank})",
                    sig.label
                );
                self.record_failure(st, rank, msg.clone());
                return Err(CommError::Invalid { rank, message: msg });
            }
            self.cv.notify_all();
        }
        let mut reduced_mine = false;
        loop {
            if let Some(slot) = st.slots.get_mut(&seq) {
                if slot.finished {
                    let r = match sig.kind {
                        Kind::AllReduce(_) => slot.contribs[rank].take().map(Delivery::Whole),
                        // this rank's own buffer, its slice holding the reduced elements
                        Kind::ReduceScatter(_) => slot.contribs[rank].take().map(|whole| {
                            let len = whole.numel() / world;
                            Delivery::Slice {
                                whole,
                                start: rank * len,
                                len,
                            }
                        }),
                        Kind::AllGather => slot
                            .contribs
                            .iter()
                            .cloned()
                            .collect::<Option<_>>()
                            .map(Delivery::Gather),
                        _ => slot.result.clone().map(Delivery::Whole),
                    }
                    .ok_or_else(|| CommError::Invalid {
                        rank,
                        message: format!(
                            "collective #{seq} ({}): no result for this rank",
                            sig.label
                        ),
                    })?;
                    let ready = slot.ready_at;
                    slot.taken += 1;
                    if slot.taken == world {
                        if let Some(mut done) = st.slots.remove(&seq) {
                            // a spare slot holds no tensor (an all-gather's parts, a result)
                            done.contribs.iter_mut().for_each(|c| *c = None);
                            done.result = None;
                            st.spare_slots.push(done);
                        }
                    }
                    drop(st);
                    let bytes = sig.numel * sig.dtype.map_or(4, |d| d.size_bytes());
                    let modelled = self.options.link.and_then(|link| match sig.kind {
                        Kind::AllReduce(_) => Some(link.all_reduce_time(bytes, world)),
                        // the time of the gathered whole
                        Kind::AllGather => Some(link.all_gather_time(bytes * world, world)),
                        Kind::ReduceScatter(_) => Some(link.reduce_scatter_time(bytes, world)),
                        _ => None,
                    });
                    if let (Some(time), Some(ready)) = (modelled, ready) {
                        let until = after(ready, time);
                        let now = Instant::now();
                        if until > now {
                            thread::sleep(until - now);
                        }
                    }
                    return Ok((r, ready.unwrap_or_else(Instant::now)));
                }
                if let (Some(reduction), false) = (slot.reduction.clone(), reduced_mine) {
                    // reduce this rank's chunk without holding the lock
                    drop(st);
                    reduction.reduce_chunk(rank);
                    drop(reduction);
                    reduced_mine = true;
                    st = self.lock();
                    let State {
                        slots,
                        spare_reductions,
                        ..
                    } = &mut *st;
                    if let Some(slot) = slots.get_mut(&seq) {
                        slot.chunk_done[rank] = true;
                        if slot.chunk_done.iter().all(|d| *d) {
                            // every worker let go of the reduction before marking its chunk
                            if let Some(mut r) = slot.reduction.take() {
                                if let Some(results) =
                                    Arc::get_mut(&mut r).and_then(Reduction::results)
                                {
                                    for (c, t) in slot.contribs.iter_mut().zip(results) {
                                        *c = Some(t);
                                    }
                                    slot.finished = true;
                                }
                                if slot.finished {
                                    spare_reductions.push(r);
                                } else {
                                    slot.reduction = Some(r);
                                }
                            }
                            self.cv.notify_all();
                        }
                    }
                    continue;
                }
            }
            if let Some((failed, reason)) = &st.failed {
                return Err(CommError::PeerFailed {
                    rank,
                    failed: *failed,
                    reason: reason.clone(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = st
                    .slots
                    .get(&seq)
                    .map(|s| {
                        if s.arrived < world {
                            (0..world)
                                .filter(|r| s.contribs[*r].is_none() && *r != rank)
                                .collect()
                        } else {
                            (0..world)
                                .filter(|r| !s.chunk_done[*r] && *r != rank)
                                .collect()
                        }
                    })
                    .unwrap_or_default();
                let err = CommError::Timeout {
                    rank,
                    seq,
                    label: sig.label.to_string(),
                    secs: self.options.timeout.as_secs_f64(),
                    missing,
                };
                self.record_failure(st, rank, err.to_string());
                return Err(err);
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// The broadcast root's tensor, or an empty one for a barrier.
/// `d` after `t`; a `d` too long for an `Instant` (a timeout of centuries) is as far off as one
/// can be, instead of a panic.
fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .or_else(|| t.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(t)
}

fn pick(kind: &Kind, contribs: &mut [Option<Tensor>]) -> Result<Tensor, String> {
    match kind {
        Kind::Broadcast(root) => contribs
            .get_mut(*root)
            .and_then(Option::take)
            .ok_or_else(|| format!("broadcast root {root} brought no tensor")),
        _ => Ok(Tensor::from_f32(vec![0], Vec::new())),
    }
}

/// Checks that every rank brought a buffer and that they agree in size and dtype.
fn check_parts(contribs: &[Option<Tensor>]) -> Result<(), String> {
    let mut first: Option<&Tensor> = None;
    for (r, c) in contribs.iter().enumerate() {
        let p = c
            .as_ref()
            .ok_or_else(|| format!("rank {r} brought no buffer"))?;
        match first {
            None => first = Some(p),
            Some(f) if p.numel() != f.numel() || p.dtype() != f.dtype() => {
                return Err(format!(
                    "rank {r} sent {} x {} but rank 0 sent {} x {}",
                    p.numel(),
                    p.dtype(),
                    f.numel(),
                    f.dtype()
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Collectives a rank may have queued to its worker before it waits for room.
const QUEUED: usize = 1024;

/// A group of `world_size` thread ranks; hand each rank thread its `comm(rank)`.
#[derive(Clone)]
pub struct ThreadGroup {
    shared: Arc<Shared>,
}

impl ThreadGroup {
    pub fn new(world_size: usize, options: CommOptions) -> ThreadGroup {
        ThreadGroup {
            shared: Arc::new(Shared {
                world: world_size.max(1),
                options,
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
            }),
        }
    }
    pub fn world_size(&self) -> usize {
        self.shared.world
    }
    /// The communicator of one rank, with its communication worker thread.
    pub fn comm(&self, rank: usize) -> ThreadComm {
        // a bounded queue is a ring allocated once (an unbounded one allocates a block every
        // few dozen collectives); a rank that runs this far ahead of its worker waits
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUED);
        let shared = self.shared.clone();
        let worker = thread::Builder::new()
            .name(format!("comm-{rank}"))
            .spawn(move || {
                for job in rx {
                    let started = Instant::now();
                    let r = shared.collective(rank, job.seq, job.sig, job.data);
                    let finished = Instant::now();
                    job.done.complete(r.map(|(t, all_arrived)| {
                        (
                            t,
                            CommTiming {
                                launched: job.launched,
                                // the transfer starts once every rank has arrived; waiting for
                                // slower ranks is load imbalance, not communication
                                started: started.max(all_arrived),
                                finished,
                            },
                        )
                    }));
                }
            })
            .ok();
        ThreadComm {
            rank,
            shared: self.shared.clone(),
            seq: 0,
            tx: Some(tx),
            worker,
            labels: HashSet::new(),
            // room for a queue's worth of completions waiting to be reused
            spare_done: Vec::with_capacity(QUEUED),
        }
    }
    /// The failure some rank reported, if any.
    pub fn failure(&self) -> Option<(usize, String)> {
        self.shared.lock().failed.clone()
    }
    /// Marks `rank` failed so the others stop waiting for it.
    pub fn abort(&self, rank: usize, reason: &str) {
        self.shared.fail(rank, reason.to_string());
    }
}

/// What a collective hands a rank's worker, made into the rank's result on the rank's own
/// thread (by [`Delivery::into_tensor`], when it waits), so that the buffers it fills come
/// from that thread's pool and go back to it.
// (one lives in each reused completion, moved once per collective: boxing the parts would
// allocate per all-gather, which a steady step must not)
#[allow(clippy::large_enum_variant)]
enum Delivery {
    /// The result as it is (an all-reduce's: the rank's own buffer).
    Whole(Tensor),
    /// Elements `start .. start + len` of the rank's own buffer (a reduce-scatter's).
    Slice {
        whole: Tensor,
        start: usize,
        len: usize,
    },
    /// Every rank's part, in rank order, to concatenate (an all-gather's).
    Gather(SmallVec<[Tensor; 8]>),
}

impl Delivery {
    /// The rank's result tensor. A slice or a gathered whole is copied into a buffer of this
    /// thread's pool; a reduce-scatter's whole buffer goes back to the pool after.
    fn into_tensor(self) -> Result<Tensor, String> {
        match self {
            Delivery::Whole(t) => Ok(t),
            Delivery::Slice { whole, start, len } => {
                let slice = whole
                    .flat_range(start, len)
                    .ok_or_else(|| format!("no elements {start}..{} in the buffer", start + len))?;
                if let Some(s) = whole.into_unshared_storage() {
                    crate::cpu::buffer_pool::give_storage(s);
                }
                Ok(slice)
            }
            Delivery::Gather(parts) => Tensor::cat_flat(&parts)
                .ok_or_else(|| "the ranks' buffers cannot be concatenated".to_string()),
        }
    }
}

type Outcome = Result<(Delivery, CommTiming), CommError>;

/// A one-shot result slot a rank waits on.
pub struct Completion {
    value: Mutex<Option<Outcome>>,
    cv: Condvar,
}

impl Completion {
    fn complete(&self, r: Outcome) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.cv.notify_all();
    }
}

struct Job {
    seq: u64,
    sig: Signature,
    data: Option<Tensor>,
    launched: Instant,
    done: Arc<Completion>,
}

/// A rank's end of a [`ThreadGroup`].
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    seq: u64,
    tx: Option<mpsc::SyncSender<Job>>,
    worker: Option<thread::JoinHandle<()>>,
    /// The labels this rank's collectives carried ([`ThreadComm::label`]).
    labels: HashSet<Arc<str>>,
    /// Completions of waited collectives, for the next ones.
    spare_done: Vec<Arc<Completion>>,
}

/// A collective in flight.
pub struct ThreadHandle {
    seq: u64,
    state: Pending,
}

enum Pending {
    /// Queued to the worker, which completes `done`.
    Queued {
        label: Arc<str>,
        done: Arc<Completion>,
    },
    /// A collective that needed no other rank (an all-reduce in a world of one): its result,
    /// with nothing queued or allocated.
    Ready(Tensor, CommTiming),
}

impl ThreadComm {
    /// Queues a collective; `like` (dtype and size) describes the buffer every rank must
    /// agree on.
    fn submit(
        &mut self,
        kind: Kind,
        like: Option<(tracepass_ir::DType, usize)>,
        data: Option<Tensor>,
        label: &str,
    ) -> Result<ThreadHandle, CommError> {
        let seq = self.seq;
        self.seq += 1;
        let label = self.label(label);
        let sig = Signature {
            kind,
            dtype: like.map(|(d, _)| d),
            numel: like.map_or(0, |(_, n)| n),
            label: label.clone(),
        };
        // a completion the worker is done with (it lets go just after completing one), or a
        // new one
        let done = match self
            .spare_done
            .iter()
            .position(|d| Arc::strong_count(d) == 1)
        {
            Some(i) => self.spare_done.swap_remove(i),
            None => Arc::new(Completion {
                value: Mutex::new(None),
                cv: Condvar::new(),
            }),
        };
        let job = Job {
            seq,
            sig,
            data,
            launched: Instant::now(),
            done: done.clone(),
        };
        self.tx
            .as_ref()
            .ok_or(CommError::WorkerGone { rank: self.rank })?
            .send(job)
            .map_err(|_| CommError::WorkerGone { rank: self.rank })?;
        Ok(ThreadHandle {
            seq,
            state: Pending::Queued { label, done },
        })
    }

    /// [`ThreadComm::submit`] of a collective over `t`, which the ranks agree on in dtype and
    /// size. A reduction writes every rank's buffer in place from a worker: a copy, if one is
    /// needed, is made here, from this thread's pool.
    fn submit_tensor(
        &mut self,
        kind: Kind,
        mut t: Tensor,
        label: &str,
    ) -> Result<ThreadHandle, CommError> {
        if matches!(kind, Kind::AllReduce(_) | Kind::ReduceScatter(_)) {
            t.make_writable();
        }
        let like = Some((t.dtype(), t.numel()));
        self.submit(kind, like, Some(t), label)
    }

    /// `label` as this rank's shared copy of it: a plan's collectives repeat their labels
    /// every step, and each is allocated once.
    fn label(&mut self, label: &str) -> Arc<str> {
        if let Some(l) = self.labels.get(label) {
            return l.clone();
        }
        let l: Arc<str> = label.into();
        self.labels.insert(l.clone());
        l
    }

    /// An all-reduce in a world of one: the rank's own buffer is the result (as the reduction
    /// of one part would give it, contiguous), at once.
    fn reduce_alone(&mut self, t: Tensor) -> Result<ThreadHandle, CommError> {
        if let Some((failed, reason)) = &self.shared.lock().failed {
            return Err(CommError::PeerFailed {
                rank: self.rank,
                failed: *failed,
                reason: reason.clone(),
            });
        }
        let seq = self.seq;
        self.seq += 1;
        let now = Instant::now();
        let timing = CommTiming {
            launched: now,
            started: now,
            finished: now,
        };
        Ok(ThreadHandle {
            seq,
            state: Pending::Ready(t.contiguous(), timing),
        })
    }

    fn block(&mut self, h: ThreadHandle) -> Result<(Tensor, CommTiming), CommError> {
        let (label, done) = match h.state {
            Pending::Ready(t, timing) => return Ok((t, timing)),
            Pending::Queued { label, done } => (label, done),
        };
        // The worker gives up after the timeout itself; the margin covers a simulated link.
        let deadline = after(
            Instant::now(),
            self.shared
                .options
                .timeout
                .saturating_mul(2)
                .saturating_add(Duration::from_secs(1)),
        );
        let mut v = done.value.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = v.take() {
                drop(v);
                self.spare_done.push(done);
                let (delivery, timing) = r?;
                return delivery
                    .into_tensor()
                    .map(|t| (t, timing))
                    .map_err(|message| CommError::Invalid {
                        rank: self.rank,
                        message: format!("collective #{} ({label}): {message}", h.seq),
                    });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    seq: h.seq,
                    label: label.to_string(),
                    secs: self.shared.options.timeout.as_secs_f64(),
                    missing: Vec::new(),
                });
            }
            v = done
                .cv
                .wait_timeout(v, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

impl Communicator for ThreadComm {
    type Tensor = Tensor;
    type Handle = ThreadHandle;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.world
    }
    fn all_reduce_async(
        &mut self,
        t: Tensor,
        op: ReduceOp,
        label: &str,
    ) -> Result<ThreadHandle, CommError> {
        if self.shared.world == 1 {
            return self.reduce_alone(t);
        }
        self.submit_tensor(Kind::AllReduce(op), t, label)
    }
    fn all_gather_async(&mut self, t: Tensor, label: &str) -> Result<ThreadHandle, CommError> {
        self.submit_tensor(Kind::AllGather, t, label)
    }
    fn reduce_scatter_async(
        &mut self,
        t: Tensor,
        op: ReduceOp,
        label: &str,
    ) -> Result<ThreadHandle, CommError> {
        let world = self.shared.world;
        if !t.numel().is_multiple_of(world) {
            return Err(CommError::Invalid {
                rank: self.rank,
                message: format!(
                    "reduce-scatter ({label}) of {} elements: not a multiple of the world size {world}",
                    t.numel()
                ),
            });
        }
        self.submit_tensor(Kind::ReduceScatter(op), t, label)
    }
    fn wait(&mut self, h: ThreadHandle) -> Result<(Tensor, CommTiming), CommError> {
        self.block(h)
    }
    fn broadcast(&mut self, t: Tensor, root: usize) -> Result<Tensor, CommError> {
        if root >= self.shared.world {
            return Err(CommError::Invalid {
                rank: self.rank,
                message: format!(
                    "broadcast root {root} is not a rank of a world of {}",
                    self.shared.world
                ),
            });
        }
        let data = if self.rank == root {
            Some(t.clone())
        } else {
            None
        };
        let h = self.submit(
            Kind::Broadcast(root),
            Some((t.dtype(), t.numel())),
            data,
            "broadcast",
        )?;
        let (r, _) = self.block(h)?;
        if r.shape() != t.shape() || r.dtype() != t.dtype() {
            return Err(CommError::Invalid {
                rank: self.rank,
                message: format!(
                    "broadcast from rank {root} sent {:?} {} but this rank holds {:?} {}",
                    r.shape(),
                    r.dtype(),
                    t.shape(),
                    t.dtype()
                ),
            });
        }
        Ok(r)
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        let h = self.submit(Kind::Barrier, None, None, "barrier")?;
        self.block(h).map(|_| ())
    }
    fn abort(&self, reason: &str) {
        self.shared.fail(self.rank, reason.to_string());
    }
    fn failure(&self) -> Option<(usize, String)> {
        self.shared.lock().failed.clone()
    }
}

impl Drop for ThreadComm {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// A failure elsewhere in the group surfaces at the end of the step.
impl crate::train::rank_loop::StepComm for ThreadComm {}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_ranks<T: Send + 'static>(
        world: usize,
        opts: CommOptions,
        f: impl Fn(ThreadComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let g = ThreadGroup::new(world, opts);
        let f = Arc::new(f);
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let c = g.comm(r);
                let f = f.clone();
                thread::spawn(move || f(c))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    }

    #[test]
    fn all_reduce_sums_in_rank_order_and_all_ranks_agree() {
        let out = run_ranks(4, CommOptions::default(), |mut c| {
            let r = c.rank() as f32;
            let t = Tensor::from_f32(vec![3], vec![r, 1.0 + r * 1e-8, 0.1 * r]);
            let h1 = c
                .all_reduce_async(t.clone(), ReduceOp::Sum, "a")
                .expect("launch");
            let h2 = c.all_reduce_async(t, ReduceOp::Max, "b").expect("launch");
            let (a, _) = c.wait(h1).expect("sum");
            let (b, _) = c.wait(h2).expect("max");
            (a.to_f32_vec(), b.to_f32_vec())
        });
        let want = ((0.0f32 + 1.0) + 2.0) + 3.0;
        assert_eq!(out[0].0[0], want);
        assert_eq!(out[0].1[0], 3.0);
        for o in &out[1..] {
            assert_eq!(
                o.0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                out[0].0.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn reduce_scatter_is_the_all_reduce_sliced_and_all_gather_undoes_it() {
        let out = run_ranks(4, CommOptions::default(), |mut c| {
            let r = c.rank() as f32;
            // 8 elements, 2 per rank, with sums whose bits depend on the order of addition
            let t = Tensor::from_f32(
                vec![8],
                (0..8).map(|i| 0.1 * r + 1e-7 * i as f32 + 1.0).collect(),
            );
            let ha = c
                .all_reduce_async(t.clone(), ReduceOp::Sum, "ar")
                .expect("launch");
            let hs = c
                .reduce_scatter_async(t, ReduceOp::Sum, "rs")
                .expect("launch");
            let (full, _) = c.wait(ha).expect("all-reduce");
            let (mine, _) = c.wait(hs).expect("reduce-scatter");
            let hg = c.all_gather_async(mine.clone(), "ag").expect("launch");
            let (gathered, _) = c.wait(hg).expect("all-gather");
            (full.to_f32_vec(), mine.to_f32_vec(), gathered.to_f32_vec())
        });
        for (rank, (full, mine, gathered)) in out.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(mine.len(), 2);
            assert_eq!(bits(mine), bits(&full[2 * rank..2 * rank + 2]));
            assert_eq!(bits(gathered), bits(full));
        }
    }

    #[test]
    fn a_reduce_scatter_the_world_does_not_divide_is_refused() {
        let out = run_ranks(2, CommOptions::default(), |mut c| {
            c.reduce_scatter_async(Tensor::from_f32(vec![3], vec![0.0; 3]), ReduceOp::Sum, "b0")
                .map(|_| ())
        });
        for r in out {
            let msg = r.expect_err("refused").to_string();
            assert!(msg.contains("not a multiple of the world size 2"), "{msg}");
        }
    }

    #[test]
    fn broadcast_and_barrier() {
        let out = run_ranks(3, CommOptions::default(), |mut c| {
            let t = Tensor::from_f32(vec![2], vec![c.rank() as f32; 2]);
            c.barrier().expect("barrier");
            c.broadcast(t, 2).expect("broadcast").to_f32_vec()
        });
        assert!(out.iter().all(|v| v == &vec![2.0, 2.0]));
    }

    #[test]
    fn a_missing_rank_times_out_with_its_number() {
        let opts = CommOptions {
            timeout: Duration::from_millis(200),
            link: None,
        };
        let start = Instant::now();
        let out = run_ranks(2, opts, |mut c| {
            if c.rank() == 1 {
                return None;
            }
            let h = c
                .all_reduce_async(Tensor::from_f32(vec![1], vec![1.0]), ReduceOp::Sum, "b0")
                .expect("launch");
            Some(c.wait(h).map(|_| ()))
        });
        assert!(start.elapsed() < Duration::from_secs(5));
        match &out[0] {
            Some(Err(CommError::Timeout { missing, label, .. })) => {
                assert_eq!(missing, &vec![1]);
                assert_eq!(label, "b0");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[test]
    fn mismatched_collectives_are_an_error_not_a_hang() {
        let out = run_ranks(2, CommOptions::default(), |mut c| {
            let n = 1 + c.rank();
            let h = c
                .all_reduce_async(Tensor::from_f32(vec![n], vec![0.0; n]), ReduceOp::Sum, "b0")
                .expect("launch");
            c.wait(h).map(|_| ())
        });
        assert!(out.iter().all(|r| r.is_err()));
        let msg = out.iter().find_map(|r| match r {
            Err(e @ CommError::Mismatch { .. }) => Some(e.to_string()),
            _ => None,
        });
        assert!(msg
            .expect("one rank sees the mismatch")
            .contains("all_reduce Sum of 1 x f32"));
    }

    #[test]
    fn link_model_delays_completion() {
        let opts = CommOptions {
            timeout: Duration::from_secs(10),
            link: Some(LinkModel {
                latency_us: 0.0,
                bandwidth_gbps: 8.0,
            }),
        };
        // 2 ranks, 4 MB: 2(n-1)/n * 4e6 B / 1e9 B/s = 4 ms
        let out = run_ranks(2, opts, |mut c| {
            let h = c
                .all_reduce_async(
                    Tensor::from_f32(vec![1_000_000], vec![1.0; 1_000_000]),
                    ReduceOp::Sum,
                    "big",
                )
                .expect("launch");
            let (_, t) = c.wait(h).expect("done");
            t.busy()
        });
        assert!(
            out.iter().all(|d| *d >= Duration::from_millis(4)),
            "{out:?}"
        );
    }
}
