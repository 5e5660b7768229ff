//! accumulate-grads: the synchronized step of gradient accumulation. Each parameter gradient
//! gets a new backward argument `acc_<grad>` (the sum of the earlier micro-steps' local
//! gradients) added to it right after it is produced, so a later `ddp` reduces the total.

use crate::pass::{Changed, Pass, PassContext, PassError};
use rustc_hash::FxHashMap as HashMap;
use tracepass_ir::{Arg, Node, Program, Rewriter, ValueId};

/// The `accumulate-grads` pass (program-level: it needs the parameters).
pub struct AccumulateGrads;

/// The op the added nodes run.
pub const ADD: &str = "ltorch.add";

impl Pass for AccumulateGrads {
    fn name(&self) -> &str {
        "accumulate-grads"
    }
    fn spec(&self) -> String {
        "accumulate-grads".into()
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        if p.params.is_empty() {
            return Err(PassError::Failed {
                pass: "accumulate-grads".into(),
                message: "no parameter metadata: give a program, or pair the backward with its forward (--forward FILE)".into(),
            });
        }
        let grads = p.gradient_values();
        let mut targets: Vec<(usize, ValueId)> = Vec::new();
        // every trainable parameter, each member of a tie included: a tie's gradients are
        // returned per member and added up later (by `ddp`), so each must carry its own total
        for param in &p.params {
            if !param.requires_grad || param.buffer {
                continue;
            }
            if let Some(i) = param.grad_output {
                if let Some(Some(g)) = grads.get(i) {
                    if !targets.iter().any(|(_, v)| v == g) {
                        targets.push((i, *g));
                    }
                }
            }
        }
        let t = &mut p.backward;
        let mut names = t.name_gen();
        let mut rw = Rewriter::new();
        let mut replaced: HashMap<ValueId, ValueId> = HashMap::default();
        for (_, g) in &targets {
            let ty = t.ty(*g).cloned().ok_or_else(|| PassError::Failed {
                pass: "accumulate-grads".into(),
                message: format!("gradient {g} has no type"),
            })?;
            let mut acc_name = format!("acc_{}", t.name(*g));
            while t.find_value(&acc_name).is_some() {
                acc_name.insert(0, '_');
            }
            let acc = t.push_arg(acc_name, ty.clone());
            let sum = t.new_value(names.fresh_for(&ty), ty);
            let add = Node::new(ADD, vec![Arg::Value(*g), Arg::Value(acc)], vec![sum]);
            match t.producer(*g) {
                Some(n) => rw.insert_after(n, add),
                None => rw.insert_at_start(add),
            };
            replaced.insert(*g, sum);
        }
        // only the returned gradients change; other readers keep the local value
        let mut ret = t.ret.clone();
        if let Arg::Tuple(items) | Arg::List(items) = &mut ret {
            for (i, g) in &targets {
                if let Some(slot) = items.get_mut(*i) {
                    if slot.as_value() == Some(*g) {
                        *slot = Arg::Value(replaced[g]);
                    }
                }
            }
        }
        rw.set_return(ret);
        rw.apply(t)
            .map_err(|e| PassError::rewrite("accumulate-grads", e))?;
        cx.stat("accumulate-grads.gradients", targets.len() as u64);
        // only the backward changes
        cx.changed_trace(false);
        Ok(Changed::from(!targets.is_empty()))
    }
}
