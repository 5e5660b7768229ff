//! Recycled tensor buffers, so that a steady-state training step allocates no element storage.
//!
//! A compiled [`crate::exec::Plan`] knows every intermediate's size and lifetime
//! ([`crate::exec::MemoryPlan`]); the executor hands each tensor back to the backend after its
//! last use, and the CPU backend keeps its buffer here, on a shelf for its element type and
//! length. Kernels take their output buffers from the shelf instead of a fresh `Vec`: from the
//! second step on every size the step needs is on the shelf already, so no page is allocated
//! (and zeroed by the kernel) again. Tensor storage is a plain `Vec` behind an `Arc`, so this is
//! a size-class pool rather than offsets in one arena: a buffer comes back only when its `Arc`
//! is the last one, which keeps every kernel, view and all-reduce as it is.
//!
//! The pool is per thread (a rank runs its kernels on its own thread) and keeps, of each
//! (dtype, length), at most as many free buffers as a plan it was told of ([`reserve`]) has
//! alive at once, plus one for each buffer of that length made beyond that count (operand
//! copies and scratch share the classes, so the plan's count is a floor: after the first
//! step the pool holds what a step really has alive at once); of a length no plan has (a
//! kernel called outside the executor) it keeps nothing, so kernels behave as before.

use crate::exec::memory_plan::SizeClass;
use crate::tensor::{Elem, Storage};
use half::{bf16, f16};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Free buffers of one element type, by length (each as its last user left it: that length,
/// its old values).
pub struct Shelf<T> {
    free: HashMap<usize, Class<T>>,
}

/// The free buffers of one length, and how many may be kept.
struct Class<T> {
    limit: usize,
    bufs: Vec<Vec<T>>,
    /// Buffers made for this length on a miss, ever.
    created: usize,
}

impl<T> Default for Shelf<T> {
    fn default() -> Self {
        Shelf {
            free: HashMap::new(),
        }
    }
}

/// What the calling thread's pool has done since `reset_stats`, and what it holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers kernels asked for that had to be allocated (none of that size was free).
    pub misses: u64,
    /// Buffers kernels asked for that came off the shelf.
    pub hits: u64,
    /// Bytes of the buffers on the shelf now (at a step's end: the pool's size).
    pub free_bytes: u64,
    /// Bytes the pool may keep: each size class's limit times its size.
    pub limit_bytes: u64,
}

thread_local! {
    static STATS: Cell<PoolStats> = const { Cell::new(PoolStats { misses: 0, hits: 0, free_bytes: 0, limit_bytes: 0 }) };
}

fn update(f: impl FnOnce(&mut PoolStats)) {
    STATS.with(|s| {
        let mut v = s.get();
        f(&mut v);
        s.set(v);
    });
}

/// An element type with a shelf of its own on each thread.
pub trait Pooled: Sized + 'static {
    fn with_shelf<R>(f: impl FnOnce(&mut Shelf<Self>) -> R) -> R;
}

macro_rules! pooled {
    ($t:ty, $shelf:ident) => {
        thread_local! {
            static $shelf: RefCell<Shelf<$t>> = RefCell::new(Shelf::default());
        }
        impl Pooled for $t {
            fn with_shelf<R>(f: impl FnOnce(&mut Shelf<Self>) -> R) -> R {
                $shelf.with(|s| f(&mut s.borrow_mut()))
            }
        }
    };
}
pooled!(f32, SHELF_F32);
pooled!(f64, SHELF_F64);
pooled!(bf16, SHELF_BF16);
pooled!(f16, SHELF_F16);
pooled!(i64, SHELF_I64);
pooled!(i32, SHELF_I32);
pooled!(bool, SHELF_BOOL);
pooled!(usize, SHELF_USIZE);

/// An empty `Vec` with room for `n` elements: a recycled buffer of length `n` when one is
/// free, otherwise a fresh allocation (counted as a miss).
pub fn take<T: Pooled>(n: usize) -> Vec<T> {
    let mut v = recycled(n).unwrap_or_else(|| Vec::with_capacity(n));
    v.clear();
    v
}

