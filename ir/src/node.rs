//! Nodes (one bound symbol each) and the edges between them.

use crate::arg::Arg;
use crate::op_name::OpName;
use crate::value::ValueId;
use serde::{Deserialize, Serialize};

/// How a statement binds its outputs on the left-hand side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lhs {
    /// `f(x)`: no outputs.
    None,
    /// `t1 = f(x)`.
    Single,
    /// `[t1, t2] = f(x)`.
    List,
    /// `a, b, = x`: Python sequence unpacking (the op is `prims.unpack_sequence`).
    Unpack,
    /// `(t1, t2) = f(x)` and `(t1,) = f(x)`: Thunder's tuple results, printed without type
    /// comments.
    Tuple,
    /// `(t1, (_, _), _) = f(x)`: a tuple with nested tuples and discarded (`_`) places, as
    /// Thunder prints the results of its torch-autograd fallbacks (`*_vjp`). The shape is the
    /// node's [`Node::lhs_pattern`]; the outputs are its named places, in order.
    Nested,
}

/// One place of a [`Lhs::Nested`] left-hand side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LhsSlot {
    /// A name: the node's next output.
    Out,
    /// `_`: a result nothing reads, bound to no value.
    Discard,
    /// A parenthesized tuple of places.
    Group(Vec<LhsSlot>),
}

impl LhsSlot {
    /// How many outputs the places bind (their [`LhsSlot::Out`]s, nested ones included).
    pub fn count_outputs(slots: &[LhsSlot]) -> usize {
        slots
            .iter()
            .map(|s| match s {
                LhsSlot::Out => 1,
                LhsSlot::Discard => 0,
                LhsSlot::Group(g) => LhsSlot::count_outputs(g),
            })
            .sum()
    }
}

/// A decomposition line Thunder prints as an indented comment under its symbol. Kept as text:
/// it documents the op and is never executed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SubSymbol {
    /// The comment line, without `#`.
    pub text: String,
    /// Nested decomposition lines.
    pub children: Vec<SubSymbol>,
}

/// One statement of a trace: a call of `op` on operands, defining `outputs`.
///
/// The callee spelling, keyword operands, decomposition and source line are rare (imported
/// Thunder statements and bucket ops have them; generated nodes do not), so they sit behind one
/// pointer: the common node is half the size, and sweeps over a million nodes read half the
/// memory.
#[derive(Clone, Debug)]
pub struct Node {
    /// Canonical op name (`ltorch.linear`, `dist.wait`), the key into the op registry.
    pub op: OpName,
    /// Positional operands (private: a node in a trace changes them through the
    /// [`crate::Rewriter`], which keeps the graph's edges in step).
    pub(crate) args: Vec<Arg>,
    /// The values the node defines.
    pub(crate) outputs: Vec<ValueId>,
    /// How the outputs are bound on the left-hand side.
    pub lhs: Lhs,
    extra: Option<Box<NodeExtra>>,
}

#[derive(Clone, Debug, Default)]
struct NodeExtra {
    callee: Option<String>,
    kwargs: Vec<(String, Arg)>,
    subsymbols: Vec<SubSymbol>,
    source: Option<String>,
    /// The places of a [`Lhs::Nested`] left-hand side.
    pattern: Option<Vec<LhsSlot>>,
}

impl NodeExtra {
    fn is_empty(&self) -> bool {
        self.callee.is_none()
            && self.kwargs.is_empty()
            && self.subsymbols.is_empty()
            && self.source.is_none()
            && self.pattern.is_none()
    }
}

