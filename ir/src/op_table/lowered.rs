//! Torch ops that Thunder 0.2.6 prints with no decomposition of its own and that tracepass
//! reads by rewriting each statement into ops of this table as it parses a trace
//! ([`crate::lowering`]). Most come from `thunder/torch/default_torch_ops.py` (registered
//! automatically, run by PyTorch, differentiated by `torch.autograd`: their backward halves are
//! the `*_vjp` entries of [`super::fallback`]); `torch.tensor` of a list is Thunder's own, but
//! its prim `tensor_from_sequence` has no other reader. Each meta types the statement as
//! printed; the rewrite is checked against it.

use super::op;
use crate::arg::Arg;
use crate::meta::{dim_of, one};
use crate::registry::DTypeRule::{First, Meta};
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, Device, TensorType};

type R = Result<MetaOut, String>;

/// The `[n, p]` of a product of an `[n, k]` and a `[k, p]` matrix.
pub(crate) fn matrix_product(
    cx: &MetaCx,
    a: &TensorType,
    b: &TensorType,
) -> Result<[usize; 2], String> {
    match (&a.shape[..], &b.shape[..]) {
        ([n, k], [k2, p]) if k == k2 => Ok([*n, *p]),
        (sa, sb) => Err(format!(
            "{}: expects an [n, k] and a [k, p] matrix, got {sa:?} and {sb:?}",
            cx.op
        )),
    }
}

/// `mm(input, mat2)`.
fn mm(cx: &MetaCx) -> R {
    let a = cx.tensor_param("input")?;
    let b = cx.tensor_param("mat2")?;
    let shape = matrix_product(cx, &a, &b)?;
    one(TensorType::new(shape, a.dtype, a.device))
}

/// `addmm(input, mat1, mat2, *, beta=1, alpha=1)`: `input` broadcasts to the product's shape.
fn addmm(cx: &MetaCx) -> R {
    let input = cx.tensor_param("input")?;
    let a = cx.tensor_param("mat1")?;
    let b = cx.tensor_param("mat2")?;
    let shape = matrix_product(cx, &a, &b)?;
    let fits = input.shape.len() <= 2
        && input
            .shape
            .iter()
            .rev()
            .zip(shape.iter().rev())
            .all(|(i, o)| *i == 1 || i == o);
    if !fits {
        return Err(format!(
            "{}: `input` of shape {:?} does not broadcast to the product's {shape:?}",
            cx.op, input.shape
        ));
    }
    one(TensorType::new(shape, a.dtype, a.device))
}

/// `diff(input, n=1, dim=-1, prepend=None, append=None)`: `prepend`, `input` and `append`
/// joined along `dim`, then `n` times the differences of neighbours (`!=` for bool).
fn diff(cx: &MetaCx) -> R {
    let a = cx.tensor_param("input")?;
    if a.shape.is_empty() {
        return Err(format!(
            "{}: diff needs a tensor of at least one dimension",
            cx.op
        ));
    }
    let d = dim_of(cx, cx.int_param("dim")?, a.shape.len())?;
    let n = cx.int_param("n")?;
    if n < 0 {
        return Err(format!("{}: order n must be non-negative, got {n}", cx.op));
    }
    let mut len = a.shape[d];
    for side in ["prepend", "append"] {
        if let Some(t) = cx.opt_tensor(side)? {
            let same = t.shape.len() == a.shape.len()
                && t.shape
                    .iter()
                    .zip(&a.shape)
                    .enumerate()
                    .all(|(i, (x, y))| i == d || x == y);
            if !same || t.dtype != a.dtype {
                return Err(format!(
                    "{}: `{side}` ({} {:?}) must match the input ({} {:?}) but along dim {d}",
                    cx.op, t.dtype, t.shape, a.dtype, a.shape
                ));
            }
            len += t.shape[d];
        }
    }
    let mut shape = a.shape.to_vec();
    shape[d] = len.saturating_sub(n as usize);
    one(TensorType::new(shape, a.dtype, a.device))
}

/// `Tensor.new_ones(a, size, *, dtype=None, device=None)` (`new_zeros`, `new_empty`):
/// `a`'s dtype and device unless given.
fn new_filled(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let size = cx.ints_param("size")?;
    let shape = size
        .iter()
        .map(|d| usize::try_from(*d).map_err(|_| format!("{}: negative size {d}", cx.op)))
        .collect::<Result<Vec<_>, _>>()?;
    let dtype = cx.dtype_param("dtype").unwrap_or(a.dtype);
    let device = cx.device_param("device")?.unwrap_or(a.device);
    one(TensorType::new(shape, dtype, device))
}

