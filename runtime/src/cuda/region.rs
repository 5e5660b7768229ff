//! A fusion region's [`FusedLoop`] as one NVRTC kernel: a grid-stride loop over the output in
//! which each lane operation is one statement, written with the unfused kernels' own
//! expressions (`kernels::unary_expr`, `kernels::binary_expr`), so nothing between the ops
//! goes to memory. Every lane's value passes an empty `asm` barrier, which keeps NVRTC from
//! contracting a multiply of one op and an add of the next into one FMA: each op rounds as
//! its unfused kernel does. Shapes and strides are constants of the source (a trace's shapes
//! are fixed), so a kernel is made per region and shape, named by a hash of its source,
//! compiled on first use and cached like the others. [`catalog`] lists regions that use every
//! lane operation, for the NVRTC check that compiles every kernel.

use super::kernels::{binary_expr, unary_expr, Source, BINARY_OPS, PRELUDE, UNARY_OPS};
use crate::exec::kernel::BinaryOp;
use crate::exec::region::{FusedLoop, LaneOp};
use std::fmt::Write as _;

/// An f32 literal with exactly the bits `x as f32` has (infinities and NaN included).
fn lit(x: f64) -> String {
    format!("__int_as_float({:#010x})", (x as f32).to_bits())
}

/// The kernel of `f` for operands that are tensors (`false`) or numbers (`true`, passed by
/// value); its parameters are the operands in order, then `float* out, long long n`.
pub fn region_source(f: &FusedLoop, numbers: &[bool]) -> Source {
    let mut params: Vec<String> = numbers
        .iter()
        .enumerate()
        .map(|(i, &num)| {
            if num {
                format!("float s{i}")
            } else {
                format!("const float* __restrict__ in{i}")
            }
        })
        .collect();
    params.push("float* __restrict__ out".into());
    params.push("long long n".into());
    let mut body = String::new();
    // the loop index along each dimension
    let rank = f.dims.len();
    let _ = writeln!(body, "    long long r = i;");
    for d in (0..rank).rev() {
        let _ = writeln!(
            body,
            "    const long long c{d} = r % {size}LL; r /= {size}LL;",
            size = f.dims[d].max(1)
        );
    }
    for (k, op) in f.ops.iter().enumerate() {
        let expr = match op {
            LaneOp::Load { input, strides } => {
                if numbers.get(*input).copied().unwrap_or(false) {
                    format!("s{input}")
                } else {
                    let terms: Vec<String> = strides
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| **s != 0)
                        .map(|(d, s)| format!("c{d} * {s}LL"))
                        .collect();
                    let at = if terms.is_empty() {
                        "0".to_string()
                    } else {
                        terms.join(" + ")
                    };
                    format!("in{input}[{at}]")
                }
            }
            LaneOp::Const(x) => lit(*x),
            LaneOp::Unary(u, a) => format!("[&]{{ float x = v{a}; return {}; }}()", unary_expr(*u)),
            LaneOp::Binary { op, a, b, alpha } => format!(
                "[&]{{ float a = v{a}, b = v{b}, alpha = {}; return {}; }}()",
                lit(*alpha),
                binary_expr(*op)
            ),
            LaneOp::PowScalar(a, e) => {
                let pow = match *e {
                    2.0 => "x * x".to_string(),
                    3.0 => "x * x * x".to_string(),
                    0.5 => "sqrtf(x)".to_string(),
                    -0.5 => "1.0f / sqrtf(x)".to_string(),
                    -1.0 => "1.0f / x".to_string(),
                    -2.0 => "1.0f / (x * x)".to_string(),
                    e => format!("powf(x, {})", lit(e)),
                };
                format!("[&]{{ float x = v{a}; return {pow}; }}()")
            }
        };
        let _ = writeln!(body, "    float v{k} = {expr};");
        let _ = writeln!(body, "    asm volatile(\"\" : \"+f\"(v{k}));");
    }
    let _ = writeln!(body, "    out[i] = v{};", f.ops.len().saturating_sub(1));
    let kernel = format!(
        "extern \"C\" __global__ void NAME({}) {{\n  GRID_STRIDE(i, n) {{\n{body}  }}\n}}\n",
        params.join(", ")
    );
    // the name is a hash of everything the kernel computes
    let name = format!("region_{:016x}", fnv1a(kernel.as_bytes()));
    // zeta's series is long: only regions that call it carry it
    let zeta = if kernel.contains("zeta_d(") {
        super::kernels::ZETA
    } else {
        ""
    };
    let code = format!(
        "{PRELUDE}{}{}{zeta}\n{}",
        super::kernels::SPECIAL_FNS,
        super::kernels::FLOAT_DIVISION,
        kernel.replace("void NAME(", &format!("void {name}("))
    );
    Source { name, code }
}

