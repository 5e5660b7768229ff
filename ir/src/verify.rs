//! The verifier: checks every invariant of a trace and reports all violations at once, each
//! with the statement as printed.

use crate::arg::Arg;
use crate::node::{Edge, Lhs, LhsSlot};
use crate::print::print_node_line;
use crate::registry::{ops, MetaOut, OpRegistry};
use crate::trace::Trace;
use crate::types::Type;
use crate::value::{Def, ValueId};
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use rustc_hash::FxHashMap as HashMap;
use std::fmt;

/// One violated invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The statement as printed, or a description of the place (`signature`, `return`).
    pub line: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.line, self.message)
    }
}

/// All the ways a trace failed verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct VerifyError {
    /// The trace's name.
    pub trace: String,
    /// Every violation, in schedule order.
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trace `{}` failed verification ({} error{}):",
            self.trace,
            self.diagnostics.len(),
            if self.diagnostics.len() == 1 { "" } else { "s" }
        )?;
        for d in &self.diagnostics {
            write!(f, "\n  - {d}")?;
        }
        Ok(())
    }
}

/// Verifies with the built-in op registry.
pub fn verify(t: &Trace) -> Result<(), VerifyError> {
    verify_with(t, OpRegistry::builtin())
}

/// Verifies with the ops of `reg`: returns every violation at once.
pub fn verify_with(t: &Trace, reg: &OpRegistry) -> Result<(), VerifyError> {
    let mut v = Verifier {
        t,
        diags: Vec::new(),
    };
    v.run(reg);
    if v.diags.is_empty() {
        Ok(())
    } else {
        Err(VerifyError {
            trace: t.name.clone(),
            diagnostics: v.diags,
        })
    }
}

/// The types a trace returns, by place in its return structure: what the trace's callers
/// (the backward reading the forward's saved values, the optimizer reading gradients) rely on.
/// A trace alone cannot say what it returned before a rewrite, so a pass manager takes these
/// before a pass and checks them after with [`verify_return_types`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReturnTypes(Vec<(Vec<u32>, String, Option<Type>)>);

impl ReturnTypes {
    /// The place (indices into nested tuples, lists and dicts), name and type of every value
    /// `t` returns, in printed order.
    pub fn of(t: &Trace) -> ReturnTypes {
        fn walk(t: &Trace, a: &Arg, path: &mut Vec<u32>, out: &mut ReturnTypes) {
            match a {
                Arg::Value(v) => out.0.push((path.clone(), t.name(*v), t.ty(*v).cloned())),
                Arg::Tuple(xs) | Arg::List(xs) => {
                    for (i, x) in xs.iter().enumerate() {
                        path.push(i as u32);
                        walk(t, x, path, out);
                        path.pop();
                    }
                }
                Arg::Dict(kv) => {
                    for (i, (_, x)) in kv.iter().enumerate() {
                        path.push(i as u32);
                        walk(t, x, path, out);
                        path.pop();
                    }
                }
                _ => {}
            }
        }
        let mut out = ReturnTypes(Vec::new());
        walk(t, &t.ret, &mut Vec::new(), &mut out);
        out
    }
    /// The same places but those at or under any of `places` (paths as [`ReturnTypes::of`]
    /// gives them; `[]` is the whole return): what is left to check when a pass changes
    /// those on purpose.
    pub fn without(&self, places: &[Vec<u32>]) -> ReturnTypes {
        ReturnTypes(
            self.0
                .iter()
                .filter(|(path, _, _)| !places.iter().any(|p| path.starts_with(p)))
                .cloned()
                .collect(),
        )
    }
}

