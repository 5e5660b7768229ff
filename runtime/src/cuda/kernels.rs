//! CUDA C sources of the elementwise, reduction and layout kernels, generated per op and dtype
//! and compiled with NVRTC on first use. Half types are handled as raw 16-bit words with PTX
//! conversions, so no CUDA headers are needed at run time. All arithmetic is in f32.

use crate::kernel::{BinaryOp, ReduceOp, UnaryOp};
use tracepass_ir::DType;

/// Largest rank the shape-carrying kernels handle.
pub const MAX_RANK: usize = 6;

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

const PRELUDE: &str = r#"
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

fn unary_expr(op: UnaryOp) -> &'static str {
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
    }
}

fn binary_expr(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "a + alpha * b",
        BinaryOp::Sub => "a - alpha * b",
        BinaryOp::Mul => "a * b",
        BinaryOp::Div => "a / b",
        BinaryOp::Pow => "(b == 2.0f ? a * a : (b == 3.0f ? a * a * a : powf(a, b)))",
        BinaryOp::Maximum => "((a != a || a > b) ? a : b)",
        BinaryOp::Minimum => "((a != a || a < b) ? a : b)",
        BinaryOp::Atan2 => "atan2f(a, b)",
    }
}

/// A kernel's entry point name and full source.
pub struct Source {
    pub name: String,
    pub code: String,
}

pub fn unary(op: UnaryOp, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("unary_{op:?}_{d}").to_lowercase();
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long n) {{\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i >= n) return;\n  float x = {ld}(in, i);\n  {st}(out, i, {});\n}}\n",
        unary_expr(op)
    );
    Some(Source { name, code })
}

/// `out[i] = a op alpha*b` with a and b broadcast through `Layout`; a side given as a number
/// reads `sa`/`sb` instead (`a_num`/`b_num` set).
pub fn binary(op: BinaryOp, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("binary_{op:?}_{d}").to_lowercase();
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* pa, const {t}* pb, float sa, float sb, int a_num, int b_num, float alpha, Layout l, {t}* out, long long n) {{\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i >= n) return;\n  long long oa, ob; offsets(l, i, &oa, &ob);\n  float a = a_num ? sa : {ld}(pa, oa);\n  float b = b_num ? sb : {ld}(pb, ob);\n  {st}(out, i, {});\n}}\n",
        binary_expr(op)
    );
    Some(Source { name, code })
}

/// Copies `in` read through `Layout.sa` (a permuted view) into contiguous `out`.
pub fn permute(d: DType) -> Option<Source> {
    let (t, _, _) = ctype(d)?;
    let name = format!("permute_{d}").to_lowercase();
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* in, Layout l, {t}* out, long long n) {{\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i >= n) return;\n  long long oa, ob; offsets(l, i, &oa, &ob);\n  out[i] = in[oa];\n}}\n"
    );
    Some(Source { name, code })
}

pub fn convert(from: DType, to: DType) -> Option<Source> {
    let (ti, ld, _) = ctype(from)?;
    let (to_t, _, st) = ctype(to)?;
    let name = format!("convert_{from}_{to}").to_lowercase();
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {ti}* in, {to_t}* out, long long n) {{\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i >= n) return;\n  {st}(out, i, {ld}(in, i));\n}}\n"
    );
    Some(Source { name, code })
}

/// One thread per output element: reduces `count` inputs at `base + k * step`. The reduced
/// dimensions are first brought last and contiguous by a permute, so the step is 1.
pub fn reduce(op: ReduceOp, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("reduce_{op:?}_{d}").to_lowercase();
    let (init, comb, fin) = match op {
        ReduceOp::Sum => ("0.0f", "acc += x;", "acc"),
        ReduceOp::Mean => ("0.0f", "acc += x;", "acc / (float)count"),
        ReduceOp::Amax => ("-INFINITY", "if (x != x || x > acc) acc = x;", "acc"),
    };
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long outer, long long count) {{\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i >= outer) return;\n  float acc = {init};\n  for (long long k = 0; k < count; ++k) {{ float x = {ld}(in, i * count + k); {comb} }}\n  {st}(out, i, {fin});\n}}\n"
    );
    Some(Source { name, code })
}

/// Softmax or log-softmax over the middle dimension of `[outer, len, inner]`.
pub fn softmax(log: bool, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = format!("{}softmax_{d}", if log { "log_" } else { "" }).to_lowercase();
    let out = if log { "s - lse" } else { "expf(s) / sum" };
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long outer, long long len, long long inner) {{\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i >= outer * inner) return;\n  long long o = i / inner, r = i % inner;\n  long long base = o * len * inner + r;\n  float m = -INFINITY;\n  for (long long j = 0; j < len; ++j) {{ float x = {ld}(in, base + j * inner); if (x > m) m = x; }}\n  float sum = 0.0f;\n  for (long long j = 0; j < len; ++j) sum += expf({ld}(in, base + j * inner) - m);\n  float lse = logf(sum);\n  for (long long j = 0; j < len; ++j) {{ float s = {ld}(in, base + j * inner) - m; {st}(out, base + j * inner, {out}); }}\n}}\n"
    );
    Some(Source { name, code })
}

/// `out[r, c] = bias[c]` for the rows of a linear layer's output (then GEMM adds with beta 1).
pub fn fill_rows(d: DType) -> Option<Source> {
    let (t, _, _) = ctype(d)?;
    let name = format!("fill_rows_{d}").to_lowercase();
    let code = format!(
        "{PRELUDE}\nextern \"C\" __global__ void {name}(const {t}* bias, {t}* out, long long n, long long cols) {{\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i >= n) return;\n  out[i] = bias[i % cols];\n}}\n"
    );
    Some(Source { name, code })
}
