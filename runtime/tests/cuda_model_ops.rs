//! GPU tests of the real models' kernels (feature `cuda`): each against the CPU backend, the
//! reference, on the same inputs, in every dtype it has. Without a CUDA GPU each test prints
//! why it skips (`TRACEPASS_REQUIRE_GPU=1` makes that a failure). NVRTC alone (no GPU) is
//! checked by `cuda_nvrtc.rs`.
#![cfg(feature = "cuda")]

use tracepass_ir::DType;
use tracepass_runtime::cpu::kernels::uniform;
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::cuda::CudaBackend;
use tracepass_runtime::exec::RngKey;
use tracepass_runtime::exec::{Backend, Input};
use tracepass_runtime::exec::{BinaryOp, CompareOp, Kernel, LossReduction, ReduceOp, Side};
use tracepass_runtime::tensor::Tensor;

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            let required = std::env::var("TRACEPASS_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "TRACEPASS_REQUIRE_GPU=1 but {e}");
            use std::io::Write;
            let _ = writeln!(std::io::stderr().lock(), "skipping GPU test: {e}");
            None
        }
    }
}

fn tol(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-4,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

fn random(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_f32(shape, v).to_dtype(dtype).unwrap()
}

fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let d = want.dtype();
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().fold(1e-6f64, |m, x| m.max(x.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let same = a == b || (a.is_nan() && b.is_nan());
        assert!(
            same || (a - b).abs() / scale <= tol(d),
            "{what} in {d}: element {i} is {a}, the CPU gives {b}"
        );
    }
}

/// Runs `k` on both backends (inputs as tensors, in order) and compares every output.
fn check(g: &CudaBackend, k: &Kernel, inputs: &[Tensor], what: &str) {
    let cpu_in: Vec<Input<'_, Tensor>> = inputs.iter().map(Input::Tensor).collect();
    let want = CpuBackend.run_multi(k, &cpu_in).unwrap();
    let dev: Vec<_> = inputs.iter().map(|t| g.upload(t).unwrap()).collect();
    let dev_in: Vec<Input<'_, _>> = dev.iter().map(Input::Tensor).collect();
    let got = g
        .run_multi(k, &dev_in)
        .unwrap_or_else(|e| panic!("{what}: {}", e.0));
    assert_eq!(got.len(), want.len(), "{what}: outputs");
    for (i, (gt, w)) in got.iter().zip(&want).enumerate() {
        close(&g.download(gt).unwrap(), w, &format!("{what} output {i}"));
    }
}

fn pool_indices(d: DType, shape: &[usize]) -> Tensor {
    let x = random(shape, 11, d);
    let k = Kernel::MaxPool2d {
        kernel: vec![3],
        stride: vec![2],
        padding: vec![1],
        dilation: vec![1],
        ceil_mode: false,
    };
    CpuBackend
        .run_multi(&k, &[Input::Tensor(&x)])
        .unwrap()
        .remove(1)
}

#[test]
fn convolution_pooling_and_embedding_match_the_cpu() {
    let Some(g) = gpu() else { return };
    for d in FLOATS {
        let x = random(&[2, 4, 9, 8], 1, d);
        let w = random(&[6, 2, 3, 3], 2, d);
        let b = random(&[6], 3, d);
        for (stride, padding, dilation, bias) in [
            (vec![1], vec![0], vec![1], false),
            (vec![2, 1], vec![1], vec![1, 2], true),
        ] {
            let k = Kernel::Convolution {
                stride,
                padding,
                dilation,
                groups: 2,
                bias,
            };
            let ins = if bias {
                vec![x.clone(), w.clone(), b.clone()]
            } else {
                vec![x.clone(), w.clone()]
            };
            check(&g, &k, &ins, &format!("{k:?}"));
        }
        let x1 = random(&[2, 3, 17], 4, d);
        let w1 = random(&[5, 3, 4], 5, d);
        let k1 = Kernel::Convolution {
            stride: vec![2],
            padding: vec![2],
            dilation: vec![1],
            groups: 1,
            bias: false,
        };
        check(&g, &k1, &[x1, w1], "conv1d");
        for ceil_mode in [false, true] {
            let k = Kernel::MaxPool2d {
                kernel: vec![3],
                stride: vec![2],
                padding: vec![1],
                dilation: vec![1],
                ceil_mode,
            };
            check(&g, &k, std::slice::from_ref(&x), &format!("{k:?}"));
        }
        let idx = pool_indices(d, &[2, 4, 9, 8]);
        let grad = random(idx.shape(), 6, d);
        check(
            &g,
            &Kernel::MaxPool2dBackward,
            &[grad, x.clone(), idx],
            "max_pool2d_backward",
        );
        let table = random(&[10, 7], 7, d);
        let ids = Tensor::from_i64(vec![2, 5], vec![0, 3, 9, 3, 1, 2, 2, 2, 8, 0]);
        check(&g, &Kernel::Embedding, &[ids.clone(), table], "embedding");
        let grad = random(&[2, 5, 7], 8, d);
        for (padding_idx, scale_grad_by_freq) in [(-1, false), (2, true)] {
            let k = Kernel::EmbeddingBackward {
                num_weights: 10,
                padding_idx,
                scale_grad_by_freq,
            };
            check(&g, &k, &[grad.clone(), ids.clone()], &format!("{k:?}"));
        }
        // an index out of range is an error, as on the CPU
        let bad = g.upload(&Tensor::from_i64(vec![1], vec![10])).unwrap();
        let t = g.upload(&random(&[10, 7], 7, d)).unwrap();
        assert!(g
            .run(
                &Kernel::Embedding,
                &[Input::Tensor(&bad), Input::Tensor(&t)]
            )
            .is_err());
    }
}

#[test]
fn var_mean_is_block_level_and_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    for d in FLOATS {
        let x = random(&[3, 5, 40, 7], 9, d);
        for (dims, correction, keepdim) in [
            (Some(vec![-1]), 0.0, false),
            (Some(vec![0, 2, 3]), 1.0, true),
            (None, 1.0, false),
        ] {
            for std in [false, true] {
                let k = Kernel::Var {
                    dims: dims.clone(),
                    correction,
                    keepdim,
                    std,
                };
                check(&g, &k, std::slice::from_ref(&x), &format!("{k:?}"));
            }
            let k = Kernel::VarMean {
                dims,
                correction,
                keepdim,
            };
            check(&g, &k, std::slice::from_ref(&x), &format!("{k:?}"));
        }
        // a row far longer than a block
        let long = random(&[2, 100_000], 10, d);
        let k = Kernel::VarMean {
            dims: Some(vec![1]),
            correction: 1.0,
            keepdim: false,
        };
        check(&g, &k, &[long], "var_mean over 100000");
    }
}

