//! Shape, layout and copy ops: reshape, expand, slicing, padding, concatenation, dtype changes.

use super::op;
use crate::arg::Arg;
use crate::meta::{convert, dim_of, identity, many, norm_dim, one, permute_dims, promote};
use crate::registry::DTypeRule::{First, Meta};
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{DType, TensorType, Type};

type R = Result<MetaOut, String>;

/// A shape spec with at most one `-1`, resolved against `numel` elements.
fn infer_shape(op: &str, spec: &[i64], numel: usize, from: &[usize]) -> Result<Vec<usize>, String> {
    let mut known: usize = 1;
    let mut infer = None;
    for (i, d) in spec.iter().enumerate() {
        match *d {
            -1 if infer.is_none() => infer = Some(i),
            d if d >= 0 => {
                known = known
                    .checked_mul(d as usize)
                    .ok_or_else(|| format!("{op}: shape {spec:?} is too large"))?
            }
            _ => return Err(format!("{op}: invalid shape {spec:?}")),
        }
    }
    let mut shape: Vec<usize> = spec.iter().map(|d| (*d).max(0) as usize).collect();
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(format!("{op}: cannot reshape {from:?} to {spec:?}"));
        }
        shape[i] = numel / known;
    } else if known != numel {
        return Err(format!(
            "{op}: cannot reshape {from:?} ({numel} elements) to {spec:?}"
        ));
    }
    Ok(shape)
}

/// `reshape(a, *shape)` / `view`: one `-1` may be inferred.
fn reshape(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let spec = cx.ints_param("shape")?;
    let shape = infer_shape(cx.op, &spec, t.numel(), &t.shape)?;
    one(t.with_shape(shape))
}

/// `view(a, *shape)`, or `view(a, dtype)`: the same bits read as `dtype` (Thunder's
/// `prims.bitcast`), which keeps the shape when the widths agree.
fn view(cx: &MetaCx) -> R {
    let to = match cx.opt("shape") {
        Some(Arg::Tuple(items)) if items.len() == 1 => match &items[0] {
            Arg::DType(d, _) => Some(*d),
            _ => None,
        },
        _ => None,
    };
    let Some(to) = to else { return reshape(cx) };
    let t = cx.tensor_param("a")?;
    if to.size_bytes() != t.dtype.size_bytes() {
        return Err(format!(
            "{}: viewing {} as {to} changes the element width; tracepass reads only views of one width",
            cx.op, t.dtype
        ));
    }
    one(TensorType::new(&t.shape, to, t.device))
}

/// `prims.reshape(a, shape)`: the exact shape.
fn prims_reshape(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let spec = cx.ints_param("shape")?;
    if spec.contains(&-1) {
        return Err(format!(
            "{}: the shape must be explicit, got {spec:?}",
            cx.op
        ));
    }
    let shape = infer_shape(cx.op, &spec, t.numel(), &t.shape)?;
    one(t.with_shape(shape))
}

/// `expand(a, *shape)`: new leading dims, size-1 dims grown, `-1` keeps a dim.
fn expand(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let spec = cx.ints_param("shape")?;
    let rank = t.shape.len();
    if spec.len() < rank {
        return Err(format!(
            "{}: cannot expand {:?} to fewer dimensions {spec:?}",
            cx.op, t.shape
        ));
    }
    let lead = spec.len() - rank;
    let mut shape = Vec::with_capacity(spec.len());
    for (i, d) in spec.iter().enumerate() {
        let have = i.checked_sub(lead).map(|j| t.shape[j]);
        let out = match (*d, have) {
            (-1, Some(h)) => h,
            (d, _) if d < 0 => {
                return Err(format!("{}: invalid size {d} in {spec:?}", cx.op));
            }
            (d, Some(h)) if h == d as usize || h == 1 => d as usize,
            (d, None) => d as usize,
            (d, Some(h)) => {
                return Err(format!(
                    "{}: dimension {i} of size {h} cannot expand to {d}",
                    cx.op
                ))
            }
        };
        shape.push(out);
    }
    one(t.with_shape(shape))
}

fn unsqueeze(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let d = dim_of(cx, cx.int_param("dim")?, t.shape.len() + 1)?;
    let mut shape = t.shape.to_vec();
    shape.insert(d, 1);
    one(t.with_shape(shape))
}

