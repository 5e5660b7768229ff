//! Loss heads: the loss value and its gradient with respect to the model output.

use crate::cpu;
use crate::tensor::{Storage, Tensor};
use crate::train::model::LossKind;
use tracepass_ir::DType;

/// `(loss, d loss / d out)`; `y` is the target batch (unused by `Sum`).
pub fn loss_and_grad(
    kind: LossKind,
    out: &Tensor,
    y: Option<&Tensor>,
) -> Result<(f64, Tensor), String> {
    match kind {
        LossKind::SeedCrossEntropy => {
            let y = y.ok_or("the cross-entropy loss needs y")?;
            if y.shape() != out.shape() || out.shape().len() != 2 {
                return Err(format!(
                    "cross-entropy: y {:?} and output {:?} must be the same [batch, classes] shape",
                    y.shape(),
                    out.shape()
                ));
            }
            // F.cross_entropy(input=y, target=out): mean over rows of -sum_j out_j * log_softmax(y)_j,
            // computed in f64 for f64 models and in f32 (as PyTorch does) otherwise
            let b = out.shape()[0];
            let c = out.shape()[1];
            let (loss, grad) = if out.dtype() == DType::F64 {
                let ls =
                    cpu::softmax(&y.to_dtype(DType::F64).ok_or("y dtype")?, 1, true)?.to_f64_vec();
                let ov = out.to_f64_vec();
                let mut total = 0.0f64;
                for r in 0..b {
                    total -= (0..c).map(|j| ov[r * c + j] * ls[r * c + j]).sum::<f64>();
                }
                let grad: Vec<f64> = ls.iter().map(|l| -l / b as f64).collect();
                (
                    total / b as f64,
                    Tensor::new(out.shape(), Storage::F64(grad)),
                )
            } else {
                let ls =
                    cpu::softmax(&y.to_dtype(DType::F32).ok_or("y dtype")?, 1, true)?.to_f32_vec();
                let ov = out.to_f32_vec();
                let scale = 1.0f32 / b as f32;
                let mut total = 0.0f32;
                for r in 0..b {
                    let mut row = 0.0f32;
                    for j in 0..c {
                        row += ov[r * c + j] * ls[r * c + j];
                    }
                    total += -row;
                }
                let grad: Vec<f32> = ls.iter().map(|l| -l * scale).collect();
                (
                    (total / b as f32) as f64,
                    Tensor::new(out.shape(), Storage::F32(grad)),
                )
            };
            let g = grad.to_dtype(out.dtype()).ok_or("output dtype")?;
            Ok((loss, g))
        }
        LossKind::CrossEntropy { ignore_index } => {
            let y = y.ok_or("the cross-entropy loss needs integer targets")?;
            cross_entropy(out, y, ignore_index)
        }
        LossKind::Mse => {
            let y = y.ok_or("the mse loss needs targets")?;
            if y.shape() != out.shape() {
                return Err(format!(
                    "mse: targets {:?} and output {:?} must have the same shape",
                    y.shape(),
                    out.shape()
                ));
            }
            let (o, t) = (out.to_f64_vec(), y.to_f64_vec());
            let n = o.len().max(1) as f64;
            let loss = o
                .iter()
                .zip(&t)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
                / n;
            let grad: Vec<f64> = o.iter().zip(&t).map(|(a, b)| 2.0 * (a - b) / n).collect();
            Ok((loss, of(out, grad)?))
        }
        LossKind::Output => {
            if out.numel() != 1 {
                return Err(format!(
                    "loss `output`: the model output must be the loss, one number, but it has shape {:?}",
                    out.shape()
                ));
            }
            Ok((out.to_f64_vec()[0], of(out, vec![1.0])?))
        }
        LossKind::Sum => {
            let loss: f64 = out.to_f64_vec().iter().sum();
            let ones = Tensor::new(
                out.shape(),
                Storage::from_f64(out.dtype(), &vec![1.0; out.numel()]).ok_or("output dtype")?,
            );
            Ok((loss, ones))
        }
    }
}

/// A tensor shaped and typed like `like`, holding `v`.
fn of(like: &Tensor, v: Vec<f64>) -> Result<Tensor, String> {
    Ok(Tensor::new(
        like.shape(),
        Storage::from_f64(like.dtype(), &v)
            .ok_or_else(|| format!("output dtype {} is not supported", like.dtype()))?,
    ))
}

