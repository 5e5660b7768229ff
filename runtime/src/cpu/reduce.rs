//! Reductions over dimensions and (log-)softmax.

use super::real::Real;
use crate::exec::kernel::ReduceOp;
use crate::tensor::{contiguous_strides, Dims, Tensor};
use tracepass_ir::DType;

/// Accumulators a run folded into one output element is spread over when the fold may be
/// regrouped: one AVX-512 vector of f32.
const LANES: usize = 16;

/// Folds the elements of a row-major tensor of `shape` into one accumulator per output
/// position (the reduced `dims` kept as size 1): the accumulators and the kept shape.
///
/// With `merge` (sums, whose order may change), a contiguous run folded into one output
/// element (a row reduced over its last dim, an image's pixels for a channel) goes over
/// [`LANES`] accumulators, element `i` into lane `i % LANES`, which are then merged pairwise
/// (lane `l` with lane `l + width`, halving `width`) before the run's tail: one vector add per
/// element where one add after another waits on the last, and a more accurate sum. The order
/// depends only on the shape, so results do not change from run to run or with threads.
fn fold_dims<E: Copy + Sync, A: Copy + Send + Sync + crate::cpu::buffer_pool::Pooled>(
    v: &[E],
    shape: &[usize],
    dims: &[usize],
    init: A,
    combine: impl Fn(A, E) -> A + Sync,
    merge: Option<fn(A, A) -> A>,
) -> Result<(Vec<A>, Dims<usize>), String> {
    if dims.iter().any(|&d| d >= shape.len().max(1)) {
        return Err(format!(
            "reduction dims {dims:?} out of range for {shape:?}"
        ));
    }
    let kept: Dims<usize> = (0..shape.len())
        .map(|i| if dims.contains(&i) { 1 } else { shape[i] })
        .collect();
    let out_n: usize = kept.iter().product();
    let mut acc = crate::cpu::buffer_pool::filled(out_n, init);
    // Reducing the leading dimensions of a row-major tensor: add whole rows (vectorizes).
    let leading = dims.iter().enumerate().all(|(i, &d)| i == d);
    if leading && out_n == 1 {
        acc[0] = fold_run(init, v, init, &combine, merge);
    } else if leading && !v.is_empty() {
        let add_rows = |acc: &mut [A], lo: usize| {
            for row in v.chunks(out_n.max(1)) {
                for (a, &e) in acc.iter_mut().zip(&row[lo..]) {
                    *a = combine(*a, e);
                }
            }
        };
        in_parts(&mut acc, v.len(), add_rows);
    } else if !v.is_empty() {
        // dims merged where input and accumulators both step through them as one; then each
        // input row folds into one accumulator (a reduced last dim) or a row of them, in the
        // same order as element by element
        let out_strides = contiguous_strides(&kept);
        let acc_strides: Dims<isize> = (0..shape.len())
            .map(|i| if dims.contains(&i) { 0 } else { out_strides[i] })
            .collect();
        let in_strides = contiguous_strides(shape);
        let (merged, strides) = super::strided::coalesce(shape, &[&in_strides, &acc_strides]);
        let rank = merged.len();
        let inner = merged[rank - 1];
        let step = strides[1][rank - 1];
        // every row in order, folding into the accumulators `lo ..` that `acc` holds only
        let fold_rows = |acc: &mut [A], lo: usize| {
            let hi = lo + acc.len();
            let mut idx: Dims<usize> = Dims::from_elem(0, rank - 1);
            let mut pos = 0isize;
            for row in v.chunks(inner) {
                let p = pos as usize;
                match step {
                    0 => {
                        if (lo..hi).contains(&p) {
                            acc[p - lo] = fold_run(acc[p - lo], row, init, &combine, merge);
                        }
                    }
                    1 => {
                        let (a, z) = (p.max(lo), (p + row.len()).min(hi));
                        if a < z {
                            for (x, &e) in acc[a - lo..z - lo].iter_mut().zip(&row[a - p..]) {
                                *x = combine(*x, e);
                            }
                        }
                    }
                    s => {
                        for (j, &e) in row.iter().enumerate() {
                            let q = (pos + j as isize * s) as usize;
                            if (lo..hi).contains(&q) {
                                acc[q - lo] = combine(acc[q - lo], e);
                            }
                        }
                    }
                }
                for d in (0..rank - 1).rev() {
                    idx[d] += 1;
                    pos += strides[1][d];
                    if idx[d] < merged[d] {
                        break;
                    }
                    pos -= strides[1][d] * merged[d] as isize;
                    idx[d] = 0;
                }
            }
        };
        in_parts(&mut acc, v.len(), fold_rows);
    }
    Ok((acc, kept))
}

