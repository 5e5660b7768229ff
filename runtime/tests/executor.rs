//! The plan compiler and executor on small hand-made traces: kernels, liveness, errors.

use tracepass_ir::{Arg, DType, DTypeSpelling, Device, TraceBuilder, TraceKind, Type};
use tracepass_runtime::comm::{CommOptions, ThreadComm, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{Clock, Recording};
use tracepass_runtime::exec::{Executor, RValue};
use tracepass_runtime::exec::{InstrKind, Plan};
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::train::{Model, ModelSource};

fn f32t(s: &[usize]) -> Type {
    Type::tensor(s, DType::F32, Device::CPU)
}

fn exec(plan: &Plan, inputs: Vec<RValue<Tensor>>) -> Result<Vec<RValue<Tensor>>, String> {
    let g = ThreadGroup::new(1, CommOptions::default());
    let mut comm = g.comm(0);
    let mut e: Executor<CpuBackend, ThreadComm> = Executor::new();
    e.run(
        plan,
        &CpuBackend,
        &mut comm,
        inputs,
        &Clock::new(false),
        &mut Recording::default(),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn runs_elementwise_matmul_and_reductions() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", f32t(&[2, 3]));
    let w = b.arg("w", f32t(&[4, 3]));
    let y = b
        .op("ltorch.linear", vec![x.into(), w.into(), Arg::None])
        .unwrap();
    let z = b
        .op_kw(
            "ltorch.sub",
            vec![1.into(), y.into()],
            vec![("alpha".into(), 2.into())],
        )
        .unwrap();
    let s = b
        .op("ltorch.sum", vec![z.into(), Arg::int_tuple([1])])
        .unwrap();
    let p = b
        .op("ltorch.permute", vec![y.into(), Arg::int_tuple([1, 0])])
        .unwrap();
    let m = b.op("ltorch.matmul", vec![p.into(), x.into()]).unwrap();
    b.ret(Arg::Tuple(vec![s.into(), m.into()]));
    let t = b.finish();
    let plan = Plan::compile(&t, &[Some(s), Some(m)]).unwrap();
    let xv = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let wv = Tensor::from_f32(
        vec![4, 3],
        vec![1., 0., 0., 0., 1., 0., 0., 0., 1., 1., 1., 1.],
    );
    let out = exec(&plan, vec![RValue::Tensor(xv), RValue::Tensor(wv)]).unwrap();
    // y = [[1,2,3,6],[4,5,6,15]]; z = 1 - 2y; s = sum over columns
    let s = out[0].clone().tensor().unwrap().to_f32_vec();
    assert_eq!(s, vec![4.0 - 2.0 * 12.0, 4.0 - 2.0 * 30.0]);
    let m = out[1].clone().tensor().unwrap();
    assert_eq!(m.shape(), &[4, 3]);
    // row 0 of y.T @ x = 1*[1,2,3] + 4*[4,5,6]
    assert_eq!(&m.to_f32_vec()[..3], &[17., 22., 27.]);
}

#[test]
fn every_value_but_the_results_is_freed_exactly_once() {
    let m = Model::load(&ModelSource::Seed).unwrap();
    let b = &m.program.backward;
    let results = m.program.gradient_values();
    let plan = Plan::compile(b, &results).unwrap();
    let mut freed = vec![0usize; plan.slots];
    for ins in &plan.instrs {
        for &s in &ins.free {
            freed[s] += 1;
        }
    }
    let kept: Vec<usize> = plan.results.iter().flatten().copied().collect();
    for (s, n) in freed.iter().enumerate() {
        let is_arg = plan.args.iter().any(|a| a.slot == s);
        if kept.contains(&s) {
            assert_eq!(*n, 0, "result `{}` must survive", plan.slot_names[s]);
        } else if !is_arg {
            assert_eq!(*n, 1, "`{}` freed {n} times", plan.slot_names[s]);
        }
    }
    // a value dies right after its last reader: t130 is read only by the matmul making t131
    let t130 = plan.slot_names.iter().position(|n| n == "t130").unwrap();
    let at = plan
        .instrs
        .iter()
        .position(|i| i.free.contains(&t130))
        .unwrap();
    assert!(
        plan.instrs[at].line.starts_with("t131 = torch.matmul(t130"),
        "{}",
        plan.instrs[at].line
    );
}

#[test]
fn an_unsupported_dtype_names_the_node() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", f32t(&[2]));
    let i = b
        .op(
            "ltorch.to",
            vec![x.into(), Arg::DType(DType::U8, DTypeSpelling::Torch)],
        )
        .unwrap();
    b.ret(Arg::Value(i));
    let t = b.finish();
    let plan = Plan::compile(&t, &[Some(i)]).unwrap();
    let e = exec(
        &plan,
        vec![RValue::Tensor(Tensor::from_f32(vec![2], vec![1., 2.]))],
    )
    .unwrap_err();
    assert!(
        e.contains("rank 0: trace `f`: `t0 = ltorch.to(x, torch.uint8)")
            || e.contains("ltorch.to(x"),
        "{e}"
    );
    assert!(e.contains("u8"), "{e}");
}

#[test]
fn wrong_inputs_are_named() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", f32t(&[2]));
    let y = b.op("ltorch.neg", vec![x.into()]).unwrap();
    b.ret(Arg::Value(y));
    let t = b.finish();
    let plan = Plan::compile(&t, &[Some(y)]).unwrap();
    let e = exec(
        &plan,
        vec![RValue::Tensor(Tensor::from_f32(vec![3], vec![0.; 3]))],
    )
    .unwrap_err();
    assert!(
        e.contains("argument `x`: the trace expects f32 [2] but was given f32 [3]"),
        "{e}"
    );
    let e = exec(&plan, vec![RValue::Scalar(1.0)]).unwrap_err();
    assert!(
        e.contains("argument `x`: the trace expects a f32 [2] tensor but was given a number"),
        "{e}"
    );
    let e = exec(&plan, vec![]).unwrap_err();
    assert!(
        e.contains("the trace takes 1 arguments but was given 0"),
        "{e}"
    );
}

