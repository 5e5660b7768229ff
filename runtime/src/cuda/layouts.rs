//! Host-side planning of the CUDA kernels' launches: output shapes, the strided views layout
//! ops gather through, and the geometry structs the kernels take, with the CPU kernels'
//! argument checks and messages. Pure functions over shapes, tested without a GPU.

use super::kernels::{Layout, MAX_RANK};
use super::model_kernels::{ConvLayout, PadLayout, PoolLayout, ScatterLayout, MAX_SPATIAL};
use crate::exec::kernel::LossReduction;
use crate::tensor::contiguous_strides;

/// A strided view of a contiguous tensor: the element it starts at, its shape and strides
/// (elements; negative for flips, 0 for expanded dims).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub offset: i64,
    pub shape: Vec<usize>,
    pub strides: Vec<i64>,
}

impl View {
    /// The whole of a contiguous tensor of `shape`.
    pub fn of(shape: &[usize]) -> View {
        View {
            offset: 0,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape)
                .into_iter()
                .map(|s| s as i64)
                .collect(),
        }
    }

    #[cfg(test)]
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The gather kernel's layout (stride_a); an error above [`MAX_RANK`].
    pub fn layout(&self) -> Result<Layout, String> {
        let rank = self.shape.len();
        if rank > MAX_RANK {
            return Err(format!(
                "rank {rank} of {:?} is above the cuda limit {MAX_RANK}",
                self.shape
            ));
        }
        let mut l = Layout {
            rank: rank as i32,
            ..Layout::default()
        };
        for d in 0..rank {
            l.shape[d] = self.shape[d] as i64;
            l.stride_a[d] = self.strides[d];
        }
        Ok(l)
    }
}

/// Normalizes a possibly negative dim (as `cpu::layout::norm_dim`).
pub fn norm_dim(d: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let n = if d < 0 { d + r } else { d };
    if n < 0 || n >= r {
        return Err(format!(
            "dimension {d} is out of range for a tensor of rank {rank}"
        ));
    }
    Ok(n as usize)
}

/// The strides a tensor of `shape` is read with when broadcast to `out` (0 where it repeats).
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<i64> {
    let own = contiguous_strides(shape);
    let lead = out.len() - shape.len().min(out.len());
    (0..out.len())
        .map(|i| {
            if i < lead || shape[i - lead] == 1 {
                0
            } else {
                own[i - lead] as i64
            }
        })
        .collect()
}

/// The broadcast shape of several shapes.
pub fn broadcast_all(shapes: &[&[usize]]) -> Result<Vec<usize>, String> {
    let mut out: Vec<usize> = Vec::new();
    for s in shapes {
        out = tracepass_ir::broadcast_shapes(&out, s)
            .ok_or_else(|| format!("shapes {shapes:?} do not broadcast"))?;
    }
    Ok(out)
}

/// A two-operand broadcast layout over `out` (a missing operand reads nothing).
pub fn binary_layout(
    a: Option<&[usize]>,
    b: Option<&[usize]>,
    out: &[usize],
) -> Result<Layout, String> {
    if out.len() > MAX_RANK {
        return Err(format!(
            "rank {} is above the cuda limit {MAX_RANK}",
            out.len()
        ));
    }
    let mut l = Layout {
        rank: out.len() as i32,
        ..Layout::default()
    };
    let (sa, sb) = (
        a.map(|s| broadcast_strides(s, out)).unwrap_or_default(),
        b.map(|s| broadcast_strides(s, out)).unwrap_or_default(),
    );
    for (i, &o) in out.iter().enumerate() {
        l.shape[i] = o as i64;
        l.stride_a[i] = sa.get(i).copied().unwrap_or(0);
        l.stride_b[i] = sb.get(i).copied().unwrap_or(0);
    }
    Ok(l)
}

/// `expand`: the CPU's plan (`cpu::layout::expand_dims`) over a contiguous tensor.
pub fn expand(shape: &[usize], target: &[i64]) -> Result<View, String> {
    let st: Vec<isize> = View::of(shape)
        .strides
        .iter()
        .map(|&s| s as isize)
        .collect();
    let (shape, strides) = crate::cpu::layout::expand_dims(shape, &st, target)?;
    Ok(View {
        offset: 0,
        shape: shape.to_vec(),
        strides: strides.into_iter().map(|s| s as i64).collect(),
    })
}

/// `slice` with steps (as `cpu::layout::slice`).
pub fn slice(shape: &[usize], start: &[i64], end: &[i64], step: &[i64]) -> Result<View, String> {
    let rank = shape.len();
    if start.len() != rank || end.len() != rank || step.len() != rank {
        return Err(format!(
            "slice: start {start:?}, end {end:?} and strides {step:?} must each have {rank} entries for {shape:?}"
        ));
    }
    let own = View::of(shape).strides;
    let mut v = View {
        offset: 0,
        shape: Vec::with_capacity(rank),
        strides: Vec::with_capacity(rank),
    };
    for d in 0..rank {
        let (s, e, k, n) = (start[d], end[d], step[d], shape[d] as i64);
        if s < 0 || s > e || e > n || k < 1 {
            return Err(format!(
                "slice: dim {d} of {shape:?}: start {s}, end {e}, stride {k} is not a valid slice of {n}"
            ));
        }
        let len = (e - s + k - 1) / k;
        v.shape.push(len as usize);
        v.strides.push(own[d] * k);
        if len > 0 {
            v.offset += s * own[d];
        }
    }
    Ok(v)
}

/// `split` into parts of `sizes` along `dim`: one view per part.
pub fn split(shape: &[usize], sizes: &[usize], dim: i64) -> Result<Vec<View>, String> {
    let d = norm_dim(dim, shape.len())?;
    if sizes.iter().sum::<usize>() != shape[d] {
        return Err(format!(
            "split: sizes {sizes:?} do not add up to dim {d}'s size {}",
            shape[d]
        ));
    }
    let mut at = 0i64;
    sizes
        .iter()
        .map(|&len| {
            let start: Vec<i64> = (0..shape.len())
                .map(|i| if i == d { at } else { 0 })
                .collect();
            let mut end: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
            end[d] = at + len as i64;
            at += len as i64;
            slice(shape, &start, &end, &vec![1; shape.len()])
        })
        .collect()
}