/// `torch.tensor(data, *, dtype=None, device=None)` of a nested list of numbers: its shape,
/// and PyTorch's dtype for it (bool, int64, or the default float) unless given.
fn tensor(cx: &MetaCx) -> R {
    let (shape, numbers) =
        nested_numbers(cx.param("data")?).map_err(|m| format!("{}: `data` {m}", cx.op))?;
    let inferred = if numbers.iter().any(|n| matches!(n, Arg::Float(_))) {
        DType::F32
    } else if !numbers.is_empty() && numbers.iter().all(|n| matches!(n, Arg::Bool(_))) {
        DType::Bool
    } else {
        DType::I64
    };
    let dtype = cx.dtype_param("dtype").unwrap_or(inferred);
    let device = cx.device_param("device")?.unwrap_or(Device::CPU);
    one(TensorType::new(shape, dtype, device))
}

/// The shape of a nested list (or tuple) of number literals, and its numbers in row-major
/// order; ragged nesting and anything but numbers are errors.
pub(crate) fn nested_numbers(data: &Arg) -> Result<(Vec<usize>, Vec<&Arg>), String> {
    match data {
        Arg::List(items) | Arg::Tuple(items) => {
            let mut inner: Option<Vec<usize>> = None;
            let mut numbers = Vec::new();
            for item in items {
                let (s, mut n) = nested_numbers(item)?;
                match &inner {
                    Some(first) if *first != s => {
                        return Err(format!("is ragged: {first:?} next to {s:?}"))
                    }
                    _ => inner = Some(s),
                }
                numbers.append(&mut n);
            }
            let mut shape = vec![items.len()];
            shape.extend(inner.unwrap_or_default());
            Ok((shape, numbers))
        }
        Arg::Int(_) | Arg::Float(_) | Arg::Bool(_) => Ok((Vec::new(), vec![data])),
        other => Err(format!("must be numbers in nested lists, got {other:?}")),
    }
}

/// `Tensor.reshape_as(a, other)`: `a` in `other`'s shape.
fn reshape_as(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let other = cx.tensor_param("other")?;
    if a.numel() != other.numel() {
        return Err(format!(
            "{}: {:?} has {} elements, {:?} {}",
            cx.op,
            a.shape,
            a.numel(),
            other.shape,
            other.numel()
        ));
    }
    one(TensorType::new(&other.shape[..], a.dtype, a.device))
}

