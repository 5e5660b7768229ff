//! Ops read by rewriting them into others of the table, as a trace is parsed.
//!
//! Thunder runs the torch functions it has no rule for through PyTorch and differentiates them
//! with `torch.autograd` (`thunder/torch/default_torch_ops.py`): the trace prints them bare,
//! with no decomposition below (`t = torch.addmm(b, x, w)`, and in the backward
//! `(gb, gx, gw) = addmm_vjp(((b, x, w), {}), g)`). For the ones real models call
//! (`ir/src/op_table/lowered.rs`) this module writes PyTorch's definition, and its
//! gradient, in ops every backend and pass already knows: `addmm` becomes `matmul` and `add`,
//! its vjp two products of transposes and a sum to the bias's shape. Every statement so read
//! keeps its names (a saved value stays the value the backward reads), each result is checked
//! against the type the trace printed for it, and the trace's provenance lists the ops.

use crate::arg::{Arg, DTypeSpelling, DeviceSpelling};
use crate::node::{LhsSlot, Node};
use crate::op_table::fallback::saved_call;
use crate::op_table::lowered::{nested_numbers, ALIASES};
use crate::registry::{MetaOut, OpRegistry};
use crate::rewriter::Rewriter;
use crate::trace::{Provenance, Trace};
use crate::types::{DType, TensorType, Type};
use crate::value::ValueId;
use petgraph::stable_graph::NodeIndex;

/// How the trace's provenance starts the entry that lists the ops rewritten.
pub const PROVENANCE: &str = "tracepass import: ops rewritten into the table's ops: ";

/// The canonical ops this module rewrites.
pub const LOWERED: &[&str] = &[
    "ltorch.mm",
    "ltorch.mm_vjp",
    "ltorch.addmm",
    "ltorch.addmm_vjp",
    "ltorch.diff",
    "ltorch.diff_vjp",
    "ltorch.new_ones",
    "ltorch.new_zeros",
    "ltorch.new_empty",
    "ltorch.new_full",
    "ltorch.tensor",
    "prims.tensor_from_sequence",
    "ltorch.reshape_as",
    "ltorch.reshape_as_vjp",
    "ltorch.vector_norm",
    "ltorch.vector_norm_vjp",
    "ltorch.norm",
    "ltorch.norm_vjp",
    "ltorch.ravel",
    "ltorch.ravel_vjp",
    "ltorch.narrow",
    "ltorch.narrow_vjp",
    "ltorch.tile",
    "ltorch.tile_vjp",
];

/// The backward halves of the aliases (`op_table/lowered.rs`): each vjp and the alias it differentiates
/// (`swapdims` is read as `swapaxes`).
pub const ALIAS_VJPS: &[(&str, &str)] = &[
    ("ltorch.swapaxes_vjp", "ltorch.swapaxes"),
    ("ltorch.swapdims_vjp", "ltorch.swapaxes"),
    ("ltorch.moveaxis_vjp", "ltorch.moveaxis"),
    ("ltorch.multiply_vjp", "ltorch.multiply"),
    ("ltorch.subtract_vjp", "ltorch.subtract"),
    ("ltorch.divide_vjp", "ltorch.divide"),
    ("ltorch.negative_vjp", "ltorch.negative"),
    ("ltorch.absolute_vjp", "ltorch.absolute"),
    ("ltorch.clip_vjp", "ltorch.clip"),
    ("ltorch.fix_vjp", "ltorch.fix"),
];

/// Whether this module rewrites every node of the canonical op `op` (`div` only with a
/// rounding mode, see [`is_lowered`]).
pub fn lowers_op(op: &str) -> bool {
    LOWERED.contains(&op)
        || ALIASES.iter().any(|(a, _)| *a == op)
        || ALIAS_VJPS.iter().any(|(v, _)| *v == op)
}

/// Whether this module rewrites `node`: an op of [`LOWERED`], or `div` with a rounding mode
/// (which no kernel computes in one step; Thunder's own body is `trunc(div(a, b))`).
pub fn is_lowered(node: &Node) -> bool {
    let op = node.op.as_str();
    lowers_op(op)
        || (op == "ltorch.div" && matches!(node.kwarg("rounding_mode"), Some(Arg::Str(_))))
}

/// Why a statement could not be rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerError {
    /// The first value the statement defines (where it is).
    pub output: String,
    /// The op as printed, and what is wrong.
    pub message: String,
}

/// Rewrites every node of a [`LOWERED`] op; after an error the trace is half-rewritten and
/// must be dropped (the parser does).
pub fn lower(t: &mut Trace, reg: &OpRegistry) -> Result<(), LowerError> {
    let todo: Vec<NodeIndex> = t
        .schedule()
        .iter()
        .copied()
        .filter(|&i| t.node(i).is_some_and(is_lowered))
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let mut rw = Rewriter::new();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for idx in todo {
        let node = t.node(idx).expect("scheduled").clone();
        let callee = node.callee_name().to_string();
        let output = node
            .outputs()
            .first()
            .map(|&o| t.name(o))
            .unwrap_or_default();
        let mut e = Emit {
            t,
            reg,
            rw: &mut rw,
            anchor: idx,
            made: 0,
            base: if output.is_empty() {
                "lw".into()
            } else {
                output.clone()
            },
        };
        e.lower(&node).map_err(|m| LowerError {
            message: format!("`{callee}` (defining `{output}`): {m}"),
            output,
        })?;
        rw.erase(idx);
        match counts.iter_mut().find(|(c, _)| *c == callee) {
            Some((_, n)) => *n += 1,
            None => counts.push((callee, 1)),
        }
    }
    rw.apply(t).map_err(|e| LowerError {
        output: String::new(),
        message: format!("rewriting the ops tracepass reads through its own rules: {e}"),
    })?;
    let list: Vec<String> = counts
        .iter()
        .map(|(c, n)| match n {
            1 => format!("`{c}`"),
            n => format!("`{c}` ({n} uses)"),
        })
        .collect();
    t.provenance.push(Provenance {
        pass: format!("{PROVENANCE}{}", list.join(", ")),
        millis: None,
    });
    Ok(())
}

