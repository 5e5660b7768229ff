//! Buffer assignment for a compiled [`Plan`], after the schedule is fixed (`sort-waits` moves
//! waits and so lifetimes): every intermediate tensor's size and lifetime, and an offset in one
//! arena per rank, as XLA's buffer assignment and TFLite's greedy-by-size planner do.
//!
//! Lifetimes are instruction indices of the plan. A buffer is born at the instruction that
//! writes it and dies after the last instruction that reads it or any view of it. Views share
//! their source's buffer (reshape, permute, expand, squeeze, unsqueeze, slice, split,
//! `update_aliases`, bucket unpacking). A buffer handed to an async collective lives until the
//! collective's `wait` (the communicator reads it meanwhile); an all-reduce reduces in place,
//! so its wait gives the same buffer back, while an all-gather or reduce-scatter writes a
//! buffer of its own from its start. Multi-output kernels (var_mean, max-pool, split) and
//! fusion regions write one buffer per output.
//!
//! Only buffers born and dead inside the plan are placed: the plan's arguments (parameters,
//! the batch, saved activations) and its results (the output, saved activations, gradients)
//! outlive it and are the caller's memory. Offsets are 64-byte aligned and assigned
//! greedy-by-size with best fit: the largest buffers first, each in the smallest gap left by
//! the placed buffers whose lifetimes overlap its own.
//!
//! In place: an elementwise kernel (unary, activation, binary) whose output has the dtype and
//! length of an input buffer that dies at that kernel writes over it (the output takes the
//! input's buffer). The CPU backend's kernels always write fresh storage, so the CPU buffer
//! pool counts its size classes from the plan without in-place ([`MemoryPlan::classes`]).

use crate::exec::kernel::Kernel;
use crate::exec::plan::{InstrKind, Plan, Slot};
use crate::tensor::Dims;
use tracepass_ir::DType;

/// Alignment of every buffer's offset and size in the arena, in bytes (a cache line, what
/// AVX-512 loads and CUDA's vectorised accesses want).
pub const ALIGN: u64 = 64;

/// One buffer of the plan: what it holds, when it lives and where it sits.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub dtype: DType,
    pub numel: usize,
    /// Bytes of its elements (unaligned).
    pub bytes: u64,
    /// The instruction that writes it (`None`: an argument, alive from the start).
    pub first: Option<usize>,
    /// The last instruction that reads it or a view of it (`None`: a result, alive past the
    /// end).
    pub last: Option<usize>,
    /// Byte offset in the arena (`None`: not in the arena, an argument or a result).
    pub offset: Option<u64>,
    /// Outputs written over this buffer in place, after its first writer.
    pub in_place: usize,
}

impl Buffer {
    /// Bytes it takes in the arena (rounded up to [`ALIGN`]).
    pub fn aligned(&self) -> u64 {
        self.bytes.div_ceil(ALIGN) * ALIGN
    }
    /// Whether it is born and dies inside the plan (an arena buffer).
    pub fn in_arena(&self) -> bool {
        self.first.is_some() && self.last.is_some()
    }
}

/// Buffers of one (dtype, length) alive at once at most.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeClass {
    pub dtype: DType,
    pub numel: usize,
    pub count: usize,
}

/// The memory plan of one [`Plan`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryPlan {
    /// Each slot's buffer (`None`: not a tensor of known size).
    pub buffer_of: Vec<Option<usize>>,
    pub buffers: Vec<Buffer>,
    /// Bytes of the arena: the end of the highest placed buffer.
    pub arena_bytes: u64,
    /// Largest sum of the (aligned) arena buffers alive at one instruction: a lower bound
    /// for any arena; `arena_bytes` exceeds it by the placement's fragmentation.
    pub peak_bytes: u64,
    /// Bytes of the tensor arguments (parameters, batch, saved activations).
    pub input_bytes: u64,
    /// Bytes of the buffers the plan writes and returns (outputs, saved activations,
    /// gradients): they outlive the plan, outside the arena.
    pub result_bytes: u64,
    /// Outputs written in place over a dying input.
    pub in_place: usize,
    /// Without in-place (as the CPU kernels run): the most buffers of each (dtype, length)
    /// alive at one instruction, arguments the plan frees and results included (their
    /// buffers come back to the CPU pool too).
    pub classes: Vec<SizeClass>,
    /// Without in-place: the largest sum of the unaligned bytes of the buffers the plan
    /// writes alive at one instruction (results included while the plan runs); what the
    /// executor measures ([`crate::exec::Executor::measure_live_bytes`]).
    pub live_peak_bytes: u64,
    /// Tensor slots of unknown size (an intermediate of a two-kernel node), not planned.
    pub unsized_slots: usize,
}