/// `flip` over `dims` (as `cpu::layout::flip`).
pub fn flip(shape: &[usize], dims: &[i64]) -> Result<View, String> {
    let rank = shape.len();
    let mut v = View::of(shape);
    let mut seen = vec![false; rank];
    for &d in dims {
        let d = norm_dim(d, rank)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(format!("flip: dim {d} is listed twice in {dims:?}"));
        }
        if shape[d] > 0 {
            v.offset += (shape[d] as i64 - 1) * v.strides[d];
        }
        v.strides[d] = -v.strides[d];
    }
    Ok(v)
}

/// The shape after `squeeze` (as `cpu::layout::squeeze`: listed dims of size 1 go, others
/// stay; `None` drops every size-1 dim).
pub fn squeeze(shape: &[usize], dims: Option<&[i64]>) -> Result<Vec<usize>, String> {
    let rank = shape.len();
    let mut drop = vec![false; rank];
    match dims {
        None => drop.iter_mut().zip(shape).for_each(|(d, &n)| *d = n == 1),
        Some(ds) => {
            for &d in ds {
                if rank == 0 {
                    norm_dim(d, 1)?;
                    continue;
                }
                let d = norm_dim(d, rank)?;
                drop[d] = shape[d] == 1;
            }
        }
    }
    Ok((0..rank).filter(|&i| !drop[i]).map(|i| shape[i]).collect())
}

/// The shape after `unsqueeze(dim)`.
pub fn unsqueeze(shape: &[usize], dim: i64) -> Result<Vec<usize>, String> {
    let d = norm_dim(dim, shape.len() + 1)?;
    let mut s = shape.to_vec();
    s.insert(d, 1);
    Ok(s)
}

/// `prims.pad`'s output shape and kernel layout (as `cpu::layout::pad`).
pub fn pad(shape: &[usize], config: &[(i64, i64, i64)]) -> Result<(Vec<usize>, PadLayout), String> {
    let rank = shape.len();
    if config.len() != rank {
        return Err(format!(
            "pad: {} (lo, hi, interior) triples for a tensor of rank {rank} ({shape:?})",
            config.len()
        ));
    }
    if rank > MAX_RANK {
        return Err(format!(
            "pad: rank {rank} is above the cuda limit {MAX_RANK}"
        ));
    }
    let strides = contiguous_strides(shape);
    let mut l = PadLayout {
        rank: rank as i32,
        ..PadLayout::default()
    };
    let mut out = Vec::with_capacity(rank);
    for (d, (&n, &(lo, hi, interior))) in shape.iter().zip(config).enumerate() {
        if interior < 0 {
            return Err(format!(
                "pad: dim {d} has negative interior padding {interior}"
            ));
        }
        let n = n as i64;
        let len = lo + hi + n + (n - 1).max(0) * interior;
        if len < 0 {
            return Err(format!(
                "pad: dim {d} of size {n} padded by ({lo}, {hi}, {interior}) has negative size {len}"
            ));
        }
        out.push(len as usize);
        l.out_shape[d] = len;
        l.in_shape[d] = n;
        l.in_stride[d] = strides[d] as i64;
        l.lo[d] = lo;
        l.step[d] = interior + 1;
    }
    Ok((out, l))
}

/// Where each input of a `cat` along `dim` goes: the output shape, and per input its
/// `(block_in, at)` in rows of `block_out` (the output's `total * inner`). Inputs of shape
/// `[0]` are skipped, as on the CPU (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatPlan {
    pub shape: Vec<usize>,
    pub block_out: usize,
    pub parts: Vec<Option<(usize, usize)>>,
}

pub fn cat(shapes: &[&[usize]], dim: i64) -> Result<CatPlan, String> {
    let live: Vec<&[usize]> = shapes.iter().copied().filter(|s| *s != [0]).collect();
    let Some(first) = live.first() else {
        return Ok(CatPlan {
            shape: vec![0],
            block_out: 0,
            parts: vec![None; shapes.len()],
        });
    };
    let rank = first.len();
    if rank == 0 {
        return Err("cat: zero-dimensional tensors cannot be concatenated".into());
    }
    let d = norm_dim(dim, rank)?;
    let mut total = 0;
    for (i, s) in live.iter().enumerate() {
        let ok = s.len() == rank && (0..rank).all(|k| k == d || s[k] == first[k]);
        if !ok {
            return Err(format!(
                "cat: tensor {i} has shape {s:?}, which does not fit {first:?} along dim {d}"
            ));
        }
        total += s[d];
    }
    let inner: usize = first[d + 1..].iter().product();
    let mut shape = first.to_vec();
    shape[d] = total;
    let mut at = 0;
    let parts = shapes
        .iter()
        .map(|s| {
            if *s == [0] {
                return None;
            }
            let block = s[d] * inner;
            let p = (block, at);
            at += block;
            Some(p)
        })
        .collect();
    Ok(CatPlan {
        shape,
        block_out: total * inner,
        parts,
    })
}

fn per_dim(v: &[i64], d: usize, what: &str, min: i64) -> Result<Vec<i64>, String> {
    let full: Vec<i64> = match v.len() {
        1 => vec![v[0]; d],
        n if n == d => v.to_vec(),
        _ => {
            return Err(format!(
                "convolution: {what} {v:?} must have 1 or {d} entries"
            ))
        }
    };
    if let Some(bad) = full.iter().find(|&&x| x < min) {
        return Err(format!(
            "convolution: {what} {v:?} has {bad}, below the minimum {min}"
        ));
    }
    Ok(full)
}

