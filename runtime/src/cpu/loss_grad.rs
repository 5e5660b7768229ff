//! The ops a model brings when it computes its own cross-entropy (`F.cross_entropy` inside the
//! module, as HF models do with `labels`): `take_along_dim` in the forward, and
//! `nll_loss_backward` and `_log_softmax_backward_data` / `_softmax_backward_data` in the
//! backward. Computed in f64, rounded once to the result's dtype.

use crate::tensor::{Storage, Tensor};
use tracepass_ir::DType;

fn out(shape: Vec<usize>, dtype: DType, v: &[f64]) -> Result<Tensor, String> {
    let s = Storage::from_f64(dtype, v).ok_or_else(|| format!("dtype {dtype} is not supported"))?;
    Ok(Tensor::new(shape, s))
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// `torch.take_along_dim(a, indices, dim)`: `out[..., i, ...] = a[..., indices[..., i, ...], ...]`
/// along `dim`, the other dims broadcast between `a` and `indices`; without `dim`, along the
/// flattened `a`. Negative indices count from the end, as in PyTorch.
pub fn take_along_dim(a: &Tensor, indices: &Tensor, dim: Option<usize>) -> Result<Tensor, String> {
    let av = a.to_f64_vec();
    let iv = indices.to_i64_vec();
    let pick = |i: i64, n: usize| -> Result<usize, String> {
        let j = if i < 0 { i + n as i64 } else { i };
        if j < 0 || j as usize >= n {
            return Err(format!(
                "take_along_dim: index {i} is out of range for size {n}"
            ));
        }
        Ok(j as usize)
    };
    let Some(dim) = dim else {
        let v = iv
            .iter()
            .map(|&i| pick(i, av.len()).map(|j| av[j]))
            .collect::<Result<Vec<f64>, String>>()?;
        return out(vec![iv.len()], a.dtype(), &v);
    };
    let (ash, ish) = (a.shape(), indices.shape());
    if ash.len() != ish.len() || dim >= ash.len() {
        return Err(format!(
            "take_along_dim: a {ash:?} and indices {ish:?} along dim {dim} do not match"
        ));
    }
    let mut shape = Vec::with_capacity(ash.len());
    for d in 0..ash.len() {
        shape.push(if d == dim {
            ish[d]
        } else if ash[d] == ish[d] || ish[d] == 1 {
            ash[d]
        } else if ash[d] == 1 {
            ish[d]
        } else {
            return Err(format!(
                "take_along_dim: a {ash:?} and indices {ish:?} do not broadcast outside dim {dim}"
            ));
        });
    }
    let (sa, si, so) = (strides(ash), strides(ish), strides(&shape));
    let n: usize = shape.iter().product();
    let mut v = Vec::with_capacity(n);
    for flat in 0..n {
        let (mut ai, mut ii) = (0usize, 0usize);
        for d in 0..shape.len() {
            let c = flat / so[d] % shape[d];
            if d != dim {
                ai += if ash[d] == 1 { 0 } else { c * sa[d] };
            }
            ii += if ish[d] == 1 { 0 } else { c * si[d] };
        }
        ai += pick(iv[ii], ash[dim])? * sa[dim];
        v.push(av[ai]);
    }
    out(shape, a.dtype(), &v)
}

/// PyTorch's `nll_loss_backward(grad, input, target, weight, reduction, ignore_index,
/// total_weight)`: the gradient of `nll_loss` with respect to its input (`[C]`, `[N, C]` or
/// `[N, C, d1, ...]`): `-w[t] * grad` at each target class (divided by `total_weight` for
/// `mean`), zero elsewhere and at ignored targets.
#[allow(clippy::too_many_arguments)]
pub fn nll_loss_backward(
    grad: &Tensor,
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: &str,
    ignore_index: i64,
    total_weight: &Tensor,
) -> Result<Tensor, String> {
    let shape = input.shape().to_vec();
    let (n, c, inner) = match shape.len() {
        1 => (1, shape[0], 1),
        0 => return Err("nll_loss_backward: the input is a scalar".into()),
        _ => (shape[0], shape[1], shape[2..].iter().product::<usize>()),
    };
    let t = target.to_i64_vec();
    if t.len() != n * inner {
        return Err(format!(
            "nll_loss_backward: target {:?} does not fit input {shape:?}",
            target.shape()
        ));
    }
    let w = weight.map(Tensor::to_f64_vec);
    if w.as_ref().is_some_and(|w| w.len() != c) {
        return Err(format!("nll_loss_backward: weight has not {c} classes"));
    }
    let g = grad.to_f64_vec();
    let scale = match reduction {
        "mean" => {
            let tw = total_weight
                .to_f64_vec()
                .first()
                .copied()
                .unwrap_or(f64::NAN);
            1.0 / tw
        }
        "sum" | "none" => 1.0,
        other => return Err(format!("nll_loss_backward: unknown reduction `{other}`")),
    };
    if reduction == "none" && g.len() != n * inner {
        return Err(format!(
            "nll_loss_backward: reduction `none` takes one gradient per target ({}), got {:?}",
            n * inner,
            grad.shape()
        ));
    }
    if reduction != "none" && g.len() != 1 {
        return Err(format!(
            "nll_loss_backward: reduction `{reduction}` takes a scalar gradient, got {:?}",
            grad.shape()
        ));
    }
    let mut v = vec![0.0f64; n * c * inner];
    for b in 0..n {
        for s in 0..inner {
            let k = b * inner + s;
            let cls = t[k];
            if cls == ignore_index {
                continue;
            }
            if cls < 0 || cls as usize >= c {
                return Err(format!(
                    "nll_loss_backward: target {cls} at position {k} is not a class of 0..{c}"
                ));
            }
            let cls = cls as usize;
            let wt = w.as_ref().map_or(1.0, |w| w[cls]);
            let gk = if reduction == "none" { g[k] } else { g[0] };
            v[(b * c + cls) * inner + s] = -wt * gk * scale;
        }
    }
    out(shape, input.dtype(), &v)
}

/// `_log_softmax_backward_data(grad, output, dim, dtype)` (`log: true`):
/// `grad - exp(output) * sum(grad, dim)`; `_softmax_backward_data` (`log: false`):
/// `output * (grad - sum(grad * output, dim))`. The result has `dtype`.
pub fn softmax_backward(
    grad: &Tensor,
    output: &Tensor,
    dim: usize,
    log: bool,
    dtype: DType,
) -> Result<Tensor, String> {
    let shape = output.shape().to_vec();
    if grad.shape() != shape.as_slice() || dim >= shape.len().max(1) {
        return Err(format!(
            "softmax backward: grad {:?} and output {shape:?} along dim {dim} do not match",
            grad.shape()
        ));
    }
    let (g, o) = (grad.to_f64_vec(), output.to_f64_vec());
    let len = shape.get(dim).copied().unwrap_or(1);
    let inner: usize = shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let outer = g.len() / (len * inner).max(1);
    let mut v = vec![0.0f64; g.len()];
    for a in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (a * len + k) * inner + i;
            let s: f64 = (0..len)
                .map(|k| if log { g[at(k)] } else { g[at(k)] * o[at(k)] })
                .sum();
            for k in 0..len {
                let j = at(k);
                v[j] = if log {
                    g[j] - o[j].exp() * s
                } else {
                    o[j] * (g[j] - s)
                };
            }
        }
    }
    out(shape, dtype, &v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_along_dim_gathers_and_broadcasts() {
        // a [2, 3], indices [2, 1] along dim 1: one column per row
        let a = Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let i = Tensor::from_i64(vec![2, 1], vec![2, -3]);
        let t = take_along_dim(&a, &i, Some(1)).unwrap();
        assert_eq!(t.shape(), &[2, 1]);
        assert_eq!(t.to_f32_vec(), vec![3.0, 4.0]);
        // indices [1, 2] broadcast over the rows, along dim 1
        let i = Tensor::from_i64(vec![1, 2], vec![1, 0]);
        let t = take_along_dim(&a, &i, Some(1)).unwrap();
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(t.to_f32_vec(), vec![2.0, 1.0, 5.0, 4.0]);
        // no dim: the flattened input
        let i = Tensor::from_i64(vec![3], vec![5, 0, 2]);
        assert_eq!(
            take_along_dim(&a, &i, None).unwrap().to_f32_vec(),
            vec![6.0, 1.0, 3.0]
        );
        let bad = Tensor::from_i64(vec![2, 1], vec![3, 0]);
        assert!(take_along_dim(&a, &bad, Some(1))
            .unwrap_err()
            .contains("index 3"));
    }

    #[test]
    fn nll_loss_backward_is_minus_the_target_indicator_over_the_count() {
        let input = Tensor::from_f32(vec![3, 2], vec![0.0; 6]);
        let target = Tensor::from_i64(vec![3], vec![1, -100, 0]);
        let g = Tensor::from_f32(vec![], vec![1.0]);
        let tw = Tensor::from_i64(vec![], vec![2]);
        let d = nll_loss_backward(&g, &input, &target, None, "mean", -100, &tw).unwrap();
        assert_eq!(d.to_f32_vec(), vec![0.0, -0.5, 0.0, 0.0, -0.5, 0.0]);
        let w = Tensor::from_f32(vec![2], vec![2.0, 3.0]);
        let d = nll_loss_backward(&g, &input, &target, Some(&w), "sum", -100, &tw).unwrap();
        assert_eq!(d.to_f32_vec(), vec![0.0, -3.0, 0.0, 0.0, -2.0, 0.0]);
    }

    #[test]
    fn softmax_backwards_match_finite_differences() {
        // y = log_softmax(x) along dim 1; L = sum(c * y): dL/dx against central differences
        let x = [0.3, -1.2, 2.0, 0.5, 0.1, -0.4];
        let c = [1.0, -2.0, 0.5, 0.25, 3.0, -1.0];
        let f = |x: &[f64], log: bool| -> (Vec<f64>, f64) {
            let mut y = vec![0.0; 6];
            for r in 0..2 {
                let row = &x[r * 3..r * 3 + 3];
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                for k in 0..3 {
                    let ls = row[k] - m - s.ln();
                    y[r * 3 + k] = if log { ls } else { ls.exp() };
                }
            }
            let l = y.iter().zip(&c).map(|(a, b)| a * b).sum();
            (y, l)
        };
        for log in [true, false] {
            let (y, _) = f(&x, log);
            let d = softmax_backward(
                &Tensor::from_f64(vec![2, 3], c.to_vec()),
                &Tensor::from_f64(vec![2, 3], y),
                1,
                log,
                DType::F64,
            )
            .unwrap()
            .to_f64_vec();
            for j in 0..6 {
                let mut xp = x.to_vec();
                xp[j] += 1e-6;
                let mut xm = x.to_vec();
                xm[j] -= 1e-6;
                let fd = (f(&xp, log).1 - f(&xm, log).1) / 2e-6;
                assert!(
                    (fd - d[j]).abs() < 1e-6,
                    "log={log} [{j}]: {} vs {fd}",
                    d[j]
                );
            }
        }
    }
}
