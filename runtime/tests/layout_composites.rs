//! `triu`/`tril`, `one_hot`, `pixel_shuffle`/`pixel_unshuffle`, `roll`,
//! `adaptive_avg_pool1d` and integer `neg`/`abs`/`sign`, and the backward statements Thunder
//! prints for its fallbacks (`pixel_shuffle_vjp`, `roll_vjp`, `adaptive_avg_pool1d_vjp`),
//! against their definitions written out element by element.

use tracepass_ir::{parse_trace, DType};
use tracepass_runtime::comm::{CommOptions, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{Backend, Clock, Executor, Input, Kernel, Plan, RValue, Recording};
use tracepass_runtime::tensor::{Storage, Tensor};

fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f32(shape, (0..n).map(|i| i as f32 * 0.5 - 3.0).collect())
}

fn run(k: &Kernel, x: &Tensor) -> Result<Tensor, String> {
    CpuBackend.run(k, &[Input::Tensor(x)]).map_err(|e| e.0)
}

/// Row-major index of `at` in `shape`.
fn flat(at: &[usize], shape: &[usize]) -> usize {
    at.iter().zip(shape).fold(0, |acc, (i, n)| acc * n + i)
}

/// `at`'s coordinates in `shape`.
fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

#[test]
fn triangles_keep_their_side_of_the_diagonal() {
    let shape = [2, 4, 6];
    let x = iota(&shape);
    for upper in [true, false] {
        for diagonal in [-5, -1, 0, 2, 7] {
            for fill in [0.0, -1.5] {
                let k = Kernel::Triangle {
                    upper,
                    diagonal,
                    fill,
                };
                let got = run(&k, &x).unwrap().to_f64_vec();
                for (i, (g, v)) in got.iter().zip(x.to_f64_vec()).enumerate() {
                    let c = coords(i, &shape);
                    let off = c[2] as i64 - c[1] as i64;
                    let keep = if upper {
                        off >= diagonal
                    } else {
                        off <= diagonal
                    };
                    assert_eq!(*g, if keep { v } else { fill }, "{k:?} at {c:?}");
                }
            }
        }
    }
    // booleans (the causal masks models build) and integers keep their dtype
    let b = Tensor::from_f32(vec![3, 3], vec![1.0; 9])
        .to_dtype(DType::Bool)
        .unwrap();
    let k = Kernel::Triangle {
        upper: true,
        diagonal: 1,
        fill: 0.0,
    };
    let t = run(&k, &b).unwrap();
    assert_eq!(t.dtype(), DType::Bool);
    let want: Vec<bool> = (0..9).map(|i| i % 3 > i / 3).collect();
    assert_eq!(t.to_bool_vec(), want);
    assert!(run(&k, &iota(&[4])).unwrap_err().contains("no matrix"));
}

#[test]
fn one_hot_marks_each_class_and_refuses_one_out_of_range() {
    let idx = Tensor::from_i64(vec![2, 3], vec![0, 4, 2, 2, 1, 0]);
    let t = run(&Kernel::OneHot { classes: 5 }, &idx).unwrap();
    assert_eq!(t.shape(), &[2, 3, 5]);
    assert_eq!(t.dtype(), DType::I64);
    let got = t.to_f64_vec();
    for (i, &c) in [0, 4, 2, 2, 1, 0].iter().enumerate() {
        for k in 0..5 {
            assert_eq!(got[i * 5 + k], if k == c { 1.0 } else { 0.0 });
        }
    }
    let e = run(&Kernel::OneHot { classes: 4 }, &idx).unwrap_err();
    assert!(e.contains("[0, 4)") && e.contains("found 0 to 4"), "{e}");
    let neg = Tensor::from_i64(vec![1], vec![-1]);
    assert!(run(&Kernel::OneHot { classes: 4 }, &neg).is_err());
    let f = Tensor::from_f32(vec![1], vec![0.0]);
    assert!(run(&Kernel::OneHot { classes: 4 }, &f)
        .unwrap_err()
        .contains("i64"));
}