#[test]
fn layout_ops_match_the_cpu_in_every_dtype() {
    let Some(g) = gpu() else { return };
    for d in [DType::F32, DType::BF16, DType::F16, DType::I64, DType::Bool] {
        let x = random(&[2, 3, 4], 12, DType::F32).to_dtype(d).unwrap();
        let one = |k: Kernel| check(&g, &k, std::slice::from_ref(&x), &format!("{k:?} {d}"));
        one(Kernel::Pad {
            value: 2.0,
            config: vec![(1, 0, 0), (-1, 2, 1), (0, 1, 2)],
        });
        one(Kernel::Slice {
            start: vec![0, 1, 1],
            end: vec![2, 3, 4],
            step: vec![1, 1, 2],
        });
        one(Kernel::Split {
            sizes: vec![1, 2],
            dim: 1,
        });
        one(Kernel::Flip(vec![0, -1]));
        one(Kernel::Squeeze(None));
        one(Kernel::Unsqueeze(-1));
        one(Kernel::Permute(vec![2, 0, 1]));
        let col = random(&[3, 1], 13, DType::F32).to_dtype(d).unwrap();
        check(&g, &Kernel::Expand(vec![2, -1, 4]), &[col], "expand");
        let y = random(&[2, 1, 4], 14, DType::F32).to_dtype(d).unwrap();
        check(&g, &Kernel::Cat { dim: 1 }, &[x.clone(), y], "cat");
        let dst = Tensor::zeros(vec![2, 3, 4], DType::F32).unwrap();
        check(&g, &Kernel::Copy, &[x.clone(), dst], "copy_");
        for to in [DType::F32, DType::BF16, DType::F16, DType::I64, DType::Bool] {
            one(Kernel::Convert(to));
        }
        let full = Kernel::Full {
            shape: vec![3, 2],
            value: -1.5,
            dtype: d,
        };
        check(&g, &full, &[], "full");
        let ar = Kernel::Arange {
            start: 1.0,
            end: 9.0,
            step: 0.7,
            dtype: d,
        };
        check(&g, &ar, &[], "arange");
    }
}