/// `n` elements whose values are unspecified: a recycled buffer as its last user left it, or
/// zeros when none is free. For a kernel that writes every element before it reads any (a
/// product with `beta = 0`), where [`filled`]'s pass over the buffer is only memory traffic.
/// Where recycled buffers are poisoned (the unit tests, and any run with
/// `TRACEPASS_POISON_RECYCLED` set, as CI's tests are), a recycled buffer comes filled with
/// NaN, so an element a kernel fails to write shows in its result instead of passing for the
/// last step's value.
pub fn overwritten<T: super::real::Real>(n: usize) -> Vec<T> {
    let mut v = recycled(n).unwrap_or_else(|| Vec::with_capacity(n));
    if v.len() != n {
        // a fresh buffer (a recycled one always has its class's length)
        v.clear();
        v.resize(n, T::ZERO);
    } else if poisoned() {
        v.fill(T::of(f64::NAN));
    }
    v
}

/// Whether [`overwritten`] poisons what it recycles.
fn poisoned() -> bool {
    static POISONED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *POISONED.get_or_init(|| {
        cfg!(test) || std::env::var_os("TRACEPASS_POISON_RECYCLED").is_some_and(|v| v != "0")
    })
}

/// A free buffer of length `n` off the shelf (its old values kept), or `None` (a miss,
/// counted; the caller allocates).
fn recycled<T: Pooled>(n: usize) -> Option<Vec<T>> {
    if n == 0 {
        return None;
    }
    // a known length with none free, and more buffers of it made than the class may keep:
    // the plan undercounted what is alive at once (kernel scratch and operand copies share
    // the class), so it may keep one more from now on
    let taken = T::with_shelf(|s| match s.free.get_mut(&n) {
        Some(c) => match c.bufs.pop() {
            Some(v) => Ok(v),
            None => {
                c.created += 1;
                let grow = c.created > c.limit;
                if grow {
                    c.limit += 1;
                }
                Err(grow)
            }
        },
        None => Err(false),
    });
    if matches!(taken, Err(true)) {
        update(|st| st.limit_bytes += (n * std::mem::size_of::<T>()) as u64);
    }
    match taken.ok() {
        Some(v) => {
            update(|st| {
                st.hits += 1;
                st.free_bytes = st
                    .free_bytes
                    .saturating_sub((n * std::mem::size_of::<T>()) as u64);
            });
            Some(v)
        }
        None => {
            update(|st| st.misses += 1);
            None
        }
    }
}

/// `n` elements from `iter` (which must give exactly `n`) in a recycled buffer.
pub fn collect<T: Pooled>(n: usize, iter: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = take(n);
    v.extend(iter);
    v
}

/// `n` copies of `x` in a recycled buffer (a `vec![x; n]` from the pool).
pub fn filled<T: Pooled + Clone>(n: usize, x: T) -> Vec<T> {
    let mut v = take(n);
    v.resize(n, x);
    v
}

/// Keeps `v` for a later [`take`] of its length, while its size class has room.
pub fn give<T: Pooled>(v: Vec<T>) {
    let n = v.len();
    if n == 0 || v.capacity() != n {
        return;
    }
    let kept = T::with_shelf(|s| match s.free.get_mut(&n) {
        Some(c) if c.bufs.len() < c.limit => {
            c.bufs.push(v);
            true
        }
        _ => false,
    });
    if kept {
        update(|st| st.free_bytes += (n * std::mem::size_of::<T>()) as u64);
    }
}

/// Keeps `v`, a kernel's scratch buffer (a gathered operand, broadcast indices), for the
/// next [`take`] of its length, making room in its class: scratch is taken and given back
/// within one kernel, so a class grows to what one kernel holds at once and no further.
pub fn give_scratch<T: Pooled>(v: Vec<T>) {
    let n = v.len();
    if n == 0 || v.capacity() != n {
        return;
    }
    let grown = T::with_shelf(|s| {
        let c = s.free.entry(n).or_insert_with(|| Class {
            limit: 0,
            bufs: Vec::new(),
            created: 0,
        });
        let grown = c.bufs.len() >= c.limit;
        if grown {
            c.limit += 1;
        }
        c.bufs.push(v);
        grown
    });
    let bytes = (n * std::mem::size_of::<T>()) as u64;
    update(|st| {
        st.free_bytes += bytes;
        if grown {
            st.limit_bytes += bytes;
        }
    });
}

/// [`give_scratch`] for an operand's elements when they were copied (a strided tensor).
pub fn give_cow<T: Pooled + Clone>(c: std::borrow::Cow<'_, [T]>) {
    if let std::borrow::Cow::Owned(v) = c {
        give_scratch(v);
    }
}

