//! `torch.argmax` / `torch.argmin`: i64 indices of the first extremum along a dimension.

use super::cumsum::lines;
use crate::tensor::Tensor;
use tracepass_ir::DType;

/// Whether `b` replaces `a` as the extremum seen so far: NaN beats everything and the first
/// NaN stays (PyTorch's argmax and argmin both return the first NaN); ties keep the first.
fn better(max: bool, a: f64, b: f64) -> bool {
    if a.is_nan() {
        return false;
    }
    b.is_nan() || if max { b > a } else { b < a }
}

/// `argmax(x, dim, keepdim)` (`max`) or `argmin`: over `dim`, or over the flattened tensor
/// when `dim` is `None` (then `keepdim` gives every dimension size 1). Bools are refused and
/// a dimension of size 0 is an error, as in PyTorch. Integers compare exactly as i64.
pub fn arg_extremum(
    x: &Tensor,
    max: bool,
    dim: Option<usize>,
    keepdim: bool,
) -> Result<Tensor, String> {
    let what = if max { "argmax" } else { "argmin" };
    let shape: crate::tensor::Dims<usize> = x.shape().into();
    let (outer, len, inner) = match dim {
        Some(d) => lines(&shape, d)?,
        None => (1, x.numel(), 1),
    };
    if len == 0 && outer * inner > 0 {
        return Err(format!(
            "{what}: the reduced dimension of {shape:?} has no elements"
        ));
    }
    let mut out = Vec::with_capacity(outer * inner);
    match x.dtype() {
        DType::I64 | DType::I32 => {
            let v = x.to_i64_vec();
            for o in 0..outer {
                for i in 0..inner {
                    let at = |j: usize| v[(o * len + j) * inner + i];
                    let mut best = 0usize;
                    for j in 1..len {
                        if (max && at(j) > at(best)) || (!max && at(j) < at(best)) {
                            best = j;
                        }
                    }
                    out.push(best as i64);
                }
            }
        }
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => {
            let v = x.to_f64_vec();
            for o in 0..outer {
                for i in 0..inner {
                    let at = |j: usize| v[(o * len + j) * inner + i];
                    let mut best = 0usize;
                    for j in 1..len {
                        if better(max, at(best), at(j)) {
                            best = j;
                        }
                    }
                    out.push(best as i64);
                }
            }
        }
        other => return Err(format!("{what}: dtype {other} is not supported")),
    }
    let out_shape: Vec<usize> = match (dim, keepdim) {
        (Some(d), true) => (0..shape.len())
            .map(|k| if k == d { 1 } else { shape[k] })
            .collect(),
        (Some(d), false) => (0..shape.len())
            .filter(|&k| k != d)
            .map(|k| shape[k])
            .collect(),
        (None, true) => vec![1; shape.len()],
        (None, false) => vec![],
    };
    Tensor::try_new(out_shape, crate::tensor::Storage::I64(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_extremum_and_first_nan_as_pytorch() {
        // torch 2.9.0: argmax -> [3, 3], argmin -> [3, 1], flattened argmax -> 3
        let x = Tensor::from_f32(
            vec![2, 5],
            vec![1., 3., 3., f32::NAN, 0., 2., -1., -1., 5., 5.],
        );
        let a = arg_extremum(&x, true, Some(1), false).unwrap();
        assert_eq!((a.dtype(), a.to_i64_vec()), (DType::I64, vec![3, 3]));
        assert_eq!(
            arg_extremum(&x, false, Some(1), false)
                .unwrap()
                .to_i64_vec(),
            vec![3, 1]
        );
        let all = arg_extremum(&x, true, None, false).unwrap();
        assert_eq!((all.shape().len(), all.to_i64_vec()), (0, vec![3]));
        let kept = arg_extremum(&x, true, None, true).unwrap();
        assert_eq!(kept.shape(), &[1, 1]);
        let cols = arg_extremum(&x, false, Some(0), true).unwrap();
        assert_eq!(
            (cols.shape(), cols.to_i64_vec()),
            (&[1, 5][..], vec![0, 1, 1, 0, 0])
        );
        let i = Tensor::from_i64(vec![4], vec![3, 1, 1, 2]);
        assert_eq!(
            arg_extremum(&i, false, Some(0), false)
                .unwrap()
                .to_i64_vec(),
            vec![1]
        );
        let e = Tensor::from_f32(vec![0, 3], vec![]);
        assert!(arg_extremum(&e, true, Some(0), false).is_err());
        assert_eq!(
            arg_extremum(&e, true, Some(1), false).unwrap().shape(),
            &[0]
        );
        let b = Tensor::from_bool(vec![2], vec![true, false]);
        assert!(arg_extremum(&b, true, Some(0), false).is_err());
    }
}
