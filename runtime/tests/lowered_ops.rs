//! The torch ops Thunder runs without a decomposition of its own that tracepass reads by
//! rewriting them into table ops (`ir/src/lowering.rs`: `addmm`, `mm`, `diff`, `new_*`,
//! `torch.tensor` of a list, `reshape_as`, `linalg.vector_norm`, `norm`, and their `*_vjp`
//! backward halves), run on the CPU against PyTorch's definitions written out element by
//! element here; a linear op's gradient against its Jacobian applied column by column.

mod common;
use common::{run_trace, values};
use tracepass_ir::{parse_trace, DType};
use tracepass_runtime::tensor::Tensor;

fn run(text: &str, inputs: &[Tensor]) -> Vec<Tensor> {
    let t = parse_trace(text).unwrap_or_else(|e| panic!("{e}"));
    // only ops of the table remain, and the provenance says which were rewritten
    for &i in t.schedule() {
        let n = t.node(i).unwrap();
        assert!(!tracepass_ir::lowering::is_lowered(n), "{} left", n.op);
    }
    assert!(t
        .provenance
        .iter()
        .any(|p| p.pass.starts_with(tracepass_ir::lowering::PROVENANCE)));
    tracepass_ir::verify(&t).unwrap();
    run_trace(&t, inputs)
}

