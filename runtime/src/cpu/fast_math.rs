//! Branch-free f32 `exp`, `tanh` and `erf` that the compiler vectorises (libm's `expf`, `tanhf`
//! and `erff` are a call per element; `tanhf` calls `expm1f`, 9% of a nanoGPT step through its
//! tanh-approximated GELU, and `erff` is the exact GELU's). Every f32 kernel's `exp`, `tanh`
//! and `erf` is this one (softmax, sigmoid, SiLU, GELU, the fusion regions), so fused and
//! unfused ops keep the same bits.
//!
//! Accuracy (checked by the tests below on every 97th f32 of the range and at the edges), as
//! PyTorch's CPU kernels (Sleef's `expf_u10`/`tanhf_u10`) are within 1 ulp:
//! - `exp`: at most 1 ulp from the correctly rounded result over [-87.3, 88.7] (normal
//!   results), at most 1 subnormal ulp below; `+inf` past ln(f32::MAX), `0` below ln(2^-150),
//!   `exp(-inf) = 0`, NaN stays NaN.
//! - `tanh`: at most 2 ulp; `tanh(±0) = ±0`, `±inf` gives `±1`, NaN stays NaN.
//! - `erf`: at most 1 ulp over [-4, 4] (erf is ±1 in f32 beyond), as libm's `erff` it is
//!   written from; `erf(±0) = ±0`, `±inf` gives `±1`, NaN stays NaN.

/// `e^x`, branch-free so that the compiler vectorises it (libm's `expf` is a call per element):
/// Cephes' `expf` (range reduction by ln 2 in two parts, a degree-6 polynomial), with the power
/// of two put in by bits as two normal factors so that subnormal results come out right.
/// `e^x` is `+inf` above ln(f32::MAX), `0` below ln(2^-150), NaN for NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // ln(2^-150): below it e^x rounds to 0
    const UNDER: f32 = -103.972_08;
    // round to nearest by adding 1.5 * 2^23 (exact for |x * LOG2E| < 2^22): a plain add the
    // compiler vectorises, where `f32::round` is a libm call on baseline x86-64
    const MAGIC: f32 = 12_582_912.0;
    // past 89, n = 128 and the product below overflows to +inf as it should; the clamp keeps
    // n in [-150, 128] (NaN stays NaN, and is put back at the end)
    let c = x.clamp(UNDER, 89.0);
    let shifted = c * LOG2E + MAGIC;
    let fx = shifted - MAGIC;
    // the integer fx from the bits of `shifted` (its ulp is 1 there): a float-to-int `as`
    // saturates, which the compiler does lane by lane
    let n = shifted.to_bits() as i32 - MAGIC.to_bits() as i32;
    let r = c - fx * C1 - fx * C2;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 5e-1;
    let y = p * z + r + 1.0;
    // 2^n as 2^h * 2^(n - h), each factor normal for n in [-150, 128]; the first product is
    // exact, so the result is rounded once more only where it is subnormal or overflows
    let h = n >> 1;
    // (for NaN, n is junk: the arithmetic wraps and the result is replaced below)
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    let e = y * pow2(h) * pow2(n - h);
    if x < UNDER {
        0.0
    } else if x >= UNDER {
        e
    } else {
        x // NaN
    }
}

