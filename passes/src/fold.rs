//! Constant folding that gives bit for bit what PyTorch and Python compute, for
//! [`canonicalize`](crate::canonicalize): each function says when a fold is exact and returns
//! `None` otherwise, so a rule never trades a trace's numbers for a shorter trace.
//!
//! - [`tensor_scale_product`]: `(x * c1) * c2` -> `x * (c1*c2)` for a tensor `x`. PyTorch
//!   rounds after each multiplication (in the tensor's dtype; half and bfloat16 through
//!   float32), so one multiplication by the product equals two only where neither rounds:
//!   for floats, both constants are powers of two of magnitude at least one (scaling by one
//!   is exact unless it overflows, and then both overflow to the same infinity), and the
//!   product is finite in the dtype (so no backend rounds the scalar itself); `x * 3.0 * 5.0`
//!   is not folded. For integer tensors, wrapping multiplication is associative, and the
//!   product must fit the dtype (PyTorch refuses a scalar that does not). Never across a
//!   dtype change: a float scalar times an integer tensor is a float tensor.
//! - [`python_arith`]: `a + b`, `a - b`, `a * b` of two number literals, as Python computes
//!   them (a trace's scalar statements are Python arithmetic): integers exactly (no fold
//!   past `i64`), floats in IEEE double, an integer with a float as the float of the integer
//!   (folded only when that conversion is exact, `|i| <= 2^53`), and no fold to a
//!   non-finite result.

use tracepass_ir::{Arg, DType};

/// `c` as a power of two's exponent `k` (`|c| == 2^k`, `k >= 0`), if it is one.
fn scale_exponent(c: &Arg) -> Option<i32> {
    let v = match c {
        Arg::Float(f) => *f,
        // an integer is exact as a float only if it converts back to itself
        Arg::Int(i) => Some(*i as f64).filter(|f| *f as i128 == *i as i128)?,
        _ => return None,
    };
    let a = v.abs();
    if !(a.is_finite() && a >= 1.0) {
        return None;
    }
    let bits = a.to_bits();
    // a power of two has no fraction bits
    (bits & ((1u64 << 52) - 1) == 0).then(|| ((bits >> 52) as i32) - 1023)
}

/// The range of an integer dtype.
fn int_range(dtype: DType) -> Option<(i64, i64)> {
    Some(match dtype {
        DType::I64 => (i64::MIN, i64::MAX),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        _ => return None,
    })
}

/// The largest power-of-two exponent that is finite in a float dtype.
fn max_exponent(dtype: DType) -> Option<i32> {
    match dtype {
        DType::F64 => Some(1023),
        DType::F32 | DType::BF16 => Some(127),
        DType::F16 => Some(15),
        _ => None,
    }
}

/// The one constant `c` with `x * c == (x * c1) * c2` for every tensor `x` of `dtype`, under
/// PyTorch's rounding; `None` where no such fold is exact (see the module's notes).
pub fn tensor_scale_product(dtype: DType, c1: &Arg, c2: &Arg) -> Option<Arg> {
    if let Some((lo, hi)) = int_range(dtype) {
        let (Arg::Int(a), Arg::Int(b)) = (c1, c2) else {
            return None;
        };
        let p = a.checked_mul(*b)?;
        return [*a, *b, p]
            .iter()
            .all(|v| (lo..=hi).contains(v))
            .then_some(Arg::Int(p));
    }
    let max = max_exponent(dtype)?;
    let (k1, k2) = (scale_exponent(c1)?, scale_exponent(c2)?);
    if k1 + k2 > max {
        return None;
    }
    Some(match (c1, c2) {
        (Arg::Int(a), Arg::Int(b)) => Arg::Int(a.checked_mul(*b)?),
        _ => Arg::Float(c1.as_f64()? * c2.as_f64()?),
    })
}

/// A scalar arithmetic operation [`python_arith`] folds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
}

