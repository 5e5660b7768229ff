//! `adaptive_max_pool1d/2d`, `bilinear` and the backward statements Thunder prints for them
//! (`adaptive_max_pool2d_vjp`, `bilinear_vjp`: its torch-autograd fallback), against PyTorch's
//! definitions written out element by element (the adaptive windows scanned in row-major order,
//! a new maximum only when strictly greater), and a few figures torch 2.9.0 gives.

use tracepass_ir::parse_trace;
use tracepass_runtime::comm::{CommOptions, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{Backend, Clock, Executor, Input, Kernel, Plan, RValue, Recording};
use tracepass_runtime::tensor::Tensor;

fn run(k: &Kernel, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let ins: Vec<Input<'_, Tensor>> = inputs.iter().map(|t| Input::Tensor(*t)).collect();
    CpuBackend
        .run_multi(k, &ins)
        .map(|o| o.into_vec())
        .map_err(|e| e.0)
}

fn run1(k: &Kernel, inputs: &[&Tensor]) -> Tensor {
    let mut out = run(k, inputs).unwrap_or_else(|e| panic!("{k:?}: {e}"));
    assert_eq!(out.len(), 1, "{k:?}");
    out.remove(0)
}

/// Numbers in [-1, 1) from a seed, a few of them repeated so that windows hold ties.
fn tied(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // 8 levels: most windows have a tie at their maximum
            ((x >> 40) % 8) as f64 / 4.0 - 1.0
        })
        .collect()
}

/// PyTorch's adaptive window `i` of `n` over `len`.
fn window(i: usize, n: usize, len: usize) -> (usize, usize) {
    (i * len / n, ((i + 1) * len).div_ceil(n))
}

/// PyTorch's adaptive max pooling of `[P, H, W]` planes to `[P, oh, ow]`: the maxima, and the
/// gradient `g` sent to each window's first maximum (summed where windows share it).
fn reference(
    x: &[f64],
    p: usize,
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    g: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let mut values = Vec::new();
    let mut grad = vec![0.0; x.len()];
    for plane in 0..p {
        for i in 0..oh {
            for j in 0..ow {
                let ((r0, r1), (c0, c1)) = (window(i, oh, h), window(j, ow, w));
                let mut best = (f64::NEG_INFINITY, usize::MAX);
                for r in r0..r1 {
                    for c in c0..c1 {
                        let at = plane * h * w + r * w + c;
                        if x[at] > best.0 {
                            best = (x[at], at);
                        }
                    }
                }
                values.push(best.0);
                grad[best.1] += g[(plane * oh + i) * ow + j];
            }
        }
    }
    (values, grad)
}

/// Uneven and overlapping windows, an output larger than its input, ties everywhere: 2-d
/// pooling of `[2, 3, H, W]` and of an unbatched `[3, H, W]`, values and gradients.
#[test]
fn adaptive_max_pool_2d_takes_the_first_maximum_of_each_window() {
    for (lead, (h, w), (oh, ow)) in [
        (vec![2, 3], (5, 7), (3, 4)),
        (vec![2, 3], (4, 4), (2, 2)),
        (vec![3], (3, 2), (5, 3)),
        (vec![1, 2], (6, 9), (1, 1)),
    ] {
        let p: usize = lead.iter().product();
        let shape: Vec<usize> = lead.iter().copied().chain([h, w]).collect();
        let xv = tied(p * h * w, (h * 31 + w) as u64);
        let gv: Vec<f64> = (0..p * oh * ow).map(|i| 1.0 + i as f64).collect();
        let (want, want_grad) = reference(&xv, p, (h, w), (oh, ow), &gv);
        let x = Tensor::from_f64(shape.clone(), xv);
        let out_shape: Vec<usize> = lead.iter().copied().chain([oh, ow]).collect();
        let g = Tensor::from_f64(out_shape.clone(), gv);
        let y = run1(&Kernel::AdaptiveMaxPool { out: vec![oh, ow] }, &[&x]);
        assert_eq!(y.shape(), &out_shape[..]);
        assert_eq!(y.to_f64_vec(), want, "{shape:?} to {oh}x{ow}");
        let d = run1(&Kernel::AdaptiveMaxPoolBackward { dims: 2 }, &[&g, &x]);
        assert_eq!(d.shape(), &shape[..]);
        assert_eq!(d.to_f64_vec(), want_grad, "{shape:?} to {oh}x{ow}");
    }
}

/// 1-d pooling of a 3-d input pools its last dimension only (2-d pooling of the same tensor
/// would take its last two as the plane); of a 2-d input, the same.
#[test]
fn adaptive_max_pool_1d_pools_the_last_dimension_only() {
    for (shape, out) in [(vec![2, 3, 10], 4), (vec![3, 10], 3), (vec![2, 2, 3], 7)] {
        let l = *shape.last().unwrap();
        let p = shape.iter().product::<usize>() / l;
        let xv = tied(p * l, l as u64 + 7);
        let gv: Vec<f64> = (0..p * out).map(|i| 0.5 + i as f64).collect();
        let (want, want_grad) = reference(&xv, p, (1, l), (1, out), &gv);
        let x = Tensor::from_f64(shape.clone(), xv);
        let mut out_shape = shape.clone();
        *out_shape.last_mut().unwrap() = out;
        let g = Tensor::from_f64(out_shape.clone(), gv);
        let y = run1(&Kernel::AdaptiveMaxPool { out: vec![out] }, &[&x]);
        assert_eq!(y.shape(), &out_shape[..]);
        assert_eq!(y.to_f64_vec(), want, "{shape:?} to {out}");
        let d = run1(&Kernel::AdaptiveMaxPoolBackward { dims: 1 }, &[&g, &x]);
        assert_eq!(d.to_f64_vec(), want_grad, "{shape:?} to {out}");
    }
}

