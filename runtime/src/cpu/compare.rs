//! Comparisons (results are bool tensors) and `where` on a bool condition, with broadcasting.

use super::buffer_pool as pool;
use super::layout::{convert, expand};
use super::promote::{promote_types, promote_with_scalar};
use crate::tensor::{is_float, Dims, Elem, Tensor};
use crate::with_elem;
use half::{bf16, f16};
use std::borrow::Cow;
use tracepass_ir::DType;

pub use crate::exec::kernel::CompareOp;

/// An operand that is a tensor or a Python number.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    Tensor(&'a Tensor),
    Scalar(f64),
}

/// The broadcast shape of the tensor operands (numbers broadcast to anything).
pub fn broadcast_all(shapes: &[&[usize]]) -> Result<Dims<usize>, String> {
    let mut out: Dims<usize> = Dims::new();
    for s in shapes {
        out = tracepass_ir::broadcast_shapes_in(&out, s)
            .ok_or_else(|| format!("shapes {shapes:?} do not broadcast"))?;
    }
    Ok(out)
}

/// A tensor broadcast to `shape`, as a view.
pub(crate) fn broadcast_to(t: &Tensor, shape: &[usize]) -> Result<Tensor, String> {
    if t.shape() == shape {
        return Ok(t.clone());
    }
    let s: Dims<i64> = shape.iter().map(|&d| d as i64).collect();
    expand(t, &s)
}

/// Elements of an operand in the compute type `T`, broadcast to `n` positions.
enum Src<'a, T: Clone> {
    Elems(Cow<'a, [T]>),
    Scalar(T),
}

impl<T: Copy + crate::cpu::buffer_pool::Pooled> Src<'_, T> {
    /// Hands a copied operand's buffer back to the pool.
    fn give_back(self) {
        if let Src::Elems(c) = self {
            pool::give_cow(c);
        }
    }
}

/// The operand in `dtype`, broadcast to `shape` (borrowed when it already is both).
fn source<'a, T: Elem>(
    op: Operand<'a>,
    dtype: DType,
    shape: &[usize],
) -> Result<Src<'a, T>, String> {
    Ok(match op {
        Operand::Scalar(x) => Src::Scalar(T::from_f64(x)),
        Operand::Tensor(t) if t.dtype() == dtype && t.shape() == shape => Src::Elems(
            t.elems::<T>()
                .ok_or_else(|| format!("operand is {}, not {dtype}", t.dtype()))?,
        ),
        Operand::Tensor(t) => {
            let c = broadcast_to(&convert(t, dtype)?, shape)?;
            let e = c
                .elems::<T>()
                .ok_or_else(|| format!("operand is {}, not {dtype}", c.dtype()))?;
            Src::Elems(Cow::Owned(e.into_owned()))
        }
    })
}

/// Runs `$body` with `$f` bound to the comparison as a closure over `$t`.
macro_rules! for_compare_op {
    ($op:expr, $t:ty, $f:ident => $body:expr) => {
        match $op {
            CompareOp::Lt => {
                let $f = |a: $t, b: $t| a < b;
                $body
            }
            CompareOp::Le => {
                let $f = |a: $t, b: $t| a <= b;
                $body
            }
            CompareOp::Gt => {
                let $f = |a: $t, b: $t| a > b;
                $body
            }
            CompareOp::Ge => {
                let $f = |a: $t, b: $t| a >= b;
                $body
            }
            CompareOp::Eq => {
                let $f = |a: $t, b: $t| a == b;
                $body
            }
            CompareOp::Ne => {
                let $f = |a: $t, b: $t| a != b;
                $body
            }
        }
    };
}

fn compare_typed<T: Elem + PartialOrd>(
    op: CompareOp,
    a: &Src<'_, T>,
    b: &Src<'_, T>,
    n: usize,
) -> Vec<bool> {
    for_compare_op!(op, T, f => match (a, b) {
        (Src::Elems(x), Src::Elems(y)) => pool::collect(n, x.iter().zip(y.iter()).map(|(&p, &q)| f(p, q))),
        (Src::Elems(x), Src::Scalar(s)) => pool::collect(n, x.iter().map(|&p| f(p, *s))),
        (Src::Scalar(s), Src::Elems(y)) => pool::collect(n, y.iter().map(|&q| f(*s, q))),
        (Src::Scalar(s), Src::Scalar(t)) => pool::filled(n, f(*s, *t)),
    })
}