/// A convolution's output shape and geometry (the checks of `cpu::conv::convolution`).
pub fn convolution(
    x: &[usize],
    w: &[usize],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    groups: i64,
) -> Result<(Vec<usize>, ConvLayout), String> {
    if x.len() < 3 || w.len() != x.len() {
        return Err(format!(
            "convolution: input {x:?} must be [N, C, *spatial] and the weight {w:?} [C_out, C_in/groups, *kernel] of the same rank"
        ));
    }
    let d = x.len() - 2;
    if d > MAX_SPATIAL {
        return Err(format!(
            "convolution: {d} spatial dims are above the cuda limit {MAX_SPATIAL}"
        ));
    }
    if groups < 1 {
        return Err(format!(
            "convolution: groups must be positive, got {groups}"
        ));
    }
    let g = groups as usize;
    let (n, cin, cout) = (x[0], x[1], w[0]);
    if cin % g != 0 || cout % g != 0 || w[1] * g != cin {
        return Err(format!(
            "convolution: input {x:?} and weight {w:?} do not fit {groups} groups"
        ));
    }
    let stride = per_dim(stride, d, "stride", 1)?;
    let padding = per_dim(padding, d, "padding", 0)?;
    let dilation = per_dim(dilation, d, "dilation", 1)?;
    let mut l = ConvLayout {
        nd: d as i32,
        groups: i32::try_from(groups).map_err(|_| format!("convolution: {groups} groups"))?,
        n: n as i64,
        cin: cin as i64,
        cout: cout as i64,
        ..ConvLayout::default()
    };
    let mut shape = vec![n, cout];
    for j in 0..d {
        let (sp, k) = (x[j + 2] as i64, w[j + 2] as i64);
        let span = dilation[j] * (k.max(1) - 1) + 1;
        let padded = sp + 2 * padding[j];
        if k == 0 || padded < span {
            return Err(format!(
                "convolution: dim {j}: input {sp} padded by {} is smaller than the dilated kernel {span}",
                padding[j]
            ));
        }
        let o = (padded - span) / stride[j] + 1;
        shape.push(o as usize);
        l.input[j] = sp;
        l.kernel[j] = k;
        l.out[j] = o;
        l.stride[j] = stride[j];
        l.padding[j] = padding[j];
        l.dilation[j] = dilation[j];
    }
    Ok((shape, l))
}

/// `max_pool2d`'s output shape and geometry (as `cpu::pool`: an input of `[N, C, H, W]` or
/// `[C, H, W]`).
pub fn max_pool2d(
    x: &[usize],
    p: &crate::cpu::pool::Pool2d,
) -> Result<(Vec<usize>, PoolLayout), String> {
    let (planes, h, w) = match x {
        [n, c, h, w] => (n * c, *h, *w),
        [c, h, w] => (*c, *h, *w),
        _ => {
            return Err(format!(
                "max_pool2d: the input must be 3-d or 4-d, got {x:?}"
            ))
        }
    };
    let out_len = |d: usize, input: usize| -> Result<i64, String> {
        let (k, s, pd, dl) = (
            p.kernel[d] as i64,
            p.stride[d] as i64,
            p.padding[d] as i64,
            p.dilation[d] as i64,
        );
        let num = input as i64 + 2 * pd - dl * (k - 1) - 1 + if p.ceil_mode { s - 1 } else { 0 };
        let mut out = num.div_euclid(s) + 1;
        if p.ceil_mode && (out - 1) * s >= input as i64 + pd {
            out -= 1;
        }
        if out < 1 {
            return Err(format!(
                "max_pool2d: an input of size {input} is too small for {p:?} (output size {out})"
            ));
        }
        Ok(out)
    };
    let (oh, ow) = (out_len(0, h)?, out_len(1, w)?);
    let mut shape = x.to_vec();
    let r = shape.len();
    shape[r - 2] = oh as usize;
    shape[r - 1] = ow as usize;
    let i = |v: [usize; 2]| [v[0] as i64, v[1] as i64];
    Ok((
        shape,
        PoolLayout {
            planes: planes as i64,
            h: h as i64,
            w: w as i64,
            oh,
            ow,
            kernel: i(p.kernel),
            stride: i(p.stride),
            padding: i(p.padding),
            dilation: i(p.dilation),
        },
    ))
}

/// Which dims `var_mean` reduces: the CPU kernel's own plan.
pub use crate::cpu::var_mean::row_reduction as var_mean;

/// `arange`'s element count (the checks of `cpu::fill::arange`).
pub fn arange_len(start: f64, end: f64, step: f64) -> Result<usize, String> {
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
        return Err(format!(
            "arange({start}, {end}, {step}): the bounds must be finite and the step nonzero"
        ));
    }
    if (step > 0.0 && end < start) || (step < 0.0 && end > start) {
        return Err(format!(
            "arange({start}, {end}, {step}): the bounds are inconsistent with the step's sign"
        ));
    }
    Ok(((end - start) / step).ceil().max(0.0) as usize)
}

/// The geometry of a `take_along_dim` launch: the output shape, the layout (`sa`: `a`'s
/// strides, 0 along `dim` and where `a` broadcasts; `sb`: the indices' strides, 0 where they
/// broadcast) and `a`'s stride and size along `dim`. The checks and messages of
/// `cpu::loss_grad::take_along_dim`; without a dim, the flattened `a` (rank 1).
#[derive(Clone, Debug)]
pub struct TakePlan {
    pub shape: Vec<usize>,
    pub layout: Layout,
    pub dim_stride: i64,
    pub dim_size: i64,
}

pub fn take_along_dim(a: &[usize], idx: &[usize], dim: Option<usize>) -> Result<TakePlan, String> {
    let Some(dim) = dim else {
        let n: usize = idx.iter().product();
        let mut layout = Layout {
            rank: 1,
            ..Layout::default()
        };
        layout.shape[0] = n as i64;
        layout.stride_b[0] = 1;
        return Ok(TakePlan {
            shape: vec![n],
            layout,
            dim_stride: 1,
            dim_size: a.iter().product::<usize>() as i64,
        });
    };
    if a.len() != idx.len() || dim >= a.len() {
        return Err(format!(
            "take_along_dim: a {a:?} and indices {idx:?} along dim {dim} do not match"
        ));
    }
    let mut shape = Vec::with_capacity(a.len());
    for d in 0..a.len() {
        shape.push(if d == dim {
            idx[d]
        } else if a[d] == idx[d] || idx[d] == 1 {
            a[d]
        } else if a[d] == 1 {
            idx[d]
        } else {
            return Err(format!(
                "take_along_dim: a {a:?} and indices {idx:?} do not broadcast outside dim {dim}"
            ));
        });
    }
    if shape.len() > MAX_RANK {
        return Err(format!(
            "take_along_dim: rank {} is above the cuda limit {MAX_RANK}",
            shape.len()
        ));
    }
    let (sa, si) = (contiguous_strides(a), contiguous_strides(idx));
    let mut layout = Layout {
        rank: shape.len() as i32,
        ..Layout::default()
    };
    for d in 0..shape.len() {
        layout.shape[d] = shape[d] as i64;
        layout.stride_a[d] = if d == dim || a[d] == 1 {
            0
        } else {
            sa[d] as i64
        };
        layout.stride_b[d] = if idx[d] == 1 { 0 } else { si[d] as i64 };
    }
    Ok(TakePlan {
        shape,
        layout,
        dim_stride: sa[dim] as i64,
        dim_size: a[dim] as i64,
    })
}