/// `tanh(x)`, branch-free: Cephes' odd polynomial below |x| = 0.625, else
/// `1 - 2 / (e^(2|x|) + 1)` with the sign put back.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let small =
        ((((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z
            - 3.333_328e-1)
            * z
            * x
            + x;
    // the sum gives +0 for -0
    let small = small.copysign(x);
    // past |x| = 9, tanh rounds to ±1 in f32; clamping keeps e^-2|x| normal and NaN in NaN
    let e = exp_f32(-2.0 * a.min(9.0));
    let large = ((1.0 - e) / (1.0 + e)).copysign(x);
    if a < 0.625 {
        small
    } else if a >= 0.625 {
        large
    } else {
        x // NaN
    }
}

/// FreeBSD `s_erff.c`'s coefficients (libm's `erff`), lowest degree first.
mod erf_coefficients {
    /// erf on |x| < 0.84375: x + x PP(x²) / QQ(x²).
    pub const PP: [f32; 5] = [
        1.2837917e-1,
        -3.250421e-1,
        -2.848175e-2,
        -5.7702702e-3,
        -2.3763017e-5,
    ];
    pub const QQ: [f32; 6] = [
        1.0,
        3.979172e-1,
        6.502225e-2,
        5.081306e-3,
        1.3249474e-4,
        -3.9602282e-6,
    ];
    /// erf on [0.84375, 1.25): ERX + PA(|x| - 1) / QA(|x| - 1).
    pub const ERX: f32 = 8.450629e-1;
    pub const PA: [f32; 7] = [
        -2.3621186e-3,
        4.148561e-1,
        -3.7220788e-1,
        3.1834662e-1,
        -1.10894695e-1,
        3.5478305e-2,
        -2.1663755e-3,
    ];
    pub const QA: [f32; 7] = [
        1.0,
        1.0642088e-1,
        5.4039794e-1,
        7.1828656e-2,
        1.2617122e-1,
        1.3637084e-2,
        1.19845e-2,
    ];
    /// erfc on [1.25, 1/0.35): e^(-x² - 0.5625 + RA(1/x²) / SA(1/x²)) / x.
    pub const RA: [f32; 8] = [
        -9.864944e-3,
        -6.9385856e-1,
        -1.0558626e1,
        -6.237533e1,
        -1.6239667e2,
        -1.8460509e2,
        -8.128744e1,
        -9.814329,
    ];
    pub const SA: [f32; 9] = [
        1.0,
        1.9651272e1,
        1.3765776e2,
        4.345659e2,
        6.4538727e2,
        4.2900815e2,
        1.08635e2,
        6.5702496,
        -6.0424414e-2,
    ];
    /// erfc from 1/0.35 on, the same form (padded with zeros to RA's and SA's lengths: a
    /// leading zero is exact in Horner's scheme).
    pub const RB: [f32; 8] = [
        -9.864943e-3,
        -7.9928327e-1,
        -1.7757956e1,
        -1.6063638e2,
        -6.3756647e2,
        -1.0250951e3,
        -4.835192e2,
        0.0,
    ];
    pub const SB: [f32; 9] = [
        1.0,
        3.033806e1,
        3.257925e2,
        1.5367296e3,
        3.1998582e3,
        2.5530503e3,
        4.7452853e2,
        -2.2440952e1,
        0.0,
    ];
}

/// `c[0] + x (c[1] + x (c[2] + ...))`.
#[inline(always)]
fn horner<const N: usize>(x: f32, c: [f32; N]) -> f32 {
    c.iter().rev().fold(0.0, |acc, &k| acc * x + k)
}

/// `erf(x)`, branch-free: every lane computes the three pieces of FreeBSD's `erff` (libm's)
/// and keeps the one its |x| falls in: a rational function of x² below |x| = 0.84375, one of
/// |x| - 1 below 1.25, and `1 - erfc(|x|)` above, with erfc's coefficients chosen per lane
/// below or above 1/0.35. Past |x| = 6, erf rounds to ±1 in f32.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    use erf_coefficients::*;
    let z = x * x;
    let small = x + x * (horner(z, PP) / horner(z, QQ));

    let a = x.abs();
    let t = a - 1.0;
    let middle = ERX + horner(t, PA) / horner(t, QA);

    // erfc(c) = e^(-c²) R(1/c²) / c, with c² split at a 12-bit head so that the head's square
    // is exact (as libm does)
    let c = a.min(6.0);
    let w = 1.0 / (c * c);
    let near = c < 1.0 / 0.35;
    let pick = |lo: f32, hi: f32| if near { lo } else { hi };
    let r = horner(w, std::array::from_fn::<f32, 8, _>(|i| pick(RA[i], RB[i])));
    let s = horner(w, std::array::from_fn::<f32, 9, _>(|i| pick(SA[i], SB[i])));
    let head = f32::from_bits(c.to_bits() & 0xffff_e000);
    let erfc = exp_f32(-head * head - 0.5625) * exp_f32((head - c) * (head + c) + r / s) / c;
    let large = 1.0 - erfc;

    let outer = if a < 1.25 { middle } else { large };
    if a < 0.843_75 {
        small
    } else if a >= 0.843_75 {
        outer.copysign(x)
    } else {
        x // NaN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// The worst distance from the correctly rounded `e^x` over every 97th f32 in `[lo, hi]`.
    fn worst_exp_ulps(lo: f32, hi: f32) -> (u32, f32) {
        let mut worst = (0u32, 0f32);
        let halves: [Box<dyn Iterator<Item = u32>>; 2] = if lo < 0.0 && hi > 0.0 {
            [
                Box::new((0..=hi.to_bits()).step_by(97)),
                Box::new((1u32 << 31..=lo.to_bits()).step_by(97)),
            ]
        } else if hi <= 0.0 {
            [
                Box::new((hi.to_bits()..=lo.to_bits()).step_by(97)),
                Box::new(std::iter::empty()),
            ]
        } else {
            [
                Box::new((lo.to_bits()..=hi.to_bits()).step_by(97)),
                Box::new(std::iter::empty()),
            ]
        };
        for bits in halves.into_iter().flatten() {
            let x = f32::from_bits(bits);
            let want = (x as f64).exp() as f32;
            let d = ulps(exp_f32(x), want);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        worst
    }

    #[test]
    fn exp_is_within_one_ulp_of_the_correctly_rounded_value() {
        let (d, x) = worst_exp_ulps(-87.3, 88.722_83);
        assert!(d <= 1, "{d} ulp at {x}");
    }

    #[test]
    fn exp_is_within_one_ulp_where_it_is_subnormal() {
        let (d, x) = worst_exp_ulps(-103.97, -87.34);
        assert!(d <= 1, "{d} ulp at {x}");
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert_eq!(exp_f32(-1e30), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(88.7229), f32::INFINITY);
        assert_eq!(exp_f32(1e30), f32::INFINITY);
        // the largest f32 whose e^x is finite
        assert!(exp_f32(88.722_83).is_finite());
        assert_eq!(exp_f32(88.722_83), (88.722_83f32 as f64).exp() as f32);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(-103.9), (-103.9f32 as f64).exp() as f32);
        assert!(exp_f32(-103.9) > 0.0);
    }

    /// The worst distance of the odd function `got` from the correctly rounded `want` over
    /// every 97th f32 of `[-limit, limit]`, each result checked to have `want`'s sign.
    fn worst_odd_ulps(limit: f32, got: fn(f32) -> f32, want: fn(f64) -> f64) -> (u32, f32) {
        let mut worst = (0u32, 0f32);
        // negative floats have the sign bit set: walk both halves
        let positives = (0..=limit.to_bits()).step_by(97);
        let negatives = (1u32 << 31..=(-limit).to_bits()).step_by(97);
        for bits in positives.chain(negatives) {
            let x = f32::from_bits(bits);
            let (got, want) = (got(x), want(x as f64) as f32);
            assert_eq!(got.is_sign_negative(), want.is_sign_negative(), "{x}");
            let d = ulps(got, want);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        worst
    }

    #[test]
    fn tanh_is_within_two_ulp_of_the_correctly_rounded_value() {
        let worst = worst_odd_ulps(10.0, tanh_f32, f64::tanh);
        assert!(worst.0 <= 2, "{} ulp at {}", worst.0, worst.1);
    }

    #[test]
    fn tanh_edges() {
        assert_eq!(tanh_f32(0.0).to_bits(), 0f32.to_bits());
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(40.0), 1.0);
        assert_eq!(tanh_f32(-40.0), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(1e-30), 1e-30);
        assert_eq!(tanh_f32(f32::MIN_POSITIVE), f32::MIN_POSITIVE);
    }

    #[test]
    fn erf_is_within_one_ulp_of_the_correctly_rounded_value() {
        // past |x| = 4 erf is ±1 in f32 (checked in `erf_edges`)
        let worst = worst_odd_ulps(4.0, erf_f32, libm::erf);
        assert!(worst.0 <= 1, "{} ulp at {}", worst.0, worst.1);
    }

    #[test]
    fn erf_edges() {
        assert_eq!(erf_f32(0.0).to_bits(), 0f32.to_bits());
        assert_eq!(erf_f32(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        for x in [4.0f32, 5.9, 6.0, 7.5, 1e30] {
            assert_eq!(erf_f32(x), 1.0, "{x}");
            assert_eq!(erf_f32(-x), -1.0, "{x}");
        }
        assert!(erf_f32(f32::NAN).is_nan());
        assert!(ulps(erf_f32(1e-30), libm::erf(1e-30f32 as f64) as f32) <= 1);
        // the subnormals: erf(x) is 2x/sqrt(pi) rounded, within one subnormal step
        let tiny = f32::from_bits(12345);
        assert!(ulps(erf_f32(tiny), libm::erf(tiny as f64) as f32) <= 1);
    }
}
