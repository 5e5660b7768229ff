//! `remat` on a hand-made two-layer GELU program, on Thunder's own seed-example program and on
//! every corpus export: snapshots of the printed traces, plus the structure the pass promises:
//! the forward saves a subset of what it saved, the backward unpacks exactly what the forward
//! saves, every op the backward gained is a cheap elementwise copy of the forward's, the
//! backward returns what it returned, the printed program reads back, and a second run finds
//! nothing to do. (That the copies keep every bit is the runtime's `remat_training` test.)

use std::collections::HashSet;
use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::remat::RECOMPUTED;
use tracepass_passes::*;

/// `h = x @ w1.T`, the tanh GELU written out as Thunder records it, `out = y @ w2.T`; the
/// forward saves `h`'s square, its half, the tanh, `1 + tanh` and the GELU's output besides
/// the weights, `x` and `h`.
const FORWARD: &str = r#"@torch.no_grad()
@no_autocast
def computation(x, t_w1, t_w2):
  # x: "cpu f32[4, 8]"
  # t_w1: "cpu f32[16, 8]"
  # t_w2: "cpu f32[8, 16]"
  h = torch.nn.functional.linear(x, t_w1, None)  # h: "cpu f32[4, 16]"
  sq = torch.mul(h, h)  # sq: "cpu f32[4, 16]"
  cube = torch.mul(sq, h)  # cube: "cpu f32[4, 16]"
  half = torch.mul(0.5, h)  # half: "cpu f32[4, 16]"
  a = torch.mul(0.044715, cube)  # a: "cpu f32[4, 16]"
  b = torch.add(h, a, alpha=1)  # b: "cpu f32[4, 16]"
  c = torch.mul(0.7978845608028654, b)  # c: "cpu f32[4, 16]"
  th = torch.tanh(c)  # th: "cpu f32[4, 16]"
  one = torch.add(1.0, th, alpha=1)  # one: "cpu f32[4, 16]"
  y = torch.mul(half, one)  # y: "cpu f32[4, 16]"
  out = torch.nn.functional.linear(y, t_w2, None)  # out: "cpu f32[4, 8]"
  return {'output': (out,), 'flat_args': [x, t_w1, t_w2]}, ((t_w2, y, t_w1, x, h, sq, half, th, one), ())
"#;

const BACKWARD: &str = r#"@torch.no_grad()
@no_autocast
def backward_fn(saved_for_backward, cotangents):
  # saved_for_backward: "Collection"
  # cotangents: "Collection"
  C0, C1, = saved_for_backward
  # C0: "Collection"
  # C1: "Collection"
  g, = cotangents
  # g: "cpu f32[4, 8]"
  t_w2, y, t_w1, x, h, sq, half, th, one, = C0
  # t_w2: "cpu f32[8, 16]"
  # y: "cpu f32[4, 16]"
  # t_w1: "cpu f32[16, 8]"
  # x: "cpu f32[4, 8]"
  # h: "cpu f32[4, 16]"
  # sq: "cpu f32[4, 16]"
  # half: "cpu f32[4, 16]"
  # th: "cpu f32[4, 16]"
  # one: "cpu f32[4, 16]"
  gt = torch.permute(g, (1, 0))  # gt: "cpu f32[8, 4]"
  gw2 = torch.matmul(gt, y)  # gw2: "cpu f32[8, 16]"
  gy = torch.matmul(g, t_w2)  # gy: "cpu f32[4, 16]"
  g1 = torch.mul(one, gy)  # g1: "cpu f32[4, 16]"
  gh1 = torch.mul(0.5, g1)  # gh1: "cpu f32[4, 16]"
  g2 = torch.mul(half, gy)  # g2: "cpu f32[4, 16]"
  t2 = torch.mul(th, th)  # t2: "cpu f32[4, 16]"
  t3 = torch.sub(1, t2, alpha=1)  # t3: "cpu f32[4, 16]"
  gc = torch.mul(g2, t3)  # gc: "cpu f32[4, 16]"
  gb = torch.mul(0.7978845608028654, gc)  # gb: "cpu f32[4, 16]"
  ga = torch.mul(0.044715, gb)  # ga: "cpu f32[4, 16]"
  g3 = torch.mul(sq, ga)  # g3: "cpu f32[4, 16]"
  g4 = torch.mul(3.0, g3)  # g4: "cpu f32[4, 16]"
  g5 = torch.add(gb, g4, alpha=1)  # g5: "cpu f32[4, 16]"
  gh = torch.add(gh1, g5, alpha=1)  # gh: "cpu f32[4, 16]"
  ght = torch.permute(gh, (1, 0))  # ght: "cpu f32[16, 4]"
  gw1 = torch.matmul(ght, x)  # gw1: "cpu f32[16, 8]"
  gx = torch.matmul(gh, t_w1)  # gx: "cpu f32[4, 8]"
  return (gx, gw1, gw2)
