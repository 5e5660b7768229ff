//! The DDP pass family on hand-made traces and on every Thunder backward in testdata: snapshots
//! of canonical printed traces plus structural assertions.

use std::collections::HashMap;
use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::*;

fn load(rel: &str) -> Trace {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/thunder")
        .join(rel);
    parse_trace(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// (name, program, pipeline prefix) for every backward in testdata.
fn thunder_programs() -> Vec<(&'static str, Program, &'static str)> {
    vec![
        (
            "mlp",
            Program::from_thunder(load("mlp/forward.trace"), load("mlp/backward.trace")).unwrap(),
            "",
        ),
        (
            "mlp_ddp",
            Program::from_thunder(
                load("mlp-ddp/forward.trace"),
                load("mlp-ddp/backward.trace"),
            )
            .unwrap(),
            "no-sync,",
        ),
        (
            "mlp_ddp_bucketed",
            Program::from_thunder(
                load("mlp-ddp-bucketed/forward.trace"),
                load("mlp-ddp-bucketed/backward.trace"),
            )
            .unwrap(),
            "no-sync,",
        ),
    ]
}

/// A hand-made program: f32 and bf16 gradients, a frozen parameter, a tied one, an input gradient.
fn hand_made() -> Program {
    let f32t = |s: &[usize]| Type::tensor(s, DType::F32, Device::CPU);
    let mut fb = TraceBuilder::new("computation", TraceKind::Forward);
    let x = fb.arg("x", f32t(&[8]));
    let _a = fb.arg("t_a", f32t(&[256, 256]));
    let _b = fb.arg("t_b", Type::tensor(vec![1024], DType::BF16, Device::CPU));
    let _c = fb.arg("t_c", f32t(&[64]));
    let _e = fb.arg("t_e", f32t(&[4]));
    fb.ret(Arg::Tuple(vec![
        Arg::Dict(vec![]),
        Arg::Tuple(vec![Arg::Tuple(vec![x.into()]), Arg::Tuple(vec![])]),
    ]));
    let forward = fb.finish();
    let mut bb = TraceBuilder::new("backward_fn", TraceKind::Backward);
    let saved = bb.arg("saved_for_backward", Type::Collection);
    let _cot = bb.arg("cotangents", Type::Collection);
    let cs = bb.unpack_sequence(
        saved,
        vec![
            ("C0".into(), Type::Collection),
            ("C1".into(), Type::Collection),
        ],
    );
    let xs = bb.unpack_sequence(cs[0], vec![("x".into(), f32t(&[8]))]);
    let seed_a = bb.arg("ga_in", f32t(&[256, 256]));
    let seed_b = bb.arg("gb_in", Type::tensor(vec![1024], DType::BF16, Device::CPU));
    let gx = bb.op("ltorch.mul", vec![xs[0].into(), 2.0.into()]).unwrap();
    let ga = bb.op("ltorch.tanh", vec![seed_a.into()]).unwrap();
    let gb = bb
        .op("ltorch.mul", vec![seed_b.into(), 0.5.into()])
        .unwrap();
    // t_c's gradient ([64]) is produced last
    let gcc = bb
        .op("ltorch.sum", vec![ga.into(), Arg::int_tuple([0])])
        .unwrap();
    let gcc = bb
        .op("ltorch.reshape", vec![gcc.into(), Arg::int_tuple([4, 64])])
        .unwrap();
    let gcc = bb
        .op("ltorch.sum", vec![gcc.into(), Arg::int_tuple([0])])
        .unwrap();
    bb.ret(Arg::Tuple(vec![
        gx.into(),
        ga.into(),
        gb.into(),
        gcc.into(),
        Arg::None,
    ]));
    // the trace's extra arguments stand for incoming gradients
    let backward = bb.finish();
    let mut p = Program::from_thunder(forward, backward).unwrap();
    assert_eq!(p.params.len(), 4);
    assert!(!p.params[3].requires_grad, "t_e is frozen");
    // a tied parameter: same gradient output as t_a
    let mut tied = p.params[0].clone();
    tied.fqn = "a_alias".into();
    tied.tied_to = Some("a".into());
    p.params.push(tied);
    p
}

fn count(t: &Trace, op: &str) -> usize {
    t.nodes().filter(|(_, n)| n.op == op).count()
}

/// Checks the invariants of a ddp + sort-waits rewrite.
fn check_ddp(before: &Program, after: &Program, bucket_mb: f64) {
    let t = &after.backward;
    verify(t).unwrap();
    let reduced: Vec<ValueId> = {
        let outs = before.gradient_values();
        let mut v: Vec<ValueId> = before
            .params
            .iter()
            .filter(|p| p.requires_grad && p.tied_to.is_none())
            .filter_map(|p| p.grad_output.and_then(|i| outs[i]))
            .collect();
        v.dedup();
        v
    };
    let plan = tracepass_passes::ddp::recorded_plan(t);
    let n_b = plan.len();
    let new_divs = count(t, ops::DIV) - count(&before.backward, ops::DIV);
    assert_eq!(new_divs, reduced.len(), "one div per reduced gradient");
    for op in [ops::BUCKET_PACK, ops::ALL_REDUCE, ops::WAIT, ops::UNPACK] {
        assert_eq!(count(t, op), n_b, "{op} count");
    }
    let members: usize = plan.iter().map(|b| b.1.len()).sum();
    assert_eq!(members, reduced.len());
    let pos: HashMap<NodeIndex, usize> = t
        .schedule()
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, i))
        .collect();
    let sched: Vec<&Node> = t.nodes().map(|(_, n)| n).collect();
    // each all-reduce right after the node that made its bucket's last gradient ready
    for (i, n) in sched.iter().enumerate() {
        if n.op != ops::ALL_REDUCE {
            continue;
        }
        let mut j = i;
        while j > 0
            && (sched[j - 1].op == ops::DIV
                || sched[j - 1].op == ops::BUCKET_PACK
                || sched[j - 1].op == ops::ALL_REDUCE)
        {
            j -= 1;
        }
        let buf = n.args()[0].as_value().unwrap();
        let pack = t.node(t.producer(buf).unwrap()).unwrap();
        let last_div = pack.args()[0]
            .as_seq()
            .unwrap()
            .last()
            .unwrap()
            .as_value()
            .unwrap();
        let local = t.node(t.producer(last_div).unwrap()).unwrap().args()[0]
            .as_value()
            .unwrap();
        match t.producer(local) {
            Some(p) => assert_eq!(
                pos[&p] + 1,
                j,
                "all-reduce of {} is not right after its producer",
                t.name(local)
            ),
            None => assert_eq!(j, 0),
        }
    }
    // each wait right before its first consumer
    for (idx, n) in t.nodes() {
        if n.op == ops::WAIT {
            let first = t
                .users(n.outputs()[0])
                .iter()
                .map(|u| pos[u])
                .min()
                .unwrap();
            assert_eq!(
                first,
                pos[&idx] + 1,
                "wait is not right before its first consumer"
            );
        }
    }
    // bucket bytes: a bucket closes once it reaches the cap; no bucket mixes dtypes
    let cap = bucket_mb * (1u64 << 20) as f64;
    let mut by_kind: HashMap<(DType, Device), Vec<(usize, usize)>> = HashMap::new();
    for (_, ms, nbytes) in &plan {
        let tys: Vec<TensorType> = ms
            .iter()
            .map(|m| t.ty(*m).unwrap().as_tensor().unwrap().clone())
            .collect();
        assert!(
            tys.iter()
                .all(|x| x.dtype == tys[0].dtype && x.device == tys[0].device),
            "bucket mixes kinds"
        );
        assert_eq!(*nbytes, tys.iter().map(TensorType::nbytes).sum::<usize>());
        by_kind
            .entry((tys[0].dtype, tys[0].device))
            .or_default()
            .push((*nbytes, tys.last().unwrap().nbytes()));
    }
    for buckets in by_kind.values() {
        for (k, (nbytes, last)) in buckets.iter().enumerate() {
            if bucket_mb <= 0.0 {
                assert_eq!(nbytes, last, "one gradient per bucket");
            } else if k + 1 < buckets.len() {
                assert!(
                    *nbytes as f64 >= cap && ((nbytes - last) as f64) < cap,
                    "bucket {k}: {nbytes} bytes vs cap {cap}"
                );
            } else {
                assert!(((nbytes - last) as f64) < cap);
            }
        }
    }
    // input gradients untouched, parameter gradients synchronized
    let (b_out, a_out) = (before.gradient_values(), after.gradient_values());
    for (i, (b, a)) in b_out.iter().zip(&a_out).enumerate() {
        let is_param = before
            .params
            .iter()
            .any(|p| p.grad_output == Some(i) && p.requires_grad);
        match (b, a) {
            (Some(b), Some(a)) if !is_param => assert_eq!(
                before.backward.name(*b),
                t.name(*a),
                "input gradient changed"
            ),
            (Some(_), Some(a)) => {
                assert_eq!(t.node(t.producer(*a).unwrap()).unwrap().op, ops::UNPACK)
            }
            (None, None) => {}
            other => panic!("gradient {i} changed shape: {other:?}"),
        }
    }
}

