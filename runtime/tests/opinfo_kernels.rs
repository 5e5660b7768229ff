//! Kernels the OpInfo samples (`testdata/opinfo/`) needed beyond the corpus's, on the CPU
//! against PyTorch 2.9.0's results (the numbers under "torch:" were printed by the pinned venv)
//! or against definitions written out here: `amax`/`amin` of bools (any/all), `index_add`,
//! `scatter_add`, `index_copy` and `index_put` of bools (a logical or; a copy), `index_copy`
//! keeping a -0.0, `logsumexp` (stable, PyTorch's per-op rounding in the halves, integers
//! promoted) and `nextafter` of bf16 and f16 (every 16-bit value, against musl's bit step).

mod common;
use common::values;

use half::{bf16, f16};
use tracepass_ir::{parse_trace, DType};
use tracepass_runtime::comm::{CommOptions, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{Backend, BinaryOp, Input, Kernel, ReduceOp, Side};
use tracepass_runtime::run::{run_trace, Named, RunOptions};
use tracepass_runtime::tensor::{Storage, Tensor};

fn run(k: &Kernel, inputs: &[&Tensor]) -> Result<Tensor, String> {
    let ins: Vec<Input<'_, Tensor>> = inputs.iter().map(|t| Input::Tensor(*t)).collect();
    CpuBackend.run(k, &ins).map_err(|e| e.0)
}

fn run1(k: &Kernel, inputs: &[&Tensor]) -> Tensor {
    run(k, inputs).unwrap_or_else(|e| panic!("{k:?}: {e}"))
}

/// Seeded bools, about one in three true.
fn bools(n: usize, seed: u64) -> Vec<bool> {
    values(n, seed).iter().map(|&x| x > 0.33).collect()
}

#[test]
fn amax_and_amin_of_bools_are_any_and_all() {
    let shape = [3usize, 4, 5];
    let v = bools(60, 7);
    let x = Tensor::from_bool(shape, v.clone());
    for (op, any) in [(ReduceOp::Amax, true), (ReduceOp::Amin, false)] {
        for (dims, keepdim) in [(vec![1], false), (vec![0, 2], true), (vec![0, 1, 2], false)] {
            let got = run1(
                &Kernel::Reduce {
                    op,
                    dims: dims.clone(),
                    keepdim,
                    dtype: DType::Bool,
                },
                &[&x],
            );
            assert_eq!(got.dtype(), DType::Bool);
            let kept: Vec<usize> = (0..3)
                .map(|d| if dims.contains(&d) { 1 } else { shape[d] })
                .collect();
            let want_shape: Vec<usize> = if keepdim {
                kept.clone()
            } else {
                (0..3)
                    .filter(|d| !dims.contains(d))
                    .map(|d| shape[d])
                    .collect()
            };
            assert_eq!(got.shape(), want_shape.as_slice());
            // the definition: any/all over the reduced coordinates
            let mut want = vec![!any; kept.iter().product()];
            for (i, &b) in v.iter().enumerate() {
                let c = [i / 20, (i / 5) % 4, i % 5];
                let at = (0..3).fold(0, |at, d| {
                    at * kept[d] + if dims.contains(&d) { 0 } else { c[d] }
                });
                want[at] = if any { want[at] || b } else { want[at] && b };
            }
            assert_eq!(got.to_bool_vec(), want, "{op:?} over {dims:?}");
        }
    }
    // torch: torch.amax(torch.zeros(0, 3, dtype=torch.bool), 0) raises
    let empty = Tensor::from_bool(vec![0, 3], Vec::new());
    let k = Kernel::Reduce {
        op: ReduceOp::Amax,
        dims: vec![0],
        keepdim: false,
        dtype: DType::Bool,
    };
    assert!(run(&k, &[&empty]).is_err());
}

#[test]
fn index_add_and_scatter_add_of_bools_or_the_values_in() {
    // torch: index_add([T, F, F, T], 0, [0, 1, 1, 2], [F, T, T, T]) == [T, T, T, T]
    let a = Tensor::from_bool(vec![4], vec![true, false, false, true]);
    let index = Tensor::from_i64(vec![4], vec![0, 1, 1, 2]);
    let src = Tensor::from_bool(vec![4], vec![false, true, true, true]);
    let got = run1(&Kernel::IndexAdd { dim: 0 }, &[&a, &index, &src]);
    assert_eq!(got.to_bool_vec(), vec![true, true, true, true]);
    let got = run1(&Kernel::ScatterAdd { dim: 0 }, &[&a, &index, &src]);
    assert_eq!(got.to_bool_vec(), vec![true, true, true, true]);
    // against the definition, rows along dim 1 with repeats
    let (shape, m) = ([3usize, 5, 2], 7usize);
    let av = bools(30, 3);
    let sv = bools(3 * m * 2, 4);
    let idx: Vec<i64> = (0..m).map(|k| ((k * 3) % 5) as i64).collect();
    let a = Tensor::from_bool(shape, av.clone());
    let s = Tensor::from_bool(vec![3, m, 2], sv.clone());
    let got = run1(
        &Kernel::IndexAdd { dim: 1 },
        &[&a, &Tensor::from_i64(vec![m], idx.clone()), &s],
    );
    let mut want = av;
    for o in 0..3 {
        for (k, &i) in idx.iter().enumerate() {
            for r in 0..2 {
                want[(o * 5 + i as usize) * 2 + r] |= sv[(o * m + k) * 2 + r];
            }
        }
    }
    assert_eq!(
        (got.dtype(), got.to_bool_vec()),
        (DType::Bool, want),
        "index_add"
    );
    // values of another dtype are refused, as PyTorch refuses them
    let f = Tensor::from_f32(vec![4], vec![1.0; 4]);
    let bad = run(
        &Kernel::IndexAdd { dim: 0 },
        &[&Tensor::from_bool(vec![4], vec![false; 4]), &index, &f],
    );
    assert!(bad.is_err());
}

#[test]
fn index_copy_and_index_put_copy_bools_and_signed_zeros() {
    // torch: index_copy([T, T, F, F], 0, [0, 2], [F, T]) == [F, T, T, F]
    let b = Tensor::from_bool(vec![4], vec![true, true, false, false]);
    let index = Tensor::from_i64(vec![2], vec![0, 2]);
    let src = Tensor::from_bool(vec![2], vec![false, true]);
    let got = run1(&Kernel::IndexCopy { dim: 0 }, &[&b, &index, &src]);
    assert_eq!(got.to_bool_vec(), vec![false, true, true, false]);
    // torch: index_put([T, T, F, F], ([0, 2],), [F, T]) == [F, T, T, F]
    let got = run1(&Kernel::IndexPut { accumulate: false }, &[&b, &src, &index]);
    assert_eq!(got.to_bool_vec(), vec![false, true, true, false]);
    // torch: index_put(.., ([0, 0, 2],), [F, T, T], accumulate=True) == [T, T, T, F]
    let got = run1(
        &Kernel::IndexPut { accumulate: true },
        &[
            &b,
            &Tensor::from_bool(vec![3], vec![false, true, true]),
            &Tensor::from_i64(vec![3], vec![0, 0, 2]),
        ],
    );
    assert_eq!(got.to_bool_vec(), vec![true, true, true, false]);
    // a copy keeps the sign of a zero: torch.index_copy([1., 2.], 0, [1], [-0.]) == [1., -0.]
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let a = Tensor::from_f64(vec![2], vec![1.0, 2.0])
            .to_dtype(dtype)
            .unwrap();
        let z = Tensor::from_f64(vec![1], vec![-0.0])
            .to_dtype(dtype)
            .unwrap();
        let one = Tensor::from_i64(vec![1], vec![1]);
        let got = run1(&Kernel::IndexCopy { dim: 0 }, &[&a, &one, &z]).to_f64_vec();
        assert_eq!(got[0], 1.0);
        assert!(
            got[1] == 0.0 && got[1].is_sign_negative(),
            "{dtype}: {got:?}"
        );
    }
}

