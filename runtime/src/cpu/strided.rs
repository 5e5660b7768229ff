//! Broadcast and strided operands read in place. An elementwise kernel walks its output in
//! row-major order over each operand's own strides (0 along broadcast dimensions), so an
//! expanded, permuted or sliced operand is neither copied nor read through an index vector.
//! Dimensions that are contiguous for every operand are merged first, so the innermost loop is
//! as long as it can be; its common forms (every operand unit-stride, or one constant along
//! it) are plain slice loops, compiled for this CPU's vector unit ([`vectorized`]). With more
//! than one thread in the rank's pool (`--threads-per-rank`), a large output is split into
//! row ranges written in parallel; every element is computed by the same function either way,
//! so the result does not depend on the thread count.

use super::buffer_pool::{self as pool, Pooled};
use super::real::Real;
use super::simd::vectorized;
use crate::tensor::{contiguous_strides, Dims, Tensor};
use rayon::prelude::*;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// Outputs smaller than this are written by one thread (handing work out costs ~10 us).
pub(crate) const PARALLEL_MIN: usize = 1 << 16;

/// An operand as the walk reads it: its elements and, per output dimension, its stride.
pub struct Strided<'a, T: Clone> {
    data: Cow<'a, [T]>,
    offset: isize,
    strides: Dims<isize>,
}

impl<'a, T: Real> Strided<'a, T> {
    /// `t` read while walking `out`, a shape `t`'s shape broadcasts to. A tensor stored in
    /// another type (bf16 and f16 computed in f32) is converted once, contiguously.
    pub fn of(t: &'a Tensor, out: &[usize]) -> Strided<'a, T> {
        let (data, offset, own) = match T::slice(t.storage()) {
            Some(v) => (
                Cow::Borrowed(v),
                t.offset() as isize,
                Dims::from(t.strides()),
            ),
            None => (T::elems(t), 0, contiguous_strides(t.shape())),
        };
        let lead = out.len() - t.shape().len();
        let strides = (0..out.len())
            .map(|i| {
                if i < lead || t.shape()[i - lead] == 1 {
                    0
                } else {
                    own[i - lead]
                }
            })
            .collect();
        Strided {
            data,
            offset,
            strides,
        }
    }

    /// Gives back a converted copy to the buffer pool.
    pub fn release(self) {
        pool::give_cow(self.data);
    }
}

/// The output shape with size-1 dimensions dropped and neighbours merged wherever every
/// operand steps through them as one (`strides[d] == strides[d + 1] * shape[d + 1]`); each
/// operand's strides over the merged shape. Never empty: a one-element walk is `[1]`.
pub(crate) fn coalesce(
    out: &[usize],
    operands: &[&[isize]],
) -> (Dims<usize>, SmallVec<[Dims<isize>; 3]>) {
    let mut shape: Dims<usize> = Dims::new();
    let mut strides: SmallVec<[Dims<isize>; 3]> = operands.iter().map(|_| Dims::new()).collect();
    for (d, &n) in out.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let merges = !shape.is_empty()
            && operands
                .iter()
                .zip(&strides)
                .all(|(s, merged)| merged.last() == Some(&(s[d] * n as isize)));
        if merges {
            if let Some(last) = shape.last_mut() {
                *last *= n;
            }
            for (s, merged) in operands.iter().zip(strides.iter_mut()) {
                if let Some(last) = merged.last_mut() {
                    *last = s[d];
                }
            }
        } else {
            shape.push(n);
            for (s, merged) in operands.iter().zip(strides.iter_mut()) {
                merged.push(s[d]);
            }
        }
    }
    if shape.is_empty() {
        shape.push(1);
        strides.iter_mut().for_each(|s| s.push(0));
    }
    (shape, strides)
}

