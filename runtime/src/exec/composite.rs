//! Ops every backend runs from its own kernels, with no kernel source of their own (and the
//! dispatch of `conv_transpose.rs`'s): a
//! triangle of matrices (`triu`, `tril`), `one_hot`, `pixel_shuffle` and its inverse, `roll`,
//! `adaptive_avg_pool1d` and its gradient, `neg`, `abs`, `sign`, `relu` and `relu6` of integers
//! (exact, wrapping as PyTorch's integer kernels), `sign` of bools, and the other unary ops of
//! integers (in f32).
//! Each is what Thunder's own decomposition computes (arange, compare, where; reshape and
//! permute; slices and a concatenation), so CPU and CUDA agree by construction.

use crate::exec::backend::{Backend, Input, KernelError, Outputs};
use crate::exec::conv_transpose;
use crate::exec::kernel::{BinaryOp, CompareOp, Kernel, ReduceOp, Side, UnaryOp};
use tracepass_ir::DType;

/// The unary ops that keep an integer operand's dtype, as PyTorch's integer kernels do (the
/// others compute in the default float; on bools PyTorch refuses them, and so do the float
/// kernels).
macro_rules! int_exact_ops {
    () => {
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu | UnaryOp::Relu6
    };
}

fn err(op: &str, m: String) -> KernelError {
    KernelError(format!("{op}: {m}"))
}

fn input<'t, T>(op: &str, inputs: &[Input<'t, T>]) -> Result<&'t T, KernelError> {
    match inputs.first() {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err(op, "input 0 is not a tensor".into())),
    }
}

/// Runs `kernel` if it is one of this module's ops, a transposed convolution or an attention
/// gradient (one output).
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<Result<B::Tensor, KernelError>> {
    if let Some(r) = crate::exec::vocab_composite::run(backend, kernel, inputs)
        .or_else(|| crate::exec::bool_ops::run(backend, kernel, inputs))
        .or_else(|| crate::exec::logsumexp::run(backend, kernel, inputs))
        .or_else(|| crate::exec::nextafter::run(backend, kernel, inputs))
        .or_else(|| crate::exec::grouped_mm::run(backend, kernel, inputs))
    {
        return Some(r);
    }
    if let Some(r) = crate::exec::setitem::run(backend, kernel, inputs) {
        return Some(r);
    }
    if let Some(r) = crate::exec::adaptive_max_pool::run(backend, kernel, inputs)
        .or_else(|| crate::exec::im2col::run(backend, kernel, inputs))
    {
        return Some(r);
    }
    if let Some(r) = conv_transpose::run(backend, kernel, inputs)
        .or_else(|| crate::exec::attention::run(backend, kernel, inputs))
        .or_else(|| crate::exec::bilinear::run(backend, kernel, inputs))
        .or_else(|| crate::exec::cosine_similarity::run(backend, kernel, inputs))
        .or_else(|| crate::exec::pointwise_loss::run(backend, kernel, inputs))
        .or_else(|| crate::exec::binary_fallback::run(backend, kernel, inputs))
    {
        return Some(r.and_then(|mut out| match (out.pop(), out.is_empty()) {
            (Some(t), true) => Ok(t),
            _ => Err(err(
                "run",
                format!("{kernel:?} gives {} tensors, not one", kernel.outputs()),
            )),
        }));
    }
    Some(match kernel {
        Kernel::Triangle {
            upper,
            diagonal,
            fill,
        } => input("triangle", inputs).and_then(|x| triangle(backend, *upper, *diagonal, *fill, x)),
        Kernel::OneHot { classes } => {
            input("one_hot", inputs).and_then(|x| one_hot(backend, *classes, x))
        }
        Kernel::PixelShuffle { factor, inverse } => input("pixel_shuffle", inputs)
            .and_then(|x| pixel_shuffle(backend, *factor, *inverse, x)),
        Kernel::TruncDivide { a, b } => trunc_divide(backend, *a, *b, inputs),
        Kernel::ChannelShuffle { groups, inverse } => input("channel_shuffle", inputs)
            .and_then(|x| channel_shuffle(backend, *groups, *inverse, x)),
        Kernel::ClampBoundBackward { bound, upper } => match inputs {
            [Input::Tensor(g), Input::Tensor(x)] => {
                clamp_bound_backward(backend, *bound, *upper, g, x)
            }
            _ => Err(err(
                "clamp_bound_backward",
                "inputs must be the gradient and the input".into(),
            )),
        },
        Kernel::Roll { shifts, dims } => {
            input("roll", inputs).and_then(|x| roll(backend, shifts, dims.as_deref(), x))
        }
        Kernel::Unary(op @ int_exact_ops!())
            if inputs.first().is_some_and(|i| match i {
                Input::Tensor(t) => is_int(backend.dtype(t)),
                Input::Scalar(_) => false,
            }) =>
        {
            input("unary", inputs).and_then(|x| unary_int(backend, *op, x))
        }
        // the sign of a bool is the bool itself, as `torch.sgn` gives
        Kernel::Unary(UnaryOp::Sign)
            if inputs.first().is_some_and(|i| match i {
                Input::Tensor(t) => backend.dtype(t) == DType::Bool,
                Input::Scalar(_) => false,
            }) =>
        {
            input("sign", inputs).and_then(|x| backend.run(&Kernel::Identity, &[Input::Tensor(x)]))
        }
        // floating functions of integers and bools compute in the default float, as
        // PyTorch promotes them (`exp2` of an i32 exponent in frexp's gradient); rounding an
        // integer keeps it
        Kernel::Unary(op)
            if inputs.first().is_some_and(|i| match i {
                Input::Tensor(t) => is_int(backend.dtype(t)) || backend.dtype(t) == DType::Bool,
                Input::Scalar(_) => false,
            }) && !matches!(op, int_exact_ops!()) =>
        {
            input("unary", inputs).and_then(|x| match op {
                UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => {
                    backend.run(&Kernel::Identity, &[Input::Tensor(x)])
                }
                _ => {
                    let f = backend.run(&Kernel::Convert(DType::F32), &[Input::Tensor(x)])?;
                    backend.run(kernel, &[Input::Tensor(&f)])
                }
            })
        }
        Kernel::AdaptiveAvgPool1d { out } => {
            input("adaptive_avg_pool1d", inputs).and_then(|x| adaptive_avg_pool1d(backend, *out, x))
        }
        Kernel::AdaptiveAvgPool1dBackward => match inputs {
            [Input::Tensor(g), Input::Tensor(x)] => adaptive_avg_pool1d_backward(backend, g, x),
            _ => Err(err(
                "adaptive_avg_pool1d_backward",
                "inputs must be the gradient and the input".into(),
            )),
        },
        _ => return None,
    })
}

