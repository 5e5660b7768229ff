//! Python-level writes into tensors (`y[key] = value`, Thunder's `copy_with_setitem`), reads by
//! index tensors, and `nn.MultiheadAttention` (`multi_head_attention_forward` and Thunder's
//! fallback backward of it) on the CPU: against definitions written out here over explicit
//! coordinates in f64, the attention's gradient against central differences of that
//! definition; then the corpus exports `slice-assign` and `mha` trained one step against eager
//! PyTorch.

mod common;
use common::values;
use common::{corpus, json, name};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{Backend, Input, Kernel, KeyItem, Mha};
use tracepass_runtime::tensor::{Tensor, TensorFile};
use tracepass_runtime::train::{train, ModelSource, TrainConfig};

fn t64(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_f64(shape, values(shape.iter().product(), seed))
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

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn slice(lo: Option<i64>, hi: Option<i64>, step: Option<i64>) -> KeyItem {
    KeyItem::Slice([lo, hi, step])
}

// ----- copy_with_setitem and getitem by tensors, against coordinates -----

/// `y[:, 1:6:2] = v` with `v` of `[4, 1]` (broadcast over the columns), and `y[..., -1] = 7`.
#[test]
fn basic_keys_write_the_selected_places_only() {
    let y = t64(&[4, 6], 1);
    let yv = y.to_f64_vec();
    let v = t64(&[4, 1], 2);
    let vv = v.to_f64_vec();
    let key = vec![slice(None, None, None), slice(Some(1), Some(6), Some(2))];
    let got = run1(&Kernel::SetItem { key, value: None }, &[&y, &v]).to_f64_vec();
    for r in 0..4 {
        for c in 0..6 {
            let want = if c % 2 == 1 { vv[r] } else { yv[r * 6 + c] };
            assert_eq!(got[r * 6 + c], want, "({r}, {c})");
        }
    }
    let key = vec![KeyItem::Ellipsis, KeyItem::Int(-1)];
    let got = run1(
        &Kernel::SetItem {
            key,
            value: Some(7.0),
        },
        &[&y],
    )
    .to_f64_vec();
    for r in 0..4 {
        for c in 0..6 {
            let want = if c == 5 { 7.0 } else { yv[r * 6 + c] };
            assert_eq!(got[r * 6 + c], want, "({r}, {c})");
        }
    }
    // an int row with a `None`: y[2, None] = v of [1, 6]
    let v = t64(&[1, 6], 3);
    let key = vec![KeyItem::Int(2), KeyItem::NewAxis];
    let got = run1(&Kernel::SetItem { key, value: None }, &[&y, &v]).to_f64_vec();
    assert_eq!(&got[12..18], &v.to_f64_vec()[..]);
    assert_eq!(&got[..12], &yv[..12]);
    // a value that does not broadcast is refused, naming the op
    let v = t64(&[4, 2], 4);
    let key = vec![slice(None, None, None), slice(Some(1), Some(6), Some(2))];
    let e = run(&Kernel::SetItem { key, value: None }, &[&y, &v]).unwrap_err();
    assert!(
        e.contains("copy_with_setitem") && e.contains("broadcast"),
        "{e}"
    );
}

/// `y[mask] = 0.5` and `y[mask] = v` with `v` one row for every masked row.
#[test]
fn a_boolean_mask_writes_where_it_is_true() {
    let y = t64(&[3, 4], 5);
    let yv = y.to_f64_vec();
    let m: Vec<bool> = yv.iter().map(|&x| x > 0.0).collect();
    let mask = Tensor::from_bool(vec![3, 4], m.clone());
    let got = run1(
        &Kernel::SetItem {
            key: vec![KeyItem::Tensor],
            value: Some(0.5),
        },
        &[&y, &mask],
    )
    .to_f64_vec();
    for i in 0..12 {
        assert_eq!(got[i], if m[i] { 0.5 } else { yv[i] });
    }
    let rows = Tensor::from_bool(vec![3], vec![true, false, true]);
    let v = t64(&[4], 6);
    let got = run1(
        &Kernel::SetItem {
            key: vec![KeyItem::Tensor],
            value: None,
        },
        &[&y, &v, &rows],
    )
    .to_f64_vec();
    assert_eq!(&got[0..4], &v.to_f64_vec()[..]);
    assert_eq!(&got[4..8], &yv[4..8]);
    assert_eq!(&got[8..12], &v.to_f64_vec()[..]);
    // a value per masked row: how many there are is known at run time only
    let v = t64(&[2, 4], 7);
    let e = run(
        &Kernel::SetItem {
            key: vec![KeyItem::Tensor],
            value: None,
        },
        &[&y, &v, &rows],
    )
    .unwrap_err();
    assert!(e.contains("run time only"), "{e}");
}

/// `y[:, idx] = v` and `y[idx, :, idx2]` style keys (the index's dimensions in place when the
/// indexed dimensions are adjacent, in front otherwise), negative indices counted from the end;
/// a repeated index is refused as `index_put` refuses it.
#[test]
fn index_tensors_write_and_read_their_places() {
    let y = t64(&[3, 5, 2], 8);
    let yv = y.to_f64_vec();
    let at = |r: usize, c: usize, k: usize| r * 10 + c * 2 + k;
    let idx = Tensor::from_i64(vec![2], vec![4, -5]);
    let cols = [4usize, 0];
    let v = t64(&[3, 2, 2], 9);
    let vv = v.to_f64_vec();
    let key = vec![slice(None, None, None), KeyItem::Tensor];
    let got = run1(
        &Kernel::SetItem {
            key: key.clone(),
            value: None,
        },
        &[&y, &v, &idx],
    )
    .to_f64_vec();
    let mut want = yv.clone();
    for r in 0..3 {
        for (j, &c) in cols.iter().enumerate() {
            for k in 0..2 {
                want[at(r, c, k)] = vv[r * 4 + j * 2 + k];
            }
        }
    }
    assert_eq!(got, want);
    // the read of the same places: y[:, idx] is [3, 2, 2]
    let read = run1(&Kernel::GetItemTensor { key }, &[&y, &idx]);
    assert_eq!(read.shape(), &[3, 2, 2]);
    let rv = read.to_f64_vec();
    for r in 0..3 {
        for (j, &c) in cols.iter().enumerate() {
            for k in 0..2 {
                assert_eq!(rv[r * 4 + j * 2 + k], yv[at(r, c, k)]);
            }
        }
    }
    // not adjacent: y[rows, :, ks] is [2, 5] (the index's dimension in front)
    let rows = Tensor::from_i64(vec![2], vec![2, 0]);
    let ks = Tensor::from_i64(vec![2], vec![1, 0]);
    let key = vec![KeyItem::Tensor, slice(None, None, None), KeyItem::Tensor];
    let read = run1(&Kernel::GetItemTensor { key }, &[&y, &rows, &ks]);
    assert_eq!(read.shape(), &[2, 5]);
    let rv = read.to_f64_vec();
    for (j, (&r, &k)) in [2usize, 0].iter().zip(&[1usize, 0]).enumerate() {
        for c in 0..5 {
            assert_eq!(rv[j * 5 + c], yv[at(r, c, k)]);
        }
    }
    // a place written twice: PyTorch leaves the winner unspecified, so it is refused
    let twice = Tensor::from_i64(vec![2], vec![1, 1]);
    let e = run(
        &Kernel::SetItem {
            key: vec![slice(None, None, None), KeyItem::Tensor],
            value: Some(1.0),
        },
        &[&y, &twice],
    )
    .unwrap_err();
    assert!(e.contains("copy_with_setitem"), "{e}");
    // an index tensor next to a partial slice has no composite: refused by name
    let e = run(
        &Kernel::GetItemTensor {
            key: vec![slice(Some(1), None, None), KeyItem::Tensor],
        },
        &[&y, &idx],
    )
    .unwrap_err();
    assert!(e.contains("whole slices"), "{e}");
}

// ----- multi-head attention, against its definition -----

/// The definition: `[L, N, E]` query, `[S, N, E]` key and value, packed projection `w`, `b`,
/// output projection `wo`, `bo`; the output and the weights averaged over heads (or not).
#[allow(clippy::too_many_arguments)]
fn mha_definition(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    w: &[f64],
    b: &[f64],
    wo: &[f64],
    bo: &[f64],
    (l, s, n, e, h): (usize, usize, usize, usize, usize),
    average: bool,
) -> (Vec<f64>, Vec<f64>) {
    let d = e / h;
    // x[t, b, :] @ w[r0.., :]^T + b
    let project = |x: &[f64], t_len: usize, part: usize| -> Vec<f64> {
        let mut out = vec![0.0; t_len * n * e];
        for t in 0..t_len {
            for bb in 0..n {
                for o in 0..e {
                    let row = part * e + o;
                    let mut acc = b[row];
                    for i in 0..e {
                        acc += x[(t * n + bb) * e + i] * w[row * e + i];
                    }
                    out[(t * n + bb) * e + o] = acc;
                }
            }
        }
        out
    };
    let (pq, pk, pv) = (project(q, l, 0), project(k, s, 1), project(v, s, 2));
    let scale = (1.0 / d as f64).sqrt();
    let mut heads = vec![0.0; l * n * e];
    let mut weights = vec![0.0; n * h * l * s];
    for bb in 0..n {
        for hh in 0..h {
            for i in 0..l {
                let scores: Vec<f64> = (0..s)
                    .map(|j| {
                        (0..d)
                            .map(|c| {
                                pq[(i * n + bb) * e + hh * d + c]
                                    * scale
                                    * pk[(j * n + bb) * e + hh * d + c]
                            })
                            .sum()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                for j in 0..s {
                    let p = (scores[j] - m).exp() / z;
                    weights[((bb * h + hh) * l + i) * s + j] = p;
                    for c in 0..d {
                        heads[(i * n + bb) * e + hh * d + c] +=
                            p * pv[(j * n + bb) * e + hh * d + c];
                    }
                }
            }
        }
    }
    let mut out = vec![0.0; l * n * e];
    for row in 0..l * n {
        for o in 0..e {
            out[row * e + o] = bo[o]
                + (0..e)
                    .map(|i| heads[row * e + i] * wo[o * e + i])
                    .sum::<f64>();
        }
    }
    if average {
        let mut avg = vec![0.0; n * l * s];
        for bb in 0..n {
            for hh in 0..h {
                for ij in 0..l * s {
                    avg[bb * l * s + ij] += weights[(bb * h + hh) * l * s + ij] / h as f64;
                }
            }
        }
        weights = avg;
    }
    (out, weights)
}

struct MhaCase {
    dims: (usize, usize, usize, usize, usize),
    tensors: Vec<Tensor>,
}

fn mha_case(l: usize, s: usize, n: usize, e: usize, h: usize) -> MhaCase {
    let shapes: [Vec<usize>; 7] = [
        vec![l, n, e],
        vec![s, n, e],
        vec![s, n, e],
        vec![3 * e, e],
        vec![3 * e],
        vec![e, e],
        vec![e],
    ];
    MhaCase {
        dims: (l, s, n, e, h),
        tensors: shapes
            .iter()
            .enumerate()
            .map(|(i, sh)| t64(sh, 20 + i as u64))
            .collect(),
    }
}

#[test]
fn multi_head_attention_matches_its_definition() {
    for average in [true, false] {
        let c = mha_case(3, 5, 2, 8, 2);
        let refs: Vec<&Tensor> = c.tensors.iter().collect();
        let k = Kernel::MultiHeadAttention(Mha { heads: 2, average });
        let out = run(&k, &refs).unwrap();
        let vals: Vec<Vec<f64>> = c.tensors.iter().map(|t| t.to_f64_vec()).collect();
        let (want_out, want_w) = mha_definition(
            &vals[0], &vals[1], &vals[2], &vals[3], &vals[4], &vals[5], &vals[6], c.dims, average,
        );
        assert_eq!(out[0].shape(), &[3, 2, 8]);
        let ws: &[usize] = if average { &[2, 3, 5] } else { &[2, 2, 3, 5] };
        assert_eq!(out[1].shape(), ws);
        assert!(max_diff(&out[0].to_f64_vec(), &want_out) < 1e-12);
        assert!(max_diff(&out[1].to_f64_vec(), &want_w) < 1e-12);
    }
}

/// The fallback backward's seven gradients against central differences of
/// `<g_out, out> + <g_weights, weights>` of the definition.
#[test]
fn multi_head_attention_gradients_match_central_differences() {
    for average in [true, false] {
        let c = mha_case(3, 4, 2, 4, 2);
        let (l, s, n, _, h) = c.dims;
        let g_out = t64(&[l, n, 4], 40);
        let wshape: Vec<usize> = if average {
            vec![n, l, s]
        } else {
            vec![n, h, l, s]
        };
        let g_w = t64(&wshape, 41);
        let mha = Mha { heads: h, average };
        let mut refs: Vec<&Tensor> = c.tensors.iter().collect();
        refs.extend([&g_out, &g_w]);
        let grads = run(
            &Kernel::MultiHeadAttentionVjp {
                mha,
                outputs: [true; 7],
            },
            &refs,
        )
        .unwrap();
        assert_eq!(grads.len(), 7);
        let (go, gw) = (g_out.to_f64_vec(), g_w.to_f64_vec());
        let objective = |vals: &[Vec<f64>]| {
            let (o, w) = mha_definition(
                &vals[0], &vals[1], &vals[2], &vals[3], &vals[4], &vals[5], &vals[6], c.dims,
                average,
            );
            o.iter().zip(&go).map(|(a, b)| a * b).sum::<f64>()
                + w.iter().zip(&gw).map(|(a, b)| a * b).sum::<f64>()
        };
        let base: Vec<Vec<f64>> = c.tensors.iter().map(|t| t.to_f64_vec()).collect();
        let eps = 1e-6;
        for (i, g) in grads.iter().enumerate() {
            assert_eq!(g.shape(), c.tensors[i].shape(), "gradient {i}");
            let gv = g.to_f64_vec();
            for j in 0..gv.len() {
                let mut plus = base.clone();
                plus[i][j] += eps;
                let mut minus = base.clone();
                minus[i][j] -= eps;
                let fd = (objective(&plus) - objective(&minus)) / (2.0 * eps);
                assert!(
                    (fd - gv[j]).abs() < 1e-7,
                    "average={average} gradient {i}[{j}]: {} vs {fd}",
                    gv[j]
                );
            }
        }
        // only the named gradients come back, in order
        let mut named = [false; 7];
        named[3] = true;
        named[6] = true;
        let some = run(
            &Kernel::MultiHeadAttentionVjp {
                mha,
                outputs: named,
            },
            &refs,
        )
        .unwrap();
        assert_eq!(some.len(), 2);
        assert_eq!(some[0].to_f64_vec(), grads[3].to_f64_vec());
        assert_eq!(some[1].to_f64_vec(), grads[6].to_f64_vec());
    }
}

// ----- the corpus exports, one step against eager PyTorch -----

fn max_abs(v: &[f64]) -> f64 {
    v.iter().map(|x| x.abs()).fold(0.0, f64::max)
}

/// `slice-assign` and `mha` (what Thunder prints for `y[key] = value` and for
/// `nn.MultiheadAttention`) train with PyTorch's step-0 loss and gradients.
#[test]
fn the_python_level_exports_train_as_eager_pytorch() {
    for want_name in ["slice-assign", "mha"] {
        let dir = corpus()
            .into_iter()
            .find(|d| name(d) == want_name)
            .unwrap_or_else(|| panic!("no export {want_name} in testdata/models"));
        let cfg = TrainConfig {
            model: ModelSource::Export(dir.clone()),
            world_size: 1,
            steps: 1,
            keep_all_ranks: true,
            pin_ranks: false,
            ..TrainConfig::default()
        };
        let r = train(&cfg, &|_, _| {}).unwrap_or_else(|e| panic!("{want_name}: {e}"));
        let loss = json(&dir.join("reference/loss.json"))["losses"][0]
            .as_f64()
            .unwrap();
        let loss_err = (r.losses[0] - loss).abs();
        assert!(
            loss_err < 1e-5 * loss.abs(),
            "{want_name}: loss off by {loss_err:e}"
        );
        let reference = TensorFile::load(&dir.join("reference/grads.safetensors")).unwrap();
        let mut worst: f64 = 0.0;
        for (fqn, want) in &reference.tensors {
            let i = r.param_names.iter().position(|n| n == fqn).unwrap();
            let got = r.grads_step0[0][i]
                .as_ref()
                .unwrap_or_else(|| panic!("{want_name}: no gradient for {fqn}"));
            let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
            let d = max_diff(&g, &w);
            assert!(
                d <= 1e-4 * max_abs(&w).max(1e-6),
                "{want_name}: `{fqn}` off by {d:e} (max |g| {})",
                max_abs(&w)
            );
            worst = worst.max(d);
        }
        eprintln!("{want_name}: loss off by {loss_err:e}, gradients by at most {worst:e}");
    }
}