fn close(got: &Tensor, want: &[f64], what: &str) {
    let got = got.to_f64_vec();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn addmm_and_its_gradients_follow_pytorch() {
    let text = "def f(b, x, w, g):
  # b: \"cpu f64[3]\"
  # x: \"cpu f64[2, 4]\"
  # w: \"cpu f64[4, 3]\"
  # g: \"cpu f64[2, 3]\"
  y = torch.addmm(b, x, w, beta=0.5, alpha=2.0)  # y: \"cpu f64[2, 3]\"
  (gb, gx, gw) = addmm_vjp(((b, x, w), {'beta': 0.5, 'alpha': 2.0}), g)
  m = torch.mm(x, w)  # m: \"cpu f64[2, 3]\"
  (mx, mw) = mm_vjp(((x, w), {}), g)
  return (y, gb, gx, gw, m, mx, mw)
";
    let (b, x, w, g) = (values(3, 1), values(8, 2), values(12, 3), values(6, 4));
    let outs = run(
        text,
        &[
            Tensor::from_f64([3], b.clone()),
            Tensor::from_f64([2, 4], x.clone()),
            Tensor::from_f64([4, 3], w.clone()),
            Tensor::from_f64([2, 3], g.clone()),
        ],
    );
    let xw = |i: usize, j: usize| (0..4).map(|k| x[i * 4 + k] * w[k * 3 + j]).sum::<f64>();
    let y: Vec<f64> = (0..6)
        .map(|e| 0.5 * b[e % 3] + 2.0 * xw(e / 3, e % 3))
        .collect();
    close(&outs[0], &y, "addmm");
    let gb: Vec<f64> = (0..3).map(|j| 0.5 * (g[j] + g[3 + j])).collect();
    close(&outs[1], &gb, "d input");
    let gx: Vec<f64> = (0..8)
        .map(|e| {
            (0..3)
                .map(|j| g[(e / 4) * 3 + j] * w[(e % 4) * 3 + j])
                .sum()
        })
        .collect();
    let gw: Vec<f64> = (0..12)
        .map(|e| (0..2).map(|i| x[i * 4 + e / 3] * g[i * 3 + e % 3]).sum())
        .collect();
    close(
        &outs[2],
        &gx.iter().map(|v| 2.0 * v).collect::<Vec<_>>(),
        "d mat1",
    );
    close(
        &outs[3],
        &gw.iter().map(|v| 2.0 * v).collect::<Vec<_>>(),
        "d mat2",
    );
    close(
        &outs[4],
        &(0..6).map(|e| xw(e / 3, e % 3)).collect::<Vec<_>>(),
        "mm",
    );
    close(&outs[5], &gx, "mm d input");
    close(&outs[6], &gw, "mm d mat2");
}

/// `diff(x, n, dim=1, prepend=p)` of a `[2, L]` row pair, written out.
fn diff_rows(p: &[f64], x: &[f64], lp: usize, lx: usize, n: usize) -> Vec<f64> {
    let mut rows: Vec<Vec<f64>> = (0..2)
        .map(|r| {
            let mut z = p[r * lp..(r + 1) * lp].to_vec();
            z.extend_from_slice(&x[r * lx..(r + 1) * lx]);
            z
        })
        .collect();
    for _ in 0..n {
        rows = rows
            .iter()
            .map(|z| z.windows(2).map(|w| w[1] - w[0]).collect())
            .collect();
    }
    rows.concat()
}

#[test]
fn diff_with_prepend_and_its_gradient_follow_pytorch() {
    let text = "def f(p, x, g, i, b):
  # p: \"cpu f64[2, 1]\"
  # x: \"cpu f64[2, 4]\"
  # g: \"cpu f64[2, 3]\"
  # i: \"cpu i64[5]\"
  # b: \"cpu b8[4]\"
  y = torch.diff(x, 2, dim=-1, prepend=p)  # y: \"cpu f64[2, 3]\"
  (gx, _, _, gp) = diff_vjp(((x, 2, -1, p), {}), g)
  di = Tensor.diff(i)  # di: \"cpu i64[4]\"
  db = torch.diff(b)  # db: \"cpu b8[3]\"
  return (y, gx, di, db, gp)
";
    let (p, x, g) = (values(2, 5), values(8, 6), values(6, 7));
    let outs = run(
        text,
        &[
            Tensor::from_f64([2, 1], p.clone()),
            Tensor::from_f64([2, 4], x.clone()),
            Tensor::from_f64([2, 3], g.clone()),
            Tensor::from_i64([5], vec![3, -1, 4, 4, 10]),
            Tensor::from_bool([4], vec![true, true, false, true]),
        ],
    );
    close(&outs[0], &diff_rows(&p, &x, 1, 4, 2), "diff");
    // diff is linear in x: the gradient is the Jacobian's transpose applied to g
    let gx: Vec<f64> = (0..8)
        .map(|e| {
            let mut unit = vec![0.0; 8];
            unit[e] = 1.0;
            let col = diff_rows(&[0.0, 0.0], &unit, 1, 4, 2);
            col.iter().zip(&g).map(|(c, g)| c * g).sum()
        })
        .collect();
    close(&outs[1], &gx, "d input");
    let gp: Vec<f64> = (0..2)
        .map(|e| {
            let mut unit = vec![0.0; 2];
            unit[e] = 1.0;
            let col = diff_rows(&unit, &[0.0; 8], 1, 4, 2);
            col.iter().zip(&g).map(|(c, g)| c * g).sum()
        })
        .collect();
    close(&outs[4], &gp, "d prepend");
    assert_eq!(outs[2].to_f64_vec(), [-4.0, 5.0, 0.0, 6.0]);
    assert_eq!(outs[3].dtype(), DType::Bool);
    assert_eq!(outs[3].to_f64_vec(), [0.0, 1.0, 1.0]);
}

#[test]
fn new_tensors_and_list_literals_take_pytorch_dtypes() {
    let text = "def f(x):
  # x: \"cpu f32[2, 3]\"
  a = Tensor.new_ones(x, (2, 2))  # a: \"cpu f32[2, 2]\"
  b = Tensor.new_zeros(x, 3, dtype=torch.int64)  # b: \"cpu i64[3]\"
  c = Tensor.new_full(x, (1, 2), 7.5)  # c: \"cpu f32[1, 2]\"
  d = Tensor.new_ones(x, (), dtype=torch.bool)  # d: \"cpu b8[]\"
  e = torch.tensor([[-2, 5], [1, 0]], device=torch.device(\"cpu\"), dtype=torch.int64)  # e: \"cpu i64[2, 2]\"
  h = torch.tensor([0.5, 1.5, 2.5])  # h: \"cpu f32[3]\"
  return (a, b, c, d, e, h)
";
    let outs = run(text, &[Tensor::from_f32([2, 3], vec![0.0; 6])]);
    let dtypes: Vec<DType> = outs.iter().map(|t| t.dtype()).collect();
    use DType::*;
    assert_eq!(dtypes, [F32, I64, F32, Bool, I64, F32]);
    assert_eq!(outs[0].to_f64_vec(), [1.0; 4]);
    assert_eq!(outs[1].to_f64_vec(), [0.0; 3]);
    assert_eq!(outs[2].to_f64_vec(), [7.5, 7.5]);
    assert_eq!(outs[3].to_f64_vec(), [1.0]);
    assert_eq!(outs[4].to_f64_vec(), [-2.0, 5.0, 1.0, 0.0]);
    assert_eq!(outs[5].to_f64_vec(), [0.5, 1.5, 2.5]);
}

#[test]
fn norms_reshape_as_and_their_gradients_follow_pytorch() {
    let text = "def f(x, g, o, h):
  # x: \"cpu f64[3, 2, 2]\"
  # g: \"cpu f64[3, 1, 1]\"
  # o: \"cpu f64[6, 2]\"
  # h: \"cpu f64[3]\"
  n = torch.linalg.vector_norm(x, ord=2, dim=(1, 2), keepdim=True)  # n: \"cpu f64[3, 1, 1]\"
  (gn,) = vector_norm_vjp(((x,), {'ord': 2, 'dim': (1, 2), 'keepdim': True}), g)
  l = Tensor.norm(x, p=1, dim=(-1, -2))  # l: \"cpu f64[3]\"
  (gl,) = norm_vjp(((x,), {'p': 1, 'dim': (-1, -2)}), h)
  r = Tensor.reshape_as(x, o)  # r: \"cpu f64[6, 2]\"
  (gr, go) = reshape_as_vjp(((x, o), {}), o)
  return (n, gn, l, gl, r, gr, go)
";
    // the last 2 x 2 block is all zeros: its norm is 0 and so is its 2-norm's gradient
    let mut x = values(12, 8);
    x[8..].fill(0.0);
    let (g, o, h) = (values(3, 9), values(12, 10), values(3, 11));
    let outs = run(
        text,
        &[
            Tensor::from_f64([3, 2, 2], x.clone()),
            Tensor::from_f64([3, 1, 1], g.clone()),
            Tensor::from_f64([6, 2], o.clone()),
            Tensor::from_f64([3], h.clone()),
        ],
    );
    let block = |b: usize| &x[b * 4..(b + 1) * 4];
    let n2: Vec<f64> = (0..3)
        .map(|b| block(b).iter().map(|v| v * v).sum::<f64>().sqrt())
        .collect();
    close(&outs[0], &n2, "2-norm");
    let gn: Vec<f64> = (0..12)
        .map(|e| match n2[e / 4] {
            0.0 => 0.0,
            n => g[e / 4] * x[e] / n,
        })
        .collect();
    close(&outs[1], &gn, "2-norm gradient");
    assert_eq!(&gn[8..], [0.0; 4]);
    let n1: Vec<f64> = (0..3)
        .map(|b| block(b).iter().map(|v| v.abs()).sum())
        .collect();
    close(&outs[2], &n1, "1-norm");
    let gl: Vec<f64> = (0..12)
        .map(|e| h[e / 4] * x[e].signum() * (x[e] != 0.0) as u8 as f64)
        .collect();
    close(&outs[3], &gl, "1-norm gradient");
    assert_eq!(outs[4].shape(), [6, 2]);
    close(&outs[4], &x, "reshape_as");
    assert_eq!(outs[5].shape(), [3, 2, 2]);
    close(&outs[5], &o, "reshape_as d input");
    close(&outs[6], &[0.0; 12], "reshape_as d other");
}

#[test]
fn an_order_the_rewrite_does_not_read_is_an_error_naming_its_line() {
    let text = "def f(x):
  # x: \"cpu f32[4]\"
  n = torch.linalg.vector_norm(x, ord=3)  # n: \"cpu f32[]\"
  return n
";
    let e = parse_trace(text).unwrap_err();
    assert_eq!(e.line, 3, "{e}");
    assert!(e.message.contains("only the 1- and 2-norm"), "{e}");
}

#[test]
fn division_with_a_rounding_mode_follows_pytorch() {
    let text = "def f(a, b, i, j):
  # a: \"cpu f64[4]\"
  # b: \"cpu f64[4]\"
  # i: \"cpu i64[4]\"
  # j: \"cpu i64[4]\"
  t = torch.div(a, b, rounding_mode='trunc')  # t: \"cpu f64[4]\"
  s = torch.div(a, 2.5, rounding_mode='floor')  # s: \"cpu f64[4]\"
  u = torch.div(i, j, rounding_mode='trunc')  # u: \"cpu i64[4]\"
  v = torch.div(i, j, rounding_mode='floor')  # v: \"cpu i64[4]\"
  return (t, s, u, v)
";
    let (a, b) = (vec![7.5, -7.5, 3.0, -0.5], vec![2.0, 2.0, -4.0, 3.0]);
    let (i, j) = (vec![7, -7, 7, -7], vec![2, 2, -2, -2]);
    let outs = run(
        text,
        &[
            Tensor::from_f64([4], a.clone()),
            Tensor::from_f64([4], b.clone()),
            Tensor::from_i64([4], i),
            Tensor::from_i64([4], j),
        ],
    );
    let t: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x / y).trunc()).collect();
    close(&outs[0], &t, "trunc");
    close(
        &outs[1],
        &a.iter().map(|x| (x / 2.5).floor()).collect::<Vec<_>>(),
        "floor",
    );
    assert_eq!(outs[2].to_f64_vec(), [3.0, -3.0, -3.0, 3.0]);
    assert_eq!(outs[3].to_f64_vec(), [3.0, -4.0, -4.0, 3.0]);
}

/// Runs `fwd` (one statement defining `y`) and `vjp` (binding `grads`) on seeded inputs, and
/// checks each gradient against central differences of `y` weighted by the cotangent `g`.
fn gradients_match_differences(
    decls: &[(&str, &[usize])],
    out: &[usize],
    fwd: &str,
    vjp: &str,
    grads: &[&str],
) {
    let ty = |s: &[usize]| {
        let dims: Vec<String> = s.iter().map(usize::to_string).collect();
        format!("\"cpu f64[{}]\"", dims.join(", "))
    };
    let names: Vec<&str> = decls.iter().map(|(n, _)| *n).collect();
    let header: String = decls
        .iter()
        .map(|(n, s)| format!("  # {n}: {}\n", ty(s)))
        .collect();
    let both = format!(
        "def f({}, g):\n{header}  # g: {}\n  {fwd}\n  {vjp}\n  return ({},)\n",
        names.join(", "),
        ty(out),
        grads.join(", ")
    );
    let only = format!(
        "def f({}):\n{header}  {fwd}\n  return y\n",
        names.join(", ")
    );
    let numel = |s: &[usize]| s.iter().product::<usize>();
    // operands away from 0 (divisors, `abs`, the clip bounds at +-0.3/0.4 are crossed by few)
    let inputs: Vec<Vec<f64>> = decls
        .iter()
        .enumerate()
        .map(|(i, (_, s))| {
            values(numel(s), 20 + i as u64)
                .iter()
                .map(|v| v + v.signum() * 0.5)
                .collect()
        })
        .collect();
    let g = values(numel(out), 7);
    let tensors = |ins: &[Vec<f64>]| -> Vec<Tensor> {
        ins.iter()
            .zip(decls)
            .map(|(v, (_, s))| Tensor::from_f64(*s, v.clone()))
            .collect()
    };
    let mut with_g = tensors(&inputs);
    with_g.push(Tensor::from_f64(out, g.clone()));
    let got = run(&both, &with_g);
    let fwd_trace = parse_trace(&only).unwrap_or_else(|e| panic!("{e}"));
    let h = 1e-6;
    for (k, grad) in grads.iter().enumerate() {
        let arg = names
            .iter()
            .position(|n| grad.ends_with(n))
            .expect("grad named after its operand");
        let want: Vec<f64> = (0..inputs[arg].len())
            .map(|e| {
                let at = |d: f64| {
                    let mut ins = inputs.clone();
                    ins[arg][e] += d;
                    run_trace(&fwd_trace, &tensors(&ins))[0].to_f64_vec()
                };
                let (p, m) = (at(h), at(-h));
                p.iter()
                    .zip(&m)
                    .zip(&g)
                    .map(|((p, m), g)| g * (p - m) / (2.0 * h))
                    .sum()
            })
            .collect();
        let got = got[k].to_f64_vec();
        for (e, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() < 1e-6,
                "{vjp}: {grad}[{e}] = {a}, differences give {b}"
            );
        }
    }
}

