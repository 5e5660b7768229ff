//! The CUDA backend: tensors in device memory (cudarc allocations, no managed memory), GEMMs
//! through cuBLAS, everything else through NVRTC kernels compiled once per op and dtype.
//! Tensors are contiguous; permutes copy, bucket views share their buffer.

use super::kernels::{self, Layout, Source, MAX_RANK};
use super::CudaError;
use crate::backend::{Backend, Input, KernelError};
use crate::kernel::{Kernel, Side};
use crate::tensor::{contiguous_strides, Storage, Tensor};
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
}

impl DevBuf {
    fn dtype(&self) -> DType {
        match self {
            DevBuf::F32(_) => DType::F32,
            DevBuf::BF16(_) => DType::BF16,
            DevBuf::F16(_) => DType::F16,
        }
    }
    /// Raw device address of element 0 (the kernels and cuBLAS take raw pointers; ordering is
    /// by the one compute stream, and by explicit events for communication).
    fn base(&self, stream: &CudaStream) -> u64 {
        match self {
            DevBuf::F32(s) => s.device_ptr(stream).0,
            DevBuf::BF16(s) => s.device_ptr(stream).0,
            DevBuf::F16(s) => s.device_ptr(stream).0,
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
}

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
                "{what}: dtype not supported on cuda (f32, bf16, f16)"
            ))
        })?;
        let mut cache = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cache.get(&src.name) {
            return Ok(f.clone());
        }
        let (image, arch) =
            super::nvrtc::compile_for_device(&src, self.cc).map_err(kerr("NVRTC"))?;
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
        // SAFETY: every kernel writes all of its output before anything reads it.
        let buf = unsafe {
            match dtype {
                DType::F32 => DevBuf::F32(self.stream.alloc::<f32>(n).map_err(kerr("cudaMalloc"))?),
                DType::BF16 => {
                    DevBuf::BF16(self.stream.alloc::<bf16>(n).map_err(kerr("cudaMalloc"))?)
                }
                DType::F16 => DevBuf::F16(self.stream.alloc::<f16>(n).map_err(kerr("cudaMalloc"))?),
                other => {
                    return Err(KernelError(format!(
                        "dtype {other} is not supported on cuda (f32, bf16, f16)"
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
        let strides = contiguous_strides(&x.shape);
        let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
        let mut l = Layout {
            rank: perm.len() as i32,
            ..Layout::default()
        };
        for (i, &p) in perm.iter().enumerate() {
            l.shape[i] = x.shape[p] as i64;
            l.stride_a[i] = strides[p] as i64;
        }
        let out = self.empty(shape, x.dtype)?;
        let n = out.numel();
        let f = self.function(kernels::permute(x.dtype), "permute")?;
        let (pi, po, nn) = (
            x.ptr(&self.stream),
            out.ptr(&self.stream),
            count(n, "permute")?,
        );
        launch!(self, f, grid(n), &pi, &l, &po, &nn)?;
        Ok(out)
    }

    fn binary(
        &self,
        k: &Kernel,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
        let Kernel::Binary { op, a, b, alpha } = k else {
            return Err(KernelError("not a binary kernel".into()));
        };
        let side = |s: &Side| -> Result<(Option<&CudaTensor>, f32), KernelError> {
            match s {
                Side::Scalar(x) => Ok((None, *x as f32)),
                Side::Input(i) => match inputs.get(*i) {
                    Some(Input::Tensor(t)) => Ok((Some(*t), 0.0)),
                    Some(Input::Scalar(x)) => Ok((None, *x as f32)),
                    None => Err(KernelError(format!("input {i} is missing"))),
                },
            }
        };
        let ((ta, sa), (tb, sb)) = (side(a)?, side(b)?);
        let first = ta.or(tb).ok_or("both operands are numbers")?;
        let dtype = first.dtype;
        if let (Some(x), Some(y)) = (ta, tb) {
            if x.dtype != y.dtype {
                return Err(KernelError(format!(
                    "cuda binary ops need one dtype, got {} and {}",
                    x.dtype, y.dtype
                )));
            }
        }
        let sa_shape = ta.map(|t| t.shape.clone()).unwrap_or_default();
        let sb_shape = tb.map(|t| t.shape.clone()).unwrap_or_default();
        let out_shape = tracepass_ir::broadcast_shapes(&sa_shape, &sb_shape).ok_or_else(|| {
            KernelError(format!(
                "shapes {sa_shape:?} and {sb_shape:?} do not broadcast"
            ))
        })?;
        if out_shape.len() > MAX_RANK {
            return Err(KernelError(format!(
                "rank {} is above the cuda limit {MAX_RANK}",
                out_shape.len()
            )));
        }
        let mut l = Layout {
            rank: out_shape.len() as i32,
            ..Layout::default()
        };
        let bs = |s: &[usize]| -> Vec<i64> {
            let own = contiguous_strides(s);
            let lead = out_shape.len() - s.len();
            (0..out_shape.len())
                .map(|i| {
                    if i < lead || s[i - lead] == 1 {
                        0
                    } else {
                        own[i - lead] as i64
                    }
                })
                .collect()
        };
        let (va, vb) = (bs(&sa_shape), bs(&sb_shape));
        for i in 0..out_shape.len() {
            l.shape[i] = out_shape[i] as i64;
            l.stride_a[i] = va[i];
            l.stride_b[i] = vb[i];
        }
        let out = self.empty(out_shape, dtype)?;
        let n = out.numel();
        let f = self.function(kernels::binary(*op, dtype), "binary op")?;
        let pa = ta.map_or(0u64, |t| t.ptr(&self.stream));
        let pb = tb.map_or(0u64, |t| t.ptr(&self.stream));
        let (a_num, b_num) = (i32::from(ta.is_none()), i32::from(tb.is_none()));
        let (alpha, po, nn) = (*alpha as f32, out.ptr(&self.stream), count(n, "binary op")?);
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
            &alpha,
            &l,
            &po,
            &nn
        )?;
        Ok(out)
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
        op: crate::kernel::ReduceOp,
        dims: &[usize],
        keepdim: bool,
        dtype: DType,
    ) -> Result<CudaTensor, KernelError> {
        if dtype != x.dtype {
            return Err(KernelError(format!(
                "reduction from {} to {dtype} is not supported on cuda",
                x.dtype
            )));
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
        let f = self.function(kernels::reduce(op, x.dtype), "reduction")?;
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
            Storage::I64(_) | Storage::I32(_) | Storage::Bool(_) => {
                return Err(KernelError(format!(
                    "{} tensors are not supported on cuda",
                    t.dtype()
                )))
            }
        })
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

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn run(
        &self,
        kernel: &Kernel,
        inputs: &[Input<'_, CudaTensor>],
    ) -> Result<CudaTensor, KernelError> {
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
            other => Err(KernelError(format!(
                "{other:?} is not supported by the cuda backend yet"
            ))),
        }
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
    ) -> Result<Vec<CudaTensor>, KernelError> {
        offsets
            .iter()
            .zip(shapes)
            .map(|(&o, s)| {
                let n: usize = s.iter().product();
                if o + n > buffer.numel() {
                    return Err(KernelError(format!(
                        "member at {o} of {n} elements overruns a bucket of {}",
                        buffer.numel()
                    )));
                }
                Ok(CudaTensor {
                    shape: s.clone(),
                    dtype: buffer.dtype,
                    offset: buffer.offset + o,
                    buf: buffer.buf.clone(),
                })
            })
            .collect()
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
