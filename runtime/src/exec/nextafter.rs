//! `nextafter` of bf16 and f16: the neighbour of `a` toward `b` in the 16-bit format, as
//! PyTorch steps the 16-bit representation (`c10::nextafter`, after musl): NaN when either
//! operand is NaN, `b` when they are equal (so `nextafter(0.0, -0.0)` is `-0.0`), the
//! smallest subnormal with `b`'s sign from a zero, and one step of the 16-bit format
//! otherwise (the largest finite from an infinity, an infinity past the largest finite).
//!
//! Every backend runs it from its f32 kernels, which the 16-bit formats are subsets of: the
//! f32 steps up and down from `|a|` (f32's own `nextafter`, exact differences), scaled by
//! `2^(23 - p)` for a format of `p` mantissa bits and floored at its smallest subnormal, are
//! its steps at `a`, in every binade (a power of two steps down by half) and among its
//! subnormals. The sum is exact in f32 and so in the 16-bit result.

use crate::exec::backend::{Backend, Input};
use crate::exec::composer::{err, Cx, R};
use crate::exec::kernel::{BinaryOp, CompareOp, Kernel, Side, UnaryOp};
use tracepass_ir::DType;

/// Runs `kernel` if it is a `nextafter` in bf16 or f16 (every tensor operand of that dtype).
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let Kernel::Binary {
        op: BinaryOp::Nextafter,
        a,
        b,
        ..
    } = kernel
    else {
        return None;
    };
    let side = |s: &Side| match s {
        Side::Scalar(v) => Some(Err(*v)),
        Side::Input(i) => match inputs.get(*i)? {
            Input::Tensor(t) => Some(Ok(*t)),
            Input::Scalar(v) => Some(Err(*v)),
        },
    };
    let (a, b) = (side(a)?, side(b)?);
    let dtypes: Vec<DType> = [&a, &b]
        .iter()
        .filter_map(|s| s.as_ref().ok().map(|t| backend.dtype(t)))
        .collect();
    let dtype = *dtypes.first()?;
    if !matches!(dtype, DType::BF16 | DType::F16) || dtypes.iter().any(|&d| d != dtype) {
        return None;
    }
    let c = Cx { b: backend };
    Some(c.nextafter16(a, b, dtype))
}

/// A 16-bit float format: mantissa bits, smallest subnormal, largest finite.
fn format(dtype: DType) -> (i32, f64, f64) {
    match dtype {
        DType::BF16 => (7, 2f64.powi(-133), 3.3895313892515355e38),
        _ => (10, 2f64.powi(-24), 65504.0),
    }
}

impl<B: Backend> Cx<'_, B> {
    fn nextafter16(
        &self,
        a: Result<&B::Tensor, f64>,
        b: Result<&B::Tensor, f64>,
        dtype: DType,
    ) -> R<B::Tensor> {
        let (p, tiny, max) = format(dtype);
        let shapes: Vec<Vec<usize>> = [&a, &b]
            .iter()
            .filter_map(|s| s.as_ref().ok().map(|t| self.b.shape(t).to_vec()))
            .collect();
        let mut shape = Vec::new();
        for s in &shapes {
            shape = tracepass_ir::broadcast_shapes(&shape, s)
                .ok_or_else(|| err("nextafter", format!("shapes {shapes:?} do not broadcast")))?;
        }
        let to_i64: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        // each operand as an f32 tensor of the common shape (exact: f32 holds both formats)
        let f32_of = |s: Result<&B::Tensor, f64>| -> R<B::Tensor> {
            match s {
                Ok(t) => {
                    let f = self.k(Kernel::Convert(DType::F32), &[t])?;
                    self.k(Kernel::Expand(to_i64.clone()), &[&f])
                }
                // a number is first rounded to the tensor's dtype, as PyTorch wraps it
                Err(v) => {
                    let t = self.full(&shape, v, dtype)?;
                    self.k(Kernel::Convert(DType::F32), &[&t])
                }
            }
        };
        let (x, y) = (f32_of(a)?, f32_of(b)?);
        let bin_s = |op, l: &B::Tensor, s: f64| {
            self.k(
                Kernel::Binary {
                    op,
                    a: Side::Input(0),
                    b: Side::Scalar(s),
                    alpha: 1.0,
                },
                &[l],
            )
        };
        let cmp = |op, l: &B::Tensor, r: Side, inputs: &[&B::Tensor]| {
            self.k(
                Kernel::Compare {
                    op,
                    a: Side::Input(0),
                    b: r,
                },
                &std::iter::once(l)
                    .chain(inputs.iter().copied())
                    .collect::<Vec<_>>(),
            )
        };
        let select = |cond: &B::Tensor, t: &B::Tensor, f: &B::Tensor| {
            self.k(
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Input(2),
                    dtype: DType::F32,
                },
                &[cond, t, f],
            )
        };
        let ax = self.k(Kernel::Unary(UnaryOp::Abs), &[&x])?;
        let scale = 2f64.powi(23 - p);
        // the 16-bit steps away from and toward zero at |x|
        let step = |toward: f64, up: bool| -> R<B::Tensor> {
            let n = bin_s(BinaryOp::Nextafter, &ax, toward)?;
            let d = if up {
                self.ew(BinaryOp::Sub, &n, &ax)?
            } else {
                self.ew(BinaryOp::Sub, &ax, &n)?
            };
            let d = bin_s(BinaryOp::Mul, &d, scale)?;
            bin_s(BinaryOp::Maximum, &d, tiny)
        };
        let (away, inward) = (step(f64::INFINITY, true)?, step(0.0, false)?);
        // up (toward +inf) grows a nonnegative x and shrinks a negative one, as -(|x| - step)
        // so the smallest negative subnormal steps to -0.0; down the reverse
        let nonneg = cmp(CompareOp::Ge, &x, Side::Scalar(0.0), &[])?;
        let pos = cmp(CompareOp::Gt, &x, Side::Scalar(0.0), &[])?;
        let grown = self.ew(BinaryOp::Add, &x, &away)?;
        let shrunk = self.ew(BinaryOp::Sub, &ax, &inward)?;
        let shrunk = self.k(Kernel::Unary(UnaryOp::Neg), &[&shrunk])?;
        let up = select(&nonneg, &grown, &shrunk)?;
        let down = self.ew(BinaryOp::Sub, &x, &select(&pos, &inward, &away)?)?;
        let above = cmp(CompareOp::Lt, &x, Side::Input(1), &[&y])?;
        let below = cmp(CompareOp::Gt, &x, Side::Input(1), &[&y])?;
        // equal operands give y (the sign of a zero y)
        let r = select(&below, &down, &y)?;
        let r = select(&above, &up, &r)?;
        // an infinity moves to the largest finite of its sign
        let infinite = cmp(CompareOp::Eq, &ax, Side::Scalar(f64::INFINITY), &[])?;
        let moves = cmp(CompareOp::Ne, &x, Side::Input(1), &[&y])?;
        let from_inf = self.k(
            Kernel::Where {
                a: Side::Input(1),
                b: Side::Scalar(0.0),
                dtype: DType::Bool,
            },
            &[&infinite, &moves],
        )?;
        let sign = self.k(Kernel::Unary(UnaryOp::Sign), &[&x])?;
        let largest = bin_s(BinaryOp::Mul, &sign, max)?;
        // NaN in, NaN out
        let mut r = select(&from_inf, &largest, &r)?;
        for t in [&x, &y] {
            let nan = cmp(CompareOp::Ne, t, Side::Input(1), &[t])?;
            r = select(&nan, t, &r)?;
        }
        self.k(Kernel::Convert(dtype), &[&r])
    }
}