/// The dimensions a norm reduces: `dim` (an int, a tuple, or `None` for all of them).
pub(crate) fn norm_dims(op: &str, dim: Option<&Arg>, rank: usize) -> Result<Vec<usize>, String> {
    let given: Vec<i64> = match dim {
        None | Some(Arg::None) => return Ok((0..rank).collect()),
        Some(Arg::Int(d)) => vec![*d],
        Some(Arg::Tuple(ds) | Arg::List(ds)) => ds
            .iter()
            .map(|d| {
                d.as_int()
                    .ok_or_else(|| format!("{op}: `dim` must be integers"))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("{op}: `dim` must be integers, got {other:?}")),
    };
    let mut dims = Vec::new();
    for d in given {
        let n = crate::meta::norm_dim(d, rank.max(1), op)?;
        if dims.contains(&n) {
            return Err(format!("{op}: dim {d} given twice"));
        }
        dims.push(n);
    }
    dims.sort_unstable();
    Ok(dims)
}

/// The order of a vector norm as a number: `ord` of `linalg.vector_norm`, `p` of `norm`
/// (`'fro'` is 2); only 1 and 2 are read.
pub(crate) fn norm_order(op: &str, p: Option<&Arg>) -> Result<f64, String> {
    let ord = match p {
        None | Some(Arg::None) => 2.0,
        Some(Arg::Str(s)) if s == "fro" => 2.0,
        Some(a) => a
            .as_f64()
            .ok_or_else(|| format!("{op}: norm order {a:?} is not a number"))?,
    };
    if ord == 1.0 || ord == 2.0 {
        Ok(ord)
    } else {
        Err(format!(
            "{op}: only the 1- and 2-norm are read, not ord={ord}"
        ))
    }
}

/// `linalg.vector_norm(x, ord=2, dim=None, keepdim=False)` and `norm(x, p='fro', dim=None,
/// keepdim=False)`: the reduced shape, in the input's float dtype.
fn vector_norm(cx: &MetaCx) -> R {
    norm_of(cx, "x", "ord")
}

fn norm(cx: &MetaCx) -> R {
    norm_of(cx, "input", "p")
}

fn norm_of(cx: &MetaCx, input: &str, order: &str) -> R {
    let x = cx.tensor_param(input)?;
    if !x.dtype.is_float() {
        return Err(format!(
            "{}: expects a floating-point tensor, got {}",
            cx.op, x.dtype
        ));
    }
    if cx.opt("dtype").is_some() {
        return Err(format!("{}: `dtype=` is not read", cx.op));
    }
    norm_order(cx.op, cx.opt(order))?;
    let dims = norm_dims(cx.op, cx.opt("dim"), x.shape.len())?;
    let keepdim = matches!(cx.opt("keepdim"), Some(Arg::Bool(true)));
    let shape: Vec<usize> = (0..x.shape.len())
        .filter_map(|d| match (dims.contains(&d), keepdim) {
            (false, _) => Some(x.shape[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    one(TensorType::new(shape, x.dtype, x.device))
}

/// Thunder's automatically registered spellings of ops the table knows under another name,
/// read as that op (`torch.swapaxes` is `transpose`): the canonical name of each, and its
/// target. Their operands are the target's, by position (keywords by the target's names).
pub const ALIASES: &[(&str, &str)] = &[
    ("ltorch.swapaxes", "ltorch.transpose"),
    ("ltorch.moveaxis", "ltorch.movedim"),
    ("ltorch.multiply", "ltorch.mul"),
    ("ltorch.subtract", "ltorch.sub"),
    ("ltorch.divide", "ltorch.div"),
    ("ltorch.negative", "ltorch.neg"),
    ("ltorch.absolute", "ltorch.abs"),
    ("ltorch.clip", "ltorch.clamp"),
    ("ltorch.fix", "ltorch.trunc"),
    ("ltorch.greater", "ltorch.gt"),
    ("ltorch.greater_equal", "ltorch.ge"),
    ("ltorch.less", "ltorch.lt"),
    ("ltorch.less_equal", "ltorch.le"),
    ("ltorch.not_equal", "ltorch.ne"),
];

/// An alias's meta: its target's, on the same operands.
fn alias(cx: &MetaCx) -> R {
    let target = ALIASES
        .iter()
        .find(|(a, _)| *a == cx.op)
        .map(|(_, t)| *t)
        .ok_or_else(|| format!("{} is no alias", cx.op))?;
    crate::registry::OpRegistry::builtin().infer(cx.trace, target, cx.args, cx.kwargs)
}

/// `ravel(a)`: `a` flattened.
fn ravel(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    one(TensorType::new([a.numel()], a.dtype, a.device))
}

/// `narrow`'s dimension, start (a negative one counts from the end) and length on a tensor
/// of `shape`, checked to fit.
pub(crate) fn narrow_range(
    op: &str,
    shape: &[usize],
    dim: i64,
    start: i64,
    len: i64,
) -> Result<(usize, usize, usize), String> {
    let d = crate::meta::norm_dim(dim, shape.len(), op)?;
    let size = *shape
        .get(d)
        .ok_or_else(|| format!("{op}: a 0-d tensor has nothing to narrow"))? as i64;
    let start = if start < 0 { start + size } else { start };
    if start < 0 || len < 0 || start + len > size {
        return Err(format!(
            "{op}: start {start} and length {len} do not fit dim {d} of size {size}"
        ));
    }
    Ok((d, start as usize, len as usize))
}

/// `narrow(a, dim, start, length)`: `length` elements of `dim` from `start`.
fn narrow(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let (start, len) = (cx.int_param("start")?, cx.int_param("length")?);
    let (d, _, len) = narrow_range(cx.op, &a.shape, cx.int_param("dim")?, start, len)?;
    let mut shape = a.shape.to_vec();
    shape[d] = len;
    one(TensorType::new(shape, a.dtype, a.device))
}

/// `tile`'s input shape and repeats, both padded with leading 1s to one rank; negative
/// repeats are an error.
pub(crate) fn tile_shapes(
    op: &str,
    shape: &[usize],
    reps: &[i64],
) -> Result<(Vec<usize>, Vec<usize>), String> {
    let reps = reps
        .iter()
        .map(|&r| usize::try_from(r).map_err(|_| format!("{op}: negative repeats {reps:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let rank = shape.len().max(reps.len());
    let pad = |v: &[usize]| {
        let mut p = vec![1; rank - v.len()];
        p.extend_from_slice(v);
        p
    };
    Ok((pad(shape), pad(&reps)))
}

/// `tile(a, dims)`: `a` repeated `dims` times along each dimension (`dims` padded with
/// leading 1s to `a`'s rank, or `a`'s shape with leading 1s to `dims`' length).
fn tile(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let (shape, reps) = tile_shapes(cx.op, &a.shape, &cx.ints_param("dims")?)?;
    let tiled: Vec<usize> = shape.iter().zip(&reps).map(|(s, r)| s * r).collect();
    one(TensorType::new(tiled, a.dtype, a.device))
}

#[rustfmt::skip]
const OPS: &[OpSpec] = &[
    op("ltorch.mm", &["torch.mm", "Tensor.mm"], Pure, "input, mat2, /", First, mm),
    op("ltorch.addmm", &["torch.addmm", "Tensor.addmm"], Pure, "input, mat1, mat2, /, *, beta=1, alpha=1", First, addmm),
    op("ltorch.diff", &["torch.diff", "Tensor.diff"], Pure, "input, n=1, dim=-1, prepend=None, append=None", First, diff),
    op("ltorch.new_ones", &["Tensor.new_ones"], Pure, "a, /, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False", Meta, new_filled),
    op("ltorch.new_zeros", &["Tensor.new_zeros"], Pure, "a, /, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False", Meta, new_filled),
    op("ltorch.new_empty", &["Tensor.new_empty"], Pure, "a, /, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False", Meta, new_filled),
    op("ltorch.new_full", &["Tensor.new_full"], Pure, "a, /, size, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False", Meta, new_filled),
    op("ltorch.reshape_as", &["Tensor.reshape_as"], Pure, "a, other, /", First, reshape_as),
    op("ltorch.vector_norm", &["torch.linalg.vector_norm"], Pure, "x, ord=2, dim=None, keepdim=False, *, dtype=None", First, vector_norm),
    op("ltorch.norm", &["torch.norm", "Tensor.norm"], Pure, "input, p=None, dim=None, keepdim=False, dtype=None", First, norm),
    op("ltorch.swapaxes", &["torch.swapaxes", "Tensor.swapaxes", "torch.swapdims", "Tensor.swapdims"], Pure, "a, /, dim0, dim1", Meta, alias),
    op("ltorch.moveaxis", &["torch.moveaxis", "Tensor.moveaxis"], Pure, "a, /, source, destination", Meta, alias),
    op("ltorch.multiply", &["torch.multiply", "Tensor.multiply"], Pure, "a, b, /", Meta, alias),
    op("ltorch.subtract", &["torch.subtract", "Tensor.subtract"], Pure, "a, b, /, *, alpha=None", Meta, alias),
    op("ltorch.divide", &["torch.divide", "Tensor.divide"], Pure, "a, b, /, *, rounding_mode=None", Meta, alias),
    op("ltorch.negative", &["torch.negative", "Tensor.negative"], Pure, "a, /", Meta, alias),
    op("ltorch.absolute", &["torch.absolute", "Tensor.absolute"], Pure, "a, /", Meta, alias),
    op("ltorch.clip", &["Tensor.clip"], Pure, "a, /, min=None, max=None", Meta, alias),
    op("ltorch.fix", &["torch.fix", "Tensor.fix"], Pure, "a, /", Meta, alias),
    op("ltorch.greater", &["torch.greater", "Tensor.greater"], Pure, "a, b, /", Meta, alias),
    op("ltorch.greater_equal", &["torch.greater_equal", "Tensor.greater_equal"], Pure, "a, b, /", Meta, alias),
    op("ltorch.less", &["torch.less", "Tensor.less"], Pure, "a, b, /", Meta, alias),
    op("ltorch.less_equal", &["torch.less_equal", "Tensor.less_equal"], Pure, "a, b, /", Meta, alias),
    op("ltorch.not_equal", &["torch.not_equal", "Tensor.not_equal"], Pure, "a, b, /", Meta, alias),
    op("ltorch.ravel", &["torch.ravel", "Tensor.ravel"], Pure, "a, /", First, ravel),
    op("ltorch.narrow", &["torch.narrow", "Tensor.narrow"], Pure, "a, /, dim, start, length", First, narrow),
    op("ltorch.tile", &["torch.tile", "Tensor.tile"], Pure, "a, /, *dims", First, tile),
    op("ltorch.tensor", &["torch.tensor"], Pure, "data, *, dtype=None, device=None, requires_grad=False, pin_memory=False", Meta, tensor),
    op("prims.tensor_from_sequence", &[], Pure, "data, *, dtype=None, device=None", Meta, tensor),
];

pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
