//! Transposed convolution (`conv_transpose1d/2d/3d`, `torch.convolution(transposed=True)`) on
//! any backend, from that backend's own kernels. A transposed convolution is the gradient of a
//! convolution with respect to its input: the input spread out by the stride (`stride - 1`
//! zeros between elements) and padded by `dilation * (kernel - 1) - padding` (plus
//! `output_padding` at the end), convolved with stride 1 by the weight with its spatial taps
//! flipped and, per group, its two channel dimensions swapped.

use crate::exec::backend::{Backend, Input, KernelError};
use crate::exec::kernel::Kernel;

/// The parameters of [`Kernel::ConvTranspose`], each one value or one per spatial dimension.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvTranspose<'a> {
    pub(crate) stride: &'a [i64],
    pub(crate) padding: &'a [i64],
    pub(crate) output_padding: &'a [i64],
    pub(crate) dilation: &'a [i64],
    pub(crate) groups: i64,
    pub(crate) bias: bool,
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

/// Inputs `x` (`[N, C_in, *spatial]` or `[C_in, *spatial]`), `w` (`[C_in, C_out / groups,
/// *kernel]`) and, with `bias`, `b` (`[C_out]`).
pub(crate) fn conv_transpose<B: Backend>(
    backend: &B,
    p: ConvTranspose<'_>,
    inputs: &[Input<'_, B::Tensor>],
) -> Result<B::Tensor, KernelError> {
    let tensor = |i: usize| match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err(format!("input {i} is not a tensor"))),
    };
    let (x, w) = (tensor(0)?, tensor(1)?);
    let (xs, ws) = (backend.shape(x).to_vec(), backend.shape(w).to_vec());
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
        .filter(|g| *g >= 1 && ws[0] % g == 0)
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
    let stride = per_dim(p.stride, spatial, "stride")?;
    let padding = per_dim(p.padding, spatial, "padding")?;
    let output_padding = per_dim(p.output_padding, spatial, "output_padding")?;
    let dilation = per_dim(p.dilation, spatial, "dilation")?;
    for i in 0..spatial {
        let (s, d, pad, op) = (stride[i], dilation[i], padding[i], output_padding[i]);
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
        conv_inputs.push(Input::Tensor(tensor(2)?));
    }
    backend.run(&conv, &conv_inputs)
}