impl Node {
    /// A node with positional operands and the usual binding for its output count.
    pub fn new(op: impl Into<OpName>, args: Vec<Arg>, outputs: Vec<ValueId>) -> Node {
        let lhs = match outputs.len() {
            0 => Lhs::None,
            1 => Lhs::Single,
            _ => Lhs::List,
        };
        Node {
            op: op.into(),
            args,
            outputs,
            lhs,
            extra: None,
        }
    }
    /// Positional operands, in printed order.
    pub fn args(&self) -> &[Arg] {
        &self.args
    }
    /// The values the node defines, in order.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }
    /// A node with the same op, callee, keywords, binding and source line, reading `args`
    /// and defining `outputs` (to queue with the [`crate::Rewriter`] in place of this one).
    /// The decomposition comments are dropped: they describe the old statement's operands.
    pub fn with_operands(&self, args: Vec<Arg>, outputs: Vec<ValueId>) -> Node {
        let mut n = Node {
            args,
            outputs,
            ..self.clone()
        };
        n.set_subsymbols(Vec::new());
        if n.extra.as_deref().is_some_and(NodeExtra::is_empty) {
            n.extra = None;
        }
        n
    }
    fn extra_mut(&mut self) -> &mut NodeExtra {
        self.extra.get_or_insert_with(Default::default)
    }
    /// The node with one more keyword operand.
    pub fn with_kwarg(mut self, key: impl Into<String>, value: Arg) -> Node {
        self.extra_mut().kwargs.push((key.into(), value));
        self
    }
    /// The callee as printed when it differs from `op` (`torch.nn.functional.linear`,
    /// `torch_wait_prim_impl`): imported Thunder traces keep their executors' names.
    pub fn callee(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|e| e.callee.as_deref())
    }
    /// Sets the callee spelling (`None`: the op's name).
    pub fn set_callee(&mut self, callee: Option<String>) {
        if callee.is_some() || self.extra.is_some() {
            self.extra_mut().callee = callee;
        }
    }
    /// The name printed as the callee.
    pub fn callee_name(&self) -> &str {
        self.callee().unwrap_or(&self.op)
    }
    /// Keyword operands, in printed order.
    pub fn kwargs(&self) -> &[(String, Arg)] {
        self.extra.as_ref().map_or(&[], |e| &e.kwargs)
    }
    /// The keyword operands, to edit in place (a node without any allocates nothing: use
    /// [`Node::set_kwargs`] to add or remove them).
    pub fn kwargs_mut(&mut self) -> &mut [(String, Arg)] {
        match &mut self.extra {
            Some(e) => &mut e.kwargs,
            None => &mut [],
        }
    }
    /// Replaces the keyword operands; setting none to a node that has none allocates nothing.
    pub fn set_kwargs(&mut self, kwargs: Vec<(String, Arg)>) {
        if !kwargs.is_empty() || self.extra.is_some() {
            self.extra_mut().kwargs = kwargs;
        }
    }
    /// Whether the rare parts (callee, kwargs, decomposition, source) are stored: every
    /// reader of them follows one more pointer.
    #[cfg(test)]
    pub(crate) fn has_extra(&self) -> bool {
        self.extra.is_some()
    }
    /// A keyword operand by name.
    pub fn kwarg(&self, key: &str) -> Option<&Arg> {
        self.kwargs().iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    /// Thunder's decomposition comments under the statement.
    pub fn subsymbols(&self) -> &[SubSymbol] {
        self.extra.as_ref().map_or(&[], |e| &e.subsymbols)
    }
    /// The decomposition comments, to edit.
    pub fn subsymbols_mut(&mut self) -> &mut Vec<SubSymbol> {
        &mut self.extra_mut().subsymbols
    }
    /// Replaces the decomposition; setting none to a node that has none allocates nothing.
    pub fn set_subsymbols(&mut self, subsymbols: Vec<SubSymbol>) {
        if !subsymbols.is_empty() || self.extra.is_some() {
            self.extra_mut().subsymbols = subsymbols;
        }
    }
    /// The source-location comment printed above the statement.
    pub fn source(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|e| e.source.as_deref())
    }
    /// Sets the source-location comment.
    pub fn set_source(&mut self, source: Option<String>) {
        if source.is_some() || self.extra.is_some() {
            self.extra_mut().source = source;
        }
    }
    /// The places of a nested left-hand side ([`Lhs::Nested`]); `None` for every other binding.
    pub fn lhs_pattern(&self) -> Option<&[LhsSlot]> {
        self.extra.as_ref().and_then(|e| e.pattern.as_deref())
    }
    /// Binds the outputs through a nested left-hand side: sets [`Lhs::Nested`] and its places,
    /// whose [`LhsSlot::Out`]s must number the node's outputs (the verifier checks it).
    pub fn set_nested_lhs(&mut self, pattern: Vec<LhsSlot>) {
        self.lhs = Lhs::Nested;
        self.extra_mut().pattern = Some(pattern);
    }
    /// Every value read by this node, in printed order (repeats included).
    pub fn operands(&self) -> Vec<ValueId> {
        let mut out = Vec::new();
        self.for_each_operand(&mut |v| out.push(v));
        out
    }
    /// Calls `f` on every value the node reads, in printed order (repeats included).
    pub fn for_each_operand(&self, f: &mut impl FnMut(ValueId)) {
        self.args.iter().for_each(|a| a.for_each_value(f));
        if let Some(e) = &self.extra {
            e.kwargs.iter().for_each(|(_, a)| a.for_each_value(f));
        }
    }
    /// Replaces every value the node reads that `f` gives a literal for by that literal.
    pub(crate) fn substitute_operands(&mut self, f: &mut impl FnMut(ValueId) -> Option<Arg>) {
        self.args.iter_mut().for_each(|a| a.substitute_values(f));
        if let Some(e) = &mut self.extra {
            e.kwargs
                .iter_mut()
                .for_each(|(_, a)| a.substitute_values(f));
        }
    }
    /// Replaces every value the node reads by `f` of it (for a node not in a trace: in a trace, use the [`crate::Rewriter`]).
    pub fn map_operands(&mut self, f: &mut impl FnMut(ValueId) -> ValueId) {
        self.args.iter_mut().for_each(|a| a.map_values(f));
        if let Some(e) = &mut self.extra {
            e.kwargs.iter_mut().for_each(|(_, a)| a.map_values(f));
        }
    }
}