/// Runs `fold(part, first)` over `acc` whole, or, for a large input on a rank with threads,
/// over contiguous parts of it on the threads: each accumulator is folded by one thread, in
/// the same order as by one, so the bits do not depend on the threads.
fn in_parts<A: Send>(acc: &mut [A], input_len: usize, fold: impl Fn(&mut [A], usize) + Sync) {
    let threads = super::pool_threads();
    if threads > 1 && input_len >= super::strided::PARALLEL_MIN && acc.len() >= 2 * threads {
        use rayon::prelude::*;
        let part = acc.len().div_ceil(threads);
        acc.par_chunks_mut(part)
            .enumerate()
            .for_each(|(k, a)| fold(a, k * part));
    } else {
        fold(acc, 0);
    }
}

/// `a` with every element of `row` folded in: over [`LANES`] accumulators merged pairwise
/// when `merge` is given and the run is long enough (see [`fold_dims`]), else in order.
fn fold_run<E: Copy, A: Copy>(
    mut a: A,
    row: &[E],
    init: A,
    combine: &impl Fn(A, E) -> A,
    merge: Option<fn(A, A) -> A>,
) -> A {
    let Some(merge) = merge.filter(|_| row.len() >= 2 * LANES) else {
        return row.iter().fold(a, |a, &e| combine(a, e));
    };
    let mut part = [init; LANES];
    let (blocks, tail) = row.as_chunks::<LANES>();
    for block in blocks {
        for (q, &e) in part.iter_mut().zip(block) {
            *q = combine(*q, e);
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            part[l] = merge(part[l], part[l + width]);
        }
    }
    a = merge(a, part[0]);
    tail.iter().fold(a, |a, &e| combine(a, e))
}

/// The output shape of a reduction: `kept` with the reduced dims dropped unless `keepdim`.
fn reduced_shape(shape: &[usize], dims: &[usize], kept: Dims<usize>, keepdim: bool) -> Dims<usize> {
    if keepdim {
        kept
    } else {
        (0..shape.len())
            .filter(|i| !dims.contains(i))
            .map(|i| shape[i])
            .collect()
    }
}

fn reduce_typed<T: Real>(
    x: &Tensor,
    op: ReduceOp,
    dims: &[usize],
    keepdim: bool,
) -> Result<Tensor, String> {
    let shape = x.shape();
    // elements each output folds: 0 where a reduced dim is empty
    let count: usize = dims.iter().filter_map(|&d| shape.get(d)).product();
    let v = T::elems(x);
    let init = match op {
        ReduceOp::Amax => T::of(f64::NEG_INFINITY),
        ReduceOp::Amin => T::of(f64::INFINITY),
        ReduceOp::Prod => T::ONE,
        ReduceOp::Sum | ReduceOp::Mean => T::ZERO,
    };
    // one fold per op, each with its own closure type, so that the inner loops carry neither
    // a match nor a call
    macro_rules! fold {
        ($combine:expr, $merge:expr) => {
            fold_dims(&v, shape, dims, init, $combine, $merge)
        };
    }
    let (mut acc, kept) = match op {
        ReduceOp::Amax => fold!(|a: T, b: T| if b.is_nan() || b > a { b } else { a }, None),
        ReduceOp::Amin => fold!(|a: T, b: T| if b.is_nan() || b < a { b } else { a }, None),
        ReduceOp::Prod => fold!(|a: T, b: T| a * b, None),
        ReduceOp::Sum | ReduceOp::Mean => fold!(|a: T, b: T| a + b, Some(|a: T, b: T| a + b)),
    }?;
    crate::cpu::buffer_pool::give_cow(v);
    if op == ReduceOp::Mean {
        // a mean over nothing is 0 / 0 = NaN, as PyTorch's
        let c = T::of(count as f64);
        acc.iter_mut().for_each(|a| *a = *a / c);
    }
    let out_shape = reduced_shape(shape, dims, kept, keepdim);
    Ok(Tensor::new(out_shape, T::storage(acc)))
}

