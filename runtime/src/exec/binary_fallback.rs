//! `torch.logaddexp` and `torch.hypot`, torch fallbacks in Thunder 0.2.6, and their gradients on
//! any backend from its elementwise kernels: both operands broadcast, PyTorch's formulas
//! (`derivatives.yaml`: `g / (1 + exp(b - a))` and `g a / hypot(a, b)`), each gradient summed
//! back to its operand's shape. `hypot` is `sqrt(a^2 + b^2)`, which (unlike C's `hypot`)
//! overflows where a square does.

use crate::exec::backend::{Backend, Input};
use crate::exec::composer::{err, Cx, R};
use crate::exec::kernel::{BinaryFallbackOp, BinaryOp, CompareOp, Kernel, Side, UnaryOp};

/// Runs [`Kernel::BinaryFallback`] or [`Kernel::BinaryFallbackVjp`]; `None` for any other.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<Vec<B::Tensor>>> {
    let c = Cx { b: backend };
    let (op, outputs) = match kernel {
        Kernel::BinaryFallback(op) => (*op, None),
        Kernel::BinaryFallbackVjp { op, outputs } => (*op, Some(*outputs)),
        _ => return None,
    };
    let ts: Vec<&B::Tensor> = inputs
        .iter()
        .filter_map(|i| match i {
            Input::Tensor(t) => Some(*t),
            Input::Scalar(_) => None,
        })
        .collect();
    let n = 2 + usize::from(outputs.is_some());
    if ts.len() != n || inputs.len() != n {
        return Some(Err(err(
            "logaddexp/hypot",
            format!("needs {n} tensor inputs"),
        )));
    }
    Some(
        c.binary_fallback(op, ts[0], ts[1])
            .and_then(|(a, b, y)| match outputs {
                None => Ok(vec![y]),
                Some(outputs) => {
                    let g = ts[2];
                    if c.b.shape(g) != c.b.shape(&y) {
                        return Err(err(
                            "logaddexp/hypot vjp",
                            format!(
                                "gradient {:?} is not the output's shape {:?}",
                                c.b.shape(g),
                                c.b.shape(&y)
                            ),
                        ));
                    }
                    let mut out = Vec::new();
                    for (i, (x, other, to)) in
                        [(&a, &b, ts[0]), (&b, &a, ts[1])].into_iter().enumerate()
                    {
                        if !outputs[i] {
                            continue;
                        }
                        let d = match op {
                            // g / (1 + exp(other - x))
                            BinaryFallbackOp::LogAddExp => {
                                let e = c.k(
                                    Kernel::Unary(UnaryOp::Exp),
                                    &[&c.ew(BinaryOp::Sub, other, x)?],
                                )?;
                                c.ew(BinaryOp::Div, g, &c.ew_s(BinaryOp::Add, &e, 1.0)?)?
                            }
                            // g x / y
                            BinaryFallbackOp::Hypot => {
                                c.ew(BinaryOp::Div, &c.ew(BinaryOp::Mul, g, x)?, &y)?
                            }
                        };
                        out.push(c.sum_to(&d, c.b.shape(to))?);
                    }
                    Ok(out)
                }
            }),
    )
}

impl<B: Backend> Cx<'_, B> {
    /// Both operands broadcast, and the result.
    fn binary_fallback(
        &self,
        op: BinaryFallbackOp,
        a: &B::Tensor,
        b: &B::Tensor,
    ) -> R<(B::Tensor, B::Tensor, B::Tensor)> {
        let (sa, sb) = (self.b.shape(a).to_vec(), self.b.shape(b).to_vec());
        let shape = tracepass_ir::broadcast_shapes(&sa, &sb).ok_or_else(|| {
            err(
                "logaddexp/hypot",
                format!("{sa:?} and {sb:?} do not broadcast"),
            )
        })?;
        let a = self.broadcast_to(a, &shape)?;
        let b = self.broadcast_to(b, &shape)?;
        let y = match op {
            BinaryFallbackOp::LogAddExp => {
                let m = self.ew(BinaryOp::Maximum, &a, &b)?;
                let d = self.k(
                    Kernel::Unary(UnaryOp::Abs),
                    &[&self.ew(BinaryOp::Sub, &a, &b)?],
                )?;
                let e = self.k(Kernel::Unary(UnaryOp::Neg), &[&d])?;
                let e = self.k(Kernel::Unary(UnaryOp::Exp), &[&e])?;
                let l = self.ew(
                    BinaryOp::Add,
                    &m,
                    &self.k(Kernel::Unary(UnaryOp::Log1p), &[&e])?,
                )?;
                // |a - b| is NaN where both are the same infinity (the result is it) or either
                // is NaN (max is NaN): the maximum then
                let nan = self.k(
                    Kernel::Compare {
                        op: CompareOp::Ne,
                        a: Side::Input(0),
                        b: Side::Input(1),
                    },
                    &[&d, &d],
                )?;
                self.k(
                    Kernel::Where {
                        a: Side::Input(1),
                        b: Side::Input(2),
                        dtype: self.b.dtype(&m),
                    },
                    &[&nan, &m, &l],
                )?
            }
            BinaryFallbackOp::Hypot => {
                let s = self.ew(
                    BinaryOp::Add,
                    &self.ew(BinaryOp::Mul, &a, &a)?,
                    &self.ew(BinaryOp::Mul, &b, &b)?,
                )?;
                self.k(Kernel::Unary(UnaryOp::Sqrt), &[&s])?
            }
        };
        Ok((a, b, y))
    }
}
