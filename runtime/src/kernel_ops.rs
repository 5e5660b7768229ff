//! Decoding the real models' ops into [`Kernel`]s: one function per op, reading the node's
//! operands in PyTorch's (or Thunder's prim's) argument order, positional or keyword. The name
//! mapping is [`decode_op`]'s one `match`, to re-key onto the IR's op table.

use crate::kernel::{CompareOp, Decoded, Kernel, Side};
use tracepass_ir::{Arg, DType, Node, Trace, ValueId};

/// The op's base name with the spellings of Thunder's executors removed: `ltorch.pad`,
/// `prims.pad`, `torch.pad`, `Tensor.expand`, `torch.nn.functional.silu`,
/// `torch.torch.ops.aten.embedding_backward`, `torch_pad_prim_impl`,
/// `torch_prims_reshape_impl` and `prims.slice_prim` all name their base op.
pub fn canonical_base(op: &str) -> &str {
    const PREFIXES: &[&str] = &[
        "torch.torch.ops.aten.",
        "torch.ops.aten.",
        "torch.nn.functional.",
        "torch.Tensor.",
        "Tensor.",
        "ltorch.",
        "prims.",
        "dist.",
        "torch.",
    ];
    let mut base = op;
    for p in PREFIXES {
        if let Some(rest) = base.strip_prefix(p) {
            base = rest;
            break;
        }
    }
    if let Some(rest) = base
        .strip_prefix("torch_prims_")
        .and_then(|r| r.strip_suffix("_impl"))
    {
        return rest;
    }
    if let Some(rest) = base
        .strip_prefix("torch_")
        .and_then(|r| r.strip_suffix("_prim_impl"))
    {
        return rest;
    }
    base.strip_suffix("_prim").unwrap_or(base)
}

/// Decodes the ops this module knows; `Ok(None)` for any other.
pub fn decode_op(trace: &Trace, node: &Node) -> Result<Option<Decoded>, String> {
    let mut o = Ops {
        trace,
        node,
        inputs: Vec::new(),
    };
    // the op table's canonical name (a node built by hand may carry a spelling): exact names,
    // since ops that share a base name differ (`prims.pad` is Thunder's, `ltorch.pad` is F.pad)
    let op = tracepass_ir::OpRegistry::builtin()
        .resolve(node.op.as_str())
        .unwrap_or(node.op.as_str());
    let kernel = match op {
        "ltorch.convolution" | "prims.convolution" => convolution(&mut o)?,
        "ltorch.max_pool2d_with_indices" => max_pool2d(&mut o)?,
        "ltorch.max_pool2d_with_indices_backward" => max_pool2d_backward(&mut o)?,
        "ltorch.embedding" => embedding(&mut o)?,
        "ltorch.embedding_backward" => embedding_backward(&mut o)?,
        "ltorch.var_mean" => var_mean(&mut o)?,
        "prims.pad" => pad(&mut o)?,
        "prims.slice_prim" => slice(&mut o)?,
        "ltorch.split" => split(&mut o)?,
        "ltorch.cat" => cat(&mut o)?,
        "ltorch.expand" => expand(&mut o)?,
        "ltorch.flip" => flip(&mut o)?,
        "ltorch.squeeze" => squeeze(&mut o)?,
        "ltorch.unsqueeze" => unsqueeze(&mut o)?,
        "ltorch.arange" => arange(&mut o)?,
        "ltorch.full" | "prims.full" => full(&mut o)?,
        "ltorch.lt" | "prims.lt" => compare(&mut o, CompareOp::Lt)?,
        "ltorch.le" | "prims.le" => compare(&mut o, CompareOp::Le)?,
        "ltorch.gt" | "prims.gt" => compare(&mut o, CompareOp::Gt)?,
        "ltorch.ge" | "prims.ge" => compare(&mut o, CompareOp::Ge)?,
        "ltorch.eq" | "prims.eq" => compare(&mut o, CompareOp::Eq)?,
        "ltorch.ne" | "prims.ne" => compare(&mut o, CompareOp::Ne)?,
        "ltorch.where" | "prims.where" => where_(&mut o)?,
        "ltorch.silu" => silu(&mut o)?,
        tracepass_ir::ops::COPY => copy(&mut o)?,
        "prims.uniform" => uniform(&mut o)?,
        _ => return Ok(None),
    };
    Ok(Some(Decoded {
        kernel,
        inputs: o.inputs,
    }))
}

/// A node's operands, read positionally or by keyword; tensor operands are collected in order.
struct Ops<'a> {
    trace: &'a Trace,
    node: &'a Node,
    inputs: Vec<ValueId>,
}

