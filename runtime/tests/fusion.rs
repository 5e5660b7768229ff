//! Fusion regions on the CPU: for every op kind `fuse-elementwise` fuses, and for broadcasts
//! along every kind of dimension, a region's result has exactly the bits of the unfused ops on
//! random inputs (the fused loop calls the unfused kernels' own functions), the f32 regions run
//! as one loop, and regions the loop cannot run (other dtypes) run their kernels one by one.

mod common;
use common::run_trace as run;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tracepass_ir::{ops, parse_trace};
use tracepass_passes::fuse_elementwise;
use tracepass_runtime::exec::{InstrKind, Plan, RegionProgram};
use tracepass_runtime::tensor::Tensor;

fn random(shape: &[usize], lo: f32, hi: f32, rng: &mut ChaCha8Rng) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f32(shape, (0..n).map(|_| rng.gen_range(lo..hi)).collect())
}

/// Fuses `src`, checks the regions it expects (each one loop when `fused_loops`), and
/// compares fused with unfused on random inputs in `[lo, hi)`, bit for bit.
fn check(src: &str, regions: usize, fused_loops: bool, lo: f32, hi: f32) {
    let unfused = parse_trace(src).unwrap();
    let mut fused = unfused.clone();
    let stats = fuse_elementwise(&mut fused).unwrap();
    assert_eq!(stats.regions, regions, "{src}");
    for (_, n) in fused.nodes().filter(|(_, n)| n.op == ops::FUSION) {
        let r = RegionProgram::compile(&fused, n).unwrap();
        assert_eq!(r.fused.is_some(), fused_loops, "{src}");
    }
    let plan = Plan::compile(&fused, &[]).unwrap();
    let kinds = plan
        .instrs
        .iter()
        .filter(|i| matches!(i.kind, InstrKind::Region(_)))
        .count();
    assert_eq!(kinds, regions);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..3 {
        let inputs: Vec<Tensor> = unfused
            .args()
            .iter()
            .map(|a| {
                let ty = unfused.ty(*a).and_then(|t| t.as_tensor()).unwrap();
                let t = random(&ty.shape, lo, hi, &mut rng);
                t.to_dtype(ty.dtype).unwrap()
            })
            .collect();
        let want = run(&unfused, &inputs);
        let got = run(&fused, &inputs);
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.shape(), g.shape());
            assert!(
                w.bitwise_eq(g),
                "{src}\nunfused {:?}\nfused   {:?}",
                w.to_f32_vec(),
                g.to_f32_vec()
            );
        }
    }
}

fn unary_chain(op: &str) -> String {
    format!(
        "def f(x):\n  # x: \"cpu f32[5, 67]\"\n  a = torch.mul(x, 1.25)  # a: \"cpu f32[5, 67]\"\n  b = {op}(a)  # b: \"cpu f32[5, 67]\"\n  c = torch.add(b, x, alpha=0.5)  # c: \"cpu f32[5, 67]\"\n  return c\n"
    )
}

#[test]
fn every_unary_op_fuses_to_the_unfused_bits() {
    for op in [
        "torch.neg",
        "torch.abs",
        "torch.exp",
        "torch.expm1",
        "torch.tanh",
        "torch.sigmoid",
        "torch.relu",
        "torch.erf",
        "torch.sin",
        "torch.cos",
        "torch.reciprocal",
        "torch.nn.functional.gelu",
        "prims.exp",
        "prims.tanh",
    ] {
        check(&unary_chain(op), 1, true, -4.0, 4.0);
    }
    // positive arguments only
    for op in ["torch.log", "torch.log1p", "torch.sqrt", "torch.rsqrt"] {
        check(&unary_chain(op), 1, true, 0.05, 6.0);
    }
}

#[test]
fn every_binary_op_fuses_to_the_unfused_bits() {
    for (call, lo) in [
        ("torch.add(a, y)", -3.0),
        ("torch.add(a, y, alpha=3)", -3.0),
        ("torch.sub(a, y, alpha=0.5)", -3.0),
        ("torch.sub(2.0, a)", -3.0),
        // a literal read where it is, on either side, with alpha
        ("torch.sub(a, 1.5, alpha=2.0)", -3.0),
        ("torch.add(0.25, a, alpha=3)", -3.0),
        ("torch.div(2.0, a)", 0.1),
        ("torch.mul(a, y)", -3.0),
        ("torch.div(a, y)", 0.1),
        ("torch.true_divide(a, y)", 0.1),
        ("torch.maximum(a, y)", -3.0),
        ("torch.minimum(a, y)", -3.0),
        ("torch.pow(a, y)", 0.1),
        ("torch.pow(a, 2)", -3.0),
        ("torch.pow(a, 3.0)", -3.0),
        ("torch.pow(a, 0.5)", 0.1),
        ("torch.pow(a, -0.5)", 0.1),
        ("torch.pow(a, -2.0)", 0.1),
        ("torch.pow(a, 2.5)", 0.1),
    ] {
        let src = format!(
            "def f(x, y):\n  # x: \"cpu f32[3, 300]\"\n  # y: \"cpu f32[3, 300]\"\n  a = torch.mul(x, 0.75)  # a: \"cpu f32[3, 300]\"\n  b = {call}  # b: \"cpu f32[3, 300]\"\n  return b\n"
        );
        check(&src, 1, true, lo, 3.0);
    }
}