/// `squeeze(a, dim=None)`: all size-1 dims, or the given ones that have size 1.
fn squeeze(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let rank = t.shape.len();
    let dims: Vec<usize> = match cx.opt("dim") {
        None => (0..rank).filter(|i| t.shape[*i] == 1).collect(),
        Some(_) => cx
            .ints_param("dim")?
            .into_iter()
            .map(|d| dim_of(cx, d, rank))
            .collect::<Result<_, _>>()?,
    };
    let shape: Vec<usize> = t
        .shape
        .iter()
        .enumerate()
        .filter(|(i, s)| !(dims.contains(i) && **s == 1))
        .map(|(_, s)| *s)
        .collect();
    one(t.with_shape(shape))
}

/// `flip(a, *dims)`: same shape; the dims must exist and be distinct.
fn flip(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let rank = t.shape.len();
    let mut seen = vec![false; rank.max(1)];
    for d in cx.ints_param("dims")? {
        let d = dim_of(cx, d, rank)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(format!("{}: dimension {d} appears twice", cx.op));
        }
    }
    one(t)
}

/// `triu/tril(a, diagonal=0, *, fill_value=None)`: a batch of matrices with the elements off
/// the kept triangle set to `fill_value` (zero).
fn triangle(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    if t.shape.len() < 2 {
        return Err(format!(
            "{}: a has {} dimensions, at least 2 are needed",
            cx.op,
            t.shape.len()
        ));
    }
    cx.int_param("diagonal")?;
    if cx.opt("fill_value").is_some() && cx.f64_param("fill_value").is_none() {
        return Err(format!("{}: `fill_value` must be a number", cx.op));
    }
    one(t)
}

/// `channel_shuffle(input, groups)`: `[N, C, *]` (at least 3 dimensions) with `C` divisible by
/// `groups`, the channels reordered, the shape kept.
fn channel_shuffle(cx: &MetaCx) -> R {
    let x = cx.tensor_param("input")?;
    let g = cx.int_param("groups")?;
    match x.shape.get(1) {
        Some(&c) if x.shape.len() >= 3 && g >= 1 && c % g as usize == 0 => one(x),
        _ => Err(format!(
            "{}: input {:?} (at least 3 dimensions, channels divisible by groups) with {g} groups",
            cx.op, x.shape
        )),
    }
}

/// `pixel_shuffle(input, upscale_factor)`: `[*, C * r * r, H, W]` to `[*, C, H * r, W * r]`.
fn pixel_shuffle(cx: &MetaCx) -> R {
    let t = cx.tensor_param("input")?;
    let r = cx.int_param("upscale_factor")?;
    let n = t.shape.len();
    let r = usize::try_from(r)
        .ok()
        .filter(|r| *r >= 1)
        .ok_or_else(|| format!("{}: upscale_factor {r} must be positive", cx.op))?;
    if n < 3 || !t.shape[n - 3].is_multiple_of(r * r) {
        return Err(format!(
            "{}: {:?} needs 3 dimensions or more and channels divisible by {}",
            cx.op,
            t.shape,
            r * r
        ));
    }
    let mut shape = t.shape.clone();
    shape[n - 3] /= r * r;
    shape[n - 2] *= r;
    shape[n - 1] *= r;
    one(t.with_shape(shape))
}

/// `pixel_unshuffle(input, downscale_factor)`: `[*, C, H * r, W * r]` to `[*, C * r * r, H, W]`.
fn pixel_unshuffle(cx: &MetaCx) -> R {
    let t = cx.tensor_param("input")?;
    let r = cx.int_param("downscale_factor")?;
    let n = t.shape.len();
    let r = usize::try_from(r)
        .ok()
        .filter(|r| *r >= 1)
        .ok_or_else(|| format!("{}: downscale_factor {r} must be positive", cx.op))?;
    if n < 3 || !t.shape[n - 2].is_multiple_of(r) || !t.shape[n - 1].is_multiple_of(r) {
        return Err(format!(
            "{}: {:?} needs 3 dimensions or more and height and width divisible by {r}",
            cx.op, t.shape
        ));
    }
    let mut shape = t.shape.clone();
    shape[n - 3] *= r * r;
    shape[n - 2] /= r;
    shape[n - 1] /= r;
    one(t.with_shape(shape))
}