fn logsumexp(x: &Tensor, dims: &[usize], keepdim: bool, dtype: DType) -> Tensor {
    run1(
        &Kernel::Logsumexp {
            dims: dims.to_vec(),
            keepdim,
            dtype,
        },
        &[x],
    )
}

#[test]
fn logsumexp_is_stable_and_follows_pytorch() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let x = Tensor::from_f32(
        vec![5, 3],
        vec![
            1.0, 2.0, 3.0, -inf, -inf, -inf, inf, 1.0, 2.0, nan, 1.0, 0.0, 1000.0, 1000.0, -1000.0,
        ],
    );
    // torch: [3.4076058864593506, -inf, inf, nan, 1000.6931762695312]
    let got = logsumexp(&x, &[1], false, DType::F32).to_f32_vec();
    let want = [3.407_606, -inf, inf, nan, 1_000.693_2];
    assert_eq!(got.len(), 5);
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g.is_nan() && w.is_nan()) || g == &w || (g - w).abs() <= 1e-6 * w.abs(),
            "{got:?}"
        );
    }
    // torch: logsumexp of rows 0 and 4 over dim 0, keepdim: [[1000.0, 1000.0, 3.0]]
    let rows = Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 1000.0, 1000.0, -1000.0]);
    let got = logsumexp(&rows, &[0], true, DType::F32);
    assert_eq!(got.shape(), &[1, 3]);
    assert_eq!(got.to_f32_vec(), vec![1000.0, 1000.0, 3.0]);
    // integers and bools promote to the default float: torch.logsumexp([[1, 2, 3],
    // [40, -5, 100]], -1, True) == [[3.4076058864593506], [100.0]] (f32)
    let xi = Tensor::from_i64(vec![2, 3], vec![1, 2, 3, 40, -5, 100]);
    let got = logsumexp(&xi, &[1], true, DType::F32);
    assert_eq!((got.dtype(), got.shape()), (DType::F32, &[2usize, 1][..]));
    let g = got.to_f32_vec();
    assert!((g[0] - 3.407_606).abs() < 1e-6 && g[1] == 100.0, "{g:?}");
    assert_eq!(
        logsumexp(&xi, &[0, 1], false, DType::F32).to_f32_vec(),
        [100.0]
    );
    // torch: logsumexp([[T, F], [F, F]], 1) == [1.31326162815094, 0.6931471824645996]
    let xb = Tensor::from_bool(vec![2, 2], vec![true, false, false, false]);
    let g = logsumexp(&xb, &[1], false, DType::F32).to_f32_vec();
    assert!((g[0] - 1.313_261_6).abs() < 1e-6 && (g[1] - std::f32::consts::LN_2).abs() < 1e-6);
    // torch: over an empty dimension, -inf
    let empty = Tensor::from_f32(vec![3, 0], Vec::new());
    assert_eq!(
        logsumexp(&empty, &[1], false, DType::F32).to_f32_vec(),
        vec![-inf; 3]
    );
}