/// Checks that every place of `t`'s return structure that held a value before (`before`) and
/// holds one now has the same type (names may change: a fold returns `x` in place of
/// `x * 1.0`; a place may become `None`, as DDP returns a tied gradient once).
pub fn verify_return_types(t: &Trace, before: &ReturnTypes) -> Result<(), VerifyError> {
    let now = ReturnTypes::of(t);
    let was: HashMap<&[u32], (&str, &Option<Type>)> = before
        .0
        .iter()
        .map(|(p, n, ty)| (p.as_slice(), (n.as_str(), ty)))
        .collect();
    let show = |t: &Option<Type>| t.as_ref().map_or("?".into(), |t| t.to_string());
    let diagnostics: Vec<Diagnostic> = now
        .0
        .iter()
        .filter_map(|(path, name, ty)| {
            let (was_name, was_ty) = was.get(path.as_slice())?;
            (ty != *was_ty).then(|| Diagnostic {
                line: "return".into(),
                message: format!(
                    "returned `{name}` is \"{}\"; it was `{was_name}`, \"{}\"",
                    show(ty),
                    show(was_ty)
                ),
            })
        })
        .collect();
    if diagnostics.is_empty() {
        Ok(())
    } else {
        Err(VerifyError {
            trace: t.name.clone(),
            diagnostics,
        })
    }
}

struct Verifier<'a> {
    t: &'a Trace,
    diags: Vec<Diagnostic>,
}

