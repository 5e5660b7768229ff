//! The kernels registered for the op table's ops, through the plan compiler and the executor
//! on hand-made traces, against values computed by hand.

mod common;
use common::run_trace_for as run;
use tracepass_ir::{Arg, DType, Device, Trace, TraceBuilder, TraceKind, Type, ValueId};
use tracepass_runtime::comm::{CommOptions, ThreadComm, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::Kernel;
use tracepass_runtime::exec::{Clock, Recording};
use tracepass_runtime::exec::{Executor, RValue};
use tracepass_runtime::exec::{InstrKind, Plan};
use tracepass_runtime::tensor::Tensor;

fn ty(shape: &[usize], dtype: DType) -> Type {
    Type::tensor(shape, dtype, Device::CPU)
}

fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f32(shape, (0..n).map(|i| i as f32).collect())
}

fn slice(a: Option<i64>, b: Option<i64>, c: Option<i64>) -> Arg {
    Arg::Slice(Box::new([a, b, c]))
}

fn all() -> Arg {
    slice(None, None, None)
}

fn bools(t: &Tensor) -> Vec<bool> {
    assert_eq!(t.dtype(), DType::Bool);
    t.contiguous()
        .elems::<bool>()
        .expect("bool storage")
        .to_vec()
}

/// The kernel the plan compiled for the trace's last node.
fn last_kernel(t: &Trace, result: ValueId) -> Kernel {
    let plan = Plan::compile(t, &[Some(result)]).unwrap_or_else(|e| panic!("{e}"));
    match &plan.instrs.last().expect("an instruction").kind {
        InstrKind::Compute(k) => k.clone(),
        other => panic!("expected a kernel, got {other:?}"),
    }
}

#[test]
fn getitem_takes_ints_slices_none_and_ellipsis() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[3, 4], DType::F32));
    let key = |items: Vec<Arg>| Arg::Tuple(items);
    let g = |b: &mut TraceBuilder, k: Arg| b.op("ltorch.getitem", vec![x.into(), k]).unwrap();
    // x[:, None, 1::2]
    let y1 = g(
        &mut b,
        key(vec![all(), Arg::None, slice(Some(1), None, Some(2))]),
    );
    // x[-1]
    let y2 = g(&mut b, Arg::Int(-1));
    // x[..., 0]
    let y3 = g(&mut b, key(vec![Arg::Ellipsis, Arg::Int(0)]));
    // x[-2:, :-1]
    let y4 = g(
        &mut b,
        key(vec![
            slice(Some(-2), None, None),
            slice(None, Some(-1), None),
        ]),
    );
    // x[5:10]: clamped to an empty slice
    let y5 = g(&mut b, slice(Some(5), Some(10), None));
    b.ret(Arg::Tuple(vec![
        y1.into(),
        y2.into(),
        y3.into(),
        y4.into(),
        y5.into(),
    ]));
    let t = b.finish();
    let out = run(&t, &[y1, y2, y3, y4, y5], vec![iota(&[3, 4])]);
    // x = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert_eq!(out[0].shape(), &[3, 1, 2]);
    assert_eq!(out[0].to_f32_vec(), vec![1., 3., 5., 7., 9., 11.]);
    assert_eq!(out[1].shape(), &[4]);
    assert_eq!(out[1].to_f32_vec(), vec![8., 9., 10., 11.]);
    assert_eq!(out[2].shape(), &[3]);
    assert_eq!(out[2].to_f32_vec(), vec![0., 4., 8.]);
    assert_eq!(out[3].shape(), &[2, 3]);
    assert_eq!(out[3].to_f32_vec(), vec![4., 5., 6., 8., 9., 10.]);
    assert_eq!(out[4].shape(), &[0, 4]);
    assert!(out[4].to_f32_vec().is_empty());
}

#[test]
fn getitem_compiles_to_a_slice_a_reshape_or_both() {
    let kernels = |key: Arg| -> Vec<Kernel> {
        let mut b = TraceBuilder::new("f", TraceKind::Forward);
        let x = b.arg("x", ty(&[3, 4], DType::F32));
        let y = b.op("ltorch.getitem", vec![x.into(), key]).unwrap();
        b.ret(Arg::Value(y));
        let plan = Plan::compile(&b.finish(), &[Some(y)]).unwrap();
        plan.instrs
            .iter()
            .map(|i| match &i.kind {
                InstrKind::Compute(k) => k.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    // x[:, 1:3]: a slice alone
    assert_eq!(
        kernels(Arg::Tuple(vec![all(), slice(Some(1), Some(3), None)])),
        vec![Kernel::Slice {
            start: vec![0, 1],
            end: vec![3, 3],
            step: vec![1, 1],
        }]
    );
    // x[:, None, :]: a reshape alone
    assert_eq!(
        kernels(Arg::Tuple(vec![all(), Arg::None, all()])),
        vec![Kernel::Reshape(vec![3, 1, 4])]
    );
    // x[1]: the row, then its dimension dropped
    assert_eq!(
        kernels(Arg::Int(1)),
        vec![
            Kernel::Slice {
                start: vec![1, 0],
                end: vec![2, 4],
                step: vec![1, 1],
            },
            Kernel::Reshape(vec![4]),
        ]
    );
}

#[test]
fn getitem_of_an_i64_mask_as_bert_indexes_it() {
    // attention_mask[:, None, None, :]
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let m = b.arg("m", ty(&[2, 3], DType::I64));
    let y = b
        .op(
            "ltorch.getitem",
            vec![
                m.into(),
                Arg::Tuple(vec![all(), Arg::None, Arg::None, all()]),
            ],
        )
        .unwrap();
    b.ret(Arg::Value(y));
    let t = b.finish();
    let out = run(
        &t,
        &[y],
        vec![Tensor::from_i64(vec![2, 3], vec![1, 1, 0, 1, 0, 0])],
    );
    assert_eq!(out[0].dtype(), DType::I64);
    assert_eq!(out[0].shape(), &[2, 1, 1, 3]);
    assert_eq!(out[0].to_i64_vec(), vec![1, 1, 0, 1, 0, 0]);
}

/// `x[i]` with an index tensor (advanced indexing, as Thunder's backward of a slice assignment
/// reads a gradient): the elements `i` names, negative ones counted from the end.
#[test]
fn getitem_with_a_tensor_index_selects_its_elements() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[3], DType::F32));
    let i = b.arg("i", ty(&[2], DType::I64));
    let y = b.op("ltorch.getitem", vec![x.into(), i.into()]).unwrap();
    b.ret(Arg::Value(y));
    let t = b.finish();
    let out = run(
        &t,
        &[y],
        vec![
            Tensor::from_f32(vec![3], vec![10.0, 20.0, 30.0]),
            Tensor::from_i64(vec![2], vec![-1, 0]),
        ],
    );
    assert_eq!(out[0].shape(), &[2]);
    assert_eq!(out[0].to_f64_vec(), vec![30.0, 10.0]);
}

#[test]
fn masked_fill_writes_the_value_where_the_mask_is_true() {
    for dtype in [DType::F32, DType::BF16] {
        let mut b = TraceBuilder::new("f", TraceKind::Forward);
        let a = b.arg("a", ty(&[4], dtype));
        let m = b.arg("m", ty(&[4], DType::Bool));
        let y = b
            .op(
                "ltorch.masked_fill",
                vec![a.into(), m.into(), Arg::Float(-1.0)],
            )
            .unwrap();
        b.ret(Arg::Value(y));
        let t = b.finish();
        let av = Tensor::from_f32(vec![4], vec![1., 2., 3., 4.])
            .to_dtype(dtype)
            .expect("representable");
        let mv = Tensor::from_bool(vec![4], vec![true, false, true, false]);
        let out = run(&t, &[y], vec![av, mv]);
        assert_eq!(out[0].dtype(), dtype);
        assert_eq!(out[0].to_f32_vec(), vec![-1., 2., -1., 4.]);
    }
}

