//! CUDA C sources of the real models' kernels (convolution, pooling, embedding, var_mean,
//! layout, comparisons, fills, random numbers, integer ops, indexing and sorting along a
//! dimension, a model's own cross-entropy backward), generated per dtype like those in [`super::kernels`], whose prelude and
//! conventions they share. The CPU kernels in
//! `crate::cpu` are the reference semantics; where a kernel differs (summation order of
//! scatter-adds), its doc says so.
//!
//! Raw copies (gathers, pads, cats, fills, embedding rows) are generated for every dtype of
//! [`ALL_DTYPES`] by element type; arithmetic is in f32 (f64 for var_mean's sums, i64 for the
//! integer ops).

use super::kernels::{ctype, Source, MAX_RANK, PRELUDE};
use crate::exec::kernel::{Activation, BinaryOp, BitOp, CompareOp, ReduceOp};
use tracepass_ir::DType;

/// Every dtype a CUDA tensor can have: the float types, i64 (indices), i32 (HF models' position
/// ids, `Tensor.int()`) and bool (masks). i32 is storage: its arithmetic runs in i64 and is
/// cast back (wrapping), which gives i32's own wrapping results, as the CPU's.
pub const ALL_DTYPES: [DType; 6] = [
    DType::F32,
    DType::BF16,
    DType::F16,
    DType::I64,
    DType::I32,
    DType::Bool,
];

/// Most spatial dimensions of a convolution.
pub const MAX_SPATIAL: usize = 4;

/// The C element type of a dtype (raw storage: bf16/f16 as 16-bit words, bool as a byte).
pub fn elem(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "float",
        DType::BF16 | DType::F16 => "unsigned short",
        DType::I64 => "long long",
        DType::I32 => "int",
        DType::Bool => "unsigned char",
        _ => return None,
    })
}

/// Whether `d` is an integer dtype (computed in wrapping i64).
fn is_int(d: DType) -> bool {
    matches!(d, DType::I64 | DType::I32)
}

/// The integer ops (wrapping i64 arithmetic, as `cpu::integer::binary_int`).
#[cfg(test)]
pub const INT_OPS: [BinaryOp; 9] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
    BinaryOp::Pow,
    BinaryOp::FloorDivide,
    BinaryOp::Remainder,
    BinaryOp::Fmod,
];

/// Shape, input strides, `lo` padding and `interior + 1` per dimension of `prims.pad`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PadLayout {
    pub rank: i32,
    pub _pad: i32,
    pub out_shape: [i64; MAX_RANK],
    pub in_shape: [i64; MAX_RANK],
    pub in_stride: [i64; MAX_RANK],
    pub lo: [i64; MAX_RANK],
    pub step: [i64; MAX_RANK],
}

// SAFETY: plain old data with a C layout; the kernels declare the same struct.
unsafe impl cudarc::driver::DeviceRepr for PadLayout {}

/// A convolution's geometry (per spatial dimension: input, kernel, output, stride, padding,
/// dilation).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvLayout {
    pub nd: i32,
    pub groups: i32,
    pub n: i64,
    pub cin: i64,
    pub cout: i64,
    pub input: [i64; MAX_SPATIAL],
    pub kernel: [i64; MAX_SPATIAL],
    pub out: [i64; MAX_SPATIAL],
    pub stride: [i64; MAX_SPATIAL],
    pub padding: [i64; MAX_SPATIAL],
    pub dilation: [i64; MAX_SPATIAL],
}

// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for ConvLayout {}

/// A 2-d max pooling over `planes` planes of `h x w`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolLayout {
    pub planes: i64,
    pub h: i64,
    pub w: i64,
    pub oh: i64,
    pub ow: i64,
    pub kernel: [i64; 2],
    pub stride: [i64; 2],
    pub padding: [i64; 2],
    pub dilation: [i64; 2],
}

// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for PoolLayout {}

/// A `scatter_add`'s geometry: the output's (`a`'s) shape, the dimension the index runs
/// along, and the index's shape and strides and `src`'s strides (elements). A 0-d `a` is
/// passed as rank 1 of size 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScatterLayout {
    pub rank: i32,
    pub dim: i32,
    pub shape: [i64; MAX_RANK],
    pub index_shape: [i64; MAX_RANK],
    pub index_stride: [i64; MAX_RANK],
    pub src_stride: [i64; MAX_RANK],
}

// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for ScatterLayout {}

/// Structs and helpers the kernels below use, after [`PRELUDE`].
const MODEL_PRELUDE: &str = r#"
struct PadLayout { int rank; int pad; long long out_shape[6]; long long in_shape[6]; long long in_stride[6]; long long lo[6]; long long step[6]; };
struct ConvLayout { int nd; int groups; long long n; long long cin; long long cout; long long in[4]; long long k[4]; long long out[4]; long long stride[4]; long long pad[4]; long long dil[4]; };
struct PoolLayout { long long planes; long long h; long long w; long long oh; long long ow; long long k[2]; long long s[2]; long long p[2]; long long d[2]; };
struct ScatterLayout { int rank; int dim; long long shape[6]; long long index_shape[6]; long long index_stride[6]; long long src_stride[6]; };
// a value of the element type from its bits (little endian: the low bytes)
template <typename T> __device__ __forceinline__ T from_bits(unsigned long long bits) { return *reinterpret_cast<const T*>(&bits); }
"#;

fn code(body: String) -> String {
    format!("{PRELUDE}{MODEL_PRELUDE}\n{body}")
}

fn lower(s: String) -> String {
    s.to_lowercase()
}