"#;

fn hand_made() -> Program {
    Program::from_thunder(
        parse_trace(FORWARD).unwrap(),
        parse_trace(BACKWARD).unwrap(),
    )
    .unwrap()
}

fn thunder_mlp() -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/thunder/mlp");
    let load = |f: &str| parse_trace(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap();
    Program::from_thunder(load("forward.trace"), load("backward.trace")).unwrap()
}

fn remat(p: &mut Program) -> u64 {
    let r = PassManager::parse("remat")
        .unwrap()
        .run(p, OpRegistry::builtin())
        .unwrap_or_else(|e| panic!("remat: {e}"));
    r.stats
        .iter()
        .filter(|(k, _)| k == "remat.recomputed")
        .map(|(_, v)| *v)
        .sum()
}

fn printed(t: &Trace) -> String {
    print_trace_with(
        t,
        PrintOptions {
            subsymbols: false,
            source: false,
            provenance: false,
            ..PrintOptions::default()
        },
    )
}

fn names(t: &Trace, vs: &[ValueId]) -> Vec<String> {
    vs.iter().map(|v| t.name(*v)).collect()
}

/// Checks what `remat` made of `before`; returns the names of the values it stopped saving.
fn check(before: &Program, after: &Program) -> Vec<String> {
    verify(&after.forward).unwrap_or_else(|e| panic!("{e}\n{}", printed(&after.forward)));
    verify(&after.backward).unwrap_or_else(|e| panic!("{e}\n{}", printed(&after.backward)));
    let (saved_before, saved_after) = (before.forward_saved(), after.forward_saved());
    // the backward unpacks as many values as the forward saves, of the same shapes in order
    // (Thunder's backward may declare another dtype: max-pool indices as f32)
    let shapes = |t: &Trace, vs: &[ValueId]| -> Vec<Option<Vec<usize>>> {
        vs.iter()
            .map(|v| match t.ty(*v) {
                Some(Type::Tensor(tt)) => Some(tt.shape.to_vec()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        shapes(&after.forward, &saved_after),
        shapes(&after.backward, &after.backward_saved())
    );
    // a subset, in the same order
    let kept: HashSet<ValueId> = saved_after.iter().copied().collect();
    let still: Vec<ValueId> = saved_before
        .iter()
        .copied()
        .filter(|v| kept.contains(v))
        .collect();
    assert_eq!(
        still, saved_after,
        "the saved values are a subset, in order"
    );
    let dropped: Vec<String> = saved_before
        .iter()
        .filter(|v| !kept.contains(v))
        .map(|v| before.forward.name(*v))
        .collect();
    // every op the backward gained is a cheap elementwise op
    let old: HashSet<String> = before
        .backward
        .nodes()
        .flat_map(|(_, n)| n.outputs().to_vec())
        .map(|v| before.backward.name(v))
        .collect();
    for (_, n) in after.backward.nodes() {
        let new = n
            .outputs()
            .iter()
            .any(|v| !old.contains(&after.backward.name(*v)));
        if new {
            assert!(
                RECOMPUTED.iter().any(|f| f.matches(n)),
                "the backward gained `{}`",
                n.op
            );
        }
    }
    // the same gradients, by name and type
    let ret = |t: &Trace| -> Vec<(String, Option<Type>)> {
        t.returned_values()
            .iter()
            .map(|v| (t.name(*v), t.ty(*v).cloned()))
            .collect()
    };
    assert_eq!(ret(&before.backward), ret(&after.backward));
    // the printed program reads back and pairs up
    let back = Program::from_thunder(
        parse_trace(&print_trace(&after.forward)).unwrap(),
        parse_trace(&print_trace(&after.backward)).unwrap(),
    )
    .unwrap_or_else(|e| panic!("the printed program does not pair up: {e}"));
    assert_eq!(back.forward_saved().len(), saved_after.len());
    // nothing is left to do
    let mut again = after.clone();
    assert_eq!(remat(&mut again), 0);
    assert_eq!(printed(&again.backward), printed(&after.backward));
    dropped
}

/// The forward's saved tuple and the backward, as printed.
fn snapshot_text(p: &Program) -> String {
    let saved = names(&p.forward, &p.forward_saved()).join(", ");
    format!("# forward saves: {saved}\n{}", printed(&p.backward))
}

#[test]
fn remat_hand_made_gelu() {
    let before = hand_made();
    let mut after = before.clone();
    assert_eq!(remat(&mut after), 4);
    // the square, the half, 1 + tanh and the GELU's output: cheap functions of `h` and the
    // tanh, which stay saved (a tanh costs more to recompute than to read)
    assert_eq!(check(&before, &after), ["y", "sq", "half", "one"]);
    insta::assert_snapshot!("remat_hand_made", snapshot_text(&after));
}

#[test]
fn remat_thunder_seed_mlp() {
    let before = thunder_mlp();
    let mut after = before.clone();
    let n = remat(&mut after);
    let dropped = check(&before, &after);
    assert_eq!(dropped.len() as u64, n);
    assert!(n >= 3, "Thunder's GELU saves cheap values: {dropped:?}");
    insta::assert_snapshot!("remat_thunder_mlp", snapshot_text(&after));
}

/// Every corpus export: what `remat` stops saving, model by model.
#[test]
fn remat_on_the_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| is_export_dir(d))
        .collect();
    dirs.sort();
    let mut summary = String::new();
    let mut models_changed = 0;
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let before = load_export(dir)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .program;
        let mut after = before.clone();
        remat(&mut after);
        let dropped = check(&before, &after);
        models_changed += usize::from(!dropped.is_empty());
        summary.push_str(&format!(
            "{name}: {} of {} saved values recomputed\n",
            dropped.len(),
            before.forward_saved().len()
        ));
    }
    assert!(models_changed >= 5, "{summary}");
    insta::assert_snapshot!("remat_corpus", summary);
}