#[test]
fn logical_not_and_isnan_give_bool_tensors() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let p = b.arg("p", ty(&[3], DType::Bool));
    let x = b.arg("x", ty(&[4], DType::F32));
    let np = b.op("ltorch.logical_not", vec![p.into()]).unwrap();
    let nx = b.op("ltorch.logical_not", vec![x.into()]).unwrap();
    let nan = b.op("ltorch.isnan", vec![x.into()]).unwrap();
    b.ret(Arg::Tuple(vec![np.into(), nx.into(), nan.into()]));
    let t = b.finish();
    let out = run(
        &t,
        &[np, nx, nan],
        vec![
            Tensor::from_bool(vec![3], vec![true, false, true]),
            Tensor::from_f32(vec![4], vec![0.0, 2.5, f32::NAN, -0.0]),
        ],
    );
    assert_eq!(bools(&out[0]), vec![false, true, false]);
    // NaN is truthy in PyTorch: not(NaN) is false; -0.0 is zero
    assert_eq!(bools(&out[1]), vec![true, false, false, true]);
    assert_eq!(bools(&out[2]), vec![false, false, true, false]);
}

#[test]
fn chunk_splits_into_ceil_sized_pieces() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[5], DType::F32));
    let two = b
        .op_multi("ltorch.chunk", vec![x.into(), Arg::Int(2)], vec![])
        .unwrap();
    let three = b
        .op_multi("ltorch.chunk", vec![x.into(), Arg::Int(3)], vec![])
        .unwrap();
    assert_eq!((two.len(), three.len()), (2, 3));
    let mut all_out = two.clone();
    all_out.extend(&three);
    b.ret(Arg::Tuple(all_out.iter().map(|v| Arg::Value(*v)).collect()));
    let t = b.finish();
    let out = run(&t, &all_out, vec![iota(&[5])]);
    let vals: Vec<Vec<f32>> = out.iter().map(Tensor::to_f32_vec).collect();
    assert_eq!(
        vals,
        vec![
            vec![0., 1., 2.],
            vec![3., 4.],
            vec![0., 1.],
            vec![2., 3.],
            vec![4.],
        ]
    );
}

#[test]
fn functional_pad_pads_the_last_dimensions_first() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 2], DType::F32));
    let p1 = b
        .op_kw(
            "ltorch.pad",
            vec![x.into(), Arg::int_tuple([1, 0])],
            vec![("value".into(), Arg::Float(9.0))],
        )
        .unwrap();
    let p2 = b
        .op("ltorch.pad", vec![x.into(), Arg::int_tuple([0, 1, 1, 0])])
        .unwrap();
    b.ret(Arg::Tuple(vec![p1.into(), p2.into()]));
    let t = b.finish();
    let x0 = Tensor::from_f32(vec![2, 2], vec![1., 2., 3., 4.]);
    let out = run(&t, &[p1, p2], vec![x0]);
    assert_eq!(out[0].shape(), &[2, 3]);
    assert_eq!(out[0].to_f32_vec(), vec![9., 1., 2., 9., 3., 4.]);
    assert_eq!(out[1].shape(), &[3, 3]);
    assert_eq!(
        out[1].to_f32_vec(),
        vec![0., 0., 0., 1., 2., 0., 3., 4., 0.]
    );
}

#[test]
fn creation_ops_fill_the_declared_shape_and_dtype() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2], DType::I64));
    let z = b
        .op("ltorch.zeros", vec![Arg::Int(2), Arg::Int(3)])
        .unwrap();
    let o = b.op("ltorch.ones_like", vec![x.into()]).unwrap();
    let f = b
        .op("ltorch.full_like", vec![x.into(), Arg::Int(7)])
        .unwrap();
    b.ret(Arg::Tuple(vec![z.into(), o.into(), f.into()]));
    let t = b.finish();
    let out = run(&t, &[z, o, f], vec![Tensor::from_i64(vec![2], vec![5, 6])]);
    assert_eq!(out[0].shape(), &[2, 3]);
    assert_eq!(out[0].to_f32_vec(), vec![0.0; 6]);
    assert_eq!(out[1].dtype(), DType::I64);
    assert_eq!(out[1].to_i64_vec(), vec![1, 1]);
    assert_eq!(out[2].dtype(), DType::I64);
    assert_eq!(out[2].to_i64_vec(), vec![7, 7]);
}

#[test]
fn conv1d_and_conv2d_run_the_convolution_kernel() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[1, 1, 4], DType::F32));
    let w = b.arg("w", ty(&[1, 1, 2], DType::F32));
    let bias = b.arg("bias", ty(&[1], DType::F32));
    let y = b
        .op("ltorch.conv1d", vec![x.into(), w.into(), bias.into()])
        .unwrap();
    let s = b
        .op_kw(
            "ltorch.conv1d",
            vec![x.into(), w.into()],
            vec![("stride".into(), Arg::Int(2))],
        )
        .unwrap();
    let x2 = b.arg("x2", ty(&[1, 1, 2, 2], DType::F32));
    let w2 = b.arg("w2", ty(&[1, 1, 2, 2], DType::F32));
    let c2 = b.op("ltorch.conv2d", vec![x2.into(), w2.into()]).unwrap();
    b.ret(Arg::Tuple(vec![y.into(), s.into(), c2.into()]));
    let t = b.finish();
    let out = run(
        &t,
        &[y, s, c2],
        vec![
            Tensor::from_f32(vec![1, 1, 4], vec![1., 2., 3., 4.]),
            Tensor::from_f32(vec![1, 1, 2], vec![1., -1.]),
            Tensor::from_f32(vec![1], vec![10.]),
            Tensor::from_f32(vec![1, 1, 2, 2], vec![1., 2., 3., 4.]),
            Tensor::from_f32(vec![1, 1, 2, 2], vec![1., 0., 0., 2.]),
        ],
    );
    // (1 - 2) + 10, (2 - 3) + 10, (3 - 4) + 10
    assert_eq!(out[0].shape(), &[1, 1, 3]);
    assert_eq!(out[0].to_f32_vec(), vec![9., 9., 9.]);
    // windows at 0 and 2: 1 - 2, 3 - 4
    assert_eq!(out[1].to_f32_vec(), vec![-1., -1.]);
    // 1 * 1 + 4 * 2
    assert_eq!(out[2].shape(), &[1, 1, 1, 1]);
    assert_eq!(out[2].to_f32_vec(), vec![9.]);
}

#[test]
fn bmm_flatten_permute_and_transpose_spellings() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let a = b.arg("a", ty(&[1, 2, 2], DType::F32));
    let c = b.arg("c", ty(&[1, 2, 2], DType::F32));
    let x = b.arg("x", ty(&[2, 3], DType::F32));
    let m = b.op("ltorch.bmm", vec![a.into(), c.into()]).unwrap();
    let f = b.op("ltorch.flatten", vec![m.into()]).unwrap();
    // permute(x, 1, 0): the dims spread over the operands
    let p = b
        .op("ltorch.permute", vec![x.into(), Arg::Int(1), Arg::Int(0)])
        .unwrap();
    let tr = b
        .op(
            "ltorch.transpose",
            vec![x.into(), Arg::Int(-1), Arg::Int(0)],
        )
        .unwrap();
    b.ret(Arg::Tuple(vec![f.into(), p.into(), tr.into()]));
    let t = b.finish();
    let out = run(
        &t,
        &[f, p, tr],
        vec![
            Tensor::from_f32(vec![1, 2, 2], vec![1., 2., 3., 4.]),
            Tensor::from_f32(vec![1, 2, 2], vec![5., 6., 7., 8.]),
            iota(&[2, 3]),
        ],
    );
    // [[1*5 + 2*7, 1*6 + 2*8], [3*5 + 4*7, 3*6 + 4*8]]
    assert_eq!(out[0].shape(), &[4]);
    assert_eq!(out[0].to_f32_vec(), vec![19., 22., 43., 50.]);
    assert_eq!(out[1].shape(), &[3, 2]);
    assert_eq!(out[1].to_f32_vec(), vec![0., 3., 1., 4., 2., 5.]);
    assert_eq!(out[2].to_f32_vec(), vec![0., 3., 1., 4., 2., 5.]);
}

