//! Predicted peak memory of one rank over one training step (forward, then backward): what the
//! rank keeps between steps (its parameters or their shards, buffers, AdamW's two f32 moments
//! for each tensor it updates) plus the most bytes of values alive at once while the step runs
//! (inputs, activations, values saved for the backward, gathered parameter buckets, packed
//! buckets, gradients). A value is alive from the node that makes it to its last reader, as the
//! executor frees it; a view (reshape, permute, an `unpack` of a bucket, a `wait` on a
//! collective's buffer) shares its source's storage and keeps it alive; a collective's input
//! stays alive until its wait (the communicator holds it while it runs). What the forward saves
//! stays alive into the backward until the backward's last reader of it.
//!
//! This is what tells fsdp's sharding stages apart: `zero2` saves the gathered parameters for
//! the backward, `zero3` frees them after their last forward reader and gathers them again.

use crate::exec::kernel::Kernel;
use crate::exec::kernel_ops::decode;
use serde::Serialize;
use tracepass_ir::{ops, Arg, NodeIndex, Program, Trace, Type, ValueId, NOT_READ, RETURNED};

/// Bytes AdamW keeps per element of a tensor it updates: two f32 moments.
pub const ADAMW_STATE_BYTES_PER_ELEMENT: usize = 8;

/// One rank's predicted memory for a step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SimMemory {
    /// Parameters (shards, for sharded ones) and buffers the rank keeps between steps.
    pub params_bytes: usize,
    /// AdamW's moments for every tensor the rank updates (a shard's, for sharded ones).
    pub optimizer_bytes: usize,
    /// The most bytes of step values (everything but the two above) alive at one time.
    pub transient_peak_bytes: usize,
    /// Of those, the gathered parameter buckets alive at that time.
    pub gathered_at_peak_bytes: usize,
    /// The most bytes of gathered parameter buckets alive at one time.
    pub gathered_peak_bytes: usize,
    /// The trace (`forward`, `backward`) where the transient peak is reached.
    pub peak_in: String,
    /// `params_bytes + optimizer_bytes + transient_peak_bytes`.
    pub peak_bytes: usize,
}

fn tensor_bytes(t: &Trace, v: ValueId) -> usize {
    match t.ty(v) {
        Some(Type::Tensor(tt)) | Some(Type::Future(tt)) => tt.nbytes(),
        _ => 0,
    }
}

/// One storage: its bytes, whether it is a gathered parameter bucket, and the last schedule
/// position (of the trace being walked) anything aliasing it is read.
#[derive(Clone, Debug)]
struct Storage {
    bytes: usize,
    gathered: bool,
    last: u32,
}

/// The walk's running totals.
#[derive(Default)]
struct Tally {
    live: usize,
    gathered: usize,
    peak: usize,
    gathered_at_peak: usize,
    gathered_peak: usize,
    peak_in: String,
}

impl Tally {
    fn alloc(&mut self, s: &Storage, trace: &str) {
        self.live += s.bytes;
        if s.gathered {
            self.gathered += s.bytes;
        }
        self.gathered_peak = self.gathered_peak.max(self.gathered);
        if self.live > self.peak {
            self.peak = self.live;
            self.gathered_at_peak = self.gathered;
            self.peak_in = trace.to_string();
        }
    }
    fn free(&mut self, s: &Storage) {
        self.live = self.live.saturating_sub(s.bytes);
        if s.gathered {
            self.gathered = self.gathered.saturating_sub(s.bytes);
        }
    }
}

/// How a node's outputs relate to the storage of its operands.
enum Alias {
    /// A fresh allocation per output.
    Fresh,
    /// Every output is a view of the first operand.
    First,
    /// Output `k` is operand `k`.
    Each,
}

fn alias_of(t: &Trace, idx: NodeIndex) -> Alias {
    let Some(n) = t.node(idx) else {
        return Alias::Fresh;
    };
    match n.op.as_str() {
        ops::UNPACK | ops::WAIT | ops::ALL_REDUCE => Alias::First,
        ops::UPDATE_ALIASES => Alias::Each,
        ops::ALL_GATHER
        | ops::REDUCE_SCATTER
        | ops::BUCKET_PACK
        | ops::FUSION
        | ops::UNPACK_SEQUENCE
        | ops::CLEAR_COLLECTION => Alias::Fresh,
        // what the executor runs as a view; what it cannot decode (the timeline reports that)
        // counts as a fresh allocation
        _ => match decode(t, n) {
            Ok(d) if d.then.is_none() => match d.kernel {
                // the CPU backend's views (`cpu/layout.rs`): strides over the same storage
                Kernel::Identity
                | Kernel::Reshape(_)
                | Kernel::Permute(_)
                | Kernel::Expand(_)
                | Kernel::Squeeze(_)
                | Kernel::Unsqueeze(_)
                | Kernel::Slice { .. } => Alias::First,
                _ => Alias::Fresh,
            },
            _ => Alias::Fresh,
        },
    }
}

