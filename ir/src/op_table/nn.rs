//! Neural-network ops: matrix products, convolution, pooling, embedding, normalization,
//! attention, dropout and losses.

use super::op;
use crate::arg::Arg;
use crate::meta::{dim_of, linear, many, matmul, norm_dim, one};
use crate::registry::DTypeRule::{First, Meta};
use crate::registry::Effect::{Pure, Random};
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, TensorType};

type R = Result<MetaOut, String>;

/// `bmm(a, b)`: `[B, n, k] @ [B, k, m]`.
fn bmm(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let b = cx.tensor_param("b")?;
    match (&a.shape[..], &b.shape[..]) {
        ([ba, n, k], [bb, k2, m]) if ba == bb && k == k2 && a.dtype == b.dtype => {
            one(TensorType::new([*ba, *n, *m], a.dtype, a.device))
        }
        _ => Err(format!(
            "{}: {} {:?} and {} {:?} do not multiply batch by batch",
            cx.op, a.dtype, a.shape, b.dtype, b.shape
        )),
    }
}

/// An int or per-dimension ints, as `n` values.
fn per_dim(cx: &MetaCx, name: &str, n: usize) -> Result<Vec<i64>, String> {
    let v = cx.ints_param(name)?;
    match v.len() {
        1 => Ok(vec![v[0]; n]),
        l if l == n => Ok(v),
        l => Err(format!(
            "{}: `{name}` has {l} entries for {n} spatial dimensions",
            cx.op
        )),
    }
}

/// Output length of a convolution or pooling window along one dimension.
fn window_out(
    op: &str,
    len: i64,
    k: i64,
    s: i64,
    p: i64,
    d: i64,
    ceil: bool,
) -> Result<usize, String> {
    if k < 1 || s < 1 || d < 1 || p < 0 {
        return Err(format!(
            "{op}: kernel {k}, stride {s}, padding {p}, dilation {d} must be positive"
        ));
    }
    let span = d * (k - 1) + 1;
    let room = len + 2 * p - span;
    if room < 0 {
        return Err(format!(
            "{op}: window of {span} does not fit length {len} with padding {p}"
        ));
    }
    let mut out = if ceil {
        (room + s - 1) / s + 1
    } else {
        room / s + 1
    };
    // PyTorch: the last window must start inside the input or left padding
    if ceil && (out - 1) * s >= len + p {
        out -= 1;
    }
    Ok(out as usize)
}

/// `convolution(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups)`.
fn convolution(cx: &MetaCx) -> R {
    convolution_of(cx, matches!(cx.opt("transposed"), Some(Arg::Bool(true))))
}

/// `conv_transpose1d/2d/3d(a, weight, bias=None, stride=1, padding=0, output_padding=0,
/// groups=1, dilation=1)`: the gradient of a convolution with respect to its input, as a layer.
fn conv_transpose(cx: &MetaCx) -> R {
    convolution_of(cx, true)
}

