//! Decoders of the ops Thunder's OpInfo suite prints that the model corpus never showed
//! (`testdata/opinfo/`): each gives a kernel that `exec/vocab_composite.rs` builds from the
//! kernels every backend has, or a random draw.

use super::{dim_operand, norm_dim, Ops};
use crate::exec::kernel::{Kernel, Side, UnaryOp};
use tracepass_ir::{Arg, DType};

/// `lerp(start, end, weight)`, the weight a tensor or a number.
pub(super) fn lerp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "start")?;
    o.tensor(1, "end")?;
    let weight = o.side(2, "weight")?;
    Ok(Kernel::Lerp { weight })
}

/// aten's `log_sigmoid_backward(grad_output, self, buffer)`: the buffer (PyTorch's CPU
/// scratch) is not read.
pub(super) fn log_sigmoid_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad_output")?;
    o.tensor(1, "a")?;
    Ok(Kernel::LogSigmoidBackward)
}

/// `any(a, dim=None, keepdim=False)`.
pub(super) fn any(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let mut dims = match o.arg(1, "dim") {
        None => (0..rank).collect(),
        Some(a) => a
            .as_int_list()
            .or_else(|| a.as_int().map(|d| vec![d]))
            .ok_or_else(|| format!("any: dim must be ints, got {a:?}"))?
            .into_iter()
            .map(|d| norm_dim(d, rank))
            .collect::<Result<Vec<_>, _>>()?,
    };
    dims.sort_unstable();
    dims.dedup();
    // a 0-d tensor reduces over nothing
    dims.retain(|&d| d < rank);
    Ok(Kernel::Any {
        dims,
        keepdim: o.flag(2, "keepdim")?,
    })
}

/// `index_copy(a, dim, index, source)`.
pub(super) fn index_copy(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(2, "index")?;
    o.tensor(3, "source")?;
    Ok(Kernel::IndexCopy {
        dim: dim_operand(o, 1, 0, "index_copy")?,
    })
}

/// `scatter(a, dim, index, src)`, `src` a tensor or a number; `reduce=` is refused.
pub(super) fn scatter(o: &mut Ops<'_>) -> Result<Kernel, String> {
    if o.arg(4, "reduce").is_some() {
        return Err("scatter with `reduce=` has no kernel (scatter_add covers 'add')".into());
    }
    o.tensor(0, "a")?;
    o.tensor(2, "index")?;
    let value = match o.side(3, "src")? {
        Side::Scalar(x) => Some(x),
        Side::Input(_) => None,
    };
    Ok(Kernel::Scatter {
        dim: dim_operand(o, 1, 0, "scatter")?,
        value,
    })
}

/// `index_put(a, indices, values, accumulate=False)` with a tuple of integer index tensors.
pub(super) fn index_put(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(2, "values")?;
    let rank = o.in_shape(0)?.len();
    let items = match o.arg(1, "indices") {
        Some(Arg::Tuple(items) | Arg::List(items)) if !items.is_empty() => items.clone(),
        other => {
            return Err(format!(
                "index_put needs a tuple of index tensors, got {other:?}"
            ))
        }
    };
    if items.len() > rank {
        return Err(format!(
            "index_put: {} index tensors for a tensor of rank {rank}",
            items.len()
        ));
    }
    for item in &items {
        let Arg::Value(v) = item else {
            return Err(format!(
                "index_put: an index must be a tensor (`None` slices have no kernel), got {item:?}"
            ));
        };
        o.inputs.push(*v);
        let dtype = o.in_type(o.inputs.len() - 1)?.dtype;
        if !matches!(
            dtype,
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8
        ) {
            return Err(format!(
                "index_put with a {dtype} index: boolean masks have no kernel"
            ));
        }
    }
    Ok(Kernel::IndexPut {
        accumulate: o.flag(3, "accumulate")?,
    })
}

/// `frexp(a)` of a float tensor.
pub(super) fn frexp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let dtype = o.in_type(0)?.dtype;
    if !dtype.is_float() {
        return Err(format!("frexp of {dtype}: PyTorch takes floats only"));
    }
    Ok(Kernel::Frexp)
}

/// Three sizes of a 3-d pooling: one int for all, a list of three, or `default` when absent
/// (or an empty list: the stride that defaults to the kernel).
fn triple(
    o: &Ops<'_>,
    i: usize,
    key: &str,
    default: Option<[usize; 3]>,
) -> Result<[usize; 3], String> {
    let missing = || format!("max_pool3d needs {key}");
    let v = match o.arg(i, key) {
        None => return default.ok_or_else(missing),
        Some(a) => a
            .as_int_list()
            .or_else(|| a.as_int().map(|x| vec![x]))
            .ok_or_else(|| format!("max_pool3d: {key} must be ints, got {a:?}"))?,
    };
    let v = match v.as_slice() {
        [] => return default.ok_or_else(missing),
        [x] => [*x; 3],
        [a, b, c] => [*a, *b, *c],
        other => return Err(format!("max_pool3d: {key} {other:?} is not 1 or 3 sizes")),
    };
    let mut out = [0usize; 3];
    for (o, x) in out.iter_mut().zip(v) {
        *o = usize::try_from(x).map_err(|_| format!("max_pool3d: negative {key} {x}"))?;
    }
    Ok(out)
}

