//! `torch.cumsum` along one dimension.

use crate::tensor::Tensor;
use tracepass_ir::DType;

/// The lines of a row-major `shape` along `dim`: `(outer, len, inner)`, line `(o, i)` holding
/// the elements `o * len * inner + j * inner + i` for `j` in `0..len`.
pub fn lines(shape: &[usize], dim: usize) -> Result<(usize, usize, usize), String> {
    if shape.is_empty() && dim == 0 {
        return Ok((1, 1, 1));
    }
    if dim >= shape.len() {
        return Err(format!("dimension {dim} is out of range for {shape:?}"));
    }
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    Ok((outer, shape[dim], inner))
}

fn scan<T: Copy>(
    v: &[T],
    shape: &[usize],
    dim: usize,
    zero: T,
    add: impl Fn(T, T) -> T,
) -> Result<Vec<T>, String> {
    let (outer, len, inner) = lines(shape, dim)?;
    let mut out = v.to_vec();
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = zero;
            for j in 0..len {
                let at = (o * len + j) * inner + i;
                acc = add(acc, v[at]);
                out[at] = acc;
            }
        }
    }
    Ok(out)
}

/// `cumsum(x, dim, dtype=dtype)`: `x` cast to `dtype` first (as PyTorch does with `dtype=`),
/// then summed along `dim`: f32 and f64 accumulate in f64 and bf16/f16 in f32 (PyTorch's CPU
/// accumulation types), each partial sum rounded to `dtype`; integers in wrapping i64.
pub fn cumsum(x: &Tensor, dim: usize, dtype: DType) -> Result<Tensor, String> {
    let x = x
        .to_dtype(dtype)
        .ok_or_else(|| format!("cumsum: cannot cast {} to {dtype}", x.dtype()))?;
    let shape: crate::tensor::Dims<usize> = x.shape().into();
    match dtype {
        DType::F32 | DType::F64 => {
            let v = scan(&x.to_f64_vec(), &shape, dim, 0.0, |a, b| a + b)?;
            // each partial sum rounded once; the running sum stays in f64
            Tensor::from_f64(shape, v)
                .to_dtype(dtype)
                .ok_or_else(|| format!("cumsum: cannot round to {dtype}"))
        }
        DType::BF16 | DType::F16 => {
            let v = scan(&x.to_f32_vec(), &shape, dim, 0.0f32, |a, b| a + b)?;
            Tensor::from_f32(shape, v)
                .to_dtype(dtype)
                .ok_or_else(|| format!("cumsum: cannot round to {dtype}"))
        }
        DType::I64 | DType::I32 => {
            let v = scan(&x.to_i64_vec(), &shape, dim, 0i64, i64::wrapping_add)?;
            Tensor::from_i64(shape, v)
                .to_dtype(dtype)
                .ok_or_else(|| format!("cumsum: cannot convert to {dtype}"))
        }
        other => Err(format!("cumsum into {other} is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_along_any_dimension() {
        let x = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let r = cumsum(&x, 1, DType::F32).unwrap();
        assert_eq!(r.to_f32_vec(), vec![1., 3., 6., 4., 9., 15.]);
        let c = cumsum(&x, 0, DType::F32).unwrap();
        assert_eq!(c.to_f32_vec(), vec![1., 2., 3., 5., 7., 9.]);
        // a transposed view sums in its own row-major order
        let t = cumsum(&x.permute(&[1, 0]).unwrap(), 0, DType::F64).unwrap();
        assert_eq!(t.dtype(), DType::F64);
        assert_eq!(t.to_f64_vec(), vec![1., 4., 3., 9., 6., 15.]);
        let m = Tensor::from_bool(vec![3], vec![true, true, false]);
        let i = cumsum(&m, 0, DType::I64).unwrap();
        assert_eq!((i.dtype(), i.to_i64_vec()), (DType::I64, vec![1, 2, 2]));
        // dtype= casts first: 1.5 and 2.5 truncate to 1 and 2
        let f = Tensor::from_f32(vec![2], vec![1.5, 2.5]);
        assert_eq!(cumsum(&f, 0, DType::I64).unwrap().to_i64_vec(), vec![1, 3]);
        let s = Tensor::from_f32(vec![], vec![4.0]);
        assert_eq!(cumsum(&s, 0, DType::F32).unwrap().to_f32_vec(), vec![4.0]);
        let e = Tensor::from_f32(vec![2, 0], vec![]);
        assert_eq!(cumsum(&e, 1, DType::F32).unwrap().shape(), &[2, 0]);
        assert!(cumsum(&x, 2, DType::F32).is_err());
    }

    #[test]
    fn f32_sums_accumulate_in_f64() {
        // 2^24 + 1 + 1: f32 accumulation loses both ones, f64 accumulation keeps them
        let x = Tensor::from_f32(vec![3], vec![16_777_216.0, 1.0, 1.0]);
        let r = cumsum(&x, 0, DType::F32).unwrap().to_f32_vec();
        assert_eq!(r, vec![16_777_216.0, 16_777_216.0, 16_777_218.0]);
    }
}
