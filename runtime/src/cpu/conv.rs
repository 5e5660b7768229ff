//! N-d convolution (`torch.convolution`, not transposed) as im2col + GEMM. Thunder writes the
//! convolution's backward as convolutions too (over padded, flipped and permuted operands), so
//! this one kernel serves both directions.

use super::buffer_pool as pool;
use super::gemm::{
    gemm_rows_shared as gemm_rows, gemm_rows_shared_strided, written_by_products, BLayout, Gemm,
};
use crate::tensor::{Dims, Tensor};
use tracepass_ir::DType;

/// Checked convolution geometry: N-d spatial sizes and per-dim parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Geometry {
    n: usize,
    cin: usize,
    cout: usize,
    groups: usize,
    spatial: Dims<usize>,
    kernel: Dims<usize>,
    out: Dims<usize>,
    stride: Dims<usize>,
    padding: Dims<usize>,
    dilation: Dims<usize>,
}

/// A convolution's per-group sizes: input channels `cg`, output channels `coutg`, output
/// positions `op` and input positions `sp` of a sample, and the unfolded rows `kc` (`cg` times
/// the kernel's taps).
struct Sizes {
    cg: usize,
    coutg: usize,
    op: usize,
    sp: usize,
    kc: usize,
}

/// A per-dim parameter: one value for every dim, or one per dim (`(1,)` in Thunder's traces).
pub(crate) fn per_dim(v: &[i64], d: usize, what: &str, min: i64) -> Result<Dims<usize>, String> {
    let full: Dims<i64> = match v.len() {
        1 => Dims::from_elem(v[0], d),
        n if n == d => Dims::from_slice(v),
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
    Ok(full.into_iter().map(|x| x as usize).collect())
}

impl Geometry {
    fn new(
        x: &[usize],
        w: &[usize],
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        groups: i64,
    ) -> Result<Geometry, String> {
        if x.len() < 3 || w.len() != x.len() {
            return Err(format!(
                "convolution: input {x:?} must be [N, C, *spatial] and the weight {w:?} [C_out, C_in/groups, *kernel] of the same rank"
            ));
        }
        let d = x.len() - 2;
        if groups < 1 {
            return Err(format!(
                "convolution: groups must be positive, got {groups}"
            ));
        }
        let groups = groups as usize;
        let (n, cin, cout) = (x[0], x[1], w[0]);
        if cin % groups != 0 || cout % groups != 0 || w[1] * groups != cin {
            return Err(format!(
                "convolution: input {x:?} and weight {w:?} do not fit {groups} groups"
            ));
        }
        let stride = per_dim(stride, d, "stride", 1)?;
        let padding = per_dim(padding, d, "padding", 0)?;
        let dilation = per_dim(dilation, d, "dilation", 1)?;
        let spatial = Dims::from_slice(&x[2..]);
        let kernel = Dims::from_slice(&w[2..]);
        let mut out = Dims::with_capacity(d);
        for j in 0..d {
            let span = dilation[j] * (kernel[j].max(1) - 1) + 1;
            let padded = spatial[j] + 2 * padding[j];
            if kernel[j] == 0 || padded < span {
                return Err(format!(
                    "convolution: dim {j}: input {} padded by {} is smaller than the dilated kernel {span}",
                    spatial[j], padding[j]
                ));
            }
            out.push((padded - span) / stride[j] + 1);
        }
        Ok(Geometry {
            n,
            cin,
            cout,
            groups,
            spatial,
            kernel,
            out,
            stride,
            padding,
            dilation,
        })
    }

    /// Where a contiguous `[N, C, *spatial]` input has its samples and channels.
    fn contiguous_input(&self) -> InputAt {
        let sp: usize = self.spatial.iter().product();
        InputAt {
            sample: self.cin * sp,
            channel: sp,
        }
    }

    /// Whether the convolution runs as products over several samples side by side (or by
    /// windows), which read the input through [`InputAt`] and can give either
    /// [`OutLayout`]; the one-sample products need both contiguous.
    fn runs_batched(&self) -> bool {
        let Sizes { op, kc, .. } = self.sizes();
        samples_per_product(self.n, op, kc) > 1 || self.unfolds_by_window()
    }

    /// The products' sizes, derived once for the kernels that share them.
    fn sizes(&self) -> Sizes {
        let cg = self.cin / self.groups;
        let kp: usize = self.kernel.iter().product();
        Sizes {
            cg,
            coutg: self.cout / self.groups,
            op: self.out.iter().product(),
            sp: self.spatial.iter().product(),
            kc: cg * kp,
        }
    }

    /// Whether the unfolded matrix is better built window by window ([`im2col_windows_2d`]):
    /// two spatial dims and a kernel wider than the output, as in Thunder's weight gradient
    /// (a 16x16 "kernel" over 3x3 outputs), where a row of the usual unfolding holds 3
    /// elements and a window row holds 16.
    fn unfolds_by_window(&self) -> bool {
        self.spatial.len() == 2 && self.kernel[1] > self.out[1]
    }

    fn is_pointwise(&self) -> bool {
        self.kernel.iter().all(|&k| k == 1)
            && self.stride.iter().all(|&s| s == 1)
            && self.padding.iter().all(|&p| p == 0)
    }
}

/// The steps `t` in `0..count` whose input index `first + t * step` lies in `0..size`, as
/// `lo..hi` (`lo >= hi` when none does): the part of an unfolded row that is not padding.
pub(crate) fn inside(first: isize, step: usize, size: usize, count: usize) -> (usize, usize) {
    let lo = if first >= 0 {
        0
    } else {
        ((-first) as usize).div_ceil(step).min(count)
    };
    let last = size as isize - 1 - first;
    let hi = if last < 0 {
        0
    } else {
        (last as usize / step + 1).min(count)
    };
    (lo, hi)
}

/// One unfolded row: `line[first + t * step]` at each step `t` in `inside` (from [`inside`]),
/// zero (padding) elsewhere.
fn unfold_row<T: Copy + Default>(
    dst: &mut [T],
    line: &[T],
    first: isize,
    step: usize,
    (lo, hi): (usize, usize),
) {
    if lo >= hi {
        dst.fill(T::default());
        return;
    }
    dst[..lo].fill(T::default());
    dst[hi..].fill(T::default());
    let start = (first + (lo * step) as isize) as usize;
    if step == 1 {
        super::strided::copy_run_init(&mut dst[lo..hi], &line[start..start + hi - lo]);
        return;
    }
    for (o, &v) in dst[lo..hi]
        .iter_mut()
        .zip(line[start..].iter().step_by(step))
    {
        *o = v;
    }
}

/// Unfolds one sample's `cg` channels (`x`, channel `c`'s `[*spatial]` at `c * cs`) into
/// `col`, `[cg * prod(kernel), prod(out)]`: row `(c, k)` holds, for every output position, the
/// input under kernel tap `k` (zero where that falls in the padding). Rows are `row_len` apart
/// in `col` and the sample's columns start at `first_col`, so several samples can share one
/// wide matrix.
fn im2col<T: Copy + Default>(
    x: &[T],
    (cg, cs): (usize, usize),
    g: &Geometry,
    col: &mut [T],
    row_len: usize,
    first_col: usize,
) {
    if g.spatial.len() == 2 {
        return im2col_2d(x, (cg, cs), g, col, row_len, first_col);
    }
    let d = g.spatial.len();
    let kp: usize = g.kernel.iter().product();
    let op: usize = g.out.iter().product();
    let sp: usize = g.spatial.iter().product();
    let (ol, sl) = (g.out[d - 1], g.spatial[d - 1]);
    let (st, pd, dl) = (g.stride[d - 1], g.padding[d - 1] as i64, g.dilation[d - 1]);
    let outer = op / ol.max(1);
    let in_strides = crate::tensor::contiguous_strides(&g.spatial);
    let mut kidx = vec![0usize; d];
    let mut oidx = vec![0usize; d.saturating_sub(1)];
    for c in 0..cg {
        let xc = &x[c * cs..c * cs + sp];
        for k in 0..kp {
            // kernel tap multi-index
            let mut r = k;
            for j in (0..d).rev() {
                kidx[j] = r % g.kernel[j];
                r /= g.kernel[j];
            }
            let at = (c * kp + k) * row_len + first_col;
            let row = &mut col[at..at + op];
            // the last dim's tap offset and the output range that lands inside the input
            let off = (kidx[d - 1] * dl) as i64 - pd;
            let (lo, hi) = inside(off as isize, st, sl, ol);
            oidx.iter_mut().for_each(|o| *o = 0);
            for seg in 0..outer {
                if seg > 0 {
                    for j in (0..d - 1).rev() {
                        oidx[j] += 1;
                        if oidx[j] < g.out[j] {
                            break;
                        }
                        oidx[j] = 0;
                    }
                }
                let dst = &mut row[seg * ol..(seg + 1) * ol];
                let mut base = 0i64;
                let mut in_image = true;
                for j in 0..d - 1 {
                    let i = (oidx[j] * g.stride[j] + kidx[j] * g.dilation[j]) as i64
                        - g.padding[j] as i64;
                    if i < 0 || i >= g.spatial[j] as i64 {
                        in_image = false;
                        break;
                    }
                    base += i * in_strides[j] as i64;
                }
                if !in_image {
                    dst.fill(T::default());
                    continue;
                }
                let line = &xc[base as usize..base as usize + sl];
                unfold_row(dst, line, off as isize, st, (lo, hi));
            }
        }
    }
}

/// [`im2col`] for two spatial dims, the common case, with the loops written out: Thunder's
/// weight gradient is a convolution with a large kernel and a few output positions, where
/// the N-d walk spends its time on index arithmetic for rows of three or four elements.
fn im2col_2d<T: Copy + Default>(
    x: &[T],
    (cg, cs): (usize, usize),
    g: &Geometry,
    col: &mut [T],
    row_len: usize,
    first_col: usize,
) {
    let (ih, iw) = (g.spatial[0], g.spatial[1]);
    let (kh, kw) = (g.kernel[0], g.kernel[1]);
    let (oh, ow) = (g.out[0], g.out[1]);
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (ph, pw) = (g.padding[0] as isize, g.padding[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    for c in 0..cg {
        let xc = &x[c * cs..c * cs + ih * iw];
        for ky in 0..kh {
            for kx in 0..kw {
                let at = ((c * kh + ky) * kw + kx) * row_len + first_col;
                let row = &mut col[at..at + oh * ow];
                // the output columns whose input column `ox * sw + off` is inside the image
                let off = (kx * dw) as isize - pw;
                let (lo, hi) = inside(off, sw, iw, ow);
                for (oy, dst) in row.chunks_exact_mut(ow.max(1)).enumerate() {
                    let iy = (oy * sh + ky * dh) as isize - ph;
                    if iy < 0 || iy >= ih as isize {
                        dst.fill(T::default());
                        continue;
                    }
                    let line = &xc[iy as usize * iw..(iy as usize + 1) * iw];
                    unfold_row(dst, line, off, sw, (lo, hi));
                }
            }
        }
    }
}

/// The transpose of [`im2col_2d`]'s matrix for one sample (`x`, channel `c`'s `[ih, iw]` at
/// `c * cs`): row `p` of `col` (at `first_row`, rows `kc` long) holds output position `p`'s
/// window, the input under every tap `(c, ky, kx)` in the weight's order (zero in the
/// padding), so that a window's row along `kx` is one run of the input.
fn im2col_windows_2d<T: Copy + Default>(
    x: &[T],
    (cg, cs): (usize, usize),
    g: &Geometry,
    col: &mut [T],
    first_row: usize,
) {
    let (ih, iw) = (g.spatial[0], g.spatial[1]);
    let (kh, kw) = (g.kernel[0], g.kernel[1]);
    let (oh, ow) = (g.out[0], g.out[1]);
    let (sh, sw) = (g.stride[0], g.stride[1]);
    let (ph, pw) = (g.padding[0] as isize, g.padding[1] as isize);
    let (dh, dw) = (g.dilation[0], g.dilation[1]);
    let kc = cg * kh * kw;
    for oy in 0..oh {
        for ox in 0..ow {
            let at = (first_row + oy * ow + ox) * kc;
            let row = &mut col[at..at + kc];
            // the taps `kx` whose input column `ox * sw + kx * dw - pw` is inside the image
            let x0 = (ox * sw) as isize - pw;
            let (lo, hi) = inside(x0, dw, iw, kw);
            for (r, dst) in row.chunks_exact_mut(kw).enumerate() {
                let (c, ky) = (r / kh, r % kh);
                let iy = (oy * sh + ky * dh) as isize - ph;
                if iy < 0 || iy >= ih as isize {
                    dst.fill(T::default());
                    continue;
                }
                let at = c * cs + iy as usize * iw;
                unfold_row(dst, &x[at..at + iw], x0, dw, (lo, hi));
            }
        }
    }
}

/// The samples a product unfolds side by side: sample `s` is `x[first + s * stride..]`. (A
/// list of slices would be a heap allocation per product when the product covers many
/// samples, as Thunder's weight gradients do.)
#[derive(Clone, Copy)]
struct Samples<'a, T> {
    x: &'a [T],
    first: usize,
    stride: usize,
    count: usize,
}

impl<'a, T> Samples<'a, T> {
    fn one(x: &'a [T]) -> Self {
        Samples {
            x,
            first: 0,
            stride: 0,
            count: 1,
        }
    }

    fn get(&self, s: usize) -> &'a [T] {
        &self.x[self.first + s * self.stride..]
    }

    fn iter(self) -> impl Iterator<Item = &'a [T]> {
        (0..self.count).map(move |s| self.get(s))
    }
}