/// What a walk hands on: the storages alive at its end that the next trace reads, and the
/// values (of the walked trace) that name each.
struct Kept {
    stores: Vec<Storage>,
    values: Vec<(ValueId, usize)>,
}

/// Walks one trace. `persistent`: its values that are parameters (counted apart, never here);
/// `carried`: storages alive when the trace starts (counted already: what the forward saved)
/// with the values of this trace that name them; `keep_at_end`: values whose storage stays
/// alive after the trace (what the forward saves).
fn walk(
    t: &Trace,
    name: &str,
    persistent: &[ValueId],
    carried: &Kept,
    keep_at_end: &[ValueId],
    tally: &mut Tally,
) -> Kept {
    let last_use = t.last_uses();
    let end = t.schedule().len() as u32;
    let last_of = |v: ValueId| match last_use.get(v.0 as usize).copied() {
        Some(RETURNED) => end,
        Some(NOT_READ) | None => 0,
        Some(p) => p,
    };
    let bound = t.value_bound();
    // each value's storage (an index into `stores`), or none (parameters, non-tensors)
    let mut store_of: Vec<Option<usize>> = vec![None; bound];
    let mut is_persistent: Vec<bool> = vec![false; bound];
    for v in persistent {
        if let Some(x) = is_persistent.get_mut(v.0 as usize) {
            *x = true;
        }
    }
    let mut stores: Vec<Storage> = carried.stores.clone();
    for s in &mut stores {
        s.last = 0;
    }
    for &(v, s) in &carried.values {
        if let Some(slot) = store_of.get_mut(v.0 as usize) {
            *slot = Some(s);
            stores[s].last = stores[s].last.max(last_of(v));
        }
    }
    // arguments: parameters are persistent; data and cotangent tensors are allocated now
    for &a in t.args() {
        let ai = a.0 as usize;
        if is_persistent[ai] || store_of[ai].is_some() {
            continue;
        }
        let bytes = tensor_bytes(t, a);
        if bytes == 0 {
            continue;
        }
        let s = Storage {
            bytes,
            gathered: false,
            last: last_of(a),
        };
        tally.alloc(&s, name);
        store_of[ai] = Some(stores.len());
        stores.push(s);
    }
    let mut freed: Vec<bool> = vec![false; stores.len()];
    let mut future_input: Vec<Option<usize>> = vec![None; bound];
    let value_of = |a: Option<&Arg>| a.and_then(Arg::as_value);
    for (pos, &idx) in t.schedule().iter().enumerate() {
        let Some(n) = t.node(idx) else { continue };
        let pos32 = pos as u32;
        let alias = alias_of(t, idx);
        let first = value_of(n.args().first());
        let first_store = first.and_then(|v| store_of[v.0 as usize]);
        let first_persistent = first.is_some_and(|v| is_persistent[v.0 as usize]);
        for (k, &o) in n.outputs().iter().enumerate() {
            let oi = o.0 as usize;
            if is_persistent[oi] || store_of[oi].is_some() {
                continue; // a parameter, or what the forward saved
            }
            let src = match alias {
                Alias::Fresh => None,
                Alias::First => Some((first_store, first_persistent)),
                Alias::Each => {
                    let v = n
                        .args()
                        .first()
                        .and_then(Arg::as_seq)
                        .and_then(|items| value_of(items.get(k)));
                    Some((
                        v.and_then(|v| store_of[v.0 as usize]),
                        v.is_some_and(|v| is_persistent[v.0 as usize]),
                    ))
                }
            };
            match src {
                // a view of a step value keeps it alive
                Some((Some(s), _)) => {
                    stores[s].last = stores[s].last.max(last_of(o));
                    store_of[oi] = Some(s);
                }
                // a view of a parameter is a parameter
                Some((None, true)) => is_persistent[oi] = true,
                Some((None, false)) => {}
                None => {
                    let bytes = tensor_bytes(t, o);
                    if bytes == 0 {
                        continue;
                    }
                    // a gathered bucket (what is cut from it, its members, are views)
                    let gathered = n.op == ops::ALL_GATHER;
                    let s = Storage {
                        bytes,
                        gathered,
                        last: last_of(o).max(pos32),
                    };
                    tally.alloc(&s, name);
                    store_of[oi] = Some(stores.len());
                    stores.push(s);
                    freed.push(false);
                }
            }
        }
        // a collective's input stays alive until its wait
        if n.op == ops::ALL_GATHER || n.op == ops::REDUCE_SCATTER {
            if let (Some(f), Some(s)) = (n.outputs().first(), first_store) {
                future_input[f.0 as usize] = Some(s);
            }
        }
        if n.op == ops::WAIT {
            if let Some(s) = first.and_then(|f| future_input[f.0 as usize]) {
                stores[s].last = stores[s].last.max(pos32);
            }
        }
        // free what nothing reads after this node
        for (s, st) in stores.iter().enumerate() {
            if !freed[s] && st.last <= pos32 {
                freed[s] = true;
                tally.free(st);
            }
        }
    }
    // at the end: what the next trace reads stays; the rest goes
    let mut kept = Kept {
        stores: Vec::new(),
        values: Vec::new(),
    };
    let mut renumber: Vec<Option<usize>> = vec![None; stores.len()];
    for &v in keep_at_end {
        let Some(s) = store_of.get(v.0 as usize).copied().flatten() else {
            continue;
        };
        if freed[s] {
            continue;
        }
        let k = *renumber[s].get_or_insert_with(|| {
            kept.stores.push(stores[s].clone());
            kept.stores.len() - 1
        });
        kept.values.push((v, k));
    }
    for (s, st) in stores.iter().enumerate() {
        if !freed[s] && renumber[s].is_none() {
            tally.free(st);
        }
    }
    kept
}

