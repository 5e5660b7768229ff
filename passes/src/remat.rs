//! `remat`: the backward recomputes the saved values that are elementwise functions of other
//! saved values, and the forward stops saving them (Thunder's rematerialization, restricted to
//! what costs no extra read).
//!
//! Thunder saves every intermediate its backward formulas name: GELU's backward reads `x`,
//! `x * x`, `0.5 * x`, `tanh(..)` and `1 + tanh(..)`, five tensors of the MLP's width, each
//! written by the forward and read back by the backward; three of them (and the GELU's output,
//! saved for a weight gradient) are a few multiplies and adds away from `x` and the `tanh`.
//! A saved value is recomputed when the chain of
//! cheap elementwise ops ([`RECOMPUTED`]) that made it in the forward reaches, through values
//! the backward does not have, only saved values that stay saved and numbers: so
//! the backward reads a subset of what it read before, and never a new tensor. The chain is
//! copied into the backward right before the first reader of the value, each value its own
//! copy (so that `fuse-elementwise` can take every copy into its reader's region, where two
//! values sharing one copy would each need it as a tensor).
//! The copies are the forward's ops on the same operands, run by the same kernels, so every
//! value, loss and gradient keeps its bits (the runtime's `remat_training` test).

use crate::pass::{Changed, Pass, PassContext, PassError};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use tracepass_ir::op::{self, Op};
use tracepass_ir::{ops, Arg, Lhs, Node, NodeIndex, Program, Rewriter, Trace, Type, ValueId};

/// The `remat` pass (program-level: it reads the forward and changes both traces).
pub struct Remat;

/// The most forward ops one saved value's recomputation may copy (the GELU's output from `x`
/// and its saved `tanh` needs 3); a value with a longer chain stays saved.
const MAX_CHAIN: usize = 16;

/// The ops a recomputation may copy: arithmetic that costs less than reading its result back
/// from memory. A transcendental (`tanh`, `exp`, `erf`, ...) costs more on a CPU (a vectorised
/// `tanh` is ~3 cycles an element, a read from memory well under one), so its result stays
/// saved and the recomputation starts from it.
pub const RECOMPUTED: &[Op] = &[
    op::ADD,
    op::SUB,
    op::MUL,
    op::NEG,
    op::ABS,
    op::RELU,
    op::MAXIMUM,
    op::MINIMUM,
    op::EXPAND,
    op::UNSQUEEZE,
];

/// Whether `n` may be copied into the backward: a cheap op with one tensor output, whose
/// keyword arguments are literals (only positional operands are mapped to the backward's).
fn recomputable(t: &Trace, n: &Node) -> bool {
    let [out] = n.outputs() else { return false };
    let mut kwarg_values = false;
    for (_, a) in n.kwargs() {
        a.for_each_value(&mut |_| kwarg_values = true);
    }
    RECOMPUTED.iter().any(|f| f.matches(n))
        && !kwarg_values
        && matches!(t.ty(*out), Some(Type::Tensor(_)))
}

/// A dropped saved value (its position among the saved values) and the forward ops, in
/// schedule order, that recompute it.
type Recompute = (usize, Vec<NodeIndex>);

/// How the backward can have a forward value.
#[derive(Clone, Debug)]
enum Source {
    /// It stays saved: the backward reads it.
    Kept,
    /// Recomputed by these forward nodes, in schedule order.
    Chain(Vec<NodeIndex>),
}

/// What to recompute: for each forward value the backward can have, how.
fn plan(fwd: &Trace, saved: &HashSet<ValueId>) -> HashMap<ValueId, Source> {
    let mut how: HashMap<ValueId, Source> = HashMap::default();
    // the forward's arguments the backward has (saved parameters and inputs)
    for a in fwd.args() {
        if saved.contains(a) {
            how.insert(*a, Source::Kept);
        }
    }
    for &idx in fwd.schedule() {
        let Some(n) = fwd.node(idx) else { continue };
        let [out] = n.outputs() else {
            for o in n.outputs() {
                if saved.contains(o) {
                    how.insert(*o, Source::Kept);
                }
            }
            continue;
        };
        let out = *out;
        let chain = recomputable(fwd, n)
            .then(|| {
                let mut chain: Vec<NodeIndex> = Vec::new();
                for v in n.operands() {
                    match how.get(&v)? {
                        Source::Kept => {}
                        Source::Chain(c) => {
                            for m in c {
                                if !chain.contains(m) {
                                    chain.push(*m);
                                }
                            }
                        }
                    }
                }
                chain.push(idx);
                (chain.len() <= MAX_CHAIN).then_some(chain)
            })
            .flatten();
        match chain {
            Some(c) => {
                how.insert(out, Source::Chain(c));
            }
            None if saved.contains(&out) => {
                how.insert(out, Source::Kept);
            }
            None => {}
        }
    }
    how
}

