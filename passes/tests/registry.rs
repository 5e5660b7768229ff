//! Typed pass options, the open registry, the pass manager's editing, and anchored passes.

use tracepass_ir::*;
use tracepass_passes::*;

fn program() -> Program {
    synth::mlp_program(&synth::MlpSpec::seed()).unwrap()
}

/// The program with a copy of the forward's first pure node right after it (unused): `cse`
/// and `dce` each remove it.
fn with_forward_duplicate() -> (Program, usize) {
    let mut p = program();
    let reg = OpRegistry::builtin();
    let t = &mut p.forward;
    let (idx, node) = t
        .nodes()
        .find(|(_, n)| reg.effect(&n.op) == Effect::Pure && n.outputs().len() == 1)
        .map(|(i, n)| (i, n.clone()))
        .expect("a pure node");
    let ty = t.ty(node.outputs()[0]).unwrap().clone();
    let name = t.name_gen().fresh("t");
    let out = t.new_value(name, ty);
    let mut rw = Rewriter::new();
    rw.insert_after(idx, node.with_operands(node.args().to_vec(), vec![out]));
    rw.apply(t).unwrap();
    verify(t).unwrap();
    let n = t.node_count();
    (p, n)
}

#[test]
fn ddp_options_are_checked_on_the_rust_path_as_on_the_string_path() {
    let e = Ddp::new(DdpOptions {
        world_size: 0,
        ..DdpOptions::default()
    })
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "pass `ddp`: bad value `0` for `world_size`: must be at least 1"
    );
    let e = Ddp::new(DdpOptions {
        world_size: 2,
        bucket_mb: f64::NAN,
        ..DdpOptions::default()
    })
    .unwrap_err();
    assert!(
        matches!(&e, PassError::BadValue { option, reason, .. } if option == "bucket_mb" && reason == "must be a finite number"),
        "{e}"
    );
    let e = Ddp::new(DdpOptions {
        world_size: 2,
        first_bucket_mb: Some(0.0),
        ..DdpOptions::default()
    })
    .unwrap_err();
    assert!(matches!(&e, PassError::BadValue { option, .. } if option == "first_bucket_mb"));
    let e = Ddp::new(DdpOptions {
        world_size: 2,
        group: "a,b".into(),
        ..DdpOptions::default()
    })
    .unwrap_err();
    assert!(matches!(&e, PassError::BadValue { option, .. } if option == "group"));
    // the string path gives the same errors
    for s in ["ddp(world_size=0)", "ddp(world_size=2,bucket_mb=inf)"] {
        assert!(
            matches!(PassManager::parse(s), Err(PassError::BadValue { .. })),
            "{s}"
        );
    }
    // and valid options print as they parse
    let d = Ddp::new(DdpOptions {
        world_size: 8,
        bucket_mb: 0.5,
        first_bucket_mb: Some(1.0),
        average: Average::Post,
        group: "dp".into(),
        launch: Launch::End,
    })
    .unwrap();
    let spec = d.spec();
    assert_eq!(
        spec,
        "ddp(world_size=8,bucket_mb=0.5,first_bucket_mb=1,average=post,group=dp,launch=end)"
    );
    let again = Ddp::from_spec(&parse_pipeline(&spec).unwrap()[0]).unwrap();
    assert_eq!(again.options(), d.options());
}

#[test]
fn help_comes_from_the_declarations() {
    let h = PassRegistry::builtin().help();
    for name in [
        "ddp",
        "fsdp",
        "sort-waits",
        "no-sync",
        "accumulate-grads",
        "dce",
        "cse",
        "canonicalize",
        "remat",
        "fuse-elementwise",
        "fold-conv-crop",
        "conv-input-grad",
    ] {
        assert!(h.contains(&format!("  {name} ")), "{name} in\n{h}");
    }
    assert!(h.contains("world_size"), "{h}");
    assert!(h.contains("bucket_mb") && h.contains("default 25"), "{h}");
    assert!(h.contains("pre|post"), "{h}");
    assert_eq!(
        PassRegistry::builtin().names(),
        [
            "ddp",
            "fsdp",
            "sort-waits",
            "no-sync",
            "accumulate-grads",
            "dce",
            "cse",
            "canonicalize",
            "remat",
            "fuse-elementwise",
            "fold-conv-crop",
            "conv-input-grad"
        ]
    );
    assert!(h.contains("zero3|zero2"), "{h}");
}

struct CountNodes;

static COUNT_NODES: PassDecl = PassDecl {
    name: "count-nodes",
    help: "reports each trace's node count",
    level: PassLevel::Trace,
    options: &[OptionDecl {
        name: "scale",
        kind: OptionKind::Int { min: 1, max: 10 },
        default: OptionDefault::Value("1"),
        help: "multiplies the count",
        show: Show::IfChanged,
    }],
};

struct Counter(u64);

impl TracePass for Counter {
    fn name(&self) -> &str {
        "count-nodes"
    }
    fn spec(&self) -> String {
        let mut v = OptionValues::defaults(&COUNT_NODES);
        v.set("scale", Some(OptionValue::Int(self.0)));
        COUNT_NODES.spell(&v)
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        cx.stat("count-nodes", self.0 * t.node_count() as u64);
        Ok(Changed::No)
    }
}