impl Ops<'_> {
    fn arg(&self, i: usize, key: &str) -> Option<&Arg> {
        self.node
            .args()
            .get(i)
            .or_else(|| self.node.kwarg(key))
            .filter(|a| !matches!(a, Arg::None))
    }
    fn tensor(&mut self, i: usize, key: &str) -> Result<(), String> {
        match self.arg(i, key) {
            Some(Arg::Value(v)) => {
                self.inputs.push(*v);
                Ok(())
            }
            other => Err(format!(
                "operand {i} (`{key}`) must be a tensor, got {other:?}"
            )),
        }
    }
    /// A tensor, or nothing when the operand is absent or `None`.
    fn opt_tensor(&mut self, i: usize, key: &str) -> Result<bool, String> {
        match self.arg(i, key) {
            None => Ok(false),
            Some(_) => self.tensor(i, key).map(|_| true),
        }
    }
    fn side(&mut self, i: usize, key: &str) -> Result<Side, String> {
        match self.arg(i, key) {
            Some(Arg::Value(v)) => {
                self.inputs.push(*v);
                Ok(Side::Input(self.inputs.len() - 1))
            }
            Some(a) => a
                .as_f64()
                .map(Side::Scalar)
                .ok_or_else(|| format!("operand {i} (`{key}`) is {a:?}, not a tensor or number")),
            None => Err(format!("operand {i} (`{key}`) is missing")),
        }
    }
    fn ints(&self, i: usize, key: &str) -> Result<Option<Vec<i64>>, String> {
        self.arg(i, key)
            .map(|a| {
                a.as_int_list()
                    .ok_or_else(|| format!("operand {i} (`{key}`) must be ints, got {a:?}"))
            })
            .transpose()
    }
    fn ints_or(&self, i: usize, key: &str, default: &[i64]) -> Result<Vec<i64>, String> {
        Ok(self.ints(i, key)?.unwrap_or_else(|| default.to_vec()))
    }
    fn int(&self, i: usize, key: &str) -> Result<Option<i64>, String> {
        self.arg(i, key)
            .map(|a| {
                a.as_int()
                    .ok_or_else(|| format!("operand {i} (`{key}`) must be an int, got {a:?}"))
            })
            .transpose()
    }
    fn number(&self, i: usize, key: &str) -> Result<Option<f64>, String> {
        self.arg(i, key)
            .map(|a| {
                a.as_f64()
                    .ok_or_else(|| format!("operand {i} (`{key}`) must be a number, got {a:?}"))
            })
            .transpose()
    }
    fn flag(&self, i: usize, key: &str) -> Result<bool, String> {
        match self.arg(i, key) {
            None => Ok(false),
            Some(Arg::Bool(b)) => Ok(*b),
            Some(a) => Err(format!("operand {i} (`{key}`) must be a bool, got {a:?}")),
        }
    }
    fn out(&self, k: usize) -> Result<&tracepass_ir::TensorType, String> {
        let v = self
            .node
            .outputs()
            .get(k)
            .ok_or_else(|| format!("the node has no output {k}"))?;
        self.trace
            .ty(*v)
            .and_then(|t| t.as_tensor())
            .ok_or_else(|| format!("output `{}` is not a tensor", self.trace.name(*v)))
    }
    fn in_shape(&self, input: usize) -> Result<Vec<usize>, String> {
        let v = self.inputs[input];
        self.trace
            .ty(v)
            .and_then(|t| t.as_tensor())
            .map(|t| t.shape.to_vec())
            .ok_or_else(|| format!("`{}` is not a tensor", self.trace.name(v)))
    }
}

/// `convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)`.
fn convolution(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    o.tensor(1, "weight")?;
    let bias = o.opt_tensor(2, "bias")?;
    if o.flag(6, "transposed")? {
        return Err("transposed convolution is not supported".into());
    }
    if o.ints_or(7, "output_padding", &[0])?
        .iter()
        .any(|&p| p != 0)
    {
        return Err("output_padding applies only to transposed convolution".into());
    }
    Ok(Kernel::Convolution {
        stride: o.ints_or(3, "stride", &[1])?,
        padding: o.ints_or(4, "padding", &[0])?,
        dilation: o.ints_or(5, "dilation", &[1])?,
        groups: o.int(8, "groups")?.unwrap_or(1),
        bias,
    })
}

/// `max_pool2d_with_indices(x, kernel_size, stride=[], padding=0, dilation=1, ceil_mode=False)`.
fn max_pool2d(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    Ok(Kernel::MaxPool2d {
        kernel: o
            .ints(1, "kernel_size")?
            .ok_or("max_pool2d needs kernel_size")?,
        stride: o.ints_or(2, "stride", &[])?,
        padding: o.ints_or(3, "padding", &[0])?,
        dilation: o.ints_or(4, "dilation", &[1])?,
        ceil_mode: o.flag(5, "ceil_mode")?,
    })
}

