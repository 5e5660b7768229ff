//! `canonicalize`: every rule on a small trace (snapshot and structural checks), the rules it
//! must not apply, and every export of the corpus with the verifier on.

use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::*;

const RULES: &str = r#"def f(x, i, b, m):
  # x: "cpu f32[4]"
  # i: "cpu i64[4]"
  # b: "cpu f32[1]"
  # m: "cpu f32[2, 2]"
  a = torch.mul(1.0, x)  # a: "cpu f32[4]"
  c = prims.mul(a, 1)  # c: "cpu f32[4]"
  d = torch.true_divide(c, 1.0)  # d: "cpu f32[4]"
  e = prims.sub(d, 0.0)  # e: "cpu f32[4]"
  f = prims.add(e, -0.0)  # f: "cpu f32[4]"
  g = prims.neg(f)  # g: "cpu f32[4]"
  h = prims.neg(g)  # h: "cpu f32[4]"
  k = Tensor.to(h, torch.float32)  # k: "cpu f32[4]"
  l = torch.reshape(k, (4,))  # l: "cpu f32[4]"
  n = prims.add(l, 0.0)  # n: "cpu f32[4]"
  o = prims.mul(i, 1.0)  # o: "cpu f32[4]"
  p = prims.sub(n, -0.0)  # p: "cpu f32[4]"
  q = torch.mul(b, 1.0)  # q: "cpu f32[1]"
  r = Tensor.expand(b, (4,))  # r: "cpu f32[4]"
  s = torch.reshape(m, (4,))  # s: "cpu f32[4]"
  u = torch.div(p, 1.0, rounding_mode='floor')  # u: "cpu f32[4]"
  return (u, o, q, r, s)
"#;

fn run(t: Trace, pipeline: &str) -> (Trace, RunReport) {
    let mut p = Program::lone(t);
    let r = PassManager::parse(pipeline)
        .unwrap()
        .run(&mut p, OpRegistry::builtin())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"));
    (p.backward, r)
}

