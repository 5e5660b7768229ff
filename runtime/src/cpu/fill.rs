//! Tensors made from numbers: `arange` and `full`.

use crate::tensor::{Elem, Tensor};
use crate::with_elem;
use tracepass_ir::DType;

/// `torch.arange(start, end, step, dtype=)`: `ceil((end - start) / step)` values
/// `start + i * step`, computed in f64 and cast to `dtype` (as PyTorch's CPU kernel does in its
/// accumulate type).
pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor, String> {
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
        return Err(format!(
            "arange({start}, {end}, {step}): the bounds must be finite and the step nonzero"
        ));
    }
    if (step > 0.0 && end < start) || (step < 0.0 && end > start) {
        return Err(format!(
            "arange({start}, {end}, {step}): the bounds are inconsistent with the step's sign"
        ));
    }
    let n = ((end - start) / step).ceil().max(0.0) as usize;
    with_elem!(dtype, T => {
        let v: Vec<T> = crate::cpu::buffer_pool::collect(n, (0..n).map(|i| T::from_f64(start + i as f64 * step)));
        Ok(Tensor::new([n], T::wrap(v)))
    }, other => Err(format!("arange: dtype {other} is not supported by the cpu backend")))
}

/// `torch.full(shape, value, dtype=)`.
pub fn full(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor, String> {
    let n = shape.iter().product();
    with_elem!(dtype, T => Ok(Tensor::new(shape, T::wrap(crate::cpu::buffer_pool::filled(n, T::from_f64(value))))),
        other => Err(format!("full: dtype {other} is not supported by the cpu backend")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arange_counts_like_pytorch() {
        let a = arange(0.0, 16.0, 1.0, DType::I64).expect("ok");
        assert_eq!(a.to_i64_vec(), (0..16).collect::<Vec<i64>>());
        let b = arange(1.0, 2.0, 0.3, DType::F32).expect("ok");
        assert_eq!(b.shape(), &[4]);
        assert_eq!(b.to_f32_vec(), vec![1.0, 1.3, 1.6, 1.9]);
        let c = arange(5.0, 0.0, -2.0, DType::I32).expect("ok");
        assert_eq!(c.to_i64_vec(), vec![5, 3, 1]);
        assert_eq!(arange(3.0, 3.0, 1.0, DType::F32).expect("ok").numel(), 0);
        assert!(arange(0.0, 1.0, 0.0, DType::F32).is_err());
        assert!(arange(0.0, 1.0, -1.0, DType::F32).is_err());
    }

    #[test]
    fn full_fills_every_dtype() {
        let f = full(&[2, 3], -0.5, DType::BF16).expect("ok");
        assert_eq!((f.dtype(), f.to_f32_vec()), (DType::BF16, vec![-0.5; 6]));
        let b = full(&[2], 1.0, DType::Bool).expect("ok");
        assert_eq!(b.to_bool_vec(), vec![true, true]);
        let s = full(&[], 7.0, DType::I64).expect("ok");
        assert_eq!((s.shape().len(), s.to_i64_vec()), (0, vec![7]));
        assert!(full(&[1], 0.0, DType::U8).is_err());
    }
}
