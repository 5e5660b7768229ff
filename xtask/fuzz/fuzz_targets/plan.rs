//! The runtime's planner on a parsed trace that verifies, after a pipeline the first byte
//! chooses: it compiles to a plan or gives a `PlanError`, and never panics.
#![no_main]
mod seed_pairing;
use libfuzzer_sys::fuzz_target;
use tracepass_ir::{parse_trace, verify, OpRegistry, ValueId};
use tracepass_passes::PassManager;
use tracepass_runtime::exec::Plan;

const PIPELINES: &[&str] = &[
    "",
    "ddp(world_size=2,bucket_mb=25),sort-waits",
    "ddp(world_size=4,bucket_mb=0,average=post),sort-waits,dce",
    "ddp(world_size=3,bucket_mb=0.001,launch=end)",
    "no-sync,dce",
    "cse,dce",
];

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(t) = parse_trace(text) else { return };
    if verify(&t).is_err() {
        return;
    }
    let mut program = seed_pairing::program_for(t, head & 0x80 == 0);
    let pipeline = PIPELINES[(head & 0x7f) as usize % PIPELINES.len()];
    if !pipeline.is_empty() {
        let Ok(pm) = PassManager::parse(pipeline) else {
            return;
        };
        if pm.run(&mut program, OpRegistry::builtin()).is_err() {
            return;
        }
    }
    let results: Vec<Option<ValueId>> = program
        .backward
        .returned_values()
        .into_iter()
        .map(Some)
        .collect();
    let _ = Plan::compile(&program.backward, &results);
});