/// The error `pipeline` ends with on a copy of `p`.
fn run_err(p: &Program, pipeline: &str) -> String {
    PassManager::parse(pipeline)
        .unwrap()
        .run(&mut p.clone(), OpRegistry::builtin())
        .unwrap_err()
        .to_string()
}

fn run(p: &Program, pipeline: &str) -> Program {
    let mut q = p.clone();
    PassManager::parse(pipeline)
        .unwrap()
        .run(&mut q, OpRegistry::builtin())
        .unwrap();
    q
}

#[test]
fn ddp_on_every_thunder_backward() {
    for (name, prog, prefix) in thunder_programs() {
        for mb in [0.0, 0.001, 1.0, 25.0] {
            let pipeline = format!("{prefix}ddp(world_size=2,bucket_mb={mb}),sort-waits,dce");
            let out = run(&prog, &pipeline);
            let local = if prefix.is_empty() {
                prog.clone()
            } else {
                run(&prog, "no-sync,dce")
            };
            check_ddp(&local, &out, mb);
            let again = run(&prog, &pipeline);
            assert_eq!(
                print_trace(&out.backward),
                print_trace(&again.backward),
                "not deterministic"
            );
            insta::assert_snapshot!(format!("{name}_bucket_{mb}"), canonical_text(&out.backward));
        }
    }
}

