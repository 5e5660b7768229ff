//! Thunder text -> passes -> binary file -> back: the chain other tools build on.

use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::PassManager;

#[test]
fn thunder_ddp_trace_rebucketed_survives_every_format() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/thunder/mlp-ddp");
    let fwd = parse_trace(&std::fs::read_to_string(dir.join("forward.trace")).unwrap()).unwrap();
    let bwd = parse_trace(&std::fs::read_to_string(dir.join("backward.trace")).unwrap()).unwrap();
    let mut p = Program::from_thunder(fwd, bwd).unwrap();
    PassManager::parse("no-sync,ddp(world_size=2,bucket_mb=25),sort-waits,dce")
        .unwrap()
        .run(&mut p, OpRegistry::builtin())
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for ext in ["tpb", "json"] {
        let f = tmp.path().join(format!("p.{ext}"));
        fsio::save(&f, &Module::Program(p.clone())).unwrap();
        assert_eq!(fsio::load(&f).unwrap(), Module::Program(p.clone()));
    }
    let f = tmp.path().join("b.trace");
    fsio::save(&f, &Module::Trace(p.backward.clone())).unwrap();
    let back = match fsio::load(&f).unwrap() {
        Module::Trace(t) => t,
        _ => unreachable!(),
    };
    assert!(back == p.backward);
    verify(&back).unwrap();
    // one bucket of 2372 f32 values, as in Thunder's own bucketed export
    let text = print_trace(&back);
    assert!(text.contains("\"cpu f32[2372]\""), "{text}");
}