/// `max_pool3d_with_indices(a, kernel_size, stride, padding, dilation, ceil_mode)`: dilation
/// 1 and floor mode (others are refused, naming which).
pub(super) fn max_pool3d(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    if !(4..=5).contains(&rank) {
        return Err(format!(
            "max_pool3d of a rank-{rank} tensor (4 or 5 dimensions)"
        ));
    }
    let kernel = triple(o, 1, "kernel_size", None)?;
    let stride = triple(o, 2, "stride", Some(kernel))?;
    let padding = triple(o, 3, "padding", Some([0; 3]))?;
    if triple(o, 4, "dilation", Some([1; 3]))? != [1; 3] {
        return Err(
            "max_pool3d with dilation has no kernel (windows of adjacent elements only)".into(),
        );
    }
    if o.flag(5, "ceil_mode")? {
        return Err("max_pool3d with ceil_mode has no kernel (floor mode only)".into());
    }
    if kernel
        .iter()
        .zip(&padding)
        .any(|(k, p)| *k == 0 || 2 * p > *k)
        || stride.contains(&0)
    {
        return Err(format!(
            "max_pool3d: kernel {kernel:?}, stride {stride:?}, padding {padding:?} (padding at most half the kernel)"
        ));
    }
    Ok(Kernel::MaxPool3d {
        kernel,
        stride,
        padding,
    })
}

/// `max_pool3d_with_indices_backward(grad, a, kernel_size, stride, padding, dilation,
/// ceil_mode, indices)`: the indices say where each gradient goes.
pub(super) fn max_pool3d_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad")?;
    o.tensor(1, "a")?;
    o.tensor(7, "result1")?;
    Ok(Kernel::MaxPool3dBackward)
}

/// `Tensor.unfold(a, dimension, size, step)`.
pub(super) fn unfold(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let dim = norm_dim(
        o.int(1, "dimension")?.ok_or("unfold needs a dimension")?,
        rank,
    )?;
    let size = o.int(2, "size")?.ok_or("unfold needs a size")?;
    let step = o.int(3, "step")?.ok_or("unfold needs a step")?;
    match (usize::try_from(size), usize::try_from(step)) {
        (Ok(size), Ok(step)) if step > 0 => Ok(Kernel::Unfold { dim, size, step }),
        _ => Err(format!("unfold: windows of {size} every {step}")),
    }
}

/// `batch_norm(a, running_mean, running_var, weight=None, bias=None, training=False,
/// momentum=0.1, eps=1e-05)` of an `[N, C, *]` tensor.
pub(super) fn batch_norm(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    if o.in_shape(0)?.len() < 2 {
        return Err("batch_norm needs an input of at least 2 dimensions ([N, C, *])".into());
    }
    let training = o.flag(5, "training")?;
    let mean = o.opt_tensor(1, "running_mean")?;
    let var = o.opt_tensor(2, "running_var")?;
    if mean != var {
        return Err("batch_norm with only one of running_mean and running_var".into());
    }
    if !training && !mean {
        return Err("batch_norm in evaluation needs the running statistics".into());
    }
    let weight = o.opt_tensor(3, "weight")?;
    let bias = o.opt_tensor(4, "bias")?;
    o.number(6, "momentum")?;
    Ok(Kernel::BatchNorm {
        training,
        eps: o.number(7, "eps")?.unwrap_or(1e-5),
        running: mean,
        weight,
        bias,
    })
}

/// `randint(low=0, high, size, *, dtype=int64)`: a uniform draw on `[low, high)`, floored
/// (float dtypes) or truncated into the integer dtype (`low >= 0`, where the two agree).
pub(super) fn randint(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let out = o.out(0)?.clone();
    let two = o.arg(2, "size").is_none();
    let (low, high) = if two {
        (0.0, o.number(0, "low")?.ok_or("randint needs high")?)
    } else {
        (
            o.number(0, "low")?.unwrap_or(0.0),
            o.number(1, "high")?.ok_or("randint needs high")?,
        )
    };
    if high <= low {
        return Err(format!("randint: the range [{low}, {high}) is empty"));
    }
    let draw = |dtype| Kernel::Uniform {
        shape: out.shape.to_vec(),
        minval: low,
        maxval: high,
        dtype,
    };
    if out.dtype.is_float() {
        o.then = Some(Kernel::Unary(UnaryOp::Floor));
        Ok(draw(out.dtype))
    } else if low >= 0.0 {
        o.then = Some(Kernel::Convert(out.dtype));
        Ok(draw(DType::F32))
    } else {
        Err(format!(
            "randint into {} from a negative low ({low}) has no kernel",
            out.dtype
        ))
    }
}
