//! `F.unfold` (im2col) and `F.fold` (col2im) on any backend, from its own kernels: unfold pads
//! the input and takes one strided slice per kernel tap, stacked after the channels; fold
//! spreads each tap's columns back with an interior-padded `pad` (the stride's gaps, the tap's
//! offset) and sums them, then cuts the padding off. Each is the other's gradient, as in
//! PyTorch. Shapes: `[N, C, H, W]` (or `[C, H, W]`) and `[N, C * kh * kw, L]` (or
//! `[C * kh * kw, L]`), `L` the `oh * ow` window positions.

use crate::exec::backend::{Backend, Input};
use crate::exec::kernel::{BinaryOp, Kernel, Side, Window2d};

use crate::exec::composer::{err, Cx, R};

/// Runs [`Kernel::Im2Col`] or [`Kernel::Col2Im`]; `None` for any other kernel.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let c = Cx { b: backend };
    Some(match (kernel, inputs) {
        (Kernel::Im2Col(w), [Input::Tensor(x)]) => c.im2col(x, w),
        (Kernel::Col2Im { output, window }, [Input::Tensor(x)]) => c.col2im(x, *output, window),
        (Kernel::Im2Col(_) | Kernel::Col2Im { .. }, _) => {
            Err(err("unfold", "one tensor input is needed"))
        }
        _ => return None,
    })
}

impl Window2d {
    /// The window positions along each dimension of an `[h, w]` plane, none if the kernel
    /// does not fit the padded plane or a size is 0.
    pub(crate) fn positions(&self, h: usize, w: usize) -> Option<[usize; 2]> {
        let mut out = [0; 2];
        for (d, len) in [h, w].into_iter().enumerate() {
            let span = self.dilation[d] * (self.kernel[d].checked_sub(1)?) + 1;
            let room = (len + 2 * self.padding[d]).checked_sub(span)?;
            if self.stride[d] == 0 || self.dilation[d] == 0 {
                return None;
            }
            out[d] = room / self.stride[d] + 1;
        }
        Some(out)
    }
}

