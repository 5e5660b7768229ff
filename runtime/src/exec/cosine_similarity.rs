//! `F.cosine_similarity(x1, x2, dim, eps)` and its gradient on any backend, from its own
//! kernels, as PyTorch 2.9 computes it: both operands broadcast, each divided by its norm along
//! `dim` clamped to at least `eps`, the products summed over `dim`. The clamp runs without
//! autograd in PyTorch, so the gradient treats the clamped norm as the norm itself (and a zero
//! norm's gradient as zero, `linalg_vector_norm`'s rule):
//! `dx1 = g x2 / (n1c n2c) - g y x1 / (n1c n1)`, likewise `dx2`, each summed back to its
//! operand's shape.

use crate::exec::backend::{Backend, Input};
use crate::exec::kernel::{BinaryOp, CompareOp, Kernel, ReduceOp, Side, UnaryOp};

use crate::exec::composer::{err, Cx, R};

/// Runs [`Kernel::CosineSimilarity`] (one output) or [`Kernel::CosineSimilarityVjp`] (one per
/// gradient); `None` for any other kernel.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<Vec<B::Tensor>>> {
    let c = Cx { b: backend };
    let t = |n: usize| -> R<Vec<&B::Tensor>> {
        let ts: Vec<&B::Tensor> = inputs
            .iter()
            .filter_map(|i| match i {
                Input::Tensor(t) => Some(*t),
                Input::Scalar(_) => None,
            })
            .collect();
        if ts.len() != n || inputs.len() != n {
            return Err(err("cosine_similarity", format!("needs {n} tensor inputs")));
        }
        Ok(ts)
    };
    Some(match kernel {
        Kernel::CosineSimilarity { dim, eps } => t(2).and_then(|t| {
            let p = c.cosine_parts(t[0], t[1], *dim, *eps)?;
            Ok(vec![p.y])
        }),
        Kernel::CosineSimilarityVjp { dim, eps, outputs } => {
            t(3).and_then(|t| c.cosine_vjp(t[0], t[1], t[2], *dim, *eps, *outputs))
        }
        _ => return None,
    })
}

/// What the forward computes that the gradient reads again (all of the broadcast shape, the
/// norms and `y` kept over `dim` as size 1).
struct Parts<T> {
    x1: T,
    x2: T,
    n1: T,
    n2: T,
    n1c: T,
    n2c: T,
    /// `x1 / n1c`, `x2 / n2c`.
    a: T,
    b: T,
    /// The result, `dim` removed.
    y: T,
    shape: Vec<usize>,
}

