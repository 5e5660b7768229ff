//! Non-finite numbers in training: a NaN or an infinity in a loss, a gradient or a parameter
//! means the run has stopped learning, so the trainer stops at the first one (naming the step
//! and rank) instead of training on and saving it, unless asked to go on.

use crate::tensor::Tensor;

/// The first element of `t` that is NaN or infinite: its position (row-major) and value.
/// Integer and boolean tensors have none.
pub fn first_non_finite(t: &Tensor) -> Option<(usize, f64)> {
    if !t.dtype().is_float() {
        return None;
    }
    if let Some(v) = t.as_f32() {
        // the common answer (none) from a loop that vectorises; the position only on a find
        if shared(v, true, all_finite, |a, b| a && b) {
            return None;
        }
        return v
            .iter()
            .position(|x| !x.is_finite())
            .map(|i| (i, f64::from(v[i])));
    }
    let v = t.to_f64_vec();
    v.iter().position(|x| !x.is_finite()).map(|i| (i, v[i]))
}

/// The L2 norm of all the gradients together, in f64 (what `clip_grad_norm_` reports).
pub fn grad_norm(grads: &[Option<Tensor>]) -> f64 {
    let mut sum = 0.0f64;
    for g in grads.iter().flatten() {
        if let Some(v) = g.elems::<f32>() {
            sum += shared(&v, 0.0, sum_of_squares, |a, b| a + b);
            crate::cpu::buffer_pool::give_cow(v);
        } else if g.dtype().is_float() {
            sum += g.to_f64_vec().iter().map(|x| x * x).sum::<f64>();
        }
    }
    sum.sqrt()
}

/// The first parameter (by `names`) holding a non-finite element, described for a message.
pub fn non_finite_param(names: &[String], params: &[Tensor]) -> Option<String> {
    names.iter().zip(params).find_map(|(n, p)| {
        first_non_finite(p).map(|(i, v)| format!("parameter `{n}` holds {v} at element {i}"))
    })
}

/// `f` over `v`, or for a long `v` on a rank with threads, over pieces of it on the threads,
/// combined with `join` (in no fixed order: these sums only decide whether a run goes on, and
/// are infinite or NaN whatever the order exactly when an element is). A step reads every
/// gradient and every parameter once more here, tens of megabytes on the mid-size models.
fn shared<R: Send + Sync + Copy>(
    v: &[f32],
    none: R,
    f: impl Fn(&[f32]) -> R + Sync,
    join: impl Fn(R, R) -> R + Sync + Send,
) -> R {
    // pieces of the length from which the kernels share a loop among threads
    const PIECE: usize = crate::cpu::strided::PARALLEL_MIN;
    if crate::cpu::pool_threads() > 1 && v.len() >= 2 * PIECE {
        use rayon::prelude::*;
        v.par_chunks(PIECE).map(&f).reduce(|| none, &join)
    } else {
        f(v)
    }
}

/// Whether every element is finite, eight lanes at a time.
fn all_finite(v: &[f32]) -> bool {
    crate::cpu::simd::vectorized(
        #[inline(always)]
        || {
            let chunks = v.chunks_exact(8);
            let rest = chunks.remainder();
            chunks.fold(true, |ok, c| {
                ok & c.iter().fold(true, |o, x| o & x.is_finite())
            }) && rest.iter().all(|x| x.is_finite())
        },
    )
}

/// The sum of the squares in f64, in eight interleaved partial sums (so it vectorises; the
/// norm only decides whether training goes on, and a sum of f32 squares cannot overflow f64,
/// so it is infinite or NaN exactly when an element is).
fn sum_of_squares(v: &[f32]) -> f64 {
    crate::cpu::simd::vectorized(
        #[inline(always)]
        || {
            let mut lanes = [0f64; 8];
            let chunks = v.chunks_exact(8);
            let rest = chunks.remainder();
            for c in chunks {
                for (l, &x) in lanes.iter_mut().zip(c) {
                    *l += f64::from(x) * f64::from(x);
                }
            }
            lanes.iter().sum::<f64>()
                + rest
                    .iter()
                    .map(|&x| f64::from(x) * f64::from(x))
                    .sum::<f64>()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_nan_or_infinity() {
        let t = Tensor::from_f32(vec![4], vec![1.0, 2.0, f32::INFINITY, f32::NAN]);
        assert_eq!(first_non_finite(&t), Some((2, f64::INFINITY)));
        assert_eq!(
            first_non_finite(&Tensor::from_f64(vec![1], vec![0.5])),
            None
        );
        assert_eq!(first_non_finite(&Tensor::from_i64(vec![1], vec![7])), None);
        let g = vec![Some(Tensor::from_f32(vec![2], vec![3.0, 4.0])), None];
        assert!((grad_norm(&g) - 5.0).abs() < 1e-12);
        // a non-finite element in the eight-wide body or in the tail, and the sum over both
        for at in [3, 17] {
            let mut v: Vec<f32> = (0..19).map(|i| i as f32).collect();
            assert_eq!(
                first_non_finite(&Tensor::from_f32(vec![19], v.clone())),
                None
            );
            let sum: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            let g = vec![Some(Tensor::from_f32(vec![19], v.clone()))];
            assert_eq!(grad_norm(&g), sum.sqrt());
            v[at] = f32::NEG_INFINITY;
            let t = Tensor::from_f32(vec![19], v);
            assert_eq!(first_non_finite(&t), Some((at, f64::NEG_INFINITY)));
            assert!(grad_norm(&[Some(t)]).is_infinite());
        }
        let names = vec!["a".to_string()];
        let msg = non_finite_param(&names, &[t]).unwrap();
        assert_eq!(msg, "parameter `a` holds inf at element 2");
    }

    #[test]
    fn long_tensors_are_checked_on_the_threads_too() {
        // long enough to be cut into pieces; a NaN in a late piece
        let n = 5 * (1 << 16) + 123;
        let v: Vec<f32> = (0..n).map(|i| ((i % 7) as f32) - 3.0).collect();
        let want: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        let mut bad = v.clone();
        bad[n - 200] = f32::NAN;
        let (one, par) = crate::cpu::alone_and_in_three_threads(|| {
            let good = Tensor::from_f32(vec![n], v.clone());
            let bad = Tensor::from_f32(vec![n], bad.clone());
            (
                grad_norm(&[Some(good.clone())]),
                first_non_finite(&good),
                first_non_finite(&bad),
                grad_norm(&[Some(good), Some(bad)]).is_nan(),
            )
        });
        for (norm, good, bad, nan) in [one, par] {
            // integers: every order of the sum is exact
            assert_eq!(norm, want.sqrt());
            assert_eq!(good, None);
            assert_eq!(bad.map(|(i, _)| i), Some(n - 200));
            assert!(nan);
        }
    }
}
