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
}

/// A decomposition line Thunder prints as an indented comment under its symbol. Kept as text:
/// it documents the op and is never executed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SubSymbol {
    pub text: String,
    pub children: Vec<SubSymbol>,
}

/// One statement of a trace: a call of `op` on operands, defining `outputs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Canonical op name (`ltorch.linear`, `dist.wait`), the key into the op registry.
    pub op: OpName,
    /// The callee as printed when it differs from `op` (`torch.nn.functional.linear`,
    /// `torch_wait_prim_impl`): imported Thunder traces keep their executors' names.
    pub callee: Option<String>,
    pub args: Vec<Arg>,
    pub kwargs: Vec<(String, Arg)>,
    pub outputs: Vec<ValueId>,
    pub lhs: Lhs,
    pub subsymbols: Vec<SubSymbol>,
    /// The source-location comment printed above the statement.
    pub source: Option<String>,
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
            callee: None,
            args,
            kwargs: Vec::new(),
            outputs,
            lhs,
            subsymbols: Vec::new(),
            source: None,
        }
    }
    pub fn with_kwarg(mut self, key: impl Into<String>, value: Arg) -> Node {
        self.kwargs.push((key.into(), value));
        self
    }
    /// The name printed as the callee.
    pub fn callee_name(&self) -> &str {
        self.callee.as_deref().unwrap_or(&self.op)
    }
    pub fn kwarg(&self, key: &str) -> Option<&Arg> {
        self.kwargs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    /// Every value read by this node, in printed order (repeats included).
    pub fn operands(&self) -> Vec<ValueId> {
        let mut out = Vec::new();
        self.for_each_operand(&mut |v| out.push(v));
        out
    }
    pub fn for_each_operand(&self, f: &mut impl FnMut(ValueId)) {
        self.args.iter().for_each(|a| a.for_each_value(f));
        self.kwargs.iter().for_each(|(_, a)| a.for_each_value(f));
    }
    pub fn map_operands(&mut self, f: &mut impl FnMut(ValueId) -> ValueId) {
        self.args.iter_mut().for_each(|a| a.map_values(f));
        self.kwargs.iter_mut().for_each(|(_, a)| a.map_values(f));
    }
}

/// An edge of the trace graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Edge {
    /// The source node defines `value`, which the target reads.
    Data { value: ValueId },
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
