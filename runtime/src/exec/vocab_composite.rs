//! The ops of Thunder's OpInfo vocabulary that every backend runs from its own kernels
//! (`exec/composite.rs` holds the corpus's): `lerp`, aten's `log_sigmoid_backward`, `any`,
//! `index_copy`, `scatter`, `index_put`, `Tensor.unfold`, `batch_norm`, `frexp` and 3-d max
//! pooling with its gradient. Each is built from
//! elementwise ops, comparisons, `where`, `index_add`/`scatter_add`, slices and reductions,
//! so CPU and CUDA agree by construction.
//!
//! The overwriting ops (`index_copy`, `scatter`, `index_put`) count the writes to each place
//! (adding ones there), add the new values to -0.0 (which copies them exactly, bools too) and
//! take them where written. With an index that
//! repeats, PyTorch leaves which write wins unspecified and a sum would be a number no PyTorch
//! run gives, so a place written twice is refused, naming the op.

use crate::exec::backend::{Backend, Input};
use crate::exec::kernel::{BinaryOp, CompareOp, Kernel, ReduceOp, Side, UnaryOp};
use tracepass_ir::DType;

use crate::exec::composer::{err, Cx, R};

/// Runs `kernel` if it is one of this module's ops.
pub(crate) fn run<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<B::Tensor>> {
    let c = Cx { b: backend };
    Some(match kernel {
        Kernel::Lerp { weight } => c.lerp(*weight, inputs),
        Kernel::Ldexp { dtype } => {
            tensors::<B, 2>("ldexp", inputs).and_then(|[a, b]| c.ldexp(a, b, *dtype))
        }
        Kernel::Addcmul { value, dtype } => tensors::<B, 3>("addcmul", inputs)
            .and_then(|[a, t1, t2]| c.addcmul(a, t1, t2, *value, *dtype)),
        Kernel::Clamp { min, max, dtype } => c.clamp(*min, *max, *dtype, inputs),
        Kernel::LogSigmoidBackward => tensors::<B, 2>("log_sigmoid_backward", inputs)
            .and_then(|[g, x]| c.log_sigmoid_backward(g, x)),
        Kernel::Any { dims, keepdim } => {
            tensors::<B, 1>("any", inputs).and_then(|[x]| c.any(x, dims, *keepdim))
        }
        Kernel::IndexCopy { dim } => tensors::<B, 3>("index_copy", inputs)
            .and_then(|[a, index, source]| c.index_copy(a, *dim, index, source)),
        Kernel::Scatter { dim, value } => c.scatter(*dim, *value, inputs),
        Kernel::IndexPut { accumulate } => c.index_put(*accumulate, inputs),
        Kernel::Unfold { dim, size, step } => {
            tensors::<B, 1>("unfold", inputs).and_then(|[x]| c.unfold(x, *dim, *size, *step))
        }
        Kernel::MaxPool3dBackward => tensors::<B, 3>("max_pool3d_backward", inputs)
            .and_then(|[g, x, idx]| c.max_pool3d_backward(g, x, idx)),
        Kernel::BatchNorm {
            training,
            eps,
            running,
            weight,
            bias,
        } => c.batch_norm(*training, *eps, *running, *weight, *bias, inputs),
        _ => return None,
    })
}

/// Runs `kernel` if it is one of this module's ops of several outputs.
pub(crate) fn run_multi<B: Backend>(
    backend: &B,
    kernel: &Kernel,
    inputs: &[Input<'_, B::Tensor>],
) -> Option<R<Vec<B::Tensor>>> {
    let c = Cx { b: backend };
    Some(match kernel {
        Kernel::Frexp => tensors::<B, 1>("frexp", inputs).and_then(|[x]| c.frexp(x)),
        Kernel::MaxPool3d {
            kernel,
            stride,
            padding,
        } => tensors::<B, 1>("max_pool3d", inputs)
            .and_then(|[x]| c.max_pool3d(x, *kernel, *stride, *padding)),
        _ => return None,
    })
}

/// The first `N` inputs, each a tensor.
fn tensors<'t, B: Backend, const N: usize>(
    op: &str,
    inputs: &[Input<'t, B::Tensor>],
) -> R<[&'t B::Tensor; N]> {
    let mut out = Vec::with_capacity(N);
    for i in 0..N {
        match inputs.get(i) {
            Some(Input::Tensor(t)) => out.push(*t),
            _ => return Err(err(op, format!("input {i} must be a tensor"))),
        }
    }
    out.try_into()
        .map_err(|_| err(op, format!("{N} tensor inputs are needed")))
}

fn tensor_at<'t, T>(op: &str, inputs: &[Input<'t, T>], i: usize) -> R<&'t T> {
    match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(*t),
        _ => Err(err(op, format!("input {i} must be a tensor"))),
    }
}