/// `torch.lt/le/gt/ge/eq/ne(a, b)`: a bool tensor of the broadcast shape. Operands meet in
/// PyTorch's promoted dtype (a number takes the tensor's dtype, so `lt(x_f32, 0.9)` compares
/// with `0.9` rounded to f32); integers compare exactly.
pub fn compare(op: CompareOp, a: Operand<'_>, b: Operand<'_>) -> Result<Tensor, String> {
    let frac = |x: f64| x.fract() != 0.0 || !x.is_finite();
    let dtype = match (a, b) {
        (Operand::Tensor(x), Operand::Tensor(y)) => promote_types(x.dtype(), y.dtype()),
        (Operand::Tensor(x), Operand::Scalar(s)) | (Operand::Scalar(s), Operand::Tensor(x)) => {
            promote_with_scalar(x.dtype(), frac(s))
        }
        _ => return Err("compare: both operands are numbers".into()),
    };
    let shapes: smallvec::SmallVec<[&[usize]; 2]> = [a, b]
        .iter()
        .filter_map(|o| match o {
            Operand::Tensor(t) => Some(t.shape()),
            Operand::Scalar(_) => None,
        })
        .collect();
    let shape = broadcast_all(&shapes)?;
    let n = shape.iter().product();
    let (a, b) = (round_scalar(a, dtype)?, round_scalar(b, dtype)?);
    let out = match dtype {
        DType::F64 => {
            let (x, y) = (
                source::<f64>(a, DType::F64, &shape)?,
                source::<f64>(b, DType::F64, &shape)?,
            );
            let r = compare_typed::<f64>(op, &x, &y, n);
            x.give_back();
            y.give_back();
            r
        }
        d if is_float(d) => {
            let (x, y) = (
                source::<f32>(a, DType::F32, &shape)?,
                source::<f32>(b, DType::F32, &shape)?,
            );
            let r = compare_typed::<f32>(op, &x, &y, n);
            x.give_back();
            y.give_back();
            r
        }
        DType::I64 | DType::I32 | DType::Bool => {
            let (x, y) = (
                source::<i64>(a, DType::I64, &shape)?,
                source::<i64>(b, DType::I64, &shape)?,
            );
            let r = compare_typed::<i64>(op, &x, &y, n);
            x.give_back();
            y.give_back();
            r
        }
        other => {
            return Err(format!(
                "compare: dtype {other} is not supported by the cpu backend"
            ))
        }
    };
    Ok(Tensor::from_bool(shape, out))
}

/// `s` rounded to the float type `dtype` and back, as a one-element tensor's `to_dtype`
/// rounds it (bf16 and f16 through f32); `None` for a type that is not a float. The CUDA
/// backend rounds its comparisons' numbers with it too.
pub(crate) fn round_to_float(s: f64, dtype: DType) -> Option<f64> {
    Some(match dtype {
        DType::F64 => s,
        DType::F32 => s as f32 as f64,
        DType::BF16 => bf16::from_f32(s as f32).to_f64(),
        DType::F16 => f16::from_f32(s as f32).to_f64(),
        _ => return None,
    })
}

