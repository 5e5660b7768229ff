//! What a step did and when: compute spans, per-bucket communication times, overlap, and the
//! Chrome/Perfetto timeline built from them.

use serde::Serialize;
use std::time::Instant;

/// A time interval in microseconds since the run's epoch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Default)]
pub struct Span {
    pub start_us: f64,
    pub end_us: f64,
}

impl Span {
    pub fn len(&self) -> f64 {
        (self.end_us - self.start_us).max(0.0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0.0
    }
}

/// One all-reduce of one step on one rank. Times in microseconds since the run's epoch.
#[derive(Clone, Debug, Serialize)]
pub struct BucketRecord {
    /// The plan's label, shared (a step's record copies no string).
    pub label: std::sync::Arc<str>,
    pub bytes: usize,
    /// Its last member gradient was produced (the pack started).
    pub ready_us: f64,
    /// `all_reduce_async` handed it to the communication worker.
    pub launch_us: f64,
    /// The worker started on it / finished it.
    pub comm_start_us: f64,
    pub comm_end_us: f64,
    /// The rank reached the `wait` / got past it.
    pub wait_start_us: f64,
    pub wait_end_us: f64,
}

/// A timeline event.
#[derive(Clone, Debug)]
pub struct Event {
    pub name: String,
    pub comm: bool,
    pub span: Span,
}

/// Raw record of one trace execution on one rank.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    pub compute: Vec<Span>,
    pub buckets: Vec<BucketRecord>,
    pub events: Vec<Event>,
}

impl Recording {
    /// Empties the record, keeping its lists' room for the next run.
    pub fn clear(&mut self) {
        self.compute.clear();
        self.buckets.clear();
        self.events.clear();
    }
}

/// Clock and switches shared by the ranks of a run.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub epoch: Instant,
    /// Keep one event per instruction (for `--timeline`).
    pub events: bool,
}

impl Clock {
    pub fn new(events: bool) -> Clock {
        Clock {
            epoch: Instant::now(),
            events,
        }
    }
    pub fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_secs_f64() * 1e6
    }
}

/// Per-step summary on one rank (seconds).
#[derive(Clone, Debug, Serialize)]
pub struct StepMetrics {
    pub step: usize,
    pub rank: usize,
    pub step_s: f64,
    /// Time in the forward and in the backward trace (wall time of their runs).
    pub forward_s: f64,
    pub backward_s: f64,
    /// Busy time of kernels inside the backward (its time minus waiting on communication).
    pub backward_compute_s: f64,
    pub compute_s: f64,
    pub comm_s: f64,
    pub overlap_s: f64,
    /// overlap / comm, in percent (100 when there was no communication to hide).
    pub overlap_pct: f64,
    /// comm - overlap: communication the step had to wait for.
    pub exposed_comm_s: f64,
    /// Time blocked in a `wait` before the all-reduce had started: waiting for a slower rank
    /// to reach it (the communication itself is in `comm_s`).
    pub sync_wait_s: f64,
    /// The rest of the step (loss, optimizer, copies, launching, a late rank's own delay):
    /// `step = compute + exposed_comm + sync_wait + other`.
    pub other_s: f64,
    /// Of `exposed_comm_s`: fsdp's all-gathers and reduce-scatters (buckets labelled
    /// `gather:` and `scatter:`).
    pub exposed_gather_s: f64,
    pub exposed_scatter_s: f64,
    /// Bytes this rank held in parameters, gradients and optimizer state at the step's
    /// fullest (before the update; a sharded run's shards, not the buckets it gathers for a
    /// while). Set by the trainer.
    pub state_bytes: usize,
    pub buckets: Vec<BucketRecord>,
    /// Tensor buffers the step's kernels had to allocate (the buffer pool's misses; 0 in a
    /// steady state). 0 on a backend without a pool.
    pub buffer_allocs: u64,
    /// Bytes of free buffers the pool keeps between steps (at the step's end).
    pub pool_bytes: u64,
    /// The rank's arena ([`crate::exec::MemoryPlan::arena_bytes`]): the largest of its plans'
    /// (forward, backward), which run in turn over one allocation; parameters, gradients,
    /// saved activations and optimizer state are outside it.
    pub arena_bytes: u64,
    /// Seconds this rank spent on the checkpoint saved after this step (0: none): writing its
    /// file (sharded), or gathering and, on rank 0, writing the whole file. Set by the trainer.
    pub checkpoint_s: f64,
    /// Bytes this rank wrote to that checkpoint (its rank file, or rank 0's whole file).
    pub checkpoint_bytes: u64,
}

