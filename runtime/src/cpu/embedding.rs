//! `embedding` (a row gather) and its backward (a row scatter-add).

use crate::tensor::{Elem, Tensor};
use crate::with_elem;
use tracepass_ir::DType;

/// Indices as i64, checked to lie in `0..rows`.
fn indices(idx: &Tensor, rows: usize, what: &str) -> Result<Vec<i64>, String> {
    if !matches!(idx.dtype(), DType::I64 | DType::I32) {
        return Err(format!(
            "{what}: indices must be i64 or i32, got {}",
            idx.dtype()
        ));
    }
    let v = idx.to_i64_vec();
    if let Some((at, &bad)) = v
        .iter()
        .enumerate()
        .find(|(_, &i)| i < 0 || i as usize >= rows)
    {
        return Err(format!(
            "{what}: index {bad} at position {at} is out of range for {rows} rows"
        ));
    }
    Ok(v)
}

/// `torch.nn.functional.embedding(idx, weight)`: `weight[idx]`, of shape `idx.shape + [dim]`.
/// (`padding_idx` and `scale_grad_by_freq` only change the backward; `max_norm` renormalizes
/// the weight in place, which a functional trace cannot express, so the decoder refuses it.)
pub fn embedding(idx: &Tensor, weight: &Tensor) -> Result<Tensor, String> {
    if weight.shape().len() != 2 {
        return Err(format!(
            "embedding: the weight must be 2-d, got {:?}",
            weight.shape()
        ));
    }
    let (rows, dim) = (weight.shape()[0], weight.shape()[1]);
    let ix = indices(idx, rows, "embedding")?;
    let mut shape = crate::tensor::Dims::from_slice(idx.shape());
    shape.push(dim);
    with_elem!(weight.dtype(), T => {
        let w = weight.elems::<T>().ok_or("embedding: weight storage")?;
        let mut out: Vec<T> = crate::cpu::buffer_pool::take(ix.len() * dim);
        for &i in &ix {
            let i = i as usize;
            out.extend_from_slice(&w[i * dim..(i + 1) * dim]);
        }
        crate::cpu::buffer_pool::give_scratch(ix);
        crate::cpu::buffer_pool::give_cow(w);
        Ok(Tensor::new(shape, T::wrap(out)))
    }, other => Err(format!("embedding: dtype {other} is not supported by the cpu backend")))
}