#[test]
fn logsumexp_of_halves_rounds_after_each_op_as_pytorch() {
    // rows where PyTorch 2.9's CPU result differs from an f32 logsumexp rounded once
    // torch (bf16): [0.150390625, 3.59375, 5.03125]; rounded once: [0.1533, 3.609, 5.0625]
    let bf = [
        -4.5625,
        -2.25,
        -1.9609375,
        -4.84375,
        -0.30078125,
        -1.828125,
        2.09375,
        0.59765625,
        2.59375,
        0.734375,
        -1.9921875,
        2.421875,
        -1.7890625,
        -3.015625,
        -0.6328125,
        -0.0225830078125,
        5.03125,
        0.031005859375,
    ];
    // torch (f16): [2.48828125, 2.7890625, 1.6875]; rounded once: [2.490234375, 2.791015625,
    // 1.6884765625]
    let hf = [
        -2.509765625,
        -4.08203125,
        -0.52783203125,
        -4.44140625,
        1.5810546875,
        1.87109375,
        -0.51953125,
        2.0234375,
        -3.419921875,
        0.80322265625,
        -1.9912109375,
        1.744140625,
        -1.2197265625,
        -0.96435546875,
        -0.36767578125,
        -3.8671875,
        -0.1351318359375,
        1.146484375,
    ];
    for (dtype, v, want) in [
        (DType::BF16, &bf, [0.150390625, 3.59375, 5.03125]),
        (DType::F16, &hf, [2.48828125, 2.7890625, 1.6875]),
    ] {
        let x = Tensor::from_f64(vec![3, 6], v.to_vec())
            .to_dtype(dtype)
            .unwrap();
        let got = logsumexp(&x, &[1], false, dtype);
        assert_eq!(got.dtype(), dtype);
        assert_eq!(got.to_f64_vec(), want.to_vec(), "{dtype}");
    }
}