/// Whether `k` gives a view of its first input (no buffer of its own).
pub fn is_view(k: &Kernel) -> bool {
    matches!(
        k,
        Kernel::Identity
            | Kernel::Reshape(_)
            | Kernel::Permute(_)
            | Kernel::Expand(_)
            | Kernel::Squeeze(_)
            | Kernel::Unsqueeze(_)
            | Kernel::Slice { .. }
            | Kernel::Split { .. }
    )
}

/// The strides of the view `k` gives of a tensor of shape `from` and `strides` as `to`
/// (the output's shape), as the CPU tensors make it; `None` when `k` writes a buffer of its
/// own (not a view kernel, or a reshape of a strided tensor that no view gives, which copies).
fn view_layout(
    k: &Kernel,
    from: &[usize],
    strides: &[isize],
    to: &[usize],
    (dtype, out_dtype): (DType, DType),
) -> Option<Dims<isize>> {
    // the strides of the dims longer than 1, which alone decide contiguity
    let long = |shape: &[usize], st: &[isize]| -> Dims<isize> {
        shape
            .iter()
            .zip(st)
            .filter(|(&n, _)| n != 1)
            .map(|(_, &s)| s)
            .collect()
    };
    let keep_long = |st: &[isize]| -> Option<Dims<isize>> {
        // squeeze, unsqueeze: size-1 dims come and go, the others keep their strides
        let mut it = long(from, st).into_iter();
        let out: Dims<isize> = to
            .iter()
            .map(|&n| if n == 1 { Some(0) } else { it.next() })
            .collect::<Option<_>>()?;
        it.next().is_none().then_some(out)
    };
    match k {
        Kernel::Identity => Some(Dims::from(strides)),
        Kernel::Convert(d) => (*d == dtype).then(|| Dims::from(strides)),
        // `copy_` gives its source itself when nothing is to expand, convert or gather
        Kernel::Copy => (from == to && dtype == out_dtype && contiguous(from, strides))
            .then(|| Dims::from(strides)),
        // as `Tensor::reshape`: a view where the strides allow one
        Kernel::Reshape(_) => {
            if contiguous(from, strides) {
                Some(crate::tensor::contiguous_strides(to))
            } else {
                crate::tensor::reshape_view_strides(from, strides, to)
            }
        }
        Kernel::Permute(perm) => perm.iter().map(|&p| strides.get(p).copied()).collect(),
        Kernel::Expand(shape) => crate::cpu::layout::expand_dims(from, strides, shape)
            .ok()
            .map(|(_, st)| st),
        Kernel::Squeeze(_) | Kernel::Unsqueeze(_) => keep_long(strides),
        Kernel::Slice { step, .. } => (step.len() == strides.len()).then(|| {
            strides
                .iter()
                .zip(step)
                .map(|(&s, &k)| s * k as isize)
                .collect()
        }),
        Kernel::Split { .. } => Some(Dims::from(strides)),
        _ => None,
    }
}

/// `Tensor::is_contiguous` over a shape and strides.
fn contiguous(shape: &[usize], strides: &[isize]) -> bool {
    let mut expect = 1isize;
    for i in (0..shape.len()).rev() {
        if shape[i] != 1 && strides[i] != expect {
            return false;
        }
        expect *= shape[i] as isize;
    }
    true
}

/// Whether `k` computes each output element from the same element of its same-shaped
/// operands only, so that its output may overwrite such an operand.
fn elementwise(k: &Kernel) -> bool {
    matches!(
        k,
        Kernel::Unary(_) | Kernel::Activation(_) | Kernel::Binary { .. }
    )
}

