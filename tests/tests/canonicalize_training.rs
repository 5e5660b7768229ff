//! `canonicalize` is exact: training an export with it in the pipeline gives bit for bit the
//! losses and parameters of training without it.

use std::path::Path;
use tracepass_passes::parse_pipeline;
use tracepass_runtime::{train, ModelSource, TrainConfig, TrainReport};

fn run(export: &str, pipeline: &str) -> TrainReport {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(export);
    let cfg = TrainConfig {
        model: ModelSource::Export(dir),
        world_size: 2,
        steps: 2,
        passes: Some(parse_pipeline(pipeline).unwrap()),
        ..TrainConfig::default()
    };
    train(&cfg, &|_, _| {}).unwrap_or_else(|e| panic!("{export} `{pipeline}`: {e}"))
}

#[test]
fn canonicalized_exports_train_to_the_same_bits() {
    // both have reshapes and expands to their own shape (`canonicalize` removes them)
    for export in ["mlp", "cnn"] {
        let plain = run(export, "ddp(world_size=2),sort-waits");
        let canon = run(export, "canonicalize,dce,ddp(world_size=2),sort-waits");
        assert!(
            canon.backward.node_count() < plain.backward.node_count(),
            "{export}: canonicalize removed nothing from the backward"
        );
        let bits = |r: &TrainReport| r.losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&plain), bits(&canon), "{export}: losses");
        assert_eq!(plain.param_names, canon.param_names);
        for (a, b) in plain.params[0].iter().zip(&canon.params[0]) {
            let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{export}: parameters differ"
            );
        }
    }
}

/// Constant folds change no number the CPU runtime computes: a trace run before and after
/// `canonicalize` on values of every class (subnormals, near overflow, infinities, NaN, signed
/// zeros; wrapping integers) returns the same bits. Scalar statements, which the runtime does
/// not execute, become literals it does.
#[test]
fn constant_folds_compute_the_same_bits() {
    use tracepass_ir::{parse_trace, OpRegistry, Program};
    use tracepass_passes::PassManager;
    use tracepass_runtime::run::{run_trace, Named, RunOptions};
    use tracepass_runtime::Tensor;
    let src = r#"def f(x, i):
  # x: "cpu f32[8]"
  # i: "cpu i64[4]"
  a = torch.mul(x, 2.0)  # a: "cpu f32[8]"
  b = torch.mul(-4.0, a)  # b: "cpu f32[8]"
  c = prims.mul(x, 2)  # c: "cpu f32[8]"
  d = prims.mul(c, 8.507059173023462e+37)  # d: "cpu f32[8]"
  j = prims.mul(i, 3037000499)  # j: "cpu i64[4]"
  k = prims.mul(j, 7)  # k: "cpu i64[4]"
  return (b, d, k)
"#;
    let plain = parse_trace(src).unwrap();
    let mut p = Program::lone(plain.clone());
    let r = PassManager::parse("canonicalize,dce")
        .unwrap()
        .run(&mut p, OpRegistry::builtin())
        .unwrap();
    let folded = p.backward;
    assert!(
        r.stats
            .iter()
            .any(|(k, v)| k == "canonicalize.mul-const-const" && *v == 3),
        "{:?}",
        r.stats
    );
    assert!(folded.node_count() < plain.node_count());
    let xs = vec![
        1.1343642,
        -3.7e-40,
        f32::MIN_POSITIVE,
        1.0e38,
        -0.0,
        f32::INFINITY,
        f32::NAN,
        f32::MAX,
    ];
    let mut inputs = Named::new();
    inputs.insert("x".into(), Tensor::from_f32(vec![8], xs));
    inputs.insert(
        "i".into(),
        Tensor::from_i64(vec![4], vec![i64::MAX, i64::MIN, -7, 0x1234_5678_9abc]),
    );
    let run = |t: &tracepass_ir::Trace| {
        let group = tracepass_runtime::comm::ThreadGroup::new(
            1,
            tracepass_runtime::comm::CommOptions::default(),
        );
        let mut comm = group.comm(0);
        run_trace(
            &tracepass_runtime::cpu::CpuBackend,
            &mut comm,
            t,
            &inputs,
            RunOptions::default(),
        )
        .unwrap()
    };
    let (want, got) = (run(&plain), run(&folded));
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>()
    );
    for (name, w) in &want {
        let g = &got[name];
        assert_eq!(w.dtype(), g.dtype(), "{name}");
        let bits = |t: &Tensor| match t.as_f32() {
            Some(v) => v.iter().map(|x| u64::from(x.to_bits())).collect::<Vec<_>>(),
            None => t.to_i64_vec().into_iter().map(|x| x as u64).collect(),
        };
        assert_eq!(bits(w), bits(g), "{name}");
    }
    // (3 * 0.5) - 2 is Python's -0.5: the folded trace runs, and multiplies by it
    let scalars = parse_trace(
        r#"def f(x):
  # x: "cpu f32[8]"
  n = prims.mul(3, 0.5)  # n: "float 1.5"
  s = prims.sub(n, 2)  # s: "float -0.5"
  u = prims.mul(x, s)  # u: "cpu f32[8]"
  return u
"#,
    )
    .unwrap();
    let mut p = Program::lone(scalars);
    PassManager::parse("canonicalize,dce")
        .unwrap()
        .run(&mut p, OpRegistry::builtin())
        .unwrap();
    assert_eq!(p.backward.node_count(), 1);
    let u = &run(&p.backward)["u"];
    let x = inputs["x"].as_f32().unwrap();
    let want: Vec<u32> = x.iter().map(|v| (v * -0.5f32).to_bits()).collect();
    let got: Vec<u32> = u.as_f32().unwrap().iter().map(|v| v.to_bits()).collect();
    assert_eq!(want, got);
}