impl Verifier<'_> {
    fn at(&mut self, idx: NodeIndex, msg: String) {
        self.diags.push(Diagnostic {
            line: print_node_line(self.t, idx),
            message: msg,
        });
    }
    fn at_place(&mut self, place: &str, msg: String) {
        self.diags.push(Diagnostic {
            line: place.to_string(),
            message: msg,
        });
    }

    fn run(&mut self, reg: &OpRegistry) {
        let t = self.t;
        let n_ids = t
            .values()
            .map(|(id, _)| id.0 as usize + 1)
            .max()
            .unwrap_or(0);
        // unique names
        let mut names: HashMap<&str, ValueId> = HashMap::default();
        names.reserve(t.value_count());
        for (id, v) in t.values() {
            if names.insert(v.name, id).is_some() {
                self.at_place(
                    "value table",
                    format!("name `{}` is used by two values", v.name),
                );
            }
            if v.ty.is_oversized() {
                self.at_place(
                    "value table",
                    format!(
                        "`{}` has type {}, over {} bytes",
                        v.name,
                        v.ty,
                        crate::types::MAX_TENSOR_BYTES
                    ),
                );
            }
        }
        // schedule is a permutation of the graph's nodes
        // schedule position by node index (a dense table)
        let mut pos: Vec<usize> =
            vec![usize::MAX; petgraph::visit::NodeIndexable::node_bound(t.graph())];
        for (i, idx) in t.schedule().iter().enumerate() {
            if t.node(*idx).is_none() || idx.index() >= pos.len() {
                self.at_place("schedule", format!("position {i} names a removed node"));
            } else if std::mem::replace(&mut pos[idx.index()], i) != usize::MAX {
                self.at(*idx, "scheduled twice".into());
            }
        }
        for idx in t.graph().node_indices() {
            if pos.get(idx.index()).is_none_or(|p| *p == usize::MAX) {
                self.at(idx, "in the graph but not in the schedule".into());
            }
        }
        // definitions
        let mut defined = vec![false; n_ids];
        for (i, a) in t.args().iter().enumerate() {
            match t.value(*a) {
                Some(v) if v.def == Def::Arg(i as u32) => defined[a.0 as usize] = true,
                Some(v) => self.at_place(
                    "signature",
                    format!("argument `{}` is not defined as argument {i}", v.name),
                ),
                None => self.at_place(
                    "signature",
                    format!("argument {i} is not in the value table"),
                ),
            }
        }
        let mut future_waits: HashMap<ValueId, usize> = HashMap::default();
        // buffers an all-reduce or a reduce-scatter works on in place, and which op took them
        let mut reduced_buffers: HashMap<ValueId, (NodeIndex, &str)> = HashMap::default();
        // (producer, value) per operand read, and per incoming data edge
        let mut want: Vec<(NodeIndex, ValueId)> = Vec::new();
        let mut have: Vec<(NodeIndex, ValueId)> = Vec::new();
        for (i, &idx) in t.schedule().iter().enumerate() {
            let Some(node) = t.node(idx) else { continue };
            let mut problems = Vec::new();
            node.for_each_operand(&mut |v| match t.value(v) {
                None => problems.push(format!("uses {v}, which is not in the value table")),
                Some(val) if !defined.get(v.0 as usize).copied().unwrap_or(false) => {
                    problems.push(format!("uses `{}` before it is defined", val.name))
                }
                Some(val) => {
                    if let Some((r, op)) = reduced_buffers.get(&v) {
                        if *r != idx {
                            problems
                                .push(format!("uses `{}` after it was handed to {op}", val.name));
                        }
                    }
                    if val.ty.is_future() {
                        if node.op == ops::WAIT {
                            *future_waits.entry(v).or_insert(0) += 1;
                        } else {
                            problems.push(format!(
                                "uses future `{}`; only {} may consume a future",
                                val.name,
                                ops::WAIT
                            ));
                        }
                    }
                }
            });
            for (k, o) in node.outputs.iter().enumerate() {
                match t.value(*o) {
                    None => problems.push(format!("defines {o}, which is not in the value table")),
                    Some(val) => {
                        if val.def != Def::Node(idx, k as u32) {
                            problems.push(format!("`{}` has another definition", val.name));
                        }
                        if let Some(d) = defined.get_mut(o.0 as usize) {
                            if *d {
                                problems.push(format!("`{}` is defined twice", val.name));
                            }
                            *d = true;
                        }
                    }
                }
            }
            // a nested left-hand side has its places, one name per output
            match (node.lhs, node.lhs_pattern()) {
                (Lhs::Nested, None) => {
                    problems.push("a nested left-hand side without its places".into())
                }
                (Lhs::Nested, Some(p)) if LhsSlot::count_outputs(p) != node.outputs.len() => {
                    problems.push(format!(
                        "its left-hand side names {} places for {} outputs",
                        LhsSlot::count_outputs(p),
                        node.outputs.len()
                    ))
                }
                (Lhs::Nested, Some(_)) | (_, None) => {}
                (lhs, Some(_)) => problems.push(format!(
                    "the places of a nested left-hand side on a {lhs:?} binding"
                )),
            }
            // an all-gather only reads its shard (the backward may gather it again)
            if node.op == ops::ALL_REDUCE || node.op == ops::REDUCE_SCATTER {
                let op = if node.op == ops::ALL_REDUCE {
                    ops::ALL_REDUCE
                } else {
                    ops::REDUCE_SCATTER
                };
                if let Some(b) = node.args.first().and_then(|a| a.as_value()) {
                    reduced_buffers.insert(b, (idx, op));
                }
            }
            // the graph's data edges into the node are its operands' producers, one per read
            want.clear();
            have.clear();
            node.for_each_operand(&mut |v| {
                if let Some(p) = t.producer(v) {
                    want.push((p, v));
                }
            });
            for e in t.graph().edges_directed(idx, petgraph::Direction::Incoming) {
                if let Edge::Data { value } = e.weight() {
                    have.push((e.source(), *value));
                }
            }
            if want != have {
                want.sort_unstable();
                have.sort_unstable();
                if want != have {
                    for (p, v) in &have {
                        if !want.contains(&(*p, *v)) {
                            problems.push(format!(
                                "stale graph edge: an edge from `{}` says it reads `{}`, which it does not",
                                print_node_line(t, *p),
                                t.name(*v)
                            ));
                        }
                    }
                    for (_, v) in &want {
                        if !have.iter().any(|(_, h)| h == v) {
                            problems.push(format!(
                                "stale graph edge: it reads `{}` but no edge comes from its producer",
                                t.name(*v)
                            ));
                        }
                    }
                    if problems.is_empty() {
                        problems.push(format!(
                            "stale graph edges: {} data edges for {} operand reads",
                            have.len(),
                            want.len()
                        ));
                    }
                }
            }
            // edges point forward in the schedule
            for e in t.graph().edges_directed(idx, petgraph::Direction::Outgoing) {
                if let Some(&j) = pos.get(e.target().index()).filter(|j| **j != usize::MAX) {
                    if j <= i {
                        let what = match e.weight() {
                            Edge::Data { value } => format!("its output `{}`", t.name(*value)),
                            Edge::Order => "an order edge".into(),
                        };
                        problems.push(format!(
                            "schedule is not topological: {what} is needed by `{}`, scheduled earlier",
                            print_node_line(t, e.target())
                        ));
                    }
                }
            }
            // op and meta
            match reg.get(&node.op) {
                // an opaque node: its declared types are trusted
                None if reg.allows_unregistered() => {}
                None => problems.push(format!("unknown op `{}`", node.op)),
                Some(_) if problems.is_empty() => {
                    match reg.infer_node(t, node) {
                        Err(m) => problems.push(m),
                        // `infer_node` binds nested places to types
                        Ok(MetaOut::Declared | MetaOut::Places(_)) => {}
                        Ok(MetaOut::Types(types)) => {
                            if types.len() != node.outputs.len() {
                                problems.push(format!(
                                    "{} gives {} outputs, the statement binds {}",
                                    node.op,
                                    types.len(),
                                    node.outputs.len()
                                ));
                            } else {
                                for (o, want) in node.outputs.iter().zip(types) {
                                    if let Some(have) = t.ty(*o) {
                                        if !type_matches(have, &want) {
                                            problems.push(format!(
                                                "`{}` is declared \"{have}\" but {} gives \"{want}\"",
                                                t.name(*o),
                                                node.op
                                            ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                Some(_) => {}
            }
            for p in problems {
                self.at(idx, p);
            }
        }
        // the return
        for v in t.returned_values() {
            match t.value(v) {
                None => self.at_place(
                    "return",
                    format!("returns {v}, which is not in the value table"),
                ),
                Some(val) if !defined.get(v.0 as usize).copied().unwrap_or(false) => self.at_place(
                    "return",
                    format!("returns `{}`, which is never defined", val.name),
                ),
                Some(val) if val.ty.is_future() => self.at_place(
                    "return",
                    format!("returns future `{}` instead of waiting on it", val.name),
                ),
                _ => {}
            }
        }
        // every future waited exactly once
        let mut futures: Vec<(ValueId, &str)> = t
            .values()
            .filter(|(_, v)| v.ty.is_future() && v.def != Def::Undefined)
            .map(|(id, v)| (id, v.name))
            .collect();
        futures.sort_unstable();
        for (id, name) in futures {
            let n = future_waits.get(&id).copied().unwrap_or(0);
            if n != 1 {
                let msg = format!("future `{name}` is waited {n} times (must be exactly once)");
                match t.producer(id) {
                    Some(p) => self.at(p, msg),
                    None => self.at_place("signature", msg),
                }
            }
        }
    }
}

/// Declared types may leave scalar values unknown where the meta knows them, and vice versa.
fn type_matches(have: &Type, want: &Type) -> bool {
    match (have, want) {
        (Type::Int(_), Type::Int(_))
        | (Type::Float(_), Type::Float(_))
        | (Type::Bool(_), Type::Bool(_)) => true,
        (_, Type::Any) | (Type::Any, _) => true,
        _ => have == want,
    }
}

#[cfg(test)]
mod tests {
    use crate::{parse_trace, Arg};

    const SRC: &str = "def f(x):\n  # x: \"cpu f32[4]\"\n  a = prims.neg(x)  # a: \"cpu f32[4]\"\n  b = prims.neg(a)  # b: \"cpu f32[4]\"\n  c = prims.add(a, b)  # c: \"cpu f32[4]\"\n  return c\n";

    #[test]
    fn an_operand_edited_without_its_edge_is_reported_as_a_stale_edge() {
        let mut t = parse_trace(SRC).unwrap();
        super::verify(&t).unwrap();
        let [x, c] = ["x", "c"].map(|n| t.find_value(n).unwrap());
        let add = t.producer(c).unwrap();
        // `c = prims.add(x, b)` by hand: the edge from `a`'s producer stays
        t.node_mut(add).unwrap().args[0] = Arg::Value(x);
        let e = super::verify(&t).unwrap_err();
        assert!(
            e.diagnostics
                .iter()
                .any(|d| d.line.contains("c = prims.add(x, b)")
                    && d.message.contains("stale graph edge")
                    && d.message.contains("`a`")),
            "{e}"
        );
        // rebuilding the node's edges makes it valid again
        t.rewire_node(add);
        super::verify(&t).unwrap();
        // and a missing edge is reported too
        let a = t.find_value("a").unwrap();
        t.node_mut(add).unwrap().args[0] = Arg::Value(a);
        let e = super::verify(&t).unwrap_err();
        assert!(
            e.diagnostics.iter().any(|d| d
                .message
                .contains("reads `a` but no edge comes from its producer")),
            "{e}"
        );
    }
}
