//! Python-level writes into a tensor: `y[key] = value` and `y.__setitem__(key, value)`.
//!
//! Thunder 0.2.6 traces both as the in-place `ltorch.setitem_`, functionalized to
//! `prims.copy_with_setitem` (a copy of `a` with `a[key]` replaced) followed by `copy_` back
//! into `a`; the torch executor prints the first as `copy_with_setitem_impl(a, key, value)`.
//! Its backward prints `copy_with_setitem_impl(g, key, 0)` (the gradient of `a`: zero where
//! written) and `Tensor.__getitem__(g, key)` (the value's). The checks are PyTorch 2.9's: the
//! key indexes `a`, and `value` broadcasts to what `a[key]` selects.

use super::op;
use crate::arg::Arg;
use crate::meta::one;
use crate::registry::DTypeRule::First;
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{broadcast_shapes, DType, TensorType, Type};

type R = Result<MetaOut, String>;

/// What `a[key]` selects: a known shape, or (a boolean mask) a data-dependent number of
/// elements followed by the dimensions the mask does not cover.
#[derive(Debug, PartialEq)]
pub(crate) enum Selected {
    Shape(Vec<usize>),
    Masked { rest: Vec<usize> },
}

/// Python's slice length for a dimension of size `n` (tensors take positive steps only).
fn slice_len(op: &str, parts: &[Option<i64>; 3], n: usize) -> Result<usize, String> {
    let n = n as i64;
    let step = parts[2].unwrap_or(1);
    if step <= 0 {
        return Err(format!("{op}: slice step must be positive, got {step}"));
    }
    let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
    let start = parts[0].map_or(0, clamp);
    let stop = parts[1].map_or(n, clamp);
    Ok(if stop <= start {
        0
    } else {
        ((stop - start + step - 1) / step) as usize
    })
}

/// The shape `a[key]` has, with PyTorch's rules: ints drop a dimension, slices cut one, `None`
/// adds one, `...` stands for the dimensions no other item indexes; integer tensors index a
/// dimension each, broadcast together, their shape placed where they stand when they are
/// adjacent (in front otherwise); a boolean tensor alone masks the leading dimensions.
pub(crate) fn selected(cx: &MetaCx, a: &TensorType, key: &Arg) -> Result<Selected, String> {
    let items: Vec<&Arg> = match key {
        Arg::Tuple(items) => items.iter().collect(),
        other => vec![other],
    };
    let mut tensors = Vec::new();
    for item in &items {
        if let Arg::Value(_) = item {
            match cx.type_of(item)? {
                Type::Tensor(t) => tensors.push(t),
                Type::Int(_) => {}
                other => return Err(format!("{}: cannot index by a {other}", cx.op)),
            }
        }
    }
    if let Some(mask) = tensors.iter().find(|t| t.dtype == DType::Bool) {
        if items.len() != 1 {
            return Err(format!(
                "{}: a boolean mask is supported as the whole key only, got {key:?}",
                cx.op
            ));
        }
        let r = mask.shape.len();
        if r > a.shape.len() || mask.shape[..] != a.shape[..r] {
            return Err(format!(
                "{}: mask {:?} does not match the leading dimensions of {:?}",
                cx.op, mask.shape, a.shape
            ));
        }
        return Ok(Selected::Masked {
            rest: a.shape[r..].to_vec(),
        });
    }
    for t in &tensors {
        if !matches!(t.dtype, DType::I64 | DType::I32) {
            return Err(format!(
                "{}: an index tensor must be i64, i32 or bool, got {}",
                cx.op, t.dtype
            ));
        }
    }
    let is_tensor = |a: &Arg| matches!(cx.type_of(a), Ok(Type::Tensor(_)));
    let is_int = |a: &Arg| match a {
        Arg::Int(_) => true,
        Arg::Value(_) => matches!(cx.type_of(a), Ok(Type::Int(_))),
        _ => false,
    };
    if !tensors.is_empty() && items.iter().any(|i| is_int(i)) {
        return Err(format!(
            "{}: ints mixed with index tensors are not supported, got {key:?}",
            cx.op
        ));
    }
    let consumed = items
        .iter()
        .filter(|i| !matches!(i, Arg::None | Arg::Ellipsis))
        .count();
    if consumed > a.shape.len() {
        return Err(format!(
            "{}: {consumed} indices for a tensor of rank {}",
            cx.op,
            a.shape.len()
        ));
    }
    if items.iter().filter(|i| matches!(i, Arg::Ellipsis)).count() > 1 {
        return Err(format!("{}: an index can hold one ellipsis (...)", cx.op));
    }
    let mut index_shape: Vec<usize> = Vec::new();
    for t in &tensors {
        index_shape = broadcast_shapes(&index_shape, &t.shape).ok_or_else(|| {
            format!(
                "{}: index tensors of shapes {:?} do not broadcast",
                cx.op,
                tensors.iter().map(|t| t.shape.to_vec()).collect::<Vec<_>>()
            )
        })?;
    }
    // where the tensors' dimensions go: in place of the first when adjacent, else in front
    let positions: Vec<usize> = (0..items.len()).filter(|&i| is_tensor(items[i])).collect();
    let adjacent = positions.windows(2).all(|w| w[1] == w[0] + 1);
    let mut shape = Vec::new();
    let mut placed = !adjacent && !tensors.is_empty();
    if placed {
        shape.extend_from_slice(&index_shape);
    }
    let mut d = 0;
    for item in &items {
        match item {
            Arg::Int(i) => {
                let n = a.shape[d] as i64;
                if *i >= n || *i < -n {
                    return Err(format!(
                        "{}: index {i} is out of range for dimension {d} of size {n}",
                        cx.op
                    ));
                }
                d += 1;
            }
            Arg::Slice(parts) => {
                shape.push(slice_len(cx.op, parts, a.shape[d])?);
                d += 1;
            }
            Arg::None => shape.push(1),
            Arg::Ellipsis => {
                let skip = a.shape.len() - consumed;
                shape.extend_from_slice(&a.shape[d..d + skip]);
                d += skip;
            }
            // an int the trace computed: its dimension dropped
            v if is_int(v) => d += 1,
            t if is_tensor(t) => {
                if !placed {
                    shape.extend_from_slice(&index_shape);
                    placed = true;
                }
                d += 1;
            }
            other => return Err(format!("{}: unsupported index {other:?}", cx.op)),
        }
    }
    shape.extend_from_slice(&a.shape[d..]);
    Ok(Selected::Shape(shape))
}

