//! Matrix products through the `gemm` crate (BLIS-style packed kernels with AVX-512/AVX2/NEON
//! micro-kernels chosen at run time; on the mid-size models' shapes it runs at 1.1-1.4x the
//! speed of `matrixmultiply`, see `cargo xtask bench gemm`), reading strided views directly so
//! transposes cost no copy.

use super::real::Real;
use crate::tensor::{Dims, Tensor};
use tracepass_ir::DType;

pub trait Gemm: Real {
    /// `C = alpha * A @ B + beta * C`, all strided.
    ///
    /// # Safety
    /// Every element addressed by the sizes and strides must lie inside the given buffers.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

thread_local! {
    /// Set while a caller already shares the work out (row blocks of one product).
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with its products on the calling thread alone.
fn serial<R>(f: impl FnOnce() -> R) -> R {
    SERIAL.with(|s| s.set(true));
    let r = f();
    SERIAL.with(|s| s.set(false));
    r
}

/// How a product's `b` (`[k, n]`) lies in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BLayout {
    /// Row-major `[k, n]`.
    Rows,
    /// Its transpose, row-major `[n, k]`: column `j` of `b` is row `j` of the buffer.
    Columns,
}

/// [`gemm_rows_shared_strided`] over a contiguous row-major `[m, n]` `c` and a row-major `b`.
pub(crate) fn gemm_rows_shared<T: Gemm>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    beta: T,
    c: &mut [T],
) -> Result<(), String> {
    gemm_rows_shared_strided(m, k, n, a, b, BLayout::Rows, beta, (c, n))
}

