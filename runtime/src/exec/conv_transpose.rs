//! Transposed convolution (`conv_transpose1d/2d/3d`, `torch.convolution(transposed=True)`) on
//! any backend, from that backend's own kernels. A transposed convolution is the gradient of a
//! convolution with respect to its input: the input spread out by the stride (`stride - 1`
//! zeros between elements) and padded by `dilation * (kernel - 1) - padding` (plus
//! `output_padding` at the end), convolved with stride 1 by the weight with its spatial taps
//! flipped and, per group, its two channel dimensions swapped.

use crate::exec::backend::{Backend, Input, KernelError};
use crate::exec::kernel::{Kernel, VjpOutputs};

/// The parameters of [`Kernel::ConvTranspose`], each one value or one per spatial dimension.
#[derive(Clone, Copy, Debug)]
struct ConvTranspose<'a> {
    stride: &'a [i64],
    padding: &'a [i64],
    output_padding: &'a [i64],
    dilation: &'a [i64],
    groups: i64,
    bias: bool,
}

/// Runs [`Kernel::ConvTranspose`] or [`Kernel::ConvTransposeVjp`] on any backend, one tensor
/// per output; `None` for any other kernel.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<Result<Vec<B::Tensor>, KernelError>> {
    Some(match kernel {
        Kernel::ConvTranspose {
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            bias,
        } => {
            let p = ConvTranspose {
                stride,
                padding,
                output_padding,
                dilation,
                groups: *groups,
                bias: *bias,
            };
            conv_transpose(backend, p, inputs).map(|t| vec![t])
        }
        Kernel::ConvTransposeVjp {
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            outputs,
        } => {
            let p = ConvTranspose {
                stride,
                padding,
                output_padding,
                dilation,
                groups: *groups,
                bias: false,
            };
            conv_transpose_vjp(backend, p, *outputs, inputs)
        }
        _ => return None,
    })
}

fn err(m: String) -> KernelError {
    KernelError(format!("conv_transpose: {m}"))
}

/// One value per spatial dimension.
fn per_dim(v: &[i64], n: usize, what: &str) -> Result<Vec<i64>, KernelError> {
    match v.len() {
        1 => Ok(vec![v[0]; n]),
        l if l == n => Ok(v.to_vec()),
        l => Err(err(format!(
            "{what} has {l} entries for {n} spatial dimensions"
        ))),
    }
}

/// The checked shape of one transposed convolution.
struct Geometry {
    spatial: usize,
    /// 1 when `x` has a batch dimension, else 0.
    lead: usize,
    groups: usize,
    stride: Vec<i64>,
    padding: Vec<i64>,
    output_padding: Vec<i64>,
    dilation: Vec<i64>,
}

/// Checks `x` (`[N, C_in, *spatial]` or `[C_in, *spatial]`) and `w` (`[C_in, C_out / groups,
/// *kernel]`) against the parameters, as PyTorch does.
fn geometry(p: &ConvTranspose<'_>, xs: &[usize], ws: &[usize]) -> Result<Geometry, KernelError> {
    let spatial = ws
        .len()
        .checked_sub(2)
        .filter(|n| *n >= 1)
        .ok_or_else(|| err(format!("weight {ws:?} has no spatial dimensions")))?;
    let lead = match xs.len() {
        l if l == spatial + 2 => 1,
        l if l == spatial + 1 => 0,
        _ => return Err(err(format!("input {xs:?} does not fit weight {ws:?}"))),
    };
    let groups = usize::try_from(p.groups)
        .ok()
        .filter(|g| *g >= 1 && ws[0].is_multiple_of(*g))
        .ok_or_else(|| {
            err(format!(
                "{} groups do not divide {} input channels",
                p.groups, ws[0]
            ))
        })?;
    if xs[lead] != ws[0] {
        return Err(err(format!(
            "input has {} channels, weight {ws:?} expects {}",
            xs[lead], ws[0]
        )));
    }
    let g = Geometry {
        spatial,
        lead,
        groups,
        stride: per_dim(p.stride, spatial, "stride")?,
        padding: per_dim(p.padding, spatial, "padding")?,
        output_padding: per_dim(p.output_padding, spatial, "output_padding")?,
        dilation: per_dim(p.dilation, spatial, "dilation")?,
    };
    for i in 0..spatial {
        let (s, d, pad, op) = (
            g.stride[i],
            g.dilation[i],
            g.padding[i],
            g.output_padding[i],
        );
        if s < 1 || d < 1 || pad < 0 || op < 0 {
            return Err(err(format!(
                "stride {s} and dilation {d} must be positive, padding {pad} and output_padding {op} not negative"
            )));
        }
        // PyTorch's own condition: the extra row must be one the stride or dilation skipped
        if op >= s.max(d) {
            return Err(err(format!(
                "output_padding {op} must be smaller than stride {s} or dilation {d}"
            )));
        }
    }
    Ok(g)
}

