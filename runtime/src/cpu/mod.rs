//! The CPU backend: f32, f64, bf16 and f16 tensors in host memory (bf16/f16 compute in f32),
//! and i64, i32 and bool tensors for indices, counters and masks.
//!
//! Every kernel is a plain function over host tensors with explicit parameters, one concept
//! per module, so it can be tested and benchmarked without a trace.

pub(crate) mod activation;
pub(crate) mod adaptive_pool;
pub(crate) mod arg_extremum;
pub(crate) mod bitwise;
pub(crate) mod buffer_pool;
pub(crate) mod compare;
pub(crate) mod conv;
pub(crate) mod conv_transpose;
pub(crate) mod cumsum;
pub(crate) mod elementwise;
pub(crate) mod embedding;
pub(crate) mod fast_math;
pub(crate) mod fill;
pub(crate) mod gemm;
pub(crate) mod indexing;
pub(crate) mod integer;
pub(crate) mod layout;
pub(crate) mod loss_grad;
pub(crate) mod pool;
pub(crate) mod promote;
pub(crate) mod random;
pub(crate) mod real;
pub(crate) mod reduce;
pub(crate) mod region;
pub(crate) mod simd;
pub(crate) mod sort;
pub(crate) mod special;
pub(crate) mod strided;
pub(crate) mod var_mean;

use crate::exec::backend::{Backend, Input, KernelError, Outputs};
use crate::exec::kernel::{Kernel, Side};
use crate::exec::memory_plan::MemoryPlan;
use crate::tensor::{supported_dtype, Storage, Tensor};
use smallvec::smallvec;
use tracepass_ir::DType;

pub(crate) use gemm::matmul;
pub(crate) use reduce::softmax;

/// The CPU kernels as plain functions over host tensors, to test and benchmark one kernel
/// without a trace (the [`CpuBackend`] runs the same functions).
pub mod kernels {
    pub use super::compare::{compare, where_, Operand};
    pub use super::conv::convolution;
    pub use super::conv_transpose::conv_transpose;
    pub use super::elementwise::promote;
    pub use super::gemm::{linear, matmul};
    pub use super::indexing::{gather, index_add, index_select, scatter_add};
    pub use super::layout::{cat, expand, flip, pad, split, SplitSizes};
    pub use super::pool::{max_pool2d_with_indices, max_pool2d_with_indices_backward, Pool2d};
    pub use super::random::{normal, uniform};
    pub use super::reduce::{reduce, softmax};
    pub use super::sort::{argsort, sort, topk};
    pub use super::var_mean::var_mean;
}

