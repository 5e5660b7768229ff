//! Special functions PyTorch has and Rust's `std` and `libm` lack, in f64 (the CPU kernels of
//! float32 and narrower compute in f64 and round once): digamma, trigamma, erfinv, erfcinv,
//! ndtri, Hurwitz zeta. Each is accurate to a few f64 ulps near the values the f32 kernels round from.

use std::f64::consts::{FRAC_2_SQRT_PI, PI, SQRT_2};

/// psi(x) = d/dx ln Gamma(x). Poles (0 and negative integers): -inf at 0, NaN below, as
/// PyTorch.
pub fn digamma(x: f64) -> f64 {
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        };
    }
    if x < 0.0 {
        if x == x.floor() {
            return f64::NAN;
        }
        // reflection: psi(1 - x) - psi(x) = pi / tan(pi x)
        return digamma(1.0 - x) - PI / (PI * x).tan();
    }
    let (mut x, mut acc) = (x, 0.0);
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    let tail = r
        * (1.0 / 12.0
            - r * (1.0 / 120.0
                - r * (1.0 / 252.0 - r * (1.0 / 240.0 - r * (1.0 / 132.0 - r * 691.0 / 32760.0)))));
    acc + x.ln() - 0.5 / x - tail
}

/// psi'(x), PyTorch's `polygamma(1, x)`.
pub fn trigamma(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x <= 0.0 && x == x.floor() {
        return f64::INFINITY;
    }
    if x < 0.0 {
        // reflection: psi1(1 - x) + psi1(x) = pi^2 / sin^2(pi x)
        let s = (PI * x).sin();
        return PI * PI / (s * s) - trigamma(1.0 - x);
    }
    let (mut x, mut acc) = (x, 0.0);
    while x < 10.0 {
        acc += 1.0 / (x * x);
        x += 1.0;
    }
    let r = 1.0 / (x * x);
    let tail = 1.0 / x
        + r / 2.0
        + r / x
            * (1.0 / 6.0 - r * (1.0 / 30.0 - r * (1.0 / 42.0 - r * (1.0 / 30.0 - r * 5.0 / 66.0))));
    acc + tail
}

/// The inverse of erf on (-1, 1); +-inf at +-1, NaN outside.
pub fn erfinv(y: f64) -> f64 {
    if y.is_nan() || !(-1.0..=1.0).contains(&y) {
        return f64::NAN;
    }
    if y == 1.0 {
        return f64::INFINITY;
    }
    if y == -1.0 {
        return f64::NEG_INFINITY;
    }
    if y.abs() > 0.9 {
        // far in the tails erfc keeps the precision 1 - |y| would lose
        let x = erfcinv(1.0 - y.abs());
        return x.copysign(y);
    }
    // Giles' single-precision approximation, then Newton on erf
    let w = -((1.0 - y) * (1.0 + y)).ln();
    let mut x = if w < 5.0 {
        let w = w - 2.5;
        let mut p = 2.810_226_36e-08;
        for c in [
            3.432_739_39e-07,
            -3.523_387_7e-06,
            -4.391_506_54e-06,
            0.000_218_580_87,
            -0.001_253_725_03,
            -0.004_177_681_64,
            0.246_640_727,
            1.501_409_41,
        ] {
            p = c + p * w;
        }
        p * y
    } else {
        let w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in [
            0.000_100_950_558,
            0.001_349_343_22,
            -0.003_673_428_44,
            0.005_739_507_73,
            -0.007_622_461_3,
            0.009_438_870_47,
            1.001_674_06,
            2.832_976_82,
        ] {
            p = c + p * w;
        }
        p * y
    };
    for _ in 0..3 {
        let err = libm::erf(x) - y;
        x -= err / (FRAC_2_SQRT_PI * (-x * x).exp());
    }
    x
}

/// The inverse of erfc on (0, 2); +inf at 0, -inf at 2, NaN outside.
pub fn erfcinv(y: f64) -> f64 {
    if y.is_nan() || !(0.0..=2.0).contains(&y) {
        return f64::NAN;
    }
    if y == 0.0 {
        return f64::INFINITY;
    }
    if y == 2.0 {
        return f64::NEG_INFINITY;
    }
    if y > 1.0 {
        return -erfcinv(2.0 - y);
    }
    if y > 0.1 {
        return erfinv(1.0 - y);
    }
    // tail: start from the asymptotic erfc(x) ~ exp(-x^2) / (x sqrt(pi)), then Newton on erfc
    let t = -(y * PI.sqrt()).ln();
    let mut x = (t - 0.5 * t.ln()).max(0.5).sqrt();
    for _ in 0..40 {
        let e = libm::erfc(x);
        let step = (e - y) / (FRAC_2_SQRT_PI * (-x * x).exp());
        x += step;
        if step.abs() <= 1e-15 * x.abs() {
            break;
        }
    }
    x
}