fn tensor<'t, T>(inputs: &[Input<'t, T>], i: usize) -> Result<&'t T, KernelError> {
    match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err(format!("input {i} is not a tensor"))),
    }
}

/// Inputs `x` (`[N, C_in, *spatial]` or `[C_in, *spatial]`), `w` (`[C_in, C_out / groups,
/// *kernel]`) and, with `bias`, `b` (`[C_out]`).
fn conv_transpose<B: Backend>(
    backend: &B,
    p: ConvTranspose<'_>,
    inputs: &[Input<'_, B::Tensor>],
) -> Result<B::Tensor, KernelError> {
    let (x, w) = (tensor(inputs, 0)?, tensor(inputs, 1)?);
    let (xs, ws) = (backend.shape(x).to_vec(), backend.shape(w).to_vec());
    let Geometry {
        spatial,
        lead,
        groups,
        stride,
        padding,
        output_padding,
        dilation,
    } = geometry(&p, &xs, &ws)?;
    // the weight as a convolution's: [g, C_in/g, C_out/g, *k] -> [g, C_out/g, C_in/g, *k],
    // flattened to [C_out, C_in/g, *k], taps flipped
    let (cig, cog) = (ws[0] / groups, ws[1]);
    let taps = &ws[2..];
    let grouped: Vec<usize> = [groups, cig, cog].iter().chain(taps).copied().collect();
    let w = backend.run(&Kernel::Reshape(grouped), &[Input::Tensor(w)])?;
    let perm: Vec<usize> = [0, 2, 1].into_iter().chain(3..3 + spatial).collect();
    let w = backend.run(&Kernel::Permute(perm), &[Input::Tensor(&w)])?;
    let flat: Vec<usize> = [groups * cog, cig].iter().chain(taps).copied().collect();
    let w = backend.run(&Kernel::Reshape(flat), &[Input::Tensor(&w)])?;
    let flip: Vec<i64> = (2..2 + spatial as i64).collect();
    let w = backend.run(&Kernel::Flip(flip), &[Input::Tensor(&w)])?;
    // the input spread by the stride and padded to the convolution's full extent
    let mut config = vec![(0, 0, 0); lead + 1];
    for i in 0..spatial {
        let edge = dilation[i] * (taps[i] as i64 - 1) - padding[i];
        config.push((edge, edge + output_padding[i], stride[i] - 1));
    }
    let x = backend.run(&Kernel::Pad { value: 0.0, config }, &[Input::Tensor(x)])?;
    let conv = Kernel::Convolution {
        stride: vec![1],
        padding: vec![0],
        dilation,
        groups: p.groups,
        bias: p.bias,
    };
    let mut conv_inputs = vec![Input::Tensor(&x), Input::Tensor(&w)];
    if p.bias {
        conv_inputs.push(Input::Tensor(tensor(inputs, 2)?));
    }
    backend.run(&conv, &conv_inputs)
}

/// The gradients of a transposed convolution (Thunder's `conv_transpose*d_vjp`), inputs `x`,
/// `w` and the output's gradient `g`. A transposed convolution is the adjoint of the
/// convolution with the same weight, stride, padding, dilation and groups, so
/// `<conv_transpose(x, w), g> = <x, conv(g, w)>`:
/// - `x`'s gradient is `conv(g, w)`, cut to `x`'s extent (`output_padding` rows the
///   convolution also covers);
/// - `w`'s gradient is that convolution's weight gradient, with `g` as the convolution's input
///   and `x` as its output gradient: per group, a convolution of `g` (batch and channels
///   swapped) by `x` (likewise) with stride and dilation exchanged, cut to the kernel's extent;
/// - the bias's gradient sums `g` over every dimension but the channels.
fn conv_transpose_vjp<B: Backend>(
    backend: &B,
    p: ConvTranspose<'_>,
    want: VjpOutputs,
    inputs: &[Input<'_, B::Tensor>],
) -> Result<Vec<B::Tensor>, KernelError> {
    let (x, w, g) = (tensor(inputs, 0)?, tensor(inputs, 1)?, tensor(inputs, 2)?);
    let (xs, ws, gs) = (
        backend.shape(x).to_vec(),
        backend.shape(w).to_vec(),
        backend.shape(g).to_vec(),
    );
    let geo = geometry(&p, &xs, &ws)?;
    let spatial = geo.spatial;
    let cout = ws[1] * geo.groups;
    let expected: Vec<usize> = {
        let mut e: Vec<usize> = xs[..geo.lead].to_vec();
        e.push(cout);
        for i in 0..spatial {
            let (s, d, pad, op) = (
                geo.stride[i],
                geo.dilation[i],
                geo.padding[i],
                geo.output_padding[i],
            );
            let n = (xs[geo.lead + 1 + i] as i64 - 1) * s - 2 * pad
                + d * (ws[2 + i] as i64 - 1)
                + op
                + 1;
            e.push(usize::try_from(n).unwrap_or(0));
        }
        e
    };
    if gs != expected {
        return Err(err(format!(
            "the gradient is {gs:?}, the transposed convolution of {xs:?} by {ws:?} gives {expected:?}"
        )));
    }
    // a batch of one where the input has none
    let batched = |t: &B::Tensor, shape: &[usize]| -> Result<B::Tensor, KernelError> {
        let s: Vec<usize> = [1].iter().chain(shape).copied().collect();
        backend.run(&Kernel::Reshape(s), &[Input::Tensor(t)])
    };
    let (xb, gb);
    let (x, g, xs, gs) = if geo.lead == 0 {
        xb = batched(x, &xs)?;
        gb = batched(g, &gs)?;
        let xs1: Vec<usize> = [1].iter().chain(&xs).copied().collect();
        let gs1: Vec<usize> = [1].iter().chain(&gs).copied().collect();
        (&xb, &gb, xs1, gs1)
    } else {
        (x, g, xs, gs)
    };
    // cuts `t` (of shape `have`) to its first `want` entries of every dimension
    let cut = |t: B::Tensor, have: &[usize], want: &[usize]| -> Result<B::Tensor, KernelError> {
        if have == want {
            return Ok(t);
        }
        backend.run(
            &Kernel::Slice {
                start: vec![0; want.len()],
                end: want.iter().map(|&n| n as i64).collect(),
                step: vec![1; want.len()],
            },
            &[Input::Tensor(&t)],
        )
    };
    let swap: Vec<usize> = [1, 0].into_iter().chain(2..2 + spatial).collect();
    let mut out = Vec::with_capacity(want.count());
    if want.input {
        let conv = Kernel::Convolution {
            stride: geo.stride.clone(),
            padding: geo.padding.clone(),
            dilation: geo.dilation.clone(),
            groups: p.groups,
            bias: false,
        };
        let gx = backend.run(&conv, &[Input::Tensor(g), Input::Tensor(w)])?;
        let have = backend.shape(&gx).to_vec();
        let gx = cut(gx, &have, &xs)?;
        out.push(if geo.lead == 0 {
            backend.run(&Kernel::Reshape(xs[1..].to_vec()), &[Input::Tensor(&gx)])?
        } else {
            gx
        });
    }
    if want.weight {
        let (cig, cog) = (ws[0] / geo.groups, ws[1]);
        let conv = Kernel::Convolution {
            stride: geo.dilation.clone(),
            padding: geo.padding.clone(),
            dilation: geo.stride.clone(),
            groups: 1,
            bias: false,
        };
        // the channels `[k * n, (k + 1) * n)` of `t`
        let channels = |t: &B::Tensor, shape: &[usize], k: usize, n: usize| {
            if geo.groups == 1 {
                return Ok(t.clone());
            }
            let mut start = vec![0i64; shape.len()];
            let mut end: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            start[1] = (k * n) as i64;
            end[1] = ((k + 1) * n) as i64;
            backend.run(
                &Kernel::Slice {
                    start,
                    end,
                    step: vec![1; shape.len()],
                },
                &[Input::Tensor(t)],
            )
        };
        let mut parts = Vec::with_capacity(geo.groups);
        for k in 0..geo.groups {
            let gk = channels(g, &gs, k, cog)?;
            let xk = channels(x, &xs, k, cig)?;
            // [C_out/g, N, *g_spatial] convolved by [C_in/g, N, *x_spatial]
            let gk = backend.run(&Kernel::Permute(swap.clone()), &[Input::Tensor(&gk)])?;
            let xk = backend.run(&Kernel::Permute(swap.clone()), &[Input::Tensor(&xk)])?;
            let gw = backend.run(&conv, &[Input::Tensor(&gk), Input::Tensor(&xk)])?;
            let have = backend.shape(&gw).to_vec();
            let want_shape: Vec<usize> = [cog, cig].iter().chain(&ws[2..]).copied().collect();
            let gw = cut(gw, &have, &want_shape)?;
            parts.push(backend.run(&Kernel::Permute(swap.clone()), &[Input::Tensor(&gw)])?);
        }
        out.push(if parts.len() == 1 {
            parts.pop().expect("one group")
        } else {
            let ins: Vec<Input<'_, B::Tensor>> = parts.iter().map(Input::Tensor).collect();
            backend.run(&Kernel::Cat { dim: 0 }, &ins)?
        });
    }
    if want.bias {
        let dims: Vec<usize> = std::iter::once(0).chain(2..2 + spatial).collect();
        out.push(backend.run(
            &Kernel::Reduce {
                op: crate::exec::kernel::ReduceOp::Sum,
                dims,
                keepdim: false,
                dtype: backend.dtype(g),
            },
            &[Input::Tensor(g)],
        )?);
    }
    Ok(out)
}
