//! The real models' ops through the plan compiler and executor: Thunder's torch-executor
//! spellings decode to the CPU kernels, multi-output nodes bind every output, and the results
//! equal the kernels called directly.

use tracepass_ir::{Arg, DType, Device, Lhs, Node, Trace, TraceKind, Type, ValueId};
use tracepass_runtime::comm::{CommOptions, ThreadComm, ThreadGroup};
use tracepass_runtime::cpu::{kernels, CpuBackend};
use tracepass_runtime::exec::Plan;
use tracepass_runtime::exec::{Clock, Recording};
use tracepass_runtime::exec::{Executor, RValue};
use tracepass_runtime::tensor::Tensor;

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

fn tensor(v: &RValue<Tensor>) -> &Tensor {
    match v {
        RValue::Tensor(t) => t,
        _ => panic!("expected a tensor"),
    }
}

fn ty(shape: &[usize], dtype: DType) -> Type {
    Type::tensor(shape, dtype, Device::CPU)
}

fn f32t(shape: &[usize]) -> Type {
    ty(shape, DType::F32)
}

fn ints(v: &[i64]) -> Arg {
    Arg::Tuple(v.iter().map(|&i| Arg::Int(i)).collect())
}

fn v(x: ValueId) -> Arg {
    Arg::Value(x)
}

/// Appends `op(args, **kw)` spelled as Thunder's torch executor prints it, with declared
/// outputs (the op table that will type these ops is not in the IR yet).
fn node(
    t: &mut Trace,
    op: &str,
    args: Vec<Arg>,
    kw: Vec<(&str, Arg)>,
    outs: Vec<Type>,
) -> Vec<ValueId> {
    let first = t.value_bound();
    let ids: Vec<ValueId> = outs
        .into_iter()
        .enumerate()
        .map(|(k, ty)| t.new_value(format!("t{}", first + k), ty))
        .collect();
    let mut n = Node::new(op, args, ids.clone());
    n.lhs = if ids.len() > 1 {
        Lhs::List
    } else {
        Lhs::Single
    };
    n.set_kwargs(kw.into_iter().map(|(k, a)| (k.to_string(), a)).collect());
    t.append(n);
    ids
}

/// The shape of the cnn and nanogpt exports' traces (Thunder 0.2.6, torch executor).
fn cnn_like() -> (Trace, Vec<Option<ValueId>>) {
    let mut t = Trace::new("computation", TraceKind::Forward);
    let x = t.push_arg("x", f32t(&[2, 3, 6, 6]));
    let w = t.push_arg("weight", f32t(&[4, 3, 3, 3]));
    let b = t.push_arg("bias", f32t(&[4]));
    let big = f32t(&[2, 4, 6, 6]);
    let t0 = node(
        &mut t,
        "torch.convolution",
        vec![
            v(x),
            v(w),
            v(b),
            ints(&[1, 1]),
            ints(&[1, 1]),
            ints(&[1, 1]),
            Arg::Bool(false),
            ints(&[0, 0]),
            Arg::Int(1),
        ],
        vec![],
        vec![big.clone()],
    )[0];
    let vm = node(
        &mut t,
        "torch.var_mean",
        vec![
            v(t0),
            Arg::List(vec![Arg::Int(0), Arg::Int(2), Arg::Int(3)]),
        ],
        vec![("correction", Arg::Int(0))],
        vec![f32t(&[4]), f32t(&[4])],
    );
    let t3 = node(
        &mut t,
        "torch.unsqueeze",
        vec![v(vm[1]), Arg::Int(0)],
        vec![],
        vec![f32t(&[1, 4])],
    )[0];
    let t4 = node(
        &mut t,
        "torch.unsqueeze",
        vec![v(t3), Arg::Int(2)],
        vec![],
        vec![f32t(&[1, 4, 1])],
    )[0];
    let t5 = node(
        &mut t,
        "torch.unsqueeze",
        vec![v(t4), Arg::Int(3)],
        vec![],
        vec![f32t(&[1, 4, 1, 1])],
    )[0];
    let t6 = node(
        &mut t,
        "Tensor.expand",
        vec![v(t5), ints(&[2, 4, 6, 6])],
        vec![],
        vec![big.clone()],
    )[0];
    let t7 = node(
        &mut t,
        "ltorch.sub",
        vec![v(t0), v(t6)],
        vec![],
        vec![big.clone()],
    )[0];
    let t8 = node(
        &mut t,
        "torch.gt",
        vec![v(t7), Arg::Float(0.0)],
        vec![],
        vec![ty(&[2, 4, 6, 6], DType::Bool)],
    )[0];
    let t9 = node(
        &mut t,
        "torch.where",
        vec![v(t8), v(t7), Arg::Int(0)],
        vec![],
        vec![big.clone()],
    )[0];
    let mp = node(
        &mut t,
        "max_pool2d_with_indices",
        vec![
            v(t9),
            Arg::Int(2),
            Arg::Int(2),
            Arg::Int(0),
            Arg::Int(1),
            Arg::Bool(false),
        ],
        vec![],
        vec![f32t(&[2, 4, 3, 3]), ty(&[2, 4, 3, 3], DType::I64)],
    );
    let t12 = node(
        &mut t,
        "max_pool2d_with_indices_backward",
        vec![
            v(mp[0]),
            v(t9),
            Arg::Int(2),
            Arg::Int(2),
            Arg::Int(0),
            Arg::Int(1),
            Arg::Bool(false),
            v(mp[1]),
        ],
        vec![],
        vec![big.clone()],
    )[0];
    let cfg = Arg::List(vec![
        ints(&[0, 0, 0]),
        ints(&[0, 0, 0]),
        ints(&[-1, -1, 0]),
        ints(&[-1, -1, 0]),
    ]);
    let t13 = node(
        &mut t,
        "torch_pad_prim_impl",
        vec![v(t12), Arg::Float(0.0), cfg],
        vec![],
        vec![f32t(&[2, 4, 4, 4])],
    )[0];
    let t14 = node(
        &mut t,
        "torch.flip",
        vec![v(t13), ints(&[2, 3])],
        vec![],
        vec![f32t(&[2, 4, 4, 4])],
    )[0];
    let halves = node(
        &mut t,
        "torch.split",
        vec![v(t14), Arg::Int(2), Arg::Int(1)],
        vec![],
        vec![f32t(&[2, 2, 4, 4]), f32t(&[2, 2, 4, 4])],
    );
    let t17 = node(
        &mut t,
        "torch.cat",
        vec![Arg::Tuple(vec![v(halves[1]), v(halves[0])]), Arg::Int(1)],
        vec![],
        vec![f32t(&[2, 4, 4, 4])],
    )[0];
    let t18 = node(
        &mut t,
        "torch.arange",
        vec![],
        vec![
            ("start", Arg::Int(0)),
            ("step", Arg::Int(1)),
            ("end", Arg::Int(4)),
            ("dtype", Arg::None),
        ],
        vec![ty(&[4], DType::I64)],
    )[0];
    t.ret = Arg::Tuple(vec![v(vm[0]), v(t17), v(mp[1]), v(t18)]);
    (t, vec![Some(vm[0]), Some(t17), Some(mp[1]), Some(t18)])
}