/// The inverse of the standard normal CDF (`torch.special.ndtri`).
pub fn ndtri(p: f64) -> f64 {
    -SQRT_2 * erfcinv(2.0 * p)
}

/// The Hurwitz zeta function, sum over k >= 0 of (k + q)^-x (`torch.special.zeta`), as
/// Cephes' `zeta` that PyTorch uses: the terms up to a = q + 9, then the Euler-Maclaurin tail.
/// inf at x = 1 and at nonpositive integer q; NaN for x < 1.
pub fn zeta(x: f64, q: f64) -> f64 {
    const MACHEP: f64 = 1.110_223_024_625_156_5e-16;
    const A: [f64; 12] = [
        12.0,
        -720.0,
        30240.0,
        -1_209_600.0,
        47_900_160.0,
        -1.892_437_580_318_379_2e9,
        7.472_424_96e10,
        -2.950_130_727_918_164e12,
        1.164_678_281_435_006_7e14,
        -4.597_978_722_407_473e15,
        1.815_210_540_194_354_7e17,
        -7.166_165_256_175_667e18,
    ];
    if x == 1.0 {
        return f64::INFINITY;
    }
    if x < 1.0 || x.is_nan() || q.is_nan() {
        return f64::NAN;
    }
    if q <= 0.0 {
        if q == q.floor() {
            return f64::INFINITY;
        }
        if x != x.floor() {
            return f64::NAN;
        }
    }
    let mut s = q.powf(-x);
    let (mut a, mut b) = (q, 0.0);
    let mut i = 0;
    while i < 9 || a <= 9.0 {
        i += 1;
        a += 1.0;
        b = a.powf(-x);
        s += b;
        if (b / s).abs() < MACHEP {
            return s;
        }
    }
    let w = a;
    s += b * w / (x - 1.0);
    s -= 0.5 * b;
    let (mut fact, mut k) = (1.0, 0.0);
    for c in A {
        fact *= x + k;
        b /= w;
        let t = fact * b / c;
        s += t;
        if (t / s).abs() < MACHEP {
            return s;
        }
        k += 1.0;
        fact *= x + k;
        b /= w;
        k += 1.0;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn digamma_and_trigamma_match_known_values() {
        // psi(1) = -gamma, psi(0.5) = -gamma - 2 ln 2, psi1(1) = pi^2/6, psi1(0.5) = pi^2/2
        let euler = 0.577_215_664_901_532_9;
        assert!(close(digamma(1.0), -euler), "{}", digamma(1.0));
        assert!(close(digamma(0.5), -euler - 2.0 * 2f64.ln()));
        assert!(close(digamma(-0.5), digamma(1.5) - PI / (PI * -0.5).tan()));
        assert!(close(trigamma(1.0), PI * PI / 6.0), "{}", trigamma(1.0));
        assert!(close(trigamma(0.5), PI * PI / 2.0));
        assert!(digamma(-2.0).is_nan());
        assert_eq!(digamma(0.0), f64::NEG_INFINITY);
    }

    #[test]
    fn zeta_matches_known_values() {
        // zeta(2, 1) = pi^2 / 6, zeta(4, 1) = pi^4 / 90, zeta(2, 2) = pi^2 / 6 - 1
        assert!(close(zeta(2.0, 1.0), PI * PI / 6.0), "{}", zeta(2.0, 1.0));
        assert!(close(zeta(4.0, 1.0), PI.powi(4) / 90.0));
        assert!(close(zeta(2.0, 2.0), PI * PI / 6.0 - 1.0));
        // zeta(3, 0.5) = 7 zeta(3), Apery's constant
        assert!(close(zeta(3.0, 0.5), 7.0 * 1.202_056_903_159_594_3));
        assert_eq!(zeta(1.0, 2.0), f64::INFINITY);
        assert!(zeta(0.5, 2.0).is_nan());
    }

    #[test]
    fn inverses_invert() {
        for y in [
            -0.999_999,
            -0.95,
            -0.5,
            -1e-6,
            0.0,
            0.3,
            0.9,
            0.99,
            0.999_999_9,
        ] {
            assert!(close(libm::erf(erfinv(y)), y), "erfinv({y})");
        }
        for y in [1e-30, 1e-8, 0.05, 0.5, 1.0, 1.5, 1.999_99] {
            let x = erfcinv(y);
            assert!((libm::erfc(x) - y).abs() <= 1e-12 * y, "erfcinv({y}) = {x}");
        }
        assert!(close(ndtri(0.975), 1.959_963_984_540_054));
        assert_eq!(ndtri(0.0), f64::NEG_INFINITY);
        assert!(erfinv(1.5).is_nan());
    }
}