#[test]
fn alias_gradients_match_central_differences() {
    let c = gradients_match_differences;
    c(
        &[("a", &[2, 3]), ("b", &[3])],
        &[2, 3],
        "y = torch.multiply(a, b)  # y: \"cpu f64[2, 3]\"",
        "(ga, gb) = multiply_vjp(((a, b), {}), g)",
        &["ga", "gb"],
    );
    c(
        &[("a", &[2, 3]), ("b", &[1, 3])],
        &[2, 3],
        "y = torch.subtract(a, b, alpha=2.0)  # y: \"cpu f64[2, 3]\"",
        "(ga, gb) = subtract_vjp(((a, b), {'alpha': 2.0}), g)",
        &["ga", "gb"],
    );
    c(
        &[("a", &[2, 3]), ("b", &[2, 1])],
        &[2, 3],
        "y = Tensor.divide(a, b)  # y: \"cpu f64[2, 3]\"",
        "(ga, gb) = divide_vjp(((a, b), {}), g)",
        &["ga", "gb"],
    );
    c(
        &[("a", &[2, 3])],
        &[2, 3],
        "y = torch.negative(a)  # y: \"cpu f64[2, 3]\"",
        "(ga,) = negative_vjp(((a,), {}), g)",
        &["ga"],
    );
    c(
        &[("a", &[2, 3])],
        &[2, 3],
        "y = torch.absolute(a)  # y: \"cpu f64[2, 3]\"",
        "(ga,) = absolute_vjp(((a,), {}), g)",
        &["ga"],
    );
    c(
        &[("a", &[2, 3])],
        &[2, 3],
        "y = Tensor.clip(a, -0.9, 1.1)  # y: \"cpu f64[2, 3]\"",
        "(ga, _, _) = clip_vjp(((a, -0.9, 1.1), {}), g)",
        &["ga"],
    );
    c(
        &[("a", &[2, 3, 4])],
        &[4, 3, 2],
        "y = torch.swapaxes(a, 0, 2)  # y: \"cpu f64[4, 3, 2]\"",
        "(ga, _, _) = swapaxes_vjp(((a, 0, 2), {}), g)",
        &["ga"],
    );
    c(
        &[("a", &[2, 3, 4])],
        &[3, 4, 2],
        "y = Tensor.moveaxis(a, 0, -1)  # y: \"cpu f64[3, 4, 2]\"",
        "(ga, _, _) = moveaxis_vjp(((a, 0, -1), {}), g)",
        &["ga"],
    );
    c(
        &[("a", &[2, 3])],
        &[6],
        "y = torch.ravel(a)  # y: \"cpu f64[6]\"",
        "(ga,) = ravel_vjp(((a,), {}), g)",
        &["ga"],
    );
    c(
        &[("a", &[2, 4])],
        &[2, 2],
        "y = torch.narrow(a, 1, -3, 2)  # y: \"cpu f64[2, 2]\"",
        "(ga, _, _, _) = narrow_vjp(((a, 1, -3, 2), {}), g)",
        &["ga"],
    );
    c(
        &[("a", &[2, 3])],
        &[2, 2, 9],
        "y = Tensor.tile(a, (2, 1, 3))  # y: \"cpu f64[2, 2, 9]\"",
        "(ga, _) = tile_vjp(((a, (2, 1, 3)), {}), g)",
        &["ga"],
    );
}

