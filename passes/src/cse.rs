//! Common subexpression elimination: a pure node identical to an earlier one (same op, same
//! operands) is replaced by it.

use crate::pass::{Changed, PassContext, PassError, TracePass};
use rustc_hash::FxHashMap as HashMap;
use tracepass_ir::{ops, Effect, OpRegistry, RewriteError, Rewriter, Trace};

/// The `cse` pass (trace-level).
pub struct Cse;

/// Merges duplicates; returns how many nodes were removed.
pub fn cse(t: &mut Trace, reg: &OpRegistry) -> Result<usize, RewriteError> {
    let mut seen: HashMap<String, tracepass_ir::NodeIndex> = HashMap::default();
    let mut dupes = Vec::new();
    let mut effects = reg.effects();
    for (idx, n) in t.nodes() {
        if effects.effect(&n.op) != Effect::Pure
            || n.op == ops::UNPACK_SEQUENCE
            || n.outputs().is_empty()
        {
            continue;
        }
        let key = format!("{}|{:?}|{:?}", n.op, n.args(), n.kwargs());
        match seen.get(&key) {
            Some(&first) => dupes.push((idx, first)),
            None => {
                seen.insert(key, idx);
            }
        }
    }
    let mut rw = Rewriter::new();
    for (dup, first) in &dupes {
        let (a, b) = (
            t.node(*dup).expect("dup").outputs(),
            t.node(*first).expect("first").outputs(),
        );
        for (old, new) in a.iter().zip(b) {
            rw.replace_all_uses(*old, *new);
        }
        rw.erase(*dup);
    }
    rw.apply(t)?;
    Ok(dupes.len())
}

impl TracePass for Cse {
    fn name(&self) -> &str {
        "cse"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        let n = cse(t, cx.registry).map_err(|e| PassError::rewrite("cse", e))?;
        cx.stat("cse.removed", n as u64);
        Ok((n > 0).into())
    }
}
