//! Bitwise and logical `and`/`or`/`xor`, and `bitwise_not`, with broadcasting.

use super::compare::{broadcast_all, broadcast_to, Operand};
use crate::exec::kernel::BitOp;
use crate::tensor::{Storage, Tensor};
use tracepass_ir::DType;

fn shape_of(a: Operand<'_>, b: Operand<'_>) -> Result<crate::tensor::Dims<usize>, String> {
    let shapes: Vec<&[usize]> = [a, b]
        .iter()
        .filter_map(|o| match o {
            Operand::Tensor(t) => Some(t.shape()),
            Operand::Scalar(_) => None,
        })
        .collect();
    if shapes.is_empty() {
        return Err("both operands are numbers".into());
    }
    broadcast_all(&shapes)
}

fn combine(op: BitOp, x: i64, y: i64) -> i64 {
    match op {
        BitOp::And => x & y,
        BitOp::Or => x | y,
        BitOp::Xor => x ^ y,
    }
}

/// `logical_and/or/xor(a, b)`: a bool tensor of the broadcast shape, on the operands'
/// truthiness (`!= 0`; NaN is true), as PyTorch; any dtype.
pub fn logical(op: BitOp, a: Operand<'_>, b: Operand<'_>) -> Result<Tensor, String> {
    let shape = shape_of(a, b)?;
    let n: usize = shape.iter().product();
    let truth = |o: Operand<'_>| -> Result<Vec<i64>, String> {
        Ok(match o {
            Operand::Tensor(t) => {
                let b = t
                    .to_dtype(DType::Bool)
                    .ok_or_else(|| format!("logical op: dtype {} is not supported", t.dtype()))?;
                broadcast_to(&b, &shape)?
                    .to_bool_vec()
                    .into_iter()
                    .map(i64::from)
                    .collect()
            }
            Operand::Scalar(s) => vec![i64::from(s != 0.0); n],
        })
    };
    let (x, y) = (truth(a)?, truth(b)?);
    let out = x
        .iter()
        .zip(&y)
        .map(|(&p, &q)| combine(op, p, q) != 0)
        .collect();
    Ok(Tensor::from_bool(shape, out))
}

/// `bitwise_and/or/xor(a, b)` of integer and bool operands (a number must be an integer or
/// bool), computed in i64 and cast to `dtype` (the promoted integer or bool dtype). Floats
/// are refused, as PyTorch refuses them.
pub fn bitwise(op: BitOp, a: Operand<'_>, b: Operand<'_>, dtype: DType) -> Result<Tensor, String> {
    let name = format!("bitwise_{}", op.name());
    let shape = shape_of(a, b)?;
    let n: usize = shape.iter().product();
    let values = |o: Operand<'_>| -> Result<Vec<i64>, String> {
        match o {
            Operand::Tensor(t) => match t.dtype() {
                DType::I64 | DType::I32 | DType::Bool => Ok(broadcast_to(t, &shape)?.to_i64_vec()),
                other => Err(format!(
                    "{name}: dtype {other} is not an integer or bool type"
                )),
            },
            Operand::Scalar(s) if s.fract() == 0.0 && s.is_finite() => Ok(vec![s as i64; n]),
            Operand::Scalar(s) => Err(format!("{name}: the number {s} is not an integer")),
        }
    };
    if !matches!(dtype, DType::I64 | DType::I32 | DType::Bool) {
        return Err(format!("{name} into {dtype} is not supported"));
    }
    let (x, y) = (values(a)?, values(b)?);
    let out = x.iter().zip(&y).map(|(&p, &q)| combine(op, p, q)).collect();
    Tensor::from_i64(shape, out)
        .to_dtype(dtype)
        .ok_or_else(|| format!("{name}: cannot convert to {dtype}"))
}