/// Unfolds `samples` (each `cg` channels of one sample, `cs` apart) side by side into `col`,
/// rows of `row_len`, sample `s` at column `s * op`. With more than one thread in the rank's
/// pool, a large matrix is filled by blocks of channels (whole rows) in parallel: a copy, so
/// the result is the same.
fn im2col_shared<T: Copy + Default + Send + Sync>(
    samples: Samples<'_, T>,
    (cg, cs): (usize, usize),
    g: &Geometry,
    col: &mut [T],
    row_len: usize,
    op: usize,
) {
    use rayon::prelude::*;
    let kp: usize = g.kernel.iter().product();
    let rows_per_channel = kp * row_len;
    let threads = super::pool_threads();
    let fill = |c0: usize, block: &mut [T]| {
        let cn = block.len() / rows_per_channel.max(1);
        for (s, xs) in samples.iter().enumerate() {
            im2col(&xs[c0 * cs..], (cn, cs), g, block, row_len, s * op);
        }
    };
    let total = cg * rows_per_channel;
    if threads <= 1 || cg < 2 || total < PARALLEL_IM2COL || rows_per_channel == 0 {
        fill(0, &mut col[..total]);
        return;
    }
    let per_block = cg.div_ceil(threads * 2);
    col[..total]
        .par_chunks_mut(per_block * rows_per_channel)
        .enumerate()
        .for_each(|(b, block)| fill(b * per_block, block));
}

