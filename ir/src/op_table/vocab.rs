//! Ops Thunder's OpInfo suite (`testdata/opinfo/`) prints that the model corpus never showed:
//! special functions, the aten backward kernels Thunder calls directly, and their spellings.

use super::op;
use crate::meta::{ew, many};
use crate::registry::DTypeRule::{First, Meta, PromoteToFloat};
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, TensorType};

type R = Result<MetaOut, String>;

fn a(cx: &MetaCx) -> R {
    ew(cx, &["a"], &[])
}

/// `log_sigmoid_backward(grad_output, self, buffer)`: shaped like `self`.
fn grad_self(cx: &MetaCx) -> R {
    ew(cx, &["grad_output", "a"], &["buffer"])
}

/// `frexp(a)`: the mantissa in `a`'s dtype and the exponent as int32.
fn frexp(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let exponent = TensorType::new(&t.shape, DType::I32, t.device);
    many(vec![t, exponent])
}

const SPECIAL: &[OpSpec] = &[
    op(
        "ltorch.polygamma",
        &[
            "torch.special.polygamma",
            "torch.polygamma",
            "Tensor.polygamma",
        ],
        Pure,
        "n, a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.erfcinv",
        &["torch_erfcinv_impl", "torch.special.erfcinv"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.ndtri",
        &["torch.special.ndtri"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op("ltorch.frexp", &["torch.frexp"], Pure, "a, /", Meta, frexp),
    op(
        "ltorch.log_sigmoid_backward",
        &["torch.ops.aten.log_sigmoid_backward"],
        Pure,
        "grad_output, a, buffer, /",
        First,
        grad_self,
    ),
];

pub(crate) const PARTS: &[&[OpSpec]] = &[SPECIAL, INDEXING, MORE];

/// `bitcast(a, dtype)`: the same bits read as `dtype`, of the same width.
fn bitcast(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let to = cx
        .dtype_param("dtype")
        .ok_or_else(|| format!("{}: `dtype` must be a dtype", cx.op))?;
    if to.size_bytes() != t.dtype.size_bytes() {
        return Err(format!(
            "{}: {} and {to} differ in width; a bitcast keeps the shape",
            cx.op, t.dtype
        ));
    }
    crate::meta::one(TensorType::new(&t.shape, to, t.device))
}

/// `index_copy(a, dim, index, source)` and `index_put(a, indices, values, accumulate)`:
/// shaped and typed like `a`.
fn like_a(cx: &MetaCx) -> R {
    crate::meta::one(cx.tensor_param("a")?)
}

const INDEXING: &[OpSpec] = &[
    op(
        "prims.bitcast",
        &["bitcast"],
        Pure,
        "a, dtype, /",
        Meta,
        bitcast,
    ),
    op(
        "ltorch.index_copy",
        &["torch.index_copy", "Tensor.index_copy"],
        Pure,
        "a, dim, index, source, /",
        First,
        like_a,
    ),
    op(
        "ltorch.scatter",
        &["torch.scatter", "Tensor.scatter"],
        Pure,
        "a, dim, index, src, /, *, reduce=None",
        First,
        like_a,
    ),
    op(
        "ltorch.index_put",
        &["torch.index_put", "Tensor.index_put"],
        Pure,
        "a, indices, values, accumulate=False, /",
        First,
        like_a,
    ),
];

/// `any(a, dim=None, keepdim=False)`: whether any element is nonzero, over `dim` (all
/// dimensions when `None`), as a bool tensor.
fn any(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let rank = t.shape.len();
    let dims: Vec<usize> = match cx.opt("dim") {
        None | Some(crate::Arg::None) => (0..rank).collect(),
        Some(_) => cx
            .ints_param("dim")
            .or_else(|_| cx.int_param("dim").map(|d| vec![d]))?
            .into_iter()
            .map(|d| crate::meta::norm_dim(d, rank.max(1), cx.op))
            .collect::<Result<_, _>>()?,
    };
    let keep = matches!(cx.opt("keepdim"), Some(crate::Arg::Bool(true)));
    let shape: Vec<usize> = t
        .shape
        .iter()
        .enumerate()
        .filter_map(|(i, &s)| match (dims.contains(&i), keep) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    crate::meta::one(TensorType::new(shape, DType::Bool, t.device))
}

fn ab(cx: &MetaCx) -> R {
    ew(cx, &["a", "b"], &[])
}

const MORE: &[OpSpec] = &[
    op(
        "ltorch.any",
        &["torch.any", "Tensor.any"],
        Pure,
        "a, /, dim=None, keepdim=False",
        Meta,
        any,
    ),
    op(
        "ltorch.zeta",
        &["torch.special.zeta"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
];