#[test]
fn pixel_shuffle_moves_channels_to_space_and_back() {
    let (r, shape) = (2, [2, 3 * 4, 3, 5]);
    let x = iota(&shape);
    let k = Kernel::PixelShuffle {
        factor: r,
        inverse: false,
    };
    let y = run(&k, &x).unwrap();
    let out = [2, 3, 6, 10];
    assert_eq!(y.shape(), &out);
    let (xv, yv) = (x.to_f64_vec(), y.to_f64_vec());
    for (i, v) in yv.iter().enumerate() {
        let [n, c, h, w] = coords(i, &out)[..] else {
            unreachable!()
        };
        let src = [n, c * r * r + (h % r) * r + w % r, h / r, w / r];
        assert_eq!(*v, xv[flat(&src, &shape)], "at {:?}", [n, c, h, w]);
    }
    let back = run(
        &Kernel::PixelShuffle {
            factor: r,
            inverse: true,
        },
        &y,
    )
    .unwrap();
    assert_eq!(back.shape(), &shape);
    assert_eq!(back.to_f64_vec(), xv);
    assert!(run(&k, &iota(&[2, 6, 2, 2]))
        .unwrap_err()
        .contains("divisible"));
}

#[test]
fn roll_wraps_each_dimension_and_the_flattened_tensor() {
    let shape = [3, 4, 5];
    let x = iota(&shape);
    let xv = x.to_f64_vec();
    for (shifts, dims) in [
        (vec![1], vec![0]),
        (vec![-2, 7], vec![2, 1]),
        (vec![9, -1, 0], vec![0, 1, 2]),
    ] {
        let k = Kernel::Roll {
            shifts: shifts.clone(),
            dims: Some(dims.clone()),
        };
        let got = run(&k, &x).unwrap().to_f64_vec();
        for (i, g) in got.iter().enumerate() {
            let mut src = coords(i, &shape);
            for (s, d) in shifts.iter().zip(&dims) {
                let n = shape[*d] as i64;
                src[*d] = (src[*d] as i64 - s).rem_euclid(n) as usize;
            }
            assert_eq!(*g, xv[flat(&src, &shape)], "{k:?} at {i}");
        }
    }
    let k = Kernel::Roll {
        shifts: vec![-7],
        dims: None,
    };
    let y = run(&k, &x).unwrap();
    assert_eq!(y.shape(), &shape);
    let n = xv.len() as i64;
    for (i, g) in y.to_f64_vec().iter().enumerate() {
        assert_eq!(*g, xv[(i as i64 + 7).rem_euclid(n) as usize]);
    }
}