#[test]
fn comparisons_where_silu_and_integer_ops_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let ints = Tensor::from_i64(vec![2, 3], vec![-3, 0, 2, 7, -1, 4]);
    let row = Tensor::from_i64(vec![3], vec![2, 0, -2]);
    for d in [DType::F32, DType::BF16, DType::F16, DType::I64] {
        let a = random(&[2, 3], 15, DType::F32).to_dtype(d).unwrap();
        let b = random(&[3], 16, DType::F32).to_dtype(d).unwrap();
        for op in [
            CompareOp::Lt,
            CompareOp::Le,
            CompareOp::Gt,
            CompareOp::Ge,
            CompareOp::Eq,
            CompareOp::Ne,
        ] {
            let k = Kernel::Compare {
                op,
                a: Side::Input(0),
                b: Side::Input(1),
            };
            check(&g, &k, &[a.clone(), b.clone()], &format!("{op:?} {d}"));
            let ks = Kernel::Compare {
                op,
                a: Side::Input(0),
                b: Side::Scalar(0.5),
            };
            check(
                &g,
                &ks,
                std::slice::from_ref(&a),
                &format!("{op:?} 0.5 {d}"),
            );
        }
        let cond = Tensor::from_bool(vec![2, 1], vec![true, false]);
        let k = Kernel::Where {
            a: Side::Input(1),
            b: Side::Scalar(-2.0),
            dtype: d,
        };
        check(&g, &k, &[cond, a], &format!("where {d}"));
    }
    for d in FLOATS {
        check(&g, &Kernel::Silu, &[random(&[4, 33], 17, d)], "silu");
        // an integer tensor and a float tensor promote to the float
        let k = Kernel::Binary {
            op: BinaryOp::Mul,
            a: Side::Input(0),
            b: Side::Input(1),
            alpha: 1.0,
        };
        check(
            &g,
            &k,
            &[ints.clone(), random(&[2, 3], 18, d)],
            "i64 * float",
        );
    }
    // a reduction to another dtype accumulates in f32 and rounds once, as on the CPU
    for (from, to) in [(DType::BF16, DType::F32), (DType::F32, DType::BF16)] {
        let k = Kernel::Reduce {
            op: ReduceOp::Sum,
            dims: vec![1],
            keepdim: false,
            dtype: to,
        };
        check(
            &g,
            &k,
            &[random(&[3, 500], 19, from)],
            "sum to another dtype",
        );
    }
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Pow,
        BinaryOp::Div,
    ] {
        let k = Kernel::Binary {
            op,
            a: Side::Input(0),
            b: Side::Input(1),
            alpha: if op == BinaryOp::Add { 3.0 } else { 1.0 },
        };
        let rhs = if op == BinaryOp::Pow {
            Tensor::from_i64(vec![3], vec![2, 0, 3])
        } else {
            row.clone()
        };
        check(&g, &k, &[ints.clone(), rhs], &format!("i64 {op:?}"));
    }
}

#[test]
fn uniform_on_the_gpu_is_the_cpus_stream() {
    let Some(g) = gpu() else { return };
    let key = RngKey {
        seed: 42,
        rank: 1,
        step: 3,
        node: 9,
    };
    for d in FLOATS {
        let want = uniform(&[7, 301], -1.0, 3.0, d, key).unwrap();
        let got = g
            .download(&g.uniform(&[7, 301], -1.0, 3.0, d, key).unwrap())
            .unwrap();
        assert!(got.bitwise_eq(&want), "uniform in {d}");
    }
}

#[test]
fn cross_entropy_backward_ops_match_the_cpu() {
    let Some(g) = gpu() else { return };
    for d in FLOATS {
        // take_along_dim: along a dim with broadcasting both ways and negative indices, and
        // over the flattened input
        let a = random(&[3, 1, 50], 20, d);
        let idx = Tensor::from_i64(
            vec![3, 4, 2],
            vec![
                0, 49, -1, -50, 7, 3, 12, 48, 0, 1, 2, 3, 4, 5, 6, 7, -8, -9, 10, 11, 12, 13, 14,
                15,
            ],
        );
        check(
            &g,
            &Kernel::TakeAlongDim { dim: Some(2) },
            &[a.clone(), idx],
            &format!("take_along_dim {d}"),
        );
        let flat = Tensor::from_i64(vec![2, 2], vec![149, 0, -150, 77]);
        check(
            &g,
            &Kernel::TakeAlongDim { dim: None },
            &[a.clone(), flat],
            &format!("take_along_dim flat {d}"),
        );
        // an index out of range is an error, as on the CPU
        let bad = g
            .upload(&Tensor::from_i64(vec![3, 1, 1], vec![0, 50, 0]))
            .unwrap();
        let da = g.upload(&a).unwrap();
        assert!(g
            .run(
                &Kernel::TakeAlongDim { dim: Some(2) },
                &[Input::Tensor(&da), Input::Tensor(&bad)]
            )
            .is_err());

        // nll_loss_backward over [N, C] and [N, C, d], every reduction, with and without
        // class weights, with ignored targets
        for (ish, tsh, tv) in [
            (vec![6, 37], vec![6], vec![3, -100, 36, 0, 17, 3]),
            (vec![2, 5, 3], vec![2, 3], vec![4, 0, -100, 2, 2, 1]),
        ] {
            let input = random(&ish, 21, d);
            let target = Tensor::from_i64(tsh.clone(), tv);
            let weight = random(&[ish[1]], 22, d);
            let tw = Tensor::from_f32(vec![], vec![4.0]).to_dtype(d).unwrap();
            for reduction in [LossReduction::Mean, LossReduction::Sum, LossReduction::None] {
                let grad = if reduction == LossReduction::None {
                    random(&tsh, 23, d)
                } else {
                    random(&[], 24, d)
                };
                for weighted in [false, true] {
                    let k = Kernel::NllLossBackward {
                        reduction,
                        ignore_index: -100,
                        weighted,
                    };
                    let mut ins = vec![grad.clone(), input.clone(), target.clone(), tw.clone()];
                    if weighted {
                        ins.push(weight.clone());
                    }
                    check(&g, &k, &ins, &format!("{k:?} {ish:?} {d}"));
                }
            }
        }
        // a total_weight given as an i64 count, as the CPU test gives it
        let k = Kernel::NllLossBackward {
            reduction: LossReduction::Mean,
            ignore_index: -100,
            weighted: false,
        };
        check(
            &g,
            &k,
            &[
                random(&[], 25, d),
                random(&[3, 4], 26, d),
                Tensor::from_i64(vec![3], vec![1, -100, 3]),
                Tensor::from_i64(vec![], vec![2]),
            ],
            &format!("nll_loss_backward i64 total_weight {d}"),
        );
        let bad_t = [
            g.upload(&random(&[], 25, d)).unwrap(),
            g.upload(&random(&[3, 4], 26, d)).unwrap(),
            g.upload(&Tensor::from_i64(vec![3], vec![1, 4, 3])).unwrap(),
            g.upload(&Tensor::from_i64(vec![], vec![2])).unwrap(),
        ];
        let ins: Vec<Input<'_, _>> = bad_t.iter().map(Input::Tensor).collect();
        assert!(
            g.run(&k, &ins).is_err(),
            "a target out of range is an error"
        );

        // softmax backward: rows along the last, a middle and the first dim; a row far longer
        // than a block; the result in another dtype
        for log in [false, true] {
            for (shape, dim) in [
                (vec![4, 300], 1),
                (vec![3, 7, 5], 1),
                (vec![9, 6], 0),
                (vec![2, 20_000], 1),
            ] {
                let x = random(&shape, 27, DType::F32);
                let sm = Kernel::Softmax { dim, log };
                let y = CpuBackend
                    .run(&sm, &[Input::Tensor(&x)])
                    .unwrap()
                    .to_dtype(d)
                    .unwrap();
                let grad = random(&shape, 28, d);
                for dtype in [d, DType::F32] {
                    let k = Kernel::SoftmaxBackward { dim, log, dtype };
                    check(
                        &g,
                        &k,
                        &[grad.clone(), y.clone()],
                        &format!("{k:?} {shape:?} from {d}"),
                    );
                }
            }
        }
    }
}