/// The threads the calling rank computes with: the size of the rayon pool it runs in
/// (`--threads-per-rank`), or 1 outside any pool.
pub(crate) fn pool_threads() -> usize {
    if rayon::current_thread_index().is_some() {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// `run` on the calling thread, then inside a pool of 3 threads (a rank with threads), for the
/// tests that a kernel's bits do not depend on the thread count.
#[cfg(test)]
pub(crate) fn alone_and_in_three_threads<R: Send>(run: impl Fn() -> R + Send) -> (R, R) {
    let one = run();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap_or_else(|e| panic!("a pool: {e}"));
    (one, pool.install(run))
}

/// Runs kernels on the calling thread (one rank = one thread; no intra-op threads, as in the
/// one-thread-per-process PyTorch baseline).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

fn tensor<'a>(inputs: &'a [Input<'_, Tensor>], i: usize) -> Result<&'a Tensor, KernelError> {
    match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(t),
        Some(Input::Scalar(_)) => Err(KernelError(format!(
            "input {i} must be a tensor, got a number"
        ))),
        None => Err(KernelError(format!("input {i} is missing"))),
    }
}

/// An operand of a comparison or `where`.
fn operand<'a>(inputs: &'a [Input<'_, Tensor>], s: Side) -> Result<compare::Operand<'a>, String> {
    Ok(match s {
        Side::Scalar(x) => compare::Operand::Scalar(x),
        Side::Input(i) => match inputs.get(i) {
            Some(Input::Tensor(t)) => compare::Operand::Tensor(t),
            Some(Input::Scalar(x)) => compare::Operand::Scalar(*x),
            None => return Err(format!("input {i} is missing")),
        },
    })
}

/// The real models' single-output kernels (see [`crate::exec::kernel_ops`]).
fn run_model_op(kernel: &Kernel, inputs: &[Input<'_, Tensor>]) -> Result<Tensor, String> {
    let t = |i: usize| tensor(inputs, i).map_err(|e| e.0);
    match kernel {
        Kernel::Convolution {
            stride,
            padding,
            dilation,
            groups,
            bias,
        } => {
            let b = if *bias { Some(t(2)?) } else { None };
            conv::convolution(
                t(0)?,
                t(1)?,
                b,
                stride,
                padding,
                dilation,
                false,
                &[0],
                *groups,
            )
        }
        Kernel::MaxPool2dBackward => pool::max_pool2d_with_indices_backward(t(0)?, t(1)?, t(2)?),
        Kernel::Embedding => embedding::embedding(t(0)?, t(1)?),
        Kernel::EmbeddingBackward {
            num_weights,
            padding_idx,
            scale_grad_by_freq,
        } => embedding::embedding_backward(
            t(0)?,
            t(1)?,
            *num_weights,
            *padding_idx,
            *scale_grad_by_freq,
        ),
        Kernel::Var {
            dims,
            correction,
            keepdim,
            std,
        } => var_mean::var(t(0)?, dims.as_deref(), *correction, *keepdim, *std),
        Kernel::Cumsum { dim, dtype } => cumsum::cumsum(t(0)?, *dim, *dtype),
        Kernel::ArgExtremum { max, dim, keepdim } => {
            arg_extremum::arg_extremum(t(0)?, *max, *dim, *keepdim)
        }
        Kernel::Bitwise {
            op,
            a,
            b,
            logical,
            dtype,
        } => {
            let (a, b) = (operand(inputs, *a)?, operand(inputs, *b)?);
            if *logical {
                bitwise::logical(*op, a, b)
            } else {
                bitwise::bitwise(*op, a, b, *dtype)
            }
        }
        Kernel::BitwiseNot => bitwise::bitwise_not(t(0)?),
        Kernel::Shift { left, a, b, dtype } => {
            bitwise::shift(*left, operand(inputs, *a)?, operand(inputs, *b)?, *dtype)
        }

        Kernel::AdaptiveAvgPool2d { oh, ow } => adaptive_pool::adaptive_avg_pool2d(t(0)?, *oh, *ow),
        Kernel::AdaptiveAvgPool2dBackward => {
            adaptive_pool::adaptive_avg_pool2d_backward(t(0)?, t(1)?.shape())
        }
        Kernel::Pad { value, config } => layout::pad(t(0)?, *value, config),
        Kernel::Slice { start, end, step } => layout::slice(t(0)?, start, end, Some(step)),
        Kernel::Cat { dim } => {
            // inline: a step's concatenations allocate no operand list
            let all = (0..inputs.len())
                .map(t)
                .collect::<Result<smallvec::SmallVec<[&Tensor; 8]>, _>>()?;
            layout::cat(&all, *dim)
        }
        Kernel::Stack { dim } => {
            let all = (0..inputs.len())
                .map(|i| layout::unsqueeze(t(i)?, *dim))
                .collect::<Result<Vec<_>, _>>()?;
            layout::cat(&all.iter().collect::<Vec<_>>(), *dim)
        }
        Kernel::Expand(shape) => layout::expand(t(0)?, shape),
        Kernel::Flip(dims) => layout::flip(t(0)?, dims),
        Kernel::Squeeze(dims) => layout::squeeze(t(0)?, dims.as_deref()),
        Kernel::Unsqueeze(dim) => layout::unsqueeze(t(0)?, *dim),
        Kernel::Arange {
            start,
            end,
            step,
            dtype,
        } => fill::arange(*start, *end, *step, *dtype),
        Kernel::Full {
            shape,
            value,
            dtype,
        } => fill::full(shape, *value, *dtype),
        Kernel::Compare { op, a, b } => {
            compare::compare(*op, operand(inputs, *a)?, operand(inputs, *b)?)
        }
        Kernel::Where { a, b, dtype } => {
            compare::where_(t(0)?, operand(inputs, *a)?, operand(inputs, *b)?, *dtype)
        }
        Kernel::Silu => activation::silu(t(0)?),
        Kernel::Activation(act) => activation::activation(*act, t(0)?),
        Kernel::Copy => layout::copy_into(t(0)?, t(1)?),
        Kernel::TakeAlongDim { dim } => loss_grad::take_along_dim(t(0)?, t(1)?, *dim),
        Kernel::Gather { dim } => indexing::gather(t(0)?, *dim, t(1)?),
        Kernel::ScatterAdd { dim } => indexing::scatter_add(t(0)?, *dim, t(1)?, t(2)?),
        Kernel::IndexSelect { dim } => indexing::index_select(t(0)?, *dim, t(1)?),
        Kernel::IndexAdd { dim } => indexing::index_add(t(0)?, *dim, t(1)?, t(2)?),
        Kernel::Argsort { dim, descending } => sort::argsort(t(0)?, *dim, *descending),
        Kernel::NllLossBackward {
            reduction,
            ignore_index,
            weighted,
        } => loss_grad::nll_loss_backward(
            t(0)?,
            t(1)?,
            t(2)?,
            if *weighted { Some(t(4)?) } else { None },
            reduction.as_str(),
            *ignore_index,
            t(3)?,
        ),
        Kernel::SoftmaxBackward { dim, log, dtype } => {
            loss_grad::softmax_backward(t(0)?, t(1)?, *dim, *log, *dtype)
        }
        Kernel::Uniform { .. } | Kernel::Normal { .. } => Err(
            "random kernels draw from a keyed random stream: the executor runs them through \
             `Backend::random`"
                .into(),
        ),
        other => Err(format!("{other:?} is not a kernel of the real models' ops")),
    }
}

fn check_dtype(t: &Tensor) -> Result<(), KernelError> {
    if supported_dtype(t.dtype()) {
        Ok(())
    } else {
        Err(KernelError(format!(
            "dtype {} is not supported by the cpu backend",
            t.dtype()
        )))
    }
}

impl Backend for CpuBackend {
    type Tensor = Tensor;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn random(&self, kernel: &Kernel, key: random::RngKey) -> Result<Tensor, KernelError> {
        match kernel {
            Kernel::Uniform {
                shape,
                minval,
                maxval,
                dtype,
            } => random::uniform(shape, *minval, *maxval, *dtype, key).map_err(KernelError),
            Kernel::Normal { shape, dtype } => {
                random::normal(shape, *dtype, key).map_err(KernelError)
            }
            other => Err(KernelError(format!("{other:?} is not a random kernel"))),
        }
    }

    fn run(&self, kernel: &Kernel, inputs: &[Input<'_, Tensor>]) -> Result<Tensor, KernelError> {
        // a composite is no view kernel: its result is a buffer of its own, as the memory
        // plan counts it (its last step may be a reshape that gives a view)
        if let Kernel::ConvTranspose {
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            bias,
        } = kernel
        {
            let b = if *bias {
                Some(tensor(inputs, 2)?)
            } else {
                None
            };
            return conv_transpose::conv_transpose(
                tensor(inputs, 0)?,
                tensor(inputs, 1)?,
                b,
                stride,
                padding,
                output_padding,
                dilation,
                *groups,
            )
            .map_err(KernelError);
        }
        if let Some(r) = crate::exec::composite::run(self, kernel, inputs) {
            return r.map(|t| t.contiguous());
        }
        let r = match kernel {
            Kernel::Unary(op) => elementwise::unary(*op, tensor(inputs, 0)?),
            Kernel::Binary { op, a, b, alpha } => elementwise::binary(*op, *a, *b, *alpha, inputs),
            Kernel::Identity => Ok(tensor(inputs, 0)?.clone()),
            Kernel::Reshape(shape) => tensor(inputs, 0)?.reshape(shape),
            Kernel::Permute(perm) => tensor(inputs, 0)?.permute(perm),
            Kernel::Convert(d) => {
                let t = tensor(inputs, 0)?;
                if t.dtype() == *d {
                    Ok(t.clone())
                } else {
                    t.to_dtype(*d)
                        .ok_or_else(|| format!("cannot convert {} to {d}", t.dtype()))
                }
            }
            Kernel::Matmul => gemm::matmul(tensor(inputs, 0)?, tensor(inputs, 1)?),
            Kernel::Linear { bias } => {
                let b = if *bias {
                    Some(tensor(inputs, 2)?)
                } else {
                    None
                };
                gemm::linear(tensor(inputs, 0)?, tensor(inputs, 1)?, b)
            }
            Kernel::Reduce {
                op,
                dims,
                keepdim,
                dtype,
            } => reduce::reduce(tensor(inputs, 0)?, *op, dims, *keepdim, *dtype),
            Kernel::Softmax { dim, log } => reduce::softmax(tensor(inputs, 0)?, *dim, *log),
            Kernel::MaxPool2d { .. }
            | Kernel::VarMean { .. }
            | Kernel::Split { .. }
            | Kernel::Sort { .. }
            | Kernel::Topk { .. } => {
                let mut outs = self.run_multi(kernel, inputs)?;
                if outs.len() != 1 {
                    return Err(KernelError(format!(
                        "{kernel:?} gives {} tensors; the node must name each",
                        outs.len()
                    )));
                }
                Ok(outs.remove(0))
            }
            other => run_model_op(other, inputs),
        };
        r.map_err(KernelError)
    }

    fn run_multi(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, Tensor>],
    ) -> Result<Outputs<Tensor>, KernelError> {
        if let Some(r) = crate::exec::composite::run_multi(self, kernel, inputs) {
            return r.map(|ts| ts.into_iter().map(|t| t.contiguous()).collect());
        }
        let r = match kernel {
            Kernel::MaxPool2d {
                kernel,
                stride,
                padding,
                dilation,
                ceil_mode,
            } => {
                let x = tensor(inputs, 0)?;
                pool::Pool2d::new(kernel, stride, padding, dilation, *ceil_mode)
                    .and_then(|p| pool::max_pool2d_with_indices(x, &p))
                    .map(|(v, i)| smallvec![v, i])
            }
            Kernel::VarMean {
                dims,
                correction,
                keepdim,
            } => var_mean::var_mean(tensor(inputs, 0)?, dims.as_deref(), *correction, *keepdim)
                .map(|(v, m)| smallvec![v, m]),
            Kernel::Split { sizes, dim } => {
                layout::split(tensor(inputs, 0)?, &layout::SplitSizes::Sizes(sizes), *dim)
            }
            Kernel::Sort { dim, descending } => {
                sort::sort(tensor(inputs, 0)?, *dim, *descending).map(|(v, i)| smallvec![v, i])
            }
            Kernel::Topk { k, dim, largest } => {
                sort::topk(tensor(inputs, 0)?, *k, *dim, *largest).map(|(v, i)| smallvec![v, i])
            }
            other => return self.run(other, inputs).map(|t| smallvec![t]),
        };
        r.map_err(KernelError)
    }

    fn run_region(
        &self,
        region: &crate::exec::region::RegionProgram,
        inputs: &[Input<'_, Tensor>],
    ) -> Result<Tensor, KernelError> {
        let fits = |i: &Input<'_, Tensor>| match i {
            Input::Tensor(t) => t.dtype() == DType::F32,
            Input::Scalar(_) => true,
        };
        match &region.fused {
            Some(f) if inputs.iter().all(fits) => Ok(region::run_fused(f, inputs)?),
            _ => region.run_steps(self, inputs),
        }
    }
    fn pack(&self, members: &[&Tensor]) -> Result<Tensor, KernelError> {
        self.pack_divided(members, &[])
    }

    /// Copies every member once, dividing on the way where it has a divisor.
    fn pack_divided(
        &self,
        members: &[&Tensor],
        divisors: &[Option<f64>],
    ) -> Result<Tensor, KernelError> {
        let first = members.first().ok_or("an empty bucket")?;
        let dtype = first.dtype();
        let total: usize = members.iter().map(|m| m.numel()).sum();
        macro_rules! concat {
            ($variant:ident, |$x:ident, $by:ident| $divided:expr) => {{
                let mut out = buffer_pool::take(total);
                for (k, m) in members.iter().enumerate() {
                    let m = m.contiguous();
                    match m.storage() {
                        Storage::$variant(v) => {
                            let src = &v[m.offset()..m.offset() + m.numel()];
                            match divisors.get(k).copied().flatten() {
                                None => out.extend_from_slice(src),
                                // dividing by one is the identity: a copy
                                Some(by) if by == 1.0 => out.extend_from_slice(src),
                                Some($by) => out.extend(src.iter().map(|&$x| $divided)),
                            }
                        }
                        other => {
                            return Err(KernelError(format!(
                                "bucket mixes {dtype} and {}",
                                other.dtype()
                            )))
                        }
                    }
                    // a strided gradient's contiguous copy goes back to the pool
                    if let Some(s) = m.into_unshared_storage() {
                        buffer_pool::give_storage(s);
                    }
                }
                Storage::$variant(out)
            }};
        }
        // the divisor in the compute type of the `div` kernel (f64 for f64, else f32)
        let data = match dtype {
            DType::F32 => concat!(F32, |x, by| x / by as f32),
            DType::F64 => concat!(F64, |x, by| x / by),
            DType::BF16 => concat!(BF16, |x, by| half::bf16::from_f32(x.to_f32() / by as f32)),
            DType::F16 => concat!(F16, |x, by| half::f16::from_f32(x.to_f32() / by as f32)),
            other => {
                return Err(KernelError(format!(
                    "dtype {other} is not supported by the cpu backend"
                )))
            }
        };
        Ok(Tensor::new([total], data))
    }

    fn unpack(
        &self,
        buffer: &Tensor,
        offsets: &[usize],
        shapes: &[Vec<usize>],
        out: &mut Vec<Tensor>,
    ) -> Result<(), KernelError> {
        if offsets.len() != shapes.len() {
            return Err(KernelError(format!(
                "{} offsets for {} members",
                offsets.len(),
                shapes.len()
            )));
        }
        let base = buffer.contiguous();
        let n = base.numel();
        for (&o, s) in offsets.iter().zip(shapes) {
            let len: usize = s.iter().product();
            if o + len > n {
                return Err(KernelError(format!(
                    "member at offset {o} with shape {s:?} overruns a bucket of {n} elements"
                )));
            }
            out.push(Tensor::view_of(&base, o, s));
        }
        Ok(())
    }

    fn upload(&self, host: &Tensor) -> Result<Tensor, KernelError> {
        check_dtype(host)?;
        Ok(host.clone())
    }

    fn download(&self, t: &Tensor) -> Result<Tensor, KernelError> {
        Ok(t.clone())
    }

    fn shape<'a>(&self, t: &'a Tensor) -> &'a [usize] {
        t.shape()
    }

    fn dtype(&self, t: &Tensor) -> DType {
        t.dtype()
    }

    fn prepare_memory(&self, memory: &MemoryPlan) {
        buffer_pool::reserve_classes(&memory.classes);
    }

    fn recycle(&self, t: Tensor) {
        if let Some(s) = t.into_unshared_storage() {
            buffer_pool::give_storage(s);
        }
    }

    fn buffer_of(&self, t: &Tensor) -> Option<(usize, u64)> {
        Some((
            t.storage_id(),
            (t.storage().len() * t.dtype().size_bytes()) as u64,
        ))
    }

    fn pool_stats(&self) -> Option<buffer_pool::PoolStats> {
        Some(buffer_pool::stats())
    }

    fn reset_pool_stats(&self) {
        buffer_pool::reset_stats();
    }
}