/// Walks rows `first..` of the merged shape, filling `dst` (a whole number of rows) by
/// `row(positions, dst_row)`.
fn walk_rows<const K: usize, U>(
    shape: &[usize],
    strides: &[Dims<isize>],
    offsets: [isize; K],
    first: usize,
    dst: &mut [MaybeUninit<U>],
    row: &impl Fn([isize; K], &mut [MaybeUninit<U>]),
) {
    let rank = shape.len();
    let inner = shape[rank - 1];
    // row `first`'s index over the outer dims, and each operand's position there
    let mut pos = offsets;
    let mut idx: Dims<usize> = SmallVec::from_elem(0, rank - 1);
    let mut r = first;
    for d in (0..rank - 1).rev() {
        idx[d] = r % shape[d];
        r /= shape[d];
        for (p, s) in pos.iter_mut().zip(strides) {
            *p += idx[d] as isize * s[d];
        }
    }
    for chunk in dst.chunks_mut(inner) {
        row(pos, chunk);
        for d in (0..rank - 1).rev() {
            idx[d] += 1;
            for (p, s) in pos.iter_mut().zip(strides) {
                *p += s[d];
            }
            if idx[d] < shape[d] {
                break;
            }
            for (p, s) in pos.iter_mut().zip(strides) {
                *p -= s[d] * shape[d] as isize;
            }
            idx[d] = 0;
        }
    }
}

/// The walk with its last dim cut into rows of at most 4096 elements (a power of two
/// dividing it), each operand stepping through the new outer dim by its old stride times
/// the row length.
fn split_long_rows(
    shape: &[usize],
    strides: &[Dims<isize>],
) -> (Dims<usize>, SmallVec<[Dims<isize>; 3]>) {
    const ROW: usize = 4096;
    let mut shape = Dims::from(shape);
    let mut strides: SmallVec<[Dims<isize>; 3]> = strides.iter().cloned().collect();
    let last = shape.len() - 1;
    let inner = shape[last];
    if inner > ROW {
        let row = (0..=ROW.trailing_zeros())
            .rev()
            .map(|k| 1usize << k)
            .find(|&r| inner % r == 0)
            .unwrap_or(1);
        if row > 1 {
            shape[last] = inner / row;
            shape.push(row);
            for s in strides.iter_mut() {
                let step = s[last];
                s[last] = step * row as isize;
                s.push(step);
            }
        }
    }
    (shape, strides)
}

/// `n` outputs written row by row (in parallel row ranges when the rank has threads).
pub(crate) fn fill<const K: usize, U: Pooled + Send>(
    shape: &[usize],
    strides: &[Dims<isize>],
    offsets: [isize; K],
    row: impl Fn([isize; K], &mut [MaybeUninit<U>]) + Sync,
) -> Vec<U> {
    let n: usize = shape.iter().product();
    let mut out = pool::take::<U>(n);
    let dst = &mut out.spare_capacity_mut()[..n];
    let threads = super::pool_threads();
    let parallel = threads > 1 && n >= PARALLEL_MIN;
    // a long row (a contiguous tensor is one) is cut into rows of a power of two that divides
    // it, so that it can be shared; the walk and every element stay the same
    let split = parallel.then(|| split_long_rows(shape, strides));
    let (shape, strides) = match &split {
        Some((shape, strides)) => (&shape[..], &strides[..]),
        None => (shape, strides),
    };
    let inner = shape[shape.len() - 1];
    let rows = n / inner.max(1);
    if parallel && rows > 1 {
        let rows_per_part = rows.div_ceil(threads * 4);
        dst.par_chunks_mut(rows_per_part * inner)
            .enumerate()
            .for_each(|(part, d)| {
                walk_rows(shape, strides, offsets, part * rows_per_part, d, &row)
            });
    } else if n > 0 {
        walk_rows(shape, strides, offsets, 0, dst, &row);
    }
    // SAFETY: the walk wrote every one of the first `n` elements (the rows tile `dst`).
    unsafe { out.set_len(n) };
    out
}