/// The nodes one statement becomes, inserted before it.
struct Emit<'a> {
    t: &'a mut Trace,
    reg: &'a OpRegistry,
    rw: &'a mut Rewriter,
    anchor: NodeIndex,
    made: usize,
    base: String,
}

type R<T> = Result<T, String>;

impl Emit<'_> {
    /// `op(args, kwargs)` into a fresh value typed by the op's meta.
    fn op(&mut self, op: &str, args: Vec<Arg>, kwargs: Vec<(String, Arg)>) -> R<ValueId> {
        let ty = self.infer(op, &args, &kwargs)?;
        let name = loop {
            let n = format!("{}_{}", self.base, self.made);
            self.made += 1;
            if self.t.find_value(&n).is_none() {
                break n;
            }
        };
        let v = self.t.new_value(name, ty);
        self.insert(op, args, kwargs, v);
        Ok(v)
    }

    /// `op(args, kwargs)` into `out`, a value of the statement rewritten, whose printed type
    /// the op's must equal.
    fn into(
        &mut self,
        out: ValueId,
        op: &str,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
    ) -> R<()> {
        let ty = self.infer(op, &args, &kwargs)?;
        match self.t.ty(out) {
            Some(want) if *want != ty && !matches!(want, Type::Any) => {
                return Err(format!(
                    "the rewrite gives `{}` the type {ty}, the trace says {want}",
                    self.t.name(out)
                ))
            }
            _ => {}
        }
        self.t.set_ty(out, ty);
        self.insert(op, args, kwargs, out);
        Ok(())
    }

    /// `v` as the value `out`: a shallow copy (no data moves).
    fn alias(&mut self, out: ValueId, v: ValueId) -> R<()> {
        self.into(out, "prims.shallow_copy", vec![Arg::Value(v)], Vec::new())
    }

    fn insert(&mut self, op: &str, args: Vec<Arg>, kwargs: Vec<(String, Arg)>, out: ValueId) {
        let mut n = Node::new(op, args, vec![out]);
        n.set_kwargs(kwargs);
        self.rw.insert_before(self.anchor, n);
    }

    fn infer(&self, op: &str, args: &[Arg], kwargs: &[(String, Arg)]) -> R<Type> {
        match self.reg.infer(self.t, op, args, kwargs)? {
            MetaOut::Types(mut v) if v.len() == 1 => Ok(v.remove(0)),
            _ => Err(format!("{op} does not give one tensor")),
        }
    }

    fn tensor(&self, v: ValueId) -> R<TensorType> {
        match self.t.ty(v) {
            Some(Type::Tensor(t)) => Ok(t.clone()),
            other => Err(format!("`{}` is not a tensor: {other:?}", self.t.name(v))),
        }
    }

    fn lower(&mut self, node: &Node) -> R<()> {
        match node.op.as_str() {
            "ltorch.mm" => self.addmm(node, false),
            "ltorch.addmm" => self.addmm(node, true),
            "ltorch.mm_vjp" => self.addmm_vjp(node, false),
            "ltorch.addmm_vjp" => self.addmm_vjp(node, true),
            "ltorch.diff" => self.diff(node),
            "ltorch.diff_vjp" => self.diff_vjp(node),
            "ltorch.new_ones" => self.new_filled(node, Some(Arg::Int(1))),
            "ltorch.new_zeros" | "ltorch.new_empty" => self.new_filled(node, Some(Arg::Int(0))),
            "ltorch.new_full" => self.new_filled(node, None),
            "ltorch.tensor" | "prims.tensor_from_sequence" => self.tensor_literal(node),
            "ltorch.div" => self.rounded_div(node),
            "ltorch.reshape_as" => self.reshape_as(node),
            "ltorch.reshape_as_vjp" => self.reshape_as_vjp(node),
            "ltorch.vector_norm" => self.norm(node, "ltorch.vector_norm", false),
            "ltorch.norm" => self.norm(node, "ltorch.norm", false),
            "ltorch.vector_norm_vjp" => self.norm(node, "ltorch.vector_norm", true),
            "ltorch.norm_vjp" => self.norm(node, "ltorch.norm", true),
            "ltorch.ravel" => self.ravel(node),
            "ltorch.narrow" => self.narrow(node),
            "ltorch.tile" => self.tile(node),
            "ltorch.ravel_vjp" => self.shape_vjp(node, "ltorch.ravel"),
            "ltorch.narrow_vjp" => self.shape_vjp(node, "ltorch.narrow"),
            "ltorch.tile_vjp" => self.shape_vjp(node, "ltorch.tile"),
            op => {
                if let Some((_, target)) = ALIASES.iter().find(|(a, _)| *a == op) {
                    let out = Self::single_out(node)?;
                    return self.into(out, target, node.args().to_vec(), node.kwargs().to_vec());
                }
                match ALIAS_VJPS.iter().find(|(v, _)| *v == op) {
                    Some((_, forward)) => self.alias_vjp(node, forward),
                    None => Err(format!("no rewrite for {op}")),
                }
            }
        }
    }

    /// The operands of `node` bound to its op's signature.
    fn bind(&self, op: &str, args: &[Arg], kwargs: &[(String, Arg)]) -> R<Bound> {
        let def = self
            .reg
            .get(op)
            .ok_or_else(|| format!("unknown op `{op}`"))?;
        let sig = def.signature.as_ref().ok_or("no signature")?;
        let bound = sig
            .bind(args, kwargs)
            .map_err(|m| format!("{op}({sig}) {m}"))?;
        let mut out = Bound::default();
        for p in &sig.params {
            if let Some(a) = bound.get(&p.name) {
                out.0.push((p.name.clone(), a.clone()));
            }
        }
        Ok(out)
    }

    fn single_out(node: &Node) -> R<ValueId> {
        match node.outputs() {
            [o] => Ok(*o),
            outs => Err(format!("binds {} results, not one", outs.len())),
        }
    }

    /// `addmm(input, mat1, mat2, *, beta, alpha)` = `beta * input + alpha * (mat1 @ mat2)`
    /// (`input` left out when `beta` is 0, as PyTorch does); `mm` is the product alone.
    fn addmm(&mut self, node: &Node, with_input: bool) -> R<()> {
        let out = Self::single_out(node)?;
        let op = node.op.as_str().to_string();
        let b = self.bind(&op, node.args(), node.kwargs())?;
        let (m1, m2) = if with_input {
            (b.value("mat1")?, b.value("mat2")?)
        } else {
            (b.value("input")?, b.value("mat2")?)
        };
        let (alpha, beta) = if with_input {
            (b.number("alpha")?, b.number("beta")?)
        } else {
            (Arg::Int(1), Arg::Int(1))
        };
        let input = if with_input && !is_zero(&beta) {
            Some(b.value("input")?)
        } else {
            None
        };
        let scaled_product = !is_one(&alpha);
        let product_is_last = input.is_none() && !scaled_product;
        let product = if product_is_last {
            return self.into(
                out,
                "ltorch.matmul",
                vec![Arg::Value(m1), Arg::Value(m2)],
                vec![],
            );
        } else {
            self.op(
                "ltorch.matmul",
                vec![Arg::Value(m1), Arg::Value(m2)],
                vec![],
            )?
        };
        let Some(input) = input else {
            return self.into(out, "ltorch.mul", vec![Arg::Value(product), alpha], vec![]);
        };
        let product = if scaled_product {
            self.op("ltorch.mul", vec![Arg::Value(product), alpha], vec![])?
        } else {
            product
        };
        let input = if is_one(&beta) {
            input
        } else {
            self.op("ltorch.mul", vec![Arg::Value(input), beta], vec![])?
        };
        self.into(
            out,
            "ltorch.add",
            vec![Arg::Value(input), Arg::Value(product)],
            vec![],
        )
    }

    /// The gradients of `addmm`/`mm`: `beta * g` summed to `input`'s shape, `alpha * g @
    /// mat2.T` and `alpha * mat1.T @ g`, each only where the statement names it.
    fn addmm_vjp(&mut self, node: &Node, with_input: bool) -> R<()> {
        let forward = if with_input {
            "ltorch.addmm"
        } else {
            "ltorch.mm"
        };
        let (args, kwargs, g) = fallback_parts(node)?;
        let b = self.bind(forward, &args, &kwargs)?;
        let names: &[&str] = if with_input {
            &["input", "mat1", "mat2"]
        } else {
            &["input", "mat2"]
        };
        let outs = named_gradients(node, names.len())?;
        let alpha = b.number("alpha").unwrap_or(Arg::Int(1));
        let beta = b.number("beta").unwrap_or(Arg::Int(1));
        let (m1, m2) = if with_input {
            (b.value("mat1")?, b.value("mat2")?)
        } else {
            (b.value("input")?, b.value("mat2")?)
        };
        for (name, out) in names.iter().zip(outs) {
            let Some(out) = out else { continue };
            let is_input = with_input && *name == "input";
            if is_input {
                let target = self.tensor(b.value("input")?)?.shape.to_vec();
                if is_one(&beta) {
                    self.sum_to(g, &target, Some(out))?;
                } else {
                    let s = self.sum_to(g, &target, None)?;
                    self.into(out, "ltorch.mul", vec![Arg::Value(s), beta.clone()], vec![])?;
                }
                continue;
            }
            // d mat1 = g @ mat2.T, d mat2 = mat1.T @ g
            let (l, r) = if *name == "mat2" {
                let m1t = self.transpose(m1)?;
                (m1t, g)
            } else {
                let m2t = self.transpose(m2)?;
                (g, m2t)
            };
            if is_one(&alpha) {
                self.into(
                    out,
                    "ltorch.matmul",
                    vec![Arg::Value(l), Arg::Value(r)],
                    vec![],
                )?;
            } else {
                let p = self.op("ltorch.matmul", vec![Arg::Value(l), Arg::Value(r)], vec![])?;
                self.into(
                    out,
                    "ltorch.mul",
                    vec![Arg::Value(p), alpha.clone()],
                    vec![],
                )?;
            }
        }
        Ok(())
    }

    fn transpose(&mut self, v: ValueId) -> R<ValueId> {
        self.op(
            "ltorch.transpose",
            vec![Arg::Value(v), Arg::Int(0), Arg::Int(1)],
            vec![],
        )
    }

    /// `g` summed over the dimensions `target` broadcast it along (its missing leading ones
    /// and its 1s), in `target`'s shape: into `out` when given (a shallow copy when `g` has
    /// that shape already), else a fresh value (`g` itself when it has that shape).
    fn sum_to(&mut self, g: ValueId, target: &[usize], out: Option<ValueId>) -> R<ValueId> {
        let shape = self.tensor(g)?.shape.to_vec();
        if shape == target {
            return match out {
                Some(o) => self.alias(o, g).map(|_| o),
                None => Ok(g),
            };
        }
        let lead = shape
            .len()
            .checked_sub(target.len())
            .ok_or("target has more dimensions")?;
        let dims: Vec<Arg> = (0..shape.len())
            .filter(|&d| d < lead || (target[d - lead] == 1 && shape[d] != 1))
            .map(|d| Arg::Int(d as i64))
            .collect();
        let summed = self.op(
            "ltorch.sum",
            vec![Arg::Value(g), Arg::List(dims), Arg::Bool(true)],
            vec![],
        )?;
        let args = vec![Arg::Value(summed), Self::shape_arg(target)];
        match out {
            Some(o) => self.into(o, "ltorch.reshape", args, vec![]).map(|_| o),
            None => self.op("ltorch.reshape", args, vec![]),
        }
    }

    /// `diff`'s operand as one tensor: `prepend`, `input` and `append` joined along `dim`.
    fn diff_joined(&mut self, b: &Bound, dim: usize) -> R<ValueId> {
        let mut parts = Vec::new();
        for side in ["prepend", "input", "append"] {
            if let Some(v) = b.opt_value(side)? {
                parts.push(Arg::Value(v));
            }
        }
        match parts[..] {
            [Arg::Value(x)] => Ok(x),
            _ => self.op(
                "ltorch.cat",
                vec![Arg::List(parts), Arg::Int(dim as i64)],
                vec![],
            ),
        }
    }

    /// `prims.slice_prim`'s operands for `v[start..end]` along `dim`.
    fn slice_args(&self, v: ValueId, dim: usize, start: usize, end: usize) -> R<Vec<Arg>> {
        let shape = self.tensor(v)?.shape.to_vec();
        let ints = |f: &dyn Fn(usize) -> usize| {
            Arg::List((0..shape.len()).map(|d| Arg::Int(f(d) as i64)).collect())
        };
        Ok(vec![
            Arg::Value(v),
            ints(&|d| if d == dim { start } else { 0 }),
            ints(&|d| if d == dim { end } else { shape[d] }),
            ints(&|_| 1),
        ])
    }

    fn slice(&mut self, v: ValueId, dim: usize, start: usize, end: usize) -> R<ValueId> {
        let args = self.slice_args(v, dim, start, end)?;
        self.op("prims.slice_prim", args, vec![])
    }

    /// `v[start..end]` along `dim`, as the value `out`.
    fn slice_into(
        &mut self,
        out: ValueId,
        v: ValueId,
        dim: usize,
        start: usize,
        end: usize,
    ) -> R<()> {
        let args = self.slice_args(v, dim, start, end)?;
        self.into(out, "prims.slice_prim", args, vec![])
    }

    fn diff_dim(&self, b: &Bound) -> R<(usize, usize)> {
        let rank = self.tensor(b.value("input")?)?.shape.len();
        let dim = crate::meta::norm_dim(b.int("dim")?, rank, "diff")?;
        let n = usize::try_from(b.int("n")?).map_err(|_| "negative order n".to_string())?;
        Ok((dim, n))
    }

    /// `diff`: `n` rounds of `z[1:] - z[:-1]` along `dim` (`!=` for bool) over the joined
    /// operand.
    fn diff(&mut self, node: &Node) -> R<()> {
        let out = Self::single_out(node)?;
        let b = self.bind("ltorch.diff", node.args(), node.kwargs())?;
        let (dim, n) = self.diff_dim(&b)?;
        let mut z = self.diff_joined(&b, dim)?;
        if n == 0 {
            return self.alias(out, z);
        }
        let step_op = if self.tensor(z)?.dtype == DType::Bool {
            "ltorch.ne"
        } else {
            "ltorch.sub"
        };
        for round in 0..n {
            let len = self.tensor(z)?.shape[dim];
            if len == 0 {
                break;
            }
            let hi = self.slice(z, dim, 1, len)?;
            let lo = self.slice(z, dim, 0, len - 1)?;
            let args = vec![Arg::Value(hi), Arg::Value(lo)];
            if round + 1 == n {
                return self.into(out, step_op, args, vec![]);
            }
            z = self.op(step_op, args, vec![])?;
        }
        // fewer elements than rounds: an empty result
        let len = self.tensor(out)?.shape[dim];
        self.slice_into(out, z, dim, 0, len)
    }

    /// `diff`'s gradient: each round's adjoint, `pad(g, before 1) - pad(g, after 1)` along
    /// `dim`, then the joined operand's gradient cut back into `prepend`, `input`, `append`.
    fn diff_vjp(&mut self, node: &Node) -> R<()> {
        let (args, kwargs, g) = fallback_parts(node)?;
        let b = self.bind("ltorch.diff", &args, &kwargs)?;
        let (dim, n) = self.diff_dim(&b)?;
        let names = ["input", "n", "dim", "prepend", "append"];
        let outs = named_gradients(node, args.len())?;
        let rank = self.tensor(g)?.shape.len();
        let mut grad = g;
        for _ in 0..n {
            let pad = |lo: i64, hi: i64| {
                Arg::List(
                    (0..rank)
                        .map(|d| {
                            let (l, h) = if d == dim { (lo, hi) } else { (0, 0) };
                            Arg::Tuple(vec![Arg::Int(l), Arg::Int(h), Arg::Int(0)])
                        })
                        .collect(),
                )
            };
            let later = self.op(
                "prims.pad",
                vec![Arg::Value(grad), Arg::Float(0.0), pad(1, 0)],
                vec![],
            )?;
            let earlier = self.op(
                "prims.pad",
                vec![Arg::Value(grad), Arg::Float(0.0), pad(0, 1)],
                vec![],
            )?;
            grad = self.op(
                "ltorch.sub",
                vec![Arg::Value(later), Arg::Value(earlier)],
                vec![],
            )?;
        }
        let lens = self.diff_lens(&b, dim)?;
        let starts = [0, lens[0], lens[0] + lens[1]];
        for (i, out) in outs.into_iter().enumerate() {
            let Some(out) = out else { continue };
            let k = match names.get(i) {
                Some(&"input") => 1,
                Some(&"prepend") => 0,
                Some(&"append") => 2,
                other => return Err(format!("no gradient for operand {other:?}")),
            };
            self.slice_into(out, grad, dim, starts[k], starts[k] + lens[k])?;
        }
        Ok(())
    }

    /// The lengths along `dim` of `prepend`, `input` and `append` (0 when absent).
    fn diff_lens(&self, b: &Bound, dim: usize) -> R<[usize; 3]> {
        let mut lens = [0usize; 3];
        for (k, side) in ["prepend", "input", "append"].iter().enumerate() {
            if let Some(v) = b.opt_value(side)? {
                lens[k] = self.tensor(v)?.shape[dim];
            }
        }
        Ok(lens)
    }

    /// `new_ones`/`new_zeros`/`new_empty`/`new_full`: a `full` of the statement's type.
    fn new_filled(&mut self, node: &Node, value: Option<Arg>) -> R<()> {
        let out = Self::single_out(node)?;
        let op = node.op.as_str().to_string();
        let b = self.bind(&op, node.args(), node.kwargs())?;
        let value = match value {
            Some(v) => v,
            None => b.get("fill_value")?.clone(),
        };
        let ty = self.tensor(out)?;
        self.full_of(out, &ty, value)
    }

    /// `full(shape, value)` in `ty`'s dtype and device, as the value `out` of type `ty`.
    fn full_of(&mut self, out: ValueId, ty: &TensorType, value: Arg) -> R<()> {
        let (args, kwargs) = Self::full_args(&ty.shape, value, ty);
        self.into(out, "ltorch.full", args, kwargs)
    }

    /// `ltorch.full`'s operands: `shape`, `value`, and `ty`'s device and dtype.
    fn full_args(shape: &[usize], value: Arg, ty: &TensorType) -> (Vec<Arg>, Vec<(String, Arg)>) {
        let kwargs = vec![
            (
                "device".to_string(),
                Arg::Device(ty.device, DeviceSpelling::Torch),
            ),
            (
                "dtype".to_string(),
                Arg::DType(ty.dtype, DTypeSpelling::Torch),
            ),
        ];
        (vec![Self::shape_arg(shape), value], kwargs)
    }

    /// `torch.tensor` of a nested list: one `full` for one number, else a `full` of each
    /// number joined by `cat` and shaped by `reshape`.
    fn tensor_literal(&mut self, node: &Node) -> R<()> {
        let out = Self::single_out(node)?;
        let b = self.bind("ltorch.tensor", node.args(), node.kwargs())?;
        let data = b.get("data")?.clone();
        let (_, numbers) = nested_numbers(&data)?;
        let ty = self.tensor(out)?;
        if numbers.len() == 1 || numbers.iter().all(|n| *n == numbers[0]) && !numbers.is_empty() {
            return self.full_of(out, &ty, numbers[0].clone());
        }
        let mut parts = Vec::new();
        for n in numbers {
            let (args, kwargs) = Self::full_args(&[1], n.clone(), &ty);
            parts.push(Arg::Value(self.op("ltorch.full", args, kwargs)?));
        }
        if parts.is_empty() {
            return self.full_of(out, &ty, Arg::Int(0));
        }
        if ty.shape.len() == 1 {
            return self.into(
                out,
                "ltorch.cat",
                vec![Arg::List(parts), Arg::Int(0)],
                vec![],
            );
        }
        let joined = self.op("ltorch.cat", vec![Arg::List(parts), Arg::Int(0)], vec![])?;
        let shape = Self::shape_arg(&ty.shape);
        self.into(
            out,
            "ltorch.reshape",
            vec![Arg::Value(joined), shape],
            vec![],
        )
    }
}

