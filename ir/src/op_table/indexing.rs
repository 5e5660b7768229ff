//! Indexing along a dimension: `gather` and its backward `scatter_add`, `index_select` and its
//! backward `index_add`. Signatures and names are Thunder 0.2.6's (`thunder/torch/__init__.py`;
//! the torch executor prints them as `torch.gather(a, dim, index)`,
//! `torch.scatter_add(a, dim, index, src)`, ...); the checks are PyTorch 2.9's, so a trace
//! PyTorch would refuse is refused here, with the operand named.

use super::op;
use crate::meta::{dim_of, one};
use crate::registry::DTypeRule::First;
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, TensorType};

type R = Result<MetaOut, String>;

/// An index tensor: i64 or i32 (PyTorch refuses other dtypes), on `a`'s device.
fn index_param(cx: &MetaCx, name: &str, a: &TensorType) -> Result<TensorType, String> {
    let idx = cx.tensor_param(name)?;
    if !matches!(idx.dtype, DType::I64 | DType::I32) {
        return Err(format!(
            "{}: `{name}` must be an i64 or i32 tensor, got {}",
            cx.op, idx.dtype
        ));
    }
    if idx.device != a.device {
        return Err(format!(
            "{}: `{name}` is on {}, the input on {}",
            cx.op, idx.device, a.device
        ));
    }
    Ok(idx)
}

/// A tensor operand that must have `a`'s dtype and device (the values `scatter_add` and
/// `index_add` add: PyTorch does not promote them).
fn values_param(cx: &MetaCx, name: &str, a: &TensorType) -> Result<TensorType, String> {
    let v = cx.tensor_param(name)?;
    if v.dtype != a.dtype || v.device != a.device {
        return Err(format!(
            "{}: `{name}` is {} {}, the input {} {}; they must agree",
            cx.op, v.device, v.dtype, a.device, a.dtype
        ));
    }
    Ok(v)
}

/// `index` has `a`'s rank and is no larger than `a` in every dimension but `dim` (PyTorch's
/// rule for `gather` and `scatter_add`).
fn fits_outside_dim(
    cx: &MetaCx,
    idx: &TensorType,
    a: &TensorType,
    a_name: &str,
    dim: usize,
) -> Result<(), String> {
    if idx.shape.len() != a.shape.len() {
        return Err(format!(
            "{}: index {:?} (rank {}) must have the rank of {a_name} {:?} (rank {})",
            cx.op,
            idx.shape,
            idx.shape.len(),
            a.shape,
            a.shape.len()
        ));
    }
    for (d, (i, n)) in idx.shape.iter().zip(a.shape.iter()).enumerate() {
        if d != dim && i > n {
            return Err(format!(
                "{}: index {:?} is larger than {a_name} {:?} in dimension {d}",
                cx.op, idx.shape, a.shape
            ));
        }
    }
    Ok(())
}

/// A vector of indices: 1-d, or 0-d (one index).
fn index_vector(cx: &MetaCx, idx: &TensorType) -> Result<usize, String> {
    match idx.shape.len() {
        0 => Ok(1),
        1 => Ok(idx.shape[0]),
        r => Err(format!(
            "{}: index must be a vector (0-d or 1-d), got rank {r} {:?}",
            cx.op, idx.shape
        )),
    }
}

/// `gather(input, dim, index)`: shaped like `index`, `input`'s dtype.
pub(super) fn gather(cx: &MetaCx) -> R {
    let a = cx.tensor_param("input")?;
    let idx = index_param(cx, "index", &a)?;
    let dim = dim_of(cx, cx.int_param("dim")?, a.shape.len())?;
    fits_outside_dim(cx, &idx, &a, "input", dim)?;
    one(TensorType::new(&idx.shape[..], a.dtype, a.device))
}

/// `scatter_add(a, dim, index, src)`: `a`'s type; `index` no larger than `src` anywhere and
/// than `a` outside `dim`.
pub(super) fn scatter_add(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let idx = index_param(cx, "index", &a)?;
    let src = values_param(cx, "src", &a)?;
    let dim = dim_of(cx, cx.int_param("dim")?, a.shape.len())?;
    fits_outside_dim(cx, &idx, &a, "a", dim)?;
    if src.shape.len() != idx.shape.len()
        || idx.shape.iter().zip(src.shape.iter()).any(|(i, s)| i > s)
    {
        return Err(format!(
            "{}: index {:?} must have src's rank and be no larger than src {:?}",
            cx.op, idx.shape, src.shape
        ));
    }
    one(a)
}

/// `index_select(a, dim, index)`: `a` with `dim` resized to the number of indices (a 0-d `a`
/// stays 0-d).
pub(super) fn index_select(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let idx = index_param(cx, "index", &a)?;
    let dim = dim_of(cx, cx.int_param("dim")?, a.shape.len())?;
    let n = index_vector(cx, &idx)?;
    if a.shape.is_empty() {
        if n != 1 {
            return Err(format!("{}: a 0-d input takes one index, got {n}", cx.op));
        }
        return one(a);
    }
    let mut shape = a.shape.to_vec();
    shape[dim] = n;
    one(a.with_shape(shape))
}

/// `index_add(a, dim, index, source)`: `a`'s type; `source` is `a` with `dim` resized to the
/// number of indices.
pub(super) fn index_add(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let idx = index_param(cx, "index", &a)?;
    let source = values_param(cx, "source", &a)?;
    let dim = dim_of(cx, cx.int_param("dim")?, a.shape.len())?;
    let n = index_vector(cx, &idx)?;
    let mut want = a.shape.to_vec();
    if let Some(s) = want.get_mut(dim) {
        *s = n;
    } else if n != 1 {
        return Err(format!("{}: a 0-d input takes one index, got {n}", cx.op));
    }
    if source.shape[..] != want[..] {
        return Err(format!(
            "{}: source {:?} must be a {:?} with dimension {dim} of size {n} (the number of \
             indices), i.e. {want:?}",
            cx.op, source.shape, a.shape
        ));
    }
    one(a)
}

#[rustfmt::skip]
const OPS: &[OpSpec] = &[
    op("ltorch.gather", &["torch.gather"], Pure, "input, dim, index", First, gather),
    op("ltorch.scatter_add", &["torch.scatter_add"], Pure, "a, /, dim, index, src", First, scatter_add),
    op("ltorch.index_select", &["torch.index_select"], Pure, "a, /, dim, index", First, index_select),
    op("ltorch.index_add", &["torch.index_add"], Pure, "a, /, dim, index, source", First, index_add),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
