//! CUDA C sources of the elementwise, reduction and layout kernels, generated per op and dtype
//! and compiled with NVRTC on first use. Half types are handled as raw 16-bit words with PTX
//! conversions, so no CUDA headers are needed at run time (NVRTC has no `math.h`: infinity is
//! spelled by its bits). All arithmetic is in f32.
//!
//! Elementwise kernels are grid-stride loops over 64-bit indices, so a launch of
//! [`elementwise_blocks`] blocks covers any element count. Reductions and softmax run one block
//! per row (warp shuffles, then one value per warp through shared memory).
//!
//! [`catalog`] lists every kernel the backend can launch (every `Kernel` variant x every dtype
//! of [`ALL_DTYPES`] it has a kernel for); it is the one source of truth the NVRTC test
//! compiles, and the op lists it is built from are checked against the op enums at compile
//! time (a new op or `Kernel` variant that is not listed does not build). The real models'
//! kernels (convolution, pooling, embedding, var_mean, layout, comparisons, fills, random
//! numbers, integer ops, take_along_dim, indexing and sorting, nll_loss and softmax
//! backward) are generated in [`super::model_kernels`].

use super::model_kernels::{self, ALL_DTYPES};
use crate::exec::kernel::{
    BinaryOp, BitOp, CompareOp, Kernel, LossReduction, ReduceOp, UnaryOp, VjpOutputs,
};
use tracepass_ir::DType;

/// Largest rank the shape-carrying kernels handle.
pub const MAX_RANK: usize = 6;

/// Threads per block of the elementwise kernels.
pub const BLOCK: u32 = 256;

/// Most blocks an elementwise launch uses: the grid-stride loop covers the rest. 2^16 blocks
/// of 256 threads keep every SM of a current GPU busy many times over.
pub const MAX_BLOCKS: u32 = 1 << 16;

/// Largest block of the row kernels (reductions, softmax): 8 warps.
pub const ROW_BLOCK: u32 = 256;

/// The dtypes the kernels are generated for.
#[cfg(test)]
pub const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// Lists every variant of a fieldless enum; leaving one out is a compile error (the match
/// inside must be exhaustive over exactly the listed variants).
macro_rules! every {
    ($ty:ident: $($v:ident),+ $(,)?) => {{
        #[allow(dead_code)]
        const fn exhaustive(x: $ty) {
            match x {
                $($ty::$v => ()),+
            }
        }
        [$($ty::$v),+]
    }};
}

/// Every unary op.
pub const UNARY_OPS: &[UnaryOp] = &every!(UnaryOp: Neg, Abs, Exp, Log, Log1p, Expm1, Sqrt,
    Rsqrt, Tanh, Sigmoid, Relu, Sin, Cos, Reciprocal, Sign, Erf, Gelu, GeluTanh, Exp2, Log2,
    Log10, Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh, Floor, Ceil, Round, Trunc,
    Erfc, Relu6, Hardswish, Hardsigmoid, Softplus, Mish, Logsigmoid, Softsign, Tanhshrink, Selu,
    Lgamma, Digamma, Trigamma, Erfinv, Erfcinv, Ndtri);

/// Every binary op.
pub const BINARY_OPS: &[BinaryOp] = &every!(BinaryOp: Add, Sub, Mul, Div, Pow, Maximum, Minimum, Atan2, FloorDivide, Remainder,
        Fmod, Nextafter, Zeta);

/// Every reduction.
pub const REDUCE_OPS: &[ReduceOp] = &every!(ReduceOp: Sum, Mean, Amax, Amin, Prod);

/// Shape and the strides two inputs are read with, for broadcasting and permutes (elements).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    pub rank: i32,
    pub _pad: i32,
    pub shape: [i64; MAX_RANK],
    pub stride_a: [i64; MAX_RANK],
    pub stride_b: [i64; MAX_RANK],
}

// SAFETY: plain old data with a C layout; the kernels declare the same struct.
unsafe impl cudarc::driver::DeviceRepr for Layout {}

/// Blocks of [`BLOCK`] threads for an elementwise launch over `n` elements (at least one, at
/// most [`MAX_BLOCKS`]; the kernels loop over the rest).
pub fn elementwise_blocks(n: usize) -> u32 {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS as usize);
    // clamped to MAX_BLOCKS above, which fits
    u32::try_from(blocks).unwrap_or(MAX_BLOCKS)
}

/// Blocks and threads for a row kernel: one block per row (grid-stride over rows past
/// [`MAX_BLOCKS`]), threads a multiple of the warp size, no more than a row needs.
pub fn row_launch(rows: usize, row_len: usize) -> (u32, u32) {
    let blocks = u32::try_from(rows.clamp(1, MAX_BLOCKS as usize)).unwrap_or(MAX_BLOCKS);
    let threads = row_len
        .clamp(32, ROW_BLOCK as usize)
        .next_multiple_of(32)
        .min(ROW_BLOCK as usize);
    (blocks, u32::try_from(threads).unwrap_or(ROW_BLOCK))
}

pub(crate) const PRELUDE: &str = r#"
#define NEG_INF __int_as_float(0xff800000)
#define GRID_STRIDE(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)
struct Layout { int rank; int pad; long long shape[6]; long long sa[6]; long long sb[6]; };
__device__ __forceinline__ float ld_f32(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ void st_f32(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ float ld_bf16(const unsigned short* p, long long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
__device__ __forceinline__ void st_bf16(unsigned short* p, long long i, float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) { p[i] = (unsigned short)((u >> 16) | 0x40u); return; }
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (unsigned short)(u >> 16);
}
__device__ __forceinline__ float ld_f16(const unsigned short* p, long long i) {
    float f; unsigned short h = p[i]; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ void st_f16(unsigned short* p, long long i, float v) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p[i] = h;
}
__device__ __forceinline__ void offsets(const Layout& l, long long i, long long* a, long long* b) {
    long long oa = 0, ob = 0;
    for (int d = l.rank - 1; d >= 0; --d) {
        long long c = i % l.shape[d];
        i /= l.shape[d];
        oa += c * l.sa[d];
        ob += c * l.sb[d];
    }
    *a = oa; *b = ob;
}
struct SumOp { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
// NaN wins, as in torch.amax and torch.amin
struct MaxOp { __device__ __forceinline__ float operator()(float a, float b) const { return (b != b || b > a) ? b : a; } };
struct MinOp { __device__ __forceinline__ float operator()(float a, float b) const { return (b != b || b < a) ? b : a; } };
struct ProdOp { __device__ __forceinline__ float operator()(float a, float b) const { return a * b; } };
// Reduces `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result. `id` is the operation's identity.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T id) {
    __shared__ T part[32];
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? part[lane] : id;
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}
"#;

/// (C type, load fn, store fn) of a dtype.
pub fn ctype(d: DType) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match d {
        DType::F32 => ("float", "ld_f32", "st_f32"),
        DType::BF16 => ("unsigned short", "ld_bf16", "st_bf16"),
        DType::F16 => ("unsigned short", "ld_f16", "st_f16"),
        _ => return None,
    })
}

