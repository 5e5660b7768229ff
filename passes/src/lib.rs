//! tracepass-passes: the Pass trait, the PassManager, and the DDP pass family.
//!
//! ```
//! use tracepass_ir::{synth, OpRegistry};
//! use tracepass_passes::PassManager;
//! let mut program = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
//! let pm = PassManager::parse("ddp(world_size=4,bucket_mb=25),sort-waits,dce").unwrap();
//! pm.run(&mut program, OpRegistry::builtin()).unwrap();
//! ```

// Policy: no panics on user input. `unwrap()` is denied in library code (clippy checks it);
// `expect()` is used only for invariants the code itself established, its message naming the
// invariant. Everything a user controls (files, options, traces, ranks) returns a typed error.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod accumulate;
pub mod api;
pub mod catalog;
pub mod cse;
pub mod dce;
pub mod ddp;
pub mod manager;
pub mod no_sync;
pub mod pass;
pub mod pipeline;
pub mod registry;
pub mod sort_waits;

pub use accumulate::AccumulateGrads;
pub use catalog::build_pass;
pub use cse::Cse;
pub use dce::Dce;
pub use ddp::{synchronizes, Average, Bucket, Ddp, DdpOptions, Launch};
pub use manager::{timing_table, PassManager, PrintIr, Reproducer, RunError, RunReport};
pub use no_sync::NoSync;
pub use pass::{Changed, OnTraces, Pass, PassContext, PassError, PassTiming, TracePass};
pub use pipeline::{parse_pipeline, print_pipeline, Anchor, PassSpec};
pub use registry::{
    BuiltPass, OptionDecl, OptionDefault, OptionKind, OptionValue, OptionValues, PassDecl,
    PassLevel, PassRegistry, Show,
};
pub use sort_waits::SortWaits;