/// What torch 2.9.0 gives: `adaptive_max_pool2d` of `[[1, 3, 3, 0], [3, 2, 3, 3]]` to
/// `(1, 3)` is `[3, 3, 3]` and the gradient `[1, 10, 100]` goes back as
/// `[[0, 11, 100, 0], [0, 0, 0, 0]]` (row-major: `(0, 1)` before `(1, 0)`);
/// `adaptive_max_pool1d` of `[2, 5, 5, 1, 5]` to 3 sends `[1, 10, 100]` to `[0, 11, 0, 0, 100]`.
#[test]
fn ties_go_where_pytorch_sends_them() {
    for dtype_f32 in [false, true] {
        let make = |shape: Vec<usize>, v: Vec<f64>| {
            if dtype_f32 {
                Tensor::from_f32(shape, v.into_iter().map(|x| x as f32).collect())
            } else {
                Tensor::from_f64(shape, v)
            }
        };
        let x = make(vec![1, 2, 4], vec![1., 3., 3., 0., 3., 2., 3., 3.]);
        let g = make(vec![1, 1, 3], vec![1., 10., 100.]);
        let y = run1(&Kernel::AdaptiveMaxPool { out: vec![1, 3] }, &[&x]);
        assert_eq!(y.dtype(), x.dtype());
        assert_eq!(y.to_f64_vec(), vec![3., 3., 3.]);
        let d = run1(&Kernel::AdaptiveMaxPoolBackward { dims: 2 }, &[&g, &x]);
        assert_eq!(d.dtype(), x.dtype());
        assert_eq!(d.to_f64_vec(), vec![0., 11., 100., 0., 0., 0., 0., 0.]);
        let x = make(vec![1, 5], vec![2., 5., 5., 1., 5.]);
        let g = make(vec![1, 3], vec![1., 10., 100.]);
        let d = run1(&Kernel::AdaptiveMaxPoolBackward { dims: 1 }, &[&g, &x]);
        assert_eq!(d.to_f64_vec(), vec![0., 11., 0., 0., 100.]);
    }
}

#[test]
fn adaptive_max_pool_refuses_what_does_not_pool() {
    let x = Tensor::from_f64(vec![2, 0, 3], vec![]);
    assert!(run(&Kernel::AdaptiveMaxPool { out: vec![2, 2] }, &[&x]).is_err());
    let x = Tensor::from_f64(vec![2, 3], vec![0.0; 6]);
    assert!(run(&Kernel::AdaptiveMaxPool { out: vec![0] }, &[&x]).is_err());
    assert!(run(&Kernel::AdaptiveMaxPool { out: vec![1, 1, 1] }, &[&x]).is_err());
    let g = Tensor::from_f64(vec![3, 1], vec![0.0; 3]);
    let e = run(&Kernel::AdaptiveMaxPoolBackward { dims: 1 }, &[&g, &x]).unwrap_err();
    assert!(e.contains("does not pool"), "{e}");
}

/// `y[n, o] = sum_ij a[n, i] w[o, i, j] b[n, j] + bias[o]` and its four gradients, over
/// explicit coordinates, with two leading dimensions.
#[test]
fn bilinear_and_its_gradients_are_the_sums_they_define() {
    let (lead, i, j, o) = ([2usize, 3], 4usize, 5usize, 3usize);
    let n: usize = lead.iter().product();
    let vals = |k: usize, seed: u64| -> Vec<f64> {
        (0..k)
            .map(|q| ((q as u64 * 7919 + seed * 104729) % 97) as f64 / 48.0 - 1.0)
            .collect()
    };
    let (av, bv, wv, biasv, gv) = (
        vals(n * i, 1),
        vals(n * j, 2),
        vals(o * i * j, 3),
        vals(o, 4),
        vals(n * o, 5),
    );
    let a = Tensor::from_f64(vec![2, 3, i], av.clone());
    let b = Tensor::from_f64(vec![2, 3, j], bv.clone());
    let w = Tensor::from_f64(vec![o, i, j], wv.clone());
    let bias = Tensor::from_f64(vec![o], biasv.clone());
    let g = Tensor::from_f64(vec![2, 3, o], gv.clone());
    let wat = |oo: usize, ii: usize, jj: usize| wv[(oo * i + ii) * j + jj];
    let close = |got: &[f64], want: &[f64], what: &str| {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (x, y)) in got.iter().zip(want).enumerate() {
            assert!(
                (x - y).abs() <= 1e-12 * (1.0 + y.abs()),
                "{what}[{k}]: {x} vs {y}"
            );
        }
    };
    let mut y = vec![0.0; n * o];
    let (mut da, mut db, mut dw) = (vec![0.0; n * i], vec![0.0; n * j], vec![0.0; o * i * j]);
    let mut dbias = vec![0.0; o];
    for r in 0..n {
        for oo in 0..o {
            let go = gv[r * o + oo];
            y[r * o + oo] = biasv[oo];
            dbias[oo] += go;
            for ii in 0..i {
                for jj in 0..j {
                    let (x1, x2) = (av[r * i + ii], bv[r * j + jj]);
                    y[r * o + oo] += x1 * wat(oo, ii, jj) * x2;
                    da[r * i + ii] += go * wat(oo, ii, jj) * x2;
                    db[r * j + jj] += go * x1 * wat(oo, ii, jj);
                    dw[(oo * i + ii) * j + jj] += go * x1 * x2;
                }
            }
        }
    }
    let got = run1(&Kernel::Bilinear { bias: true }, &[&a, &b, &w, &bias]);
    assert_eq!(got.shape(), &[2, 3, o]);
    close(&got.to_f64_vec(), &y, "y");
    let no_bias = run1(&Kernel::Bilinear { bias: false }, &[&a, &b, &w]).to_f64_vec();
    let y0: Vec<f64> = y
        .iter()
        .enumerate()
        .map(|(k, v)| v - biasv[k % o])
        .collect();
    close(&no_bias, &y0, "y without bias");
    let grads = run(
        &Kernel::BilinearVjp { outputs: [true; 4] },
        &[&a, &b, &w, &g],
    )
    .unwrap();
    assert_eq!(grads.len(), 4);
    assert_eq!(grads[0].shape(), a.shape());
    assert_eq!(grads[1].shape(), b.shape());
    assert_eq!(grads[2].shape(), w.shape());
    for (t, want, what) in [
        (&grads[0], &da, "da"),
        (&grads[1], &db, "db"),
        (&grads[2], &dw, "dw"),
        (&grads[3], &dbias, "dbias"),
    ] {
        close(&t.to_f64_vec(), want, what);
    }
    // only the gradients asked for, in order
    let some = run(
        &Kernel::BilinearVjp {
            outputs: [false, true, false, true],
        },
        &[&a, &b, &w, &g],
    )
    .unwrap();
    assert_eq!(some.len(), 2);
    close(&some[0].to_f64_vec(), &db, "db alone");
    close(&some[1].to_f64_vec(), &dbias, "dbias alone");
}

