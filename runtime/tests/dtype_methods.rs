//! PyTorch's dtype methods as Thunder prints them when it has no symbol of its own
//! (`Tensor.int(t)` in RoBERTa's position ids): each is `t.to(dtype)`, through the op table,
//! the plan compiler and the CPU kernels.

mod common;
use common::run_trace;
use tracepass_ir::{parse_trace, DType};
use tracepass_runtime::tensor::Tensor;

const TRACE: &str = r#"def computation(x, m):
  # x: "cpu f32[4]"
  # m: "cpu b8[4]"
  a = Tensor.int(m)  # a: "cpu i32[4]"
  b = Tensor.long(x)  # b: "cpu i64[4]"
  c = Tensor.double(a)  # c: "cpu f64[4]"
  d = Tensor.half(x)  # d: "cpu f16[4]"
  e = Tensor.bfloat16(x)  # e: "cpu bf16[4]"
  f = Tensor.bool(b)  # f: "cpu b8[4]"
  g = Tensor.float(a)  # g: "cpu f32[4]"
  h = Tensor.type_as(x, b)  # h: "cpu i64[4]"
  i = Tensor.int(x, memory_format=_torch_memory_format_0)  # i: "cpu i32[4]"
  return (a, b, c, d, e, f, g, h, i)
"#;

#[test]
fn dtype_methods_convert_as_to_does() {
    let t = parse_trace(TRACE).unwrap_or_else(|e| panic!("{e}"));
    let x = Tensor::from_f32(vec![4], vec![-1.5, 0.0, 2.7, 3.0]);
    let m = Tensor::from_bool(vec![4], vec![true, false, true, true]);
    let out = run_trace(&t, &[x, m]);
    let dtypes: Vec<DType> = out.iter().map(Tensor::dtype).collect();
    use DType::*;
    assert_eq!(dtypes, [I32, I64, F64, F16, BF16, Bool, F32, I64, I32]);
    let as_f64 = |t: &Tensor| t.to_dtype(F64).expect("f64").to_f64_vec();
    // float to integer truncates toward zero, as torch does
    assert_eq!(as_f64(&out[0]), [1.0, 0.0, 1.0, 1.0]);
    assert_eq!(as_f64(&out[1]), [-1.0, 0.0, 2.0, 3.0]);
    assert_eq!(as_f64(&out[2]), [1.0, 0.0, 1.0, 1.0]);
    assert_eq!(as_f64(&out[3]), [-1.5, 0.0, 2.69921875, 3.0]);
    assert_eq!(as_f64(&out[4]), [-1.5, 0.0, 2.703125, 3.0]);
    assert_eq!(as_f64(&out[5]), [1.0, 0.0, 1.0, 1.0]);
    assert_eq!(as_f64(&out[6]), [1.0, 0.0, 1.0, 1.0]);
    assert_eq!(as_f64(&out[7]), [-1.0, 0.0, 2.0, 3.0]);
    assert_eq!(as_f64(&out[8]), [-1.0, 0.0, 2.0, 3.0]);
}
