//! The two element types the CPU backend computes in (f32 for f32/bf16/f16 tensors, f64 for f64).

use crate::tensor::{Storage, Tensor};
use std::borrow::Cow;
use std::ops::{Add, Div, Mul, Neg, Sub};

pub trait Real:
    Copy
    + crate::cpu::buffer_pool::Pooled
    + Send
    + Sync
    + 'static
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    fn of(x: f64) -> Self;
    fn tanh(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn exp_m1(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn atan2(self, o: Self) -> Self;
    fn erf(self) -> Self;
    fn is_nan(self) -> bool;
    /// C's `fmod` (Rust's `%` on floats).
    fn fmod(self, o: Self) -> Self;
    fn floor(self) -> Self;
    /// `f` computed in f64 and rounded once to this type (the elementwise functions the
    /// hardware has no fast path for).
    fn via(self, f: fn(f64) -> f64) -> Self;
    /// `f` of both operands computed in f64, rounded once.
    fn via2(self, o: Self, f: fn(f64, f64) -> f64) -> Self;
    /// The next representable value after `self` toward `o` (C's `nextafter`).
    fn nextafter(self, o: Self) -> Self;
    /// The storage variant holding this type, if `s` is one.
    fn slice(s: &Storage) -> Option<&[Self]>;
    fn storage(v: Vec<Self>) -> Storage;
    /// Elements of `t` in row-major order as this type (borrowed when they already are).
    fn elems(t: &Tensor) -> Cow<'_, [Self]>;
}

macro_rules! real {
    ($t:ty, $variant:ident, $exp:path, $erf:path, $tanh:path, $next:path, $vec:ident) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn of(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                <$t>::exp_m1(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            #[inline(always)]
            fn atan2(self, o: Self) -> Self {
                <$t>::atan2(self, o)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn fmod(self, o: Self) -> Self {
                self % o
            }
            #[inline(always)]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline(always)]
            fn via(self, f: fn(f64) -> f64) -> Self {
                f(self as f64) as $t
            }
            #[inline(always)]
            fn via2(self, o: Self, f: fn(f64, f64) -> f64) -> Self {
                f(self as f64, o as f64) as $t
            }
            #[inline(always)]
            fn nextafter(self, o: Self) -> Self {
                $next(self, o)
            }
            fn slice(s: &Storage) -> Option<&[Self]> {
                match s {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn storage(v: Vec<Self>) -> Storage {
                Storage::$variant(v)
            }
            fn elems(t: &Tensor) -> Cow<'_, [Self]> {
                if t.is_contiguous() {
                    if let Some(v) = Self::slice(t.storage()) {
                        return Cow::Borrowed(&v[t.offset()..t.offset() + t.numel()]);
                    }
                }
                Cow::Owned(t.$vec())
            }
        }
    };
}

real!(
    f32,
    F32,
    super::fast_math::exp_f32,
    super::fast_math::erf_f32,
    super::fast_math::tanh_f32,
    libm::nextafterf,
    to_f32_vec
);
real!(
    f64,
    F64,
    f64::exp,
    libm::erf,
    f64::tanh,
    libm::nextafter,
    to_f64_vec
);