fn execute(text: &str, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let t = parse_trace(text).map_err(|e| e.to_string())?;
    let results: Vec<_> = t.returned_values().into_iter().map(Some).collect();
    let plan = Plan::compile(&t, &results).map_err(|e| e.to_string())?;
    let comm = ThreadGroup::new(1, CommOptions::default());
    let out = Executor::<CpuBackend, _>::new()
        .run(
            &plan,
            &CpuBackend,
            &mut comm.comm(0),
            inputs
                .iter()
                .map(|t| RValue::Tensor((*t).clone()))
                .collect(),
            &Clock::new(false),
            &mut Recording::default(),
        )
        .map_err(|e| e.to_string())?;
    Ok(out
        .into_iter()
        .map(|v| match v {
            RValue::Tensor(t) => t,
            _ => panic!("not a tensor"),
        })
        .collect())
}

/// The statements as Thunder prints them (a `None` output size keeps the input's), bound
/// to the kernels above: the same numbers as the kernels' definitions.
#[test]
fn thunders_statements_run_through_the_kernels() {
    let text = r#"def backward_fn(x, g, a, b, w, bias, gy):
  # x: "cpu f32[2, 5, 7]"
  # g: "cpu f32[2, 3, 7]"
  # a: "cpu f32[4, 3]"
  # b: "cpu f32[4, 2]"
  # w: "cpu f32[5, 3, 2]"
  # bias: "cpu f32[5]"
  # gy: "cpu f32[4, 5]"
  t1 = torch.nn.functional.adaptive_max_pool2d(x, (3, None))  # t1: "cpu f32[2, 3, 7]"
  (t2, (_, _)) = adaptive_max_pool2d_vjp(((x, (3, None)), {}), g)
  t3 = torch.nn.functional.adaptive_max_pool1d(x, 4)  # t3: "cpu f32[2, 5, 4]"
  t4 = torch.nn.functional.bilinear(a, b, w, bias)  # t4: "cpu f32[4, 5]"
  (t5, _, t6, t7) = bilinear_vjp(((a, b, w, bias), {}), gy)
  return (t1, t2, t3, t4, t5, t6, t7)
"#;
    let xv = tied(2 * 5 * 7, 3);
    let x = Tensor::from_f32(vec![2, 5, 7], xv.iter().map(|&v| v as f32).collect());
    let gv: Vec<f64> = (0..2 * 3 * 7).map(|i| i as f64 * 0.25).collect();
    let g = Tensor::from_f32(vec![2, 3, 7], gv.iter().map(|&v| v as f32).collect());
    let f32s = |shape: Vec<usize>, seed: u64| {
        let n: usize = shape.iter().product();
        Tensor::from_f32(
            shape,
            (0..n)
                .map(|q| ((q as u64 * 13 + seed) % 11) as f32 / 5.0 - 1.0)
                .collect(),
        )
    };
    let (a, b, w, bias, gy) = (
        f32s(vec![4, 3], 1),
        f32s(vec![4, 2], 2),
        f32s(vec![5, 3, 2], 3),
        f32s(vec![5], 4),
        f32s(vec![4, 5], 5),
    );
    let out = execute(text, &[&x, &g, &a, &b, &w, &bias, &gy]).unwrap_or_else(|e| panic!("{e}"));
    // the 2-d pooling of the last two dimensions of an unbatched [C=2, 5, 7]
    let (want, want_grad) = reference(&xv, 2, (5, 7), (3, 7), &gv);
    assert_eq!(out[0].to_f64_vec(), want);
    assert_eq!(out[1].to_f64_vec(), want_grad);
    let (want1, _) = reference(&xv, 10, (1, 7), (1, 4), &[0.0; 40]);
    assert_eq!(out[2].to_f64_vec(), want1);
    let direct = run1(&Kernel::Bilinear { bias: true }, &[&a, &b, &w, &bias]);
    assert_eq!(out[3].to_f64_vec(), direct.to_f64_vec());
    let grads = run(
        &Kernel::BilinearVjp {
            outputs: [true, false, true, true],
        },
        &[&a, &b, &w, &gy],
    )
    .unwrap();
    for (k, want) in grads.iter().enumerate() {
        assert_eq!(out[4 + k].to_f64_vec(), want.to_f64_vec(), "gradient {k}");
    }
}

/// `return_indices=True` gives a pair no kernel computes: refused when the plan is made,
/// naming the reason.
#[test]
fn pooling_with_indices_is_refused() {
    let text = r#"def f(x):
  # x: "cpu f32[2, 5, 7]"
  t1 = torch.nn.functional.adaptive_max_pool2d(x, 3, True)  # t1: "cpu f32[2, 3, 3]"
  return t1
"#;
    let x = Tensor::from_f32(vec![2, 5, 7], vec![0.0; 70]);
    let e = execute(text, &[&x]).unwrap_err();
    assert!(e.contains("return_indices"), "{e}");
}

