//! Dead code elimination: removes pure nodes none of whose outputs is used or returned.

use crate::pass::{Changed, Pass, PassContext, PassError};
use rustc_hash::{FxHashMap, FxHashSet};
use tracepass_ir::{Effect, NodeIndex, OpRegistry, Program, Trace, ValueId};

pub struct Dce;

/// Removes dead pure nodes; returns how many. Use counts live in a table indexed by value id,
/// and each distinct op's effect is looked up once.
pub fn dce(t: &mut Trace, reg: &OpRegistry) -> usize {
    let mut uses: Vec<u32> = vec![0; t.value_bound()];
    let bump = |v: ValueId, uses: &mut Vec<u32>| {
        if let Some(c) = uses.get_mut(v.0 as usize) {
            *c += 1;
        }
    };
    for (_, n) in t.nodes() {
        n.for_each_operand(&mut |v| bump(v, &mut uses));
    }
    for v in t.returned_values() {
        bump(v, &mut uses);
    }
    // keyed by where the op's name is stored (one address per built-in op): no string hashing
    let mut pure: FxHashMap<usize, bool> = FxHashMap::default();
    let mut dead: Vec<NodeIndex> = Vec::new();
    for &idx in t.schedule().iter().rev() {
        let Some(n) = t.node(idx) else { continue };
        let is_pure = *pure
            .entry(n.op.addr())
            .or_insert_with(|| reg.effect(&n.op) == Effect::Pure);
        if !is_pure || n.outputs.is_empty() {
            continue;
        }
        if n.outputs
            .iter()
            .all(|o| uses.get(o.0 as usize).copied().unwrap_or(0) == 0)
        {
            dead.push(idx);
            n.for_each_operand(&mut |v| {
                if let Some(c) = uses.get_mut(v.0 as usize) {
                    *c = c.saturating_sub(1);
                }
            });
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