impl Emit<'_> {
    fn shape_arg(shape: &[usize]) -> Arg {
        Arg::Tuple(shape.iter().map(|&d| Arg::Int(d as i64)).collect())
    }

    /// `reshape_as(a, other)`: `a` reshaped to `other`'s shape.
    fn reshape_as(&mut self, node: &Node) -> R<()> {
        let out = Self::single_out(node)?;
        let b = self.bind("ltorch.reshape_as", node.args(), node.kwargs())?;
        let shape = self.tensor(b.value("other")?)?.shape.to_vec();
        let a = b.value("a")?;
        self.into(
            out,
            "ltorch.reshape",
            vec![Arg::Value(a), Self::shape_arg(&shape)],
            vec![],
        )
    }

    /// `reshape_as`'s gradients: `g` in `a`'s shape, and zeros for `other`, whose values the
    /// result does not read (`torch.autograd.functional.vjp` fills in zeros).
    fn reshape_as_vjp(&mut self, node: &Node) -> R<()> {
        let (args, kwargs, g) = fallback_parts(node)?;
        let b = self.bind("ltorch.reshape_as", &args, &kwargs)?;
        let outs = named_gradients(node, args.len())?;
        for (name, out) in ["a", "other"].iter().zip(outs) {
            let Some(out) = out else { continue };
            let ty = self.tensor(b.value(name)?)?;
            if *name == "a" {
                self.into(
                    out,
                    "ltorch.reshape",
                    vec![Arg::Value(g), Self::shape_arg(&ty.shape)],
                    vec![],
                )?;
            } else {
                self.full_of(out, &ty, Arg::Float(0.0))?;
            }
        }
        Ok(())
    }

    /// `linalg.vector_norm`/`norm` of order 1 (`sum(abs(x))`) or 2 (`sqrt(sum(x * x))`),
    /// and with `vjp` their gradient: `g * sign(x)`, and `g * x / norm` with 0 where the
    /// norm is 0 (PyTorch's `norm_backward`).
    fn norm(&mut self, node: &Node, forward: &str, vjp: bool) -> R<()> {
        let (args, kwargs, g) = if vjp {
            let (a, k, g) = fallback_parts(node)?;
            (a, k, Some(g))
        } else {
            (node.args().to_vec(), node.kwargs().to_vec(), None)
        };
        let b = self.bind(forward, &args, &kwargs)?;
        let (input, order) = if forward == "ltorch.norm" {
            ("input", "p")
        } else {
            ("x", "ord")
        };
        let x = b.value(input)?;
        let xt = self.tensor(x)?;
        let ord = crate::op_table::lowered::norm_order(forward, b.get(order).ok())?;
        let dims = crate::op_table::lowered::norm_dims(forward, b.get("dim").ok(), xt.shape.len())?;
        let keepdim = matches!(b.get("keepdim"), Ok(Arg::Bool(true)));
        let dim_list = Arg::List(dims.iter().map(|&d| Arg::Int(d as i64)).collect());
        let kept: Vec<usize> = (0..xt.shape.len())
            .map(|d| if dims.contains(&d) { 1 } else { xt.shape[d] })
            .collect();
        let Some(g) = g else {
            let out = Self::single_out(node)?;
            let sum_args = |v: ValueId| vec![Arg::Value(v), dim_list.clone(), Arg::Bool(keepdim)];
            if ord == 1.0 {
                let a = self.op("ltorch.abs", vec![Arg::Value(x)], vec![])?;
                return self.into(out, "ltorch.sum", sum_args(a), vec![]);
            }
            let sq = self.op("ltorch.mul", vec![Arg::Value(x), Arg::Value(x)], vec![])?;
            let s = self.op("ltorch.sum", sum_args(sq), vec![])?;
            return self.into(out, "ltorch.sqrt", vec![Arg::Value(s)], vec![]);
        };
        let outs = named_gradients(node, args.len())?;
        let Some(out) = outs.first().copied().flatten() else {
            return Ok(());
        };
        if outs.iter().skip(1).any(Option::is_some) {
            return Err("only the input gets a gradient".into());
        }
        let gk = self.op(
            "ltorch.reshape",
            vec![Arg::Value(g), Self::shape_arg(&kept)],
            vec![],
        )?;
        if ord == 1.0 {
            let sign = self.op("ltorch.sign", vec![Arg::Value(x)], vec![])?;
            return self.into(
                out,
                "ltorch.mul",
                vec![Arg::Value(sign), Arg::Value(gk)],
                vec![],
            );
        }
        let sq = self.op("ltorch.mul", vec![Arg::Value(x), Arg::Value(x)], vec![])?;
        let s = self.op(
            "ltorch.sum",
            vec![Arg::Value(sq), dim_list, Arg::Bool(true)],
            vec![],
        )?;
        let n = self.op("ltorch.sqrt", vec![Arg::Value(s)], vec![])?;
        let q = self.op("ltorch.div", vec![Arg::Value(gk), Arg::Value(n)], vec![])?;
        let zero = self.op("ltorch.eq", vec![Arg::Value(n), Arg::Float(0.0)], vec![])?;
        let q = self.op(
            "ltorch.where",
            vec![Arg::Value(zero), Arg::Float(0.0), Arg::Value(q)],
            vec![],
        )?;
        self.into(
            out,
            "ltorch.mul",
            vec![Arg::Value(x), Arg::Value(q)],
            vec![],
        )
    }
}

