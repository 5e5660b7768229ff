//! `fuse-elementwise`: regions on small hand-made traces and on two corpus exports (snapshots of
//! the printed regions), with the structure every region must have checked against the trace
//! it came from: no region crosses a non-elementwise op, every value inside it had exactly one
//! reader and was not returned, the trace returns what it returned, the verifier passes, and
//! the printed trace parses back to the same trace.

use std::collections::HashSet;
use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::fuse_elementwise::FUSABLE;
use tracepass_passes::*;

fn run(p: &mut Program, pipeline: &str) -> RunReport {
    PassManager::parse(pipeline)
        .unwrap()
        .run(p, OpRegistry::builtin())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"))
}

fn stat(r: &RunReport, key: &str) -> u64 {
    r.stats
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .sum()
}

fn printed(t: &Trace) -> String {
    print_trace_with(
        t,
        PrintOptions {
            dels: false,
            ..PrintOptions::default()
        },
    )
}

/// The region statements of `t` with their bodies, as printed.
fn regions_text(t: &Trace) -> String {
    let text = printed(t);
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("  ") && !line.starts_with("    ") {
            inside = line.contains("= tracepass.fusion(");
        }
        if inside && !line.trim().is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Checks every region of `after` against `before`; returns how many nodes the regions hold.
fn check_regions(before: &Trace, after: &Trace) -> usize {
    verify(after).unwrap_or_else(|e| panic!("{e}\n{}", printed(after)));
    // outputs preserved: the same return structure, of the same types
    assert_eq!(
        before
            .returned_values()
            .iter()
            .map(|v| (before.name(*v), before.ty(*v).cloned()))
            .collect::<Vec<_>>(),
        after
            .returned_values()
            .iter()
            .map(|v| (after.name(*v), after.ty(*v).cloned()))
            .collect::<Vec<_>>()
    );
    let returned: HashSet<String> = before
        .returned_values()
        .iter()
        .map(|v| before.name(*v))
        .collect();
    // lossless: the printed trace reads back as the same trace
    let back = parse_trace(&print_trace(after)).unwrap();
    assert_eq!(printed(&back), printed(after));
    let mut fused = 0;
    for (_, n) in after.nodes().filter(|(_, n)| n.op == ops::FUSION) {
        let body = region_body(after, n).unwrap();
        assert!(body.node_count() >= 2);
        fused += body.node_count();
        let root = body.returned_values()[0];
        for (_, m) in body.nodes() {
            assert!(FUSABLE.iter().any(|f| f.matches(m)), "{} in a region", m.op);
            let out = m.outputs()[0];
            if out == root {
                continue;
            }
            // an intermediate: read in the original trace only by members of this region,
            // not returned
            let name = body.name(out);
            let orig = before.find_value(&name).expect("the original defines it");
            let members: HashSet<String> = body
                .nodes()
                .flat_map(|(_, m)| m.outputs().iter().map(|v| body.name(*v)))
                .collect();
            for u in before.users(orig) {
                let reader = before.node(u).expect("a reader");
                assert!(
                    reader
                        .outputs()
                        .iter()
                        .any(|v| members.contains(&before.name(*v))),
                    "`{name}` had a reader outside its region ({})",
                    reader.op
                );
            }
            assert!(!returned.contains(&name), "`{name}` was returned");
            assert!(
                after.find_value(&name).is_none(),
                "`{name}` is still a value"
            );
        }
    }
    fused
}

const CHAIN: &str = r#"def f(x, b, w):
  # x: "cpu f32[2, 3]"
  # b: "cpu f32[3]"
  # w: "cpu f32[3, 3]"
  t0 = Tensor.expand(b, (2, 3))  # t0: "cpu f32[2, 3]"
  t1 = torch.add(x, t0)  # t1: "cpu f32[2, 3]"
  t2 = torch.mul(t1, 0.5)  # t2: "cpu f32[2, 3]"
  t3 = torch.tanh(t2)  # t3: "cpu f32[2, 3]"
  t4 = torch.matmul(t3, w)  # t4: "cpu f32[2, 3]"
  t5 = torch.neg(t4)  # t5: "cpu f32[2, 3]"
  t6 = torch.exp(t5)  # t6: "cpu f32[2, 3]"
  t7 = torch.mul(t6, t4)  # t7: "cpu f32[2, 3]"
  t8 = torch.sub(t7, 1.0)  # t8: "cpu f32[2, 3]"
  t9 = torch.sum(t8, (0,))  # t9: "cpu f32[3]"
  t10 = torch.erf(t9)  # t10: "cpu f32[3]"
  t11 = torch.true_divide(t10, 2.0)  # t11: "cpu f32[3]"
  t12 = torch.rsqrt(t11)  # t12: "cpu f32[3]"
  return (t12, t11)
"#;

#[test]
fn chains_become_regions_that_stop_at_other_ops() {
    let before = parse_trace(CHAIN).unwrap();
    let mut p = Program::lone(before.clone());
    let r = run(&mut p, "fuse-elementwise");
    let t = p.backward;
    insta::assert_snapshot!("hand_made_chain", printed(&t));
    assert_eq!(check_regions(&before, &t), 4 + 4 + 2);
    assert_eq!(stat(&r, "fuse-elementwise.regions"), 3);
    assert_eq!(stat(&r, "fuse-elementwise.fused"), 10);
    let ops: Vec<&str> = t.nodes().map(|(_, n)| n.op.as_str()).collect();
    // t11 is returned, so it ends a region and t12 stays alone
    assert_eq!(
        ops,
        [
            "tracepass.fusion",
            "ltorch.matmul",
            "tracepass.fusion",
            "ltorch.sum",
            "tracepass.fusion",
            "ltorch.rsqrt"
        ]
    );
    // a second run finds nothing more
    let mut again = Program::lone(t.clone());
    assert_eq!(
        stat(
            &run(&mut again, "fuse-elementwise"),
            "fuse-elementwise.regions"
        ),
        0
    );
}

#[test]
fn a_value_read_twice_inside_a_region_joins_it() {
    let src = r#"def f(x):
  # x: "cpu f32[4]"
  a = torch.exp(x)  # a: "cpu f32[4]"
  b = torch.mul(a, 2.0)  # b: "cpu f32[4]"
  c = torch.add(b, a)  # c: "cpu f32[4]"
  d = torch.tanh(c)  # d: "cpu f32[4]"
  return d
"#;
    let before = parse_trace(src).unwrap();
    let mut p = Program::lone(before.clone());
    run(&mut p, "fuse-elementwise");
    let t = p.backward;
    insta::assert_snapshot!("hand_made_shared", printed(&t));
    // `a`'s two readers are both in d's region: all four fuse into one, `a` is no value
    assert!(t.find_value("a").is_none());
    assert_eq!(t.node_count(), 1);
    assert_eq!(check_regions(&before, &t), 4);
}

#[test]
fn a_value_read_by_two_regions_stays_a_value() {
    let src = r#"def f(x, w):
  # x: "cpu f32[4]"
  # w: "cpu f32[4, 4]"
  a = torch.exp(x)  # a: "cpu f32[4]"
  b = torch.mul(a, 2.0)  # b: "cpu f32[4]"
  c = torch.tanh(b)  # c: "cpu f32[4]"
  d = torch.add(a, 1.0)  # d: "cpu f32[4]"
  e = torch.matmul(w, d)  # e: "cpu f32[4]"
  f = torch.neg(e)  # f: "cpu f32[4]"
  g = torch.mul(f, c)  # g: "cpu f32[4]"
  return g
"#;
    let before = parse_trace(src).unwrap();
    let mut p = Program::lone(before.clone());
    run(&mut p, "fuse-elementwise");
    let t = p.backward;
    insta::assert_snapshot!("hand_made_read_by_two_regions", printed(&t));
    // `a` is read by `b` (g's region) and by `d` (read by the matmul): neither region may
    // take it, so it stays a value of its own, as does `d`
    assert!(t.find_value("a").is_some());
    assert!(t.find_value("d").is_some());
    assert!(t.find_value("c").is_none());
    assert_eq!(check_regions(&before, &t), 4);
}

#[test]
fn rounding_divisions_and_pre_averaging_stay_out() {
    let src = r#"def f(x, g):
  # x: "cpu f32[4]"
  # g: "cpu f32[4]"
  a = torch.exp(x)  # a: "cpu f32[4]"
  b = torch.div(a, 2.0, rounding_mode='floor')  # b: "cpu f32[4]"
  c = torch.tanh(b)  # c: "cpu f32[4]"
  d = torch.mul(g, 3.0)  # d: "cpu f32[4]"
  e = prims.div(d, 2.0)  # e: "cpu f32[4]"
  t2 = dist.bucket_pack([e], bucket='b0', offsets=(0,), nbytes=16)  # t2: "cpu f32[4]"
  return (c, t2)
"#;
    let before = parse_trace(src).unwrap();
    let mut p = Program::lone(before.clone());
    let r = run(&mut p, "fuse-elementwise");
    assert_eq!(
        stat(&r, "fuse-elementwise.regions"),
        0,
        "{}",
        printed(&p.backward)
    );
    assert!(p.backward == before);
}

fn corpus(name: &str) -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name);
    fsio::load(&dir).unwrap().into_program().0
}

