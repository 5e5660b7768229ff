//! Issue #27: a pass library that cannot corrupt IR silently. Each test is a regression test
//! for one of the bugs a compiler author hit writing passes of their own.

use tracepass_ir::*;
use tracepass_passes::*;

/// A trace-level pass made of a closure, for passes that misbehave on purpose.
struct FnPass<F>(&'static str, F);

impl<F: Fn(&mut Trace) -> Changed> TracePass for FnPass<F> {
    fn name(&self) -> &str {
        self.0
    }
    fn run_on_trace(&self, t: &mut Trace, _: &mut PassContext) -> Result<Changed, PassError> {
        Ok((self.1)(t))
    }
}

const INT_MUL: &str =
    "def f(x):\n  # x: \"cpu i64[4]\"\n  y = prims.mul(x, 1.0)  # y: \"cpu f32[4]\"\n  return y\n";

/// Bug 4: folding `x_i64 * 1.0` to `x` leaves a valid trace that returns the wrong type; the
/// manager checks what each trace returns against what it returned before the pass.
#[test]
fn a_pass_that_changes_a_return_type_is_caught() {
    let mut p = Program::lone(parse_trace(INT_MUL).unwrap());
    let mut pm = PassManager::new();
    pm.add_trace_pass(FnPass("bad-fold", |t: &mut Trace| {
        let (x, y) = (t.find_value("x").unwrap(), t.find_value("y").unwrap());
        let mut rw = Rewriter::new();
        rw.replace_all_uses(y, x);
        rw.erase(t.producer(y).unwrap());
        rw.apply(t).unwrap();
        Changed::Yes
    }));
    let e = pm.run(&mut p, OpRegistry::builtin()).unwrap_err();
    let PassError::Verify { pass, error } = &e.error else {
        panic!("a verification error expected: {e}");
    };
    assert_eq!(pass, "bad-fold");
    assert!(
        error.diagnostics[0].message.contains("\"cpu i64[4]\""),
        "{error}"
    );
}

/// A pass that changes a return type on purpose says where: only the places it declared are
/// let go; a change anywhere else is still caught.
#[test]
fn a_declared_return_change_lets_go_of_that_place_only() {
    const TWO: &str = "def f(x, z):\n  # x: \"cpu i64[4]\"\n  # z: \"cpu i64[4]\"\n  y = prims.mul(x, 1.0)  # y: \"cpu f32[4]\"\n  w = prims.mul(z, 1.0)  # w: \"cpu f32[4]\"\n  return (y, (w, y))\n";
    /// Returns `x` in place of `y` (a type change), declaring the places `declared`.
    struct Retype(&'static [&'static [u32]]);
    impl Pass for Retype {
        fn name(&self) -> &str {
            "retype"
        }
        fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
            for place in self.0 {
                cx.changed_return(false, place);
            }
            let t = &mut p.backward;
            let (x, y) = (t.find_value("x").unwrap(), t.find_value("y").unwrap());
            let mut rw = Rewriter::new();
            rw.replace_all_uses(y, x);
            rw.erase(t.producer(y).unwrap());
            rw.apply(t).map_err(|e| PassError::rewrite("retype", e))?;
            Ok(Changed::Yes)
        }
    }
    let run = |declared| {
        let mut p = Program::lone(parse_trace(TWO).unwrap());
        let mut pm = PassManager::new();
        pm.add(Retype(declared));
        pm.run(&mut p, OpRegistry::builtin())
    };
    // y is returned at [0] and at [1, 1]: declaring both, or the whole return, lets it pass
    assert!(run(&[&[0], &[1, 1]]).is_ok());
    assert!(run(&[&[0], &[1]]).is_ok());
    assert!(run(&[&[]]).is_ok());
    // declaring one place leaves the other checked; declaring none checks both
    for declared in [&[&[0u32] as &[u32]] as &[&[u32]], &[&[1, 0]], &[]] {
        let e = run(declared).unwrap_err();
        let PassError::Verify { error, .. } = &e.error else {
            panic!("a verification error expected: {e}");
        };
        assert!(
            error.diagnostics[0].message.contains("\"cpu i64[4]\""),
            "{error}"
        );
    }
}

