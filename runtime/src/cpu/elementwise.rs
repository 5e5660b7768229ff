//! Elementwise kernels with NumPy broadcasting.

use super::promote::{promote_types, promote_with_scalar};
use super::real::Real;
use super::strided::{self, Strided};
use crate::exec::backend::Input;
use crate::exec::kernel::{BinaryOp, Side, UnaryOp};
use crate::tensor::{is_float, Tensor};
use tracepass_ir::DType;

/// The dtype two operands compute in (PyTorch's promotion among the float types).
pub fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    match (a, b) {
        (x, y) if x == y => x,
        (F64, _) | (_, F64) => F64,
        _ => F32,
    }
}

/// Expands `$body` once per listed variant with `$f` bound to that variant's function, so
/// each loop is compiled for one op (and vectorized where the op allows) instead of matching
/// per element.
macro_rules! per_op {
    ($op:expr, $f:ident => $body:expr; $($variant:path => $func:expr),+ $(,)?) => {
        match $op {
            $($variant => {
                let $f = $func;
                $body
            })+
        }
    };
}

/// [`per_op`] over the unary ops.
macro_rules! for_unary_op {
    ($op:expr, $t:ty, $f:ident => $body:expr) => {
        per_op!($op, $f => $body;
            UnaryOp::Neg => |x: $t| -x,
            UnaryOp::Abs => |x: $t| x.abs(),
            UnaryOp::Exp => |x: $t| x.exp(),
            UnaryOp::Log => |x: $t| x.ln(),
            UnaryOp::Log1p => |x: $t| x.ln_1p(),
            UnaryOp::Expm1 => |x: $t| x.exp_m1(),
            UnaryOp::Sqrt => |x: $t| x.sqrt(),
            UnaryOp::Rsqrt => |x: $t| <$t>::ONE / x.sqrt(),
            UnaryOp::Tanh => |x: $t| x.tanh(),
            UnaryOp::Sigmoid => |x: $t| <$t>::ONE / (<$t>::ONE + (-x).exp()),
            UnaryOp::Relu => |x: $t| if x > <$t>::ZERO { x } else { <$t>::ZERO },
            UnaryOp::Sin => |x: $t| x.sin(),
            UnaryOp::Cos => |x: $t| x.cos(),
            UnaryOp::Reciprocal => |x: $t| <$t>::ONE / x,
            UnaryOp::Sign => |x: $t| {
                if x > <$t>::ZERO {
                    <$t>::ONE
                } else if x < <$t>::ZERO {
                    -<$t>::ONE
                } else {
                    x
                }
            },
            UnaryOp::Erf => |x: $t| x.erf(),
            UnaryOp::Gelu => |x: $t| {
                <$t>::of(0.5)
                    * x
                    * (<$t>::ONE + (x * <$t>::of(std::f64::consts::FRAC_1_SQRT_2)).erf())
            },
            UnaryOp::GeluTanh => |x: $t| {
                let inner = <$t>::of(0.7978845608028654) * (x + <$t>::of(0.044715) * x * x * x);
                <$t>::of(0.5) * x * (<$t>::ONE + inner.tanh())
            },
            UnaryOp::Exp2 => |x: $t| x.via(|x: f64| x.exp2()),
            UnaryOp::Log2 => |x: $t| x.via(|x: f64| x.log2()),
            UnaryOp::Log10 => |x: $t| x.via(|x: f64| x.log10()),
            UnaryOp::Tan => |x: $t| x.via(|x: f64| x.tan()),
            UnaryOp::Asin => |x: $t| x.via(|x: f64| x.asin()),
            UnaryOp::Acos => |x: $t| x.via(|x: f64| x.acos()),
            UnaryOp::Atan => |x: $t| x.via(|x: f64| x.atan()),
            UnaryOp::Sinh => |x: $t| x.via(|x: f64| x.sinh()),
            UnaryOp::Cosh => |x: $t| x.via(|x: f64| x.cosh()),
            UnaryOp::Asinh => |x: $t| x.via(|x: f64| x.asinh()),
            UnaryOp::Acosh => |x: $t| x.via(|x: f64| x.acosh()),
            UnaryOp::Atanh => |x: $t| x.via(|x: f64| x.atanh()),
            UnaryOp::Floor => |x: $t| x.via(|x: f64| x.floor()),
            UnaryOp::Ceil => |x: $t| x.via(|x: f64| x.ceil()),
            UnaryOp::Round => |x: $t| x.via(|x: f64| x.round_ties_even()),
            UnaryOp::Trunc => |x: $t| x.via(|x: f64| x.trunc()),
            UnaryOp::Erfc => |x: $t| x.via(|x: f64| libm::erfc(x)),
            UnaryOp::Relu6 => |x: $t| x.via(|x: f64| if x.is_nan() { x } else { x.clamp(0.0, 6.0) }),
            UnaryOp::Hardswish => |x: $t| x.via(|x: f64| x * (x + 3.0).clamp(0.0, 6.0) / 6.0),
            UnaryOp::Hardsigmoid => |x: $t| x.via(|x: f64| (x + 3.0).clamp(0.0, 6.0) / 6.0),
            UnaryOp::Softplus => |x: $t| x.via(|x: f64| if x > 20.0 { x } else { x.exp().ln_1p() }),
            UnaryOp::Mish => |x: $t| x.via(|x: f64| x * (if x > 20.0 { x } else { x.exp().ln_1p() }).tanh()),
            UnaryOp::Logsigmoid => |x: $t| x.via(|x: f64| x.min(0.0) - (-x.abs()).exp().ln_1p()),
            UnaryOp::Softsign => |x: $t| x.via(|x: f64| x / (1.0 + x.abs())),
            UnaryOp::Tanhshrink => |x: $t| x.via(|x: f64| x - x.tanh()),
            UnaryOp::Selu => |x: $t| x.via(|x: f64| 1.0507009873554805 * if x > 0.0 { x } else { 1.6732632423543772 * x.exp_m1() }),
            UnaryOp::Lgamma => |x: $t| x.via(libm::lgamma),
            UnaryOp::Digamma => |x: $t| x.via(crate::cpu::special::digamma),
            UnaryOp::Trigamma => |x: $t| x.via(crate::cpu::special::trigamma),
            UnaryOp::Erfinv => |x: $t| x.via(crate::cpu::special::erfinv),
            UnaryOp::Erfcinv => |x: $t| x.via(crate::cpu::special::erfcinv),
            UnaryOp::Ndtri => |x: $t| x.via(crate::cpu::special::ndtri),

        )
    };
}

