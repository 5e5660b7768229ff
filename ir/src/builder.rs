//! Building traces in Rust: operands in, typed outputs with fresh names out.

use crate::arg::Arg;
use crate::node::{Lhs, Node};
use crate::registry::{ops, MetaOut, OpRegistry, ResultPlace};
use crate::trace::{Trace, TraceKind};
use crate::types::Type;
use crate::value::ValueId;
use petgraph::stable_graph::NodeIndex;

/// An op could not be added: its meta rejected the operands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot build `{op}`: {message}")]
pub struct BuildError {
    /// The op being added.
    pub op: String,
    /// What is wrong.
    pub message: String,
}

impl From<ValueId> for Arg {
    fn from(v: ValueId) -> Arg {
        Arg::Value(v)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Arg {
        Arg::Float(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::Int(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Arg {
        Arg::Bool(v)
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Arg {
        Arg::Str(v.to_string())
    }
}

/// Appends statements to a trace, inferring output types through the op registry.
///
/// ```
/// use tracepass_ir::{Arg, TraceBuilder, TraceKind, Type, DType, Device};
/// let mut b = TraceBuilder::new("computation", TraceKind::Computation);
/// let x = b.arg("x", Type::tensor([8, 32], DType::F32, Device::CPU));
/// let y = b.op("ltorch.mul", vec![x.into(), 0.5.into()]).unwrap();
/// b.ret(Arg::Tuple(vec![y.into()]));
/// let trace = b.finish();
/// assert!(tracepass_ir::verify(&trace).is_ok());
/// ```
pub struct TraceBuilder<'r> {
    trace: Trace,
    reg: &'r OpRegistry,
    counter: u64,
}

impl TraceBuilder<'static> {
    /// A builder of an empty trace, with the built-in op registry.
    pub fn new(name: &str, kind: TraceKind) -> Self {
        TraceBuilder::with_registry(name, kind, OpRegistry::builtin())
    }
}

impl<'r> TraceBuilder<'r> {
    /// A builder of an empty trace whose ops come from `reg`.
    pub fn with_registry(name: &str, kind: TraceKind, reg: &'r OpRegistry) -> Self {
        TraceBuilder {
            trace: Trace::new(name, kind),
            reg,
            counter: 0,
        }
    }
    /// Appends a trace argument.
    pub fn arg(&mut self, name: &str, ty: Type) -> ValueId {
        self.trace.push_arg(name, ty)
    }
    fn fresh(&mut self, ty: &Type) -> String {
        let n = self.counter;
        self.counter += 1;
        format!("{}{n}", ty.name_prefix())
    }
    /// Adds `op(args)` with one output and returns it.
    pub fn op(&mut self, op: &str, args: Vec<Arg>) -> Result<ValueId, BuildError> {
        self.op_kw(op, args, Vec::new())
    }
    /// Appends a node with keyword operands; its output types come from the op's meta.
    pub fn op_kw(
        &mut self,
        op: &str,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
    ) -> Result<ValueId, BuildError> {
        let outs = self.op_multi(op, args, kwargs)?;
        outs.first().copied().ok_or_else(|| BuildError {
            op: op.into(),
            message: "has no output".into(),
        })
    }
    /// Adds an op with any number of outputs, typed by its meta.
    pub fn op_multi(
        &mut self,
        op: &str,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
    ) -> Result<Vec<ValueId>, BuildError> {
        let err = |message: String| BuildError {
            op: op.into(),
            message,
        };
        let mut pattern = None;
        let types = match self
            .reg
            .infer(&self.trace, op, &args, &kwargs)
            .map_err(err)?
        {
            MetaOut::Types(t) => t,
            // every value named, every `None` discarded
            MetaOut::Places(places) => {
                let mut types = Vec::new();
                pattern = Some(ResultPlace::bind_all(&places, &mut types));
                types
            }
            MetaOut::Declared => {
                return Err(BuildError {
                    op: op.into(),
                    message: "outputs must be declared: use `op_declared`".into(),
                })
            }
        };
        let outs: Vec<ValueId> = types
            .into_iter()
            .map(|t| {
                let name = self.fresh(&t);
                self.trace.new_value(name, t)
            })
            .collect();
        let mut node = Node::new(op, args, outs.clone());
        node.set_kwargs(kwargs);
        if let Some(p) = pattern {
            node.set_nested_lhs(p);
        }
        self.trace.append(node);
        Ok(outs)
    }
    /// Adds an op whose outputs have given names and types.
    pub fn op_declared(
        &mut self,
        node_op: &str,
        args: Vec<Arg>,
        outputs: Vec<(String, Type)>,
        lhs: Lhs,
    ) -> Vec<ValueId> {
        let outs: Vec<ValueId> = outputs
            .into_iter()
            .map(|(n, t)| self.trace.new_value(n, t))
            .collect();
        let mut node = Node::new(node_op, args, outs.clone());
        node.lhs = lhs;
        self.trace.append(node);
        outs
    }
    /// `a, b, = src` with declared names and types.
    pub fn unpack_sequence(&mut self, src: ValueId, outputs: Vec<(String, Type)>) -> Vec<ValueId> {
        self.op_declared(
            ops::UNPACK_SEQUENCE,
            vec![Arg::Value(src)],
            outputs,
            Lhs::Unpack,
        )
    }
    /// A side-effecting statement with no outputs.
    pub fn effect(&mut self, op: &str, args: Vec<Arg>) -> NodeIndex {
        self.trace.append(Node::new(op, args, Vec::new()))
    }
    /// Sets how the last added node prints its callee (a Thunder executor name).
    pub fn spell_last(&mut self, callee: &str) {
        if let Some(&idx) = self.trace.schedule().last() {
            if let Some(n) = self.trace.node_mut(idx) {
                n.set_callee(Some(callee.to_string()));
            }
        }
    }
    /// Sets the return structure.
    pub fn ret(&mut self, ret: Arg) {
        self.trace.ret = ret;
    }
    /// The trace built so far.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }
    /// The trace.
    pub fn finish(self) -> Trace {
        self.trace
    }
}

#[cfg(test)]
mod tests {
    use crate::synth::{mlp_program, MlpSpec};

    /// Built and canonicalized nodes store no out-of-line part they do not need: printing,
    /// passes and copies would otherwise follow a pointer per node for nothing.
    #[test]
    fn nodes_keep_no_empty_out_of_line_part() {
        let p = mlp_program(&MlpSpec::deep(3, 8, 2)).expect("synthetic program");
        let mut t = p.backward;
        let needs = |n: &crate::Node| {
            n.callee().is_some()
                || !n.kwargs().is_empty()
                || !n.subsymbols().is_empty()
                || n.source().is_some()
        };
        assert!(t.nodes().all(|(_, n)| n.has_extra() == needs(n)));
        assert!(t.nodes().any(|(_, n)| !n.has_extra()));
        crate::canon::canonicalize(&mut t);
        assert!(t.nodes().all(|(_, n)| n.has_extra() == needs(n)));
    }
}