#[test]
fn integer_and_bool_sums_and_maxima_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let mask = Tensor::from_bool(vec![3, 700], (0..2100).map(|i| (i * 7) % 3 == 0).collect());
    let ints = Tensor::from_i64(
        vec![3, 700],
        (0..2100i64).map(|i| (i * 7919) % 1001 - 500).collect(),
    );
    let floats = random(&[3, 700], 29, DType::F32);
    for (x, what) in [(mask, "bool"), (ints, "i64"), (floats, "f32")] {
        for op in [
            ReduceOp::Sum,
            ReduceOp::Amax,
            ReduceOp::Amin,
            ReduceOp::Prod,
        ] {
            for (dims, keepdim) in [(vec![1], false), (vec![0, 1], false), (vec![0], true)] {
                let k = Kernel::Reduce {
                    op,
                    dims,
                    keepdim,
                    dtype: DType::I64,
                };
                check(
                    &g,
                    &k,
                    std::slice::from_ref(&x),
                    &format!("{k:?} of {what}"),
                );
            }
        }
        // a mean into i64 is refused, as on the CPU
        let k = Kernel::Reduce {
            op: ReduceOp::Mean,
            dims: vec![1],
            keepdim: false,
            dtype: DType::I64,
        };
        let dx = g.upload(&x).unwrap();
        assert!(g.run(&k, &[Input::Tensor(&dx)]).is_err());
    }
}

#[test]
fn transposed_convolution_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    for d in FLOATS {
        let x = random(&[2, 4, 5, 6], 21, d);
        let w = random(&[4, 3, 3, 2], 22, d);
        let b = random(&[6], 23, d);
        let k = Kernel::ConvTranspose {
            stride: vec![2, 3],
            padding: vec![1, 0],
            output_padding: vec![1, 2],
            dilation: vec![1],
            groups: 2,
            bias: true,
        };
        check(&g, &k, &[x, w, b], "conv_transpose2d");
        // its gradients (Thunder's conv_transpose2d_vjp), all three and the weight's alone
        let x = random(&[2, 4, 5, 6], 24, d);
        let w = random(&[4, 3, 3, 2], 25, d);
        let gy = random(&[2, 6, 10, 19], 26, d);
        for outputs in [
            tracepass_runtime::exec::VjpOutputs {
                input: true,
                weight: true,
                bias: true,
            },
            tracepass_runtime::exec::VjpOutputs {
                input: false,
                weight: true,
                bias: false,
            },
        ] {
            let k = Kernel::ConvTransposeVjp {
                stride: vec![2, 3],
                padding: vec![1, 0],
                output_padding: vec![1, 2],
                dilation: vec![1],
                groups: 2,
                outputs,
            };
            check(
                &g,
                &k,
                &[x.clone(), w.clone(), gy.clone()],
                "conv_transpose2d_vjp",
            );
        }
    }
}

#[test]
fn parametrized_activations_match_the_cpu() {
    use tracepass_runtime::exec::Activation;
    let Some(g) = gpu() else { return };
    for d in FLOATS {
        let mut x = random(&[3, 50], 31, d).to_f32_vec();
        x.iter_mut().for_each(|v| *v *= 4.0);
        x[0] = f32::NAN;
        let x = Tensor::from_f32(vec![3, 50], x).to_dtype(d).unwrap();
        for act in [
            Activation::LeakyRelu { slope: 0.2 },
            Activation::Elu { alpha: 0.7 },
            Activation::Celu { alpha: 1.3 },
            Activation::Hardtanh {
                min: -1.5,
                max: 2.0,
            },
        ] {
            check(
                &g,
                &Kernel::Activation(act),
                std::slice::from_ref(&x),
                &format!("{act:?}"),
            );
        }
    }
}

