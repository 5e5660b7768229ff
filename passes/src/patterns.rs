//! Declarative rewrite patterns and a greedy driver, in the spirit of MLIR's DRR and
//! `applyPatternsGreedily` and of egg's `rewrite!`: a [`Pattern`] names a source shape (an op
//! and its operands, nested ops included), guards (types, constants, readers) and a
//! replacement; [`apply_patterns_greedily`] applies a set of them to a fixed point.
//!
//! ```
//! use tracepass_ir::{op, parse_trace, print_trace, OpRegistry};
//! use tracepass_passes::patterns::{apply_patterns_greedily, Guard, Operand, Pattern, Rewrite};
//! // -(-x) -> x
//! static NEG_NEG: Pattern = Pattern {
//!     name: "neg-neg",
//!     root: op::NEG,
//!     operands: &[Operand::Node(op::NEG, &[Operand::Bind("x")])],
//!     commutative: false,
//!     guards: &[Guard::SameType("x")],
//!     rewrite: Rewrite::Value("x"),
//! };
//! let mut t = parse_trace(
//!     "def f(x):\n  # x: \"cpu f32[4]\"\n  a = prims.neg(x)  # a: \"cpu f32[4]\"\n  b = prims.neg(a)  # b: \"cpu f32[4]\"\n  return b\n",
//! )
//! .unwrap();
//! let applied = apply_patterns_greedily(&mut t, &[&NEG_NEG], OpRegistry::builtin()).unwrap();
//! assert_eq!(applied.total(), 1);
//! assert!(print_trace(&t).contains("return x"));
//! ```

use std::collections::BTreeMap;
use tracepass_ir::op::Op;
use tracepass_ir::{
    literal_fits, Arg, Effect, Node, NodeIndex, OpRegistry, RewriteError, Rewriter, Trace, ValueId,
};

