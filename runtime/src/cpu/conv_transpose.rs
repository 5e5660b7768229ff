//! Transposed convolution (`torch.convolution(transposed=True)`, `conv_transpose1d/2d/3d`) as
//! one product and a scatter, the way PyTorch's CPU kernels compute a convolution's input
//! gradient. Per group, `cols = W^T @ X` (`[C_out/g * taps, positions]`) holds what every
//! input element contributes under every tap, and col2im adds each into the output element
//! that tap lands on.
//!
//! The composite every backend has (`exec/conv_transpose.rs`: the input spread out by the
//! stride, convolved by the flipped weight) multiplies `1 - 1/stride^d` of its products by the
//! zeros it inserted, and copies the weight flipped and transposed first; on ResNet-18-64's
//! stride-2 input gradients that made one convolution 6x the work it needs. This one reads the
//! weight in place (its transpose is a column-major operand) and touches no zero.

use super::buffer_pool as pool;
use super::conv::{inside, per_dim};
use super::gemm::{gemm_cols_a_shared, written_by_products, Gemm};
use crate::tensor::{Dims, Tensor};
use tracepass_ir::DType;

/// The checked shape of one transposed convolution, batched (`x` `[N, C_in, *in]`, `w`
/// `[C_in, C_out / groups, *kernel]`).
#[derive(Clone, Debug)]
struct Geometry {
    n: usize,
    cin: usize,
    cout: usize,
    groups: usize,
    input: Dims<usize>,
    kernel: Dims<usize>,
    out: Dims<usize>,
    stride: Dims<usize>,
    padding: Dims<usize>,
    dilation: Dims<usize>,
}

impl Geometry {
    #[allow(clippy::too_many_arguments)]
    fn new(
        x: &[usize],
        w: &[usize],
        stride: &[i64],
        padding: &[i64],
        output_padding: &[i64],
        dilation: &[i64],
        groups: i64,
    ) -> Result<Geometry, String> {
        if x.len() < 3 || w.len() != x.len() {
            return Err(format!(
                "conv_transpose: input {x:?} must be [N, C_in, *spatial] and the weight {w:?} [C_in, C_out/groups, *kernel] of the same rank"
            ));
        }
        let d = x.len() - 2;
        let groups = usize::try_from(groups)
            .ok()
            .filter(|g| *g >= 1 && w[0].is_multiple_of(*g))
            .ok_or_else(|| {
                format!(
                    "conv_transpose: {groups} groups do not divide the weight's {} input channels",
                    w[0]
                )
            })?;
        if x[1] != w[0] {
            return Err(format!(
                "conv_transpose: input {x:?} has {} channels, weight {w:?} expects {}",
                x[1], w[0]
            ));
        }
        let stride = per_dim(stride, d, "stride", 1)?;
        let padding = per_dim(padding, d, "padding", 0)?;
        let output_padding = per_dim(output_padding, d, "output_padding", 0)?;
        let dilation = per_dim(dilation, d, "dilation", 1)?;
        // the lengths in signed arithmetic: a padding can exceed what the input gives
        let mut out = Dims::new();
        for j in 0..d {
            let [s, p, op, dl] =
                [stride[j], padding[j], output_padding[j], dilation[j]].map(|v| v as i64);
            // PyTorch's own condition: the extra row must be one the stride or dilation skipped
            if op >= s.max(dl) {
                return Err(format!(
                    "conv_transpose: output_padding {op} must be smaller than stride {s} or dilation {dl}"
                ));
            }
            let len = (x[2 + j] as i64 - 1) * s - 2 * p + dl * (w[2 + j] as i64 - 1) + op + 1;
            if len < 1 || x[2 + j] == 0 {
                return Err(format!(
                    "conv_transpose: input {x:?} by weight {w:?} gives output length {len} in spatial dim {j}"
                ));
            }
            out.push(len as usize);
        }
        Ok(Geometry {
            n: x[0],
            cin: x[1],
            cout: w[1] * groups,
            groups,
            input: Dims::from_slice(&x[2..]),
            kernel: Dims::from_slice(&w[2..]),
            out,
            stride,
            padding,
            dilation,
        })
    }
}