/// `bitwise_left_shift` (`left`) or `bitwise_right_shift(a, b)` of integer operands into the
/// promoted integer `dtype`, as PyTorch's CPU kernels: a count below 0 or at least the dtype's
/// width shifts every bit out (left: 0; right: the sign, 0 or -1); the right shift is
/// arithmetic. PyTorch has no bool or float shift, so neither has this.
pub fn shift(left: bool, a: Operand<'_>, b: Operand<'_>, dtype: DType) -> Result<Tensor, String> {
    let name = if left {
        "bitwise_left_shift"
    } else {
        "bitwise_right_shift"
    };
    let bits: i64 = match dtype {
        DType::I64 => 64,
        DType::I32 => 32,
        other => return Err(format!("{name} into {other} is not supported")),
    };
    let shape = shape_of(a, b)?;
    let n: usize = shape.iter().product();
    let values = |o: Operand<'_>| -> Result<Vec<i64>, String> {
        match o {
            Operand::Tensor(t) => match t.dtype() {
                DType::I64 | DType::I32 => Ok(broadcast_to(t, &shape)?.to_i64_vec()),
                other => Err(format!("{name}: dtype {other} is not an integer type")),
            },
            Operand::Scalar(s) if s.fract() == 0.0 && s.is_finite() => Ok(vec![s as i64; n]),
            Operand::Scalar(s) => Err(format!("{name}: the number {s} is not an integer")),
        }
    };
    let (x, y) = (values(a)?, values(b)?);
    let one = |v: i64, c: i64| -> i64 {
        let out_of_range = !(0..bits).contains(&c);
        match (left, bits) {
            (true, _) if out_of_range => 0,
            (false, _) if out_of_range => v >> 63,
            (true, 32) => i64::from((v as i32).wrapping_shl(c as u32)),
            (true, _) => v.wrapping_shl(c as u32),
            (false, 32) => i64::from((v as i32) >> c),
            (false, _) => v >> c,
        }
    };
    Ok(match dtype {
        DType::I32 => {
            let mut out: Vec<i32> = crate::cpu::buffer_pool::take(n);
            out.extend(x.iter().zip(&y).map(|(&v, &c)| one(v, c) as i32));
            Tensor::new(shape, Storage::I32(out))
        }
        _ => {
            let mut out: Vec<i64> = crate::cpu::buffer_pool::take(n);
            out.extend(x.iter().zip(&y).map(|(&v, &c)| one(v, c)));
            Tensor::from_i64(shape, out)
        }
    })
}

