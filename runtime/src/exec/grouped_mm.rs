//! `torch._grouped_mm`, which every backend runs from its own matmul, slices and concatenation,
//! group by group, as PyTorch 2.9's CPU fallback (`_grouped_mm_fallback`) does: group `g`
//! spans `offsets[g - 1]..offsets[g]` (from 0) of the grouped dimension, and multiplies that
//! span of `a` by `b[g]` (rows), `a[g]` by that span of `b` (columns), or the two spans of the
//! inner dimension. The offsets are read back from the device (a few numbers), as the
//! fallback reads them on the host. What no group covers (rows or columns past the last
//! offset) is left uninitialized by PyTorch (whatever its fresh buffer held); tracepass
//! writes 0 there, so a padded batch whose tail is ignored runs. Offsets that decrease or run
//! past the grouped dimension are refused.

use crate::exec::backend::{Backend, Input};
use crate::exec::composer::{err, Cx, R};
use crate::exec::kernel::Kernel;

/// Runs `kernel` if it is a [`Kernel::GroupedMm`].
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let Kernel::GroupedMm { offsets } = kernel else {
        return None;
    };
    let c = Cx { b: backend };
    let t = |i: usize| match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err("_grouped_mm", format!("input {i} must be a tensor"))),
    };
    Some((|| {
        let offs = if *offsets { Some(t(2)?) } else { None };
        c.grouped_mm(t(0)?, t(1)?, offs)
    })())
}

impl<B: Backend> Cx<'_, B> {
    /// `x[start..end]` along `dim`, the other dimensions whole.
    fn span(&self, x: &B::Tensor, dim: usize, start: usize, end: usize) -> R<B::Tensor> {
        let shape = self.b.shape(x).to_vec();
        let mut lo = vec![0i64; shape.len()];
        let mut hi: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        lo[dim] = start as i64;
        hi[dim] = end as i64;
        self.k(
            Kernel::Slice {
                start: lo,
                end: hi,
                step: vec![1; shape.len()],
            },
            &[x],
        )
    }

    /// Matrix `g` of a batch of matrices.
    fn member(&self, x: &B::Tensor, g: usize) -> R<B::Tensor> {
        let one = self.span(x, 0, g, g + 1)?;
        let shape = self.b.shape(x)[1..].to_vec();
        self.reshape(&one, &shape)
    }

    /// The groups' `(start, end)` spans of a dimension of `size`, from the cumulative offsets.
    fn spans(&self, offsets: &B::Tensor, size: usize) -> R<Vec<(usize, usize)>> {
        let ends = self.b.download(offsets)?.to_i64_vec();
        let mut start = 0usize;
        let mut out = Vec::with_capacity(ends.len());
        for (g, &e) in ends.iter().enumerate() {
            if e < start as i64 || e > size as i64 {
                return Err(err(
                    "_grouped_mm",
                    format!(
                        "offset {g} is {e}: the offsets must grow from 0 to at most the \
                         grouped dimension's {size}, got {ends:?}"
                    ),
                ));
            }
            out.push((start, e as usize));
            start = e as usize;
        }
        Ok(out)
    }

    /// The pieces concatenated along `dim`, then zeros up to the output's `shape` there
    /// (`covered` is how far the pieces reach).
    fn joined(
        &self,
        mut pieces: Vec<B::Tensor>,
        dim: usize,
        covered: usize,
        shape: &[usize],
        dtype: tracepass_ir::DType,
    ) -> R<B::Tensor> {
        if covered < shape[dim] {
            let mut tail = shape.to_vec();
            tail[dim] = shape[dim] - covered;
            pieces.push(self.full(&tail, 0.0, dtype)?);
        }
        match pieces.len() {
            0 => self.full(shape, 0.0, dtype),
            1 => pieces.pop().ok_or_else(|| err("_grouped_mm", "no pieces")),
            _ => {
                let refs: Vec<&B::Tensor> = pieces.iter().collect();
                self.k(Kernel::Cat { dim: dim as i64 }, &refs)
            }
        }
    }

    fn grouped_mm(
        &self,
        a: &B::Tensor,
        b: &B::Tensor,
        offsets: Option<&B::Tensor>,
    ) -> R<B::Tensor> {
        let (sa, sb) = (self.b.shape(a).to_vec(), self.b.shape(b).to_vec());
        let dtype = self.b.dtype(a);
        let Some(offsets) = offsets else {
            // (G, m, k) x (G, k, n): a batched product
            return self.matmul(a, b);
        };
        match (sa.len(), sb.len()) {
            // (m, k) x (k, n): the inner dimension grouped, one (m, n) product per group
            (2, 2) => {
                let per = self
                    .spans(offsets, sa[1])?
                    .into_iter()
                    .map(|(s, e)| {
                        if s == e {
                            self.full(&[sa[0], sb[1]], 0.0, dtype)
                        } else {
                            self.matmul(&self.span(a, 1, s, e)?, &self.span(b, 0, s, e)?)
                        }
                    })
                    .collect::<R<Vec<_>>>()?;
                if per.is_empty() {
                    return self.full(&[0, sa[0], sb[1]], 0.0, dtype);
                }
                let refs: Vec<&B::Tensor> = per.iter().collect();
                self.k(Kernel::Stack { dim: 0 }, &refs)
            }
            // (m, k) x (G, k, n): the rows grouped
            (2, 3) => {
                let spans = self.spans(offsets, sa[0])?;
                let covered = spans.last().map_or(0, |s| s.1);
                let mut pieces = Vec::new();
                for (g, (s, e)) in spans.into_iter().enumerate() {
                    if s < e {
                        pieces.push(self.matmul(&self.span(a, 0, s, e)?, &self.member(b, g)?)?);
                    }
                }
                self.joined(pieces, 0, covered, &[sa[0], sb[2]], dtype)
            }
            // (G, m, k) x (k, n): the columns grouped
            (3, 2) => {
                let spans = self.spans(offsets, sb[1])?;
                let covered = spans.last().map_or(0, |s| s.1);
                let mut pieces = Vec::new();
                for (g, (s, e)) in spans.into_iter().enumerate() {
                    if s < e {
                        pieces.push(self.matmul(&self.member(a, g)?, &self.span(b, 1, s, e)?)?);
                    }
                }
                self.joined(pieces, 1, covered, &[sa[1], sb[1]], dtype)
            }
            (ra, rb) => Err(err(
                "_grouped_mm",
                format!("operands of rank {ra} and {rb} with offsets"),
            )),
        }
    }
}
