//! Ops that make tensors from numbers: ranges, fills, random draws.

use super::op;
use crate::arg::Arg;
use crate::meta::one;
use crate::registry::DTypeRule::Operand;
use crate::registry::Effect::{Pure, Random};
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, Device, TensorType, Type};

type R = Result<MetaOut, String>;

/// The dtype a Python number gives a new tensor (PyTorch's defaults).
fn number_dtype(cx: &MetaCx, a: &Arg) -> Result<DType, String> {
    Ok(match cx.type_of(a)? {
        Type::Bool(_) => DType::Bool,
        Type::Int(_) => DType::I64,
        Type::Float(_) => DType::F32,
        Type::Tensor(t) if t.shape.is_empty() => t.dtype,
        other => return Err(format!("{}: expected a number, got {other}", cx.op)),
    })
}

pub(super) fn device(cx: &MetaCx) -> Result<Device, String> {
    Ok(cx.device_param("device")?.unwrap_or(Device::CPU))
}

fn shape(cx: &MetaCx, name: &str) -> Result<Vec<usize>, String> {
    let v = cx.ints_param(name)?;
    v.iter()
        .map(|d| usize::try_from(*d).map_err(|_| format!("{}: negative size {d}", cx.op)))
        .collect()
}

/// `arange(start, end=None, step=1)`: `ceil((end - start) / step)` elements; integers give
/// i64, any float the default float.
fn arange(cx: &MetaCx) -> R {
    let start = cx
        .f64_param("start")
        .ok_or_else(|| format!("{}: `start` must be a known number", cx.op))?;
    let (start, end) = match cx.opt("end") {
        None => (0.0, start),
        Some(_) => (
            start,
            cx.f64_param("end")
                .ok_or_else(|| format!("{}: `end` must be a known number", cx.op))?,
        ),
    };
    let step = cx.f64_param("step").unwrap_or(1.0);
    if step == 0.0 || ((end - start) / step) < 0.0 {
        return Err(format!(
            "{}: range {start}..{end} with step {step} is empty or backwards",
            cx.op
        ));
    }
    let n = ((end - start) / step).ceil() as usize;
    let any_float = ["start", "end", "step"]
        .iter()
        .filter_map(|p| cx.opt(p))
        .any(|a| matches!(cx.type_of(a), Ok(Type::Float(_))));
    let dtype = cx
        .dtype_param("dtype")
        .unwrap_or(if any_float { DType::F32 } else { DType::I64 });
    one(TensorType::new([n], dtype, device(cx)?))
}

/// `full(shape, fill_value)`: the fill value's dtype unless `dtype=` is given.
fn full(cx: &MetaCx) -> R {
    let dtype = match cx.dtype_param("dtype") {
        Some(d) => d,
        None => number_dtype(cx, cx.param("fill_value")?)?,
    };
    one(TensorType::new(shape(cx, "shape")?, dtype, device(cx)?))
}

/// `zeros(*size)`, `ones`, `empty`, `rand`, `randn`: default float unless `dtype=`.
fn filled(cx: &MetaCx) -> R {
    let dtype = cx.dtype_param("dtype").unwrap_or(DType::F32);
    one(TensorType::new(shape(cx, "size")?, dtype, device(cx)?))
}

/// `zeros_like(a)`, `full_like(a, v)`: `a`'s shape, dtype and device unless given.
fn like(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let dtype = cx.dtype_param("dtype").unwrap_or(a.dtype);
    let device = cx.device_param("device")?.unwrap_or(a.device);
    one(TensorType::new(&a.shape[..], dtype, device))
}

/// Thunder's `uniform(shape, minval, maxval, *, device, dtype)`.
fn uniform(cx: &MetaCx) -> R {
    let dtype = cx
        .dtype_param("dtype")
        .ok_or_else(|| format!("{}: needs `dtype`", cx.op))?;
    if !dtype.is_float() {
        return Err(format!("{}: {dtype} is not a floating dtype", cx.op));
    }
    one(TensorType::new(shape(cx, "shape")?, dtype, device(cx)?))
}

const OPS: &[OpSpec] = &[
    op(
        "ltorch.arange",
        &["torch.arange"],
        Pure,
        "start, end=None, step=1, *, device=None, dtype=None",
        Operand,
        arange,
    ),
    op(
        "ltorch.full",
        &["torch.full"],
        Pure,
        "shape, fill_value, *, device=None, dtype=None",
        Operand,
        full,
    ),
    op(
        "prims.full",
        &[],
        Pure,
        "shape, fill_value, *, device, dtype",
        Operand,
        full,
    ),
    op(
        "ltorch.full_like",
        &["torch.full_like"],
        Pure,
        "a, fill_value, *, device=None, dtype=None",
        Operand,
        like,
    ),
    op(
        "ltorch.zeros",
        &["torch.zeros"],
        Pure,
        "*size, device=None, dtype=None",
        Operand,
        filled,
    ),
    op(
        "ltorch.ones",
        &["torch.ones"],
        Pure,
        "*size, device=None, dtype=None",
        Operand,
        filled,
    ),
    op(
        "ltorch.empty",
        &["prims.empty", "torch.empty"],
        Pure,
        "*size, device=None, dtype=None",
        Operand,
        filled,
    ),
    op(
        "ltorch.zeros_like",
        &["torch.zeros_like"],
        Pure,
        "a, /, *, device=None, dtype=None",
        Operand,
        like,
    ),
    op(
        "ltorch.ones_like",
        &["torch.ones_like"],
        Pure,
        "a, /, *, device=None, dtype=None",
        Operand,
        like,
    ),
    op(
        "prims.uniform",
        &["uniform"],
        Random,
        "shape, minval=0.0, maxval=1.0, *, device, dtype",
        Operand,
        uniform,
    ),
    op(
        "ltorch.rand",
        &["torch.rand"],
        Random,
        "*size, device=None, dtype=None",
        Operand,
        filled,
    ),
    op(
        "ltorch.randn",
        &["prims.randn", "torch.randn"],
        Random,
        "*size, device=None, dtype=None",
        Operand,
        filled,
    ),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