impl MemoryPlan {
    /// Plans `plan`, whose slot `s` holds `slot_types[s]` (dtype and element count) when known.
    pub fn new(plan: &Plan, slot_types: &[Option<(DType, Vec<usize>)>]) -> MemoryPlan {
        let mut mp = Self::assign(plan, slot_types, true);
        let fresh = Self::assign(plan, slot_types, false);
        mp.classes = fresh.count_classes(plan.instrs.len());
        mp.live_peak_bytes = fresh.live_peak(plan.instrs.len());
        mp
    }

    /// Buffers, lifetimes and offsets, with or without in-place outputs.
    fn assign(
        plan: &Plan,
        slot_types: &[Option<(DType, Vec<usize>)>],
        in_place: bool,
    ) -> MemoryPlan {
        let shape_of = |s: Slot| slot_types.get(s).and_then(|t| t.as_ref()).map(|t| &t.1[..]);
        let type_of = |s: Slot| {
            slot_types
                .get(s)
                .and_then(|t| t.as_ref())
                .map(|(d, sh)| (*d, sh.iter().product::<usize>()))
        };
        // each slot's strides, as the CPU tensors' views give them: a reshape of a strided
        // view that no view gives copies into a buffer of its own
        let mut strides: Vec<Option<Dims<isize>>> = vec![None; plan.slots];
        let mut mp = MemoryPlan {
            buffer_of: vec![None; plan.slots],
            ..MemoryPlan::default()
        };
        // each slot's last reader, a future's read by its wait standing for the buffer's
        let mut slot_last: Vec<Option<usize>> = vec![None; plan.slots];
        let mut future_input: Vec<Option<Slot>> = vec![None; plan.slots];
        for (i, ins) in plan.instrs.iter().enumerate() {
            for &s in &ins.inputs {
                slot_last[s] = Some(i);
            }
            if matches!(
                ins.kind,
                InstrKind::AllReduce { .. }
                    | InstrKind::AllGather { .. }
                    | InstrKind::ReduceScatter { .. }
            ) {
                if let (Some(&b), Some(&f)) = (ins.inputs.first(), ins.outputs.first()) {
                    future_input[f] = Some(b);
                }
            }
            if let InstrKind::Wait { .. } = ins.kind {
                if let Some(b) = ins.inputs.first().and_then(|&f| future_input[f]) {
                    slot_last[b] = Some(i);
                }
            }
        }
        let mut result = vec![false; plan.slots];
        for r in plan.results.iter().flatten() {
            result[*r] = true;
        }
        // each buffer's own slot (the one its writer wrote) and whether a result holds it
        let mut root: Vec<Slot> = Vec::new();
        let mut kept: Vec<bool> = Vec::new();
        let mut slots_of: Vec<Vec<Slot>> = Vec::new();
        let fresh = |mp: &mut MemoryPlan,
                     root: &mut Vec<Slot>,
                     kept: &mut Vec<bool>,
                     slots_of: &mut Vec<Vec<Slot>>,
                     s: Slot,
                     first: Option<usize>| {
            if let Some((dtype, numel)) = type_of(s) {
                mp.buffer_of[s] = Some(mp.buffers.len());
                mp.buffers.push(Buffer {
                    dtype,
                    numel,
                    bytes: (numel * dtype.size_bytes()) as u64,
                    first,
                    last: None,
                    offset: None,
                    in_place: 0,
                });
                root.push(s);
                kept.push(result[s]);
                slots_of.push(vec![s]);
            }
        };
        for a in &plan.args {
            strides[a.slot] = shape_of(a.slot).map(crate::tensor::contiguous_strides);
            fresh(&mut mp, &mut root, &mut kept, &mut slots_of, a.slot, None);
        }
        let mut future_buffer: Vec<Option<usize>> = vec![None; plan.slots];
        for (i, ins) in plan.instrs.iter().enumerate() {
            let input_strides = ins.inputs.first().and_then(|&s| strides[s].clone());
            let view_strides: Vec<Option<Dims<isize>>> = ins
                .outputs
                .iter()
                .enumerate()
                .map(|(k, &o)| match &ins.kind {
                    InstrKind::Compute(kernel) => {
                        let (from, to) =
                            (ins.inputs.first().and_then(|&s| shape_of(s))?, shape_of(o)?);
                        let dtypes = (type_of(ins.inputs[0])?.0, type_of(o)?.0);
                        view_layout(kernel, from, input_strides.as_deref()?, to, dtypes)
                    }
                    InstrKind::Alias => ins.inputs.get(k).and_then(|&s| strides[s].clone()),
                    InstrKind::Unpack { .. } => shape_of(o).map(crate::tensor::contiguous_strides),
                    _ => None,
                })
                .collect();
            let shares_input = match &ins.kind {
                InstrKind::Compute(_) => {
                    view_strides.iter().all(Option::is_some) && !ins.outputs.is_empty()
                }
                InstrKind::Alias | InstrKind::Unpack { .. } => true,
                _ => false,
            };
            for (&o, st) in ins.outputs.iter().zip(&view_strides) {
                strides[o] = match st {
                    Some(st) if shares_input => Some(st.clone()),
                    _ => shape_of(o).map(crate::tensor::contiguous_strides),
                };
            }
            match &ins.kind {
                InstrKind::AllReduce { .. } => {
                    if let (Some(&s), Some(&f)) = (ins.inputs.first(), ins.outputs.first()) {
                        future_buffer[f] = mp.buffer_of[s];
                    }
                    continue;
                }
                InstrKind::AllGather { .. } | InstrKind::ReduceScatter { .. } => {
                    // the gathered or scattered buffer is written from the collective's start
                    if let Some(&f) = ins.outputs.first() {
                        let wait = plan.instrs[i..].iter().position(|w| {
                            matches!(w.kind, InstrKind::Wait { .. }) && w.inputs.first() == Some(&f)
                        });
                        if let Some(o) = wait.and_then(|w| plan.instrs[i + w].outputs.first()) {
                            fresh(&mut mp, &mut root, &mut kept, &mut slots_of, *o, Some(i));
                            future_buffer[f] = mp.buffer_of[*o];
                        }
                    }
                    continue;
                }
                InstrKind::Wait { .. } => {
                    if let (Some(&f), Some(&o)) = (ins.inputs.first(), ins.outputs.first()) {
                        if let Some(b) = future_buffer[f] {
                            mp.buffer_of[o] = Some(b);
                            slots_of[b].push(o);
                            kept[b] |= result[o];
                        }
                    }
                    continue;
                }
                _ => {}
            }
            // in place: an elementwise output over a same-typed input buffer that dies here
            let over = match &ins.kind {
                InstrKind::Compute(k) if in_place && elementwise(k) && ins.outputs.len() == 1 => {
                    let o = ins.outputs[0];
                    ins.inputs.iter().copied().find_map(|s| {
                        let b = mp.buffer_of[s]?;
                        let buf = &mp.buffers[b];
                        let dies_here = slots_of[b].iter().all(|&t| slot_last[t] <= Some(i));
                        (buf.first.is_some()
                            && root[b] == s
                            && !kept[b]
                            && dies_here
                            && type_of(o) == Some((buf.dtype, buf.numel)))
                        .then_some(b)
                    })
                }
                _ => None,
            };
            for (k, &o) in ins.outputs.iter().enumerate() {
                let source = match &ins.kind {
                    InstrKind::Alias => ins.inputs.get(k),
                    _ if shares_input => ins.inputs.first(),
                    _ => None,
                };
                match (source.and_then(|&s| mp.buffer_of[s]), over) {
                    (Some(b), _) | (None, Some(b)) => {
                        mp.buffer_of[o] = Some(b);
                        slots_of[b].push(o);
                        kept[b] |= result[o];
                        if over.is_some() {
                            root[b] = o;
                            mp.buffers[b].in_place += 1;
                            mp.in_place += 1;
                        }
                    }
                    (None, None) if matches!(ins.kind, InstrKind::UnpackSequence) => {
                        fresh(&mut mp, &mut root, &mut kept, &mut slots_of, o, None)
                    }
                    (None, None) => {
                        fresh(&mut mp, &mut root, &mut kept, &mut slots_of, o, Some(i));
                        if mp.buffer_of[o].is_none() && matches!(ins.kind, InstrKind::Compute(_)) {
                            mp.unsized_slots += 1;
                        }
                    }
                }
            }
        }
        for (b, buf) in mp.buffers.iter_mut().enumerate() {
            buf.last = if kept[b] {
                None
            } else {
                // never read: dies right after its writer
                slots_of[b]
                    .iter()
                    .filter_map(|&s| slot_last[s])
                    .max()
                    .or(buf.first)
            };
        }
        mp.input_bytes = mp
            .buffers
            .iter()
            .filter(|b| b.first.is_none())
            .map(|b| b.bytes)
            .sum();
        mp.result_bytes = mp
            .buffers
            .iter()
            .filter(|b| b.first.is_some() && b.last.is_none())
            .map(|b| b.bytes)
            .sum();
        mp.place();
        mp
    }