/// `channel_shuffle` of `[N, C, *]` in `g` groups: output channel `j * g + i` is input channel
/// `i * (C / g) + j`; its fallback gradient is the shuffle back.
#[test]
fn channel_shuffle_interleaves_the_groups_and_its_gradient_undoes_it() {
    let text = r#"def f(x, g):
  # x: "cpu f32[2, 6, 2, 3]"
  # g: "cpu f32[2, 6, 2, 3]"
  t1 = torch.nn.functional.channel_shuffle(x, 3)  # t1: "cpu f32[2, 6, 2, 3]"
  (t2, _) = channel_shuffle_vjp(((x, 3), {}), g)
  return (t1, t2)
"#;
    let (n, c, rest, groups) = (2usize, 6usize, 6usize, 3usize);
    let xv: Vec<f32> = (0..n * c * rest).map(|i| i as f32).collect();
    let x = Tensor::from_f32(vec![2, 6, 2, 3], xv.clone());
    let gv: Vec<f32> = (0..n * c * rest).map(|i| (i * 7 % 11) as f32).collect();
    let g = Tensor::from_f32(vec![2, 6, 2, 3], gv.clone());
    let out = execute(text, &[&x, &g]).unwrap_or_else(|e| panic!("{e}"));
    let per = c / groups;
    let (y, dx) = (out[0].to_f64_vec(), out[1].to_f64_vec());
    for b in 0..n {
        for i in 0..groups {
            for j in 0..per {
                let (src, dst) = (i * per + j, j * groups + i);
                for r in 0..rest {
                    // forward: y[dst] = x[src]; gradient: dx[src] = g[dst]
                    assert_eq!(
                        y[(b * c + dst) * rest + r],
                        xv[(b * c + src) * rest + r] as f64
                    );
                    assert_eq!(
                        dx[(b * c + src) * rest + r],
                        gv[(b * c + dst) * rest + r] as f64
                    );
                }
            }
        }
    }
}

/// `clamp_min`/`clamp_max` with a number bound, and PyTorch's derivative: the gradient passes
/// where `x >= min` (`x <= max`), the bound itself included, and not at NaN; a tensor bound's
/// gradient is refused.
#[test]
fn clamp_min_and_max_pass_the_gradient_inside_the_bound() {
    let text = r#"def f(x, g):
  # x: "cpu f64[6]"
  # g: "cpu f64[6]"
  t1 = torch.clamp_min(x, 0.5)  # t1: "cpu f64[6]"
  t2 = torch.clamp_max(x, 0.5)  # t2: "cpu f64[6]"
  (t3, _) = clamp_min_vjp(((x, 0.5), {}), g)
  (t4, _) = clamp_max_vjp(((x, 0.5), {}), g)
  return (t1, t2, t3, t4)
"#;
    let xv = vec![-1.0, 0.5, 0.75, 2.0, f64::NAN, 0.25];
    let gv = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let x = Tensor::from_f64(vec![6], xv.clone());
    let g = Tensor::from_f64(vec![6], gv);
    let out = execute(text, &[&x, &g]).unwrap_or_else(|e| panic!("{e}"));
    let same = |got: Vec<f64>, want: &[f64]| {
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(want) {
            assert!(a == b || (a.is_nan() && b.is_nan()), "{got:?} vs {want:?}");
        }
    };
    // torch 2.9.0: clamp_min -> [0.5, 0.5, 0.75, 2, nan, 0.5], clamp_max -> [-1, 0.5, 0.5, 0.5,
    // nan, 0.25]; gradients of ones*g: [0, 2, 3, 4, 0, 0] and [1, 2, 0, 0, 0, 6]
    same(out[0].to_f64_vec(), &[0.5, 0.5, 0.75, 2.0, f64::NAN, 0.5]);
    same(out[1].to_f64_vec(), &[-1.0, 0.5, 0.5, 0.5, f64::NAN, 0.25]);
    same(out[2].to_f64_vec(), &[0.0, 2.0, 3.0, 4.0, 0.0, 0.0]);
    same(out[3].to_f64_vec(), &[1.0, 2.0, 0.0, 0.0, 0.0, 6.0]);
    let tensor_bound = r#"def f(x, m, g):
  # x: "cpu f64[6]"
  # m: "cpu f64[6]"
  # g: "cpu f64[6]"
  (t1, t2) = clamp_min_vjp(((x, m), {}), g)
  return (t1, t2)
"#;
    let e = execute(tensor_bound, &[&x, &x, &g]).unwrap_err();
    assert!(e.contains("tensor bound"), "{e}");
}