/// `F.cross_entropy(out.view(-1, C), targets.view(-1), ignore_index=..)`: the classes are the
/// output's last dim; the loss is the mean over the targets that are not `ignore_index`, in f64.
fn cross_entropy(out: &Tensor, y: &Tensor, ignore_index: i64) -> Result<(f64, Tensor), String> {
    let c = *out
        .shape()
        .last()
        .ok_or("cross-entropy: the output is a scalar; it needs a class dim")?;
    let rows = out.numel().checked_div(c).unwrap_or(0);
    if y.numel() != rows || y.dtype().is_float() {
        return Err(format!(
            "cross-entropy: targets {:?} {} must be integers, one per row of the output {:?} (its last dim, {c}, holds the classes)",
            y.shape(),
            y.dtype(),
            out.shape()
        ));
    }
    // read in place when the output is contiguous f32 and the targets contiguous i64 (a
    // copy otherwise): a training step copies neither
    let (xs, ts) = (out.as_f32(), y.as_i64());
    let x_copy = if xs.is_none() {
        out.to_f64_vec()
    } else {
        Vec::new()
    };
    let t_copy = if ts.is_none() {
        y.to_f64_vec()
    } else {
        Vec::new()
    };
    let x = |i: usize| xs.map_or_else(|| x_copy[i], |v| f64::from(v[i]));
    let target = |r: usize| ts.map_or_else(|| t_copy[r] as i64, |v| v[r]);
    // the mean's divisor first: every gradient element is divided by it as it is written
    let mut counted = 0usize;
    for r in 0..rows {
        let t = target(r);
        if t == ignore_index {
            continue;
        }
        if t < 0 || t as usize >= c {
            return Err(format!(
                "cross-entropy: target {t} at position {r} is not a class of 0..{c}"
            ));
        }
        counted += 1;
    }
    // PyTorch's mean over zero targets is NaN
    let n = counted as f64;
    // one row: its term of the loss (0 for an ignored row) and its gradient, in f64, into
    // `write(column, value)`
    let row = |r: usize, write: &mut dyn FnMut(usize, f64)| -> f64 {
        let t = target(r);
        let at = r * c;
        if t == ignore_index {
            (0..c).for_each(|j| write(j, 0.0 / n));
            return 0.0;
        }
        let m = (at..at + c).map(x).fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = (at..at + c).map(|i| (x(i) - m).exp()).sum();
        let lse = m + sum.ln();
        for j in 0..c {
            let g = (x(at + j) - lse).exp();
            let g = if j == t as usize { g - 1.0 } else { g };
            write(j, g / n);
        }
        lse - x(at + t as usize)
    };
    // each row's term first, then their sum in row order: the same additions as one loop, so
    // the rows may be shared among the rank's threads (two exponentials an element in f64
    // are ~3 ms of a nanoGPT-mid step)
    let mut terms = crate::cpu::buffer_pool::overwritten::<f64>(rows);
    let grad = if out.dtype() == DType::F32 {
        // every element is written: a pooled buffer as it comes
        let mut g = crate::cpu::buffer_pool::overwritten::<f32>(out.numel());
        let rows_of = |first: usize, gs: &mut [f32], ts: &mut [f64]| {
            for (k, (gr, term)) in gs.chunks_mut(c).zip(ts.iter_mut()).enumerate() {
                *term = row(first + k, &mut |j, v| gr[j] = v as f32);
            }
        };
        let threads = crate::cpu::pool_threads();
        let parallel = out.numel() >= crate::cpu::strided::PARALLEL_MIN && rows >= 2 * threads;
        if threads > 1 && parallel && c > 0 {
            use rayon::prelude::*;
            let block = rows.div_ceil(threads);
            g.par_chunks_mut(block * c)
                .zip(terms.par_chunks_mut(block))
                .enumerate()
                .for_each(|(b, (gs, ts))| rows_of(b * block, gs, ts));
        } else if c > 0 {
            rows_of(0, &mut g, &mut terms);
        }
        Tensor::new(out.shape(), Storage::F32(g))
    } else {
        let mut g = vec![0.0f64; out.numel()];
        for (r, term) in terms.iter_mut().enumerate() {
            *term = row(r, &mut |j, v| g[r * c + j] = v);
        }
        of(out, g)?
    };
    let total = (0..rows)
        .filter(|&r| target(r) != ignore_index)
        .fold(0.0f64, |total, r| total + terms[r]);
    crate::cpu::buffer_pool::give_scratch(terms);
    Ok((total / n, grad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_entropy_gradient_matches_finite_differences() {
        let out = Tensor::from_f32(vec![2, 3], vec![0.2, 0.5, 0.3, 0.1, 0.1, 0.8]);
        let y = Tensor::from_f32(vec![2, 3], vec![1.0, -1.0, 0.5, 0.0, 2.0, -0.5]);
        let (l, g) = loss_and_grad(LossKind::SeedCrossEntropy, &out, Some(&y)).expect("ok");
        // loss is linear in out, so the gradient is exact: check one coordinate
        let mut bumped = out.to_f32_vec();
        bumped[4] += 1.0;
        let (l2, _) = loss_and_grad(
            LossKind::SeedCrossEntropy,
            &Tensor::from_f32(vec![2, 3], bumped),
            Some(&y),
        )
        .expect("ok");
        assert!(((l2 - l) - g.to_f32_vec()[4] as f64).abs() < 1e-5);
        let (s, ones) = loss_and_grad(LossKind::Sum, &out, None).expect("ok");
        assert!((s - 2.0).abs() < 1e-6);
        assert_eq!(ones.to_f32_vec(), vec![1.0; 6]);
    }

    #[test]
    fn integer_cross_entropy_is_pytorchs_over_leading_dims_and_ignores_minus_100() {
        // logits [2, 2, 3]: four rows, the last target ignored
        let out = Tensor::from_f32(
            vec![2, 2, 3],
            vec![1.0, 2.0, 3.0, 0.0, 0.0, 0.0, -1.0, 0.5, 2.0, 4.0, 4.0, 4.0],
        );
        let y = Tensor::new(vec![2, 2], Storage::I64(vec![2, 0, 1, -100]));
        let kind = LossKind::CrossEntropy { ignore_index: -100 };
        let (l, g) = loss_and_grad(kind, &out, Some(&y)).expect("ok");
        let lse = |r: [f64; 3]| r.iter().map(|v| v.exp()).sum::<f64>().ln();
        let want = ((lse([1.0, 2.0, 3.0]) - 3.0)
            + (lse([0.0, 0.0, 0.0]) - 0.0)
            + (lse([-1.0, 0.5, 2.0]) - 0.5))
            / 3.0;
        assert!((l - want).abs() < 1e-12, "{l} vs {want}");
        let g = g.to_f64_vec();
        // the ignored row gets no gradient; each counted row sums to zero
        assert_eq!(&g[9..12], &[0.0, 0.0, 0.0]);
        for r in 0..3 {
            assert!(g[r * 3..r * 3 + 3].iter().sum::<f64>().abs() < 1e-6);
        }
        // finite differences on one logit
        let mut bumped = out.to_f32_vec();
        bumped[4] += 1e-3;
        let (l2, _) =
            loss_and_grad(kind, &Tensor::from_f32(vec![2, 2, 3], bumped), Some(&y)).expect("ok");
        assert!(((l2 - l) / 1e-3 - g[4]).abs() < 1e-3);
        let bad = Tensor::new(vec![2, 2], Storage::I64(vec![2, 0, 3, 0]));
        let e = loss_and_grad(kind, &out, Some(&bad)).unwrap_err();
        assert!(e.contains("target 3 at position 2"), "{e}");
    }

    #[test]
    fn mse_and_output_losses() {
        let out = Tensor::from_f32(vec![2], vec![1.0, 3.0]);
        let y = Tensor::from_f32(vec![2], vec![0.0, 1.0]);
        let (l, g) = loss_and_grad(LossKind::Mse, &out, Some(&y)).expect("ok");
        assert!((l - 2.5).abs() < 1e-12);
        assert_eq!(g.to_f32_vec(), vec![1.0, 2.0]);
        let scalar = Tensor::from_f32(vec![], vec![0.75]);
        let (l, g) = loss_and_grad(LossKind::Output, &scalar, None).expect("ok");
        assert!((l - 0.75).abs() < 1e-12);
        assert_eq!(g.to_f32_vec(), vec![1.0]);
        assert!(loss_and_grad(LossKind::Output, &out, None).is_err());
    }

    #[test]
    fn cross_entropy_shared_among_threads_keeps_the_bits() {
        // large enough to be shared out: 70 rows of 1000 classes, some targets ignored
        let (rows, c) = (70usize, 1000usize);
        let out = Tensor::from_f32(
            vec![rows, c],
            (0..rows * c)
                .map(|i| (i as f32 * 0.013).sin() * 4.0)
                .collect(),
        );
        let targets: Vec<i64> = (0..rows as i64)
            .map(|r| {
                if r % 9 == 4 {
                    -100
                } else {
                    (r * 37) % c as i64
                }
            })
            .collect();
        let y = Tensor::new(vec![rows], Storage::I64(targets));
        let kind = LossKind::CrossEntropy { ignore_index: -100 };
        let (one, par) = crate::cpu::alone_and_in_three_threads(|| {
            let (l, g) = loss_and_grad(kind, &out, Some(&y)).expect("ok");
            (
                l.to_bits(),
                g.to_f32_vec()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
            )
        });
        assert_eq!(one, par);
        // and it is the loss: the mean over the counted rows of lse - x[target]
        let x = out.to_f32_vec();
        let (mut total, mut counted) = (0.0f64, 0usize);
        for r in (0..rows).filter(|r| r % 9 != 4) {
            let row: Vec<f64> = x[r * c..(r + 1) * c]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            total += lse - row[(r * 37) % c];
            counted += 1;
        }
        let want = total / counted as f64;
        assert!(
            (f64::from_bits(one.0) - want).abs() < 1e-9,
            "{} vs {want}",
            f64::from_bits(one.0)
        );
    }
}