#[test]
fn update_aliases_binds_each_output_to_its_input() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2], DType::F32));
    let n = b.arg("n", ty(&[], DType::I64));
    let al = b
        .op_multi(
            "python.update_aliases",
            vec![Arg::Tuple(vec![x.into(), n.into()])],
            vec![],
        )
        .unwrap();
    assert_eq!(al.len(), 2);
    // num_batches_tracked + 1, as BatchNorm's forward does it
    let n1 = b.op("ltorch.add", vec![al[1].into(), Arg::Int(1)]).unwrap();
    let y = b.op("ltorch.mul", vec![al[0].into(), Arg::Int(2)]).unwrap();
    b.ret(Arg::Tuple(vec![y.into(), n1.into()]));
    let t = b.finish();
    let plan = Plan::compile(&t, &[Some(y), Some(n1)]).unwrap();
    assert!(matches!(plan.instrs[0].kind, InstrKind::Alias));
    let out = run(
        &t,
        &[y, n1, al[0]],
        vec![
            Tensor::from_f32(vec![2], vec![1.5, -2.0]),
            Tensor::from_i64(vec![], vec![41]),
        ],
    );
    assert_eq!(out[0].to_f32_vec(), vec![3.0, -4.0]);
    assert_eq!(out[1].dtype(), DType::I64);
    assert_eq!(out[1].to_i64_vec(), vec![42]);
    assert_eq!(out[2].to_f32_vec(), vec![1.5, -2.0]);
}

#[test]
fn copy_gives_the_source_in_the_destination_dtype() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let src = b.arg("src", ty(&[2], DType::BF16));
    let dst = b.arg("dst", ty(&[2], DType::BF16));
    let y = b
        .op_kw(
            "python.copy_",
            vec![src.into(), dst.into()],
            vec![("grad_enabled".into(), Arg::Bool(true))],
        )
        .unwrap();
    b.ret(Arg::Value(y));
    let t = b.finish();
    let s = Tensor::from_f32(vec![2], vec![0.5, 3.0])
        .to_dtype(DType::BF16)
        .unwrap();
    let d = Tensor::from_f32(vec![2], vec![7.0, 7.0])
        .to_dtype(DType::BF16)
        .unwrap();
    let out = run(&t, &[y], vec![s, d]);
    assert_eq!(out[0].dtype(), DType::BF16);
    assert_eq!(out[0].to_f32_vec(), vec![0.5, 3.0]);
}

#[test]
fn decoders_read_the_ops_options() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 3], DType::F32));
    let g = b
        .op_kw(
            "ltorch.gelu",
            vec![x.into()],
            vec![("approximate".into(), Arg::Str("tanh".into()))],
        )
        .unwrap();
    let t = b.finish();
    assert_eq!(
        last_kernel(&t, g),
        Kernel::Unary(tracepass_runtime::exec::UnaryOp::GeluTanh)
    );
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let r = b.op("ltorch.rand", vec![Arg::Int(2), Arg::Int(3)]).unwrap();
    let t = b.finish();
    assert!(
        matches!(last_kernel(&t, r), Kernel::Uniform { shape, minval, maxval, .. }
            if shape == vec![2, 3] && minval == 0.0 && maxval == 1.0)
    );
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 3], DType::F32));
    let r = b
        .op_kw(
            "ltorch.relu",
            vec![x.into()],
            vec![("inplace".into(), Arg::Bool(true))],
        )
        .unwrap();
    b.ret(Arg::Value(r));
    let t = b.finish();
    let e = Plan::compile(&t, &[Some(r)]).expect_err("in-place relu");
    assert!(e.to_string().contains("in-place relu"), "{e}");
}

#[test]
fn prims_and_torch_level_spellings_run_their_registered_kernels() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 3], DType::F32));
    let s = b
        .op("prims.sum", vec![x.into(), Arg::int_tuple([1])])
        .unwrap();
    let m = b
        .op("prims.amax", vec![x.into(), Arg::int_tuple([0])])
        .unwrap();
    let t = b
        .op("prims.transpose", vec![x.into(), Arg::int_tuple([1, 0])])
        .unwrap();
    let c = b
        .op(
            "prims.convert_element_type",
            vec![
                x.into(),
                Arg::DType(DType::F64, tracepass_ir::DTypeSpelling::Thunder),
            ],
        )
        .unwrap();
    let vm = b
        .op_multi(
            "prims.var_mean",
            vec![x.into(), Arg::int_tuple([1])],
            vec![("correction".into(), Arg::Int(0))],
        )
        .unwrap();
    let mean = b.op("ltorch.mean", vec![x.into(), Arg::Int(1)]).unwrap();
    let cl = b.op("ltorch.clone", vec![x.into()]).unwrap();
    let e = b.op("ltorch.empty", vec![Arg::Int(2)]).unwrap();
    let z = b.op("ltorch.zeros_like", vec![x.into()]).unwrap();
    let ls = b
        .op("ltorch.log_softmax", vec![x.into(), Arg::Int(1)])
        .unwrap();
    let outs = vec![s, m, t, c, vm[0], vm[1], mean, cl, e, z, ls];
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let tr = b.finish();
    // x = [[1, 2, 3], [4, 5, 6]]
    let x0 = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let out = run(&tr, &outs, vec![x0]);
    assert_eq!(out[0].to_f32_vec(), vec![6., 15.]);
    assert_eq!(out[1].to_f32_vec(), vec![4., 5., 6.]);
    assert_eq!(out[2].shape(), &[3, 2]);
    assert_eq!(out[2].to_f32_vec(), vec![1., 4., 2., 5., 3., 6.]);
    assert_eq!(out[3].dtype(), DType::F64);
    assert_eq!(out[3].to_f64_vec(), vec![1., 2., 3., 4., 5., 6.]);
    // population variance of (1, 2, 3) and of (4, 5, 6): ((-1)^2 + 0 + 1^2) / 3
    let var = out[4].to_f32_vec();
    assert!(var.iter().all(|v| (v - 2.0 / 3.0).abs() < 1e-6), "{var:?}");
    assert_eq!(out[5].to_f32_vec(), vec![2., 5.]);
    assert_eq!(out[6].to_f32_vec(), vec![2., 5.]);
    assert_eq!(out[7].to_f32_vec(), vec![1., 2., 3., 4., 5., 6.]);
    assert_eq!(out[8].shape(), &[2]);
    assert_eq!(out[9].to_f32_vec(), vec![0.0; 6]);
    // log_softmax of (1, 2, 3): x - 3 - ln(e^-2 + e^-1 + 1)
    let lse = ((-2.0f64).exp() + (-1.0f64).exp() + 1.0).ln();
    let want: Vec<f64> = [-2.0, -1.0, 0.0, -2.0, -1.0, 0.0]
        .iter()
        .map(|d| d - lse)
        .collect();
    for (got, w) in out[10].to_f32_vec().iter().zip(&want) {
        assert!((*got as f64 - w).abs() < 1e-6, "{got} vs {w}");
    }
}

