//! `nn.MultiheadAttention`'s `F.multi_head_attention_forward` and its gradient, on any backend
//! from its own kernels (linear, matmul, softmax and its backward, permutes, reductions), as
//! PyTorch 2.9 computes them when the weights are asked for: the packed projection split into
//! query, key and value rows; `q * sqrt(1 / head_dim)`; `softmax(q k^T)`; the heads' outputs
//! joined and projected; the weights averaged over heads (or not).
//!
//! Shapes: query `[L, N, E]`, key and value `[S, N, E]` (`[L, E]`, `[S, E]` unbatched: one
//! batch of 1), `H` heads of `D = E / H`.

use crate::exec::backend::{Backend, Input, KernelError};
use crate::exec::kernel::{BinaryOp, Kernel, Mha, ReduceOp, Side};

use crate::exec::composer::{Cx, R};

fn err(m: impl std::fmt::Display) -> KernelError {
    crate::exec::composer::err("multi_head_attention_forward", m)
}

/// Runs [`Kernel::MultiHeadAttention`] or [`Kernel::MultiHeadAttentionVjp`], one tensor per
/// output; `None` for any other kernel.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<Vec<B::Tensor>>> {
    let c = Cx { b: backend };
    Some(match kernel {
        Kernel::MultiHeadAttention(m) => c.forward(*m, inputs).map(|f| {
            let Forward { out, weights, .. } = f;
            vec![out, weights]
        }),
        Kernel::MultiHeadAttentionVjp { mha, outputs } => c.vjp(*mha, outputs, inputs),
        _ => return None,
    })
}

fn tensors<'t, T>(inputs: &[Input<'t, T>], n: usize) -> R<Vec<&'t T>> {
    (0..n)
        .map(|i| match inputs.get(i) {
            Some(Input::Tensor(t)) => Ok(*t),
            _ => Err(err(format!("input {i} must be a tensor"))),
        })
        .collect()
}

/// The sizes of one call.
#[derive(Clone, Copy)]
struct Dims {
    l: usize,
    s: usize,
    n: usize,
    e: usize,
    h: usize,
    d: usize,
    batched: bool,
}

/// What the forward computes that the gradient reads again.
struct Forward<T> {
    out: T,
    weights: T,
    /// The projected query (scaled), key and value, by head: `[N*H, L|S, D]`.
    q: T,
    k: T,
    v: T,
    /// `softmax(q k^T)`: `[N*H, L, S]`.
    p: T,
    /// The heads' outputs joined: `[L*N, E]`.
    joined: T,
    dims: Dims,
}