/// `c = a @ b + beta * c` over row-major slices (im2col convolution): `a` is `[m, k]`, `b` is
/// `[k, n]` laid out as `layout` says, `c` is `[m, n]` with its rows `ldc` apart (a block of a
/// wider matrix, written in place instead of through a scratch product and a copy). The rows
/// of `c` are shared among the rank's threads in blocks, each block a one-thread product: for
/// the skinny products of a convolution (a few hundred columns), where the `gemm` crate's own
/// sharing costs more than it gains. Every element is the same dot product in the same order
/// as in one product over all rows (checked by the conv tests).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_rows_shared_strided<T: Gemm>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    layout: BLayout,
    beta: T,
    (c, ldc): (&mut [T], usize),
) -> Result<(), String> {
    use rayon::prelude::*;
    let c_needs = strided_len(m, n, ldc);
    if ldc < n || a.len() < m * k || b.len() < k * n || c.len() < c_needs {
        return Err(format!(
            "gemm: [{m}, {k}] @ [{k}, {n}] (rows of the result {ldc} apart) does not fit buffers of {}, {} and {} elements",
            a.len(),
            b.len(),
            c.len()
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if let Some(rows) = shared_row_block(m, k, n) {
        // each block a one-thread product (`serial`: this function again, not shared)
        return c[..c_needs]
            .par_chunks_mut(rows * ldc)
            .zip(a[..m * k].par_chunks(rows * k))
            .try_for_each(|(cc, aa)| {
                let block = aa.len() / k;
                serial(|| gemm_rows_shared_strided(block, k, n, aa, b, layout, beta, (cc, ldc)))
            });
    }
    let (rsb, csb) = match layout {
        BLayout::Rows => (n as isize, 1),
        BLayout::Columns => (1, k as isize),
    };
    // SAFETY: the three buffers hold at least the row-major blocks addressed, checked above
    // (`b` as `[k, n]` or as `[n, k]`: `k * n` elements either way).
    unsafe {
        gemm_to_rows(
            m,
            k,
            n,
            (a.as_ptr(), k as isize, 1),
            (b.as_ptr(), rsb, csb),
            beta,
            (&mut c[..c_needs], ldc),
        );
    }
    Ok(())
}

/// The elements a row-major `[m, n]` block with rows `ld` apart spans.
fn strided_len(m: usize, n: usize, ld: usize) -> usize {
    match m {
        0 => 0,
        m => (m - 1) * ld + n,
    }
}

/// Rows per block when a product's rows are shared among the rank's threads, each block a
/// one-thread product, or `None` when one thread computes it all: a small product, no pool, or
/// a caller that shares the work out already.
fn shared_row_block(m: usize, k: usize, n: usize) -> Option<usize> {
    let threads = super::pool_threads();
    (threads > 1 && m >= 32 && m * k * n >= 1 << 20 && !SERIAL.with(std::cell::Cell::get))
        .then(|| m.div_ceil(threads).div_ceil(16) * 16)
}

/// How many threads one product may use: the size of the rayon pool the calling rank runs in
/// (`--threads-per-rank`), and one outside any pool or for products too small to share.
fn parallelism(m: usize, k: usize, n: usize) -> gemm::Parallelism {
    /// Below about this many multiply-adds, handing work to another thread costs more than it
    /// saves (a 64x64x64 block is ~10 us on one core).
    const MIN_SHARED_MACS: usize = 1 << 18;
    if rayon::current_thread_index().is_none()
        || m * k * n < MIN_SHARED_MACS
        || SERIAL.with(std::cell::Cell::get)
    {
        return gemm::Parallelism::None;
    }
    match rayon::current_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        t => gemm::Parallelism::Rayon(t),
    }
}

macro_rules! gemm_impl {
    ($t:ty) => {
        impl Gemm for $t {
            unsafe fn gemm(
                m: usize,
                k: usize,
                n: usize,
                a: *const $t,
                rsa: isize,
                csa: isize,
                b: *const $t,
                rsb: isize,
                csb: isize,
                beta: $t,
                c: *mut $t,
                rsc: isize,
                csc: isize,
            ) {
                // gemm's `dst = alpha * dst + beta * lhs @ rhs` with strides as (column, row);
                // `read_dst` false ignores `alpha` and never reads `c`.
                let read_dst = beta != 0.0;
                #[cfg(test)]
                IN_GEMM_CRATE.with(|f| f.set(true));
                gemm::gemm(
                    m,
                    n,
                    k,
                    c,
                    csc,
                    rsc,
                    read_dst,
                    a,
                    csa,
                    rsa,
                    b,
                    csb,
                    rsb,
                    beta,
                    1.0,
                    false,
                    false,
                    false,
                    parallelism(m, k, n),
                );
                #[cfg(test)]
                IN_GEMM_CRATE.with(|f| f.set(false));
            }
        }
    };
}
gemm_impl!(f32);
gemm_impl!(f64);

/// A 2-d strided operand: base pointer and strides, borrowed from a tensor of type `T`.
struct Mat<'a, T> {
    data: &'a [T],
    offset: usize,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

impl<'a, T: Gemm> Mat<'a, T> {
    fn of(t: &'a Tensor, batch_offset: isize) -> Option<Mat<'a, T>> {
        let s = T::slice(t.storage())?;
        let r = t.shape().len();
        Some(Mat {
            data: s,
            offset: (t.offset() as isize + batch_offset) as usize,
            rows: t.shape()[r - 2],
            cols: t.shape()[r - 1],
            rs: t.strides()[r - 2],
            cs: t.strides()[r - 1],
        })
    }
    /// Checks that the extreme addressed elements are inside the buffer.
    fn in_bounds(&self) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        let last = self.offset as isize
            + (self.rows as isize - 1) * self.rs
            + (self.cols as isize - 1) * self.cs;
        let first = self.offset as isize
            + (self.rows as isize - 1) * self.rs.min(0)
            + (self.cols as isize - 1) * self.cs.min(0);
        first >= 0 && (last as usize) < self.data.len() && (self.offset) < self.data.len()
    }
}

fn gemm_into<T: Gemm>(
    a: &Mat<T>,
    b: &Mat<T>,
    beta: T,
    c: &mut [T],
    c_off: usize,
) -> Result<(), String> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k {
        return Err(format!(
            "inner dimensions differ: [{m}, {k}] @ [{}, {n}]",
            b.rows
        ));
    }
    if !a.in_bounds() || !b.in_bounds() || c.len() < c_off + m * n {
        return Err("strided view out of its storage".into());
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // a product through the column scratch shares its rows among the rank's threads, each
    // block a one-thread product: the crate's own sharing leaves the scratch's transposition
    // to one thread (`[64, 2048] @ [2048, 513]` over a column-major `b` on two threads: 108
    // -> 189 GFLOP/s). The crate's blocking depends on `k` alone, so the bits do not change.
    let by_columns = through_columns(m, k, n, (a.rs, a.cs), (b.rs, b.cs), beta == T::ZERO);
    if let Some(rows) = shared_row_block(m, k, n).filter(|_| by_columns) {
        use rayon::prelude::*;
        return c[c_off..c_off + m * n]
            .par_chunks_mut(rows * n)
            .enumerate()
            .try_for_each(|(i, block)| {
                let first_row = a.offset as isize + (i * rows) as isize * a.rs;
                let part = Mat {
                    offset: usize::try_from(first_row).map_err(|e| e.to_string())?,
                    rows: block.len() / n,
                    ..*a
                };
                serial(|| gemm_into(&part, b, beta, block, 0))
            });
    }
    // SAFETY: bounds were checked above; c is a fresh row-major [m, n] block at c_off.
    unsafe {
        gemm_to_rows(
            m,
            k,
            n,
            (a.data.as_ptr().add(a.offset), a.rs, a.cs),
            (b.data.as_ptr().add(b.offset), b.rs, b.cs),
            beta,
            (&mut c[c_off..c_off + m * n], n),
        );
    }
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// Set while the `gemm` crate runs, so that the steady-state allocation test
    /// (`train/steady_alloc.rs`) can tell the crate's allocations apart (it must make none).
    pub(crate) static IN_GEMM_CRATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `c = a @ b` into the row-major `[m, n]` block `c`, where `a` (`[m, k]`) is read
/// column-major in its buffer, element `(i, p)` at `i + p * lda` (`lda >= m`), and `b` is
/// row-major `[k, n]`: a transposed convolution reads its weight, `[C_in, C_out * taps]`, as
/// this `a` without copying it transposed. Its rows are shared among the rank's threads in
/// blocks, each a one-thread product, as in [`gemm_rows_shared`]: every element the same dot
/// product in the same order whatever the thread count.
pub(crate) fn gemm_cols_a_shared<T: Gemm>(
    m: usize,
    k: usize,
    n: usize,
    (a, lda): (&[T], usize),
    b: &[T],
    c: &mut [T],
) -> Result<(), String> {
    use rayon::prelude::*;
    let a_needs = if m == 0 || k == 0 {
        0
    } else {
        (m - 1) + (k - 1) * lda + 1
    };
    if lda < m || a.len() < a_needs || b.len() < k * n || c.len() < m * n {
        return Err(format!(
            "gemm: [{m}, {k}] (column-major, lda {lda}) @ [{k}, {n}] does not fit buffers of {}, {} and {} elements",
            a.len(),
            b.len(),
            c.len()
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let block = |r0: usize, cc: &mut [T]| {
        let rows = cc.len() / n;
        // SAFETY (both products): rows `r0..r0 + rows` of `a` address `a[r0 + i + p * lda]`
        // for `i < rows <= m - r0` and `p < k`, at most `a_needs - 1`, checked above; `b`
        // holds `k * n` elements, `cc` is `rows * n` long and so is `t`.
        if n <= 32 && rows >= 16 * n {
            // a tall `c` of a few columns (a late layer's positions under many rows) runs
            // faster as its transpose, `b^T @ a^T` with `a^T` row-major, transposed into
            // place: `[4608, 512] @ [512, 32]` 67-77 GFLOP/s against 56-76; from 64 columns
            // on, the direct product is the faster (103 against 81)
            let mut t = written_by_products(rows * n, k);
            unsafe {
                gemm_to_rows(
                    n,
                    k,
                    rows,
                    (b.as_ptr(), 1, n as isize),
                    (a.as_ptr().add(r0), lda as isize, 1),
                    T::ZERO,
                    (&mut t, rows),
                );
            }
            transpose_into(&t, n, rows, (cc, n));
            crate::cpu::buffer_pool::give_scratch(t);
            return;
        }
        unsafe {
            gemm_to_rows(
                rows,
                k,
                n,
                (a.as_ptr().add(r0), 1, lda as isize),
                (b.as_ptr(), n as isize, 1),
                T::ZERO,
                (cc, n),
            );
        }
    };
    let Some(rows) = shared_row_block(m, k, n) else {
        block(0, &mut c[..m * n]);
        return Ok(());
    };
    c[..m * n]
        .par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(i, cc)| serial(|| block(i * rows, cc)));
    Ok(())
}

/// Whether a product into a row-major `c` runs faster computed column-major and transposed.
/// The `gemm` crate computes a row-major `c` as `c^T = b^T @ a^T`, packing `b^T` as its left
/// operand; when `b` is column-major that packing is a transposition, redone for every block of
/// `k` and amortised over only `m` columns. Computed column-major, the left operand is `a`,
/// whose packing costs the same only when `a` is row-major, amortised over `n` columns. On the
/// weight gradients of a convolution (`[64, 2048] @ [2048, 513]` with `b` column-major) the
/// column-major product runs at 82 GFLOP/s against 29; the results are the same bits, every
/// element the same sum in the same order (tested). With a row-major `a` only a wide `c`
/// gains (`n >= 4m`, the packing amortised over few columns): at `n >= 2m` a transformer's
/// forward projection (`[512, 384] @ [384, 1152]` over a transposed weight) went through
/// columns and ran at 72 GFLOP/s against the crate's 104 (98 against 186 on two threads).
/// A deep product gains from `n >= 2m` too: the transposed copy of `c` is amortised over `k`,
/// the crate's transposing packing is not (ResNet-18-64's stem weight gradient, `[64, 8192]
/// @ [8192, 192]`: 7.6-9.0 -> 4.6 ms alone, 5.8-6.2 -> 4.0-4.1 ms in the model's step). `beta`
/// must be zero: with it, the crate adds `c` in a different place.
fn through_columns(
    m: usize,
    k: usize,
    n: usize,
    (rsa, csa): (isize, isize),
    (rsb, csb): (isize, isize),
    beta_is_zero: bool,
) -> bool {
    /// Below this many multiply-adds the scratch and the transposed copy cost more than the
    /// packing saves.
    const MIN_MACS: usize = 1 << 16;
    let b_columns = rsb.unsigned_abs() == 1 && csb.unsigned_abs() != 1;
    let a_rows = csa.unsigned_abs() == 1 && rsa.unsigned_abs() != 1;
    beta_is_zero
        && m >= 2
        && n >= 2
        && m * k * n >= MIN_MACS
        && b_columns
        && (!a_rows || n >= 4 * m || (n >= 2 * m && k >= 8 * m))
}

/// `c = a @ b + beta * c` into the row-major `[m, n]` block `c`, its rows `ldc` apart (`a` and
/// `b` given as pointer, row stride, column stride), through a column-major scratch where
/// [`through_columns`] says that is faster.
///
/// # Safety
/// Every element the sizes and strides address in `a` and `b` must be inside their buffers.
unsafe fn gemm_to_rows<T: Gemm>(
    m: usize,
    k: usize,
    n: usize,
    (a, rsa, csa): (*const T, isize, isize),
    (b, rsb, csb): (*const T, isize, isize),
    beta: T,
    (c, ldc): (&mut [T], usize),
) {
    debug_assert!(ldc >= n && c.len() >= m.saturating_sub(1) * ldc + n);
    if !through_columns(m, k, n, (rsa, csa), (rsb, csb), beta == T::ZERO) {
        T::gemm(
            m,
            k,
            n,
            a,
            rsa,
            csa,
            b,
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            ldc as isize,
            1,
        );
        return;
    }
    let mut cols = written_by_products(m * n, k);
    T::gemm(
        m,
        k,
        n,
        a,
        rsa,
        csa,
        b,
        rsb,
        csb,
        T::ZERO,
        cols.as_mut_ptr(),
        1,
        m as isize,
    );
    transpose_into(&cols, n, m, (c, ldc));
    crate::cpu::buffer_pool::give_scratch(cols);
}

/// A buffer of `len` elements for products with `beta = 0` over `k` terms to write whole: its
/// old values are left in it (no pass to zero it) unless `k` is 0, where the buffer is zeroed
/// for the empty sums rather than trusting every path to write them.
pub(crate) fn written_by_products<T: Gemm>(len: usize, k: usize) -> Vec<T> {
    if k == 0 {
        return crate::cpu::buffer_pool::filled(len, T::ZERO);
    }
    crate::cpu::buffer_pool::overwritten(len)
}

/// `dst[c][r] = src[r][c]` for a row-major `[rows, cols]` `src`, `dst`'s rows `ld` apart, in
/// square tiles so that both sides are touched in runs.
fn transpose_into<T: Copy>(src: &[T], rows: usize, cols: usize, (dst, ld): (&mut [T], usize)) {
    const TILE: usize = 32;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * ld + r] = src[r * cols + c];
                }
            }
        }
    }
}