impl PartialEq for Node {
    fn eq(&self, other: &Node) -> bool {
        self.op == other.op
            && self.args == other.args
            && self.outputs == other.outputs
            && self.lhs == other.lhs
            && self.callee() == other.callee()
            && self.kwargs() == other.kwargs()
            && self.subsymbols() == other.subsymbols()
            && self.source() == other.source()
            && self.lhs_pattern() == other.lhs_pattern()
    }
}

/// The serialized form of a [`Node`]: every field inline, as in earlier versions of the
/// format (the boxing above is a memory layout, not a format change).
#[derive(Serialize)]
struct NodeRef<'a> {
    op: &'a OpName,
    callee: Option<&'a str>,
    args: &'a [Arg],
    kwargs: &'a [(String, Arg)],
    outputs: &'a [ValueId],
    lhs: Lhs,
    subsymbols: &'a [SubSymbol],
    source: Option<&'a str>,
    /// Written in human-readable formats only: the binary rows of format version 1 have no
    /// such field (binary files store columns since version 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    lhs_pattern: Option<&'a [LhsSlot]>,
}

#[derive(Deserialize)]
#[serde(rename = "Node")]
struct NodeOwned {
    op: OpName,
    callee: Option<String>,
    args: Vec<Arg>,
    kwargs: Vec<(String, Arg)>,
    outputs: Vec<ValueId>,
    lhs: Lhs,
    subsymbols: Vec<SubSymbol>,
    source: Option<String>,
}

/// [`NodeOwned`] as JSON stores it: with the places of a nested left-hand side.
#[derive(Deserialize)]
#[serde(rename = "Node")]
struct NodeOwnedText {
    op: OpName,
    callee: Option<String>,
    args: Vec<Arg>,
    kwargs: Vec<(String, Arg)>,
    outputs: Vec<ValueId>,
    lhs: Lhs,
    subsymbols: Vec<SubSymbol>,
    source: Option<String>,
    #[serde(default)]
    lhs_pattern: Option<Vec<LhsSlot>>,
}