/// `roll(input, shifts, dims=None)`: one shift per dim, or one shift of the flattened tensor.
fn roll(cx: &MetaCx) -> R {
    let t = cx.tensor_param("input")?;
    let shifts = cx.ints_param("shifts")?;
    match cx.opt("dims") {
        None if shifts.len() == 1 => {}
        None => {
            return Err(format!(
                "{}: {} shifts without dims (one shift rolls the flattened tensor)",
                cx.op,
                shifts.len()
            ))
        }
        Some(_) => {
            let dims = cx.ints_param("dims")?;
            if dims.len() != shifts.len() {
                return Err(format!(
                    "{}: {} shifts for {} dims",
                    cx.op,
                    shifts.len(),
                    dims.len()
                ));
            }
            for d in dims {
                dim_of(cx, d, t.shape.len())?;
            }
        }
    }
    one(t)
}

fn permute(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let dims = cx.ints_param("dims")?;
    one(t.with_shape(permute_dims(cx.op, &t.shape, &dims)?))
}

/// `movedim(a, source, destination)`: the dims of `source` move to `destination`; the others
/// keep their order in the places left.
fn movedim(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let rank = t.shape.len();
    let norm = |name: &str| -> Result<Vec<usize>, String> {
        cx.ints_param(name)?
            .into_iter()
            .map(|d| norm_dim(d, rank, cx.op))
            .collect()
    };
    let (src, dst) = (norm("source")?, norm("destination")?);
    if src.len() != dst.len() {
        return Err(format!(
            "{}: {} source dims but {} destinations",
            cx.op,
            src.len(),
            dst.len()
        ));
    }
    let mut perm: Vec<Option<usize>> = vec![None; rank];
    for (&s, &d) in src.iter().zip(&dst) {
        if perm[d].replace(s).is_some() {
            return Err(format!("{}: destination {d} repeats", cx.op));
        }
    }
    let mut rest = (0..rank).filter(|i| !src.contains(i));
    let perm: Vec<usize> = perm
        .into_iter()
        .map(|p| p.or_else(|| rest.next()))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{}: source dims repeat", cx.op))?;
    one(t.with_shape(perm.iter().map(|&p| t.shape[p]).collect::<Vec<usize>>()))
}

/// `Tensor.view_as(a, other)`: `a` in `other`'s shape.
fn view_as(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let other = cx.tensor_param("other")?;
    if t.numel() != other.numel() {
        return Err(format!(
            "{}: {:?} cannot view as {:?}",
            cx.op, t.shape, other.shape
        ));
    }
    one(t.with_shape(&other.shape))
}

fn prims_transpose(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let dims = cx.ints_param("permutation")?;
    one(t.with_shape(permute_dims(cx.op, &t.shape, &dims)?))
}

fn transpose(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let rank = t.shape.len();
    let a = dim_of(cx, cx.int_param("dim0")?, rank)?;
    let b = dim_of(cx, cx.int_param("dim1")?, rank)?;
    let mut shape = t.shape.to_vec();
    shape.swap(a, b);
    one(t.with_shape(shape))
}

/// The tensors of a sequence operand.
fn tensors(cx: &MetaCx, name: &str) -> Result<Vec<TensorType>, String> {
    let items = cx
        .param(name)?
        .as_seq()
        .ok_or_else(|| format!("{}: `{name}` must be a sequence of tensors", cx.op))?;
    if items.is_empty() {
        return Err(format!("{}: `{name}` is empty", cx.op));
    }
    items
        .iter()
        .map(|a| match cx.type_of(a)? {
            Type::Tensor(t) => Ok(t),
            other => Err(format!("{}: `{name}` holds {other}, not a tensor", cx.op)),
        })
        .collect()
}

/// `cat(tensors, dim=0)`: equal shapes but along `dim`; dtypes promote.
fn cat(cx: &MetaCx) -> R {
    let ts = tensors(cx, "tensors")?;
    let first = &ts[0];
    let rank = first.shape.len();
    let d = dim_of(cx, cx.int_param("dim")?, rank)?;
    let mut shape = first.shape.to_vec();
    let mut dtype = first.dtype;
    shape[d] = 0;
    for t in &ts {
        if t.shape.len() != rank
            || t.device != first.device
            || t.shape
                .iter()
                .enumerate()
                .any(|(i, s)| i != d && *s != first.shape[i])
        {
            return Err(format!(
                "{}: {} {:?} does not fit {} {:?} along dimension {d}",
                cx.op, t.device, t.shape, first.device, first.shape
            ));
        }
        shape[d] += t.shape[d];
        dtype = promote(dtype, t.dtype);
    }
    one(TensorType::new(shape, dtype, first.device))
}