/// Adds one sample's columns into its output channels: `out` is `[channels, *out]` (the
/// sample's channels of one group, or a block of them starting at channel `c0` of the group),
/// `cols` the group's `[cog * taps, row_len]` product with this sample's positions from
/// column `first_col`. Each output element gets its terms tap by tap in order, whichever
/// thread adds them, so the sum does not depend on the thread count.
fn col2im<T: Gemm>(
    out: &mut [T],
    c0: usize,
    cols: &[T],
    row_len: usize,
    first_col: usize,
    g: &Geometry,
) {
    if g.input.len() == 2 {
        return col2im_2d(out, c0, cols, row_len, first_col, g);
    }
    let d = g.input.len();
    let kp: usize = g.kernel.iter().product();
    let ip: usize = g.input.iter().product();
    let opn: usize = g.out.iter().product();
    let (il, ol) = (g.input[d - 1], g.out[d - 1]);
    let (st, pd, dl) = (g.stride[d - 1], g.padding[d - 1], g.dilation[d - 1]);
    let outer = ip / il.max(1);
    let out_strides = crate::tensor::contiguous_strides(&g.out);
    let mut kidx: Dims<usize> = Dims::from_elem(0, d);
    let mut iidx: Dims<usize> = Dims::from_elem(0, d);
    for (c, oc) in out.chunks_exact_mut(opn.max(1)).enumerate() {
        for k in 0..kp {
            let mut r = k;
            for j in (0..d).rev() {
                kidx[j] = r % g.kernel[j];
                r /= g.kernel[j];
            }
            let at = ((c0 + c) * kp + k) * row_len + first_col;
            let row = &cols[at..at + ip];
            // the last dim: input `i` lands on output `i * stride + off`
            let off = (kidx[d - 1] * dl) as isize - pd as isize;
            let (lo, hi) = inside(off, st, ol, il);
            if lo >= hi {
                continue;
            }
            iidx.iter_mut().for_each(|i| *i = 0);
            for seg in 0..outer {
                if seg > 0 {
                    for j in (0..d - 1).rev() {
                        iidx[j] += 1;
                        if iidx[j] < g.input[j] {
                            break;
                        }
                        iidx[j] = 0;
                    }
                }
                let mut base = 0isize;
                let mut lands = true;
                for j in 0..d - 1 {
                    let o = (iidx[j] * g.stride[j] + kidx[j] * g.dilation[j]) as isize
                        - g.padding[j] as isize;
                    if o < 0 || o >= g.out[j] as isize {
                        lands = false;
                        break;
                    }
                    base += o * out_strides[j] as isize;
                }
                if !lands {
                    continue;
                }
                let start = (base + off + (lo * st) as isize) as usize;
                add_run(&mut oc[start..], &row[seg * il + lo..seg * il + hi], st);
            }
        }
    }
}

/// Adds `src` into every `step`-th element of `dst` from the first.
#[inline]
fn add_run<T: Gemm>(dst: &mut [T], src: &[T], step: usize) {
    if step == 1 {
        dst[..src.len()]
            .iter_mut()
            .zip(src)
            .for_each(|(o, &v)| *o = *o + v);
    } else {
        for (o, &v) in dst.iter_mut().step_by(step).zip(src) {
            *o = *o + v;
        }
    }
}