/// A shape as the kernels see it: a 0-d tensor as rank 1 of size 1 (its one slice), and an
/// error above [`MAX_RANK`].
fn kernel_shape(what: &str, shape: &[usize]) -> Result<Vec<usize>, String> {
    if shape.len() > MAX_RANK {
        return Err(format!(
            "{what}: rank {} of {shape:?} is above the cuda limit {MAX_RANK}",
            shape.len()
        ));
    }
    Ok(if shape.is_empty() {
        vec![1]
    } else {
        shape.to_vec()
    })
}

/// The geometry of a `gather` launch (output shaped like the index): `sa` holds `a`'s strides
/// with 0 along `dim`; the checks and messages of `cpu::indexing::gather`.
pub fn gather(a: &[usize], idx: &[usize], dim: usize) -> Result<TakePlan, String> {
    crate::cpu::indexing::check_gather("gather", a, idx, dim)?;
    let (ka, ki) = (kernel_shape("gather", a)?, kernel_shape("gather", idx)?);
    let sa = contiguous_strides(&ka);
    let mut layout = Layout {
        rank: ki.len() as i32,
        ..Layout::default()
    };
    for d in 0..ki.len() {
        layout.shape[d] = ki[d] as i64;
        layout.stride_a[d] = if d == dim { 0 } else { sa[d] as i64 };
    }
    Ok(TakePlan {
        shape: idx.to_vec(),
        layout,
        dim_stride: sa[dim] as i64,
        dim_size: ka[dim] as i64,
    })
}

/// The geometry of a `scatter_add` launch over `a`'s elements; the checks of
/// `cpu::indexing::scatter_add` (dtypes are the caller's).
pub fn scatter(
    a: &[usize],
    idx: &[usize],
    src: &[usize],
    dim: usize,
) -> Result<ScatterLayout, String> {
    crate::cpu::indexing::check_gather("scatter_add", a, idx, dim)?;
    if src.len() != idx.len() || idx.iter().zip(src).any(|(i, s)| i > s) {
        return Err(format!(
            "scatter_add: index {idx:?} must have the rank of src {src:?} and be no larger"
        ));
    }
    let (ka, ki, ks) = (
        kernel_shape("scatter_add", a)?,
        kernel_shape("scatter_add", idx)?,
        kernel_shape("scatter_add", src)?,
    );
    let (si, ss) = (contiguous_strides(&ki), contiguous_strides(&ks));
    let mut l = ScatterLayout {
        rank: ka.len() as i32,
        dim: dim as i32,
        ..ScatterLayout::default()
    };
    for d in 0..ka.len() {
        l.shape[d] = ka[d] as i64;
        l.index_shape[d] = ki[d] as i64;
        l.index_stride[d] = si[d] as i64;
        l.src_stride[d] = ss[d] as i64;
    }
    Ok(l)
}

/// `nll_loss_backward`'s input as `[n, classes, inner]` and whether the gradient is read per
/// element (reduction `none`) or is one number; the checks of
/// `cpu::loss_grad::nll_loss_backward`, and for `none` a gradient of one element per target
/// (the CPU indexes it so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NllPlan {
    pub n: usize,
    pub classes: usize,
    pub inner: usize,
    pub per_element: bool,
}

pub fn nll_loss_backward(
    grad: &[usize],
    input: &[usize],
    target: &[usize],
    weight: Option<&[usize]>,
    reduction: LossReduction,
) -> Result<NllPlan, String> {
    let (n, classes, inner) = match input.len() {
        0 => return Err("nll_loss_backward: the input is a scalar".into()),
        1 => (1, input[0], 1),
        _ => (input[0], input[1], input[2..].iter().product::<usize>()),
    };
    if target.iter().product::<usize>() != n * inner {
        return Err(format!(
            "nll_loss_backward: target {target:?} does not fit input {input:?}"
        ));
    }
    if weight.is_some_and(|w| w.iter().product::<usize>() != classes) {
        return Err(format!(
            "nll_loss_backward: weight has not {classes} classes"
        ));
    }
    let g: usize = grad.iter().product();
    let per_element = reduction == LossReduction::None;
    if !per_element && g != 1 {
        return Err(format!(
            "nll_loss_backward: reduction `{}` takes a scalar gradient, got {grad:?}",
            reduction.as_str()
        ));
    }
    if per_element && g != n * inner {
        return Err(format!(
            "nll_loss_backward: reduction `none` takes a gradient per target {target:?}, got \
             {grad:?}"
        ));
    }
    Ok(NllPlan {
        n,
        classes,
        inner,
        per_element,
    })
}