/// [`im2col_windows_2d`] for `samples` side by side (sample `s` from row `s * op`), shared
/// among the rank's threads by samples when the matrix is large: a copy, so the result is the
/// same.
fn windows_shared<T: Copy + Default + Send + Sync>(
    samples: Samples<'_, T>,
    (cg, cs): (usize, usize),
    g: &Geometry,
    col: &mut [T],
    op: usize,
) {
    use rayon::prelude::*;
    let per_sample = op * cg * g.kernel.iter().product::<usize>();
    if per_sample == 0 {
        return;
    }
    if super::pool_threads() <= 1 || samples.count < 2 || col.len() < PARALLEL_IM2COL {
        for (s, xs) in samples.iter().enumerate() {
            im2col_windows_2d(xs, (cg, cs), g, col, s * op);
        }
        return;
    }
    col.par_chunks_mut(per_sample)
        .take(samples.count)
        .enumerate()
        .for_each(|(s, block)| im2col_windows_2d(samples.get(s), (cg, cs), g, block, 0));
}

/// Unfolded matrices smaller than this are filled on one thread.
const PARALLEL_IM2COL: usize = 1 << 16;

/// Where the input's elements lie: sample `n`, channel `c` at `n * sample + c * channel`.
/// Contiguous `[N, C, *spatial]` has `C * sp` and `sp`; a view of a contiguous `[C, N,
/// *spatial]` with its first two dims swapped, as Thunder reads the forward's input for a
/// weight gradient, has `sp` and `N * sp` (unfolded straight from its buffer, no copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InputAt {
    sample: usize,
    channel: usize,
}

/// How the result lies in its buffer: `[N, C_out, *out]`, or `[C_out, N, *out]` (returned
/// as a view with the first two dims swapped): Thunder's weight gradient, a `[C_in, C_out,
/// *taps]` convolution it permutes right back, is then a product's rows as they come and a
/// contiguous `[C_out, C_in, *taps]` gradient for the optimizer. The layout moves no bit:
/// every element is the same sum either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutLayout {
    Samples,
    Channels,
}