/// musl's `nextafter` on a 16-bit representation, as `c10::nextafter` steps bf16 (and
/// PyTorch 2.9's CPU kernel f16): the definition the composite is checked against.
fn next16(from: u16, to: u16, is_nan: impl Fn(u16) -> bool) -> Option<u16> {
    if is_nan(from) || is_nan(to) {
        return None; // NaN
    }
    if from == to {
        return Some(from);
    }
    let sign = 0x8000u16;
    let (af, at) = (from & !sign, to & !sign);
    if af == 0 {
        return Some(if at == 0 { to } else { (to & sign) | 1 });
    }
    Some(if af > at || (from ^ to) & sign != 0 {
        from - 1
    } else {
        from + 1
    })
}

fn bits_tensor(dtype: DType, bits: &[u16]) -> Tensor {
    let n = vec![bits.len()];
    match dtype {
        DType::BF16 => Tensor::new(
            n,
            Storage::BF16(bits.iter().map(|&b| bf16::from_bits(b)).collect()),
        ),
        _ => Tensor::new(
            n,
            Storage::F16(bits.iter().map(|&b| f16::from_bits(b)).collect()),
        ),
    }
}

fn bits_of(t: &Tensor) -> Vec<u16> {
    match t.storage() {
        Storage::BF16(v) => v.iter().map(|x| x.to_bits()).collect(),
        Storage::F16(v) => v.iter().map(|x| x.to_bits()).collect(),
        other => panic!("not a 16-bit float: {other:?}"),
    }
}

#[test]
fn nextafter_steps_every_bf16_and_f16_value_as_pytorch() {
    let k = Kernel::Binary {
        op: BinaryOp::Nextafter,
        a: Side::Input(0),
        b: Side::Input(1),
        alpha: 1.0,
    };
    for dtype in [DType::BF16, DType::F16] {
        let is_nan = |b: u16| match dtype {
            DType::BF16 => bf16::from_bits(b).is_nan(),
            _ => f16::from_bits(b).is_nan(),
        };
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let from = bits_tensor(dtype, &all);
        // toward +inf, -inf, +0, -0, 1.0, a NaN and a seeded partner
        let one = match dtype {
            DType::BF16 => bf16::ONE.to_bits(),
            _ => f16::ONE.to_bits(),
        };
        let mut seed = 0x2545_F491u32;
        let partner: Vec<u16> = all
            .iter()
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                seed as u16
            })
            .collect();
        let (pinf, ninf) = match dtype {
            DType::BF16 => (bf16::INFINITY.to_bits(), bf16::NEG_INFINITY.to_bits()),
            _ => (f16::INFINITY.to_bits(), f16::NEG_INFINITY.to_bits()),
        };
        let targets: Vec<(&str, Vec<u16>)> = vec![
            ("+inf", vec![pinf; all.len()]),
            ("-inf", vec![ninf; all.len()]),
            ("+0", vec![0; all.len()]),
            ("-0", vec![0x8000; all.len()]),
            ("1", vec![one; all.len()]),
            ("nan", vec![pinf | 0x40; all.len()]),
            ("seeded", partner),
        ];
        for (what, to) in targets {
            let got = bits_of(&run1(&k, &[&from, &bits_tensor(dtype, &to)]));
            for ((&f, &t), &g) in all.iter().zip(&to).zip(&got) {
                match next16(f, t, is_nan) {
                    None => assert!(is_nan(g), "{dtype} {f:#06x} toward {what}: {g:#06x}"),
                    Some(w) => {
                        assert_eq!(g, w, "{dtype}: nextafter({f:#06x}, {t:#06x}) toward {what}")
                    }
                }
            }
        }
    }
}

