//! Loss heads: the loss value and its gradient with respect to the model output.

use crate::cpu;
use crate::model::LossKind;
use crate::tensor::{Storage, Tensor};
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
                    Tensor::new(out.shape().to_vec(), Storage::F64(grad)),
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
                    Tensor::new(out.shape().to_vec(), Storage::F32(grad)),
                )
            };
            let g = grad.to_dtype(out.dtype()).ok_or("output dtype")?;
            Ok((loss, g))
        }
        LossKind::Sum => {
            let loss: f64 = out.to_f64_vec().iter().sum();
            let ones = Tensor::new(
                out.shape().to_vec(),
                Storage::from_f64(out.dtype(), &vec![1.0; out.numel()]).ok_or("output dtype")?,
            );
            Ok((loss, ones))
        }
    }
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
}