fn map_typed<T: Real>(x: &Tensor, op: UnaryOp) -> Tensor {
    for_unary_op!(op, T, f => map_tensor(x, f))
}

/// `f` of every element of `x` (read in place when strided) into a pooled buffer.
pub(crate) fn map_tensor<T: Real>(x: &Tensor, f: impl Fn(T) -> T + Sync) -> Tensor {
    let v = Strided::<T>::of(x, x.shape());
    let data = strided::map(x.shape(), &v, f);
    v.release();
    Tensor::new(x.shape(), T::storage(data))
}

/// Runs a unary op in the tensor's compute type and returns the tensor's dtype.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor, String> {
    with_compute_type(x.dtype(), |ct| match ct {
        DType::F64 => Ok(map_typed::<f64>(x, op)),
        _ => Ok(map_typed::<f32>(x, op)),
    })
}

/// Computes in f32 or f64 and casts the result to `dtype` (bf16/f16 compute in f32).
fn with_compute_type(
    dtype: DType,
    f: impl FnOnce(DType) -> Result<Tensor, String>,
) -> Result<Tensor, String> {
    let ct = match dtype {
        DType::F64 => DType::F64,
        DType::F32 | DType::BF16 | DType::F16 => DType::F32,
        other => return Err(format!("dtype {other} is not supported by the cpu backend")),
    };
    let out = f(ct)?;
    if out.dtype() == dtype {
        Ok(out)
    } else {
        out.to_dtype(dtype)
            .ok_or_else(|| format!("cannot convert to {dtype}"))
    }
}