impl Emit<'_> {
    /// `div(a, b, rounding_mode=...)`: `'trunc'` is `trunc(a / b)` for floats (PyTorch's
    /// `div_trunc`) and `prims.div` (rounding toward zero) for integers; `'floor'` is
    /// `floor_divide`, which PyTorch defines as this very division.
    fn rounded_div(&mut self, node: &Node) -> R<()> {
        let out = Self::single_out(node)?;
        let (a, b) = match node.args() {
            [a, b] => (a.clone(), b.clone()),
            other => return Err(format!("expects two operands, got {}", other.len())),
        };
        let float = self.tensor(out)?.dtype.is_float();
        match node.kwarg("rounding_mode") {
            Some(Arg::Str(m)) if m == "trunc" && float => {
                let q = self.op("ltorch.true_divide", vec![a, b], vec![])?;
                self.into(out, "ltorch.trunc", vec![Arg::Value(q)], vec![])
            }
            Some(Arg::Str(m)) if m == "trunc" => self.into(out, "prims.div", vec![a, b], vec![]),
            Some(Arg::Str(m)) if m == "floor" => {
                self.into(out, "ltorch.floor_divide", vec![a, b], vec![])
            }
            other => Err(format!("unknown rounding_mode {other:?}")),
        }
    }
}

