//! What the composite ops (`setitem`, `attention`, `vocab_composite`) are written with: a backend
//! and a few of its kernels called on tensors. Each of those modules adds its own methods to
//! [`Cx`]; the ones they all need live here, once.

use crate::exec::backend::{Backend, Input, KernelError};
use crate::exec::kernel::{BinaryOp, Kernel, Side};
use tracepass_ir::DType;

pub(crate) type R<T> = Result<T, KernelError>;

/// An error of the composite `op`, naming it.
pub(crate) fn err(op: &str, m: impl std::fmt::Display) -> KernelError {
    KernelError(format!("{op}: {m}"))
}

/// A backend and the kernels a composite op is made of.
pub(crate) struct Cx<'b, B> {
    pub(crate) b: &'b B,
}

impl<B: Backend> Cx<'_, B> {
    /// Runs `kernel` on tensors.
    pub(crate) fn k(&self, kernel: Kernel, inputs: &[&B::Tensor]) -> R<B::Tensor> {
        let inputs: Vec<Input<'_, B::Tensor>> = inputs.iter().map(|t| Input::Tensor(*t)).collect();
        self.b.run(&kernel, &inputs)
    }
    /// `x op y`, broadcast.
    pub(crate) fn ew(&self, op: BinaryOp, x: &B::Tensor, y: &B::Tensor) -> R<B::Tensor> {
        self.k(
            Kernel::Binary {
                op,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha: 1.0,
            },
            &[x, y],
        )
    }

    /// `x op s`.
    pub(crate) fn ew_s(&self, op: BinaryOp, x: &B::Tensor, s: f64) -> R<B::Tensor> {
        self.k(
            Kernel::Binary {
                op,
                a: Side::Input(0),
                b: Side::Scalar(s),
                alpha: 1.0,
            },
            &[x],
        )
    }

    pub(crate) fn matmul(&self, a: &B::Tensor, b: &B::Tensor) -> R<B::Tensor> {
        self.k(Kernel::Matmul, &[a, b])
    }
    pub(crate) fn reshape(&self, x: &B::Tensor, shape: &[usize]) -> R<B::Tensor> {
        self.k(Kernel::Reshape(shape.to_vec()), &[x])
    }
    pub(crate) fn full(&self, shape: &[usize], value: f64, dtype: DType) -> R<B::Tensor> {
        self.k(
            Kernel::Full {
                shape: shape.to_vec(),
                value,
                dtype,
            },
            &[],
        )
    }
}
