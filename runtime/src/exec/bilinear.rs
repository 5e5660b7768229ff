//! `F.bilinear` (`nn.Bilinear`) and its gradient on any backend, from its own kernels (matmul,
//! permutes, broadcast products, sums): `y[n, o] = sum_ij a[n, i] w[o, i, j] b[n, j] + bias[o]`
//! over the leading dimensions flattened to `n`, with
//! `z[n, o, i] = sum_j w[o, i, j] b[n, j]` (one matmul) and `p[n, o, i] = g[n, o] a[n, i]`:
//! `da = sum_o g z`, `db = p @ w`, `dw = p^T @ b`, `dbias = sum_n g`.

use crate::exec::backend::{Backend, Input};
use crate::exec::kernel::{BinaryOp, Kernel, ReduceOp};

use crate::exec::composer::{err, Cx, R};

/// Runs [`Kernel::Bilinear`] (one output) or [`Kernel::BilinearVjp`] (one per gradient);
/// `None` for any other kernel.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<Vec<B::Tensor>>> {
    let c = Cx { b: backend };
    Some(match kernel {
        Kernel::Bilinear { bias } => {
            tensors(inputs, 3 + usize::from(*bias)).and_then(|t| c.bilinear(&t).map(|y| vec![y]))
        }
        Kernel::BilinearVjp { outputs } => {
            tensors(inputs, 4).and_then(|t| c.bilinear_vjp(&t, *outputs))
        }
        _ => return None,
    })
}

fn tensors<'t, T>(inputs: &[Input<'t, T>], n: usize) -> R<Vec<&'t T>> {
    if inputs.len() != n {
        return Err(err("bilinear", format!("{} inputs, not {n}", inputs.len())));
    }
    inputs
        .iter()
        .enumerate()
        .map(|(i, t)| match t {
            Input::Tensor(t) => Ok(*t),
            Input::Scalar(_) => Err(err("bilinear", format!("input {i} must be a tensor"))),
        })
        .collect()
}

/// The operands' sizes: `n` rows (the leading dimensions), `o` outputs, `i`, `j` features.
struct Dims {
    lead: Vec<usize>,
    n: usize,
    o: usize,
    i: usize,
    j: usize,
}

impl<B: Backend> Cx<'_, B> {
    fn sum_dim(&self, x: &B::Tensor, dim: usize) -> R<B::Tensor> {
        let dtype = self.b.dtype(x);
        self.k(
            Kernel::Reduce {
                op: ReduceOp::Sum,
                dims: vec![dim],
                keepdim: false,
                dtype,
            },
            &[x],
        )
    }

    fn bilinear_dims(&self, a: &B::Tensor, b: &B::Tensor, w: &B::Tensor) -> R<Dims> {
        let (sa, sb, sw) = (self.b.shape(a), self.b.shape(b), self.b.shape(w));
        match (sa, sb, sw) {
            ([lead @ .., i], [lead_b @ .., j], [o, wi, wj])
                if lead == lead_b && i == wi && j == wj =>
            {
                Ok(Dims {
                    lead: lead.to_vec(),
                    n: lead.iter().product(),
                    o: *o,
                    i: *i,
                    j: *j,
                })
            }
            _ => Err(err(
                "bilinear",
                format!("inputs {sa:?} and {sb:?} do not fit weight {sw:?}"),
            )),
        }
    }

    /// `z[n, o, i] = sum_j w[o, i, j] b[n, j]`, and `a` as `[n, 1, i]`.
    fn bilinear_z(
        &self,
        d: &Dims,
        a: &B::Tensor,
        b: &B::Tensor,
        w: &B::Tensor,
    ) -> R<(B::Tensor, B::Tensor)> {
        let b2 = self.reshape(b, &[d.n, d.j])?;
        let wt = self.k(Kernel::Permute(vec![2, 0, 1]), &[w])?;
        let wt = self.reshape(&wt, &[d.j, d.o * d.i])?;
        let z = self.matmul(&b2, &wt)?;
        Ok((
            self.reshape(&z, &[d.n, d.o, d.i])?,
            self.reshape(a, &[d.n, 1, d.i])?,
        ))
    }

    fn bilinear(&self, t: &[&B::Tensor]) -> R<B::Tensor> {
        let d = self.bilinear_dims(t[0], t[1], t[2])?;
        let (z, a3) = self.bilinear_z(&d, t[0], t[1], t[2])?;
        let y = self.sum_dim(&self.ew(BinaryOp::Mul, &z, &a3)?, 2)?;
        let y = match t.get(3) {
            Some(bias) => self.ew(BinaryOp::Add, &y, bias)?,
            None => y,
        };
        let mut shape = d.lead.clone();
        shape.push(d.o);
        self.reshape(&y, &shape)
    }

    /// The gradients `outputs` names (input1, input2, weight, bias), in that order, from
    /// inputs `a, b, w, g`.
    fn bilinear_vjp(&self, t: &[&B::Tensor], outputs: [bool; 4]) -> R<Vec<B::Tensor>> {
        let [a, b, w, g] = [t[0], t[1], t[2], t[3]];
        let d = self.bilinear_dims(a, b, w)?;
        let gs = self.b.shape(g).to_vec();
        if gs[..] != [&d.lead[..], &[d.o]].concat()[..] {
            return Err(err(
                "bilinear_vjp",
                format!("gradient {gs:?} is not the output's shape"),
            ));
        }
        let g3 = self.reshape(g, &[d.n, d.o, 1])?;
        let mut out = Vec::new();
        if outputs[0] {
            let (z, _) = self.bilinear_z(&d, a, b, w)?;
            let da = self.sum_dim(&self.ew(BinaryOp::Mul, &g3, &z)?, 1)?;
            out.push(self.reshape(&da, self.b.shape(a))?);
        }
        if outputs[1] || outputs[2] {
            let a3 = self.reshape(a, &[d.n, 1, d.i])?;
            let p = self.ew(BinaryOp::Mul, &g3, &a3)?;
            let p = self.reshape(&p, &[d.n, d.o * d.i])?;
            if outputs[1] {
                let w2 = self.reshape(w, &[d.o * d.i, d.j])?;
                let db = self.matmul(&p, &w2)?;
                out.push(self.reshape(&db, self.b.shape(b))?);
            }
            if outputs[2] {
                let pt = self.k(Kernel::Permute(vec![1, 0]), &[&p])?;
                let b2 = self.reshape(b, &[d.n, d.j])?;
                let dw = self.matmul(&pt, &b2)?;
                out.push(self.reshape(&dw, &[d.o, d.i, d.j])?);
            }
        }
        if outputs[3] {
            let g2 = self.reshape(g, &[d.n, d.o])?;
            out.push(self.sum_dim(&g2, 0)?);
        }
        Ok(out)
    }
}