/// `a op b` for two number literals, as Python computes it; `None` where the fold could
/// differ from Python (an integer past `i64`, an integer not exact as a float, a non-finite
/// float, a bool).
pub fn python_arith(op: Arith, a: &Arg, b: &Arg) -> Option<Arg> {
    let float = |x: f64, y: f64| {
        let r = match op {
            Arith::Add => x + y,
            Arith::Sub => x - y,
            Arith::Mul => x * y,
        };
        r.is_finite().then_some(Arg::Float(r))
    };
    // 2^53: every integer up to it is exact as a double
    let exact = |i: i64| (i.unsigned_abs() <= 1 << 53).then_some(i as f64);
    match (a, b) {
        (Arg::Int(x), Arg::Int(y)) => match op {
            Arith::Add => x.checked_add(*y),
            Arith::Sub => x.checked_sub(*y),
            Arith::Mul => x.checked_mul(*y),
        }
        .map(Arg::Int),
        (Arg::Float(x), Arg::Float(y)) if x.is_finite() && y.is_finite() => float(*x, *y),
        (Arg::Int(x), Arg::Float(y)) if y.is_finite() => float(exact(*x)?, *y),
        (Arg::Float(x), Arg::Int(y)) if x.is_finite() => float(*x, exact(*y)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What PyTorch does for `x * c` on a float32 tensor: the scalar in float32, one rounding.
    fn mul_f32(x: f32, c: f64) -> f32 {
        x * c as f32
    }

    #[test]
    fn float_scales_fold_only_where_two_roundings_equal_one() {
        let f = Arg::Float;
        assert_eq!(
            tensor_scale_product(DType::F32, &f(2.0), &f(-4.0)),
            Some(f(-8.0))
        );
        assert_eq!(
            tensor_scale_product(DType::F32, &Arg::Int(2), &Arg::Int(8)),
            Some(Arg::Int(16))
        );
        // not powers of two, below one, zero, beyond the dtype, not numbers
        for (d, a, b) in [
            (DType::F32, f(3.0), f(5.0)),
            (DType::F32, f(0.5), f(0.5)),
            (DType::F32, f(2.0), f(0.0)),
            (DType::F32, f(2f64.powi(100)), f(2f64.powi(28))),
            (DType::F16, f(256.0), f(256.0)),
            (DType::F32, f(f64::INFINITY), f(2.0)),
            (DType::F32, Arg::Int((1 << 53) + 1), f(2.0)),
            (DType::F8E4M3, f(2.0), f(2.0)),
            (DType::Bool, Arg::Int(2), Arg::Int(2)),
        ] {
            assert_eq!(tensor_scale_product(d, &a, &b), None, "{d} {a:?} {b:?}");
        }
        // why: by 3 then by 5 rounds twice, by 15 once, and the results differ
        let x = f32::from_bits(0x3f91_32d9); // 1.1343642
        assert_ne!(mul_f32(mul_f32(x, 3.0), 5.0), mul_f32(x, 15.0));
        // where it folds, it is exact: every float32 bit pattern's class (normal,
        // subnormal, near overflow, zeros, infinities)
        for x in [
            1.1f32,
            -3.7e-40,
            f32::MIN_POSITIVE,
            1.0e38,
            -0.0,
            f32::INFINITY,
            f32::MAX,
        ] {
            for (a, b) in [(2.0, 4.0), (-2.0, 2f64.powi(60)), (1.0, 2f64.powi(127))] {
                let Some(Arg::Float(c)) = tensor_scale_product(DType::F32, &f(a), &f(b)) else {
                    panic!("{a} * {b} folds")
                };
                assert_eq!(
                    mul_f32(mul_f32(x, a), b).to_bits(),
                    mul_f32(x, c).to_bits(),
                    "{x} * {a} * {b}"
                );
            }
        }
    }

    #[test]
    fn integer_scales_fold_within_the_dtype() {
        let i = Arg::Int;
        assert_eq!(tensor_scale_product(DType::I64, &i(3), &i(5)), Some(i(15)));
        assert_eq!(
            tensor_scale_product(DType::I32, &i(1 << 16), &i(1 << 16)),
            None
        );
        assert_eq!(tensor_scale_product(DType::U8, &i(16), &i(16)), None);
        assert_eq!(tensor_scale_product(DType::U8, &i(-1), &i(-1)), None);
        assert_eq!(tensor_scale_product(DType::I64, &i(i64::MAX), &i(2)), None);
        // a float scalar makes an integer tensor a float one: never folded here
        assert_eq!(
            tensor_scale_product(DType::I64, &Arg::Float(2.0), &i(2)),
            None
        );
        // wrapping products are associative: folding keeps the wrapped bits
        let x: i32 = 0x7fff_0001;
        assert_eq!(
            x.wrapping_mul(300).wrapping_mul(7),
            x.wrapping_mul(2100),
            "i32"
        );
    }

    #[test]
    fn scalars_fold_as_python_computes_them() {
        let (i, f) = (Arg::Int, Arg::Float);
        assert_eq!(python_arith(Arith::Mul, &i(6), &i(7)), Some(i(42)));
        assert_eq!(
            python_arith(Arith::Mul, &f(0.1), &f(3.0)),
            Some(f(0.1 * 3.0))
        );
        assert_eq!(python_arith(Arith::Add, &i(1), &f(0.5)), Some(f(1.5)));
        assert_eq!(python_arith(Arith::Sub, &f(0.5), &i(2)), Some(f(-1.5)));
        assert_eq!(python_arith(Arith::Mul, &i(i64::MAX), &i(2)), None);
        assert_eq!(python_arith(Arith::Mul, &i((1 << 53) + 1), &f(1.0)), None);
        assert_eq!(python_arith(Arith::Mul, &f(1e308), &f(10.0)), None);
        assert_eq!(python_arith(Arith::Add, &Arg::Bool(true), &i(1)), None);
    }
}