fn conv_typed<T: Gemm + Default>(
    (x, x_at): (&[T], InputAt),
    w: &[T],
    bias: Option<&[T]>,
    g: &Geometry,
    layout: OutLayout,
) -> Result<Vec<T>, String> {
    let Sizes {
        cg,
        coutg,
        op,
        sp,
        kc,
    } = g.sizes();
    // recycled buffers: fresh ones of this size come as new pages the kernel must zero; without
    // a bias every element is written by a product (or its copy-out), so none is zeroed first
    let mut out = match bias {
        Some(_) => pool::filled(g.n * g.cout * op, T::ZERO),
        None => written_by_products(g.n * g.cout * op, kc),
    };
    let beta = match bias {
        Some(b) => {
            for (k, row) in out.chunks_mut(op.max(1)).enumerate() {
                row.fill(b[k % g.cout]);
            }
            T::ONE
        }
        None => T::ZERO,
    };
    let pointwise = g.is_pointwise();
    if g.runs_batched() {
        let batch = samples_per_product(g.n, op, kc);
        conv_batched((x, x_at), w, bias.is_some(), g, batch, (&mut out, layout))?;
        return Ok(out);
    }
    if x_at != g.contiguous_input() || layout != OutLayout::Samples {
        return Err("convolution: a per-sample product needs a contiguous input and result".into());
    }
    // the unfolded matrix: im2col writes every element (zeros in the padding)
    let mut col = if pointwise {
        Vec::new()
    } else {
        pool::overwritten(kc * op)
    };
    for n in 0..g.n {
        for grp in 0..g.groups {
            let xs = &x[(n * g.cin + grp * cg) * sp..(n * g.cin + (grp + 1) * cg) * sp];
            let ws = &w[grp * coutg * kc..(grp + 1) * coutg * kc];
            let at = (n * g.cout + grp * coutg) * op;
            let dst = &mut out[at..at + coutg * op];
            if pointwise {
                gemm_rows(coutg, kc, op, ws, xs, beta, dst)?;
            } else {
                im2col_shared(Samples::one(xs), (cg, sp), g, &mut col, op, op);
                gemm_rows(coutg, kc, op, ws, &col, beta, dst)?;
            }
        }
    }
    pool::give_scratch(col);
    Ok(out)
}

/// How many samples one product should cover: a product per sample is `[C_out, K] @ [K, P]`
/// with `P` the sample's output positions, which for the late layers of a CNN (and for the
/// weight gradient Thunder writes as a convolution over the batch) is a handful of columns,
/// where a GEMM runs at a fraction of its speed. Side by side, samples give `P * batch`
/// columns; the unfolded matrix is kept under 4 Mi elements. Up to 2048 columns rather than
/// 512: with two threads each product shares out its unfolding and its rows (two hand-offs
/// between threads each), and fewer, wider products made ResNet-18-64 at one rank and two
/// threads 10-20% faster (`xtask bench-mid-one`, alternated), at one thread the same.
/// Evenly shared: ResNet-18-64's layer-3 weight gradients (256 samples of 9 positions) took
/// 2.7-3.5 ms each as 228 + 28 samples, 2.4-2.6 as 128 + 128 (one thread, `--timeline`).
fn samples_per_product(n: usize, op: usize, kc: usize) -> usize {
    const WANT_COLUMNS: usize = 2048;
    const MAX_COL_ELEMS: usize = 1 << 22;
    if op >= WANT_COLUMNS || n <= 1 {
        return 1;
    }
    let by_width = WANT_COLUMNS.div_ceil(op.max(1));
    let by_memory = (MAX_COL_ELEMS / (kc * op).max(1)).max(1);
    let most = by_width.min(by_memory).min(n);
    // as many products as `most` needs, sharing the samples evenly: 256 samples of 9
    // positions go as 128 + 128, not 228 + 28, whose second product is a narrow one
    n.div_ceil(n.div_ceil(most))
}

/// [`conv_typed`] with `batch` samples unfolded side by side into one `[K, batch * P]` matrix
/// per product; the `[C_out/groups, batch * P]` result is copied out sample by sample (onto the
/// bias already in `out` when there is one).
fn conv_batched<T: Gemm + Default>(
    (x, x_at): (&[T], InputAt),
    w: &[T],
    has_bias: bool,
    g: &Geometry,
    batch: usize,
    (out, layout): (&mut [T], OutLayout),
) -> Result<(), String> {
    let Sizes {
        cg, coutg, op, kc, ..
    } = g.sizes();
    if layout == OutLayout::Channels && (has_bias || g.groups != 1) {
        return Err("convolution: a channels-first result is for one group without bias".into());
    }
    let width = batch * op;
    // the unfolded matrix as `[K, columns]`, or by windows as its transpose
    let b_layout = if g.unfolds_by_window() {
        BLayout::Columns
    } else {
        BLayout::Rows
    };
    // unfolded sample by sample, every element written (zeros in the padding)
    let mut col = pool::overwritten(kc * width);
    // a channels-first result takes each product in place, its rows `N * P` apart
    let mut prod = match layout {
        OutLayout::Samples => written_by_products(coutg * width, kc),
        OutLayout::Channels => Vec::new(),
    };
    for n0 in (0..g.n).step_by(batch) {
        let nb = batch.min(g.n - n0);
        let cols = nb * op;
        for grp in 0..g.groups {
            // each sample's group of channels, from its first (the rest of the buffer: a
            // swapped input's channels lie `N * sp` apart)
            let samples = Samples {
                x,
                first: n0 * x_at.sample + grp * cg * x_at.channel,
                stride: x_at.sample,
                count: nb,
            };
            let at = (cg, x_at.channel);
            match b_layout {
                BLayout::Columns => windows_shared(samples, at, g, &mut col[..cols * kc], op),
                BLayout::Rows => im2col_shared(samples, at, g, &mut col, cols, op),
            }
            let ws = &w[grp * coutg * kc..(grp + 1) * coutg * kc];
            if layout == OutLayout::Channels {
                // `out` is `[C_out, N * P]`: the product is its columns `n0 * P..`
                let per_channel = g.n * op;
                let dst = (&mut out[n0 * op..], per_channel);
                gemm_rows_shared_strided(coutg, kc, cols, ws, &col, b_layout, T::ZERO, dst)?;
                continue;
            }
            let dst = (&mut prod[..], cols);
            gemm_rows_shared_strided(coutg, kc, cols, ws, &col, b_layout, T::ZERO, dst)?;
            // each sample's block of `out` gets its columns of the product; a copy, shared
            // among the rank's threads by samples when large (Thunder's weight gradients
            // write a whole `[C_in, C_out, kh, kw]` here)
            let per_sample = g.cout * op;
            let block = &mut out[n0 * per_sample..(n0 + nb) * per_sample];
            let copy_out = |s: usize, sample: &mut [T]| {
                for m in 0..coutg {
                    let src = &prod[m * cols + s * op..m * cols + (s + 1) * op];
                    let at = (grp * coutg + m) * op;
                    let dst = &mut sample[at..at + op];
                    if has_bias {
                        dst.iter_mut().zip(src).for_each(|(d, &v)| *d = *d + v);
                    } else {
                        super::strided::copy_run_init(dst, src);
                    }
                }
            };
            if super::pool_threads() > 1 && nb > 1 && block.len() >= PARALLEL_IM2COL {
                use rayon::prelude::*;
                block
                    .par_chunks_mut(per_sample)
                    .enumerate()
                    .for_each(|(s, sample)| copy_out(s, sample));
            } else {
                block
                    .chunks_mut(per_sample)
                    .enumerate()
                    .for_each(|(s, sample)| copy_out(s, sample));
            }
        }
    }
    pool::give_scratch(col);
    pool::give_scratch(prod);
    Ok(())
}

