//! Activations that are not in the unary-op table: `silu`, and those with parameters
//! (`leaky_relu`, `elu`, `celu`, `hardtanh`).

use super::elementwise::map_tensor;
use super::real::Real;
use crate::exec::kernel::Activation;
use crate::tensor::Tensor;
use tracepass_ir::DType;

fn activation_typed<T: Real>(act: Activation, x: &Tensor) -> Tensor {
    let [p0, p1] = act.params().map(T::of);
    match act {
        Activation::LeakyRelu { .. } => map_tensor(x, |e: T| if e > T::ZERO { e } else { e * p0 }),
        Activation::Elu { .. } => {
            map_tensor(x, |e: T| if e <= T::ZERO { e.exp_m1() * p0 } else { e })
        }
        // PyTorch's celu is elu with input scale 1 / alpha (p1)
        Activation::Celu { .. } => map_tensor(x, |e: T| {
            if e <= T::ZERO {
                (e * p1).exp_m1() * p0
            } else {
                e
            }
        }),
        Activation::Hardtanh { .. } => map_tensor(x, |e: T| {
            if e < p0 {
                p0
            } else if e > p1 {
                p1
            } else {
                e
            }
        }),
    }
}

/// An activation with parameters of a float tensor, as PyTorch's CPU kernels compute it: in
/// the compute type (f32 for f32, bf16 and f16, rounded once to the dtype; f64 for f64) with
/// the parameters in it; NaN stays NaN. Integer tensors are refused, as PyTorch refuses them
/// for `leaky_relu`, `elu` and `celu` (and `hardtanh` is kept to floats with them).
pub fn activation(act: Activation, x: &Tensor) -> Result<Tensor, String> {
    let name = act.name();
    match x.dtype() {
        DType::F64 => Ok(activation_typed::<f64>(act, x)),
        DType::F32 => Ok(activation_typed::<f32>(act, x)),
        d @ (DType::BF16 | DType::F16) => activation_typed::<f32>(act, x)
            .to_dtype(d)
            .ok_or_else(|| format!("{name}: cannot round to {d}")),
        other => Err(format!("{name}: dtype {other} is not a float type")),
    }
}

fn silu_typed<T: Real>(x: &Tensor) -> Tensor {
    // PyTorch's formula: x / (1 + exp(-x))
    map_tensor(x, |e: T| e / (T::ONE + (-e).exp()))
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
    fn parametrized_activations_match_pytorch() {
        let xs = [-2.5, -0.5, 0.0, 0.5, 1.0, 2.5, f64::NAN];
        let x = Tensor::from_f32(vec![7], xs.iter().map(|&v| v as f32).collect());
        // torch 2.9.0: F.leaky_relu(x, 0.2), F.elu(x, 0.7), F.celu(x, 0.7),
        // F.hardtanh(x, -1.0, 2.0) on float32, printed with precision=10
        let cases: [(Activation, [f64; 6]); 4] = [
            (
                Activation::LeakyRelu { slope: 0.2 },
                [-0.5, -0.1000000015, 0.0, 0.5, 1.0, 2.5],
            ),
            (
                Activation::Elu { alpha: 0.7 },
                [-0.6425404549, -0.2754285336, 0.0, 0.5, 1.0, 2.5],
            ),
            (
                Activation::Celu { alpha: 0.7 },
                [-0.6803190708, -0.3573208451, 0.0, 0.5, 1.0, 2.5],
            ),
            (
                Activation::Hardtanh {
                    min: -1.0,
                    max: 2.0,
                },
                [-1.0, -0.5, 0.0, 0.5, 1.0, 2.0],
            ),
        ];
        for (act, want) in cases {
            let y = activation(act, &x).expect("float");
            assert_eq!(y.dtype(), DType::F32);
            let got = y.to_f64_vec();
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-9, "{act:?}: {got:?}");
            }
            assert!(got[6].is_nan(), "{act:?} keeps NaN");
            let h = activation(act, &x.to_dtype(DType::BF16).expect("bf16")).expect("bf16");
            assert_eq!(h.dtype(), DType::BF16);
        }
        let i = Tensor::from_i64(vec![2], vec![1, -5]);
        let e = activation(Activation::LeakyRelu { slope: 0.1 }, &i).expect_err("ints");
        assert!(e.contains("leaky_relu") && e.contains("i64"), "{e}");
    }

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
