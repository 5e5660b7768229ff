//! A steady-state training step allocates no tensor storage. This crate's unit-test binary
//! counts, with a global allocator, what the calling thread allocates while a flag is set;
//! the test runs a corpus model's forward and backward on the test thread, as a rank does, and
//! counts each step's executor runs.

use crate::comm::{CommOptions, ThreadComm, ThreadGroup};
use crate::cpu::CpuBackend;
use crate::exec::{Backend, Clock, Executor, RValue, Recording};
use crate::train::data::seeded_params;
use crate::train::loss::loss_and_grad;
use crate::train::model::{Model, ModelSource};
use crate::train::trainer::{build_plans, data_source, TrainConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// What one thread allocated while counting: (allocations, bytes, largest single one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Allocated {
    count: u64,
    bytes: u64,
    largest: u64,
    /// Of `count`, those made inside the `gemm` crate (its packing buffers, which its patched
    /// copy keeps per thread: none in a steady step).
    gemm: u64,
}

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static TRACING: Cell<bool> = const { Cell::new(false) };
    /// Trace every allocation, not only the large ones (`TRACEPASS_ALLOC_TRACE=all`).
    static TRACE_ALL: Cell<bool> = const { Cell::new(false) };
    static ALLOCATED: Cell<Allocated> = const { Cell::new(Allocated { count: 0, bytes: 0, largest: 0, gemm: 0 }) };
}

fn note(size: usize) {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        if crate::cpu::gemm::IN_GEMM_CRATE.with(Cell::get) {
            let _ = ALLOCATED.try_with(|a| {
                let mut v = a.get();
                v.count += 1;
                v.gemm += 1;
                a.set(v);
            });
            return;
        }
        let _ = ALLOCATED.try_with(|a| {
            let mut v = a.get();
            v.count += 1;
            v.bytes += size as u64;
            v.largest = v.largest.max(size as u64);
            a.set(v);
        });
        if TRACING.with(Cell::get) && (size >= LARGE || TRACE_ALL.with(Cell::get)) {
            trace(size);
        }
    }
}

/// Allocations at least this large are tensor storage or scratch, never bookkeeping.
const LARGE: usize = 256;

/// Prints where a large allocation came from (`TRACEPASS_ALLOC_TRACE=1`, to find the kernel
/// that still allocates).
fn trace(size: usize) {
    COUNTING.with(|c| c.set(false));
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let ours: Vec<&str> = bt
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("tracepass_runtime::") && !l.contains("steady_alloc"))
        .take(4)
        .collect();
    eprintln!("{size} bytes: {}", ours.join(" <- "));
    COUNTING.with(|c| c.set(true));
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING_ALLOCATOR: Counting = Counting;

/// What `f` allocates on this thread.
fn counted<R>(f: impl FnOnce() -> R) -> (R, Allocated) {
    ALLOCATED.with(|a| a.set(Allocated::default()));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCATED.with(Cell::get))
}

/// What [`executor_allocations`] saw.
struct Steps {
    /// Each step's executor allocations (forward and backward runs together).
    allocated: Vec<Allocated>,
    /// Each step's pool misses.
    misses: Vec<u64>,
    /// Each step's loss and gradients, as bits (every step runs the first batch on the same
    /// parameters, so they must not change).
    results: Vec<Vec<u64>>,
}