#[test]
fn a_registered_pass_works_in_pipelines_with_its_declared_options() {
    let _ = CountNodes;
    let mut reg = PassRegistry::with_builtins();
    reg.register_trace_pass(&COUNT_NODES, |o| Ok(Counter(o.int("scale"))))
        .unwrap();
    let mut p = program();
    let (fwd, bwd) = (
        p.forward.node_count() as u64,
        p.backward.node_count() as u64,
    );
    let pm = PassManager::parse_with(&reg, "count-nodes(scale=2),backward(count-nodes)").unwrap();
    assert_eq!(pm.pipeline(), "count-nodes(scale=2),backward(count-nodes)");
    let report = pm.run(&mut p, OpRegistry::builtin()).unwrap();
    let counts: Vec<u64> = report.stats.iter().map(|(_, v)| *v).collect();
    assert_eq!(counts, [2 * fwd, 2 * bwd, bwd]);
    // its options are checked from the declaration
    assert!(matches!(
        PassManager::parse_with(&reg, "count-nodes(scale=11)"),
        Err(PassError::BadValue { reason, .. }) if reason == "must be at most 10"
    ));
    // the built-in registry does not know it; the error lists the valid names
    let Err(PassError::UnknownPass { valid, .. }) = PassManager::parse("count-nodes") else {
        panic!("unknown pass expected");
    };
    assert!(!valid.contains("count-nodes") && valid.contains("sort-waits"));
    // names are unique and spellable
    assert!(matches!(
        reg.register_trace_pass(&COUNT_NODES, |_| Ok(Counter(1))),
        Err(PassError::Duplicate { .. })
    ));
    static FORWARD: PassDecl = PassDecl {
        name: "forward",
        help: "",
        level: PassLevel::Trace,
        options: &[],
    };
    assert!(matches!(
        reg.register_trace_pass(&FORWARD, |_| Ok(Counter(1))),
        Err(PassError::BadPassName { .. })
    ));
}

#[test]
fn the_manager_inserts_and_removes_passes() {
    let mut pm = PassManager::parse("ddp(world_size=2),dce").unwrap();
    pm.insert(1, Box::new(OnTraces::new(SortWaits, None)))
        .unwrap();
    pm.insert(0, Box::new(OnTraces::new(Cse, Some(Anchor::Backward))))
        .unwrap();
    assert_eq!(
        pm.pipeline(),
        "backward(cse),ddp(world_size=2,bucket_mb=25),sort-waits,dce"
    );
    let removed = pm.remove(pm.position("dce").unwrap()).unwrap();
    assert_eq!(removed.name(), "dce");
    assert_eq!(pm.len(), 3);
    assert!(matches!(
        pm.remove(3),
        Err(PassError::NoSuchPosition { at: 3, len: 3 })
    ));
    assert!(pm.insert(5, Box::new(OnTraces::new(Dce, None))).is_err());
    pm.extend_parsed(PassRegistry::builtin(), "forward(dce)")
        .unwrap();
    assert_eq!(
        pm.pipeline(),
        "backward(cse),ddp(world_size=2,bucket_mb=25),sort-waits,forward(dce)"
    );
    let mut p = program();
    pm.run(&mut p, OpRegistry::builtin()).unwrap();
    assert!(tracepass_passes::synchronizes(&p.backward));
}

#[test]
fn anchored_passes_run_on_their_trace_and_leave_provenance_there() {
    let (dup, n) = with_forward_duplicate();
    // backward(...) leaves the forward alone
    let mut p = dup.clone();
    PassManager::parse("backward(cse,dce)")
        .unwrap()
        .run(&mut p, OpRegistry::builtin())
        .unwrap();
    assert_eq!(p.forward.node_count(), n);
    assert_eq!(p.forward.provenance, dup.forward.provenance);
    // forward(cse) removes the duplicate and says so on the forward only
    let mut p = dup.clone();
    PassManager::parse("forward(cse)")
        .unwrap()
        .run(&mut p, OpRegistry::builtin())
        .unwrap();
    assert_eq!(p.forward.node_count(), n - 1);
    assert_eq!(p.forward.provenance.last().unwrap().pass, "forward(cse)");
    assert_eq!(p.backward.provenance, dup.backward.provenance);
    // unanchored, a trace-level pass covers both traces; ddp's line is on the backward
    let mut p = dup.clone();
    let mut pm = PassManager::parse("dce,ddp(world_size=2)").unwrap();
    pm.print_ir.after_all = true;
    let r = pm.run(&mut p, OpRegistry::builtin()).unwrap();
    assert_eq!(p.forward.node_count(), n - 1);
    assert_eq!(p.forward.provenance.len(), dup.forward.provenance.len() + 1);
    assert_eq!(
        p.backward.provenance.last().unwrap().pass,
        "ddp(world_size=2,bucket_mb=25)"
    );
    // and dumps show both traces
    let (f, b) = (&p.forward.name, &p.backward.name);
    assert!(
        r.dumps[0].contains(&format!("def {f}(")) && r.dumps[0].contains(&format!("def {b}(")),
        "{}",
        r.dumps[0]
    );
    // a program-level pass cannot be anchored, and a lone trace has no forward
    assert!(matches!(
        PassManager::parse("forward(ddp(world_size=2))"),
        Err(PassError::NotTraceLevel { .. })
    ));
    let mut lone = Program::lone(dup.backward.clone());
    let e = PassManager::parse("forward(dce)")
        .unwrap()
        .run(&mut lone, OpRegistry::builtin())
        .unwrap_err();
    assert!(matches!(e.error, PassError::NoForward { .. }), "{e}");
    let r = PassManager::parse("dce")
        .unwrap()
        .run(&mut lone, OpRegistry::builtin())
        .unwrap();
    assert_eq!(r.timings.len(), 1);
}

#[test]
fn errors_stay_typed_through_the_manager() {
    let mut lone = Program::lone(program().backward);
    let e = PassManager::parse("ddp(world_size=2)")
        .unwrap()
        .run(&mut lone, OpRegistry::builtin())
        .unwrap_err();
    assert!(matches!(e.error, PassError::Failed { ref pass, .. } if pass == "ddp"));
}