/// `torch.convolution(x, w, bias, stride, padding, dilation, transposed, output_padding,
/// groups)` for `transposed=False`: `x` is `[N, C_in, *spatial]` (1, 2 or 3 spatial dims, or
/// more), `w` is `[C_out, C_in / groups, *kernel]`; each per-dim parameter is one int for all
/// dims or one per dim. f32, f64, and bf16/f16 (computed in f32 and rounded).
#[allow(clippy::too_many_arguments)]
pub fn convolution(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    transposed: bool,
    output_padding: &[i64],
    groups: i64,
) -> Result<Tensor, String> {
    if transposed {
        return Err(
            "convolution: transposed convolution is not supported by the cpu backend".into(),
        );
    }
    if output_padding.iter().any(|&p| p != 0) {
        return Err(format!(
            "convolution: output_padding {output_padding:?} applies only to transposed convolution"
        ));
    }
    if x.dtype() != w.dtype() || bias.is_some_and(|b| b.dtype() != x.dtype()) {
        return Err(format!(
            "convolution: input {}, weight {} and bias {:?} must share a dtype",
            x.dtype(),
            w.dtype(),
            bias.map(|b| b.dtype())
        ));
    }
    let g = Geometry::new(x.shape(), w.shape(), stride, padding, dilation, groups)?;
    if let Some(b) = bias {
        if b.shape() != [g.cout] {
            return Err(format!(
                "convolution: bias {:?} must be [{}]",
                b.shape(),
                g.cout
            ));
        }
    }
    // An input that is a swapped view of a contiguous buffer is unfolded from that buffer
    // (where the products run over several samples); with the weight swapped too (Thunder's
    // weight gradient) the result is laid out channels first. Neither changes a bit.
    let batched = g.runs_batched();
    let swapped_x = batched.then(|| swapped_buffer(x)).flatten();
    let (x_in, x_at) = match &swapped_x {
        Some(buf) => (
            buf,
            InputAt {
                sample: g.spatial.iter().product(),
                channel: g.n * g.spatial.iter().product::<usize>(),
            },
        ),
        None => (x, g.contiguous_input()),
    };
    let layout =
        if swapped_x.is_some() && g.groups == 1 && bias.is_none() && swapped_buffer(w).is_some() {
            OutLayout::Channels
        } else {
            OutLayout::Samples
        };
    let mut shape: Dims<usize> = match layout {
        OutLayout::Samples => smallvec::smallvec![g.n, g.cout],
        OutLayout::Channels => smallvec::smallvec![g.cout, g.n],
    };
    shape.extend_from_slice(&g.out);
    let dtype = x.dtype();
    let out = match dtype {
        DType::F64 => {
            let (xs, ws) = (x_in.elems::<f64>(), w.elems::<f64>());
            let bs = bias.and_then(|b| b.elems::<f64>());
            let (Some(xs), Some(ws)) = (xs, ws) else {
                return Err("convolution: f64 storage".into());
            };
            let out = conv_typed::<f64>((&xs, x_at), &ws, bs.as_deref(), &g, layout)?;
            Tensor::from_f64(shape, out)
        }
        DType::F32 | DType::BF16 | DType::F16 => {
            let (xs, ws) = (f32_elems(x_in), f32_elems(w));
            let bs = bias.map(f32_elems);
            let out = conv_typed::<f32>((&xs, x_at), &ws, bs.as_deref(), &g, layout)?;
            let out = Tensor::from_f32(shape, out);
            // copies of strided operands (Thunder's permuted backward operands) go back
            pool::give_cow(xs);
            pool::give_cow(ws);
            bs.map(pool::give_cow);
            if dtype == DType::F32 {
                out
            } else {
                out.to_dtype(dtype)
                    .ok_or_else(|| format!("convolution: cannot round to {dtype}"))?
            }
        }
        other => {
            return Err(format!(
                "convolution: dtype {other} is not supported by the cpu backend"
            ))
        }
    };
    match layout {
        OutLayout::Samples => Ok(out),
        OutLayout::Channels => {
            let perm: Dims<usize> = [1, 0].into_iter().chain(2..out.shape().len()).collect();
            out.permute(&perm)
        }
    }
}

/// The contiguous tensor `t` is a view of with its first two dims swapped, if it is one and
/// is not itself contiguous.
fn swapped_buffer(t: &Tensor) -> Option<Tensor> {
    let r = t.shape().len();
    if r < 3 || t.is_contiguous() {
        return None;
    }
    let perm: Dims<usize> = [1, 0].into_iter().chain(2..r).collect();
    t.permute(&perm).ok().filter(Tensor::is_contiguous)
}