#[test]
fn layout_ops_follow_pytorch() {
    let text = "def f(a):
  # a: \"cpu f64[2, 3]\"
  t = Tensor.tile(a, (2, 2))  # t: \"cpu f64[4, 6]\"
  n = Tensor.narrow(a, -1, 1, 2)  # n: \"cpu f64[2, 2]\"
  r = torch.ravel(a)  # r: \"cpu f64[6]\"
  s = torch.swapdims(a, 0, 1)  # s: \"cpu f64[3, 2]\"
  c = torch.greater_equal(a, 3.0)  # c: \"cpu b8[2, 3]\"
  return (t, n, r, s, c)
";
    let a: Vec<f64> = (1..=6).map(f64::from).collect();
    let outs = run(text, &[Tensor::from_f64([2, 3], a.clone())]);
    let row = |r: usize| a[r * 3..r * 3 + 3].repeat(2);
    let tile: Vec<f64> = [row(0), row(1), row(0), row(1)].concat();
    assert_eq!(outs[0].to_f64_vec(), tile);
    assert_eq!(outs[1].to_f64_vec(), [2.0, 3.0, 5.0, 6.0]);
    assert_eq!(outs[2].to_f64_vec(), a);
    assert_eq!(outs[3].to_f64_vec(), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(outs[4].to_f64_vec(), [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
}