#[test]
fn cumsum_and_arg_extrema_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let ints = Tensor::from_i64(
        vec![3, 40, 5],
        (0..600i64).map(|i| (i * 7919) % 101 - 50).collect(),
    );
    for d in FLOATS {
        let x = random(&[3, 40, 5], 41, d);
        for dim in [0, 1, 2] {
            check(
                &g,
                &Kernel::Cumsum { dim, dtype: d },
                std::slice::from_ref(&x),
                "cumsum",
            );
            for max in [true, false] {
                for keepdim in [false, true] {
                    let k = Kernel::ArgExtremum {
                        max,
                        dim: Some(dim),
                        keepdim,
                    };
                    check(&g, &k, std::slice::from_ref(&x), &format!("{k:?} in {d}"));
                    check(
                        &g,
                        &k,
                        std::slice::from_ref(&ints),
                        &format!("{k:?} of i64"),
                    );
                }
            }
        }
        let k = Kernel::ArgExtremum {
            max: true,
            dim: None,
            keepdim: false,
        };
        check(&g, &k, std::slice::from_ref(&x), "flattened argmax");
        // integers cumsum in i64, or cast to a float dtype first
        check(
            &g,
            &Kernel::Cumsum {
                dim: 1,
                dtype: DType::I64,
            },
            std::slice::from_ref(&ints),
            "i64 cumsum",
        );
        check(
            &g,
            &Kernel::Cumsum { dim: 1, dtype: d },
            std::slice::from_ref(&ints),
            "cast cumsum",
        );
    }
}

#[test]
fn logical_and_bitwise_ops_match_the_cpu() {
    use tracepass_runtime::exec::BitOp;
    let Some(g) = gpu() else { return };
    let ints = Tensor::from_i64(
        vec![4, 30],
        (0..120i64).map(|i| (i * 37) % 19 - 9).collect(),
    );
    let row = Tensor::from_i64(vec![30], (0..30i64).map(|i| i * 5 - 60).collect());
    let mask = Tensor::from_bool(vec![4, 30], (0..120).map(|i| i % 3 == 0).collect());
    let floats = random(&[4, 30], 43, DType::F32);
    for op in [BitOp::And, BitOp::Or, BitOp::Xor] {
        let k = |logical, dtype, b| Kernel::Bitwise {
            op,
            a: Side::Input(0),
            b,
            logical,
            dtype,
        };
        let two = Side::Input(1);
        check(
            &g,
            &k(false, DType::I64, two),
            &[ints.clone(), row.clone()],
            "bitwise i64",
        );
        check(
            &g,
            &k(false, DType::I64, Side::Scalar(6.0)),
            std::slice::from_ref(&ints),
            "bitwise number",
        );
        check(
            &g,
            &k(false, DType::Bool, two),
            &[mask.clone(), mask.clone()],
            "bitwise bool",
        );
        check(
            &g,
            &k(true, DType::Bool, two),
            &[floats.clone(), ints.clone()],
            "logical",
        );
        check(
            &g,
            &k(true, DType::Bool, Side::Scalar(0.0)),
            std::slice::from_ref(&mask),
            "logical number",
        );
    }
    check(&g, &Kernel::BitwiseNot, &[ints], "not i64");
    check(&g, &Kernel::BitwiseNot, &[mask], "not bool");
}

#[test]
fn adaptive_avg_pooling_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    for d in FLOATS {
        let x = random(&[2, 3, 7, 10], 47, d);
        for (oh, ow) in [(3, 4), (5, 3), (7, 10), (1, 6)] {
            check(
                &g,
                &Kernel::AdaptiveAvgPool2d { oh, ow },
                std::slice::from_ref(&x),
                "pool",
            );
            let grad = random(&[2, 3, oh, ow], 48, d);
            check(
                &g,
                &Kernel::AdaptiveAvgPool2dBackward,
                &[grad, x.clone()],
                &format!("pool backward to {oh}x{ow}"),
            );
        }
    }
}