/// `silu(x) = x / (1 + exp(-x))`, as PyTorch's formula (and `cpu::activation::silu`).
pub fn silu(d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = lower(format!("silu_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{ float x = {ld}(in, i); {st}(out, i, x / (1.0f + expf(-x))); }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// The activations with parameters, one of each (the parameters are kernel arguments, so
/// these stand for every value of them).
pub const ACTIVATIONS: [Activation; 4] = [
    Activation::LeakyRelu { slope: 0.01 },
    Activation::Elu { alpha: 1.0 },
    Activation::Celu { alpha: 1.0 },
    Activation::Hardtanh {
        min: -1.0,
        max: 1.0,
    },
];

/// An activation with parameters `p0`, `p1` ([`Activation::params`]) in f32, as
/// `cpu::activation::activation` computes it: NaN stays NaN.
pub fn activation(act: Activation, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let expr = match act {
        Activation::LeakyRelu { .. } => "x > 0.0f ? x : x * p0",
        Activation::Elu { .. } => "x <= 0.0f ? expm1f(x) * p0 : x",
        Activation::Celu { .. } => "x <= 0.0f ? expm1f(x * p1) * p0 : x",
        Activation::Hardtanh { .. } => "x < p0 ? p0 : (x > p1 ? p1 : x)",
    };
    let name = lower(format!("activation_{}_{d}", act.name()));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, {t}* out, float p0, float p1, long long n) {{\n  GRID_STRIDE(i, n) {{ float x = {ld}(in, i); {st}(out, i, {expr}); }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `cumsum` along the middle dimension of `[outer, len, inner]`, one thread per line (the host
/// casts the input to the result's dtype first): f32 accumulates in f64 and bf16/f16 in f32,
/// each partial sum rounded to the dtype, as `cpu::cumsum::cumsum`; i64 and i32 wrap.
pub fn cumsum(d: DType) -> Option<Source> {
    let (t, load, acc, store) = match (ctype(d), d) {
        (Some((t, ld, st)), DType::F32) => (t, ld, "double", format!("{st}(out, at, (float)acc);")),
        (Some((t, ld, st)), _) => (t, ld, "float", format!("{st}(out, at, acc);")),
        (None, _) if is_int(d) => {
            let t = elem(d)?;
            (t, "", "long long", format!("out[at] = ({t})acc;"))
        }
        (None, _) => return None,
    };
    let add = if is_int(d) {
        "acc = (long long)((unsigned long long)acc + (unsigned long long)(long long)in[at]);"
            .to_string()
    } else {
        format!("acc += {load}(in, at);")
    };
    let name = lower(format!("cumsum_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long outer, long long len, long long inner) {{\n  GRID_STRIDE(line, outer * inner) {{\n    const long long o = line / inner, i = line % inner;\n    {acc} acc = 0;\n    for (long long j = 0; j < len; ++j) {{ const long long at = (o * len + j) * inner + i; {add} {store} }}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `argmax` (`max`) or `argmin` along the middle dimension of `[outer, len > 0, inner]`, one
/// thread per line, into i64: the first extremum, the first NaN beating everything (as
/// `cpu::arg_extremum`). Floats compare in f32 (exact for the dtypes), integers exactly.
pub fn arg_extremum(max: bool, d: DType) -> Option<Source> {
    let (t, ct, load) = match ctype(d) {
        Some((t, ld, _)) => (t, "float", format!("{ld}(in, at)")),
        None if is_int(d) => (elem(d)?, "long long", "(long long)in[at]".to_string()),
        None => return None,
    };
    let cmp = if max { ">" } else { "<" };
    let name = lower(format!("{}_{d}", if max { "argmax" } else { "argmin" }));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, long long* out, long long outer, long long len, long long inner) {{\n  GRID_STRIDE(line, outer * inner) {{\n    const long long o = line / inner, i = line % inner;\n    long long at = o * len * inner + i, best = 0;\n    {ct} bv = {load};\n    for (long long j = 1; j < len; ++j) {{\n      at = (o * len + j) * inner + i;\n      {ct} v = {load};\n      if (!(bv != bv) && (v != v || v {cmp} bv)) {{ best = j; bv = v; }}\n    }}\n    out[line] = best;\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// Bitwise `and`/`or`/`xor` of i64 or bool (0/1 byte) operands broadcast through `Layout`; a
/// side given as a number reads `sa`/`sb` (`a_num`/`b_num` set). The host converts logical
/// ops' operands to bool (truthiness) and bitwise ops' integers to i64 first.
pub fn bitwise(op: BitOp, d: DType) -> Option<Source> {
    let t = match d {
        DType::I64 | DType::Bool => elem(d)?,
        _ => return None,
    };
    let sym = match op {
        BitOp::And => "&",
        BitOp::Or => "|",
        BitOp::Xor => "^",
    };
    let name = lower(format!("bitwise_{}_{d}", op.name()));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* pa, const {t}* pb, long long sa, long long sb, int a_num, int b_num, Layout l, {t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{\n    long long oa, ob; offsets(l, i, &oa, &ob);\n    long long a = a_num ? sa : (long long)pa[oa];\n    long long b = b_num ? sb : (long long)pb[ob];\n    out[i] = ({t})(a {sym} b);\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `bitwise_not`: `~x` for i64 and i32, logical not for bool (0/1 bytes).
pub fn bitwise_not(d: DType) -> Option<Source> {
    let (t, expr) = match d {
        _ if is_int(d) => (elem(d)?, "~in[i]"),
        DType::Bool => ("unsigned char", "(unsigned char)(in[i] ^ 1)"),
        _ => return None,
    };
    let name = lower(format!("bitwise_not_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{ out[i] = {expr}; }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// Window `[*s, *e)` of output cell `i` of `out` pooled from `len` (PyTorch's adaptive
/// pooling windows, as `cpu::adaptive_pool::window`).
const ADAPTIVE_WINDOW: &str = "__device__ __forceinline__ void window(long long i, long long len, long long out, long long* s, long long* e) { *s = (i * len) / out; *e = ((i + 1) * len + out - 1) / out; }\n";

/// `adaptive_avg_pool2d` over `planes` planes of `h x w` into `oh x ow`, one thread per
/// output element, summed in f32.
pub fn adaptive_avg_pool2d(d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = lower(format!("adaptive_avg_pool2d_{d}"));
    let body = format!(
        "{ADAPTIVE_WINDOW}extern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long planes, long long h, long long w, long long oh, long long ow) {{\n  GRID_STRIDE(k, planes * oh * ow) {{\n    const long long j = k % ow, i = (k / ow) % oh, p = k / (ow * oh);\n    long long h0, h1, w0, w1; window(i, h, oh, &h0, &h1); window(j, w, ow, &w0, &w1);\n    float sum = 0.0f;\n    for (long long r = h0; r < h1; ++r) for (long long c = w0; c < w1; ++c) sum += {ld}(in, (p * h + r) * w + c);\n    {st}(out, k, sum / (float)((h1 - h0) * (w1 - w0)));\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `_adaptive_avg_pool2d_backward`: one thread per input element, summing `grad / window
/// size` over the output cells whose windows hold it, in f32.
pub fn adaptive_avg_pool2d_backward(d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = lower(format!("adaptive_avg_pool2d_backward_{d}"));
    let body = format!(
        "{ADAPTIVE_WINDOW}extern \"C\" __global__ void {name}(const {t}* grad, {t}* out, long long planes, long long h, long long w, long long oh, long long ow) {{\n  GRID_STRIDE(k, planes * h * w) {{\n    const long long c = k % w, r = (k / w) % h, p = k / (w * h);\n    float acc = 0.0f;\n    for (long long i = 0; i < oh; ++i) {{\n      long long h0, h1; window(i, h, oh, &h0, &h1);\n      if (r < h0 || r >= h1) continue;\n      for (long long j = 0; j < ow; ++j) {{\n        long long w0, w1; window(j, w, ow, &w0, &w1);\n        if (c < w0 || c >= w1) continue;\n        acc += {ld}(grad, (p * oh + i) * ow + j) / (float)((h1 - h0) * (w1 - w0));\n      }}\n    }}\n    {st}(out, k, acc);\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// Converts between any two different dtypes of [`ALL_DTYPES`]: floats to integers truncate
/// (saturating, NaN to 0, as Rust's `as` and the GPU's `cvt.rzi`; to i32 through i64, then
/// wrapping, as `Tensor::to_dtype`), anything to bool is `!= 0`
/// (NaN is true), bool to anything is 0 or 1.
pub fn convert(from: DType, to: DType) -> Option<Source> {
    if from == to {
        return None;
    }
    let ti = elem(from)?;
    let to_t = elem(to)?;
    let load = match ctype(from) {
        Some((_, ld, _)) => format!("float v = {ld}(in, i);"),
        None if is_int(from) => "long long v = in[i];".to_string(),
        None => "unsigned char v = in[i];".to_string(),
    };
    let store = match ctype(to) {
        Some((_, _, st)) => format!("{st}(out, i, (float)v);"),
        // through i64, as the CPU: floats truncate (saturating at i64's range), then i32 wraps
        None if is_int(to) => format!("out[i] = ({to_t})(long long)v;"),
        None => "out[i] = (unsigned char)(v != 0);".to_string(),
    };
    let name = lower(format!("convert_{from}_{to}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {ti}* in, {to_t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{ {load} {store} }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// Copies `in` read through `Layout.sa` (a permuted, expanded, sliced or flipped view; the
/// host shifts `in` to the view's first element) into contiguous `out`. Every dtype.
pub fn gather(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("permute_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, Layout l, {t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{\n    long long oa, ob; offsets(l, i, &oa, &ob);\n    out[i] = in[oa];\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `prims.pad`: each output element is the input element it lands on, or `value` (given as
/// the bits of the dtype, converted on the host as the CPU kernel converts it).
pub fn pad(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("pad_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, PadLayout l, unsigned long long value, {t}* out, long long n) {{\n  const {t} fill = from_bits<{t}>(value);\n  GRID_STRIDE(i, n) {{\n    long long r = i, off = 0; bool inside = true;\n    for (int d = l.rank - 1; d >= 0; --d) {{\n      long long c = r % l.out_shape[d]; r /= l.out_shape[d];\n      long long p = c - l.lo[d];\n      if (p < 0 || p % l.step[d] != 0 || p / l.step[d] >= l.in_shape[d]) {{ inside = false; break; }}\n      off += (p / l.step[d]) * l.in_stride[d];\n    }}\n    out[i] = inside ? in[off] : fill;\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// One input of a `cat`: `in` is `[outer, block_in]`, written at column `at` of `out`'s
/// `[outer, block_out]` rows.
pub fn cat_copy(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("cat_copy_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, {t}* out, long long block_in, long long block_out, long long at, long long n) {{\n  GRID_STRIDE(i, n) {{ out[(i / block_in) * block_out + at + i % block_in] = in[i]; }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `full`: every element the value's bits (converted on the host as `cpu::fill::full`).
pub fn fill(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("fill_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}({t}* out, unsigned long long value, long long n) {{\n  const {t} v = from_bits<{t}>(value);\n  GRID_STRIDE(i, n) {{ out[i] = v; }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `arange`: `start + i * step` in f64, then cast (floats round through f32, integers
/// truncate, bool is `!= 0`), as `cpu::fill::arange`.
pub fn arange(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let store = match ctype(d) {
        Some((_, _, st)) => format!("{st}(out, i, (float)v);"),
        // through i64, then i32 wraps, as the CPU (and PyTorch)
        None if is_int(d) => format!("out[i] = ({t})(long long)v;"),
        None => "out[i] = (unsigned char)(v != 0.0);".to_string(),
    };
    let name = lower(format!("arange_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}({t}* out, double start, double step, long long n) {{\n  GRID_STRIDE(i, n) {{ double v = __dadd_rn(start, __dmul_rn((double)i, step)); {store} }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

fn compare_expr(op: CompareOp) -> &'static str {
    match op {
        CompareOp::Lt => "a < b",
        CompareOp::Le => "a <= b",
        CompareOp::Gt => "a > b",
        CompareOp::Ge => "a >= b",
        CompareOp::Eq => "a == b",
        CompareOp::Ne => "a != b",
    }
}

/// A comparison of two operands of dtype `d` (the host converts both to the promoted dtype
/// and rounds a number to it, as `cpu::compare::compare`), broadcast through `Layout`; floats
/// compare in f32, integers and bools in i64. The result is bool (0 or 1 bytes).
pub fn compare(op: CompareOp, d: DType) -> Option<Source> {
    let t = elem(d)?;
    let (ct, la, lb) = match ctype(d) {
        Some((_, ld, _)) => ("float", format!("{ld}(pa, oa)"), format!("{ld}(pb, ob)")),
        None => (
            "long long",
            "(long long)pa[oa]".to_string(),
            "(long long)pb[ob]".to_string(),
        ),
    };
    let name = lower(format!("compare_{op:?}_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* pa, const {t}* pb, double sa, double sb, int a_num, int b_num, Layout l, unsigned char* out, long long n) {{\n  GRID_STRIDE(i, n) {{\n    long long oa, ob; offsets(l, i, &oa, &ob);\n    {ct} a = a_num ? ({ct})sa : {la};\n    {ct} b = b_num ? ({ct})sb : {lb};\n    out[i] = ({}) ? 1 : 0;\n  }}\n}}\n",
        compare_expr(op)
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `where(c, a, b)`: `c` (bool) read through `lc.sa`, `a` and `b` through `l.sa`/`l.sb`; a
/// side given as a number is its bits in dtype `d` (`a_num`/`b_num` set).
pub fn where_(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("where_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const unsigned char* c, const {t}* pa, const {t}* pb, unsigned long long sa, unsigned long long sb, int a_num, int b_num, Layout l, Layout lc, {t}* out, long long n) {{\n  const {t} va = from_bits<{t}>(sa), vb = from_bits<{t}>(sb);\n  GRID_STRIDE(i, n) {{\n    long long oa, ob, oc, unused; offsets(l, i, &oa, &ob); offsets(lc, i, &oc, &unused);\n    out[i] = c[oc] ? (a_num ? va : pa[oa]) : (b_num ? vb : pb[ob]);\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

fn int_expr(op: BinaryOp) -> Option<&'static str> {
    Some(match op {
        BinaryOp::Add => {
            "(long long)((unsigned long long)a + (unsigned long long)b * (unsigned long long)alpha)"
        }
        BinaryOp::Sub => {
            "(long long)((unsigned long long)a - (unsigned long long)b * (unsigned long long)alpha)"
        }
        BinaryOp::Mul => "(long long)((unsigned long long)a * (unsigned long long)b)",
        BinaryOp::Maximum => "(a > b ? a : b)",
        BinaryOp::Minimum => "(a < b ? a : b)",
        BinaryOp::Pow => "ipow(a, b, bad)",
        BinaryOp::FloorDivide => "idiv(a, b, 0, bad)",
        BinaryOp::Remainder => "idiv(a, b, 1, bad)",
        BinaryOp::Fmod => "idiv(a, b, 2, bad)",
        BinaryOp::Div | BinaryOp::Atan2 | BinaryOp::Zeta | BinaryOp::Nextafter => return None,
    })
}

/// Wrapping i64 arithmetic with i64 broadcasting (as `cpu::integer::binary_int`); a side given
/// as a number reads `sa`/`sb`. A negative exponent of `pow` sets `*bad` (the CPU refuses it).
/// Division and atan2 of integers compute in floats (the host converts): `None`.
pub fn binary_int(op: BinaryOp) -> Option<Source> {
    let expr = int_expr(op)?;
    let name = lower(format!("binary_int_{op:?}"));
    let body = format!(
        "__device__ __forceinline__ long long ipow(long long a, long long e, int* bad) {{\n  if (e < 0) {{ atomicExch(bad, 1); return 0; }}\n  unsigned long long r = 1, x = (unsigned long long)a;\n  while (e > 0) {{ if (e & 1) r *= x; x *= x; e >>= 1; }}\n  return (long long)r;\n}}\n// floor division (0), remainder (1) or fmod (2); a zero divisor sets *bad (PyTorch raises)\n__device__ __forceinline__ long long idiv(long long a, long long b, int kind, int* bad) {{\n  if (b == 0) {{ atomicExch(bad, 1); return 0; }}\n  if (b == -1) return kind == 0 ? (long long)(0ull - (unsigned long long)a) : 0;\n  long long q = a / b, r = a % b;\n  if (kind == 2) return r;\n  bool adjust = r != 0 && ((r < 0) != (b < 0));\n  return kind == 0 ? (adjust ? q - 1 : q) : (adjust ? r + b : r);\n}}\nextern \"C\" __global__ void {name}(const long long* pa, const long long* pb, long long sa, long long sb, int a_num, int b_num, long long alpha, Layout l, long long* out, long long n, int* bad) {{\n  GRID_STRIDE(i, n) {{\n    long long oa, ob; offsets(l, i, &oa, &ob);\n    long long a = a_num ? sa : pa[oa];\n    long long b = b_num ? sb : pb[ob];\n    out[i] = {expr};\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// Direct convolution, one thread per output element (grid-stride), summing `bias` and then
/// the taps in f32 (`cpu::conv::convolution` sums in f32 through a GEMM: the order differs,
/// the precision does not). Up to [`MAX_SPATIAL`] spatial dimensions.
pub fn convolution(d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = lower(format!("convolution_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* x, const {t}* w, const {t}* bias, int has_bias, ConvLayout g, {t}* out, long long n) {{\n  long long op = 1, kp = 1, sp = 1;\n  for (int j = 0; j < g.nd; ++j) {{ op *= g.out[j]; kp *= g.k[j]; sp *= g.in[j]; }}\n  const long long cg = g.cin / g.groups, coutg = g.cout / g.groups;\n  GRID_STRIDE(i, n) {{\n    long long o = i % op, rest = i / op;\n    const long long co = rest % g.cout, b = rest / g.cout;\n    long long oi[4];\n    for (int j = g.nd - 1; j >= 0; --j) {{ oi[j] = o % g.out[j]; o /= g.out[j]; }}\n    const long long grp = co / coutg;\n    float acc = has_bias ? {ld}(bias, co) : 0.0f;\n    for (long long c = 0; c < cg; ++c) {{\n      const long long xb = (b * g.cin + grp * cg + c) * sp;\n      const long long wb = (co * cg + c) * kp;\n      for (long long k = 0; k < kp; ++k) {{\n        long long r = k, off = 0, step = 1; bool inside = true;\n        for (int j = g.nd - 1; j >= 0; --j) {{\n          long long kj = r % g.k[j]; r /= g.k[j];\n          long long p = oi[j] * g.stride[j] + kj * g.dil[j] - g.pad[j];\n          if (p < 0 || p >= g.in[j]) {{ inside = false; break; }}\n          off += p * step; step *= g.in[j];\n        }}\n        if (inside) acc = __fadd_rn(acc, __fmul_rn({ld}(x, xb + off), {ld}(w, wb + k)));\n      }}\n    }}\n    {st}(out, i, acc);\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `max_pool2d_with_indices`: values and i64 indices into each (N, C) plane, with the CPU
/// kernel's window walk (NaN wins; the first maximum is kept).
pub fn max_pool2d(d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = lower(format!("max_pool2d_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* x, PoolLayout p, {t}* out, long long* idx, long long n) {{\n  GRID_STRIDE(e, n) {{\n    const long long j = e % p.ow, i = (e / p.ow) % p.oh, plane = e / (p.ow * p.oh);\n    long long h0 = i * p.s[0] - p.p[0];\n    const long long h1 = (h0 + (p.k[0] - 1) * p.d[0] + 1 < p.h ? h0 + (p.k[0] - 1) * p.d[0] + 1 : p.h);\n    while (h0 < 0) h0 += p.d[0];\n    long long w0 = j * p.s[1] - p.p[1];\n    const long long w1 = (w0 + (p.k[1] - 1) * p.d[1] + 1 < p.w ? w0 + (p.k[1] - 1) * p.d[1] + 1 : p.w);\n    while (w0 < 0) w0 += p.d[1];\n    const long long base = plane * p.h * p.w;\n    long long best = h0 * p.w + w0;\n    float mx = NEG_INF;\n    for (long long r = h0; r < h1; r += p.d[0]) {{\n      for (long long c = w0; c < w1; c += p.d[1]) {{\n        const long long k = r * p.w + c;\n        const float v = {ld}(x, base + k);\n        if (v > mx || v != v) {{ mx = v; best = k; }}\n      }}\n    }}\n    {st}(out, e, mx);\n    idx[e] = best;\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `max_pool2d_with_indices_backward`: adds each gradient into an f32 buffer (zeroed first)
/// at its index, with `atomicAdd` (the backward has no window geometry to gather by). Windows
/// that overlap add in an unspecified order (the CPU adds in output order): equal within f32
/// rounding. An index outside its plane sets `*bad`.
pub fn max_pool2d_backward(d: DType) -> Option<Source> {
    let (t, ld, _) = ctype(d)?;
    let name = lower(format!("max_pool2d_backward_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* grad, const long long* idx, float* acc, long long per_plane, long long plane_size, long long n, int* bad) {{\n  GRID_STRIDE(e, n) {{\n    const long long k = idx[e];\n    if (k < 0 || k >= plane_size) {{ atomicExch(bad, 1); continue; }}\n    atomicAdd(acc + (e / per_plane) * plane_size + k, {ld}(grad, e));\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `embedding`: row `idx[k]` of `weight` (`rows x dim`) for each index (i64); an index out of
/// range sets `*bad` and writes zeros. Every dtype (a raw copy).
pub fn embedding(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("embedding_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const long long* idx, const {t}* w, {t}* out, long long rows, long long dim, long long n, int* bad) {{\n  GRID_STRIDE(e, n) {{\n    const long long r = idx[e / dim];\n    if (r < 0 || r >= rows) {{ atomicExch(bad, 1); out[e] = ({t})0; continue; }}\n    out[e] = w[r * dim + e % dim];\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// How often each row is indexed (for `scale_grad_by_freq`); an index out of range sets
/// `*bad`. Not per dtype.
pub fn embedding_count() -> Source {
    let name = "embedding_count".to_string();
    let body = format!(
        "extern \"C\" __global__ void {name}(const long long* idx, unsigned int* counts, long long rows, long long n, int* bad) {{\n  GRID_STRIDE(k, n) {{\n    const long long r = idx[k];\n    if (r < 0 || r >= rows) {{ atomicExch(bad, 1); continue; }}\n    atomicAdd(counts + r, 1u);\n  }}\n}}\n"
    );
    Source {
        name,
        code: code(body),
    }
}

/// `embedding_backward`: each gradient row added into row `idx[k]` of an f32 buffer (zeroed
/// first) with `atomicAdd`, skipping `padding_idx`, scaled by `1 / count` when `counts` is not
/// null. Repeated indices add in an unspecified order (the CPU adds in index order): equal
/// within f32 rounding.
pub fn embedding_backward(d: DType) -> Option<Source> {
    let (t, ld, _) = ctype(d)?;
    let name = lower(format!("embedding_backward_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* grad, const long long* idx, const unsigned int* counts, float* acc, long long rows, long long dim, long long padding_idx, long long n, int* bad) {{\n  GRID_STRIDE(e, n) {{\n    const long long r = idx[e / dim];\n    if (r < 0 || r >= rows) {{ atomicExch(bad, 1); continue; }}\n    if (r == padding_idx) continue;\n    float v = {ld}(grad, e);\n    if (counts) v = __fmul_rn(v, 1.0f / (float)counts[r]);\n    atomicAdd(acc + r * dim + e % dim, v);\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `var_mean` over the last `count` contiguous elements of each row (the host permutes the
/// reduced dims last): one block per row, sums in f64 (two passes: mean, then squared
/// deviations) through warp shuffles and shared memory, `var = ss / divisor` in f64, both
/// rounded once to the dtype, as `cpu::var_mean::var_mean`.
pub fn var_mean(d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = lower(format!("var_mean_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* in, {t}* var, {t}* mean, long long outer, long long count, double divisor) {{\n  SumOp sm;\n  for (long long row = blockIdx.x; row < outer; row += gridDim.x) {{\n    const long long base = row * count;\n    double s = 0.0;\n    for (long long k = threadIdx.x; k < count; k += blockDim.x) s += (double){ld}(in, base + k);\n    s = block_reduce(s, sm, 0.0);\n    const double m = s / (double)count;\n    double ss = 0.0;\n    for (long long k = threadIdx.x; k < count; k += blockDim.x) {{ double dv = (double){ld}(in, base + k) - m; ss += dv * dv; }}\n    ss = block_reduce(ss, sm, 0.0);\n    if (threadIdx.x == 0) {{ {st}(mean, row, (float)m); {st}(var, row, (float)(ss / divisor)); }}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// Sum or max of i64 over the last `count` contiguous elements of each row (the host converts
/// bools and other dtypes to i64 and permutes the reduced dims last, as for
/// [`super::kernels::reduce`]): one block per row, wrapping sums, as `cpu::reduce`'s integer
/// path (`torch.sum(mask)` counts). A mean of integers has no kernel (`None`), as on the CPU.
pub fn reduce_int(op: ReduceOp) -> Option<Source> {
    let (functor, init) = match op {
        ReduceOp::Sum => ("WrapAddOp", "0ll"),
        ReduceOp::Amax => ("IMaxOp", "(-9223372036854775807ll - 1)"),
        ReduceOp::Amin => ("IMinOp", "9223372036854775807ll"),
        ReduceOp::Prod => ("WrapMulOp", "1ll"),
        ReduceOp::Mean => return None,
    };
    let name = lower(format!("reduce_int_{op:?}"));
    let body = format!(
        "struct WrapAddOp {{ __device__ __forceinline__ long long operator()(long long a, long long b) const {{ return (long long)((unsigned long long)a + (unsigned long long)b); }} }};\nstruct IMaxOp {{ __device__ __forceinline__ long long operator()(long long a, long long b) const {{ return a > b ? a : b; }} }};\nstruct IMinOp {{ __device__ __forceinline__ long long operator()(long long a, long long b) const {{ return a < b ? a : b; }} }};\nstruct WrapMulOp {{ __device__ __forceinline__ long long operator()(long long a, long long b) const {{ return (long long)((unsigned long long)a * (unsigned long long)b); }} }};\nextern \"C\" __global__ void {name}(const long long* in, long long* out, long long outer, long long count) {{\n  {functor} op;\n  const long long id = {init};\n  for (long long row = blockIdx.x; row < outer; row += gridDim.x) {{\n    const long long base = row * count;\n    long long acc = id;\n    for (long long k = threadIdx.x; k < count; k += blockDim.x) acc = op(acc, in[base + k]);\n    acc = block_reduce(acc, op, id);\n    if (threadIdx.x == 0) out[row] = acc;\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `take_along_dim`: output element `i` reads `a` at `l.sa`'s offset (0 along `dim` and where
/// `a` broadcasts) plus `index * dim_stride`, the index read through `l.sb` (0 where the
/// indices broadcast); negative indices count from the end; one out of `0..dim_size` sets
/// `*bad` and writes zero. Without a dim the host passes the flattened `a` (rank 1, `sa` 0,
/// `sb` 1, stride 1). Every dtype (a raw copy, as [`embedding`]).
pub fn take_along_dim(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("take_along_dim_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* a, const long long* idx, Layout l, long long dim_stride, long long dim_size, {t}* out, long long n, int* bad) {{\n  GRID_STRIDE(i, n) {{\n    long long oa, oi; offsets(l, i, &oa, &oi);\n    long long j = idx[oi];\n    if (j < 0) j += dim_size;\n    if (j < 0 || j >= dim_size) {{ atomicExch(bad, 1); out[i] = ({t})0; continue; }}\n    out[i] = a[oa + j * dim_stride];\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `nll_loss_backward` over an input of `[n, classes, inner]`, one thread per element:
/// `-weight[t] * grad * (1 / total_weight for mean)` at the target class `t` of its
/// `(batch, position)`, zero elsewhere and where `t == ignore_index`; computed in f64 and
/// rounded once to the dtype, as `cpu::loss_grad::nll_loss_backward`. `grad`, `weight` (null
/// when unweighted) and `tw` come as f32 (the host converts them, exactly for the float
/// dtypes); `grad` is read at the element's position when `per_element` (reduction `none`),
/// else at 0; `tw_n == 0` gives NaN for a mean, as the CPU's empty `total_weight`. A target
/// outside `0..classes` that is not ignored sets `*bad`.
pub fn nll_loss_backward(d: DType) -> Option<Source> {
    let (t, _, st) = ctype(d)?;
    let name = lower(format!("nll_loss_backward_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const float* grad, const long long* target, const float* weight, const float* tw, long long tw_n, int mean, int per_element, long long classes, long long inner, long long ignore_index, {t}* out, long long n, int* bad) {{\n  const double scale = !mean ? 1.0 : (tw_n > 0 ? 1.0 / (double)tw[0] : __longlong_as_double(0x7ff8000000000000ll));\n  GRID_STRIDE(e, n) {{\n    const long long s = e % inner, cls = (e / inner) % classes, b = e / (inner * classes);\n    const long long k = b * inner + s;\n    const long long tk = target[k];\n    double v = 0.0;\n    if (tk != ignore_index) {{\n      if (tk < 0 || tk >= classes) {{ if (cls == 0) atomicExch(bad, 1); }}\n      else if (tk == cls) {{\n        const double w = weight ? (double)weight[tk] : 1.0;\n        const double g = (double)grad[per_element ? k : 0];\n        v = -w * g * scale;\n      }}\n    }}\n    {st}(out, e, (float)v);\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `_log_softmax_backward_data` (`log`: `grad - exp(output) * sum(grad)`) or
/// `_softmax_backward_data` (`output * (grad - sum(grad * output))`) over the middle dimension
/// of `[outer, len, inner]`, as [`super::kernels::softmax`]: one block per row `(o, r)`, the
/// row's sum through warp shuffles and shared memory in f32 (the CPU sums in f64: equal
/// within f32 rounding), the result in the inputs' dtype (the host converts for another).
pub fn softmax_backward(log: bool, d: DType) -> Option<Source> {
    let (t, ld, st) = ctype(d)?;
    let name = lower(format!(
        "{}softmax_backward_{d}",
        if log { "log_" } else { "" }
    ));
    let (term, out) = if log {
        (format!("{ld}(grad, at)"), "gv - expf(yv) * s")
    } else {
        (format!("{ld}(grad, at) * {ld}(y, at)"), "yv * (gv - s)")
    };
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* grad, const {t}* y, {t}* out, long long outer, long long len, long long inner) {{\n  SumOp sm;\n  for (long long row = blockIdx.x; row < outer * inner; row += gridDim.x) {{\n    const long long base = (row / inner) * len * inner + row % inner;\n    float s = 0.0f;\n    for (long long j = threadIdx.x; j < len; j += blockDim.x) {{ const long long at = base + j * inner; s += {term}; }}\n    s = block_reduce(s, sm, 0.0f);\n    for (long long j = threadIdx.x; j < len; j += blockDim.x) {{ const long long at = base + j * inner; const float gv = {ld}(grad, at), yv = {ld}(y, at); {st}(out, at, {out}); }}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// ChaCha8 (as `rand_chacha::ChaCha8Rng`: the 256-bit key, a 64-bit block counter from 0 in
/// words 12-13, stream 0 in words 14-15) in device code: word `i` of the stream is word
/// `i % 16` of block `i / 16`, so element `i` of `uniform` is the same value the CPU's
/// `cpu::random::uniform` draws for the same key.
const CHACHA: &str = r#"
__device__ __forceinline__ unsigned int rotl(unsigned int x, int r) { return (x << r) | (x >> (32 - r)); }
#define QR(a, b, c, d) a += b; d ^= a; d = rotl(d, 16); c += d; b ^= c; b = rotl(b, 12); a += b; d ^= a; d = rotl(d, 8); c += d; b ^= c; b = rotl(b, 7);
__device__ void chacha8_block(const unsigned int key[8], unsigned long long block, unsigned int out[16]) {
    unsigned int s[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u,
        key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
        (unsigned int)block, (unsigned int)(block >> 32), 0u, 0u};
    unsigned int x[16];
    for (int i = 0; i < 16; ++i) x[i] = s[i];
    for (int r = 0; r < 4; ++r) {
        QR(x[0], x[4], x[8], x[12]) QR(x[1], x[5], x[9], x[13]) QR(x[2], x[6], x[10], x[14]) QR(x[3], x[7], x[11], x[15])
        QR(x[0], x[5], x[10], x[15]) QR(x[1], x[6], x[11], x[12]) QR(x[2], x[7], x[8], x[13]) QR(x[3], x[4], x[9], x[14])
    }
    for (int i = 0; i < 16; ++i) out[i] = x[i] + s[i];
}
"#;

/// Thunder's `uniform`: `lo + width * u` in f32 (no fused multiply-add, as on the CPU), `u`
/// from the top 24 bits of stream word `i`; one thread per 16-word ChaCha block.
pub fn uniform(d: DType) -> Option<Source> {
    let (t, _, st) = ctype(d)?;
    let name = lower(format!("uniform_{d}"));
    let body = format!(
        "{CHACHA}\nextern \"C\" __global__ void {name}({t}* out, unsigned long long seed, unsigned long long rank, unsigned long long step, unsigned long long node, float lo, float width, long long n) {{\n  const unsigned int key[8] = {{(unsigned int)seed, (unsigned int)(seed >> 32), (unsigned int)rank, (unsigned int)(rank >> 32), (unsigned int)step, (unsigned int)(step >> 32), (unsigned int)node, (unsigned int)(node >> 32)}};\n  const long long blocks = (n + 15) / 16;\n  GRID_STRIDE(b, blocks) {{\n    unsigned int words[16];\n    chacha8_block(key, (unsigned long long)b, words);\n    for (int j = 0; j < 16 && b * 16 + j < n; ++j) {{\n      const float u = (float)(words[j] >> 8) * (1.0f / 16777216.0f);\n      {st}(out, b * 16 + j, __fadd_rn(lo, __fmul_rn(width, u)));\n    }}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `randn`: element `i` from words `2i` and `2i + 1` of the key's ChaCha8 stream by
/// Box–Muller in f32 (as `cpu::random::normal` draws them, there in f64; the values agree to
/// f32 rounding of the logarithm and cosine), 8 elements per 16-word block.
pub fn normal(d: DType) -> Option<Source> {
    let (t, _, st) = ctype(d)?;
    let name = lower(format!("normal_{d}"));
    let body = format!(
        "{CHACHA}\nextern \"C\" __global__ void {name}({t}* out, unsigned long long seed, unsigned long long rank, unsigned long long step, unsigned long long node, long long n) {{\n  const unsigned int key[8] = {{(unsigned int)seed, (unsigned int)(seed >> 32), (unsigned int)rank, (unsigned int)(rank >> 32), (unsigned int)step, (unsigned int)(step >> 32), (unsigned int)node, (unsigned int)(node >> 32)}};\n  const long long blocks = (n + 7) / 8;\n  GRID_STRIDE(b, blocks) {{\n    unsigned int words[16];\n    chacha8_block(key, (unsigned long long)b, words);\n    for (int j = 0; j < 8 && b * 8 + j < n; ++j) {{\n      const float u1 = (float)((words[2 * j] >> 8) + 1) * (1.0f / 16777216.0f);\n      const float u2 = (float)(words[2 * j + 1] >> 8) * (1.0f / 16777216.0f);\n      {st}(out, b * 8 + j, sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2));\n    }}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// Sets `*bad` when an index lies outside `0..size` (the host then reads the indices back to
/// name it, as the CPU does). Not per dtype: indices are i64 on cuda.
pub fn index_check() -> Source {
    let name = "index_check".to_string();
    let body = format!(
        "extern \"C\" __global__ void {name}(const long long* idx, long long n, long long size, int* bad) {{\n  GRID_STRIDE(k, n) {{ const long long j = idx[k]; if (j < 0 || j >= size) atomicExch(bad, 1); }}\n}}\n"
    );
    Source {
        name,
        code: code(body),
    }
}

/// `gather`: output element `i` (a position of the index) reads `a` at `l.sa`'s offset (`a`'s
/// strides, 0 along `dim`) plus `idx[i] * dim_stride`; an index outside `0..dim_size` (which
/// [`index_check`] reports) writes zero. Every dtype (a raw copy).
pub fn gather_dim(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("gather_dim_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* a, const long long* idx, Layout l, long long dim_stride, long long dim_size, {t}* out, long long n) {{\n  GRID_STRIDE(i, n) {{\n    long long oa, ob; offsets(l, i, &oa, &ob);\n    const long long j = idx[i];\n    out[i] = (j >= 0 && j < dim_size) ? a[oa + j * dim_stride] : ({t})0;\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `index_select` of `a` as `[outer, len, inner]` by `m` indices: output element `(o, i, r)`
/// is `a[o, idx[i], r]` (zero for an index outside `0..len`, which [`index_check`] reports).
/// Every dtype (a raw copy).
pub fn index_select(d: DType) -> Option<Source> {
    let t = elem(d)?;
    let name = lower(format!("index_select_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* a, const long long* idx, {t}* out, long long len, long long m, long long inner, long long n) {{\n  GRID_STRIDE(e, n) {{\n    const long long o = e / (m * inner), i = (e / inner) % m, r = e % inner;\n    const long long j = idx[i];\n    out[e] = (j >= 0 && j < len) ? a[(o * len + j) * inner + r] : ({t})0;\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// The accumulator of the adds: (declaration from `a[e]`, `acc += src[at]`, store to
/// `out[e]`); floats in f32 (rounded once by the store), i64 wrapping. As
/// `cpu::indexing`'s accumulation, so both give the same bits.
fn add_parts(d: DType) -> Option<(&'static str, String, String, String)> {
    Some(match (ctype(d), d) {
        (Some((t, ld, st)), _) => (
            t,
            format!("float acc = {ld}(a, e);"),
            format!("acc += {ld}(src, at);"),
            format!("{st}(out, e, acc);"),
        ),
        (None, _) if is_int(d) => {
            let t = elem(d)?;
            (
                t,
                "long long acc = a[e];".to_string(),
                "acc = (long long)((unsigned long long)acc + (unsigned long long)(long long)src[at]);"
                    .to_string(),
                format!("out[e] = ({t})acc;"),
            )
        }
        (None, _) => return None,
    })
}

/// `scatter_add`, one thread per output element `e` (a position of `a`; no atomics, so the
/// result does not depend on scheduling): it walks its line of the index along `l.dim` (when
/// `e` lies inside the index's extent in the other dimensions) and adds `src` wherever the
/// index names `e`'s coordinate, in index order. Costs `index.shape[dim]` reads per element.
pub fn scatter_add(d: DType) -> Option<Source> {
    let (t, init, add, store) = add_parts(d)?;
    let name = lower(format!("scatter_add_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* a, const long long* idx, const {t}* src, ScatterLayout l, {t}* out, long long n) {{\n  GRID_STRIDE(e, n) {{\n    long long r = e, oi = 0, os = 0, target = 0; bool inside = true;\n    for (int d = l.rank - 1; d >= 0; --d) {{\n      const long long c = r % l.shape[d]; r /= l.shape[d];\n      if (d == l.dim) {{ target = c; continue; }}\n      if (c >= l.index_shape[d]) inside = false;\n      oi += c * l.index_stride[d]; os += c * l.src_stride[d];\n    }}\n    {init}\n    if (inside) {{\n      for (long long j = 0; j < l.index_shape[l.dim]; ++j) {{\n        if (idx[oi + j * l.index_stride[l.dim]] != target) continue;\n        const long long at = os + j * l.src_stride[l.dim];\n        {add}\n      }}\n    }}\n    {store}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `index_add` of `source` (`[outer, m, inner]`) into `a` (`[outer, len, inner]`), one thread
/// per output element `(o, j, r)`: it adds `source[o, i, r]` for every `i` whose index is `j`,
/// in index order (no atomics). Costs `m` reads per element.
pub fn index_add(d: DType) -> Option<Source> {
    let (t, init, add, store) = add_parts(d)?;
    let name = lower(format!("index_add_{d}"));
    let body = format!(
        "extern \"C\" __global__ void {name}(const {t}* a, const long long* idx, const {t}* src, {t}* out, long long len, long long m, long long inner, long long n) {{\n  GRID_STRIDE(e, n) {{\n    const long long o = e / (len * inner), j = (e / inner) % len, r = e % inner;\n    {init}\n    for (long long i = 0; i < m; ++i) {{\n      if (idx[i] != j) continue;\n      const long long at = (o * m + i) * inner + r;\n      {add}\n    }}\n    {store}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// `sort`, `argsort` and `topk` of `[outer, len, inner]` along the middle dimension, one thread
/// per input element: its rank is the number of elements of its line that sort before it
/// (smaller, or larger when `descending`; equal ones before it in index order), so ranks are
/// a permutation and the order is stable, as `cpu::sort`. Ranks below `take` write the index
/// (and, when `values` is not null, the value) at that rank. NaN sorts above every number;
/// -0.0 equals 0.0. Floats compare in f32 (exact for the dtypes), i64 exactly. Costs `len`
/// reads per element.
pub fn sort_rank(d: DType) -> Option<Source> {
    let (t, kt, load) = match ctype(d) {
        Some((t, ld, _)) => (t, "float", format!("{ld}(in, ")),
        None if is_int(d) => (elem(d)?, "long long", "(in[".to_string()),
        None => return None,
    };
    let close = if is_int(d) { "])" } else { ")" };
    let less = if is_int(d) {
        "__device__ __forceinline__ bool sort_less(long long a, long long b) { return a < b; }"
    } else {
        "__device__ __forceinline__ bool sort_less(float a, float b) { return !(a != a) && ((b != b) || a < b); }"
    };
    let name = lower(format!("sort_rank_{d}"));
    let body = format!(
        "{less}\nextern \"C\" __global__ void {name}(const {t}* in, {t}* values, long long* indices, long long outer, long long len, long long inner, long long take, int descending, long long n) {{\n  GRID_STRIDE(e, n) {{\n    const long long o = e / (len * inner), j = (e / inner) % len, i = e % inner;\n    const {kt} v = {load}e{close};\n    long long rank = 0;\n    for (long long q = 0; q < len; ++q) {{\n      const {kt} w = {load}(o * len + q) * inner + i{close};\n      const bool lt = sort_less(w, v), gt = sort_less(v, w);\n      if ((descending ? gt : lt) || (!lt && !gt && q < j)) ++rank;\n    }}\n    if (rank < take) {{\n      const long long at = (o * take + rank) * inner + i;\n      indices[at] = j;\n      if (values) values[at] = in[e];\n    }}\n  }}\n}}\n"
    );
    Some(Source {
        name,
        code: code(body),
    })
}

/// The ChaCha8 block function exactly as the device code computes it (for the CPU test that
/// holds it to `rand_chacha`).
#[cfg(test)]
pub fn chacha8_block_host(key: [u32; 8], block: u64) -> [u32; 16] {
    let mut s = [0u32; 16];
    s[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
    s[4..12].copy_from_slice(&key);
    s[12] = block as u32;
    s[13] = (block >> 32) as u32;
    let mut x = s;
    fn qr(x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(16);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(12);
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(8);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(7);
    }
    for _ in 0..4 {
        qr(&mut x, 0, 4, 8, 12);
        qr(&mut x, 1, 5, 9, 13);
        qr(&mut x, 2, 6, 10, 14);
        qr(&mut x, 3, 7, 11, 15);
        qr(&mut x, 0, 5, 10, 15);
        qr(&mut x, 1, 6, 11, 12);
        qr(&mut x, 2, 7, 8, 13);
        qr(&mut x, 3, 4, 9, 14);
    }
    let mut out = [0u32; 16];
    for i in 0..16 {
        out[i] = x[i].wrapping_add(s[i]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::random::{uniform as cpu_uniform, RngKey};
    use rand_chacha::rand_core::{RngCore, SeedableRng};

    fn key_words(k: RngKey) -> [u32; 8] {
        let mut w = [0u32; 8];
        for (i, v) in [k.seed, k.rank, k.step, k.node].into_iter().enumerate() {
            w[2 * i] = v as u32;
            w[2 * i + 1] = (v >> 32) as u32;
        }
        w
    }

    #[test]
    fn the_device_chacha8_is_rand_chachas_stream() {
        let k = RngKey {
            seed: 0x0123_4567_89ab_cdef,
            rank: 3,
            step: u64::MAX - 5,
            node: 17,
        };
        let mut seed = [0u8; 32];
        for (i, w) in [k.seed, k.rank, k.step, k.node].iter().enumerate() {
            seed[i * 8..(i + 1) * 8].copy_from_slice(&w.to_le_bytes());
        }
        let mut rng = rand_chacha::ChaCha8Rng::from_seed(seed);
        // past rand_chacha's 4-block buffer, so block numbers above 3 are checked too
        for b in 0..9u64 {
            let words = chacha8_block_host(key_words(k), b);
            for (j, &w) in words.iter().enumerate() {
                assert_eq!(w, rng.next_u32(), "block {b} word {j}");
            }
        }
        // and the f32 mapping the kernel applies gives the CPU's uniform, bit for bit
        let (lo, hi) = (-0.5f64, 2.0f64);
        let want = cpu_uniform(&[100], lo, hi, DType::F32, k)
            .expect("ok")
            .to_f32_vec();
        let (l, w) = (lo as f32, (hi - lo) as f32);
        for (i, &x) in want.iter().enumerate() {
            let word = chacha8_block_host(key_words(k), (i / 16) as u64)[i % 16];
            let u = (word >> 8) as f32 * (1.0f32 / 16_777_216.0);
            assert_eq!((l + w * u).to_bits(), x.to_bits(), "element {i}");
        }
    }

    #[test]
    fn the_device_code_mirrors_the_host_chacha() {
        let src = uniform(DType::F32).expect("f32");
        for part in [
            "0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u",
            "(unsigned int)block, (unsigned int)(block >> 32), 0u, 0u",
            "for (int r = 0; r < 4; ++r)",
            "out[i] = x[i] + s[i]",
            "words[j] >> 8",
            "__fadd_rn(lo, __fmul_rn(width, u))",
        ] {
            assert!(src.code.contains(part), "{part}");
        }
        assert!(uniform(DType::I64).is_none());
    }

    #[test]
    fn raw_copies_exist_for_every_dtype_and_arithmetic_for_floats() {
        for d in ALL_DTYPES {
            assert!(
                gather(d).is_some() && pad(d).is_some() && fill(d).is_some(),
                "{d}"
            );
            assert_eq!(convolution(d).is_some(), ctype(d).is_some(), "{d}");
        }
        assert!(elem(DType::F64).is_none());
        assert!(binary_int(BinaryOp::Div).is_none());
        assert!(convert(DType::F32, DType::F32).is_none());
    }

    /// What `sort_rank` computes (its CUDA C loop, in f32): (values, indices) of the first
    /// `take` of each line.
    fn sort_rank_host(
        x: &[f32],
        (outer, len, inner): (usize, usize, usize),
        take: usize,
        descending: bool,
    ) -> (Vec<f32>, Vec<i64>) {
        let less = |a: f32, b: f32| !a.is_nan() && (b.is_nan() || a < b);
        let mut vals = vec![f32::INFINITY; outer * take * inner];
        let mut idx = vec![-1i64; outer * take * inner];
        for e in 0..x.len() {
            let (o, j, i) = (e / (len * inner), (e / inner) % len, e % inner);
            let v = x[e];
            let mut rank = 0;
            for q in 0..len {
                let w = x[(o * len + q) * inner + i];
                let (lt, gt) = (less(w, v), less(v, w));
                if (if descending { gt } else { lt }) || (!lt && !gt && q < j) {
                    rank += 1;
                }
            }
            if rank < take {
                let at = (o * take + rank) * inner + i;
                idx[at] = j as i64;
                vals[at] = v;
            }
        }
        (vals, idx)
    }

    /// What `index_add` computes (its CUDA C loop, in f32).
    fn index_add_host(
        a: &[f32],
        idx: &[i64],
        src: &[f32],
        (len, m, inner): (usize, usize, usize),
    ) -> Vec<f32> {
        (0..a.len())
            .map(|e| {
                let (o, j, r) = (e / (len * inner), (e / inner) % len, e % inner);
                let mut acc = a[e];
                for i in 0..m {
                    if idx[i] == j as i64 {
                        acc += src[(o * m + i) * inner + r];
                    }
                }
                acc
            })
            .collect()
    }

    #[test]
    fn the_sort_rank_loop_gives_the_cpus_order() {
        use crate::cpu::sort;
        use crate::tensor::Tensor;
        // ties, NaNs, -0.0 and 0.0 along each dimension of [5, 9, 3]
        let v: Vec<f32> = (0..135)
            .map(|k| match k % 10 {
                3 => f32::NAN,
                5 => -0.0,
                7 => 0.0,
                _ => ((k * 37 % 11) as f32 - 5.0) / 2.0,
            })
            .collect();
        let x = Tensor::from_f32(vec![5, 9, 3], v.clone());
        for dim in 0..3 {
            let geometry = crate::cpu::cumsum::lines(x.shape(), dim).unwrap();
            let len = geometry.1;
            for descending in [false, true] {
                let (cv, ci) = sort::sort(&x, dim, descending).unwrap();
                let (hv, hi) = sort_rank_host(&v, geometry, len, descending);
                assert_eq!(hi, ci.to_i64_vec(), "dim {dim} descending {descending}");
                let same = hv
                    .iter()
                    .zip(cv.to_f32_vec())
                    .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
                assert!(same, "dim {dim} descending {descending}");
                for k in [0, 1, len / 2] {
                    let (_, ti) = sort::topk(&x, k, dim, descending).unwrap();
                    let (_, hi) = sort_rank_host(&v, geometry, k, descending);
                    assert_eq!(hi, ti.to_i64_vec(), "topk {k} along {dim}");
                }
            }
        }
    }

    #[test]
    fn the_index_add_loop_gives_the_cpus_bits() {
        use crate::cpu::indexing;
        use crate::tensor::Tensor;
        // repeated indices: the same additions in the same order
        let a: Vec<f32> = (0..60).map(|k| (k as f32 * 0.37).sin()).collect();
        let iv: Vec<i64> = vec![2, 0, 2, 3, 2, 1, 0];
        let src: Vec<f32> = (0..5 * 7 * 3).map(|k| (k as f32 * 0.11).cos()).collect();
        let want = indexing::index_add(
            &Tensor::from_f32(vec![5, 4, 3], a.clone()),
            1,
            &Tensor::from_i64(vec![7], iv.clone()),
            &Tensor::from_f32(vec![5, 7, 3], src.clone()),
        )
        .unwrap()
        .to_f32_vec();
        let got = index_add_host(&a, &iv, &src, (4, 7, 3));
        assert!(got
            .iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits()));
    }
}