/// Brings both operands to one compute type (f32 or f64); bf16/f16 compute in f32.
fn compute_pair(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor, DType, DType), String> {
    let out = super::elementwise::promote(a.dtype(), b.dtype());
    let ct = match out {
        DType::F64 => DType::F64,
        DType::F32 | DType::BF16 | DType::F16 => DType::F32,
        other => return Err(format!("dtype {other} is not supported by the cpu backend")),
    };
    let conv = |t: &Tensor| {
        if t.dtype() == ct {
            Ok(t.clone())
        } else {
            t.to_dtype(ct)
                .ok_or_else(|| format!("cannot convert {} to {ct}", t.dtype()))
        }
    };
    Ok((conv(a)?, conv(b)?, ct, out))
}

fn finish(t: Tensor, dtype: DType) -> Result<Tensor, String> {
    if t.dtype() == dtype {
        Ok(t)
    } else {
        t.to_dtype(dtype)
            .ok_or_else(|| format!("cannot convert to {dtype}"))
    }
}

/// `torch.matmul`'s operands as (batches of) matrices: a 1-d `a` is a row and a 1-d `b` a
/// column (their added dimension dropped from the result), the batch dimensions broadcast.
struct MatmulShape {
    a: Tensor,
    b: Tensor,
    m: usize,
    k: usize,
    n: usize,
    batch: Dims<usize>,
    drop_m: bool,
    drop_n: bool,
}