#[test]
fn normal_on_the_gpu_follows_the_cpus_stream() {
    let Some(g) = gpu() else { return };
    let key = RngKey {
        seed: 42,
        rank: 1,
        step: 3,
        node: 11,
    };
    for d in FLOATS {
        let want = tracepass_runtime::cpu::kernels::normal(&[7, 301], d, key).unwrap();
        let got = g.download(&g.normal(&[7, 301], d, key).unwrap()).unwrap();
        // the same words, f32 logarithm and cosine on the device: agreement to rounding
        for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            assert!(
                (a - b).abs() <= tol(d) * b.abs().max(1.0),
                "{d} element {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn floor_divide_remainder_and_fmod_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let ints = Tensor::from_i64(
        vec![4, 25],
        (0..100i64).map(|i| (i * 37) % 41 - 20).collect(),
    );
    let divisors = Tensor::from_i64(
        vec![25],
        (0..25i64)
            .map(|i| if i < 12 { i - 13 } else { i - 11 })
            .collect(),
    );
    for op in [BinaryOp::FloorDivide, BinaryOp::Remainder, BinaryOp::Fmod] {
        let k = |b| Kernel::Binary {
            op,
            a: Side::Input(0),
            b,
            alpha: 1.0,
        };
        check(
            &g,
            &k(Side::Input(1)),
            &[ints.clone(), divisors.clone()],
            &format!("i64 {op:?}"),
        );
        check(
            &g,
            &k(Side::Scalar(-3.0)),
            std::slice::from_ref(&ints),
            &format!("i64 {op:?} -3"),
        );
        for d in FLOATS {
            let x = random(&[4, 25], 53, d);
            let y = random(&[25], 54, d);
            check(
                &g,
                &k(Side::Input(1)),
                &[x.clone(), y],
                &format!("{op:?} in {d}"),
            );
            check(
                &g,
                &k(Side::Scalar(0.3)),
                &[x],
                &format!("{op:?} by 0.3 in {d}"),
            );
        }
        // an integer division by zero is an error, as on the CPU
        let zero = Tensor::from_i64(vec![2], vec![1, 0]);
        let (da, db) = (g.upload(&zero).unwrap(), g.upload(&zero).unwrap());
        let e = g
            .run(
                &k(Side::Input(1)),
                &[Input::Tensor(&da), Input::Tensor(&db)],
            )
            .unwrap_err();
        assert!(e.0.contains("ZeroDivisionError"), "{}", e.0);
    }
}

#[test]
fn stack_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    for d in [DType::F32, DType::BF16, DType::I64, DType::Bool] {
        let (x, y) = (random(&[3, 4, 5], 61, d), random(&[3, 4, 5], 62, d));
        for dim in [0, 2, -1, 3] {
            check(
                &g,
                &Kernel::Stack { dim },
                &[x.clone(), y.clone()],
                &format!("stack {dim} {d}"),
            );
        }
    }
}

#[test]
fn triangles_one_hot_pixel_shuffle_and_roll_match_the_cpu() {
    let Some(g) = gpu() else { return };
    for d in FLOATS {
        let x = random(&[2, 8, 4, 6], 41, d);
        for k in [
            Kernel::Triangle {
                upper: true,
                diagonal: 1,
                fill: 0.0,
            },
            Kernel::Triangle {
                upper: false,
                diagonal: -1,
                fill: -2.0,
            },
            Kernel::PixelShuffle {
                factor: 2,
                inverse: false,
            },
            Kernel::PixelShuffle {
                factor: 2,
                inverse: true,
            },
            Kernel::Roll {
                shifts: vec![1, -3],
                dims: Some(vec![2, 3]),
            },
            Kernel::Roll {
                shifts: vec![5],
                dims: None,
            },
        ] {
            check(&g, &k, std::slice::from_ref(&x), &format!("{k:?}"));
        }
    }
    let mask = Tensor::from_f32(vec![4, 4], vec![1.0; 16])
        .to_dtype(DType::Bool)
        .unwrap();
    let upper = Kernel::Triangle {
        upper: true,
        diagonal: 1,
        fill: 0.0,
    };
    check(&g, &upper, &[mask], "triu of a bool mask");
    for d in FLOATS {
        let x = random(&[2, 3, 7], 42, d);
        let gy = random(&[2, 3, 3], 43, d);
        let k = Kernel::AdaptiveAvgPool1d { out: 3 };
        check(&g, &k, std::slice::from_ref(&x), "adaptive_avg_pool1d");
        let k = Kernel::AdaptiveAvgPool1dBackward;
        check(&g, &k, &[gy, x], "adaptive_avg_pool1d backward");
    }
    let ints = Tensor::from_i64(vec![5], vec![-3, 0, 5, i64::MIN, i64::MAX]);
    for op in [
        tracepass_runtime::exec::UnaryOp::Neg,
        tracepass_runtime::exec::UnaryOp::Abs,
        tracepass_runtime::exec::UnaryOp::Sign,
    ] {
        check(
            &g,
            &Kernel::Unary(op),
            std::slice::from_ref(&ints),
            &format!("{op:?} of i64"),
        );
    }
    let idx = Tensor::from_i64(vec![2, 3], vec![0, 4, 2, 2, 1, 0]);
    check(
        &g,
        &Kernel::OneHot { classes: 5 },
        std::slice::from_ref(&idx),
        "one_hot",
    );
    let dev = g.upload(&idx).unwrap();
    assert!(g
        .run(&Kernel::OneHot { classes: 4 }, &[Input::Tensor(&dev)])
        .is_err());
}