#[test]
fn nextafter_of_halves_matches_pytorchs_printed_results() {
    // torch 2.9.0: nextafter(a, b).view(torch.int16) for these pairs
    let a = [1.0, 1.0, 0.0, 0.0, -0.0, 1.0, f64::INFINITY, -1.0, 2.0];
    let b = [2.0, 0.0, 1.0, -0.0, 0.0, 1.0, 0.0, -2.0, 0.0];
    let want_bf16: [i16; 9] = [16257, 16255, 1, -32768, 0, 16256, 32639, -16511, 16383];
    let want_f16: [i16; 9] = [15361, 15359, 1, -32768, 0, 15360, 31743, -17407, 16383];
    for (dtype, want) in [(DType::BF16, want_bf16), (DType::F16, want_f16)] {
        let t = |v: &[f64]| {
            Tensor::from_f64(vec![v.len()], v.to_vec())
                .to_dtype(dtype)
                .unwrap()
        };
        let k = Kernel::Binary {
            op: BinaryOp::Nextafter,
            a: Side::Input(0),
            b: Side::Input(1),
            alpha: 1.0,
        };
        let got: Vec<i16> = bits_of(&run1(&k, &[&t(&a), &t(&b)]))
            .into_iter()
            .map(|b| b as i16)
            .collect();
        assert_eq!(got, want, "{dtype}");
    }
    // past the largest finite f16 is infinity: torch gives inf for nextafter(65504, inf)
    let big = Tensor::from_f64(vec![1], vec![65504.0])
        .to_dtype(DType::F16)
        .unwrap();
    let k = Kernel::Binary {
        op: BinaryOp::Nextafter,
        a: Side::Input(0),
        b: Side::Scalar(f64::INFINITY),
        alpha: 1.0,
    };
    assert_eq!(run1(&k, &[&big]).to_f64_vec(), vec![f64::INFINITY]);
}

#[test]
fn thunders_logsumexp_and_bool_amax_statements_run() {
    // as Thunder 0.2.6 prints them for int64 and bool inputs (testdata/opinfo)
    let text = r#"import torch

@torch.no_grad()
def computation(t_0, t_1):
  # t_0: "cpu i64[4, 4]"
  # t_1: "cpu b8[2, 3]"
  t61 = torch.logsumexp(t_0, (0, 1), False)  # t61: "cpu f32[]"
  t62 = torch.amax(t_1, None, False)  # t62: "cpu b8[]"
  t63 = torch.amin(t_1, [1], True)  # t63: "cpu b8[2, 1]"
  return (t61, t62, t63)
"#;
    let trace = parse_trace(text).expect("parses");
    let mut inputs = Named::new();
    let ints: Vec<i64> = (0..16).map(|i| (i * 7 % 11) as i64 - 5).collect();
    inputs.insert("t_0".into(), Tensor::from_i64(vec![4, 4], ints.clone()));
    inputs.insert(
        "t_1".into(),
        Tensor::from_bool(vec![2, 3], vec![true, true, true, false, true, false]),
    );
    let group = ThreadGroup::new(1, CommOptions::default());
    let mut comm = group.comm(0);
    let out = run_trace(
        &CpuBackend,
        &mut comm,
        &trace,
        &inputs,
        RunOptions::default(),
    )
    .expect("runs");
    let lse = out["t61"].to_f64_vec()[0];
    let want = ints.iter().map(|&i| (i as f64).exp()).sum::<f64>().ln();
    assert!((lse - want).abs() < 1e-5 * want.abs(), "{lse} vs {want}");
    assert_eq!(out["t62"].to_bool_vec(), vec![true]);
    assert_eq!(out["t63"].to_bool_vec(), vec![true, false]);
    assert_eq!(out["t63"].shape(), &[2, 1]);
}

fn grouped_mm(a: &Tensor, b: &Tensor, offsets: Option<&[i32]>) -> Result<Tensor, String> {
    match offsets {
        Some(o) => {
            let offs = Tensor::new(vec![o.len()], Storage::I32(o.to_vec()));
            run(&Kernel::GroupedMm { offsets: true }, &[a, b, &offs])
        }
        None => run(&Kernel::GroupedMm { offsets: false }, &[a, b]),
    }
}