/// FNV-1a, 64-bit: a stable name for a kernel's text.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Regions that between them use every lane operation (every unary op, every binary op with
/// tensors and with a literal, every special case of a literal exponent, broadcast, strided
/// and number operands), so compiling them checks the generator as a whole.
pub fn catalog() -> Vec<Source> {
    let shape = vec![2, 3, 5];
    let load = |input: usize, strides: Vec<usize>| LaneOp::Load { input, strides };
    let mut out = Vec::new();
    // one region applying every unary op in turn to a loaded, broadcast value
    let mut ops = vec![load(0, vec![15, 5, 1]), load(1, vec![0, 0, 1])];
    ops.push(LaneOp::Binary {
        op: BinaryOp::Add,
        a: 0,
        b: 1,
        alpha: 1.0,
    });
    for &u in UNARY_OPS {
        let last = ops.len() - 1;
        ops.push(LaneOp::Unary(u, last));
    }
    out.push(region_source(
        &FusedLoop::new(shape.clone(), ops),
        &[false, false],
    ));
    // every binary op, on a transposed operand, a number and a literal
    let mut ops = vec![load(0, vec![1, 2, 6]), load(1, vec![]), LaneOp::Const(0.5)];
    for &b in BINARY_OPS {
        let last = ops.len() - 1;
        ops.push(LaneOp::Binary {
            op: b,
            a: last,
            b: 1,
            alpha: 2.0,
        });
        let last = ops.len() - 1;
        ops.push(LaneOp::Binary {
            op: b,
            a: 2,
            b: last,
            alpha: 1.0,
        });
    }
    for e in [2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 2.5, f64::INFINITY] {
        let last = ops.len() - 1;
        ops.push(LaneOp::PowScalar(last, e));
    }
    out.push(region_source(&FusedLoop::new(shape, ops), &[false, true]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_kernel_reads_each_operand_through_its_strides() {
        let f = FusedLoop::new(
            vec![4, 8],
            vec![
                LaneOp::Load {
                    input: 0,
                    strides: vec![8, 1],
                },
                LaneOp::Load {
                    input: 1,
                    strides: vec![0, 1],
                },
                LaneOp::Binary {
                    op: BinaryOp::Mul,
                    a: 0,
                    b: 1,
                    alpha: 1.0,
                },
                LaneOp::Unary(crate::exec::kernel::UnaryOp::Tanh, 2),
            ],
        );
        let s = region_source(&f, &[false, false]);
        assert!(s.code.contains("in0[c0 * 8LL + c1 * 1LL]"), "{}", s.code);
        assert!(s.code.contains("in1[c1 * 1LL]"), "{}", s.code);
        assert!(s.code.contains("tanhf(x)"), "{}", s.code);
        assert!(s.code.contains("out[i] = v3;"), "{}", s.code);
        assert!(s.code.contains(&format!("void {}(", s.name)));
        // another shape is another kernel; the same region is the same one
        let g = FusedLoop::new(vec![2, 8], f.ops.clone());
        assert_ne!(region_source(&g, &[false, false]).name, s.name);
        assert_eq!(region_source(&f, &[false, false]), s);
        assert_eq!(lit(0.1), "__int_as_float(0x3dcccccd)");
        assert_eq!(catalog().len(), 2);
    }

    /// The full check over every kernel is `tests/cuda_nvrtc.rs`; this one builds only the
    /// region kernels, for a quick answer while working on the generator.
    #[test]
    fn the_region_catalog_compiles_where_nvrtc_is_present() {
        if crate::cuda::nvrtc::available().is_err() {
            return;
        }
        for s in catalog() {
            if let Err(e) = crate::cuda::nvrtc::compile(&s, Some("compute_80")) {
                panic!("{e}\n{}", s.code);
            }
        }
    }
}