/// Sum, mean, max, min or product over `dims`; the result has `dtype`. A max or min over no
/// elements (a reduced dimension of size 0) is an error, as in PyTorch, unless the result is
/// empty too.
pub fn reduce(
    x: &Tensor,
    op: ReduceOp,
    dims: &[usize],
    keepdim: bool,
    dtype: DType,
) -> Result<Tensor, String> {
    check_extremum(x.shape(), op, dims)?;
    let ct = match dtype {
        DType::F64 => DType::F64,
        DType::F32 | DType::BF16 | DType::F16 => DType::F32,
        DType::I64 | DType::I32 if op != ReduceOp::Mean => {
            return reduce_int(x, op, dims, keepdim, dtype)
        }
        other => {
            return Err(format!(
                "{op:?} into {other} is not supported by the cpu backend"
            ))
        }
    };
    let r = match ct {
        DType::F64 => reduce_typed::<f64>(x, op, dims, keepdim)?,
        _ => reduce_typed::<f32>(x, op, dims, keepdim)?,
    };
    if r.dtype() == dtype {
        Ok(r)
    } else {
        r.to_dtype(dtype)
            .ok_or_else(|| format!("cannot convert to {dtype}"))
    }
}

fn softmax_typed<T: Real>(x: &Tensor, dim: usize, log: bool) -> Tensor {
    let shape = x.shape();
    let v = T::elems(x);
    let len = shape.get(dim).copied().unwrap_or(1);
    let inner: usize = shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let outer = x.numel() / (len * inner).max(1);
    // every element is written (each row's exponentials, then their normalised values)
    let mut out = crate::cpu::buffer_pool::overwritten(v.len());
    if inner == 1 && len > 0 {
        crate::cpu::simd::vectorized(
            #[inline(always)]
            || {
                for (row, dst) in v.chunks_exact(len).zip(out.chunks_exact_mut(len)) {
                    softmax_row(row, dst, log);
                }
            },
        );
        crate::cpu::buffer_pool::give_cow(v);
        return Tensor::new(shape, T::storage(out));
    }
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * len * inner + j * inner + i;
            let mut max = T::of(f64::NEG_INFINITY);
            for j in 0..len {
                if v[at(j)] > max {
                    max = v[at(j)];
                }
            }
            // each exponential once: kept in the output until the sum is known
            let mut sum = T::ZERO;
            for j in 0..len {
                let e = (v[at(j)] - max).exp();
                out[at(j)] = e;
                sum = sum + e;
            }
            let lse = sum.ln();
            for j in 0..len {
                out[at(j)] = if log {
                    (v[at(j)] - max) - lse
                } else {
                    out[at(j)] / sum
                };
            }
        }
    }
    crate::cpu::buffer_pool::give_cow(v);
    Tensor::new(shape, T::storage(out))
}

/// Lanes of the partial maxima and sums of [`softmax_row`]: a row's loops run as vector
/// code, in the same order on every thread count.
const SOFTMAX_LANES: usize = 8;

