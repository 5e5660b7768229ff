//! 2-d adaptive average pooling to any output size, and its backward: output cell `(i, j)`
//! averages input rows `floor(i * H / oh) .. ceil((i + 1) * H / oh)` and the columns alike
//! (PyTorch's windows, which overlap when the sizes do not divide).

use crate::tensor::Tensor;
use tracepass_ir::DType;

/// Input rows (or columns) `start..end` pooled into output cell `i` of `out` from `len`.
pub fn window(i: usize, len: usize, out: usize) -> (usize, usize) {
    ((i * len) / out, ((i + 1) * len).div_ceil(out))
}

/// The `(planes, h, w)` of a `[..., h, w]` tensor of rank 3 or more.
fn planes(shape: &[usize], what: &str) -> Result<(usize, usize, usize), String> {
    let r = shape.len();
    if r < 3 {
        return Err(format!("{what}: input {shape:?} has rank below 3"));
    }
    Ok((shape[..r - 2].iter().product(), shape[r - 2], shape[r - 1]))
}

fn float(d: DType, what: &str) -> Result<(), String> {
    match d {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => Ok(()),
        other => Err(format!("{what}: dtype {other} is not a float type")),
    }
}

/// `adaptive_avg_pool2d(x, (oh, ow))`: computed in f64, rounded once to `x`'s dtype.
pub fn adaptive_avg_pool2d(x: &Tensor, oh: usize, ow: usize) -> Result<Tensor, String> {
    let what = "adaptive_avg_pool2d";
    float(x.dtype(), what)?;
    let shape = x.shape();
    let (p, h, w) = planes(shape, what)?;
    if (h == 0 || w == 0) && p * oh * ow > 0 {
        return Err(format!("{what}: input {shape:?} has no elements to pool"));
    }
    let v = x.to_f64_pooled();
    let mut out = crate::cpu::buffer_pool::take(p * oh * ow);
    for plane in 0..p {
        let base = plane * h * w;
        for i in 0..oh {
            let (h0, h1) = window(i, h, oh);
            for j in 0..ow {
                let (w0, w1) = window(j, w, ow);
                let mut sum = 0.0;
                for r in h0..h1 {
                    for c in w0..w1 {
                        sum += v[base + r * w + c];
                    }
                }
                out.push(sum / ((h1 - h0) * (w1 - w0)) as f64);
            }
        }
    }
    crate::cpu::buffer_pool::give_scratch(v);
    let mut out_shape: crate::tensor::Dims<usize> = shape[..shape.len() - 2].into();
    out_shape.extend([oh, ow]);
    rounded(&out_shape, out, x.dtype(), what)
}

/// `_adaptive_avg_pool2d_backward(grad, x)`: every input element gets `grad[i, j] /
/// window size` from each output cell whose window holds it; computed in f64, rounded once
/// to `grad`'s dtype; the result has `input_shape`.
pub fn adaptive_avg_pool2d_backward(
    grad: &Tensor,
    input_shape: &[usize],
) -> Result<Tensor, String> {
    let what = "adaptive_avg_pool2d_backward";
    float(grad.dtype(), what)?;
    let (p, h, w) = planes(input_shape, what)?;
    let gs = grad.shape();
    let r = input_shape.len();
    if gs.len() != r || gs[..r - 2] != input_shape[..r - 2] {
        return Err(format!(
            "{what}: grad {gs:?} does not pool input {input_shape:?}"
        ));
    }
    let (oh, ow) = (gs[r - 2], gs[r - 1]);
    let g = grad.to_f64_pooled();
    let mut out = crate::cpu::buffer_pool::filled(p * h * w, 0.0f64);
    for plane in 0..p {
        for i in 0..oh {
            let (h0, h1) = window(i, h, oh);
            for j in 0..ow {
                let (w0, w1) = window(j, w, ow);
                let share = g[(plane * oh + i) * ow + j] / ((h1 - h0) * (w1 - w0)) as f64;
                for row in h0..h1 {
                    for c in w0..w1 {
                        out[(plane * h + row) * w + c] += share;
                    }
                }
            }
        }
    }
    crate::cpu::buffer_pool::give_scratch(g);
    rounded(input_shape, out, grad.dtype(), what)
}

/// `out` (f64) rounded once to `dtype`, its buffer kept for the next call.
fn rounded(shape: &[usize], out: Vec<f64>, dtype: DType, what: &str) -> Result<Tensor, String> {
    let wide = Tensor::from_f64(shape, out);
    let r = wide
        .to_dtype(dtype)
        .ok_or_else(|| format!("{what}: cannot round to {dtype}"));
    if let Some(crate::tensor::Storage::F64(v)) = wide.into_unshared_storage() {
        crate::cpu::buffer_pool::give_scratch(v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_pytorchs() {
        // 5 rows into 3: [0, 2), [1, 4), [3, 5); 7 columns into 4: [0,2) [1,4) [3,6) [5,7)
        assert_eq!(
            (0..3).map(|i| window(i, 5, 3)).collect::<Vec<_>>(),
            vec![(0, 2), (1, 4), (3, 5)]
        );
        assert_eq!(
            (0..4).map(|i| window(i, 7, 4)).collect::<Vec<_>>(),
            vec![(0, 2), (1, 4), (3, 6), (5, 7)]
        );
        // dividing sizes give equal, disjoint windows
        assert_eq!(
            (0..2).map(|i| window(i, 4, 2)).collect::<Vec<_>>(),
            vec![(0, 2), (2, 4)]
        );
    }

    #[test]
    fn pooling_and_its_gradient_add_up() {
        let x = Tensor::from_f64(vec![1, 1, 2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let y = adaptive_avg_pool2d(&x, 1, 2).unwrap();
        // columns [0, 2) and [1, 3)
        assert_eq!(y.to_f64_vec(), vec![3.0, 4.0]);
        let g = Tensor::from_f64(vec![1, 1, 1, 2], vec![4.0, 8.0]);
        let dx = adaptive_avg_pool2d_backward(&g, &[1, 1, 2, 3]).unwrap();
        assert_eq!(dx.to_f64_vec(), vec![1.0, 3.0, 2.0, 1.0, 3.0, 2.0]);
        assert!(adaptive_avg_pool2d(&Tensor::from_i64(vec![1, 1, 1], vec![1]), 1, 1).is_err());
        assert!(adaptive_avg_pool2d_backward(&g, &[1, 2, 2, 3]).is_err());
    }
}