/// A number rounded to the float dtype the comparison meets in (then compared in a type that
/// holds it exactly).
fn round_scalar(o: Operand<'_>, dtype: DType) -> Result<Operand<'_>, String> {
    Ok(match o {
        Operand::Scalar(s) if is_float(dtype) => {
            Operand::Scalar(round_to_float(s, dtype).ok_or("compare: number cast")?)
        }
        other => other,
    })
}

/// `c[i] ? a : b` for each position `i` of `dst`, `(a, b) = pair(i)`: a loop with no branch
/// on the condition, which the compiler turns into vector blends (a branch per element
/// mispredicts on half of a ReLU's inputs). `c` and whatever `pair` reads are as long as
/// `dst`, so the loop carries no bounds checks.
#[inline(always)]
fn select_into<T: Copy>(
    dst: &mut [std::mem::MaybeUninit<T>],
    c: &[bool],
    pair: impl Fn(usize) -> (T, T),
) {
    let n = dst.len();
    let c = &c[..n];
    super::simd::vectorized(|| {
        for i in 0..n {
            let (a, b) = pair(i);
            dst[i].write(if c[i] { a } else { b });
        }
    });
}

/// `n` elements into a recycled buffer, `fill(lo, part)` writing elements `lo ..` of each
/// part: the whole at once, or, when large, contiguous parts on the rank's threads (a
/// selection, so the same elements whatever the split).
fn selected<T: pool::Pooled + Copy + Send>(
    n: usize,
    fill: impl Fn(usize, &mut [std::mem::MaybeUninit<T>]) + Sync,
) -> Vec<T> {
    let mut out = pool::take::<T>(n);
    let dst = &mut out.spare_capacity_mut()[..n];
    let threads = super::pool_threads();
    if threads > 1 && n >= super::strided::PARALLEL_MIN {
        use rayon::prelude::*;
        let part = n.div_ceil(threads);
        dst.par_chunks_mut(part)
            .enumerate()
            .for_each(|(k, d)| fill(k * part, d));
    } else {
        fill(0, dst);
    }
    // SAFETY: `fill` wrote every element of every part (`select_into` writes all of its `dst`).
    unsafe { out.set_len(n) };
    out
}

/// `torch.where(cond, a, b)`: `a` where `cond` is true, else `b`, broadcast together, in
/// `dtype` (the node's output dtype: the promotion of the operands). `cond` must be bool.
pub fn where_(
    cond: &Tensor,
    a: Operand<'_>,
    b: Operand<'_>,
    dtype: DType,
) -> Result<Tensor, String> {
    if cond.dtype() != DType::Bool {
        return Err(format!(
            "where: the condition must be a bool tensor, got {}",
            cond.dtype()
        ));
    }
    let mut shapes: smallvec::SmallVec<[&[usize]; 3]> = smallvec::smallvec![cond.shape()];
    for o in [a, b] {
        if let Operand::Tensor(t) = o {
            shapes.push(t.shape());
        }
    }
    let shape = broadcast_all(&shapes)?;
    let c = broadcast_to(cond, &shape)?;
    let c = c.elems::<bool>().ok_or("where: condition storage")?;
    // a number becomes an element of the result: one an integer dtype cannot hold is refused,
    // as PyTorch refuses it (a comparison's numbers, which become no element, are not)
    for o in [a, b] {
        if let Operand::Scalar(x) = o {
            crate::cpu::fill::check_fits(x, dtype).map_err(|e| format!("where: {e}"))?;
        }
    }
    with_elem!(dtype, T => {
        let (x, y) = (source::<T>(a, dtype, &shape)?, source::<T>(b, dtype, &shape)?);
        // the operand kinds matched once, outside the loop
        let n = c.len();
        let out: Vec<T> = selected(n, |lo, dst| {
            let (m, c) = (dst.len(), &c[lo..]);
            match (&x, &y) {
                (Src::Elems(p), Src::Elems(q)) => {
                    let (p, q) = (&p[lo..lo + m], &q[lo..lo + m]);
                    select_into(dst, c, |i| (p[i], q[i]))
                }
                (Src::Elems(p), Src::Scalar(q)) => {
                    let p = &p[lo..lo + m];
                    select_into(dst, c, |i| (p[i], *q))
                }
                (Src::Scalar(p), Src::Elems(q)) => {
                    let q = &q[lo..lo + m];
                    select_into(dst, c, |i| (*p, q[i]))
                }
                (Src::Scalar(p), Src::Scalar(q)) => select_into(dst, c, |_| (*p, *q)),
            }
        });
        x.give_back();
        y.give_back();
        pool::give_cow(c);
        Ok(Tensor::new(shape, T::wrap(out)))
    }, other => Err(format!("where: dtype {other} is not supported by the cpu backend")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_where_in_threads_selects_as_one_thread_does() {
        let n = 3 * super::super::strided::PARALLEL_MIN + 5;
        let c = Tensor::from_bool(vec![n], (0..n).map(|i| i % 3 == 0 || i % 7 == 0).collect());
        let a = Tensor::from_f32(vec![n], (0..n).map(|i| i as f32).collect());
        let run = || {
            where_(&c, Operand::Tensor(&a), Operand::Scalar(-1.0), DType::F32)
                .expect("selects")
                .to_f32_vec()
        };
        let (one, three) = crate::cpu::alone_and_in_three_threads(run);
        assert_eq!(one, three);
        let want: Vec<f32> = (0..n)
            .map(|i| {
                if i % 3 == 0 || i % 7 == 0 {
                    i as f32
                } else {
                    -1.0
                }
            })
            .collect();
        assert_eq!(one, want);
    }

    #[test]
    fn scalars_round_to_the_tensor_dtype() {
        // 0.9f32 < 0.9 in f64, but not in f32, PyTorch's compute type
        let x = Tensor::from_f32(vec![3], vec![0.9, 0.5, 1.0]);
        let r = compare(CompareOp::Lt, Operand::Tensor(&x), Operand::Scalar(0.9)).expect("ok");
        assert_eq!(r.dtype(), DType::Bool);
        assert_eq!(r.to_bool_vec(), vec![false, true, false]);
        let h = x.to_dtype(DType::BF16).expect("bf16");
        // 0.9 in bf16 is 0.8984375, so bf16(0.9) == bf16(0.9)
        let r = compare(CompareOp::Eq, Operand::Tensor(&h), Operand::Scalar(0.9)).expect("ok");
        assert_eq!(r.to_bool_vec(), vec![true, false, false]);
        let r = compare(CompareOp::Gt, Operand::Scalar(0.7), Operand::Tensor(&x)).expect("ok");
        assert_eq!(r.to_bool_vec(), vec![false, true, false]);
        let i = Tensor::from_i64(vec![3], vec![-1, 0, 1]);
        let r = compare(CompareOp::Ge, Operand::Tensor(&i), Operand::Scalar(0.5)).expect("ok");
        assert_eq!(r.to_bool_vec(), vec![false, false, true]);
        let r = compare(CompareOp::Ne, Operand::Tensor(&i), Operand::Scalar(0.0)).expect("ok");
        assert_eq!(r.to_bool_vec(), vec![true, false, true]);
        let nan = Tensor::from_f32(vec![1], vec![f32::NAN]);
        let r = compare(CompareOp::Ne, Operand::Tensor(&nan), Operand::Tensor(&nan)).expect("ok");
        assert_eq!(r.to_bool_vec(), vec![true]);
    }

    #[test]
    fn the_causal_mask_of_nanogpt() {
        // ge(arange(4)[:, None] + 0, arange(4)[None, :]) is the lower triangle
        let r = Tensor::from_i64(vec![4, 1], vec![0, 1, 2, 3]);
        let c = Tensor::from_i64(vec![1, 4], vec![0, 1, 2, 3]);
        let m = compare(CompareOp::Ge, Operand::Tensor(&r), Operand::Tensor(&c)).expect("ok");
        assert_eq!(m.shape(), &[4, 4]);
        let want: Vec<bool> = (0..16).map(|k| k / 4 >= k % 4).collect();
        assert_eq!(m.to_bool_vec(), want);
        let bad = Tensor::from_i64(vec![3], vec![0, 1, 2]);
        assert!(compare(CompareOp::Lt, Operand::Tensor(&c), Operand::Tensor(&bad)).is_err());
        // where(mask, scores, -inf)
        let s = Tensor::from_f32(vec![2, 4, 4], (0..32).map(|i| i as f32).collect());
        let w = where_(
            &m,
            Operand::Tensor(&s),
            Operand::Scalar(f64::NEG_INFINITY),
            DType::F32,
        )
        .expect("ok");
        assert_eq!(w.shape(), &[2, 4, 4]);
        let v = w.to_f32_vec();
        for (k, &e) in v.iter().enumerate() {
            let (i, j) = ((k % 16) / 4, k % 4);
            if i >= j {
                assert_eq!(e, k as f32);
            } else {
                assert_eq!(e, f32::NEG_INFINITY);
            }
        }
    }

    #[test]
    fn where_broadcasts_casts_and_checks_the_condition() {
        let m = Tensor::from_bool(vec![2, 1], vec![true, false]);
        let a = Tensor::from_f32(vec![3], vec![1., 2., 3.]);
        let w = where_(&m, Operand::Tensor(&a), Operand::Scalar(0.0), DType::F32).expect("ok");
        assert_eq!(w.to_f32_vec(), vec![1., 2., 3., 0., 0., 0.]);
        let h = a.to_dtype(DType::BF16).expect("bf16");
        let w = where_(&m, Operand::Scalar(7.0), Operand::Tensor(&h), DType::BF16).expect("ok");
        assert_eq!(w.dtype(), DType::BF16);
        assert_eq!(w.to_f32_vec(), vec![7., 7., 7., 1., 2., 3.]);
        assert!(where_(&a, Operand::Tensor(&a), Operand::Scalar(0.0), DType::F32).is_err());
        let i = Tensor::from_i64(vec![1], vec![5]);
        let w = where_(&m, Operand::Tensor(&i), Operand::Scalar(-1.0), DType::I64).expect("ok");
        assert_eq!(w.to_i64_vec(), vec![5, -1]);
        // a number an integer result cannot hold is refused, as PyTorch refuses it
        let i32s = i.to_dtype(DType::I32).expect("i32");
        let err = where_(&m, Operand::Tensor(&i32s), Operand::Scalar(3e9), DType::I32)
            .expect_err("3e9 does not fit i32");
        assert!(err.contains("without overflow"), "{err}");
    }
}