/// `x[r0..r1, c0..c1] @ y[k..]` of row-major matrices as f64: the definition each group's
/// product is checked against.
fn mm(
    x: &[f64],
    xcols: usize,
    rows: (usize, usize),
    inner: (usize, usize),
    y: &[f64],
    ycols: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; (rows.1 - rows.0) * ycols];
    for r in rows.0..rows.1 {
        for c in 0..ycols {
            out[(r - rows.0) * ycols + c] = (inner.0..inner.1)
                .map(|k| x[r * xcols + k] * y[(k - inner.0) * ycols + c])
                .sum();
        }
    }
    out
}

#[test]
fn grouped_mm_multiplies_each_group_as_pytorch() {
    // torch: _grouped_mm(a, b, offs=[1, 4]) of these (f32; the offsets' first group one row)
    let a = Tensor::from_f32(
        vec![4, 4],
        vec![
            1., 2., 1., 2., 3., 4., 3., 4., 5., 6., 5., 6., 7., 8., 7., 8.,
        ],
    );
    let b = Tensor::from_f32(vec![2, 4, 4], (0..32).map(|v| v as f32 / 8.0).collect());
    let got = grouped_mm(&a, &b, Some(&[1, 4])).unwrap();
    assert_eq!(got.shape(), &[4, 4]);
    assert_eq!(
        got.to_f32_vec(),
        vec![
            5.0, 5.75, 6.5, 7.25, 39.0, 40.75, 42.5, 44.25, 61.0, 63.75, 66.5, 69.25, 83.0, 86.75,
            90.5, 94.25
        ]
    );
    // every layout against the definition, in bf16 (f32 accumulation, rounded once)
    let (m, k, n, g) = (6usize, 8usize, 5usize, 3usize);
    let bf = |shape: Vec<usize>, seed| {
        let n: usize = shape.iter().product();
        let t = Tensor::from_f64(shape, values(n, seed))
            .to_dtype(DType::BF16)
            .unwrap();
        let held = t.to_f64_vec();
        (t, held)
    };
    let close = |got: &Tensor, want: &[f64], what: &str| {
        assert_eq!(got.dtype(), DType::BF16, "{what}");
        for (i, (x, w)) in got.to_f64_vec().iter().zip(want).enumerate() {
            assert!(
                (x - w).abs() <= 8e-3 * (1.0 + w.abs()),
                "{what}[{i}]: {x} vs {w}"
            );
        }
    };
    // rows grouped: (m, k) x (G, k, n), rows 5.. uncovered (0)
    let (a, av) = bf(vec![m, k], 1);
    let (b, bv) = bf(vec![g, k, n], 2);
    let got = grouped_mm(&a, &b, Some(&[2, 2, 5])).unwrap();
    let mut want = mm(&av, k, (0, 2), (0, k), &bv[..k * n], n);
    want.extend(mm(&av, k, (2, 5), (0, k), &bv[2 * k * n..], n));
    want.extend(vec![0.0; n]);
    assert_eq!(got.shape(), &[m, n]);
    close(&got, &want, "rows");
    // columns grouped: (G, m, k) x (k, n)
    let (a3, a3v) = bf(vec![g, m, k], 3);
    let (b2, b2v) = bf(vec![k, n], 4);
    let got = grouped_mm(&a3, &b2, Some(&[1, 1, 4])).unwrap();
    let cols = |gi: usize, c0: usize, c1: usize| -> Vec<f64> {
        let ysub: Vec<f64> = (0..k)
            .flat_map(|r| b2v[r * n + c0..r * n + c1].to_vec())
            .collect();
        mm(
            &a3v[gi * m * k..(gi + 1) * m * k],
            k,
            (0, m),
            (0, k),
            &ysub,
            c1 - c0,
        )
    };
    let (c0, c2) = (cols(0, 0, 1), cols(2, 1, 4));
    let want: Vec<f64> = (0..m)
        .flat_map(|r| {
            let mut row = vec![c0[r]];
            row.extend(&c2[r * 3..r * 3 + 3]);
            row.push(0.0);
            row
        })
        .collect();
    assert_eq!(got.shape(), &[m, n]);
    close(&got, &want, "columns");
    // inner dimension grouped: (m, k) x (k, n) -> (G, m, n), an empty group all 0
    let (b2k, b2kv) = bf(vec![k, n], 5);
    let got = grouped_mm(&a, &b2k, Some(&[3, 3, 8])).unwrap();
    let mut want = mm(&av, k, (0, m), (0, 3), &b2kv[..3 * n], n);
    want.extend(vec![0.0; m * n]);
    want.extend(mm(&av, k, (0, m), (3, 8), &b2kv[3 * n..], n));
    assert_eq!(got.shape(), &[g, m, n]);
    close(&got, &want, "inner");
    // no offsets: a batched product
    let (b3, b3v) = bf(vec![g, k, n], 6);
    let got = grouped_mm(&a3, &b3, None).unwrap();
    let want: Vec<f64> = (0..g)
        .flat_map(|gi| {
            mm(
                &a3v[gi * m * k..(gi + 1) * m * k],
                k,
                (0, m),
                (0, k),
                &b3v[gi * k * n..(gi + 1) * k * n],
                n,
            )
        })
        .collect();
    close(&got, &want, "batched");
    // offsets that decrease or run past the grouped dimension are refused
    assert!(grouped_mm(&a, &b, Some(&[4, 2, 5])).is_err());
    assert!(grouped_mm(&a, &b, Some(&[2, 4, 7])).is_err());
}