/// The statements Thunder prints for a model with `F.pixel_shuffle` and `torch.roll`
/// (both registered automatically): the backward's fallbacks undo the forward.
#[test]
fn thunders_pixel_shuffle_and_roll_statements_and_their_vjps_run() {
    let text = r#"def backward_fn(x, g, h):
  # x: "cpu f32[2, 8, 2, 3]"
  # g: "cpu f32[2, 2, 4, 6]"
  # h: "cpu f32[2, 8, 2, 3]"
  t1 = torch.nn.functional.pixel_shuffle(x, 2)  # t1: "cpu f32[2, 2, 4, 6]"
  (t2, _) = pixel_shuffle_vjp(((x, 2), {}), g)
  t3 = torch.roll(x, shifts=(1, 1), dims=(2, 3))  # t3: "cpu f32[2, 8, 2, 3]"
  (t4,) = roll_vjp(((x,), {'shifts': (1, 1), 'dims': (2, 3)}), h)
  t5 = torch.triu(x, 1)  # t5: "cpu f32[2, 8, 2, 3]"
  return (t1, t2, t3, t4, t5)
"#;
    let t = parse_trace(text).unwrap_or_else(|e| panic!("{e}"));
    let results: Vec<_> = t.returned_values().into_iter().map(Some).collect();
    let plan = Plan::compile(&t, &results).unwrap_or_else(|e| panic!("{e}"));
    let comm = ThreadGroup::new(1, CommOptions::default());
    let (x, g, h) = (
        iota(&[2, 8, 2, 3]),
        iota(&[2, 2, 4, 6]),
        iota(&[2, 8, 2, 3]),
    );
    let out: Vec<Tensor> = Executor::<CpuBackend, _>::new()
        .run(
            &plan,
            &CpuBackend,
            &mut comm.comm(0),
            vec![
                RValue::Tensor(x.clone()),
                RValue::Tensor(g.clone()),
                RValue::Tensor(h.clone()),
            ],
            &Clock::new(false),
            &mut Recording::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|v| match v {
            RValue::Tensor(t) => t,
            _ => panic!("not a tensor"),
        })
        .collect();
    let kernel = |k: Kernel, x: &Tensor| run(&k, x).unwrap().to_f64_vec();
    let shuffle = |inverse| Kernel::PixelShuffle { factor: 2, inverse };
    let roll = |s: i64| Kernel::Roll {
        shifts: vec![s, s],
        dims: Some(vec![2, 3]),
    };
    assert_eq!(out[0].to_f64_vec(), kernel(shuffle(false), &x));
    // a permutation's gradient is the inverse permutation of the output's gradient
    assert_eq!(out[1].to_f64_vec(), kernel(shuffle(true), &g));
    assert_eq!(out[2].to_f64_vec(), kernel(roll(1), &x));
    assert_eq!(out[3].to_f64_vec(), kernel(roll(-1), &h));
    assert_eq!(
        kernel(roll(1), &out[3]),
        h.to_f64_vec(),
        "rolled back and forth"
    );
    let upper = Kernel::Triangle {
        upper: true,
        diagonal: 1,
        fill: 0.0,
    };
    assert_eq!(out[4].to_f64_vec(), kernel(upper, &x));
}

#[test]
fn integer_neg_abs_and_sign_stay_exact_integers() {
    use tracepass_runtime::exec::UnaryOp;
    let x = Tensor::from_i64(vec![5], vec![-3, 0, 5, i64::MIN, i64::MAX]);
    let u = |op| run(&Kernel::Unary(op), &x).unwrap();
    let neg = u(UnaryOp::Neg);
    assert_eq!(neg.dtype(), DType::I64);
    assert_eq!(neg.to_i64_vec(), vec![3, 0, -5, i64::MIN, -i64::MAX]);
    assert_eq!(
        u(UnaryOp::Abs).to_i64_vec(),
        vec![3, 0, 5, i64::MIN, i64::MAX]
    );
    assert_eq!(u(UnaryOp::Sign).to_i64_vec(), vec![-1, 0, 1, -1, 1]);
    // relu and relu6 (hardtanh) of integers stay integers, as in PyTorch
    let relu = u(UnaryOp::Relu);
    assert_eq!(
        (relu.dtype(), relu.to_i64_vec()),
        (DType::I64, vec![0, 0, 5, 0, i64::MAX])
    );
    assert_eq!(u(UnaryOp::Relu6).to_i64_vec(), vec![0, 0, 5, 0, 6]);
    let small = Tensor::from_i64(vec![2], vec![-7, 7])
        .to_dtype(DType::I32)
        .unwrap();
    let n = run(&Kernel::Unary(UnaryOp::Neg), &small).unwrap();
    assert_eq!((n.dtype(), n.to_i64_vec()), (DType::I32, vec![7, -7]));
    // `torch.sgn` of a bool tensor is that tensor
    let b = Tensor::new(vec![3], Storage::Bool(vec![true, false, true]));
    let s = run(&Kernel::Unary(UnaryOp::Sign), &b).unwrap();
    assert_eq!((s.dtype(), s.to_i64_vec()), (DType::Bool, vec![1, 0, 1]));
}