/// `cosine_similarity` and Thunder's `cosine_similarity_vjp` with a broadcast operand, a zero
/// vector (its norm clamped to `eps`) and a tiny one: torch 2.9.0's figures.
#[test]
fn cosine_similarity_and_its_gradient_are_pytorchs() {
    let text = r#"def f(x1, x2, g, u1, u2, h):
  # x1: "cpu f64[2, 3]"
  # x2: "cpu f64[1, 3]"
  # g: "cpu f64[2]"
  # u1: "cpu f64[2, 2]"
  # u2: "cpu f64[2, 2]"
  # h: "cpu f64[2]"
  t1 = torch.nn.functional.cosine_similarity(x1, x2, dim=1)  # t1: "cpu f64[2]"
  (t2, t3) = cosine_similarity_vjp(((x1, x2), {'dim': 1}), g)
  t4 = torch.nn.functional.cosine_similarity(u1, u2, 0, 0.5)  # t4: "cpu f64[2]"
  (_, t5, _, _) = cosine_similarity_vjp(((u1, u2, 0, 0.5), {}), h)
  return (t1, t2, t3, t4, t5)
"#;
    let t = |shape: Vec<usize>, v: Vec<f64>| Tensor::from_f64(shape, v);
    let ins = [
        t(vec![2, 3], vec![1., 2., 0., 0., 0., 0.]),
        t(vec![1, 3], vec![2., -1., 3.]),
        t(vec![2], vec![1., 2.]),
        t(vec![2, 2], vec![3., 4., 1e-9, 0.]),
        t(vec![2, 2], vec![1., 0., 0., 2.]),
        t(vec![2], vec![1., -1.]),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let out = execute(text, &refs).unwrap_or_else(|e| panic!("{e}"));
    let close = |got: &Tensor, want: &[f64]| {
        let g = got.to_f64_vec();
        assert_eq!(g.len(), want.len());
        for (a, b) in g.iter().zip(want) {
            assert!(
                (a - b).abs() <= 1e-12 * b.abs().max(1e-9),
                "{g:?} vs {want:?}"
            );
        }
    };
    close(&out[0], &[0.0, 0.0]);
    close(
        &out[1],
        &[
            2.390_457_218_668_787e-1,
            -1.195_228_609_334_393_6e-1,
            3.585_685_828_003_181e-1,
            1.069_044_967_649_697_5e8,
            -5.345_224_838_248_488e7,
            1.603_567_451_474_546_5e8,
        ],
    );
    // x2's gradient summed over the broadcast row
    close(
        &out[2],
        &[0.119_522_860_933_439_36, 0.239_045_721_866_878_72, 0.0],
    );
    close(&out[3], &[1.0, 0.0]);
    close(&out[4], &[0.0, -0.5, 3.333_333_333_333_333_7e-10, 0.0]);
}

/// PyTorch's im2col over coordinates: column `(c * kh + ki) * kw + kj`, position `i * ow + j`
/// holds the zero-padded input at `(i * sh + ki * dh - ph, j * sw + kj * dw - pw)`; fold adds
/// each column entry back there.
fn im2col_reference(
    x: &[f64],
    [n, c, h, w]: [usize; 4],
    k: [usize; 2],
    d: [usize; 2],
    p: [usize; 2],
    s: [usize; 2],
) -> (Vec<f64>, [usize; 2], Vec<(usize, usize)>) {
    let oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) / s[0] + 1;
    let ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) / s[1] + 1;
    let mut cols = Vec::new();
    // (column entry, input index) pairs where the entry reads the input
    let mut map = Vec::new();
    for b in 0..n {
        for ch in 0..c {
            for ki in 0..k[0] {
                for kj in 0..k[1] {
                    for i in 0..oh {
                        for j in 0..ow {
                            let y = (i * s[0] + ki * d[0]) as i64 - p[0] as i64;
                            let xx = (j * s[1] + kj * d[1]) as i64 - p[1] as i64;
                            let inside = y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w;
                            if inside {
                                let at = ((b * c + ch) * h + y as usize) * w + xx as usize;
                                map.push((cols.len(), at));
                                cols.push(x[at]);
                            } else {
                                cols.push(0.0);
                            }
                        }
                    }
                }
            }
        }
    }
    (cols, [oh, ow], map)
}

/// `F.unfold` and `F.fold` as Thunder prints them, with their `_vjp`s (each the other), against
/// the coordinate definition; overlapping windows (stride below the kernel) sum in fold.
#[test]
fn unfold_and_fold_are_im2col_and_col2im() {
    let text = r#"def f(x, g, u, h):
  # x: "cpu f64[2, 3, 5, 6]"
  # g: "cpu f64[2, 18, 9]"
  # u: "cpu f64[2, 18, 9]"
  # h: "cpu f64[2, 3, 5, 6]"
  t1 = torch.nn.functional.unfold(x, (2, 3), dilation=1, padding=1, stride=2)  # t1: "cpu f64[2, 18, 9]"
  (t2, (_, _)) = unfold_vjp(((x, (2, 3)), {'dilation': 1, 'padding': 1, 'stride': 2}), g)
  t3 = torch.nn.functional.fold(u, output_size=(5, 6), kernel_size=(2, 3), padding=1, stride=2)  # t3: "cpu f64[2, 3, 5, 6]"
  (t4,) = fold_vjp(((u,), {'output_size': (5, 6), 'kernel_size': (2, 3), 'padding': 1, 'stride': 2}), h)
  t5 = torch.nn.functional.unfold(x, 3, 2, 0, 1)  # t5: "cpu f64[2, 27, 2]"
  return (t1, t2, t3, t4, t5)
"#;
    let dims = [2, 3, 5, 6];
    let xv: Vec<f64> = (0..180).map(|i| i as f64 * 0.5 - 7.0).collect();
    let gv: Vec<f64> = (0..2 * 18 * 9).map(|i| (i % 13) as f64 - 6.0).collect();
    let hv: Vec<f64> = (0..180).map(|i| (i % 7) as f64).collect();
    let t = |shape: Vec<usize>, v: &[f64]| Tensor::from_f64(shape, v.to_vec());
    let ins = [
        t(dims.to_vec(), &xv),
        t(vec![2, 18, 9], &gv),
        t(vec![2, 18, 9], &gv),
        t(dims.to_vec(), &hv),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let out = execute(text, &refs).unwrap_or_else(|e| panic!("{e}"));
    let (cols, pos, map) = im2col_reference(&xv, dims, [2, 3], [1, 1], [1, 1], [2, 2]);
    assert_eq!(pos, [3, 3]);
    assert_eq!(out[0].to_f64_vec(), cols);
    // fold (and unfold's gradient): each column entry added where it was read
    let mut folded = vec![0.0; 180];
    for &(entry, at) in &map {
        folded[at] += gv[entry];
    }
    assert_eq!(out[1].to_f64_vec(), folded);
    assert_eq!(out[2].to_f64_vec(), folded);
    // fold's gradient: the unfold of h
    let (hcols, _, _) = im2col_reference(&hv, dims, [2, 3], [1, 1], [1, 1], [2, 2]);
    assert_eq!(out[3].to_f64_vec(), hcols);
    let (dilated, pos, _) = im2col_reference(&xv, dims, [3, 3], [2, 2], [0, 0], [1, 1]);
    assert_eq!(pos, [1, 2]);
    assert_eq!(out[4].to_f64_vec(), dilated);
}

/// `got` within `rel` of `want`, element by element (or `1e-12` of it near 0).
fn close_to(got: &Tensor, want: &[f64], rel: f64) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{g:?} vs {want:?}");
    for (a, b) in g.iter().zip(want) {
        assert!((a - b).abs() <= rel * b.abs() + 1e-12, "{g:?} vs {want:?}");
    }
}