fn failed(message: String) -> PassError {
    PassError::Failed {
        pass: "remat".into(),
        message,
    }
}

impl Pass for Remat {
    fn name(&self) -> &str {
        "remat"
    }
    fn spec(&self) -> String {
        "remat".into()
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        let fwd_saved = p.forward_saved();
        let bwd_saved = p.backward_saved();
        if fwd_saved.is_empty() || fwd_saved.len() != bwd_saved.len() {
            // a lone backward, or saved values not unpacked one by one: nothing to change
            cx.stat("remat.recomputed", 0);
            return Ok(Changed::No);
        }
        let saved: HashSet<ValueId> = fwd_saved.iter().copied().collect();
        let how = plan(&p.forward, &saved);
        let returned: HashSet<ValueId> = p.backward.returned_values().into_iter().collect();
        let mut times_saved: HashMap<ValueId, usize> = HashMap::default();
        for f in &fwd_saved {
            *times_saved.entry(*f).or_default() += 1;
        }
        // a value the forward saves twice, one the backward returns, and one the backward
        // declares with another type than the forward's (the copy would have the forward's)
        // stay saved
        let mut dropped: Vec<usize> = Vec::new();
        for (i, (&f, &b)) in fwd_saved.iter().zip(&bwd_saved).enumerate() {
            let same_type = p.forward.ty(f).is_some() && p.forward.ty(f) == p.backward.ty(b);
            if matches!(how.get(&f), Some(Source::Chain(_)))
                && times_saved[&f] == 1
                && !returned.contains(&b)
                && same_type
            {
                dropped.push(i);
            }
        }
        if dropped.is_empty() {
            cx.stat("remat.recomputed", 0);
            return Ok(Changed::No);
        }
        // a recomputed value's chain may pass through a value that stays saved: read that
        let dropped_values: HashSet<ValueId> = dropped.iter().map(|&i| fwd_saved[i]).collect();
        let positions = p.forward.schedule_positions();
        let chains: Vec<Recompute> = dropped
            .iter()
            .map(|&i| {
                let f = fwd_saved[i];
                let mut chain = match how.get(&f) {
                    Some(Source::Chain(c)) => {
                        trim_at_kept(&p.forward, c, f, &saved, &dropped_values)
                    }
                    _ => Vec::new(),
                };
                // in schedule order, so that each copy comes after what it reads
                chain.sort_by_key(|n| positions.get(n.index()).copied().unwrap_or(u32::MAX));
                (i, chain)
            })
            .collect();
        let mut is_dropped = vec![false; fwd_saved.len()];
        for &i in &dropped {
            is_dropped[i] = true;
        }
        let copied = rewrite_backward(p, &fwd_saved, &bwd_saved, &is_dropped, &chains)?;
        rewrite_forward(p, &is_dropped)?;
        cx.stat("remat.recomputed", dropped.len() as u64);
        cx.stat("remat.copied_ops", copied as u64);
        cx.changed_trace(true);
        cx.changed_trace(false);
        cx.changed_return(true, &[1, 0]);
        Ok(Changed::Yes)
    }
}

/// `chain` (which computes `target`) without the nodes that only feed values the backward
/// reads anyway (saved values that stay saved).
fn trim_at_kept(
    fwd: &Trace,
    chain: &[NodeIndex],
    target: ValueId,
    saved: &HashSet<ValueId>,
    dropped: &HashSet<ValueId>,
) -> Vec<NodeIndex> {
    // walk back from the target, stopping at saved values that stay saved
    let members: HashSet<NodeIndex> = chain.iter().copied().collect();
    let mut keep: Vec<NodeIndex> = Vec::new();
    let mut stack = vec![target];
    let mut visited: HashSet<ValueId> = HashSet::default();
    while let Some(v) = stack.pop() {
        if !visited.insert(v) {
            continue;
        }
        if v != target && saved.contains(&v) && !dropped.contains(&v) {
            continue;
        }
        let Some(n) = fwd.producer(v).filter(|n| members.contains(n)) else {
            continue;
        };
        keep.push(n);
        if let Some(node) = fwd.node(n) {
            stack.extend(node.operands());
        }
    }
    keep
}