impl<B: Backend> Cx<'_, B> {
    fn permute(&self, x: &B::Tensor, perm: &[usize]) -> R<B::Tensor> {
        self.k(Kernel::Permute(perm.to_vec()), &[x])
    }
    /// `a^T @ b` of two matrices.
    fn matmul_tn(&self, a: &B::Tensor, b: &B::Tensor) -> R<B::Tensor> {
        let at = self.permute(a, &[1, 0])?;
        self.matmul(&at, b)
    }
    /// `x * s`.
    fn scale(&self, x: &B::Tensor, s: f64) -> R<B::Tensor> {
        self.k(
            Kernel::Binary {
                op: BinaryOp::Mul,
                a: Side::Input(0),
                b: Side::Scalar(s),
                alpha: 1.0,
            },
            &[x],
        )
    }
    fn add(&self, x: &B::Tensor, y: &B::Tensor) -> R<B::Tensor> {
        self.k(
            Kernel::Binary {
                op: BinaryOp::Add,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha: 1.0,
            },
            &[x, y],
        )
    }
    fn reduce(&self, op: ReduceOp, x: &B::Tensor, dims: &[usize]) -> R<B::Tensor> {
        let dtype = self.b.dtype(x);
        self.k(
            Kernel::Reduce {
                op,
                dims: dims.to_vec(),
                keepdim: false,
                dtype,
            },
            &[x],
        )
    }
    /// Rows `i*e .. (i+1)*e` of a packed projection (`[3E, E]` or `[3E]`).
    fn rows(&self, x: &B::Tensor, i: usize, e: usize) -> R<B::Tensor> {
        let shape = self.b.shape(x).to_vec();
        let mut start = vec![0i64; shape.len()];
        let mut end: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
        start[0] = (i * e) as i64;
        end[0] = ((i + 1) * e) as i64;
        self.k(
            Kernel::Slice {
                step: vec![1; shape.len()],
                start,
                end,
            },
            &[x],
        )
    }
    /// `[T, N, E]` (flat `[T*N, E]`) by head: `[N*H, T, D]`.
    fn split_heads(&self, x: &B::Tensor, t: usize, m: Dims) -> R<B::Tensor> {
        let x = self.reshape(x, &[t, m.n * m.h, m.d])?;
        self.permute(&x, &[1, 0, 2])
    }
    /// `[N*H, T, D]` joined back: `[T*N, E]`.
    fn join_heads(&self, x: &B::Tensor, t: usize, m: Dims) -> R<B::Tensor> {
        let x = self.permute(x, &[1, 0, 2])?;
        self.reshape(&x, &[t * m.n, m.e])
    }

    fn dims(&self, mha: Mha, q: &B::Tensor, k: &B::Tensor) -> R<Dims> {
        let (qs, ks) = (self.b.shape(q).to_vec(), self.b.shape(k).to_vec());
        let (l, n, e, s, batched) = match (&qs[..], &ks[..]) {
            ([l, n, e], [s, n2, e2]) if n == n2 && e == e2 => (*l, *n, *e, *s, true),
            ([l, e], [s, e2]) if e == e2 => (*l, 1, *e, *s, false),
            _ => {
                return Err(err(format!(
                    "query {qs:?} and key {ks:?} are not [L, N, E] and [S, N, E]"
                )))
            }
        };
        if mha.heads == 0 || e % mha.heads != 0 {
            return Err(err(format!("{e} features in {} heads", mha.heads)));
        }
        Ok(Dims {
            l,
            s,
            n,
            e,
            h: mha.heads,
            d: e / mha.heads,
            batched,
        })
    }

    fn forward(&self, mha: Mha, inputs: &[Input<'_, B::Tensor>]) -> R<Forward<B::Tensor>> {
        let t = tensors(inputs, 7)?;
        let (query, key, value, w, b, wo, bo) = (t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
        let m = self.dims(mha, query, key)?;
        let project = |x: &B::Tensor, i: usize| -> R<B::Tensor> {
            let wi = self.rows(w, i, m.e)?;
            let bi = self.rows(b, i, m.e)?;
            self.k(Kernel::Linear { bias: true }, &[x, &wi, &bi])
        };
        let scale = (1.0 / m.d as f64).sqrt();
        let q = self.split_heads(&project(query, 0)?, m.l, m)?;
        let q = self.scale(&q, scale)?;
        let k = self.split_heads(&project(key, 1)?, m.s, m)?;
        let v = self.split_heads(&project(value, 2)?, m.s, m)?;
        let kt = self.permute(&k, &[0, 2, 1])?;
        let scores = self.matmul(&q, &kt)?;
        let p = self.k(Kernel::Softmax { dim: 2, log: false }, &[&scores])?;
        let heads = self.matmul(&p, &v)?;
        let joined = self.join_heads(&heads, m.l, m)?;
        let out = self.k(Kernel::Linear { bias: true }, &[&joined, wo, bo])?;
        let out_shape = if m.batched {
            vec![m.l, m.n, m.e]
        } else {
            vec![m.l, m.e]
        };
        let out = self.reshape(&out, &out_shape)?;
        let weights = self.reshape(&p, &[m.n, m.h, m.l, m.s])?;
        let weights = if mha.average {
            self.reduce(ReduceOp::Mean, &weights, &[1])?
        } else {
            weights
        };
        let mut ws = self.b.shape(&weights).to_vec();
        if !m.batched {
            ws.remove(0);
        }
        let weights = self.reshape(&weights, &ws)?;
        Ok(Forward {
            out,
            weights,
            q,
            k,
            v,
            p,
            joined,
            dims: m,
        })
    }

    fn vjp(
        &self,
        mha: Mha,
        outputs: &[bool; 7],
        inputs: &[Input<'_, B::Tensor>],
    ) -> R<Vec<B::Tensor>> {
        let t = tensors(inputs, 9)?;
        let (query, key, value, w, wo) = (t[0], t[1], t[2], t[3], t[5]);
        let (g_out, g_weights) = (t[7], t[8]);
        let f = self.forward(mha, &inputs[..7])?;
        let m = f.dims;
        let dtype = self.b.dtype(query);
        if self.b.dtype(g_out) != dtype || self.b.dtype(g_weights) != dtype {
            return Err(err(format!(
                "the gradients are {} and {}, the inputs {dtype}",
                self.b.dtype(g_out),
                self.b.dtype(g_weights)
            )));
        }
        // the output projection
        let g = self.reshape(g_out, &[m.l * m.n, m.e])?;
        let g_wo = self.matmul_tn(&g, &f.joined)?;
        let g_bo = self.reduce(ReduceOp::Sum, &g, &[0])?;
        let g_joined = self.matmul(&g, wo)?;
        let g_heads = self.split_heads(&g_joined, m.l, m)?;
        // attention: out = p v, p = softmax(q k^T)
        let vt = self.permute(&f.v, &[0, 2, 1])?;
        let g_p = self.matmul(&g_heads, &vt)?;
        let pt = self.permute(&f.p, &[0, 2, 1])?;
        let g_v = self.matmul(&pt, &g_heads)?;
        // the weights' own gradient: spread evenly over the heads when averaged
        let gw = if mha.average {
            let gw = self.reshape(g_weights, &[m.n, 1, m.l, m.s])?;
            let gw = self.k(
                Kernel::Expand(vec![m.n as i64, m.h as i64, m.l as i64, m.s as i64]),
                &[&gw],
            )?;
            self.scale(&gw, 1.0 / m.h as f64)?
        } else {
            self.k(Kernel::Identity, &[g_weights])?
        };
        let gw = self.reshape(&gw, &[m.n * m.h, m.l, m.s])?;
        let g_p = self.add(&g_p, &gw)?;
        let g_scores = self.k(
            Kernel::SoftmaxBackward {
                dim: 2,
                log: false,
                dtype,
            },
            &[&g_p, &f.p],
        )?;
        let g_q = self.matmul(&g_scores, &f.k)?;
        let g_q = self.scale(&g_q, (1.0 / m.d as f64).sqrt())?;
        let st = self.permute(&g_scores, &[0, 2, 1])?;
        let g_k = self.matmul(&st, &f.q)?;
        // the input projections
        let mut g_in = Vec::new();
        let (mut g_w, mut g_b) = (Vec::new(), Vec::new());
        for (i, (x, gh, len)) in [(query, g_q, m.l), (key, g_k, m.s), (value, g_v, m.s)]
            .into_iter()
            .enumerate()
        {
            let gp = self.join_heads(&gh, len, m)?;
            let wi = self.rows(w, i, m.e)?;
            let gx = self.matmul(&gp, &wi)?;
            g_in.push(self.reshape(&gx, self.b.shape(x))?);
            let xf = self.reshape(x, &[len * m.n, m.e])?;
            g_w.push(self.matmul_tn(&gp, &xf)?);
            g_b.push(self.reduce(ReduceOp::Sum, &gp, &[0])?);
        }
        let cat = |parts: &[B::Tensor]| {
            let refs: Vec<&B::Tensor> = parts.iter().collect();
            self.k(Kernel::Cat { dim: 0 }, &refs)
        };
        let g_w = cat(&g_w)?;
        let g_b = cat(&g_b)?;
        let mut g_in = g_in.into_iter();
        let all = [
            g_in.next(),
            g_in.next(),
            g_in.next(),
            Some(g_w),
            Some(g_b),
            Some(g_wo),
            Some(g_bo),
        ];
        all.into_iter()
            .zip(outputs)
            .filter(|(_, &named)| named)
            .map(|(g, _)| g.ok_or_else(|| err("a gradient is missing")))
            .collect()
    }
}
