//! `var_mean`: variance and mean over dims in one pass over memory (two over each row).

use super::buffer_pool as pool;
use super::layout::norm_dim;
use crate::tensor::Tensor;
use tracepass_ir::DType;

/// `torch.var_mean(x, dims, correction=, keepdim=)`: the variance divides by
/// `max(N - correction, 0)` (so `N <= correction` gives inf or NaN, as in PyTorch) where `N`
/// is the count of reduced elements. Dims may be negative; `None` reduces all. Both results
/// have `x`'s dtype; they are computed in f64 (two-pass) and rounded once.
/// `torch.var` (or `torch.std` when `std`) over `dims`: computed in f64 from the input's
/// values, the square root taken there, and rounded once to the input's dtype.
pub fn var(
    x: &Tensor,
    dims: Option<&[i64]>,
    correction: f64,
    keepdim: bool,
    std: bool,
) -> Result<Tensor, String> {
    let dtype = x.dtype();
    if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16 | DType::F16) {
        let what = if std { "std" } else { "var" };
        return Err(format!("{what}: dtype {dtype} is not a float type"));
    }
    let wide = x
        .to_dtype(DType::F64)
        .ok_or_else(|| format!("var: cannot widen {dtype}"))?;
    let (v, _) = var_mean(&wide, dims, correction, keepdim)?;
    let v = if std {
        Tensor::from_f64(
            v.shape().to_vec(),
            v.to_f64_vec().into_iter().map(f64::sqrt).collect(),
        )
    } else {
        v
    };
    v.to_dtype(dtype)
        .ok_or_else(|| format!("var: cannot round to {dtype}"))
}

pub fn var_mean(
    x: &Tensor,
    dims: Option<&[i64]>,
    correction: f64,
    keepdim: bool,
) -> Result<(Tensor, Tensor), String> {
    let dtype = x.dtype();
    if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16 | DType::F16) {
        return Err(format!("var_mean: dtype {dtype} is not a float type"));
    }
    let RowReduction {
        perm,
        rows,
        len: row,
        shape: out_shape,
    } = row_reduction(x.shape(), dims, keepdim)?;
    let p = x.permute(&perm)?;
    let divisor = (row as f64 - correction).max(0.0);
    let mut var: Vec<f64> = pool::take(rows);
    let mut mean: Vec<f64> = pool::take(rows);
    macro_rules! rows {
        ($v:expr) => {{
            let v = $v;
            for r in 0..rows {
                let e = &v[r * row..(r + 1) * row];
                let m = e.iter().map(|&a| f64::from(a)).sum::<f64>() / row as f64;
                let ss: f64 = e
                    .iter()
                    .map(|&a| {
                        let d = f64::from(a) - m;
                        d * d
                    })
                    .sum();
                mean.push(m);
                var.push(ss / divisor);
            }
        }};
    }
    match dtype {
        DType::F64 => rows!(p.elems::<f64>().ok_or("var_mean: f64 storage")?),
        DType::F32 => {
            let e = p.elems::<f32>().ok_or("var_mean: f32 storage")?;
            rows!(&e);
            pool::give_cow(e);
        }
        _ => rows!(p.to_f32_vec()),
    }
    let make = |v: Vec<f64>| -> Result<Tensor, String> {
        match dtype {
            DType::F64 => Ok(Tensor::from_f64(out_shape.clone(), v)),
            DType::F32 => {
                // rounded once from f64, as `to_dtype` rounds, into a pooled buffer
                let f = pool::collect(v.len(), v.iter().map(|&x| x as f32));
                pool::give_scratch(v);
                Ok(Tensor::from_f32(out_shape.clone(), f))
            }
            _ => Tensor::from_f64(out_shape.clone(), v)
                .to_dtype(dtype)
                .ok_or_else(|| format!("var_mean: cannot convert to {dtype}")),
        }
    };
    Ok((make(var)?, make(mean)?))
}