pub(crate) fn unary_expr(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Neg => "-x",
        UnaryOp::Abs => "fabsf(x)",
        UnaryOp::Exp => "expf(x)",
        UnaryOp::Log => "logf(x)",
        UnaryOp::Log1p => "log1pf(x)",
        UnaryOp::Expm1 => "expm1f(x)",
        UnaryOp::Sqrt => "sqrtf(x)",
        UnaryOp::Rsqrt => "1.0f / sqrtf(x)",
        UnaryOp::Tanh => "tanhf(x)",
        UnaryOp::Sigmoid => "1.0f / (1.0f + expf(-x))",
        UnaryOp::Relu => "(x > 0.0f ? x : 0.0f)",
        UnaryOp::Sin => "sinf(x)",
        UnaryOp::Cos => "cosf(x)",
        UnaryOp::Reciprocal => "1.0f / x",
        UnaryOp::Sign => "(x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x))",
        UnaryOp::Erf => "erff(x)",
        UnaryOp::Gelu => "0.5f * x * (1.0f + erff(x * 0.7071067811865476f))",
        UnaryOp::GeluTanh => {
            "0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))"
        }
        UnaryOp::Exp2 => "exp2f(x)",
        UnaryOp::Log2 => "log2f(x)",
        UnaryOp::Log10 => "log10f(x)",
        UnaryOp::Tan => "tanf(x)",
        UnaryOp::Asin => "asinf(x)",
        UnaryOp::Acos => "acosf(x)",
        UnaryOp::Atan => "atanf(x)",
        UnaryOp::Sinh => "sinhf(x)",
        UnaryOp::Cosh => "coshf(x)",
        UnaryOp::Asinh => "asinhf(x)",
        UnaryOp::Acosh => "acoshf(x)",
        UnaryOp::Atanh => "atanhf(x)",
        UnaryOp::Floor => "floorf(x)",
        UnaryOp::Ceil => "ceilf(x)",
        UnaryOp::Round => "rintf(x)",
        UnaryOp::Trunc => "truncf(x)",
        UnaryOp::Erfc => "erfcf(x)",
        UnaryOp::Relu6 => "(x != x ? x : fminf(fmaxf(x, 0.0f), 6.0f))",
        UnaryOp::Hardswish => "x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f",
        UnaryOp::Hardsigmoid => "fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f",
        UnaryOp::Softplus => "(x > 20.0f ? x : log1pf(expf(x)))",
        UnaryOp::Mish => "x * tanhf(x > 20.0f ? x : log1pf(expf(x)))",
        UnaryOp::Logsigmoid => "fminf(x, 0.0f) - log1pf(expf(-fabsf(x)))",
        UnaryOp::Softsign => "x / (1.0f + fabsf(x))",
        UnaryOp::Tanhshrink => "x - tanhf(x)",
        UnaryOp::Selu => "1.0507009873554805f * (x > 0.0f ? x : 1.6732632423543772f * expm1f(x))",
        UnaryOp::Lgamma => "lgammaf(x)",
        UnaryOp::Digamma => "digamma_f(x)",
        UnaryOp::Trigamma => "trigamma_f(x)",
        UnaryOp::Erfinv => "erfinvf(x)",
        UnaryOp::Erfcinv => "erfcinvf(x)",
        UnaryOp::Ndtri => "normcdfinvf(x)",
    }
}

/// digamma and trigamma (CUDA's math library has neither), as `cpu::special` computes them:
/// reflection below 0, recurrence up to 10, then the asymptotic series; in double.
pub(crate) const SPECIAL_FNS: &str = r#"
__device__ double digamma_d(double x) {
    const double PI = 3.141592653589793;
    if (x != x) return x;
    if (x == 0.0) return signbit(x) ? 1.0 / 0.0 : -1.0 / 0.0;
    double acc = 0.0;
    if (x < 0.0) {
        if (x == floor(x)) return 0.0 / 0.0;
        acc = -PI / tan(PI * x);
        x = 1.0 - x;
    }
    while (x < 10.0) { acc -= 1.0 / x; x += 1.0; }
    double r = 1.0 / (x * x);
    double tail = r * (1.0/12 - r * (1.0/120 - r * (1.0/252 - r * (1.0/240 - r * (1.0/132 - r * 691.0/32760)))));
    return acc + log(x) - 0.5 / x - tail;
}
__device__ float digamma_f(float x) { return (float)digamma_d((double)x); }
__device__ double trigamma_d(double x) {
    const double PI = 3.141592653589793;
    if (x != x) return x;
    if (x <= 0.0 && x == floor(x)) return 1.0 / 0.0;
    double acc = 0.0, sign = 1.0;
    if (x < 0.0) {
        double s = sin(PI * x);
        acc = PI * PI / (s * s);
        sign = -1.0;
        x = 1.0 - x;
    }
    double inner = 0.0;
    while (x < 10.0) { inner += 1.0 / (x * x); x += 1.0; }
    double r = 1.0 / (x * x);
    inner += 1.0 / x + r / 2.0 + r / x * (1.0/6 - r * (1.0/30 - r * (1.0/42 - r * (1.0/30 - r * 5.0/66))));
    return acc + sign * inner;
}
__device__ float trigamma_f(float x) { return (float)trigamma_d((double)x); }
"#;