/// Runs `k` on both backends and asks for the same bits in every output (the indexing kernels
/// copy, or add in the CPU's order; sorts are stable on both).
fn check_exact(g: &CudaBackend, k: &Kernel, inputs: &[Tensor], what: &str) {
    let cpu_in: Vec<Input<'_, Tensor>> = inputs.iter().map(Input::Tensor).collect();
    let want = CpuBackend
        .run_multi(k, &cpu_in)
        .unwrap_or_else(|e| panic!("{what} on the cpu: {}", e.0));
    let dev: Vec<_> = inputs.iter().map(|t| g.upload(t).unwrap()).collect();
    let dev_in: Vec<Input<'_, _>> = dev.iter().map(Input::Tensor).collect();
    let got = g
        .run_multi(k, &dev_in)
        .unwrap_or_else(|e| panic!("{what}: {}", e.0));
    assert_eq!(got.len(), want.len(), "{what}: outputs");
    for (i, (gt, w)) in got.iter().zip(&want).enumerate() {
        let gt = g.download(gt).unwrap();
        assert!(
            gt.bitwise_eq(w),
            "{what} output {i}: the gpu gives {:?}, the cpu {:?}",
            gt.to_f64_vec(),
            w.to_f64_vec()
        );
    }
}

/// Random values in `d`; i64 ones spread over -100..100 (not truncated to 0).
fn operand(shape: &[usize], seed: u64, d: DType) -> Tensor {
    if d != DType::I64 {
        return random(shape, seed, d);
    }
    let v = random(shape, seed, DType::F64).to_f64_vec();
    Tensor::from_f64(shape, v.iter().map(|x| x * 100.0).collect())
        .to_dtype(DType::I64)
        .unwrap()
}