/// The elementwise functions and activations beyond the first corpus, against hand-computed
/// values (PyTorch's definitions: `round` halves to even, `selu`'s constants, `softplus`
/// linear above 20).
#[test]
fn more_elementwise_functions_and_activations() {
    let xs = [-2.5f32, -0.5, 0.0, 0.5, 1.0, 2.5, 30.0];
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[7], DType::F32));
    let ops = [
        "ltorch.floor",
        "ltorch.ceil",
        "ltorch.round",
        "ltorch.trunc",
        "ltorch.relu6",
        "ltorch.hardswish",
        "ltorch.hardsigmoid",
        "ltorch.softsign",
        "ltorch.softplus",
        "ltorch.selu",
        "ltorch.logsigmoid",
        "ltorch.atan",
        "ltorch.exp2",
    ];
    let ys: Vec<ValueId> = ops
        .iter()
        .map(|op| {
            b.op(op, vec![x.into()])
                .unwrap_or_else(|e| panic!("{op}: {e}"))
        })
        .collect();
    b.ret(Arg::Tuple(ys.iter().map(|y| Arg::Value(*y)).collect()));
    let out = run(
        &b.finish(),
        &ys,
        vec![Tensor::from_f32(vec![7], xs.to_vec())],
    );
    let want: Vec<Vec<f64>> = vec![
        vec![-3.0, -1.0, 0.0, 0.0, 1.0, 2.0, 30.0],
        vec![-2.0, -0.0, 0.0, 1.0, 1.0, 3.0, 30.0],
        vec![-2.0, -0.0, 0.0, 0.0, 1.0, 2.0, 30.0],
        vec![-2.0, -0.0, 0.0, 0.0, 1.0, 2.0, 30.0],
        vec![0.0, 0.0, 0.0, 0.5, 1.0, 2.5, 6.0],
        vec![
            -2.5 * 0.5 / 6.0,
            -0.5 * 2.5 / 6.0,
            0.0,
            0.5 * 3.5 / 6.0,
            4.0 / 6.0,
            2.5 * 5.5 / 6.0,
            30.0,
        ],
        vec![
            0.5 / 6.0,
            2.5 / 6.0,
            0.5,
            3.5 / 6.0,
            4.0 / 6.0,
            5.5 / 6.0,
            1.0,
        ],
        vec![
            -2.5 / 3.5,
            -0.5 / 1.5,
            0.0,
            0.5 / 1.5,
            0.5,
            2.5 / 3.5,
            30.0 / 31.0,
        ],
        xs.iter()
            .map(|&x| {
                if x > 20.0 {
                    x as f64
                } else {
                    (x as f64).exp().ln_1p()
                }
            })
            .collect(),
        xs.iter()
            .map(|&x| {
                let x = x as f64;
                1.0507009873554805
                    * if x > 0.0 {
                        x
                    } else {
                        1.6732632423543772 * x.exp_m1()
                    }
            })
            .collect(),
        xs.iter()
            .map(|&x| (1.0 / (1.0 + (-(x as f64)).exp())).ln())
            .collect(),
        xs.iter().map(|&x| (x as f64).atan()).collect(),
        xs.iter().map(|&x| (x as f64).exp2()).collect(),
    ];
    for ((op, got), want) in ops.iter().zip(&out).zip(&want) {
        for (g, w) in got.to_f64_vec().iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{op}: {:?} vs {want:?}",
                got.to_f64_vec()
            );
        }
    }
}

/// `clamp` runs as `maximum` then `minimum`; one bound alone is one kernel.
#[test]
fn clamp_bounds_below_and_above() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[4], DType::F32));
    let both = b
        .op(
            "ltorch.clamp",
            vec![x.into(), Arg::Float(-1.0), Arg::Float(2.0)],
        )
        .unwrap();
    let lo = b
        .op("ltorch.clamp", vec![x.into(), Arg::Float(0.0)])
        .unwrap();
    b.ret(Arg::Tuple(vec![Arg::Value(both), Arg::Value(lo)]));
    let out = run(
        &b.finish(),
        &[both, lo],
        vec![Tensor::from_f32(vec![4], vec![-3.0, -0.5, 1.5, 7.0])],
    );
    assert_eq!(out[0].to_f32_vec(), vec![-1.0, -0.5, 1.5, 2.0]);
    assert_eq!(out[1].to_f32_vec(), vec![0.0, 0.0, 1.5, 7.0]);
}

/// Keyword operands of a node.
type Kwargs = Vec<(String, Arg)>;

/// `leaky_relu`, `elu`, `celu` and `hardtanh` with their parameters, positional or keyword,
/// against torch 2.9.0's values (`F.leaky_relu(x, 0.2)`, `F.elu(x, 0.7)`, `F.celu(x, 0.7)`,
/// `F.hardtanh(x, -1.0, 2.0)` on float32), and the defaults (0.01, 1.0, 1.0, [-1, 1]).
#[test]
fn parametrized_activations_take_their_parameters() {
    let xs = vec![-2.5f32, -0.5, 0.0, 0.5, 1.0, 2.5];
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[6], DType::F32));
    let calls: Vec<(&str, Vec<Arg>, Kwargs)> = vec![
        ("ltorch.leaky_relu", vec![x.into(), Arg::Float(0.2)], vec![]),
        (
            "ltorch.elu",
            vec![x.into()],
            vec![("alpha".into(), Arg::Float(0.7))],
        ),
        ("ltorch.celu", vec![x.into(), Arg::Float(0.7)], vec![]),
        (
            "ltorch.hardtanh",
            vec![x.into(), Arg::Float(-1.0)],
            vec![("max_val".into(), Arg::Float(2.0))],
        ),
        ("ltorch.leaky_relu", vec![x.into()], vec![]),
        ("ltorch.elu", vec![x.into()], vec![]),
        ("ltorch.celu", vec![x.into()], vec![]),
        ("ltorch.hardtanh", vec![x.into()], vec![]),
    ];
    let ys: Vec<ValueId> = calls
        .iter()
        .map(|(op, args, kw)| {
            b.op_kw(op, args.clone(), kw.clone())
                .unwrap_or_else(|e| panic!("{op}: {e}"))
        })
        .collect();
    b.ret(Arg::Tuple(ys.iter().map(|y| Arg::Value(*y)).collect()));
    let out = run(
        &b.finish(),
        &ys,
        vec![Tensor::from_f32(vec![6], xs.clone())],
    );
    let elu = |x: f64, a: f64| if x > 0.0 { x } else { a * x.exp_m1() };
    let want: Vec<Vec<f64>> = vec![
        vec![-0.5, -0.1000000015, 0.0, 0.5, 1.0, 2.5],
        vec![-0.6425404549, -0.2754285336, 0.0, 0.5, 1.0, 2.5],
        vec![-0.6803190708, -0.3573208451, 0.0, 0.5, 1.0, 2.5],
        vec![-1.0, -0.5, 0.0, 0.5, 1.0, 2.0],
        xs.iter()
            .map(|&x| if x > 0.0 { x as f64 } else { x as f64 * 0.01 })
            .collect(),
        xs.iter().map(|&x| elu(x as f64, 1.0)).collect(),
        xs.iter().map(|&x| elu(x as f64, 1.0)).collect(),
        vec![-1.0, -0.5, 0.0, 0.5, 1.0, 1.0],
    ];
    for (((op, ..), got), want) in calls.iter().zip(&out).zip(&want) {
        assert_eq!(got.dtype(), DType::F32, "{op}");
        for (g, w) in got.to_f64_vec().iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-7,
                "{op}: {:?} vs {want:?}",
                got.to_f64_vec()
            );
        }
    }
}