/// A lone backward has no forward to read: the pass leaves it alone.
#[test]
fn remat_leaves_a_lone_backward_alone() {
    let mut p = Program::lone(parse_trace(BACKWARD).unwrap());
    let before = printed(&p.backward);
    assert_eq!(remat(&mut p), 0);
    assert_eq!(printed(&p.backward), before);
}

/// A value the forward saves twice stays saved, in both places; the others are still
/// recomputed.
#[test]
fn remat_keeps_a_value_saved_twice() {
    let forward = FORWARD.replace("half, th, one), ())", "half, th, one, half), ())");
    let backward = BACKWARD
        .replace("half, th, one, = C0", "half, th, one, half2, = C0")
        .replace(
            "  # one: \"cpu f32[4, 16]\"\n",
            "  # one: \"cpu f32[4, 16]\"\n  # half2: \"cpu f32[4, 16]\"\n",
        )
        .replace("g2 = torch.mul(half, gy)", "g2 = torch.mul(half2, gy)");
    let before = Program::from_thunder(
        parse_trace(&forward).unwrap(),
        parse_trace(&backward).unwrap(),
    )
    .unwrap();
    let mut after = before.clone();
    assert_eq!(remat(&mut after), 3);
    assert_eq!(check(&before, &after), ["y", "sq", "one"]);
    let saved = names(&after.forward, &after.forward_saved());
    assert_eq!(
        saved.iter().filter(|n| *n == "half").count(),
        2,
        "{saved:?}"
    );
}

/// A value computed from the forward's arguments (here `x * x`, `x` saved as it is) is
/// recomputed from them.
#[test]
fn remat_recomputes_from_saved_arguments() {
    let forward = r#"def computation(x, t_w):
  # x: "cpu f32[4, 8]"
  # t_w: "cpu f32[2, 8]"
  s = torch.mul(x, x)  # s: "cpu f32[4, 8]"
  out = torch.nn.functional.linear(s, t_w, None)  # out: "cpu f32[4, 2]"
  return {'output': (out,), 'flat_args': [x, t_w]}, ((t_w, x, s), ())
"#;
    let backward = r#"def backward_fn(saved_for_backward, cotangents):
  # saved_for_backward: "Collection"
  # cotangents: "Collection"
  C0, C1, = saved_for_backward
  # C0: "Collection"
  # C1: "Collection"
  g, = cotangents
  # g: "cpu f32[4, 2]"
  t_w, x, s, = C0
  # t_w: "cpu f32[2, 8]"
  # x: "cpu f32[4, 8]"
  # s: "cpu f32[4, 8]"
  gt = torch.permute(g, (1, 0))  # gt: "cpu f32[2, 4]"
  gw = torch.matmul(gt, s)  # gw: "cpu f32[2, 8]"
  gs = torch.matmul(g, t_w)  # gs: "cpu f32[4, 8]"
  g1 = torch.mul(gs, x)  # g1: "cpu f32[4, 8]"
  gx = torch.mul(2.0, g1)  # gx: "cpu f32[4, 8]"
  return (gx, gw)
"#;
    let before = Program::from_thunder(
        parse_trace(forward).unwrap(),
        parse_trace(backward).unwrap(),
    )
    .unwrap();
    let mut after = before.clone();
    assert_eq!(remat(&mut after), 1);
    assert_eq!(check(&before, &after), ["s"]);
}
