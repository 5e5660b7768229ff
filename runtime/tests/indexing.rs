//! Indexing and sorting along a dimension (`gather`, `scatter_add`, `index_select`,
//! `index_add`, `sort`, `argsort`, `topk`) on the CPU against their definitions, written out
//! here over explicit coordinates in f64; then Thunder 0.2.6's printed statements (copied from
//! real exports) run through `Plan::compile` and the executor.

mod common;
use common::values;

use tracepass_ir::{parse_trace, DType};
use tracepass_runtime::comm::{CommOptions, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{Backend, Clock, Executor, Input, Kernel, Plan, RValue, Recording};
use tracepass_runtime::tensor::Tensor;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::BF16, DType::F16];

/// A tensor of `dtype` and the f64 values it holds (rounded to the dtype first, so the
/// definition reads the very numbers the kernel does); integers are the values times 100.
fn input(shape: &[usize], seed: u64, dtype: DType) -> (Tensor, Vec<f64>) {
    let n = shape.iter().product();
    let v: Vec<f64> = match dtype {
        DType::I64 | DType::I32 => values(n, seed)
            .iter()
            .map(|x| (x * 100.0).trunc())
            .collect(),
        _ => values(n, seed),
    };
    let t = Tensor::from_f64(shape, v)
        .to_dtype(dtype)
        .expect("a cpu dtype");
    let held = t.to_f64_vec();
    (t, held)
}

/// Indices in `0..size` with repeats: `(k * 7 + seed) % size` for each of `n` positions.
fn indices(shape: &[usize], size: usize, seed: usize, dtype: DType) -> (Tensor, Vec<usize>) {
    let n: usize = shape.iter().product();
    let v: Vec<usize> = (0..n).map(|k| (k * 7 + seed) % size).collect();
    let t = Tensor::from_i64(shape, v.iter().map(|&i| i as i64).collect())
        .to_dtype(dtype)
        .expect("an index dtype");
    (t, v)
}

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

/// The row-major coordinates of element `i` of `shape`.
fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

/// The row-major position of coordinates `c` in `shape`.
fn flat(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |at, (x, n)| at * n + x)
}

/// How far a sum may be off in `dtype`, relative to the sum of its terms' magnitudes: f32
/// accumulation for f32 and the halves (rounded once), f64 for f64.
fn tol(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-13,
        DType::F32 => 1e-6,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        _ => 0.0,
    }
}

fn assert_sums(got: &Tensor, want: &[f64], scale: &[f64], what: &str) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{what}: element count");
    let d = got.dtype();
    for (i, ((x, w), s)) in g.iter().zip(want).zip(scale).enumerate() {
        assert!(
            (x - w).abs() <= tol(d) * s.max(1e-30),
            "{what} in {d}: element {i} is {x}, the definition gives {w}"
        );
    }
}

// ----- the definitions -----

/// `out[p] = a[p with p[dim] = index[p]]`.
fn gather_def(a: &[f64], ash: &[usize], dim: usize, idx: &[usize], ish: &[usize]) -> Vec<f64> {
    (0..idx.len())
        .map(|p| {
            let mut c = coords(p, ish);
            if !c.is_empty() {
                c[dim] = idx[p];
            }
            a[flat(&c, ash)]
        })
        .collect()
}

/// `out = a`; `out[p with p[dim] = index[p]] += src[p]` for every position `p` of the index.
/// Also gives each element's scale (the magnitudes added there).
fn scatter_add_def(
    a: &[f64],
    ash: &[usize],
    dim: usize,
    idx: &[usize],
    ish: &[usize],
    src: &[f64],
    ssh: &[usize],
) -> (Vec<f64>, Vec<f64>) {
    let mut out = a.to_vec();
    let mut scale: Vec<f64> = a.iter().map(|x| x.abs()).collect();
    for (p, &i) in idx.iter().enumerate() {
        let c = coords(p, ish);
        let s = src[flat(&c, ssh)];
        let mut to = c;
        if !to.is_empty() {
            to[dim] = i;
        }
        let at = flat(&to, ash);
        out[at] += s;
        scale[at] += s.abs();
    }
    (out, scale)
}

