//! The device interface the executor drives: kernels, bucket packing, host transfers.

pub use crate::cpu::buffer_pool::PoolStats;
pub use crate::cpu::random::RngKey;
use crate::exec::kernel::{BinaryOp, Kernel, Side};
use crate::exec::memory_plan::MemoryPlan;
use crate::exec::region::RegionProgram;
use crate::tensor::Tensor;
use tracepass_ir::DType;

/// An operand handed to a kernel: a tensor, or a number the trace computed or wrote.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a, T> {
    Tensor(&'a T),
    Scalar(f64),
}

/// Why a kernel could not run (the executor adds which node).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct KernelError(pub String);

impl From<String> for KernelError {
    fn from(s: String) -> Self {
        KernelError(s)
    }
}
impl From<&str> for KernelError {
    fn from(s: &str) -> Self {
        KernelError(s.to_string())
    }
}

/// The tensors of a multi-output kernel, inline up to four (values and indices, variance and
/// mean, a q/k/v split): running one allocates no list.
pub type Outputs<T> = smallvec::SmallVec<[T; 4]>;

/// A device that holds tensors and runs kernels on them.
pub trait Backend: Send + Sync + 'static {
    type Tensor: Clone + Send + Sync + std::fmt::Debug + 'static;

    fn name(&self) -> &'static str;
    /// Runs one kernel; `inputs` are numbered as the kernel's `Side::Input`s.
    fn run(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, Self::Tensor>],
    ) -> Result<Self::Tensor, KernelError>;
    /// Runs a kernel that gives several tensors (`Kernel::outputs() > 1`: max-pool's values
    /// and indices, var_mean, split), one per output of the node.
    fn run_multi(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, Self::Tensor>],
    ) -> Result<Outputs<Self::Tensor>, KernelError> {
        self.run(kernel, inputs).map(|t| smallvec::smallvec![t])
    }
    /// Runs a random kernel (`Kernel::Uniform`, `Kernel::Normal`) drawing from the stream `key` names, so a
    /// value depends on (seed, rank, step, node) and its index only.
    fn random(&self, kernel: &Kernel, key: RngKey) -> Result<Self::Tensor, KernelError> {
        let _ = key;
        Err(KernelError(format!(
            "{kernel:?}: random numbers are not implemented on the {} backend",
            self.name()
        )))
    }
    /// Runs a fusion region on its operands. The default runs the body's kernels one after
    /// the other (the unfused ops' results); a backend runs [`RegionProgram::fused`] as one
    /// loop or kernel when there is one.
    fn run_region(
        &self,
        region: &RegionProgram,
        inputs: &[Input<'_, Self::Tensor>],
    ) -> Result<Self::Tensor, KernelError> {
        region.run_steps(self, inputs)
    }
    /// Concatenates the flattened members into one 1-d bucket buffer.
    fn pack(&self, members: &[&Self::Tensor]) -> Result<Self::Tensor, KernelError>;
    /// Like `pack`, dividing each member that has a divisor by it (in the member's compute
    /// type, as the `div` kernel would). The default divides first, then packs; a backend can
    /// do both in one pass.
    fn pack_divided(
        &self,
        members: &[&Self::Tensor],
        divisors: &[Option<f64>],
    ) -> Result<Self::Tensor, KernelError> {
        let divided: Vec<Option<Self::Tensor>> = members
            .iter()
            .zip(divisors.iter().chain(std::iter::repeat(&None)))
            .map(|(m, d)| {
                d.map(|by| {
                    self.run(
                        &Kernel::Binary {
                            op: BinaryOp::Div,
                            a: Side::Input(0),
                            b: Side::Scalar(by),
                            alpha: 1.0,
                        },
                        &[Input::Tensor(*m)],
                    )
                })
                .transpose()
            })
            .collect::<Result<_, _>>()?;
        let refs: Vec<&Self::Tensor> = members
            .iter()
            .zip(&divided)
            .map(|(m, d)| d.as_ref().unwrap_or(*m))
            .collect();
        self.pack(&refs)
    }
    /// Views of a bucket buffer, appended to `out` (the caller's list, kept from step to
    /// step): member `i` starts at element `offsets[i]` and has `shapes[i]`.
    fn unpack(
        &self,
        buffer: &Self::Tensor,
        offsets: &[usize],
        shapes: &[Vec<usize>],
        out: &mut Vec<Self::Tensor>,
    ) -> Result<(), KernelError>;
    fn upload(&self, host: &Tensor) -> Result<Self::Tensor, KernelError>;
    fn download(&self, t: &Self::Tensor) -> Result<Tensor, KernelError>;
    fn shape<'a>(&self, t: &'a Self::Tensor) -> &'a [usize];
    fn dtype(&self, t: &Self::Tensor) -> DType;
    /// Blocks until queued work is done (a no-op on the CPU).
    fn synchronize(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// `memory` (a plan's buffers) is about to run on the calling thread: a backend that
    /// recycles buffers sizes its pool from it. The default does nothing.
    fn prepare_memory(&self, memory: &MemoryPlan) {
        let _ = memory;
    }
    /// The executor is done with `t` (its last reader has run): a backend may keep its buffer
    /// for a later kernel's output. The default drops it.
    fn recycle(&self, t: Self::Tensor) {
        drop(t);
    }
    /// Which buffer holds `t` (equal for views of one buffer) and that buffer's bytes, where
    /// the backend can tell: what [`crate::exec::Executor::measure_live_bytes`] adds up.
    fn buffer_of(&self, t: &Self::Tensor) -> Option<(usize, u64)> {
        let _ = t;
        None
    }
    /// The calling thread's buffer pool, where the backend has one (`--metrics`).
    fn pool_stats(&self) -> Option<PoolStats> {
        None
    }
    /// Zeroes the pool's per-step counters (a step's start).
    fn reset_pool_stats(&self) {}
}
