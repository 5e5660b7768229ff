//! Cases a sweep of five samples per op of Thunder's OpInfo database (`python -m
//! tracepass.export.opinfo --samples 5`) found beyond the one-sample corpus of
//! `testdata/opinfo/`: an adaptive pool to an empty output, and the prims Thunder prints below
//! `embedding` and `torch.tensor` (read when a trace is taken down to its prims).

mod common;
use common::run_trace;
use tracepass_ir::{parse_trace, DType};
use tracepass_runtime::tensor::Tensor;

fn run(text: &str, inputs: &[Tensor]) -> Vec<Tensor> {
    let t = parse_trace(text).unwrap_or_else(|e| panic!("{e}"));
    tracepass_ir::verify(&t).unwrap();
    run_trace(&t, inputs)
}

#[test]
fn an_adaptive_pool_to_size_zero_is_empty_as_in_pytorch() {
    let text = "def f(x):
  # x: \"cpu f32[3, 2, 3, 4]\"
  y = torch.nn.functional.adaptive_avg_pool2d(x, (0, 0))  # y: \"cpu f32[3, 2, 0, 0]\"
  z = torch.nn.functional.adaptive_avg_pool2d(x, (1, 0))  # z: \"cpu f32[3, 2, 1, 0]\"
  return (y, z)
";
    let outs = run(text, &[Tensor::from_f32([3, 2, 3, 4], vec![1.0; 72])]);
    assert_eq!(outs[0].shape(), [3, 2, 0, 0]);
    assert_eq!(outs[1].shape(), [3, 2, 1, 0]);
}

#[test]
fn the_prims_below_embedding_and_tensor_run() {
    let text = "def f(i, w):
  # i: \"cpu i64[3]\"
  # w: \"cpu f32[4, 2]\"
  e = prims.embedding(i, w, padding_idx=-1, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False)  # e: \"cpu f32[3, 2]\"
  s = prims.tensor_from_sequence([True, False, True], dtype=None, device=devices.Device(\"cpu\"))  # s: \"cpu b8[3]\"
  return (e, s)
";
    let w: Vec<f32> = (0..8).map(|v| v as f32).collect();
    let outs = run(
        text,
        &[
            Tensor::from_i64([3], vec![3, 0, 3]),
            Tensor::from_f32([4, 2], w),
        ],
    );
    assert_eq!(outs[0].to_f64_vec(), [6.0, 7.0, 0.0, 1.0, 6.0, 7.0]);
    assert_eq!(outs[1].dtype(), DType::Bool);
    assert_eq!(outs[1].to_f64_vec(), [1.0, 0.0, 1.0]);
}
