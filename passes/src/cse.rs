//! Common subexpression elimination: a pure node identical to an earlier one (same op, same
//! operands) is replaced by it.

use crate::pass::{Changed, Pass, PassContext, PassError};
use rustc_hash::FxHashMap as HashMap;
use tracepass_ir::{ops, Effect, OpRegistry, Program, Trace};

pub struct Cse;

/// Merges duplicates; returns how many nodes were removed.
pub fn cse(t: &mut Trace, reg: &OpRegistry) -> usize {
    let mut seen: HashMap<String, tracepass_ir::NodeIndex> = HashMap::default();
    let mut dupes = Vec::new();
    let mut effects = reg.effects();
    for (idx, n) in t.nodes() {
        if effects.effect(&n.op) != Effect::Pure
            || n.op == ops::UNPACK_SEQUENCE
            || n.outputs.is_empty()
        {
            continue;
        }
        let key = format!("{}|{:?}|{:?}", n.op, n.args, n.kwargs());
        match seen.get(&key) {
            Some(&first) => dupes.push((idx, first)),
            None => {
                seen.insert(key, idx);
            }
        }
    }
    for (dup, first) in &dupes {
        let (a, b) = (
            t.node(*dup).expect("dup").outputs.clone(),
            t.node(*first).expect("first").outputs.clone(),
        );
        for (old, new) in a.into_iter().zip(b) {
            t.replace_all_uses(old, new);
        }
    }
    if !dupes.is_empty() {
        let gone: rustc_hash::FxHashSet<_> = dupes.iter().map(|d| d.0).collect();
        t.retain_nodes(|_, idx| !gone.contains(&idx));
        t.purge_undefined_values();
    }
    dupes.len()
}

impl Pass for Cse {
    fn name(&self) -> &str {
        "cse"
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        let n = cse(&mut p.backward, cx.registry);
        cx.stat("cse.removed", n as u64);
        Ok((n > 0).into())
    }
}