    /// Greedy by size, best fit: the arena buffers from the largest down (ties: earlier
    /// writer first), each at the start of the smallest gap between the placed buffers whose
    /// lifetimes overlap its own that holds it, or above them all.
    fn place(&mut self) {
        let mut order: Vec<usize> = (0..self.buffers.len())
            .filter(|&b| self.buffers[b].in_arena())
            .collect();
        order.sort_by_key(|&b| {
            (
                std::cmp::Reverse(self.buffers[b].aligned()),
                self.buffers[b].first,
            )
        });
        let span = |b: &Buffer| (b.first.unwrap_or(0), b.last.unwrap_or(0));
        let mut placed: Vec<usize> = Vec::with_capacity(order.len());
        let mut arena = 0u64;
        for b in order {
            let size = self.buffers[b].aligned();
            let (f, l) = span(&self.buffers[b]);
            let mut busy: Vec<(u64, u64)> = placed
                .iter()
                .filter_map(|&p| {
                    let pb = &self.buffers[p];
                    let (pf, pl) = span(pb);
                    (pf <= l && f <= pl).then(|| {
                        let o = pb.offset.unwrap_or(0);
                        (o, o + pb.aligned())
                    })
                })
                .collect();
            busy.sort_unstable();
            let (mut at, mut best): (u64, Option<(u64, u64)>) = (0, None);
            for &(lo, hi) in &busy {
                if lo >= at + size {
                    let gap = lo - at;
                    if best.is_none_or(|(g, _)| gap < g) {
                        best = Some((gap, at));
                    }
                }
                at = at.max(hi);
            }
            let offset = best.map_or(at, |(_, o)| o);
            self.buffers[b].offset = Some(offset);
            arena = arena.max(offset + size);
            placed.push(b);
        }
        self.arena_bytes = arena;
        self.peak_bytes = self.sweep(|b| b.in_arena().then(|| b.aligned()), usize::MAX);
    }

