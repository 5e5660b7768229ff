//! Reductions and ops along a dimension: sum, mean, var_mean, argmax, softmax, cumsum, topk,
//! sort and argsort.

use super::op;
use crate::arg::Arg;
use crate::meta::{dim_of, many, one};
use crate::registry::DTypeRule::{Meta, Promote};
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, TensorType, Type};

type R = Result<MetaOut, String>;

/// The reduced shape of `t` over the operand `dims_param` (`None`: every dimension).
fn reduced(
    cx: &MetaCx,
    t: &TensorType,
    dims_param: &str,
    keepdim: bool,
) -> Result<Vec<usize>, String> {
    let rank = t.shape.len();
    let dims: Vec<usize> = match cx.opt(dims_param) {
        None => (0..rank).collect(),
        Some(Arg::Tuple(v) | Arg::List(v)) if v.is_empty() => (0..rank).collect(),
        Some(_) => cx
            .ints_param(dims_param)?
            .into_iter()
            .map(|d| dim_of(cx, d, rank))
            .collect::<Result<_, _>>()?,
    };
    Ok(t.shape
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            if dims.contains(&i) {
                keepdim.then_some(1)
            } else {
                Some(*s)
            }
        })
        .collect())
}

fn keepdim(cx: &MetaCx) -> bool {
    matches!(cx.opt("keepdim"), Some(Arg::Bool(true)))
}

/// `sum`/`prod`: integers and booleans accumulate in i64 unless `dtype=` says otherwise.
fn sum(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dim", keepdim(cx))?;
    let dtype = cx.dtype_param("dtype").unwrap_or(if t.dtype.is_float() {
        t.dtype
    } else {
        DType::I64
    });
    one(TensorType::new(shape, dtype, t.device))
}

/// `mean`: floating inputs only (as PyTorch), `dtype=` may change the result's type.
fn mean(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let dtype = cx.dtype_param("dtype").unwrap_or(t.dtype);
    if !dtype.is_float() {
        return Err(format!("{}: mean of {dtype} needs a floating dtype", cx.op));
    }
    let shape = reduced(cx, &t, "dim", keepdim(cx))?;
    one(TensorType::new(shape, dtype, t.device))
}

/// `amax`/`amin`: the input's dtype.
fn extremum(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dim", keepdim(cx))?;
    one(t.with_shape(shape))
}

/// `torch.min`, which Thunder registers automatically and so prints as called: `min(input)`
/// the smallest element, `min(input, other)` the elementwise minimum (broadcast, promoted),
/// `min(input, dim, keepdim=False)` values and i64 indices.
fn torch_min(cx: &MetaCx) -> R {
    let t = cx.tensor_param("input")?;
    match cx.opt("other") {
        None => one(t.with_shape(Vec::new())),
        Some(Arg::Value(v)) if matches!(cx.trace.ty(*v), Some(Type::Tensor(_))) => {
            crate::meta::ew(cx, &["input", "other"], &[])
        }
        Some(_) => {
            let rank = t.shape.len();
            let d = dim_of(cx, cx.int_param("other")?, rank.max(1))?;
            let mut shape = t.shape.clone();
            if rank > 0 {
                if keepdim(cx) {
                    shape[d] = 1;
                } else {
                    shape.remove(d);
                }
            }
            let indices = TensorType::new(shape.clone(), DType::I64, t.device);
            Ok(MetaOut::Types(vec![
                Type::Tensor(t.with_shape(shape)),
                Type::Tensor(indices),
            ]))
        }
    }
}

fn float_of(t: &TensorType) -> DType {
    if t.dtype.is_float() {
        t.dtype
    } else {
        DType::F32
    }
}

/// `var`/`std`.
fn var(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dim", keepdim(cx))?;
    one(TensorType::new(shape, float_of(&t), t.device))
}

/// `var_mean` / `std_mean`: (variance, mean).
fn var_mean(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dim", keepdim(cx))?;
    let out = TensorType::new(shape, float_of(&t), t.device);
    many(vec![out.clone(), out])
}

/// `prims.sum(a, dims)` and friends: explicit dims, no keepdim.
fn prims_reduce(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dims", false)?;
    let dtype = cx.dtype_param("output_dtype").unwrap_or(t.dtype);
    one(TensorType::new(shape, dtype, t.device))
}

fn prims_var_mean(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dims", false)?;
    let out = TensorType::new(shape, float_of(&t), t.device);
    many(vec![out.clone(), out])
}

/// `argmax`/`argmin`: i64 indices; no dim reduces everything (to size 1 in every dimension
/// with `keepdim=True`, as torch 2.9 gives `argmax(x, keepdim=True).shape == (1, 1)` for a
/// 2-d `x`).
fn arg_extremum(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dim", keepdim(cx))?;
    one(TensorType::new(shape, DType::I64, t.device))
}

/// `softmax`/`log_softmax`: same shape, `dtype=` if given.
fn softmax(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    dim_of(cx, cx.int_param("dim")?, t.shape.len())?;
    let dtype = cx.dtype_param("dtype").unwrap_or(t.dtype);
    one(TensorType::new(&t.shape[..], dtype, t.device))
}

fn logsumexp(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let shape = reduced(cx, &t, "dim", keepdim(cx))?;
    one(TensorType::new(shape, float_of(&t), t.device))
}

/// `cumsum`: same shape; integers accumulate in i64.
fn cumsum(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    dim_of(cx, cx.int_param("dim")?, t.shape.len())?;
    let dtype = cx.dtype_param("dtype").unwrap_or(if t.dtype.is_float() {
        t.dtype
    } else {
        DType::I64
    });
    one(TensorType::new(&t.shape[..], dtype, t.device))
}