impl MatmulShape {
    fn of(a: &Tensor, b: &Tensor) -> Result<MatmulShape, String> {
        let (a2, drop_m) = if a.shape().len() == 1 {
            (a.reshape([1, a.shape()[0]])?, true)
        } else {
            (a.clone(), false)
        };
        let (b2, drop_n) = if b.shape().len() == 1 {
            (b.reshape([b.shape()[0], 1])?, true)
        } else {
            (b.clone(), false)
        };
        let (ra, rb) = (a2.shape().len(), b2.shape().len());
        if ra == 0 || rb == 0 {
            return Err("matmul of a 0-d tensor".into());
        }
        let (m, k) = (a2.shape()[ra - 2], a2.shape()[ra - 1]);
        let (kb, n) = (b2.shape()[rb - 2], b2.shape()[rb - 1]);
        if k != kb {
            return Err(format!(
                "matmul shapes {:?} and {:?} do not fit",
                a.shape(),
                b.shape()
            ));
        }
        let (ba, bb) = (&a2.shape()[..ra - 2], &b2.shape()[..rb - 2]);
        let batch = tracepass_ir::broadcast_shapes_in(ba, bb)
            .ok_or_else(|| format!("matmul batch shapes {ba:?} and {bb:?} do not broadcast"))?;
        Ok(MatmulShape {
            a: a2,
            b: b2,
            m,
            k,
            n,
            batch,
            drop_m,
            drop_n,
        })
    }