    /// The largest sum of `weight` over the buffers alive at one instruction (buffers with no
    /// weight left out; a result is alive to instruction `n`).
    fn sweep(&self, weight: impl Fn(&Buffer) -> Option<u64>, n: usize) -> u64 {
        let mut events: Vec<(usize, i64)> = Vec::new();
        for b in &self.buffers {
            let Some(w) = weight(b) else { continue };
            let first = b.first.unwrap_or(0);
            let last = b.last.unwrap_or(n.min(usize::MAX - 1));
            events.push((2 * first, w as i64));
            events.push((2 * last + 1, -(w as i64)));
        }
        // a buffer dying at i still counts at i: its death sorts after i's births
        events.sort_unstable();
        let (mut live, mut peak) = (0i64, 0i64);
        for (_, w) in events {
            live += w;
            peak = peak.max(live);
        }
        peak as u64
    }

    /// Bytes of the buffers the plan writes alive at once at most (results to the end).
    fn live_peak(&self, n: usize) -> u64 {
        self.sweep(|b| b.first.map(|_| b.bytes), n)
    }

    /// The most buffers of each (dtype, length) alive at one instruction.
    fn count_classes(&self, n: usize) -> Vec<SizeClass> {
        let mut classes: Vec<SizeClass> = Vec::new();
        let mut events: Vec<(usize, bool, usize)> = Vec::new(); // (time, is_birth, buffer)
        for (b, buf) in self.buffers.iter().enumerate() {
            if buf.numel == 0 {
                continue;
            }
            // an argument counts only when the plan frees it (its buffer then comes back)
            if buf.first.is_none() && buf.last.is_none() {
                continue;
            }
            events.push((buf.first.map_or(0, |f| 2 * f + 1), true, b));
            events.push((2 * buf.last.unwrap_or(n) + 2, false, b));
        }
        // deaths after instruction i (time 2i+2) come before births at instruction i+1 (2i+3)
        events.sort_by_key(|&(t, birth, _)| (t, birth));
        let mut alive: Vec<usize> = Vec::new();
        for (_, birth, b) in events {
            let (dtype, numel) = (self.buffers[b].dtype, self.buffers[b].numel);
            let k = match classes
                .iter()
                .position(|c| c.dtype == dtype && c.numel == numel)
            {
                Some(k) => k,
                None => {
                    classes.push(SizeClass {
                        dtype,
                        numel,
                        count: 0,
                    });
                    alive.push(0);
                    classes.len() - 1
                }
            };
            if birth {
                alive[k] += 1;
                classes[k].count = classes[k].count.max(alive[k]);
            } else {
                alive[k] -= 1;
            }
        }
        classes
    }

