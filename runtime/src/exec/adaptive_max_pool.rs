//! `adaptive_max_pool1d/2d` and their gradient on any backend, from its own kernels (slices,
//! `argmax`, `gather`, `scatter_add`). PyTorch's window `i` of `n` over `len` elements is
//! `[floor(i * len / n), ceil((i + 1) * len / n))`; the windows may overlap, and each output
//! takes the first maximum of its window in row-major order (`val > max` as the scan goes),
//! where its gradient goes (summed where windows share it).
//!
//! A maximum over a rectangle is a maximum over rows of maxima over columns, and the first in
//! row-major order is the first row's first column: the first argmax of each column window of
//! each row, then the first argmax over each row window of those maxima. With NaN in a window
//! the output is NaN as in PyTorch, but the gradient goes to the first NaN where PyTorch's
//! scan sends it to the last.

use crate::exec::backend::{Backend, Input};
use crate::exec::kernel::{BinaryOp, Kernel, Side};

use crate::exec::composer::{err, Cx, R};

/// Runs [`Kernel::AdaptiveMaxPool`] or [`Kernel::AdaptiveMaxPoolBackward`]; `None` for any
/// other kernel.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let c = Cx { b: backend };
    Some(match (kernel, inputs) {
        (Kernel::AdaptiveMaxPool { out }, [Input::Tensor(x)]) => c.adaptive_max_pool(x, out),
        (Kernel::AdaptiveMaxPoolBackward { dims }, [Input::Tensor(g), Input::Tensor(x)]) => {
            c.adaptive_max_pool_backward(g, x, *dims)
        }
        (Kernel::AdaptiveMaxPool { .. } | Kernel::AdaptiveMaxPoolBackward { .. }, _) => Err(err(
            "adaptive_max_pool",
            "inputs must be the input (and, for the gradient, first the output's gradient)",
        )),
        _ => return None,
    })
}

/// PyTorch's adaptive window `i` of `n` over `len` elements, as `[start, end)`.
pub(crate) fn window(i: usize, n: usize, len: usize) -> (usize, usize) {
    (i * len / n, ((i + 1) * len).div_ceil(n))
}

/// An input as `[P, H, W]` planes (`H = 1` when one dimension is pooled).
struct Planes<T> {
    x: T,
    p: usize,
    h: usize,
    w: usize,
}