/// `max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
/// ceil_mode, indices)`: the indices say where each gradient goes.
fn max_pool2d_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad_output")?;
    o.tensor(1, "self")?;
    o.tensor(7, "indices")?;
    Ok(Kernel::MaxPool2dBackward)
}

/// `embedding(idx, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)`.
fn embedding(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    o.tensor(1, "weight")?;
    if o.arg(3, "max_norm").is_some() {
        return Err("embedding with max_norm (an in-place renorm) is not supported".into());
    }
    Ok(Kernel::Embedding)
}

/// `aten.embedding_backward(grad, idx, num_weights, padding_idx, scale_grad_by_freq, sparse)`.
fn embedding_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad")?;
    o.tensor(1, "indices")?;
    if o.flag(5, "sparse")? {
        return Err("sparse embedding gradients are not supported".into());
    }
    let num_weights = o
        .int(2, "num_weights")?
        .ok_or("embedding_backward needs num_weights")?;
    Ok(Kernel::EmbeddingBackward {
        num_weights: usize::try_from(num_weights)
            .map_err(|_| format!("num_weights {num_weights} is negative"))?,
        padding_idx: o.int(3, "padding_idx")?.unwrap_or(-1),
        scale_grad_by_freq: o.flag(4, "scale_grad_by_freq")?,
    })
}

/// `var_mean(x, dim, *, correction=1, keepdim=False)` (also the older `(x, dim, unbiased,
/// keepdim)` form and `prims.var_mean(x, dims, correction=)`).
fn var_mean(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    let dims = o.ints(1, "dim")?;
    let (correction, keepdim) = match o.node.args().get(2) {
        Some(Arg::Bool(unbiased)) => (if *unbiased { 1.0 } else { 0.0 }, o.flag(3, "keepdim")?),
        _ => (
            match o
                .node
                .kwarg("correction")
                .filter(|a| !matches!(a, Arg::None))
            {
                Some(a) => a
                    .as_f64()
                    .ok_or_else(|| format!("correction must be a number, got {a:?}"))?,
                None => 1.0,
            },
            match o.node.kwarg("keepdim") {
                Some(Arg::Bool(b)) => *b,
                _ => false,
            },
        ),
    };
    Ok(Kernel::VarMean {
        dims,
        correction,
        keepdim,
    })
}