#[test]
fn a_cnn_shaped_trace_runs_on_the_cpu_kernels() {
    let (trace, rets) = cnn_like();
    let plan = Plan::compile(&trace, &rets).expect("every op decodes");
    let x = Tensor::from_f32(
        vec![2, 3, 6, 6],
        (0..216)
            .map(|i| ((i * 37) % 19) as f32 * 0.1 - 0.9)
            .collect(),
    );
    let w = Tensor::from_f32(
        vec![4, 3, 3, 3],
        (0..108)
            .map(|i| ((i * 11) % 7) as f32 * 0.05 - 0.15)
            .collect(),
    );
    let b = Tensor::from_f32(vec![4], vec![0.1, -0.2, 0.3, 0.0]);
    let out = exec(
        &plan,
        vec![
            RValue::Tensor(x.clone()),
            RValue::Tensor(w.clone()),
            RValue::Tensor(b.clone()),
        ],
    )
    .expect("runs");

    // the same chain, calling the kernels directly
    let t0 = kernels::convolution(
        &x,
        &w,
        Some(&b),
        &[1, 1],
        &[1, 1],
        &[1, 1],
        false,
        &[0, 0],
        1,
    )
    .expect("conv");
    let (var, mean) = kernels::var_mean(&t0, Some(&[0, 2, 3]), 0.0, false).expect("var_mean");
    assert!(tensor(&out[0]).bitwise_eq(&var));
    let m = kernels::expand(&mean.reshape(vec![1, 4, 1, 1]).expect("4"), &[2, 4, 6, 6])
        .expect("expand");
    let centered: Vec<f32> = t0
        .to_f32_vec()
        .iter()
        .zip(m.to_f32_vec())
        .map(|(a, b)| a - b)
        .collect();
    let t7 = Tensor::from_f32(vec![2, 4, 6, 6], centered);
    let mask = kernels::compare(
        tracepass_runtime::exec::CompareOp::Gt,
        kernels::Operand::Tensor(&t7),
        kernels::Operand::Scalar(0.0),
    )
    .expect("gt");
    let t9 = kernels::where_(
        &mask,
        kernels::Operand::Tensor(&t7),
        kernels::Operand::Scalar(0.0),
        tracepass_ir::DType::F32,
    )
    .expect("where");
    let p = kernels::Pool2d::new(&[2], &[2], &[0], &[1], false).expect("pool");
    let (v, idx) = kernels::max_pool2d_with_indices(&t9, &p).expect("pool");
    assert!(tensor(&out[2]).bitwise_eq(&idx));
    let g = kernels::max_pool2d_with_indices_backward(&v, &t9, &idx).expect("backward");
    let cropped =
        kernels::pad(&g, 0.0, &[(0, 0, 0), (0, 0, 0), (-1, -1, 0), (-1, -1, 0)]).expect("pad");
    let flipped = kernels::flip(&cropped, &[2, 3]).expect("flip");
    let halves = kernels::split(&flipped, &kernels::SplitSizes::Chunk(2), 1).expect("split");
    let swapped = kernels::cat(&[&halves[1], &halves[0]], 1).expect("cat");
    assert_eq!(tensor(&out[1]).shape(), &[2, 4, 4, 4]);
    assert!(tensor(&out[1]).bitwise_eq(&swapped));
    assert_eq!(tensor(&out[3]).to_i64_vec(), vec![0, 1, 2, 3]);
}
