//! An all-reduce's arithmetic on the host, done in place: the ranks' communication workers
//! each reduce their own disjoint chunk of the buffers (as in a ring's reduce-scatter) into
//! rank 0's buffer and copy it into every other rank's (the ring's all-gather), so each rank
//! gets its result in the buffer it brought: the reduction allocates and copies nothing beyond
//! that, and no rank's buffer ends up with another rank (whose pool would keep it while the
//! first allocates a new one every step). A reduce-scatter copies into each other rank's
//! buffer only the slice that rank keeps. Elements are combined in rank order (0, 1, 2, ...),
//! so every element gets the same bits whichever worker reduces it and however the buffer is
//! chunked.

use crate::comm::ReduceOp;
use crate::tensor::{Storage, Tensor};
use half::{bf16, f16};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Elements reduced at a time: 16 KiB of f32, well inside L1 with the parts' blocks.
const BLOCK: usize = 4096;

/// Where a rank's elements live while workers write them.
#[derive(Clone, Copy)]
enum Base {
    F32(*mut f32),
    F64(*mut f64),
    BF16(*mut bf16),
    F16(*mut f16),
    I64(*mut i64),
    I32(*mut i32),
    Bool(*mut bool),
}

impl Base {
    /// The elements of a whole, unshared storage, to write.
    fn of(s: &mut Storage) -> Base {
        match s {
            Storage::F32(v) => Base::F32(v.as_mut_ptr()),
            Storage::F64(v) => Base::F64(v.as_mut_ptr()),
            Storage::BF16(v) => Base::BF16(v.as_mut_ptr()),
            Storage::F16(v) => Base::F16(v.as_mut_ptr()),
            Storage::I64(v) => Base::I64(v.as_mut_ptr()),
            Storage::I32(v) => Base::I32(v.as_mut_ptr()),
            Storage::Bool(v) => Base::Bool(v.as_mut_ptr()),
        }
    }
}

/// One all-reduce in progress: every rank's buffer, each of which ends holding the result.
/// Kept from one all-reduce to the next by its caller ([`Reduction::start`] reuses its lists).
pub struct Reduction {
    op: ReduceOp,
    /// The ranks' buffers (whole and unshared), in rank order; only reached through `bases`
    /// until every chunk is done.
    parts: SmallVec<[Tensor; 4]>,
    bases: SmallVec<[Base; 4]>,
    len: usize,
    /// Whether every rank's buffer gets the whole result, or (a reduce-scatter) rank 0's the
    /// whole and every other rank's only the slice it keeps (its `len / ranks` elements at
    /// `rank * len / ranks`).
    everyone: bool,
    /// Which chunks a worker has taken; a chunk is written by exactly one worker.
    claimed: SmallVec<[AtomicBool; 8]>,
    /// Chunks whose writes are complete (released by their writer, acquired by `results`).
    done: AtomicUsize,
}

// SAFETY: the buffers are written only through `reduce_chunk`, which hands each chunk index
// (a disjoint element range of every buffer) to at most one caller, and reached otherwise only
// through `&mut self` (`start`, `results`) once every chunk's writer has released its writes
// (`done`).
unsafe impl Send for Reduction {}
unsafe impl Sync for Reduction {}

impl Default for Reduction {
    fn default() -> Self {
        Reduction {
            op: ReduceOp::Sum,
            parts: SmallVec::new(),
            bases: SmallVec::new(),
            len: 0,
            everyone: true,
            claimed: SmallVec::new(),
            done: AtomicUsize::new(0),
        }
    }
}

impl Reduction {
    /// A reduction of `parts` (one tensor per rank, all of one dtype and size, checked by the
    /// caller) in `chunks` pieces, into every part.
    #[cfg(test)]
    pub fn new(op: ReduceOp, parts: impl IntoIterator<Item = Tensor>, chunks: usize) -> Reduction {
        let mut r = Reduction::default();
        r.start(op, parts, chunks, true);
        r
    }

    /// Starts the reduction of `parts` in `chunks` pieces, in this reduction's lists, into
    /// every part (`everyone`) or rank 0's whole and the others' own slices. A part written
    /// in place that something else still shares (or a view) is copied first.
    pub fn start(
        &mut self,
        op: ReduceOp,
        parts: impl IntoIterator<Item = Tensor>,
        chunks: usize,
        everyone: bool,
    ) {
        self.op = op;
        self.everyone = everyone;
        self.parts.clear();
        self.bases.clear();
        for mut p in parts {
            // moving the tensor moves its header only; the base still points at its elements
            self.bases.push(Base::of(p.storage_mut()));
            self.parts.push(p);
        }
        self.len = self.parts.first().map_or(0, Tensor::numel);
        self.claimed.clear();
        self.claimed
            .extend((0..chunks.max(1)).map(|_| AtomicBool::new(false)));
        *self.done.get_mut() = 0;
    }