/// [`per_op`] over the binary ops `a op (alpha * b)`.
macro_rules! for_binary_op {
    ($op:expr, $t:ty, $alpha:expr, $f:ident => $body:expr) => {{
        let alpha: $t = $alpha;
        per_op!($op, $f => $body;
            BinaryOp::Add => |a: $t, b: $t| a + alpha * b,
            BinaryOp::Sub => |a: $t, b: $t| a - alpha * b,
            BinaryOp::Mul => |a: $t, b: $t| a * b,
            BinaryOp::Div => |a: $t, b: $t| a / b,
            BinaryOp::Pow => |a: $t, b: $t| a.powf(b),
            BinaryOp::Maximum => |a: $t, b: $t| if a.is_nan() || a > b { a } else { b },
            BinaryOp::Minimum => |a: $t, b: $t| if a.is_nan() || a < b { a } else { b },
            BinaryOp::Atan2 => |a: $t, b: $t| a.atan2(b),
            BinaryOp::FloorDivide => |a: $t, b: $t| floor_divide(a, b),
            BinaryOp::Remainder => |a: $t, b: $t| {
                let m = a.fmod(b);
                if m != <$t>::ZERO && ((b < <$t>::ZERO) != (m < <$t>::ZERO)) { m + b } else { m }
            },
            BinaryOp::Fmod => |a: $t, b: $t| a.fmod(b),
            BinaryOp::Nextafter => |a: $t, b: $t| a.nextafter(b),
            BinaryOp::Zeta => |a: $t, b: $t| a.via2(b, super::special::zeta),
        )
    }};
}

/// PyTorch's `div_floor` of floats: `a / b` when `b` is 0, else the exact quotient of
/// `a - fmod(a, b)` by `b`, moved down one where the remainder's sign differs from `b`'s,
/// floored (and rounded to nearest when the division was inexact by more than one half).
#[inline(always)]
fn floor_divide<T: Real>(a: T, b: T) -> T {
    if b == T::ZERO {
        return a / b;
    }
    let m = a.fmod(b);
    let mut div = (a - m) / b;
    if m != T::ZERO && ((b < T::ZERO) != (m < T::ZERO)) {
        div = div - T::ONE;
    }
    if div != T::ZERO {
        let f = div.floor();
        if div - f > T::of(0.5) {
            f + T::ONE
        } else {
            f
        }
    } else {
        // a zero with the sign of a / b
        T::ZERO * (a / b)
    }
}

enum Operand<'a> {
    T(&'a Tensor),
    S(f64),
}

fn pow_scalar<T: Real>(shape: &[usize], v: &Strided<'_, T>, e: f64) -> Vec<T> {
    // PyTorch special-cases these exponents; doing the same keeps results bit-close.
    match e {
        2.0 => strided::map(shape, v, |x: T| x * x),
        3.0 => strided::map(shape, v, |x: T| x * x * x),
        0.5 => strided::map(shape, v, |x: T| x.sqrt()),
        -0.5 => strided::map(shape, v, |x: T| T::ONE / x.sqrt()),
        -1.0 => strided::map(shape, v, |x: T| T::ONE / x),
        -2.0 => strided::map(shape, v, |x: T| T::ONE / (x * x)),
        _ => {
            let e = T::of(e);
            strided::map(shape, v, |x: T| x.powf(e))
        }
    }
}

/// `dst[i] = op(src[i])`, with the unary kernel's own function (so a fusion region gives the
/// unfused kernel's bits; generic, as there, so `Real`'s functions are the ones called).
#[inline(always)]
pub(crate) fn unary_into<T: Real>(op: UnaryOp, src: &[T], dst: &mut [T]) {
    for_unary_op!(op, T, f => dst.iter_mut().zip(src).for_each(|(d, &x)| *d = f(x)))
}