/// `spans` sorted and merged where they meet, in place (empty ones dropped).
fn union_in_place(spans: &mut Vec<Span>) {
    spans.retain(|s| s.end_us > s.start_us);
    // unstable: no buffer; spans that start together merge whatever their order
    spans.sort_unstable_by(|a, b| a.start_us.total_cmp(&b.start_us));
    let mut kept = 0usize;
    for i in 0..spans.len() {
        let s = spans[i];
        match kept.checked_sub(1).map(|l| &mut spans[l]) {
            Some(l) if s.start_us <= l.end_us => l.end_us = l.end_us.max(s.end_us),
            _ => {
                spans[kept] = s;
                kept += 1;
            }
        }
    }
    spans.truncate(kept);
}

thread_local! {
    /// Copies of the span sets being merged, kept for the next step's metrics (a step's
    /// bookkeeping allocates nothing once they have grown).
    static SCRATCH: std::cell::RefCell<(Vec<Span>, Vec<Span>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

thread_local! {
    /// A step's compute, communication and wait spans as gathered from its recordings, and a
    /// filtered set, kept for the next step's metrics.
    static GATHERED: std::cell::RefCell<[Vec<Span>; 4]> =
        const { std::cell::RefCell::new([const { Vec::new() }; 4]) };
}

/// `f` of four empty span lists (this thread's, when no other call holds them).
fn with_gathered<R>(f: impl FnOnce(&mut [Vec<Span>; 4]) -> R) -> R {
    GATHERED.with(|g| match g.try_borrow_mut() {
        Ok(mut lists) => {
            lists.iter_mut().for_each(Vec::clear);
            f(&mut lists)
        }
        Err(_) => f(&mut Default::default()),
    })
}

/// `f` of the unions of `a` and `b` (each merged from a copy in this thread's scratch).
fn with_unions<R>(a: &[Span], b: &[Span], f: impl FnOnce(&[Span], &[Span]) -> R) -> R {
    let merged = |(ua, ub): &mut (Vec<Span>, Vec<Span>)| {
        for (u, src) in [(&mut *ua, a), (&mut *ub, b)] {
            u.clear();
            u.extend_from_slice(src);
            union_in_place(u);
        }
    };
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut pair) => {
            merged(&mut pair);
            f(&pair.0, &pair.1)
        }
        // (a nested call: its own copies)
        Err(_) => {
            let mut pair = (Vec::new(), Vec::new());
            merged(&mut pair);
            f(&pair.0, &pair.1)
        }
    })
}

/// Total length of the union of `spans`.
pub fn busy(spans: &[Span]) -> f64 {
    with_unions(spans, &[], |u, _| u.iter().map(Span::len).sum())
}

/// Busy compute, communication, and how much of the communication the compute hid (seconds).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct OverlapSummary {
    pub compute_s: f64,
    pub comm_s: f64,
    pub overlap_s: f64,
    /// overlap / comm, in percent (100 when there was no communication to hide).
    pub overlap_pct: f64,
    /// comm - overlap.
    pub exposed_comm_s: f64,
}

impl OverlapSummary {
    /// Adds the times of a stretch disjoint in time from those already summed (a finished
    /// micro-step), so that unions and overlaps add up.
    pub fn add(&mut self, m: &StepMetrics) {
        self.compute_s += m.compute_s;
        self.comm_s += m.comm_s;
        self.overlap_s += m.overlap_s;
        self.exposed_comm_s += m.exposed_comm_s;
        self.overlap_pct = pct(self.overlap_s, self.comm_s);
    }

    /// Summarizes compute and communication spans (microseconds, possibly overlapping).
    pub fn of(compute: &[Span], comm: &[Span]) -> OverlapSummary {
        let (compute_us, comm_us) = (busy(compute), busy(comm));
        let overlap_us = overlap(compute, comm);
        OverlapSummary {
            compute_s: compute_us * 1e-6,
            comm_s: comm_us * 1e-6,
            overlap_s: overlap_us * 1e-6,
            overlap_pct: pct(overlap_us, comm_us),
            exposed_comm_s: (comm_us - overlap_us) * 1e-6,
        }
    }
}

/// overlap / comm in percent; 100 when there was no communication to hide.
fn pct(overlap: f64, comm: f64) -> f64 {
    if comm > 0.0 {
        100.0 * overlap / comm
    } else {
        100.0
    }
}

/// Total length of the intersection of two span sets.
pub fn overlap(a: &[Span], b: &[Span]) -> f64 {
    with_unions(a, b, overlap_of_unions)
}