impl Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        NodeRef {
            op: &self.op,
            callee: self.callee(),
            args: &self.args,
            kwargs: self.kwargs(),
            outputs: &self.outputs,
            lhs: self.lhs,
            subsymbols: self.subsymbols(),
            source: self.source(),
            lhs_pattern: if s.is_human_readable() {
                self.lhs_pattern()
            } else {
                None
            },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        let (n, pattern) = if d.is_human_readable() {
            let t = NodeOwnedText::deserialize(d)?;
            let n = NodeOwned {
                op: t.op,
                callee: t.callee,
                args: t.args,
                kwargs: t.kwargs,
                outputs: t.outputs,
                lhs: t.lhs,
                subsymbols: t.subsymbols,
                source: t.source,
            };
            (n, t.lhs_pattern)
        } else {
            (NodeOwned::deserialize(d)?, None)
        };
        // a nested left-hand side needs its places, one name per output (binary rows of
        // format version 1 have no places, so no nested binding either)
        match (&n.lhs, &pattern) {
            (Lhs::Nested, None) => {
                return Err(serde::de::Error::custom(
                    "a nested left-hand side without its places",
                ))
            }
            (Lhs::Nested, Some(p)) if LhsSlot::count_outputs(p) != n.outputs.len() => {
                return Err(serde::de::Error::custom(format!(
                    "a left-hand side of {} places for {} outputs",
                    LhsSlot::count_outputs(p),
                    n.outputs.len()
                )))
            }
            (Lhs::Nested, Some(_)) | (_, None) => {}
            (_, Some(_)) => {
                return Err(serde::de::Error::custom(
                    "left-hand side places on a binding that is not nested",
                ))
            }
        }
        let extra = NodeExtra {
            callee: n.callee,
            kwargs: n.kwargs,
            subsymbols: n.subsymbols,
            source: n.source,
            pattern,
        };
        Ok(Node {
            op: n.op,
            args: n.args,
            outputs: n.outputs,
            lhs: n.lhs,
            extra: (!extra.is_empty()).then(|| Box::new(extra)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #27, bug 9: a node rebuilt on new operands does not keep the old statement's
    /// decomposition comments (they name the old operands).
    #[test]
    fn with_operands_drops_the_decomposition() {
        let mut n = Node::new(
            "ltorch.relu",
            vec![Arg::Value(ValueId(0))],
            vec![ValueId(1)],
        )
        .with_kwarg("inplace", Arg::Bool(false));
        n.set_source(Some("# model.py:3".into()));
        n.set_subsymbols(vec![SubSymbol {
            text: "t1 = prims.gt(t0, 0.0)".into(),
            children: Vec::new(),
        }]);
        let m = n.with_operands(vec![Arg::Value(ValueId(2))], vec![ValueId(3)]);
        assert!(m.subsymbols().is_empty());
        assert_eq!(m.kwarg("inplace"), Some(&Arg::Bool(false)));
        assert_eq!(m.source(), n.source());
        assert_eq!(m.outputs(), &[ValueId(3)]);
        let plain = Node::new("prims.neg", vec![Arg::Value(ValueId(0))], vec![ValueId(1)]);
        let mut decomposed = plain.clone();
        decomposed.set_subsymbols(vec![SubSymbol {
            text: "x".into(),
            children: Vec::new(),
        }]);
        assert!(!decomposed
            .with_operands(plain.args.clone(), plain.outputs.clone())
            .has_extra());
    }
}

/// An edge of the trace graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Edge {
    /// The source node defines `value`, which the target reads.
    Data {
        /// The value the edge carries.
        value: ValueId,
    },
    /// The source must run before the target, with no data between them (collective order,
    /// side effects).
    Order,
}

/// The derived decoding of [`SubSymbol`], called under a nesting guard (decompositions nest).
#[derive(Deserialize)]
#[serde(remote = "SubSymbol")]
struct SubSymbolDef {
    text: String,
    children: Vec<SubSymbol>,
}

impl<'de> Deserialize<'de> for SubSymbol {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SubSymbol, D::Error> {
        let _level = crate::arg::NestingGuard::enter::<D::Error>()?;
        SubSymbolDef::deserialize(d)
    }
}
