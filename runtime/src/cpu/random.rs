//! Random numbers for dropout: `uniform`, from a counter-based generator keyed by
//! (seed, rank, step, node), so a value depends only on its key and its element index, never on
//! which thread draws it or in what order nodes run.

use crate::tensor::{Elem, Tensor};
use crate::with_elem;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tracepass_ir::DType;

/// What a random tensor's stream is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RngKey {
    pub seed: u64,
    pub rank: u64,
    pub step: u64,
    /// The node's position in its trace (or any id stable across runs).
    pub node: u64,
}

impl RngKey {
    /// The generator for this key: ChaCha8 with the key as its 256-bit seed. ChaCha is
    /// counter-based: word `i` of the stream is a function of (key, i) alone.
    fn rng(&self) -> ChaCha8Rng {
        let mut seed = [0u8; 32];
        for (i, w) in [self.seed, self.rank, self.step, self.node]
            .iter()
            .enumerate()
        {
            seed[i * 8..(i + 1) * 8].copy_from_slice(&w.to_le_bytes());
        }
        ChaCha8Rng::from_seed(seed)
    }
}

/// Thunder's `uniform(shape, minval, maxval, dtype=)` (`torch.empty(...).uniform_`): values
/// in `[minval, maxval)` as `minval + (maxval - minval) * u`, with `u` from 24 random bits for
/// f32/bf16/f16 (computed in f32 and rounded) and 53 for f64, as PyTorch's CPU generator maps
/// its bits.
pub fn uniform(
    shape: &[usize],
    minval: f64,
    maxval: f64,
    dtype: DType,
    key: RngKey,
) -> Result<Tensor, String> {
    if minval > maxval || !minval.is_finite() || !maxval.is_finite() {
        return Err(format!(
            "uniform: the range [{minval}, {maxval}) must be finite and not reversed"
        ));
    }
    let n: usize = shape.iter().product();
    let mut rng = key.rng();
    if dtype == DType::F64 {
        let v: Vec<f64> = (0..n)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
                minval + (maxval - minval) * u
            })
            .collect();
        return Ok(Tensor::new(shape, crate::tensor::Storage::F64(v)));
    }
    let (lo, width) = (minval as f32, (maxval - minval) as f32);
    with_elem!(dtype, T => {
        let v: Vec<T> = (0..n)
            .map(|_| {
                let b = rng.next_u32();
                let u = (b >> 8) as f32 * (1.0 / (1u32 << 24) as f32);
                T::from_f64(f64::from(lo + width * u))
            })
            .collect();
        Ok(Tensor::new(shape, T::wrap(v)))
    }, other => Err(format!("uniform: dtype {other} is not supported by the cpu backend")))
}