/// Gives back the buffer of `s`, whatever its element type.
pub fn give_storage(s: Storage) {
    match s {
        Storage::F32(v) => give(v),
        Storage::F64(v) => give(v),
        Storage::BF16(v) => give(v),
        Storage::F16(v) => give(v),
        Storage::I64(v) => give(v),
        Storage::I32(v) => give(v),
        Storage::Bool(v) => give(v),
    }
}

/// Lets the calling thread's pool keep `count` free buffers of length `n` (never fewer than
/// an earlier call allowed).
pub fn reserve<T: Elem>(n: usize, count: usize) {
    let grown = T::with_shelf(|s| {
        let c = s.free.entry(n).or_insert_with(|| Class {
            limit: 0,
            bufs: Vec::new(),
            created: 0,
        });
        let grown = count.saturating_sub(c.limit);
        if grown > 0 {
            c.limit = count;
            c.bufs.reserve(count - c.bufs.len());
        }
        grown
    });
    if grown > 0 {
        update(|st| st.limit_bytes += (grown * n * std::mem::size_of::<T>()) as u64);
    }
}

/// [`reserve`] for every size class of a memory plan (the executor calls it before each run;
/// after the first, nothing changes and nothing is allocated).
pub fn reserve_classes(classes: &[SizeClass]) {
    for c in classes {
        crate::with_elem!(c.dtype, T => reserve::<T>(c.numel, c.count), _other => ())
    }
}

/// The calling thread's counters and sizes.
pub fn stats() -> PoolStats {
    STATS.with(Cell::get)
}

/// Zeroes the hit and miss counters (a step's start); the sizes stay.
pub fn reset_stats() {
    update(|st| {
        st.hits = 0;
        st.misses = 0;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_comes_back_for_its_length_only_within_the_budget() {
        // a fresh thread: its own, empty pool
        std::thread::spawn(|| {
            let v: Vec<f32> = collect(4, [1.0f32, 2.0, 3.0, 4.0].into_iter());
            assert_eq!(stats().misses, 1);
            let p = v.as_ptr();
            give(v);
            // no class of that length: nothing kept
            assert_eq!(stats().free_bytes, 0);
            reserve::<f32>(4, 2);
            reserve::<f32>(16, 1);
            reserve::<f32>(4, 1);
            assert_eq!(stats().limit_bytes, 96);
            let v: Vec<f32> = filled(4, 0.0);
            let p2 = v.as_ptr();
            give(v);
            assert_eq!(stats().free_bytes, 16);
            let mut again: Vec<f32> = take(4);
            assert_eq!((again.len(), again.as_ptr()), (0, p2));
            assert_ne!(p, std::ptr::null());
            assert_eq!((stats().hits, stats().free_bytes), (1, 0));
            // another length or type does not take it
            again.resize(4, 0.0);
            give(again);
            let other: Vec<f32> = take(5);
            let ints: Vec<i32> = take(4);
            assert_eq!((other.capacity() >= 5, ints.capacity() >= 4), (true, true));
            assert_eq!((stats().hits, stats().free_bytes), (1, 16));
            // past its class's limit a buffer is dropped
            give(vec![0.0f32; 4]);
            assert_eq!(stats().free_bytes, 32);
            give(vec![0.0f32; 4]);
            assert_eq!(stats().free_bytes, 32);
            give(vec![0.0f32; 16]);
            assert_eq!(stats().free_bytes, 96);
            reset_stats();
            assert_eq!((stats().hits, stats().misses), (0, 0));
        })
        .join()
        .expect("pool thread");
    }

    #[test]
    fn a_class_grows_to_what_is_alive_at_once_beyond_the_plan() {
        std::thread::spawn(|| {
            // the plan says two alive at once; a step really holds three (an operand copy)
            reserve::<f32>(8, 2);
            let step = || {
                let held: Vec<Vec<f32>> = (0..3).map(|_| filled(8, 1.0)).collect();
                held.into_iter().for_each(give);
            };
            step();
            // the first step makes all three, and the class may keep the third from now on
            assert_eq!((stats().misses, stats().free_bytes), (3, 96));
            reset_stats();
            for _ in 0..5 {
                step();
            }
            assert_eq!((stats().misses, stats().hits), (0, 15));
            // and no further: the three made are all it keeps
            assert_eq!((stats().free_bytes, stats().limit_bytes), (96, 96));
        })
        .join()
        .expect("pool thread");
    }
}