    /// The number of matrix products.
    fn count(&self) -> usize {
        self.batch.iter().product()
    }

    /// The result's shape.
    fn out_shape(&self) -> Dims<usize> {
        let mut shape = self.batch.clone();
        if !self.drop_m {
            shape.push(self.m);
        }
        if !self.drop_n {
            shape.push(self.n);
        }
        shape
    }
}

/// Whether a batched product shares its `count` products among the rank's `threads` (each
/// product on one thread) rather than sharing each product: attention's `[24, 128, 64] @
/// [24, 64, 128]` is 24 products of a million multiply-adds, where handing blocks of each
/// to another thread costs about what it saves (1.0-1.5x on two threads, against 1.9x for a
/// large product). Every product is the same sum either way (the thread-count test).
fn by_batch(count: usize, macs: usize, threads: usize) -> bool {
    threads > 1 && (count >= 2 * threads || (count >= threads && macs < 1 << 22))
}

fn matmul_typed<T: Gemm>(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let shape = MatmulShape::of(a, b)?;
    let (a2, b2) = (&shape.a, &shape.b);
    let (m, n) = (shape.m, shape.n);
    let (ra, rb) = (a2.shape().len(), b2.shape().len());
    let (ba, bb) = (&a2.shape()[..ra - 2], &b2.shape()[..rb - 2]);
    let nb = shape.batch.len();
    let (batch, count) = (&shape.batch, shape.count());
    let mut out = written_by_products(count * m * n, shape.k);
    let stride_of = |t: &Tensor, lead: usize, i: usize, dims: &[usize]| -> isize {
        if i < lead || dims[i - lead] == 1 {
            0
        } else {
            t.strides()[i - lead]
        }
    };
    let (lead_a, lead_b) = (nb - ba.len(), nb - bb.len());
    // product `c`'s offsets into `a` and `b`, from its batch index
    let offsets = |c: usize| -> (isize, isize) {
        let (mut r, mut oa, mut ob) = (c, 0isize, 0isize);
        for i in (0..nb).rev() {
            let ix = r % batch[i];
            r /= batch[i];
            oa += ix as isize * stride_of(a2, lead_a, i, ba);
            ob += ix as isize * stride_of(b2, lead_b, i, bb);
        }
        (oa, ob)
    };
    let product = |c: usize, dst: &mut [T]| -> Result<(), String> {
        let (oa, ob) = offsets(c);
        let ma = Mat::<T>::of(a2, oa).ok_or("matmul operand has the wrong storage type")?;
        let mb = Mat::<T>::of(b2, ob).ok_or("matmul operand has the wrong storage type")?;
        gemm_into(&ma, &mb, T::ZERO, dst, 0)
    };
    let threads = super::pool_threads();
    if by_batch(count, m * shape.k * n, threads) && m * n > 0 {
        use rayon::prelude::*;
        return out[..count * m * n]
            .par_chunks_mut(m * n)
            .enumerate()
            .try_for_each(|(c, dst)| serial(|| product(c, dst)))
            .map(|()| Tensor::new(shape.out_shape(), T::storage(out)));
    }
    for (c, dst) in out.chunks_mut((m * n).max(1)).take(count).enumerate() {
        product(c, dst)?;
    }
    Ok(Tensor::new(shape.out_shape(), T::storage(out)))
}

/// `a` (`[.., rows, cols]`) broadcast to `batch` and read as i64, row-major.
fn batched_i64(a: &Tensor, batch: &[usize]) -> Result<Vec<i64>, String> {
    let r = a.shape().len();
    let lead = batch.len() + 2 - r;
    let mut shape = batch.to_vec();
    shape.extend_from_slice(&a.shape()[r - 2..]);
    let strides: Vec<isize> = (0..shape.len())
        .map(|i| match i.checked_sub(lead) {
            Some(j) if a.shape()[j] == shape[i] => a.strides()[j],
            _ => 0,
        })
        .collect();
    let view = a.view(shape, strides, a.offset())?;
    Ok(view.to_i64_vec())
}