impl<B: Backend> Cx<'_, B> {
    fn planes(&self, x: &B::Tensor, dims: usize) -> R<Planes<B::Tensor>> {
        let shape = self.b.shape(x).to_vec();
        let r = shape.len();
        if !(1..=2).contains(&dims) || r <= dims || shape[r - dims..].contains(&0) {
            return Err(err(
                "adaptive_max_pool",
                format!("{dims} pooled dimensions of input {shape:?}"),
            ));
        }
        let (h, w) = if dims == 1 {
            (1, shape[r - 1])
        } else {
            (shape[r - 2], shape[r - 1])
        };
        let p = shape[..r - dims].iter().product();
        Ok(Planes {
            x: self.reshape(x, &[p, h, w])?,
            p,
            h,
            w,
        })
    }

    /// The position along `dim` (1 or 2) of `x`'s `[P, A, B]` first maximum in each of the `n`
    /// adaptive windows along it: i64 `[P, n, B]` or `[P, A, n]`.
    fn window_argmax(&self, x: &B::Tensor, dim: usize, n: usize) -> R<B::Tensor> {
        let shape = self.b.shape(x).to_vec();
        let len = shape[dim];
        let parts = (0..n)
            .map(|i| {
                let (s, e) = window(i, n, len);
                let mut start = vec![0i64; 3];
                let mut end: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                start[dim] = s as i64;
                end[dim] = e as i64;
                let part = self.k(
                    Kernel::Slice {
                        start,
                        end,
                        step: vec![1; 3],
                    },
                    &[x],
                )?;
                let at = self.k(
                    Kernel::ArgExtremum {
                        max: true,
                        dim: Some(dim),
                        keepdim: true,
                    },
                    &[&part],
                )?;
                self.k(
                    Kernel::Binary {
                        op: BinaryOp::Add,
                        a: Side::Input(0),
                        b: Side::Scalar(s as f64),
                        alpha: 1.0,
                    },
                    &[&at],
                )
            })
            .collect::<R<Vec<_>>>()?;
        match &parts[..] {
            [one] => self.k(Kernel::Identity, &[one]),
            _ => {
                let refs: Vec<&B::Tensor> = parts.iter().collect();
                self.k(Kernel::Cat { dim: dim as i64 }, &refs)
            }
        }
    }

    /// The maxima `[P, oh, ow]` and their i64 positions `[P, oh * ow]` in each `H * W` plane.
    fn maxima(&self, p: &Planes<B::Tensor>, oh: usize, ow: usize) -> R<(B::Tensor, B::Tensor)> {
        let cols = self.window_argmax(&p.x, 2, ow)?;
        let row_max = self.k(Kernel::Gather { dim: 2 }, &[&p.x, &cols])?;
        let rows = self.window_argmax(&row_max, 1, oh)?;
        let values = self.k(Kernel::Gather { dim: 1 }, &[&row_max, &rows])?;
        let col = self.k(Kernel::Gather { dim: 1 }, &[&cols, &rows])?;
        let row_start = self.k(
            Kernel::Binary {
                op: BinaryOp::Mul,
                a: Side::Input(0),
                b: Side::Scalar(p.w as f64),
                alpha: 1.0,
            },
            &[&rows],
        )?;
        let pos = self.k(
            Kernel::Binary {
                op: BinaryOp::Add,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha: 1.0,
            },
            &[&row_start, &col],
        )?;
        Ok((values, self.reshape(&pos, &[p.p, oh * ow])?))
    }

    /// The pooling of `x`'s last `out.len()` dimensions to `out`.
    fn adaptive_max_pool(&self, x: &B::Tensor, out: &[usize]) -> R<B::Tensor> {
        if out.contains(&0) {
            return Err(err(
                "adaptive_max_pool",
                format!("output size {out:?} must be positive"),
            ));
        }
        let (oh, ow) = match out {
            [ow] => (1, *ow),
            [oh, ow] => (*oh, *ow),
            _ => {
                return Err(err(
                    "adaptive_max_pool",
                    format!("output size {out:?}: one or two dimensions are pooled"),
                ))
            }
        };
        let p = self.planes(x, out.len())?;
        let (values, _) = self.maxima(&p, oh, ow)?;
        let shape = self.b.shape(x);
        let mut to = shape[..shape.len() - out.len()].to_vec();
        to.extend_from_slice(out);
        self.reshape(&values, &to)
    }

    /// The gradient `g` of the pooling of `x`'s last `dims` dimensions, each element added at
    /// its window's maximum.
    fn adaptive_max_pool_backward(
        &self,
        g: &B::Tensor,
        x: &B::Tensor,
        dims: usize,
    ) -> R<B::Tensor> {
        let p = self.planes(x, dims)?;
        let (gs, xs) = (self.b.shape(g).to_vec(), self.b.shape(x).to_vec());
        let lead = xs.len() - dims;
        if gs.len() != xs.len() || gs[..lead] != xs[..lead] || gs[lead..].contains(&0) {
            return Err(err(
                "adaptive_max_pool_backward",
                format!("gradient {gs:?} does not pool input {xs:?}"),
            ));
        }
        let (oh, ow) = if dims == 1 {
            (1, gs[lead])
        } else {
            (gs[lead], gs[lead + 1])
        };
        let (_, pos) = self.maxima(&p, oh, ow)?;
        let g = self.reshape(g, &[p.p, oh * ow])?;
        let zeros = self.full(&[p.p, p.h * p.w], 0.0, self.b.dtype(&g))?;
        let d = self.k(Kernel::ScatterAdd { dim: 1 }, &[&zeros, &pos, &g])?;
        self.reshape(&d, &xs)
    }
}