    /// Reduces chunk `index` into rank 0's buffer and copies it into the others'; a chunk
    /// already taken (or out of range) is left alone, so no two workers ever write the same
    /// elements.
    pub fn reduce_chunk(&self, index: usize) {
        let n = self.claimed.len();
        let Some(flag) = self.claimed.get(index) else {
            return;
        };
        if flag.swap(true, Ordering::AcqRel) {
            return;
        }
        let (lo, hi) = (index * self.len / n, (index + 1) * self.len / n);
        let op = self.op;
        let Some((&first, others)) = self.bases.split_first() else {
            self.done.fetch_add(1, Ordering::Release);
            return;
        };
        // SAFETY (both macros): `lo..hi` lies inside every buffer's `len` elements (the parts
        // agree in size) and no other chunk overlaps it; the claim above makes this the only
        // reader and writer of this range of every buffer.
        macro_rules! blocks {
            ($p:expr, $variant:ident, |$block:ident, $start:ident, $srcs:ident| $reduce:block) => {{
                let out = unsafe { std::slice::from_raw_parts_mut($p.add(lo), hi - lo) };
                // block by block, so the output block stays in L1 while every rank's part is
                // added to it and while it is copied back (one pass over memory each)
                for (k, $block) in out.chunks_mut(BLOCK).enumerate() {
                    let $start = lo + k * BLOCK;
                    let len = $block.len();
                    let $srcs = others.iter().filter_map(|b| match b {
                        Base::$variant(q) => {
                            Some(unsafe { std::slice::from_raw_parts(q.add($start), len) })
                        }
                        _ => None,
                    });
                    $reduce
                    for (j, b) in others.iter().enumerate() {
                        let (a, z) = self.copied(j + 1, $start, len);
                        if let (Base::$variant(q), true) = (b, a < z) {
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    $block.as_ptr().add(a - $start),
                                    q.add(a),
                                    z - a,
                                )
                            };
                        }
                    }
                }
            }};
        }
        macro_rules! native {
            ($p:expr, $variant:ident) => {
                blocks!($p, $variant, |block, start, srcs| {
                    for src in srcs {
                        // one loop per op, so the sum compiles to vector adds
                        match op {
                            ReduceOp::Sum => {
                                for (a, &b) in block.iter_mut().zip(src) {
                                    *a = add(*a, b);
                                }
                            }
                            ReduceOp::Max => {
                                for (a, &b) in block.iter_mut().zip(src) {
                                    *a = larger(*a, b);
                                }
                            }
                        }
                    }
                })
            };
        }
        macro_rules! widened {
            ($p:expr, $variant:ident, $ty:ty) => {{
                let mut acc = [0.0f32; BLOCK];
                blocks!($p, $variant, |block, start, srcs| {
                    let acc = &mut acc[..block.len()];
                    for (a, x) in acc.iter_mut().zip(block.iter()) {
                        *a = x.to_f32();
                    }
                    for src in srcs {
                        for (a, b) in acc.iter_mut().zip(src) {
                            *a = combine(op, *a, b.to_f32());
                        }
                    }
                    for (o, a) in block.iter_mut().zip(acc.iter()) {
                        *o = <$ty>::from_f32(*a);
                    }
                })
            }};
        }
        match first {
            Base::F32(p) => native!(p, F32),
            Base::F64(p) => native!(p, F64),
            Base::BF16(p) => widened!(p, BF16, bf16),
            Base::F16(p) => widened!(p, F16, f16),
            Base::I64(p) => native!(p, I64),
            Base::I32(p) => native!(p, I32),
            // a sum or max of booleans is their `or`
            Base::Bool(p) => native!(p, Bool),
        }
        self.done.fetch_add(1, Ordering::Release);
    }

    /// Chunks no worker has taken yet.
    #[cfg(test)]
    pub fn unclaimed(&self) -> Vec<usize> {
        (0..self.claimed.len())
            .filter(|&i| !self.claimed[i].load(Ordering::Acquire))
            .collect()
    }

    /// Of the reduced elements `start .. start + len`, the range `rank`'s buffer gets: all of
    /// them, or where they meet the rank's slice.
    fn copied(&self, rank: usize, start: usize, len: usize) -> (usize, usize) {
        if self.everyone {
            return (start, start + len);
        }
        let slice = self.len / self.bases.len().max(1);
        (
            start.max(rank * slice),
            (start + len).min((rank + 1) * slice),
        )
    }

    /// The ranks' buffers, each holding the reduced elements, in rank order, once every chunk
    /// is done; `None` (and nothing taken) until then, so nothing ever reads a buffer while
    /// a worker may still write it.
    pub fn results(&mut self) -> Option<impl Iterator<Item = Tensor> + '_> {
        if self.done.load(Ordering::Acquire) < self.claimed.len() {
            return None;
        }
        self.bases.clear();
        Some(self.parts.drain(..))
    }
}