impl<B: Backend> Cx<'_, B> {
    pub(crate) fn sum_over(&self, x: &B::Tensor, dims: Vec<usize>, keepdim: bool) -> R<B::Tensor> {
        let dtype = self.b.dtype(x);
        self.k(
            Kernel::Reduce {
                op: ReduceOp::Sum,
                dims,
                keepdim,
                dtype,
            },
            &[x],
        )
    }

    /// `x` expanded to `shape` (its missing leading dimensions first added as 1s).
    pub(crate) fn broadcast_to(&self, x: &B::Tensor, shape: &[usize]) -> R<B::Tensor> {
        let s = self.b.shape(x).to_vec();
        let mut full = vec![1; shape.len() - s.len()];
        full.extend(&s);
        let x = self.reshape(x, &full)?;
        self.k(
            Kernel::Expand(shape.iter().map(|&d| d as i64).collect()),
            &[&x],
        )
    }

    /// `d` of the broadcast shape summed back to `shape`.
    pub(crate) fn sum_to(&self, d: &B::Tensor, shape: &[usize]) -> R<B::Tensor> {
        let full = self.b.shape(d).to_vec();
        let extra = full.len() - shape.len();
        let dims: Vec<usize> = (0..full.len())
            .filter(|&i| i < extra || (shape[i - extra] == 1 && full[i] != 1))
            .collect();
        let d = if dims.is_empty() {
            self.k(Kernel::Identity, &[d])?
        } else {
            self.sum_over(d, dims, true)?
        };
        self.reshape(&d, shape)
    }

    fn cosine_parts(
        &self,
        x1: &B::Tensor,
        x2: &B::Tensor,
        dim: usize,
        eps: f64,
    ) -> R<Parts<B::Tensor>> {
        let (s1, s2) = (self.b.shape(x1).to_vec(), self.b.shape(x2).to_vec());
        let shape = tracepass_ir::broadcast_shapes(&s1, &s2)
            .filter(|s| dim < s.len())
            .ok_or_else(|| {
                err(
                    "cosine_similarity",
                    format!("{s1:?} and {s2:?} do not broadcast, or have no dimension {dim}"),
                )
            })?;
        let x1 = self.broadcast_to(x1, &shape)?;
        let x2 = self.broadcast_to(x2, &shape)?;
        let norm = |x: &B::Tensor| -> R<B::Tensor> {
            let sq = self.ew(BinaryOp::Mul, x, x)?;
            let s = self.sum_over(&sq, vec![dim], true)?;
            self.k(Kernel::Unary(UnaryOp::Sqrt), &[&s])
        };
        let (n1, n2) = (norm(&x1)?, norm(&x2)?);
        let n1c = self.ew_s(BinaryOp::Maximum, &n1, eps)?;
        let n2c = self.ew_s(BinaryOp::Maximum, &n2, eps)?;
        let a = self.ew(BinaryOp::Div, &x1, &n1c)?;
        let b = self.ew(BinaryOp::Div, &x2, &n2c)?;
        let y = self.sum_over(&self.ew(BinaryOp::Mul, &a, &b)?, vec![dim], false)?;
        Ok(Parts {
            x1,
            x2,
            n1,
            n2,
            n1c,
            n2c,
            a,
            b,
            y,
            shape,
        })
    }

    /// The gradients `outputs` names (x1's, x2's), in that order.
    fn cosine_vjp(
        &self,
        x1: &B::Tensor,
        x2: &B::Tensor,
        g: &B::Tensor,
        dim: usize,
        eps: f64,
        outputs: [bool; 2],
    ) -> R<Vec<B::Tensor>> {
        let (s1, s2) = (self.b.shape(x1).to_vec(), self.b.shape(x2).to_vec());
        let p = self.cosine_parts(x1, x2, dim, eps)?;
        let mut kept = p.shape.clone();
        kept[dim] = 1;
        let gs = self.b.shape(g).to_vec();
        let mut want = p.shape.clone();
        want.remove(dim);
        if gs != want {
            return Err(err(
                "cosine_similarity_vjp",
                format!("gradient {gs:?} is not the output's shape {want:?}"),
            ));
        }
        let ge = self.reshape(g, &kept)?;
        let yk = self.reshape(&p.y, &kept)?;
        let gy = self.ew(BinaryOp::Mul, &ge, &yk)?;
        let one = |x: &B::Tensor,
                   other: &B::Tensor,
                   n: &B::Tensor,
                   nc: &B::Tensor,
                   to: &[usize]|
         -> R<B::Tensor> {
            // g other / nc - g y x / (nc n), the second term 0 where n is 0
            let first = self.ew(BinaryOp::Div, &self.ew(BinaryOp::Mul, &ge, other)?, nc)?;
            let denom = self.ew(BinaryOp::Mul, nc, n)?;
            let nonzero = self.k(
                Kernel::Compare {
                    op: CompareOp::Ne,
                    a: Side::Input(0),
                    b: Side::Scalar(0.0),
                },
                &[n],
            )?;
            let inv = self.k(Kernel::Unary(UnaryOp::Reciprocal), &[&denom])?;
            let inv = self.k(
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Scalar(0.0),
                    dtype: self.b.dtype(&inv),
                },
                &[&nonzero, &inv],
            )?;
            let second = self.ew(BinaryOp::Mul, &self.ew(BinaryOp::Mul, &gy, x)?, &inv)?;
            let d = self.ew(BinaryOp::Sub, &first, &second)?;
            self.sum_to(&d, to)
        };
        let mut out = Vec::new();
        if outputs[0] {
            out.push(one(&p.x1, &p.b, &p.n1, &p.n1c, &s1)?);
        }
        if outputs[1] {
            out.push(one(&p.x2, &p.a, &p.n2, &p.n2c, &s2)?);
        }
        Ok(out)
    }
}