/// `stack(tensors, dim=0)`: equal shapes, a new dimension.
fn stack(cx: &MetaCx) -> R {
    let ts = tensors(cx, "tensors")?;
    let first = &ts[0];
    let d = dim_of(cx, cx.int_param("dim")?, first.shape.len() + 1)?;
    let mut dtype = first.dtype;
    for t in &ts {
        if t.shape != first.shape || t.device != first.device {
            return Err(format!(
                "{}: {:?} and {:?} differ",
                cx.op, t.shape, first.shape
            ));
        }
        dtype = promote(dtype, t.dtype);
    }
    let mut shape = first.shape.to_vec();
    shape.insert(d, ts.len());
    one(TensorType::new(shape, dtype, first.device))
}

/// `split(a, size_or_sections, dim=0)`: pieces of one size (the last may be smaller) or of
/// the listed sizes.
fn split(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let d = dim_of(cx, cx.int_param("dim")?, t.shape.len())?;
    let n = t.shape[d];
    let sizes: Vec<usize> = match cx.param("size_or_sections")? {
        Arg::Tuple(_) | Arg::List(_) => {
            let s = cx.ints_param("size_or_sections")?;
            if s.iter().any(|x| *x < 0) || s.iter().sum::<i64>() != n as i64 {
                return Err(format!("{}: sections {s:?} do not add up to {n}", cx.op));
            }
            s.into_iter().map(|x| x as usize).collect()
        }
        _ => {
            let size = cx.int_param("size_or_sections")?;
            if size <= 0 {
                return Err(format!(
                    "{}: split size must be positive, got {size}",
                    cx.op
                ));
            }
            let size = size as usize;
            let mut v = vec![size; n / size];
            if n % size != 0 || n == 0 {
                v.push(n % size);
            }
            v
        }
    };
    many(
        sizes
            .into_iter()
            .map(|s| {
                let mut shape = t.shape.to_vec();
                shape[d] = s;
                t.with_shape(shape)
            })
            .collect(),
    )
}

/// `chunk(a, chunks, dim=0)`: pieces of `ceil(n / chunks)`.
fn chunk(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let d = dim_of(cx, cx.int_param("dim")?, t.shape.len())?;
    let chunks = cx.int_param("chunks")?;
    if chunks <= 0 {
        return Err(format!("{}: chunks must be positive, got {chunks}", cx.op));
    }
    let n = t.shape[d];
    let size = n.div_ceil(chunks as usize).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < n || (n == 0 && out.is_empty()) {
        let s = size.min(n - start);
        let mut shape = t.shape.to_vec();
        shape[d] = s;
        out.push(t.with_shape(shape));
        start += size;
        if n == 0 {
            break;
        }
    }
    many(out)
}

/// `prims.slice_prim(a, start_indices, end_indices, strides=None)`.
fn slice_prim(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let rank = t.shape.len();
    let start = cx.ints_param("start_indices")?;
    let end = cx.ints_param("end_indices")?;
    let strides = match cx.opt("strides") {
        None => vec![1; rank],
        Some(_) => cx.ints_param("strides")?,
    };
    if start.len() != rank || end.len() != rank || strides.len() != rank {
        return Err(format!(
            "{}: {rank} dimensions but {} starts, {} ends, {} strides",
            cx.op,
            start.len(),
            end.len(),
            strides.len()
        ));
    }
    let mut shape = Vec::with_capacity(rank);
    for i in 0..rank {
        let (s, e, st, n) = (start[i], end[i], strides[i], t.shape[i] as i64);
        if s < 0 || s > e || e > n || st < 1 {
            return Err(format!(
                "{}: bad slice {s}:{e}:{st} of dimension {i} (size {n})",
                cx.op
            ));
        }
        shape.push(((e - s + st - 1) / st) as usize);
    }
    one(t.with_shape(shape))
}