/// `bitwise_not(a)`: `!x` for integers, logical not for bools; floats are refused.
pub fn bitwise_not(x: &Tensor) -> Result<Tensor, String> {
    match x.dtype() {
        DType::Bool => Ok(Tensor::from_bool(
            x.shape(),
            x.to_bool_vec().into_iter().map(|b| !b).collect(),
        )),
        d @ (DType::I64 | DType::I32) => {
            Tensor::from_i64(x.shape(), x.to_i64_vec().into_iter().map(|v| !v).collect())
                .to_dtype(d)
                .ok_or_else(|| format!("bitwise_not: cannot convert to {d}"))
        }
        other => Err(format!(
            "bitwise_not: dtype {other} is not an integer or bool type"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_ops_on_integers_and_bools() {
        let a = Tensor::from_i64(vec![2, 3], vec![1, 2, 3, 4, 5, 6]);
        let b = Tensor::from_i64(vec![3], vec![3, -1, 0]);
        let t = |x| Operand::Tensor(x);
        let and = bitwise(BitOp::And, t(&a), t(&b), DType::I64).unwrap();
        assert_eq!(and.to_i64_vec(), vec![1, 2, 0, 0, 5, 0]);
        let or = bitwise(BitOp::Or, t(&a), Operand::Scalar(8.0), DType::I64).unwrap();
        assert_eq!(or.to_i64_vec(), vec![9, 10, 11, 12, 13, 14]);
        let xor = bitwise(BitOp::Xor, t(&a), t(&b), DType::I64).unwrap();
        assert_eq!(xor.to_i64_vec(), vec![2, -3, 3, 7, -6, 6]);
        let p = Tensor::from_bool(vec![3], vec![true, false, true]);
        let q = Tensor::from_bool(vec![3], vec![true, true, false]);
        let x = bitwise(BitOp::Xor, t(&p), t(&q), DType::Bool).unwrap();
        assert_eq!(x.to_bool_vec(), vec![false, true, true]);
        assert_eq!(
            bitwise_not(&p).unwrap().to_bool_vec(),
            vec![false, true, false]
        );
        assert_eq!(bitwise_not(&b).unwrap().to_i64_vec(), vec![-4, 0, -1]);
        let f = Tensor::from_f32(vec![1], vec![1.0]);
        assert!(bitwise(BitOp::And, t(&f), t(&f), DType::F32).is_err());
        assert!(bitwise(BitOp::And, t(&a), Operand::Scalar(0.5), DType::I64).is_err());
        assert!(bitwise_not(&f).is_err());
    }

    /// Expected values from PyTorch's definition: `v << c` wraps in the dtype, `v >> c` is
    /// arithmetic, and a count outside `0..width` gives 0 (left) or the sign fill (right).
    #[test]
    fn shifts_follow_pytorch_for_any_count() {
        let t = |x| Operand::Tensor(x);
        let a = Tensor::from_i64(vec![5], vec![1, -8, 5, -1, 3]);
        let c = Tensor::from_i64(vec![5], vec![0, 1, 64, 70, -1]);
        let l = shift(true, t(&a), t(&c), DType::I64).unwrap();
        assert_eq!(l.to_i64_vec(), vec![1, -16, 0, 0, 0]);
        let r = shift(false, t(&a), t(&c), DType::I64).unwrap();
        assert_eq!(r.to_i64_vec(), vec![1, -4, 0, -1, 0]);
        let a32 = a.to_dtype(DType::I32).unwrap();
        let c32 = Tensor::from_i64(vec![5], vec![31, 32, 33, -1, 2])
            .to_dtype(DType::I32)
            .unwrap();
        let l = shift(true, t(&a32), t(&c32), DType::I32).unwrap();
        assert_eq!(l.dtype(), DType::I32);
        assert_eq!(l.to_i64_vec(), vec![i64::from(i32::MIN), 0, 0, 0, 12]);
        let r = shift(false, t(&a32), t(&c32), DType::I32).unwrap();
        assert_eq!(r.to_i64_vec(), vec![0, -1, 0, -1, 0]);
        // i64 wraps past the top bit; a number as either side broadcasts
        let big = Tensor::from_i64(vec![1], vec![3]);
        let w = shift(true, t(&big), Operand::Scalar(63.0), DType::I64).unwrap();
        assert_eq!(w.to_i64_vec(), vec![i64::MIN]);
        let s = shift(false, Operand::Scalar(-64.0), t(&c), DType::I64).unwrap();
        assert_eq!(s.to_i64_vec(), vec![-64, -32, -1, -1, -1]);
        let p = Tensor::from_bool(vec![1], vec![true]);
        assert!(shift(true, t(&p), t(&p), DType::Bool).is_err());
        assert!(shift(true, t(&a), Operand::Scalar(0.5), DType::I64).is_err());
    }

    #[test]
    fn logical_ops_use_truthiness() {
        let f = Tensor::from_f32(vec![4], vec![0.0, -0.0, 2.5, f32::NAN]);
        let i = Tensor::from_i64(vec![4], vec![0, 1, 0, -3]);
        let t = |x| Operand::Tensor(x);
        let and = logical(BitOp::And, t(&f), t(&i)).unwrap();
        assert_eq!(and.dtype(), DType::Bool);
        assert_eq!(and.to_bool_vec(), vec![false, false, false, true]);
        let or = logical(BitOp::Or, t(&f), t(&i)).unwrap();
        assert_eq!(or.to_bool_vec(), vec![false, true, true, true]);
        let xor = logical(BitOp::Xor, t(&i), Operand::Scalar(1.0)).unwrap();
        assert_eq!(xor.to_bool_vec(), vec![true, false, true, false]);
    }
}