#[test]
fn broadcasts_along_every_kind_of_dimension_fuse_to_the_unfused_bits() {
    // a bias along the last dimension, through unsqueeze and expand (nanoGPT's layer norm)
    check(
        r#"def f(x, w, b):
  # x: "cpu f32[2, 7, 33]"
  # w: "cpu f32[33]"
  # b: "cpu f32[33]"
  t0 = torch.unsqueeze(w, 0)  # t0: "cpu f32[1, 33]"
  t1 = torch.unsqueeze(t0, 1)  # t1: "cpu f32[1, 1, 33]"
  t2 = Tensor.expand(t1, (2, 7, 33))  # t2: "cpu f32[2, 7, 33]"
  t3 = torch.mul(x, t2)  # t3: "cpu f32[2, 7, 33]"
  t4 = Tensor.expand(b, (2, 7, 33))  # t4: "cpu f32[2, 7, 33]"
  t5 = torch.add(t3, t4)  # t5: "cpu f32[2, 7, 33]"
  return t5
"#,
        1,
        true,
        -2.0,
        2.0,
    );
    // a column ([2, 7, 1]: a statistic per row) and implicit broadcasting in the op itself
    check(
        r#"def f(x, m, s):
  # x: "cpu f32[2, 7, 33]"
  # m: "cpu f32[2, 7, 1]"
  # s: "cpu f32[7, 1]"
  t0 = torch.sub(x, m)  # t0: "cpu f32[2, 7, 33]"
  t1 = torch.add(s, 1e-05)  # t1: "cpu f32[7, 1]"
  t2 = torch.rsqrt(t1)  # t2: "cpu f32[7, 1]"
  t3 = torch.mul(t0, t2)  # t3: "cpu f32[2, 7, 33]"
  return t3
"#,
        1,
        true,
        0.1,
        2.0,
    );
    // a 0-d operand and a middle dimension of 1
    check(
        r#"def f(x, c, y):
  # x: "cpu f32[4, 1, 9]"
  # c: "cpu f32[]"
  # y: "cpu f32[4, 5, 9]"
  t0 = torch.mul(x, c)  # t0: "cpu f32[4, 1, 9]"
  t1 = Tensor.expand(t0, (4, 5, 9))  # t1: "cpu f32[4, 5, 9]"
  t2 = torch.add(t1, y)  # t2: "cpu f32[4, 5, 9]"
  t3 = torch.tanh(t2)  # t3: "cpu f32[4, 5, 9]"
  return t3
"#,
        1,
        true,
        -2.0,
        2.0,
    );
}

#[test]
fn a_region_of_another_dtype_runs_its_kernels_one_by_one() {
    check(
        r#"def f(x):
  # x: "cpu f64[3, 5]"
  a = torch.exp(x)  # a: "cpu f64[3, 5]"
  b = torch.mul(a, 3.0)  # b: "cpu f64[3, 5]"
  return b
"#,
        1,
        false,
        -1.0,
        1.0,
    );
    check(
        r#"def f(x):
  # x: "cpu bf16[3, 5]"
  a = torch.tanh(x)  # a: "cpu bf16[3, 5]"
  b = torch.mul(a, 3.0)  # b: "cpu bf16[3, 5]"
  return b
"#,
        1,
        false,
        -1.0,
        1.0,
    );
}

/// `simulate` times a region as one memory-bound kernel: a fused trace simulates (it was an
/// error: the region has no kernel to decode), with fewer ops and no more time than unfused.
#[test]
fn simulate_times_a_region_as_one_kernel() {
    use tracepass_runtime::comm::LinkModel;
    use tracepass_runtime::sim::{simulate, DeviceModel, SimOptions};
    let unfused = parse_trace(CHAIN).unwrap();
    let mut fused = unfused.clone();
    assert_eq!(fuse_elementwise(&mut fused).unwrap().regions, 1);
    let opts = SimOptions {
        world_size: 1,
        device: DeviceModel::named("h100").unwrap(),
        link: LinkModel::parse("10,80").unwrap(),
        host_reduction: false,
    };
    let a = simulate(&unfused, &opts).unwrap();
    let b = simulate(&fused, &opts).unwrap();
    assert_eq!((a.ops, b.ops), (5, 1));
    assert!(b.step_s < a.step_s, "{} vs {}", b.step_s, a.step_s);
}

const CHAIN: &str = r#"def f(x, b):
  # x: "cpu f32[64, 1024]"
  # b: "cpu f32[1024]"
  t0 = Tensor.expand(b, (64, 1024))  # t0: "cpu f32[64, 1024]"
  t1 = torch.add(x, t0)  # t1: "cpu f32[64, 1024]"
  t2 = torch.tanh(t1)  # t2: "cpu f32[64, 1024]"
  t3 = torch.mul(t2, x)  # t3: "cpu f32[64, 1024]"
  t4 = torch.exp(t3)  # t4: "cpu f32[64, 1024]"
  return t4
"#;