/// Which dims `var_mean` reduces (`None` is all, a dim listed twice is an error), the
/// permutation bringing them last (kept dims first: each output element reduces one
/// contiguous row), the row count and row length, and the output shape. The CUDA backend
/// plans with it too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowReduction {
    pub perm: Vec<usize>,
    pub rows: usize,
    pub len: usize,
    pub shape: Vec<usize>,
}

pub fn row_reduction(
    x: &[usize],
    dims: Option<&[i64]>,
    keepdim: bool,
) -> Result<RowReduction, String> {
    let rank = x.len();
    let mut reduced = vec![false; rank];
    match dims {
        None => reduced.iter_mut().for_each(|r| *r = true),
        Some(ds) => {
            for &d in ds {
                let d = if rank == 0 {
                    norm_dim(d, 1).map(|_| 0)?
                } else {
                    norm_dim(d, rank)?
                };
                if rank > 0 && std::mem::replace(&mut reduced[d], true) {
                    return Err(format!("var_mean: dim {d} is listed twice in {ds:?}"));
                }
            }
        }
    }
    let kept: Vec<usize> = (0..rank).filter(|&d| !reduced[d]).collect();
    let red: Vec<usize> = (0..rank).filter(|&d| reduced[d]).collect();
    Ok(RowReduction {
        perm: kept.iter().chain(&red).copied().collect(),
        rows: kept.iter().map(|&d| x[d]).product(),
        len: red.iter().map(|&d| x[d]).product(),
        shape: if keepdim {
            (0..rank)
                .map(|d| if reduced[d] { 1 } else { x[d] })
                .collect()
        } else {
            kept.iter().map(|&d| x[d]).collect()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_and_batch_norm_statistics() {
        let x = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 6., 8.]);
        let (v, m) = var_mean(&x, Some(&[-1]), 0.0, false).expect("ok");
        assert_eq!(m.to_f32_vec(), vec![2., 6.]);
        assert_eq!(v.to_f32_vec(), vec![2. / 3., 8. / 3.]);
        let (v, m) = var_mean(&x, Some(&[1]), 1.0, true).expect("ok");
        assert_eq!((v.shape(), m.shape()), (&[2, 1][..], &[2, 1][..]));
        assert_eq!(v.to_f32_vec(), vec![1., 4.]);
        // over (0, 2, 3) of NCHW, against the definition
        let n: usize = 2 * 3 * 4 * 5;
        let data: Vec<f64> = (0..n).map(|i| ((i * 7919) % 101) as f64 / 10.0).collect();
        let t = Tensor::from_f64(vec![2, 3, 4, 5], data.clone());
        let (v, m) = var_mean(&t, Some(&[0, 2, 3]), 1.0, false).expect("ok");
        for c in 0..3 {
            let e: Vec<f64> = (0..n)
                .filter(|i| (i / 20) % 3 == c)
                .map(|i| data[i])
                .collect();
            let mu = e.iter().sum::<f64>() / e.len() as f64;
            let var = e.iter().map(|a| (a - mu) * (a - mu)).sum::<f64>() / (e.len() - 1) as f64;
            assert!((m.to_f64_vec()[c] - mu).abs() < 1e-12);
            assert!((v.to_f64_vec()[c] - var).abs() < 1e-12);
        }
        let (v, _) = var_mean(&x, None, 6.0, false).expect("ok");
        assert_eq!(v.to_f32_vec(), vec![f32::INFINITY]);
        let h = x.to_dtype(DType::BF16).expect("bf16");
        let (v, m) = var_mean(&h, Some(&[0]), 0.0, false).expect("ok");
        assert_eq!(
            (v.dtype(), m.to_f32_vec()),
            (DType::BF16, vec![2.5, 4., 5.5])
        );
        assert!(var_mean(&x, Some(&[2]), 0.0, false).is_err());
        assert!(var_mean(&x, Some(&[1, -1]), 0.0, false).is_err());
    }
}