/// Copies each dropped value's chain into the backward before the value's first reader,
/// reads the copy instead, and removes the dropped values from the backward's unpack.
/// Returns the number of ops copied.
fn rewrite_backward(
    p: &mut Program,
    fwd_saved: &[ValueId],
    bwd_saved: &[ValueId],
    is_dropped: &[bool],
    chains: &[Recompute],
) -> Result<usize, PassError> {
    let fwd = &p.forward;
    let bwd = &mut p.backward;
    // forward value -> the backward value that holds it
    let mut held: HashMap<ValueId, ValueId> = HashMap::default();
    for ((&f, &b), _) in fwd_saved
        .iter()
        .zip(bwd_saved)
        .zip(is_dropped)
        .filter(|(_, &d)| !d)
    {
        held.entry(f).or_insert(b);
    }
    // each copy goes before its value's first reader (a value the backward never reads needs
    // none); copies are made in the order they are read, so their names follow the schedule
    let pos = bwd.schedule_positions();
    let at = |n: &NodeIndex| pos.get(n.index()).copied().unwrap_or(u32::MAX);
    let mut order: Vec<(u32, NodeIndex, &Recompute)> = chains
        .iter()
        .filter_map(|c| {
            let reader = bwd.users(bwd_saved[c.0]).into_iter().min_by_key(at)?;
            Some((at(&reader), reader, c))
        })
        .collect();
    order.sort_by_key(|(p, _, (i, _))| (*p, *i));
    let mut names = bwd.name_gen();
    let mut rw = Rewriter::new();
    let mut copied = 0;
    for (_, reader, (i, chain)) in order {
        let (f, b) = (fwd_saved[*i], bwd_saved[*i]);
        // each value its own copy of its chain (no value shared between two copies), so
        // that every copied value has the readers of one region
        let mut made: HashMap<ValueId, ValueId> = HashMap::default();
        for &idx in chain {
            let Some(n) = fwd.node(idx) else { continue };
            let out = n.outputs()[0];
            let mut args = n.args().to_vec();
            let mut missing = None;
            for a in &mut args {
                a.map_values(&mut |v| match made.get(&v).or_else(|| held.get(&v)) {
                    Some(&h) => h,
                    None => {
                        missing = Some(v);
                        v
                    }
                });
            }
            if let Some(v) = missing {
                return Err(failed(format!(
                    "recomputing {} needs {}, which the backward does not have",
                    fwd.name(out),
                    fwd.name(v)
                )));
            }
            let ty = fwd
                .ty(out)
                .cloned()
                .ok_or_else(|| failed(format!("{} has no type", fwd.name(out))))?;
            let new = bwd.new_value(names.fresh_for(&ty), ty);
            let mut copy = n.with_operands(args, vec![new]);
            copy.set_subsymbols(Vec::new());
            copy.set_source(None);
            rw.insert_before(reader, copy);
            made.insert(out, new);
            copied += 1;
        }
        let new = *made
            .get(&f)
            .ok_or_else(|| failed(format!("{} was not recomputed", fwd.name(f))))?;
        rw.replace_all_uses(b, new);
    }
    // the unpack of the saved values loses the dropped ones
    let unpack = bwd
        .nodes()
        .find(|(_, n)| {
            n.op == ops::UNPACK_SEQUENCE && n.lhs == Lhs::Unpack && n.outputs() == bwd_saved
        })
        .map(|(i, n)| (i, n.clone()))
        .ok_or_else(|| {
            failed("the backward's unpack of its saved values is not where expected".into())
        })?;
    let outs: Vec<ValueId> = bwd_saved
        .iter()
        .zip(is_dropped)
        .filter(|(_, &d)| !d)
        .map(|(v, _)| *v)
        .collect();
    rw.replace(
        unpack.0,
        unpack.1.with_operands(unpack.1.args().to_vec(), outs),
    );
    rw.apply(bwd).map_err(|e| PassError::rewrite("remat", e))?;
    Ok(copied)
}

/// The forward's saved tuple without the dropped values.
fn rewrite_forward(p: &mut Program, is_dropped: &[bool]) -> Result<(), PassError> {
    let mut ret = p.forward.ret.clone();
    let saved = match &mut ret {
        Arg::Tuple(items) => match items.get_mut(1) {
            Some(Arg::Tuple(s)) => s.first_mut(),
            _ => None,
        },
        _ => None,
    };
    let Some(Arg::Tuple(values) | Arg::List(values)) = saved else {
        return Err(failed(
            "the forward's saved values are not a flat tuple".into(),
        ));
    };
    let mut dropped = is_dropped.iter();
    values.retain(|_| !dropped.next().copied().unwrap_or(false));
    let mut rw = Rewriter::new();
    rw.set_return(ret);
    rw.apply(&mut p.forward)
        .map_err(|e| PassError::rewrite("remat", e))?;
    Ok(())
}