/// Softmax (or log-softmax) of one contiguous row into `dst`: the maximum (over the values
/// that are not NaN: a NaN makes its row NaN through the sum), each exponential once, kept in
/// `dst` until the sum is known, the sum in [`SOFTMAX_LANES`] partial sums.
#[inline(always)]
fn softmax_row<T: Real>(row: &[T], dst: &mut [T], log: bool) {
    let mut maxes = [T::of(f64::NEG_INFINITY); SOFTMAX_LANES];
    let mut chunks = row.chunks_exact(SOFTMAX_LANES);
    for c in &mut chunks {
        for (m, &x) in maxes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    for (m, &x) in maxes.iter_mut().zip(chunks.remainder()) {
        *m = if x > *m { x } else { *m };
    }
    let max = maxes
        .iter()
        .fold(T::of(f64::NEG_INFINITY), |a, &b| if b > a { b } else { a });
    for (d, &x) in dst.iter_mut().zip(row) {
        *d = (x - max).exp();
    }
    let mut sums = [T::ZERO; SOFTMAX_LANES];
    let mut chunks = dst.chunks_exact(SOFTMAX_LANES);
    for c in &mut chunks {
        for (s, &e) in sums.iter_mut().zip(c) {
            *s = *s + e;
        }
    }
    for (s, &e) in sums.iter_mut().zip(chunks.remainder()) {
        *s = *s + e;
    }
    let sum =
        ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
    if log {
        let lse = sum.ln();
        for (d, &x) in dst.iter_mut().zip(row) {
            *d = (x - max) - lse;
        }
    } else {
        for d in dst.iter_mut() {
            *d = *d / sum;
        }
    }
}

/// Softmax or log-softmax along `dim`, max-subtracted for stability.
pub fn softmax(x: &Tensor, dim: usize, log: bool) -> Result<Tensor, String> {
    let dtype = x.dtype();
    let r = match dtype {
        DType::F64 => softmax_typed::<f64>(x, dim, log),
        DType::F32 | DType::BF16 | DType::F16 => softmax_typed::<f32>(x, dim, log),
        other => return Err(format!("dtype {other} is not supported by the cpu backend")),
    };
    in_dtype(r, dtype)
}

/// A max or min needs at least one element per output position.
pub fn check_extremum(shape: &[usize], op: ReduceOp, dims: &[usize]) -> Result<(), String> {
    if !matches!(op, ReduceOp::Amax | ReduceOp::Amin) {
        return Ok(());
    }
    let empty = dims.iter().any(|&d| shape.get(d) == Some(&0));
    let out_empty = (0..shape.len()).any(|d| !dims.contains(&d) && shape[d] == 0);
    if empty && !out_empty {
        return Err(format!(
            "{op:?} over dims {dims:?} of {shape:?}: a reduced dimension has no elements \
             (PyTorch refuses this too)"
        ));
    }
    Ok(())
}

/// `r` as `dtype` (itself when it already is).
fn in_dtype(r: Tensor, dtype: DType) -> Result<Tensor, String> {
    if r.dtype() == dtype {
        Ok(r)
    } else {
        r.to_dtype(dtype)
            .ok_or_else(|| format!("cannot convert to {dtype}"))
    }
}

/// Sum, max, min or product of bools or integers into an integer dtype (`torch.sum(mask)`
/// counts), exact in wrapping i64 as PyTorch's integer sums are.
fn reduce_int(
    x: &Tensor,
    op: ReduceOp,
    dims: &[usize],
    keepdim: bool,
    dtype: DType,
) -> Result<Tensor, String> {
    let shape = x.shape();
    let (init, combine): (i64, fn(i64, i64) -> i64) = match op {
        ReduceOp::Amax => (i64::MIN, i64::max),
        ReduceOp::Amin => (i64::MAX, i64::min),
        ReduceOp::Prod => (1, i64::wrapping_mul),
        ReduceOp::Sum | ReduceOp::Mean => (0, i64::wrapping_add),
    };
    let (acc, kept) = fold_dims(&x.to_i64_vec(), shape, dims, init, combine, None)?;
    in_dtype(
        Tensor::from_i64(reduced_shape(shape, dims, kept, keepdim), acc),
        dtype,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_over_an_empty_dimension_follow_pytorch() {
        let x = Tensor::from_f32([3usize, 0], Vec::new());
        let sum = reduce(&x, ReduceOp::Sum, &[1], false, DType::F32).expect("sum");
        assert_eq!(sum.shape(), &[3]);
        assert!(sum.to_f64_vec().iter().all(|&v| v == 0.0));
        let mean = reduce(&x, ReduceOp::Mean, &[1], false, DType::F32).expect("mean");
        assert!(mean.to_f64_vec().iter().all(|v| v.is_nan()), "0 / 0");
        let err = reduce(&x, ReduceOp::Amax, &[1], false, DType::F32).unwrap_err();
        assert!(err.contains("no elements"), "{err}");
        // over the non-empty dim the result is itself empty, which is fine
        let amax = reduce(&x, ReduceOp::Amax, &[0], false, DType::F32).expect("empty result");
        assert_eq!(amax.shape(), &[0]);
    }

    #[test]
    fn a_rank_with_threads_gives_the_one_thread_bits_and_the_right_sums() {
        // large enough to be shared among threads; the dims take every path of the fold
        // (leading rows, a run into one accumulator, a row of accumulators)
        let shape = [8usize, 33, 17, 31];
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
            .collect();
        let x = Tensor::from_f32(shape, vals.clone());
        for dims in [
            vec![0],
            vec![0, 1],
            vec![0, 2, 3],
            vec![1, 3],
            vec![3],
            vec![2],
            vec![1],
            vec![0, 3],
        ] {
            for op in [ReduceOp::Sum, ReduceOp::Amax] {
                let run = || {
                    reduce(&x, op, &dims, false, DType::F32)
                        .expect("reduces")
                        .to_f32_vec()
                };
                let (one, three) = crate::cpu::alone_and_in_three_threads(run);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&one), bits(&three), "{op:?} over {dims:?}");
                // against a sum in f64, element by element
                let kept: Vec<usize> = (0..4).filter(|d| !dims.contains(d)).collect();
                let mut want = vec![0f64; one.len()];
                let mut most = vec![f64::NEG_INFINITY; one.len()];
                for (i, &e) in vals.iter().enumerate() {
                    let mut rest = i;
                    let mut idx = [0usize; 4];
                    for d in (0..4).rev() {
                        idx[d] = rest % shape[d];
                        rest /= shape[d];
                    }
                    let out = kept.iter().fold(0, |o, &d| o * shape[d] + idx[d]);
                    want[out] += e as f64;
                    most[out] = most[out].max(e as f64);
                }
                let want = if op == ReduceOp::Sum { want } else { most };
                for (k, (&got, &w)) in one.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - w).abs() <= 1e-3 * (1.0 + w.abs()),
                        "{op:?} over {dims:?} at {k}: {got} against {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn reductions_over_any_dims() {
        let x = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let s0 = reduce(&x, ReduceOp::Sum, &[0], false, DType::F32).expect("ok");
        assert_eq!(
            (s0.shape().to_vec(), s0.to_f32_vec()),
            (vec![3], vec![5., 7., 9.])
        );
        let s1 = reduce(&x, ReduceOp::Sum, &[1], true, DType::F32).expect("ok");
        assert_eq!(
            (s1.shape().to_vec(), s1.to_f32_vec()),
            (vec![2, 1], vec![6., 15.])
        );
        let m = reduce(&x, ReduceOp::Mean, &[0, 1], false, DType::F64).expect("ok");
        assert_eq!((m.shape().len(), m.to_f64_vec()), (0, vec![3.5]));
        let a = reduce(
            &x.permute(&[1, 0]).expect("2-d"),
            ReduceOp::Amax,
            &[1],
            false,
            DType::F32,
        )
        .expect("ok");
        assert_eq!(a.to_f32_vec(), vec![4., 5., 6.]);
    }

    #[test]
    fn long_sums_are_regrouped_over_lanes_deterministically() {
        // a million tenths: added one after another in f32 the sum drifts by about 1%
        let n = 1_000_000;
        let x = Tensor::from_f32(vec![2, n / 2], vec![0.1; n]);
        let s = reduce(&x, ReduceOp::Sum, &[0, 1], false, DType::F32).expect("ok");
        let got = f64::from(s.to_f32_vec()[0]);
        let sequential = (0..n).fold(0f32, |a, _| a + 0.1);
        let want = n as f64 * f64::from(0.1f32);
        assert!((f64::from(sequential) - want).abs() / want > 5e-3);
        assert!((got - want).abs() / want < 1e-3, "{got} vs {want}");
        // the same bits every time, and per row over a reduced last dim
        let again = reduce(&x, ReduceOp::Sum, &[0, 1], false, DType::F32).expect("ok");
        assert_eq!(again.to_f32_vec()[0].to_bits(), s.to_f32_vec()[0].to_bits());
        let rows = reduce(&x, ReduceOp::Mean, &[1], false, DType::F32).expect("ok");
        for m in rows.to_f32_vec() {
            assert!((f64::from(m) - f64::from(0.1f32)).abs() < 1e-4, "{m}");
        }
        // max and min keep their order and their NaN
        let mut v = vec![1f32; 100];
        v[37] = f32::NAN;
        let t = Tensor::from_f32(vec![100], v);
        assert!(reduce(&t, ReduceOp::Amax, &[0], false, DType::F32)
            .expect("ok")
            .to_f32_vec()[0]
            .is_nan());
    }

    #[test]
    fn log_softmax_normalizes() {
        let x = Tensor::from_f64(vec![2, 2], vec![0.0, 0.0, 1000.0, 0.0]);
        let l = softmax(&x, 1, true).expect("ok").to_f64_vec();
        assert!((l[0] - (0.5f64).ln()).abs() < 1e-12);
        assert!(l[2].abs() < 1e-12 && l[3] < -999.0);
        let s = softmax(&x, 0, false).expect("ok").to_f64_vec();
        assert!((s[1] - 0.5).abs() < 1e-12);
    }

    #[test]
    fn bools_and_integers_sum_exactly_into_integers() {
        let m = Tensor::from_bool(vec![2, 3], vec![true, false, true, true, true, false]);
        let all = reduce(&m, ReduceOp::Sum, &[0, 1], false, DType::I64).unwrap();
        assert_eq!(all.shape(), &[] as &[usize]);
        assert_eq!(all.to_i64_vec(), vec![4]);
        let rows = reduce(&m, ReduceOp::Sum, &[1], true, DType::I64).unwrap();
        assert_eq!(rows.shape(), &[2, 1]);
        assert_eq!(rows.to_i64_vec(), vec![2, 2]);
        let i = Tensor::from_i64(vec![2, 2], vec![5, -7, 9, 1]);
        let cols = reduce(&i, ReduceOp::Amax, &[0], false, DType::I64).unwrap();
        assert_eq!(cols.to_i64_vec(), vec![9, 1]);
        assert!(reduce(&i, ReduceOp::Mean, &[0], false, DType::I64).is_err());
        let mins = reduce(&i, ReduceOp::Amin, &[1], false, DType::I64).unwrap();
        assert_eq!(mins.to_i64_vec(), vec![-7, 1]);
        let prods = reduce(&i, ReduceOp::Prod, &[0], true, DType::I64).unwrap();
        assert_eq!(
            (prods.shape(), prods.to_i64_vec()),
            (&[1, 2][..], vec![45, -7])
        );
        // products wrap as PyTorch's int64 products do
        let big = Tensor::from_i64(vec![2], vec![1 << 62, 4]);
        let p = reduce(&big, ReduceOp::Prod, &[0], false, DType::I64).unwrap();
        assert_eq!(p.to_i64_vec(), vec![0]);
        let m = reduce(&m, ReduceOp::Prod, &[1], false, DType::I64).unwrap();
        assert_eq!(m.to_i64_vec(), vec![0, 0]);
    }

    #[test]
    fn amin_and_prod_of_floats() {
        let x = Tensor::from_f32(vec![2, 3], vec![1.5, -2.0, 3.0, f32::NAN, 5.0, -6.0]);
        let mn = reduce(&x, ReduceOp::Amin, &[1], false, DType::F32).unwrap();
        let v = mn.to_f32_vec();
        assert_eq!(v[0], -2.0);
        assert!(v[1].is_nan(), "NaN wins: {v:?}");
        let cols = reduce(&x, ReduceOp::Amin, &[0], true, DType::F32).unwrap();
        assert_eq!(cols.shape(), &[1, 3]);
        assert_eq!(cols.to_f32_vec()[1..], [-2.0, -6.0]);
        let p = reduce(&x, ReduceOp::Prod, &[1], false, DType::F32).unwrap();
        assert_eq!(p.to_f32_vec()[0], -9.0);
        assert!(p.to_f32_vec()[1].is_nan());
        let h = x.to_dtype(DType::BF16).unwrap();
        let ph = reduce(&h, ReduceOp::Prod, &[0, 1], false, DType::BF16).unwrap();
        assert_eq!(ph.dtype(), DType::BF16);
        // no elements: the product is 1, a minimum is refused unless the result is empty
        let e = Tensor::from_f32(vec![0, 3], vec![]);
        let pe = reduce(&e, ReduceOp::Prod, &[0], false, DType::F32).unwrap();
        assert_eq!(pe.to_f32_vec(), vec![1.0; 3]);
        let err = reduce(&e, ReduceOp::Amin, &[0], false, DType::F32).unwrap_err();
        assert!(err.contains("no elements"), "{err}");
        let ok = reduce(&e, ReduceOp::Amin, &[1], false, DType::F32).unwrap();
        assert_eq!(ok.shape(), &[0]);
    }
}
