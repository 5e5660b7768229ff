//! `torch._grouped_mm`: matrix products of groups of rows, columns or inner dimensions, the
//! groups given by cumulative `offsets` (mixture-of-experts layers). The shapes follow
//! PyTorch 2.9's meta (`torch/_meta_registrations.py`, `_create_grouped_mm_output_tensor`):
//! `(m, k) x (k, n)` groups `k` into `(G, m, n)`; `(m, k) x (G, k, n)` groups the rows into
//! `(m, n)`; `(G, m, k) x (k, n)` groups the columns into `(m, n)`; `(G, m, k) x (G, k, n)`
//! is a batched product without offsets.

use super::op;
use crate::meta::one;
use crate::registry::DTypeRule::Meta;
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, TensorType};

type R = Result<MetaOut, String>;

/// `_grouped_mm(a, b, offsets=None, bias=None, dtype=None)`, as Thunder's `ltorch` declares it.
fn grouped_mm(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let b = cx.tensor_param("b")?;
    let offsets = cx.opt_tensor("offsets")?;
    if cx.opt("bias").is_some() {
        return Err(format!(
            "{}: a bias is not supported (PyTorch 2.9 refuses it too)",
            cx.op
        ));
    }
    if a.dtype != b.dtype || !a.dtype.is_float() {
        return Err(format!(
            "{}: the operands are {} and {}; they must be one float dtype",
            cx.op, a.dtype, b.dtype
        ));
    }
    if let Some(d) = cx.dtype_param("dtype") {
        if d != a.dtype {
            return Err(format!(
                "{}: the result dtype {d} must be the operands' {}",
                cx.op, a.dtype
            ));
        }
    }
    if a.device != b.device {
        return Err(format!(
            "{}: the operands are on {} and {}",
            cx.op, a.device, b.device
        ));
    }
    let groups = match &offsets {
        Some(o) if o.shape.len() == 1 && o.dtype == DType::I32 => Some(o.shape[0]),
        Some(o) => {
            return Err(format!(
                "{}: the offsets must be a vector of int32, got {} {:?}",
                cx.op, o.dtype, o.shape
            ))
        }
        None => None,
    };
    let mismatch = || {
        format!(
            "{}: {:?} and {:?} do not multiply in groups of {}",
            cx.op,
            a.shape,
            b.shape,
            groups.map_or("no offsets".to_string(), |g| format!("{g} offsets"))
        )
    };
    let shape = match (&a.shape[..], &b.shape[..], groups) {
        ([m, k], [k2, n], Some(g)) if k == k2 => vec![g, *m, *n],
        ([m, k], [g2, k2, n], Some(g)) if k == k2 && g == *g2 => vec![*m, *n],
        ([g2, m, k], [k2, n], Some(g)) if k == k2 && g == *g2 => vec![*m, *n],
        ([g, m, k], [g2, k2, n], None) if g == g2 && k == k2 => vec![*g, *m, *n],
        _ => return Err(mismatch()),
    };
    one(TensorType::new(shape, a.dtype, a.device))
}

pub(crate) const PARTS: &[&[OpSpec]] = &[&[op(
    "ltorch._grouped_mm",
    &["torch._grouped_mm", "prims._grouped_mm"],
    Pure,
    "a, b, offsets=None, bias=None, dtype=None",
    Meta,
    grouped_mm,
)]];
