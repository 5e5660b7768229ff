//! Decoders of Thunder's primitives whose operands are ordered differently from the torch-level
//! op's (`ir/src/op_table/prims.rs`): the same kernels, the operands read where the prim has
//! them.

use super::{dim_operand, Ops};
use crate::exec::kernel::{Kernel, Side};

/// `broadcast_in_dim(a, shape, broadcast_dimensions)`: `a` reshaped to the output's rank (size 1
/// in the new dimensions), then expanded.
pub(super) fn broadcast_in_dim(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let a = o.in_shape(0)?;
    let shape = o
        .ints(1, "shape")?
        .ok_or("broadcast_in_dim needs a shape")?;
    let dims = o
        .ints(2, "broadcast_dimensions")?
        .ok_or("broadcast_in_dim needs broadcast_dimensions")?;
    let mut placed = vec![1usize; shape.len()];
    for (&size, &d) in a.iter().zip(&dims) {
        let slot = usize::try_from(d)
            .ok()
            .and_then(|d| placed.get_mut(d))
            .ok_or_else(|| format!("broadcast_in_dim: dimension {d} is out of range"))?;
        *slot = size;
    }
    o.then = Some(Kernel::Expand(shape));
    Ok(Kernel::Reshape(placed))
}

/// `iota(length, *, start, step, device, dtype)`.
pub(super) fn iota(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let length = o.number(0, "length")?.ok_or("iota needs a length")?;
    let start = o.number(usize::MAX, "start")?.ok_or("iota needs start")?;
    let step = o.number(usize::MAX, "step")?.ok_or("iota needs step")?;
    Ok(Kernel::Arange {
        start,
        end: start + length * step,
        step,
        dtype: o.out(0)?.dtype,
    })
}

/// `take(a, index, dim)`: `index_select(a, dim, index)`.
pub(super) fn take(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "index")?;
    Ok(Kernel::IndexSelect {
        dim: dim_operand(o, 2, 0, "take")?,
    })
}

/// `take_along_axis(a, indices, dim)`.
pub(super) fn take_along_axis(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "indices")?;
    Ok(Kernel::TakeAlongDim {
        dim: Some(dim_operand(o, 2, 0, "take_along_axis")?),
    })
}

/// `gather(input, index, dim)`.
pub(super) fn gather(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    o.tensor(1, "index")?;
    Ok(Kernel::Gather {
        dim: dim_operand(o, 2, 0, "gather")?,
    })
}

/// `scatter_add(a, index, src, dim)`.
pub(super) fn scatter_add(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "index")?;
    o.tensor(2, "src")?;
    Ok(Kernel::ScatterAdd {
        dim: dim_operand(o, 3, 0, "scatter_add")?,
    })
}

/// `index_add(a, index, source, dim)`.
pub(super) fn index_add(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "index")?;
    o.tensor(2, "source")?;
    Ok(Kernel::IndexAdd {
        dim: dim_operand(o, 3, 0, "index_add")?,
    })
}

/// `index_copy(a, index, source, dim)`.
pub(super) fn index_copy(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "index")?;
    o.tensor(2, "source")?;
    Ok(Kernel::IndexCopy {
        dim: dim_operand(o, 3, 0, "index_copy")?,
    })
}

/// `scatter(a, index, src, dim)`, `src` a tensor or a number.
pub(super) fn scatter(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "index")?;
    let value = match o.side(2, "src")? {
        Side::Scalar(x) => Some(x),
        Side::Input(_) => None,
    };
    Ok(Kernel::Scatter {
        dim: dim_operand(o, 3, 0, "scatter")?,
        value,
    })
}