fn convolution_of(cx: &MetaCx, transposed: bool) -> R {
    let x = cx.tensor_param("a")?;
    let w = cx.tensor_param("weight")?;
    let spatial = w
        .shape
        .len()
        .checked_sub(2)
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{}: weight {:?} has no spatial dimensions", cx.op, w.shape))?;
    let batched = x.shape.len() == spatial + 2;
    if !batched && x.shape.len() != spatial + 1 {
        return Err(format!(
            "{}: input {:?} does not fit weight {:?}",
            cx.op, x.shape, w.shape
        ));
    }
    let lead = if batched { 1 } else { 0 };
    let groups = cx.int_param("groups")?;
    if groups < 1 {
        return Err(format!("{}: groups must be positive, got {groups}", cx.op));
    }
    let stride = per_dim(cx, "stride", spatial)?;
    let dilation = per_dim(cx, "dilation", spatial)?;
    let in_ch = x.shape[lead] as i64;
    let (out_ch, w_in) = if transposed {
        (w.shape[1] as i64 * groups, w.shape[0] as i64)
    } else {
        (w.shape[0] as i64, w.shape[1] as i64 * groups)
    };
    if w_in != in_ch {
        return Err(format!(
            "{}: input has {in_ch} channels but weight {:?} with {groups} groups expects {w_in}",
            cx.op, w.shape
        ));
    }
    let padding = match cx.param("padding")? {
        Arg::Str(s) if s == "valid" => vec![0; spatial],
        Arg::Str(s) if s == "same" => (0..spatial)
            .map(|i| dilation[i] * (w.shape[2 + i] as i64 - 1) / 2)
            .collect(),
        _ => per_dim(cx, "padding", spatial)?,
    };
    let mut shape: Vec<usize> = x.shape[..lead].to_vec();
    shape.push(out_ch as usize);
    for i in 0..spatial {
        let len = x.shape[lead + 1 + i] as i64;
        let k = w.shape[2 + i] as i64;
        let n = if transposed {
            let op = cx
                .opt("output_padding")
                .map(|_| per_dim(cx, "output_padding", spatial))
                .transpose()?
                .map_or(0, |v| v[i]);
            let n = (len - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + op + 1;
            if n < 0 {
                return Err(format!("{}: negative output length {n}", cx.op));
            }
            n as usize
        } else {
            window_out(cx.op, len, k, stride[i], padding[i], dilation[i], false)?
        };
        shape.push(n);
    }
    if let Some(b) = cx.opt_tensor("bias")? {
        if b.shape[..] != [out_ch as usize] {
            return Err(format!(
                "{}: bias {:?} does not fit {out_ch} output channels",
                cx.op, b.shape
            ));
        }
    }
    one(x.with_shape(shape))
}

/// Pooling with indices over the last `n` dimensions: (values, i64 indices). Thunder's own
/// meta types the indices like the input; PyTorch returns int64, which is what they hold.
fn max_pool_with_indices(cx: &MetaCx, n: usize) -> R {
    let x = cx.tensor_param("a")?;
    if x.shape.len() < n + 1 {
        return Err(format!(
            "{}: input {:?} has too few dimensions",
            cx.op, x.shape
        ));
    }
    let k = per_dim(cx, "kernel_size", n)?;
    let s = match cx.opt("stride") {
        Some(Arg::Tuple(v) | Arg::List(v)) if v.is_empty() => k.clone(),
        None => k.clone(),
        Some(_) => per_dim(cx, "stride", n)?,
    };
    let p = per_dim(cx, "padding", n)?;
    let d = per_dim(cx, "dilation", n)?;
    let ceil = matches!(cx.opt("ceil_mode"), Some(Arg::Bool(true)));
    let lead = x.shape.len() - n;
    let mut shape = x.shape[..lead].to_vec();
    for i in 0..n {
        if p[i] * 2 > k[i] {
            return Err(format!(
                "{}: padding {} is more than half the kernel {}",
                cx.op, p[i], k[i]
            ));
        }
        shape.push(window_out(
            cx.op,
            x.shape[lead + i] as i64,
            k[i],
            s[i],
            p[i],
            d[i],
            ceil,
        )?);
    }
    many(vec![
        x.with_shape(&shape),
        TensorType::new(shape, DType::I64, x.device),
    ])
}

fn max_pool1d_with_indices(cx: &MetaCx) -> R {
    max_pool_with_indices(cx, 1)
}
fn max_pool2d_with_indices(cx: &MetaCx) -> R {
    max_pool_with_indices(cx, 2)
}
fn max_pool3d_with_indices(cx: &MetaCx) -> R {
    max_pool_with_indices(cx, 3)
}

/// `max_poolNd(a, ..., return_indices=False)`: values, or (values, indices).
fn max_pool(cx: &MetaCx, n: usize) -> R {
    let out = max_pool_with_indices(cx, n)?;
    match (out, cx.opt("return_indices")) {
        (MetaOut::Types(mut t), Some(Arg::Bool(true))) => {
            t.truncate(2);
            Ok(MetaOut::Types(t))
        }
        (MetaOut::Types(mut t), _) => {
            t.truncate(1);
            Ok(MetaOut::Types(t))
        }
        (other, _) => Ok(other),
    }
}
fn max_pool1d(cx: &MetaCx) -> R {
    max_pool(cx, 1)
}
fn max_pool2d(cx: &MetaCx) -> R {
    max_pool(cx, 2)
}
fn max_pool3d(cx: &MetaCx) -> R {
    max_pool(cx, 3)
}

/// The gradient of a pooling: shaped like its input `a`.
fn pool_backward(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let g = cx.tensor_param("grad")?;
    if g.dtype != a.dtype {
        return Err(format!(
            "{}: grad is {} but input is {}",
            cx.op, g.dtype, a.dtype
        ));
    }
    one(a)
}

/// `adaptive_avg_pool2d(a, output_size)`.
fn adaptive_avg_pool2d(cx: &MetaCx) -> R {
    let x = cx.tensor_param("a")?;
    let out = per_dim(cx, "output_size", 2)?;
    if x.shape.len() < 3 || out.iter().any(|o| *o < 0) {
        return Err(format!(
            "{}: bad input {:?} or size {out:?}",
            cx.op, x.shape
        ));
    }
    let mut shape = x.shape[..x.shape.len() - 2].to_vec();
    shape.extend(out.iter().map(|o| *o as usize));
    one(x.with_shape(shape))
}

/// `adaptive_avg_pool1d(input, output_size)`: `[*, C, L]` to `[*, C, output_size]`.
fn adaptive_avg_pool1d(cx: &MetaCx) -> R {
    let x = cx.tensor_param("input")?;
    let out = per_dim(cx, "output_size", 1)?;
    let n = x.shape.len();
    if !(2..=3).contains(&n) || out[0] < 1 {
        return Err(format!(
            "{}: input {:?} (2 or 3 dimensions) with output size {out:?}",
            cx.op, x.shape
        ));
    }
    let mut shape = x.shape.clone();
    shape[n - 1] = out[0] as usize;
    one(x.with_shape(shape))
}

/// `adaptive_max_pool1d/2d(input, output_size, return_indices=False)` (`n` spatial
/// dimensions): `[*, C, *spatial]` (one or no batch dimension, every size non-zero) to the
/// output size, `None` keeping a size. The indices (`return_indices=True`) are refused: the
/// runtime computes the maxima, and the gradient from the input.
fn adaptive_max_pool(cx: &MetaCx, n: usize) -> R {
    let x = cx.tensor_param("input")?;
    if !matches!(cx.opt("return_indices"), None | Some(Arg::Bool(false))) {
        return Err(format!(
            "{}: return_indices=True (the pair of maxima and indices) is not supported",
            cx.op
        ));
    }
    let r = x.shape.len();
    if !(n + 1..=n + 2).contains(&r) || x.shape[r - n - 1..].contains(&0) || !x.dtype.is_float() {
        return Err(format!(
            "{}: input {} {:?} must be a floating-point tensor of {} or {} dimensions, the              non-batch ones non-zero",
            cx.op,
            x.dtype,
            x.shape,
            n + 1,
            n + 2
        ));
    }
    let spatial = &x.shape[r - n..];
    let sizes: Vec<Option<i64>> = match cx.param("output_size")? {
        Arg::Tuple(v) | Arg::List(v) => v
            .iter()
            .map(|a| match a {
                Arg::None => Ok(None),
                a => a.as_int().map(Some).ok_or(()),
            })
            .collect::<Result<_, ()>>()
            .map_err(|()| format!("{}: `output_size` must be integers or None", cx.op))?,
        _ => vec![Some(cx.int_param("output_size")?)],
    };
    let sizes = match sizes.len() {
        1 => vec![sizes[0]; n],
        l if l == n => sizes,
        l => {
            return Err(format!(
                "{}: `output_size` has {l} entries for {n} spatial dimensions",
                cx.op
            ))
        }
    };
    let mut shape = x.shape[..r - n].to_vec();
    for (s, &len) in sizes.iter().zip(spatial) {
        match s {
            None => shape.push(len),
            Some(s) if *s >= 1 => shape.push(*s as usize),
            Some(s) => return Err(format!("{}: output size {s} must be positive", cx.op)),
        }
    }
    one(x.with_shape(shape))
}

fn adaptive_max_pool1d(cx: &MetaCx) -> R {
    adaptive_max_pool(cx, 1)
}

fn adaptive_max_pool2d(cx: &MetaCx) -> R {
    adaptive_max_pool(cx, 2)
}

/// The window positions of `unfold`/`fold` over an `[h, w]` plane (`kernel_size`,
/// `dilation`, `padding`, `stride`: an int or a pair each).
fn im2col_positions(cx: &MetaCx, h: usize, w: usize) -> Result<[usize; 2], String> {
    let k = per_dim(cx, "kernel_size", 2)?;
    let d = per_dim(cx, "dilation", 2)?;
    let p = per_dim(cx, "padding", 2)?;
    let s = per_dim(cx, "stride", 2)?;
    let mut out = [0; 2];
    for (i, len) in [h, w].into_iter().enumerate() {
        out[i] = window_out(cx.op, len as i64, k[i], s[i], p[i], d[i], false)?;
    }
    Ok(out)
}

/// `unfold(input, kernel_size, dilation=1, padding=0, stride=1)` (im2col): `[N, C, H, W]`
/// (or `[C, H, W]`) to `[N, C * kh * kw, L]`, `L` the window positions.
fn unfold_im2col(cx: &MetaCx) -> R {
    let x = cx.tensor_param("input")?;
    let r = x.shape.len();
    if !(3..=4).contains(&r) || !x.dtype.is_float() || x.shape[r - 3..].contains(&0) {
        return Err(format!(
            "{}: input {} {:?} must be a floating-point [N, C, H, W] or [C, H, W]",
            cx.op, x.dtype, x.shape
        ));
    }
    let [oh, ow] = im2col_positions(cx, x.shape[r - 2], x.shape[r - 1])?;
    let k = per_dim(cx, "kernel_size", 2)?;
    let mut shape = x.shape[..r - 3].to_vec();
    shape.extend([x.shape[r - 3] * (k[0] * k[1]) as usize, oh * ow]);
    one(x.with_shape(shape))
}

/// `fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1)` (col2im):
/// `[N, C * kh * kw, L]` (or unbatched) to `[N, C, H, W]`, `L` the window positions of
/// `output_size`.
fn fold_col2im(cx: &MetaCx) -> R {
    let x = cx.tensor_param("input")?;
    let out = per_dim(cx, "output_size", 2)?;
    let k = per_dim(cx, "kernel_size", 2)?;
    let r = x.shape.len();
    let taps = (k[0] * k[1]).max(1) as usize;
    if !(2..=3).contains(&r) || !x.dtype.is_float() || out.iter().any(|&o| o < 1) {
        return Err(format!(
            "{}: input {} {:?} must be floating-point [N, C * kh * kw, L] or unbatched, output              size {out:?} positive",
            cx.op, x.dtype, x.shape
        ));
    }
    let [oh, ow] = im2col_positions(cx, out[0] as usize, out[1] as usize)?;
    let (rows, l) = (x.shape[r - 2], x.shape[r - 1]);
    if rows % taps != 0 || rows == 0 || l != oh * ow {
        return Err(format!(
            "{}: input {:?} is not the columns of a {}x{} kernel at {oh}x{ow} positions",
            cx.op, x.shape, k[0], k[1]
        ));
    }
    let mut shape = x.shape[..r - 2].to_vec();
    shape.extend([rows / taps, out[0] as usize, out[1] as usize]);
    one(x.with_shape(shape))
}

/// `cosine_similarity(x1, x2, dim=1, eps=1e-8)`: both floating tensors of one dtype, broadcast,
/// `dim` (of the broadcast rank) summed away.
fn cosine_similarity(cx: &MetaCx) -> R {
    let a = cx.tensor_param("x1")?;
    let b = cx.tensor_param("x2")?;
    let shape = crate::types::broadcast_shapes(&a.shape, &b.shape)
        .filter(|s| !s.is_empty() && a.dtype == b.dtype && a.dtype.is_float() && a.device == b.device)
        .ok_or_else(|| {
            format!(
                "{}: x1 {} {:?} and x2 {} {:?} must be floating tensors of one dtype that broadcast",
                cx.op, a.dtype, a.shape, b.dtype, b.shape
            )
        })?;
    let dim = match cx.opt("dim") {
        None => 1,
        Some(_) => cx.int_param("dim")?,
    };
    let d = dim_of(cx, dim, shape.len())?;
    let mut out = shape;
    out.remove(d);
    one(a.with_shape(out))
}

/// `bilinear(input1, input2, weight, bias=None)`: `[*, in1]` and `[*, in2]` (the same
/// leading sizes) with `weight [out, in1, in2]` and `bias [out]` to `[*, out]`, all one
/// floating dtype.
fn bilinear(cx: &MetaCx) -> R {
    let a = cx.tensor_param("input1")?;
    let b = cx.tensor_param("input2")?;
    let w = cx.tensor_param("weight")?;
    let bias = cx.opt_tensor("bias")?;
    let fits = match (&a.shape[..], &b.shape[..], &w.shape[..]) {
        ([lead_a @ .., i1], [lead_b @ .., i2], [_, w1, w2]) => {
            lead_a == lead_b && i1 == w1 && i2 == w2
        }
        _ => false,
    };
    let out = w.shape.first().copied().unwrap_or(0);
    let bias_fits = bias.as_ref().is_none_or(|t| t.shape[..] == [out]);
    let same = [&b, &w]
        .into_iter()
        .chain(bias.as_ref())
        .all(|t| t.dtype == a.dtype && t.device == a.device);
    if !fits || !bias_fits || !same || !a.dtype.is_float() {
        return Err(format!(
            "{}: input1 {} {:?}, input2 {} {:?}, weight {} {:?} and bias {:?} do not fit              (`[*, in1]`, `[*, in2]`, `[out, in1, in2]`, `[out]`, one floating dtype)",
            cx.op,
            a.dtype,
            a.shape,
            b.dtype,
            b.shape,
            w.dtype,
            w.shape,
            bias.map(|t| t.shape)
        ));
    }
    let mut shape = a.shape[..a.shape.len() - 1].to_vec();
    shape.push(out);
    one(a.with_shape(shape))
}

/// `_adaptive_avg_pool2d_backward(grad, a)`: the gradient with respect to `a`.
fn adaptive_avg_pool2d_backward(cx: &MetaCx) -> R {
    let g = cx.tensor_param("grad")?;
    let a = cx.tensor_param("a")?;
    if g.shape.len() != a.shape.len() || a.shape.len() < 3 {
        return Err(format!(
            "{}: grad {:?} does not pool input {:?}",
            cx.op, g.shape, a.shape
        ));
    }
    one(g.with_shape(a.shape.clone()))
}

/// `embedding(a, weight, ...)`: indices of any shape, one weight row each.
fn embedding(cx: &MetaCx) -> R {
    let idx = cx.tensor_param("a")?;
    let w = cx.tensor_param("weight")?;
    if w.shape.len() != 2 || idx.dtype.is_float() || idx.dtype == DType::Bool {
        return Err(format!(
            "{}: needs integer indices and a 2-d weight, got {} indices and weight {:?}",
            cx.op, idx.dtype, w.shape
        ));
    }
    let mut shape = idx.shape.to_vec();
    shape.push(w.shape[1]);
    one(w.with_shape(shape))
}

/// `embedding_backward(grad, indices, num_weights, ...)`: `[num_weights, embedding_dim]`.
fn embedding_backward(cx: &MetaCx) -> R {
    let g = cx.tensor_param("grad")?;
    let n = cx.int_param("num_weights")?;
    let dim = *g
        .shape
        .last()
        .ok_or_else(|| format!("{}: grad is 0-d", cx.op))?;
    if n < 0 {
        return Err(format!("{}: num_weights {n} is negative", cx.op));
    }
    one(g.with_shape([n as usize, dim]))
}

/// `take_along_dim(a, indices, dim)`: `a`'s values at `indices` along `dim`; the other dims
/// broadcast. Without `dim`, along the flattened `a`: shaped like `indices`, flattened.
pub(super) fn take_along_dim(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let idx = cx.tensor_param("indices")?;
    if idx.dtype.is_float() || idx.dtype == DType::Bool {
        return Err(format!(
            "{}: indices must be integers, got {}",
            cx.op, idx.dtype
        ));
    }
    let Some(_) = cx.opt("dim") else {
        let n: usize = idx.shape.iter().product();
        return one(a.with_shape([n]));
    };
    let dim = norm_dim(cx.int_param("dim")?, a.shape.len(), cx.op)?;
    if a.shape.len() != idx.shape.len() {
        return Err(format!(
            "{}: a {:?} and indices {:?} must have the same number of dims",
            cx.op, a.shape, idx.shape
        ));
    }
    let mut shape = Vec::with_capacity(a.shape.len());
    for (i, (&x, &y)) in a.shape.iter().zip(&idx.shape).enumerate() {
        shape.push(match (i == dim, x, y) {
            (true, _, y) => y,
            (false, x, y) if x == y || y == 1 => x,
            (false, 1, y) => y,
            _ => {
                return Err(format!(
                    "{}: a {:?} and indices {:?} do not broadcast outside dim {dim}",
                    cx.op, a.shape, idx.shape
                ))
            }
        });
    }
    one(a.with_shape(shape))
}

/// `nll_loss_backward(grad, a, target, ...)`: the gradient with respect to `a`.
fn nll_loss_backward(cx: &MetaCx) -> R {
    one(cx.tensor_param("a")?)
}

/// `_softmax_backward_data` / `_log_softmax_backward_data`: shaped like `grad_output`, in
/// `input_dtype`.
fn softmax_backward(cx: &MetaCx) -> R {
    let g = cx.tensor_param("grad_output")?;
    let out = cx.tensor_param("output")?;
    if g.shape != out.shape {
        return Err(format!(
            "{}: grad_output {:?} and output {:?} differ in shape",
            cx.op, g.shape, out.shape
        ));
    }
    norm_dim(cx.int_param("dim")?, g.shape.len(), cx.op)?;
    let dtype = cx.dtype_param("input_dtype").unwrap_or(g.dtype);
    one(TensorType::new(g.shape.clone(), dtype, g.device))
}

/// Normalizations: shaped like the input.
fn like_input(cx: &MetaCx) -> R {
    one(cx.tensor_param("a")?)
}

/// `scaled_dot_product_attention(query, key, value, ...)`: `[..., L, Ev]`.
fn sdpa(cx: &MetaCx) -> R {
    let q = cx.tensor_param("query")?;
    let k = cx.tensor_param("key")?;
    let v = cx.tensor_param("value")?;
    let (Some(lq), Some(ev)) = (q.shape.len().checked_sub(1), v.shape.last()) else {
        return Err(format!("{}: 0-d operands", cx.op));
    };
    if q.shape.last() != k.shape.last() || q.dtype != k.dtype || q.dtype != v.dtype {
        return Err(format!(
            "{}: query {:?} and key {:?} do not fit",
            cx.op, q.shape, k.shape
        ));
    }
    let mut shape = q.shape[..lq].to_vec();
    shape.push(*ev);
    one(q.with_shape(shape))
}

/// `cross_entropy`/`nll_loss`/`mse_loss` with `reduction`: 0-d, or per element/sample.
fn loss(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let t = cx.tensor_param("target")?;
    let reduction = cx.opt("reduction").and_then(Arg::as_str).unwrap_or("mean");
    match reduction {
        "mean" | "sum" => one(a.with_shape([])),
        "none" if cx.op == "ltorch.mse_loss" => one(a),
        "none" => {
            if t.dtype.is_float() {
                // probabilities as targets: one loss per sample
                let mut s = a.shape.to_vec();
                if s.len() > 1 {
                    s.remove(1);
                } else {
                    s.clear();
                }
                one(a.with_shape(s))
            } else {
                one(a.with_shape(&t.shape[..]))
            }
        }
        other => Err(format!("{}: unknown reduction '{other}'", cx.op)),
    }
}

/// The pointwise losses Thunder runs as torch fallbacks (`binary_cross_entropy(_with_logits)`,
/// `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div`): input and target one floating dtype and shape
/// (PyTorch broadcasts only with a warning, or refuses); 0-d, or the input's shape with
/// `reduction='none'`. `size_average`/`reduce` (deprecated) must be `None`.
fn pointwise_loss(cx: &MetaCx) -> R {
    let a = cx.tensor_param("input")?;
    let t = cx.tensor_param("target")?;
    if a.shape != t.shape || a.dtype != t.dtype || !a.dtype.is_float() || a.device != t.device {
        return Err(format!(
            "{}: input {} {:?} and target {} {:?} must be floating tensors of one dtype and shape",
            cx.op, a.dtype, a.shape, t.dtype, t.shape
        ));
    }
    for k in ["size_average", "reduce"] {
        if cx.opt(k).is_some_and(|v| !matches!(v, Arg::None)) {
            return Err(format!(
                "{}: `{k}` is deprecated and not supported; use `reduction`",
                cx.op
            ));
        }
    }
    match cx.opt("reduction").and_then(Arg::as_str).unwrap_or("mean") {
        "mean" | "sum" => one(a.with_shape([])),
        "batchmean" if cx.op == "ltorch.kl_div" => one(a.with_shape([])),
        "none" => one(a),
        other => Err(format!("{}: unknown reduction '{other}'", cx.op)),
    }
}

/// `one_hot(a, num_classes)`: i64, one more dimension. The class count must be given: it
/// depends on the data otherwise.
fn one_hot(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let n = cx.int_param("num_classes")?;
    if n < 0 {
        return Err(format!(
            "{}: num_classes must be given (it would depend on the data)",
            cx.op
        ));
    }
    let mut shape = a.shape.to_vec();
    shape.push(n as usize);
    one(TensorType::new(shape, DType::I64, a.device))
}

/// `torch.nn.functional.pad(a, pad, mode, value)`: `pad` lists (left, right) pairs from the
/// last dimension backwards; negative values crop.
fn f_pad(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let pad = cx.ints_param("pad")?;
    if pad.len() % 2 != 0 || pad.len() / 2 > a.shape.len() {
        return Err(format!(
            "{}: pad {pad:?} does not fit rank {}",
            cx.op,
            a.shape.len()
        ));
    }
    let mut shape = a.shape.to_vec();
    let rank = shape.len();
    for (i, pair) in pad.chunks(2).enumerate() {
        let d = rank - 1 - i;
        let n = shape[d] as i64 + pair[0] + pair[1];
        if n < 0 {
            return Err(format!("{}: dimension {d} would have length {n}", cx.op));
        }
        shape[d] = n as usize;
    }
    one(a.with_shape(shape))
}

/// `glu(a, dim=-1)`: half the size along `dim`.
fn glu(cx: &MetaCx) -> R {
    let a = cx.tensor_param("a")?;
    let d = dim_of(cx, cx.int_param("dim")?, a.shape.len())?;
    if a.shape[d] % 2 != 0 {
        return Err(format!(
            "{}: dimension {d} has odd size {}",
            cx.op, a.shape[d]
        ));
    }
    let mut shape = a.shape.to_vec();
    shape[d] /= 2;
    one(a.with_shape(shape))
}

const OPS: &[OpSpec] = &[
    op("ltorch.linear", &["torch.nn.functional.linear", "torch.linear"], Pure, "a, w, /, bias=None", First, linear),
    op("prims.linear", &[], Pure, "a, w, bias, /", First, linear),
    op("ltorch.matmul", &["torch.matmul", "Tensor.matmul", "Tensor.__matmul__"], Pure, "a, b, /", First, matmul),
    op("prims.matmul", &[], Pure, "a, b, /", First, matmul),
    op("ltorch.bmm", &["torch.bmm"], Pure, "a, b, /", First, bmm),
    op("ltorch.convolution", &["torch.convolution"], Pure, "a, weight, bias, stride, padding, dilation, transposed, output_padding, groups", First, convolution),
    op("prims.convolution", &[], Pure, "a, weight, bias, stride, padding, dilation, transposed, output_padding, groups", First, convolution),
    op("ltorch.conv1d", &["torch.nn.functional.conv1d"], Pure, "a, weight, bias=None, stride=1, padding=0, dilation=1, groups=1", First, convolution),
    op("ltorch.conv2d", &["torch.nn.functional.conv2d"], Pure, "a, weight, bias=None, stride=1, padding=0, dilation=1, groups=1", First, convolution),
    op("ltorch.conv3d", &["torch.nn.functional.conv3d"], Pure, "a, weight, bias=None, stride=1, padding=0, dilation=1, groups=1", First, convolution),
    op("ltorch.conv_transpose1d", &["torch.nn.functional.conv_transpose1d"], Pure, "a, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1", First, conv_transpose),
    op("ltorch.conv_transpose2d", &["torch.nn.functional.conv_transpose2d"], Pure, "a, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1", First, conv_transpose),
    op("ltorch.conv_transpose3d", &["torch.nn.functional.conv_transpose3d"], Pure, "a, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1", First, conv_transpose),
    op("ltorch.max_pool1d_with_indices", &["max_pool1d_with_indices"], Pure, "a, kernel_size, stride, padding, dilation, ceil_mode", Meta, max_pool1d_with_indices),
    op("ltorch.max_pool2d_with_indices", &["max_pool2d_with_indices"], Pure, "a, kernel_size, stride, padding, dilation, ceil_mode", Meta, max_pool2d_with_indices),
    op("ltorch.max_pool3d_with_indices", &["max_pool3d_with_indices"], Pure, "a, kernel_size, stride, padding, dilation, ceil_mode", Meta, max_pool3d_with_indices),
    op("ltorch.max_pool2d_with_indices_backward", &["max_pool2d_with_indices_backward"], Pure, "grad, a, kernel_size, stride, padding, dilation, ceil_mode, result1", First, pool_backward),
    op("ltorch.max_pool3d_with_indices_backward", &["max_pool3d_with_indices_backward"], Pure, "grad, a, kernel_size, stride, padding, dilation, ceil_mode, result1", First, pool_backward),
    op("ltorch.max_pool1d", &["torch.nn.functional.max_pool1d"], Pure, "a, /, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False", Meta, max_pool1d),
    op("ltorch.max_pool2d", &["torch.nn.functional.max_pool2d"], Pure, "a, /, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False", Meta, max_pool2d),
    op("ltorch.max_pool3d", &["torch.nn.functional.max_pool3d"], Pure, "a, /, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False", Meta, max_pool3d),
    op("ltorch.adaptive_avg_pool1d", &["torch.nn.functional.adaptive_avg_pool1d", "torch.adaptive_avg_pool1d"], Pure, "input, output_size", First, adaptive_avg_pool1d),
    op("ltorch.adaptive_avg_pool2d", &["torch.nn.functional.adaptive_avg_pool2d"], Pure, "a, /, output_size", First, adaptive_avg_pool2d),
    op("ltorch.adaptive_max_pool1d", &["torch.nn.functional.adaptive_max_pool1d"], Pure, "input, output_size, return_indices=False", First, adaptive_max_pool1d),
    op("ltorch.adaptive_max_pool2d", &["torch.nn.functional.adaptive_max_pool2d"], Pure, "input, output_size, return_indices=False", First, adaptive_max_pool2d),
    op("ltorch.unfold_im2col", &["torch.nn.functional.unfold"], Pure, "input, kernel_size, dilation=1, padding=0, stride=1", First, unfold_im2col),
    op("ltorch.fold_col2im", &["torch.nn.functional.fold"], Pure, "input, output_size, kernel_size, dilation=1, padding=0, stride=1", First, fold_col2im),
    op("ltorch.cosine_similarity", &["torch.nn.functional.cosine_similarity", "torch.cosine_similarity"], Pure, "x1, x2, dim=1, eps=1e-08", First, cosine_similarity),
    op("ltorch.bilinear", &["torch.nn.functional.bilinear", "torch.bilinear"], Pure, "input1, input2, weight, bias=None", First, bilinear),
    op("ltorch.adaptive_avg_pool2d_backward", &["torch.torch.ops.aten._adaptive_avg_pool2d_backward", "torch.ops.aten._adaptive_avg_pool2d_backward"], Pure, "grad, a", First, adaptive_avg_pool2d_backward),
    op("ltorch.embedding", &["torch.nn.functional.embedding"], Pure, "a, /, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False", Meta, embedding),
    // the prim: `padding_idx` keyword-only, -1 for none (it only matters to the backward)
    op("prims.embedding", &[], Pure, "a, /, weight, *, padding_idx=-1, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False", Meta, embedding),
    op("ltorch.embedding_backward", &["prims.embedding_backward", "torch.torch.ops.aten.embedding_backward", "torch.ops.aten.embedding_backward"], Pure, "grad, indices, num_weights, padding_idx, scale_grad_by_freq, sparse", First, embedding_backward),
    op("ltorch.layer_norm", &["torch.nn.functional.layer_norm"], Pure, "a, /, normalized_shape, weight=None, bias=None, eps=1e-05", First, like_input),
    op("ltorch.rms_norm", &["torch.nn.functional.rms_norm"], Pure, "a, /, normalized_shape, weight=None, eps=None", First, like_input),
    op("ltorch.batch_norm", &["torch.nn.functional.batch_norm"], Pure, "a, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05", First, like_input),
    op("ltorch.group_norm", &["torch.nn.functional.group_norm"], Pure, "a, /, num_groups, weight=None, bias=None, eps=1e-05", First, like_input),
    op("ltorch.instance_norm", &["torch.nn.functional.instance_norm"], Pure, "a, /, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True, momentum=0.1, eps=1e-05", First, like_input),
    op("ltorch.dropout", &["torch.nn.functional.dropout"], Random, "a, /, p=0.5, training=True, inplace=False", First, like_input),
    op("ltorch.glu", &["torch.nn.functional.glu"], Pure, "a, /, dim=-1", First, glu),
    op("ltorch.scaled_dot_product_attention", &["torch.nn.functional.scaled_dot_product_attention"], Pure, "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False", First, sdpa),
    op("ltorch.cross_entropy", &["torch.nn.functional.cross_entropy"], Pure, "a, /, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean', label_smoothing=0.0", First, loss),
    op("ltorch.nll_loss", &["torch.nn.functional.nll_loss"], Pure, "a, /, target, weight=None, ignore_index=-100, reduction='mean'", First, loss),
    op("ltorch.binary_cross_entropy_with_logits", &["torch.nn.functional.binary_cross_entropy_with_logits"], Pure, "input, target, weight=None, size_average=None, reduce=None, reduction='mean', pos_weight=None", First, pointwise_loss),
    op("ltorch.binary_cross_entropy", &["torch.nn.functional.binary_cross_entropy"], Pure, "input, target, weight=None, size_average=None, reduce=None, reduction='mean'", First, pointwise_loss),
    op("ltorch.l1_loss", &["torch.nn.functional.l1_loss"], Pure, "input, target, size_average=None, reduce=None, reduction='mean', weight=None", First, pointwise_loss),
    op("ltorch.smooth_l1_loss", &["torch.nn.functional.smooth_l1_loss"], Pure, "input, target, size_average=None, reduce=None, reduction='mean', beta=1.0", First, pointwise_loss),
    op("ltorch.kl_div", &["torch.nn.functional.kl_div"], Pure, "input, target, size_average=None, reduce=None, reduction='mean', log_target=False", First, pointwise_loss),
    op("ltorch.huber_loss", &["torch.nn.functional.huber_loss"], Pure, "input, target, reduction='mean', delta=1.0, weight=None", First, pointwise_loss),
    op("ltorch.mse_loss", &["torch.nn.functional.mse_loss"], Pure, "a, /, target, size_average=None, reduce=None, reduction='mean'", First, loss),
    op("ltorch.nll_loss_backward", &["torch_nll_loss_backward_impl"], Pure, "grad, a, target, weight, reduction, ignore_index, total_weight", First, nll_loss_backward),
    op("ltorch.log_softmax_backward", &["torch.torch.ops.aten._log_softmax_backward_data", "torch.ops.aten._log_softmax_backward_data"], Pure, "grad_output, output, dim, input_dtype", Meta, softmax_backward),
    op("ltorch.softmax_backward", &["torch.torch.ops.aten._softmax_backward_data", "torch.ops.aten._softmax_backward_data"], Pure, "grad_output, output, dim, input_dtype", Meta, softmax_backward),
    op("ltorch.take_along_dim", &["torch.take_along_dim", "Tensor.take_along_dim"], Pure, "a, /, indices, dim=None", First, take_along_dim),
    op("ltorch.one_hot", &["torch.nn.functional.one_hot"], Pure, "a, /, num_classes=-1", Meta, one_hot),
    op("ltorch.pad", &["torch.nn.functional.pad"], Pure, "a, /, pad, mode='constant', value=None", First, f_pad),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
