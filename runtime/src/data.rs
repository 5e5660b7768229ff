//! Training data and initial parameters: from safetensors files, or drawn from a seed.

use crate::cpu;
use crate::tensor::{Storage, Tensor};
use crate::tensorfile::{TensorFile, TensorFileError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use tracepass_ir::{DType, Param, TensorType};

/// A deterministic stream per (purpose, a, b), independent of everything else.
fn rng(seed: u64, purpose: u64, a: u64, b: u64) -> StdRng {
    let mut z = seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for x in [a, b] {
        z = (z ^ x).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z ^= z >> 31;
    }
    StdRng::seed_from_u64(z)
}

fn tensor_of(shape: &[usize], dtype: DType, v: Vec<f64>) -> Result<Tensor, String> {
    let s =
        Storage::from_f64(dtype, &v).ok_or_else(|| format!("dtype {dtype} is not supported"))?;
    Ok(Tensor::new(shape.to_vec(), s))
}

/// Where batches come from.
pub enum DataSource {
    /// `x = randn(x_shape)`, `y = randn(y_shape).softmax(dim=1)`, one stream per micro-batch and rank.
    Seeded { seed: u64 },
    /// Tensors `x.<micro-batch>.<rank>` and `y.<micro-batch>.<rank>`.
    File(TensorFile),
}

impl DataSource {
    /// The batch of `rank` for micro-batch `micro` (= step when there is no accumulation).
    pub fn batch(
        &self,
        micro: usize,
        rank: usize,
        x_ty: &TensorType,
        y_shape: Option<&[usize]>,
    ) -> Result<(Tensor, Option<Tensor>), String> {
        match self {
            DataSource::Seeded { seed } => {
                let mut r = rng(*seed, 1, micro as u64, rank as u64);
                let x = values_for("input `x`", &x_ty.shape, || {
                    r.sample::<f64, _>(StandardNormal)
                })?;
                let x = tensor_of(&x_ty.shape, x_ty.dtype, x)?;
                let y = match y_shape {
                    Some(s) => {
                        let n: usize = s.iter().product();
                        let y: Vec<f64> =
                            (0..n).map(|_| r.sample::<f64, _>(StandardNormal)).collect();
                        let y =
                            Tensor::from_f32(s.to_vec(), y.into_iter().map(|v| v as f32).collect());
                        Some(cpu::softmax(&y, 1, false)?)
                    }
                    None => None,
                };
                Ok((x, y))
            }
            DataSource::File(f) => {
                let get = |name: String, shape: &[usize]| -> Result<Tensor, String> {
                    let t = f.get(&name).map_err(|e| e.to_string())?;
                    if t.shape() != shape {
                        return Err(format!(
                            "{}: `{name}` has shape {:?} but the model takes {:?}",
                            f.path.display(),
                            t.shape(),
                            shape
                        ));
                    }
                    Ok(t.clone())
                };
                let x = get(format!("x.{micro}.{rank}"), &x_ty.shape)?;
                let x = if x.dtype() == x_ty.dtype {
                    x
                } else {
                    x.to_dtype(x_ty.dtype).ok_or("x dtype")?
                };
                let y = match y_shape {
                    Some(s) => Some(get(format!("y.{micro}.{rank}"), s)?),
                    None => None,
                };
                Ok((x, y))
            }
        }
    }
}

/// The elements of `shape`, drawn from `next` in order, or an error naming `what` when they
/// cannot be counted or allocated (a failed allocation would abort the process).
fn values_for(
    what: &str,
    shape: &[usize],
    mut next: impl FnMut() -> f64,
) -> Result<Vec<f64>, String> {
    let n = shape
        .iter()
        .try_fold(1usize, |n, d| n.checked_mul(*d))
        .ok_or_else(|| format!("{what}: shape {shape:?} has too many elements to count"))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|e| format!("{what}: cannot allocate {n} values of shape {shape:?} ({e})"))?;
    v.extend((0..n).map(|_| next()));
    Ok(v)
}

/// Initial parameters like `nn.Linear`'s default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the
/// weight and the bias, fan_in taken from the layer's weight. The same on every rank.
pub fn seeded_params(params: &[Param], seed: u64) -> Result<Vec<Tensor>, String> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let fan_in = if p.shape.len() >= 2 {
                p.shape[1..].iter().product::<usize>()
            } else {
                let weight = p.fqn.strip_suffix("bias").map(|m| format!("{m}weight"));
                weight
                    .and_then(|w| params.iter().find(|q| q.fqn == w))
                    .map(|w| w.shape[1..].iter().product::<usize>())
                    .unwrap_or(p.shape.iter().product())
            };
            let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
            let mut r = rng(seed, 2, i as u64, 0);
            let v = values_for(&format!("parameter `{}`", p.fqn), &p.shape, || {
                r.gen_range(-bound..bound)
            })?;
            tensor_of(&p.shape, p.dtype, v)
        })
        .collect()
}

/// Parameters by module path from a safetensors file, checked against the model's.
pub fn file_params(params: &[Param], file: &TensorFile) -> Result<Vec<Tensor>, String> {
    params
        .iter()
        .map(|p| {
            let t = file
                .get(&p.fqn)
                .map_err(|e: TensorFileError| e.to_string())?;
            if t.shape() != p.shape.as_slice() {
                return Err(format!(
                    "{}: parameter `{}` has shape {:?} but the model's is {:?}",
                    file.path.display(),
                    p.fqn,
                    t.shape(),
                    p.shape
                ));
            }
            if t.dtype() == p.dtype {
                Ok(t.clone())
            } else {
                t.to_dtype(p.dtype)
                    .ok_or_else(|| format!("parameter `{}`: cannot convert to {}", p.fqn, p.dtype))
            }
        })
        .collect()
}