/// What an operand of a source shape matches.
#[derive(Clone, Copy, Debug)]
pub enum Operand {
    /// Any value of the trace, bound to a name the guards and the rewrite refer to.
    Bind(&'static str),
    /// A number literal equal to this one: an integer or a float, compared by value, and a
    /// float zero by its sign too (`-0.0` is not `0.0` here).
    Number(f64),
    /// A number literal (an integer or a float, not a bool), bound to a name
    /// ([`Bindings::literal`]): what a constant fold computes with.
    Literal(&'static str),
    /// Anything (a value or a literal), not bound.
    Any,
    /// A value defined by a node of `op` whose positional operands match these.
    Node(Op, &'static [Operand]),
    /// Any further operands (last only: `reshape(x, *shape)`).
    Rest,
}

/// A condition a match must meet.
#[derive(Clone, Copy, Debug)]
pub enum Guard {
    /// The root's result has exactly the type of this bound value (dtype, shape, device):
    /// no promotion, no broadcast.
    SameType(&'static str),
    /// The root has no keyword operands (`rounding_mode`, `alpha`, `copy` change what it does).
    NoKwargs,
    /// Every reader of the root's result and of this bound value is pure: no in-place update
    /// could tell the value from its replacement (a cast's copy from its input).
    PureReaders(&'static str),
    /// This bound value is read by one node only.
    SingleUse(&'static str),
    /// A condition of your own.
    Custom(fn(&Trace, &Bindings) -> bool),
}

/// What replaces the root.
#[derive(Clone, Copy, Debug)]
pub enum Rewrite {
    /// The root's readers read this bound value instead (the root's result must have its
    /// type); the root goes.
    Value(&'static str),
    /// A node of your own making defines the root's outputs in its place (their names stay).
    Node(fn(&Trace, &Bindings) -> Option<Node>),
    /// The root's readers read this literal instead (a fold computed it; `None`: no fold
    /// after all); the root goes. The rewriter checks that the literal is a number of the
    /// root's result type.
    Literal(fn(&Trace, &Bindings) -> Option<Arg>),
}

/// A rewrite pattern: a source shape, its guards, and a replacement.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    /// Its name, counted in statistics (`canonicalize.mul-one`).
    pub name: &'static str,
    /// The op the source shape is rooted at (a family matches every namespace).
    pub root: Op,
    /// The root's positional operands.
    pub operands: &'static [Operand],
    /// Whether the root's two operands may also match swapped (`x * 1.0` and `1.0 * x`).
    pub commutative: bool,
    /// Conditions on the match, all of which must hold.
    pub guards: &'static [Guard],
    /// What replaces the root.
    pub rewrite: Rewrite,
}

/// The values a match bound, by name, and the root.
#[derive(Clone, Debug)]
pub struct Bindings {
    /// The root node.
    pub root: NodeIndex,
    values: Vec<(&'static str, ValueId)>,
    literals: Vec<(&'static str, Arg)>,
}

impl Bindings {
    /// The value bound to `name`.
    pub fn get(&self, name: &str) -> Option<ValueId> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }
    /// The number literal bound to `name` ([`Operand::Literal`]).
    pub fn literal(&self, name: &str) -> Option<&Arg> {
        self.literals
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| a)
    }
}

/// How many times each pattern applied, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied(pub BTreeMap<&'static str, u64>);

impl Applied {
    /// Applications of all patterns together.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

fn number_matches(want: f64, a: &Arg) -> bool {
    match a {
        Arg::Float(x) => x.to_bits() == want.to_bits(),
        Arg::Int(i) => (*i as f64) == want && want.to_bits() != (-0.0f64).to_bits(),
        _ => false,
    }
}

/// Matches `args` against `pattern`, binding into `b`.
fn match_operands(t: &Trace, args: &[Arg], pattern: &[Operand], b: &mut Bindings) -> bool {
    let rest = matches!(pattern.last(), Some(Operand::Rest));
    let fixed = if rest {
        &pattern[..pattern.len() - 1]
    } else {
        pattern
    };
    if args.len() < fixed.len() || (!rest && args.len() != fixed.len()) {
        return false;
    }
    fixed
        .iter()
        .zip(args)
        .all(|(p, a)| match_operand(t, a, p, b))
}

fn match_operand(t: &Trace, a: &Arg, p: &Operand, b: &mut Bindings) -> bool {
    match p {
        Operand::Any | Operand::Rest => true,
        Operand::Number(x) => number_matches(*x, a),
        Operand::Literal(name) => match a {
            Arg::Int(_) | Arg::Float(_) => match b.literal(name) {
                Some(bound) => bound == a,
                None => {
                    b.literals.push((name, a.clone()));
                    true
                }
            },
            _ => false,
        },
        Operand::Bind(name) => match a {
            Arg::Value(v) => match b.get(name) {
                Some(bound) => bound == *v,
                None => {
                    b.values.push((name, *v));
                    true
                }
            },
            _ => false,
        },
        Operand::Node(op, inner) => {
            let Arg::Value(v) = a else { return false };
            let Some(n) = t.producer(*v).and_then(|p| t.node(p)) else {
                return false;
            };
            op.matches(n)
                && n.kwargs().is_empty()
                && n.outputs().len() == 1
                && match_operands(t, n.args(), inner, b)
        }
    }
}

/// Whether every reader of `v` is pure.
fn pure_readers(t: &Trace, v: ValueId, reg: &OpRegistry) -> bool {
    t.users(v)
        .into_iter()
        .all(|u| t.node(u).is_some_and(|n| reg.effect(&n.op) == Effect::Pure))
}

impl Pattern {
    /// The bindings of a match rooted at `idx`, if the shape and every guard hold.
    pub fn try_match(&self, t: &Trace, idx: NodeIndex, reg: &OpRegistry) -> Option<Bindings> {
        let node = t.node(idx)?;
        if !self.root.matches(node) || node.outputs().len() != 1 {
            return None;
        }
        let try_args = |args: &[Arg]| {
            let mut b = Bindings {
                root: idx,
                values: Vec::new(),
                literals: Vec::new(),
            };
            (match_operands(t, args, self.operands, &mut b) && self.guards_hold(t, node, &b, reg))
                .then_some(b)
        };
        try_args(node.args()).or_else(|| match node.args() {
            [x, y] if self.commutative => try_args(&[y.clone(), x.clone()]),
            _ => None,
        })
    }

    fn guards_hold(&self, t: &Trace, node: &Node, b: &Bindings, reg: &OpRegistry) -> bool {
        let out = node.outputs()[0];
        self.guards.iter().all(|g| match g {
            Guard::SameType(name) => b
                .get(name)
                .is_some_and(|v| t.ty(v).is_some() && t.ty(v) == t.ty(out)),
            Guard::NoKwargs => node.kwargs().is_empty(),
            Guard::PureReaders(name) => {
                pure_readers(t, out, reg) && b.get(name).is_some_and(|v| pure_readers(t, v, reg))
            }
            Guard::SingleUse(name) => b.get(name).is_some_and(|v| t.users(v).len() == 1),
            Guard::Custom(f) => f(t, b),
        })
    }
}

/// Applies `patterns` to `t` until none applies (at most 16 sweeps), in schedule order: each
/// sweep finds every match first, then applies them at once with a [`Rewriter`]. A root is
/// replaced only when it is pure, a value only by one of exactly its type and a literal only
/// by a number of its type (the rewriter refuses others), whatever the pattern's guards say. Unread nodes are left for `dce`.
pub fn apply_patterns_greedily(
    t: &mut Trace,
    patterns: &[&Pattern],
    reg: &OpRegistry,
) -> Result<Applied, RewriteError> {
    let mut applied = Applied::default();
    let mut effects = reg.effects();
    for _ in 0..16 {
        let mut rw = Rewriter::new();
        let mut any = false;
        // roots replaced in this sweep: a match reading one waits for the next sweep
        let mut replaced = vec![false; t.node_bound()];
        let schedule: Vec<NodeIndex> = t.schedule().to_vec();
        for idx in schedule {
            let Some(node) = t.node(idx) else { continue };
            if effects.effect(&node.op) != Effect::Pure {
                continue;
            }
            let mut reads_replaced = false;
            node.for_each_operand(&mut |v| {
                if let Some(p) = t.producer(v) {
                    reads_replaced |= replaced.get(p.index()).copied().unwrap_or(false);
                }
            });
            if reads_replaced {
                continue;
            }
            for p in patterns {
                let Some(b) = p.try_match(t, idx, reg) else {
                    continue;
                };
                let out = node.outputs()[0];
                let done = match p.rewrite {
                    Rewrite::Value(name) => match b.get(name) {
                        Some(v) if v != out && t.ty(v).is_some() && t.ty(v) == t.ty(out) => {
                            rw.replace_all_uses(out, v);
                            rw.erase(idx);
                            true
                        }
                        _ => false,
                    },
                    Rewrite::Node(make) => match make(t, &b) {
                        Some(n) if n.outputs() == node.outputs() => {
                            rw.replace(idx, n);
                            true
                        }
                        _ => false,
                    },
                    Rewrite::Literal(fold) => match fold(t, &b) {
                        Some(lit) if literal_fits(t.ty(out), &lit) => {
                            rw.replace_all_uses_with_literal(out, lit);
                            rw.erase(idx);
                            true
                        }
                        _ => false,
                    },
                };
                if done {
                    replaced[idx.index()] = true;
                    *applied.0.entry(p.name).or_default() += 1;
                    any = true;
                    break;
                }
            }
        }
        if !any {
            break;
        }
        rw.apply(t)?;
    }
    Ok(applied)
}