/// A softmax backward's rows: `(outer, len, inner)` of `output` along `dim` (the kernels'
/// `[outer, len, inner]`), with the checks of `cpu::loss_grad::softmax_backward`.
pub fn softmax_backward(
    grad: &[usize],
    output: &[usize],
    dim: usize,
) -> Result<(usize, usize, usize), String> {
    if grad != output || dim >= output.len().max(1) {
        return Err(format!(
            "softmax backward: grad {grad:?} and output {output:?} along dim {dim} do not match"
        ));
    }
    let len = output.get(dim).copied().unwrap_or(1);
    let inner: usize = output.get(dim + 1..).map_or(1, |s| s.iter().product());
    let outer: usize = output.get(..dim).map_or(1, |s| s.iter().product());
    Ok((outer, len, inner))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::layout as cl;
    use crate::tensor::Tensor;
    use tracepass_ir::DType;

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_f32(shape, (0..n).map(|i| i as f32).collect())
    }

    /// What the gather kernel computes for `v` over a contiguous `src` (the CUDA C loop).
    fn gather(src: &[f32], v: &View) -> Vec<f32> {
        let l = v.layout().expect("rank");
        (0..v.numel())
            .map(|i| {
                let (mut r, mut off) = (i as i64, v.offset);
                for d in (0..l.rank as usize).rev() {
                    off += (r % l.shape[d]) * l.stride_a[d];
                    r /= l.shape[d];
                }
                src[off as usize]
            })
            .collect()
    }

    #[test]
    fn views_gather_what_the_cpu_layout_ops_give() {
        let shape = [2, 3, 4];
        let x = iota(&shape);
        let src = x.to_f32_vec();
        let check = |v: View, want: Tensor| {
            assert_eq!(v.shape, want.shape());
            assert_eq!(gather(&src, &v), want.to_f32_vec());
        };
        check(
            slice(&shape, &[0, 1, 1], &[2, 3, 4], &[1, 1, 2]).unwrap(),
            cl::slice(&x, &[0, 1, 1], &[2, 3, 4], Some(&[1, 1, 2])).unwrap(),
        );
        check(
            flip(&shape, &[0, -1]).unwrap(),
            cl::flip(&x, &[0, -1]).unwrap(),
        );
        let u = iota(&[3, 1]);
        let usrc = u.to_f32_vec();
        let e = expand(&[3, 1], &[2, -1, 4]).unwrap();
        assert_eq!(e.shape, vec![2, 3, 4]);
        assert_eq!(
            gather(&usrc, &e),
            cl::expand(&u, &[2, -1, 4]).unwrap().to_f32_vec()
        );
        assert!(expand(&[3], &[2, 4]).is_err());
        let parts = split(&shape, &[1, 2], 1).unwrap();
        let want = cl::split(&x, &cl::SplitSizes::Sizes(&[1, 2]), 1).unwrap();
        for (v, w) in parts.into_iter().zip(want) {
            check(v, w);
        }
        assert!(split(&shape, &[1, 1], 1).is_err());
        assert!(slice(&shape, &[0, 0, 3], &[2, 3, 2], &[1, 1, 1]).is_err());
        assert!(flip(&shape, &[1, 1]).is_err());
        assert_eq!(squeeze(&[1, 3, 1], None).unwrap(), vec![3]);
        assert_eq!(squeeze(&[1, 3, 1], Some(&[-1, 1])).unwrap(), vec![1, 3]);
        assert_eq!(unsqueeze(&[3], -1).unwrap(), vec![3, 1]);
        assert!(unsqueeze(&[3], 2).is_err());
        assert!(View::of(&[1; 7]).layout().is_err());
    }

    #[test]
    fn pad_layout_places_elements_as_the_cpu_pad() {
        let x = iota(&[2, 3]);
        let src = x.to_f32_vec();
        for config in [
            vec![(1, 0, 0), (0, 2, 1)],
            vec![(-1, 1, 0), (2, -1, 2)],
            vec![(0, 0, 0), (0, 0, 0)],
        ] {
            let (shape, l) = pad(&[2, 3], &config).unwrap();
            let want = cl::pad(&x, -7.0, &config).unwrap();
            assert_eq!(shape, want.shape());
            // the CUDA C loop
            let n: usize = shape.iter().product();
            let got: Vec<f32> = (0..n as i64)
                .map(|i| {
                    let (mut r, mut off) = (i, 0);
                    for d in (0..l.rank as usize).rev() {
                        let c = r % l.out_shape[d];
                        r /= l.out_shape[d];
                        let p = c - l.lo[d];
                        if p < 0 || p % l.step[d] != 0 || p / l.step[d] >= l.in_shape[d] {
                            return -7.0;
                        }
                        off += (p / l.step[d]) * l.in_stride[d];
                    }
                    src[off as usize]
                })
                .collect();
            assert_eq!(got, want.to_f32_vec(), "{config:?}");
        }
        assert!(pad(&[2], &[(0, 0, -1)]).is_err());
        assert!(pad(&[2], &[(-3, 0, 0)]).is_err());
    }

    #[test]
    fn cat_plans_blocks_and_skips_empty_inputs() {
        let p = cat(&[&[2, 1, 3], &[0], &[2, 2, 3]], 1).unwrap();
        assert_eq!(p.shape, vec![2, 3, 3]);
        assert_eq!(p.block_out, 9);
        assert_eq!(p.parts, vec![Some((3, 0)), None, Some((6, 3))]);
        assert!(cat(&[&[2, 1], &[3, 1]], 1).is_err());
        assert!(cat(&[&[], &[]], 0).is_err());
        assert_eq!(cat(&[&[0]], 0).unwrap().shape, vec![0]);
    }

    #[test]
    fn conv_and_pool_geometry_match_the_cpu_kernels_shapes() {
        let x = iota(&[1, 4, 7, 6]);
        let w = Tensor::from_f32(vec![6, 2, 3, 2], vec![0.5; 72]);
        let (shape, l) = convolution(x.shape(), w.shape(), &[2, 1], &[1], &[1, 2], 2).unwrap();
        let want =
            crate::cpu::conv::convolution(&x, &w, None, &[2, 1], &[1], &[1, 2], false, &[0], 2)
                .unwrap();
        assert_eq!(shape, want.shape());
        assert_eq!((l.nd, l.groups, l.cin, l.cout), (2, 2, 4, 6));
        assert!(convolution(x.shape(), w.shape(), &[1], &[0], &[1], 3).is_err());
        assert!(convolution(
            &[1, 1, 1, 1, 1, 1, 1],
            &[1, 1, 1, 1, 1, 1, 1],
            &[1],
            &[0],
            &[1],
            1
        )
        .is_err());
        for ceil in [false, true] {
            let p = crate::cpu::pool::Pool2d::new(&[3], &[2], &[1], &[1], ceil).unwrap();
            let (shape, l) = max_pool2d(&[2, 3, 8, 7], &p).unwrap();
            let (v, _) =
                crate::cpu::pool::max_pool2d_with_indices(&iota(&[2, 3, 8, 7]), &p).unwrap();
            assert_eq!(shape, v.shape());
            assert_eq!(l.planes, 6);
        }
    }

    /// What the convolution kernel computes (its CUDA C loop, one output at a time).
    fn conv_like_the_kernel(
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        g: &ConvLayout,
    ) -> Vec<f32> {
        let nd = g.nd as usize;
        let op: i64 = g.out[..nd].iter().product();
        let kp: i64 = g.kernel[..nd].iter().product();
        let sp: i64 = g.input[..nd].iter().product();
        let (cg, coutg) = (g.cin / g.groups as i64, g.cout / g.groups as i64);
        (0..g.n * g.cout * op)
            .map(|i| {
                let (mut o, rest) = (i % op, i / op);
                let (co, b) = (rest % g.cout, rest / g.cout);
                let mut oi = [0i64; MAX_SPATIAL];
                for j in (0..nd).rev() {
                    oi[j] = o % g.out[j];
                    o /= g.out[j];
                }
                let grp = co / coutg;
                let mut acc = bias.map_or(0.0, |b| b[co as usize]);
                for c in 0..cg {
                    let xb = (b * g.cin + grp * cg + c) * sp;
                    let wb = (co * cg + c) * kp;
                    for k in 0..kp {
                        let (mut r, mut off, mut step, mut inside) = (k, 0, 1, true);
                        for j in (0..nd).rev() {
                            let kj = r % g.kernel[j];
                            r /= g.kernel[j];
                            let p = oi[j] * g.stride[j] + kj * g.dilation[j] - g.padding[j];
                            if p < 0 || p >= g.input[j] {
                                inside = false;
                                break;
                            }
                            off += p * step;
                            step *= g.input[j];
                        }
                        if inside {
                            acc += x[(xb + off) as usize] * w[(wb + k) as usize];
                        }
                    }
                }
                acc
            })
            .collect()
    }

    #[test]
    fn the_convolution_loop_computes_the_cpu_convolution() {
        let rnd = |shape: &[usize], seed: usize| {
            let n: usize = shape.iter().product();
            let v = (0..n).map(|i| (((i * 7919 + seed * 104_729) % 23) as f32 - 11.0) / 8.0);
            Tensor::from_f32(shape, v.collect())
        };
        for (xs, ws, stride, padding, dilation, groups) in [
            (
                vec![2, 4, 7, 6],
                vec![6, 2, 3, 2],
                vec![2, 1],
                vec![1],
                vec![1, 2],
                2,
            ),
            (vec![1, 3, 9], vec![4, 3, 3], vec![2], vec![2], vec![1], 1),
            (
                vec![1, 2, 4, 5, 3],
                vec![2, 2, 2, 3, 1],
                vec![1],
                vec![0, 1, 0],
                vec![1],
                1,
            ),
            (
                vec![2, 3, 5, 5],
                vec![3, 1, 1, 1],
                vec![1],
                vec![0],
                vec![1],
                3,
            ),
        ] {
            let (x, w, b) = (rnd(&xs, 1), rnd(&ws, 2), rnd(&ws[..1], 3));
            let (shape, l) = convolution(&xs, &ws, &stride, &padding, &dilation, groups).unwrap();
            let want = crate::cpu::conv::convolution(
                &x,
                &w,
                Some(&b),
                &stride,
                &padding,
                &dilation,
                false,
                &[0],
                groups,
            )
            .unwrap();
            assert_eq!(shape, want.shape());
            let got =
                conv_like_the_kernel(&x.to_f32_vec(), &w.to_f32_vec(), Some(&b.to_f32_vec()), &l);
            for (g, e) in got.iter().zip(want.to_f32_vec()) {
                assert!((g - e).abs() < 1e-4, "{xs:?} {ws:?}: {g} vs {e}");
            }
        }
    }

    #[test]
    fn var_mean_rows_and_arange_lengths() {
        let r = var_mean(&[2, 3, 4, 5], Some(&[0, -2, 3]), false).unwrap();
        assert_eq!(r.perm[..], [1, 0, 2, 3]);
        assert_eq!((r.rows, r.len, r.shape.to_vec()), (3, 40, vec![3]));
        let r = var_mean(&[2, 3], None, true).unwrap();
        assert_eq!((r.rows, r.len, r.shape.to_vec()), (1, 6, vec![1, 1]));
        assert!(var_mean(&[2, 3], Some(&[1, -1]), false).is_err());
        assert_eq!(arange_len(1.0, 2.0, 0.3).unwrap(), 4);
        assert_eq!(arange_len(5.0, 0.0, -2.0).unwrap(), 3);
        assert!(arange_len(0.0, 1.0, -1.0).is_err());
    }

    #[test]
    fn broadcast_layouts_repeat_size_one_dims() {
        let l = binary_layout(Some(&[3, 1]), Some(&[4]), &[3, 4]).unwrap();
        assert_eq!(&l.stride_a[..2], &[1, 0]);
        assert_eq!(&l.stride_b[..2], &[0, 1]);
        let l = binary_layout(None, Some(&[2, 4]), &[2, 4]).unwrap();
        assert_eq!(&l.stride_a[..2], &[0, 0]);
        assert_eq!(&l.stride_b[..2], &[4, 1]);
        assert_eq!(broadcast_all(&[&[2, 1], &[3], &[]]).unwrap(), vec![2, 3]);
        assert!(broadcast_all(&[&[2], &[3]]).is_err());
    }

    /// What the take_along_dim kernel computes (the CUDA C loop); `None` where it sets `bad`.
    fn take_kernel(a: &[f32], idx: &[i64], p: &TakePlan) -> Option<Vec<f32>> {
        let l = &p.layout;
        (0..p.shape.iter().product::<usize>())
            .map(|i| {
                let (mut r, mut oa, mut oi) = (i as i64, 0i64, 0i64);
                for d in (0..l.rank as usize).rev() {
                    let c = r % l.shape[d];
                    r /= l.shape[d];
                    oa += c * l.stride_a[d];
                    oi += c * l.stride_b[d];
                }
                let mut j = idx[oi as usize];
                if j < 0 {
                    j += p.dim_size;
                }
                (0..p.dim_size)
                    .contains(&j)
                    .then(|| a[(oa + j * p.dim_stride) as usize])
            })
            .collect()
    }

    #[test]
    fn take_along_dim_plans_gather_what_the_cpu_gives() {
        use crate::cpu::loss_grad;
        let cases: &[(&[usize], &[usize], Option<usize>)] = &[
            (&[2, 3], &[2, 1], Some(1)),
            (&[2, 3], &[1, 2], Some(1)),
            (&[2, 3, 4], &[1, 3, 5], Some(2)),
            (&[2, 1, 4], &[3, 5, 1], Some(0)),
            (&[3, 1, 4], &[3, 5, 2], Some(2)),
            (&[2, 3, 4], &[4, 3], None),
            (&[5], &[], None),
        ];
        for &(ash, ish, dim) in cases {
            let a = iota(ash);
            let n: usize = ish.iter().product();
            let range = dim.map_or(ash.iter().product::<usize>(), |d| ash[d]) as i64;
            // every index from -range to range - 1, negative ones wrapping
            let iv: Vec<i64> = (0..n as i64)
                .map(|k| (k * 7) % (2 * range) - range)
                .collect();
            let idx = Tensor::from_i64(ish, iv.clone());
            let want = loss_grad::take_along_dim(&a, &idx, dim).unwrap();
            let p = take_along_dim(ash, ish, dim).unwrap();
            assert_eq!(p.shape, want.shape(), "{ash:?} {ish:?} {dim:?}");
            let got = take_kernel(&a.to_f32_vec(), &iv, &p).expect("in range");
            assert_eq!(got, want.to_f32_vec(), "{ash:?} {ish:?} {dim:?}");
            // one index out of range: the kernel flags it, the CPU refuses it
            let mut bad = iv.clone();
            if let Some(b) = bad.last_mut() {
                *b = range;
                let t = Tensor::from_i64(ish, bad.clone());
                assert!(loss_grad::take_along_dim(&a, &t, dim).is_err());
                assert!(take_kernel(&a.to_f32_vec(), &bad, &p).is_none());
            }
        }
        for (ash, ish) in [(&[2, 3][..], &[2, 3, 1][..]), (&[2, 3], &[3, 1])] {
            let want = loss_grad::take_along_dim(
                &iota(ash),
                &Tensor::from_i64(ish, vec![0; ish.iter().product()]),
                Some(1),
            )
            .unwrap_err();
            assert_eq!(take_along_dim(ash, ish, Some(1)).unwrap_err(), want);
        }
        assert!(take_along_dim(&[2], &[2], Some(1)).is_err());
        assert!(take_along_dim(&[1; 7], &[1; 7], Some(0)).is_err());
    }

    /// What the nll_loss_backward kernel computes; `None` where it sets `bad`.
    #[allow(clippy::too_many_arguments)]
    fn nll_kernel(
        grad: &[f32],
        target: &[i64],
        weight: Option<&[f32]>,
        tw: &[f32],
        mean: bool,
        p: &NllPlan,
        ignore_index: i64,
    ) -> Option<Vec<f32>> {
        let scale = if !mean {
            1.0
        } else {
            tw.first().map_or(f64::NAN, |&t| 1.0 / f64::from(t))
        };
        let (c, inner) = (p.classes as i64, p.inner as i64);
        let n = p.n as i64 * c * inner;
        let mut bad = false;
        let out = (0..n)
            .map(|e| {
                let (s, cls, b) = (e % inner, (e / inner) % c, e / (inner * c));
                let k = (b * inner + s) as usize;
                let t = target[k];
                let mut v = 0.0f64;
                if t != ignore_index {
                    if t < 0 || t >= c {
                        bad = true;
                    } else if t == cls {
                        let w = weight.map_or(1.0, |w| f64::from(w[t as usize]));
                        let g = f64::from(grad[if p.per_element { k } else { 0 }]);
                        v = -w * g * scale;
                    }
                }
                v as f32
            })
            .collect();
        (!bad).then_some(out)
    }

    #[test]
    fn nll_loss_backward_plans_compute_what_the_cpu_gives() {
        use crate::cpu::loss_grad;
        // [N, C], [C] and [N, C, d1, d2] inputs; ignored targets; every reduction
        let cases: &[(&[usize], &[usize], Vec<i64>)] = &[
            (&[4, 3], &[4], vec![2, -100, 0, 1]),
            (&[5], &[], vec![3]),
            (&[2, 3, 2, 2], &[2, 2, 2], vec![0, 1, 2, -100, 2, 2, 1, 0]),
        ];
        for (ish, tsh, tv) in cases {
            let input = Tensor::zeros(ish, DType::F32).unwrap();
            let target = Tensor::from_i64(tsh, tv.clone());
            let classes = if ish.len() == 1 { ish[0] } else { ish[1] };
            let wv: Vec<f32> = (0..classes).map(|c| 0.5 + c as f32).collect();
            let weight = Tensor::from_f32(vec![classes], wv.clone());
            let tw = Tensor::from_f32(vec![], vec![3.0]);
            for reduction in [LossReduction::Mean, LossReduction::Sum, LossReduction::None] {
                let gsh: Vec<usize> = if reduction == LossReduction::None {
                    tsh.to_vec()
                } else {
                    vec![]
                };
                let gn: usize = gsh.iter().product();
                let gv: Vec<f32> = (0..gn).map(|k| 0.25 - k as f32 * 0.75).collect();
                let grad = Tensor::from_f32(gsh.clone(), gv.clone());
                for weighted in [false, true] {
                    let w = weighted.then_some(&weight);
                    let want = loss_grad::nll_loss_backward(
                        &grad,
                        &input,
                        &target,
                        w,
                        reduction.as_str(),
                        -100,
                        &tw,
                    )
                    .unwrap();
                    let p =
                        nll_loss_backward(&gsh, ish, tsh, w.map(|w| w.shape()), reduction).unwrap();
                    let got = nll_kernel(
                        &gv,
                        tv,
                        weighted.then_some(&wv[..]),
                        &[3.0],
                        reduction == LossReduction::Mean,
                        &p,
                        -100,
                    )
                    .expect("targets in range");
                    assert_eq!(got, want.to_f32_vec(), "{ish:?} {reduction:?} {weighted}");
                }
            }
            // a target out of range that is not ignored: flagged, as the CPU refuses it
            let mut bad = tv.clone();
            bad[0] = classes as i64;
            let p = nll_loss_backward(&[], ish, tsh, None, LossReduction::Sum).unwrap();
            assert!(nll_kernel(&[1.0], &bad, None, &[1.0], false, &p, -100).is_none());
            assert!(loss_grad::nll_loss_backward(
                &Tensor::from_f32(vec![], vec![1.0]),
                &input,
                &Tensor::from_i64(tsh, bad),
                None,
                "sum",
                -100,
                &tw,
            )
            .is_err());
        }
        // the CPU's shape checks
        let sum = LossReduction::Sum;
        assert!(nll_loss_backward(&[], &[], &[], None, sum).is_err());
        assert!(nll_loss_backward(&[], &[4, 3], &[3], None, sum).is_err());
        assert!(nll_loss_backward(&[], &[4, 3], &[4], Some(&[2]), sum).is_err());
        assert!(nll_loss_backward(&[2], &[4, 3], &[4], None, sum).is_err());
        assert!(nll_loss_backward(&[3], &[4, 3], &[4], None, LossReduction::None).is_err());
        let p = nll_loss_backward(&[4], &[4, 3], &[4], None, LossReduction::None).unwrap();
        assert!(p.per_element && (p.n, p.classes, p.inner) == (4, 3, 1));
    }

    #[test]
    fn softmax_backward_rows_are_the_cpus() {
        use crate::cpu::loss_grad;
        let shape = [2, 3, 4];
        for dim in 0..3 {
            let (outer, len, inner) = softmax_backward(&shape, &shape, dim).unwrap();
            assert_eq!(outer * len * inner, 24);
            let g: Vec<f32> = (0..24).map(|k| (k as f32 * 0.37).sin()).collect();
            let y: Vec<f32> = (0..24).map(|k| -0.1 - (k % 5) as f32 * 0.3).collect();
            for log in [false, true] {
                // the kernel: per row (o, r) a sum over len elements inner apart
                let mut got = [0.0f32; 24];
                for row in 0..outer * inner {
                    let base = (row / inner) * len * inner + row % inner;
                    let at = |j: usize| base + j * inner;
                    let s: f32 = (0..len)
                        .map(|j| if log { g[at(j)] } else { g[at(j)] * y[at(j)] })
                        .sum();
                    for j in 0..len {
                        let (gv, yv) = (g[at(j)], y[at(j)]);
                        got[at(j)] = if log {
                            gv - yv.exp() * s
                        } else {
                            yv * (gv - s)
                        };
                    }
                }
                let want = loss_grad::softmax_backward(
                    &Tensor::from_f32(shape, g.clone()),
                    &Tensor::from_f32(shape, y.clone()),
                    dim,
                    log,
                    DType::F32,
                )
                .unwrap()
                .to_f32_vec();
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "dim {dim} log {log}: {a} vs {b}");
                }
            }
        }
        assert_eq!(softmax_backward(&[], &[], 0).unwrap(), (1, 1, 1));
        assert!(softmax_backward(&[2, 3], &[3, 2], 0).is_err());
        assert!(softmax_backward(&[2, 3], &[2, 3], 2).is_err());
    }

    /// What the gather_dim kernel computes (the CUDA C loop); `None` for an index out of range.
    fn gather_dim_kernel(a: &[f32], idx: &[i64], p: &TakePlan) -> Option<Vec<f32>> {
        let l = &p.layout;
        (0..p.shape.iter().product::<usize>())
            .map(|i| {
                let (mut r, mut oa) = (i as i64, 0i64);
                for d in (0..l.rank as usize).rev() {
                    oa += r % l.shape[d] * l.stride_a[d];
                    r /= l.shape[d];
                }
                let j = idx[i];
                (0..p.dim_size)
                    .contains(&j)
                    .then(|| a[(oa + j * p.dim_stride) as usize])
            })
            .collect()
    }

    /// What the scatter_add kernel computes in f32 (the CUDA C loop over each output element).
    fn scatter_kernel(a: &[f32], idx: &[i64], src: &[f32], l: &ScatterLayout) -> Vec<f32> {
        (0..a.len())
            .map(|e| {
                let (mut r, mut oi, mut os, mut target, mut inside) = (e as i64, 0, 0, 0, true);
                for d in (0..l.rank as usize).rev() {
                    let c = r % l.shape[d];
                    r /= l.shape[d];
                    if d == l.dim as usize {
                        target = c;
                        continue;
                    }
                    inside &= c < l.index_shape[d];
                    oi += c * l.index_stride[d];
                    os += c * l.src_stride[d];
                }
                let mut acc = a[e];
                let dim = l.dim as usize;
                for j in 0..l.index_shape[dim] {
                    if inside && idx[(oi + j * l.index_stride[dim]) as usize] == target {
                        acc += src[(os + j * l.src_stride[dim]) as usize];
                    }
                }
                acc
            })
            .collect()
    }

    #[test]
    fn gather_and_scatter_add_plans_compute_what_the_cpu_gives() {
        use crate::cpu::indexing;
        type Case = (&'static [usize], &'static [usize], &'static [usize], usize);
        let cases: &[Case] = &[
            (&[4, 16], &[4, 8], &[4, 8], 1),
            (&[3, 4], &[2, 9], &[3, 9], 1),
            (&[5, 2, 3], &[7, 2, 2], &[7, 3, 2], 0),
            (&[2, 3, 4], &[1, 2, 6], &[2, 2, 6], 2),
            (&[], &[], &[], 0),
        ];
        for &(ash, ish, ssh, dim) in cases {
            let size = ash.get(dim).copied().unwrap_or(1) as i64;
            let n: usize = ish.iter().product();
            // duplicates on purpose: indices cycle through 0..size
            let iv: Vec<i64> = (0..n as i64).map(|k| (k * 5 + 3) % size).collect();
            let idx = Tensor::from_i64(ish, iv.clone());
            let a = iota(ash);
            let want = indexing::gather(&a, dim, &idx).unwrap();
            let p = super::gather(ash, ish, dim).unwrap();
            assert_eq!(p.shape, want.shape(), "{ash:?} {ish:?}");
            let got = gather_dim_kernel(&a.to_f32_vec(), &iv, &p).expect("in range");
            assert_eq!(got, want.to_f32_vec(), "gather {ash:?} {ish:?} {dim}");
            let mut bad = iv.clone();
            bad[n - 1] = size;
            assert!(gather_dim_kernel(&a.to_f32_vec(), &bad, &p).is_none());

            let nsrc: usize = ssh.iter().product();
            let src = Tensor::from_f32(ssh, (0..nsrc).map(|k| 0.1 + k as f32 / 7.0).collect());
            let want = indexing::scatter_add(&a, dim, &idx, &src).unwrap();
            let l = scatter(ash, ish, ssh, dim).unwrap();
            let got = scatter_kernel(&a.to_f32_vec(), &iv, &src.to_f32_vec(), &l);
            // the same additions in the same order: the same bits
            assert_eq!(got, want.to_f32_vec(), "scatter_add {ash:?} {ish:?} {dim}");
        }
        assert!(super::gather(&[3, 4], &[4, 1], 1)
            .unwrap_err()
            .contains("larger than the input [3, 4] in dimension 0"));
        assert!(scatter(&[3, 4], &[2, 2], &[2, 1], 1).is_err());
        assert!(super::gather(&[1; 7], &[1; 7], 0).is_err());
    }
}