/// `randn(shape, dtype=)`: standard normal samples by Box–Muller, element `i` from words
/// `2i` and `2i + 1` of the key's stream (u64 words for f64): `sqrt(-2 ln u1) * cos(2 pi u2)`
/// with `u1` in (0, 1] and `u2` in [0, 1) from 24 (53 for f64) random bits each, computed in
/// f64 and rounded once to `dtype`. Not PyTorch's stream, but as deterministic per key as
/// [`uniform`].
pub fn normal(shape: &[usize], dtype: DType, key: RngKey) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    let mut rng = key.rng();
    let box_muller =
        |u1: f64, u2: f64| (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let v: Vec<f64> = match dtype {
        DType::F64 => (0..n)
            .map(|_| {
                let scale = 1.0 / (1u64 << 53) as f64;
                let u1 = ((rng.next_u64() >> 11) + 1) as f64 * scale;
                let u2 = (rng.next_u64() >> 11) as f64 * scale;
                box_muller(u1, u2)
            })
            .collect(),
        DType::F32 | DType::BF16 | DType::F16 => (0..n)
            .map(|_| {
                let scale = 1.0 / (1u32 << 24) as f64;
                let u1 = f64::from((rng.next_u32() >> 8) + 1) * scale;
                let u2 = f64::from(rng.next_u32() >> 8) * scale;
                box_muller(u1, u2)
            })
            .collect(),
        other => return Err(format!("randn: dtype {other} is not a float type")),
    };
    Tensor::from_f64(shape, v)
        .to_dtype(dtype)
        .ok_or_else(|| format!("randn: cannot round to {dtype}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(node: u64) -> RngKey {
        RngKey {
            seed: 42,
            rank: 1,
            step: 3,
            node,
        }
    }

    #[test]
    fn normal_samples_are_standard_and_keyed() {
        let n = 200_000;
        let a = normal(&[n], DType::F32, key(7)).expect("ok");
        assert!(a.bitwise_eq(&normal(&[n], DType::F32, key(7)).expect("ok")));
        assert!(!a.bitwise_eq(&normal(&[n], DType::F32, key(8)).expect("ok")));
        let v = a.to_f64_vec();
        assert!(v.iter().all(|x| x.is_finite()));
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        // standard errors: 1/sqrt(n) ~ 0.0022 for the mean, sqrt(2/n) ~ 0.0032 for the variance
        assert!(mean.abs() < 0.012, "mean {mean}");
        assert!((var - 1.0).abs() < 0.016, "variance {var}");
        let within1 = v.iter().filter(|x| x.abs() < 1.0).count() as f64 / n as f64;
        assert!(
            (within1 - 0.682_689_492).abs() < 0.005,
            "P(|z| < 1) = {within1}"
        );
        // element 0 from the first two words, as the device code draws it
        let mut rng = key(7).rng();
        let (w1, w2) = (rng.next_u32(), rng.next_u32());
        let u1 = f64::from((w1 >> 8) + 1) / 16_777_216.0;
        let u2 = f64::from(w2 >> 8) / 16_777_216.0;
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        assert_eq!(v[0], z as f32 as f64);
        let d = normal(&[1000], DType::F64, key(1)).expect("f64");
        assert_eq!(d.dtype(), DType::F64);
        assert!(normal(&[3], DType::I64, key(1)).is_err());
    }

    #[test]
    fn streams_are_reproducible_and_distinct_per_key() {
        let a = uniform(&[4, 64], 0.0, 1.0, DType::F32, key(7)).expect("ok");
        let b = uniform(&[4, 64], 0.0, 1.0, DType::F32, key(7)).expect("ok");
        assert!(a.bitwise_eq(&b));
        for other in [
            key(8),
            RngKey { rank: 0, ..key(7) },
            RngKey { step: 4, ..key(7) },
            RngKey { seed: 43, ..key(7) },
        ] {
            let c = uniform(&[4, 64], 0.0, 1.0, DType::F32, other).expect("ok");
            assert!(!a.bitwise_eq(&c), "{other:?}");
        }
        // a longer draw starts with the shorter one: element i depends only on (key, i)
        let long = uniform(&[512], 0.0, 1.0, DType::F32, key(7)).expect("ok");
        assert_eq!(long.to_f32_vec()[..256], a.to_f32_vec()[..]);
        // on another thread, the same values
        let t = std::thread::spawn(|| uniform(&[4, 64], 0.0, 1.0, DType::F32, key(7)))
            .join()
            .expect("thread")
            .expect("ok");
        assert!(t.bitwise_eq(&a));
    }

    #[test]
    fn values_are_uniform_in_range_and_dropout_keeps_one_minus_p() {
        let n = 200_000;
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            let x = uniform(&[n], -2.0, 3.0, dtype, key(1)).expect("ok");
            assert_eq!(x.dtype(), dtype);
            let v = x.to_f64_vec();
            assert!(v.iter().all(|&e| (-2.0..=3.0).contains(&e)), "{dtype}");
            let mean = v.iter().sum::<f64>() / n as f64;
            // mean 0.5, sd 5/sqrt(12); 4 sigma of the sample mean
            assert!(
                (mean - 0.5).abs() < 4.0 * 5.0 / 12f64.sqrt() / (n as f64).sqrt(),
                "{dtype} {mean}"
            );
        }
        // keep = u < 0.9: the keep rate is within 3 sigma of 0.9
        let u = uniform(&[n], 0.0, 1.0, DType::F32, key(2))
            .expect("ok")
            .to_f32_vec();
        let kept = u.iter().filter(|&&e| e < 0.9).count() as f64 / n as f64;
        let sigma = (0.9f64 * 0.1 / n as f64).sqrt();
        assert!((kept - 0.9).abs() < 3.0 * sigma, "{kept}");
        // deciles are even: a chi-square test with 9 degrees of freedom at p = 0.001
        let mut bins = [0f64; 10];
        u.iter().for_each(|&e| bins[(e * 10.0) as usize] += 1.0);
        let expect = n as f64 / 10.0;
        let chi2: f64 = bins.iter().map(|b| (b - expect).powi(2) / expect).sum();
        assert!(chi2 < 27.88, "{chi2} {bins:?}");
        assert!(uniform(&[1], 1.0, 0.0, DType::F32, key(0)).is_err());
    }
}
