//! Ops Thunder's OpInfo suite (`testdata/opinfo/`) prints that the model corpus never showed:
//! special functions, the aten backward kernels Thunder calls directly, and their spellings.

use super::op;
use crate::meta::{ew, many};
use crate::registry::DTypeRule::{First, Meta, Operand, PromoteToFloat};
use crate::registry::Effect::{Pure, Random};
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, Device, TensorType, Type};

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
        &[
            "prims.erfcinv",
            "torch_erfcinv_impl",
            "torch.special.erfcinv",
        ],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.ndtri",
        &["prims.ndtri", "torch.special.ndtri"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.frexp",
        &["prims.frexp", "torch.frexp"],
        Pure,
        "a, /",
        Meta,
        frexp,
    ),
    op(
        "ltorch.log_sigmoid_backward",
        &["torch.ops.aten.log_sigmoid_backward"],
        Pure,
        "grad_output, a, buffer, /",
        First,
        grad_self,
    ),
];

pub(crate) const PARTS: &[&[OpSpec]] = &[SPECIAL, INDEXING, MORE, TENSOR_METHODS];

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
pub(super) fn like_a(cx: &MetaCx) -> R {
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
        &["prims.index_put", "torch.index_put", "Tensor.index_put"],
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
        &["prims.zeta", "torch.special.zeta"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
];

/// `item(a)`: the one element of `a` as a Python number, known only at run time.
fn item(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    if t.numel() != 1 {
        return Err(format!(
            "{}: a tensor of {:?} has no single element",
            cx.op, t.shape
        ));
    }
    // Thunder 0.2.6 types a bool tensor's item as `int` (Python's bool is an int)
    let ty = match t.dtype {
        d if d.is_float() => Type::Float(None),
        _ => Type::Int(None),
    };
    Ok(MetaOut::Types(vec![ty]))
}

/// `unfold(a, dimension, size, step)`: the windows of `size` elements every `step` along
/// `dimension` (`(n - size) / step + 1` of them) in a new last dimension; a 0-d `a` counts
/// as one element.
fn unfold(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let d = crate::meta::norm_dim(cx.int_param("dimension")?, t.shape.len(), cx.op)?;
    let (size, step) = (cx.int_param("size")?, cx.int_param("step")?);
    let n = t.shape.get(d).copied().unwrap_or(1) as i64;
    if size < 0 || size > n || step <= 0 {
        return Err(format!(
            "{}: windows of {size} every {step} do not fit dimension {d} of {:?}",
            cx.op, t.shape
        ));
    }
    let mut shape = t.shape.to_vec();
    if let Some(s) = shape.get_mut(d) {
        *s = ((n - size) / step + 1) as usize;
    }
    shape.push(size as usize);
    crate::meta::one(TensorType::new(shape, t.dtype, t.device))
}

/// `randint(low=0, high, size, *, dtype=int64)`: integers drawn from `[low, high)`; with two
/// positional operands they are `high` and `size`.
fn randint(cx: &MetaCx) -> R {
    let size = match cx.opt("size") {
        Some(_) => "size",
        None => "high",
    };
    let shape = cx
        .ints_param(size)?
        .iter()
        .map(|d| usize::try_from(*d).map_err(|_| format!("{}: negative size {d}", cx.op)))
        .collect::<Result<Vec<_>, _>>()?;
    let dtype = cx.dtype_param("dtype").unwrap_or(DType::I64);
    let device = cx.device_param("device")?.unwrap_or(Device::CPU);
    crate::meta::one(TensorType::new(shape, dtype, device))
}

const TENSOR_METHODS: &[OpSpec] = &[
    op(
        "ltorch.item",
        &["prims.item", "Tensor.item", "torch.Tensor.item"],
        Pure,
        "a, /",
        Meta,
        item,
    ),
    op(
        "ltorch.unfold",
        &["prims.unfold", "Tensor.unfold", "torch.Tensor.unfold"],
        Pure,
        "a, dimension, size, step, /",
        First,
        unfold,
    ),
    op(
        "ltorch.randint",
        &["prims.randint", "torch.randint"],
        Random,
        "low, high, size=None, /, *, generator=None, out=None, dtype=None, layout=None, \
         device=None, requires_grad=False",
        Operand,
        randint,
    ),
];