impl Emit<'_> {
    /// `ravel(a)`: `a` as one dimension.
    fn ravel(&mut self, node: &Node) -> R<()> {
        let out = Self::single_out(node)?;
        let b = self.bind("ltorch.ravel", node.args(), node.kwargs())?;
        let a = b.value("a")?;
        let n = self.tensor(a)?.numel();
        self.into(
            out,
            "ltorch.reshape",
            vec![Arg::Value(a), Self::shape_arg(&[n])],
            vec![],
        )
    }

    /// `narrow(a, dim, start, length)`: `a`, and its dimension, start and length.
    fn narrow_range(&self, b: &Bound) -> R<(ValueId, usize, usize, usize)> {
        let a = b.value("a")?;
        let shape = self.tensor(a)?.shape.to_vec();
        let (d, start, len) = crate::op_table::lowered::narrow_range(
            "narrow",
            &shape,
            b.int("dim")?,
            b.int("start")?,
            b.int("length")?,
        )?;
        Ok((a, d, start, len))
    }

    /// `narrow`: a slice of `dim`.
    fn narrow(&mut self, node: &Node) -> R<()> {
        let out = Self::single_out(node)?;
        let b = self.bind("ltorch.narrow", node.args(), node.kwargs())?;
        let (a, dim, start, len) = self.narrow_range(&b)?;
        self.slice_into(out, a, dim, start, start + len)
    }

    /// `tile(a, dims)`: `a`, and its shape and the repeats padded to one rank.
    fn tile_shapes(&self, b: &Bound) -> R<(ValueId, Vec<usize>, Vec<usize>)> {
        let a = b.value("a")?;
        let shape = self.tensor(a)?.shape.to_vec();
        let reps = crate::meta::flat_ints(b.get("dims")?, Arg::as_int)
            .ok_or("repeats must be integers")?;
        let (shape, reps) = crate::op_table::lowered::tile_shapes("tile", &shape, &reps)?;
        Ok((a, shape, reps))
    }

    /// `tile`: `a` as `[1, s0, 1, s1, ...]`, expanded to `[r0, s0, r1, s1, ...]`, merged.
    fn tile(&mut self, node: &Node) -> R<()> {
        let out = Self::single_out(node)?;
        let b = self.bind("ltorch.tile", node.args(), node.kwargs())?;
        let (a, shape, reps) = self.tile_shapes(&b)?;
        let split: Vec<usize> = shape.iter().flat_map(|&s| [1, s]).collect();
        let wide: Vec<usize> = shape
            .iter()
            .zip(&reps)
            .flat_map(|(&s, &r)| [r, s])
            .collect();
        let final_shape: Vec<usize> = shape.iter().zip(&reps).map(|(s, r)| s * r).collect();
        let v = self.op(
            "ltorch.reshape",
            vec![Arg::Value(a), Self::shape_arg(&split)],
            vec![],
        )?;
        let v = self.op(
            "ltorch.expand",
            vec![Arg::Value(v), Self::shape_arg(&wide)],
            vec![],
        )?;
        self.into(
            out,
            "ltorch.reshape",
            vec![Arg::Value(v), Self::shape_arg(&final_shape)],
            vec![],
        )
    }

    /// The gradients of `ravel` (`g` in `a`'s shape), `narrow` (`g` padded back with zeros)
    /// and `tile` (the sum over the copies).
    fn shape_vjp(&mut self, node: &Node, forward: &str) -> R<()> {
        let (args, kwargs, g) = fallback_parts(node)?;
        let b = self.bind(forward, &args, &kwargs)?;
        let outs = named_gradients(node, args.len())?;
        let Some(out) = outs.first().copied().flatten() else {
            return Ok(());
        };
        let a_shape = self.tensor(b.value("a")?)?.shape.to_vec();
        match forward {
            "ltorch.ravel" => self.into(
                out,
                "ltorch.reshape",
                vec![Arg::Value(g), Self::shape_arg(&a_shape)],
                vec![],
            ),
            "ltorch.narrow" => {
                let (_, dim, start, len) = self.narrow_range(&b)?;
                let cfg = (0..a_shape.len())
                    .map(|d| {
                        let (lo, hi) = if d == dim {
                            (start, a_shape[d] - start - len)
                        } else {
                            (0, 0)
                        };
                        Arg::Tuple(vec![Arg::Int(lo as i64), Arg::Int(hi as i64), Arg::Int(0)])
                    })
                    .collect();
                self.into(
                    out,
                    "prims.pad",
                    vec![Arg::Value(g), Arg::Float(0.0), Arg::List(cfg)],
                    vec![],
                )
            }
            _ => {
                let (_, shape, reps) = self.tile_shapes(&b)?;
                let wide: Vec<usize> = shape
                    .iter()
                    .zip(&reps)
                    .flat_map(|(&s, &r)| [r, s])
                    .collect();
                let v = self.op(
                    "ltorch.reshape",
                    vec![Arg::Value(g), Self::shape_arg(&wide)],
                    vec![],
                )?;
                let dims = Arg::List((0..shape.len()).map(|i| Arg::Int(2 * i as i64)).collect());
                let v = self.op(
                    "ltorch.sum",
                    vec![Arg::Value(v), dims, Arg::Bool(false)],
                    vec![],
                )?;
                self.into(
                    out,
                    "ltorch.reshape",
                    vec![Arg::Value(v), Self::shape_arg(&a_shape)],
                    vec![],
                )
            }
        }
    }

    /// The gradients of the elementwise and layout aliases, PyTorch's derivatives: each
    /// operand's summed to its shape where it was broadcast.
    fn alias_vjp(&mut self, node: &Node, forward: &str) -> R<()> {
        let (args, kwargs, g) = fallback_parts(node)?;
        let b = self.bind(forward, &args, &kwargs)?;
        let outs = named_gradients(node, args.len())?;
        let operand = |i: usize| args.get(i).cloned().unwrap_or(Arg::None);
        for (i, out) in outs.into_iter().enumerate() {
            let Some(out) = out else { continue };
            let Arg::Value(x) = operand(i) else {
                return Err(format!("operand {i} gets a gradient but is not a tensor"));
            };
            let target = self.tensor(x)?.shape.to_vec();
            let gv = Arg::Value(g);
            // the gradient before it is summed to the operand's shape
            let full = match (forward, i) {
                ("ltorch.swapaxes", 0) => {
                    let (d0, d1) = (b.get("dim0")?.clone(), b.get("dim1")?.clone());
                    return self.into(out, "ltorch.transpose", vec![gv, d0, d1], vec![]);
                }
                ("ltorch.moveaxis", 0) => {
                    let (src, dst) = (b.get("source")?.clone(), b.get("destination")?.clone());
                    return self.into(out, "ltorch.movedim", vec![gv, dst, src], vec![]);
                }
                ("ltorch.negative", 0) => return self.into(out, "ltorch.neg", vec![gv], vec![]),
                ("ltorch.absolute", 0) => {
                    let s = self.op("ltorch.sign", vec![Arg::Value(x)], vec![])?;
                    return self.into(out, "ltorch.mul", vec![gv, Arg::Value(s)], vec![]);
                }
                ("ltorch.fix", 0) => {
                    let ty = self.tensor(x)?;
                    return self.full_of(out, &ty, Arg::Float(0.0));
                }
                ("ltorch.clip", 0) => return self.clip_vjp(out, x, g, &b),
                ("ltorch.multiply", k) => {
                    let other = operand(1 - k);
                    self.op("ltorch.mul", vec![gv, other], vec![])?
                }
                ("ltorch.subtract", 0) => g,
                ("ltorch.subtract", 1) => {
                    let alpha = b.number("alpha").unwrap_or(Arg::Int(1));
                    let neg = match alpha {
                        Arg::Int(a) => Arg::Int(-a),
                        Arg::Float(a) => Arg::Float(-a),
                        _ => Arg::Int(-1),
                    };
                    self.op("ltorch.mul", vec![gv, neg], vec![])?
                }
                ("ltorch.divide", k) => {
                    if !matches!(b.get("rounding_mode"), Err(_) | Ok(Arg::None)) {
                        let ty = self.tensor(x)?;
                        return self.full_of(out, &ty, Arg::Float(0.0));
                    }
                    let (num, den) = (operand(0), operand(1));
                    let q = self.op("ltorch.true_divide", vec![gv, den.clone()], vec![])?;
                    if k == 0 {
                        q
                    } else {
                        // d(a / b)/db = -a / b^2: -(g / b) * (a / b)
                        let r = self.op("ltorch.true_divide", vec![num, den], vec![])?;
                        let p =
                            self.op("ltorch.mul", vec![Arg::Value(q), Arg::Value(r)], vec![])?;
                        self.op("ltorch.neg", vec![Arg::Value(p)], vec![])?
                    }
                }
                (f, k) => return Err(format!("no gradient of {f} for operand {k}")),
            };
            self.sum_to(full, &target, Some(out))?;
        }
        Ok(())
    }

    /// `clip(a, min, max)`'s gradient: `g` where `min <= a <= max`, else 0 (PyTorch's
    /// inclusive bounds); the bounds must be numbers.
    fn clip_vjp(&mut self, out: ValueId, x: ValueId, g: ValueId, b: &Bound) -> R<()> {
        let mut mask: Option<ValueId> = None;
        for (bound, cmp) in [("min", "ltorch.ge"), ("max", "ltorch.le")] {
            let v = match b.get(bound) {
                Err(_) | Ok(Arg::None) => continue,
                Ok(a @ (Arg::Int(_) | Arg::Float(_))) => a.clone(),
                Ok(other) => return Err(format!("`{bound}` must be a number, got {other:?}")),
            };
            let m = self.op(cmp, vec![Arg::Value(x), v], vec![])?;
            mask = Some(match mask {
                None => m,
                Some(prev) => self.op(
                    "ltorch.logical_and",
                    vec![Arg::Value(prev), Arg::Value(m)],
                    vec![],
                )?,
            });
        }
        match mask {
            None => self.alias(out, g),
            Some(m) => self.into(
                out,
                "ltorch.where",
                vec![Arg::Value(m), Arg::Value(g), Arg::Float(0.0)],
                vec![],
            ),
        }
    }
}

