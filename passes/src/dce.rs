//! Dead code elimination: removes pure nodes none of whose outputs is used or returned.

use crate::pass::{Changed, Pass, PassContext, PassError};
use std::collections::HashMap;
use tracepass_ir::{Effect, OpRegistry, Program, Trace, ValueId};

pub struct Dce;

/// Removes dead pure nodes; returns how many.
pub fn dce(t: &mut Trace, reg: &OpRegistry) -> usize {
    let mut uses: HashMap<ValueId, usize> = HashMap::new();
    for (_, n) in t.nodes() {
        n.for_each_operand(&mut |v| *uses.entry(v).or_insert(0) += 1);
    }
    for v in t.returned_values() {
        *uses.entry(v).or_insert(0) += 1;
    }
    let mut dead = std::collections::HashSet::new();
    for &idx in t.schedule().iter().rev() {
        let n = t.node(idx).expect("scheduled");
        if reg.effect(&n.op) != Effect::Pure || n.outputs.is_empty() {
            continue;
        }
        if n.outputs
            .iter()
            .all(|o| uses.get(o).copied().unwrap_or(0) == 0)
        {
            dead.insert(idx);
            n.for_each_operand(&mut |v| {
                if let Some(c) = uses.get_mut(&v) {
                    *c -= 1;
                }
            });
        }
    }
    if !dead.is_empty() {
        t.retain_nodes(|_, idx| !dead.contains(&idx));
        t.purge_undefined_values();
    }
    dead.len()
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