/// `dst[i] = a[i] op (alpha * b[i])`, with the binary kernel's own function.
#[inline(always)]
pub(crate) fn binary_into<T: Real>(op: BinaryOp, alpha: f64, a: &[T], b: &[T], dst: &mut [T]) {
    for_binary_op!(op, T, T::of(alpha), f => dst
        .iter_mut()
        .zip(a.iter().zip(b))
        .for_each(|(d, (&p, &q))| *d = f(p, q)))
}

/// [`binary_into`] with one operand a number: `a[i] op (alpha * y)`, or `x op (alpha * b[i])`
/// (`scalar_first`), the same function on the same values.
#[inline(always)]
pub(crate) fn binary_scalar_into<T: Real>(
    op: BinaryOp,
    alpha: f64,
    (v, y): (&[T], T),
    scalar_first: bool,
    dst: &mut [T],
) {
    for_binary_op!(op, T, T::of(alpha), f => {
        let it = dst.iter_mut().zip(v);
        if scalar_first {
            it.for_each(|(d, &q)| *d = f(y, q))
        } else {
            it.for_each(|(d, &p)| *d = f(p, y))
        }
    })
}

/// `dst[i] = src[i] ** e` as the `pow` kernel computes a literal exponent ([`pow_scalar`]).
#[inline(always)]
pub(crate) fn pow_scalar_into<T: Real>(src: &[T], e: f64, dst: &mut [T]) {
    let it = dst.iter_mut().zip(src);
    match e {
        2.0 => it.for_each(|(d, &x)| *d = x * x),
        3.0 => it.for_each(|(d, &x)| *d = x * x * x),
        0.5 => it.for_each(|(d, &x)| *d = x.sqrt()),
        -0.5 => it.for_each(|(d, &x)| *d = T::ONE / x.sqrt()),
        -1.0 => it.for_each(|(d, &x)| *d = T::ONE / x),
        -2.0 => it.for_each(|(d, &x)| *d = T::ONE / (x * x)),
        _ => {
            let e = T::of(e);
            it.for_each(|(d, &x)| *d = x.powf(e))
        }
    }
}

fn binary_typed<T: Real>(
    op: BinaryOp,
    a: Operand,
    b: Operand,
    alpha: f64,
) -> Result<Tensor, String> {
    Ok(match (a, b) {
        (Operand::T(x), Operand::S(s)) => {
            let v = Strided::<T>::of(x, x.shape());
            let data = if op == BinaryOp::Pow {
                pow_scalar(x.shape(), &v, s)
            } else {
                let s = T::of(s);
                for_binary_op!(op, T, T::of(alpha), f => strided::map(x.shape(), &v, |e| f(e, s)))
            };
            v.release();
            Tensor::new(x.shape(), T::storage(data))
        }
        (Operand::S(s), Operand::T(y)) => {
            let s = T::of(s);
            let v = Strided::<T>::of(y, y.shape());
            let data: Vec<T> =
                for_binary_op!(op, T, T::of(alpha), f => strided::map(y.shape(), &v, |e| f(s, e)));
            v.release();
            Tensor::new(y.shape(), T::storage(data))
        }
        (Operand::T(x), Operand::T(y)) => {
            let out: crate::tensor::Dims<usize> =
                tracepass_ir::broadcast_shapes_in(x.shape(), y.shape()).ok_or_else(|| {
                    format!(
                        "shapes {:?} and {:?} do not broadcast",
                        x.shape(),
                        y.shape()
                    )
                })?;
            let (va, vb) = (Strided::<T>::of(x, &out), Strided::<T>::of(y, &out));
            let data: Vec<T> =
                for_binary_op!(op, T, T::of(alpha), f => strided::zip_map(&out, &va, &vb, f));
            va.release();
            vb.release();
            Tensor::new(out, T::storage(data))
        }
        (Operand::S(_), Operand::S(_)) => return Err("both operands are numbers".into()),
    })
}