/// Integer `torch.matmul`, as PyTorch's CPU computes it: exact, wrapping on overflow.
fn matmul_int(a: &Tensor, b: &Tensor, out: DType) -> Result<Tensor, String> {
    let shape = MatmulShape::of(a, b)?;
    let (m, k, n, count) = (shape.m, shape.k, shape.n, shape.count());
    let av = batched_i64(&shape.a, &shape.batch)?;
    let bv = batched_i64(&shape.b, &shape.batch)?;
    let mut acc = vec![0i64; count * m * n];
    for c in 0..count {
        let (pa, pb) = (
            &av[c * m * k..(c + 1) * m * k],
            &bv[c * k * n..(c + 1) * k * n],
        );
        let po = &mut acc[c * m * n..(c + 1) * m * n];
        for i in 0..m {
            for p in 0..k {
                let x = pa[i * k + p];
                for j in 0..n {
                    po[i * n + j] = po[i * n + j].wrapping_add(x.wrapping_mul(pb[p * n + j]));
                }
            }
        }
    }
    finish(Tensor::from_i64(shape.out_shape(), acc), out)
}

/// `torch.matmul`: 1-d, 2-d and batched operands with broadcast batch dimensions.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let promoted = super::elementwise::promote(a.dtype(), b.dtype());
    if matches!(
        promoted,
        DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8
    ) {
        return matmul_int(a, b, promoted);
    }
    let (a, b, ct, out) = compute_pair(a, b)?;
    let r = match ct {
        DType::F64 => matmul_typed::<f64>(&a, &b)?,
        _ => matmul_typed::<f32>(&a, &b)?,
    };
    finish(r, out)
}

