//! Snapshots of printed traces in canonical form, and the synthetic generator checked against
//! the structure of Thunder's own export.

use std::path::Path;
use tracepass_ir::*;

fn load(rel: &str) -> Trace {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/thunder")
        .join(rel);
    parse_trace(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn snapshot_thunder_backward_canonical() {
    let t = load("mlp/backward.trace");
    assert_eq!(t.kind, TraceKind::Backward);
    insta::assert_snapshot!("mlp_backward", canonical_text(&t));
}

#[test]
fn snapshot_thunder_bucketed_canonical() {
    insta::assert_snapshot!(
        "mlp_ddp_bucketed_backward",
        canonical_text(&load("mlp-ddp-bucketed/backward.trace"))
    );
}

#[test]
fn canonical_form_ignores_numbering() {
    // two Thunder runs number differently; the canonical forms of the two backwards agree
    let a = canonical_text(&load("mlp/backward.trace"));
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/thunder/mlp/backward.trace"),
    )
    .unwrap();
    let shifted = text.replace("t1", "t9");
    assert_ne!(text, shifted);
    assert_eq!(canonical_text(&parse_trace(&shifted).unwrap()), a);
}

#[test]
fn kinds_are_recognised() {
    assert_eq!(load("mlp/forward.trace").kind, TraceKind::Forward);
    assert_eq!(load("mlp/joint.trace").kind, TraceKind::Joint);
    assert_eq!(load("mlp/computation.trace").kind, TraceKind::Computation);
}

#[test]
fn thunder_export_makes_a_program() {
    let p = Program::from_thunder(load("mlp/forward.trace"), load("mlp/backward.trace")).unwrap();
    let fqns: Vec<_> = p.params.iter().map(|p| p.fqn.as_str()).collect();
    assert_eq!(fqns, ["l1.bias", "l1.weight", "l2.bias", "l2.weight"]);
    assert_eq!(p.params[1].shape, vec![64, 32]);
    assert_eq!(p.forward_saved().len(), 8);
    assert_eq!(p.backward_saved().len(), 8);
    // the DDP-bucketed backward has no x gradient: Thunder returns None there
    let p = Program::from_thunder(
        load("mlp-ddp-bucketed/forward.trace"),
        load("mlp-ddp-bucketed/backward.trace"),
    )
    .unwrap();
    assert_eq!(p.gradient_values()[0], None);
    // a backward that does not belong to the forward is refused
    let e =
        Program::from_thunder(load("mlp/computation.trace"), load("mlp/joint.trace")).unwrap_err();
    assert_eq!(e, ProgramError::BackwardReturnNotTuple);
}

fn op_sequence(t: &Trace) -> Vec<String> {
    t.nodes().map(|(_, n)| n.op.to_string()).collect()
}

#[test]
fn synthetic_seed_model_has_thunders_structure() {
    let synth = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
    verify(&synth.forward).unwrap();
    verify(&synth.backward).unwrap();
    let thunder =
        Program::from_thunder(load("mlp/forward.trace"), load("mlp/backward.trace")).unwrap();
    assert_eq!(op_sequence(&synth.backward), op_sequence(&thunder.backward));
    assert_eq!(op_sequence(&synth.forward), op_sequence(&thunder.forward));
    assert_eq!(synth.params, thunder.params);
    let shapes = |p: &Program| {
        p.backward_saved()
            .iter()
            .map(|v| p.backward.ty(*v).cloned())
            .collect::<Vec<_>>()
    };
    assert_eq!(shapes(&synth), shapes(&thunder));
}

#[test]
fn synthetic_deep_mlp_scales() {
    let p = synth::mlp_program(&synth::MlpSpec::deep_with_backward_nodes(2000, 16)).unwrap();
    verify(&p.backward).unwrap();
    assert!(
        p.backward.node_count() >= 2000,
        "{}",
        p.backward.node_count()
    );
    assert!(p.backward.node_count() < 2100);
    assert_eq!(p.params.len(), 2 * 96);
}