/// Copies `src` into `dst` (the same length). Runs of 8 to [`SHORT_RUN`] elements (a 3x3
/// kernel's rows of 9, a 16-wide image row) go as blocks of 8, the last block overlapping the
/// one before, so the copy is a few vector moves inline: `copy_from_slice` calls `memcpy` per
/// run, which on the weight-gradient gathers cost more than the copy itself.
pub(crate) fn copy_run<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T]) {
    const BLOCK: usize = 8;
    let n = src.len();
    debug_assert_eq!(dst.len(), n);
    let block = |dst: &mut [MaybeUninit<T>], at: usize| {
        if let Ok(s) = <&[T; BLOCK]>::try_from(&src[at..at + BLOCK]) {
            for (d, &x) in dst[at..at + BLOCK].iter_mut().zip(s) {
                d.write(x);
            }
        }
    };
    if !(BLOCK..=SHORT_RUN).contains(&n) {
        dst.iter_mut().zip(src).for_each(|(d, &x)| {
            d.write(x);
        });
        return;
    }
    let mut at = 0;
    while at + BLOCK < n {
        block(dst, at);
        at += BLOCK;
    }
    block(dst, n - BLOCK);
}

/// [`copy_run`] into initialised elements.
pub(crate) fn copy_run_init<T: Copy>(dst: &mut [T], src: &[T]) {
    // SAFETY: a `[T]` is a valid `[MaybeUninit<T>]` of the same length, and `copy_run` only
    // writes initialised values into it.
    let dst = unsafe {
        std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<MaybeUninit<T>>(), dst.len())
    };
    copy_run(dst, src);
}

/// Runs at most this long count as short for [`fill_transposed`].
const SHORT_RUN: usize = 32;
/// Rows of the output [`fill_transposed`] handles together.
const TILE_ROWS: usize = 16;

/// [`fill`] for a copy whose last two walked dims are transposed in the source (the middle
/// dim's stride is larger than the one before it) with short rows: a permuted `[C_in, C_out,
/// 3, 3]` weight gradient, or a flipped and permuted weight, where the plain walk reads each
/// 9-element row from another part of the source. Here `TILE_ROWS` output rows go together,
/// column by column, so that the source is read in runs of `TILE_ROWS` rows (contiguous where
/// the rows are) and the writes stay within the tile. `None` where the walk is not of that
/// kind. Every element is copied by `row`, as the plain walk would, so the result is the same.
pub(crate) fn fill_transposed<U: Pooled + Send>(
    shape: &[usize],
    strides: &[isize],
    offset: isize,
    row: impl Fn(isize, &mut [MaybeUninit<U>]) + Sync,
) -> Option<Vec<U>> {
    let rank = shape.len();
    if rank < 3 {
        return None;
    }
    let (m, b) = (shape[rank - 1], shape[rank - 2]);
    let (sb, sa) = (strides[rank - 2], strides[rank - 3]);
    let n: usize = shape.iter().product();
    if m > SHORT_RUN || sb.unsigned_abs() <= sa.unsigned_abs() || n < 1 << 14 {
        return None;
    }
    let mut out = pool::take::<U>(n);
    let dst = &mut out.spare_capacity_mut()[..n];
    // where output row `r` (an index over every dim but the last two; `b * m` elements)
    // starts in the source
    let outer = &shape[..rank - 2];
    let start = |r: usize| {
        let (mut r, mut p) = (r, offset);
        for d in (0..rank - 2).rev() {
            p += (r % outer[d]) as isize * strides[d];
            r /= outer[d];
        }
        p
    };
    let tile = |first: usize, rows: &mut [MaybeUninit<U>]| {
        let count = rows.len() / (b * m);
        let starts: SmallVec<[isize; TILE_ROWS]> = (first..first + count).map(start).collect();
        for j in 0..b {
            for (i, &p) in starts.iter().enumerate() {
                let at = (i * b + j) * m;
                row(p + j as isize * sb, &mut rows[at..at + m]);
            }
        }
    };
    let tile_len = TILE_ROWS * b * m;
    if super::pool_threads() > 1 && n >= PARALLEL_MIN {
        dst.par_chunks_mut(tile_len)
            .enumerate()
            .for_each(|(t, rows)| tile(t * TILE_ROWS, rows));
    } else {
        for (t, rows) in dst.chunks_mut(tile_len).enumerate() {
            tile(t * TILE_ROWS, rows);
        }
    }
    // SAFETY: the tiles cover `dst`, and each tile writes every one of its rows' elements.
    unsafe { out.set_len(n) };
    Some(out)
}