/// `prims.pad(a, padding_value, padding_config)`: per dimension `(lo, hi, interior)`; `lo`
/// and `hi` may be negative (cropping).
fn pad(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let config = cx
        .param("padding_config")?
        .as_seq()
        .ok_or_else(|| format!("{}: padding_config must be a sequence", cx.op))?;
    if config.len() != t.shape.len() {
        return Err(format!(
            "{}: {} dimensions but {} padding entries",
            cx.op,
            t.shape.len(),
            config.len()
        ));
    }
    let mut shape = Vec::with_capacity(config.len());
    for (i, (c, n)) in config.iter().zip(t.shape.iter()).enumerate() {
        let Some([lo, hi, interior]) = c.as_int_list().and_then(|v| <[i64; 3]>::try_from(v).ok())
        else {
            return Err(format!(
                "{}: padding entry {i} must be (lo, hi, interior)",
                cx.op
            ));
        };
        let n = *n as i64;
        if interior < 0 {
            return Err(format!("{}: negative interior padding {interior}", cx.op));
        }
        let len = n + (n - 1).max(0) * interior + lo + hi;
        if len < 0 {
            return Err(format!(
                "{}: dimension {i} would have length {len} after padding",
                cx.op
            ));
        }
        shape.push(len as usize);
    }
    one(t.with_shape(shape))
}

/// Python's slice length for a dimension of size `n` (steps are positive for tensors).
fn slice_len(op: &str, parts: &[Option<i64>; 3], n: usize) -> Result<usize, String> {
    let n = n as i64;
    let step = parts[2].unwrap_or(1);
    if step <= 0 {
        return Err(format!("{op}: slice step must be positive, got {step}"));
    }
    let clamp = |v: i64| {
        let v = if v < 0 { v + n } else { v };
        v.clamp(0, n)
    };
    let start = parts[0].map_or(0, clamp);
    let stop = parts[1].map_or(n, clamp);
    Ok(if stop <= start {
        0
    } else {
        ((stop - start + step - 1) / step) as usize
    })
}

/// `a[key]` with basic indexing (ints, slices, `None`, `...`) and index tensors (advanced
/// indexing, `setitem.rs`); a boolean mask or a list trusts the type the trace declares.
fn getitem(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let key = cx.param("key")?;
    let items: Vec<&Arg> = match key {
        Arg::Tuple(items) => items.iter().collect(),
        other => vec![other],
    };
    if items
        .iter()
        .any(|a| matches!(a, Arg::List(_) | Arg::Bool(_)))
    {
        return Ok(MetaOut::Declared);
    }
    if items.iter().any(|a| matches!(a, Arg::Value(_))) {
        // index tensors: PyTorch's advanced indexing; a boolean mask selects a number of
        // elements known at run time only, so its declared type is trusted
        return match super::setitem::selected(cx, &t, key)? {
            super::setitem::Selected::Shape(shape) => one(t.with_shape(shape)),
            super::setitem::Selected::Masked { .. } => Ok(MetaOut::Declared),
        };
    }
    let consumed = items
        .iter()
        .filter(|a| matches!(a, Arg::Int(_) | Arg::Slice(_)))
        .count();
    if consumed > t.shape.len() {
        return Err(format!(
            "{}: {consumed} indices for a tensor of rank {}",
            cx.op,
            t.shape.len()
        ));
    }
    let mut dim = 0;
    let mut shape = Vec::new();
    let mut saw_ellipsis = false;
    for a in items {
        match a {
            Arg::Int(i) => {
                let n = t.shape[dim] as i64;
                if *i >= n || *i < -n {
                    return Err(format!("{}: index {i} out of range for size {n}", cx.op));
                }
                dim += 1;
            }
            Arg::Slice(parts) => {
                shape.push(slice_len(cx.op, parts, t.shape[dim])?);
                dim += 1;
            }
            Arg::None => shape.push(1),
            Arg::Ellipsis if !saw_ellipsis => {
                saw_ellipsis = true;
                let skip = t.shape.len() - consumed;
                shape.extend_from_slice(&t.shape[dim..dim + skip]);
                dim += skip;
            }
            other => {
                return Err(format!("{}: unsupported index {other:?}", cx.op));
            }
        }
    }
    shape.extend_from_slice(&t.shape[dim..]);
    one(t.with_shape(shape))
}