/// The dimension a sort or top-k runs along: `dim`, or the last one when it is absent or
/// `None` (Thunder's `sort`, `argsort` and `topk` take `None` for the last dimension).
fn sort_dim(cx: &MetaCx, t: &TensorType) -> Result<usize, String> {
    match cx.opt("dim") {
        None => Ok(t.shape.len().saturating_sub(1)),
        Some(_) => dim_of(cx, cx.int_param("dim")?, t.shape.len()),
    }
}

/// `topk(a, k, dim=None, largest=True, sorted=True)`: (values, i64 indices) with `k` along
/// `dim`; `0 <= k <= a.shape[dim]` (1 for a 0-d `a`), as PyTorch checks.
fn topk(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let d = sort_dim(cx, &t)?;
    let k = cx.int_param("k")?;
    let n = t.shape.get(d).copied().unwrap_or(1);
    if k < 0 || k as u64 > n as u64 {
        return Err(format!(
            "{}: k = {k} is out of range for dimension {d} of {:?} (0..={n})",
            cx.op, t.shape
        ));
    }
    let mut shape = t.shape.to_vec();
    if let Some(s) = shape.get_mut(d) {
        *s = k as usize;
    }
    many(vec![
        t.with_shape(&shape),
        TensorType::new(shape, DType::I64, t.device),
    ])
}

/// `sort(a, dim=None, descending=False, stable=False)`: (values, i64 indices).
fn sort(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    sort_dim(cx, &t)?;
    many(vec![
        t.clone(),
        TensorType::new(&t.shape[..], DType::I64, t.device),
    ])
}

/// `argsort(a, dim=-1, descending=False, stable=False)`: i64 indices shaped like `a`.
fn argsort(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    sort_dim(cx, &t)?;
    one(TensorType::new(&t.shape[..], DType::I64, t.device))
}

const OPS: &[OpSpec] = &[
    op(
        "ltorch.sum",
        &["torch.sum", "Tensor.sum"],
        Pure,
        "a, /, dim=None, keepdim=False, *, dtype=None",
        Meta,
        sum,
    ),
    op(
        "ltorch.prod",
        &["prims.prod", "torch.prod", "torch._refs.prod"],
        Pure,
        "a, /, dim=None, keepdim=False, *, dtype=None",
        Meta,
        sum,
    ),
    op(
        "ltorch.mean",
        &["torch.mean", "Tensor.mean"],
        Pure,
        "a, /, dim=None, keepdim=False, *, dtype=None",
        Meta,
        mean,
    ),
    op(
        "ltorch.amax",
        &["torch.amax"],
        Pure,
        "a, /, dim=None, keepdim=False",
        Meta,
        extremum,
    ),
    op(
        "ltorch.min",
        &["torch.min"],
        Pure,
        "input, other=None, keepdim=False",
        Promote,
        torch_min,
    ),
    op(
        "ltorch.amin",
        &["torch.amin"],
        Pure,
        "a, /, dim=None, keepdim=False",
        Meta,
        extremum,
    ),
    op(
        "ltorch.var",
        &["prims.var", "torch.var"],
        Pure,
        "a, /, dim=None, *, keepdim=False, correction=1",
        Meta,
        var,
    ),
    op(
        "ltorch.std",
        &["prims.std", "torch.std"],
        Pure,
        "a, /, dim=None, *, keepdim=False, correction=1",
        Meta,
        var,
    ),
    op(
        "ltorch.var_mean",
        &["torch.var_mean"],
        Pure,
        "a, /, dim=None, *, keepdim=False, correction=1",
        Meta,
        var_mean,
    ),
    op(
        "ltorch.argmax",
        &["prims.argmax", "torch.argmax"],
        Pure,
        "a, /, dim=None, keepdim=False",
        Meta,
        arg_extremum,
    ),
    op(
        "ltorch.argmin",
        &["prims.argmin", "torch.argmin"],
        Pure,
        "a, /, dim=None, keepdim=False",
        Meta,
        arg_extremum,
    ),
    op(
        "ltorch.softmax",
        &[
            "torch.softmax",
            "torch.nn.functional.softmax",
            "torch._softmax",
        ],
        Pure,
        "a, dim, dtype=None",
        Meta,
        softmax,
    ),
    op(
        "ltorch.log_softmax",
        &["torch.log_softmax", "torch.nn.functional.log_softmax"],
        Pure,
        "a, dim, dtype=None",
        Meta,
        softmax,
    ),
    op(
        "ltorch.logsumexp",
        &["torch.logsumexp"],
        Pure,
        "a, /, dim, keepdim=False",
        Meta,
        logsumexp,
    ),
    op(
        "ltorch.cumsum",
        &["torch.cumsum"],
        Pure,
        "a, dim, *, dtype=None",
        Meta,
        cumsum,
    ),
    op(
        "ltorch.topk",
        &["prims.topk", "torch.topk"],
        Pure,
        "a, /, k, dim=None, largest=True, sorted=True",
        Meta,
        topk,
    ),
    op(
        "ltorch.sort",
        &["prims.sort", "torch.sort"],
        Pure,
        "a, /, dim=None, descending=False, stable=False",
        Meta,
        sort,
    ),
    op(
        "ltorch.argsort",
        &["torch.argsort"],
        Pure,
        "a, /, dim=-1, descending=False, stable=False",
        Meta,
        argsort,
    ),
    op(
        "prims.sum",
        &[],
        Pure,
        "a, /, dims, *, output_dtype=None",
        Meta,
        prims_reduce,
    ),
    op("prims.amax", &[], Pure, "a, /, dims", Meta, prims_reduce),
    op("prims.amin", &[], Pure, "a, /, dims", Meta, prims_reduce),
    op(
        "prims.var_mean",
        &[],
        Pure,
        "a, /, dims, *, correction",
        Meta,
        prims_var_mean,
    ),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