/// `binary_cross_entropy_with_logits` and `binary_cross_entropy` with Thunder's `*_vjp`s: large
/// logits, a weight and a `pos_weight` broadcast, a probability whose log is clamped at -100;
/// torch 2.9.0's figures (float64).
#[test]
fn binary_cross_entropies_and_their_gradients_are_pytorchs() {
    let text = r#"def f(x, y, p, w, pw, g, h):
  # x: "cpu f64[2, 3]"
  # y: "cpu f64[2, 3]"
  # p: "cpu f64[2, 3]"
  # w: "cpu f64[3]"
  # pw: "cpu f64[2, 1]"
  # g: "cpu f64[]"
  # h: "cpu f64[2, 3]"
  t1 = torch.nn.functional.binary_cross_entropy_with_logits(x, y)  # t1: "cpu f64[]"
  (t2, t3) = binary_cross_entropy_with_logits_vjp(((x, y), {}), g)
  t4 = torch.nn.functional.binary_cross_entropy_with_logits(x, y, w, None, None, 'none', pw)  # t4: "cpu f64[2, 3]"
  (t5, t6, _, _, _, _, _) = binary_cross_entropy_with_logits_vjp(((x, y, w, None, None, 'none', pw), {}), h)
  t7 = torch.nn.functional.binary_cross_entropy(p, y, None, None, None, 'sum')  # t7: "cpu f64[]"
  (t8, t9, _, _, _, _) = binary_cross_entropy_vjp(((p, y, None, None, None, 'sum'), {}), g)
  t10 = torch.nn.functional.binary_cross_entropy(p, y, w)  # t10: "cpu f64[]"
  (t11, t12, _) = binary_cross_entropy_vjp(((p, y, w), {}), g)
  return (t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12)
"#;
    let t = |shape: Vec<usize>, v: Vec<f64>| Tensor::from_f64(shape, v);
    let ins = [
        t(vec![2, 3], vec![0.5, -1.0, 30.0, -30.0, 0.0, 2.0]),
        t(vec![2, 3], vec![1.0, 0.0, 0.25, 0.5, 1.0, 0.0]),
        t(vec![2, 3], vec![0.2, 0.9, 1e-50, 0.5, 0.7, 0.01]),
        t(vec![3], vec![2.0, 0.5, 1.0]),
        t(vec![2, 1], vec![3.0, 0.5]),
        t(vec![], vec![1.5]),
        t(vec![2, 3], vec![1.0, -2.0, 0.5, 0.25, 1.0, 3.0]),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let out = execute(text, &refs).unwrap_or_else(|e| panic!("{e}"));
    let want: [&[f64]; 12] = [
        &[6.851235643883572],
        &[
            -0.09438516719953634,
            0.06723535534249878,
            0.1874999999999766,
            -0.12499999999997662,
            -0.125,
            0.22019926949447058,
        ],
        &[-0.125, 0.25, -7.5, 7.5, -0.0, -0.5],
        &[
            2.84446190508064,
            0.1566308437591114,
            22.500000000000142,
            15.000000000000142,
            0.17328679513998632,
            2.1269280110429727,
        ],
        &[
            -2.265244012788872,
            -0.2689414213699951,
            0.37499999999992983,
            -0.1249999999999649,
            -0.125,
            2.642391233933647,
        ],
        &[
            0.8963079367204267,
            -3.6265233750364456,
            -14.999999999999906,
            7.499999999999976,
            -0.17328679513998632,
            -6.190392016564459,
        ],
        &[29.971895465780324],
        &[
            -7.5,
            15.000000000000004,
            -375000001498.426,
            0.0,
            -2.142857142857143,
            1.515151515151515,
        ],
        &[
            2.0794415416798357,
            -3.295836866004329,
            172.69388197455345,
            -0.0,
            -1.2709467905808052,
            6.892679775201884,
        ],
        &[5.157475090051331],
        &[
            -2.5,
            1.2500000000000002,
            -62500000249.73767,
            0.0,
            -0.17857142857142858,
            0.2525252525252525,
        ],
        &[
            std::f64::consts::LN_2, // -logit(0.2) = ln 4, times the weight 2 and g 1.5, over 6
            -0.27465307216702745,
            28.782313662425576,
            -0.0,
            -0.10591223254840043,
            1.1487799625336474,
        ],
    ];
    for (got, want) in out.iter().zip(want) {
        close_to(got, want, 1e-10);
    }
}

/// `l1_loss`, `smooth_l1_loss` (`beta` 0.5, and 0 as L1) and `huber_loss` (`delta` 0.5) with
/// their `*_vjp`s, differences on either side of the bend and at it: torch 2.9.0's figures.
#[test]
fn l1_smooth_l1_and_huber_losses_and_their_gradients_are_pytorchs() {
    let text = r#"def f(a, b, g, h):
  # a: "cpu f64[2, 3]"
  # b: "cpu f64[2, 3]"
  # g: "cpu f64[]"
  # h: "cpu f64[2, 3]"
  t1 = torch.nn.functional.l1_loss(a, b)  # t1: "cpu f64[]"
  (t2, t3) = l1_loss_vjp(((a, b), {}), g)
  t4 = torch.nn.functional.smooth_l1_loss(a, b, reduction='none', beta=0.5)  # t4: "cpu f64[2, 3]"
  (t5, t6) = smooth_l1_loss_vjp(((a, b), {'reduction': 'none', 'beta': 0.5}), h)
  t7 = torch.nn.functional.smooth_l1_loss(a, b, reduction='sum', beta=0.0)  # t7: "cpu f64[]"
  (t8, t9) = smooth_l1_loss_vjp(((a, b), {'reduction': 'sum', 'beta': 0.0}), g)
  t10 = torch.nn.functional.huber_loss(a, b, delta=0.5)  # t10: "cpu f64[]"
  (t11, t12) = huber_loss_vjp(((a, b), {'delta': 0.5}), g)
  return (t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12)
"#;
    let t = |shape: Vec<usize>, v: Vec<f64>| Tensor::from_f64(shape, v);
    let ins = [
        t(vec![2, 3], vec![0.0, 1.0, -2.0, 0.25, 0.5, 3.0]),
        t(vec![2, 3], vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
        t(vec![], vec![1.5]),
        t(vec![2, 3], vec![1.0, -2.0, 0.5, 0.25, 1.0, 3.0]),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let out = execute(text, &refs).unwrap_or_else(|e| panic!("{e}"));
    let want: [&[f64]; 12] = [
        &[0.9583333333333334],
        &[0.0, 0.25, -0.25, 0.25, 0.25, 0.25],
        &[-0.0, -0.25, 0.25, -0.25, -0.25, -0.25],
        &[0.0, 0.75, 1.75, 0.0625, 0.25, 1.75],
        &[0.0, -2.0, -0.5, 0.125, 1.0, 3.0],
        &[0.0, 2.0, 0.5, -0.125, -1.0, -3.0],
        &[5.75],
        &[0.0, 1.5, -1.5, 1.5, 1.5, 1.5],
        &[-0.0, -1.5, 1.5, -1.5, -1.5, -1.5],
        &[0.3802083333333333],
        &[0.0, 0.125, -0.125, 0.0625, 0.125, 0.125],
        &[0.0, -0.125, 0.125, -0.0625, -0.125, -0.125],
    ];
    for (got, want) in out.iter().zip(want) {
        close_to(got, want, 1e-12);
    }
}

/// What PyTorch or Thunder cannot do is refused by name: a weight's gradient, the deprecated
/// `size_average`, a weighted `l1_loss`, a negative `beta`.
#[test]
fn pointwise_losses_refuse_what_pytorch_does_not_do() {
    let cases = [
        (
            "t1 = torch.nn.functional.binary_cross_entropy(x, y, w)  # t1: \"cpu f64[]\"\n  (t2, t3, t4) = binary_cross_entropy_vjp(((x, y, w), {}), g)\n  return (t1, t2, t3, t4)",
            "not differentiable with respect to `weight`",
        ),
        (
            "t1 = torch.nn.functional.l1_loss(x, y, True)  # t1: \"cpu f64[]\"\n  return (t1,)",
            "size_average",
        ),
        (
            "t1 = torch.nn.functional.l1_loss(x, y, weight=w)  # t1: \"cpu f64[]\"\n  return (t1,)",
            "weight is not supported",
        ),
        (
            "t1 = torch.nn.functional.smooth_l1_loss(x, y, beta=-1.0)  # t1: \"cpu f64[]\"\n  return (t1,)",
            "must not be negative",
        ),
    ];
    for (body, want) in cases {
        let text = format!(
            "def f(x, y, w, g):\n  # x: \"cpu f64[3]\"\n  # y: \"cpu f64[3]\"\n  # w: \"cpu f64[3]\"\n  # g: \"cpu f64[]\"\n  {body}\n"
        );
        let t = |v: Vec<f64>| Tensor::from_f64(vec![v.len()], v);
        let ins = [
            t(vec![0.2, 0.5, 0.7]),
            t(vec![1.0, 0.0, 1.0]),
            t(vec![1.0, 2.0, 3.0]),
            Tensor::from_f64(vec![], vec![1.0]),
        ];
        let refs: Vec<&Tensor> = ins.iter().collect();
        match execute(&text, &refs) {
            Ok(_) => panic!("{body} ran"),
            Err(e) => assert!(e.contains(want), "{body}: {e}"),
        }
    }
}

/// `kl_div` and Thunder's `kl_div_vjp`: `batchmean`, `sum`, `mean` and `none`, probabilities
/// and log-probabilities as targets, a zero target (whose gradient is NaN in PyTorch, through
/// `xlogy`): torch 2.9.0's figures.
#[test]
fn kl_div_and_its_gradients_are_pytorchs() {
    let text = r#"def f(x, t, lt, g, h):
  # x: "cpu f64[2, 3]"
  # t: "cpu f64[2, 3]"
  # lt: "cpu f64[2, 3]"
  # g: "cpu f64[]"
  # h: "cpu f64[2, 3]"
  t1 = torch.nn.functional.kl_div(x, t, reduction='batchmean')  # t1: "cpu f64[]"
  (t2, t3) = kl_div_vjp(((x, t), {'reduction': "batchmean"}), g)
  t4 = torch.nn.functional.kl_div(x, lt, reduction='none', log_target=True)  # t4: "cpu f64[2, 3]"
  (t5, t6) = kl_div_vjp(((x, lt), {'reduction': "none", 'log_target': True}), h)
  t7 = torch.nn.functional.kl_div(x, lt, log_target=True)  # t7: "cpu f64[]"
  (t8, t9) = kl_div_vjp(((x, lt), {'log_target': True}), g)
  t10 = torch.nn.functional.kl_div(x, t, None, None, 'sum')  # t10: "cpu f64[]"
  (t11, t12, _, _, _) = kl_div_vjp(((x, t, None, None, 'sum'), {}), g)
  return (t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12)
"#;
    let t = |shape: Vec<usize>, v: Vec<f64>| Tensor::from_f64(shape, v);
    let ins = [
        t(vec![2, 3], vec![-1.0, -0.5, -2.0, 0.5, -3.0, -0.1]),
        t(vec![2, 3], vec![0.2, 0.0, 0.8, 0.5, 0.25, 0.25]),
        t(vec![2, 3], vec![-1.5, -0.2, -2.0, 0.3, -1.0, -4.0]),
        t(vec![], vec![1.5]),
        t(vec![2, 3], vec![1.0, -2.0, 0.5, 0.25, 1.0, 3.0]),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let out = execute(text, &refs).unwrap_or_else(|e| panic!("{e}"));
    let nan = f64::NAN;
    let want: [&[f64]; 12] = [
        &[0.3924384028109471],
        &[-0.15, -0.0, -0.6, -0.375, -0.1875, -0.1875],
        &[
            0.29292156567442496,
            nan,
            2.082642336514343,
            -0.14486038541995894,
            1.9602792291600821,
            -0.21472077083991786,
        ],
        &[
            -0.11156508007421491,
            0.24561922592339452,
            0.0,
            -0.26997176151520064,
            0.7357588823428847,
            -0.0714309916660633,
        ],
        &[
            -0.22313016014842982,
            1.6374615061559636,
            -0.06766764161830635,
            -0.3374647018940008,
            -0.36787944117144233,
            -0.054946916666202536,
        ],
        &[
            0.11156508007421491,
            -2.128699958002753,
            0.06766764161830635,
            0.26997176151520064,
            1.103638323514327,
            -0.15934605833198734,
        ],
        &[0.08806837916846673],
        &[
            -0.055782540037107455,
            -0.20468268826949546,
            -0.033833820809153176,
            -0.3374647018940008,
            -0.09196986029286058,
            -0.004578909722183545,
        ],
        &[
            0.027891270018553727,
            0.2660874947503441,
            0.033833820809153176,
            0.26997176151520064,
            0.27590958087858175,
            -0.01327883819433228,
        ],
        &[0.7848768056218942],
        &[-0.3, -0.0, -1.2, -0.75, -0.375, -0.375],
        &[
            0.5858431313488499,
            nan,
            4.165284673028686,
            -0.2897207708399179,
            3.9205584583201643,
            -0.4294415416798357,
        ],
    ];
    for (got, want) in out.iter().zip(want) {
        let g = got.to_f64_vec();
        assert_eq!(g.len(), want.len(), "{g:?} vs {want:?}");
        for (a, b) in g.iter().zip(want) {
            assert_eq!(a.is_nan(), b.is_nan(), "{g:?} vs {want:?}");
        }
        let (g2, w2): (Vec<f64>, Vec<f64>) = g
            .iter()
            .zip(want)
            .filter(|(_, b)| !b.is_nan())
            .map(|(a, b)| (*a, *b))
            .unzip();
        close_to(&Tensor::from_f64(vec![g2.len()], g2), &w2, 1e-12);
    }
}

/// `torch.logaddexp` and `torch.hypot` with Thunder's `*_vjp`s, a broadcast operand each (its
/// gradient summed over the broadcast), and logaddexp of equal infinities: torch 2.9.0's figures.
#[test]
fn logaddexp_and_hypot_and_their_gradients_are_pytorchs() {
    let text = r#"def f(x, b, y, h, i, j):
  # x: "cpu f64[2, 3]"
  # b: "cpu f64[1, 3]"
  # y: "cpu f64[2, 1]"
  # h: "cpu f64[2, 3]"
  # i: "cpu f64[2, 3]"
  # j: "cpu f64[2, 3]"
  t1 = torch.logaddexp(x, b)  # t1: "cpu f64[2, 3]"
  (t2, t3) = logaddexp_vjp(((x, b), {}), h)
  t4 = torch.hypot(x, y)  # t4: "cpu f64[2, 3]"
  (t5, t6) = hypot_vjp(((x, y), {}), h)
  t7 = torch.logaddexp(i, j)  # t7: "cpu f64[2, 3]"
  return (t1, t2, t3, t4, t5, t6, t7)
"#;
    let inf = f64::INFINITY;
    let t = |shape: Vec<usize>, v: Vec<f64>| Tensor::from_f64(shape, v);
    let ins = [
        t(vec![2, 3], vec![0.5, -1.0, 30.0, 0.0, -2.0, 2.0]),
        t(vec![1, 3], vec![1.0, -1.0, -3.0]),
        t(vec![2, 1], vec![3.0, -0.5]),
        t(vec![2, 3], vec![1.0, -2.0, 0.5, 0.25, 1.0, 3.0]),
        t(vec![2, 3], vec![0.5, -1.0, 30.0, inf, -inf, 2.0]),
        t(vec![2, 3], vec![1.0, -1.0, -3.0, inf, -inf, 0.0]),
    ];
    let refs: Vec<&Tensor> = ins.iter().collect();
    let out = execute(text, &refs).unwrap_or_else(|e| panic!("{e}"));
    let want: [&[f64]; 6] = [
        &[
            1.4740769841801067,
            -0.3068528194400547,
            30.000000000000004,
            1.3132616875182228,
            -0.6867383124817772,
            2.0067153484891183,
        ],
        &[
            0.3775406687981454,
            -1.0,
            0.49999999999999767,
            0.06723535534249878,
            0.2689414213699951,
            2.9799214472271456,
        ],
        &[
            0.8052239758593558,
            -0.2689414213699951,
            0.020078552772856896,
        ],
        &[
            3.0413812651491097,
            3.1622776601683795,
            30.14962686336267,
            0.5,
            2.0615528128088303,
            2.0615528128088303,
        ],
        &[
            0.1643989873053573,
            0.6324555320336759,
            0.4975185951049946,
            0.0,
            -0.9701425001453319,
            2.9104275004359956,
        ],
        &[-0.8612208127583844, -1.2201425001453319],
    ];
    for (got, want) in out.iter().zip(want) {
        close_to(got, want, 1e-12);
    }
    let inf_case = out[6].to_f64_vec();
    assert_eq!(&inf_case[3..5], &[inf, -inf], "{inf_case:?}");
    close_to(
        &Tensor::from_f64(vec![4], [&inf_case[..3], &inf_case[5..]].concat()),
        &[
            1.4740769841801067,
            -0.3068528194400547,
            30.000000000000004,
            2.1269280110429727,
        ],
        1e-12,
    );
}