/// Arguments PyTorch refuses, integer tensors and in-place forms are plan errors that name
/// the op and the argument.
#[test]
fn parametrized_activations_refuse_what_pytorch_refuses() {
    let cases: Vec<(&str, DType, Vec<Arg>, Kwargs, &str)> = vec![
        (
            "ltorch.celu",
            DType::F32,
            vec![Arg::Float(0.0)],
            vec![],
            "`alpha` cannot be 0",
        ),
        (
            "ltorch.hardtanh",
            DType::F32,
            vec![Arg::Float(2.0), Arg::Float(-1.0)],
            vec![],
            "`min_val` 2 is greater than `max_val` -1",
        ),
        (
            "ltorch.leaky_relu",
            DType::I64,
            vec![],
            vec![],
            "leaky_relu of a i64 tensor",
        ),
        (
            "ltorch.elu",
            DType::F32,
            vec![],
            vec![("inplace".into(), Arg::Bool(true))],
            "in-place elu",
        ),
        (
            "ltorch.leaky_relu",
            DType::F32,
            vec![Arg::Str("x".into())],
            vec![],
            "`negative_slope`",
        ),
    ];
    for (op, dtype, extra, kw, msg) in cases {
        let mut b = TraceBuilder::new("f", TraceKind::Forward);
        let x = b.arg("x", ty(&[3], dtype));
        let mut args = vec![x.into()];
        args.extend(extra);
        let y = b
            .op_kw(op, args, kw)
            .unwrap_or_else(|e| panic!("{op} types: {e}"));
        b.ret(Arg::Value(y));
        let e = Plan::compile(&b.finish(), &[Some(y)])
            .expect_err(op)
            .to_string();
        assert!(e.contains(op) && e.contains(msg), "{op}: {e}");
    }
}

/// `amin` and `prod` through their decoders: negative dims, keepdim, no dim, `dtype=`,
/// integer and bool inputs (which multiply into i64, as in PyTorch).
#[test]
fn amin_and_prod_reduce_over_their_dims() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 3], DType::F32));
    let i = b.arg("i", ty(&[2, 3], DType::I64));
    let m = b.arg("m", ty(&[2, 3], DType::Bool));
    let dims = |d: &[i64]| Arg::Tuple(d.iter().map(|&v| Arg::Int(v)).collect());
    let amin_last = b
        .op("ltorch.amin", vec![x.into(), dims(&[-1]), Arg::Bool(true)])
        .unwrap();
    let amin_all = b.op("ltorch.amin", vec![x.into()]).unwrap();
    let prod_rows = b.op("ltorch.prod", vec![x.into(), Arg::Int(0)]).unwrap();
    let prod_ints = b.op("ltorch.prod", vec![i.into(), Arg::Int(1)]).unwrap();
    let prod_f64 = b
        .op_kw(
            "ltorch.prod",
            vec![i.into()],
            vec![(
                "dtype".into(),
                Arg::DType(DType::F64, tracepass_ir::DTypeSpelling::Torch),
            )],
        )
        .unwrap();
    let prod_mask = b.op("ltorch.prod", vec![m.into(), Arg::Int(-1)]).unwrap();
    let imin = b.op("ltorch.amin", vec![i.into(), Arg::Int(0)]).unwrap();
    let outs = [
        amin_last, amin_all, prod_rows, prod_ints, prod_f64, prod_mask, imin,
    ];
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let xs = vec![1.5f32, -2.0, 3.0, 0.5, 5.0, -6.0];
    let got = run(
        &b.finish(),
        &outs,
        vec![
            Tensor::from_f32(vec![2, 3], xs),
            Tensor::from_i64(vec![2, 3], vec![2, -3, 4, 5, 6, -1]),
            Tensor::from_bool(vec![2, 3], vec![true, true, true, true, false, true]),
        ],
    );
    assert_eq!(got[0].shape(), &[2, 1]);
    assert_eq!(got[0].to_f32_vec(), vec![-2.0, -6.0]);
    assert_eq!(got[1].shape(), &[] as &[usize]);
    assert_eq!(got[1].to_f32_vec(), vec![-6.0]);
    assert_eq!(got[2].to_f32_vec(), vec![0.75, -10.0, -18.0]);
    assert_eq!(
        (got[3].dtype(), got[3].to_i64_vec()),
        (DType::I64, vec![-24, -30])
    );
    assert_eq!(
        (got[4].dtype(), got[4].to_f64_vec()),
        (DType::F64, vec![720.0])
    );
    assert_eq!(
        (got[5].dtype(), got[5].to_i64_vec()),
        (DType::I64, vec![1, 0])
    );
    assert_eq!(got[6].to_i64_vec(), vec![2, -3, -1]);
}

/// `var` and `std` as Thunder prints them (`torch.var(a, (1,), correction=0)`,
/// `torch.std(a, (0, 2), correction=1)`), no dims, a negative dim and keepdim, against
/// two-pass f64 references.
#[test]
fn var_and_std_take_dims_and_corrections() {
    let shape = [2usize, 3, 4];
    let xs: Vec<f64> = (0..24).map(|i| ((i * 7) % 11) as f64 * 0.5 - 2.0).collect();
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&shape, DType::F32));
    let dims = |d: &[i64]| Arg::Tuple(d.iter().map(|&v| Arg::Int(v)).collect());
    let corr = |c: i64| vec![("correction".to_string(), Arg::Int(c))];
    let v1 = b
        .op_kw("ltorch.var", vec![x.into(), dims(&[1])], corr(0))
        .unwrap();
    let s02 = b
        .op_kw("ltorch.std", vec![x.into(), dims(&[0, 2])], corr(1))
        .unwrap();
    let s_all = b.op("ltorch.std", vec![x.into()]).unwrap();
    let v_keep = b
        .op_kw(
            "ltorch.var",
            vec![x.into(), Arg::Int(-1)],
            vec![
                ("keepdim".to_string(), Arg::Bool(true)),
                ("correction".to_string(), Arg::Int(0)),
            ],
        )
        .unwrap();
    let outs = [v1, s02, s_all, v_keep];
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let got = run(
        &b.finish(),
        &outs,
        vec![Tensor::from_f64(shape, xs.clone())
            .to_dtype(DType::F32)
            .unwrap()],
    );
    let at = |i: usize, j: usize, k: usize| xs[i * 12 + j * 4 + k];
    let var = |v: &[f64], c: f64| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() as f64 - c)
    };
    let mut want1 = vec![];
    for i in 0..2 {
        for k in 0..4 {
            want1.push(var(&(0..3).map(|j| at(i, j, k)).collect::<Vec<_>>(), 0.0));
        }
    }
    let want02: Vec<f64> = (0..3)
        .map(|j| {
            let v: Vec<f64> = (0..2)
                .flat_map(|i| (0..4).map(move |k| (i, k)))
                .map(|(i, k)| at(i, j, k))
                .collect();
            var(&v, 1.0).sqrt()
        })
        .collect();
    let want_all = vec![var(&xs, 1.0).sqrt()];
    let mut want_keep = vec![];
    for i in 0..2 {
        for j in 0..3 {
            want_keep.push(var(&(0..4).map(|k| at(i, j, k)).collect::<Vec<_>>(), 0.0));
        }
    }
    let cases = [
        (&got[0], vec![2, 4], want1),
        (&got[1], vec![3], want02),
        (&got[2], vec![], want_all),
        (&got[3], vec![2, 3, 1], want_keep),
    ];
    for (k, (t, shape, want)) in cases.into_iter().enumerate() {
        assert_eq!(t.shape(), &shape[..], "case {k}");
        assert_eq!(t.dtype(), DType::F32);
        for (g, w) in t.to_f64_vec().iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "case {k}: {g} vs {w}"
            );
        }
    }
    // integers are refused, as PyTorch refuses them
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let i = b.arg("i", ty(&[3], DType::I64));
    let y = b.op("ltorch.std", vec![i.into()]).unwrap();
    b.ret(Arg::Value(y));
    let e = Plan::compile(&b.finish(), &[Some(y)])
        .expect_err("ints")
        .to_string();
    assert!(e.contains("std of a i64 tensor"), "{e}");
}

