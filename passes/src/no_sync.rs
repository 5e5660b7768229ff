//! no-sync: removes gradient synchronization (division by the world size, pack, all-reduce, wait,
//! unpack, bucket views) so a backward computes local gradients again: the step of gradient
//! accumulation, or the first step of re-bucketing Thunder's own DDP output.

use crate::pass::{Changed, PassContext, PassError, TracePass};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use tracepass_ir::{ops, Arg, RewriteError, Rewriter, Trace, ValueId};

/// The `no-sync` pass (trace-level).
pub struct NoSync;

const DIVS: &[&str] = &[ops::DIV, ops::TRUE_DIVIDE, "ltorch.div"];

/// The local gradient behind a synchronized one: strips bucket views and divisions by a constant.
fn strip(t: &Trace, mut v: ValueId, removable: &mut HashSet<tracepass_ir::NodeIndex>) -> ValueId {
    loop {
        let Some(p) = t.producer(v) else { return v };
        let n = t.node(p).expect("producer");
        let is_view = n.op == ops::UPDATE_BUCKET_VIEW;
        let is_const_div =
            DIVS.contains(&n.op.as_str()) && n.args().get(1).and_then(Arg::as_f64).is_some();
        let next = if is_view || is_const_div {
            n.args().first().and_then(Arg::as_value)
        } else {
            None
        };
        match next {
            Some(x) => {
                removable.insert(p);
                v = x;
            }
            None => return v,
        }
    }
}

/// Removes synchronization; returns the number of collectives removed.
pub fn no_sync(t: &mut Trace) -> Result<usize, RewriteError> {
    let mut removable = HashSet::default();
    let mut replace: HashMap<ValueId, ValueId> = HashMap::default();
    let reduces: Vec<_> = t
        .nodes()
        .filter(|(_, n)| n.op == ops::ALL_REDUCE)
        .map(|(i, _)| i)
        .collect();
    for ar in &reduces {
        removable.insert(*ar);
        let ar_node = t.node(*ar).expect("all-reduce");
        let (Some(buf), Some(fut)) = (
            ar_node.args().first().and_then(Arg::as_value),
            ar_node.outputs().first().copied(),
        ) else {
            continue;
        };
        // the local values going in
        let pack = t
            .producer(buf)
            .filter(|p| t.node(*p).is_some_and(|n| n.op == ops::BUCKET_PACK));
        let members: Option<Vec<ValueId>> = pack.map(|p| {
            removable.insert(p);
            t.node(p)
                .and_then(|n| n.args().first())
                .and_then(Arg::as_seq)
                .map_or_else(Vec::new, |s| s.iter().filter_map(Arg::as_value).collect())
        });
        // the synchronized values coming out
        for w in t.users(fut) {
            let wn = t.node(w).expect("wait");
            if wn.op != ops::WAIT {
                continue;
            }
            removable.insert(w);
            let Some(&reduced) = wn.outputs().first() else {
                continue;
            };
            match &members {
                None => {
                    let local = strip(t, buf, &mut removable);
                    replace.insert(reduced, local);
                }
                Some(ms) => {
                    for u in t.users(reduced) {
                        let un = t.node(u).expect("unpack");
                        if un.op != ops::UNPACK {
                            continue;
                        }
                        removable.insert(u);
                        // Thunder's unpack names template tensors; ours follows the pack order
                        let sources: Vec<ValueId> = match un.args().get(1).and_then(Arg::as_seq) {
                            Some(tpl) => tpl.iter().filter_map(Arg::as_value).collect(),
                            None => ms.clone(),
                        };
                        for (o, s) in un.outputs().to_vec().into_iter().zip(sources) {
                            let local = strip(t, s, &mut removable);
                            replace.insert(o, local);
                        }
                    }
                }
            }
        }
        if let Some(ms) = &members {
            for m in ms {
                strip(t, *m, &mut removable);
            }
        }
    }
    // post-averaging divisions of the synchronized values
    let mut extra = HashMap::default();
    for (&synced, &local) in &replace {
        for u in t.users(synced) {
            let n = t.node(u).expect("user");
            if DIVS.contains(&n.op.as_str()) && n.args().get(1).and_then(Arg::as_f64).is_some() {
                if let Some(&o) = n.outputs().first() {
                    removable.insert(u);
                    extra.insert(o, local);
                }
            }
        }
    }
    replace.extend(extra);
    let mut rw = Rewriter::new();
    for (old, new) in &replace {
        rw.replace_all_uses(*old, *new);
    }
    rw.apply(t)?;
    let n = reduces.len();
    // remove the synchronization nodes whose outputs nothing else needs
    let returned: HashSet<ValueId> = t.returned_values().into_iter().collect();
    let still_used = |t: &Trace, idx| {
        t.node(idx).is_some_and(|n| {
            n.outputs()
                .iter()
                .any(|o| returned.contains(o) || t.users(*o).iter().any(|u| !removable.contains(u)))
        })
    };
    let mut keep: HashSet<_> = removable
        .iter()
        .copied()
        .filter(|i| still_used(t, *i))
        .collect();
    // a kept node keeps what it reads (a reduced buffer used other than through an unpack keeps
    // its wait, all-reduce and pack), so the result never refers to a removed value
    let mut work: Vec<_> = keep.iter().copied().collect();
    while let Some(idx) = work.pop() {
        let Some(n) = t.node(idx) else { continue };
        n.for_each_operand(&mut |v| {
            if let Some(p) = t.producer(v) {
                if removable.contains(&p) && keep.insert(p) {
                    work.push(p);
                }
            }
        });
    }
    let mut rw = Rewriter::new();
    for idx in t.schedule() {
        if removable.contains(idx) && !keep.contains(idx) {
            rw.erase(*idx);
        }
    }
    rw.apply(t)?;
    Ok(n)
}

impl TracePass for NoSync {
    fn name(&self) -> &str {
        "no-sync"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        if crate::fsdp::shards(t) {
            // an fsdp backward returns gradient shards: without its reduce-scatters it would
            // return whole local gradients where the program promises shards
            return Err(PassError::Failed {
                pass: "no-sync".into(),
                message: "the trace reduce-scatters gradient shards (fsdp): removing the reduce-scatters would return whole gradients where shards are expected; accumulate with `fsdp(...),accumulate-grads` (each micro-step reduce-scatters and adds up its shard), or run `accumulate-grads,fsdp(...)` on the unsharded program".into(),
            });
        }
        let n = no_sync(t).map_err(|e| PassError::rewrite("no-sync", e))?;
        cx.stat("no-sync.collectives_removed", n as u64);
        Ok((n > 0).into())
    }
}