/// Each pack's per-member divisors, in plan order.
fn pack_divisors(plan: &Plan) -> Vec<Vec<Option<f64>>> {
    plan.instrs
        .iter()
        .filter_map(|i| match &i.kind {
            InstrKind::Pack { divisors } => Some(divisors.clone()),
            _ => None,
        })
        .collect()
}

/// `prims.div` feeding a bucket is fused into the pack (one pass over the gradient), unless
/// something else reads the quotient; either way the numbers are those of the `div` kernel.
#[test]
fn a_division_read_only_by_its_bucket_is_fused_into_the_pack() {
    let text = r#"import thunder
import thunder.core.prims as prims
import tracepass.dist as dist

def backward_fn(g, h):
  # g: "cpu f32[5]"
  # h: "cpu bf16[3]"
  t0 = prims.div(g, 3.0)  # t0: "cpu f32[5]"
  t1 = prims.div(h, 3.0)  # t1: "cpu bf16[3]"
  t2 = dist.bucket_pack([t0], bucket='b0', offsets=(0,), nbytes=20)  # t2: "cpu f32[5]"
  ft0 = dist.all_reduce_async(t2, 'sum', 'world')  # ft0: "FUTURE thunder.devices.Device(type='cpu') f32[5]"
  t3 = dist.bucket_pack([t1], bucket='b1', offsets=(0,), nbytes=6)  # t3: "cpu bf16[3]"
  ft1 = dist.all_reduce_async(t3, 'sum', 'world')  # ft1: "FUTURE thunder.devices.Device(type='cpu') bf16[3]"
  t4 = dist.wait(ft0)  # t4: "cpu f32[5]"
  t5 = dist.unpack(t4, bucket='b0', offsets=(0,), shapes=((5,),))  # t5: "cpu f32[5]"
  t6 = dist.wait(ft1)  # t6: "cpu bf16[3]"
  t7 = dist.unpack(t6, bucket='b1', offsets=(0,), shapes=((3,),))  # t7: "cpu bf16[3]"
  return (t5, t7)
"#;
    let t = tracepass_ir::parse_trace(text).unwrap();
    let id = |name: &str| t.find_value(name).unwrap();
    let g = Tensor::from_f32(vec![5], vec![1.0, -2.5, 7.0, 1e-8, 3.3]);
    let h = Tensor::from_f32(vec![3], vec![0.1, 5.0, -9.75])
        .to_dtype(DType::BF16)
        .unwrap();
    let inputs = || vec![RValue::Tensor(g.clone()), RValue::Tensor(h.clone())];
    let divided = |x: &Tensor| {
        use tracepass_runtime::exec::{Backend, Input};
        use tracepass_runtime::exec::{BinaryOp, Kernel, Side};
        let div = Kernel::Binary {
            op: BinaryOp::Div,
            a: Side::Input(0),
            b: Side::Scalar(3.0),
            alpha: 1.0,
        };
        CpuBackend.run(&div, &[Input::Tensor(x)]).unwrap()
    };

    let fused = Plan::compile(&t, &[Some(id("t5")), Some(id("t7"))]).unwrap();
    let packs = pack_divisors(&fused);
    assert_eq!(packs, vec![vec![Some(3.0)], vec![Some(3.0)]]);
    let nops = fused
        .instrs
        .iter()
        .filter(|i| matches!(i.kind, InstrKind::Nop) && i.line.contains("prims.div"))
        .count();
    assert_eq!(nops, 2);
    let out = exec(&fused, inputs()).unwrap();
    let got = out[0].clone().tensor().unwrap();
    assert!(got.bitwise_eq(&divided(&g)), "{:?}", got.to_f32_vec());
    let got = out[1].clone().tensor().unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    assert!(got.bitwise_eq(&divided(&h)), "{:?}", got.to_f32_vec());

    // t0 is also a result: its division must run on its own, and nothing changes
    let kept = Plan::compile(&t, &[Some(id("t5")), Some(id("t7")), Some(id("t0"))]).unwrap();
    let packs = pack_divisors(&kept);
    assert_eq!(packs, vec![vec![], vec![Some(3.0)]]);
    let out = exec(&kept, inputs()).unwrap();
    assert!(out[0].clone().tensor().unwrap().bitwise_eq(&divided(&g)));
    assert!(out[2].clone().tensor().unwrap().bitwise_eq(&divided(&g)));
}