/// The elements as f32: borrowed for f32, converted for bf16/f16.
pub(crate) fn f32_elems(t: &Tensor) -> std::borrow::Cow<'_, [f32]> {
    match t.elems::<f32>() {
        Some(v) => v,
        None => t.to_f32_vec().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_shared_evenly_among_products() {
        // 256 samples of 9 positions: at most 228 a product, so two of 128 (not 228 + 28)
        assert_eq!(samples_per_product(256, 9, 128), 128);
        // what fits in one product stays one; a wide sample is one a product
        assert_eq!(samples_per_product(8, 16, 2304), 8);
        assert_eq!(samples_per_product(8, 4096, 27), 1);
        // every sample is covered, and no product exceeds the width the rule allows
        for (n, op) in [(7, 300), (100, 50), (513, 4), (3, 2047)] {
            let per = samples_per_product(n, op, 64);
            let products = n.div_ceil(per);
            assert!(
                per * products >= n && per * (products - 1) < n,
                "{n} x {op}"
            );
            assert!(per <= 2048usize.div_ceil(op), "{n} x {op}");
        }
    }

    /// The definition, for any number of spatial dims, in f64.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f64],
        xs: &[usize],
        w: &[f64],
        ws: &[usize],
        b: Option<&[f64]>,
        s: &[usize],
        p: &[usize],
        dl: &[usize],
        groups: usize,
    ) -> (Vec<usize>, Vec<f64>) {
        let d = xs.len() - 2;
        let out: Vec<usize> = (0..d)
            .map(|j| (xs[j + 2] + 2 * p[j] - dl[j] * (ws[j + 2] - 1) - 1) / s[j] + 1)
            .collect();
        let (n, cin, cout) = (xs[0], xs[1], ws[0]);
        let (cg, coutg) = (cin / groups, cout / groups);
        let op: usize = out.iter().product();
        let kp: usize = ws[2..].iter().product();
        let sp: usize = xs[2..].iter().product();
        let unravel = |mut i: usize, dims: &[usize]| {
            let mut v = vec![0; dims.len()];
            for j in (0..dims.len()).rev() {
                v[j] = i % dims[j];
                i /= dims[j];
            }
            v
        };
        let mut y = vec![0.0; n * cout * op];
        for bi in 0..n {
            for co in 0..cout {
                let grp = co / coutg;
                for o in 0..op {
                    let oi = unravel(o, &out);
                    let mut acc = b.map_or(0.0, |b| b[co]);
                    for ci in 0..cg {
                        for k in 0..kp {
                            let ki = unravel(k, &ws[2..]);
                            let mut pos = 0usize;
                            let mut inside = true;
                            for j in 0..d {
                                let i = (oi[j] * s[j] + ki[j] * dl[j]) as i64 - p[j] as i64;
                                if i < 0 || i >= xs[j + 2] as i64 {
                                    inside = false;
                                }
                                pos = pos * xs[j + 2] + i.max(0) as usize;
                            }
                            if inside {
                                let xv = x[(bi * cin + grp * cg + ci) * sp + pos];
                                acc += xv * w[(co * cg + ci) * kp + k];
                            }
                        }
                    }
                    y[(bi * cout + co) * op + o] = acc;
                }
            }
        }
        let mut shape = vec![n, cout];
        shape.extend(out);
        (shape, y)
    }

    fn data(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64 + seed) * 0.618).sin()).collect()
    }

    #[test]
    fn a_rank_with_threads_gives_the_one_thread_bits() {
        // big enough for the product's rows to be shared out (64 rows, 144 x 512 each) and
        // the unfolded matrix to be filled by blocks of channels: two samples side by side
        // (16x16), and one sample a product (32x32)
        for side in [16usize, 32] {
            let x = Tensor::from_f32(
                vec![4, 16, side, side],
                data(4 * 16 * side * side, 0.5)
                    .iter()
                    .map(|&v| v as f32)
                    .collect(),
            );
            let w = Tensor::from_f32(
                vec![64, 16, 3, 3],
                data(64 * 144, 1.5).iter().map(|&v| v as f32).collect(),
            );
            let run = || {
                convolution(&x, &w, None, &[1], &[1], &[1], false, &[0], 1)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .to_f32_vec()
            };
            let (one, three) = crate::cpu::alone_and_in_three_threads(run);
            assert_eq!(one.len(), 4 * 64 * side * side);
            assert!(one
                .iter()
                .zip(&three)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        // a weight gradient as Thunder writes it, unfolded by windows (samples in parallel)
        let x = Tensor::from_f32(
            vec![64, 8, 18, 18],
            data(64 * 8 * 18 * 18, 2.5)
                .iter()
                .map(|&v| v as f32)
                .collect(),
        );
        let w = Tensor::from_f32(
            vec![64, 8, 16, 16],
            data(64 * 8 * 256, 3.5).iter().map(|&v| v as f32).collect(),
        );
        let run = || {
            convolution(&x, &w, None, &[1], &[0], &[1], false, &[0], 1)
                .unwrap_or_else(|e| panic!("{e}"))
                .to_f32_vec()
        };
        let (one, three) = crate::cpu::alone_and_in_three_threads(run);
        assert_eq!(one.len(), 64 * 64 * 9);
        assert!(one
            .iter()
            .zip(&three)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        // a late layer's weight gradient: a 2x2 "kernel", 57 samples a product, each sample's
        // 128 x 9 outputs copied out by samples in parallel
        let x = Tensor::from_f32(
            vec![128, 8, 2, 2],
            data(128 * 32, 4.5).iter().map(|&v| v as f32).collect(),
        );
        let w = Tensor::from_f32(
            vec![128, 8, 2, 2],
            data(128 * 32, 5.5).iter().map(|&v| v as f32).collect(),
        );
        let run = || {
            convolution(&x, &w, None, &[1], &[1], &[1], false, &[0], 1)
                .unwrap_or_else(|e| panic!("{e}"))
                .to_f32_vec()
        };
        const { assert!(57 * 128 * 9 >= PARALLEL_IM2COL) };
        let (one, three) = crate::cpu::alone_and_in_three_threads(run);
        assert_eq!(one.len(), 128 * 128 * 9);
        assert!(one
            .iter()
            .zip(&three)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        // and it is the convolution: output (1, 2) at tap (2, 0) of sample 3, channel 5
        let (xs, ws) = (x.to_f32_vec(), w.to_f32_vec());
        let (n, co, oy, ox) = (3, 5, 2, 0);
        let mut want = 0f64;
        for c in 0..8 {
            for ky in 0..2 {
                for kx in 0..2 {
                    let (iy, ix) = (oy + ky, ox + kx);
                    if (1..3).contains(&iy) && (1..3).contains(&ix) {
                        let xv = xs[((n * 8 + c) * 2 + iy - 1) * 2 + ix - 1];
                        want += f64::from(xv) * f64::from(ws[((co * 8 + c) * 2 + ky) * 2 + kx]);
                    }
                }
            }
        }
        let got = f64::from(one[((n * 128 + co) * 3 + oy) * 3 + ox]);
        assert!((got - want).abs() < 1e-4, "{got} vs {want}");
    }

    fn swapped(t: &Tensor) -> Tensor {
        let perm: Vec<usize> = [1, 0].into_iter().chain(2..t.shape().len()).collect();
        t.permute(&perm).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Thunder's weight gradient reads both operands through views with batch and channels
    /// swapped; unfolded from their buffers and laid out channels first, it gives bit for
    /// bit what contiguous copies give (a fused trace may hand it a copy where the unfused one
    /// hands a view), and its result is a swapped view of a contiguous gradient. Over 3x3
    /// (stride 1 and 2: the convolution's dilation), 1x1 and 7x7 stride-2 gradients, one with
    /// padding of its own, one run by windows (a kernel wider than its output), in a thread
    /// pool, and a view of only one operand.
    #[test]
    fn swapped_operands_give_the_contiguous_bits() {
        // (x [N, C_in, H, W] as the forward has it, g [N, C_out, oh, ow], stride, padding,
        // dilation of the weight-gradient convolution)
        type Case = ([usize; 4], [usize; 4], i64, i64, i64);
        let cases: &[Case] = &[
            ([4, 6, 10, 10], [4, 5, 8, 8], 1, 0, 1),
            ([4, 6, 9, 9], [4, 5, 4, 4], 1, 0, 2),
            ([3, 4, 8, 8], [3, 7, 4, 4], 1, 0, 2),
            ([2, 3, 22, 22], [2, 4, 8, 8], 1, 0, 2),
            ([2, 3, 6, 7], [2, 4, 6, 7], 1, 1, 1),
            ([8, 64, 4, 4], [8, 32, 2, 2], 1, 0, 1),
            ([8, 16, 18, 18], [8, 16, 16, 16], 1, 0, 1),
        ];
        let bits = |t: &Tensor| {
            t.to_f32_vec()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        for (i, &(xs, gs, s, p, d)) in cases.iter().enumerate() {
            let f32s =
                |n: usize, seed: f64| data(n, seed).iter().map(|&v| v as f32).collect::<Vec<_>>();
            let x = Tensor::from_f32(xs, f32s(xs.iter().product(), 1.0 + i as f64));
            let g = Tensor::from_f32(gs, f32s(gs.iter().product(), 20.0 + i as f64));
            let (xv, gv) = (swapped(&x), swapped(&g));
            let conv = |a: &Tensor, b: &Tensor| {
                convolution(a, b, None, &[s], &[p], &[d], false, &[0], 1)
                    .unwrap_or_else(|e| panic!("case {i}: {e}"))
            };
            let want = conv(&xv.contiguous(), &gv.contiguous());
            let (got, in_pool) = crate::cpu::alone_and_in_three_threads(|| conv(&xv, &gv));
            assert_eq!(got.shape(), want.shape(), "case {i}");
            assert!(
                swapped(&got).is_contiguous(),
                "case {i}: {:?}",
                got.strides()
            );
            assert_eq!(bits(&got), bits(&want), "case {i}");
            assert_eq!(bits(&in_pool), bits(&want), "case {i} in a pool");
            // one swapped operand: unfolded from the buffer, laid out as usual
            let half = conv(&xv, &gv.contiguous());
            assert!(half.is_contiguous(), "case {i}");
            assert_eq!(bits(&half), bits(&want), "case {i}, the input swapped");
            let half = conv(&xv.contiguous(), &gv);
            assert_eq!(bits(&half), bits(&want), "case {i}, the weight swapped");
        }
    }

    #[test]
    fn im2col_matches_direct_convolution() {
        // (input, weight, stride, padding, dilation, groups, bias)
        type Case = (
            Vec<usize>,
            Vec<usize>,
            Vec<usize>,
            Vec<usize>,
            Vec<usize>,
            usize,
            bool,
        );
        let cases: Vec<Case> = vec![
            (
                vec![2, 3, 8, 8],
                vec![4, 3, 3, 3],
                vec![1, 1],
                vec![1, 1],
                vec![1, 1],
                1,
                true,
            ),
            (
                vec![2, 4, 9, 7],
                vec![6, 2, 3, 2],
                vec![2, 1],
                vec![1, 0],
                vec![1, 2],
                2,
                false,
            ),
            (
                vec![1, 4, 5, 5],
                vec![4, 1, 3, 3],
                vec![1, 2],
                vec![2, 1],
                vec![2, 1],
                4,
                true,
            ),
            (
                vec![2, 3, 6, 6],
                vec![5, 3, 1, 1],
                vec![1, 1],
                vec![0, 0],
                vec![1, 1],
                1,
                true,
            ),
            (
                vec![2, 3, 6, 6],
                vec![5, 3, 1, 1],
                vec![2, 2],
                vec![0, 0],
                vec![1, 1],
                1,
                false,
            ),
            (
                vec![3, 2, 11],
                vec![4, 2, 4],
                vec![3],
                vec![2],
                vec![2],
                1,
                true,
            ),
            (
                vec![1, 2, 4, 5, 3],
                vec![3, 2, 2, 3, 2],
                vec![1, 2, 1],
                vec![1, 1, 0],
                vec![1, 1, 2],
                1,
                true,
            ),
            // samples side by side in blocks of two (256 positions each), the last block one,
            // with a bias and a strided 1x1 kernel
            (
                vec![5, 2, 32, 16],
                vec![3, 2, 1, 1],
                vec![2, 1],
                vec![0, 0],
                vec![1, 1],
                1,
                true,
            ),
            // the cnn backward's weight gradient: batch and channels swapped, kernel = grad's plane
            (
                vec![8, 4, 10, 10],
                vec![16, 4, 8, 8],
                vec![1, 1],
                vec![0, 0],
                vec![1, 1],
                1,
                false,
            ),
            // unfolded by windows (a kernel wider than the output), with groups, a bias, and
            // stride, padding and dilation that put windows partly in the padding
            (
                vec![3, 4, 9, 12],
                vec![6, 2, 5, 7],
                vec![1, 2],
                vec![2, 3],
                vec![1, 2],
                2,
                true,
            ),
        ];
        for (xs, ws, s, p, dl, groups, with_bias) in cases {
            let x = data(xs.iter().product(), 0.0);
            let w = data(ws.iter().product(), 3.0);
            let b = data(ws[0], 7.0);
            let (shape, want) = naive(
                &x,
                &xs,
                &w,
                &ws,
                with_bias.then_some(&b[..]),
                &s,
                &p,
                &dl,
                groups,
            );
            let tx = Tensor::from_f64(xs.clone(), x.clone());
            let tw = Tensor::from_f64(ws.clone(), w.clone());
            let tb = Tensor::from_f64(vec![ws[0]], b.clone());
            let i = |v: &[usize]| v.iter().map(|&e| e as i64).collect::<Vec<_>>();
            let got = convolution(
                &tx,
                &tw,
                with_bias.then_some(&tb),
                &i(&s),
                &i(&p),
                &i(&dl),
                false,
                &[0],
                groups as i64,
            )
            .expect("valid");
            assert_eq!(got.shape(), &shape[..], "{xs:?} {ws:?}");
            for (g, e) in got.to_f64_vec().iter().zip(&want) {
                assert!((g - e).abs() < 1e-12, "{xs:?} {ws:?}: {g} vs {e}");
            }
            // f32 and bf16 agree to their precision
            let f = convolution(
                &tx.to_dtype(DType::F32).expect("f32"),
                &tw.to_dtype(DType::F32).expect("f32"),
                with_bias
                    .then(|| tb.to_dtype(DType::F32).expect("f32"))
                    .as_ref(),
                &i(&s),
                &i(&p),
                &i(&dl),
                false,
                &[0],
                groups as i64,
            )
            .expect("valid");
            let scale = want.iter().fold(0f64, |m, e| m.max(e.abs()));
            for (g, e) in f.to_f64_vec().iter().zip(&want) {
                assert!((g - e).abs() < 1e-5 * scale.max(1.0), "{g} vs {e}");
            }
        }
    }

    fn dot(a: &Tensor, b: &Tensor) -> f64 {
        a.to_f64_vec()
            .iter()
            .zip(b.to_f64_vec())
            .map(|(x, y)| x * y)
            .sum()
    }

    /// Thunder's backward of a padded 3x3 convolution, as the cnn trace writes it (pad, flip,
    /// permute, convolution, crop), built from these kernels, is the adjoint of the forward:
    /// <conv(x, w), g> = <x, dx(g)> = <w, dw(g)>.
    #[test]
    fn thunders_backward_formulas_give_the_adjoint() {
        use crate::cpu::layout::{flip, pad};
        let x = Tensor::from_f64(vec![2, 3, 6, 6], data(2 * 3 * 36, 0.0));
        let w = Tensor::from_f64(vec![4, 3, 3, 3], data(4 * 27, 1.0));
        let g = Tensor::from_f64(vec![2, 4, 6, 6], data(2 * 4 * 36, 2.0));
        let y = convolution(&x, &w, None, &[1, 1], &[1, 1], &[1, 1], false, &[0, 0], 1)
            .expect("forward");
        // grad input: conv(g, flip(w^T)) with padding k-1, then crop the forward's padding
        let wt = flip(&w.permute(&[1, 0, 2, 3]).expect("4-d"), &[2, 3]).expect("flip");
        let full = convolution(&g, &wt, None, &[1], &[2, 2], &[1, 1], false, &[0, 0], 1)
            .expect("grad input");
        assert_eq!(full.shape(), &[2, 3, 8, 8]);
        let dx = pad(
            &full,
            0.0,
            &[(0, 0, 0), (0, 0, 0), (-1, -1, 0), (-1, -1, 0)],
        )
        .expect("crop");
        // grad weight: conv(pad(x)^T, g^T), transposed back
        let xp = pad(&x, 0.0, &[(0, 0, 0), (0, 0, 0), (1, 1, 0), (1, 1, 0)]).expect("pad");
        let dw = convolution(
            &xp.permute(&[1, 0, 2, 3]).expect("4-d"),
            &g.permute(&[1, 0, 2, 3]).expect("4-d"),
            None,
            &[1, 1],
            &[0],
            &[1, 1],
            false,
            &[0, 0],
            1,
        )
        .expect("grad weight")
        .permute(&[1, 0, 2, 3])
        .expect("4-d");
        let lhs = dot(&y, &g);
        assert!((lhs - dot(&x, &dx)).abs() < 1e-10 * lhs.abs().max(1.0));
        assert!((lhs - dot(&w, &dw)).abs() < 1e-10 * lhs.abs().max(1.0));
    }

    #[test]
    fn one_value_parameters_broadcast_and_bad_shapes_are_refused() {
        let x = Tensor::from_f32(vec![1, 1, 3, 3], (0..9).map(|i| i as f32).collect());
        let w = Tensor::from_f32(vec![1, 1, 2, 2], vec![1., 0., 0., 1.]);
        let y = convolution(&x, &w, None, &[1], &[0], &[1], false, &[0, 0], 1).expect("ok");
        assert_eq!(y.shape(), &[1, 1, 2, 2]);
        assert_eq!(y.to_f32_vec(), vec![4., 6., 10., 12.]);
        let bad_groups = convolution(&x, &w, None, &[1], &[0], &[1], false, &[0], 2);
        assert!(bad_groups.is_err());
        assert!(convolution(&x, &w, None, &[1, 1, 1], &[0], &[1], false, &[0], 1).is_err());
        assert!(convolution(&x, &w, None, &[0], &[0], &[1], false, &[0], 1).is_err());
        assert!(convolution(&x, &w, None, &[1], &[0], &[1], true, &[0], 1).is_err());
        let big = Tensor::from_f32(vec![1, 1, 4, 4], vec![0.; 16]);
        assert!(convolution(&x, &big, None, &[1], &[0], &[1], false, &[0], 1).is_err());
        let b = Tensor::from_f32(vec![2], vec![0., 0.]);
        assert!(convolution(&x, &w, Some(&b), &[1], &[0], &[1], false, &[0], 1).is_err());
    }
}
