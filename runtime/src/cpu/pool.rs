//! 2-d max pooling with indices, and its backward.

use crate::tensor::Tensor;
use tracepass_ir::DType;

/// Window parameters of a 2-d pooling, per spatial dim (height, width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
}

impl Pool2d {
    /// From PyTorch's argument forms: each an int or a pair; an empty stride means the kernel.
    pub fn new(
        kernel: &[i64],
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        ceil_mode: bool,
    ) -> Result<Pool2d, String> {
        let pair = |v: &[i64], what: &str| -> Result<[usize; 2], String> {
            let p = match v {
                [a] => [*a, *a],
                [a, b] => [*a, *b],
                _ => {
                    return Err(format!(
                        "max_pool2d: {what} must be one or two ints, got {v:?}"
                    ))
                }
            };
            if p.iter().any(|&x| x < 0) {
                return Err(format!("max_pool2d: {what} {v:?} is negative"));
            }
            Ok([p[0] as usize, p[1] as usize])
        };
        let kernel = pair(kernel, "kernel_size")?;
        let stride = if stride.is_empty() {
            kernel
        } else {
            pair(stride, "stride")?
        };
        let padding = pair(padding, "padding")?;
        let dilation = pair(dilation, "dilation")?;
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
            return Err(format!(
                "max_pool2d: kernel {kernel:?}, stride {stride:?} and dilation {dilation:?} must be positive"
            ));
        }
        if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
            return Err(format!(
                "max_pool2d: padding {padding:?} must be at most half the kernel {kernel:?}"
            ));
        }
        Ok(Pool2d {
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode,
        })
    }

    /// PyTorch's `pooling_output_shape` for one dim.
    fn out_len(&self, d: usize, input: usize) -> Result<usize, String> {
        let (k, s, p, dl) = (
            self.kernel[d] as i64,
            self.stride[d] as i64,
            self.padding[d] as i64,
            self.dilation[d] as i64,
        );
        let num = input as i64 + 2 * p - dl * (k - 1) - 1 + if self.ceil_mode { s - 1 } else { 0 };
        let mut out = num.div_euclid(s) + 1;
        if self.ceil_mode && (out - 1) * s >= input as i64 + p {
            out -= 1;
        }
        if out < 1 {
            return Err(format!(
                "max_pool2d: an input of size {input} is too small for {self:?} (output size {out})"
            ));
        }
        Ok(out as usize)
    }
}

/// (planes, H, W) of an NCHW or CHW input.
fn planes(shape: &[usize]) -> Result<(usize, usize, usize), String> {
    match shape {
        [n, c, h, w] => Ok((n * c, *h, *w)),
        [c, h, w] => Ok((*c, *h, *w)),
        _ => Err(format!(
            "max_pool2d: the input must be 3-d or 4-d, got {shape:?}"
        )),
    }
}

/// `max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)`: the maxima and
/// their positions `h * W + w` within each (N, C) plane of the input (i64). A NaN wins, and the
/// first maximum in window order is kept, as in PyTorch's CPU kernel.
pub fn max_pool2d_with_indices(x: &Tensor, p: &Pool2d) -> Result<(Tensor, Tensor), String> {
    let (np, h, w) = planes(x.shape())?;
    let (oh, ow) = (p.out_len(0, h)?, p.out_len(1, w)?);
    let dtype = x.dtype();
    let xs: std::borrow::Cow<'_, [f32]> = match dtype {
        DType::F32 => x.elems::<f32>().ok_or("max_pool2d: f32 storage")?,
        DType::BF16 | DType::F16 => x.to_f32_vec().into(),
        DType::F64 => return max_pool_f64(x, p, np, h, w, oh, ow),
        other => return Err(format!("max_pool2d: dtype {other} is not a float type")),
    };
    let mut out = crate::cpu::buffer_pool::take(np * oh * ow);
    let mut idx = crate::cpu::buffer_pool::take(np * oh * ow);
    pool_planes(&xs, p, np, h, w, oh, ow, &mut out, &mut idx);
    let mut shape = crate::tensor::Dims::from_slice(x.shape());
    let r = shape.len();
    shape[r - 2] = oh;
    shape[r - 1] = ow;
    let vals = Tensor::from_f32(shape.clone(), out);
    let vals = if dtype == DType::F32 {
        vals
    } else {
        vals.to_dtype(dtype).ok_or("max_pool2d: rounding")?
    };
    Ok((vals, Tensor::from_i64(shape, idx)))
}