fn stat(r: &RunReport, key: &str) -> u64 {
    r.stats
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn every_rule_applies_and_nothing_inexact_does() {
    let (t, r) = run(parse_trace(RULES).unwrap(), "canonicalize,dce");
    verify(&t).unwrap();
    let text = canonical_text(&t);
    insta::assert_snapshot!("canonicalize_rules", text);
    for (rule, n) in [
        ("mul-one", 3),
        ("div-one", 1),
        ("sub-zero", 1),
        ("add-neg-zero", 1),
        ("neg-neg", 1),
        ("dead-cast", 1),
        ("dead-reshape", 1),
    ] {
        assert_eq!(stat(&r, &format!("canonicalize.{rule}")), n, "{rule}");
    }
    let ops: Vec<String> = t.nodes().map(|(_, n)| n.op.to_string()).collect();
    // kept: x + 0.0 (not exact for -0.0), i64 * 1.0 (a float), x - (-0.0), a floor division,
    // a broadcast (f32[1] * 1.0 stays f32[1] and goes; the expand to [4] stays), a reshape
    // to another shape; the two negations of x went, and the chain reads x directly
    assert_eq!(
        ops,
        [
            "prims.add",
            "prims.mul",
            "prims.sub",
            "ltorch.expand",
            "ltorch.reshape",
            // `div(rounding_mode='floor')` is read as the `floor_divide` PyTorch defines it as
            "ltorch.floor_divide"
        ],
        "{}",
        print_trace(&t)
    );
    let first = t.nodes().next().unwrap().1;
    assert_eq!(first.args()[0], Arg::Value(t.find_value("x").unwrap()));
    // a fixed point: a second run changes nothing
    let (again, r2) = run(t.clone(), "canonicalize");
    assert_eq!(stat(&r2, "canonicalize.rewrites"), 0);
    assert!(again == t);
}

/// Constant folds: exact scalings of tensors, and scalar arithmetic to literals.
const FOLDS: &str = r#"def f(x, h, i, y):
  # x: "cpu f32[4]"
  # h: "cpu f16[4]"
  # i: "cpu i64[4]"
  # y: "cpu f32[4]"
  a = torch.mul(x, 2.0)  # a: "cpu f32[4]"
  b = torch.mul(4.0, a)  # b: "cpu f32[4]"
  c = prims.mul(y, 3.0)  # c: "cpu f32[4]"
  d = prims.mul(c, 5.0)  # d: "cpu f32[4]"
  e = prims.mul(h, 256.0)  # e: "cpu f16[4]"
  g = prims.mul(e, 256.0)  # g: "cpu f16[4]"
  j = prims.mul(i, 3)  # j: "cpu i64[4]"
  k = prims.mul(5, j)  # k: "cpu i64[4]"
  l = prims.mul(i, 2.0)  # l: "cpu f32[4]"
  m = prims.mul(l, 2.0)  # m: "cpu f32[4]"
  o = prims.mul(y, 0.5)  # o: "cpu f32[4]"
  q = prims.mul(o, 0.5)  # q: "cpu f32[4]"
  n = prims.mul(2, 3)  # n: "int 6"
  r = prims.add(n, 4)  # r: "int 10"
  s = prims.mul(0.1, 3.0)  # s: "float 0.30000000000000004"
  u = prims.mul(x, s)  # u: "cpu f32[4]"
  v = prims.sub(r, 0.5)  # v: "float 9.5"
  w = prims.mul(y, v)  # w: "cpu f32[4]"
  z = prims.mul(9223372036854775807, 2)  # z: "int"
  return (b, d, g, k, m, q, u, w, r, z)
"#;

#[test]
fn constant_folds_are_exact_and_refused_where_they_would_round() {
    let input = parse_trace(FOLDS).unwrap();
    verify(&input).unwrap();
    let (t, r) = run(input, "canonicalize,dce");
    verify(&t).unwrap();
    insta::assert_snapshot!("canonicalize_folds", canonical_text(&t));
    assert_eq!(stat(&r, "canonicalize.mul-const-const"), 2);
    // 2*3, then 6+4 and 0.1*3.0, then 10-0.5 (each waits for the literal it reads)
    assert_eq!(stat(&r, "canonicalize.fold-scalar"), 4);
    let body = print_trace(&t);
    let line = |name: &str| {
        let v = t
            .find_value(name)
            .unwrap_or_else(|| panic!("{name} is kept"));
        let n = t.node(t.producer(v).unwrap()).unwrap();
        (n.op.to_string(), n.args().to_vec())
    };
    let [x, y, i, c, e, l, o] =
        ["x", "y", "i", "c", "e", "l", "o"].map(|n| t.find_value(n).unwrap());
    // x*2*4 is x*8 (powers of two, above one), i*3*5 is i*15 (integers wrap alike)
    assert_eq!(line("b").1, [Arg::Value(x), Arg::Float(8.0)]);
    assert_eq!(line("k").1, [Arg::Value(i), Arg::Int(15)]);
    // kept: 3*5 rounds, 256*256 overflows f16's scalar, i64*2.0 is a float tensor, and
    // halvings round in the subnormals
    assert_eq!(line("d").1, [Arg::Value(c), Arg::Float(5.0)]);
    assert_eq!(line("g").1, [Arg::Value(e), Arg::Float(256.0)]);
    assert_eq!(line("m").1, [Arg::Value(l), Arg::Float(2.0)]);
    assert_eq!(line("q").1, [Arg::Value(o), Arg::Float(0.5)]);
    // scalars are literals where they were read, in Python's arithmetic
    assert_eq!(line("u").1, [Arg::Value(x), Arg::Float(0.1 * 3.0)]);
    assert_eq!(line("w").1, [Arg::Value(y), Arg::Float(9.5)]);
    for gone in ["a", "j", "n", "s", "v", "r"] {
        assert!(
            t.find_value(gone).is_none(),
            "{gone} is folded away:\n{body}"
        );
    }
    // i64::MAX * 2 has no i64 result: not folded
    assert!(t.find_value("z").is_some(), "{body}");
    let Arg::Tuple(ret) = &t.ret else {
        panic!("a tuple is returned")
    };
    assert_eq!(ret[8], Arg::Int(10), "the returned scalar is the literal");
    // a fixed point
    let (again, r2) = run(t.clone(), "canonicalize");
    assert_eq!(stat(&r2, "canonicalize.rewrites"), 0);
    assert!(again == t);
}

#[test]
fn casts_an_in_place_update_could_tell_apart_are_kept() {
    let src = r#"def f(x, y):
  # x: "cpu f32[4]"
  # y: "cpu f32[4]"
  a = Tensor.to(x, torch.float32, copy=True)  # a: "cpu f32[4]"
  b = copy_(y, a, grad_enabled=True)  # b: "cpu f32[4]"
  return (x, b)
"#;
    let (t, r) = run(parse_trace(src).unwrap(), "canonicalize");
    assert_eq!(stat(&r, "canonicalize.rewrites"), 0);
    assert!(print_trace(&t).contains("Tensor.to(x"));
}

/// Every export of the corpus, with verification after each pass: the rules apply where they
/// should and leave valid traces of the same interface.
#[test]
fn canonicalize_runs_on_every_corpus_export() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut exports: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("export.json").is_file())
        .collect();
    exports.sort();
    assert!(exports.len() >= 29, "{} exports", exports.len());
    let mut total = 0;
    for e in &exports {
        let (mut p, _) = fsio::load(e).unwrap().into_program();
        let before = (p.forward.node_count(), p.backward.node_count());
        let r = PassManager::parse("canonicalize,dce")
            .unwrap()
            .run(&mut p, OpRegistry::builtin())
            .unwrap_or_else(|err| panic!("{}: {err}", e.display()));
        let n = stat(&r, "canonicalize.rewrites");
        eprintln!(
            "{}: {n} rewrites ({})",
            e.file_name().unwrap().to_string_lossy(),
            r.stat_details
                .iter()
                .filter(|s| s.key != "canonicalize.rewrites" && s.key.starts_with("canonicalize."))
                .map(|s| format!("{}={}", s.key.trim_start_matches("canonicalize."), s.value))
                .collect::<Vec<_>>()
                .join(" ")
        );
        total += n;
        let after = (p.forward.node_count(), p.backward.node_count());
        assert!(
            after.0 <= before.0 && after.1 <= before.1,
            "{}",
            e.display()
        );
        if n > 0 {
            assert!(after.0 + after.1 < before.0 + before.1, "{}", e.display());
        }
        verify(&p.forward).unwrap();
        verify(&p.backward).unwrap();
    }
    assert!(total > 0, "no rule applied on the corpus");
}
