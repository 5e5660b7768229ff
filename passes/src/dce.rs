//! Dead code elimination: removes pure nodes none of whose outputs is used or returned.

use crate::pass::{Changed, PassContext, PassError, TracePass};
use tracepass_ir::{
    Edge, Effect, NodeIndex, OpRegistry, RewriteError, Rewriter, Trace, ValueIdSet,
};

/// The `dce` pass (trace-level).
pub struct Dce;

/// Removes dead pure nodes; returns how many. A node's readers are counted from the graph's
/// data edges (one sweep over the edge list, which is compact) rather than by walking every
/// node's operands; each distinct op's effect is looked up once.
pub fn dce(t: &mut Trace, reg: &OpRegistry) -> Result<usize, RewriteError> {
    // readers per node: one per data edge out of it (an operand read twice counts twice)
    let mut readers = vec![0u32; t.node_bound()];
    for (source, _, e) in t.edges() {
        if matches!(e, Edge::Data { .. }) {
            readers[source.index()] += 1;
        }
    }
    let returned: ValueIdSet = t.returned_values().into_iter().collect();
    let mut effects = reg.effects();
    let mut dead: Vec<NodeIndex> = Vec::new();
    // reverse schedule order: a node's readers come after it, so they are settled first
    for &idx in t.schedule().iter().rev() {
        if readers[idx.index()] != 0 {
            continue;
        }
        let Some(n) = t.node(idx) else { continue };
        if effects.effect(&n.op) != Effect::Pure
            || n.outputs().is_empty()
            || n.outputs().iter().any(|o| returned.contains(o))
        {
            continue;
        }
        dead.push(idx);
        for (source, e) in t.predecessors(idx) {
            if matches!(e, Edge::Data { .. }) {
                let r = &mut readers[source.index()];
                *r = r.saturating_sub(1);
            }
        }
    }
    let removed = dead.len();
    let mut rw = Rewriter::new();
    // in schedule order
    for idx in dead.into_iter().rev() {
        rw.erase(idx);
    }
    rw.apply(t)?;
    Ok(removed)
}

impl TracePass for Dce {
    fn name(&self) -> &str {
        "dce"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        let n = dce(t, cx.registry).map_err(|e| PassError::rewrite("dce", e))?;
        cx.stat("dce.removed", n as u64);
        Ok((n > 0).into())
    }
}
