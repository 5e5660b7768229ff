//! Activations that are not in the unary-op table: `silu`.

use super::real::Real;
use crate::tensor::Tensor;
use tracepass_ir::DType;

fn silu_typed<T: Real>(x: &Tensor) -> Tensor {
    let v = T::elems(x);
    // PyTorch's formula: x / (1 + exp(-x))
    let out: Vec<T> = v.iter().map(|&e| e / (T::ONE + (-e).exp())).collect();
    Tensor::new(x.shape().to_vec(), T::storage(out))
}

/// `torch.nn.functional.silu(x)`: `x * sigmoid(x)`; bf16/f16 compute in f32 and round.
pub fn silu(x: &Tensor) -> Result<Tensor, String> {
    match x.dtype() {
        DType::F64 => Ok(silu_typed::<f64>(x)),
        DType::F32 => Ok(silu_typed::<f32>(x)),
        d @ (DType::BF16 | DType::F16) => silu_typed::<f32>(x)
            .to_dtype(d)
            .ok_or_else(|| format!("silu: cannot round to {d}")),
        other => Err(format!("silu: dtype {other} is not a float type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_values_and_saturation() {
        let x = Tensor::from_f64(vec![4], vec![0.0, 1.0, -1.0, -800.0]);
        let y = silu(&x).expect("ok").to_f64_vec();
        let s = |v: f64| v / (1.0 + (-v).exp());
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 0.7310585786300049).abs() < 1e-15);
        assert!((y[2] - s(-1.0)).abs() < 1e-15);
        assert_eq!(y[3], -0.0);
        let h = silu(&x.to_dtype(DType::BF16).expect("bf16")).expect("ok");
        assert_eq!(h.dtype(), DType::BF16);
        assert!((h.to_f32_vec()[1] - 0.731).abs() < 4e-3);
        assert!(silu(&Tensor::from_i64(vec![1], vec![1])).is_err());
    }
}