/// Runs `steps` steps of the corpus model `name` on one rank, all on the first batch and the
/// initial parameters (no optimizer), counting what the executor allocates.
fn executor_allocations(name: &str, passes: Option<&str>, steps: usize) -> Steps {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name);
    let model = Model::load(&ModelSource::Export(dir)).expect("corpus model");
    let cfg = TrainConfig {
        world_size: 1,
        passes: passes.map(|p| tracepass_passes::parse_pipeline(p).expect("pipeline")),
        ..TrainConfig::default()
    };
    let plans = build_plans(&model, &cfg).expect("plans");
    let params = seeded_params(&model.program.params, 0).expect("params");
    let data = data_source(&cfg, &model).expect("data");
    let group = ThreadGroup::new(1, CommOptions::default());
    let mut comm: ThreadComm = group.comm(0);
    let backend = CpuBackend;
    let clock = Clock::new(false);
    let mut exec: Executor<CpuBackend, ThreadComm> = Executor::new();
    // one recording reused, as its spans are the caller's memory, not the executor's
    let mut rec = Recording::default();
    rec.compute
        .reserve(4 * (plans.forward.instrs.len() + plans.sync.instrs.len()));
    let mut per_step = Vec::new();
    let mut misses = Vec::new();
    let mut results = Vec::new();
    let tracing = std::env::var_os("TRACEPASS_ALLOC_TRACE");
    TRACE_ALL.with(|t| t.set(tracing.as_ref().is_some_and(|v| v == "all")));
    let tracing = tracing.is_some();
    // the list of updated buffers, kept from step to step as the trainer keeps it
    let mut updated = Vec::new();
    for step in 0..steps {
        TRACING.with(|t| t.set(tracing && step == 4));
        let batch = data.batch(0, 0, &model).expect("batch");
        // the run's lists come from the executor and go back to it, as the trainer's do
        let mut inputs = exec.list(plans.forward.args.len());
        model.forward_inputs_into(batch.data, &params, &mut inputs);
        rec.clear();
        backend.reset_pool_stats();
        let (fwd, a_fwd) = counted(|| {
            plans.run_forward(
                &mut exec,
                &backend,
                &mut comm,
                inputs,
                &clock,
                &mut rec,
                std::mem::take(&mut updated),
            )
        });
        let mut fwd = fwd.expect("forward").expect("an output");
        let (loss, cot) =
            loss_and_grad(model.loss, &fwd.output, batch.targets.as_ref()).expect("loss");
        let mut bits = vec![loss.to_bits()];
        // a rank's updated buffers (running statistics) replace the old ones, whose storage
        // goes back to the pool: here the new ones go back instead
        fwd.buffers.drain(..).for_each(|b| backend.recycle(b));
        updated = std::mem::take(&mut fwd.buffers);
        backend.recycle(fwd.output);
        let mut cotangents = exec.list(1);
        cotangents.push(RValue::Tensor(cot));
        let mut binputs = exec.list(2 + plans.acc_targets.len());
        binputs.push(fwd.saved);
        binputs.push(RValue::Seq(cotangents));
        binputs.extend(plans.acc_targets.iter().map(|_| RValue::None));
        rec.clear();
        let (grads, a_bwd) =
            counted(|| exec.run(&plans.sync, &backend, &mut comm, binputs, &clock, &mut rec));
        let grads = grads.expect("backward");
        for g in &grads {
            if let RValue::Tensor(t) = g {
                bits.extend(t.to_f64_vec().into_iter().map(f64::to_bits));
            }
        }
        exec.recycle_list(&backend, grads);
        results.push(bits);
        misses.push(backend.pool_stats().map_or(u64::MAX, |p| p.misses));
        per_step.push(Allocated {
            count: a_fwd.count + a_bwd.count,
            bytes: a_fwd.bytes + a_bwd.bytes,
            largest: a_fwd.largest.max(a_bwd.largest),
            gemm: a_fwd.gemm + a_bwd.gemm,
        });
    }
    Steps {
        allocated: per_step,
        misses,
        results,
    }
}

/// The executor's allocations from the third step on are a few lists per run, the same every
/// step: every tensor buffer comes from the pool, and no instruction allocates bookkeeping
/// (shapes and strides are inline, `Arc` headers reused), nor does the `gemm` crate (counted
/// apart: its patched copy keeps its packing buffers per thread).
#[test]
fn a_steady_state_step_allocates_nothing() {
    steady_state(None);
    steady_state(Some("fuse-elementwise"));
}

/// Whether every step gave the first step's loss and gradients, all finite: a recycled buffer
/// (poisoned with NaN in the unit tests, see `buffer_pool::overwritten`) whose elements a
/// kernel did not all write would show as a NaN, or as a result that moves.
fn unchanged_and_finite(results: &[Vec<u64>]) -> bool {
    let finite = |r: &Vec<u64>| r.iter().all(|&b| f64::from_bits(b).is_finite());
    results.iter().all(|r| r == &results[0] && finite(r))
}

/// Checks that a steady nanoGPT step under `passes` allocates nothing: no tensor storage
/// (every buffer comes from the pool), no bookkeeping (shapes and strides live inline, `Arc`
/// headers are reused, operand lists are on the stack, and the lists of a run's arguments
/// and results are the executor's, kept from run to run), nothing in the `gemm` crate (its
/// patched copy keeps its packing buffers per thread). The first steps fill the pool and
/// grow the kept lists.
fn steady_state(passes: Option<&str>) {
    let Steps {
        allocated: steps,
        misses,
        results,
        ..
    } = executor_allocations("nanogpt", passes, STEPS);
    // recycled buffers (poisoned with NaN in the unit tests) leave no trace in the results
    assert!(unchanged_and_finite(&results), "nanogpt {passes:?}");
    // every tensor buffer a kernel asks for after the first step comes from the pool
    assert!(misses[0] > 0, "{misses:?}");
    assert!(misses[1..].iter().all(|&m| m == 0), "{misses:?}");
    assert!(steps[0].count > 0, "{steps:?}");
    for s in &steps[WARM..] {
        assert_eq!(s.count, 0, "{passes:?}: {steps:?}");
    }
}

