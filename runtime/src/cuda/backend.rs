//! The CUDA backend: tensors in device memory (cudarc allocations, no managed memory), GEMMs
//! through cuBLAS, everything else through NVRTC kernels compiled once per op and dtype.
//! Tensors are contiguous; permutes copy, bucket views share their buffer.

use super::kernels::{self, Source, MAX_RANK};
use super::layouts::{self, View};
use super::model_kernels;
use super::CudaError;
use crate::cpu::promote::{promote_types, promote_with_scalar};
use crate::exec::backend::{Backend, Input, KernelError, Outputs};
use crate::exec::kernel::{
    Activation, BinaryOp, BitOp, CompareOp, Kernel, LossReduction, ReduceOp, Side,
};
use crate::tensor::{is_float, Storage, Tensor};
use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use half::{bf16, f16};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tracepass_ir::DType;

/// Device memory of one dtype.
pub enum DevBuf {
    F32(CudaSlice<f32>),
    BF16(CudaSlice<bf16>),
    F16(CudaSlice<f16>),
    I64(CudaSlice<i64>),
    I32(CudaSlice<i32>),
    Bool(CudaSlice<bool>),
}

impl DevBuf {
    /// Its length in elements and the stream it was allocated on.
    fn len_and_stream(&self) -> (usize, &Arc<CudaStream>) {
        match self {
            DevBuf::F32(s) => (s.len(), s.stream()),
            DevBuf::BF16(s) => (s.len(), s.stream()),
            DevBuf::F16(s) => (s.len(), s.stream()),
            DevBuf::I64(s) => (s.len(), s.stream()),
            DevBuf::I32(s) => (s.len(), s.stream()),
            DevBuf::Bool(s) => (s.len(), s.stream()),
        }
    }
    fn dtype(&self) -> DType {
        match self {
            DevBuf::F32(_) => DType::F32,
            DevBuf::BF16(_) => DType::BF16,
            DevBuf::F16(_) => DType::F16,
            DevBuf::I64(_) => DType::I64,
            DevBuf::I32(_) => DType::I32,
            DevBuf::Bool(_) => DType::Bool,
        }
    }
    /// Raw device address of element 0 (the kernels and cuBLAS take raw pointers; ordering is
    /// by the one compute stream, and by explicit events for communication).
    fn base(&self, stream: &CudaStream) -> u64 {
        match self {
            DevBuf::F32(s) => s.device_ptr(stream).0,
            DevBuf::BF16(s) => s.device_ptr(stream).0,
            DevBuf::F16(s) => s.device_ptr(stream).0,
            DevBuf::I64(s) => s.device_ptr(stream).0,
            DevBuf::I32(s) => s.device_ptr(stream).0,
            DevBuf::Bool(s) => s.device_ptr(stream).0,
        }
    }
}

/// A contiguous tensor in device memory, possibly a view at `offset` elements into a buffer.
#[derive(Clone)]
pub struct CudaTensor {
    shape: Vec<usize>,
    dtype: DType,
    offset: usize,
    buf: Arc<DevBuf>,
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaTensor({} {:?} @ {})",
            self.dtype, self.shape, self.offset
        )
    }
}

impl CudaTensor {
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Device address of the first element.
    pub fn ptr(&self, stream: &CudaStream) -> u64 {
        self.buf.base(stream) + (self.offset * self.dtype.size_bytes()) as u64
    }
    /// A tensor allocated (not initialized) on `stream`: the output of a collective on the
    /// communication stream, which writes every element of it.
    pub(crate) fn uninit_on(
        stream: &Arc<CudaStream>,
        shape: Vec<usize>,
        dtype: DType,
    ) -> Result<CudaTensor, String> {
        let n = shape.iter().product::<usize>().max(1);
        let e = |e: cudarc::driver::DriverError| format!("cudaMalloc: {e}");
        // SAFETY: the collective writes all of it before anything reads it.
        let buf = unsafe {
            match dtype {
                DType::F32 => DevBuf::F32(stream.alloc::<f32>(n).map_err(e)?),
                DType::BF16 => DevBuf::BF16(stream.alloc::<bf16>(n).map_err(e)?),
                DType::F16 => DevBuf::F16(stream.alloc::<f16>(n).map_err(e)?),
                other => return Err(format!("a collective cannot produce {other} on cuda")),
            }
        };
        Ok(CudaTensor {
            shape,
            dtype,
            offset: 0,
            buf: Arc::new(buf),
        })
    }
}

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    /// The device's compute capability: kernels are built as a CUBIN for its own `sm_XY`.
    cc: (i32, i32),
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Bucket buffers, kept across steps and reused once no tensor views them any more.
    buckets: Mutex<Vec<Arc<DevBuf>>>,
    /// The memory plans' buffers, recycled: by (dtype, length), how many a plan has alive at
    /// once at most and the free ones (given back after their last use, on this stream, so a
    /// later kernel on it reuses one in stream order, as `cudaFreeAsync` then
    /// `cudaMallocAsync` would, without the allocator call).
    recycled: Mutex<HashMap<(DType, usize), Recycled>>,
}

/// Of one (dtype, length): how many buffers may be kept, and the free ones.
type Recycled = (usize, Vec<DevBuf>);

fn kerr<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> KernelError + '_ {
    move |e| KernelError(format!("{what}: {e}"))
}

/// An elementwise launch over `n` elements: capped blocks, the kernels loop over the rest.
fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (kernels::elementwise_blocks(n), 1, 1),
        block_dim: (kernels::BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A row launch: one block per row of `len` elements.
fn rows(rows: usize, len: usize) -> LaunchConfig {
    let (blocks, threads) = kernels::row_launch(rows, len);
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// An element count as the kernels' `long long`.
fn count(n: usize, what: &str) -> Result<i64, KernelError> {
    i64::try_from(n).map_err(|_| KernelError(format!("{what}: {n} elements is too many")))
}

/// Launches kernel `$f` with config `$cfg` and the given arguments (all borrowed locals).
macro_rules! launch {
    ($self:expr, $f:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let mut b = $self.stream.launch_builder(&$f);
        $( b.arg($arg); )*
        // SAFETY: the argument list matches the generated kernel's signature; the pointers come
        // from live allocations of the sizes passed; the kernels bound every index by them.
        unsafe { b.launch($cfg) }.map(|_| ()).map_err(kerr("kernel launch"))
    }};
}

/// How a row-major `c(m x n) = a(m x k) @ b(k x n)` (`b` stored `n x k` when transposed) is
/// handed to cuBLAS, which is column major: `c^T = b^T a^T`, so cuBLAS's (m, n, k) are our
/// (n, m, k) and its A is our `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmCall {
    /// No output elements: nothing to run.
    Nothing,
    /// `k == 0`: the product is all zeros (cuBLAS is not called).
    Zero,
    /// Sizes and leading dimensions, each at least 1 as cuBLAS requires.
    Call {
        m: i32,
        n: i32,
        k: i32,
        lda: i32,
        ldb: i32,
        ldc: i32,
    },
}

impl GemmCall {
    pub fn new(m: usize, k: usize, n: usize, b_transposed: bool) -> Result<GemmCall, KernelError> {
        if m == 0 || n == 0 {
            return Ok(GemmCall::Nothing);
        }
        if k == 0 {
            return Ok(GemmCall::Zero);
        }
        let int = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| {
                KernelError(format!(
                    "GEMM {m} x {k} x {n}: {what} {v} is above cuBLAS's 32-bit limit"
                ))
            })
        };
        let lda = if b_transposed { k } else { n };
        Ok(GemmCall::Call {
            m: int(n, "n")?,
            n: int(m, "m")?,
            k: int(k, "k")?,
            lda: int(lda.max(1), "leading dimension")?,
            ldb: int(k.max(1), "leading dimension")?,
            ldc: int(n.max(1), "leading dimension")?,
        })
    }
}

/// A (batched) matrix product of two shapes as `torch.matmul` defines it: 1-d operands get a
/// unit dimension (dropped from the result), batch dimensions broadcast one by one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulPlan {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub out_shape: Vec<usize>,
    /// Element offsets into `a` and `b` of each output matrix, in output order.
    pub batches: Vec<(usize, usize)>,
}