fn is_int(d: DType) -> bool {
    matches!(
        d,
        DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8
    )
}

fn binary<B: Backend>(
    backend: &B,
    op: BinaryOp,
    a: Side,
    b: Side,
    inputs: &[Input<'_, B::Tensor>],
) -> Result<B::Tensor, KernelError> {
    backend.run(
        &Kernel::Binary {
            op,
            a,
            b,
            alpha: 1.0,
        },
        inputs,
    )
}

/// `neg` (`0 - x`), `abs` (`max(x, -x)`) and `sign` (`(x > 0) - (x < 0)`) of an integer tensor.
/// `a / b` rounded toward zero, for integers: `a - fmod(a, b)` is a multiple of `b`, so its
/// floor division is exact (and division by zero is refused, as PyTorch's integer division
/// raises).
fn trunc_divide<B: Backend>(
    backend: &B,
    a: Side,
    b: Side,
    inputs: &[Input<'_, B::Tensor>],
) -> Result<B::Tensor, KernelError> {
    let n = inputs.len();
    let r = binary(backend, BinaryOp::Fmod, a, b, inputs)?;
    let mut with = inputs.to_vec();
    with.push(Input::Tensor(&r));
    let multiple = binary(backend, BinaryOp::Sub, a, Side::Input(n), &with)?;
    let mut with = inputs.to_vec();
    with.push(Input::Tensor(&multiple));
    binary(backend, BinaryOp::FloorDivide, Side::Input(n), b, &with)
}

fn unary_int<B: Backend>(
    backend: &B,
    op: UnaryOp,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let neg = || {
        binary(
            backend,
            BinaryOp::Sub,
            Side::Scalar(0.0),
            Side::Input(0),
            &[Input::Tensor(x)],
        )
    };
    let clamp = |op, x: &B::Tensor, bound: f64| {
        binary(
            backend,
            op,
            Side::Input(0),
            Side::Scalar(bound),
            &[Input::Tensor(x)],
        )
    };
    match op {
        UnaryOp::Neg => neg(),
        UnaryOp::Relu => clamp(BinaryOp::Maximum, x, 0.0),
        UnaryOp::Relu6 => clamp(BinaryOp::Minimum, &clamp(BinaryOp::Maximum, x, 0.0)?, 6.0),
        UnaryOp::Abs => {
            let n = neg()?;
            binary(
                backend,
                BinaryOp::Maximum,
                Side::Input(0),
                Side::Input(1),
                &[Input::Tensor(x), Input::Tensor(&n)],
            )
        }
        _ => {
            let side = |op| -> Result<B::Tensor, KernelError> {
                let c = backend.run(
                    &Kernel::Compare {
                        op,
                        a: Side::Input(0),
                        b: Side::Scalar(0.0),
                    },
                    &[Input::Tensor(x)],
                )?;
                backend.run(&Kernel::Convert(backend.dtype(x)), &[Input::Tensor(&c)])
            };
            let (pos, neg) = (side(CompareOp::Gt)?, side(CompareOp::Lt)?);
            binary(
                backend,
                BinaryOp::Sub,
                Side::Input(0),
                Side::Input(1),
                &[Input::Tensor(&pos), Input::Tensor(&neg)],
            )
        }
    }
}

/// Runs `kernel` if it is an op of several outputs every backend builds from its own kernels
/// (a transposed convolution's gradients).
pub(crate) fn run_multi<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<Result<Outputs<B::Tensor>, KernelError>> {
    run_multi_composite(backend, kernel, inputs).map(|r| r.map(Outputs::from_vec))
}

/// [`run_multi`]'s ops, which build their lists of outputs as they go.
fn run_multi_composite<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<Result<Vec<B::Tensor>, KernelError>> {
    if let Some(r) = crate::exec::vocab_composite::run_multi(backend, kernel, inputs) {
        return Some(r);
    }
    if let Some(r) = crate::exec::attention::run(backend, kernel, inputs)
        .or_else(|| crate::exec::bilinear::run(backend, kernel, inputs))
        .or_else(|| crate::exec::cosine_similarity::run(backend, kernel, inputs))
        .or_else(|| crate::exec::pointwise_loss::run(backend, kernel, inputs))
        .or_else(|| crate::exec::binary_fallback::run(backend, kernel, inputs))
    {
        return Some(r);
    }
    conv_transpose::run(backend, kernel, inputs)
}

/// `shape` with a row dimension of 1 before the last: `[*, C, L]` as `[*, C, 1, L]`.
fn as_row(shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.insert(s.len().saturating_sub(1), 1);
    s
}

/// `adaptive_avg_pool1d(x, out)`: the 2-d pooling of `x` as one row, to `(1, out)`.
fn adaptive_avg_pool1d<B: Backend>(
    backend: &B,
    out: usize,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let shape = backend.shape(x).to_vec();
    if !(2..=3).contains(&shape.len()) || out == 0 {
        return Err(err(
            "adaptive_avg_pool1d",
            format!("input {shape:?} (2 or 3 dimensions) to {out}"),
        ));
    }
    let row = backend.run(&Kernel::Reshape(as_row(&shape)), &[Input::Tensor(x)])?;
    let pooled = backend.run(
        &Kernel::AdaptiveAvgPool2d { oh: 1, ow: out },
        &[Input::Tensor(&row)],
    )?;
    let mut to = shape;
    let last = to.len() - 1;
    to[last] = out;
    backend.run(&Kernel::Reshape(to), &[Input::Tensor(&pooled)])
}

/// The gradient of [`adaptive_avg_pool1d`] with respect to `x`, from the output's `g`.
fn adaptive_avg_pool1d_backward<B: Backend>(
    backend: &B,
    g: &B::Tensor,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let (gs, xs) = (backend.shape(g).to_vec(), backend.shape(x).to_vec());
    if gs.len() != xs.len() || !(2..=3).contains(&xs.len()) {
        return Err(err(
            "adaptive_avg_pool1d_backward",
            format!("gradient {gs:?} does not pool input {xs:?}"),
        ));
    }
    let g2 = backend.run(&Kernel::Reshape(as_row(&gs)), &[Input::Tensor(g)])?;
    let x2 = backend.run(&Kernel::Reshape(as_row(&xs)), &[Input::Tensor(x)])?;
    let d = backend.run(
        &Kernel::AdaptiveAvgPool2dBackward,
        &[Input::Tensor(&g2), Input::Tensor(&x2)],
    )?;
    backend.run(&Kernel::Reshape(xs), &[Input::Tensor(&d)])
}

/// Keeps the elements with `col - row >= diagonal` (`upper`) or `col - row <= diagonal`
/// of every matrix in the last two dimensions; the others become `fill`.
fn triangle<B: Backend>(
    backend: &B,
    upper: bool,
    diagonal: i64,
    fill: f64,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let shape = backend.shape(x).to_vec();
    let n = shape.len();
    if n < 2 {
        return Err(err(
            "triangle",
            format!("{shape:?} has no matrix dimensions"),
        ));
    }
    let (rows, cols) = (shape[n - 2], shape[n - 1]);
    let arange = |len: usize, to: Vec<usize>| -> Result<B::Tensor, KernelError> {
        let a = backend.run(
            &Kernel::Arange {
                start: 0.0,
                end: len as f64,
                step: 1.0,
                dtype: DType::I64,
            },
            &[],
        )?;
        backend.run(&Kernel::Reshape(to), &[Input::Tensor(&a)])
    };
    let r = arange(rows, vec![rows, 1])?;
    let c = arange(cols, vec![1, cols])?;
    let offset = backend.run(
        &Kernel::Binary {
            op: BinaryOp::Sub,
            a: Side::Input(0),
            b: Side::Input(1),
            alpha: 1.0,
        },
        &[Input::Tensor(&c), Input::Tensor(&r)],
    )?;
    let keep = backend.run(
        &Kernel::Compare {
            op: if upper { CompareOp::Ge } else { CompareOp::Le },
            a: Side::Input(0),
            b: Side::Scalar(diagonal as f64),
        },
        &[Input::Tensor(&offset)],
    )?;
    backend.run(
        &Kernel::Where {
            a: Side::Input(1),
            b: Side::Scalar(fill),
            dtype: backend.dtype(x),
        },
        &[Input::Tensor(&keep), Input::Tensor(x)],
    )
}

/// `one_hot(idx, classes)`: i64, a new last dimension of `classes`. Like PyTorch, an index
/// outside `[0, classes)` is an error (checked on the host: one small read per call).
fn one_hot<B: Backend>(
    backend: &B,
    classes: usize,
    idx: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    if backend.dtype(idx) != DType::I64 {
        return Err(err(
            "one_hot",
            format!("indices must be i64, got {}", backend.dtype(idx)),
        ));
    }
    let shape = backend.shape(idx).to_vec();
    if shape.iter().product::<usize>() > 0 {
        let all: Vec<usize> = (0..shape.len()).collect();
        let extreme = |op| -> Result<f64, KernelError> {
            let t = backend.run(
                &Kernel::Reduce {
                    op,
                    dims: all.clone(),
                    keepdim: false,
                    dtype: DType::I64,
                },
                &[Input::Tensor(idx)],
            )?;
            let host = backend.download(&t)?;
            host.to_f64_vec()
                .first()
                .copied()
                .ok_or_else(|| err("one_hot", "an empty reduction".into()))
        };
        let (lo, hi) = (extreme(ReduceOp::Amin)?, extreme(ReduceOp::Amax)?);
        if lo < 0.0 || hi >= classes as f64 {
            return Err(err(
                "one_hot",
                format!("class values must lie in [0, {classes}), found {lo} to {hi}"),
            ));
        }
    }
    let c = backend.run(
        &Kernel::Arange {
            start: 0.0,
            end: classes as f64,
            step: 1.0,
            dtype: DType::I64,
        },
        &[],
    )?;
    let col = backend.run(&Kernel::Unsqueeze(-1), &[Input::Tensor(idx)])?;
    let hit = backend.run(
        &Kernel::Compare {
            op: CompareOp::Eq,
            a: Side::Input(0),
            b: Side::Input(1),
        },
        &[Input::Tensor(&col), Input::Tensor(&c)],
    )?;
    backend.run(&Kernel::Convert(DType::I64), &[Input::Tensor(&hit)])
}

/// `channel_shuffle(x, g)`: `[N, C, *]` as `[N, g, C / g, rest]`, dimensions 1 and 2 swapped
/// (with `inverse`, as `[N, C / g, g, rest]`: the shuffle back), the shape kept.
fn channel_shuffle<B: Backend>(
    backend: &B,
    groups: usize,
    inverse: bool,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let shape = backend.shape(x).to_vec();
    let c = shape.get(1).copied().unwrap_or(0);
    if shape.len() < 3 || groups == 0 || !c.is_multiple_of(groups) {
        return Err(err(
            "channel_shuffle",
            format!("{shape:?} in {groups} groups"),
        ));
    }
    let rest: usize = shape[2..].iter().product();
    let (a, b) = if inverse {
        (c / groups, groups)
    } else {
        (groups, c / groups)
    };
    let split = backend.run(
        &Kernel::Reshape(vec![shape[0], a, b, rest]),
        &[Input::Tensor(x)],
    )?;
    let swapped = backend.run(&Kernel::Permute(vec![0, 2, 1, 3]), &[Input::Tensor(&split)])?;
    backend.run(&Kernel::Reshape(shape), &[Input::Tensor(&swapped)])
}

/// `where(x >= bound, g, 0)` (`upper`: `x <= bound`): NaN passes no gradient, as in PyTorch.
fn clamp_bound_backward<B: Backend>(
    backend: &B,
    bound: f64,
    upper: bool,
    g: &B::Tensor,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let inside = backend.run(
        &Kernel::Compare {
            op: if upper { CompareOp::Le } else { CompareOp::Ge },
            a: Side::Input(0),
            b: Side::Scalar(bound),
        },
        &[Input::Tensor(x)],
    )?;
    backend.run(
        &Kernel::Where {
            a: Side::Input(1),
            b: Side::Scalar(0.0),
            dtype: backend.dtype(g),
        },
        &[Input::Tensor(&inside), Input::Tensor(g)],
    )
}

/// `pixel_shuffle(x, r)`: `[*, C r r, H, W]` to `[*, C, H r, W r]`, element
/// `[c, h r + i, w r + j]` from channel `c r r + i r + j`; with `inverse`, `pixel_unshuffle`.
fn pixel_shuffle<B: Backend>(
    backend: &B,
    factor: usize,
    inverse: bool,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let op = if inverse {
        "pixel_unshuffle"
    } else {
        "pixel_shuffle"
    };
    let shape = backend.shape(x).to_vec();
    let n = shape.len();
    let r = factor;
    if n < 3 || r == 0 {
        return Err(err(op, format!("{shape:?} by factor {r}")));
    }
    let lead = &shape[..n - 3];
    let (c, h, w) = (shape[n - 3], shape[n - 2], shape[n - 1]);
    let b = lead.len();
    let with = |tail: &[usize]| -> Vec<usize> { lead.iter().chain(tail).copied().collect() };
    let (split, perm, joined) = if inverse {
        if !h.is_multiple_of(r) || !w.is_multiple_of(r) {
            return Err(err(
                op,
                format!("{shape:?}: height and width not divisible by {r}"),
            ));
        }
        (
            with(&[c, h / r, r, w / r, r]),
            [0, 2, 4, 1, 3],
            with(&[c * r * r, h / r, w / r]),
        )
    } else {
        if !c.is_multiple_of(r * r) {
            return Err(err(
                op,
                format!("{shape:?}: channels not divisible by {}", r * r),
            ));
        }
        (
            with(&[c / (r * r), r, r, h, w]),
            [0, 3, 1, 4, 2],
            with(&[c / (r * r), h * r, w * r]),
        )
    };
    let perm: Vec<usize> = (0..b).chain(perm.iter().map(|p| b + p)).collect();
    let t = backend.run(&Kernel::Reshape(split), &[Input::Tensor(x)])?;
    let t = backend.run(&Kernel::Permute(perm), &[Input::Tensor(&t)])?;
    backend.run(&Kernel::Reshape(joined), &[Input::Tensor(&t)])
}

/// `roll(x, shifts, dims)`: element `i` of each rolled dimension moves to `(i + shift) mod
/// n`; without dims, the flattened tensor rolls by the one shift and keeps its shape.
fn roll<B: Backend>(
    backend: &B,
    shifts: &[i64],
    dims: Option<&[usize]>,
    x: &B::Tensor,
) -> Result<B::Tensor, KernelError> {
    let shape = backend.shape(x).to_vec();
    let Some(dims) = dims else {
        let [shift] = shifts else {
            return Err(err("roll", format!("{} shifts without dims", shifts.len())));
        };
        let flat = backend.run(
            &Kernel::Reshape(vec![shape.iter().product()]),
            &[Input::Tensor(x)],
        )?;
        let rolled = roll(backend, &[*shift], Some(&[0]), &flat)?;
        return backend.run(&Kernel::Reshape(shape), &[Input::Tensor(&rolled)]);
    };
    if dims.len() != shifts.len() {
        return Err(err(
            "roll",
            format!("{} shifts for {} dims", shifts.len(), dims.len()),
        ));
    }
    let mut t = x.clone();
    for (&shift, &d) in shifts.iter().zip(dims) {
        let len = *shape
            .get(d)
            .ok_or_else(|| err("roll", format!("dim {d} of {shape:?}")))?;
        if len == 0 {
            continue;
        }
        let s = shift.rem_euclid(len as i64) as usize;
        if s == 0 {
            continue;
        }
        // the last `s` entries, then the first `len - s`
        let part = |from: usize, to: usize| {
            let mut start = vec![0i64; shape.len()];
            let mut end: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
            start[d] = from as i64;
            end[d] = to as i64;
            backend.run(
                &Kernel::Slice {
                    start,
                    end,
                    step: vec![1; shape.len()],
                },
                &[Input::Tensor(&t)],
            )
        };
        let (tail, head) = (part(len - s, len)?, part(0, len - s)?);
        t = backend.run(
            &Kernel::Cat { dim: d as i64 },
            &[Input::Tensor(&tail), Input::Tensor(&head)],
        )?;
    }
    Ok(t)
}

/// The kernels an op of this module launches, each with the dtype it runs on, for an input of
/// dtype `d` (the CUDA catalog compiles their sources); `None` for any other kernel.
#[cfg(feature = "cuda")]
pub(crate) fn parts(kernel: &Kernel, d: DType) -> Option<Vec<(Kernel, DType)>> {
    let arange = Kernel::Arange {
        start: 0.0,
        end: 1.0,
        step: 1.0,
        dtype: DType::I64,
    };
    let compare = |op| Kernel::Compare {
        op,
        a: Side::Input(0),
        b: Side::Input(1),
    };
    let reduce = |op| Kernel::Reduce {
        op,
        dims: vec![0],
        keepdim: false,
        dtype: DType::I64,
    };
    Some(match kernel {
        Kernel::Triangle { upper, .. } => vec![
            (arange, DType::I64),
            (
                Kernel::Binary {
                    op: BinaryOp::Sub,
                    a: Side::Input(0),
                    b: Side::Input(1),
                    alpha: 1.0,
                },
                DType::I64,
            ),
            (
                compare(if *upper { CompareOp::Ge } else { CompareOp::Le }),
                DType::I64,
            ),
            (
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Scalar(0.0),
                    dtype: d,
                },
                d,
            ),
        ],
        Kernel::OneHot { .. } => vec![
            (reduce(ReduceOp::Amin), DType::I64),
            (reduce(ReduceOp::Amax), DType::I64),
            (arange, DType::I64),
            (compare(CompareOp::Eq), DType::I64),
            (Kernel::Convert(DType::I64), DType::Bool),
        ],
        Kernel::PixelShuffle { .. } | Kernel::ChannelShuffle { .. } => {
            vec![(Kernel::Permute(vec![]), d)]
        }
        Kernel::ClampBoundBackward { .. } => vec![
            (
                Kernel::Compare {
                    op: CompareOp::Ge,
                    a: Side::Input(0),
                    b: Side::Scalar(0.0),
                },
                d,
            ),
            (
                Kernel::Compare {
                    op: CompareOp::Le,
                    a: Side::Input(0),
                    b: Side::Scalar(0.0),
                },
                d,
            ),
            (
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Scalar(0.0),
                    dtype: d,
                },
                d,
            ),
        ],
        Kernel::AdaptiveAvgPool1d { out } => {
            vec![(Kernel::AdaptiveAvgPool2d { oh: 1, ow: *out }, d)]
        }
        Kernel::AdaptiveAvgPool1dBackward => vec![(Kernel::AdaptiveAvgPool2dBackward, d)],
        Kernel::Unary(int_exact_ops!()) if is_int(d) => {
            let bin = |op| Kernel::Binary {
                op,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha: 1.0,
            };
            vec![
                (bin(BinaryOp::Sub), d),
                (bin(BinaryOp::Maximum), d),
                (bin(BinaryOp::Minimum), d),
                (compare(CompareOp::Gt), d),
                (compare(CompareOp::Lt), d),
                (Kernel::Convert(d), DType::Bool),
            ]
        }
        Kernel::Unary(UnaryOp::Sign) if d == DType::Bool => vec![(Kernel::Identity, d)],
        Kernel::TruncDivide { .. } => [BinaryOp::Fmod, BinaryOp::Sub, BinaryOp::FloorDivide]
            .into_iter()
            .map(|op| {
                (
                    Kernel::Binary {
                        op,
                        a: Side::Input(0),
                        b: Side::Input(1),
                        alpha: 1.0,
                    },
                    d,
                )
            })
            .collect(),
        Kernel::Roll { .. } => vec![
            (
                Kernel::Slice {
                    start: vec![],
                    end: vec![],
                    step: vec![],
                },
                d,
            ),
            (Kernel::Cat { dim: 0 }, d),
        ],
        // exec/setitem.rs: a basic key pads the value and a mask of ones into place; a mask
        // key broadcasts; index tensors are wrapped, then index_put / index_select
        Kernel::SetItem { .. } | Kernel::GetItemTensor { .. } => vec![
            (Kernel::Permute(vec![]), d),
            (
                Kernel::Pad {
                    value: 0.0,
                    config: vec![],
                },
                d,
            ),
            (
                Kernel::Pad {
                    value: 0.0,
                    config: vec![],
                },
                DType::F32,
            ),
            (
                Kernel::Full {
                    shape: vec![],
                    value: 0.0,
                    dtype: d,
                },
                d,
            ),
            (
                Kernel::Full {
                    shape: vec![],
                    value: 1.0,
                    dtype: DType::F32,
                },
                DType::F32,
            ),
            (compare(CompareOp::Ne), DType::F32),
            (compare(CompareOp::Lt), DType::I64),
            (
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Input(2),
                    dtype: d,
                },
                d,
            ),
            (
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Input(2),
                    dtype: DType::I64,
                },
                DType::I64,
            ),
            (Kernel::Convert(DType::I64), DType::I64),
            (
                Kernel::Binary {
                    op: BinaryOp::Add,
                    a: Side::Input(0),
                    b: Side::Input(1),
                    alpha: 1.0,
                },
                DType::I64,
            ),
            (
                Kernel::Binary {
                    op: BinaryOp::Mul,
                    a: Side::Input(0),
                    b: Side::Input(1),
                    alpha: 1.0,
                },
                DType::I64,
            ),
            (Kernel::IndexSelect { dim: 0 }, d),
            (Kernel::IndexPut { accumulate: false }, d),
        ],
        // exec/attention.rs
        Kernel::MultiHeadAttention(_) | Kernel::MultiHeadAttentionVjp { .. } => {
            let bin = |op| Kernel::Binary {
                op,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha: 1.0,
            };
            let sum = |op| Kernel::Reduce {
                op,
                dims: vec![0],
                keepdim: false,
                dtype: d,
            };
            vec![
                (
                    Kernel::Slice {
                        start: vec![],
                        end: vec![],
                        step: vec![],
                    },
                    d,
                ),
                (Kernel::Linear { bias: true }, d),
                (Kernel::Matmul, d),
                (Kernel::Softmax { dim: 2, log: false }, d),
                (
                    Kernel::SoftmaxBackward {
                        dim: 2,
                        log: false,
                        dtype: d,
                    },
                    d,
                ),
                (sum(ReduceOp::Mean), d),
                (sum(ReduceOp::Sum), d),
                (bin(BinaryOp::Mul), d),
                (bin(BinaryOp::Add), d),
                (Kernel::Cat { dim: 0 }, d),
            ]
        }
        _ => return None,
    })
}