pub(crate) fn binary_expr(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "a + alpha * b",
        BinaryOp::Sub => "a - alpha * b",
        BinaryOp::Mul => "a * b",
        BinaryOp::Div => "a / b",
        BinaryOp::Pow => "(b == 2.0f ? a * a : (b == 3.0f ? a * a * a : powf(a, b)))",
        BinaryOp::Maximum => "((a != a || a > b) ? a : b)",
        BinaryOp::Minimum => "((a != a || a < b) ? a : b)",
        BinaryOp::Atan2 => "atan2f(a, b)",
        BinaryOp::FloorDivide => "floor_div(a, b)",
        BinaryOp::Remainder => "remainder(a, b)",
        BinaryOp::Fmod => "fmodf(a, b)",
        BinaryOp::Nextafter => "nextafterf(a, b)",
        BinaryOp::Zeta => "(float)zeta_d((double)a, (double)b)",
    }
}

/// PyTorch's `div_floor` and `remainder` of floats (as `cpu::elementwise`).
pub(crate) const FLOAT_DIVISION: &str = r#"
__device__ __forceinline__ float floor_div(float a, float b) {
    if (b == 0.0f) return a / b;
    float m = fmodf(a, b);
    float div = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) div -= 1.0f;
    if (div != 0.0f) { float f = floorf(div); return (div - f > 0.5f) ? f + 1.0f : f; }
    return 0.0f * (a / b);
}
__device__ __forceinline__ float remainder(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) ? m + b : m;
}
"#;

/// The Hurwitz zeta function in double, as `cpu::special::zeta` (Cephes' `zeta`: the sum
/// up to a = q + 9, then the Euler-Maclaurin tail).
pub(crate) const ZETA: &str = r#"
__device__ double zeta_d(double x, double q) {
    const double MACHEP = 1.11022302462515654042e-16;
    const double A[12] = {12.0, -720.0, 30240.0, -1209600.0, 47900160.0,
        -1.8924375803183791606e9, 7.47242496e10, -2.950130727918164224e12,
        1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
        -7.1661652561756670113e18};
    if (x == 1.0) return 1.0 / 0.0;
    if (x < 1.0) return 0.0 / 0.0;
    if (q <= 0.0) {
        if (q == floor(q)) return 1.0 / 0.0;
        if (x != floor(x)) return 0.0 / 0.0;
    }
    double s = pow(q, -x), a = q, b = 0.0;
    int i = 0;
    while (i < 9 || a <= 9.0) {
        i += 1; a += 1.0; b = pow(a, -x); s += b;
        if (fabs(b / s) < MACHEP) return s;
    }
    double w = a;
    s += b * w / (x - 1.0);
    s -= 0.5 * b;
    double aa = 1.0, k = 0.0;
    for (int j = 0; j < 12; j++) {
        aa *= x + k; b /= w;
        double t = aa * b / A[j];
        s += t;
        if (fabs(t / s) < MACHEP) return s;
        k += 1.0; aa *= x + k; b /= w; k += 1.0;
    }
    return s;
}
"#;

/// A kernel's entry point name and full source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub name: String,
    pub code: String,
}

pub fn unary(op: UnaryOp, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("unary_{op:?}_{d}").to_lowercase();
    let special = if matches!(op, UnaryOp::Digamma | UnaryOp::Trigamma) {
        SPECIAL_FNS
    } else {
        ""
    };
    let code = format!(
        "{PRELUDE}{special}\nextern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{\n    float x = {ld}(in, i);\n    {st}(out, i, {});\n  }}\n}}\n",
        unary_expr(op)
    );
    Some(Source { name, code })
}

/// `out[i] = a op alpha*b` with a and b broadcast through `Layout`; a side given as a number
/// reads `sa`/`sb` instead (`a_num`/`b_num` set).
pub fn binary(op: BinaryOp, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("binary_{op:?}_{d}").to_lowercase();
    let zeta = if op == BinaryOp::Zeta { ZETA } else { "" };
    let code = format!(
        "{PRELUDE}{FLOAT_DIVISION}{zeta}\nextern \"C\" __global__ void {name}(const {t}* pa, const {t}* pb, float sa, float sb, int a_num, int b_num, float alpha, Layout l, {t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{\n    long long oa, ob; offsets(l, i, &oa, &ob);\n    float a = a_num ? sa : {ld}(pa, oa);\n    float b = b_num ? sb : {ld}(pb, ob);\n    {st}(out, i, {});\n  }}\n}}\n",
        binary_expr(op)
    );
    Some(Source { name, code })
}

/// Copies `in` read through `Layout.sa` (a permuted view) into contiguous `out`; every dtype
/// of [`ALL_DTYPES`] (see [`model_kernels::gather`]).
pub fn permute(d: DType) -> Option<Source> {
    model_kernels::gather(d)
}

/// Converts between two different dtypes of [`ALL_DTYPES`] (the same dtype needs no kernel:
/// `None`; see [`model_kernels::convert`]).
pub fn convert(from: DType, to: DType) -> Option<Source> {
    model_kernels::convert(from, to)
}

/// One block per output row: reduces the `count` contiguous inputs of row `r` at `r * count`.
/// (The reduced dimensions are first brought last and contiguous by a permute.)
pub fn reduce(op: ReduceOp, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("reduce_{op:?}_{d}").to_lowercase();
    let (init, functor, fin) = match op {
        ReduceOp::Sum => ("0.0f", "SumOp", "acc"),
        ReduceOp::Mean => ("0.0f", "SumOp", "acc / (float)count"),
        ReduceOp::Amax => ("NEG_INF", "MaxOp", "acc"),
        ReduceOp::Amin => ("__int_as_float(0x7f800000)", "MinOp", "acc"),
        ReduceOp::Prod => ("1.0f", "ProdOp", "acc"),
    };
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long outer, long long count) {{\n  {functor} op;\n  for (long long row = blockIdx.x; row < outer; row += gridDim.x) {{\n    const long long base = row * count;\n    float acc = {init};\n    for (long long k = threadIdx.x; k < count; k += blockDim.x) acc = op(acc, {ld}(in, base + k));\n    acc = block_reduce(acc, op, {init});\n    if (threadIdx.x == 0) {st}(out, row, {fin});\n  }}\n}}\n"
    );
    Some(Source { name, code })
}