/// Steps run, and the first one counted as steady.
const STEPS: usize = 5;
const WARM: usize = 3;

/// Every tensor buffer comes from the pool after the first step on models whose kernels copy
/// strided operands (Thunder's permuted convolution backward, RoPE's sliced halves through
/// `cat` and `pad`), update buffers (batch norm's running statistics) or unpack buckets.
#[test]
fn no_buffer_is_allocated_after_the_first_step_on_any_kind_of_model() {
    // the optimising passes too: transposed convolutions, channels-first weight gradients
    let optimised = Some("conv-input-grad,fold-conv-crop,fuse-elementwise");
    let runs = [
        ("llama", None),
        ("resnet", None),
        ("resnet", optimised),
        ("convzoo", optimised),
        ("cnn", None),
        ("bert", None),
    ];
    for (name, passes) in runs {
        let Steps {
            allocated: steps,
            misses,
            results,
            ..
        } = executor_allocations(name, passes, STEPS);
        assert!(unchanged_and_finite(&results), "{name} {passes:?}");
        assert!(misses[0] > 0, "{name}: {misses:?}");
        assert!(misses[1..].iter().all(|&m| m == 0), "{name}: {misses:?}");
        // nor anything else (see above)
        for s in &steps[WARM..] {
            assert_eq!(s.count, 0, "{name} {passes:?}: {steps:?}");
        }
    }
}

/// The memory plan's liveness is the executor's: on every corpus model, the largest sum of
/// the bytes of the buffers a run wrote that are alive at once, measured by the executor
/// instruction by instruction, is what the plan predicts, to the byte, for the forward and
/// the backward.
#[test]
fn the_planned_live_peak_is_the_measured_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .expect("corpus")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    let mut checked = 0;
    for name in &names {
        let Ok(model) = Model::load(&ModelSource::Export(root.join(name))) else {
            continue;
        };
        let cfg = TrainConfig {
            world_size: 1,
            ..TrainConfig::default()
        };
        let Ok(plans) = build_plans(&model, &cfg) else {
            continue;
        };
        let params = seeded_params(&model.program.params, 0).expect("params");
        let data = data_source(&cfg, &model).expect("data");
        let group = ThreadGroup::new(1, CommOptions::default());
        let mut comm: ThreadComm = group.comm(0);
        let backend = CpuBackend;
        let clock = Clock::new(false);
        let mut exec: Executor<CpuBackend, ThreadComm> = Executor::new();
        exec.measure_live_bytes();
        let mut rec = Recording::default();
        exec.set_rng(0, 0, 0);
        let batch = data.batch(0, 0, &model).expect("batch");
        let inputs = model.forward_inputs(batch.data, &params);
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
            .expect("forward")
            .expect("an output");
        assert_eq!(
            exec.live_peak_bytes(),
            plans.forward.memory.live_peak_bytes,
            "{name}: forward"
        );
        let Ok((_, cot)) = loss_and_grad(model.loss, &fwd.output, batch.targets.as_ref()) else {
            continue;
        };
        // the plan takes its arguments as contiguous (it cannot know a saved view's strides):
        // a reshape of a strided saved view would copy into a buffer it did not plan
        fn contiguous(v: RValue<crate::tensor::Tensor>) -> RValue<crate::tensor::Tensor> {
            match v {
                RValue::Tensor(t) => RValue::Tensor(t.contiguous()),
                RValue::Seq(items) => RValue::Seq(items.into_iter().map(contiguous).collect()),
                other => other,
            }
        }
        let mut binputs = vec![
            contiguous(fwd.saved),
            RValue::Seq(vec![RValue::Tensor(cot)]),
        ];
        binputs.extend(plans.acc_targets.iter().map(|_| RValue::None));
        // (a model of several outputs takes several cotangents: left out here)
        if exec
            .run(&plans.sync, &backend, &mut comm, binputs, &clock, &mut rec)
            .is_err()
        {
            continue;
        }
        assert_eq!(
            exec.live_peak_bytes(),
            plans.sync.memory.live_peak_bytes,
            "{name}: backward"
        );
        checked += 1;
    }
    assert!(checked >= 5, "{checked} of {} models", names.len());
    eprintln!("{checked} of {} models checked", names.len());
}