#[test]
fn a_plan_error_lists_every_op_without_a_kernel_at_once() {
    // two unsupported ops, one of them twice, around ops that have kernels
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", f32t(&[4]));
    let a = b.op("ltorch.copysign", vec![x.into(), x.into()]).unwrap();
    let e = b.op("ltorch.exp", vec![a.into()]).unwrap();
    // (lgamma, digamma, then zeta and any were these ops until they got kernels; copysign and
    // glu still have none)
    let c = b.op("ltorch.glu", vec![e.into()]).unwrap();
    let f = b.op("ltorch.copysign", vec![e.into(), x.into()]).unwrap();
    b.ret(Arg::Tuple(vec![Arg::Value(f), Arg::Value(c)]));
    let t = b.finish();
    let err = Plan::compile(&t, &[Some(f), Some(c)]).expect_err("copysign and glu have no kernel");
    let listed: Vec<(&str, usize)> = err
        .missing
        .iter()
        .map(|m| (m.op.as_str(), m.count))
        .collect();
    assert_eq!(listed, vec![("ltorch.copysign", 2), ("ltorch.glu", 1)]);
    // the first node of each, as printed, and why
    let first_lgamma = tracepass_ir::print_node_line(&t, t.schedule()[0]);
    let first_digamma = tracepass_ir::print_node_line(&t, t.schedule()[2]);
    assert_eq!(err.missing[0].first_line, first_lgamma);
    assert_eq!(err.missing[1].first_line, first_digamma);
    assert_eq!(err.line, first_lgamma);
    let text = err.to_string();
    assert!(text.contains("2 ops without a kernel (3 nodes)"), "{text}");
    for m in &err.missing {
        assert!(text.contains(&format!("`{}` x{}", m.op, m.count)), "{text}");
        assert!(text.contains(&m.first_line), "{text}");
        assert!(text.contains("no kernel for op"), "{text}");
    }
}