/// `flatten(a, start_dim=0, end_dim=-1)`.
fn flatten(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    if t.shape.is_empty() {
        return one(t.with_shape([1]));
    }
    let rank = t.shape.len();
    let s = dim_of(cx, cx.int_param("start_dim")?, rank)?;
    let e = dim_of(cx, cx.int_param("end_dim")?, rank)?;
    if s > e {
        return Err(format!("{}: start_dim {s} is after end_dim {e}", cx.op));
    }
    let mut shape = t.shape[..s].to_vec();
    shape.push(t.shape[s..=e].iter().product());
    shape.extend_from_slice(&t.shape[e + 1..]);
    one(t.with_shape(shape))
}

/// `Tensor.to(a, other_tensor)` takes the other tensor's dtype and device; other forms name
/// them.
fn to(cx: &MetaCx) -> R {
    if let Some(a @ Arg::Value(_)) = cx.opt("tensor_dtype_or_device") {
        if let (Type::Tensor(like), Ok(t)) = (cx.type_of(a)?, cx.tensor_param("a")) {
            return one(TensorType::new(&t.shape[..], like.dtype, like.device));
        }
    }
    convert(cx)
}

/// `Tensor.int()`, `Tensor.long()`, ...: PyTorch's dtype methods, each `self.to(dtype)` with
/// its fixed dtype (`memory_format` changes no value). Thunder 0.2.6 has a symbol for `long`
/// only; it prints the others as the torch calls they are.
fn to_fixed(cx: &MetaCx, dtype: DType) -> R {
    let t = cx.tensor_param("a")?;
    one(TensorType::new(&t.shape[..], dtype, t.device))
}
fn to_i64(cx: &MetaCx) -> R {
    to_fixed(cx, DType::I64)
}
fn to_i32(cx: &MetaCx) -> R {
    to_fixed(cx, DType::I32)
}
fn to_f32(cx: &MetaCx) -> R {
    to_fixed(cx, DType::F32)
}
fn to_f64(cx: &MetaCx) -> R {
    to_fixed(cx, DType::F64)
}
fn to_f16(cx: &MetaCx) -> R {
    to_fixed(cx, DType::F16)
}
fn to_bf16(cx: &MetaCx) -> R {
    to_fixed(cx, DType::BF16)
}
fn to_bool(cx: &MetaCx) -> R {
    to_fixed(cx, DType::Bool)
}

/// `Tensor.type_as(a, other)`: `a` in `other`'s dtype (and device, as Thunder's `type_as`).
fn type_as(cx: &MetaCx) -> R {
    let t = cx.tensor_param("a")?;
    let like = cx.tensor_param("other")?;
    one(TensorType::new(&t.shape[..], like.dtype, like.device))
}

