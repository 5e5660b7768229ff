//! Transposed convolution (`conv_transpose1d/2d/3d`, `torch.convolution(transposed=True)`)
//! against its definition, summed directly in f64: every input element scatters
//! `x[n, ci, i] * w[ci, co, k]` to output position `i * stride - padding + k * dilation`.

use tracepass_ir::{parse_trace, DType};
use tracepass_runtime::comm::{CommOptions, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{
    Backend, Clock, Executor, Input, Kernel, Plan, RValue, Recording, VjpOutputs,
};
use tracepass_runtime::tensor::Tensor;

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

struct Case {
    x: Vec<usize>,
    w: Vec<usize>,
    stride: Vec<i64>,
    padding: Vec<i64>,
    output_padding: Vec<i64>,
    dilation: Vec<i64>,
    groups: usize,
    bias: bool,
}

/// The definition, with every parameter given per spatial dimension.
fn reference(c: &Case, x: &[f64], w: &[f64], b: &[f64]) -> (Vec<usize>, Vec<f64>) {
    let sp = c.w.len() - 2;
    let (cin, cog) = (c.w[0], c.w[1]);
    let cig = cin / c.groups;
    let mut out_shape = vec![c.x[0], cog * c.groups];
    for i in 0..sp {
        let (len, k) = (c.x[2 + i] as i64, c.w[2 + i] as i64);
        out_shape.push(
            ((len - 1) * c.stride[i] - 2 * c.padding[i]
                + c.dilation[i] * (k - 1)
                + c.output_padding[i]
                + 1) as usize,
        );
    }
    let (xs, ws, os) = (strides(&c.x), strides(&c.w), strides(&out_shape));
    let mut out = vec![0.0; out_shape.iter().product()];
    for (o, v) in out.iter_mut().enumerate() {
        *v = if c.bias {
            b[(o / os[1]) % out_shape[1]]
        } else {
            0.0
        };
    }
    let spatial_in: Vec<usize> = c.x[2..].to_vec();
    let taps: Vec<usize> = c.w[2..].to_vec();
    let count = |dims: &[usize]| dims.iter().product::<usize>();
    for n in 0..c.x[0] {
        for ci in 0..cin {
            let g = ci / cig;
            for co in 0..cog {
                for i in 0..count(&spatial_in) {
                    for k in 0..count(&taps) {
                        let (mut ii, mut kk, mut at) = (i, k, n * os[0] + (g * cog + co) * os[1]);
                        let (mut xi, mut wi) = (n * xs[0] + ci * xs[1], ci * ws[0] + co * ws[1]);
                        let mut inside = true;
                        for dim in (0..sp).rev() {
                            let (id, kd) = (ii % spatial_in[dim], kk % taps[dim]);
                            ii /= spatial_in[dim];
                            kk /= taps[dim];
                            xi += id * xs[2 + dim];
                            wi += kd * ws[2 + dim];
                            let pos = id as i64 * c.stride[dim] - c.padding[dim]
                                + kd as i64 * c.dilation[dim];
                            if pos < 0 || pos >= out_shape[2 + dim] as i64 {
                                inside = false;
                            } else {
                                at += pos as usize * os[2 + dim];
                            }
                        }
                        if inside {
                            out[at] += x[xi] * w[wi];
                        }
                    }
                }
            }
        }
    }
    (out_shape, out)
}

fn check(c: Case) {
    let (nx, nw, nb) = (
        c.x.iter().product(),
        c.w.iter().product(),
        c.w[1] * c.groups,
    );
    let (x, w, b) = (values(nx, 1), values(nw, 2), values(nb, 3));
    let (shape, want) = reference(&c, &x, &w, &b);
    for dtype in [DType::F64, DType::F32] {
        let t = |shape: &[usize], v: &[f64]| {
            Tensor::from_f64(shape, v.to_vec()).to_dtype(dtype).unwrap()
        };
        let (tx, tw, tb) = (t(&c.x, &x), t(&c.w, &w), t(&[nb], &b));
        let k = Kernel::ConvTranspose {
            stride: c.stride.clone(),
            padding: c.padding.clone(),
            output_padding: c.output_padding.clone(),
            dilation: c.dilation.clone(),
            groups: c.groups as i64,
            bias: c.bias,
        };
        let mut inputs = vec![Input::Tensor(&tx), Input::Tensor(&tw)];
        if c.bias {
            inputs.push(Input::Tensor(&tb));
        }
        let got = CpuBackend
            .run(&k, &inputs)
            .unwrap_or_else(|e| panic!("{}", e.0));
        assert_eq!(got.shape(), &shape[..], "{dtype}");
        assert_eq!(got.dtype(), dtype);
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        for (i, (g, r)) in got.to_f64_vec().iter().zip(&want).enumerate() {
            assert!(
                (g - r).abs() <= tol * (1.0 + r.abs()),
                "{dtype} element {i}: {g} vs {r}"
            );
        }
    }
}

#[test]
fn one_dimension_with_stride_padding_and_output_padding() {
    check(Case {
        x: vec![2, 3, 5],
        w: vec![3, 4, 3],
        stride: vec![2],
        padding: vec![1],
        output_padding: vec![1],
        dilation: vec![1],
        groups: 1,
        bias: true,
    });
}

#[test]
fn two_dimensions_grouped_and_dilated_with_padding_past_the_kernel() {
    check(Case {
        x: vec![2, 4, 4, 3],
        w: vec![4, 3, 3, 2],
        stride: vec![3, 2],
        padding: vec![3, 1],
        output_padding: vec![0, 1],
        dilation: vec![2, 1],
        groups: 2,
        bias: false,
    });
}

#[test]
fn three_dimensions() {
    check(Case {
        x: vec![1, 2, 3, 2, 2],
        w: vec![2, 2, 2, 2, 2],
        stride: vec![2, 1, 2],
        padding: vec![0, 1, 0],
        output_padding: vec![1, 0, 0],
        dilation: vec![1, 1, 1],
        groups: 1,
        bias: true,
    });
}

#[test]
fn an_output_padding_no_stride_skips_is_refused() {
    let x = Tensor::from_f32(vec![1, 1, 3], vec![1.0; 3]);
    let w = Tensor::from_f32(vec![1, 1, 2], vec![1.0; 2]);
    let k = Kernel::ConvTranspose {
        stride: vec![1],
        padding: vec![0],
        output_padding: vec![1],
        dilation: vec![1],
        groups: 1,
        bias: false,
    };
    let e = CpuBackend
        .run(&k, &[Input::Tensor(&x), Input::Tensor(&w)])
        .unwrap_err();
    assert!(e.0.contains("output_padding 1"), "{}", e.0);
}

/// The statement Thunder printed for a U-Net's `ConvTranspose2d(8, 8, 2, stride=2)`, and the
/// same through `torch.convolution(transposed=True)`, planned and run.
#[test]
fn thunders_conv_transpose2d_statement_runs() {
    let text = r#"def computation(x, w, b):
  # x: "cpu f32[2, 8, 4, 4]"
  # w: "cpu f32[8, 8, 2, 2]"
  # b: "cpu f32[8]"
  t234 = torch.nn.functional.conv_transpose2d(x, w, b, (2, 2), (0, 0), (0, 0), 1, (1, 1))  # t234: "cpu f32[2, 8, 8, 8]"
  t235 = torch.convolution(x, w, b, [2, 2], [0, 0], [1, 1], True, [0, 0], 1)  # t235: "cpu f32[2, 8, 8, 8]"
  return (t234, t235)
"#;
    let t = parse_trace(text).unwrap_or_else(|e| panic!("{e}"));
    let results: Vec<_> = t.returned_values().into_iter().map(Some).collect();
    let plan = Plan::compile(&t, &results).unwrap_or_else(|e| panic!("{e}"));
    let g = ThreadGroup::new(1, CommOptions::default());
    let (x, w, b) = (values(2 * 8 * 16, 4), values(8 * 8 * 4, 5), values(8, 6));
    let tensors = [
        Tensor::from_f64(vec![2, 8, 4, 4], x.clone())
            .to_dtype(DType::F32)
            .unwrap(),
        Tensor::from_f64(vec![8, 8, 2, 2], w.clone())
            .to_dtype(DType::F32)
            .unwrap(),
        Tensor::from_f64(vec![8], b.clone())
            .to_dtype(DType::F32)
            .unwrap(),
    ];
    let out = Executor::<CpuBackend, _>::new()
        .run(
            &plan,
            &CpuBackend,
            &mut g.comm(0),
            tensors.into_iter().map(RValue::Tensor).collect(),
            &Clock::new(false),
            &mut Recording::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        x: vec![2, 8, 4, 4],
        w: vec![8, 8, 2, 2],
        stride: vec![2, 2],
        padding: vec![0, 0],
        output_padding: vec![0, 0],
        dilation: vec![1, 1],
        groups: 1,
        bias: true,
    };
    let (_, want) = reference(&case, &x, &w, &b);
    for v in out {
        let RValue::Tensor(t) = v else {
            panic!("not a tensor")
        };
        assert_eq!(t.shape(), &[2, 8, 8, 8]);
        for (g, r) in t.to_f64_vec().iter().zip(&want) {
            assert!((g - r).abs() <= 1e-5 * (1.0 + r.abs()), "{g} vs {r}");
        }
    }
}

/// The gradients of `<conv_transpose(x, w) + b, g>`, each from the definition: the output is
/// linear in `x` and in `w`, so the gradient of element `j` is the output of the basis
/// vector `e_j` (bias off) dotted with `g`; the bias's is `g` summed per channel.
fn reference_grads(c: &Case, x: &[f64], w: &[f64], g: &[f64]) -> [Vec<f64>; 3] {
    let unbiased = Case {
        bias: false,
        x: c.x.clone(),
        w: c.w.clone(),
        stride: c.stride.clone(),
        padding: c.padding.clone(),
        output_padding: c.output_padding.clone(),
        dilation: c.dilation.clone(),
        groups: c.groups,
    };
    let dot = |y: &[f64]| y.iter().zip(g).map(|(a, b)| a * b).sum::<f64>();
    let basis = |n: usize, j: usize| {
        let mut e = vec![0.0; n];
        e[j] = 1.0;
        e
    };
    let gx = (0..x.len())
        .map(|j| dot(&reference(&unbiased, &basis(x.len(), j), w, &[]).1))
        .collect();
    let gw = (0..w.len())
        .map(|j| dot(&reference(&unbiased, x, &basis(w.len(), j), &[]).1))
        .collect();
    let channels = c.w[1] * c.groups;
    let (shape, _) = reference(&unbiased, x, w, &[]);
    let plane: usize = shape[2..].iter().product();
    let mut gb = vec![0.0; channels];
    for (i, v) in g.iter().enumerate() {
        gb[(i / plane) % channels] += v;
    }
    [gx, gw, gb]
}

fn check_vjp(c: Case) {
    let (nx, nw) = (c.x.iter().product(), c.w.iter().product());
    let (x, w) = (values(nx, 7), values(nw, 8));
    let (out_shape, _) = reference(&c, &x, &w, &vec![0.0; c.w[1] * c.groups]);
    let g = values(out_shape.iter().product(), 9);
    let want = reference_grads(&c, &x, &w, &g);
    for dtype in [DType::F64, DType::F32] {
        let t = |shape: &[usize], v: &[f64]| {
            Tensor::from_f64(shape, v.to_vec()).to_dtype(dtype).unwrap()
        };
        let (tx, tw, tg) = (t(&c.x, &x), t(&c.w, &w), t(&out_shape, &g));
        // every subset of the three gradients, in order input, weight, bias
        for mask in 1..8u8 {
            let outputs = VjpOutputs {
                input: mask & 1 != 0,
                weight: mask & 2 != 0,
                bias: mask & 4 != 0,
            };
            let k = Kernel::ConvTransposeVjp {
                stride: c.stride.clone(),
                padding: c.padding.clone(),
                output_padding: c.output_padding.clone(),
                dilation: c.dilation.clone(),
                groups: c.groups as i64,
                outputs,
            };
            let inputs = [Input::Tensor(&tx), Input::Tensor(&tw), Input::Tensor(&tg)];
            let got = CpuBackend
                .run_multi(&k, &inputs)
                .unwrap_or_else(|e| panic!("{}", e.0));
            let bias_shape = [c.w[1] * c.groups];
            let expected: Vec<(&[usize], &Vec<f64>)> = [
                (outputs.input, &c.x[..], &want[0]),
                (outputs.weight, &c.w[..], &want[1]),
                (outputs.bias, &bias_shape[..], &want[2]),
            ]
            .into_iter()
            .filter(|(on, _, _)| *on)
            .map(|(_, s, v)| (s, v))
            .collect();
            assert_eq!(got.len(), expected.len(), "{outputs:?}");
            let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
            for (t, (shape, want)) in got.iter().zip(expected) {
                assert_eq!(t.shape(), shape, "{dtype} {outputs:?}");
                assert_eq!(t.dtype(), dtype);
                for (i, (a, r)) in t.to_f64_vec().iter().zip(want).enumerate() {
                    assert!(
                        (a - r).abs() <= tol * (1.0 + r.abs()),
                        "{dtype} {outputs:?} element {i}: {a} vs {r}"
                    );
                }
            }
            if outputs.count() == 1 {
                let one = CpuBackend
                    .run(&k, &inputs)
                    .unwrap_or_else(|e| panic!("{}", e.0));
                assert_eq!(one.to_f64_vec(), got[0].to_f64_vec());
            }
        }
    }
}

#[test]
fn gradients_in_one_dimension_with_output_padding() {
    check_vjp(Case {
        x: vec![2, 3, 5],
        w: vec![3, 4, 3],
        stride: vec![2],
        padding: vec![1],
        output_padding: vec![1],
        dilation: vec![1],
        groups: 1,
        bias: true,
    });
}

/// Output padding past the stride (allowed where dilation is larger): the gradient
/// convolutions cover more than the input and the kernel, and are cut.
#[test]
fn gradients_in_two_dimensions_grouped_dilated_and_cut() {
    check_vjp(Case {
        x: vec![2, 4, 4, 3],
        w: vec![4, 3, 3, 2],
        stride: vec![1, 2],
        padding: vec![3, 1],
        output_padding: vec![1, 1],
        dilation: vec![2, 1],
        groups: 2,
        bias: true,
    });
}

#[test]
fn gradients_in_three_dimensions() {
    check_vjp(Case {
        x: vec![1, 2, 3, 2, 2],
        w: vec![2, 2, 2, 2, 2],
        stride: vec![2, 1, 2],
        padding: vec![0, 1, 0],
        output_padding: vec![1, 0, 0],
        dilation: vec![1, 1, 1],
        groups: 1,
        bias: true,
    });
}

#[test]
fn a_gradient_of_the_wrong_shape_is_refused() {
    let x = Tensor::from_f32(vec![1, 1, 3], vec![1.0; 3]);
    let w = Tensor::from_f32(vec![1, 1, 2], vec![1.0; 2]);
    let g = Tensor::from_f32(vec![1, 1, 5], vec![1.0; 5]);
    let k = Kernel::ConvTransposeVjp {
        stride: vec![1],
        padding: vec![0],
        output_padding: vec![0],
        dilation: vec![1],
        groups: 1,
        outputs: VjpOutputs {
            input: true,
            weight: false,
            bias: false,
        },
    };
    let e = CpuBackend
        .run(
            &k,
            &[Input::Tensor(&x), Input::Tensor(&w), Input::Tensor(&g)],
        )
        .unwrap_err();
    assert!(e.0.contains("gives [1, 1, 4]"), "{}", e.0);
}

/// Thunder's backward statement for that U-Net layer, planned and run: the gradients it
/// names, in its order, against the definition; the places it discards are not computed.
#[test]
fn thunders_conv_transpose2d_vjp_statement_runs() {
    let text = r#"def backward_fn(x, w, b, g):
  # x: "cpu f32[2, 3, 3, 3]"
  # w: "cpu f32[3, 2, 2, 2]"
  # b: "cpu f32[2]"
  # g: "cpu f32[2, 2, 6, 6]"
  (t1, t2, _, (_, _), (_, _), (_, _), _, (_, _)) = conv_transpose2d_vjp(((x, w, b, (2, 2), (0, 0), (0, 0), 1, (1, 1)), {}), g)
  (_, t3, t4) = conv_transpose2d_vjp(((x, w, b), {'stride': 2}), g)
  return (t1, t2, t3, t4)
"#;
    let t = parse_trace(text).unwrap_or_else(|e| panic!("{e}"));
    let results: Vec<_> = t.returned_values().into_iter().map(Some).collect();
    let plan = Plan::compile(&t, &results).unwrap_or_else(|e| panic!("{e}"));
    let comm = ThreadGroup::new(1, CommOptions::default());
    let (x, w, b, g) = (
        values(54, 10),
        values(24, 11),
        values(2, 12),
        values(144, 13),
    );
    let f32 = |shape: &[usize], v: &[f64]| {
        RValue::Tensor(
            Tensor::from_f64(shape, v.to_vec())
                .to_dtype(DType::F32)
                .unwrap(),
        )
    };
    let out = Executor::<CpuBackend, _>::new()
        .run(
            &plan,
            &CpuBackend,
            &mut comm.comm(0),
            vec![
                f32(&[2, 3, 3, 3], &x),
                f32(&[3, 2, 2, 2], &w),
                f32(&[2], &b),
                f32(&[2, 2, 6, 6], &g),
            ],
            &Clock::new(false),
            &mut Recording::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        x: vec![2, 3, 3, 3],
        w: vec![3, 2, 2, 2],
        stride: vec![2, 2],
        padding: vec![0, 0],
        output_padding: vec![0, 0],
        dilation: vec![1, 1],
        groups: 1,
        bias: true,
    };
    let [gx, gw, gb] = reference_grads(&case, &x, &w, &g);
    for (v, want) in out.iter().zip([&gx, &gw, &gw, &gb]) {
        let RValue::Tensor(t) = v else {
            panic!("not a tensor")
        };
        for (a, r) in t.to_f64_vec().iter().zip(want) {
            assert!((a - r).abs() <= 1e-5 * (1.0 + r.abs()), "{a} vs {r}");
        }
    }
}
