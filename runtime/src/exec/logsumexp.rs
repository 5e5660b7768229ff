//! `torch.logsumexp`, which every backend runs from its own kernels as PyTorch's CPU kernel
//! composes it (`aten/src/ATen/native/ReduceOps.cpp`, `logsumexp_out_impl`): the max over
//! the dims, set to 0 where infinite (so a row of `-inf` gives `-inf` and one with `+inf`
//! gives `+inf`, not NaN), then `log(sum(exp(x - max))) + max`. Each step is one kernel in the
//! result's dtype, rounding there as PyTorch's eager ops do; integers and bools are first
//! converted to the result's float dtype (the default float, as the meta gives).

use crate::exec::backend::{Backend, Input};
use crate::exec::composer::{err, Cx, R};
use crate::exec::kernel::{BinaryOp, CompareOp, Kernel, ReduceOp, Side, UnaryOp};
use tracepass_ir::DType;

/// Runs `kernel` if it is a [`Kernel::Logsumexp`].
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let Kernel::Logsumexp {
        dims,
        keepdim,
        dtype,
    } = kernel
    else {
        return None;
    };
    let c = Cx { b: backend };
    Some(match inputs.first() {
        Some(Input::Tensor(x)) => c.logsumexp(x, dims, *keepdim, *dtype),
        _ => Err(err("logsumexp", "input 0 must be a tensor")),
    })
}

impl<B: Backend> Cx<'_, B> {
    fn logsumexp(
        &self,
        x: &B::Tensor,
        dims: &[usize],
        keepdim: bool,
        dtype: DType,
    ) -> R<B::Tensor> {
        if !dtype.is_float() {
            return Err(err(
                "logsumexp",
                format!("the result dtype {dtype} is not a float"),
            ));
        }
        let x = if self.b.dtype(x) == dtype {
            x.clone()
        } else {
            self.k(Kernel::Convert(dtype), &[x])?
        };
        let reduce = |op, keepdim, t: &B::Tensor| {
            self.k(
                Kernel::Reduce {
                    op,
                    dims: dims.to_vec(),
                    keepdim,
                    dtype,
                },
                &[t],
            )
        };
        let unary = |op, t: &B::Tensor| self.k(Kernel::Unary(op), &[t]);
        if self.b.shape(&x).contains(&0) {
            // no max of no elements: PyTorch takes log(sum(exp(x))) (-inf where empty)
            let e = unary(UnaryOp::Exp, &x)?;
            return unary(UnaryOp::Log, &reduce(ReduceOp::Sum, keepdim, &e)?);
        }
        let max = reduce(ReduceOp::Amax, true, &x)?;
        let abs = unary(UnaryOp::Abs, &max)?;
        let infinite = self.k(
            Kernel::Compare {
                op: CompareOp::Eq,
                a: Side::Input(0),
                b: Side::Scalar(f64::INFINITY),
            },
            &[&abs],
        )?;
        let max = self.k(
            Kernel::Where {
                a: Side::Scalar(0.0),
                b: Side::Input(1),
                dtype,
            },
            &[&infinite, &max],
        )?;
        let shifted = self.ew(BinaryOp::Sub, &x, &max)?;
        let e = unary(UnaryOp::Exp, &shifted)?;
        let sum = reduce(ReduceOp::Sum, keepdim, &e)?;
        let log = unary(UnaryOp::Log, &sum)?;
        let max = if keepdim {
            max
        } else {
            let shape = self.b.shape(&log).to_vec();
            self.reshape(&max, &shape)?
        };
        self.ew(BinaryOp::Add, &log, &max)
    }
}
