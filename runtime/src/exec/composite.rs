//! Ops every backend runs from its own kernels, with no kernel source of their own: a
//! triangle of matrices (`triu`, `tril`), `one_hot`, `pixel_shuffle` and its inverse, `roll`.
//! Each is what Thunder's own decomposition computes (arange, compare, where; reshape and
//! permute; slices and a concatenation), so CPU and CUDA agree by construction.

use crate::exec::backend::{Backend, Input, KernelError};
use crate::exec::kernel::{BinaryOp, CompareOp, Kernel, ReduceOp, Side};
use tracepass_ir::DType;

fn err(op: &str, m: String) -> KernelError {
    KernelError(format!("{op}: {m}"))
}

fn input<'t, T>(op: &str, inputs: &[Input<'t, T>]) -> Result<&'t T, KernelError> {
    match inputs.first() {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err(op, "input 0 is not a tensor".into())),
    }
}

/// Runs `kernel` if it is one of this module's ops.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<Result<B::Tensor, KernelError>> {
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
        Kernel::Roll { shifts, dims } => {
            input("roll", inputs).and_then(|x| roll(backend, shifts, dims.as_deref(), x))
        }
        _ => return None,
    })
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
        Kernel::PixelShuffle { .. } => vec![(Kernel::Permute(vec![]), d)],
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
        _ => return None,
    })
}