/// `cumsum` as Thunder prints it (`torch.cumsum(a, 1)`, `torch.cumsum(a, 1,
/// dtype=torch.float32)` of integers), negative dims and bools (which count in i64).
#[test]
fn cumsum_sums_along_a_dimension_in_the_result_dtype() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 3], DType::F32));
    let i = b.arg("i", ty(&[2, 3], DType::I64));
    let m = b.arg("m", ty(&[4], DType::Bool));
    let rows = b.op("ltorch.cumsum", vec![x.into(), Arg::Int(1)]).unwrap();
    let cols = b.op("ltorch.cumsum", vec![x.into(), Arg::Int(-2)]).unwrap();
    let ints = b
        .op_kw(
            "ltorch.cumsum",
            vec![i.into(), Arg::Int(1)],
            vec![(
                "dtype".into(),
                Arg::DType(DType::F32, tracepass_ir::DTypeSpelling::Torch),
            )],
        )
        .unwrap();
    let count = b.op("ltorch.cumsum", vec![m.into(), Arg::Int(0)]).unwrap();
    let outs = [rows, cols, ints, count];
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let got = run(
        &b.finish(),
        &outs,
        vec![
            Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.0]),
            Tensor::from_i64(vec![2, 3], vec![1, 2, 3, 4, 5, 6]),
            Tensor::from_bool(vec![4], vec![true, false, true, true]),
        ],
    );
    assert_eq!(got[0].to_f32_vec(), vec![1.0, 3.0, 6.0, 4.0, 9.0, 3.0]);
    assert_eq!(got[1].to_f32_vec(), vec![1.0, 2.0, 3.0, 5.0, 7.0, -3.0]);
    assert_eq!(got[2].dtype(), DType::F32);
    assert_eq!(got[2].to_f32_vec(), vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    assert_eq!(
        (got[3].dtype(), got[3].to_i64_vec()),
        (DType::I64, vec![1, 1, 2, 3])
    );
}

/// `argmax`/`argmin` as Thunder prints them (`torch.argmax(a, 1, False)`,
/// `torch.argmin(a, -1, True)`, `torch.argmax(a, None, False)`), against torch 2.9.0's
/// values for the same input (ties keep the first index, the first NaN wins both).
#[test]
fn argmax_and_argmin_give_first_indices() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 5], DType::F32));
    let i = b.arg("i", ty(&[4], DType::I64));
    let a1 = b
        .op(
            "ltorch.argmax",
            vec![x.into(), Arg::Int(1), Arg::Bool(false)],
        )
        .unwrap();
    let n1 = b
        .op(
            "ltorch.argmin",
            vec![x.into(), Arg::Int(-1), Arg::Bool(true)],
        )
        .unwrap();
    let all = b
        .op("ltorch.argmax", vec![x.into(), Arg::None, Arg::Bool(false)])
        .unwrap();
    let imin = b.op("ltorch.argmin", vec![i.into()]).unwrap();
    let outs = [a1, n1, all, imin];
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let got = run(
        &b.finish(),
        &outs,
        vec![
            Tensor::from_f32(
                vec![2, 5],
                vec![1., 3., 3., f32::NAN, 0., 2., -1., -1., 5., 5.],
            ),
            Tensor::from_i64(vec![4], vec![3, 1, 1, 2]),
        ],
    );
    assert_eq!(
        (got[0].dtype(), got[0].to_i64_vec()),
        (DType::I64, vec![3, 3])
    );
    assert_eq!(
        (got[1].shape(), got[1].to_i64_vec()),
        (&[2, 1][..], vec![3, 1])
    );
    assert_eq!((got[2].shape().len(), got[2].to_i64_vec()), (0, vec![3]));
    assert_eq!(got[3].to_i64_vec(), vec![1]);
}

/// The logical and bitwise ops as Thunder prints them (`torch.logical_and(a, b)`,
/// `torch.bitwise_xor(a, b)`, `torch.bitwise_not(a)` on i64 and bool tensors), numbers as
/// operands, and `isinf`/`isfinite` on floats and integers.
#[test]
fn logical_bitwise_and_float_class_ops() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let i = b.arg("i", ty(&[2, 3], DType::I64));
    let j = b.arg("j", ty(&[3], DType::I64));
    let p = b.arg("p", ty(&[3], DType::Bool));
    let x = b.arg("x", ty(&[4], DType::F32));
    let ops: Vec<(&str, Vec<Arg>)> = vec![
        ("ltorch.logical_and", vec![i.into(), j.into()]),
        ("ltorch.logical_or", vec![x.into(), Arg::Int(0)]),
        ("ltorch.logical_xor", vec![p.into(), j.into()]),
        ("ltorch.bitwise_and", vec![i.into(), j.into()]),
        ("ltorch.bitwise_or", vec![i.into(), Arg::Int(8)]),
        ("ltorch.bitwise_xor", vec![p.into(), p.into()]),
        ("ltorch.bitwise_not", vec![i.into()]),
        ("ltorch.bitwise_not", vec![p.into()]),
        ("ltorch.isinf", vec![x.into()]),
        ("ltorch.isfinite", vec![x.into()]),
        ("ltorch.isinf", vec![j.into()]),
        ("ltorch.isfinite", vec![j.into()]),
    ];
    let outs: Vec<ValueId> = ops
        .iter()
        .map(|(op, args)| {
            b.op(op, args.clone())
                .unwrap_or_else(|e| panic!("{op}: {e}"))
        })
        .collect();
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let t = b.finish();
    let got = run(
        &t,
        &outs,
        vec![
            Tensor::from_i64(vec![2, 3], vec![1, 2, 0, 4, 5, 6]),
            Tensor::from_i64(vec![3], vec![3, -1, 0]),
            Tensor::from_bool(vec![3], vec![true, false, true]),
            Tensor::from_f32(
                vec![4],
                vec![0.0, f32::INFINITY, f32::NAN, f32::NEG_INFINITY],
            ),
        ],
    );
    let dtypes: Vec<DType> = got.iter().map(|t| t.dtype()).collect();
    use DType::{Bool, I64};
    assert_eq!(
        dtypes,
        vec![Bool, Bool, Bool, I64, I64, Bool, I64, Bool, Bool, Bool, Bool, Bool]
    );
    assert_eq!(bools(&got[0]), vec![true, true, false, true, true, false]);
    assert_eq!(bools(&got[1]), vec![false, true, true, true]);
    assert_eq!(bools(&got[2]), vec![false, true, true]);
    assert_eq!(got[3].to_i64_vec(), vec![1, 2, 0, 0, 5, 0]);
    assert_eq!(got[4].to_i64_vec(), vec![9, 10, 8, 12, 13, 14]);
    assert_eq!(bools(&got[5]), vec![false, false, false]);
    assert_eq!(got[6].to_i64_vec(), vec![-2, -3, -1, -5, -6, -7]);
    assert_eq!(bools(&got[7]), vec![false, true, false]);
    assert_eq!(bools(&got[8]), vec![false, true, false, true]);
    assert_eq!(bools(&got[9]), vec![true, false, false, false]);
    assert_eq!(bools(&got[10]), vec![false; 3]);
    assert_eq!(bools(&got[11]), vec![true; 3]);
    // bitwise ops of floats are a run-time error naming the op and the dtype
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[4], DType::F32));
    let y = b
        .op("ltorch.bitwise_and", vec![x.into(), x.into()])
        .expect("the op table types it");
    b.ret(Arg::Value(y));
    let t = b.finish();
    let plan = Plan::compile(&t, &[Some(y)]).unwrap_or_else(|e| panic!("{e}"));
    let g = ThreadGroup::new(1, CommOptions::default());
    let mut comm = g.comm(0);
    let mut e: Executor<CpuBackend, ThreadComm> = Executor::new();
    let err = e
        .run(
            &plan,
            &CpuBackend,
            &mut comm,
            vec![RValue::Tensor(Tensor::from_f32(vec![4], vec![1.0; 4]))],
            &Clock::new(false),
            &mut Recording::default(),
        )
        .expect_err("floats have no bits to and")
        .to_string();
    assert!(err.contains("bitwise_and") && err.contains("f32"), "{err}");
}