/// Softmax or log-softmax over the middle dimension of `[outer, len, inner]`: one block per
/// row `(o, r)`, whose `len` elements lie `inner` apart.
pub fn softmax(log: bool, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("{}softmax_{d}", if log { "log_" } else { "" }).to_lowercase();
    let out = if log { "s - lse" } else { "expf(s) / sum" };
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long outer, long long len, long long inner) {{\n  MaxOp mx; SumOp sm;\n  for (long long row = blockIdx.x; row < outer * inner; row += gridDim.x) {{\n    const long long base = (row / inner) * len * inner + row % inner;\n    float m = NEG_INF;\n    for (long long j = threadIdx.x; j < len; j += blockDim.x) m = mx(m, {ld}(in, base + j * inner));\n    m = block_reduce(m, mx, NEG_INF);\n    float sum = 0.0f;\n    for (long long j = threadIdx.x; j < len; j += blockDim.x) sum += expf({ld}(in, base + j * inner) - m);\n    sum = block_reduce(sum, sm, 0.0f);\n    float lse = logf(sum);\n    for (long long j = threadIdx.x; j < len; j += blockDim.x) {{ float s = {ld}(in, base + j * inner) - m; {st}(out, base + j * inner, {out}); }}\n  }}\n}}\n"
    );
    Some(Source { name, code })
}

/// `out[r, c] = bias[c]` for the rows of a linear layer's output (then GEMM adds with beta 1).
pub fn fill_rows(d: DType) -> Option<Source> {
    let (t, _, _) = ctype(d)?;
    let name = format!("fill_rows_{d}").to_lowercase();
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* bias, {t}* out, long long n, long long cols) {{\n  GRID_STRIDE(i, n) {{ out[i] = bias[i % cols]; }}\n}}\n"
    );
    Some(Source { name, code })
}

/// Every comparison.
pub const COMPARE_OPS: &[CompareOp] = &every!(CompareOp: Lt, Le, Gt, Ge, Eq, Ne);

