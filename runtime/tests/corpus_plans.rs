//! Every trace of the model corpus (`testdata/models/*/`) compiles to a plan: the forward with
//! the results the trainer asks for, the backward (Thunder's own all-reduces included) with the
//! gradients.

mod common;
use common::corpus;
use tracepass_ir::{load_export, Arg};
use tracepass_runtime::exec::Plan;
use tracepass_runtime::train::forward_output;

#[test]
fn every_corpus_trace_compiles_to_a_plan() {
    let dirs = corpus();
    assert!(dirs.len() >= 14, "the corpus holds 14 exports: {dirs:?}");
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        let export = load_export(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = &export.program;
        // the forward: the model output, then everything saved for the backward (as the
        // trainer asks for them)
        let output = forward_output(&p.forward).unwrap_or_else(|| panic!("{name}: no output"));
        let mut fwd_results = vec![Some(output)];
        match &p.forward.ret {
            Arg::Tuple(items) if items.len() == 2 => {
                items[1].for_each_value(&mut |v| fwd_results.push(Some(v)))
            }
            other => panic!("{name}: the forward returns {other:?}"),
        }
        if let Err(e) = Plan::compile(&p.forward, &fwd_results) {
            failures.push(format!("{name} forward: {e}"));
        }
        match Plan::compile(&p.backward, &p.gradient_values()) {
            Ok(plan) => {
                if export.info.world_size.is_some() {
                    assert!(
                        !plan.collectives.is_empty(),
                        "{name}: the -ddp backward plans Thunder's all-reduces"
                    );
                }
            }
            Err(e) => failures.push(format!("{name} backward: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