/// [`col2im`] for two spatial dims, the common case, with the loops written out: the late
/// layers of a CNN have rows of two or four positions, where the N-d walk spends its time on
/// index arithmetic.
fn col2im_2d<T: Gemm>(
    out: &mut [T],
    c0: usize,
    cols: &[T],
    row_len: usize,
    first_col: usize,
    g: &Geometry,
) {
    let (ih, iw) = (g.input[0], g.input[1]);
    let (kh, kw) = (g.kernel[0], g.kernel[1]);
    let (oh, ow) = (g.out[0], g.out[1]);
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (ph, pw) = (g.padding[0] as isize, g.padding[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    for (c, oc) in out.chunks_exact_mut((oh * ow).max(1)).enumerate() {
        for ky in 0..kh {
            // the input rows whose output row `iy * sh + ky * dh - ph` is inside
            let (ylo, yhi) = inside(ky as isize * dh as isize - ph, sh, oh, ih);
            for kx in 0..kw {
                let off = (kx * dw) as isize - pw;
                let (lo, hi) = inside(off, sw, ow, iw);
                if lo >= hi || ylo >= yhi {
                    continue;
                }
                let at = (((c0 + c) * kh + ky) * kw + kx) * row_len + first_col;
                let row = &cols[at..at + ih * iw];
                for iy in ylo..yhi {
                    let oy = (iy * sh + ky * dh) as isize - ph;
                    let start = oy as usize * ow + (off + (lo * sw) as isize) as usize;
                    add_run(&mut oc[start..], &row[iy * iw + lo..iy * iw + hi], sw);
                }
            }
        }
    }
}

/// How many samples one product covers: side by side they give the product `P * batch`
/// columns (the late layers of a CNN have a handful of positions per sample), with the
/// product kept under 4 Mi elements.
fn samples_per_product(n: usize, ip: usize, rows: usize) -> usize {
    const WANT_COLUMNS: usize = 512;
    const MAX_COLS_ELEMS: usize = 1 << 22;
    if ip >= WANT_COLUMNS || n <= 1 {
        return 1;
    }
    let by_width = WANT_COLUMNS.div_ceil(ip.max(1));
    let by_memory = (MAX_COLS_ELEMS / (rows * ip).max(1)).max(1);
    by_width.min(by_memory).min(n)
}

/// Products smaller than this (output elements) add their columns on one thread.
const PARALLEL_COL2IM: usize = 1 << 15;

fn conv_transpose_typed<T: Gemm + Default + Send + Sync>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    g: &Geometry,
) -> Result<Vec<T>, String> {
    use rayon::prelude::*;
    let (cig, cog) = (g.cin / g.groups, g.cout / g.groups);
    let kp: usize = g.kernel.iter().product();
    let ip: usize = g.input.iter().product();
    let opn: usize = g.out.iter().product();
    let rows = cog * kp;
    let mut out = pool::filled(g.n * g.cout * opn, T::ZERO);
    if let Some(b) = bias {
        for (k, plane) in out.chunks_mut(opn.max(1)).enumerate() {
            plane.fill(b[k % g.cout]);
        }
    }
    let batch = samples_per_product(g.n, ip, rows);
    let width = batch * ip;
    let mut xb = if batch > 1 {
        pool::filled(cig * width, T::ZERO)
    } else {
        Vec::new()
    };
    let mut cols = written_by_products(rows * width, cig);
    let threads = super::pool_threads();
    for n0 in (0..g.n).step_by(batch) {
        let nb = batch.min(g.n - n0);
        let used = nb * ip;
        for grp in 0..g.groups {
            let sample = |n: usize| &x[(n * g.cin + grp * cig) * ip..][..cig * ip];
            // the samples' channels of this group side by side, `[cig, nb * ip]`
            let b: &[T] = if batch > 1 {
                for k in 0..cig {
                    for s in 0..nb {
                        let src = &sample(n0 + s)[k * ip..(k + 1) * ip];
                        xb[k * used + s * ip..][..ip].copy_from_slice(src);
                    }
                }
                &xb[..cig * used]
            } else {
                sample(n0)
            };
            // the group's weight `[cig, cog * taps]`, read transposed
            let wg = &w[grp * cig * rows..(grp + 1) * cig * rows];
            gemm_cols_a_shared(rows, cig, used, (wg, rows), b, &mut cols[..rows * used])?;
            let product = &cols[..rows * used];
            let per_sample = g.cout * opn;
            let block = &mut out[n0 * per_sample..(n0 + nb) * per_sample];
            let group = grp * cog * opn..(grp + 1) * cog * opn;
            if threads <= 1 || block.len() < PARALLEL_COL2IM {
                for (s, sample) in block.chunks_exact_mut(per_sample).enumerate() {
                    col2im(&mut sample[group.clone()], 0, product, used, s * ip, g);
                }
            } else if nb >= threads {
                block
                    .par_chunks_exact_mut(per_sample)
                    .enumerate()
                    .for_each(|(s, sample)| {
                        col2im(&mut sample[group.clone()], 0, product, used, s * ip, g)
                    });
            } else {
                let per_block = cog.div_ceil(threads * 2).max(1);
                for (s, sample) in block.chunks_exact_mut(per_sample).enumerate() {
                    sample[group.clone()]
                        .par_chunks_mut(per_block * opn)
                        .enumerate()
                        .for_each(|(i, part)| {
                            col2im(part, i * per_block, product, used, s * ip, g)
                        });
                }
            }
        }
    }
    pool::give_scratch(xb);
    pool::give_scratch(cols);
    Ok(out)
}

/// `torch.convolution(x, w, bias, stride, padding, dilation, transposed=True, output_padding,
/// groups)`: `x` is `[N, C_in, *spatial]` or unbatched `[C_in, *spatial]` (1, 2, 3 or more
/// spatial dims), `w` is `[C_in, C_out / groups, *kernel]`; each per-dim parameter is one int
/// for all dims or one per dim. f32, f64, and bf16/f16 (computed in f32 and rounded).
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    output_padding: &[i64],
    dilation: &[i64],
    groups: i64,
) -> Result<Tensor, String> {
    if x.dtype() != w.dtype() || bias.is_some_and(|b| b.dtype() != x.dtype()) {
        return Err(format!(
            "conv_transpose: input {}, weight {} and bias {:?} must share a dtype",
            x.dtype(),
            w.dtype(),
            bias.map(|b| b.dtype())
        ));
    }
    // an unbatched input is a batch of one
    let unbatched = x.shape().len() + 1 == w.shape().len();
    let mut xshape: Dims<usize> = Dims::new();
    if unbatched {
        xshape.push(1);
    }
    xshape.extend_from_slice(x.shape());
    let g = Geometry::new(
        &xshape,
        w.shape(),
        stride,
        padding,
        output_padding,
        dilation,
        groups,
    )?;
    if let Some(b) = bias {
        if b.shape() != [g.cout] {
            return Err(format!(
                "conv_transpose: bias {:?} must be [{}]",
                b.shape(),
                g.cout
            ));
        }
    }
    let mut shape: Dims<usize> = Dims::new();
    if !unbatched {
        shape.push(g.n);
    }
    shape.push(g.cout);
    shape.extend_from_slice(&g.out);
    let dtype = x.dtype();
    match dtype {
        DType::F64 => {
            let (Some(xs), Some(ws)) = (x.elems::<f64>(), w.elems::<f64>()) else {
                return Err("conv_transpose: f64 storage".into());
            };
            let bs = bias.and_then(|b| b.elems::<f64>());
            let out = conv_transpose_typed::<f64>(&xs, &ws, bs.as_deref(), &g)?;
            Ok(Tensor::from_f64(shape, out))
        }
        DType::F32 | DType::BF16 | DType::F16 => {
            let (xs, ws) = (super::conv::f32_elems(x), super::conv::f32_elems(w));
            let bs = bias.map(super::conv::f32_elems);
            let out = conv_transpose_typed::<f32>(&xs, &ws, bs.as_deref(), &g)?;
            let out = Tensor::from_f32(shape, out);
            pool::give_cow(xs);
            pool::give_cow(ws);
            bs.map(pool::give_cow);
            if dtype == DType::F32 {
                Ok(out)
            } else {
                out.to_dtype(dtype)
                    .ok_or_else(|| format!("conv_transpose: cannot round to {dtype}"))
            }
        }
        other => Err(format!(
            "conv_transpose: dtype {other} is not supported by the cpu backend"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values in [-1, 1] that differ with `seed`.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| ((i as f64 + 0.5) * (0.37 + seed as f64 * 0.013)).sin())
            .collect()
    }

    fn f32_tensor(shape: &[usize], seed: u64) -> Tensor {
        let v = values(shape.iter().product(), seed);
        Tensor::from_f32(shape, v.iter().map(|&x| x as f32).collect::<Vec<_>>())
    }

    /// The composite every backend has: the input spread out by the stride and padded, by the
    /// weight transposed per group and flipped, through the ordinary convolution.
    #[allow(clippy::too_many_arguments)]
    fn through_convolution(
        x: &Tensor,
        w: &Tensor,
        stride: &[i64],
        padding: &[i64],
        output_padding: &[i64],
        dilation: &[i64],
        groups: usize,
    ) -> Tensor {
        let ws = w.shape().to_vec();
        let d = ws.len() - 2;
        let (cig, cog) = (ws[0] / groups, ws[1]);
        let grouped: Vec<usize> = [groups, cig, cog].iter().chain(&ws[2..]).copied().collect();
        let flat: Vec<usize> = [groups * cog, cig]
            .iter()
            .chain(&ws[2..])
            .copied()
            .collect();
        let perm: Vec<usize> = [0, 2, 1].into_iter().chain(3..3 + d).collect();
        let wt = w
            .reshape(&grouped)
            .and_then(|t| t.permute(&perm))
            .map(|t| t.contiguous())
            .and_then(|t| t.reshape(&flat))
            .unwrap_or_else(|e| panic!("{e}"));
        let flips: Vec<i64> = (2..2 + d as i64).collect();
        let wf = crate::cpu::kernels::flip(&wt, &flips).unwrap_or_else(|e| panic!("{e}"));
        let mut config = vec![(0, 0, 0); 2];
        for j in 0..d {
            let edge = dilation[j] * (ws[2 + j] as i64 - 1) - padding[j];
            config.push((edge, edge + output_padding[j], stride[j] - 1));
        }
        let xp = crate::cpu::kernels::pad(x, 0.0, &config).unwrap_or_else(|e| panic!("{e}"));
        crate::cpu::kernels::convolution(
            &xp,
            &wf,
            None,
            &[1],
            &[0],
            dilation,
            false,
            &[0],
            groups as i64,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Against the composite in f64 (the same sums in another order), on the shapes the
    /// pass `conv-input-grad` produces and on grouped, dilated and 1-d/3-d ones.
    #[test]
    fn matches_the_convolution_of_the_spread_input() {
        #[allow(clippy::type_complexity)]
        let cases: &[(&[usize], &[usize], &[i64], &[i64], &[i64], &[i64], usize)] = &[
            // ResNet's stride-2 input gradient: [8, 512, 2, 2] by [512, 256, 3, 3]
            (&[3, 16, 2, 2], &[16, 8, 3, 3], &[2], &[1], &[1], &[1], 1),
            (&[2, 6, 5, 4], &[6, 4, 3, 3], &[1], &[1], &[0], &[1], 1),
            (&[2, 6, 3, 3], &[6, 5, 1, 1], &[2], &[0], &[1], &[1], 1),
            (&[1, 4, 7], &[4, 3, 5], &[3], &[2], &[2], &[1], 2),
            (
                &[2, 6, 4, 5],
                &[6, 2, 3, 2],
                &[2, 1],
                &[1, 0],
                &[0, 0],
                &[2, 3],
                3,
            ),
            (
                &[1, 2, 3, 2, 3],
                &[2, 2, 2, 3, 2],
                &[2, 1, 2],
                &[0, 1, 1],
                &[1, 0, 0],
                &[1],
                1,
            ),
            // enough positions for one sample per product
            (&[2, 3, 24, 24], &[3, 4, 3, 3], &[1], &[1], &[0], &[1], 1),
        ];
        for (i, &(xs, ws, s, p, op, dl, groups)) in cases.iter().enumerate() {
            let d = ws.len() - 2;
            let full = |v: &[i64]| -> Vec<i64> {
                if v.len() == 1 {
                    vec![v[0]; d]
                } else {
                    v.to_vec()
                }
            };
            let (s, p, op, dl) = (full(s), full(p), full(op), full(dl));
            let x = Tensor::from_f64(xs, values(xs.iter().product(), 1 + i as u64));
            let w = Tensor::from_f64(ws, values(ws.iter().product(), 50 + i as u64));
            let got = conv_transpose(&x, &w, None, &s, &p, &op, &dl, groups as i64)
                .unwrap_or_else(|e| panic!("case {i}: {e}"));
            let want = through_convolution(&x, &w, &s, &p, &op, &dl, groups);
            assert_eq!(got.shape(), want.shape(), "case {i}");
            for (j, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                    "case {i} element {j}: {a} vs {b}"
                );
            }
        }
    }

    /// The rank's threads share the product by rows and the scatter by samples or channels;
    /// every output element is the same sum in the same order, so the bits do not move.
    #[test]
    fn a_thread_pool_gives_the_one_thread_bits() {
        for (xs, ws, stride) in [
            // the scatter shared by samples, then by blocks of channels
            (&[8usize, 64, 8, 8][..], &[64usize, 32, 3, 3][..], 2i64),
            (&[2, 32, 40, 40][..], &[32, 24, 3, 3][..], 1),
        ] {
            let x = f32_tensor(xs, 7);
            let w = f32_tensor(ws, 8);
            let b = f32_tensor(&[ws[1]], 9);
            let run = || {
                conv_transpose(&x, &w, Some(&b), &[stride], &[1], &[stride - 1], &[1], 1)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .to_f32_vec()
            };
            let (one, three) = crate::cpu::alone_and_in_three_threads(run);
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                three.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{xs:?} by {ws:?}"
            );
        }
    }

    /// An unbatched input gives an unbatched output, bf16 computes in f32 and rounds, and bad
    /// geometry is an error that names it.
    #[test]
    fn unbatched_low_precision_and_refusals() {
        let x = Tensor::from_f64([4, 3, 3], values(36, 3));
        let w = Tensor::from_f64([4, 2, 2, 2], values(32, 4));
        let batched = x.reshape([1, 4, 3, 3]).unwrap_or_else(|e| panic!("{e}"));
        let one = conv_transpose(&x, &w, None, &[2], &[0], &[0], &[1], 1)
            .unwrap_or_else(|e| panic!("{e}"));
        let many = conv_transpose(&batched, &w, None, &[2], &[0], &[0], &[1], 1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(one.shape(), &[2, 6, 6]);
        assert_eq!(one.to_f64_vec(), many.to_f64_vec());
        let (xb, wb) = (
            x.to_dtype(DType::BF16).unwrap_or_else(|| panic!("bf16")),
            w.to_dtype(DType::BF16).unwrap_or_else(|| panic!("bf16")),
        );
        let low = conv_transpose(&xb, &wb, None, &[2], &[0], &[0], &[1], 1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(low.dtype(), DType::BF16);
        let exact = conv_transpose(
            &xb.to_dtype(DType::F32).unwrap_or_else(|| panic!("f32")),
            &wb.to_dtype(DType::F32).unwrap_or_else(|| panic!("f32")),
            None,
            &[2],
            &[0],
            &[0],
            &[1],
            1,
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .to_dtype(DType::BF16)
        .unwrap_or_else(|| panic!("bf16"));
        assert_eq!(low.to_f64_vec(), exact.to_f64_vec());
        let err = |r: Result<Tensor, String>| r.err().unwrap_or_default();
        assert!(
            err(conv_transpose(&x, &w, None, &[1], &[0], &[1], &[1], 1)).contains("output_padding")
        );
        assert!(
            err(conv_transpose(&x, &w, None, &[1], &[3], &[0], &[1], 1)).contains("output length")
        );
        assert!(err(conv_transpose(&x, &w, None, &[1], &[0], &[0], &[1], 3)).contains("groups"));
        assert!(err(conv_transpose(&x, &w, None, &[0], &[0], &[0], &[1], 1)).contains("stride"));
    }
}