#[allow(clippy::too_many_arguments)]
fn max_pool_f64(
    x: &Tensor,
    p: &Pool2d,
    np: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
) -> Result<(Tensor, Tensor), String> {
    let xs = x.elems::<f64>().ok_or("max_pool2d: f64 storage")?;
    let mut out = crate::cpu::buffer_pool::take(np * oh * ow);
    let mut idx = crate::cpu::buffer_pool::take(np * oh * ow);
    pool_planes(&xs, p, np, h, w, oh, ow, &mut out, &mut idx);
    let mut shape = crate::tensor::Dims::from_slice(x.shape());
    let r = shape.len();
    shape[r - 2] = oh;
    shape[r - 1] = ow;
    Ok((
        Tensor::from_f64(shape.clone(), out),
        Tensor::from_i64(shape, idx),
    ))
}

trait PoolElem: Copy + PartialOrd {
    const NEG_INF: Self;
    fn nan(self) -> bool;
    /// `if take { a } else { b }` through bit masks, which keeps [`pool_plane`]'s lane loop
    /// free of branches, so vectorised (written as an `if`, it ran at half the speed).
    fn pick(take: bool, a: Self, b: Self) -> Self;
}
impl PoolElem for f32 {
    const NEG_INF: f32 = f32::NEG_INFINITY;
    fn nan(self) -> bool {
        self.is_nan()
    }
    fn pick(take: bool, a: f32, b: f32) -> f32 {
        let mask = 0u32.wrapping_sub(u32::from(take));
        f32::from_bits((a.to_bits() & mask) | (b.to_bits() & !mask))
    }
}
impl PoolElem for f64 {
    const NEG_INF: f64 = f64::NEG_INFINITY;
    fn nan(self) -> bool {
        self.is_nan()
    }
    fn pick(take: bool, a: f64, b: f64) -> f64 {
        let mask = 0u64.wrapping_sub(u64::from(take));
        f64::from_bits((a.to_bits() & mask) | (b.to_bits() & !mask))
    }
}

/// `if take { a } else { b }` for positions, through a bit mask (see [`PoolElem::pick`]).
fn pick_index(take: bool, a: i64, b: i64) -> i64 {
    let mask = 0i64.wrapping_sub(i64::from(take));
    (a & mask) | (b & !mask)
}

/// Pools of fewer output elements than this run on one thread.
const PARALLEL_POOL: usize = 1 << 14;

/// Every plane's maxima and their positions into `out` and `idx` (`np * oh * ow` each),
/// planes shared among the rank's threads when large. Each window keeps its first maximum
/// (or last NaN) in window order whichever thread runs it ([`pool_plane`]).
#[allow(clippy::too_many_arguments)]
fn pool_planes<T: PoolElem + Send + Sync>(
    xs: &[T],
    p: &Pool2d,
    np: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    out: &mut Vec<T>,
    idx: &mut Vec<i64>,
) {
    use rayon::prelude::*;
    let per_plane = oh * ow;
    out.clear();
    out.resize(np * per_plane, T::NEG_INF);
    idx.clear();
    idx.resize(np * per_plane, 0);
    if per_plane == 0 {
        return;
    }
    let one = |plane: usize, (o, ix): (&mut [T], &mut [i64])| {
        pool_plane(
            &xs[plane * h * w..(plane + 1) * h * w],
            p,
            (h, w),
            ow,
            o,
            ix,
        )
    };
    if crate::cpu::pool_threads() > 1 && np > 1 && np * per_plane >= PARALLEL_POOL {
        out.par_chunks_mut(per_plane)
            .zip(idx.par_chunks_mut(per_plane))
            .enumerate()
            .for_each(|(plane, bufs)| one(plane, bufs));
    } else {
        out.chunks_mut(per_plane)
            .zip(idx.chunks_mut(per_plane))
            .enumerate()
            .for_each(|(plane, bufs)| one(plane, bufs));
    }
}