fn to_operand<'a>(o: &Operand<'a>) -> super::compare::Operand<'a> {
    match *o {
        Operand::T(t) => super::compare::Operand::Tensor(t),
        Operand::S(s) => super::compare::Operand::Scalar(s),
    }
}

/// A tensor operand converted to f32 (`None` for numbers).
fn f32_operand(o: &Operand<'_>) -> Result<Option<Tensor>, String> {
    match o {
        Operand::T(t) => t
            .to_dtype(DType::F32)
            .map(Some)
            .ok_or_else(|| format!("cannot convert {} to f32", t.dtype())),
        Operand::S(_) => Ok(None),
    }
}

/// The operand, reading `converted` in place of its tensor when there is one.
fn reborrow<'a>(o: Operand<'a>, converted: Option<&'a Tensor>) -> Operand<'a> {
    match (o, converted) {
        (Operand::T(_), Some(t)) => Operand::T(t),
        (o, _) => o,
    }
}

/// `a op (alpha * b)` with broadcasting; numbers take the tensor's dtype, as in PyTorch.
pub fn binary(
    op: BinaryOp,
    a: Side,
    b: Side,
    alpha: f64,
    inputs: &[Input<'_, Tensor>],
) -> Result<Tensor, String> {
    let get = |s: Side| -> Result<Operand, String> {
        match s {
            Side::Scalar(x) => Ok(Operand::S(x)),
            Side::Input(i) => match inputs.get(i) {
                Some(Input::Tensor(t)) => Ok(Operand::T(t)),
                Some(Input::Scalar(x)) => Ok(Operand::S(*x)),
                None => Err(format!("input {i} is missing")),
            },
        }
    };
    let (oa, ob) = (get(a)?, get(b)?);
    let frac = |x: f64| x.fract() != 0.0 || !x.is_finite();
    let dtype = match (&oa, &ob) {
        (Operand::T(x), Operand::T(y)) if is_float(x.dtype()) && is_float(y.dtype()) => {
            promote(x.dtype(), y.dtype())
        }
        (Operand::T(x), Operand::T(y)) => promote_types(x.dtype(), y.dtype()),
        (Operand::T(x), Operand::S(s)) | (Operand::S(s), Operand::T(x)) => {
            promote_with_scalar(x.dtype(), frac(*s) || frac(alpha))
        }
        _ => return Err("both operands are numbers".into()),
    };
    if !is_float(dtype) {
        return match op {
            // true division, atan2 and zeta of integers give the default float type
            BinaryOp::Div | BinaryOp::Atan2 | BinaryOp::Zeta => {
                let fa = f32_operand(&oa)?;
                let fb = f32_operand(&ob)?;
                binary_typed::<f32>(
                    op,
                    reborrow(oa, fa.as_ref()),
                    reborrow(ob, fb.as_ref()),
                    alpha,
                )
            }
            _ => super::integer::binary_int(op, to_operand(&oa), to_operand(&ob), alpha, dtype),
        };
    }
    if op == BinaryOp::Nextafter && !matches!(dtype, DType::F32 | DType::F64) {
        // the next float of a half is not the next float of its f32 compute copy
        return Err(format!(
            "nextafter of {dtype}: the kernel steps f32 and f64 only"
        ));
    }
    with_compute_type(dtype, |ct| match ct {
        DType::F64 => binary_typed::<f64>(op, oa, ob, alpha),
        _ => binary_typed::<f32>(op, oa, ob, alpha),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        let a = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let b = Tensor::from_f32(vec![3], vec![10., 20., 30.]);
        let r = binary(
            BinaryOp::Add,
            Side::Input(0),
            Side::Input(1),
            1.0,
            &[Input::Tensor(&a), Input::Tensor(&b)],
        )
        .expect("broadcasts");
        assert_eq!(r.to_f32_vec(), vec![11., 22., 33., 14., 25., 36.]);
        let c = Tensor::from_f32(vec![2, 1], vec![1., 2.]);
        let r = binary(
            BinaryOp::Mul,
            Side::Input(0),
            Side::Input(1),
            1.0,
            &[Input::Tensor(&c), Input::Tensor(&b)],
        )
        .expect("broadcasts");
        assert_eq!(r.shape(), &[2, 3]);
        assert_eq!(r.to_f32_vec(), vec![10., 20., 30., 20., 40., 60.]);
        let bad = Tensor::from_f32(vec![2], vec![1., 2.]);
        assert!(binary(
            BinaryOp::Add,
            Side::Input(0),
            Side::Input(1),
            1.0,
            &[Input::Tensor(&a), Input::Tensor(&bad)]
        )
        .is_err());
    }

    #[test]
    fn scalars_alpha_and_pow() {
        let a = Tensor::from_f32(vec![3], vec![1., 2., 3.]);
        let r = binary(
            BinaryOp::Sub,
            Side::Scalar(1.0),
            Side::Input(0),
            2.0,
            &[Input::Tensor(&a)],
        )
        .expect("ok");
        assert_eq!(r.to_f32_vec(), vec![-1., -3., -5.]);
        let r = binary(
            BinaryOp::Pow,
            Side::Input(0),
            Side::Scalar(3.0),
            1.0,
            &[Input::Tensor(&a)],
        )
        .expect("ok");
        assert_eq!(r.to_f32_vec(), vec![1., 8., 27.]);
        let h = a.to_dtype(DType::BF16).expect("bf16");
        let r = binary(
            BinaryOp::Mul,
            Side::Input(0),
            Side::Scalar(0.5),
            1.0,
            &[Input::Tensor(&h)],
        )
        .expect("ok");
        assert_eq!(r.dtype(), DType::BF16);
        assert_eq!(r.to_f32_vec(), vec![0.5, 1.0, 1.5]);
    }

    #[test]
    fn integer_operands_promote_like_pytorch() {
        let i = Tensor::from_i64(vec![2], vec![3, 4]);
        let ins = [Input::Tensor(&i)];
        let r = binary(BinaryOp::Add, Side::Input(0), Side::Scalar(0.0), 1.0, &ins).expect("ok");
        assert_eq!((r.dtype(), r.to_i64_vec()), (DType::I64, vec![3, 4]));
        let r = binary(BinaryOp::Mul, Side::Input(0), Side::Scalar(0.5), 1.0, &ins).expect("ok");
        assert_eq!((r.dtype(), r.to_f32_vec()), (DType::F32, vec![1.5, 2.0]));
        let r = binary(BinaryOp::Div, Side::Input(0), Side::Scalar(2.0), 1.0, &ins).expect("ok");
        assert_eq!((r.dtype(), r.to_f32_vec()), (DType::F32, vec![1.5, 2.0]));
        let h = Tensor::from_f32(vec![2], vec![1.0, 2.0])
            .to_dtype(DType::BF16)
            .expect("bf16");
        let r = binary(
            BinaryOp::Add,
            Side::Input(0),
            Side::Input(1),
            1.0,
            &[Input::Tensor(&h), Input::Tensor(&i)],
        )
        .expect("ok");
        assert_eq!((r.dtype(), r.to_f32_vec()), (DType::BF16, vec![4.0, 6.0]));
    }

    #[test]
    fn unary_ops_compute_known_values() {
        let a = Tensor::from_f64(vec![3], vec![-1.0, 0.0, 2.0]);
        assert_eq!(
            unary(UnaryOp::Relu, &a).expect("ok").to_f64_vec(),
            vec![0.0, 0.0, 2.0]
        );
        assert_eq!(
            unary(UnaryOp::Sign, &a).expect("ok").to_f64_vec(),
            vec![-1.0, 0.0, 1.0]
        );
        let t = unary(UnaryOp::Tanh, &a).expect("ok").to_f64_vec();
        assert!((t[2] - 2.0f64.tanh()).abs() < 1e-15);
        let e = unary(UnaryOp::Erf, &a).expect("ok").to_f64_vec();
        assert!((e[0] + 0.8427007929497149).abs() < 1e-12);
    }
}