/// What a new parameter layout changes (`fsdp`) is let go: the forward's `flat_args` and saved
/// parameters, the backward's gradients; the model's output is still held to its type.
#[test]
fn a_new_parameter_layout_lets_go_of_parameter_places_only() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models/mlp");
    let (program, _) = fsio::load(&dir).unwrap().into_program();
    /// Returns the last parameter where `flat_args` and the saved parameters were (and where
    /// the model's output was, when `.0`), and its gradient in every parameter's gradient
    /// place: types change at each.
    struct Relayout(bool);
    impl Pass for Relayout {
        fn name(&self) -> &str {
            "relayout"
        }
        fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
            cx.changed_parameter_returns(p);
            let params: Vec<ValueId> = p
                .params
                .iter()
                .map(|x| p.forward.args()[x.forward_arg])
                .collect();
            let last = *params.last().unwrap();
            let mut ret = p.forward.ret.clone();
            let Arg::Tuple(items) = &mut ret else {
                panic!("a forward returns a tuple")
            };
            let Some(Arg::Dict(entries)) = items.get_mut(0) else {
                panic!("the forward returns a dict first")
            };
            for (k, v) in entries.iter_mut() {
                if k.as_str() == Some("flat_args") || (self.0 && k.as_str() == Some("output")) {
                    v.map_values(&mut |_| last);
                }
            }
            if let Some(Arg::Tuple(saved)) = items.get_mut(1) {
                if let Some(first) = saved.first_mut() {
                    first.map_values(&mut |v| if params.contains(&v) { last } else { v });
                }
            }
            let mut rw = Rewriter::new();
            rw.set_return(ret);
            rw.apply(&mut p.forward)
                .map_err(|e| PassError::rewrite("relayout", e))?;
            let places: Vec<usize> = p.params.iter().filter_map(|x| x.grad_output).collect();
            let b = &mut p.backward;
            let mut ret = b.ret.clone();
            let Arg::Tuple(grads) = &mut ret else {
                panic!("a backward returns a tuple")
            };
            let last_grad = grads[*places.last().unwrap()].clone();
            for k in places {
                grads[k] = last_grad.clone();
            }
            let mut rw = Rewriter::new();
            rw.set_return(ret);
            rw.apply(b).map_err(|e| PassError::rewrite("relayout", e))?;
            Ok(Changed::Yes)
        }
    }
    let run = |output| {
        let mut p = program.clone();
        let mut pm = PassManager::new();
        pm.add(Relayout(output));
        pm.verify_each = true;
        pm.run(&mut p, OpRegistry::builtin())
    };
    run(false).unwrap_or_else(|e| panic!("{e}"));
    let e = run(true).unwrap_err();
    let PassError::Verify { error, .. } = &e.error else {
        panic!("a verification error expected: {e}");
    };
    assert_eq!(error.diagnostics.len(), 1, "{error}");
    assert!(
        error.diagnostics[0]
            .message
            .contains("returned `t_norm2_weight` is \"cpu f32[64]\"; it was `t648`"),
        "{error}"
    );
}

struct Nothing;

impl TracePass for Nothing {
    fn name(&self) -> &str {
        "nothing"
    }
    fn run_on_trace(&self, _: &mut Trace, _: &mut PassContext) -> Result<Changed, PassError> {
        Ok(Changed::No)
    }
}

impl Pass for Nothing {
    fn name(&self) -> &str {
        "nothing"
    }
    fn run(&self, _: &mut Program, _: &mut PassContext) -> Result<Changed, PassError> {
        Ok(Changed::No)
    }
}