impl<B: Backend> Cx<'_, B> {
    /// `x op alpha * y`.
    fn bin(&self, op: BinaryOp, x: &B::Tensor, y: &B::Tensor, alpha: f64) -> R<B::Tensor> {
        self.k(
            Kernel::Binary {
                op,
                a: Side::Input(0),
                b: Side::Input(1),
                alpha,
            },
            &[x, y],
        )
    }
    fn cmp_s(&self, op: CompareOp, x: &B::Tensor, s: f64) -> R<B::Tensor> {
        self.k(
            Kernel::Compare {
                op,
                a: Side::Input(0),
                b: Side::Scalar(s),
            },
            &[x],
        )
    }
    fn shape(&self, x: &B::Tensor) -> Vec<usize> {
        self.b.shape(x).to_vec()
    }

    /// PyTorch's `lerp`: `start + w * (end - start)` where `|w| < 0.5`, else
    /// `end - (end - start) * (1 - w)`, exact at both ends.
    fn lerp(&self, weight: Side, inputs: &[Input<'_, B::Tensor>]) -> R<B::Tensor> {
        let start = tensor_at("lerp", inputs, 0)?;
        let end = tensor_at("lerp", inputs, 1)?;
        let w = match weight {
            Side::Scalar(w) => Err(w),
            Side::Input(i) => match inputs.get(i) {
                Some(Input::Tensor(t)) => Ok(*t),
                Some(Input::Scalar(w)) => Err(*w),
                None => return Err(err("lerp", format!("input {i} is missing"))),
            },
        };
        let diff = self.bin(BinaryOp::Sub, end, start, 1.0)?;
        match w {
            Err(w) if w.abs() < 0.5 => self.bin(BinaryOp::Add, start, &diff, w),
            Err(w) => self.bin(BinaryOp::Sub, end, &diff, 1.0 - w),
            Ok(w) => {
                let wd = self.bin(BinaryOp::Mul, w, &diff, 1.0)?;
                let lo = self.bin(BinaryOp::Add, start, &wd, 1.0)?;
                let one_minus = self.k(
                    Kernel::Binary {
                        op: BinaryOp::Sub,
                        a: Side::Scalar(1.0),
                        b: Side::Input(0),
                        alpha: 1.0,
                    },
                    &[w],
                )?;
                let hd = self.bin(BinaryOp::Mul, &diff, &one_minus, 1.0)?;
                let hi = self.bin(BinaryOp::Sub, end, &hd, 1.0)?;
                let abs = self.k(Kernel::Unary(UnaryOp::Abs), &[w])?;
                let near_start = self.cmp_s(CompareOp::Lt, &abs, 0.5)?;
                let dtype = self.b.dtype(&lo);
                self.k(
                    Kernel::Where {
                        a: Side::Input(1),
                        b: Side::Input(2),
                        dtype,
                    },
                    &[&near_start, &lo, &hi],
                )
            }
        }
    }

    fn convert(&self, x: &B::Tensor, dtype: DType) -> R<B::Tensor> {
        if self.b.dtype(x) == dtype {
            return Ok(x.clone());
        }
        self.k(Kernel::Convert(dtype), &[x])
    }

    /// PyTorch's `ldexp`: `a * 2^b`, with the power taken in the result's float dtype (so
    /// f64's `2^200` is finite).
    fn ldexp(&self, a: &B::Tensor, b: &B::Tensor, dtype: DType) -> R<B::Tensor> {
        if !dtype.is_float() {
            return Err(err(
                "ldexp",
                format!("the result dtype {dtype} is not a float"),
            ));
        }
        let (a, b) = (self.convert(a, dtype)?, self.convert(b, dtype)?);
        let p = self.k(Kernel::Unary(UnaryOp::Exp2), &[&b])?;
        self.bin(BinaryOp::Mul, &a, &p, 1.0)
    }

    /// PyTorch's integer `addcmul`: `a + value * t1 * t2`, each product wrapping in `dtype`
    /// (multiplication modulo 2^bits is associative, so the grouping does not matter).
    /// PyTorch refuses a fractional `value` for integers, and rounds floats once, which a
    /// composite of roundings cannot match: both are refused.
    fn addcmul(
        &self,
        a: &B::Tensor,
        t1: &B::Tensor,
        t2: &B::Tensor,
        value: f64,
        dtype: DType,
    ) -> R<B::Tensor> {
        if !matches!(dtype, DType::I64 | DType::I32) {
            return Err(err(
                "addcmul",
                format!("{dtype}: only integer addcmul runs (floats round once in PyTorch)"),
            ));
        }
        if value.fract() != 0.0 || !value.is_finite() {
            return Err(err("addcmul", format!("value {value} is not an integer")));
        }
        let (a, t1, t2) = (
            self.convert(a, dtype)?,
            self.convert(t1, dtype)?,
            self.convert(t2, dtype)?,
        );
        let prod = self.bin(BinaryOp::Mul, &t1, &t2, 1.0)?;
        let scaled = self.ew_s(BinaryOp::Mul, &prod, value)?;
        self.bin(BinaryOp::Add, &a, &scaled, 1.0)
    }

    /// PyTorch's `clamp(a, min, max)`: `minimum(maximum(a, min), max)` (so `min > max` gives
    /// `max`, and a NaN anywhere propagates), in `dtype`.
    fn clamp(
        &self,
        min: Side,
        max: Side,
        dtype: DType,
        inputs: &[Input<'_, B::Tensor>],
    ) -> R<B::Tensor> {
        let a = self.convert(tensor_at("clamp", inputs, 0)?, dtype)?;
        let bound = |x: &B::Tensor, op: BinaryOp, s: Side| -> R<B::Tensor> {
            let s = match s {
                Side::Scalar(v) => Err(v),
                Side::Input(i) => match inputs.get(i) {
                    Some(Input::Tensor(t)) => Ok(*t),
                    Some(Input::Scalar(v)) => Err(*v),
                    None => return Err(err("clamp", format!("input {i} is missing"))),
                },
            };
            match s {
                Ok(t) => self.bin(op, x, &self.convert(t, dtype)?, 1.0),
                Err(v) => self.ew_s(op, x, v),
            }
        };
        let lo = bound(&a, BinaryOp::Maximum, min)?;
        bound(&lo, BinaryOp::Minimum, max)
    }

    /// `grad * sigmoid(-x)`, the derivative of `log(sigmoid(x))`.
    fn log_sigmoid_backward(&self, g: &B::Tensor, x: &B::Tensor) -> R<B::Tensor> {
        let neg = self.k(Kernel::Unary(UnaryOp::Neg), &[x])?;
        let s = self.k(Kernel::Unary(UnaryOp::Sigmoid), &[&neg])?;
        self.bin(BinaryOp::Mul, g, &s, 1.0)
    }

    /// Nonzero as 1.0 (NaN included), its amax over `dims`, compared with 0.
    fn any(&self, x: &B::Tensor, dims: &[usize], keepdim: bool) -> R<B::Tensor> {
        let dtype = self.b.dtype(x);
        let nonzero = if dtype.is_float() {
            self.cmp_s(CompareOp::Ne, x, 0.0)?
        } else {
            // a nonzero integer stays nonzero as f32
            let f = self.k(Kernel::Convert(DType::F32), &[x])?;
            self.cmp_s(CompareOp::Ne, &f, 0.0)?
        };
        if dims.is_empty() {
            return Ok(nonzero);
        }
        let ones = self.k(Kernel::Convert(DType::F32), &[&nonzero])?;
        let most = self.k(
            Kernel::Reduce {
                op: ReduceOp::Amax,
                dims: dims.to_vec(),
                keepdim,
                dtype: DType::F32,
            },
            &[&ones],
        )?;
        self.cmp_s(CompareOp::Ne, &most, 0.0)
    }

    /// Refuses `counts` (f32 writes per place) where a place is written more than once.
    fn refuse_repeats(&self, op: &str, counts: &B::Tensor) -> R<()> {
        let rank = self.shape(counts).len();
        let most = self.k(
            Kernel::Reduce {
                op: ReduceOp::Amax,
                dims: (0..rank).collect(),
                keepdim: false,
                dtype: DType::F32,
            },
            &[counts],
        )?;
        let most = self.b.download(&most)?.to_f64_vec();
        match most.first() {
            Some(&n) if n > 1.0 => Err(err(
                op,
                format!(
                    "an index repeats ({n} writes to one place): PyTorch leaves which write \
                     wins unspecified, so tracepass refuses rather than pick one"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `a` with the places `counts` marks (written once) replaced by the values `add` (an
    /// `index_add` or a `scatter_add` kernel) sends there: the values are added to -0.0, the
    /// identity of IEEE addition, so each is copied as it is (a -0.0 stays -0.0; a bool is
    /// or-ed with false), then selected where written. A plain copy, in every dtype.
    fn placed(
        &self,
        add: Kernel,
        a: &B::Tensor,
        index: &B::Tensor,
        src: &B::Tensor,
        counts: &B::Tensor,
    ) -> R<B::Tensor> {
        let dtype = self.b.dtype(a);
        let base = self.full(&self.shape(a), -0.0, dtype)?;
        let values = self.k(add, &[&base, index, src])?;
        let hit = self.cmp_s(CompareOp::Gt, counts, 0.0)?;
        self.k(
            Kernel::Where {
                a: Side::Input(1),
                b: Side::Input(2),
                dtype,
            },
            &[&hit, &values, a],
        )
    }

    fn index_copy(
        &self,
        a: &B::Tensor,
        dim: usize,
        index: &B::Tensor,
        source: &B::Tensor,
    ) -> R<B::Tensor> {
        let zeros = self.full(&self.shape(a), 0.0, DType::F32)?;
        let ones = self.full(&self.shape(source), 1.0, DType::F32)?;
        let counts = self.k(Kernel::IndexAdd { dim }, &[&zeros, index, &ones])?;
        self.refuse_repeats("index_copy", &counts)?;
        self.placed(Kernel::IndexAdd { dim }, a, index, source, &counts)
    }

    fn scatter(
        &self,
        dim: usize,
        value: Option<f64>,
        inputs: &[Input<'_, B::Tensor>],
    ) -> R<B::Tensor> {
        let a = tensor_at("scatter", inputs, 0)?;
        let index = tensor_at("scatter", inputs, 1)?;
        let dtype = self.b.dtype(a);
        let at = self.shape(index);
        let zeros = self.full(&self.shape(a), 0.0, DType::F32)?;
        let ones = self.full(&at, 1.0, DType::F32)?;
        let counts = self.k(Kernel::ScatterAdd { dim }, &[&zeros, index, &ones])?;
        self.refuse_repeats("scatter", &counts)?;
        let filled;
        let src = match value {
            Some(v) => {
                filled = self.full(&at, v, dtype)?;
                &filled
            }
            None => tensor_at("scatter", inputs, 2)?,
        };
        self.placed(Kernel::ScatterAdd { dim }, a, index, src, &counts)
    }

    /// Advanced indexing `a[i0, i1, ...] = values` (or `+=`): the index tensors, wrapped and
    /// broadcast, give one row-major position into `a`'s leading dimensions; `a` seen as
    /// `[positions, *rest]` takes the values' rows there by `index_copy` (`index_add`).
    fn index_put(&self, accumulate: bool, inputs: &[Input<'_, B::Tensor>]) -> R<B::Tensor> {
        let a = tensor_at("index_put", inputs, 0)?;
        let values = tensor_at("index_put", inputs, 1)?;
        let indices = (2..inputs.len())
            .map(|i| tensor_at("index_put", inputs, i))
            .collect::<R<Vec<_>>>()?;
        let shape = self.shape(a);
        let k = indices.len();
        if k == 0 || k > shape.len() {
            return Err(err(
                "index_put",
                format!("{k} index tensors for a tensor of shape {shape:?}"),
            ));
        }
        let shapes: Vec<Vec<usize>> = indices.iter().map(|t| self.shape(t)).collect();
        let mut common: Vec<usize> = Vec::new();
        for s in &shapes {
            common = tracepass_ir::broadcast_shapes(&common, s).ok_or_else(|| {
                err(
                    "index_put",
                    format!("index shapes {shapes:?} do not broadcast"),
                )
            })?;
        }
        let to_i64 = |s: &[usize]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
        let mut position: Option<B::Tensor> = None;
        let mut stride = 1usize;
        for (j, idx) in indices.iter().enumerate().rev() {
            let e = self.k(Kernel::Expand(to_i64(&common)), &[idx])?;
            let e = self.k(Kernel::Convert(DType::I64), &[&e])?;
            // negative indices count from the end
            let negative = self.cmp_s(CompareOp::Lt, &e, 0.0)?;
            let shifted = self.ew_s(BinaryOp::Add, &e, shape[j] as f64)?;
            let e = self.k(
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Input(2),
                    dtype: DType::I64,
                },
                &[&negative, &shifted, &e],
            )?;
            let term = self.ew_s(BinaryOp::Mul, &e, stride as f64)?;
            position = Some(match position {
                None => term,
                Some(p) => self.bin(BinaryOp::Add, &p, &term, 1.0)?,
            });
            stride *= shape[j];
        }
        let position = position.ok_or_else(|| err("index_put", "no index tensors"))?;
        let n: usize = common.iter().product();
        let position = self.reshape(&position, &[n])?;
        let rest = &shape[k..];
        let flat_shape: Vec<usize> = std::iter::once(stride)
            .chain(rest.iter().copied())
            .collect();
        let flat = self.reshape(a, &flat_shape)?;
        let full_shape: Vec<usize> = common.iter().chain(rest).copied().collect();
        let rows = self.k(Kernel::Expand(to_i64(&full_shape)), &[values])?;
        let row_shape: Vec<usize> = std::iter::once(n).chain(rest.iter().copied()).collect();
        let rows = self.reshape(&rows, &row_shape)?;
        let out = if accumulate {
            self.k(Kernel::IndexAdd { dim: 0 }, &[&flat, &position, &rows])?
        } else {
            self.index_copy(&flat, 0, &position, &rows)?
        };
        self.reshape(&out, &shape)
    }

    /// Each window a slice, stacked along `dim`, its elements moved to the last dimension.
    fn unfold(&self, x: &B::Tensor, dim: usize, size: usize, step: usize) -> R<B::Tensor> {
        let mut shape = self.shape(x);
        let scalar = shape.is_empty();
        let x = if scalar {
            shape = vec![1];
            self.reshape(x, &shape)?
        } else {
            self.k(Kernel::Identity, &[x])?
        };
        let n = *shape
            .get(dim)
            .ok_or_else(|| err("unfold", format!("no dimension {dim} in {shape:?}")))?;
        if size > n || step == 0 {
            return Err(err(
                "unfold",
                format!("windows of {size} every {step} along {n} elements"),
            ));
        }
        let windows = (n - size) / step + 1;
        let slices = (0..windows)
            .map(|w| {
                let mut start = vec![0i64; shape.len()];
                let mut end: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                start[dim] = (w * step) as i64;
                end[dim] = (w * step + size) as i64;
                self.k(
                    Kernel::Slice {
                        start,
                        end,
                        step: vec![1; shape.len()],
                    },
                    &[&x],
                )
            })
            .collect::<R<Vec<_>>>()?;
        let refs: Vec<&B::Tensor> = slices.iter().collect();
        let stacked = self.k(Kernel::Stack { dim: dim as i64 }, &refs)?;
        // [.., windows, size, ..]: the window's elements (dim + 1) last
        let rank = shape.len() + 1;
        let perm: Vec<usize> = (0..rank)
            .filter(|&d| d != dim + 1)
            .chain([dim + 1])
            .collect();
        let moved = self.k(Kernel::Permute(perm), &[&stacked])?;
        let mut out = if scalar { Vec::new() } else { shape.clone() };
        if let Some(d) = out.get_mut(dim) {
            *d = windows;
        }
        out.push(size);
        self.reshape(&moved, &out)
    }

    /// `e = floor(log2 |x|) + 1` and `m = x * 2^-e` (the power of two in two halves, so a
    /// subnormal `x` does not overflow it), moved by one where `log2` rounded across a power
    /// of two; 0, inf and NaN are their own mantissa with exponent 0.
    fn frexp(&self, x: &B::Tensor) -> R<Vec<B::Tensor>> {
        let dtype = self.b.dtype(x);
        let un = |op, t: &B::Tensor| self.k(Kernel::Unary(op), &[t]);
        let select = |cond: &B::Tensor, a: &B::Tensor, b: &B::Tensor| {
            let dtype = self.b.dtype(a);
            self.k(
                Kernel::Where {
                    a: Side::Input(1),
                    b: Side::Input(2),
                    dtype,
                },
                &[cond, a, b],
            )
        };
        let abs = un(UnaryOp::Abs, x)?;
        let log = un(UnaryOp::Log2, &abs)?;
        let floor = un(UnaryOp::Floor, &log)?;
        let mut e = self.ew_s(BinaryOp::Add, &floor, 1.0)?;
        let half = self.ew_s(BinaryOp::Mul, &e, 0.5)?;
        let h = un(UnaryOp::Floor, &half)?;
        let rest = self.bin(BinaryOp::Sub, &e, &h, 1.0)?;
        let mut m = x.clone();
        for part in [&h, &rest] {
            let neg = un(UnaryOp::Neg, part)?;
            let scale = un(UnaryOp::Exp2, &neg)?;
            m = self.bin(BinaryOp::Mul, &m, &scale, 1.0)?;
        }
        // log2 rounded up or down across a power of two: one step back into [0.5, 1)
        for (op, bound, by, step) in [
            (CompareOp::Ge, 1.0, 0.5, 1.0),
            (CompareOp::Lt, 0.5, 2.0, -1.0),
        ] {
            let am = un(UnaryOp::Abs, &m)?;
            let off = self.cmp_s(op, &am, bound)?;
            let moved = self.ew_s(BinaryOp::Mul, &m, by)?;
            let stepped = self.ew_s(BinaryOp::Add, &e, step)?;
            m = select(&off, &moved, &m)?;
            e = select(&off, &stepped, &e)?;
        }
        let finite = self.cmp_s(CompareOp::Lt, &abs, f64::INFINITY)?;
        let nonzero = self.cmp_s(CompareOp::Ne, x, 0.0)?;
        let regular = self.k(
            Kernel::Where {
                a: Side::Input(1),
                b: Side::Scalar(0.0),
                dtype: DType::Bool,
            },
            &[&finite, &nonzero],
        )?;
        let mantissa = select(&regular, &m, x)?;
        let exponent = self.k(
            Kernel::Where {
                a: Side::Input(1),
                b: Side::Scalar(0.0),
                dtype,
            },
            &[&regular, &e],
        )?;
        let exponent = self.k(Kernel::Convert(DType::I32), &[&exponent])?;
        Ok(vec![mantissa, exponent])
    }

    /// The windows by [`Cx::unfold`] along D, H and W (after padding with -inf), their maxima
    /// and first argmax, the argmax turned into a position in the unpadded plane.
    fn max_pool3d(
        &self,
        x: &B::Tensor,
        kernel: [usize; 3],
        stride: [usize; 3],
        padding: [usize; 3],
    ) -> R<Vec<B::Tensor>> {
        let shape = self.shape(x);
        let batched = match shape.len() {
            5 => shape.clone(),
            4 => std::iter::once(1).chain(shape.iter().copied()).collect(),
            r => return Err(err("max_pool3d", format!("a rank-{r} input"))),
        };
        let x = self.reshape(x, &batched)?;
        let padded = if padding == [0; 3] {
            x
        } else {
            let mut config = vec![(0, 0, 0); 2];
            config.extend(padding.iter().map(|&p| (p as i64, p as i64, 0)));
            self.k(
                Kernel::Pad {
                    value: f64::NEG_INFINITY,
                    config,
                },
                &[&x],
            )?
        };
        let mut windows = padded;
        for d in 0..3 {
            windows = self.unfold(&windows, 2 + d, kernel[d], stride[d])?;
        }
        let ws = self.shape(&windows);
        let out: Vec<usize> = ws[..5].to_vec();
        let taps: usize = kernel.iter().product();
        let flat: Vec<usize> = out.iter().copied().chain([taps]).collect();
        let windows = self.reshape(&windows, &flat)?;
        let dtype = self.b.dtype(&windows);
        let values = self.k(
            Kernel::Reduce {
                op: ReduceOp::Amax,
                dims: vec![5],
                keepdim: false,
                dtype,
            },
            &[&windows],
        )?;
        let tap = self.k(
            Kernel::ArgExtremum {
                max: true,
                dim: Some(5),
                keepdim: false,
            },
            &[&windows],
        )?;
        // tap = (kd * kh + ih) * kw + iw; the position (d0 + kd) * H * W + (h0 + ih) * W + w0 + iw
        let (h, w) = (batched[3] as f64, batched[4] as f64);
        let [_, kh, kw] = kernel.map(|k| k as f64);
        let along = |d: usize, n: usize| -> R<B::Tensor> {
            // the window starts of dimension d, shaped to broadcast over [oD, oH, oW]
            let starts = self.k(
                Kernel::Arange {
                    start: 0.0,
                    end: n as f64,
                    step: 1.0,
                    dtype: DType::I64,
                },
                &[],
            )?;
            let mut s = vec![1usize; 3];
            s[d] = n;
            let starts = self.reshape(&starts, &s)?;
            let scaled = self.ew_s(BinaryOp::Mul, &starts, stride[d] as f64)?;
            self.ew_s(BinaryOp::Sub, &scaled, padding[d] as f64)
        };
        let div = |t: &B::Tensor, by: f64| self.ew_s(BinaryOp::FloorDivide, t, by);
        let rem = |t: &B::Tensor, by: f64| self.ew_s(BinaryOp::Remainder, t, by);
        let id = div(&tap, kh * kw)?;
        let ih = rem(&div(&tap, kw)?, kh)?;
        let iw = rem(&tap, kw)?;
        let pd = self.bin(BinaryOp::Add, &along(0, out[2])?, &id, 1.0)?;
        let ph = self.bin(BinaryOp::Add, &along(1, out[3])?, &ih, 1.0)?;
        let pw = self.bin(BinaryOp::Add, &along(2, out[4])?, &iw, 1.0)?;
        let rows = self.ew_s(BinaryOp::Mul, &pd, h * w)?;
        let cols = self.ew_s(BinaryOp::Mul, &ph, w)?;
        let pos = self.bin(BinaryOp::Add, &rows, &cols, 1.0)?;
        let pos = self.bin(BinaryOp::Add, &pos, &pw, 1.0)?;
        let unbatched: Vec<usize> = if shape.len() == 4 {
            out[1..].to_vec()
        } else {
            out
        };
        Ok(vec![
            self.reshape(&values, &unbatched)?,
            self.reshape(&pos, &unbatched)?,
        ])
    }

    /// Each gradient added at its index in its `D * H * W` plane (`scatter_add`).
    fn max_pool3d_backward(&self, g: &B::Tensor, x: &B::Tensor, idx: &B::Tensor) -> R<B::Tensor> {
        let shape = self.shape(x);
        let r = shape.len();
        if r < 3 {
            return Err(err("max_pool3d_backward", format!("input {shape:?}")));
        }
        let planes: usize = shape[..r - 3].iter().product();
        let plane: usize = shape[r - 3..].iter().product();
        let n = self.b.shape(g).iter().product::<usize>() / planes.max(1);
        let g = self.reshape(g, &[planes, n])?;
        let idx = self.reshape(idx, &[planes, n])?;
        let zeros = self.full(&[planes, plane], 0.0, self.b.dtype(&g))?;
        let out = self.k(Kernel::ScatterAdd { dim: 1 }, &[&zeros, &idx, &g])?;
        self.reshape(&out, &shape)
    }

    /// `(x - mean) / sqrt(var + eps) * weight + bias` per channel (dimension 1): the batch's
    /// biased statistics in training, the running ones in evaluation.
    fn batch_norm(
        &self,
        training: bool,
        eps: f64,
        running: bool,
        weight: bool,
        bias: bool,
        inputs: &[Input<'_, B::Tensor>],
    ) -> R<B::Tensor> {
        let x = tensor_at("batch_norm", inputs, 0)?;
        let shape = self.shape(x);
        if shape.len() < 2 {
            return Err(err(
                "batch_norm",
                format!("input {shape:?} has no channels"),
            ));
        }
        let mut channel = vec![1usize; shape.len()];
        channel[1] = shape[1];
        let mut next = 1;
        let mut take = |present: bool| -> R<Option<B::Tensor>> {
            if !present {
                return Ok(None);
            }
            let t = tensor_at("batch_norm", inputs, next)?;
            next += 1;
            self.reshape(t, &channel).map(Some)
        };
        let stats = (take(running)?, take(running)?);
        let (weight, bias) = (take(weight)?, take(bias)?);
        let (var, mean) = match (training, stats) {
            (false, (Some(m), Some(v))) => (v, m),
            (false, _) => return Err(err("batch_norm", "evaluation needs running statistics")),
            (true, _) => {
                let dims: Vec<i64> = (0..shape.len() as i64).filter(|&d| d != 1).collect();
                let mut vm = self.b.run_multi(
                    &Kernel::VarMean {
                        dims: Some(dims),
                        correction: 0.0,
                        keepdim: true,
                    },
                    &[Input::Tensor(x)],
                )?;
                match (vm.pop(), vm.pop()) {
                    (Some(m), Some(v)) => (v, m),
                    _ => return Err(err("batch_norm", "var_mean gave no pair")),
                }
            }
        };
        let centered = self.bin(BinaryOp::Sub, x, &mean, 1.0)?;
        let shifted = self.ew_s(BinaryOp::Add, &var, eps)?;
        let inv = self.k(Kernel::Unary(UnaryOp::Rsqrt), &[&shifted])?;
        let mut y = self.bin(BinaryOp::Mul, &centered, &inv, 1.0)?;
        if let Some(w) = weight {
            y = self.bin(BinaryOp::Mul, &y, &w, 1.0)?;
        }
        if let Some(b) = bias {
            y = self.bin(BinaryOp::Add, &y, &b, 1.0)?;
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;
    use crate::tensor::Tensor;

    fn run(kernel: Kernel, inputs: &[&Tensor]) -> Tensor {
        let inputs: Vec<Input<'_, Tensor>> = inputs.iter().map(|t| Input::Tensor(*t)).collect();
        CpuBackend.run(&kernel, &inputs).expect("runs")
    }

    fn run_err(kernel: Kernel, inputs: &[&Tensor]) -> String {
        let inputs: Vec<Input<'_, Tensor>> = inputs.iter().map(|t| Input::Tensor(*t)).collect();
        match CpuBackend.run(&kernel, &inputs) {
            Ok(_) => String::from("ran"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn frexp_splits_every_kind_of_float_as_c_does() {
        let xs = [
            0.75f32,
            -3.0,
            1.0,
            0.5,
            1e30,
            -1e-30,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-45, // subnormal: 2^-149
            0.999_999_94,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NAN,
        ];
        let x = Tensor::from_f32(vec![xs.len()], xs.to_vec());
        let out = CpuBackend
            .run_multi(&Kernel::Frexp, &[Input::Tensor(&x)])
            .expect("runs");
        let (m, e) = (out[0].to_f32_vec(), out[1].to_i64_vec());
        assert_eq!(out[1].dtype(), DType::I32);
        for (i, &v) in xs.iter().enumerate() {
            if !v.is_finite() || v == 0.0 {
                // PyTorch: the value itself and exponent 0
                assert!(m[i] == v || (m[i].is_nan() && v.is_nan()), "{v}: {}", m[i]);
                assert_eq!(e[i], 0, "{v}");
                continue;
            }
            let (want_m, want_e) = libm::frexpf(v);
            assert_eq!((m[i], e[i]), (want_m, i64::from(want_e)), "frexp({v:e})");
        }
    }

    #[test]
    fn index_put_wraps_negative_indices_and_accumulates() {
        let a = Tensor::from_f32(vec![3, 2], vec![0.0; 6]);
        let rows = Tensor::from_i64(vec![2], vec![0, -1]);
        let cols = Tensor::from_i64(vec![1], vec![1]);
        let v = Tensor::from_f32(vec![2], vec![5.0, 7.0]);
        let put = run(
            Kernel::IndexPut { accumulate: false },
            &[&a, &v, &rows, &cols],
        );
        assert_eq!(put.to_f32_vec(), vec![0.0, 5.0, 0.0, 0.0, 0.0, 7.0]);
        let twice = Tensor::from_i64(vec![2], vec![2, 2]);
        let acc = run(Kernel::IndexPut { accumulate: true }, &[&put, &v, &twice]);
        // one index tensor: whole rows; row 2 twice, each time adding the row [5, 7]
        assert_eq!(acc.to_f32_vec(), vec![0.0, 5.0, 0.0, 0.0, 10.0, 21.0]);
    }

    #[test]
    fn unfold_gives_the_windows_in_a_new_last_dimension() {
        // torch.arange(8.).reshape(2, 4).unfold(1, 2, 2) = [[[0,1],[2,3]],[[4,5],[6,7]]]
        let x = Tensor::from_f32(vec![2, 4], (0..8).map(|v| v as f32).collect());
        let w = run(
            Kernel::Unfold {
                dim: 1,
                size: 2,
                step: 2,
            },
            &[&x],
        );
        assert_eq!(w.shape(), &[2, 2, 2]);
        assert_eq!(w.to_f32_vec(), (0..8).map(|v| v as f32).collect::<Vec<_>>());
        // along dim 0, windows of 2 every 1: [1, 4, 2], the window's rows last
        let w = run(
            Kernel::Unfold {
                dim: 0,
                size: 2,
                step: 1,
            },
            &[&x],
        );
        assert_eq!(w.shape(), &[1, 4, 2]);
        assert_eq!(w.to_f32_vec(), vec![0., 4., 1., 5., 2., 6., 3., 7.]);
    }

    #[test]
    fn an_overwrite_with_a_repeated_index_is_refused_not_summed() {
        let a = Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]);
        let index = Tensor::from_i64(vec![2], vec![1, 1]);
        let source = Tensor::from_f32(vec![2], vec![5.0, 7.0]);
        let e = run_err(Kernel::IndexCopy { dim: 0 }, &[&a, &index, &source]);
        assert!(e.contains("index_copy") && e.contains("repeats"), "{e}");
        let scatter = Kernel::Scatter {
            dim: 0,
            value: Some(9.0),
        };
        let e = run_err(scatter, &[&a, &index]);
        assert!(e.contains("scatter") && e.contains("repeats"), "{e}");
    }

    #[test]
    fn scatter_overwrites_and_any_reduces_over_a_dimension() {
        let a = Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let index = Tensor::from_i64(vec![1, 2], vec![1, 0]);
        let s = run(
            Kernel::Scatter {
                dim: 0,
                value: Some(9.0),
            },
            &[&a, &index],
        );
        assert_eq!(s.to_f32_vec(), vec![1.0, 9.0, 9.0, 4.0]);
        let x = Tensor::from_f32(vec![2, 2], vec![0.0, f32::NAN, 0.0, 0.0]);
        let any = run(
            Kernel::Any {
                dims: vec![1],
                keepdim: false,
            },
            &[&x],
        );
        assert_eq!(any.to_bool_vec(), vec![true, false]);
    }

    #[test]
    fn max_pool3d_indexes_the_unpadded_plane_and_its_gradient_goes_back_there() {
        // kernel 2, stride 2, padding 1 on 2x2x2: each window holds one real element
        let x = Tensor::from_f32(vec![1, 1, 2, 2, 2], (0..8).map(|v| v as f32).collect());
        let out = CpuBackend
            .run_multi(
                &Kernel::MaxPool3d {
                    kernel: [2; 3],
                    stride: [2; 3],
                    padding: [1; 3],
                },
                &[Input::Tensor(&x)],
            )
            .expect("runs");
        assert_eq!(out[0].shape(), &[1, 1, 2, 2, 2]);
        assert_eq!(out[0].to_f32_vec(), x.to_f32_vec());
        assert_eq!(out[1].to_i64_vec(), (0..8).collect::<Vec<i64>>());
        // no padding, one window over everything: the maximum is the last element
        let out = CpuBackend
            .run_multi(
                &Kernel::MaxPool3d {
                    kernel: [2; 3],
                    stride: [1; 3],
                    padding: [0; 3],
                },
                &[Input::Tensor(&x)],
            )
            .expect("runs");
        assert_eq!(
            (out[0].to_f32_vec(), out[1].to_i64_vec()),
            (vec![7.0], vec![7])
        );
        let g = Tensor::from_f32(vec![1, 1, 1, 1, 1], vec![3.0]);
        let back = run(Kernel::MaxPool3dBackward, &[&g, &x, &out[1]]);
        assert_eq!(back.to_f32_vec(), vec![0., 0., 0., 0., 0., 0., 0., 3.]);
    }

    #[test]
    fn lerp_is_exact_at_both_ends() {
        let start = Tensor::from_f32(vec![3], vec![1.0, 1.0, 1.0]);
        let end = Tensor::from_f32(vec![3], vec![3.0, 3.0, 3.0]);
        let w = Tensor::from_f32(vec![3], vec![0.0, 0.25, 1.0]);
        let l = CpuBackend
            .run(
                &Kernel::Lerp {
                    weight: Side::Input(2),
                },
                &[
                    Input::Tensor(&start),
                    Input::Tensor(&end),
                    Input::Tensor(&w),
                ],
            )
            .expect("runs");
        assert_eq!(l.to_f32_vec(), vec![1.0, 1.5, 3.0]);
    }

    /// `ldexp(a, b) = a * 2^b` by its definition, the power in the result's dtype.
    #[test]
    fn ldexp_multiplies_by_a_power_of_two_in_the_result_dtype() {
        let a = Tensor::from_f64(vec![4], vec![1.0, -3.0, 0.5, 7.0]);
        let b = Tensor::from_i64(vec![4], vec![200, -2, 3, 0]);
        let l = run(Kernel::Ldexp { dtype: DType::F64 }, &[&a, &b]);
        assert_eq!(l.dtype(), DType::F64);
        let want: Vec<f64> = [(1.0, 200), (-3.0, -2), (0.5, 3), (7.0, 0)]
            .iter()
            .map(|&(m, e)| m * 2f64.powi(e))
            .collect();
        assert_eq!(l.to_f64_vec(), want);
        // integers promote to float32
        let i = Tensor::from_i64(vec![2], vec![3, -1]);
        let l = run(Kernel::Ldexp { dtype: DType::F32 }, &[&i, &i]);
        assert_eq!(l.to_f32_vec(), vec![24.0, -0.5]);
        let e = run_err(Kernel::Ldexp { dtype: DType::I64 }, &[&i, &i]);
        assert!(e.contains("ldexp"), "{e}");
    }

    /// `a + value * t1 * t2`, wrapping like PyTorch's integer arithmetic.
    #[test]
    fn integer_addcmul_wraps_in_its_dtype() {
        let a = Tensor::from_i64(vec![3], vec![1, -2, 0]);
        let t1 = Tensor::from_i64(vec![3], vec![2, 3, i64::MAX]);
        let t2 = Tensor::from_i64(vec![1], vec![5]);
        let k = Kernel::Addcmul {
            value: -2.0,
            dtype: DType::I64,
        };
        let out = run(k, &[&a, &t1, &t2]);
        let want: Vec<i64> = [(1i64, 2i64), (-2, 3), (0, i64::MAX)]
            .iter()
            .map(|&(x, y)| x.wrapping_add((-2i64).wrapping_mul(y).wrapping_mul(5)))
            .collect();
        assert_eq!(out.to_i64_vec(), want);
        let a32 = Tensor::from_i64(vec![1], vec![i64::from(i32::MAX)])
            .to_dtype(DType::I32)
            .unwrap();
        let k32 = Kernel::Addcmul {
            value: 1.0,
            dtype: DType::I32,
        };
        let out = run(k32, &[&a32, &a32, &a32]);
        assert_eq!(out.dtype(), DType::I32);
        let m = i32::MAX;
        assert_eq!(
            out.to_i64_vec(),
            vec![i64::from(m.wrapping_add(m.wrapping_mul(m)))]
        );
        let frac = Kernel::Addcmul {
            value: 0.5,
            dtype: DType::I64,
        };
        assert!(run_err(frac, &[&a, &t1, &t2]).contains("not an integer"));
        let f = Tensor::from_f32(vec![1], vec![1.0]);
        let float = Kernel::Addcmul {
            value: 1.0,
            dtype: DType::F32,
        };
        assert!(run_err(float, &[&f, &f, &f]).contains("addcmul"));
    }

    /// `min(max(a, lo), hi)`: a lower bound above the upper one gives the upper one.
    #[test]
    fn clamp_with_tensor_bounds_takes_the_max_then_the_min() {
        let a = Tensor::from_i64(vec![4], vec![-5, 0, 5, 9]);
        let lo = Tensor::from_i64(vec![4], vec![-1, 1, 0, 10]);
        let hi = Tensor::from_i64(vec![4], vec![3, 3, 3, 2]);
        let k = Kernel::Clamp {
            min: Side::Input(1),
            max: Side::Input(2),
            dtype: DType::I64,
        };
        let out = run(k, &[&a, &lo, &hi]);
        let want: Vec<i64> = [(-5i64, -1i64, 3i64), (0, 1, 3), (5, 0, 3), (9, 10, 2)]
            .iter()
            .map(|&(x, l, h)| x.max(l).min(h))
            .collect();
        assert_eq!(out.to_i64_vec(), want);
        let k = Kernel::Clamp {
            min: Side::Scalar(0.0),
            max: Side::Input(1),
            dtype: DType::I64,
        };
        assert_eq!(run(k, &[&a, &hi]).to_i64_vec(), vec![0, 0, 3, 2]);
    }
}