/// The NVRTC kernels the backend launches for `kernel` on inputs of dtype `d` (none for those
/// that are metadata changes or cuBLAS calls, or for a dtype the op has no kernel for). The
/// backend takes its sources from the same generators; this match is exhaustive, so a new
/// `Kernel` must say what it launches.
pub fn sources(kernel: &Kernel, d: DType) -> Vec<Source> {
    use model_kernels as m;
    // ops run from other kernels: theirs
    if let Some(parts) = crate::exec::composite::parts(kernel, d) {
        return parts.iter().flat_map(|(k, d)| sources(k, *d)).collect();
    }
    let v = match kernel {
        Kernel::Unary(op) => vec![unary(*op, d)],
        // floats compute here; integers (and bools, as i64) in wrapping i64, divisions of
        // integers in f32 after a conversion; i32 converted to i64 and back
        Kernel::Binary { op, .. } => match d {
            DType::I64 => vec![binary(*op, d), m::binary_int(*op)],
            DType::I32 => vec![
                convert(d, DType::I64),
                m::binary_int(*op),
                convert(DType::I64, d),
            ],
            _ => vec![binary(*op, d)],
        },
        Kernel::Identity | Kernel::Reshape(_) | Kernel::Matmul => vec![],
        // views: a shape on the same buffer
        Kernel::Squeeze(_) | Kernel::Unsqueeze(_) => vec![],
        Kernel::Permute(_)
        | Kernel::Expand(_)
        | Kernel::Slice { .. }
        | Kernel::Flip(_)
        | Kernel::Split { .. } => vec![permute(d)],
        Kernel::Convert(to) => vec![convert(d, *to)],
        Kernel::Linear { bias } => {
            if *bias {
                vec![fill_rows(d)]
            } else {
                vec![]
            }
        }
        // the reduced dimensions are permuted last first; bools and integers sum and max in
        // i64 (bools and i32 converted first, an i32 result cast back)
        Kernel::Reduce { op, .. } => {
            if matches!(d, DType::I64 | DType::I32 | DType::Bool) {
                vec![
                    convert(d, DType::I64),
                    permute(DType::I64),
                    m::reduce_int(*op),
                    convert(DType::I64, DType::I32),
                ]
            } else {
                vec![permute(d), reduce(*op, d)]
            }
        }
        Kernel::Softmax { log, .. } => vec![softmax(*log, d)],
        Kernel::Convolution { .. } => vec![m::convolution(d)],
        // the weight permuted and flipped, the input padded, then a convolution
        // (crate::exec::conv_transpose)
        Kernel::ConvTranspose { .. } => vec![permute(d), m::pad(d), m::convolution(d)],
        // convolutions of permuted operands, cut by slices, groups joined, the bias's sum
        // (crate::exec::conv_transpose)
        Kernel::ConvTransposeVjp { .. } => vec![
            permute(d),
            m::convolution(d),
            m::cat_copy(d),
            reduce(ReduceOp::Sum, d),
        ],
        Kernel::MaxPool2d { .. } => vec![m::max_pool2d(d)],
        // f32 accumulation, then rounded to the dtype
        Kernel::MaxPool2dBackward => vec![m::max_pool2d_backward(d), convert(DType::F32, d)],
        Kernel::Embedding => vec![m::embedding(d)],
        Kernel::EmbeddingBackward { .. } => vec![
            m::embedding_backward(d),
            Some(m::embedding_count()),
            convert(DType::F32, d),
        ],
        Kernel::VarMean { .. } => vec![permute(d), m::var_mean(d)],
        // halves widen to f32 first, so the square root rounds once
        Kernel::Var { .. } => vec![
            convert(d, DType::F32),
            permute(DType::F32),
            m::var_mean(DType::F32),
            unary(UnaryOp::Sqrt, DType::F32),
            convert(DType::F32, d),
        ],
        // cast to the result's dtype first
        Kernel::Cumsum { dtype, .. } => vec![convert(d, *dtype), m::cumsum(*dtype)],
        Kernel::ArgExtremum { max, .. } => vec![m::arg_extremum(*max, d)],
        // logical ops on bools (truthiness), bitwise ops on i64 or bools
        Kernel::Bitwise {
            op, logical, dtype, ..
        } => {
            if *logical || *dtype == DType::Bool {
                vec![convert(d, DType::Bool), m::bitwise(*op, DType::Bool)]
            } else {
                vec![convert(d, DType::I64), m::bitwise(*op, DType::I64)]
            }
        }
        Kernel::BitwiseNot => vec![m::bitwise_not(d)],
        Kernel::AdaptiveAvgPool2d { .. } => vec![m::adaptive_avg_pool2d(d)],
        Kernel::AdaptiveAvgPool2dBackward => vec![m::adaptive_avg_pool2d_backward(d)],
        Kernel::Pad { .. } => vec![m::pad(d)],
        Kernel::Cat { .. } => vec![m::cat_copy(d)],
        // unsqueezed views, concatenated
        Kernel::Stack { .. } => vec![m::cat_copy(d)],
        Kernel::Arange { .. } => vec![m::arange(d)],
        Kernel::Full { .. } => vec![m::fill(d)],
        Kernel::Compare { op, .. } => vec![m::compare(*op, d)],
        Kernel::Where { .. } => vec![m::where_(d)],
        Kernel::Silu => vec![m::silu(d)],
        Kernel::Activation(act) => vec![m::activation(*act, d)],
        // expanded to the destination's shape, converted to its dtype
        Kernel::Copy => vec![permute(d)],
        Kernel::Uniform { .. } => vec![m::uniform(d)],
        Kernel::Normal { .. } => vec![m::normal(d)],
        // the ops of a model's own cross-entropy
        Kernel::TakeAlongDim { .. } => vec![m::take_along_dim(d)],
        // indices bounds-checked first (an index out of range is an error naming it); the adds
        // run one thread per output element, in index order (deterministic, no atomics)
        Kernel::Gather { .. } => checked(m::gather_dim(d)),
        Kernel::IndexSelect { .. } => checked(m::index_select(d)),
        Kernel::ScatterAdd { .. } => checked(m::scatter_add(d)),
        Kernel::IndexAdd { .. } => checked(m::index_add(d)),
        Kernel::Sort { .. } | Kernel::Argsort { .. } | Kernel::Topk { .. } => {
            vec![m::sort_rank(d)]
        }
        // grad, weight and total_weight are read as f32
        Kernel::NllLossBackward { .. } if ctype(d).is_some() => {
            vec![m::nll_loss_backward(d), convert(d, DType::F32)]
        }
        Kernel::NllLossBackward { .. } => vec![],
        // another result dtype: computed from f32 copies, then rounded to it
        Kernel::SoftmaxBackward { log, dtype, .. } if ctype(d).is_some() => vec![
            m::softmax_backward(*log, d),
            m::softmax_backward(*log, DType::F32),
            convert(d, DType::F32),
            convert(DType::F32, *dtype),
        ],
        Kernel::SoftmaxBackward { .. } => vec![],
        // returned above, from their parts
        Kernel::Triangle { .. }
        | Kernel::OneHot { .. }
        | Kernel::PixelShuffle { .. }
        | Kernel::ChannelShuffle { .. }
        | Kernel::ClampBoundBackward { .. }
        | Kernel::Roll { .. }
        | Kernel::TruncDivide { .. }
        | Kernel::AdaptiveAvgPool1d { .. }
        | Kernel::AdaptiveAvgPool1dBackward
        | Kernel::Lerp { .. }
        | Kernel::Logsumexp { .. }
        | Kernel::GroupedMm { .. }
        | Kernel::Ldexp { .. }
        | Kernel::Addcmul { .. }
        | Kernel::Clamp { .. }
        | Kernel::LogSigmoidBackward
        | Kernel::Any { .. }
        | Kernel::IndexCopy { .. }
        | Kernel::Scatter { .. }
        | Kernel::IndexPut { .. }
        | Kernel::Unfold { .. }
        | Kernel::BatchNorm { .. }
        | Kernel::Frexp
        | Kernel::MaxPool3d { .. }
        | Kernel::MaxPool3dBackward
        | Kernel::SetItem { .. }
        | Kernel::GetItemTensor { .. }
        | Kernel::MultiHeadAttention(_)
        | Kernel::MultiHeadAttentionVjp { .. }
        | Kernel::AdaptiveMaxPool { .. }
        | Kernel::AdaptiveMaxPoolBackward { .. }
        | Kernel::Bilinear { .. }
        | Kernel::BilinearVjp { .. }
        | Kernel::CosineSimilarity { .. }
        | Kernel::CosineSimilarityVjp { .. }
        | Kernel::PointwiseLoss { .. }
        | Kernel::PointwiseLossVjp { .. }
        | Kernel::BinaryFallback(_)
        | Kernel::BinaryFallbackVjp { .. }
        | Kernel::Im2Col(_)
        | Kernel::Col2Im { .. }
        // no CUDA kernel: the backend refuses it by name
        | Kernel::Shift { .. } => vec![],
    };
    v.into_iter().flatten().collect()
}

/// An indexing kernel and, when it exists for the dtype, the bounds check run before it.
fn checked(main: Option<Source>) -> Vec<Option<Source>> {
    match main {
        Some(k) => vec![Some(model_kernels::index_check()), Some(k)],
        None => vec![],
    }
}