/// Bug 7: a declaration is registered at the level it declares.
#[test]
fn a_declaration_is_registered_at_its_own_level() {
    static PROGRAM_LEVEL: PassDecl = PassDecl {
        name: "nothing",
        help: "does nothing",
        level: PassLevel::Program,
        options: &[],
    };
    static TRACE_LEVEL: PassDecl = PassDecl {
        level: PassLevel::Trace,
        ..PROGRAM_LEVEL
    };
    let mut reg = PassRegistry::new();
    let e = reg
        .register_trace_pass(&PROGRAM_LEVEL, |_| Ok(Nothing))
        .expect_err("refused");
    assert_eq!(
        e.to_string(),
        "pass `nothing` is declared program-level but registered as a trace-level pass"
    );
    assert!(matches!(
        reg.register_pass(&TRACE_LEVEL, |_| Ok(Nothing)),
        Err(PassError::WrongLevel { .. })
    ));
    assert!(reg.names().is_empty(), "nothing registered");
    reg.register_pass(&PROGRAM_LEVEL, |_| Ok(Nothing)).unwrap();
}

/// A pass with an option that does not spell itself (its `spec` is the default, the name).
struct Scale(u64);

impl TracePass for Scale {
    fn name(&self) -> &str {
        "scale-mark"
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        cx.stat("scale-mark.factor", self.0);
        // a change (a no-op reordering would not be one): rename nothing, but say so only on
        // the backward, so the provenance line appears there
        Ok((t.kind == TraceKind::Backward).into())
    }
}

static SCALE_MARK: PassDecl = PassDecl {
    name: "scale-mark",
    help: "reports its factor",
    level: PassLevel::Trace,
    options: &[OptionDecl {
        name: "factor",
        kind: OptionKind::Int { min: 1, max: 9 },
        default: OptionDefault::Value("1"),
        help: "the factor",
        show: Show::IfChanged,
    }],
};

/// Bug 5: a registered pass prints back with its options, from its declaration.
#[test]
fn a_registered_pass_prints_back_with_its_options() {
    let mut reg = PassRegistry::with_builtins();
    reg.register_trace_pass(&SCALE_MARK, |o| Ok(Scale(o.int("factor"))))
        .unwrap();
    let pm = PassManager::parse_with(&reg, "scale-mark(factor=3),backward(scale-mark)").unwrap();
    assert_eq!(pm.pipeline(), "scale-mark(factor=3),backward(scale-mark)");
    let mut p = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let r = pm.run(&mut p, OpRegistry::builtin()).unwrap();
    assert_eq!(r.timings[0].pass, "scale-mark(factor=3)");
    let prov: Vec<&str> = p
        .backward
        .provenance
        .iter()
        .map(|x| x.pass.as_str())
        .collect();
    assert!(
        prov.ends_with(&["scale-mark(factor=3)", "backward(scale-mark)"]),
        "{prov:?}"
    );
}

/// Breaks a trace the way a buggy pass would: its schedule reversed (uses before definitions).
fn corrupt(t: &mut Trace) {
    let mut order = t.schedule().to_vec();
    order.reverse();
    t.set_schedule(order);
}

/// A program-level pass that breaks the backward but says it changed the forward.
struct WrongTrace;

impl Pass for WrongTrace {
    fn name(&self) -> &str {
        "wrong-trace"
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        corrupt(&mut p.backward);
        cx.changed_trace(true);
        Ok(Changed::Yes)
    }
}

