//! Predicted memory per rank: the forward's and the backward's memory plans
//! ([`crate::exec::MemoryPlan`], the same plans the executor runs with).

use crate::exec::{Plan, PlanError};
use serde::Serialize;
use tracepass_ir::{Arg, Program};

/// Bytes one rank holds in a step, by what holds them (the optimizer's state not included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// The forward's tensor arguments: parameters and the batch.
    pub inputs_bytes: u64,
    /// The forward's arena: its intermediates.
    pub forward_arena_bytes: u64,
    /// What the forward returns: the output and the saved activations.
    pub forward_results_bytes: u64,
    /// The backward's arguments: the saved activations and the output's gradient.
    pub saved_bytes: u64,
    /// The backward's arena: its intermediates and buckets.
    pub backward_arena_bytes: u64,
    /// The gradients the backward returns.
    pub gradients_bytes: u64,
    /// The arena of the rank: the larger of the two, which run in turn over it.
    pub arena_bytes: u64,
    /// `inputs + max(forward arena + forward results, saved + backward arena + gradients)`.
    pub peak_bytes: u64,
}

/// Plans the forward and the backward of `program` (as `train` compiles them) and adds up
/// what one rank holds at the busiest point of a step.
pub fn predicted_memory(program: &Program) -> Result<MemoryEstimate, PlanError> {
    let mut fwd_results = Vec::new();
    program
        .forward
        .ret
        .for_each_value(&mut |v| fwd_results.push(Some(v)));
    let forward = Plan::compile(&program.forward, &fwd_results)?;
    let grads = match &program.backward.ret {
        Arg::Tuple(items) | Arg::List(items) => items.iter().map(Arg::as_value).collect(),
        _ => Vec::new(),
    };
    let backward = Plan::compile(&program.backward, &grads)?;
    let (f, b) = (&forward.memory, &backward.memory);
    Ok(MemoryEstimate {
        inputs_bytes: f.input_bytes,
        forward_arena_bytes: f.arena_bytes,
        forward_results_bytes: f.result_bytes,
        saved_bytes: b.input_bytes,
        backward_arena_bytes: b.arena_bytes,
        gradients_bytes: b.result_bytes,
        arena_bytes: f.arena_bytes.max(b.arena_bytes),
        peak_bytes: f.input_bytes
            + (f.arena_bytes + f.result_bytes).max(b.input_bytes + b.arena_bytes + b.result_bytes),
    })
}