/// Addition as the all-reduce does it: IEEE for floats, wrapping for integers (as NCCL and
/// gloo), `or` for booleans.
trait AddElem: Copy {
    fn add_elem(self, b: Self) -> Self;
}
macro_rules! add_elem {
    ($($t:ty: |$a:ident, $b:ident| $e:expr),+) => {
        $(impl AddElem for $t {
            #[inline(always)]
            fn add_elem(self, $b: Self) -> Self {
                let $a = self;
                $e
            }
        })+
    };
}
add_elem!(
    f32: |a, b| a + b,
    f64: |a, b| a + b,
    i64: |a, b| a.wrapping_add(b),
    i32: |a, b| a.wrapping_add(b),
    bool: |a, b| a | b
);

#[inline(always)]
fn larger<T: PartialOrd>(a: T, b: T) -> T {
    if b > a {
        b
    } else {
        a
    }
}

#[inline(always)]
fn add<T: AddElem>(a: T, b: T) -> T {
    a.add_elem(b)
}

fn combine<T: PartialOrd + std::ops::Add<Output = T>>(op: ReduceOp, a: T, b: T) -> T {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(n: usize, len: usize) -> Vec<Tensor> {
        (0..n)
            .map(|r| {
                Tensor::from_f32(
                    vec![len],
                    (0..len)
                        .map(|i| (i as f32 * 0.37 + r as f32).sin())
                        .collect(),
                )
            })
            .collect()
    }

    /// The result of a reduction every chunk of which is done: rank 0's buffer, after
    /// checking that every rank's holds the same.
    fn done(mut r: Reduction) -> Tensor {
        let all: Vec<Tensor> = r.results().expect("every chunk is reduced").collect();
        for t in &all[1..] {
            assert_eq!(t.shape(), all[0].shape());
            assert_eq!(
                t.to_f64_vec(),
                all[0].to_f64_vec(),
                "every rank gets the result"
            );
        }
        all[0].clone()
    }

    #[test]
    fn finish_gives_nothing_while_a_chunk_is_not_reduced() {
        let mut r = Reduction::new(ReduceOp::Sum, ranks(2, 6), 2);
        r.reduce_chunk(1);
        assert!(r.results().is_none(), "finished with chunk 0 not reduced");
        assert_eq!(r.unclaimed(), vec![0]);
        r.reduce_chunk(0);
        assert_eq!(done(r).shape(), &[6]);
    }

    #[test]
    fn each_rank_gets_the_result_in_its_own_buffer_and_a_reduction_is_reused() {
        let parts = ranks(3, 2 * BLOCK + 5);
        let ids: Vec<usize> = parts.iter().map(Tensor::storage_id).collect();
        let mut r = Reduction::new(ReduceOp::Sum, parts, 3);
        (0..3).for_each(|i| r.reduce_chunk(i));
        let out: Vec<Tensor> = r.results().expect("done").collect();
        assert_eq!(out.iter().map(Tensor::storage_id).collect::<Vec<_>>(), ids);
        // the same reduction again, over the results: each element tripled
        let want: Vec<f32> = out[0].to_f32_vec().iter().map(|x| (x + x) + x).collect();
        r.start(ReduceOp::Sum, out, 2, true);
        assert_eq!(r.unclaimed(), vec![0, 1]);
        (0..2).for_each(|i| r.reduce_chunk(i));
        assert_eq!(done(r).to_f32_vec(), want);
    }

    #[test]
    fn a_reduce_scatter_gives_rank_0_the_whole_and_each_other_rank_its_slice() {
        // slices of BLOCK/2 + 3 elements, reduced in 2 chunks: chunk and block edges fall
        // inside slices
        let slice = BLOCK / 2 + 3;
        let parts = ranks(3, 3 * slice);
        let before: Vec<Vec<f32>> = parts.iter().map(Tensor::to_f32_vec).collect();
        let want: Vec<f32> = (0..3 * slice)
            .map(|i| (before[0][i] + before[1][i]) + before[2][i])
            .collect();
        let mut r = Reduction::default();
        r.start(ReduceOp::Sum, parts, 2, false);
        (0..2).for_each(|i| r.reduce_chunk(i));
        let out: Vec<Vec<f32>> = r.results().expect("done").map(|t| t.to_f32_vec()).collect();
        assert_eq!(out[0], want);
        for k in 1..3 {
            for i in 0..3 * slice {
                let expected = if i / slice == k {
                    want[i]
                } else {
                    before[k][i]
                };
                assert_eq!(out[k][i], expected, "rank {k}, element {i}");
            }
        }
    }

    #[test]
    fn chunks_in_any_order_give_the_rank_order_sum() {
        let parts = ranks(3, 11);
        let want: Vec<f32> = (0..11)
            .map(|i| {
                let v: Vec<f32> = parts.iter().map(|p| p.to_f32_vec()[i]).collect();
                (v[0] + v[1]) + v[2]
            })
            .collect();
        let r = Reduction::new(ReduceOp::Sum, parts, 4);
        for i in [2, 0, 3, 1, 1, 9] {
            r.reduce_chunk(i);
        }
        assert!(r.unclaimed().is_empty());
        let out = done(r);
        assert_eq!(out.shape(), &[11]);
        assert_eq!(out.to_f32_vec(), want);
    }

    #[test]
    fn integer_and_bool_buffers_reduce_exactly() {
        let parts = vec![
            Tensor::from_i64(vec![3], vec![1, -2, i64::MAX]),
            Tensor::from_i64(vec![3], vec![10, 5, 1]),
        ];
        let r = Reduction::new(ReduceOp::Sum, parts, 2);
        (0..2).for_each(|i| r.reduce_chunk(i));
        assert_eq!(done(r).to_i64_vec(), vec![11, 3, i64::MIN]);
        let parts = vec![
            Tensor::from_bool(vec![3], vec![true, false, false]),
            Tensor::from_bool(vec![3], vec![false, false, true]),
        ];
        let r = Reduction::new(ReduceOp::Max, parts, 1);
        r.reduce_chunk(0);
        assert_eq!(done(r).to_bool_vec(), vec![true, false, true]);
    }

    #[test]
    fn blocks_and_chunk_edges_do_not_change_the_bits() {
        let len = 3 * BLOCK + 777;
        let parts = ranks(4, len);
        let want: Vec<f32> = (0..len)
            .map(|i| {
                let v: Vec<f32> = parts.iter().map(|p| p.to_f32_vec()[i]).collect();
                ((v[0] + v[1]) + v[2]) + v[3]
            })
            .collect();
        let r = Reduction::new(ReduceOp::Sum, parts, 3);
        for i in 0..3 {
            r.reduce_chunk(i);
        }
        assert_eq!(done(r).to_f32_vec(), want);
    }

    #[test]
    fn a_shared_first_buffer_is_not_overwritten() {
        let parts = ranks(2, 5);
        let keep = parts[0].clone();
        let before = keep.to_f32_vec();
        let r = Reduction::new(ReduceOp::Max, parts, 2);
        assert_eq!(r.unclaimed(), vec![0, 1]);
        r.reduce_chunk(0);
        assert_eq!(r.unclaimed(), vec![1]);
        r.reduce_chunk(1);
        let out = done(r);
        assert_eq!(keep.to_f32_vec(), before);
        assert!(out.to_f32_vec().iter().zip(&before).all(|(o, b)| o >= b));
    }

    #[test]
    fn half_precision_accumulates_in_f32() {
        let parts: Vec<Tensor> = (0..4)
            .map(|_| Tensor::from_f32(vec![2], vec![1.0, 1e-3]).to_dtype(tracepass_ir::DType::BF16))
            .collect::<Option<_>>()
            .expect("bf16 is supported");
        let r = Reduction::new(ReduceOp::Sum, parts, 4);
        for i in 0..4 {
            r.reduce_chunk(i);
        }
        let out = done(r).to_f32_vec();
        assert_eq!(out[0], 4.0);
        assert_eq!(
            out[1],
            bf16::from_f32(4.0 * bf16::from_f32(1e-3).to_f32()).to_f32()
        );
    }
}