/// Adaptive average pooling to an output size that does not divide the input (5x7 to 3x4,
/// PyTorch's overlapping windows) and its backward, as Thunder prints them
/// (`torch.nn.functional.adaptive_avg_pool2d(a, (3, 4))`,
/// `torch.torch.ops.aten._adaptive_avg_pool2d_backward(grad, a)`), against torch 2.9.0's
/// values in f64 for `x = sin(0.3 i - 4)` and `grad = cos(0.7 i)`.
#[test]
fn adaptive_avg_pooling_to_any_output_size_and_back() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[1, 2, 5, 7], DType::F64));
    let g = b.arg("g", ty(&[1, 2, 3, 4], DType::F64));
    let y = b
        .op(
            "ltorch.adaptive_avg_pool2d",
            vec![x.into(), Arg::Tuple(vec![Arg::Int(3), Arg::Int(4)])],
        )
        .unwrap();
    let dx = b
        .op(
            "ltorch.adaptive_avg_pool2d_backward",
            vec![g.into(), x.into()],
        )
        .unwrap();
    b.ret(Arg::Tuple(vec![Arg::Value(y), Arg::Value(dx)]));
    let t = b.finish();
    let plan = Plan::compile(&t, &[Some(y), Some(dx)]).unwrap_or_else(|e| panic!("{e}"));
    let kernels: Vec<&Kernel> = plan
        .instrs
        .iter()
        .filter_map(|i| match &i.kind {
            InstrKind::Compute(k) => Some(k),
            _ => None,
        })
        .collect();
    assert_eq!(
        kernels,
        vec![
            &Kernel::AdaptiveAvgPool2d { oh: 3, ow: 4 },
            &Kernel::AdaptiveAvgPool2dBackward
        ]
    );
    let xs: Vec<f64> = (0..70).map(|i| (i as f64 * 0.3 - 4.0).sin()).collect();
    let gs: Vec<f64> = (0..24).map(|i| (i as f64 * 0.7).cos()).collect();
    let got = run(
        &t,
        &[y, dx],
        vec![
            Tensor::from_f64(vec![1, 2, 5, 7], xs),
            Tensor::from_f64(vec![1, 2, 3, 4], gs),
        ],
    );
    let want_y = [
        -0.16480876362812447,
        -0.3434676987940934,
        -0.47502466184123177,
        -0.4740550767197564,
        -0.0010953728885784164,
        -0.002248580677062864,
        -0.0030889306568658357,
        -0.003070753947409651,
        -0.17257968686385802,
        -0.3491230694738789,
        -0.47640433449772956,
        -0.4717752674137156,
        0.48616282338960526,
        0.4617583561954055,
        0.3015889462842318,
        0.10965824060028523,
        0.003160670164169599,
        0.0029904105897891795,
        0.0019375749143061283,
        0.0006858064747590024,
        0.487362831959922,
        0.45932523619953275,
        0.29520818541971844,
        0.10157866901185597,
    ];
    // the first plane's gradient (5x7) and the second's first row
    let want_dx = [
        0.25,
        0.3774736978807481,
        0.12747369788074808,
        0.15580155503078824,
        0.028327857150040173,
        -0.09788366899992411,
        -0.12621152614996428,
        0.09296294322189033,
        0.1163858980703277,
        0.023422954848437372,
        -0.0027226125949336086,
        -0.026145567443370966,
        -0.12127169868957276,
        -0.0951261312462018,
        -0.15703705677810967,
        -0.2610877998104204,
        -0.10405074303231071,
        -0.15852416762572186,
        -0.05447342459341114,
        -0.02338802968964866,
        0.03108539490376248,
        0.03685441284945273,
        0.0994467758810445,
        0.0625923630315918,
        0.13376931416206475,
        0.07117695113047295,
        0.14060581154370175,
        0.0694288604132288,
        0.1938914696275624,
        0.3605345756914649,
        0.1666431060639025,
        0.2922934817877866,
        0.1256503757238841,
        0.16399384123335042,
        0.03834346550946631,
        -0.12982216352917103,
        -0.28777576388435633,
        -0.15795360035518533,
        -0.31302464570597766,
        -0.15507104535079233,
        -0.27395527734979047,
        -0.11888423199899813,
    ];
    assert_eq!(got[0].shape(), &[1, 2, 3, 4]);
    assert_eq!(got[1].shape(), &[1, 2, 5, 7]);
    for (g, w) in got[0].to_f64_vec().iter().zip(want_y) {
        assert!((g - w).abs() < 1e-12, "{g} vs {w}");
    }
    let dxv = got[1].to_f64_vec();
    for (g, w) in dxv.iter().zip(want_dx) {
        assert!((g - w).abs() < 1e-12, "{g} vs {w}");
    }
    // the gradient of a mean keeps its total: sum(dx) == sum(grad) per plane
    let total: f64 = (0..24).map(|i| (i as f64 * 0.7).cos()).sum();
    assert!((dxv.iter().sum::<f64>() - total).abs() < 1e-12);
}

/// `randn` as Thunder prints it (`torch.randn((2, 3, 4), device=..., dtype=torch.float32)`):
/// the declared shape and dtype, the executor's keyed stream (the same per (seed, rank, step,
/// node), another for another step), and a typed error without a stream.
#[test]
fn randn_draws_from_the_keyed_stream() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let r = b
        .op_kw(
            "ltorch.randn",
            vec![Arg::Tuple(vec![Arg::Int(2), Arg::Int(3), Arg::Int(4)])],
            vec![(
                "dtype".into(),
                Arg::DType(DType::F32, tracepass_ir::DTypeSpelling::Torch),
            )],
        )
        .unwrap();
    b.ret(Arg::Value(r));
    let t = b.finish();
    assert_eq!(
        last_kernel(&t, r),
        Kernel::Normal {
            shape: vec![2, 3, 4],
            dtype: DType::F32
        }
    );
    let plan = Plan::compile(&t, &[Some(r)]).unwrap_or_else(|e| panic!("{e}"));
    let draw = |step: Option<usize>| {
        let g = ThreadGroup::new(1, CommOptions::default());
        let mut comm = g.comm(0);
        let mut e: Executor<CpuBackend, ThreadComm> = Executor::new();
        if let Some(s) = step {
            e.set_rng(5, 0, s);
        }
        e.run(
            &plan,
            &CpuBackend,
            &mut comm,
            vec![],
            &Clock::new(false),
            &mut Recording::default(),
        )
        .map(|mut v| match v.remove(0) {
            RValue::Tensor(t) => t,
            other => panic!("expected a tensor, got {other:?}"),
        })
        .map_err(|e| e.to_string())
    };
    let a = draw(Some(1)).unwrap();
    assert_eq!((a.shape(), a.dtype()), (&[2, 3, 4][..], DType::F32));
    assert!(a.bitwise_eq(&draw(Some(1)).unwrap()));
    assert!(!a.bitwise_eq(&draw(Some(2)).unwrap()));
    assert!(a.to_f64_vec().iter().any(|v| *v < 0.0) && a.to_f64_vec().iter().any(|v| *v > 0.0));
    let e = draw(None).expect_err("no stream");
    assert!(e.contains("random"), "{e}");
}