/// `out[..., i, ...] = a[..., index[i], ...]` along `dim`.
fn index_select_def(a: &[f64], ash: &[usize], dim: usize, idx: &[usize]) -> (Vec<f64>, Vec<usize>) {
    if ash.is_empty() {
        return (vec![a[0]], vec![]);
    }
    let mut osh = ash.to_vec();
    osh[dim] = idx.len();
    let n: usize = osh.iter().product();
    let v = (0..n)
        .map(|e| {
            let mut c = coords(e, &osh);
            c[dim] = idx[c[dim]];
            a[flat(&c, ash)]
        })
        .collect();
    (v, osh)
}

/// `out = a`; `out[..., index[i], ...] += source[..., i, ...]` for every `i`.
fn index_add_def(
    a: &[f64],
    ash: &[usize],
    dim: usize,
    idx: &[usize],
    src: &[f64],
    ssh: &[usize],
) -> (Vec<f64>, Vec<f64>) {
    let mut out = a.to_vec();
    let mut scale: Vec<f64> = a.iter().map(|x| x.abs()).collect();
    for (k, s) in src.iter().enumerate() {
        let mut c = coords(k, ssh);
        if !c.is_empty() {
            c[dim] = idx[c[dim]];
        }
        let at = flat(&c, ash);
        out[at] += s;
        scale[at] += s.abs();
    }
    (out, scale)
}

/// `a` sorts strictly before `b` ascending: PyTorch puts NaN above every number.
fn before(a: f64, b: f64) -> bool {
    !a.is_nan() && (b.is_nan() || a < b)
}

/// The stable order of `v`: each position inserted before the first one it sorts strictly
/// before, so equal values keep their index order.
fn stable_order(v: &[f64], descending: bool) -> Vec<usize> {
    let mut order: Vec<usize> = Vec::with_capacity(v.len());
    for j in 0..v.len() {
        let at = order
            .iter()
            .position(|&q| {
                if descending {
                    before(v[q], v[j])
                } else {
                    before(v[j], v[q])
                }
            })
            .unwrap_or(order.len());
        order.insert(at, j);
    }
    order
}

/// The first `take` of each line's stable order along `dim`: (values, indices), shaped as
/// `shape` with `dim` resized to `take`.
fn sorted_def(
    v: &[f64],
    shape: &[usize],
    dim: usize,
    descending: bool,
    take: usize,
) -> (Vec<f64>, Vec<i64>) {
    if shape.is_empty() {
        // PyTorch: a 0-d input gives itself, even for topk's k = 0
        return (v.to_vec(), vec![0]);
    }
    let mut osh = shape.to_vec();
    osh[dim] = take;
    let n: usize = osh.iter().product();
    let (mut vals, mut idx) = (vec![0.0; n], vec![0i64; n]);
    for e in 0..n {
        let c = coords(e, &osh);
        let line: Vec<f64> = (0..shape[dim])
            .map(|j| {
                let mut q = c.clone();
                q[dim] = j;
                v[flat(&q, shape)]
            })
            .collect();
        let j = stable_order(&line, descending)[c[dim]];
        vals[e] = line[j];
        idx[e] = j as i64;
    }
    (vals, idx)
}

/// Bitwise equality of values as f64 (NaN equal to NaN, -0.0 and 0.0 told apart).
fn same_values(got: &Tensor, want: &[f64], what: &str) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{what}: element count");
    for (i, (x, w)) in g.iter().zip(want).enumerate() {
        assert!(
            x.to_bits() == w.to_bits() || (x.is_nan() && w.is_nan()),
            "{what}: element {i} is {x}, the definition gives {w}"
        );
    }
}

// ----- kernels against the definitions -----

