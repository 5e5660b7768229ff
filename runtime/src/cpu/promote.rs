//! PyTorch's type promotion between the dtypes the CPU backend holds.

use tracepass_ir::DType;

/// The category of a dtype in PyTorch's promotion: bool < integer < float.
fn category(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8 => 1,
        _ => 2,
    }
}

/// `torch.promote_types(a, b)` for two tensors' dtypes: the higher category wins; within
/// floats f64 dominates and f16 with bf16 gives f32; within integers the wider one.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let (ca, cb) = (category(a), category(b));
    if ca != cb {
        return if ca > cb { a } else { b };
    }
    match (a, b) {
        (F64, _) | (_, F64) => F64,
        (F32, _) | (_, F32) => F32,
        (F16, BF16) | (BF16, F16) => F32,
        (I64, _) | (_, I64) => I64,
        (I32, _) | (_, I32) => I32,
        (I16, _) | (_, I16) => I16,
        // u8 with i8 is i16 in PyTorch
        (U8, I8) | (I8, U8) => I16,
        _ => a,
    }
}

/// The dtype of `tensor op number` (a Python number is a "wrapped number": it only raises the
/// category, to the default dtype of its kind).
pub fn promote_with_scalar(t: DType, scalar_is_float: bool) -> DType {
    if scalar_is_float && category(t) < 2 {
        DType::F32
    } else if !scalar_is_float && t == DType::Bool {
        DType::I64
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        use DType::*;
        assert_eq!(promote_types(F16, BF16), F32);
        assert_eq!(promote_types(BF16, F64), F64);
        assert_eq!(promote_types(I64, BF16), BF16);
        assert_eq!(promote_types(Bool, I32), I32);
        assert_eq!(promote_types(I32, I64), I64);
        assert_eq!(promote_types(U8, I8), I16);
        assert_eq!(promote_with_scalar(I64, true), F32);
        assert_eq!(promote_with_scalar(I64, false), I64);
        assert_eq!(promote_with_scalar(BF16, true), BF16);
        assert_eq!(promote_with_scalar(Bool, false), I64);
    }
}
