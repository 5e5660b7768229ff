//! `var_mean`: variance and mean over dims in one pass over memory (two over each row).

use super::buffer_pool as pool;
use super::layout::norm_dim;
use crate::tensor::{Dims, Tensor};
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
            v.shape(),
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
    let mut var: Vec<f64> = pool::filled(rows, 0.0);
    let mut mean: Vec<f64> = pool::filled(rows, 0.0);
    macro_rules! rows {
        ($v:expr) => {{
            let v = $v;
            let one = |r: usize, (m, var): (&mut f64, &mut f64)| {
                let e = &v[r * row..(r + 1) * row];
                *m = lane_sum(e, |a| f64::from(a)) / row as f64;
                let ss = lane_sum(e, |a| {
                    let d = f64::from(a) - *m;
                    d * d
                });
                *var = ss / divisor;
            };
            // rows are independent and each is summed the same way on any thread
            if super::pool_threads() > 1 && rows > 1 && rows * row >= super::strided::PARALLEL_MIN {
                use rayon::prelude::*;
                mean.par_iter_mut()
                    .zip(var.par_iter_mut())
                    .enumerate()
                    .for_each(|(r, pair)| one(r, pair));
            } else {
                mean.iter_mut()
                    .zip(var.iter_mut())
                    .enumerate()
                    .for_each(|(r, pair)| one(r, pair));
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

/// `f(a)` summed in f64 over `e`, element `i` into lane `i % 8` (one AVX-512 vector of f64),
/// the lanes merged pairwise, then the tail: a vector add per element instead of a chain of
/// adds each waiting on the last, in an order that depends only on the length.
fn lane_sum<T: Copy>(e: &[T], f: impl Fn(T) -> f64) -> f64 {
    const LANES: usize = 8;
    let (blocks, tail) = e.as_chunks::<LANES>();
    let mut part = [0.0f64; LANES];
    for block in blocks {
        for (q, &a) in part.iter_mut().zip(block) {
            *q += f(a);
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            part[l] += part[l + width];
        }
    }
    tail.iter().fold(part[0], |s, &a| s + f(a))
}

/// Which dims `var_mean` reduces (`None` is all, a dim listed twice is an error), the
/// permutation bringing them last (kept dims first: each output element reduces one
/// contiguous row), the row count and row length, and the output shape. The CUDA backend
/// plans with it too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowReduction {
    pub perm: Dims<usize>,
    pub rows: usize,
    pub len: usize,
    pub shape: Dims<usize>,
}

pub fn row_reduction(
    x: &[usize],
    dims: Option<&[i64]>,
    keepdim: bool,
) -> Result<RowReduction, String> {
    let rank = x.len();
    let mut reduced: Dims<bool> = Dims::from_elem(false, rank);
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
    let kept: Dims<usize> = (0..rank).filter(|&d| !reduced[d]).collect();
    let red: Dims<usize> = (0..rank).filter(|&d| reduced[d]).collect();
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

    #[test]
    fn rows_on_threads_give_the_one_thread_bits() {
        // batch-norm statistics of [8, 64, 16, 16]: rows of 2048 shared out by channel
        let n = 8 * 64 * 16 * 16;
        let x = Tensor::from_f32(
            vec![8, 64, 16, 16],
            (0..n)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.013 - 6.0)
                .collect(),
        );
        assert!(n >= crate::cpu::strided::PARALLEL_MIN);
        let run = || {
            let (v, m) = var_mean(&x, Some(&[0, 2, 3]), 0.0, false).expect("ok");
            (v.to_f32_vec(), m.to_f32_vec())
        };
        let (one, three) = crate::cpu::alone_and_in_three_threads(run);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one.0), bits(&three.0));
        assert_eq!(bits(&one.1), bits(&three.1));
        // and they are the statistics, against an f64 two-pass over one channel
        let e: Vec<f64> = (0..n)
            .filter(|i| (i / 256) % 64 == 5)
            .map(|i| f64::from(((i * 7919) % 1013) as f32 * 0.013 - 6.0))
            .collect();
        let mu = e.iter().sum::<f64>() / e.len() as f64;
        let var = e.iter().map(|a| (a - mu) * (a - mu)).sum::<f64>() / e.len() as f64;
        assert!((f64::from(one.1[5]) - mu).abs() < 1e-5);
        assert!((f64::from(one.0[5]) - var).abs() < 1e-4 * var);
    }
}