/// `prims.pad(x, padding_value, padding_config)`.
fn pad(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let value = o.number(1, "padding_value")?.unwrap_or(0.0);
    let config = match o.arg(2, "padding_config") {
        Some(Arg::Tuple(items) | Arg::List(items)) => items
            .iter()
            .map(|t| match t.as_int_list().as_deref() {
                Some(&[lo, hi, interior]) => Ok((lo, hi, interior)),
                _ => Err(format!(
                    "a padding triple must be (lo, hi, interior), got {t:?}"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(format!(
                "padding_config must be a list of triples, got {other:?}"
            ))
        }
    };
    Ok(Kernel::Pad { value, config })
}

/// `prims.slice_prim(x, start_indices, end_indices, strides=None)`.
fn slice(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let start = o
        .ints(1, "start_indices")?
        .ok_or("slice needs start_indices")?;
    let end = o.ints(2, "end_indices")?.ok_or("slice needs end_indices")?;
    let step = o.ints_or(3, "strides", &vec![1; start.len()])?;
    Ok(Kernel::Slice { start, end, step })
}

/// `split(x, split_size_or_sections, dim=0)`, resolved to explicit sizes from the input shape.
fn split(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "tensor")?;
    let shape = o.in_shape(0)?;
    let dim = o.int(2, "dim")?.unwrap_or(0);
    let d = crate::cpu::layout::norm_dim(dim, shape.len())?;
    let sizes = match o.arg(1, "split_size_or_sections") {
        Some(Arg::Int(c)) => {
            let c = usize::try_from(*c).map_err(|_| format!("split size {c} is negative"))?;
            if c == 0 {
                return Err("split size 0".into());
            }
            let n = shape[d];
            (0..n.div_ceil(c).max(1))
                .map(|i| c.min(n - i * c))
                .collect()
        }
        Some(a) => a
            .as_int_list()
            .and_then(|v| v.into_iter().map(|x| usize::try_from(x).ok()).collect())
            .ok_or_else(|| format!("split sizes must be non-negative ints, got {a:?}"))?,
        None => return Err("split needs split_size_or_sections".into()),
    };
    Ok(Kernel::Split { sizes, dim })
}

/// `cat(tensors, dim=0)`.
fn cat(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let node = o.node;
    match node.args().first().or_else(|| node.kwarg("tensors")) {
        Some(Arg::Tuple(items) | Arg::List(items)) => {
            for t in items {
                match t {
                    Arg::Value(v) => o.inputs.push(*v),
                    other => return Err(format!("cat operands must be tensors, got {other:?}")),
                }
            }
        }
        other => return Err(format!("cat needs a sequence of tensors, got {other:?}")),
    }
    Ok(Kernel::Cat {
        dim: o.int(1, "dim")?.unwrap_or(0),
    })
}

/// `Tensor.expand(x, shape)` or `Tensor.expand(x, *sizes)`.
fn expand(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "self")?;
    let sizes = if o.node.args().len() > 2 {
        o.node.args()[1..]
            .iter()
            .map(|a| {
                a.as_int()
                    .ok_or_else(|| format!("expand size {a:?} is not an int"))
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        o.ints(1, "size")?.ok_or("expand needs a shape")?
    };
    Ok(Kernel::Expand(sizes))
}

fn flip(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    Ok(Kernel::Flip(o.ints(1, "dims")?.ok_or("flip needs dims")?))
}

fn squeeze(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    Ok(Kernel::Squeeze(o.ints(1, "dim")?))
}

fn unsqueeze(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    Ok(Kernel::Unsqueeze(
        o.int(1, "dim")?.ok_or("unsqueeze needs a dim")?,
    ))
}

/// `arange(start, end=None, step=1, device=, dtype=)`; the dtype is the output's.
fn arange(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let first = o.number(0, "start")?.ok_or("arange needs an end")?;
    let (start, end) = match o.number(1, "end")? {
        Some(e) => (first, e),
        None => (0.0, first),
    };
    Ok(Kernel::Arange {
        start,
        end,
        step: o.number(2, "step")?.unwrap_or(1.0),
        dtype: o.out(0)?.dtype,
    })
}

/// `full(shape, fill_value, device=, dtype=)`; the dtype is the output's.
fn full(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let out = o.out(0)?;
    Ok(Kernel::Full {
        shape: out.shape.to_vec(),
        value: o.number(1, "fill_value")?.ok_or("full needs fill_value")?,
        dtype: out.dtype,
    })
}

fn compare(o: &mut Ops<'_>, op: CompareOp) -> Result<Kernel, String> {
    let a = o.side(0, "input")?;
    let b = o.side(1, "other")?;
    if matches!((a, b), (Side::Scalar(_), Side::Scalar(_))) {
        return Err("both operands are numbers".into());
    }
    Ok(Kernel::Compare { op, a, b })
}

/// `where(cond, a, b)`: the output's dtype is the operands' promotion.
fn where_(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "condition")?;
    let a = o.side(1, "input")?;
    let b = o.side(2, "other")?;
    Ok(Kernel::Where {
        a,
        b,
        dtype: o.out(0)?.dtype,
    })
}

fn silu(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    if o.flag(1, "inplace")? {
        return Err("in-place silu is not supported".into());
    }
    Ok(Kernel::Silu)
}

/// `copy_(src, dst)`: the value `dst` holds afterwards.
fn copy(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "copy_from")?;
    o.tensor(1, "copy_to")?;
    Ok(Kernel::Copy)
}

/// `uniform(shape, minval, maxval, device=, dtype=)`.
fn uniform(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let out = o.out(0)?;
    let dtype: DType = out.dtype;
    Ok(Kernel::Uniform {
        shape: out.shape.to_vec(),
        minval: o.number(1, "minval")?.unwrap_or(0.0),
        maxval: o.number(2, "maxval")?.unwrap_or(1.0),
        dtype,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executor_spellings_reduce_to_one_name() {
        for (spelled, base) in [
            ("torch.convolution", "convolution"),
            ("ltorch.convolution", "convolution"),
            ("torch_pad_prim_impl", "pad"),
            ("prims.pad", "pad"),
            ("torch_slice_prim_impl", "slice"),
            ("prims.slice_prim", "slice"),
            ("torch_prims_reshape_impl", "reshape"),
            (
                "torch.torch.ops.aten.embedding_backward",
                "embedding_backward",
            ),
            ("torch.nn.functional.silu", "silu"),
            ("Tensor.expand", "expand"),
            ("torch.Tensor.to", "to"),
            ("max_pool2d_with_indices", "max_pool2d_with_indices"),
            ("copy_", "copy_"),
            ("dist.all_reduce", "all_reduce"),
        ] {
            assert_eq!(canonical_base(spelled), base, "{spelled}");
        }
    }
}