/// (input shape, index shape, src shape, dim) of a gather or scatter_add.
type GatherCase = (&'static [usize], &'static [usize], &'static [usize], usize);

/// Index larger than the input along `dim` and smaller elsewhere, src larger than the index,
/// a 0-d case.
const GATHER_CASES: &[GatherCase] = &[
    (&[4, 16], &[4, 8], &[4, 8], 1),
    (&[3, 4], &[2, 9], &[3, 10], 1),
    (&[5, 2, 3], &[7, 2, 2], &[7, 3, 2], 0),
    (&[2, 3, 4], &[1, 2, 6], &[2, 2, 6], 2),
    (&[2, 3, 4], &[2, 3, 4], &[2, 3, 4], 1),
    (&[], &[], &[], 0),
];

#[test]
fn gather_copies_what_the_definition_picks_in_every_dtype() {
    for (case, &(ash, ish, _, dim)) in GATHER_CASES.iter().enumerate() {
        for dtype in FLOATS.into_iter().chain([DType::I64, DType::I32]) {
            for idt in [DType::I64, DType::I32] {
                let (a, av) = input(ash, case as u64 + 1, dtype);
                let size = ash.get(dim).copied().unwrap_or(1);
                let (i, iv) = indices(ish, size, case, idt);
                let got = run1(&Kernel::Gather { dim }, &[&a, &i]);
                assert_eq!((got.shape(), got.dtype()), (ish, dtype));
                let what = format!("gather {ash:?} by {ish:?} along {dim} in {dtype}");
                same_values(&got, &gather_def(&av, ash, dim, &iv, ish), &what);
            }
        }
    }
}

#[test]
fn scatter_add_accumulates_duplicates_as_the_definition() {
    for (case, &(ash, ish, ssh, dim)) in GATHER_CASES.iter().enumerate() {
        for dtype in FLOATS.into_iter().chain([DType::I64]) {
            let (a, av) = input(ash, case as u64 + 11, dtype);
            let (src, sv) = input(ssh, case as u64 + 21, dtype);
            let size = ash.get(dim).copied().unwrap_or(1);
            let (i, iv) = indices(ish, size, case, DType::I64);
            let got = run1(&Kernel::ScatterAdd { dim }, &[&a, &i, &src]);
            assert_eq!((got.shape(), got.dtype()), (ash, dtype));
            let (want, scale) = scatter_add_def(&av, ash, dim, &iv, ish, &sv, ssh);
            let what = format!("scatter_add {ish:?} into {ash:?} along {dim}");
            assert_sums(&got, &want, &scale, &what);
        }
    }
    // every index the same: one element takes the sum of a whole line
    let z = Tensor::zeros(vec![2, 5], DType::F32).unwrap();
    let i = Tensor::from_i64(vec![2, 4], vec![3; 8]);
    let ones = Tensor::from_f32(vec![2, 4], vec![0.5; 8]);
    let s = run1(&Kernel::ScatterAdd { dim: 1 }, &[&z, &i, &ones]);
    assert_eq!(s.to_f32_vec(), [0., 0., 0., 2., 0., 0., 0., 0., 2., 0.]);
}

/// (input shape, number of indices or `None` for a 0-d index, dim).
const SELECT_CASES: &[(&[usize], Option<usize>, usize)] = &[
    (&[32, 16], Some(16), 0),
    (&[3, 5, 4], Some(7), 1),
    (&[3, 5, 4], None, 2),
    (&[6], Some(10), 0),
    (&[3, 5, 4], Some(0), 1),
];

#[test]
fn index_select_and_index_add_match_their_definitions() {
    for (case, &(ash, count, dim)) in SELECT_CASES.iter().enumerate() {
        let ish: Vec<usize> = count.map_or(vec![], |n| vec![n]);
        for dtype in FLOATS.into_iter().chain([DType::I64]) {
            let (a, av) = input(ash, case as u64 + 31, dtype);
            let (i, iv) = indices(&ish, ash[dim], case, DType::I64);
            let got = run1(&Kernel::IndexSelect { dim }, &[&a, &i]);
            let (want, osh) = index_select_def(&av, ash, dim, &iv);
            assert_eq!(got.shape(), osh.as_slice());
            let what = format!("index_select {ash:?} along {dim} in {dtype}");
            same_values(&got, &want, &what);

            // index_add's source is index_select's output shape
            let (src, sv) = input(&osh, case as u64 + 41, dtype);
            let got = run1(&Kernel::IndexAdd { dim }, &[&a, &i, &src]);
            assert_eq!((got.shape(), got.dtype()), (ash, dtype));
            let (want, scale) = index_add_def(&av, ash, dim, &iv, &sv, &osh);
            let what = format!("index_add into {ash:?} along {dim} in {dtype}");
            assert_sums(&got, &want, &scale, &what);
        }
    }
    // i32 indices as PyTorch takes them
    let (a, av) = input(&[4, 3], 5, DType::F32);
    let i = Tensor::from_i64(vec![3], vec![3, 3, 0])
        .to_dtype(DType::I32)
        .unwrap();
    let got = run1(&Kernel::IndexSelect { dim: 0 }, &[&a, &i]);
    same_values(
        &got,
        &index_select_def(&av, &[4, 3], 0, &[3, 3, 0]).0,
        "i32",
    );
}

/// Values with ties (quarters), NaNs, -0.0 and 0.0.
fn with_ties(shape: &[usize], seed: u64, dtype: DType) -> (Tensor, Vec<f64>) {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = values(n, seed)
        .iter()
        .enumerate()
        .map(|(k, x)| match k % 11 {
            3 => f64::NAN,
            5 => -0.0,
            7 => 0.0,
            _ => (x * 4.0).round() / 4.0,
        })
        .map(|x| match dtype {
            DType::I64 => {
                if x.is_nan() {
                    7.0
                } else {
                    x * 4.0
                }
            }
            _ => x,
        })
        .collect();
    let t = Tensor::from_f64(shape, v).to_dtype(dtype).unwrap();
    let held = t.to_f64_vec();
    (t, held)
}

#[test]
fn sort_argsort_and_topk_are_stable_with_nan_above_everything() {
    let cases: &[(&[usize], usize)] = &[
        (&[4, 16], 1),
        (&[5, 3, 4], 0),
        (&[5, 3, 4], 1),
        (&[5, 3, 4], 2),
        (&[33], 0),
        (&[], 0),
    ];
    for (case, &(shape, dim)) in cases.iter().enumerate() {
        for dtype in FLOATS.into_iter().chain([DType::I64]) {
            let (x, xv) = with_ties(shape, case as u64 + 51, dtype);
            let len = shape.get(dim).copied().unwrap_or(1);
            for descending in [false, true] {
                let what = format!("sort {shape:?} along {dim} in {dtype}, desc {descending}");
                let (want_v, want_i) = sorted_def(&xv, shape, dim, descending, len);
                let out = run(&Kernel::Sort { dim, descending }, &[&x]).unwrap();
                assert_eq!(out.len(), 2);
                assert_eq!((out[0].shape(), out[0].dtype()), (shape, dtype));
                assert_eq!((out[1].shape(), out[1].dtype()), (shape, DType::I64));
                same_values(&out[0], &want_v, &what);
                assert_eq!(out[1].to_i64_vec(), want_i, "{what}");
                let a = run1(&Kernel::Argsort { dim, descending }, &[&x]);
                assert_eq!(a.to_i64_vec(), want_i, "arg{what}");
            }
            for k in [0, 1, len.min(3), len] {
                for largest in [true, false] {
                    let what = format!("topk {k} of {shape:?} along {dim} in {dtype}");
                    let (want_v, want_i) = sorted_def(&xv, shape, dim, largest, k);
                    let out = run(&Kernel::Topk { k, dim, largest }, &[&x]).unwrap();
                    same_values(&out[0], &want_v, &what);
                    assert_eq!(out[1].to_i64_vec(), want_i, "{what}");
                }
            }
        }
    }
    let (a, _) = input(&[3, 4], 1, DType::F32);
    let e = run(
        &Kernel::Topk {
            k: 5,
            dim: 1,
            largest: true,
        },
        &[&a],
    )
    .unwrap_err();
    assert!(e.contains("topk: 5 elements asked of dimension 1"), "{e}");
}

#[test]
fn out_of_range_indices_and_bad_operands_are_clear_errors() {
    let (a, _) = input(&[3, 4], 1, DType::F32);
    let bad = Tensor::from_i64(vec![1, 2], vec![0, 4]);
    let e = run(&Kernel::Gather { dim: 1 }, &[&a, &bad]).unwrap_err();
    assert_eq!(
        e,
        "gather: index 4 is out of bounds for dimension 1 with size 4"
    );
    let neg = Tensor::from_i64(vec![1, 2], vec![-1, 0]);
    let e = run(&Kernel::Gather { dim: 1 }, &[&a, &neg]).unwrap_err();
    assert_eq!(
        e,
        "gather: index -1 is out of bounds for dimension 1 with size 4"
    );
    let src = Tensor::from_f32(vec![1, 2], vec![1.0, 2.0]);
    let e = run(&Kernel::ScatterAdd { dim: 1 }, &[&a, &bad, &src]).unwrap_err();
    assert!(e.contains("index 4 is out of bounds"), "{e}");
    let v = Tensor::from_i64(vec![2], vec![1, 3]);
    let e = run(&Kernel::IndexSelect { dim: 0 }, &[&a, &v]).unwrap_err();
    assert_eq!(
        e,
        "index_select: index 3 is out of bounds for dimension 0 with size 3"
    );
    let rows = Tensor::from_f32(vec![2, 4], vec![1.0; 8]);
    let e = run(&Kernel::IndexAdd { dim: 0 }, &[&a, &v, &rows]).unwrap_err();
    assert!(e.contains("index_add: index 3 is out of bounds"), "{e}");
    // operands PyTorch refuses
    let f = Tensor::from_f32(vec![1, 2], vec![0.0, 1.0]);
    let e = run(&Kernel::Gather { dim: 1 }, &[&a, &f]).unwrap_err();
    assert!(e.contains("must be an i64 or i32 tensor, got f32"), "{e}");
    let tall = Tensor::from_i64(vec![4, 1], vec![0; 4]);
    let e = run(&Kernel::Gather { dim: 1 }, &[&a, &tall]).unwrap_err();
    assert!(
        e.contains("larger than the input [3, 4] in dimension 0"),
        "{e}"
    );
    let d64 = Tensor::from_f64(vec![1, 2], vec![1.0, 2.0]);
    let ok = Tensor::from_i64(vec![1, 2], vec![0, 1]);
    let e = run(&Kernel::ScatterAdd { dim: 1 }, &[&a, &ok, &d64]).unwrap_err();
    assert!(e.contains("src is f64, the input f32"), "{e}");
    let wide = Tensor::from_f32(vec![2, 5], vec![1.0; 10]);
    let pair = Tensor::from_i64(vec![2], vec![0, 1]);
    let e = run(&Kernel::IndexAdd { dim: 0 }, &[&a, &pair, &wide]).unwrap_err();
    assert!(e.contains("source [2, 5] must be the input [3, 4]"), "{e}");
    let e = run(&Kernel::IndexAdd { dim: 0 }, &[&a, &ok, &rows]).unwrap_err();
    assert!(e.contains("the index must be a vector"), "{e}");
}

// ----- Thunder's printed statements through the plan and the executor -----

/// Runs a trace's computation on the CPU with `args` in order; its returned values.
fn execute(text: &str, args: Vec<Tensor>) -> Vec<Tensor> {
    let t = parse_trace(text).unwrap_or_else(|e| panic!("{e}"));
    let results: Vec<_> = t.returned_values().into_iter().map(Some).collect();
    let plan = Plan::compile(&t, &results).unwrap_or_else(|e| panic!("{e}"));
    let g = ThreadGroup::new(1, CommOptions::default());
    Executor::<CpuBackend, _>::new()
        .run(
            &plan,
            &CpuBackend,
            &mut g.comm(0),
            args.into_iter().map(RValue::Tensor).collect(),
            &Clock::new(false),
            &mut Recording::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|v| match v {
            RValue::Tensor(t) => t,
            _ => panic!("a returned value is not a tensor"),
        })
        .collect()
}

#[test]
fn thunders_gather_and_scatter_add_statements_run() {
    // from a Thunder 0.2.6 export of `torch.gather(h, 1, i)` and its backward
    let text = r#"def computation(t65, t67, t72):
  # t65: "cpu f32[4, 16]"
  # t67: "cpu i64[4, 8]"
  # t72: "cpu f32[4, 8]"
  t68 = torch.gather(t65, 1, t67)  # t68: "cpu f32[4, 8]"
  t80 = torch.full((4, 16), 0, device=torch.device("cpu"), dtype=torch.float32)  # t80: "cpu f32[4, 16]"
  t81 = torch.scatter_add(t80, 1, t67, t72)  # t81: "cpu f32[4, 16]"
  t90 = torch.gather(t65, -1, t67)  # t90: "cpu f32[4, 8]"
  return (t68, t81, t90)
"#;
    let (h, hv) = input(&[4, 16], 61, DType::F32);
    let (i, iv) = indices(&[4, 8], 16, 5, DType::I64);
    let (g, gv) = input(&[4, 8], 62, DType::F32);
    let out = execute(text, vec![h, i, g]);
    let want = gather_def(&hv, &[4, 16], 1, &iv, &[4, 8]);
    same_values(&out[0], &want, "gather");
    same_values(&out[2], &want, "gather along -1");
    let (want, scale) = scatter_add_def(&[0.0; 64], &[4, 16], 1, &iv, &[4, 8], &gv, &[4, 8]);
    assert_sums(&out[1], &want, &scale, "scatter_add");
}

#[test]
fn thunders_argsort_statement_runs() {
    // from a Thunder 0.2.6 export of `torch.gather(h, 1, torch.argsort(h, dim=1)[:, :8])`
    let text = r#"def computation(t65):
  # t65: "cpu f32[4, 16]"
  t66 = torch.argsort(t65, dim=1, descending=False, stable=False)  # t66: "cpu i64[4, 16]"
  t67 = Tensor.__getitem__(t66, (slice(None,None,None), slice(None,8,None)))  # t67: "cpu i64[4, 8]"
  t68 = torch.gather(t65, 1, t67)  # t68: "cpu f32[4, 8]"
  t69 = torch.argsort(t65, dim=-1, descending=True, stable=True)  # t69: "cpu i64[4, 16]"
  return (t66, t68, t69)
"#;
    let (h, hv) = input(&[4, 16], 63, DType::F32);
    let out = execute(text, vec![h]);
    let (_, order) = sorted_def(&hv, &[4, 16], 1, false, 16);
    assert_eq!(out[0].to_i64_vec(), order);
    // the 8 smallest of each row, ascending
    let first: Vec<usize> = (0..32)
        .map(|e| order[(e / 8) * 16 + e % 8] as usize)
        .collect();
    same_values(
        &out[1],
        &gather_def(&hv, &[4, 16], 1, &first, &[4, 8]),
        "gather",
    );
    let (_, order) = sorted_def(&hv, &[4, 16], 1, true, 16);
    assert_eq!(out[2].to_i64_vec(), order);
}

#[test]
fn thunders_index_select_and_index_add_statements_run() {
    // from a Thunder 0.2.6 export of `torch.index_select(self.w, 0, idx.flatten())` and its
    // backward
    let text = r#"def computation(idx, t_w, t97):
  # idx: "cpu i64[2, 8]"
  # t_w: "cpu f32[32, 16]"
  # t97: "cpu f32[16, 16]"
  t73 = torch.flatten(idx, 0, -1)  # t73: "cpu i64[16]"
  t74 = torch.index_select(t_w, 0, t73)  # t74: "cpu f32[16, 16]"
  t98 = torch.full((32, 16), 0, device=torch.device("cpu"), dtype=torch.float32)  # t98: "cpu f32[32, 16]"
  t99 = torch.index_add(t98, 0, t73, t97)  # t99: "cpu f32[32, 16]"
  t100 = torch.index_select(t_w, -2, t73)  # t100: "cpu f32[16, 16]"
  return (t74, t99, t100)
"#;
    // repeated rows, as token ids repeat
    let (idx, iv) = indices(&[2, 8], 5, 3, DType::I64);
    let (w, wv) = input(&[32, 16], 71, DType::F32);
    let (g, gv) = input(&[16, 16], 72, DType::F32);
    let out = execute(text, vec![idx, w, g]);
    let (want, _) = index_select_def(&wv, &[32, 16], 0, &iv);
    same_values(&out[0], &want, "index_select");
    same_values(&out[2], &want, "index_select along -2");
    let (want, scale) = index_add_def(&[0.0; 512], &[32, 16], 0, &iv, &gv, &[16, 16]);
    assert_sums(&out[1], &want, &scale, "index_add");
}

#[test]
fn thunders_topk_and_its_scatter_add_backward_run() {
    // from a Thunder 0.2.6 export of `torch.topk(self.l(x), 4, dim=1)[0]`: a tuple result
    // without type comments, and its backward
    let text = r#"def computation(t63, t69):
  # t63: "cpu f32[4, 16]"
  # t69: "cpu f32[4, 4]"
  (t64, t65) = torch.topk(t63, 4, 1, True, True)
  t77 = torch.zeros_like(t63, device=None, dtype=None)  # t77: "cpu f32[4, 16]"
  t78 = torch.scatter_add(t77, 1, t65, t69)  # t78: "cpu f32[4, 16]"
  (t90, t91) = torch.topk(t63, 3, -1, False, True)
  return (t64, t65, t78, t90, t91)
"#;
    let (x, xv) = input(&[4, 16], 81, DType::F32);
    let (g, gv) = input(&[4, 4], 82, DType::F32);
    let out = execute(text, vec![x, g]);
    let (v, i) = sorted_def(&xv, &[4, 16], 1, true, 4);
    same_values(&out[0], &v, "topk values");
    assert_eq!(out[1].to_i64_vec(), i);
    let iu: Vec<usize> = i.iter().map(|&j| j as usize).collect();
    let (want, scale) = scatter_add_def(&[0.0; 64], &[4, 16], 1, &iu, &[4, 4], &gv, &[4, 4]);
    assert_sums(&out[2], &want, &scale, "scatter_add");
    let (v, i) = sorted_def(&xv, &[4, 16], 1, false, 3);
    same_values(&out[3], &v, "smallest 3");
    assert_eq!(out[4].to_i64_vec(), i);
}

#[test]
fn a_sort_statement_gives_values_and_indices() {
    let text = r#"def computation(a):
  # a: "cpu bf16[3, 5]"
  (t0, t1) = torch.sort(a, dim=0, descending=True, stable=True)
  (t2, t3) = torch.sort(a, dim=-1, descending=False, stable=False)
  return (t0, t1, t2, t3)
"#;
    let (a, av) = with_ties(&[3, 5], 91, DType::BF16);
    let out = execute(text, vec![a]);
    let (v, i) = sorted_def(&av, &[3, 5], 0, true, 3);
    same_values(&out[0], &v, "descending along 0");
    assert_eq!(out[1].to_i64_vec(), i);
    let (v, i) = sorted_def(&av, &[3, 5], 1, false, 5);
    same_values(&out[2], &v, "ascending along -1");
    assert_eq!(out[3].to_i64_vec(), i);
}