/// `f(a, b)` for every element of `out`, the shape `a` and `b` broadcast to.
pub fn zip_map<T: Real, U: Pooled + Send>(
    out: &[usize],
    a: &Strided<'_, T>,
    b: &Strided<'_, T>,
    f: impl Fn(T, T) -> U + Sync,
) -> Vec<U> {
    let (shape, strides) = coalesce(out, &[&a.strides, &b.strides]);
    let last = shape.len() - 1;
    let (sa, sb) = (strides[0][last], strides[1][last]);
    let (va, vb) = (&*a.data, &*b.data);
    // each row's loop is dispatched on its own: a closure called once inside `vectorized` is
    // inlined there, one called per row from the walk would not be
    fill(&shape, &strides, [a.offset, b.offset], |[pa, pb], dst| {
        let (pa, pb, m) = (pa as usize, pb as usize, dst.len());
        vectorized(
            #[inline(always)]
            || match (sa, sb) {
                (1, 1) => {
                    for ((d, &x), &y) in dst.iter_mut().zip(&va[pa..pa + m]).zip(&vb[pb..pb + m]) {
                        d.write(f(x, y));
                    }
                }
                (1, 0) => {
                    let y = vb[pb];
                    for (d, &x) in dst.iter_mut().zip(&va[pa..pa + m]) {
                        d.write(f(x, y));
                    }
                }
                (0, 1) => {
                    let x = va[pa];
                    for (d, &y) in dst.iter_mut().zip(&vb[pb..pb + m]) {
                        d.write(f(x, y));
                    }
                }
                _ => {
                    for (j, d) in dst.iter_mut().enumerate() {
                        let j = j as isize;
                        d.write(f(
                            va[(pa as isize + j * sa) as usize],
                            vb[(pb as isize + j * sb) as usize],
                        ));
                    }
                }
            },
        )
    })
}