fn linear_typed<T: Gemm>(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, String> {
    let xs = x.shape();
    let k = *xs.last().ok_or("linear of a 0-d input")?;
    if w.shape().len() != 2 || w.shape()[1] != k {
        return Err(format!(
            "linear: input {:?} does not fit weight {:?}",
            xs,
            w.shape()
        ));
    }
    let n = w.shape()[0];
    // the leading dims' product, not `numel / k`: that is 0 for `k = 0` with rows present
    let m: usize = xs[..xs.len() - 1].iter().product();
    let x2 = if xs.len() == 2 {
        x.clone()
    } else {
        x.reshape([m, k])?
    };
    let wt = w.permute(&[1, 0])?;
    let mut out = match bias {
        Some(_) => crate::cpu::buffer_pool::filled(m * n, T::ZERO),
        None => written_by_products(m * n, k),
    };
    let beta = if let Some(b) = bias {
        if b.numel() != n {
            return Err(format!(
                "linear: bias {:?} does not fit {n} outputs",
                b.shape()
            ));
        }
        let bv = T::elems(b);
        for row in out.chunks_mut(n.max(1)) {
            row.copy_from_slice(&bv);
        }
        T::ONE
    } else {
        T::ZERO
    };
    let ma = Mat::<T>::of(&x2, 0).ok_or("linear input has the wrong storage type")?;
    let mb = Mat::<T>::of(&wt, 0).ok_or("linear weight has the wrong storage type")?;
    gemm_into(&ma, &mb, beta, &mut out, 0)?;
    let mut shape = Dims::from_slice(&xs[..xs.len() - 1]);
    shape.push(n);
    Ok(Tensor::new(shape, T::storage(out)))
}

/// `torch.nn.functional.linear`: `x @ w.T + b`.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, String> {
    let (x, w, ct, out) = compute_pair(x, w)?;
    let b = match b {
        Some(b) => Some(b.to_dtype(ct).ok_or("unsupported bias dtype")?),
        None => None,
    };
    let r = match ct {
        DType::F64 => linear_typed::<f64>(&x, &w, b.as_ref())?,
        _ => linear_typed::<f32>(&x, &w, b.as_ref())?,
    };
    finish(r, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    c[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        c
    }

    #[test]
    fn matmul_matches_naive_product_on_views() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        let want = naive(&a, &b, m, k, n);
        let ta = Tensor::from_f64(vec![m, k], a.clone());
        let tb = Tensor::from_f64(vec![k, n], b.clone());
        let got = matmul(&ta, &tb).expect("fits").to_f64_vec();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12);
        }
        // transposed view of a [k, m] buffer as the left operand
        let at: Vec<f64> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let view = Tensor::from_f64(vec![k, m], at)
            .permute(&[1, 0])
            .expect("2-d");
        let got = matmul(&view, &tb).expect("fits").to_f64_vec();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12);
        }
        // batched with a broadcast right operand
        let batched = Tensor::from_f64(vec![2, m, k], [a.clone(), a.clone()].concat());
        let got = matmul(&batched, &tb).expect("fits");
        assert_eq!(got.shape(), &[2, m, n]);
        assert!(matmul(&tb, &tb).is_err());
    }

    #[test]
    fn column_major_products_keep_the_row_major_bits() {
        // a convolution weight gradient's shape: `b` column-major, `n` well above `m`, and `k`
        // past the crate's depth blocks, so every element is a sum over several blocks
        let (m, k, n) = (48, 2100, 301);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let (ra, cb) = ((k as isize, 1), (1, k as isize));
        assert!(through_columns(m, k, n, ra, cb, true));
        // a beta to add keeps the direct product; so does a row-major `b` or a tall `m`
        assert!(!through_columns(m, k, n, ra, cb, false));
        assert!(!through_columns(m, k, n, ra, (n as isize, 1), true));
        assert!(!through_columns(n, k, m, ra, cb, true));
        let mut via_columns = vec![0f32; m * n];
        gemm_rows_shared_strided(
            m,
            k,
            n,
            &a,
            &b,
            BLayout::Columns,
            0.0,
            (&mut via_columns, n),
        )
        .expect("fits");
        let mut direct = vec![0f32; m * n];
        // SAFETY: `a` is `[m, k]`, `b` `[n, k]`, `direct` `[m, n]`, all row-major.
        unsafe {
            f32::gemm(
                m,
                k,
                n,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                1,
                k as isize,
                0.0,
                direct.as_mut_ptr(),
                n as isize,
                1,
            );
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&via_columns), bits(&direct));
        // and both are the product
        let bt: Vec<f64> = (0..k * n).map(|i| b[(i % n) * k + i / n] as f64).collect();
        let a64: Vec<f64> = a.iter().map(|&x| x as f64).collect();
        for (g, w) in via_columns.iter().zip(naive(&a64, &bt, m, k, n)) {
            assert!((*g as f64 - w).abs() < 1e-2, "{g} vs {w}");
        }
    }

    #[test]
    fn integer_matmul_is_exact_broadcasts_and_wraps() {
        // [[1, 2, 3], [4, 5, 6]] @ [[7, 8], [9, 10], [11, 12]] = [[58, 64], [139, 154]]
        let a = Tensor::from_i64(vec![2, 3], vec![1, 2, 3, 4, 5, 6]);
        let b = Tensor::from_i64(vec![3, 2], vec![7, 8, 9, 10, 11, 12]);
        let c = matmul(&a, &b).unwrap();
        assert_eq!(c.dtype(), DType::I64);
        assert_eq!(c.shape(), [2, 2]);
        assert_eq!(c.to_i64_vec(), [58, 64, 139, 154]);
        // a batch of two against one matrix, and a vector on the right
        let a2 = Tensor::from_i64(vec![2, 1, 3], vec![1, 2, 3, -1, 0, 1]);
        let c = matmul(&a2, &b).unwrap();
        assert_eq!(c.shape(), [2, 1, 2]);
        assert_eq!(c.to_i64_vec(), [58, 64, 4, 4]);
        let v = Tensor::from_i64(vec![3], vec![1, 1, 1]);
        assert_eq!(matmul(&a, &v).unwrap().to_i64_vec(), [6, 15]);
        // i32 stays i32; products past i64 wrap as PyTorch's do
        let a32 = a.to_dtype(DType::I32).unwrap();
        assert_eq!(
            matmul(&a32, &a32.permute(&[1, 0]).unwrap())
                .unwrap()
                .dtype(),
            DType::I32
        );
        let big = Tensor::from_i64(vec![1, 1], vec![i64::MAX]);
        let two = Tensor::from_i64(vec![1, 1], vec![2]);
        assert_eq!(matmul(&big, &two).unwrap().to_i64_vec(), [-2]);
        // empty batches give an empty result
        let e = Tensor::from_i64(vec![0, 0, 0], vec![]);
        assert_eq!(matmul(&e, &e).unwrap().shape(), [0, 0, 0]);
    }

    #[test]
    fn linear_adds_bias_and_transposes_weight() {
        let x = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let w = Tensor::from_f32(vec![2, 3], vec![1., 0., 0., 0., 1., 1.]);
        let b = Tensor::from_f32(vec![2], vec![10., 20.]);
        let y = linear(&x, &w, Some(&b)).expect("fits");
        assert_eq!(y.shape(), &[2, 2]);
        assert_eq!(y.to_f32_vec(), vec![11., 25., 14., 31.]);
    }

    /// A batched product (attention's shape, with a broadcast and a transposed operand) is
    /// shared by products in a pool, and gives the one-thread bits and the per-product results.
    #[test]
    fn batched_products_shared_by_batch_keep_the_bits() {
        assert!(by_batch(24, 128 * 64 * 128, 2) && !by_batch(24, 0, 1) && !by_batch(2, 1 << 24, 2));
        let (bt, m, k, n) = (7, 40, 24, 36);
        let a = Tensor::from_f32(
            vec![bt, m, k],
            (0..bt * m * k).map(|i| (i as f32 * 0.37).sin()).collect(),
        );
        let b = Tensor::from_f32(
            vec![bt, n, k],
            (0..bt * n * k).map(|i| (i as f32 * 0.11).cos()).collect(),
        )
        .permute(&[0, 2, 1])
        .expect("a view");
        let shared = Tensor::from_f32(vec![k, n], (0..k * n).map(|i| i as f32 * 0.01).collect());
        for rhs in [&b, &shared] {
            let (one, par) = crate::cpu::alone_and_in_three_threads(|| {
                matmul(&a, rhs).expect("fits").to_f32_vec()
            });
            assert_eq!(
                one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                par.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            let (av, rv) = (a.to_f32_vec(), rhs.contiguous().to_f32_vec());
            let rb = if rhs.shape().len() == 3 { k * n } else { 0 };
            for c in [0, bt - 1] {
                for (i, j) in [(0, 0), (m - 1, n - 1), (m / 2, 3)] {
                    let want: f32 = (0..k)
                        .map(|p| av[(c * m + i) * k + p] * rv[c * rb + p * n + j])
                        .sum();
                    assert!(
                        (par[(c * m + i) * n + j] - want).abs() < 1e-3,
                        "{c}: {i},{j}"
                    );
                }
            }
        }
    }

    #[test]
    fn products_in_a_thread_pool_equal_the_one_thread_result_bitwise() {
        // large enough to be shared out (see `parallelism`)
        let (m, k, n) = (96, 80, 112);
        let a = Tensor::from_f32(
            vec![m, k],
            (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect(),
        );
        let w = Tensor::from_f32(
            vec![n, k],
            (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect(),
        );
        let ((one, _), (par, shared)) = crate::cpu::alone_and_in_three_threads(|| {
            (
                linear(&a, &w, None).expect("fits").to_f32_vec(),
                parallelism(m, k, n),
            )
        });
        assert!(matches!(shared, gemm::Parallelism::Rayon(3)));
        assert!(matches!(parallelism(m, k, n), gemm::Parallelism::None));
        assert_eq!(
            one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            par.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        // and both are the product
        let (av, wv) = (a.to_f32_vec(), w.to_f32_vec());
        for i in [0, m / 2, m - 1] {
            for j in [0, n - 1] {
                let want: f32 = (0..k).map(|p| av[i * k + p] * wv[j * k + p]).sum();
                assert!((one[i * n + j] - want).abs() < 1e-3, "{i},{j}");
            }
        }
    }

    #[test]
    fn products_through_columns_share_rows_and_keep_the_bits() {
        // a column-major `b` with n >= 4m: computed through the column scratch, whose rows a
        // pool shares out (101 rows: the last block is short)
        let (m, k, n) = (101, 96, 520);
        let a = Tensor::from_f32(
            vec![m, k],
            (0..m * k).map(|i| (i as f32 * 0.29).sin()).collect(),
        );
        let bt = Tensor::from_f32(
            vec![n, k],
            (0..n * k).map(|i| (i as f32 * 0.13).cos()).collect(),
        );
        let b = bt.permute(&[1, 0]).expect("a view");
        assert!(through_columns(
            m,
            k,
            n,
            (k as isize, 1),
            (1, k as isize),
            true
        ));
        let (one, par) =
            crate::cpu::alone_and_in_three_threads(|| matmul(&a, &b).expect("fits").to_f32_vec());
        assert_eq!(
            one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            par.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let (av, bv) = (a.to_f32_vec(), bt.to_f32_vec());
        for i in [0, 40, m - 1] {
            for j in [0, 7, n - 1] {
                let want: f32 = (0..k).map(|p| av[i * k + p] * bv[j * k + p]).sum();
                assert!((par[i * n + j] - want).abs() < 1e-3, "{i},{j}");
            }
        }
    }
}

#[cfg(test)]
mod zero_size_tests {
    use crate::cpu::CpuBackend;
    use crate::exec::{Backend, Input, Kernel};
    use crate::tensor::Tensor;

    fn filled(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_f32(shape, (0..n).map(|i| i as f32 * 0.25 - 1.0).collect())
    }

    fn run(k: &Kernel, inputs: &[Tensor]) -> Tensor {
        let args: Vec<Input<'_, Tensor>> = inputs.iter().map(Input::Tensor).collect();
        CpuBackend
            .run(k, &args)
            .expect("a zero-size product is defined")
    }

    /// Products with an empty dimension: `k = 0` gives zeros (plus the bias), an empty `m` or
    /// batch gives an empty result. The GPU check runs the same cases against these.
    #[test]
    fn products_with_an_empty_dimension_are_zeros_or_empty() {
        let c = run(&Kernel::Matmul, &[filled(&[4, 0]), filled(&[0, 3])]);
        assert_eq!(c.shape(), &[4, 3]);
        assert!(c.to_f64_vec().iter().all(|&x| x == 0.0));
        let bias = filled(&[6]);
        let c = run(
            &Kernel::Linear { bias: true },
            &[filled(&[5, 0]), filled(&[6, 0]), bias.clone()],
        );
        assert_eq!(c.shape(), &[5, 6]);
        let want = bias.to_f64_vec();
        for row in c.to_f64_vec().chunks(6) {
            assert_eq!(row, &want[..]);
        }
        let c = run(&Kernel::Matmul, &[filled(&[0, 4]), filled(&[4, 3])]);
        assert_eq!(c.shape(), &[0, 3]);
        let c = run(&Kernel::Matmul, &[filled(&[2, 0, 4]), filled(&[4, 3])]);
        assert_eq!(c.shape(), &[2, 0, 3]);
    }
}