/// One plane `x` (`[h, w]`) into its `out` and `idx` rows of `ow`. The columns whose windows
/// lie inside the row are swept a window position at a time over up to [`LANES`] outputs: the
/// values gathered contiguous, then a compare-and-select per output, a loop the compiler
/// vectorises, so without a branch (after a ReLU half the inputs tie at zero, and a branch on
/// the comparison mispredicts about as often as not) and without a chain from one comparison
/// to the next. One output at a time, ResNet-18-64's stem pool took 4.1 ms a step; 2.4-2.6 ms
/// so. The edge columns, whose windows the padding clips, go one at a time. Both visit each
/// window in the same order, so the first maximum (or the last NaN) is kept either way.
fn pool_plane<T: PoolElem>(
    x: &[T],
    p: &Pool2d,
    (h, w): (usize, usize),
    ow: usize,
    out: &mut [T],
    idx: &mut [i64],
) {
    let [kh, kw] = p.kernel;
    let [sh, sw] = p.stride;
    let [ph, pw] = p.padding;
    let [dh, dw] = p.dilation;
    // columns `j` whose window `j * sw - pw + c * dw` (c < kw) lies in `0..w`
    let span = (kw - 1) * dw;
    let inner_lo = pw.div_ceil(sw).min(ow);
    let inner_hi = if w + pw > span {
        ((w + pw - span - 1) / sw + 1).clamp(inner_lo, ow)
    } else {
        inner_lo
    };
    for (i, (orow, irow)) in out.chunks_mut(ow).zip(idx.chunks_mut(ow)).enumerate() {
        let mut h0 = (i * sh) as i64 - ph as i64;
        let h1 = (h0 + ((kh - 1) * dh) as i64 + 1).min(h as i64);
        while h0 < 0 {
            h0 += dh as i64;
        }
        let edges = (0..inner_lo).chain(inner_hi..ow);
        for j in edges {
            let mut w0 = (j * sw) as i64 - pw as i64;
            let w1 = (w0 + span as i64 + 1).min(w as i64);
            while w0 < 0 {
                w0 += dw as i64;
            }
            let mut best = h0 * w as i64 + w0;
            let mut max = T::NEG_INF;
            let mut r = h0;
            while r < h1 {
                let mut c = w0;
                while c < w1 {
                    let k = r * w as i64 + c;
                    let v = x[k as usize];
                    // a NaN wins (the window's last, as PyTorch's `val > max || isnan(val)`)
                    let take = (v > max) | v.nan();
                    max = T::pick(take, v, max);
                    best = pick_index(take, k, best);
                    c += dw as i64;
                }
                r += dh as i64;
            }
            orow[j] = max;
            irow[j] = best;
        }
        if inner_lo == inner_hi {
            continue;
        }
        let (o, ix) = (&mut orow[inner_lo..inner_hi], &mut irow[inner_lo..inner_hi]);
        let first = h0 as usize * w + inner_lo * sw - pw;
        for (chunk, (oc, ic)) in o.chunks_mut(LANES).zip(ix.chunks_mut(LANES)).enumerate() {
            let q0 = first + chunk * LANES * sw;
            oc.fill(T::NEG_INF);
            for (l, b) in ic.iter_mut().enumerate() {
                *b = (q0 + l * sw) as i64;
            }
            // the window position's values for the chunk's outputs, gathered contiguous so
            // that the update below is a plain loop over lanes, which the compiler vectorises
            let mut vals = [T::NEG_INF; LANES];
            let vals = &mut vals[..oc.len()];
            let mut r = h0 as usize;
            while (r as i64) < h1 {
                for c in 0..kw {
                    let start = q0 + (r - h0 as usize) * w + c * dw;
                    let row = &x[start..start + (vals.len() - 1) * sw + 1];
                    for (l, v) in vals.iter_mut().enumerate() {
                        *v = row[l * sw];
                    }
                    for (l, ((m, b), &v)) in
                        oc.iter_mut().zip(ic.iter_mut()).zip(&*vals).enumerate()
                    {
                        let take = (v > *m) | v.nan();
                        *m = T::pick(take, v, *m);
                        *b = pick_index(take, (start + l * sw) as i64, *b);
                    }
                }
                r += dh;
            }
        }
    }
}