/// Bug 6: the manager verifies what a pass changed (by fingerprint), not what it says it
/// changed; and with verification after each pass off, once at the end.
#[test]
fn verification_follows_what_changed_and_runs_at_the_end() {
    let program = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    // names the wrong trace
    let mut pm = PassManager::new();
    pm.add(WrongTrace);
    let e = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(
        matches!(&e.error, PassError::Verify { pass, error } if pass == "wrong-trace" && error.trace == program.backward.name),
        "{e}"
    );
    // says it changed nothing
    let mut pm = PassManager::new();
    pm.add_trace_pass(FnPass("liar", |t: &mut Trace| {
        if t.kind == TraceKind::Backward {
            corrupt(t);
        }
        Changed::No
    }));
    let e = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(
        matches!(&e.error, PassError::Verify { pass, .. } if pass == "liar"),
        "{e}"
    );
    // verification after each pass off: caught once, at the end
    pm.verify_each = false;
    let e = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(
        matches!(&e.error, PassError::VerifyAtEnd { pipeline, .. } if pipeline == "liar"),
        "{e}"
    );
    pm.verify_at_end = false;
    pm.run(&mut program.clone(), OpRegistry::builtin()).unwrap();
    // a pass that changes nothing passes, whatever it says
    let mut pm = PassManager::new();
    pm.add_trace_pass(FnPass("idle", |_: &mut Trace| Changed::Yes));
    pm.run(&mut program.clone(), OpRegistry::builtin()).unwrap();
}

/// The fingerprint sees every edit a pass can make, and not the provenance the manager adds.
#[test]
fn the_fingerprint_changes_with_the_trace_and_not_with_its_provenance() {
    let mut t = parse_trace(INT_MUL).unwrap();
    let f = t.fingerprint();
    assert_eq!(t.clone().fingerprint(), f);
    t.provenance.push(Provenance {
        pass: "x".into(),
        millis: None,
    });
    assert_eq!(t.fingerprint(), f);
    let y = t.find_value("y").unwrap();
    let x = t.find_value("x").unwrap();
    let mut u = t.clone();
    u.set_ty(y, u.ty(x).unwrap().clone());
    assert_ne!(u.fingerprint(), f);
    let mut u = t.clone();
    let p = u.producer(y).unwrap();
    let node = u.node(p).unwrap().clone();
    let mut rw = Rewriter::new();
    // the same op on another literal, in place (the slot may be reused)
    rw.replace(
        p,
        node.with_operands(vec![Arg::Value(x), Arg::Float(2.0)], vec![y]),
    );
    rw.apply(&mut u).unwrap();
    assert_ne!(u.fingerprint(), f);
}

/// Bug 8: a panicking pass is caught by the manager; what ran before it (IR dumps, stats)
/// comes back with the error; each failure of one process keeps its own reproducer.
#[test]
fn failures_keep_what_came_before_and_their_own_reproducers() {
    let program = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut pm = PassManager::parse("dce").unwrap();
    pm.add_trace_pass(FnPass("boom", |_: &mut Trace| panic!("boom went the pass")));
    pm.print_ir.after_all = true;
    pm.reproducer_dir = Some(dir.path().to_path_buf());
    let e = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(
        matches!(&e.error, PassError::Panicked { pass, message } if pass == "boom" && message == "boom went the pass"),
        "{e}"
    );
    assert_eq!(e.report.timings.len(), 1, "dce ran");
    assert_eq!(e.report.dumps.len(), 1);
    assert!(e.report.dumps[0].starts_with("// ----- IR after dce -----"));
    assert!(e.report.stats.iter().any(|(k, _)| k == "dce.removed"));
    let first = e.reproducer.clone().expect("a reproducer");
    let again = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    let second = again.reproducer.expect("a reproducer");
    assert_ne!(first, second);
    assert!(first.exists() && second.exists());
    let r = Reproducer::load(&first).unwrap();
    assert_eq!(
        (r.pipeline.as_str(), r.failed_pass.as_str()),
        ("dce,boom", "boom")
    );
}