/// The predicted memory of one rank training `p` (forward, then backward) with AdamW.
pub fn predict_memory(p: &Program) -> SimMemory {
    let f = &p.forward;
    let b = &p.backward;
    // parameters: their forward arguments (a sharded parameter's is its bucket's shard), once
    let mut param_args: Vec<usize> = p.params.iter().map(|x| x.forward_arg).collect();
    param_args.sort_unstable();
    param_args.dedup();
    let persistent: Vec<ValueId> = param_args
        .iter()
        .filter_map(|i| f.args().get(*i).copied())
        .collect();
    let params_bytes: usize = persistent.iter().map(|v| tensor_bytes(f, *v)).sum();
    // AdamW keeps state for each tensor the backward returns a gradient for
    let grads = p.gradient_values();
    let mut updated: Vec<usize> = p
        .params
        .iter()
        .filter(|x| {
            x.grad_output
                .and_then(|k| grads.get(k).copied().flatten())
                .is_some()
        })
        .map(|x| x.forward_arg)
        .collect();
    updated.sort_unstable();
    updated.dedup();
    let optimizer_bytes: usize = updated
        .iter()
        .filter_map(|i| f.args().get(*i))
        .filter_map(|v| f.ty(*v).and_then(Type::tensor_type).map(|tt| tt.numel()))
        .map(|n| n * ADAMW_STATE_BYTES_PER_ELEMENT)
        .sum();
    let mut tally = Tally::default();
    let saved_f = p.forward_saved();
    let saved_b = p.backward_saved();
    let none = Kept {
        stores: Vec::new(),
        values: Vec::new(),
    };
    let kept = walk(f, "forward", &persistent, &none, &saved_f, &mut tally);
    // the backward's names of what the forward saved: its storages, or parameters
    let mut carried = Kept {
        stores: kept.stores,
        values: Vec::new(),
    };
    let mut persistent_b = Vec::new();
    for (fv, bv) in saved_f.iter().zip(&saved_b) {
        if persistent.contains(fv) {
            persistent_b.push(*bv);
        } else if let Some((_, s)) = kept.values.iter().find(|(v, _)| v == fv) {
            carried.values.push((*bv, *s));
        }
    }
    walk(b, "backward", &persistent_b, &carried, &[], &mut tally);
    SimMemory {
        params_bytes,
        optimizer_bytes,
        transient_peak_bytes: tally.peak,
        gathered_at_peak_bytes: tally.gathered_at_peak,
        gathered_peak_bytes: tally.gathered_peak,
        peak_in: tally.peak_in,
        peak_bytes: params_bytes + optimizer_bytes + tally.peak,
    }
}