/// `copy_with_setitem(a, key, value)`: `a`'s type; `value` (a number, or a tensor on `a`'s
/// device that PyTorch casts to `a`'s dtype) broadcasts to `a[key]`.
fn copy_with_setitem(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let key = cx.param("key")?;
    let sel = selected(cx, &a, key)?;
    let value = cx.param("value")?;
    let v = match cx.type_of(value)? {
        Type::Tensor(v) => v,
        Type::Int(_) | Type::Float(_) | Type::Bool(_) => return one(a),
        other => {
            return Err(format!(
                "{}: the value written must be a number or a tensor, got {other}",
                cx.op
            ))
        }
    };
    if v.device != a.device {
        return Err(format!(
            "{}: the value is on {}, the tensor written on {}",
            cx.op, v.device, a.device
        ));
    }
    let fits = match &sel {
        Selected::Shape(s) => broadcast_shapes(&v.shape, s).is_some_and(|b| b == *s),
        // the number of masked elements is known at run time only: the value must broadcast
        // to any number of them
        Selected::Masked { rest } => {
            let r = rest.len();
            let (lead, tail) = if v.shape.len() > r {
                v.shape.split_at(v.shape.len() - r)
            } else {
                (&[][..], &v.shape[..])
            };
            lead.iter().all(|&n| n == 1)
                && broadcast_shapes(tail, rest).is_some_and(|b| b[..] == rest[..])
        }
    };
    if !fits {
        return Err(format!(
            "{}: a value of shape {:?} does not broadcast to the {} written",
            cx.op,
            v.shape,
            match sel {
                Selected::Shape(s) => format!("{s:?}"),
                Selected::Masked { rest } => format!("masked elements (each {rest:?})"),
            }
        ));
    }
    one(a)
}

#[rustfmt::skip]
const OPS: &[OpSpec] = &[
    op("prims.copy_with_setitem", &["copy_with_setitem_impl"], Pure, "a, key, value, /", First, copy_with_setitem),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
