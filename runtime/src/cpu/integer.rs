//! Elementwise arithmetic on integer and bool tensors (counters, index arithmetic such as
//! nanoGPT's `arange(T)[:, None] + 0`), exact in i64 and wrapping on overflow, as PyTorch's
//! integer kernels.

use super::compare::{broadcast_all, broadcast_to, Operand};
use crate::exec::kernel::BinaryOp;
use crate::tensor::Tensor;
use tracepass_ir::DType;

/// `a op (alpha * b)` in i64, the result cast to `dtype` (an integer or bool dtype). `Div` and
/// `Atan2` are refused: on integers they give floats, which the float kernels compute.
pub fn binary_int(
    op: BinaryOp,
    a: Operand<'_>,
    b: Operand<'_>,
    alpha: f64,
    dtype: DType,
) -> Result<Tensor, String> {
    let shapes: smallvec::SmallVec<[&[usize]; 2]> = [a, b]
        .iter()
        .filter_map(|o| match o {
            Operand::Tensor(t) => Some(t.shape()),
            Operand::Scalar(_) => None,
        })
        .collect();
    if shapes.is_empty() {
        return Err("both operands are numbers".into());
    }
    let shape = broadcast_all(&shapes)?;
    let n: usize = shape.iter().product();
    let int = |x: f64, what: &str| -> Result<i64, String> {
        if x.fract() != 0.0 || !x.is_finite() {
            Err(format!("{what} {x} is not an integer"))
        } else {
            Ok(x as i64)
        }
    };
    let values = |o: Operand<'_>| -> Result<Vec<i64>, String> {
        Ok(match o {
            Operand::Tensor(t) => broadcast_to(t, &shape)?.to_i64_vec(),
            Operand::Scalar(s) => crate::cpu::buffer_pool::filled(n, int(s, "operand")?),
        })
    };
    let alpha = int(alpha, "alpha")?;
    let (x, y) = (values(a)?, values(b)?);
    let f: fn(i64, i64, i64) -> Result<i64, String> = match op {
        BinaryOp::Add => |p, q, al| Ok(p.wrapping_add(q.wrapping_mul(al))),
        BinaryOp::Sub => |p, q, al| Ok(p.wrapping_sub(q.wrapping_mul(al))),
        BinaryOp::Mul => |p, q, _| Ok(p.wrapping_mul(q)),
        BinaryOp::Maximum => |p, q, _| Ok(p.max(q)),
        BinaryOp::Minimum => |p, q, _| Ok(p.min(q)),
        // a negative exponent gives 1 / p^|q| truncated, as PyTorch's integer pow: 0 unless
        // p is 1 or -1 (0 as well for p = 0, as PyTorch's CPU kernel gives)
        BinaryOp::Pow => |p, q, _| match u32::try_from(q) {
            Ok(e) => Ok(p.wrapping_pow(e)),
            Err(_) if q > 0 => Err(format!("integer pow with exponent {q}")),
            Err(_) => match p {
                1 => Ok(1),
                -1 => Ok(if q % 2 == 0 { 1 } else { -1 }),
                _ => Ok(0),
            },
        },
        // PyTorch raises ZeroDivisionError for integer division by zero
        BinaryOp::FloorDivide => |p, q, _| {
            if q == 0 {
                return Err("floor_divide: ZeroDivisionError (integer division by zero)".into());
            }
            let d = p.wrapping_div(q);
            Ok(if p.wrapping_rem(q) != 0 && ((p < 0) != (q < 0)) {
                d - 1
            } else {
                d
            })
        },
        BinaryOp::Remainder => |p, q, _| {
            if q == 0 {
                return Err("remainder: ZeroDivisionError (integer division by zero)".into());
            }
            let r = p.wrapping_rem(q);
            Ok(if r != 0 && ((r < 0) != (q < 0)) {
                r + q
            } else {
                r
            })
        },
        BinaryOp::Fmod => |p, q, _| {
            if q == 0 {
                return Err("fmod: ZeroDivisionError (integer division by zero)".into());
            }
            Ok(p.wrapping_rem(q))
        },
        BinaryOp::Div | BinaryOp::Atan2 | BinaryOp::Zeta => {
            return Err(format!("{op:?} of integers computes in floats"))
        }
        BinaryOp::Nextafter => {
            return Err("nextafter of integers: PyTorch defines it for floats only".into())
        }
    };
    let mut out: Vec<i64> = crate::cpu::buffer_pool::take(n);
    for (&p, &q) in x.iter().zip(&y) {
        out.push(f(p, q, alpha)?);
    }
    crate::cpu::buffer_pool::give_scratch(x);
    crate::cpu::buffer_pool::give_scratch(y);
    Tensor::from_i64(shape, out)
        .to_dtype(dtype)
        .ok_or_else(|| format!("cannot convert to {dtype}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_arithmetic_is_exact_and_broadcasts() {
        let a = Tensor::from_i64(vec![2, 1], vec![3, (1 << 60) + 1]);
        let b = Tensor::from_i64(vec![2], vec![1, 2]);
        let r = binary_int(
            BinaryOp::Sub,
            Operand::Tensor(&a),
            Operand::Tensor(&b),
            2.0,
            DType::I64,
        )
        .expect("ok");
        assert_eq!(r.to_i64_vec(), vec![1, -1, (1 << 60) - 1, (1 << 60) - 3]);
        let r = binary_int(
            BinaryOp::Add,
            Operand::Tensor(&a),
            Operand::Scalar(0.0),
            1.0,
            DType::I64,
        )
        .expect("ok");
        assert!(r.bitwise_eq(&a));
        let r = binary_int(
            BinaryOp::Pow,
            Operand::Tensor(&b),
            Operand::Scalar(3.0),
            1.0,
            DType::I32,
        )
        .expect("ok");
        assert_eq!((r.dtype(), r.to_i64_vec()), (DType::I32, vec![1, 8]));
        // negative exponents truncate 1 / p^|q|, as PyTorch's integer pow
        let p = Tensor::from_i64(vec![5], vec![1, -1, -1, 5, 0]);
        let q = Tensor::from_i64(vec![5], vec![-3, -3, -2, -1, -5]);
        let r = binary_int(
            BinaryOp::Pow,
            Operand::Tensor(&p),
            Operand::Tensor(&q),
            1.0,
            DType::I64,
        )
        .expect("ok");
        assert_eq!(r.to_i64_vec(), vec![1, -1, 1, 0, 0]);
        assert!(binary_int(
            BinaryOp::Add,
            Operand::Tensor(&b),
            Operand::Scalar(0.5),
            1.0,
            DType::I64
        )
        .is_err());
        assert!(binary_int(
            BinaryOp::Div,
            Operand::Tensor(&b),
            Operand::Tensor(&b),
            1.0,
            DType::I64
        )
        .is_err());
    }
}
