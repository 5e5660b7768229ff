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
    if dtype == DType::I32 {
        // as PyTorch: computed in i64, then cast, which wraps past i32's range (a direct
        // `as i32` would saturate)
        let v: Vec<i32> = (0..n)
            .map(|i| (start + i as f64 * step) as i64 as i32)
            .collect();
        return Ok(Tensor::new([n], crate::tensor::Storage::I32(v)));
    }
    with_elem!(dtype, T => {
        let v: Vec<T> = crate::cpu::buffer_pool::collect(n, (0..n).map(|i| T::from_f64(start + i as f64 * step)));
        Ok(Tensor::new([n], T::wrap(v)))
    }, other => Err(format!("arange: dtype {other} is not supported by the cpu backend")))
}

/// `torch.full(shape, value, dtype=)`. An integer dtype refuses a value outside its range (and
/// NaN or an infinity), as PyTorch does ("value cannot be converted ... without overflow"),
/// rather than saturate it; a fraction truncates, as in PyTorch.
pub fn full(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor, String> {
    check_fits(value, dtype).map_err(|e| format!("full: {e}"))?;
    let n = shape.iter().product();
    with_elem!(dtype, T => Ok(Tensor::new(shape, T::wrap(crate::cpu::buffer_pool::filled(n, T::from_f64(value))))),
        other => Err(format!("full: dtype {other} is not supported by the cpu backend")))
}

/// Refuses a number an integer `dtype` cannot hold (NaN, an infinity, or outside its range),
/// as PyTorch refuses it where a number becomes a tensor's element (`full`, `fill_`,
/// `masked_fill`, `where`: "value cannot be converted to type int without overflow"). Float
/// dtypes take every number.
pub(crate) fn check_fits(value: f64, dtype: DType) -> Result<(), String> {
    let range = match dtype {
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
        _ => return Ok(()),
    };
    if (range.0..=range.1).contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{value} cannot be converted to {dtype} without overflow"
        ))
    }
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
    fn integers_wrap_in_arange_and_overflow_is_refused_in_full() {
        // PyTorch: arange(2147483646, 2147483650, dtype=int32) wraps past i32::MAX
        let a = arange(2147483646.0, 2147483650.0, 1.0, DType::I32).expect("ok");
        assert_eq!(
            a.to_i64_vec(),
            vec![2147483646, 2147483647, -2147483648, -2147483647]
        );
        for (v, d) in [
            (3e9, DType::I32),
            (f64::NAN, DType::I32),
            (f64::INFINITY, DType::I64),
            (1e20, DType::I64),
        ] {
            let err = full(&[2], v, d).unwrap_err();
            assert!(err.contains("without overflow"), "{v} in {d}: {err}");
        }
        let t = full(&[1], -2.7, DType::I64).expect("a fraction truncates");
        assert_eq!(t.to_i64_vec(), vec![-2]);
        let t = full(&[1], f64::from(i32::MIN), DType::I32).expect("the range's end fits");
        assert_eq!(t.to_i64_vec(), vec![i64::from(i32::MIN)]);
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