/// Thunder's `prims.div` of integers rounds toward zero (C's division), unlike
/// `floor_divide`, whatever the signs; dividing by zero is refused as PyTorch raises.
#[test]
fn integer_prims_div_truncates_toward_zero() {
    use tracepass_runtime::exec::Side;
    let a = Tensor::from_i64(vec![6], vec![7, -7, 7, -7, 6, i64::MIN]);
    let b = Tensor::from_i64(vec![6], vec![2, 2, -2, -2, 3, 1]);
    let k = Kernel::TruncDivide {
        a: Side::Input(0),
        b: Side::Input(1),
    };
    let q = CpuBackend
        .run(&k, &[Input::Tensor(&a), Input::Tensor(&b)])
        .unwrap();
    assert_eq!(q.dtype(), DType::I64);
    assert_eq!(q.to_i64_vec(), vec![3, -3, -3, 3, 2, i64::MIN]);
    let zero = Tensor::from_i64(vec![6], vec![0; 6]);
    assert!(CpuBackend
        .run(&k, &[Input::Tensor(&a), Input::Tensor(&zero)])
        .is_err());
}

/// HF Swin pools with `nn.AdaptiveAvgPool1d(1)`; MPNet's relative-position buckets take
/// `torch.min` of two integer tensors. Both registered automatically by Thunder.
#[test]
fn thunders_adaptive_avg_pool1d_its_vjp_and_torch_min_run() {
    let text = r#"def backward_fn(x, g, a, b):
  # x: "cpu f32[2, 3, 7]"
  # g: "cpu f32[2, 3, 3]"
  # a: "cpu i64[4]"
  # b: "cpu i64[4]"
  t1 = torch.nn.functional.adaptive_avg_pool1d(x, 3)  # t1: "cpu f32[2, 3, 3]"
  (t2, _) = adaptive_avg_pool1d_vjp(((x, 3), {}), g)
  t3 = torch.min(a, b)  # t3: "cpu i64[4]"
  t4 = torch.min(x)  # t4: "cpu f32[]"
  return (t1, t2, t3, t4)
"#;
    let t = parse_trace(text).unwrap_or_else(|e| panic!("{e}"));
    let results: Vec<_> = t.returned_values().into_iter().map(Some).collect();
    let plan = Plan::compile(&t, &results).unwrap_or_else(|e| panic!("{e}"));
    let comm = ThreadGroup::new(1, CommOptions::default());
    let (x, g) = (iota(&[2, 3, 7]), iota(&[2, 3, 3]));
    let (a, b) = (
        Tensor::from_i64(vec![4], vec![5, -2, 9, 0]),
        Tensor::from_i64(vec![4], vec![3, 4, 9, -1]),
    );
    let out: Vec<Tensor> = Executor::<CpuBackend, _>::new()
        .run(
            &plan,
            &CpuBackend,
            &mut comm.comm(0),
            [&x, &g, &a, &b]
                .map(|t| RValue::Tensor(t.clone()))
                .into_iter()
                .collect(),
            &Clock::new(false),
            &mut Recording::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|v| match v {
            RValue::Tensor(t) => t,
            _ => panic!("not a tensor"),
        })
        .collect();
    // PyTorch's adaptive windows: output j averages [floor(j L / n), ceil((j + 1) L / n))
    let (l, n) = (7usize, 3usize);
    let window = |j: usize| (j * l / n, ((j + 1) * l).div_ceil(n));
    let xv = x.to_f64_vec();
    let mut pooled = Vec::new();
    let mut grad = vec![0.0; xv.len()];
    let gv = g.to_f64_vec();
    for row in 0..6 {
        for j in 0..n {
            let (s, e) = window(j);
            let len = (e - s) as f64;
            pooled.push((s..e).map(|i| xv[row * l + i]).sum::<f64>() / len);
            for i in s..e {
                grad[row * l + i] += gv[row * n + j] / len;
            }
        }
    }
    assert_eq!(out[0].shape(), &[2, 3, 3]);
    for (got, want) in out[0].to_f64_vec().iter().zip(&pooled) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
    assert_eq!(out[1].shape(), &[2, 3, 7]);
    for (got, want) in out[1].to_f64_vec().iter().zip(&grad) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
    assert_eq!(out[2].to_i64_vec(), vec![3, -2, 9, -1]);
    assert_eq!(out[3].to_f64_vec(), vec![-3.0]);
}
