//! tracepass-passes: the pass traits, the pass registry, the PassManager, and the DDP pass
//! family.
//!
//! - [`Pass`] rewrites a whole [`Program`](tracepass_ir::Program) (`ddp`, `accumulate-grads`);
//!   [`TracePass`] rewrites one trace at a time (`sort-waits`, `no-sync`, `dce`, `cse`) and
//!   runs on every trace of a program, or on one when anchored: `forward(cse),backward(dce)`.
//! - Every pass is declared once ([`PassDecl`]: name, help, typed options), and a
//!   [`PassRegistry`] maps names to passes; register your own and they work in pipelines.
//! - [`PassManager`] runs a pipeline, verifying what each pass changed, printing IR, timing
//!   passes and writing a reproducer when one fails; [`PassInstrumentation`] hooks run around
//!   every pass.
//! - [`patterns`]: declarative rewrite patterns and a greedy driver; [`canonicalize`] is written
//!   with them.
//!
//! ```
//! use tracepass_ir::{synth, OpRegistry};
//! use tracepass_passes::PassManager;
//! let mut program = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
//! let pm = PassManager::parse("ddp(world_size=4,bucket_mb=25),sort-waits,dce").unwrap();
//! let report = pm.run(&mut program, OpRegistry::builtin()).unwrap();
//! assert!(report.stats.contains(&("ddp.buckets".to_string(), 1)));
//! assert_eq!(
//!     program.backward.provenance.last().unwrap().pass,
//!     "ddp(world_size=4,bucket_mb=25)"
//! );
//! ```
//!
//! # Writing a pass
//!
//! A pass reads the trace, queues its edits on a [`Rewriter`](tracepass_ir::Rewriter) and
//! applies them once: operands, graph edges and the schedule stay consistent. Declare it once,
//! register it, and name it in pipelines. Here, `fold-neg` replaces `prims.neg(prims.neg(x))`
//! by `x`:
//!
//! ```
//! use tracepass_ir::{op, parse_trace, print_trace, Arg, OpRegistry, Program, Rewriter, Trace};
//! use tracepass_passes::{
//!     Changed, PassContext, PassDecl, PassError, PassLevel, PassManager, PassRegistry,
//!     TracePass,
//! };
//!
//! struct FoldNeg;
//!
//! static FOLD_NEG: PassDecl = PassDecl {
//!     name: "fold-neg",
//!     help: "replaces -(-x) by x",
//!     level: PassLevel::Trace,
//!     options: &[],
//! };
//!
//! impl TracePass for FoldNeg {
//!     fn name(&self) -> &str {
//!         FOLD_NEG.name
//!     }
//!     fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
//!         let mut rw = Rewriter::new();
//!         let mut folded = 0;
//!         for (_, node) in t.nodes() {
//!             let (true, [Arg::Value(inner)], [out]) =
//!                 (op::NEG.matches(node), node.args(), node.outputs())
//!             else {
//!                 continue;
//!             };
//!             let Some(first) = t.producer(*inner).and_then(|p| t.node(p)) else {
//!                 continue;
//!             };
//!             if let (true, [Arg::Value(x)]) = (op::NEG.matches(first), first.args()) {
//!                 // readers of -(-x) read x; dce removes what is left unread
//!                 rw.replace_all_uses(*out, *x);
//!                 folded += 1;
//!             }
//!         }
//!         rw.apply(t).map_err(|e| PassError::rewrite("fold-neg", e))?;
//!         cx.stat("fold-neg.folded", folded);
//!         Ok((folded > 0).into())
//!     }
//! }
//!
//! let mut registry = PassRegistry::with_builtins();
//! registry.register_trace_pass(&FOLD_NEG, |_| Ok(FoldNeg)).unwrap();
//! let mut program = Program::lone(
//!     parse_trace(
//!         "def f(x):\n  # x: \"cpu f32[4]\"\n  a = prims.neg(x)  # a: \"cpu f32[4]\"\n  b = prims.neg(a)  # b: \"cpu f32[4]\"\n  c = prims.mul(b, b)  # c: \"cpu f32[4]\"\n  return c\n",
//!     )
//!     .unwrap(),
//! );
//! let pm = PassManager::parse_with(&registry, "fold-neg,dce").unwrap();
//! let report = pm.run(&mut program, OpRegistry::builtin()).unwrap();
//! assert_eq!(report.stats[0], ("fold-neg.folded".to_string(), 1));
//! let text = print_trace(&program.backward);
//! assert!(text.contains("c = prims.mul(x, x)") && !text.contains("prims.neg"), "{text}");
//! ```
//!
//! `examples/opt.rs` builds a `tracepass opt`-style driver around such a pass in a few lines.

// Policy: no panics on user input. `unwrap()` is denied in library code (clippy checks it);
// `expect()` is used only for invariants the code itself established, its message naming the
// invariant. Everything a user controls (files, options, traces, ranks) returns a typed error.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![warn(missing_docs)]

pub mod accumulate;
pub mod api;
pub mod canonicalize;
pub mod catalog;
pub mod conv_input_grad;
pub mod cse;
pub mod dce;
pub mod ddp;
pub mod ddp_plan;
pub mod fold;
pub mod fold_conv_crop;
pub mod fsdp;
pub mod fuse_elementwise;
pub mod instrument;
pub mod manager;
pub mod no_sync;
pub mod pass;
pub mod patterns;
pub mod pipeline;
pub mod registry;
pub mod remat;
pub mod sort_waits;

pub use accumulate::AccumulateGrads;
pub use canonicalize::Canonicalize;
pub use catalog::build_pass;
pub use conv_input_grad::{conv_input_grad, ConvInputGrad};
pub use cse::Cse;
pub use dce::Dce;
pub use ddp::{synchronizes, Average, Bucket, Ddp, DdpOptions, Launch};
pub use ddp_plan::{
    plan_ddp, plan_ddp_text, BucketPlan, DdpPlan, GradientPlan, PlanError, PlanParam,
};
pub use fold_conv_crop::{fold_conv_crop, FoldConvCrop};
pub use fsdp::{Fsdp, FsdpOptions, Sharding};
pub use fuse_elementwise::{
    fuse_elementwise, fuse_elementwise_keeping, FuseElementwise, FusionStats,
};
pub use instrument::{
    dump_program, IrPrinter, PassInstrumentation, ReproducerError, ReproducerWriter,
};
pub use manager::{
    reproducer_path, timing_table, PassManager, PrintIr, Reproducer, RunError, RunReport,
};
pub use no_sync::NoSync;
pub use pass::{Changed, OnTraces, Pass, PassContext, PassError, PassTiming, Stat, TracePass};
pub use pipeline::{parse_pipeline, print_pipeline, Anchor, PassSpec};
pub use registry::{
    BuiltPass, OptionDecl, OptionDefault, OptionKind, OptionValue, OptionValues, PassDecl,
    PassLevel, PassRegistry, Show,
};
pub use remat::Remat;
pub use sort_waits::SortWaits;
