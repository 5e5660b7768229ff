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
            "ltorch.div"
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