/// `aten.embedding_backward(grad, idx, num_weights, padding_idx, scale_grad_by_freq, sparse)`
/// (dense): `grad_weight[idx[k]] += grad[k]` in index order, skipping `idx == padding_idx`
/// (aten passes -1 for none); with `scale_grad_by_freq` each row's contribution is divided by
/// how often its index occurs. Accumulates in f32 (f64 for f64) and rounds once.
pub fn embedding_backward(
    grad: &Tensor,
    idx: &Tensor,
    num_weights: usize,
    padding_idx: i64,
    scale_grad_by_freq: bool,
) -> Result<Tensor, String> {
    let ix = indices(idx, num_weights, "embedding_backward")?;
    let gs = grad.shape();
    if gs.len() != idx.shape().len() + 1 || gs[..gs.len() - 1] != *idx.shape() {
        return Err(format!(
            "embedding_backward: grad {gs:?} does not fit indices {:?}",
            idx.shape()
        ));
    }
    let dim = gs[gs.len() - 1];
    let mut counts = vec![0u32; if scale_grad_by_freq { num_weights } else { 0 }];
    for &i in &ix {
        if let Some(c) = counts.get_mut(i as usize) {
            *c += 1;
        }
    }
    macro_rules! accumulate {
        ($t:ty, $g:expr) => {{
            let g = $g;
            let mut out = crate::cpu::buffer_pool::filled(num_weights * dim, 0 as $t);
            for (k, &i) in ix.iter().enumerate() {
                if i == padding_idx {
                    continue;
                }
                let i = i as usize;
                let src = &g[k * dim..(k + 1) * dim];
                let dst = &mut out[i * dim..(i + 1) * dim];
                if scale_grad_by_freq {
                    let s = 1.0 / counts[i] as $t;
                    dst.iter_mut().zip(src).for_each(|(d, &e)| *d += e * s);
                } else {
                    dst.iter_mut().zip(src).for_each(|(d, &e)| *d += e);
                }
            }
            out
        }};
    }
    let shape = [num_weights, dim];
    let out = match grad.dtype() {
        DType::F64 => Tensor::from_f64(
            shape,
            accumulate!(f64, grad.elems::<f64>().ok_or("grad storage")?),
        ),
        DType::F32 => Tensor::from_f32(
            shape,
            accumulate!(f32, grad.elems::<f32>().ok_or("grad storage")?),
        ),
        DType::BF16 | DType::F16 => Tensor::from_f32(shape, accumulate!(f32, grad.to_f32_vec()))
            .to_dtype(grad.dtype())
            .ok_or("embedding_backward: rounding")?,
        other => {
            return Err(format!(
                "embedding_backward: grad dtype {other} is not a float type"
            ))
        }
    };
    crate::cpu::buffer_pool::give_scratch(ix);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_gathers_rows() {
        let w = Tensor::from_f32(vec![3, 2], vec![0., 1., 10., 11., 20., 21.]);
        let i = Tensor::from_i64(vec![2, 2], vec![2, 0, 1, 2]);
        let e = embedding(&i, &w).expect("ok");
        assert_eq!(e.shape(), &[2, 2, 2]);
        assert_eq!(e.to_f32_vec(), vec![20., 21., 0., 1., 10., 11., 20., 21.]);
        let bad = Tensor::from_i64(vec![1], vec![3]);
        let err = embedding(&bad, &w).expect_err("out of range");
        assert!(err.contains("index 3 at position 0"), "{err}");
        assert!(embedding(&w, &w).is_err());
    }

    #[test]
    fn backward_is_the_adjoint_of_forward() {
        // <embedding(i, w), g> == <w, embedding_backward(g, i)> for any w, g
        let (rows, dim) = (5, 3);
        let i = Tensor::from_i64(vec![2, 4], vec![1, 4, 1, 0, 3, 1, 4, 2]);
        let w: Vec<f64> = (0..rows * dim).map(|k| (k as f64 * 0.7).sin()).collect();
        let g: Vec<f64> = (0..8 * dim).map(|k| (k as f64 * 0.3).cos()).collect();
        let tw = Tensor::from_f64(vec![rows, dim], w.clone());
        let tg = Tensor::from_f64(vec![2, 4, dim], g.clone());
        let fwd = embedding(&i, &tw).expect("ok").to_f64_vec();
        let bwd = embedding_backward(&tg, &i, rows, -1, false).expect("ok");
        assert_eq!(bwd.shape(), &[rows, dim]);
        let lhs: f64 = fwd.iter().zip(&g).map(|(a, b)| a * b).sum();
        let rhs: f64 = w.iter().zip(bwd.to_f64_vec()).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-12);
        // row 1 occurs three times: with scale_grad_by_freq its gradient is their mean
        let scaled = embedding_backward(&tg, &i, rows, -1, true)
            .expect("ok")
            .to_f64_vec();
        let plain = bwd.to_f64_vec();
        for c in 0..dim {
            assert!((scaled[dim + c] - plain[dim + c] / 3.0).abs() < 1e-12);
            assert!((scaled[c] - plain[c]).abs() < 1e-12);
        }
        // padding_idx rows get no gradient
        let padded = embedding_backward(&tg, &i, rows, 4, false)
            .expect("ok")
            .to_f64_vec();
        assert!(padded[4 * dim..].iter().all(|&e| e == 0.0));
        assert_eq!(padded[..4 * dim], plain[..4 * dim]);
        assert!(embedding_backward(&tg, &i, 4, -1, false).is_err());
        let f = Tensor::from_f32(vec![2, 4, dim], g.iter().map(|&x| x as f32).collect());
        let b16 = f.to_dtype(DType::BF16).expect("bf16");
        let r = embedding_backward(&b16, &i, rows, -1, false).expect("ok");
        assert_eq!(r.dtype(), DType::BF16);
    }
}