/// Two real exports, after DDP as `train --passes` would run them: the regions snapshotted,
/// every region checked, and the codecs carry them.
#[test]
fn corpus_exports_fuse_with_every_region_checked() {
    for (name, pipeline) in [
        (
            "mlp",
            "ddp(world_size=2,bucket_mb=25),fuse-elementwise,sort-waits",
        ),
        (
            "nanogpt",
            "ddp(world_size=2,bucket_mb=25),fuse-elementwise,sort-waits",
        ),
    ] {
        let mut p = corpus(name);
        run(&mut p, "ddp(world_size=2,bucket_mb=25)");
        let before = p.clone();
        let r = run(&mut p, "fuse-elementwise,sort-waits");
        let mut fused = 0;
        for (b, a) in [
            (&before.forward, &p.forward),
            (&before.backward, &p.backward),
        ] {
            fused += check_regions(b, a);
            assert!(a.node_count() < b.node_count() || b == a);
        }
        // the binary format and JSON carry the regions
        let dir = tempfile::tempdir().unwrap();
        for file in ["p.tpb", "p.json"] {
            let path = dir.path().join(file);
            fsio::save(&path, &Module::Program(p.clone())).unwrap();
            let (back, _) = fsio::load(&path).unwrap().into_program();
            assert_eq!(printed(&back.backward), printed(&p.backward), "{file}");
            assert!(back == p, "{file}");
        }
        assert!(fused > 0, "{name}: nothing fused");
        assert_eq!(stat(&r, "fuse-elementwise.fused"), fused as u64);
        insta::assert_snapshot!(
            format!("{name}_regions"),
            format!(
                "# {pipeline}\n# forward\n{}# backward\n{}",
                regions_text(&p.forward),
                regions_text(&p.backward)
            )
        );
    }
}