/// `floor_divide`, `remainder` and `fmod` as Thunder prints them (`torch.floor_divide(a, 2)`,
/// `torch.remainder(a, -3)`, `torch.fmod(x, 0.7)`), on i64 and f32 tensors, against torch
/// 2.9.0's values; an integer division by zero is an error, as PyTorch raises.
#[test]
fn floor_divide_remainder_and_fmod_follow_pytorch() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let a = b.arg("a", ty(&[2, 3], DType::I64));
    let d = b.arg("d", ty(&[3], DType::I64));
    let x = b.arg("x", ty(&[7], DType::F32));
    let calls: Vec<(&str, Vec<Arg>)> = vec![
        ("ltorch.floor_divide", vec![a.into(), Arg::Int(2)]),
        ("ltorch.remainder", vec![a.into(), Arg::Int(-3)]),
        ("ltorch.fmod", vec![a.into(), Arg::Int(3)]),
        ("ltorch.floor_divide", vec![a.into(), d.into()]),
        ("ltorch.floor_divide", vec![x.into(), Arg::Float(0.7)]),
        ("ltorch.remainder", vec![x.into(), Arg::Float(0.7)]),
        ("ltorch.fmod", vec![x.into(), Arg::Float(0.7)]),
        ("ltorch.floor_divide", vec![x.into(), Arg::Float(-0.7)]),
        ("ltorch.remainder", vec![x.into(), Arg::Float(-0.7)]),
    ];
    let outs: Vec<ValueId> = calls
        .iter()
        .map(|(op, args)| {
            b.op(op, args.clone())
                .unwrap_or_else(|e| panic!("{op}: {e}"))
        })
        .collect();
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let t = b.finish();
    let inputs = |divisor: Vec<i64>| {
        vec![
            Tensor::from_i64(vec![2, 3], vec![7, -7, 5, 4, -5, 6]),
            Tensor::from_i64(vec![3], divisor),
            Tensor::from_f32(vec![7], vec![5.5, -5.5, 0.3, -0.3, 7.0, -7.0, 1e-30]),
        ]
    };
    let got = run(&t, &outs, inputs(vec![2, -3, 4]));
    assert_eq!(got[0].to_i64_vec(), vec![3, -4, 2, 2, -3, 3]);
    assert_eq!(got[1].to_i64_vec(), vec![-2, -1, -1, -2, -2, 0]);
    assert_eq!(got[2].to_i64_vec(), vec![1, -1, 2, 1, -2, 0]);
    assert_eq!(got[3].to_i64_vec(), vec![3, 2, 1, 2, 1, 1]);
    let want: [[f64; 7]; 5] = [
        [7., -8., 0., -1., 10., -11., 0.],
        [
            6.0000008345e-01,
            9.9999904633e-02,
            3.0000001192e-01,
            3.9999997616e-01,
            1.1920928955e-07,
            6.9999986887e-01,
            1.0000000032e-30,
        ],
        [
            6.0000008345e-01,
            -6.0000008345e-01,
            3.0000001192e-01,
            -3.0000001192e-01,
            1.1920928955e-07,
            -1.1920928955e-07,
            1.0000000032e-30,
        ],
        [-8., 7., -1., 0., -11., 10., -1.],
        [
            -9.9999904633e-02,
            -6.0000008345e-01,
            -3.9999997616e-01,
            -3.0000001192e-01,
            -6.9999986887e-01,
            -1.1920928955e-07,
            -6.9999998808e-01,
        ],
    ];
    for (k, w) in want.iter().enumerate() {
        let g = got[4 + k].to_f64_vec();
        assert_eq!(got[4 + k].dtype(), DType::F32);
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() <= 1e-9 * b.abs().max(1e-30),
                "{}: {g:?}",
                calls[4 + k].0
            );
        }
    }
    // a zero divisor among the integers
    let plan = Plan::compile(&t, &outs.iter().map(|v| Some(*v)).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("{e}"));
    let g = ThreadGroup::new(1, CommOptions::default());
    let mut comm = g.comm(0);
    let mut e: Executor<CpuBackend, ThreadComm> = Executor::new();
    let err = e
        .run(
            &plan,
            &CpuBackend,
            &mut comm,
            inputs(vec![2, 0, 4])
                .into_iter()
                .map(RValue::Tensor)
                .collect(),
            &Clock::new(false),
            &mut Recording::default(),
        )
        .expect_err("integer division by zero")
        .to_string();
    assert!(err.contains("ZeroDivisionError"), "{err}");
}

/// `stack(tensors, dim)` at the front, in the middle and at the end (negative), and of
/// zero-dimensional tensors.
#[test]
fn stack_adds_a_dimension() {
    let mut b = TraceBuilder::new("f", TraceKind::Forward);
    let x = b.arg("x", ty(&[2, 3], DType::F32));
    let y = b.arg("y", ty(&[2, 3], DType::F32));
    let s = b.arg("s", ty(&[], DType::F32));
    let pair = || Arg::List(vec![x.into(), y.into()]);
    let s0 = b.op("ltorch.stack", vec![pair()]).unwrap();
    let s1 = b.op("ltorch.stack", vec![pair(), Arg::Int(1)]).unwrap();
    let s_last = b.op("ltorch.stack", vec![pair(), Arg::Int(-1)]).unwrap();
    let scalars = b
        .op(
            "ltorch.stack",
            vec![Arg::Tuple(vec![s.into(), s.into(), s.into()])],
        )
        .unwrap();
    let outs = [s0, s1, s_last, scalars];
    b.ret(Arg::Tuple(outs.iter().map(|v| Arg::Value(*v)).collect()));
    let got = run(
        &b.finish(),
        &outs,
        vec![
            iota(&[2, 3]),
            Tensor::from_f32(vec![2, 3], (10..16).map(|v| v as f32).collect()),
            Tensor::from_f32(vec![], vec![7.0]),
        ],
    );
    assert_eq!(got[0].shape(), &[2, 2, 3]);
    assert_eq!(
        got[0].to_f32_vec(),
        vec![0., 1., 2., 3., 4., 5., 10., 11., 12., 13., 14., 15.]
    );
    assert_eq!(got[1].shape(), &[2, 2, 3]);
    assert_eq!(
        got[1].to_f32_vec(),
        vec![0., 1., 2., 10., 11., 12., 3., 4., 5., 13., 14., 15.]
    );
    assert_eq!(got[2].shape(), &[2, 3, 2]);
    assert_eq!(
        got[2].to_f32_vec(),
        vec![0., 10., 1., 11., 2., 12., 3., 13., 4., 14., 5., 15.]
    );
    assert_eq!(
        (got[3].shape(), got[3].to_f32_vec()),
        (&[3][..], vec![7.0; 3])
    );
}