/// A fallback vjp's forward positional and keyword operands, and the output's gradient.
type FallbackParts = (Vec<Arg>, Vec<(String, Arg)>, ValueId);

/// A fallback vjp's forward operands (positional and keyword) and the output's gradient.
fn fallback_parts(node: &Node) -> R<FallbackParts> {
    let saved = node.args().first().ok_or("no saved operands")?;
    let (args, kwargs) = saved_call(saved)?;
    match node.args() {
        [_, Arg::Value(g)] => Ok((args, kwargs, *g)),
        other => Err(format!(
            "expects the forward's operands and one gradient, got {} operands",
            other.len()
        )),
    }
}

/// The value the statement binds to the gradient of each of the forward's `count` positional
/// operands (`None` where it binds `_` or nothing).
fn named_gradients(node: &Node, count: usize) -> R<Vec<Option<ValueId>>> {
    let outs = node.outputs();
    let mut next = outs.iter().copied();
    let named: Vec<bool> = match node.lhs_pattern() {
        Some(p) => {
            if p.iter().any(|s| matches!(s, LhsSlot::Group(_))) {
                return Err("a nested left-hand side for a flat operand list".into());
            }
            (0..count)
                .map(|i| matches!(p.get(i), Some(LhsSlot::Out)))
                .collect()
        }
        None => (0..count).map(|i| i < outs.len()).collect(),
    };
    if named.iter().filter(|&&n| n).count() != outs.len() {
        return Err(format!("binds {} results for {count} operands", outs.len()));
    }
    Ok(named
        .into_iter()
        .map(|n| if n { next.next() } else { None })
        .collect())
}

