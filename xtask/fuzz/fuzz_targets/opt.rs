//! `opt` with a random pipeline on a parsed trace: the first bytes choose passes and options,
//! the rest is the trace text. Pass errors are fine; panics and invalid output are not.
#![no_main]
mod seed_pairing;
use libfuzzer_sys::fuzz_target;
use tracepass_ir::{parse_trace, verify, OpRegistry};
use tracepass_passes::{PassError, PassManager};

const PASSES: &[&str] = &[
    "ddp(world_size=2,bucket_mb=25)",
    "ddp(world_size=4,bucket_mb=0)",
    "ddp(world_size=3,bucket_mb=0.001,average=post)",
    "ddp(world_size=8,bucket_mb=1,first_bucket_mb=0.01,launch=end)",
    "sort-waits",
    "no-sync",
    "accumulate-grads",
    "dce",
    "cse",
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, rest) = data.split_at(4);
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(t) = parse_trace(text) else { return };
    let n = 1 + (head[0] % 4) as usize;
    let pipeline: Vec<&str> = (0..n)
        .map(|i| PASSES[head[1 + i % 3] as usize % PASSES.len()])
        .collect();
    let Ok(pm) = PassManager::parse(&pipeline.join(",")) else {
        return;
    };
    let mut program = seed_pairing::program_for(t, head[3] % 2 == 0);
    let valid_before = verify(&program.backward).is_ok();
    match pm.run(&mut program, OpRegistry::builtin()) {
        Ok(_) => assert!(verify(&program.backward).is_ok() || !valid_before),
        // a pass that turns a valid trace into an invalid one is a bug
        Err(e) => {
            if let PassError::Verify { pass, error } = &e.error {
                panic!("pass `{pass}` broke a valid trace: {error}");
            }
        }
    }
});