impl MatmulPlan {
    pub fn new(a: &[usize], b: &[usize]) -> Result<MatmulPlan, KernelError> {
        if a.is_empty() || b.is_empty() {
            return Err(KernelError("matmul of a 0-d tensor".into()));
        }
        let (ra, rb) = (a.len(), b.len());
        let (m, k) = if ra == 1 {
            (1, a[0])
        } else {
            (a[ra - 2], a[ra - 1])
        };
        let (kb, n) = if rb == 1 {
            (b[0], 1)
        } else {
            (b[rb - 2], b[rb - 1])
        };
        if k != kb {
            return Err(KernelError(format!(
                "matmul shapes {a:?} and {b:?} do not fit ({k} != {kb})"
            )));
        }
        let (ba, bb) = (&a[..ra.saturating_sub(2)], &b[..rb.saturating_sub(2)]);
        let batch = tracepass_ir::broadcast_shapes(ba, bb).ok_or_else(|| {
            KernelError(format!(
                "matmul batch dimensions {ba:?} of {a:?} and {bb:?} of {b:?} do not broadcast"
            ))
        })?;
        // element strides of each operand's batch dimensions, 0 where it broadcasts
        let strides = |own: &[usize], mat: usize| -> Vec<usize> {
            let lead = batch.len() - own.len();
            let mut st = vec![0usize; batch.len()];
            let mut step = mat;
            for i in (0..own.len()).rev() {
                if own[i] != 1 {
                    st[lead + i] = step;
                }
                step *= own[i];
            }
            st
        };
        let (sa, sb) = (strides(ba, m * k), strides(bb, k * n));
        let count: usize = batch.iter().product();
        let mut batches = Vec::with_capacity(count);
        let mut idx = vec![0usize; batch.len()];
        for _ in 0..count {
            let oa = idx.iter().zip(&sa).map(|(i, s)| i * s).sum();
            let ob = idx.iter().zip(&sb).map(|(i, s)| i * s).sum();
            batches.push((oa, ob));
            for d in (0..batch.len()).rev() {
                idx[d] += 1;
                if idx[d] < batch[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        let mut out_shape = batch;
        if ra > 1 {
            out_shape.push(m);
        }
        if rb > 1 {
            out_shape.push(n);
        }
        Ok(MatmulPlan {
            m,
            k,
            n,
            out_shape,
            batches,
        })
    }

    /// `(stride_a, stride_b)` when the batches step evenly through both operands (one strided
    /// batched GEMM does them all; a stride of 0 repeats a matrix).
    pub fn uniform_strides(&self) -> Option<(usize, usize)> {
        let (a0, b0) = *self.batches.first()?;
        let (sa, sb) = match self.batches.get(1) {
            Some(&(a1, b1)) => (a1.checked_sub(a0)?, b1.checked_sub(b0)?),
            None => (0, 0),
        };
        self.batches
            .iter()
            .enumerate()
            .all(|(i, &(a, b))| a == a0 + i * sa && b == b0 + i * sb)
            .then_some((sa, sb))
    }
}

impl CudaBackend {
    /// The backend on GPU `ordinal`; an error (never a panic) without a driver or device.
    pub fn new(ordinal: usize) -> Result<CudaBackend, CudaError> {
        super::check_available(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::Driver(e.to_string()))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| CudaError::Driver(e.to_string()))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Library {
            lib: "cuBLAS",
            message: e.to_string(),
        })?;
        Ok(CudaBackend {
            ctx,
            cc,
            stream,
            blas,
            functions: Mutex::new(HashMap::new()),
            buckets: Mutex::new(Vec::new()),
            recycled: Mutex::new(HashMap::new()),
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The device's compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }
    /// The compute stream every kernel runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Compiles (first use) and returns a kernel.
    fn function(&self, src: Option<Source>, what: &str) -> Result<CudaFunction, KernelError> {
        let src = src.ok_or_else(|| {
            KernelError(format!(
                "{what}: no cuda kernel for this dtype (see cuda::kernels::catalog)"
            ))
        })?;
        let mut cache = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cache.get(&src.name) {
            return Ok(f.clone());
        }
        let (image, arch) =
            super::nvrtc::compile_for_device_cached(&src, self.cc).map_err(kerr("NVRTC"))?;
        let module = self
            .ctx
            .load_module(image.into_module_image())
            .map_err(|e| KernelError(format!("loading kernel `{}` ({arch}): {e}", src.name)))?;
        let f = module
            .load_function(&src.name)
            .map_err(kerr("loading a kernel"))?;
        cache.insert(src.name, f.clone());
        Ok(f)
    }

    fn alloc(&self, dtype: DType, n: usize) -> Result<Arc<DevBuf>, KernelError> {
        let n = n.max(1);
        if let Ok(mut free) = self.recycled.lock() {
            if let Some(buf) = free.get_mut(&(dtype, n)).and_then(|(_, v)| v.pop()) {
                return Ok(Arc::new(buf));
            }
        }
        // SAFETY: every kernel writes all of its output before anything reads it.
        let buf = unsafe {
            match dtype {
                DType::F32 => DevBuf::F32(self.stream.alloc::<f32>(n).map_err(kerr("cudaMalloc"))?),
                DType::BF16 => {
                    DevBuf::BF16(self.stream.alloc::<bf16>(n).map_err(kerr("cudaMalloc"))?)
                }
                DType::F16 => DevBuf::F16(self.stream.alloc::<f16>(n).map_err(kerr("cudaMalloc"))?),
                DType::I64 => DevBuf::I64(self.stream.alloc::<i64>(n).map_err(kerr("cudaMalloc"))?),
                DType::I32 => DevBuf::I32(self.stream.alloc::<i32>(n).map_err(kerr("cudaMalloc"))?),
                DType::Bool => {
                    DevBuf::Bool(self.stream.alloc::<bool>(n).map_err(kerr("cudaMalloc"))?)
                }
                other => {
                    return Err(KernelError(format!(
                        "dtype {other} is not supported on cuda (f32, bf16, f16, i64, i32, bool)"
                    )))
                }
            }
        };
        Ok(Arc::new(buf))
    }

    fn empty(&self, shape: Vec<usize>, dtype: DType) -> Result<CudaTensor, KernelError> {
        let n = shape.iter().product();
        Ok(CudaTensor {
            buf: self.alloc(dtype, n)?,
            shape,
            dtype,
            offset: 0,
        })
    }

    /// `c = a(m x k) @ b(k x n)` in row-major terms, all contiguous, through cuBLAS (column
    /// major: c^T = b^T a^T). `b_transposed`: b is stored as (n x k).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        m: usize,
        k: usize,
        n: usize,
        a: u64,
        b: u64,
        b_transposed: bool,
        c: u64,
        beta: f32,
        dtype: DType,
    ) -> Result<(), KernelError> {
        self.gemm_batched(m, k, n, a, b, b_transposed, c, beta, dtype, 1, (0, 0))
    }

    /// `batch` GEMMs whose operands step by `strides` elements (of a, b; c steps by m*n).
    #[allow(clippy::too_many_arguments)]
    fn gemm_batched(
        &self,
        m: usize,
        k: usize,
        n: usize,
        a: u64,
        b: u64,
        b_transposed: bool,
        c: u64,
        beta: f32,
        dtype: DType,
        batch: usize,
        strides: (usize, usize),
    ) -> Result<(), KernelError> {
        let ty = match dtype {
            DType::F32 => blas_sys::cudaDataType_t::CUDA_R_32F,
            DType::BF16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
            DType::F16 => blas_sys::cudaDataType_t::CUDA_R_16F,
            other => {
                return Err(KernelError(format!(
                    "matmul in {other} is not supported on cuda"
                )))
            }
        };
        let (cm, cn, ck, lda, ldb, ldc) = match GemmCall::new(m, k, n, b_transposed)? {
            GemmCall::Nothing => return Ok(()),
            GemmCall::Zero => {
                if beta == 0.0 {
                    let bytes = batch
                        .checked_mul(m * n * dtype.size_bytes())
                        .ok_or_else(|| KernelError("GEMM output size overflows".into()))?;
                    // SAFETY: c addresses `batch` contiguous m x n outputs on this stream.
                    unsafe {
                        cudarc::driver::result::memset_d8_async(
                            c,
                            0,
                            bytes,
                            self.stream.cu_stream(),
                        )
                    }
                    .map_err(kerr("zeroing an empty product"))?;
                }
                return Ok(());
            }
            GemmCall::Call {
                m,
                n,
                k,
                lda,
                ldb,
                ldc,
            } => (m, n, k, lda, ldb, ldc),
        };
        let alpha = 1.0f32;
        let transa = if b_transposed {
            blas_sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas_sys::cublasOperation_t::CUBLAS_OP_N
        };
        let handle = *self.blas.handle();
        let (pa, pb) = (
            (&alpha) as *const f32 as *const _,
            (&beta) as *const f32 as *const _,
        );
        let compute = blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        if batch == 1 {
            // SAFETY: pointers address contiguous matrices of the given sizes on this stream.
            return unsafe {
                blas_result::gemm_ex(
                    handle,
                    transa,
                    blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    cm,
                    cn,
                    ck,
                    pa,
                    b as *const _,
                    ty,
                    lda,
                    a as *const _,
                    ty,
                    ldb,
                    pb,
                    c as *mut _,
                    ty,
                    ldc,
                    compute,
                    algo,
                )
            }
            .map_err(kerr("cuBLAS gemm"));
        }
        let big = |v: usize| {
            i64::try_from(v).map_err(|_| KernelError(format!("GEMM stride {v} is too large")))
        };
        let count = i32::try_from(batch)
            .map_err(|_| KernelError(format!("{batch} batched GEMMs are too many for cuBLAS")))?;
        // SAFETY: `batch` matrices of each operand at the given element strides, all inside
        // their allocations; outputs contiguous.
        unsafe {
            blas_result::gemm_strided_batched_ex(
                handle,
                transa,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                cm,
                cn,
                ck,
                pa,
                b as *const _,
                ty,
                lda,
                big(strides.1)?,
                a as *const _,
                ty,
                ldb,
                big(strides.0)?,
                pb,
                c as *mut _,
                ty,
                ldc,
                big(m * n)?,
                count,
                compute,
                algo,
            )
        }
        .map_err(kerr("cuBLAS strided batched gemm"))
    }

    /// Runs an elementwise kernel `(in, out, n)` over `x` into a new tensor of `dtype`.
    fn map(
        &self,
        x: &CudaTensor,
        dtype: DType,
        src: Option<Source>,
        what: &str,
    ) -> Result<CudaTensor, KernelError> {
        let out = self.empty(x.shape.clone(), dtype)?;
        let f = self.function(src, what)?;
        let (pi, po, n) = (
            x.ptr(&self.stream),
            out.ptr(&self.stream),
            count(out.numel(), what)?,
        );
        launch!(self, f, grid(out.numel()), &pi, &po, &n)?;
        Ok(out)
    }

    fn permute(&self, x: &CudaTensor, perm: &[usize]) -> Result<CudaTensor, KernelError> {
        if perm.len() != x.shape.len() || perm.len() > MAX_RANK {
            return Err(KernelError(format!(
                "permutation {perm:?} of rank {} (cuda handles rank <= {MAX_RANK})",
                x.shape.len()
            )));
        }
        let own = View::of(&x.shape);
        let v = View {
            offset: 0,
            shape: perm.iter().map(|&p| x.shape[p]).collect(),
            strides: perm.iter().map(|&p| own.strides[p]).collect(),
        };
        self.gather(x, &v)
    }

    /// Copies the strided view `v` of contiguous `x` into a new contiguous tensor.
    fn gather(&self, x: &CudaTensor, v: &View) -> Result<CudaTensor, KernelError> {
        let l = v.layout()?;
        let out = self.empty(v.shape.clone(), x.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(kernels::permute(x.dtype), "gather")?;
        let es = x.dtype.size_bytes() as i64;
        let pi = x.ptr(&self.stream).wrapping_add_signed(v.offset * es);
        let (po, nn) = (out.ptr(&self.stream), count(n, "gather")?);
        launch!(self, f, grid(n), &pi, &l, &po, &nn)?;
        Ok(out)
    }

    /// `x` in dtype `to` (the same tensor when it has it).
    fn convert_to(&self, x: &CudaTensor, to: DType) -> Result<CudaTensor, KernelError> {
        if x.dtype == to {
            return Ok(x.clone());
        }
        self.map(x, to, kernels::convert(x.dtype, to), "dtype conversion")
    }

    /// A zeroed device buffer of `n` elements (at least one).
    fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, KernelError> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(kerr("cudaMalloc"))
    }

    /// Reads the error flag kernels set (waits for the stream): `Err(what)` when it is set.
    fn check_flag(&self, flag: &CudaSlice<i32>, what: &str) -> Result<(), KernelError> {
        let v = self
            .stream
            .clone_dtoh(flag)
            .map_err(kerr("reading an error flag"))?;
        if v.first().copied().unwrap_or(0) != 0 {
            return Err(KernelError(what.to_string()));
        }
        Ok(())
    }

    /// An f32 accumulation buffer as a tensor of `shape`, rounded to `dtype`.
    fn accumulated(
        &self,
        acc: CudaSlice<f32>,
        shape: Vec<usize>,
        dtype: DType,
    ) -> Result<CudaTensor, KernelError> {
        let t = CudaTensor {
            shape,
            dtype: DType::F32,
            offset: 0,
            buf: Arc::new(DevBuf::F32(acc)),
        };
        self.convert_to(&t, dtype)
    }

    fn binary(
        &self,
        k: &Kernel,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        let Kernel::Binary { op, a, b, alpha } = k else {
            return Err(KernelError("not a binary kernel".into()));
        };
        let ((ta, sa), (tb, sb)) = (operand(inputs, a)?, operand(inputs, b)?);
        let dtype = binary_dtype(ta.map(|t| t.dtype), tb.map(|t| t.dtype), sa, sb, *alpha)?;
        let shapes: Vec<&[usize]> = [ta, tb].iter().flatten().map(|t| t.shape()).collect();
        let out_shape = layouts::broadcast_all(&shapes)?;
        let l = layouts::binary_layout(ta.map(|t| t.shape()), tb.map(|t| t.shape()), &out_shape)?;
        if *op == BinaryOp::Nextafter && dtype != DType::F32 {
            // the next float of a half is not the next float of its f32 compute copy
            return Err(KernelError(format!(
                "nextafter of {dtype}: the CUDA kernel steps f32 only"
            )));
        }
        let int =
            !is_float(dtype) && !matches!(op, BinaryOp::Div | BinaryOp::Atan2 | BinaryOp::Zeta);
        // integers compute in i64 (bools too), true division and atan2 of integers in f32;
        // floats in their dtype when every tensor has it, else in f32 from each operand's own
        // values (as the CPU reads them), rounded once to the result's dtype
        let same = [ta, tb].iter().flatten().all(|t| t.dtype == dtype);
        let ct = if int {
            DType::I64
        } else if is_float(dtype) && same {
            dtype
        } else {
            DType::F32
        };
        let result = if is_float(dtype) { dtype } else { ct };
        let conv = |t: Option<&CudaTensor>| t.map(|t| self.convert_to(t, ct)).transpose();
        let (ca, cb) = (conv(ta)?, conv(tb)?);
        let out = self.empty(out_shape, ct)?;
        let n = out.numel();
        let pa = ca.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
        let pb = cb.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
        let (a_num, b_num) = (i32::from(ca.is_none()), i32::from(cb.is_none()));
        let (po, nn) = (out.ptr(&self.stream), count(n, "binary op")?);
        if int {
            let ia = if ca.is_none() {
                whole(sa, "operand")?
            } else {
                0
            };
            let ib = if cb.is_none() {
                whole(sb, "operand")?
            } else {
                0
            };
            let al = whole(*alpha, "alpha")?;
            let f = self.function(model_kernels::binary_int(*op), "integer op")?;
            let bad = self.zeros::<i32>(1)?;
            let pbad = bad.device_ptr(&self.stream).0;
            if n > 0 {
                launch!(
                    self,
                    f,
                    grid(n),
                    &pa,
                    &pb,
                    &ia,
                    &ib,
                    &a_num,
                    &b_num,
                    &al,
                    &l,
                    &po,
                    &nn,
                    &pbad
                )?;
            }
            match op {
                BinaryOp::Pow => self.check_flag(&bad, "integer pow with a negative exponent")?,
                BinaryOp::FloorDivide | BinaryOp::Remainder | BinaryOp::Fmod => self.check_flag(
                    &bad,
                    &format!("{op:?}: ZeroDivisionError (integer division by zero)"),
                )?,
                _ => {}
            }
            return self.convert_to(&out, dtype);
        }
        let f = self.function(kernels::binary(*op, ct), "binary op")?;
        let (alpha, fa, fb) = (*alpha as f32, sa as f32, sb as f32);
        if n > 0 {
            launch!(
                self,
                f,
                grid(n),
                &pa,
                &pb,
                &fa,
                &fb,
                &a_num,
                &b_num,
                &alpha,
                &l,
                &po,
                &nn
            )?;
        }
        self.convert_to(&out, result)
    }

    fn matmul(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor, KernelError> {
        if a.dtype != b.dtype {
            return Err(KernelError(format!(
                "matmul of {} and {}",
                a.dtype, b.dtype
            )));
        }
        let plan = MatmulPlan::new(&a.shape, &b.shape)?;
        let (m, k, n) = (plan.m, plan.k, plan.n);
        let out = self.empty(plan.out_shape.clone(), a.dtype)?;
        let es = a.dtype.size_bytes() as u64;
        let (pa, pb, pc) = (
            a.ptr(&self.stream),
            b.ptr(&self.stream),
            out.ptr(&self.stream),
        );
        match plan.uniform_strides() {
            None if plan.batches.is_empty() => {}
            // b is one matrix and a's batches are contiguous: fold the batch into the rows
            Some((sa, 0)) if sa == m * k || plan.batches.len() == 1 => {
                let (oa, ob) = plan.batches[0];
                let rows = plan.batches.len() * m;
                let (pa, pb) = (pa + oa as u64 * es, pb + ob as u64 * es);
                self.gemm(rows, k, n, pa, pb, false, pc, 0.0, a.dtype)?;
            }
            Some(strides) => {
                let (oa, ob) = plan.batches[0];
                let (pa, pb) = (pa + oa as u64 * es, pb + ob as u64 * es);
                let count = plan.batches.len();
                self.gemm_batched(m, k, n, pa, pb, false, pc, 0.0, a.dtype, count, strides)?;
            }
            None => {
                for (i, &(oa, ob)) in plan.batches.iter().enumerate() {
                    self.gemm(
                        m,
                        k,
                        n,
                        pa + oa as u64 * es,
                        pb + ob as u64 * es,
                        false,
                        pc + (i * m * n) as u64 * es,
                        0.0,
                        a.dtype,
                    )?;
                }
            }
        }
        Ok(out)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor, KernelError> {
        let k = *x.shape.last().ok_or("linear of a 0-d input")?;
        if w.shape.len() != 2 || w.shape[1] != k || w.dtype != x.dtype {
            return Err(KernelError(format!(
                "linear: input {} {:?} does not fit weight {} {:?}",
                x.dtype, x.shape, w.dtype, w.shape
            )));
        }
        let n = w.shape[0];
        // rows: the leading dimensions (not numel / k, which is 0 when k is)
        let m: usize = x.shape[..x.shape.len() - 1].iter().product();
        let mut shape = x.shape[..x.shape.len() - 1].to_vec();
        shape.push(n);
        let out = self.empty(shape, x.dtype)?;
        let pc = out.ptr(&self.stream);
        let beta = if let Some(b) = bias {
            if b.numel() != n || b.dtype != x.dtype {
                return Err(KernelError(format!(
                    "linear: bias {:?} does not fit {n} outputs",
                    b.shape
                )));
            }
            let f = self.function(kernels::fill_rows(x.dtype), "linear bias")?;
            let (pb, total, cols) = (
                b.ptr(&self.stream),
                count(m * n, "linear bias")?,
                count(n, "linear bias")?,
            );
            if m * n > 0 {
                launch!(self, f, grid(m * n), &pb, &pc, &total, &cols)?;
            }
            1.0
        } else {
            0.0
        };
        self.gemm(
            m,
            k,
            n,
            x.ptr(&self.stream),
            w.ptr(&self.stream),
            true,
            pc,
            beta,
            x.dtype,
        )?;
        Ok(out)
    }

    fn reduce(
        &self,
        x: &CudaTensor,
        op: ReduceOp,
        dims: &[usize],
        keepdim: bool,
        dtype: DType,
    ) -> Result<CudaTensor, KernelError> {
        crate::cpu::reduce::check_extremum(&x.shape, op, dims).map_err(KernelError)?;
        if dtype == DType::I32 && op != ReduceOp::Mean {
            // as the CPU: computed in i64, then cast (wrapping)
            let r = self.reduce(x, op, dims, keepdim, DType::I64)?;
            return self.convert_to(&r, DType::I32);
        }
        if dtype == DType::I64 {
            // as the CPU: sums and maxima into i64 are exact (wrapping) over the input's
            // values as i64 (bools 0 or 1, floats truncated); a mean of integers is refused
            if op == ReduceOp::Mean {
                return Err(KernelError(format!(
                    "{op:?} into {dtype} is not supported (a mean is a float)"
                )));
            }
            if x.dtype != DType::I64 {
                return self.reduce(&self.convert_to(x, DType::I64)?, op, dims, keepdim, dtype);
            }
        } else if dtype != x.dtype {
            // as the CPU: accumulate in f32 from the input's values, round once to `dtype`
            if !is_float(dtype) {
                return Err(KernelError(format!(
                    "reduction to {dtype} is not supported (f32, bf16, f16, and i64 for sums \
                     and maxima)"
                )));
            }
            let r = self.reduce(
                &self.convert_to(x, DType::F32)?,
                op,
                dims,
                keepdim,
                DType::F32,
            )?;
            return self.convert_to(&r, dtype);
        }
        // bring the reduced dimensions last, then reduce contiguous runs
        let rank = x.shape.len();
        if let Some(d) = dims.iter().find(|&&d| d >= rank) {
            return Err(KernelError(format!(
                "reduction over dimension {d} of a rank-{rank} tensor {:?}",
                x.shape
            )));
        }
        let mut perm: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
        perm.extend(dims.iter().copied());
        let src = if perm.iter().enumerate().all(|(i, p)| i == *p) {
            x.clone()
        } else {
            self.permute(x, &perm)?
        };
        let len: usize = dims.iter().map(|&d| x.shape[d]).product();
        let outer: usize = (0..rank)
            .filter(|d| !dims.contains(d))
            .map(|d| x.shape[d])
            .product();
        let shape: Vec<usize> = if keepdim {
            (0..rank)
                .map(|d| if dims.contains(&d) { 1 } else { x.shape[d] })
                .collect()
        } else {
            (0..rank)
                .filter(|d| !dims.contains(d))
                .map(|d| x.shape[d])
                .collect()
        };
        let out = self.empty(shape, x.dtype)?;
        let src_code = if x.dtype == DType::I64 {
            model_kernels::reduce_int(op)
        } else {
            kernels::reduce(op, x.dtype)
        };
        let f = self.function(src_code, "reduction")?;
        let (pi, po, o, c) = (
            src.ptr(&self.stream),
            out.ptr(&self.stream),
            count(outer, "reduction")?,
            count(len, "reduction")?,
        );
        if outer > 0 {
            launch!(self, f, rows(outer, len), &pi, &po, &o, &c)?;
        }
        Ok(out)
    }

    /// Host copy of a host tensor's elements as `dtype` bits.
    fn upload_storage(&self, t: &Tensor) -> Result<DevBuf, KernelError> {
        let t = t.contiguous();
        let (o, n) = (t.offset(), t.numel());
        Ok(match t.storage() {
            Storage::F32(v) => DevBuf::F32(
                self.stream
                    .clone_htod(&v[o..o + n])
                    .map_err(kerr("upload"))?,
            ),
            Storage::BF16(v) => DevBuf::BF16(
                self.stream
                    .clone_htod(&v[o..o + n])
                    .map_err(kerr("upload"))?,
            ),
            Storage::F16(v) => DevBuf::F16(
                self.stream
                    .clone_htod(&v[o..o + n])
                    .map_err(kerr("upload"))?,
            ),
            Storage::F64(_) => {
                return Err(KernelError("f64 tensors are not supported on cuda".into()))
            }
            Storage::I64(v) => DevBuf::I64(
                self.stream
                    .clone_htod(&v[o..o + n])
                    .map_err(kerr("upload"))?,
            ),
            Storage::Bool(v) => DevBuf::Bool(
                self.stream
                    .clone_htod(&v[o..o + n])
                    .map_err(kerr("upload"))?,
            ),
            Storage::I32(v) => DevBuf::I32(
                self.stream
                    .clone_htod(&v[o..o + n])
                    .map_err(kerr("upload"))?,
            ),
        })
    }
}

/// An operand of an elementwise kernel: a tensor, or a number (0 for a tensor).
fn operand<'a>(
    inputs: &'a [Input<'_, CudaTensor>],
    s: &Side,
) -> Result<(Option<&'a CudaTensor>, f64), KernelError> {
    match s {
        Side::Scalar(x) => Ok((None, *x)),
        Side::Input(i) => match inputs.get(*i) {
            Some(Input::Tensor(t)) => Ok((Some(*t), 0.0)),
            Some(Input::Scalar(x)) => Ok((None, *x)),
            None => Err(KernelError(format!("input {i} is missing"))),
        },
    }
}

fn fractional(x: f64) -> bool {
    x.fract() != 0.0 || !x.is_finite()
}

/// The dtype a binary op's result has (as `cpu::elementwise::binary`): float tensors promote
/// among floats, other tensors by category, a number promotes an integer tensor to f32 when
/// it (or alpha) has a fraction.
pub fn binary_dtype(
    a: Option<DType>,
    b: Option<DType>,
    sa: f64,
    sb: f64,
    alpha: f64,
) -> Result<DType, KernelError> {
    Ok(match (a, b) {
        (Some(x), Some(y)) if is_float(x) && is_float(y) => crate::cpu::elementwise::promote(x, y),
        (Some(x), Some(y)) => promote_types(x, y),
        (Some(x), None) => promote_with_scalar(x, fractional(sb) || fractional(alpha)),
        (None, Some(y)) => promote_with_scalar(y, fractional(sa) || fractional(alpha)),
        (None, None) => return Err(KernelError("both operands are numbers".into())),
    })
}

/// The dtype a comparison computes in (as `cpu::compare::compare`).
pub fn compare_dtype(
    a: Option<DType>,
    b: Option<DType>,
    sa: f64,
    sb: f64,
) -> Result<DType, KernelError> {
    Ok(match (a, b) {
        (Some(x), Some(y)) => promote_types(x, y),
        (Some(x), None) => promote_with_scalar(x, fractional(sb)),
        (None, Some(y)) => promote_with_scalar(y, fractional(sa)),
        (None, None) => return Err(KernelError("compare: both operands are numbers".into())),
    })
}

/// A number as an integer operand (the CPU's integer kernels refuse fractions).
fn whole(x: f64, what: &str) -> Result<i64, KernelError> {
    if fractional(x) {
        Err(KernelError(format!("{what} {x} is not an integer")))
    } else {
        Ok(x as i64)
    }
}

/// The bits of `value` in `dtype` (low bytes first), converted as the CPU kernels convert a
/// number to a tensor element (`cpu::fill::full`).
pub fn value_bits(value: f64, dtype: DType) -> Result<u64, KernelError> {
    let t = crate::cpu::fill::full(&[], value, dtype).map_err(KernelError)?;
    Ok(match t.storage() {
        Storage::F32(v) => u64::from(v[0].to_bits()),
        Storage::BF16(v) => u64::from(v[0].to_bits()),
        Storage::F16(v) => u64::from(v[0].to_bits()),
        Storage::I64(v) => v[0] as u64,
        Storage::I32(v) => u64::from(v[0] as u32),
        Storage::Bool(v) => u64::from(v[0]),
        _ => {
            return Err(KernelError(format!(
                "dtype {dtype} is not supported on cuda (f32, bf16, f16, i64, i32, bool)"
            )))
        }
    })
}

/// A number rounded to float `dtype` and back (as `cpu::compare` rounds a comparison's number).
fn round_to(value: f64, dtype: DType) -> f64 {
    crate::cpu::compare::round_to_float(value, dtype).unwrap_or(value)
}

impl CudaBackend {
    fn view_of(&self, x: &CudaTensor, shape: Vec<usize>) -> CudaTensor {
        CudaTensor { shape, ..x.clone() }
    }

    fn compare(
        &self,
        op: CompareOp,
        a: &Side,
        b: &Side,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        let ((ta, sa), (tb, sb)) = (operand(inputs, a)?, operand(inputs, b)?);
        let dtype = compare_dtype(ta.map(|t| t.dtype), tb.map(|t| t.dtype), sa, sb)?;
        let shapes: Vec<&[usize]> = [ta, tb].iter().flatten().map(|t| t.shape()).collect();
        let shape = layouts::broadcast_all(&shapes)?;
        let l = layouts::binary_layout(ta.map(|t| t.shape()), tb.map(|t| t.shape()), &shape)?;
        // the kernel's dtype: the operands' own when they share one (every float type loads
        // to f32 exactly, bool compares as i64), else f32 for floats and i64 for integers
        let dtypes: Vec<DType> = [ta, tb].iter().flatten().map(|t| t.dtype).collect();
        let shared = dtypes.windows(2).all(|w| w[0] == w[1]);
        let kd = match dtypes.first() {
            Some(&d) if shared && is_float(d) == is_float(dtype) => d,
            _ if is_float(dtype) => DType::F32,
            _ => DType::I64,
        };
        let conv = |t: Option<&CudaTensor>| t.map(|t| self.convert_to(t, kd)).transpose();
        let (ca, cb) = (conv(ta)?, conv(tb)?);
        let (sa, sb) = (round_to(sa, dtype), round_to(sb, dtype));
        let out = self.empty(shape, DType::Bool)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(model_kernels::compare(op, kd), "compare")?;
        let pa = ca.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
        let pb = cb.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
        let (a_num, b_num) = (i32::from(ca.is_none()), i32::from(cb.is_none()));
        let (po, nn) = (out.ptr(&self.stream), count(n, "compare")?);
        launch!(
            self,
            f,
            grid(n),
            &pa,
            &pb,
            &sa,
            &sb,
            &a_num,
            &b_num,
            &l,
            &po,
            &nn
        )?;
        Ok(out)
    }

    /// `bitwise_and/or/xor` into `dtype` (i64 or bool) or, when `logical`, `logical_and/or/
    /// xor` (bool), as `cpu::bitwise`: logical operands become bools (`!= 0`), bitwise ones
    /// must be integers or bools (computed in i64 unless both are bool).
    fn bitwise(
        &self,
        op: BitOp,
        a: &Side,
        b: &Side,
        logical: bool,
        dtype: DType,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        let name = if logical { "logical" } else { "bitwise" };
        let ((ta, sa), (tb, sb)) = (operand(inputs, a)?, operand(inputs, b)?);
        let kd = if logical || dtype == DType::Bool {
            DType::Bool
        } else {
            DType::I64
        };
        let number = |s: f64| -> Result<i64, KernelError> {
            if logical {
                Ok(i64::from(s != 0.0))
            } else if s.fract() == 0.0 && s.is_finite() {
                Ok(s as i64)
            } else {
                Err(KernelError(format!(
                    "{name}_{}: the number {s} is not an integer",
                    op.name()
                )))
            }
        };
        let conv = |t: Option<&CudaTensor>| -> Result<Option<CudaTensor>, KernelError> {
            let Some(t) = t else { return Ok(None) };
            if !logical && !matches!(t.dtype, DType::I64 | DType::I32 | DType::Bool) {
                return Err(KernelError(format!(
                    "bitwise_{}: dtype {} is not an integer or bool type",
                    op.name(),
                    t.dtype
                )));
            }
            self.convert_to(t, kd).map(Some)
        };
        let (ca, cb) = (conv(ta)?, conv(tb)?);
        let (na, nb) = (number(sa)?, number(sb)?);
        let shapes: Vec<&[usize]> = [ta, tb].iter().flatten().map(|t| t.shape()).collect();
        let shape = layouts::broadcast_all(&shapes)?;
        let l = layouts::binary_layout(ta.map(|t| t.shape()), tb.map(|t| t.shape()), &shape)?;
        let out = self.empty(shape, kd)?;
        let n = out.numel();
        if n > 0 {
            let f = self.function(model_kernels::bitwise(op, kd), name)?;
            let pa = ca.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
            let pb = cb.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
            let (a_num, b_num) = (i32::from(ca.is_none()), i32::from(cb.is_none()));
            let (po, nn) = (out.ptr(&self.stream), count(n, name)?);
            launch!(
                self,
                f,
                grid(n),
                &pa,
                &pb,
                &na,
                &nb,
                &a_num,
                &b_num,
                &l,
                &po,
                &nn
            )?;
        }
        if logical {
            Ok(out)
        } else {
            self.convert_to(&out, dtype)
        }
    }

    fn where_(
        &self,
        a: &Side,
        b: &Side,
        dtype: DType,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        let c = tensor(inputs, 0)?;
        if c.dtype != DType::Bool {
            return Err(KernelError(format!(
                "where: the condition must be a bool tensor, got {}",
                c.dtype
            )));
        }
        let ((ta, sa), (tb, sb)) = (operand(inputs, a)?, operand(inputs, b)?);
        let mut shapes: Vec<&[usize]> = vec![c.shape()];
        shapes.extend([ta, tb].iter().flatten().map(|t| t.shape()));
        let shape = layouts::broadcast_all(&shapes)?;
        let l = layouts::binary_layout(ta.map(|t| t.shape()), tb.map(|t| t.shape()), &shape)?;
        let lc = layouts::binary_layout(Some(c.shape()), None, &shape)?;
        let conv = |t: Option<&CudaTensor>| t.map(|t| self.convert_to(t, dtype)).transpose();
        let (ca, cb) = (conv(ta)?, conv(tb)?);
        let (va, vb) = (
            if ca.is_none() {
                value_bits(sa, dtype)?
            } else {
                0
            },
            if cb.is_none() {
                value_bits(sb, dtype)?
            } else {
                0
            },
        );
        let out = self.empty(shape, dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(model_kernels::where_(dtype), "where")?;
        let pc = c.ptr(&self.stream);
        let pa = ca.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
        let pb = cb.as_ref().map_or(0u64, |t| t.ptr(&self.stream));
        let (a_num, b_num) = (i32::from(ca.is_none()), i32::from(cb.is_none()));
        let (po, nn) = (out.ptr(&self.stream), count(n, "where")?);
        launch!(
            self,
            f,
            grid(n),
            &pc,
            &pa,
            &pb,
            &va,
            &vb,
            &a_num,
            &b_num,
            &l,
            &lc,
            &po,
            &nn
        )?;
        Ok(out)
    }

    fn pad(
        &self,
        x: &CudaTensor,
        value: f64,
        config: &[(i64, i64, i64)],
    ) -> Result<CudaTensor, KernelError> {
        let (shape, l) = layouts::pad(&x.shape, config)?;
        let bits = value_bits(value, x.dtype)?;
        let out = self.empty(shape, x.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(model_kernels::pad(x.dtype), "pad")?;
        let (pi, po, nn) = (x.ptr(&self.stream), out.ptr(&self.stream), count(n, "pad")?);
        launch!(self, f, grid(n), &pi, &l, &bits, &po, &nn)?;
        Ok(out)
    }

    fn cat(&self, xs: &[&CudaTensor], dim: i64) -> Result<CudaTensor, KernelError> {
        let shapes: Vec<&[usize]> = xs.iter().map(|t| t.shape()).collect();
        let plan = layouts::cat(&shapes, dim)?;
        let live: Vec<&&CudaTensor> = xs.iter().filter(|t| t.shape != [0]).collect();
        let dtype = match live.first() {
            Some(first) => live
                .iter()
                .fold(first.dtype, |d, t| promote_types(d, t.dtype)),
            None => xs.first().map_or(DType::F32, |t| t.dtype),
        };
        let out = self.empty(plan.shape.clone(), dtype)?;
        let f = self.function(model_kernels::cat_copy(dtype), "cat")?;
        let (po, bo) = (out.ptr(&self.stream), count(plan.block_out, "cat")?);
        for (x, part) in xs.iter().zip(&plan.parts) {
            let Some((block_in, at)) = *part else {
                continue;
            };
            if x.numel() == 0 {
                continue;
            }
            let x = self.convert_to(x, dtype)?;
            let pi = x.ptr(&self.stream);
            let (bi, at, n) = (
                count(block_in, "cat")?,
                count(at, "cat")?,
                count(x.numel(), "cat")?,
            );
            launch!(self, f, grid(x.numel()), &pi, &po, &bi, &bo, &at, &n)?;
        }
        Ok(out)
    }

    fn fill(&self, shape: &[usize], value: f64, dtype: DType) -> Result<CudaTensor, KernelError> {
        let bits = value_bits(value, dtype)?;
        let out = self.empty(shape.to_vec(), dtype)?;
        let n = out.numel();
        if n > 0 {
            let f = self.function(model_kernels::fill(dtype), "full")?;
            let (po, nn) = (out.ptr(&self.stream), count(n, "full")?);
            launch!(self, f, grid(n), &po, &bits, &nn)?;
        }
        Ok(out)
    }

    fn arange(
        &self,
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
    ) -> Result<CudaTensor, KernelError> {
        let n = layouts::arange_len(start, end, step)?;
        let out = self.empty(vec![n], dtype)?;
        let f = self.function(model_kernels::arange(dtype), "arange")?;
        if n > 0 {
            let (po, nn) = (out.ptr(&self.stream), count(n, "arange")?);
            launch!(self, f, grid(n), &po, &start, &step, &nn)?;
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn convolution(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        stride: &[i64],
        padding: &[i64],
        dilation: &[i64],
        groups: i64,
    ) -> Result<CudaTensor, KernelError> {
        if x.dtype != w.dtype || bias.is_some_and(|b| b.dtype != x.dtype) {
            return Err(KernelError(format!(
                "convolution: input {}, weight {} and bias {:?} must share a dtype",
                x.dtype,
                w.dtype,
                bias.map(|b| b.dtype)
            )));
        }
        let (shape, l) =
            layouts::convolution(&x.shape, &w.shape, stride, padding, dilation, groups)?;
        if let Some(b) = bias {
            if b.shape != [shape[1]] {
                return Err(KernelError(format!(
                    "convolution: bias {:?} must be [{}]",
                    b.shape, shape[1]
                )));
            }
        }
        let out = self.empty(shape, x.dtype)?;
        let n = out.numel();
        let f = self.function(model_kernels::convolution(x.dtype), "convolution")?;
        if n > 0 {
            let (px, pw) = (x.ptr(&self.stream), w.ptr(&self.stream));
            let pb = bias.map_or(0u64, |b| b.ptr(&self.stream));
            let has_bias = i32::from(bias.is_some());
            let (po, nn) = (out.ptr(&self.stream), count(n, "convolution")?);
            launch!(self, f, grid(n), &px, &pw, &pb, &has_bias, &l, &po, &nn)?;
        }
        Ok(out)
    }

    fn max_pool2d(
        &self,
        x: &CudaTensor,
        p: &crate::cpu::pool::Pool2d,
    ) -> Result<Vec<CudaTensor>, KernelError> {
        let (shape, l) = layouts::max_pool2d(&x.shape, p)?;
        let f = self.function(model_kernels::max_pool2d(x.dtype), "max_pool2d")?;
        let vals = self.empty(shape.clone(), x.dtype)?;
        let idx = self.empty(shape, DType::I64)?;
        let n = vals.numel();
        if n > 0 {
            let (px, pv, pi) = (
                x.ptr(&self.stream),
                vals.ptr(&self.stream),
                idx.ptr(&self.stream),
            );
            let nn = count(n, "max_pool2d")?;
            launch!(self, f, grid(n), &px, &l, &pv, &pi, &nn)?;
        }
        Ok(vec![vals, idx])
    }

    fn max_pool2d_backward(
        &self,
        grad: &CudaTensor,
        x: &CudaTensor,
        indices: &CudaTensor,
    ) -> Result<CudaTensor, KernelError> {
        let (planes, h, w) = match x.shape.as_slice() {
            [n, c, h, w] => (n * c, *h, *w),
            [c, h, w] => (*c, *h, *w),
            other => {
                return Err(KernelError(format!(
                    "max_pool2d: the input must be 3-d or 4-d, got {other:?}"
                )))
            }
        };
        if grad.shape != indices.shape || grad.shape.len() != x.shape.len() {
            return Err(KernelError(format!(
                "max_pool2d_backward: grad {:?}, indices {:?} and input {:?} do not fit",
                grad.shape, indices.shape, x.shape
            )));
        }
        if indices.dtype != DType::I64 {
            return Err(KernelError(
                "max_pool2d_backward: indices must be i64".into(),
            ));
        }
        let f = self.function(
            model_kernels::max_pool2d_backward(grad.dtype),
            "max_pool2d_backward",
        )?;
        let acc = self.zeros::<f32>(planes * h * w)?;
        let n = grad.numel();
        if n > 0 {
            let bad = self.zeros::<i32>(1)?;
            let (pg, pi) = (grad.ptr(&self.stream), indices.ptr(&self.stream));
            let (pa, pbad) = (
                acc.device_ptr(&self.stream).0,
                bad.device_ptr(&self.stream).0,
            );
            let (per_plane, size, nn) = (
                count(n / planes.max(1), "max_pool2d_backward")?,
                count(h * w, "max_pool2d_backward")?,
                count(n, "max_pool2d_backward")?,
            );
            launch!(
                self,
                f,
                grid(n),
                &pg,
                &pi,
                &pa,
                &per_plane,
                &size,
                &nn,
                &pbad
            )?;
            self.check_flag(
                &bad,
                &format!("max_pool2d_backward: an index is outside a {h} x {w} plane"),
            )?;
        }
        self.accumulated(acc, x.shape.clone(), grad.dtype)
    }

    fn embedding(&self, idx: &CudaTensor, weight: &CudaTensor) -> Result<CudaTensor, KernelError> {
        let [rows, dim] = weight.shape[..] else {
            return Err(KernelError(format!(
                "embedding: the weight must be 2-d, got {:?}",
                weight.shape
            )));
        };
        if idx.dtype != DType::I64 {
            return Err(KernelError(format!(
                "embedding: indices must be i64 on cuda, got {}",
                idx.dtype
            )));
        }
        let mut shape = idx.shape.clone();
        shape.push(dim);
        let out = self.empty(shape, weight.dtype)?;
        let f = self.function(model_kernels::embedding(weight.dtype), "embedding")?;
        let n = out.numel();
        if n > 0 {
            let bad = self.zeros::<i32>(1)?;
            let (pi, pw, po) = (
                idx.ptr(&self.stream),
                weight.ptr(&self.stream),
                out.ptr(&self.stream),
            );
            let pbad = bad.device_ptr(&self.stream).0;
            let (r, d, nn) = (
                count(rows, "embedding")?,
                count(dim, "embedding")?,
                count(n, "embedding")?,
            );
            launch!(self, f, grid(n), &pi, &pw, &po, &r, &d, &nn, &pbad)?;
            self.check_flag(
                &bad,
                &format!("embedding: an index is out of range for {rows} rows"),
            )?;
        }
        Ok(out)
    }

    fn embedding_backward(
        &self,
        grad: &CudaTensor,
        idx: &CudaTensor,
        num_weights: usize,
        padding_idx: i64,
        scale_grad_by_freq: bool,
    ) -> Result<CudaTensor, KernelError> {
        let gs = &grad.shape;
        if gs.len() != idx.shape.len() + 1 || gs[..gs.len() - 1] != idx.shape[..] {
            return Err(KernelError(format!(
                "embedding_backward: grad {gs:?} does not fit indices {:?}",
                idx.shape
            )));
        }
        if idx.dtype != DType::I64 {
            return Err(KernelError(format!(
                "embedding_backward: indices must be i64 on cuda, got {}",
                idx.dtype
            )));
        }
        let dim = gs[gs.len() - 1];
        let f = self.function(
            model_kernels::embedding_backward(grad.dtype),
            "embedding_backward",
        )?;
        let acc = self.zeros::<f32>(num_weights * dim)?;
        let bad = self.zeros::<i32>(1)?;
        let pbad = bad.device_ptr(&self.stream).0;
        let pi = idx.ptr(&self.stream);
        let rows = count(num_weights, "embedding_backward")?;
        let counts = if scale_grad_by_freq && idx.numel() > 0 {
            let c = self.zeros::<u32>(num_weights)?;
            let fc = self.function(Some(model_kernels::embedding_count()), "embedding_backward")?;
            let pc = c.device_ptr(&self.stream).0;
            let k = count(idx.numel(), "embedding_backward")?;
            launch!(self, fc, grid(idx.numel()), &pi, &pc, &rows, &k, &pbad)?;
            Some(c)
        } else {
            None
        };
        let n = grad.numel();
        if n > 0 {
            let pc = counts
                .as_ref()
                .map_or(0u64, |c| c.device_ptr(&self.stream).0);
            let (pg, pa) = (grad.ptr(&self.stream), acc.device_ptr(&self.stream).0);
            let (d, nn) = (
                count(dim, "embedding_backward")?,
                count(n, "embedding_backward")?,
            );
            launch!(
                self,
                f,
                grid(n),
                &pg,
                &pi,
                &pc,
                &pa,
                &rows,
                &d,
                &padding_idx,
                &nn,
                &pbad
            )?;
        }
        if idx.numel() > 0 {
            self.check_flag(
                &bad,
                &format!("embedding_backward: an index is out of range for {num_weights} rows"),
            )?;
        }
        self.accumulated(acc, vec![num_weights, dim], grad.dtype)
    }

    fn var_mean(
        &self,
        x: &CudaTensor,
        dims: Option<&[i64]>,
        correction: f64,
        keepdim: bool,
    ) -> Result<Vec<CudaTensor>, KernelError> {
        let f = self.function(model_kernels::var_mean(x.dtype), "var_mean")?;
        let plan = layouts::var_mean(&x.shape, dims, keepdim)?;
        let src = if plan.perm.iter().enumerate().all(|(i, p)| i == *p) {
            x.clone()
        } else {
            self.permute(x, &plan.perm)?
        };
        let var = self.empty(plan.shape.to_vec(), x.dtype)?;
        let mean = self.empty(plan.shape.to_vec(), x.dtype)?;
        if plan.rows > 0 {
            let divisor = (plan.len as f64 - correction).max(0.0);
            let (pi, pv, pm) = (
                src.ptr(&self.stream),
                var.ptr(&self.stream),
                mean.ptr(&self.stream),
            );
            let (o, c) = (count(plan.rows, "var_mean")?, count(plan.len, "var_mean")?);
            launch!(
                self,
                f,
                rows(plan.rows, plan.len),
                &pi,
                &pv,
                &pm,
                &o,
                &c,
                &divisor
            )?;
        }
        Ok(vec![var, mean])
    }

    /// `var`, or `std` when `std`: `var_mean`'s variance (of an f32 copy for bf16 and f16, so
    /// the square root is taken before the one rounding to the dtype).
    fn var(
        &self,
        x: &CudaTensor,
        dims: Option<&[i64]>,
        correction: f64,
        keepdim: bool,
        std: bool,
    ) -> Result<CudaTensor, KernelError> {
        let wide = self.convert_to(x, DType::F32)?;
        let mut vm = self.var_mean(&wide, dims, correction, keepdim)?;
        if vm.is_empty() {
            return Err(KernelError("var: var_mean gave no tensors".into()));
        }
        let mut v = vm.swap_remove(0);
        if std {
            v = self.map(
                &v,
                DType::F32,
                kernels::unary(crate::exec::kernel::UnaryOp::Sqrt, DType::F32),
                "std",
            )?;
        }
        self.convert_to(&v, x.dtype)
    }

    /// `cumsum` along `dim` of `x` cast to `dtype` (see [`model_kernels::cumsum`]).
    fn cumsum(&self, x: &CudaTensor, dim: usize, dtype: DType) -> Result<CudaTensor, KernelError> {
        let src = self.convert_to(x, dtype)?;
        let (outer, len, inner) = crate::cpu::cumsum::lines(&src.shape, dim)?;
        let f = self.function(model_kernels::cumsum(dtype), "cumsum")?;
        let out = self.empty(src.shape.clone(), dtype)?;
        if out.numel() > 0 {
            let (pi, po) = (src.ptr(&self.stream), out.ptr(&self.stream));
            let (o, l, i) = (
                count(outer, "cumsum")?,
                count(len, "cumsum")?,
                count(inner, "cumsum")?,
            );
            launch!(self, f, grid(outer * inner), &pi, &po, &o, &l, &i)?;
        }
        Ok(out)
    }

    /// `argmax`/`argmin` (see [`model_kernels::arg_extremum`]); shapes and errors as
    /// `cpu::arg_extremum::arg_extremum`.
    fn arg_extremum(
        &self,
        x: &CudaTensor,
        max: bool,
        dim: Option<usize>,
        keepdim: bool,
    ) -> Result<CudaTensor, KernelError> {
        let what = if max { "argmax" } else { "argmin" };
        let shape = x.shape.clone();
        let (outer, len, inner) = match dim {
            Some(d) => crate::cpu::cumsum::lines(&shape, d)?,
            None => (1, x.numel(), 1),
        };
        if len == 0 && outer * inner > 0 {
            return Err(KernelError(format!(
                "{what}: the reduced dimension of {shape:?} has no elements"
            )));
        }
        let out_shape: Vec<usize> = match (dim, keepdim) {
            (Some(d), true) => (0..shape.len())
                .map(|k| if k == d { 1 } else { shape[k] })
                .collect(),
            (Some(d), false) => (0..shape.len())
                .filter(|&k| k != d)
                .map(|k| shape[k])
                .collect(),
            (None, true) => vec![1; shape.len()],
            (None, false) => vec![],
        };
        let f = self.function(model_kernels::arg_extremum(max, x.dtype), what)?;
        let out = self.empty(out_shape, DType::I64)?;
        if out.numel() > 0 {
            let (pi, po) = (x.ptr(&self.stream), out.ptr(&self.stream));
            let (o, l, i) = (count(outer, what)?, count(len, what)?, count(inner, what)?);
            launch!(self, f, grid(outer * inner), &pi, &po, &o, &l, &i)?;
        }
        Ok(out)
    }

    /// The `(planes, h, w)` of a `[..., h, w]` tensor of rank 3 or more.
    fn planes(shape: &[usize], what: &str) -> Result<(usize, usize, usize), KernelError> {
        let r = shape.len();
        if r < 3 {
            return Err(KernelError(format!(
                "{what}: input {shape:?} has rank below 3"
            )));
        }
        Ok((shape[..r - 2].iter().product(), shape[r - 2], shape[r - 1]))
    }

    /// Adaptive average pooling or its backward (`src`) of `x` into a tensor of `shape`;
    /// `dims` are `(planes, h, w, oh, ow)`.
    fn adaptive_pool(
        &self,
        src: Option<Source>,
        x: &CudaTensor,
        shape: Vec<usize>,
        dims: [usize; 5],
    ) -> Result<CudaTensor, KernelError> {
        let what = "adaptive_avg_pool2d";
        let [planes, h, w, oh, ow] = dims;
        if (h == 0 || w == 0) && planes * oh * ow > 0 {
            return Err(KernelError(format!(
                "{what}: an input of {h}x{w} has no elements to pool"
            )));
        }
        let f = self.function(src, what)?;
        let out = self.empty(shape, x.dtype)?;
        let n = out.numel();
        if n > 0 {
            let (pi, po) = (x.ptr(&self.stream), out.ptr(&self.stream));
            let [p, hh, ww, o1, o2] = [planes, h, w, oh, ow].map(|v| v as i64);
            launch!(self, f, grid(n), &pi, &po, &p, &hh, &ww, &o1, &o2)?;
        }
        Ok(out)
    }

    /// Checks `idx` (i64 on cuda) against `0..size` with [`model_kernels::index_check`]; when
    /// one is out of range, reads the indices back to name it with the CPU's message.
    fn check_indices(
        &self,
        what: &str,
        idx: &CudaTensor,
        dim: usize,
        size: usize,
    ) -> Result<(), KernelError> {
        if idx.dtype != DType::I64 {
            return Err(KernelError(format!(
                "{what}: the index must be i64 on cuda, got {}",
                idx.dtype
            )));
        }
        let n = idx.numel();
        if n == 0 {
            return Ok(());
        }
        let f = self.function(Some(model_kernels::index_check()), what)?;
        let bad = self.zeros::<i32>(1)?;
        let (pi, pbad) = (idx.ptr(&self.stream), bad.device_ptr(&self.stream).0);
        let (nn, sz) = (count(n, what)?, count(size, what)?);
        launch!(self, f, grid(n), &pi, &nn, &sz, &pbad)?;
        if self.check_flag(&bad, what).is_err() {
            let host = self.download(idx)?.to_i64_vec();
            crate::cpu::indexing::check_indices(what, &host, dim, size)?;
            return Err(KernelError(format!(
                "{what}: an index is out of bounds for dimension {dim} with size {size}"
            )));
        }
        Ok(())
    }

    /// `gather` (see [`model_kernels::gather_dim`]); checks and errors as the CPU's. Every
    /// dtype of `a`.
    fn gather_dim(
        &self,
        a: &CudaTensor,
        dim: usize,
        idx: &CudaTensor,
    ) -> Result<CudaTensor, KernelError> {
        let p = layouts::gather(&a.shape, &idx.shape, dim)?;
        self.check_indices("gather", idx, dim, p.dim_size as usize)?;
        let out = self.empty(p.shape.clone(), a.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(model_kernels::gather_dim(a.dtype), "gather")?;
        let (pa, pi, po) = (
            a.ptr(&self.stream),
            idx.ptr(&self.stream),
            out.ptr(&self.stream),
        );
        let nn = count(n, "gather")?;
        launch!(
            self,
            f,
            grid(n),
            &pa,
            &pi,
            &p.layout,
            &p.dim_stride,
            &p.dim_size,
            &po,
            &nn
        )?;
        Ok(out)
    }

    /// `scatter_add` (see [`model_kernels::scatter_add`]): deterministic, and the CPU's bits,
    /// since each output element adds its contributions itself in index order. Floats and i64.
    fn scatter_add(
        &self,
        a: &CudaTensor,
        dim: usize,
        idx: &CudaTensor,
        src: &CudaTensor,
    ) -> Result<CudaTensor, KernelError> {
        if src.dtype != a.dtype {
            return Err(KernelError(format!(
                "scatter_add: src is {}, the input {}; they must agree",
                src.dtype, a.dtype
            )));
        }
        let l = layouts::scatter(&a.shape, &idx.shape, &src.shape, dim)?;
        let size = a.shape.get(dim).copied().unwrap_or(1);
        self.check_indices("scatter_add", idx, dim, size)?;
        let out = self.empty(a.shape.clone(), a.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(model_kernels::scatter_add(a.dtype), "scatter_add")?;
        let (pa, pi, ps, po) = (
            a.ptr(&self.stream),
            idx.ptr(&self.stream),
            src.ptr(&self.stream),
            out.ptr(&self.stream),
        );
        let nn = count(n, "scatter_add")?;
        launch!(self, f, grid(n), &pa, &pi, &ps, &l, &po, &nn)?;
        Ok(out)
    }

    /// `index_select` (see [`model_kernels::index_select`]); checks and errors as the CPU's.
    /// Every dtype of `a`.
    fn index_select(
        &self,
        a: &CudaTensor,
        dim: usize,
        idx: &CudaTensor,
    ) -> Result<CudaTensor, KernelError> {
        use crate::cpu::indexing::{index_select_shape, index_vector};
        let m = index_vector("index_select", &idx.shape)?;
        let shape = index_select_shape(&a.shape, dim, m)?;
        let (outer, len, inner) = crate::cpu::cumsum::lines(&a.shape, dim)?;
        self.check_indices("index_select", idx, dim, len)?;
        let out = self.empty(shape, a.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        debug_assert_eq!(n, outer * m * inner);
        let f = self.function(model_kernels::index_select(a.dtype), "index_select")?;
        let (pa, pi, po) = (
            a.ptr(&self.stream),
            idx.ptr(&self.stream),
            out.ptr(&self.stream),
        );
        let (l, mm, i, nn) = (
            count(len, "index_select")?,
            count(m, "index_select")?,
            count(inner, "index_select")?,
            count(n, "index_select")?,
        );
        launch!(self, f, grid(n), &pa, &pi, &po, &l, &mm, &i, &nn)?;
        Ok(out)
    }

    /// `index_add` (see [`model_kernels::index_add`]): deterministic, the CPU's bits. Floats
    /// and i64.
    fn index_add(
        &self,
        a: &CudaTensor,
        dim: usize,
        idx: &CudaTensor,
        source: &CudaTensor,
    ) -> Result<CudaTensor, KernelError> {
        let m = crate::cpu::indexing::index_vector("index_add", &idx.shape)?;
        crate::cpu::indexing::check_index_add(
            (&a.shape, a.dtype),
            dim,
            m,
            (&source.shape, source.dtype),
        )?;
        let (_, len, inner) = crate::cpu::cumsum::lines(&a.shape, dim)?;
        self.check_indices("index_add", idx, dim, len)?;
        let out = self.empty(a.shape.clone(), a.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(model_kernels::index_add(a.dtype), "index_add")?;
        let (pa, pi, ps, po) = (
            a.ptr(&self.stream),
            idx.ptr(&self.stream),
            source.ptr(&self.stream),
            out.ptr(&self.stream),
        );
        let (l, mm, i, nn) = (
            count(len, "index_add")?,
            count(m, "index_add")?,
            count(inner, "index_add")?,
            count(n, "index_add")?,
        );
        launch!(self, f, grid(n), &pa, &pi, &ps, &po, &l, &mm, &i, &nn)?;
        Ok(out)
    }

    /// `sort`, `argsort` (no values) and `topk` along `dim` (see
    /// [`model_kernels::sort_rank`]): the first `take` of each line in stable order, as
    /// `cpu::sort`. Floats and i64.
    fn sort_lines(
        &self,
        x: &CudaTensor,
        dim: usize,
        descending: bool,
        take: usize,
        values: bool,
    ) -> Result<(Option<CudaTensor>, CudaTensor), KernelError> {
        let what = "sort";
        let (outer, len, inner) = crate::cpu::cumsum::lines(&x.shape, dim)?;
        if take > len {
            return Err(KernelError(format!(
                "{what}: {take} elements asked of dimension {dim} of {:?}",
                x.shape
            )));
        }
        let mut shape = x.shape.clone();
        if let Some(s) = shape.get_mut(dim) {
            *s = take;
        }
        let indices = self.empty(shape.clone(), DType::I64)?;
        let vals = if values {
            Some(self.empty(shape, x.dtype)?)
        } else {
            None
        };
        let n = x.numel();
        if n == 0 || take == 0 {
            return Ok((vals, indices));
        }
        let f = self.function(model_kernels::sort_rank(x.dtype), what)?;
        let (pin, pidx) = (x.ptr(&self.stream), indices.ptr(&self.stream));
        let pv = vals.as_ref().map_or(0u64, |v| v.ptr(&self.stream));
        let (o, l, i, t, nn) = (
            count(outer, what)?,
            count(len, what)?,
            count(inner, what)?,
            count(take, what)?,
            count(n, what)?,
        );
        let desc = i32::from(descending);
        launch!(
            self,
            f,
            grid(n),
            &pin,
            &pv,
            &pidx,
            &o,
            &l,
            &i,
            &t,
            &desc,
            &nn
        )?;
        Ok((vals, indices))
    }

    /// The values and indices of [`Self::sort_lines`], both asked for.
    fn sorted_pair(
        &self,
        x: &CudaTensor,
        dim: usize,
        descending: bool,
        take: usize,
    ) -> Result<Vec<CudaTensor>, KernelError> {
        match self.sort_lines(x, dim, descending, take, true)? {
            (Some(v), i) => Ok(vec![v, i]),
            (None, _) => Err(KernelError("sort: the values were not computed".into())),
        }
    }

    /// `take_along_dim`: `a` gathered by i64 indices (see [`layouts::take_along_dim`]); an
    /// index out of range is an error, as on the CPU. Every dtype of `a`.
    fn take_along_dim(
        &self,
        a: &CudaTensor,
        idx: &CudaTensor,
        dim: Option<usize>,
    ) -> Result<CudaTensor, KernelError> {
        if idx.dtype != DType::I64 {
            return Err(KernelError(format!(
                "take_along_dim: indices must be i64 on cuda, got {}",
                idx.dtype
            )));
        }
        let p = layouts::take_along_dim(&a.shape, &idx.shape, dim)?;
        let out = self.empty(p.shape.clone(), a.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.function(model_kernels::take_along_dim(a.dtype), "take_along_dim")?;
        let bad = self.zeros::<i32>(1)?;
        let (pa, pi, po) = (
            a.ptr(&self.stream),
            idx.ptr(&self.stream),
            out.ptr(&self.stream),
        );
        let pbad = bad.device_ptr(&self.stream).0;
        let nn = count(n, "take_along_dim")?;
        launch!(
            self,
            f,
            grid(n),
            &pa,
            &pi,
            &p.layout,
            &p.dim_stride,
            &p.dim_size,
            &po,
            &nn,
            &pbad
        )?;
        self.check_flag(
            &bad,
            &format!(
                "take_along_dim: an index is out of range for size {}",
                p.dim_size
            ),
        )?;
        Ok(out)
    }

    /// `nll_loss_backward` (see [`model_kernels::nll_loss_backward`]): the gradient,
    /// `total_weight` and the class weights are read as f32 copies (exact for the float
    /// dtypes), the result has the input's dtype; a target that is not a class and not
    /// ignored is an error, as on the CPU.
    #[allow(clippy::too_many_arguments)]
    fn nll_loss_backward(
        &self,
        grad: &CudaTensor,
        input: &CudaTensor,
        target: &CudaTensor,
        total_weight: &CudaTensor,
        weight: Option<&CudaTensor>,
        reduction: LossReduction,
        ignore_index: i64,
    ) -> Result<CudaTensor, KernelError> {
        if target.dtype != DType::I64 {
            return Err(KernelError(format!(
                "nll_loss_backward: targets must be i64 on cuda, got {}",
                target.dtype
            )));
        }
        let p = layouts::nll_loss_backward(
            &grad.shape,
            &input.shape,
            &target.shape,
            weight.map(|w| w.shape.as_slice()),
            reduction,
        )?;
        let f = self.function(
            model_kernels::nll_loss_backward(input.dtype),
            "nll_loss_backward",
        )?;
        let out = self.empty(input.shape.clone(), input.dtype)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let g = self.convert_to(grad, DType::F32)?;
        let tw = self.convert_to(total_weight, DType::F32)?;
        let w = weight.map(|w| self.convert_to(w, DType::F32)).transpose()?;
        let bad = self.zeros::<i32>(1)?;
        let (pg, pt, ptw, po) = (
            g.ptr(&self.stream),
            target.ptr(&self.stream),
            tw.ptr(&self.stream),
            out.ptr(&self.stream),
        );
        let pw = w.as_ref().map_or(0u64, |w| w.ptr(&self.stream));
        let pbad = bad.device_ptr(&self.stream).0;
        let what = "nll_loss_backward";
        let (tw_n, classes, inner, nn) = (
            count(tw.numel(), what)?,
            count(p.classes, what)?,
            count(p.inner, what)?,
            count(n, what)?,
        );
        let (mean, per_element) = (
            i32::from(reduction == LossReduction::Mean),
            i32::from(p.per_element),
        );
        launch!(
            self,
            f,
            grid(n),
            &pg,
            &pt,
            &pw,
            &ptw,
            &tw_n,
            &mean,
            &per_element,
            &classes,
            &inner,
            &ignore_index,
            &po,
            &nn,
            &pbad
        )?;
        self.check_flag(
            &bad,
            &format!(
                "nll_loss_backward: a target is not a class of 0..{}",
                p.classes
            ),
        )?;
        Ok(out)
    }

    /// `_log_softmax_backward_data` / `_softmax_backward_data` (see
    /// [`model_kernels::softmax_backward`]), one block per row. When the result's dtype is not
    /// the inputs' (or the two inputs differ), the kernel runs on f32 copies and the result
    /// is rounded once to `dtype`.
    fn softmax_backward(
        &self,
        grad: &CudaTensor,
        output: &CudaTensor,
        dim: usize,
        log: bool,
        dtype: DType,
    ) -> Result<CudaTensor, KernelError> {
        let (outer, len, inner) = layouts::softmax_backward(&grad.shape, &output.shape, dim)?;
        if grad.dtype != dtype || output.dtype != dtype {
            let r = self.softmax_backward(
                &self.convert_to(grad, DType::F32)?,
                &self.convert_to(output, DType::F32)?,
                dim,
                log,
                DType::F32,
            )?;
            return self.convert_to(&r, dtype);
        }
        let f = self.function(
            model_kernels::softmax_backward(log, dtype),
            "softmax backward",
        )?;
        let out = self.empty(output.shape.clone(), dtype)?;
        if out.numel() > 0 {
            let (pg, py, po) = (
                grad.ptr(&self.stream),
                output.ptr(&self.stream),
                out.ptr(&self.stream),
            );
            let what = "softmax backward";
            let (o, l, i) = (count(outer, what)?, count(len, what)?, count(inner, what)?);
            launch!(self, f, rows(outer * inner, len), &pg, &py, &po, &o, &l, &i)?;
        }
        Ok(out)
    }

    /// Thunder's `uniform` drawn from the random stream of `key`: element for element the
    /// values `cpu::random::uniform` gives for the same key (ChaCha8, word `i` for element
    /// `i`, mapped in f32 as on the CPU). f64 is not a cuda dtype.
    pub fn uniform(
        &self,
        shape: &[usize],
        minval: f64,
        maxval: f64,
        dtype: DType,
        key: crate::cpu::random::RngKey,
    ) -> Result<CudaTensor, KernelError> {
        if minval > maxval || !minval.is_finite() || !maxval.is_finite() {
            return Err(KernelError(format!(
                "uniform: the range [{minval}, {maxval}) must be finite and not reversed"
            )));
        }
        let f = self.function(model_kernels::uniform(dtype), "uniform")?;
        let out = self.empty(shape.to_vec(), dtype)?;
        let n = out.numel();
        if n > 0 {
            let (lo, width) = (minval as f32, (maxval - minval) as f32);
            let (po, nn) = (out.ptr(&self.stream), count(n, "uniform")?);
            launch!(
                self,
                f,
                grid(n.div_ceil(16)),
                &po,
                &key.seed,
                &key.rank,
                &key.step,
                &key.node,
                &lo,
                &width,
                &nn
            )?;
        }
        Ok(out)
    }

    /// An activation with parameters ([`Kernel::Activation`]), the parameters in f32.
    fn activation(&self, act: Activation, x: &CudaTensor) -> Result<CudaTensor, KernelError> {
        let what = act.name();
        let f = self.function(model_kernels::activation(act, x.dtype), what)?;
        let out = self.empty(x.shape.clone(), x.dtype)?;
        let [p0, p1] = act.params().map(|p| p as f32);
        let (pi, po, n) = (
            x.ptr(&self.stream),
            out.ptr(&self.stream),
            count(out.numel(), what)?,
        );
        launch!(self, f, grid(out.numel()), &pi, &po, &p0, &p1, &n)?;
        Ok(out)
    }

    /// `randn` from the random stream of `key` (see `model_kernels::normal`).
    pub fn normal(
        &self,
        shape: &[usize],
        dtype: DType,
        key: crate::cpu::random::RngKey,
    ) -> Result<CudaTensor, KernelError> {
        let f = self.function(model_kernels::normal(dtype), "randn")?;
        let out = self.empty(shape.to_vec(), dtype)?;
        let n = out.numel();
        if n > 0 {
            let (po, nn) = (out.ptr(&self.stream), count(n, "randn")?);
            launch!(
                self,
                f,
                grid(n.div_ceil(8)),
                &po,
                &key.seed,
                &key.rank,
                &key.step,
                &key.node,
                &nn
            )?;
        }
        Ok(out)
    }

    /// The real models' multi-output kernels.
    fn run_multi_op(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<Vec<CudaTensor>, KernelError> {
        match kernel {
            Kernel::MaxPool2d {
                kernel,
                stride,
                padding,
                dilation,
                ceil_mode,
            } => {
                let p =
                    crate::cpu::pool::Pool2d::new(kernel, stride, padding, dilation, *ceil_mode)?;
                self.max_pool2d(tensor(inputs, 0)?, &p)
            }
            Kernel::VarMean {
                dims,
                correction,
                keepdim,
            } => self.var_mean(tensor(inputs, 0)?, dims.as_deref(), *correction, *keepdim),
            Kernel::Split { sizes, dim } => {
                let x = tensor(inputs, 0)?;
                layouts::split(&x.shape, sizes, *dim)?
                    .iter()
                    .map(|v| self.gather(x, v))
                    .collect()
            }
            Kernel::Sort { dim, descending } => {
                let x = tensor(inputs, 0)?;
                let len = x.shape.get(*dim).copied().unwrap_or(1);
                self.sorted_pair(x, *dim, *descending, len)
            }
            Kernel::Topk { k, dim, largest } => {
                // a 0-d input gives itself for k = 0 too, as on the CPU (and in PyTorch)
                let x = tensor(inputs, 0)?;
                let k = if x.shape.is_empty() { (*k).max(1) } else { *k };
                self.sorted_pair(x, *dim, *largest, k)
            }
            other => self.run(other, inputs).map(|t| vec![t]),
        }
    }

    /// The real models' single-output kernels.
    fn run_model_op(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        let t = |i: usize| tensor(inputs, i);
        match kernel {
            Kernel::Convolution {
                stride,
                padding,
                dilation,
                groups,
                bias,
            } => {
                let b = if *bias { Some(t(2)?) } else { None };
                self.convolution(t(0)?, t(1)?, b, stride, padding, dilation, *groups)
            }
            Kernel::MaxPool2dBackward => self.max_pool2d_backward(t(0)?, t(1)?, t(2)?),
            Kernel::Embedding => self.embedding(t(0)?, t(1)?),
            Kernel::EmbeddingBackward {
                num_weights,
                padding_idx,
                scale_grad_by_freq,
            } => self.embedding_backward(
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
            } => self.var(t(0)?, dims.as_deref(), *correction, *keepdim, *std),
            Kernel::Cumsum { dim, dtype } => self.cumsum(t(0)?, *dim, *dtype),
            Kernel::ArgExtremum { max, dim, keepdim } => {
                self.arg_extremum(t(0)?, *max, *dim, *keepdim)
            }
            Kernel::Bitwise {
                op,
                a,
                b,
                logical,
                dtype,
            } => self.bitwise(*op, a, b, *logical, *dtype, inputs),
            Kernel::BitwiseNot => {
                let x = t(0)?;
                self.map(
                    x,
                    x.dtype,
                    model_kernels::bitwise_not(x.dtype),
                    "bitwise_not",
                )
            }
            Kernel::AdaptiveAvgPool2d { oh, ow } => {
                let x = t(0)?;
                let (planes, h, w) = Self::planes(&x.shape, "adaptive_avg_pool2d")?;
                let mut shape = x.shape[..x.shape.len() - 2].to_vec();
                shape.extend([*oh, *ow]);
                self.adaptive_pool(
                    model_kernels::adaptive_avg_pool2d(x.dtype),
                    x,
                    shape,
                    [planes, h, w, *oh, *ow],
                )
            }
            Kernel::AdaptiveAvgPool2dBackward => {
                let (g, x) = (t(0)?, t(1)?);
                let (planes, h, w) = Self::planes(&x.shape, "adaptive_avg_pool2d_backward")?;
                let r = x.shape.len();
                if g.shape.len() != r || g.shape[..r - 2] != x.shape[..r - 2] {
                    return Err(KernelError(format!(
                        "adaptive_avg_pool2d_backward: grad {:?} does not pool input {:?}",
                        g.shape, x.shape
                    )));
                }
                let (oh, ow) = (g.shape[r - 2], g.shape[r - 1]);
                self.adaptive_pool(
                    model_kernels::adaptive_avg_pool2d_backward(g.dtype),
                    g,
                    x.shape.clone(),
                    [planes, h, w, oh, ow],
                )
            }
            Kernel::Pad { value, config } => self.pad(t(0)?, *value, config),
            Kernel::Slice { start, end, step } => {
                let x = t(0)?;
                self.gather(x, &layouts::slice(&x.shape, start, end, step)?)
            }
            Kernel::Cat { dim } => {
                let all = (0..inputs.len()).map(t).collect::<Result<Vec<_>, _>>()?;
                self.cat(&all, *dim)
            }
            Kernel::Stack { dim } => {
                let views = (0..inputs.len())
                    .map(|i| {
                        let x = t(i)?;
                        Ok(self.view_of(x, layouts::unsqueeze(&x.shape, *dim)?))
                    })
                    .collect::<Result<Vec<_>, KernelError>>()?;
                self.cat(&views.iter().collect::<Vec<_>>(), *dim)
            }
            Kernel::Expand(shape) => {
                let x = t(0)?;
                self.gather(x, &layouts::expand(&x.shape, shape)?)
            }
            Kernel::Flip(dims) => {
                let x = t(0)?;
                self.gather(x, &layouts::flip(&x.shape, dims)?)
            }
            Kernel::Squeeze(dims) => {
                let x = t(0)?;
                Ok(self.view_of(x, layouts::squeeze(&x.shape, dims.as_deref())?))
            }
            Kernel::Unsqueeze(dim) => {
                let x = t(0)?;
                Ok(self.view_of(x, layouts::unsqueeze(&x.shape, *dim)?))
            }
            Kernel::Arange {
                start,
                end,
                step,
                dtype,
            } => self.arange(*start, *end, *step, *dtype),
            Kernel::Full {
                shape,
                value,
                dtype,
            } => self.fill(shape, *value, *dtype),
            Kernel::Compare { op, a, b } => self.compare(*op, a, b, inputs),
            Kernel::Where { a, b, dtype } => self.where_(a, b, *dtype, inputs),
            Kernel::Silu => {
                let x = t(0)?;
                self.map(x, x.dtype, model_kernels::silu(x.dtype), "silu")
            }
            Kernel::Activation(act) => self.activation(*act, t(0)?),
            Kernel::Copy => {
                let (src, dst) = (t(0)?, t(1)?);
                let target: Vec<i64> = dst.shape.iter().map(|&s| s as i64).collect();
                let v = layouts::expand(&src.shape, &target).map_err(|e| format!("copy_: {e}"))?;
                let e = self.gather(src, &v)?;
                self.convert_to(&e, dst.dtype)
            }
            Kernel::TakeAlongDim { dim } => self.take_along_dim(t(0)?, t(1)?, *dim),
            Kernel::Gather { dim } => self.gather_dim(t(0)?, *dim, t(1)?),
            Kernel::ScatterAdd { dim } => self.scatter_add(t(0)?, *dim, t(1)?, t(2)?),
            Kernel::IndexSelect { dim } => self.index_select(t(0)?, *dim, t(1)?),
            Kernel::IndexAdd { dim } => self.index_add(t(0)?, *dim, t(1)?, t(2)?),
            Kernel::Argsort { dim, descending } => {
                let x = t(0)?;
                let len = x.shape.get(*dim).copied().unwrap_or(1);
                self.sort_lines(x, *dim, *descending, len, false)
                    .map(|(_, i)| i)
            }
            Kernel::NllLossBackward {
                reduction,
                ignore_index,
                weighted,
            } => self.nll_loss_backward(
                t(0)?,
                t(1)?,
                t(2)?,
                t(3)?,
                if *weighted { Some(t(4)?) } else { None },
                *reduction,
                *ignore_index,
            ),
            Kernel::SoftmaxBackward { dim, log, dtype } => {
                self.softmax_backward(t(0)?, t(1)?, *dim, *log, *dtype)
            }
            Kernel::Uniform { .. } | Kernel::Normal { .. } => Err(KernelError(
                "uniform draws from a keyed random stream: the executor runs it through \
                 `Backend::random`"
                    .into(),
            )),
            other => Err(KernelError(format!(
                "{other:?} is not a kernel of the real models' ops"
            ))),
        }
    }
}

fn tensor<'a>(
    inputs: &'a [Input<'_, CudaTensor>],
    i: usize,
) -> Result<&'a CudaTensor, KernelError> {
    match inputs.get(i) {
        Some(Input::Tensor(t)) => Ok(t),
        Some(Input::Scalar(_)) => Err(KernelError(format!(
            "input {i} must be a tensor, got a number"
        ))),
        None => Err(KernelError(format!("input {i} is missing"))),
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;

    fn prepare_memory(&self, memory: &crate::exec::MemoryPlan) {
        if let Ok(mut free) = self.recycled.lock() {
            for c in memory.classes.iter().filter(|c| c.numel > 0) {
                let e = free.entry((c.dtype, c.numel)).or_default();
                e.0 = e.0.max(c.count);
            }
        }
    }

    fn recycle(&self, t: CudaTensor) {
        let Ok(buf) = Arc::try_unwrap(t.buf) else {
            return;
        };
        let (n, stream) = buf.len_and_stream();
        if !Arc::ptr_eq(stream, &self.stream) {
            return;
        }
        let key = (buf.dtype(), n);
        if let Ok(mut free) = self.recycled.lock() {
            if let Some((limit, v)) = free.get_mut(&key) {
                if v.len() < *limit {
                    v.push(buf);
                }
            }
        }
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    /// A region with a fused loop on f32 operands runs as one generated kernel
    /// (`cuda::region`); any other runs its kernels one by one.
    fn run_region(
        &self,
        region: &crate::exec::region::RegionProgram,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        let fits = |i: &Input<'_, CudaTensor>| match i {
            Input::Tensor(t) => t.dtype == DType::F32,
            Input::Scalar(_) => true,
        };
        let Some(f) = region.fused.as_ref().filter(|_| inputs.iter().all(fits)) else {
            return region.run_steps(self, inputs);
        };
        let numbers: Vec<bool> = inputs
            .iter()
            .map(|i| matches!(i, Input::Scalar(_)))
            .collect();
        let func = self.function(
            Some(super::region::region_source(f, &numbers)),
            "fusion region",
        )?;
        let out = self.empty(f.shape.clone(), DType::F32)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let ptrs: Vec<u64> = inputs
            .iter()
            .map(|i| match i {
                Input::Tensor(t) => t.ptr(&self.stream),
                Input::Scalar(_) => 0,
            })
            .collect();
        let nums: Vec<f32> = inputs
            .iter()
            .map(|i| match i {
                Input::Scalar(x) => *x as f32,
                Input::Tensor(_) => 0.0,
            })
            .collect();
        let (po, nn) = (out.ptr(&self.stream), count(n, "fusion region")?);
        let mut b = self.stream.launch_builder(&func);
        for (k, num) in numbers.iter().enumerate() {
            if *num {
                b.arg(&nums[k]);
            } else {
                b.arg(&ptrs[k]);
            }
        }
        b.arg(&po);
        b.arg(&nn);
        // SAFETY: the arguments match the generated kernel's parameters (`region_source`: one
        // pointer or number per operand, then out and n); the loads stay within each operand,
        // as the plan's strides come from its shape.
        unsafe { b.launch(grid(n)) }
            .map(|_| ())
            .map_err(kerr("kernel launch"))?;
        Ok(out)
    }

    fn random(
        &self,
        kernel: &Kernel,
        key: crate::cpu::random::RngKey,
    ) -> Result<CudaTensor, KernelError> {
        match kernel {
            Kernel::Uniform {
                shape,
                minval,
                maxval,
                dtype,
            } => self.uniform(shape, *minval, *maxval, *dtype, key),
            Kernel::Normal { shape, dtype } => self.normal(shape, *dtype, key),
            other => Err(KernelError(format!("{other:?} is not a random kernel"))),
        }
    }

    fn run(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        if let Some(r) = crate::exec::composite::run(self, kernel, inputs) {
            return r;
        }
        match kernel {
            Kernel::Unary(op) => {
                let x = tensor(inputs, 0)?;
                self.map(x, x.dtype, kernels::unary(*op, x.dtype), "unary op")
            }
            Kernel::Binary { .. } => self.binary(kernel, inputs),
            Kernel::Identity => Ok(tensor(inputs, 0)?.clone()),
            Kernel::Reshape(shape) => {
                let x = tensor(inputs, 0)?;
                if shape.iter().product::<usize>() != x.numel() {
                    return Err(KernelError(format!(
                        "cannot reshape {:?} to {shape:?}",
                        x.shape
                    )));
                }
                Ok(CudaTensor {
                    shape: shape.clone(),
                    ..x.clone()
                })
            }
            Kernel::Permute(perm) => self.permute(tensor(inputs, 0)?, perm),
            Kernel::Convert(to) => {
                let x = tensor(inputs, 0)?;
                if x.dtype == *to {
                    return Ok(x.clone());
                }
                self.map(x, *to, kernels::convert(x.dtype, *to), "dtype conversion")
            }
            Kernel::Matmul => self.matmul(tensor(inputs, 0)?, tensor(inputs, 1)?),
            Kernel::Linear { bias } => {
                let b = if *bias {
                    Some(tensor(inputs, 2)?)
                } else {
                    None
                };
                self.linear(tensor(inputs, 0)?, tensor(inputs, 1)?, b)
            }
            Kernel::Reduce {
                op,
                dims,
                keepdim,
                dtype,
            } => self.reduce(tensor(inputs, 0)?, *op, dims, *keepdim, *dtype),
            Kernel::Softmax { dim, log } => {
                let x = tensor(inputs, 0)?;
                if *dim >= x.shape.len().max(1) {
                    return Err(KernelError(format!(
                        "softmax over dimension {dim} of a tensor of shape {:?}",
                        x.shape
                    )));
                }
                let len = x.shape.get(*dim).copied().unwrap_or(1);
                let outer: usize = x.shape.get(..*dim).map_or(1, |s| s.iter().product());
                let inner: usize = x.shape.get(dim + 1..).map_or(1, |s| s.iter().product());
                let out = self.empty(x.shape.clone(), x.dtype)?;
                let f = self.function(kernels::softmax(*log, x.dtype), "softmax")?;
                let (pi, po) = (x.ptr(&self.stream), out.ptr(&self.stream));
                let (o, l, i) = (
                    count(outer, "softmax")?,
                    count(len, "softmax")?,
                    count(inner, "softmax")?,
                );
                if x.numel() > 0 {
                    launch!(self, f, rows(outer * inner, len), &pi, &po, &o, &l, &i)?;
                }
                Ok(out)
            }
            Kernel::MaxPool2d { .. }
            | Kernel::VarMean { .. }
            | Kernel::Split { .. }
            | Kernel::Sort { .. }
            | Kernel::Topk { .. } => {
                let mut outs = self.run_multi_op(kernel, inputs)?;
                if outs.len() != 1 {
                    return Err(KernelError(format!(
                        "{kernel:?} gives {} tensors; the node must name each",
                        outs.len()
                    )));
                }
                Ok(outs.remove(0))
            }
            other => self.run_model_op(other, inputs),
        }
    }

    fn run_multi(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<Outputs<CudaTensor>, KernelError> {
        if let Some(r) = crate::exec::composite::run_multi(self, kernel, inputs) {
            return r;
        }
        self.run_multi_op(kernel, inputs).map(Outputs::from_vec)
    }

    fn pack(&self, members: &[&CudaTensor]) -> Result<CudaTensor, KernelError> {
        let first = members.first().ok_or("an empty bucket")?;
        let dtype = first.dtype;
        let total: usize = members.iter().map(|m| m.numel()).sum();
        // reuse a bucket buffer of this size that nothing views any more
        let buf = {
            let mut pool = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
            let free = pool.iter().position(|b| {
                Arc::strong_count(b) == 1
                    && b.dtype() == dtype
                    && match &**b {
                        DevBuf::F32(s) => s.len() == total,
                        DevBuf::BF16(s) => s.len() == total,
                        DevBuf::F16(s) => s.len() == total,
                        DevBuf::I64(s) => s.len() == total,
                        DevBuf::I32(s) => s.len() == total,
                        DevBuf::Bool(s) => s.len() == total,
                    }
            });
            match free {
                Some(i) => pool[i].clone(),
                None => {
                    let b = self.alloc(dtype, total)?;
                    pool.push(b.clone());
                    b
                }
            }
        };
        let out = CudaTensor {
            shape: vec![total],
            dtype,
            offset: 0,
            buf,
        };
        let es = dtype.size_bytes();
        let mut at = out.ptr(&self.stream);
        for m in members {
            if m.dtype != dtype {
                return Err(KernelError(format!("bucket mixes {dtype} and {}", m.dtype)));
            }
            let bytes = m.numel() * es;
            // SAFETY: both ranges lie inside live allocations; same stream orders the copy.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    at,
                    m.ptr(&self.stream),
                    bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(kerr("bucket copy"))?;
            at += bytes as u64;
        }
        Ok(out)
    }

    fn unpack(
        &self,
        buffer: &CudaTensor,
        offsets: &[usize],
        shapes: &[Vec<usize>],
        out: &mut Vec<CudaTensor>,
    ) -> Result<(), KernelError> {
        for (&o, s) in offsets.iter().zip(shapes) {
            let n: usize = s.iter().product();
            if o + n > buffer.numel() {
                return Err(KernelError(format!(
                    "member at {o} of {n} elements overruns a bucket of {}",
                    buffer.numel()
                )));
            }
            out.push(CudaTensor {
                shape: s.clone(),
                dtype: buffer.dtype,
                offset: buffer.offset + o,
                buf: buffer.buf.clone(),
            });
        }
        Ok(())
    }

    fn upload(&self, host: &Tensor) -> Result<CudaTensor, KernelError> {
        let buf = self.upload_storage(host)?;
        Ok(CudaTensor {
            shape: host.shape().to_vec(),
            dtype: buf.dtype(),
            offset: 0,
            buf: Arc::new(buf),
        })
    }

    fn download(&self, t: &CudaTensor) -> Result<Tensor, KernelError> {
        let (o, n) = (t.offset, t.numel());
        let storage = match &*t.buf {
            DevBuf::F32(s) => Storage::F32(
                self.stream
                    .clone_dtoh(&s.slice(o..o + n))
                    .map_err(kerr("download"))?,
            ),
            DevBuf::BF16(s) => Storage::BF16(
                self.stream
                    .clone_dtoh(&s.slice(o..o + n))
                    .map_err(kerr("download"))?,
            ),
            DevBuf::F16(s) => Storage::F16(
                self.stream
                    .clone_dtoh(&s.slice(o..o + n))
                    .map_err(kerr("download"))?,
            ),
            DevBuf::I64(s) => Storage::I64(
                self.stream
                    .clone_dtoh(&s.slice(o..o + n))
                    .map_err(kerr("download"))?,
            ),
            DevBuf::I32(s) => Storage::I32(
                self.stream
                    .clone_dtoh(&s.slice(o..o + n))
                    .map_err(kerr("download"))?,
            ),
            DevBuf::Bool(s) => Storage::Bool(
                self.stream
                    .clone_dtoh(&s.slice(o..o + n))
                    .map_err(kerr("download"))?,
            ),
        };
        Tensor::try_new(t.shape.clone(), storage).map_err(KernelError)
    }

    fn shape<'a>(&self, t: &'a CudaTensor) -> &'a [usize] {
        &t.shape
    }

    fn dtype(&self, t: &CudaTensor) -> DType {
        t.dtype
    }

    fn synchronize(&self) -> Result<(), KernelError> {
        self.stream.synchronize().map_err(kerr("synchronize"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_and_numbers_follow_the_cpu_kernels() {
        use DType::*;
        assert_eq!(
            binary_dtype(Some(BF16), Some(F16), 0., 0., 1.).unwrap(),
            F32
        );
        assert_eq!(
            binary_dtype(Some(BF16), Some(BF16), 0., 0., 1.).unwrap(),
            BF16
        );
        assert_eq!(binary_dtype(Some(I64), None, 0., 0.5, 1.).unwrap(), F32);
        assert_eq!(binary_dtype(Some(I64), None, 0., 2.0, 1.).unwrap(), I64);
        assert_eq!(binary_dtype(None, Some(I64), 2.0, 0., 0.5).unwrap(), F32);
        assert_eq!(
            binary_dtype(Some(Bool), Some(Bool), 0., 0., 1.).unwrap(),
            Bool
        );
        assert_eq!(
            binary_dtype(Some(I64), Some(BF16), 0., 0., 1.).unwrap(),
            BF16
        );
        assert!(binary_dtype(None, None, 1., 2., 1.).is_err());
        assert_eq!(compare_dtype(Some(I64), None, 0., 0.5).unwrap(), F32);
        assert_eq!(compare_dtype(Some(Bool), None, 0., 1.0).unwrap(), I64);
        assert_eq!(compare_dtype(Some(F16), Some(I64), 0., 0.).unwrap(), F16);
        assert_eq!(value_bits(1.0, F32).unwrap(), u64::from(1.0f32.to_bits()));
        assert_eq!(value_bits(-1.0, BF16).unwrap(), 0xbf80);
        assert_eq!(value_bits(-1.0, F16).unwrap(), 0xbc00);
        assert_eq!(value_bits(-3.7, I64).unwrap(), (-3i64) as u64);
        assert_eq!(value_bits(0.5, Bool).unwrap(), 1);
        assert!(value_bits(1.0, F64).is_err());
        assert_eq!(round_to(0.9, BF16), 0.8984375);
        assert_eq!(round_to(0.9, I64), 0.9);
        assert_eq!(whole(3.0, "x").unwrap(), 3);
        assert!(whole(2.5, "x").is_err());
    }

    #[test]
    fn zero_size_gemms_never_pass_a_leading_dimension_of_zero() {
        assert_eq!(GemmCall::new(0, 5, 7, false).unwrap(), GemmCall::Nothing);
        assert_eq!(GemmCall::new(3, 5, 0, true).unwrap(), GemmCall::Nothing);
        assert_eq!(GemmCall::new(3, 0, 7, false).unwrap(), GemmCall::Zero);
        for (m, k, n) in [(1, 1, 1), (3, 5, 7), (1, 4096, 1), (8, 1, 1024)] {
            for t in [false, true] {
                let GemmCall::Call {
                    m: cm,
                    n: cn,
                    k: ck,
                    lda,
                    ldb,
                    ldc,
                } = GemmCall::new(m, k, n, t).unwrap()
                else {
                    panic!("{m} {k} {n} runs a GEMM");
                };
                assert_eq!((cm, cn, ck), (n as i32, m as i32, k as i32));
                assert!(lda >= 1 && ldb >= 1 && ldc >= 1);
                // cuBLAS: lda >= rows of its A (n, or k transposed), ldb >= k, ldc >= n
                assert!(lda >= if t { ck } else { cm });
                assert!(ldb >= ck && ldc >= cm);
            }
        }
        let e = GemmCall::new(1 << 31, 4, 4, false).unwrap_err();
        assert!(e.0.contains("32-bit"), "{}", e.0);
    }

    #[test]
    fn matmul_batch_dimensions_broadcast_one_by_one() {
        // equal products but different dims: the old check compared only the product
        let e = MatmulPlan::new(&[6, 4, 5], &[2, 3, 5, 6]).unwrap_err();
        assert!(e.0.contains("do not broadcast"), "{}", e.0);
        assert!(MatmulPlan::new(&[2, 4, 5], &[3, 5, 6]).is_err());
        assert!(MatmulPlan::new(&[4, 5], &[4, 6]).is_err());
        assert!(MatmulPlan::new(&[], &[4]).is_err());

        let p = MatmulPlan::new(&[2, 3, 4, 5], &[3, 5, 6]).unwrap();
        assert_eq!(p.out_shape, vec![2, 3, 4, 6]);
        assert_eq!((p.m, p.k, p.n), (4, 5, 6));
        let want: Vec<(usize, usize)> = (0..6).map(|i| (i * 20, (i % 3) * 30)).collect();
        assert_eq!(p.batches, want);
        assert_eq!(p.uniform_strides(), None);

        // both sides broadcast
        let p = MatmulPlan::new(&[2, 1, 4, 5], &[3, 5, 6]).unwrap();
        assert_eq!(p.out_shape, vec![2, 3, 4, 6]);
        let want: Vec<(usize, usize)> = (0..6).map(|i| ((i / 3) * 20, (i % 3) * 30)).collect();
        assert_eq!(p.batches, want);

        // a 2-d right operand is shared by every batch; a's batches are contiguous
        let p = MatmulPlan::new(&[4, 8, 16], &[16, 5]).unwrap();
        assert_eq!(p.out_shape, vec![4, 8, 5]);
        assert_eq!(p.uniform_strides(), Some((128, 0)));

        // equal batches: one strided batched GEMM
        let p = MatmulPlan::new(&[4, 3, 7], &[4, 7, 2]).unwrap();
        assert_eq!(p.uniform_strides(), Some((21, 14)));

        // 1-d operands: the unit dimension is dropped from the result
        assert_eq!(MatmulPlan::new(&[5], &[5, 6]).unwrap().out_shape, vec![6]);
        assert_eq!(
            MatmulPlan::new(&[2, 4, 5], &[5]).unwrap().out_shape,
            vec![2, 4]
        );
        assert_eq!(
            MatmulPlan::new(&[5], &[5]).unwrap().out_shape,
            Vec::<usize>::new()
        );

        // an empty batch has no GEMM to run
        let p = MatmulPlan::new(&[0, 4, 5], &[5, 6]).unwrap();
        assert!(p.batches.is_empty());
        assert_eq!(p.out_shape, vec![0, 4, 6]);
    }
}