/// [`overlap`] of two sorted, disjoint span sets.
fn overlap_of_unions(a: &[Span], b: &[Span]) -> f64 {
    let (mut i, mut j, mut total) = (0, 0, 0.0);
    while i < a.len() && j < b.len() {
        let lo = a[i].start_us.max(b[j].start_us);
        let hi = a[i].end_us.min(b[j].end_us);
        if hi > lo {
            total += hi - lo;
        }
        if a[i].end_us < b[j].end_us {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

impl StepMetrics {
    /// Summarizes the recordings of one step (forward, backward, ...) run between `start` and `end`.
    pub fn from_recordings(
        step: usize,
        rank: usize,
        step_span: Span,
        recs: &[Recording],
    ) -> StepMetrics {
        Self::from_recordings_into(step, rank, step_span, recs, Vec::new())
    }

    /// [`StepMetrics::from_recordings`] with the step's bucket records copied into `buckets`
    /// (emptied first): a training loop hands in lists it made before the steady steps, so a
    /// step's record allocates nothing.
    pub fn from_recordings_into(
        step: usize,
        rank: usize,
        step_span: Span,
        recs: &[Recording],
        mut buckets_out: Vec<BucketRecord>,
    ) -> StepMetrics {
        let buckets = || recs.iter().flat_map(|r| r.buckets.iter());
        let comm_span = |b: &BucketRecord| Span {
            start_us: b.comm_start_us,
            end_us: b.comm_end_us,
        };
        let (o, sync_wait_s, exposed_gather_s, exposed_scatter_s) = with_gathered(|g| {
            let [compute, comm, waits, spans] = g;
            compute.extend(recs.iter().flat_map(|r| r.compute.iter().copied()));
            comm.extend(buckets().map(comm_span));
            let o = OverlapSummary::of(compute, comm);
            // a wait blocks the compute thread: the part of it no communication ran in was
            // spent waiting for the other ranks to start the all-reduce
            waits.extend(buckets().map(|b| Span {
                start_us: b.wait_start_us,
                end_us: b.wait_end_us,
            }));
            let sync_wait_s = (busy(waits) - overlap(waits, comm)).max(0.0) * 1e-6;
            let mut exposed_of = |prefix: &str| {
                spans.clear();
                spans.extend(
                    buckets()
                        .filter(|b| b.label.starts_with(prefix))
                        .map(comm_span),
                );
                // the difference of two sums of spans: never below zero for rounding's sake
                OverlapSummary::of(compute, spans).exposed_comm_s.max(0.0)
            };
            let gather = exposed_of("gather:");
            (o, sync_wait_s, gather, exposed_of("scatter:"))
        });
        let step_s = step_span.len() * 1e-6;
        StepMetrics {
            step,
            rank,
            step_s,
            forward_s: 0.0,
            backward_s: 0.0,
            backward_compute_s: 0.0,
            compute_s: o.compute_s,
            comm_s: o.comm_s,
            overlap_s: o.overlap_s,
            overlap_pct: o.overlap_pct,
            exposed_comm_s: o.exposed_comm_s,
            sync_wait_s,
            other_s: (step_s - o.compute_s - o.exposed_comm_s - sync_wait_s).max(0.0),
            exposed_gather_s,
            exposed_scatter_s,
            state_bytes: 0,
            buckets: {
                buckets_out.clear();
                buckets_out.extend(buckets().cloned());
                buckets_out
            },
            buffer_allocs: 0,
            pool_bytes: 0,
            arena_bytes: 0,
            checkpoint_s: 0.0,
            checkpoint_bytes: 0,
        }
    }

    /// Adds the summed times of the step's earlier micro-steps (disjoint in time from this
    /// one's recordings).
    pub fn add_local(&mut self, local: &OverlapSummary) {
        self.compute_s += local.compute_s;
        self.comm_s += local.comm_s;
        self.overlap_s += local.overlap_s;
        self.exposed_comm_s += local.exposed_comm_s;
        self.overlap_pct = pct(self.overlap_s, self.comm_s);
    }
}

#[derive(Serialize)]
struct TraceEvent<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'a str,
    ts: f64,
    dur: f64,
    pid: usize,
    tid: usize,
}

#[derive(Serialize)]
struct MetaEvent {
    name: &'static str,
    ph: &'static str,
    pid: usize,
    tid: usize,
    args: serde_json::Value,
}

/// Chrome/Perfetto trace JSON: one process per rank, thread 0 compute, thread 1 communication.
pub fn timeline_json(ranks: &[(usize, Vec<Event>)]) -> serde_json::Value {
    let mut events = Vec::new();
    for (rank, evs) in ranks {
        for (tid, name) in [(0, "compute"), (1, "communication")] {
            events.push(
                serde_json::to_value(MetaEvent {
                    name: "thread_name",
                    ph: "M",
                    pid: *rank,
                    tid,
                    args: serde_json::json!({ "name": name }),
                })
                .unwrap_or_default(),
            );
        }
        events.push(
            serde_json::to_value(MetaEvent {
                name: "process_name",
                ph: "M",
                pid: *rank,
                tid: 0,
                args: serde_json::json!({ "name": format!("rank {rank}") }),
            })
            .unwrap_or_default(),
        );
        for e in evs {
            events.push(
                serde_json::to_value(TraceEvent {
                    name: &e.name,
                    cat: if e.comm { "comm" } else { "compute" },
                    ph: "X",
                    ts: e.span.start_us,
                    dur: e.span.len(),
                    pid: *rank,
                    tid: usize::from(e.comm),
                })
                .unwrap_or_default(),
            );
        }
    }
    serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(a: f64, b: f64) -> Span {
        Span {
            start_us: a,
            end_us: b,
        }
    }

    #[test]
    fn micro_steps_summed_one_by_one_equal_the_step_summed_whole() {
        let rec = |at: f64, comm: bool| Recording {
            compute: vec![s(at, at + 40.), s(at + 50., at + 90.)],
            buckets: comm
                .then(|| BucketRecord {
                    label: "b0".into(),
                    bytes: 4,
                    ready_us: at,
                    launch_us: at,
                    comm_start_us: at + 30.,
                    comm_end_us: at + 70.,
                    wait_start_us: at + 60.,
                    wait_end_us: at + 70.,
                })
                .into_iter()
                .collect(),
            events: vec![],
        };
        let (a, b, c) = (rec(0., false), rec(100., true), rec(200., true));
        let whole =
            StepMetrics::from_recordings(0, 0, s(0., 300.), &[a.clone(), b.clone(), c.clone()]);
        let mut local = OverlapSummary::default();
        for r in [a, b] {
            local.add(&StepMetrics::from_recordings(0, 0, Span::default(), &[r]));
        }
        let mut parts = StepMetrics::from_recordings(0, 0, s(0., 300.), &[c]);
        parts.add_local(&local);
        for (x, y) in [
            (parts.compute_s, whole.compute_s),
            (parts.comm_s, whole.comm_s),
            (parts.overlap_s, whole.overlap_s),
            (parts.exposed_comm_s, whole.exposed_comm_s),
            (parts.overlap_pct, whole.overlap_pct),
        ] {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
        assert!((whole.compute_s - 240e-6).abs() < 1e-12);
    }

    #[test]
    fn overlap_intersects_unions() {
        let compute = [s(0., 10.), s(12., 20.)];
        let comm = [s(5., 15.), s(14., 30.)];
        // comm union [5, 30]; compute ∩ = [5,10] + [12,20] = 13
        assert_eq!(overlap(&compute, &comm), 13.0);
        assert_eq!(overlap(&compute, &[]), 0.0);
    }

    #[test]
    fn step_metrics_relate_comm_overlap_and_exposed() {
        let rec = Recording {
            compute: vec![s(0., 100.)],
            buckets: vec![BucketRecord {
                label: "b0".into(),
                bytes: 4,
                ready_us: 10.,
                launch_us: 10.,
                comm_start_us: 50.,
                comm_end_us: 150.,
                wait_start_us: 100.,
                wait_end_us: 150.,
            }],
            events: vec![],
        };
        let m = StepMetrics::from_recordings(0, 0, s(0., 150.), std::slice::from_ref(&rec));
        assert!((m.comm_s - 100e-6).abs() < 1e-12);
        assert!((m.overlap_s - 50e-6).abs() < 1e-12);
        assert!((m.overlap_pct - 50.0).abs() < 1e-9);
        assert!((m.exposed_comm_s - 50e-6).abs() < 1e-12);
        // the wait [100, 150] is all communication: no waiting for another rank
        assert!(m.sync_wait_s.abs() < 1e-12);
        assert!((m.other_s - 0.0).abs() < 1e-12);
    }

    #[test]
    fn waiting_for_a_late_rank_is_sync_wait() {
        // compute [0, 10]; wait [10, 40]; the all-reduce ran [35, 40] once the late rank came
        let rec = Recording {
            compute: vec![s(0., 10.)],
            buckets: vec![BucketRecord {
                label: "b0".into(),
                bytes: 4,
                ready_us: 10.,
                launch_us: 10.,
                comm_start_us: 35.,
                comm_end_us: 40.,
                wait_start_us: 10.,
                wait_end_us: 40.,
            }],
            events: vec![],
        };
        let m = StepMetrics::from_recordings(0, 0, s(0., 50.), std::slice::from_ref(&rec));
        assert!((m.exposed_comm_s - 5e-6).abs() < 1e-12);
        assert!((m.sync_wait_s - 25e-6).abs() < 1e-12);
        assert!((m.other_s - 10e-6).abs() < 1e-12);
        let sum = m.compute_s + m.exposed_comm_s + m.sync_wait_s + m.other_s;
        assert!((sum - m.step_s).abs() < 1e-12);
    }
}
