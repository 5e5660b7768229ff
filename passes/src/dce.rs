//! Dead code elimination: removes pure nodes none of whose outputs is used or returned.

use crate::pass::{Changed, Pass, PassContext, PassError};
use petgraph::visit::{EdgeRef, IntoEdgeReferences, NodeIndexable};
use petgraph::Direction;
use rustc_hash::FxHashSet;
use tracepass_ir::{Edge, Effect, NodeIndex, OpRegistry, Program, Trace, ValueIdSet};

pub struct Dce;

/// Removes dead pure nodes; returns how many. A node's readers are counted from the graph's
/// data edges (one sweep over the edge list, which is compact) rather than by walking every
/// node's operands; each distinct op's effect is looked up once.
pub fn dce(t: &mut Trace, reg: &OpRegistry) -> usize {
    let g = t.graph();
    // readers per node: one per data edge out of it (an operand read twice counts twice)
    let mut readers = vec![0u32; g.node_bound()];
    for e in g.edge_references() {
        if matches!(e.weight(), Edge::Data { .. }) {
            readers[e.source().index()] += 1;
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
            || n.outputs.is_empty()
            || n.outputs.iter().any(|o| returned.contains(o))
        {
            continue;
        }
        dead.push(idx);
        for e in g.edges_directed(idx, Direction::Incoming) {
            if matches!(e.weight(), Edge::Data { .. }) {
                let r = &mut readers[e.source().index()];
                *r = r.saturating_sub(1);
            }
        }
    }
    let removed = dead.len();
    if !dead.is_empty() {
        let dead: FxHashSet<NodeIndex> = dead.into_iter().collect();
        t.retain_nodes(|_, idx| !dead.contains(&idx));
        t.purge_undefined_values();
    }
    removed
}

impl Pass for Dce {
    fn name(&self) -> &str {
        "dce"
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        let n = dce(&mut p.backward, cx.registry);
        cx.stat("dce.removed", n as u64);
        Ok((n > 0).into())
    }
}