    /// Bytes the size classes hold when every class is at its count.
    pub fn pool_bytes(&self) -> u64 {
        self.classes
            .iter()
            .map(|c| (c.count * c.numel * c.dtype.size_bytes()) as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::trainer::{build_plans, TrainConfig};
    use crate::train::{Model, ModelSource};

    fn plans(model: &str, world_size: usize, passes: Option<&str>) -> crate::train::trainer::Plans {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/models")
            .join(model);
        let model = Model::load(&ModelSource::Export(dir)).expect("corpus model");
        let cfg = TrainConfig {
            world_size,
            passes: passes.map(|s| tracepass_passes::parse_pipeline(s).expect("pipeline")),
            ..TrainConfig::default()
        };
        build_plans(&model, &cfg).expect("plans")
    }

    /// Arena buffers alive at one instruction never share a byte; all are aligned and inside
    /// the arena; returns whether some buffer reuses a dead one's bytes.
    fn check_placement(mp: &MemoryPlan) -> bool {
        let placed: Vec<&Buffer> = mp.buffers.iter().filter(|b| b.in_arena()).collect();
        let span = |b: &Buffer| (b.first.unwrap_or(0), b.last.unwrap_or(0));
        let mut reused = false;
        for (i, a) in placed.iter().enumerate() {
            let oa = a.offset.expect("an arena buffer has an offset");
            assert_eq!(oa % ALIGN, 0);
            assert!(oa + a.aligned() <= mp.arena_bytes);
            let (fa, la) = span(a);
            for b in &placed[i + 1..] {
                let ob = b.offset.expect("offset");
                let (fb, lb) = span(b);
                let together = fa <= lb && fb <= la;
                let overlap = oa < ob + b.aligned() && ob < oa + a.aligned();
                assert!(!(together && overlap), "{a:?} and {b:?}");
                reused |= overlap;
            }
        }
        assert!(mp
            .buffers
            .iter()
            .all(|b| b.in_arena() == b.offset.is_some()));
        let total: u64 = placed.iter().map(|b| b.aligned()).sum();
        assert!(mp.peak_bytes <= mp.arena_bytes && mp.arena_bytes <= total);
        reused
    }

    #[test]
    fn live_buffers_never_share_bytes_and_dead_ones_are_reused() {
        let p = plans("nanogpt", 1, None);
        for plan in [&p.forward, &p.sync] {
            let mp = &plan.memory;
            assert!(mp.buffers.iter().filter(|b| b.in_arena()).count() > 20);
            assert!(check_placement(mp), "{}: no reuse", plan.trace_name);
            // greedy by size packs close to the lower bound
            assert!(
                mp.arena_bytes * 4 <= mp.peak_bytes * 5,
                "{}: arena {} for a peak of {}",
                plan.trace_name,
                mp.arena_bytes,
                mp.peak_bytes
            );
        }
        // the backward writes over dying inputs (elementwise gradients)
        assert!(p.sync.memory.in_place > 0);
    }

    #[test]
    fn views_share_their_source_and_in_place_outputs_their_input() {
        let plan = plans("nanogpt", 1, None).sync;
        let mp = &plan.memory;
        let (mut views, mut in_place) = (0, 0);
        for ins in &plan.instrs {
            let InstrKind::Compute(k) = &ins.kind else {
                continue;
            };
            let (Some(&i), Some(&o)) = (ins.inputs.first(), ins.outputs.first()) else {
                continue;
            };
            if matches!(
                k,
                Kernel::Permute(_) | Kernel::Expand(_) | Kernel::Unsqueeze(_)
            ) {
                assert_eq!(mp.buffer_of[o], mp.buffer_of[i], "{}", ins.line);
                views += 1;
            }
            if elementwise(k)
                && ins
                    .inputs
                    .iter()
                    .any(|&s| mp.buffer_of[s] == mp.buffer_of[o])
            {
                // the input it overwrites is read by nothing after this instruction
                let b = mp.buffer_of[o].expect("a planned output");
                assert!(
                    mp.buffers[b].first
                        < Some(
                            plan.instrs
                                .iter()
                                .position(|x| std::ptr::eq(x, ins))
                                .unwrap_or(0)
                        )
                );
                in_place += 1;
            }
        }
        assert!(
            views > 5 && in_place > 0,
            "{views} views, {in_place} in place"
        );
        assert_eq!(in_place, mp.in_place);
    }

    #[test]
    fn a_bucket_lives_until_its_collective_is_waited_on() {
        let p = plans(
            "nanogpt",
            2,
            Some("ddp(world_size=2,bucket_mb=0.001),sort-waits"),
        );
        let plan = &p.sync;
        let mp = &plan.memory;
        let mut checked = 0;
        for (i, ins) in plan.instrs.iter().enumerate() {
            let InstrKind::AllReduce { .. } = ins.kind else {
                continue;
            };
            let (buf, fut) = (ins.inputs[0], ins.outputs[0]);
            let w = plan
                .instrs
                .iter()
                .position(|w| matches!(w.kind, InstrKind::Wait { .. }) && w.inputs[0] == fut)
                .expect("a wait");
            assert!(w > i);
            let b = mp.buffer_of[buf].expect("a planned bucket");
            // the wait gives the same buffer back (an in-place all-reduce), alive past it
            assert_eq!(mp.buffer_of[plan.instrs[w].outputs[0]], Some(b));
            assert!(mp.buffers[b].last.is_none_or(|l| l >= w));
            checked += 1;
        }
        assert!(checked > 1, "{checked} all-reduces");
        check_placement(mp);
    }

    #[test]
    fn fusion_regions_and_sharded_collectives_are_planned() {
        let p = plans("nanogpt", 1, Some("fuse-elementwise"));
        assert!(p
            .sync
            .instrs
            .iter()
            .any(|i| matches!(i.kind, InstrKind::Region(_))));
        for plan in [&p.forward, &p.sync] {
            assert_eq!(plan.memory.unsized_slots, 0, "{}", plan.trace_name);
            check_placement(&plan.memory);
        }
        let p = plans(
            "nanogpt",
            2,
            Some("fsdp(world_size=2,sharding=zero3,bucket_mb=0.001),sort-waits"),
        );
        let mp = &p.sync.memory;
        let gathers = p
            .sync
            .instrs
            .iter()
            .filter(|i| matches!(i.kind, InstrKind::AllGather { .. }))
            .count();
        assert!(gathers > 0);
        check_placement(mp);
    }
}