#[test]
fn ddp_on_hand_made_trace() {
    let p = hand_made();
    for mb in [0.0, 0.001, 1.0, 25.0] {
        let out = run(&p, &format!("ddp(world_size=4,bucket_mb={mb}),sort-waits"));
        check_ddp(&p, &out, mb);
        insta::assert_snapshot!(
            format!("hand_made_bucket_{mb}"),
            canonical_text(&out.backward)
        );
    }
    // 25 MiB: the f32 gradients share a bucket, the bf16 one has its own
    let out = run(&p, "ddp(world_size=4,bucket_mb=25)");
    let plan = tracepass_passes::ddp::recorded_plan(&out.backward);
    assert_eq!(plan.len(), 2);
    // bf16's bucket closes first: its last gradient is produced before the last f32 one
    assert_eq!(plan.iter().map(|b| b.1.len()).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn first_bucket_and_post_average() {
    let p = hand_made();
    let out = run(&p, "ddp(world_size=4,bucket_mb=25,first_bucket_mb=0.0001)");
    let plan = tracepass_passes::ddp::recorded_plan(&out.backward);
    assert_eq!(
        plan.iter().map(|b| b.1.len()).collect::<Vec<_>>(),
        [1, 1, 1],
        "{plan:?}"
    );
    let out = run(&p, "ddp(world_size=4,average=post)");
    let t = &out.backward;
    // the divisions come after the unpacks
    let pos: Vec<&str> = t.nodes().map(|(_, n)| n.op.as_str()).collect();
    let first_div = pos.iter().position(|o| *o == ops::DIV).unwrap();
    let first_unpack = pos.iter().position(|o| *o == ops::UNPACK).unwrap();
    assert!(first_div > first_unpack);
}

#[test]
fn no_sync_restores_local_gradients() {
    // Thunder's DDP backward minus synchronization equals the plain backward, up to numbering
    let (_, synced, _) = thunder_programs().into_iter().nth(1).unwrap();
    let local = run(&synced, "no-sync,dce");
    assert_eq!(count(&local.backward, ops::ALL_REDUCE), 0);
    assert_eq!(count(&local.backward, ops::TRUE_DIVIDE), 0);
    let plain =
        Program::from_thunder(load("mlp/forward.trace"), load("mlp/backward.trace")).unwrap();
    let ops_of = |t: &Trace| t.nodes().map(|(_, n)| n.op.clone()).collect::<Vec<_>>();
    assert_eq!(ops_of(&local.backward), ops_of(&plain.backward));
    // and ours round-trips: ddp then no-sync gives back the input
    let ours = run(&plain, "ddp(world_size=2,bucket_mb=1),no-sync,dce");
    let body = |t: &Trace| {
        canonical_text(t)
            .lines()
            .filter(|l| !l.starts_with("# Constructed"))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(body(&ours.backward), body(&plain.backward));
}

#[test]
fn thunder_schedule_has_no_overlap_ours_does() {
    // in Thunder's export every all-reduce comes after the last gradient; ours start earlier
    let (_, synced, _) = thunder_programs().into_iter().nth(1).unwrap();
    let first_ar = |t: &Trace| {
        t.nodes()
            .position(|(_, n)| n.op == ops::ALL_REDUCE)
            .unwrap()
    };
    let last_matmul = |t: &Trace| {
        t.nodes()
            .enumerate()
            .filter(|(_, (_, n))| n.op == "ltorch.matmul")
            .map(|(i, _)| i)
            .max()
            .unwrap()
    };
    assert!(first_ar(&synced.backward) > last_matmul(&synced.backward));
    let ours = run(
        &synced,
        "no-sync,ddp(world_size=2,bucket_mb=0),sort-waits,dce",
    );
    assert!(first_ar(&ours.backward) < last_matmul(&ours.backward));
    // launch=end reproduces Thunder 0.2.6's schedule from a plain backward
    let (_, plain, _) = thunder_programs().into_iter().next().unwrap();
    let late = run(&plain, "ddp(world_size=2,bucket_mb=0,launch=end)");
    assert_eq!(count(&late.backward, ops::ALL_REDUCE), 4);
    assert!(first_ar(&late.backward) > last_matmul(&late.backward));
    let sched: Vec<&str> = late
        .backward
        .schedule()
        .iter()
        .map(|i| late.backward.node(*i).unwrap().op.as_str())
        .collect();
    let first_dist = sched.iter().position(|o| *o == ops::DIV).unwrap();
    assert!(sched[first_dist..]
        .iter()
        .all(|o| o.starts_with("dist.") || *o == ops::DIV));
    assert_eq!(
        PassManager::parse("ddp(world_size=2,launch=end)")
            .unwrap()
            .pipeline(),
        "ddp(world_size=2,bucket_mb=25,launch=end)"
    );
}

#[test]
fn dce_and_cse() {
    let plain =
        Program::from_thunder(load("mlp/forward.trace"), load("mlp/backward.trace")).unwrap();
    // Thunder's backward reshapes t64 twice and t152 twice: cse merges them
    let out = run(&plain, "cse,dce");
    assert_eq!(out.backward.node_count(), plain.backward.node_count() - 2);
    let mut t = plain.clone();
    let dead = t
        .backward
        .new_value("dead", Type::tensor([8, 4], DType::F32, Device::CPU));
    let cot = t.backward.find_value("t64").unwrap();
    t.backward
        .append(Node::new("ltorch.tanh", vec![cot.into()], vec![dead]));
    let out = run(&t, "dce");
    assert_eq!(out.backward.node_count(), plain.backward.node_count());
}

#[test]
fn pipeline_errors_list_what_is_valid() {
    let e = |s: &str| PassManager::parse(s).err().unwrap().to_string();
    assert_eq!(
        e("ddp(world_size=4),frob"),
        "unknown pass `frob`; valid passes: ddp, fsdp, sort-waits, no-sync, accumulate-grads, dce, cse, canonicalize, remat, fuse-elementwise, fold-conv-crop, conv-input-grad"
    );
    assert_eq!(e("ddp(world_size=4,bucket=3)"), "pass `ddp` has no option `bucket`; valid options: world_size, bucket_mb, first_bucket_mb, average, group, launch");
    assert_eq!(
        e("ddp(world_size=0)"),
        "pass `ddp`: bad value `0` for `world_size`: must be at least 1"
    );
    assert_eq!(
        e("ddp(world_size=2,bucket_mb=NaN)"),
        "pass `ddp`: bad value `NaN` for `bucket_mb`: must be a finite number"
    );
    assert_eq!(
        e("ddp(world_size=2,average=mean)"),
        "pass `ddp`: bad value `mean` for `average`: expected one of pre, post"
    );
    assert_eq!(e("ddp"), "pass `ddp`: missing required option `world_size`");
    assert_eq!(
        e("dce(x=1)"),
        "pass `dce` has no option `x`; valid options: (none)"
    );
    let pm = PassManager::parse("ddp(world_size=4,bucket_mb=25),sort-waits,dce").unwrap();
    assert_eq!(
        pm.pipeline(),
        "ddp(world_size=4,bucket_mb=25),sort-waits,dce"
    );
}

#[test]
fn ddp_needs_parameters_and_replaces_thunders_ddp() {
    let lone = Program::lone(load("mlp/backward.trace"));
    let err = PassManager::parse("ddp(world_size=2)")
        .unwrap()
        .run(&mut lone.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(err.to_string().contains("no parameter metadata"), "{err}");
    // Thunder's own DDP backward: `ddp` replaces its collectives, as `no-sync,ddp` does
    let (_, synced, _) = thunder_programs().into_iter().nth(1).unwrap();
    let direct = run(&synced, "ddp(world_size=2)");
    let rebucketed = run(&synced, "no-sync,ddp(world_size=2)");
    assert_eq!(
        count(&direct.backward, ops::ALL_REDUCE),
        count(&rebucketed.backward, ops::ALL_REDUCE)
    );
    assert_eq!(
        count(&direct.backward, ops::DIV),
        count(&rebucketed.backward, ops::DIV)
    );
}

#[test]
fn ddp_refuses_its_own_output() {
    let p = hand_made();
    // gradients made by `unpack` (average=pre) or by divisions of its outputs (average=post)
    for average in ["pre", "post"] {
        let once = run(
            &p,
            &format!("ddp(world_size=2,bucket_mb=1,average={average})"),
        );
        assert!(synchronizes(&once.backward));
        let err = run_err(&once, "ddp(world_size=2)");
        assert!(err.contains("run `no-sync` first"), "{err}");
        // and no-sync makes it acceptable again
        run(&once, "no-sync,ddp(world_size=2,bucket_mb=1)");
    }
}

/// Sizes near the 2^63-byte limit: each gradient is a possible tensor, their bucket is not.
#[test]
fn a_bucket_too_large_to_exist_is_an_error() {
    let huge = || Type::tensor(vec![1usize << 60], DType::F32, Device::CPU); // 2^62 bytes
    let mut fb = TraceBuilder::new("computation", TraceKind::Forward);
    let _a = fb.arg("t_a", huge());
    let _b = fb.arg("t_b", huge());
    fb.ret(Arg::Tuple(vec![Arg::Dict(vec![]), Arg::Tuple(vec![])]));
    let mut bb = TraceBuilder::new("backward_fn", TraceKind::Backward);
    let _saved = bb.arg("saved_for_backward", Type::Collection);
    let _cot = bb.arg("cotangents", Type::Collection);
    let seed_a = bb.arg("ga_in", huge());
    let seed_b = bb.arg("gb_in", huge());
    let ga = bb
        .op("ltorch.mul", vec![seed_a.into(), 2.0.into()])
        .unwrap();
    let gb = bb
        .op("ltorch.mul", vec![seed_b.into(), 2.0.into()])
        .unwrap();
    bb.ret(Arg::Tuple(vec![ga.into(), gb.into()]));
    let p = Program::from_thunder(fb.finish(), bb.finish()).unwrap();
    verify(&p.backward).unwrap();
    // one gradient a bucket: fine
    run(&p, "ddp(world_size=2,bucket_mb=0)");
    // both in one bucket: 2^63 bytes
    let err = run_err(&p, "ddp(world_size=2,bucket_mb=1e15)");
    assert!(err.contains("bucket b0 would hold over"), "{err}");
}

#[test]
fn manager_prints_ir_times_and_writes_reproducers() {
    let plain =
        Program::from_thunder(load("mlp/forward.trace"), load("mlp/backward.trace")).unwrap();
    let mut pm = PassManager::parse("ddp(world_size=2),sort-waits,dce").unwrap();
    pm.print_ir.after_change = true;
    pm.print_ir.before = vec!["ddp".into()];
    let mut p = plain.clone();
    let report = pm.run(&mut p, OpRegistry::builtin()).unwrap();
    // sort-waits finds nothing to move after ddp: no dump after it
    assert_eq!(report.dumps.len(), 2, "before ddp, after ddp");
    assert!(report.dumps[0].starts_with("// ----- IR before ddp -----"));
    assert_eq!(report.timings.len(), 3);
    assert!(timing_table(&report).contains("sort-waits"));
    assert_eq!(
        p.backward.provenance.last().unwrap().pass,
        "ddp(world_size=2,bucket_mb=25)"
    );
    // a failing pass leaves a reproducer that replays the same failure
    let dir = tempfile::tempdir().unwrap();
    let mut pm = PassManager::parse("sort-waits,ddp(world_size=2)").unwrap();
    pm.reproducer_dir = Some(dir.path().to_path_buf());
    let err = pm
        .run(
            &mut Program::lone(load("mlp/backward.trace")),
            OpRegistry::builtin(),
        )
        .unwrap_err();
    let path = err.reproducer.clone().expect("reproducer written");
    let r = Reproducer::load(&path).unwrap();
    assert_eq!(r.pipeline, "sort-waits,ddp(world_size=2,bucket_mb=25)");
    assert_eq!(r.failed_pass, "ddp");
    assert!(matches!(r.input, Module::Trace(_)));
}

#[test]
fn verify_after_each_pass_names_the_pass() {
    struct Breaker;
    impl Pass for Breaker {
        fn name(&self) -> &str {
            "breaker"
        }
        fn run(&self, p: &mut Program, _: &mut PassContext) -> Result<Changed, PassError> {
            let mut s = p.backward.schedule().to_vec();
            s.reverse();
            p.backward.set_schedule(s);
            Ok(Changed::Yes)
        }
    }
    let mut pm = PassManager::new();
    pm.add(Breaker);
    let err = pm
        .run(
            &mut Program::lone(load("mlp/backward.trace")),
            OpRegistry::builtin(),
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the IR is invalid after pass `breaker`"),
        "{err}"
    );
}

#[test]
fn a_program_pass_that_names_no_trace_has_both_verified() {
    // it breaks the forward without saying which trace it changed
    struct ForwardBreaker;
    impl Pass for ForwardBreaker {
        fn name(&self) -> &str {
            "forward-breaker"
        }
        fn run(&self, p: &mut Program, _: &mut PassContext) -> Result<Changed, PassError> {
            let mut s = p.forward.schedule().to_vec();
            s.reverse();
            p.forward.set_schedule(s);
            Ok(Changed::Yes)
        }
    }
    let mut p = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let mut pm = PassManager::new();
    pm.add(ForwardBreaker);
    let err = pm.run(&mut p, OpRegistry::builtin()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the IR is invalid after pass `forward-breaker`"),
        "{err}"
    );
}

#[test]
fn seed_apis_have_thunders_defaults() {
    let mut p = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    api::ddp(&mut p, 2, api::DdpArgs::default()).unwrap();
    assert_eq!(p.broadcast_from, Some(0));
    assert_eq!(
        count(&p.backward, ops::ALL_REDUCE),
        1,
        "the seed model fits one 25 MiB bucket"
    );
    let plugin = api::DdpPlugin::default();
    assert_eq!(plugin.broadcast_from, None);
    let mut q = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    api::DdpPlugin {
        bucket_size_in_mb: 0.0,
        ..plugin
    }
    .apply(&mut q, 2)
    .unwrap();
    assert_eq!(q.broadcast_from, None);
    assert_eq!(count(&q.backward, ops::ALL_REDUCE), 4);
}

#[test]
fn accumulate_grads_adds_an_argument_per_parameter_gradient() {
    for (name, p, prefix) in thunder_programs() {
        let out = run(&p, &format!("{prefix}accumulate-grads"));
        let b = &out.backward;
        let n_params = p.params.iter().filter(|q| q.grad_output.is_some()).count();
        // one new argument and one add per parameter gradient, none for the input x
        assert_eq!(b.args().len(), 2 + n_params, "{name}");
        let adds: Vec<_> = b
            .nodes()
            .filter(|(_, n)| {
                n.op == "ltorch.add"
                    && n.args()
                        .get(1)
                        .and_then(Arg::as_value)
                        .is_some_and(|v| b.name(v).starts_with("acc_"))
            })
            .collect();
        assert_eq!(adds.len(), n_params, "{name}");
        // the returned parameter gradients are the sums; each add directly follows its gradient
        let grads = out.gradient_values();
        for q in &p.params {
            let g = grads[q.grad_output.unwrap()].unwrap();
            let prod = b.producer(g).unwrap();
            let node = b.node(prod).unwrap();
            assert_eq!(node.op, "ltorch.add", "{name}: {}", q.fqn);
            let local = node.args()[0].as_value().unwrap();
            let pos = |n| b.schedule().iter().position(|x| *x == n).unwrap();
            assert_eq!(pos(prod), pos(b.producer(local).unwrap()) + 1, "{name}");
        }
        if name == "mlp" {
            insta::assert_snapshot!("mlp_accumulate", canonical_text(b));
            // ddp after it reduces the sums
            let both = run(
                &p,
                "accumulate-grads,ddp(world_size=2,bucket_mb=25),sort-waits",
            );
            assert_eq!(count(&both.backward, ops::ALL_REDUCE), 1);
        }
    }
}

/// A tie's members return their own gradients (ddp adds them up later), so each gets its own
/// accumulator: nanoGPT's `lm_head.weight` = `transformer.wte.weight` (issue #26 item 1).
#[test]
fn accumulate_grads_gives_each_member_of_a_tie_its_accumulator() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/nanogpt");
    let p = load_export(&dir).unwrap().program;
    assert!(p.params.iter().any(|q| q.tied_to.is_some()));
    let out = run(&p, "accumulate-grads");
    let b = &out.backward;
    let grads = out.gradient_values();
    let trained: Vec<&Param> = p
        .params
        .iter()
        .filter(|q| q.requires_grad && !q.buffer)
        .collect();
    assert_eq!(b.args().len(), 2 + trained.len());
    for q in trained {
        let g = grads[q.grad_output.unwrap()].unwrap();
        let node = b.node(b.producer(g).unwrap()).unwrap();
        assert_eq!(node.op, "ltorch.add", "{}", q.fqn);
        let acc = node.args()[1].as_value().unwrap();
        assert!(
            b.name(acc).starts_with("acc_"),
            "{}: {}",
            q.fqn,
            b.name(acc)
        );
    }
}

/// Found by `cargo xtask fuzz opt`: a Thunder bucketed DDP backward whose reduced bucket buffer
/// is returned directly (not only through its unpack). no-sync removed the all-reduce but kept
/// the wait that read it, leaving an undefined future.
#[test]
fn fuzz_no_sync_keeps_what_a_kept_wait_reads() {
    let text = include_str!("fuzz_regressions/no_sync_reduced_buffer_returned.trace");
    let t = parse_trace(text).unwrap();
    assert!(verify(&t).is_ok());
    for pipeline in ["no-sync", "dce,no-sync,dce", "no-sync,sort-waits,cse"] {
        let mut p = Program::lone(t.clone());
        let r = PassManager::parse(pipeline)
            .unwrap()
            .run(&mut p, OpRegistry::builtin());
        assert!(
            r.is_ok(),
            "{pipeline}: {}",
            r.err().map(|e| e.to_string()).unwrap_or_default()
        );
        assert!(verify(&p.backward).is_ok());
    }
}

/// A trainable parameter the backward returns no gradient for (the loss never reaches it) is
/// left alone like a frozen one and named as unused; the rest is synchronized as before.
#[test]
fn a_parameter_without_a_gradient_is_left_alone_and_named() {
    let mut p = hand_made();
    // `t_e` (frozen in `hand_made`) now requires a gradient that the backward never returns
    p.params[3].requires_grad = true;
    assert_eq!(p.unused_params(), ["e"]);
    let mut q = p.clone();
    let report = PassManager::parse("ddp(world_size=4,bucket_mb=25),sort-waits")
        .unwrap()
        .run(&mut q, OpRegistry::builtin())
        .unwrap();
    let note = |k: &str| {
        report
            .notes
            .iter()
            .find(|(n, _)| n == k)
            .map(|x| x.1.clone())
    };
    assert_eq!(note("ddp.unused").as_deref(), Some("e"));
    assert!(report.stats.contains(&("ddp.unused".to_string(), 1)));
    // the same rewrite as with `e` frozen: its position still returns None
    let frozen = run(&hand_made(), "ddp(world_size=4,bucket_mb=25),sort-waits");
    assert_eq!(print_trace(&q.backward), print_trace(&frozen.backward));
    let Arg::Tuple(ret) = &q.backward.ret else {
        panic!("the backward returns a tuple")
    };
    assert!(matches!(ret[4], Arg::None));
    check_ddp(&hand_made(), &q, 25.0);
    insta::assert_snapshot!("hand_made_unused", canonical_text(&q.backward));
    // a gradient for a parameter that does not require one stays an error
    let mut bad = hand_made();
    bad.params[1].requires_grad = false;
    let e = run_err(&bad, "ddp(world_size=4)");
    assert!(e.contains("does not require a gradient"), "{e}");
}