/// `f(a)` for every element of `a`, in row-major order.
pub fn map<T: Real, U: Pooled + Send>(
    shape: &[usize],
    a: &Strided<'_, T>,
    f: impl Fn(T) -> U + Sync,
) -> Vec<U> {
    let (merged, strides) = coalesce(shape, &[&a.strides]);
    let sa = strides[0][merged.len() - 1];
    let va = &*a.data;
    fill(&merged, &strides, [a.offset], |[pa], dst| {
        let (pa, m) = (pa as usize, dst.len());
        vectorized(
            #[inline(always)]
            || {
                if sa == 1 {
                    for (d, &x) in dst.iter_mut().zip(&va[pa..pa + m]) {
                        d.write(f(x));
                    }
                } else {
                    for (j, d) in dst.iter_mut().enumerate() {
                        d.write(f(va[(pa as isize + j as isize * sa) as usize]));
                    }
                }
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_runs_copy_every_element_and_nothing_else() {
        let src: Vec<u32> = (1..=48).collect();
        for n in 0..=40 {
            // one element of guard on each side
            let mut dst = vec![0u32; n + 2];
            copy_run_init(&mut dst[1..n + 1], &src[..n]);
            assert_eq!(dst[1..n + 1], src[..n], "run of {n}");
            assert_eq!((dst[0], dst[n + 1]), (0, 0), "run of {n} wrote outside");
        }
    }

    fn t(shape: &[usize], offset: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_f32(shape, (0..n).map(|i| i as f32 * 0.5 + offset).collect())
    }

    fn expanded(x: &Tensor, out: &[usize]) -> Vec<f32> {
        let shape: Vec<i64> = out.iter().map(|&n| n as i64).collect();
        crate::cpu::layout::expand(x, &shape)
            .unwrap_or_else(|e| panic!("{e}"))
            .contiguous()
            .to_f32_vec()
    }

    /// The reference: every output element from its operands' broadcast positions, one by one.
    fn reference(out: &[usize], a: &Tensor, b: &Tensor) -> Vec<f32> {
        let (ea, eb) = (expanded(a, out), expanded(b, out));
        ea.iter().zip(&eb).map(|(x, y)| x * 3.0 - y).collect()
    }

    #[test]
    fn merged_walks_equal_elementwise_reference_on_broadcasts_and_views() {
        let cases: Vec<(Tensor, Tensor)> = vec![
            (t(&[4, 6, 5, 7], 0.0), t(&[4, 6, 5, 1], 1.0)),
            (t(&[3, 5], 0.0), t(&[5], 2.0)),
            (t(&[3, 1], 0.0), t(&[1, 4], 2.0)),
            (t(&[2, 3, 4], 0.0), t(&[], 7.0)),
            (t(&[2, 3, 4], 0.0), t(&[3, 1], 7.0)),
            // a permuted view and a sliced view
            (
                t(&[4, 3, 5], 0.0)
                    .permute(&[2, 0, 1])
                    .unwrap_or_else(|e| panic!("{e}")),
                t(&[5, 4, 3], 1.0),
            ),
            (
                Tensor::view_of(&t(&[40], 0.0), 3, vec![6, 5]),
                t(&[6, 1], 1.0),
            ),
        ];
        for (a, b) in cases {
            let out = tracepass_ir::broadcast_shapes(a.shape(), b.shape())
                .unwrap_or_else(|| panic!("{:?} {:?}", a.shape(), b.shape()));
            let (sa, sb) = (Strided::<f32>::of(&a, &out), Strided::<f32>::of(&b, &out));
            let got = zip_map(&out, &sa, &sb, |x, y| x * 3.0 - y);
            assert_eq!(
                got,
                reference(&out, &a, &b),
                "{:?} {:?}",
                a.shape(),
                b.shape()
            );
            let mapped = map(&out, &sa, |x| x + 1.0);
            let want: Vec<f32> = expanded(&a, &out).iter().map(|x| x + 1.0).collect();
            assert_eq!(mapped, want);
        }
    }

    #[test]
    fn thread_pools_give_the_same_bits() {
        let (a, b) = (t(&[64, 33, 40], 0.25), t(&[64, 33, 1], 3.0));
        let out = [64, 33, 40];
        let run = || {
            let (sa, sb) = (Strided::<f32>::of(&a, &out), Strided::<f32>::of(&b, &out));
            zip_map(&out, &sa, &sb, |x, y| (x / y).tanh())
        };
        let (one, three) = crate::cpu::alone_and_in_three_threads(run);
        assert_eq!(one.len(), 64 * 33 * 40);
        assert!(one
            .iter()
            .zip(&three)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        // one long contiguous row (cut into rows of 4096 to be shared), and one whose length
        // no power of two above 1 divides (walked whole)
        for n in [3 << 15, 65537] {
            let a = t(&[n], 0.5);
            let run = || map(&[n], &Strided::<f32>::of(&a, &[n]), |x| x.tanh() * 2.0);
            let (one, three) = crate::cpu::alone_and_in_three_threads(run);
            let want: Vec<f32> = a.to_f32_vec().iter().map(|x| x.tanh() * 2.0).collect();
            assert_eq!(one, want);
            assert!(one
                .iter()
                .zip(&three)
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    #[test]
    fn coalesce_merges_only_what_every_operand_walks_contiguously() {
        let (shape, s) = coalesce(
            &[4, 6, 128, 128],
            &[&[98304, 16384, 128, 1], &[768, 128, 1, 0]],
        );
        let vecs = |s: &[Dims<isize>]| s.iter().map(|d| d.to_vec()).collect::<Vec<_>>();
        assert_eq!(shape.to_vec(), vec![3072, 128]);
        assert_eq!(vecs(&s), vec![vec![128, 1], vec![1, 0]]);
        let (shape, s) = coalesce(&[1, 1], &[&[0, 0]]);
        assert_eq!((shape.to_vec(), vecs(&s)), (vec![1], vec![vec![0]]));
    }
}