/// The reproducer writer `tracepass opt` uses: for internal failures only, reading the input
/// again when one happens (no copy per run), and saying why it could not write one.
#[test]
fn a_reproducer_writer_of_ones_own_making() {
    use std::{cell::Cell, rc::Rc};
    let program = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let reloads = Rc::new(Cell::new(0));
    let writer = |dir: &std::path::Path| {
        let (input, reloads) = (program.clone(), reloads.clone());
        ReproducerWriter::new(dir)
            .internal_only()
            .reload_input(move || {
                reloads.set(reloads.get() + 1);
                Ok(Module::Program(input.clone()))
            })
    };
    // a pass refusing its input (ddp twice) is not internal: nothing is read or written
    let mut pm = PassManager::parse("ddp(world_size=2),ddp(world_size=2)").unwrap();
    pm.reproducer(writer(dir.path()));
    let e = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(!e.error.is_internal(), "{e}");
    assert!(e.reproducer.is_none() && e.report.reproducer_error.is_none());
    assert_eq!(reloads.get(), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // a panic is: the input is read again and written with the pipeline
    let mut pm = PassManager::parse("dce").unwrap();
    pm.add_trace_pass(FnPass("boom", |_: &mut Trace| panic!("boom")));
    pm.reproducer(writer(dir.path()));
    let e = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(e.error.is_internal());
    assert_eq!(reloads.get(), 1);
    let r = Reproducer::load(e.reproducer.as_deref().expect("written")).unwrap();
    assert_eq!(
        (r.pipeline.as_str(), r.failed_pass.as_str()),
        ("dce,boom", "boom")
    );
    assert!(r.input == Module::Program(program.clone()));
    // a folder that is not there: the error says why, and the run's error stays the pass's
    pm.reproducer(writer(&dir.path().join("missing")));
    let e = pm
        .run(&mut program.clone(), OpRegistry::builtin())
        .unwrap_err();
    assert!(e.reproducer.is_none());
    assert!(e.report.reproducer_error.is_some(), "{e}");
    assert!(matches!(e.error, PassError::Panicked { .. }));
}

/// Instrumentation: hooks around every pass, the manager's own printing built on them.
#[test]
fn instrumentation_sees_every_pass_and_failure() {
    use std::{cell::RefCell, rc::Rc};
    #[derive(Default)]
    struct Log(Rc<RefCell<Vec<String>>>);
    impl PassInstrumentation for Log {
        fn before_pipeline(&mut self, _: &Program, pipeline: &str) {
            self.0.borrow_mut().push(format!("start {pipeline}"));
        }
        fn before_pass(&mut self, pass: &dyn Pass, _: &Program) {
            self.0.borrow_mut().push(format!("before {}", pass.spec()));
        }
        fn after_pass(&mut self, pass: &dyn Pass, _: &Program, run: &PassTiming) {
            self.0
                .borrow_mut()
                .push(format!("after {} {:?}", pass.spec(), run.changed));
        }
        fn after_failure(&mut self, pass: &str, _: &Program, error: &PassError) {
            let kind = match error {
                PassError::Verify { .. } => "verify",
                _ => "other",
            };
            self.0.borrow_mut().push(format!("failed {pass} {kind}"));
        }
    }
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut pm = PassManager::parse("ddp(world_size=2),dce").unwrap();
    pm.instrument(Log(log.clone()));
    pm.add_trace_pass(FnPass("breaks", |t: &mut Trace| {
        corrupt(t);
        Changed::Yes
    }));
    let dumps = Rc::new(RefCell::new(Vec::new()));
    let sink = dumps.clone();
    let mut printer = IrPrinter::new(
        PrintIr {
            after: vec!["breaks".into()],
            ..PrintIr::default()
        },
        move |d| sink.borrow_mut().push(d),
    );
    printer.backward_only = true;
    pm.instrument(printer);
    let mut p = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    pm.run(&mut p, OpRegistry::builtin()).unwrap_err();
    assert_eq!(
        *log.borrow(),
        [
            "start ddp(world_size=2,bucket_mb=25),dce,breaks",
            "before ddp(world_size=2,bucket_mb=25)",
            "after ddp(world_size=2,bucket_mb=25) Yes",
            "before dce",
            "after dce No",
            "before breaks",
            "failed breaks verify",
        ]
    );
    // the IR the verifier rejected, printed for the pass that broke it
    assert_eq!(dumps.borrow().len(), 1);
    assert!(dumps.borrow()[0].starts_with("// ----- IR after breaks -----"));
}

/// Statistics with their trace: a trace-level pass reports once per trace, and says which.
#[test]
fn stats_say_which_pass_and_trace_reported_them() {
    let mut p = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    let (f, b) = (p.forward.name.clone(), p.backward.name.clone());
    let r = PassManager::parse("ddp(world_size=2),dce,backward(cse)")
        .unwrap()
        .run(&mut p, OpRegistry::builtin())
        .unwrap();
    let dce: Vec<(Option<&str>, u64)> = r
        .stat_details
        .iter()
        .filter(|s| s.key == "dce.removed")
        .map(|s| (s.trace.as_deref(), s.value))
        .collect();
    assert_eq!(dce.len(), 2);
    assert_eq!((dce[0].0, dce[1].0), (Some(f.as_str()), Some(b.as_str())));
    let ddp = r
        .stat_details
        .iter()
        .find(|s| s.key == "ddp.buckets")
        .unwrap();
    assert_eq!(
        (ddp.pass.as_str(), ddp.trace.as_deref()),
        ("ddp(world_size=2,bucket_mb=25)", None)
    );
    let cse = r
        .stat_details
        .iter()
        .find(|s| s.key == "cse.removed")
        .unwrap();
    assert_eq!(
        (cse.pass.as_str(), cse.trace.as_deref()),
        ("backward(cse)", Some(b.as_str()))
    );
    // the plain list is the same counters, in the same order
    let plain: Vec<(String, u64)> = r
        .stat_details
        .iter()
        .map(|s| (s.key.clone(), s.value))
        .collect();
    assert_eq!(plain, r.stats);
}

/// Bug 1 on the corpus: on every export's backward, wrap the first node whose output another
/// node reads (`v = b * 2.0` before it, its readers read `v`, and it goes); the trace verifies
/// and `dce`, with verification off, keeps `v`'s producer.
#[test]
fn replacing_a_node_by_an_inserted_one_keeps_edges_on_every_export() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut exports: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("export.json").is_file())
        .collect();
    exports.sort();
    let reg = OpRegistry::builtin();
    let mut wrapped = 0;
    for e in &exports {
        let (mut p, _) = fsio::load(e).unwrap().into_program();
        let t = &mut p.backward;
        // a pure node with one float tensor output that a pure `prims.mul` can stand for,
        // read by another node, reading a value
        let found = t.nodes().find_map(|(idx, n)| {
            let [b] = n.outputs() else { return None };
            let ty = t.ty(*b)?;
            let x = n.args().iter().find_map(Arg::as_value)?;
            (reg.effect(&n.op) == Effect::Pure
                && ty.as_tensor().is_some_and(|tt| tt.dtype.is_float())
                && t.ty(x) == Some(ty)
                && !t.users(*b).is_empty())
            .then_some((idx, *b, x, ty.clone()))
        });
        let Some((pb, b, x, ty)) = found else {
            continue;
        };
        let name = t.name_gen().fresh("t");
        let v = t.new_value(name, ty);
        let mut rw = Rewriter::new();
        rw.insert_before(
            pb,
            Node::new("prims.mul", vec![Arg::Value(x), Arg::Float(2.0)], vec![v]),
        );
        rw.replace_all_uses(b, v);
        rw.erase(pb);
        rw.apply(t).unwrap();
        verify(t).unwrap_or_else(|err| panic!("{}: {err}", e.display()));
        let mut pm = PassManager::parse("dce").unwrap();
        pm.verify_each = false;
        pm.run(&mut p, reg).unwrap();
        assert!(p.backward.producer(v).is_some(), "{}", e.display());
        assert!(!print_trace(&p.backward).contains("<undefined"));
        wrapped += 1;
    }
    assert_eq!(wrapped, exports.len(), "every export has such a node");
}