impl<B: Backend> Cx<'_, B> {
    /// `[N, C, H, W]` to `[N, C * kh * kw, oh * ow]`.
    fn im2col(&self, x: &B::Tensor, w: &Window2d) -> R<B::Tensor> {
        let shape = self.b.shape(x).to_vec();
        let (batched, [n, c, h, wd]) = match shape[..] {
            [n, c, h, w] => (true, [n, c, h, w]),
            [c, h, w] => (false, [1, c, h, w]),
            _ => return Err(err("unfold", format!("input {shape:?} is not 3-d or 4-d"))),
        };
        let [oh, ow] = w
            .positions(h, wd)
            .ok_or_else(|| err("unfold", format!("{w:?} does not fit input {shape:?}")))?;
        let x = self.reshape(x, &[n, c, h, wd])?;
        let (ph, pw) = (w.padding[0], w.padding[1]);
        let padded = if ph == 0 && pw == 0 {
            x
        } else {
            self.k(
                Kernel::Pad {
                    value: 0.0,
                    config: vec![
                        (0, 0, 0),
                        (0, 0, 0),
                        (ph as i64, ph as i64, 0),
                        (pw as i64, pw as i64, 0),
                    ],
                },
                &[&x],
            )?
        };
        let mut taps = Vec::with_capacity(w.kernel[0] * w.kernel[1]);
        for ki in 0..w.kernel[0] {
            for kj in 0..w.kernel[1] {
                let (r0, c0) = (ki * w.dilation[0], kj * w.dilation[1]);
                taps.push(self.k(
                    Kernel::Slice {
                        start: vec![0, 0, r0 as i64, c0 as i64],
                        end: vec![
                            n as i64,
                            c as i64,
                            (r0 + (oh - 1) * w.stride[0] + 1) as i64,
                            (c0 + (ow - 1) * w.stride[1] + 1) as i64,
                        ],
                        step: vec![1, 1, w.stride[0] as i64, w.stride[1] as i64],
                    },
                    &[&padded],
                )?);
            }
        }
        let refs: Vec<&B::Tensor> = taps.iter().collect();
        let stacked = self.k(Kernel::Stack { dim: 2 }, &refs)?;
        let cols = [c * w.kernel[0] * w.kernel[1], oh * ow];
        if batched {
            self.reshape(&stacked, &[n, cols[0], cols[1]])
        } else {
            self.reshape(&stacked, &cols)
        }
    }

    /// `[N, C * kh * kw, oh * ow]` to `[N, C, H, W]`, overlapping taps summed.
    fn col2im(&self, x: &B::Tensor, [h, wd]: [usize; 2], w: &Window2d) -> R<B::Tensor> {
        let shape = self.b.shape(x).to_vec();
        let taps = w.kernel[0] * w.kernel[1];
        let (batched, n, rows, l) = match shape[..] {
            [n, r, l] => (true, n, r, l),
            [r, l] => (false, 1, r, l),
            _ => return Err(err("fold", format!("input {shape:?} is not 2-d or 3-d"))),
        };
        let positions = w.positions(h, wd);
        let [oh, ow] = match positions {
            Some(p) if taps > 0 && rows % taps == 0 && p[0] * p[1] == l => p,
            _ => {
                return Err(err(
                    "fold",
                    format!("input {shape:?} is not the columns of {w:?} over {h}x{wd}"),
                ))
            }
        };
        let c = rows / taps;
        let x = self.reshape(x, &[n, c, taps, oh, ow])?;
        let (hp, wp) = (h + 2 * w.padding[0], wd + 2 * w.padding[1]);
        let mut sum: Option<B::Tensor> = None;
        for ki in 0..w.kernel[0] {
            for kj in 0..w.kernel[1] {
                let q = ki * w.kernel[1] + kj;
                let tap = self.k(
                    Kernel::Slice {
                        start: vec![0, 0, q as i64, 0, 0],
                        end: vec![n as i64, c as i64, q as i64 + 1, oh as i64, ow as i64],
                        step: vec![1; 5],
                    },
                    &[&x],
                )?;
                let tap = self.reshape(&tap, &[n, c, oh, ow])?;
                let (r0, c0) = (ki * w.dilation[0], kj * w.dilation[1]);
                let (r1, c1) = (
                    r0 + (oh - 1) * w.stride[0] + 1,
                    c0 + (ow - 1) * w.stride[1] + 1,
                );
                let placed = self.k(
                    Kernel::Pad {
                        value: 0.0,
                        config: vec![
                            (0, 0, 0),
                            (0, 0, 0),
                            (r0 as i64, (hp - r1) as i64, w.stride[0] as i64 - 1),
                            (c0 as i64, (wp - c1) as i64, w.stride[1] as i64 - 1),
                        ],
                    },
                    &[&tap],
                )?;
                sum = Some(match sum {
                    None => placed,
                    Some(s) => self.k(
                        Kernel::Binary {
                            op: BinaryOp::Add,
                            a: Side::Input(0),
                            b: Side::Input(1),
                            alpha: 1.0,
                        },
                        &[&s, &placed],
                    )?,
                });
            }
        }
        let sum = sum.ok_or_else(|| err("fold", "an empty kernel"))?;
        let (ph, pw) = (w.padding[0] as i64, w.padding[1] as i64);
        let out = self.k(
            Kernel::Slice {
                start: vec![0, 0, ph, pw],
                end: vec![n as i64, c as i64, ph + h as i64, pw + wd as i64],
                step: vec![1; 4],
            },
            &[&sum],
        )?;
        if batched {
            self.reshape(&out, &[n, c, h, wd])
        } else {
            self.reshape(&out, &[c, h, wd])
        }
    }
}