/// One kernel of each kind with each op (the shape-like fields do not change the source).
pub fn every_kernel() -> Vec<Kernel> {
    use crate::exec::kernel::Side;
    // exhaustive: a new Kernel variant does not build until it is listed below
    fn listed(k: &Kernel) {
        match k {
            Kernel::Unary(_)
            | Kernel::Binary { .. }
            | Kernel::Identity
            | Kernel::Reshape(_)
            | Kernel::Permute(_)
            | Kernel::Convert(_)
            | Kernel::Matmul
            | Kernel::Linear { .. }
            | Kernel::Reduce { .. }
            | Kernel::Softmax { .. }
            | Kernel::Convolution { .. }
            | Kernel::ConvTranspose { .. }
            | Kernel::ConvTransposeVjp { .. }
            | Kernel::Triangle { .. }
            | Kernel::OneHot { .. }
            | Kernel::PixelShuffle { .. }
            | Kernel::ChannelShuffle { .. }
            | Kernel::ClampBoundBackward { .. }
            | Kernel::Roll { .. }
            | Kernel::TruncDivide { .. }
            | Kernel::AdaptiveAvgPool1d { .. }
            | Kernel::AdaptiveAvgPool1dBackward
            | Kernel::Lerp { .. }
            | Kernel::Logsumexp { .. }
            | Kernel::GroupedMm { .. }
            | Kernel::Ldexp { .. }
            | Kernel::Addcmul { .. }
            | Kernel::Clamp { .. }
            | Kernel::LogSigmoidBackward
            | Kernel::Any { .. }
            | Kernel::IndexCopy { .. }
            | Kernel::Scatter { .. }
            | Kernel::IndexPut { .. }
            | Kernel::Unfold { .. }
            | Kernel::BatchNorm { .. }
            | Kernel::Frexp
            | Kernel::MaxPool3d { .. }
            | Kernel::MaxPool3dBackward
            | Kernel::SetItem { .. }
            | Kernel::GetItemTensor { .. }
            | Kernel::MultiHeadAttention(_)
            | Kernel::MultiHeadAttentionVjp { .. }
            | Kernel::AdaptiveMaxPool { .. }
            | Kernel::AdaptiveMaxPoolBackward { .. }
            | Kernel::Bilinear { .. }
            | Kernel::BilinearVjp { .. }
            | Kernel::CosineSimilarity { .. }
            | Kernel::CosineSimilarityVjp { .. }
            | Kernel::PointwiseLoss { .. }
            | Kernel::PointwiseLossVjp { .. }
            | Kernel::BinaryFallback(_)
            | Kernel::BinaryFallbackVjp { .. }
            | Kernel::Im2Col(_)
            | Kernel::Col2Im { .. }
            | Kernel::MaxPool2d { .. }
            | Kernel::MaxPool2dBackward
            | Kernel::Embedding
            | Kernel::EmbeddingBackward { .. }
            | Kernel::VarMean { .. }
            | Kernel::Var { .. }
            | Kernel::Cumsum { .. }
            | Kernel::Bitwise { .. }
            | Kernel::BitwiseNot
            | Kernel::Shift { .. }
            | Kernel::AdaptiveAvgPool2d { .. }
            | Kernel::AdaptiveAvgPool2dBackward
            | Kernel::ArgExtremum { .. }
            | Kernel::Pad { .. }
            | Kernel::Slice { .. }
            | Kernel::Split { .. }
            | Kernel::Cat { .. }
            | Kernel::Stack { .. }
            | Kernel::Expand(_)
            | Kernel::Flip(_)
            | Kernel::Squeeze(_)
            | Kernel::Unsqueeze(_)
            | Kernel::Arange { .. }
            | Kernel::Full { .. }
            | Kernel::Compare { .. }
            | Kernel::Where { .. }
            | Kernel::Silu
            | Kernel::Activation(_)
            | Kernel::Copy
            | Kernel::Uniform { .. }
            | Kernel::Normal { .. }
            | Kernel::TakeAlongDim { .. }
            | Kernel::Gather { .. }
            | Kernel::ScatterAdd { .. }
            | Kernel::IndexSelect { .. }
            | Kernel::IndexAdd { .. }
            | Kernel::Sort { .. }
            | Kernel::Argsort { .. }
            | Kernel::Topk { .. }
            | Kernel::NllLossBackward { .. }
            | Kernel::SoftmaxBackward { .. } => (),
        }
    }
    let mut ks: Vec<Kernel> = UNARY_OPS.iter().map(|&op| Kernel::Unary(op)).collect();
    ks.extend(BINARY_OPS.iter().map(|&op| Kernel::Binary {
        op,
        a: Side::Input(0),
        b: Side::Input(1),
        alpha: 1.0,
    }));
    ks.extend([
        Kernel::Identity,
        Kernel::Reshape(vec![]),
        Kernel::Permute(vec![]),
        Kernel::Matmul,
        Kernel::Linear { bias: false },
        Kernel::Linear { bias: true },
    ]);
    ks.extend(ALL_DTYPES.iter().map(|&d| Kernel::Convert(d)));
    ks.extend(REDUCE_OPS.iter().map(|&op| Kernel::Reduce {
        op,
        dims: vec![],
        keepdim: false,
        dtype: DType::F32,
    }));
    ks.extend([false, true].map(|log| Kernel::Softmax { dim: 0, log }));
    ks.extend([
        Kernel::Convolution {
            stride: vec![1],
            padding: vec![0],
            dilation: vec![1],
            groups: 1,
            bias: true,
        },
        Kernel::ConvTranspose {
            stride: vec![2],
            padding: vec![0],
            output_padding: vec![0],
            dilation: vec![1],
            groups: 1,
            bias: true,
        },
        Kernel::Triangle {
            upper: true,
            diagonal: 0,
            fill: 0.0,
        },
        Kernel::Triangle {
            upper: false,
            diagonal: 0,
            fill: 0.0,
        },
        Kernel::OneHot { classes: 2 },
        Kernel::AdaptiveAvgPool1d { out: 3 },
        Kernel::AdaptiveAvgPool1dBackward,
        Kernel::PixelShuffle {
            factor: 2,
            inverse: false,
        },
        Kernel::Roll {
            shifts: vec![1],
            dims: None,
        },
        Kernel::TruncDivide {
            a: Side::Input(0),
            b: Side::Input(1),
        },
        Kernel::ConvTransposeVjp {
            stride: vec![2],
            padding: vec![0],
            output_padding: vec![0],
            dilation: vec![1],
            groups: 2,
            outputs: VjpOutputs {
                input: true,
                weight: true,
                bias: true,
            },
        },
        Kernel::MaxPool2d {
            kernel: vec![2],
            stride: vec![],
            padding: vec![0],
            dilation: vec![1],
            ceil_mode: false,
        },
        Kernel::MaxPool2dBackward,
        Kernel::Embedding,
        Kernel::EmbeddingBackward {
            num_weights: 1,
            padding_idx: -1,
            scale_grad_by_freq: true,
        },
        Kernel::VarMean {
            dims: None,
            correction: 1.0,
            keepdim: false,
        },
        Kernel::Var {
            dims: None,
            correction: 1.0,
            keepdim: false,
            std: true,
        },
        Kernel::Pad {
            value: 0.0,
            config: vec![],
        },
        Kernel::Slice {
            start: vec![],
            end: vec![],
            step: vec![],
        },
        Kernel::Split {
            sizes: vec![],
            dim: 0,
        },
        Kernel::Cat { dim: 0 },
        Kernel::Stack { dim: 0 },
        Kernel::Expand(vec![]),
        Kernel::Flip(vec![]),
        Kernel::Squeeze(None),
        Kernel::Unsqueeze(0),
        Kernel::Arange {
            start: 0.0,
            end: 1.0,
            step: 1.0,
            dtype: DType::F32,
        },
        Kernel::Full {
            shape: vec![],
            value: 0.0,
            dtype: DType::F32,
        },
        Kernel::Where {
            a: Side::Input(1),
            b: Side::Input(2),
            dtype: DType::F32,
        },
        Kernel::Silu,
        Kernel::Copy,
        Kernel::Uniform {
            shape: vec![],
            minval: 0.0,
            maxval: 1.0,
            dtype: DType::F32,
        },
        Kernel::Normal {
            shape: vec![],
            dtype: DType::F32,
        },
        Kernel::TakeAlongDim { dim: Some(0) },
        Kernel::TakeAlongDim { dim: None },
        Kernel::Gather { dim: 0 },
        Kernel::ScatterAdd { dim: 0 },
        Kernel::IndexSelect { dim: 0 },
        Kernel::IndexAdd { dim: 0 },
        Kernel::Sort {
            dim: 0,
            descending: false,
        },
        Kernel::Argsort {
            dim: 0,
            descending: true,
        },
        Kernel::Topk {
            k: 1,
            dim: 0,
            largest: true,
        },
    ]);
    ks.extend(
        [
            (LossReduction::Mean, true),
            (LossReduction::Sum, false),
            (LossReduction::None, false),
        ]
        .map(|(reduction, weighted)| Kernel::NllLossBackward {
            reduction,
            ignore_index: -100,
            weighted,
        }),
    );
    ks.extend([false, true].map(|log| Kernel::SoftmaxBackward {
        dim: 0,
        log,
        dtype: DType::F32,
    }));
    ks.extend(model_kernels::ACTIVATIONS.map(Kernel::Activation));
    ks.extend(
        [DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32]
            .map(|dtype| Kernel::Cumsum { dim: 0, dtype }),
    );
    for op in [BitOp::And, BitOp::Or, BitOp::Xor] {
        ks.extend(
            [
                (true, DType::Bool),
                (false, DType::I64),
                (false, DType::Bool),
            ]
            .map(|(logical, dtype)| Kernel::Bitwise {
                op,
                a: Side::Input(0),
                b: Side::Input(1),
                logical,
                dtype,
            }),
        );
    }
    ks.push(Kernel::BitwiseNot);
    ks.extend([
        Kernel::AdaptiveAvgPool2d { oh: 1, ow: 1 },
        Kernel::AdaptiveAvgPool2dBackward,
    ]);
    ks.extend([true, false].map(|max| Kernel::ArgExtremum {
        max,
        dim: None,
        keepdim: false,
    }));
    ks.extend(COMPARE_OPS.iter().map(|&op| Kernel::Compare {
        op,
        a: Side::Input(0),
        b: Side::Input(1),
    }));
    ks.iter().for_each(listed);
    ks
}