/// (input shape, index shape, src shape, dim) of a gather or scatter_add.
type GatherCase = (&'static [usize], &'static [usize], &'static [usize], usize);

/// Indices in `0..size` with repeats.
fn repeating(shape: &[usize], size: usize, seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_i64(
        shape,
        (0..n).map(|k| ((k * 7 + seed) % size) as i64).collect(),
    )
}

#[test]
fn gather_scatter_add_index_select_and_index_add_give_the_cpus_bits() {
    let Some(g) = gpu() else { return };
    let cases: &[GatherCase] = &[
        (&[4, 16], &[4, 8], &[4, 8], 1),
        (&[3, 4], &[2, 9], &[3, 10], 1),
        (&[5, 2, 3], &[7, 2, 2], &[7, 3, 2], 0),
        (&[2, 3, 4], &[1, 2, 6], &[2, 2, 6], 2),
        (&[64, 33], &[64, 200], &[64, 200], 1),
        (&[], &[], &[], 0),
    ];
    for (c, &(ash, ish, ssh, dim)) in cases.iter().enumerate() {
        let size = ash.get(dim).copied().unwrap_or(1);
        let idx = repeating(ish, size, c);
        for d in [DType::F32, DType::BF16, DType::F16, DType::I64] {
            let a = operand(ash, 71 + c as u64, d);
            let src = operand(ssh, 81 + c as u64, d);
            let what = format!("{ash:?} by {ish:?} along {dim} in {d}");
            check_exact(
                &g,
                &Kernel::Gather { dim },
                &[a.clone(), idx.clone()],
                &what,
            );
            check_exact(
                &g,
                &Kernel::ScatterAdd { dim },
                &[a, idx.clone(), src],
                &what,
            );
        }
    }
    for (c, &(ash, m, dim)) in [
        (&[32usize, 16][..], Some(16usize), 0usize),
        (&[3, 5, 4], Some(7), 1),
        (&[3, 5, 4], None, 2),
        (&[50, 64], Some(300), 0),
    ]
    .iter()
    .enumerate()
    {
        let ish: Vec<usize> = m.map_or(vec![], |n| vec![n]);
        let idx = repeating(&ish, ash[dim], c);
        let mut ssh = ash.to_vec();
        ssh[dim] = m.unwrap_or(1);
        for d in [DType::F32, DType::BF16, DType::F16, DType::I64] {
            let a = operand(ash, 91 + c as u64, d);
            let src = operand(&ssh, 101 + c as u64, d);
            let what = format!("{ash:?} by {ish:?} along {dim} in {d}");
            let k = Kernel::IndexSelect { dim };
            check_exact(&g, &k, &[a.clone(), idx.clone()], &what);
            let k = Kernel::IndexAdd { dim };
            check_exact(&g, &k, &[a, idx.clone(), src], &what);
        }
    }
    // an index out of range: the CPU's error, naming it
    let a = random(&[3, 4], 1, DType::F32);
    let bad = Tensor::from_i64(vec![1, 3], vec![0, 4, -1]);
    let dev = [g.upload(&a).unwrap(), g.upload(&bad).unwrap()];
    let e = g
        .run(
            &Kernel::Gather { dim: 1 },
            &[Input::Tensor(&dev[0]), Input::Tensor(&dev[1])],
        )
        .unwrap_err();
    assert_eq!(
        e.0,
        "gather: index 4 is out of bounds for dimension 1 with size 4"
    );
}

#[test]
fn sort_argsort_and_topk_give_the_cpus_order() {
    let Some(g) = gpu() else { return };
    for d in [DType::F32, DType::BF16, DType::F16, DType::I64] {
        // ties (quarters, -0.0 and 0.0) and NaNs
        let v: Vec<f64> = random(&[6, 40, 3], 111, DType::F64)
            .to_f64_vec()
            .iter()
            .enumerate()
            .map(|(k, x)| match k % 13 {
                4 => f64::NAN,
                6 => -0.0,
                8 => 0.0,
                _ => (x * 4.0).round(),
            })
            .map(|x| {
                if d == DType::I64 && x.is_nan() {
                    9.0
                } else {
                    x
                }
            })
            .collect();
        let x = Tensor::from_f64(vec![6, 40, 3], v).to_dtype(d).unwrap();
        for dim in [0, 1, 2] {
            for descending in [false, true] {
                let what = format!("sort along {dim} in {d}, descending {descending}");
                let k = Kernel::Sort { dim, descending };
                check_exact(&g, &k, std::slice::from_ref(&x), &what);
                let k = Kernel::Argsort { dim, descending };
                check_exact(&g, &k, std::slice::from_ref(&x), &what);
            }
            let len = [6, 40, 3][dim];
            for k in [0, 1, len.min(4), len] {
                for largest in [true, false] {
                    let kernel = Kernel::Topk { k, dim, largest };
                    let what = format!("{kernel:?} in {d}");
                    check_exact(&g, &kernel, std::slice::from_ref(&x), &what);
                }
            }
        }
    }
}

/// i32 tensors (HF models' position ids: `Tensor.int()`, then adds, products and casts) are
/// storage on the GPU: their arithmetic runs in i64 and is cast back. That must give the CPU's
/// bits, wrapping at i32's range included.
#[test]
fn i32_tensors_run_as_the_cpu_runs_them() {
    let Some(g) = gpu() else { return };
    // spread over i32's range, with values near its ends so that sums and products wrap
    let wide: Vec<i64> = (0..60i64)
        .map(|i| match i % 4 {
            0 => i32::MAX as i64 - i,
            1 => i32::MIN as i64 + i,
            _ => (i * 7919) % 201 - 100,
        })
        .collect();
    let a = Tensor::from_i64(vec![3, 20], wide)
        .to_dtype(DType::I32)
        .unwrap();
    let b = Tensor::from_i64(vec![3, 20], (0..60i64).map(|i| (i * 37) % 19 - 9).collect())
        .to_dtype(DType::I32)
        .unwrap();
    let mask = Tensor::from_bool(vec![3, 20], (0..60).map(|i| i % 3 != 0).collect());
    let big = Tensor::from_i64(vec![4], vec![1 << 40, -(1 << 33) - 5, 7, -7]);
    let floats = Tensor::from_f32(vec![5], vec![3.7, -2.5, 3e9, -1e12, f32::NAN]);
    // conversions: bool, i64 past i32's range (wraps), floats (truncate through i64)
    for (x, what) in [(&mask, "bool"), (&big, "i64"), (&floats, "f32")] {
        check_exact(
            &g,
            &Kernel::Convert(DType::I32),
            std::slice::from_ref(x),
            what,
        );
    }
    for to in [DType::I64, DType::F32, DType::BF16, DType::Bool] {
        check_exact(
            &g,
            &Kernel::Convert(to),
            std::slice::from_ref(&a),
            "from i32",
        );
    }
    for op in [
        BinaryOp::Add,
        BinaryOp::Mul,
        BinaryOp::Sub,
        BinaryOp::Maximum,
    ] {
        let k = Kernel::Binary {
            op,
            a: Side::Input(0),
            b: Side::Input(1),
            alpha: 1.0,
        };
        check_exact(&g, &k, &[a.clone(), b.clone()], &format!("{op:?}"));
        check_exact(
            &g,
            &k,
            &[a.clone(), mask.clone()],
            &format!("{op:?} with bool"),
        );
    }
    let plus_number = Kernel::Binary {
        op: BinaryOp::Add,
        a: Side::Input(0),
        b: Side::Scalar(3.0),
        alpha: 1.0,
    };
    check_exact(&g, &plus_number, std::slice::from_ref(&a), "add a number");
    for dtype in [DType::I32, DType::I64] {
        let k = Kernel::Cumsum { dim: 1, dtype };
        check_exact(&g, &k, std::slice::from_ref(&a), "cumsum");
        let k = Kernel::Reduce {
            op: ReduceOp::Sum,
            dims: vec![1],
            keepdim: false,
            dtype,
        };
        check_exact(&g, &k, std::slice::from_ref(&a), "sum");
    }
    let k = Kernel::Compare {
        op: CompareOp::Lt,
        a: Side::Input(0),
        b: Side::Input(1),
    };
    check_exact(&g, &k, &[a.clone(), b.clone()], "lt");
    let k = Kernel::ArgExtremum {
        max: true,
        dim: Some(1),
        keepdim: false,
    };
    check_exact(&g, &k, std::slice::from_ref(&a), "argmax");
    let k = Kernel::Sort {
        dim: 1,
        descending: true,
    };
    check_exact(&g, &k, std::slice::from_ref(&b), "sort");
    check_exact(
        &g,
        &Kernel::BitwiseNot,
        std::slice::from_ref(&a),
        "bitwise_not",
    );
    check_exact(
        &g,
        &Kernel::Permute(vec![1, 0]),
        std::slice::from_ref(&a),
        "permute",
    );
    // past i32's range arange wraps, as in PyTorch
    let ar = Kernel::Arange {
        start: 2147483640.0,
        end: 2147483660.0,
        step: 3.0,
        dtype: DType::I32,
    };
    check_exact(&g, &ar, &[], "arange");
}
