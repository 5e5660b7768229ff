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
        if let Some(v) = g.as_f32() {
            sum += v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>();
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
        let names = vec!["a".to_string()];
        let msg = non_finite_param(&names, &[t]).unwrap();
        assert_eq!(msg, "parameter `a` holds inf at element 2");
    }
}