/// Every kernel the backend can launch: each op x dtype of [`ALL_DTYPES`] (x target dtype for
/// conversions), each once, in a fixed order. The NVRTC test compiles all of them.
pub fn catalog() -> Vec<Source> {
    let mut out: Vec<Source> = Vec::new();
    for d in ALL_DTYPES {
        for k in every_kernel() {
            for s in sources(&k, d) {
                if !out.iter().any(|o| o.name == s.name) {
                    out.push(s);
                }
            }
        }
    }
    // fusion regions are generated per region: these use every lane operation
    out.extend(super::region::catalog());
    out
}

#[cfg(test)]
mod tests {
    use super::model_kernels::INT_OPS;
    use super::*;

    #[test]
    fn the_catalog_has_every_op_for_every_dtype_once() {
        let c = catalog();
        let float = UNARY_OPS.len() + BINARY_OPS.len() + REDUCE_OPS.len() + 2 + 1;
        // conv, pool, pool backward, embedding backward, var_mean, silu, uniform,
        // nll_loss_backward, softmax and log_softmax backward, the activations with parameters,
        // cumsum, argmax, argmin, adaptive pooling and its backward, normal, scatter_add,
        // index_add, sort_rank
        let float_models = 10 + model_kernels::ACTIVATIONS.len() + 3 + 2 + 1 + 3;
        // permute, pad, cat, fill, arange, embedding, where, take_along_dim, gather_dim,
        // index_select, and the comparisons
        let every = 10 + COMPARE_OPS.len();
        let converts = ALL_DTYPES.len() * (ALL_DTYPES.len() - 1);
        let want = DTYPES.len() * (float + float_models)
            + ALL_DTYPES.len() * every
            + converts
            + INT_OPS.len()
            + 4 // integer sum, amax, amin and prod
            + 2 * 3 // i64 and i32 cumsum, argmax and argmin
            + 2 * 4 // and, or, xor, not on i64 and bool
            + 1 // not on i32 (its and, or, xor run in i64)
            + 2 * 3 // i64 and i32 scatter_add, index_add and sort_rank
            + 1 // index_check
            + 1 // embedding_count
            + 2; // the fusion regions of `region::catalog`
        assert_eq!(c.len(), want);
        let mut names: Vec<&str> = c.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), c.len(), "kernel names are unique");
        let has = |name: String| assert!(names.contains(&name.as_str()), "{name} missing");
        for d in DTYPES {
            for &op in UNARY_OPS {
                has(format!("unary_{op:?}_{d}").to_lowercase());
            }
            for name in [
                "reduce_amax",
                "softmax",
                "log_softmax",
                "fill_rows",
                "convolution",
                "max_pool2d",
                "max_pool2d_backward",
                "embedding_backward",
                "var_mean",
                "silu",
                "uniform",
                "nll_loss_backward",
                "softmax_backward",
                "log_softmax_backward",
                "activation_leaky_relu",
                "activation_elu",
                "activation_celu",
                "activation_hardtanh",
                "cumsum",
                "normal",
                "adaptive_avg_pool2d",
                "adaptive_avg_pool2d_backward",
                "argmax",
                "argmin",
                "scatter_add",
                "index_add",
                "sort_rank",
            ] {
                has(format!("{name}_{d}"));
            }
        }
        for d in ALL_DTYPES {
            for name in [
                "permute",
                "pad",
                "cat_copy",
                "fill",
                "arange",
                "embedding",
                "where",
                "take_along_dim",
                "gather_dim",
                "index_select",
            ] {
                has(format!("{name}_{d}"));
            }
            for &op in COMPARE_OPS {
                has(format!("compare_{op:?}_{d}").to_lowercase());
            }
            for to in ALL_DTYPES.iter().filter(|&&to| to != d) {
                has(format!("convert_{d}_{to}"));
            }
        }
        for op in INT_OPS {
            has(format!("binary_int_{op:?}").to_lowercase());
        }
        has("reduce_int_sum".into());
        has("reduce_int_amax".into());
        has("reduce_int_amin".into());
        for op in ["and", "or", "xor", "not"] {
            has(format!("bitwise_{op}_i64"));
            has(format!("bitwise_{op}_b8"));
        }
        has("reduce_int_prod".into());
        for name in ["scatter_add", "index_add", "sort_rank"] {
            has(format!("{name}_i64"));
        }
        has("index_check".into());
        for d in DTYPES {
            has(format!("reduce_amin_{d}"));
            has(format!("reduce_prod_{d}"));
        }
        // each source defines the entry point it is named by
        for s in &c {
            assert!(
                s.code.contains(&format!("void {}(", s.name)),
                "{} does not define its entry point",
                s.name
            );
        }
    }

    #[test]
    fn every_kernel_variant_launches_a_kernel_in_the_catalog() {
        // only views and cuBLAS calls launch no NVRTC kernel
        let c = catalog();
        for k in every_kernel() {
            let srcs: Vec<Source> = ALL_DTYPES.iter().flat_map(|&d| sources(&k, d)).collect();
            let metadata = matches!(
                k,
                Kernel::Identity
                    | Kernel::Reshape(_)
                    | Kernel::Matmul
                    | Kernel::Linear { bias: false }
                    | Kernel::Squeeze(_)
                    | Kernel::Unsqueeze(_)
            );
            assert_eq!(srcs.is_empty(), metadata, "{k:?}");
            for s in srcs {
                assert!(c.contains(&s), "{} of {k:?} is not in the catalog", s.name);
            }
        }
    }

    #[test]
    fn no_kernel_uses_what_nvrtc_lacks() {
        // NVRTC has no math.h: INFINITY, NAN, HUGE_VALF and friends are undefined there
        for s in catalog() {
            for undefined in ["INFINITY", "NAN", "HUGE_VAL", "FLT_MAX", "#include"] {
                let body = s.code.replace("NEG_INF", "");
                assert!(!body.contains(undefined), "{} uses {undefined}", s.name);
            }
        }
    }

    #[test]
    fn elementwise_grids_cover_any_size_with_grid_stride_loops() {
        assert_eq!(elementwise_blocks(0), 1);
        assert_eq!(elementwise_blocks(1), 1);
        assert_eq!(elementwise_blocks(256), 1);
        assert_eq!(elementwise_blocks(257), 2);
        // the old `n as u32` truncated 2^32 + 512 elements to 512 (2 blocks)
        let big = (1usize << 32) + 512;
        assert_eq!(elementwise_blocks(big), MAX_BLOCKS);
        assert_eq!(elementwise_blocks(usize::MAX), MAX_BLOCKS);
        // every elementwise kernel loops over the grid, so a capped grid still covers n
        for s in catalog() {
            let row = s.name.starts_with("reduce_")
                || s.name.contains("softmax_")
                || s.name.starts_with("var_mean_");
            let strided = if row {
                s.code.contains("row += gridDim.x")
            } else {
                // the macro's definition, then a use
                s.code.matches("GRID_STRIDE(").count() >= 2
            };
            assert!(strided, "{} has no grid-stride loop", s.name);
            assert!(!s.code.contains("if (i >= n) return"), "{}", s.name);
        }
    }

    #[test]
    fn row_launches_are_whole_warps_one_block_per_row() {
        assert_eq!(row_launch(10, 4), (10, 32));
        assert_eq!(row_launch(1, 100), (1, 128));
        assert_eq!(row_launch(1, 1 << 30), (1, ROW_BLOCK));
        assert_eq!(row_launch(0, 0), (1, 32));
        assert_eq!(row_launch(1 << 40, 7), (MAX_BLOCKS, 32));
        for len in 0..1000 {
            let (_, t) = row_launch(3, len);
            assert_eq!(t % 32, 0);
            assert!((32..=ROW_BLOCK).contains(&t));
        }
    }

    #[test]
    fn reductions_and_softmax_are_block_level() {
        for s in catalog() {
            if s.name.starts_with("reduce_")
                || s.name.contains("softmax_")
                || s.name.starts_with("var_mean_")
            {
                assert!(s.code.contains("block_reduce("), "{}", s.name);
                assert!(s.code.contains("row += gridDim.x"), "{}", s.name);
                assert!(s.code.contains("k += blockDim.x") || s.code.contains("j += blockDim.x"));
            }
        }
    }
}
