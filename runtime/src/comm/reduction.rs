//! An all-reduce's arithmetic on the host, done in place: the ranks' communication workers
//! each overwrite their own disjoint chunk of rank 0's buffer with the reduction of that chunk
//! (as in a ring's reduce-scatter), so the reduction allocates and copies nothing beyond reading
//! the inputs. Elements are combined in rank order (0, 1, 2, ...), so every element gets the
//! same bits whichever worker reduces it and however the buffer is chunked.

use crate::comm::ReduceOp;
use crate::tensor::{Storage, Tensor};
use half::{bf16, f16};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Elements reduced at a time: 16 KiB of f32, well inside L1 with the parts' blocks.
const BLOCK: usize = 4096;

/// Where rank 0's elements live while workers write them.
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

/// One all-reduce in progress: rank 0's buffer (the output) and the other ranks' inputs.
pub struct Reduction {
    op: ReduceOp,
    shape: Vec<usize>,
    /// Rank 0's storage; only reached through `base` until every chunk is done.
    out: UnsafeCell<Storage>,
    base: Base,
    len: usize,
    others: Vec<Tensor>,
    /// Which chunks a worker has taken; a chunk is written by exactly one worker.
    claimed: Vec<AtomicBool>,
    /// Chunks whose writes are complete (released by their writer, acquired by `finish`).
    done: AtomicUsize,
}

// SAFETY: the output is written only through `reduce_chunk`, which hands each chunk index (a
// disjoint element range) to at most one caller, and read back only by `finish` once every
// chunk's writer has released its writes (`done`); the inputs in `others` are only read.
unsafe impl Send for Reduction {}
unsafe impl Sync for Reduction {}

impl Reduction {
    /// Starts the reduction of `parts` (one contiguous tensor per rank, all of one dtype and
    /// size, checked by the caller) in `chunks` pieces. Rank 0's buffer becomes the output; it
    /// is copied first only if something else still shares it.
    pub fn new(op: ReduceOp, mut parts: Vec<Tensor>, chunks: usize) -> Reduction {
        let others = parts.split_off(1.min(parts.len()));
        let first = parts.pop();
        let shape = first
            .as_ref()
            .map_or_else(|| vec![0], |t| t.shape().to_vec());
        let mut out = first.map_or(Storage::F32(Vec::new()), Tensor::into_storage);
        let len = out.len();
        let base = match &mut out {
            Storage::F32(v) => Base::F32(v.as_mut_ptr()),
            Storage::F64(v) => Base::F64(v.as_mut_ptr()),
            Storage::BF16(v) => Base::BF16(v.as_mut_ptr()),
            Storage::F16(v) => Base::F16(v.as_mut_ptr()),
            Storage::I64(v) => Base::I64(v.as_mut_ptr()),
            Storage::I32(v) => Base::I32(v.as_mut_ptr()),
            Storage::Bool(v) => Base::Bool(v.as_mut_ptr()),
        };
        Reduction {
            op,
            shape,
            // moving the Vec moves its header only; `base` still points at its elements
            out: UnsafeCell::new(out),
            base,
            len,
            others,
            claimed: (0..chunks.max(1)).map(|_| AtomicBool::new(false)).collect(),
            done: AtomicUsize::new(0),
        }
    }

    /// Reduces chunk `index` of the output in place; a chunk already taken (or out of range)
    /// is left alone, so no two workers ever write the same elements.
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
        macro_rules! native {
            ($p:expr, $variant:ident) => {{
                // SAFETY: `lo..hi` lies inside the output's `len` elements and no other chunk
                // overlaps it; the claim above makes this the only writer of this range.
                let out = unsafe { std::slice::from_raw_parts_mut($p.add(lo), hi - lo) };
                // block by block, so the output block stays in L1 while every rank's part is
                // added to it (one pass over memory instead of one per rank)
                for (k, block) in out.chunks_mut(BLOCK).enumerate() {
                    let start = lo + k * BLOCK;
                    for part in &self.others {
                        if let Storage::$variant(v) = part.storage() {
                            let at = part.offset() + start;
                            let src = &v[at..at + block.len()];
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
                    }
                }
            }};
        }
        macro_rules! widened {
            ($p:expr, $variant:ident, $ty:ty) => {{
                // SAFETY: as above.
                let out = unsafe { std::slice::from_raw_parts_mut($p.add(lo), hi - lo) };
                let mut acc: Vec<f32> = Vec::with_capacity(BLOCK);
                for (k, block) in out.chunks_mut(BLOCK).enumerate() {
                    let start = lo + k * BLOCK;
                    acc.clear();
                    acc.extend(block.iter().map(|x| x.to_f32()));
                    for part in &self.others {
                        if let Storage::$variant(v) = part.storage() {
                            let at = part.offset() + start;
                            let src = &v[at..at + block.len()];
                            for (a, b) in acc.iter_mut().zip(src) {
                                *a = combine(op, *a, b.to_f32());
                            }
                        }
                    }
                    for (o, a) in block.iter_mut().zip(&acc) {
                        *o = <$ty>::from_f32(*a);
                    }
                }
            }};
        }
        match self.base {
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

    /// The reduced tensor, once every chunk is done; until then the reduction comes back
    /// unchanged (`Err`), so nothing ever reads the output while a worker may still write it.
    pub fn finish(self: Arc<Self>) -> Result<Tensor, Arc<Self>> {
        if self.done.load(Ordering::Acquire) < self.claimed.len() {
            return Err(self);
        }
        Ok(match Arc::try_unwrap(self) {
            Ok(r) => Tensor::new(r.shape, r.out.into_inner()),
            Err(shared) => {
                // SAFETY: every chunk's writes happened before its `done` increment, which the
                // load above acquired; no chunk can be claimed again, so nothing writes any more.
                let data = unsafe { (*shared.out.get()).clone() };
                Tensor::new(shared.shape.clone(), data)
            }
        })
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

    /// The result of a reduction every chunk of which is done.
    fn done(r: Arc<Reduction>) -> Tensor {
        match r.finish() {
            Ok(t) => t,
            Err(_) => panic!("a chunk is not reduced yet"),
        }
    }

    #[test]
    fn finish_gives_nothing_while_a_chunk_is_not_reduced() {
        let r = Arc::new(Reduction::new(ReduceOp::Sum, ranks(2, 6), 2));
        r.reduce_chunk(1);
        let r = match r.finish() {
            Ok(_) => panic!("finished with chunk 0 not reduced"),
            Err(r) => r,
        };
        assert_eq!(r.unclaimed(), vec![0]);
        r.reduce_chunk(0);
        assert_eq!(done(r).shape(), &[6]);
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
        let r = Arc::new(Reduction::new(ReduceOp::Sum, parts, 4));
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
        let r = Arc::new(Reduction::new(ReduceOp::Sum, parts, 2));
        (0..2).for_each(|i| r.reduce_chunk(i));
        assert_eq!(done(r).to_i64_vec(), vec![11, 3, i64::MIN]);
        let parts = vec![
            Tensor::from_bool(vec![3], vec![true, false, false]),
            Tensor::from_bool(vec![3], vec![false, false, true]),
        ];
        let r = Arc::new(Reduction::new(ReduceOp::Max, parts, 1));
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
        let r = Arc::new(Reduction::new(ReduceOp::Sum, parts, 3));
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
        let r = Arc::new(Reduction::new(ReduceOp::Max, parts, 2));
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
        let r = Arc::new(Reduction::new(ReduceOp::Sum, parts, 4));
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