const OPS: &[OpSpec] = &[
    op("ltorch.reshape", &["torch.reshape", "Tensor.reshape"], Pure, "a, /, *shape", First, reshape),
    op("ltorch.view", &["prims.view", "Tensor.view"], Pure, "a, /, *shape", Meta, view),
    op("prims.reshape", &["torch_prims_reshape_impl"], Pure, "a, /, shape", First, prims_reshape),
    op("ltorch.expand", &["Tensor.expand", "torch.expand"], Pure, "a, /, *shape", First, expand),
    op("ltorch.unsqueeze", &["torch.unsqueeze", "Tensor.unsqueeze"], Pure, "a, /, dim", First, unsqueeze),
    op("ltorch.squeeze", &["prims.squeeze", "torch.squeeze", "Tensor.squeeze"], Pure, "a, /, dim=None", First, squeeze),
    op("ltorch.flip", &["prims.flip", "torch.flip"], Pure, "a, /, *dims", First, flip),
    op("ltorch.triu", &["torch.triu", "Tensor.triu"], Pure, "a, /, diagonal=0, *, fill_value=None", First, triangle),
    op("ltorch.tril", &["torch.tril", "Tensor.tril"], Pure, "a, /, diagonal=0, *, fill_value=None", First, triangle),
    op("ltorch.pixel_shuffle", &["torch.nn.functional.pixel_shuffle", "torch.pixel_shuffle"], Pure, "input, upscale_factor", First, pixel_shuffle),
    op("ltorch.channel_shuffle", &["torch.nn.functional.channel_shuffle", "torch.channel_shuffle", "torch.nn.functional.native_channel_shuffle", "torch.native_channel_shuffle"], Pure, "input, groups", First, channel_shuffle),
    op("ltorch.pixel_unshuffle", &["torch.nn.functional.pixel_unshuffle", "torch.pixel_unshuffle"], Pure, "input, downscale_factor", First, pixel_unshuffle),
    op("ltorch.roll", &["torch.roll", "Tensor.roll"], Pure, "input, shifts, dims=None", First, roll),
    op("ltorch.permute", &["torch.permute", "Tensor.permute"], Pure, "a, /, *dims", First, permute),
    op("ltorch.movedim", &["torch.movedim", "Tensor.movedim"], Pure, "a, /, source, destination", First, movedim),
    op("ltorch.view_as", &["Tensor.view_as"], Pure, "a, other, /", First, view_as),
    op("prims.transpose", &[], Pure, "a, /, permutation", First, prims_transpose),
    op("ltorch.transpose", &["torch.transpose", "Tensor.transpose"], Pure, "a, /, dim0, dim1", First, transpose),
    op("ltorch.flatten", &["torch.flatten"], Pure, "a, /, start_dim=0, end_dim=-1", First, flatten),
    op("ltorch.cat", &["prims.cat", "torch.cat"], Pure, "tensors, dim=0", Meta, cat),
    op("ltorch.stack", &["torch.stack"], Pure, "tensors, dim=0", Meta, stack),
    op("ltorch.split", &["torch.split"], Pure, "a, size_or_sections, /, dim=0", First, split),
    op("ltorch.chunk", &["torch.chunk"], Pure, "a, chunks, /, dim=0", First, chunk),
    op("prims.slice_prim", &["torch_slice_prim_impl"], Pure, "a, /, start_indices, end_indices, strides=None", First, slice_prim),
    op("prims.pad", &["torch_pad_prim_impl"], Pure, "a, /, padding_value, padding_config", First, pad),
    op("ltorch.getitem", &["Tensor.__getitem__"], Pure, "a, /, key", First, getitem),
    op("ltorch.contiguous", &["Tensor.contiguous", "torch.contiguous"], Pure, "a, /, *, memory_format=None", First, identity),
    op("ltorch.clone", &["prims.clone", "torch.clone", "Tensor.clone"], Pure, "a, /, *, memory_format=None", First, identity),
    // registered by Thunder as a torch fallback: the value, with no gradient (`detach_vjp`)
    op("ltorch.detach", &["torch.detach", "Tensor.detach"], Pure, "a, /", First, identity),
    op("prims.shallow_copy", &["shallow_copy"], Pure, "a, /", First, identity),
    op("ltorch.to", &["Tensor.to", "torch.Tensor.to", "torch.to"], Pure, "a, tensor_dtype_or_device=None, optional_positional_dtype=None, /, *, device=None, dtype=None, copy=False, memory_format=None", Meta, to),
    op("prims.convert_element_type", &[], Pure, "a, /, dtype", Meta, convert),
    op("ltorch.long", &["Tensor.long", "torch.Tensor.long"], Pure, "a, /, memory_format=None", Meta, to_i64),
    op("ltorch.int", &["Tensor.int", "torch.Tensor.int"], Pure, "a, /, memory_format=None", Meta, to_i32),
    op("ltorch.float", &["Tensor.float", "torch.Tensor.float"], Pure, "a, /, memory_format=None", Meta, to_f32),
    op("ltorch.double", &["Tensor.double", "torch.Tensor.double"], Pure, "a, /, memory_format=None", Meta, to_f64),
    op("ltorch.half", &["Tensor.half", "torch.Tensor.half"], Pure, "a, /, memory_format=None", Meta, to_f16),
    op("ltorch.bfloat16", &["Tensor.bfloat16", "torch.Tensor.bfloat16"], Pure, "a, /, memory_format=None", Meta, to_bf16),
    op("ltorch.bool", &["Tensor.bool", "torch.Tensor.bool"], Pure, "a, /, memory_format=None", Meta, to_bool),
    op("ltorch.type_as", &["Tensor.type_as", "torch.Tensor.type_as"], Pure, "a, other, /", Meta, type_as),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
