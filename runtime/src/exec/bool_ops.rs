//! PyTorch's reductions and accumulations of bool tensors, which every backend runs from its
//! own float kernels: `amax` of bools is `any` and `amin` is `all` (`torch.max` of a bool
//! tensor reaches `amax`), and adding bools is a logical or, so `index_add` and `scatter_add`
//! of bools set a place when it was set or any value sent there is (PyTorch 2.9's CPU
//! kernels: `index_add(a, 0, [0, 1, 1], [False, True, True])` gives `a | [False, True]`).
//! Each converts to f32 (0 or 1, exact), runs the float kernel and compares with 0, so CPU
//! and CUDA agree by construction.

use crate::exec::backend::{Backend, Input};
use crate::exec::composer::{err, Cx, R};
use crate::exec::kernel::{CompareOp, Kernel, ReduceOp, Side};
use tracepass_ir::DType;

/// Runs `kernel` if it is a reduction or an accumulation of bools.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let is_bool = |i: usize| matches!(inputs.get(i), Some(Input::Tensor(t)) if backend.dtype(t) == DType::Bool);
    let c = Cx { b: backend };
    match kernel {
        Kernel::Reduce {
            op: op @ (ReduceOp::Amax | ReduceOp::Amin),
            dims,
            keepdim,
            dtype: DType::Bool,
        } if is_bool(0) => Some(c.bool_extremum(*op, dims, *keepdim, inputs)),
        Kernel::IndexAdd { .. } | Kernel::ScatterAdd { .. } if is_bool(0) => {
            Some(c.bool_accumulate(kernel, inputs))
        }
        _ => None,
    }
}

fn tensor<'t, T>(op: &str, inputs: &[Input<'t, T>], i: usize) -> R<&'t T> {
    match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err(op, format!("input {i} must be a tensor"))),
    }
}

impl<B: Backend> Cx<'_, B> {
    fn as_f32(&self, x: &B::Tensor) -> R<B::Tensor> {
        self.k(Kernel::Convert(DType::F32), &[x])
    }
    fn nonzero(&self, x: &B::Tensor) -> R<B::Tensor> {
        self.k(
            Kernel::Compare {
                op: CompareOp::Ne,
                a: Side::Input(0),
                b: Side::Scalar(0.0),
            },
            &[x],
        )
    }

    /// `amax` (any) or `amin` (all) of a bool tensor: the f32 extremum of its 0s and 1s. A
    /// reduction over no elements is refused by the float kernel, as PyTorch refuses it.
    fn bool_extremum(
        &self,
        op: ReduceOp,
        dims: &[usize],
        keepdim: bool,
        inputs: &[Input<'_, B::Tensor>],
    ) -> R<B::Tensor> {
        let x = self.as_f32(tensor("amax", inputs, 0)?)?;
        let r = self.k(
            Kernel::Reduce {
                op,
                dims: dims.to_vec(),
                keepdim,
                dtype: DType::F32,
            },
            &[&x],
        )?;
        self.nonzero(&r)
    }

    /// `index_add` or `scatter_add` into a bool tensor: the f32 sums of its 0s and 1s and the
    /// values sent to each place (exact below 2^24 writes to one place), nonzero or not.
    fn bool_accumulate(&self, kernel: &Kernel, inputs: &[Input<'_, B::Tensor>]) -> R<B::Tensor> {
        let op = match kernel {
            Kernel::IndexAdd { .. } => "index_add",
            _ => "scatter_add",
        };
        let a = tensor(op, inputs, 0)?;
        let index = tensor(op, inputs, 1)?;
        let src = tensor(op, inputs, 2)?;
        if self.b.dtype(src) != DType::Bool {
            return Err(err(
                op,
                format!(
                    "the values are {}, the input bool; they must agree",
                    self.b.dtype(src)
                ),
            ));
        }
        let (fa, fs) = (self.as_f32(a)?, self.as_f32(src)?);
        let sum = self.k(kernel.clone(), &[&fa, index, &fs])?;
        self.nonzero(&sum)
    }
}