fn is_one(a: &Arg) -> bool {
    matches!(a, Arg::Int(1)) || matches!(a, Arg::Float(x) if *x == 1.0)
}

fn is_zero(a: &Arg) -> bool {
    matches!(a, Arg::Int(0)) || matches!(a, Arg::Float(x) if *x == 0.0)
}

/// Operands by parameter name, owned.
#[derive(Default)]
struct Bound(Vec<(String, Arg)>);

impl Bound {
    fn get(&self, name: &str) -> R<&Arg> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
            .ok_or_else(|| format!("no operand `{name}`"))
    }
    fn value(&self, name: &str) -> R<ValueId> {
        match self.get(name)? {
            Arg::Value(v) => Ok(*v),
            other => Err(format!("`{name}` must be a tensor, got {other:?}")),
        }
    }
    fn opt_value(&self, name: &str) -> R<Option<ValueId>> {
        match self.get(name) {
            Err(_) | Ok(Arg::None) => Ok(None),
            Ok(Arg::Value(v)) => Ok(Some(*v)),
            Ok(other) => Err(format!("`{name}` must be a tensor, got {other:?}")),
        }
    }
    fn int(&self, name: &str) -> R<i64> {
        self.get(name)?
            .as_int()
            .ok_or_else(|| format!("`{name}` must be an integer literal"))
    }
    /// A number literal (`beta`, `alpha`); a traced number is refused, never guessed.
    fn number(&self, name: &str) -> R<Arg> {
        match self.get(name)? {
            a @ (Arg::Int(_) | Arg::Float(_)) => Ok(a.clone()),
            Arg::Bool(b) => Ok(Arg::Int(*b as i64)),
            other => Err(format!("`{name}` must be a number literal, got {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{parse_trace, print_trace, verify};

    #[test]
    fn addmm_and_its_vjp_become_products_and_a_sum() {
        let text = "def f(b, x, w, g):
  # b: \"cpu f32[3]\"
  # x: \"cpu f32[2, 4]\"
  # w: \"cpu f32[4, 3]\"
  # g: \"cpu f32[2, 3]\"
  y = torch.addmm(b, x, w)  # y: \"cpu f32[2, 3]\"
  (gb, gx, gw) = addmm_vjp(((b, x, w), {}), g)
  return (y, gb, gx, gw)
";
        let t = parse_trace(text).unwrap();
        verify(&t).unwrap();
        insta::assert_snapshot!(print_trace(&t));
        let said: Vec<&str> = t.provenance.iter().map(|p| p.pass.as_str()).collect();
        assert_eq!(
            said,
            [format!("{}`torch.addmm`, `addmm_vjp`", super::PROVENANCE)]
        );
    }

    #[test]
    fn a_result_of_another_type_than_printed_is_refused() {
        // the trace says [2, 5]; the product of these matrices is [2, 3]
        let text = "def f(x, w):
  # x: \"cpu f32[2, 4]\"
  # w: \"cpu f32[4, 3]\"
  y = torch.mm(x, w)  # y: \"cpu f32[2, 5]\"
  return y
";
        let e = parse_trace(text).unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        assert!(e.message.contains("the trace says cpu f32[2, 5]"), "{e}");
    }
}
