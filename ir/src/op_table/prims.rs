//! Thunder's primitives whose operands differ from the torch-level op's (`prims.take(a, index,
//! dim)` against `index_select(a, dim, index)`), as `thunder/core/prims.py` declares them. They
//! are printed inside decompositions, which the parser reads for torch-level ops tracepass has no
//! entry for (`crate::decomposition`). Prims with the torch-level op's operands are spellings of
//! that op's entry instead (`prims.acos` of `ltorch.acos`).

use super::creation::device;
use super::indexing::{gather, index_add, index_select, scatter_add};
use super::nn::take_along_dim;
use super::op;
use super::vocab::like_a;
use crate::meta::one;
use crate::registry::DTypeRule::{First, Meta};
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::TensorType;

type R = Result<MetaOut, String>;

/// `broadcast_in_dim(a, shape, broadcast_dimensions)`: `a`'s dimension `i` becomes dimension
/// `broadcast_dimensions[i]` of `shape` (strictly increasing), where it must be 1 or the same
/// size; the other dimensions are new.
fn broadcast_in_dim(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let shape = cx.ints_param("shape")?;
    let dims = cx.ints_param("broadcast_dimensions")?;
    if dims.len() != a.shape.len() {
        return Err(format!(
            "{}: {} broadcast dimensions for a rank-{} input",
            cx.op,
            dims.len(),
            a.shape.len()
        ));
    }
    let mut last = -1;
    for (i, &d) in dims.iter().enumerate() {
        if d <= last || d as usize >= shape.len() {
            return Err(format!(
                "{}: broadcast_dimensions {dims:?} must increase and lie in 0..{}",
                cx.op,
                shape.len()
            ));
        }
        last = d;
        let want = shape[d as usize];
        if a.shape[i] != 1 && a.shape[i] as i64 != want {
            return Err(format!(
                "{}: input dimension {i} has size {}, output dimension {d} size {want}",
                cx.op, a.shape[i]
            ));
        }
    }
    let shape = shape
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| format!("{}: negative size {s}", cx.op)))
        .collect::<Result<Vec<_>, _>>()?;
    one(TensorType::new(shape, a.dtype, a.device))
}

/// `iota(length, *, start, step, device, dtype)`: `start, start + step, ...`, `length` of them.
fn iota(cx: &MetaCx) -> R {
    let n = cx.int_param("length")?;
    let n = usize::try_from(n).map_err(|_| format!("{}: negative length {n}", cx.op))?;
    for p in ["start", "step"] {
        cx.f64_param(p)
            .ok_or_else(|| format!("{}: `{p}` must be a known number", cx.op))?;
    }
    let dtype = cx
        .dtype_param("dtype")
        .ok_or_else(|| format!("{}: `dtype` must be a dtype", cx.op))?;
    one(TensorType::new([n], dtype, device(cx)?))
}

#[rustfmt::skip]
const PRIMS: &[OpSpec] = &[
    op("prims.broadcast_in_dim", &[], Pure, "a, /, shape, broadcast_dimensions", First, broadcast_in_dim),
    op("prims.iota", &[], Pure, "length, *, start, step, device, dtype", Meta, iota),
    op("prims.take", &[], Pure, "a, /, index, dim", First, index_select),
    op("prims.take_along_axis", &[], Pure, "a, /, indices, dim", First, take_along_dim),
    op("prims.gather", &[], Pure, "input, /, index, dim", First, gather),
    op("prims.scatter_add", &[], Pure, "a, /, index, src, dim", First, scatter_add),
    op("prims.index_add", &[], Pure, "a, /, index, source, dim", First, index_add),
    op("prims.index_copy", &[], Pure, "a, /, index, source, dim", First, like_a),
    op("prims.scatter", &[], Pure, "a, /, index, src, dim", First, like_a),
];

pub(crate) const PARTS: &[&[OpSpec]] = &[PRIMS];