/// Outputs of a row swept together by [`pool_plane`] (a stack buffer of this many values).
const LANES: usize = 64;

/// `max_pool2d_with_indices_backward(grad, x, ..., indices)`: each output gradient added to
/// the input position its index names, within its plane.
pub fn max_pool2d_with_indices_backward(
    grad: &Tensor,
    x: &Tensor,
    indices: &Tensor,
) -> Result<Tensor, String> {
    let (np, h, w) = planes(x.shape())?;
    if grad.shape() != indices.shape() || grad.shape().len() != x.shape().len() {
        return Err(format!(
            "max_pool2d_backward: grad {:?}, indices {:?} and input {:?} do not fit",
            grad.shape(),
            indices.shape(),
            x.shape()
        ));
    }
    let per_plane = grad.numel() / np.max(1);
    let ix = indices
        .elems::<i64>()
        .ok_or("max_pool2d_backward: indices must be i64")?;
    if let Some(bad) = ix.iter().find(|&&i| i < 0 || i as usize >= h * w) {
        return Err(format!(
            "max_pool2d_backward: index {bad} is outside a {h} x {w} plane"
        ));
    }
    macro_rules! scatter {
        ($t:ty, $g:expr) => {{
            let g = $g;
            let mut out = crate::cpu::buffer_pool::filled(np * h * w, 0 as $t);
            for plane in 0..np {
                let dst = &mut out[plane * h * w..(plane + 1) * h * w];
                let r = plane * per_plane..(plane + 1) * per_plane;
                for (&i, &e) in ix[r.clone()].iter().zip(&g[r]) {
                    dst[i as usize] += e;
                }
            }
            out
        }};
    }
    let shape = x.shape();
    Ok(match grad.dtype() {
        DType::F64 => Tensor::from_f64(shape, scatter!(f64, grad.elems::<f64>().ok_or("grad")?)),
        DType::F32 => Tensor::from_f32(shape, scatter!(f32, grad.elems::<f32>().ok_or("grad")?)),
        d @ (DType::BF16 | DType::F16) => Tensor::from_f32(shape, scatter!(f32, grad.to_f32_vec()))
            .to_dtype(d)
            .ok_or("max_pool2d_backward: rounding")?,
        other => {
            return Err(format!(
                "max_pool2d_backward: dtype {other} is not a float type"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(k: i64, s: &[i64], pad: i64, d: i64, ceil: bool) -> Pool2d {
        Pool2d::new(&[k], s, &[pad], &[d], ceil).expect("valid")
    }

    /// The definition: max over the window's in-range positions, first maximum wins.
    fn naive(
        x: &[f64],
        h: usize,
        w: usize,
        p: &Pool2d,
        oh: usize,
        ow: usize,
    ) -> (Vec<f64>, Vec<i64>) {
        let mut o = vec![];
        let mut ix = vec![];
        for i in 0..oh {
            for j in 0..ow {
                let mut best: Option<(f64, i64)> = None;
                for a in 0..p.kernel[0] {
                    for b in 0..p.kernel[1] {
                        let r = (i * p.stride[0] + a * p.dilation[0]) as i64 - p.padding[0] as i64;
                        let c = (j * p.stride[1] + b * p.dilation[1]) as i64 - p.padding[1] as i64;
                        if r < 0 || c < 0 || r >= h as i64 || c >= w as i64 {
                            continue;
                        }
                        let v = x[(r * w as i64 + c) as usize];
                        if best.is_none_or(|(m, _)| v > m || v.is_nan()) {
                            best = Some((v, r * w as i64 + c));
                        }
                    }
                }
                let (v, k) = best.expect("window has an element");
                o.push(v);
                ix.push(k);
            }
        }
        (o, ix)
    }

    /// [`naive`] over each of `planes` planes of `data`, at the output size `o` has.
    fn naive_planes(
        data: &[f64],
        planes: usize,
        (h, w): (usize, usize),
        p: &Pool2d,
        o: &Tensor,
    ) -> (Vec<f64>, Vec<i64>) {
        let (oh, ow) = (o.shape()[2], o.shape()[3]);
        let (mut want_o, mut want_i) = (vec![], vec![]);
        for plane in data.chunks(h * w).take(planes) {
            let (a, b) = naive(plane, h, w, p, oh, ow);
            want_o.extend(a);
            want_i.extend(b);
        }
        (want_o, want_i)
    }

    #[test]
    fn matches_the_definition_for_strides_padding_dilation_and_ceil() {
        let (h, w) = (7, 6);
        let data: Vec<f64> = (0..2 * 3 * h * w).map(|i| ((i * 37) % 23) as f64).collect();
        let x = Tensor::from_f64(vec![2, 3, h, w], data.clone());
        for p in [
            pool(2, &[], 0, 1, false),
            pool(3, &[2], 1, 1, false),
            pool(3, &[2], 1, 1, true),
            pool(2, &[1], 1, 2, false),
            pool(3, &[3], 0, 1, true),
        ] {
            let (o, i) = max_pool2d_with_indices(&x, &p).expect("ok");
            let (want_o, want_i) = naive_planes(&data, 6, (h, w), &p, &o);
            assert_eq!(o.to_f64_vec(), want_o, "{p:?}");
            assert_eq!(i.to_i64_vec(), want_i, "{p:?}");
        }
        // PyTorch's sizes: 7 with k=3, s=2, p=1 gives 4 either way; ceil turns 7/3 into 3
        let (o, _) = max_pool2d_with_indices(&x, &pool(3, &[3], 0, 1, true)).expect("ok");
        assert_eq!(&o.shape()[2..], &[3, 2]);
        let (o, _) = max_pool2d_with_indices(&x, &pool(3, &[3], 0, 1, false)).expect("ok");
        assert_eq!(&o.shape()[2..], &[2, 2]);
        assert!(Pool2d::new(&[2], &[], &[2], &[1], false).is_err());
    }

    /// Planes wide enough for the row sweep of the inner columns, with ties, NaNs and
    /// infinities: the same maxima and first positions as the definition, on every geometry.
    #[test]
    fn the_row_sweep_keeps_the_first_maximum_and_the_last_nan() {
        // 141 columns: more than `LANES` outputs a row at stride 1
        let (h, w) = (11, 141);
        let data: Vec<f64> = (0..2 * h * w)
            .map(|i| match i % 41 {
                7 => f64::NAN,
                11 | 12 => f64::NEG_INFINITY,
                _ => ((i * 37) % 13) as f64,
            })
            .collect();
        let x = Tensor::from_f64(vec![1, 2, h, w], data.clone());
        let x32 = Tensor::from_f32(vec![1, 2, h, w], data.iter().map(|&v| v as f32).collect());
        for p in [
            pool(3, &[2], 1, 1, false),
            pool(2, &[], 0, 1, false),
            pool(3, &[1], 1, 1, false),
            pool(3, &[2], 1, 2, false),
            pool(3, &[2], 1, 1, true),
            pool(5, &[3], 2, 1, true),
            pool(4, &[3], 0, 3, false),
        ] {
            for x in [&x, &x32] {
                let (o, i) = max_pool2d_with_indices(x, &p).expect("ok");
                let (want_o, want_i) = naive_planes(&data, 2, (h, w), &p, &o);
                let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
                let got = o.to_f64_vec();
                assert!(got.iter().zip(&want_o).all(|(&a, &b)| same(a, b)), "{p:?}");
                assert_eq!(i.to_i64_vec(), want_i, "{p:?}");
            }
        }
    }

    /// Central differences of L(x) = sum(maxpool(x) * g) match the backward (inputs distinct,
    /// so the max is differentiable).
    #[test]
    fn backward_matches_numerical_gradient() {
        let shape = vec![2, 2, 5, 5];
        let n: usize = shape.iter().product();
        let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 211) as f64 * 0.01).collect();
        let g: Vec<f64> = (0..2 * 2 * 3 * 3)
            .map(|i| (i as f64 * 0.37).sin())
            .collect();
        let p = pool(3, &[2], 1, 1, false);
        let loss = |v: &[f64]| {
            let (o, _) = max_pool2d_with_indices(&Tensor::from_f64(shape.clone(), v.to_vec()), &p)
                .expect("ok");
            o.to_f64_vec()
                .iter()
                .zip(&g)
                .map(|(a, b)| a * b)
                .sum::<f64>()
        };
        let tx = Tensor::from_f64(shape.clone(), x.clone());
        let (o, i) = max_pool2d_with_indices(&tx, &p).expect("ok");
        let tg = Tensor::from_f64(o.shape(), g.clone());
        let dx = max_pool2d_with_indices_backward(&tg, &tx, &i)
            .expect("ok")
            .to_f64_vec();
        let h = 1e-4;
        for k in 0..n {
            let (mut up, mut down) = (x.clone(), x.clone());
            up[k] += h;
            down[k] -= h;
            let num = (loss(&up) - loss(&down)) / (2.0 * h);
            assert!(
                (num - dx[k]).abs() < 1e-8,
                "element {k}: {num} vs {}",
                dx[k]
            );
        }
    }

    #[test]
    fn nan_wins_and_backward_routes_gradients() {
        let x = Tensor::from_f32(vec![1, 1, 2, 4], vec![1., 5., f32::NAN, 0., 3., 2., 7., 7.]);
        let (o, i) = max_pool2d_with_indices(&x, &pool(2, &[], 0, 1, false)).expect("ok");
        assert_eq!(o.to_f32_vec()[0], 5.);
        assert!(o.to_f32_vec()[1].is_nan());
        assert_eq!(i.to_i64_vec(), vec![1, 2]);
        let g = Tensor::from_f32(vec![1, 1, 1, 2], vec![10., 20.]);
        let gx = max_pool2d_with_indices_backward(&g, &x, &i).expect("ok");
        assert_eq!(gx.to_f32_vec(), vec![0., 10., 20., 0., 0., 0., 0., 0.]);
        // overlapping windows add
        let y = Tensor::from_f32(vec![1, 3, 3], vec![0., 0., 0., 0., 9., 0., 0., 0., 0.]);
        let (o, i) = max_pool2d_with_indices(&y, &pool(2, &[1], 0, 1, false)).expect("ok");
        assert_eq!(i.to_i64_vec(), vec![4; 4]);
        let gx =
            max_pool2d_with_indices_backward(&Tensor::from_f32(vec![1, 2, 2], vec![1.; 4]), &y, &i)
                .expect("ok");
        assert_eq!(gx.to_f32_vec()[4], 4.);
        assert_eq!(o.shape(), &[1, 2, 2]);
        let bad = Tensor::from_i64(vec![1, 2, 2], vec![9; 4]);
        assert!(max_pool2d_with_indices_backward(
            &Tensor::from_f32(vec![1, 2, 2], vec![1.; 4]),
            &y,
            &bad
        )
        .is_err());
    }

    /// Two NaNs in a window: the later one's position, as PyTorch's CPU kernel keeps it; and
    /// planes shared among a pool's threads give the one-thread values and positions.
    #[test]
    fn the_last_nan_wins_and_threads_keep_the_result() {
        let x = Tensor::from_f32(vec![1, 1, 2, 2], vec![f32::NAN, 1., 2., f32::NAN]);
        let (_, i) = max_pool2d_with_indices(&x, &pool(2, &[], 0, 1, false)).expect("ok");
        assert_eq!(i.to_i64_vec(), vec![3]);
        let n = 8 * 16 * 24 * 24;
        let v: Vec<f32> = (0..n)
            .map(|k| {
                if k % 97 == 5 {
                    f32::NAN
                } else {
                    ((k * 7919) % 1000) as f32
                }
            })
            .collect();
        let x = Tensor::from_f32(vec![8, 16, 24, 24], v);
        let p = pool(3, &[2], 1, 1, false);
        let (one, three) = crate::cpu::alone_and_in_three_threads(|| {
            let (o, i) = max_pool2d_with_indices(&x, &p).expect("ok");
            (
                o.to_f32_vec()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                i.to_i64_vec(),
            )
        });
        assert!(one.1.len() >= PARALLEL_POOL);
        assert_eq!(one, three);
    }
}