#[test]
fn thunders_grouped_mm_statement_parses_verifies_and_runs() {
    // as Thunder 0.2.6 prints it (testdata/opinfo/_grouped_mm/bf16-0)
    let text = r#"import torch

@torch.no_grad()
def computation(t_0, t_1, t_2):
  # t_0: "cpu bf16[16, 32]"
  # t_1: "cpu bf16[2, 32, 64]"
  # t_2: "cpu i32[2]"
  t4 = torch._grouped_mm(t_0, t_1, t_2)  # t4: "cpu bf16[16, 64]"
  return (t4,)
"#;
    let trace = parse_trace(text).expect("parses");
    tracepass_ir::verify(&trace).expect("verifies");
    // the meta refuses what PyTorch refuses: mismatched groups, offsets of another dtype
    for bad in [
        text.replace("bf16[2, 32, 64]", "bf16[3, 32, 64]"),
        text.replace("i32[2]", "i64[2]"),
        text.replace("t4: \"cpu bf16[16, 64]", "t4: \"cpu bf16[16, 32]"),
    ] {
        let refused = parse_trace(&bad).map(|t| tracepass_ir::verify(&t).is_err());
        assert!(refused.unwrap_or(true), "accepted:\n{bad}");
    }
    let mut inputs = Named::new();
    let a = Tensor::from_f64(vec![16, 32], values(512, 11))
        .to_dtype(DType::BF16)
        .unwrap();
    let b = Tensor::from_f64(vec![2, 32, 64], values(4096, 12))
        .to_dtype(DType::BF16)
        .unwrap();
    inputs.insert("t_0".into(), a.clone());
    inputs.insert("t_1".into(), b.clone());
    inputs.insert(
        "t_2".into(),
        Tensor::new(vec![2], Storage::I32(vec![0, 16])),
    );
    let group = ThreadGroup::new(1, CommOptions::default());
    let mut comm = group.comm(0);
    let out = run_trace(
        &CpuBackend,
        &mut comm,
        &trace,
        &inputs,
        RunOptions::default(),
    )
    .expect("runs");
    // the first group is empty: every row is a @ b[1]
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let want = mm(&av, 32, (0, 16), (0, 32), &bv[32 * 64..], 64);
    let got = out["t4"].to_f64_vec();
    assert_eq!(out["t4"].shape(), &[16, 64]);
    for (x, w) in got.iter().zip(&want) {
        assert!((x - w).abs() <= 8e-3 * (1.0 + w.abs()), "{x} vs {w}");
    }
}
