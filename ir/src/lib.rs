//! tracepass-ir: Lightning Thunder's training traces as a DAG with a schedule.
//!
//! - [`Trace`]: nodes with data and order edges, the schedule (a topological order), the
//!   value table.
//! - [`Rewriter`]: how passes edit a trace: queue insertions, replacements, erasures and a new
//!   return, then apply them at once, edges and schedule kept consistent.
//! - [`Program`]: forward + backward + parameters.
//! - [`OpRegistry`]: ops, their effects and meta functions, Thunder's spellings of them.
//! - [`verify()`], [`print_trace`], [`parse_trace`], [`codec`], [`fsio`]: checking and formats.
//!
//! ```
//! use tracepass_ir::{parse_trace, print_trace, verify, TraceBuilder, Arg, DType, Device, Type};
//! // build a trace: its output types come from the ops' meta functions
//! let mut b = TraceBuilder::new("f", tracepass_ir::TraceKind::Forward);
//! let x = b.arg("x", Type::tensor([2, 3], DType::F32, Device::CPU));
//! let y = b.op("prims.neg", vec![Arg::Value(x)]).unwrap();
//! b.ret(Arg::Value(y));
//! let t = b.finish();
//! verify(&t).unwrap();
//! // print it as Thunder does; read back, it prints the same
//! let text = print_trace(&t);
//! assert!(text.contains("prims.neg(x)"));
//! assert_eq!(print_trace(&parse_trace(&text).unwrap()), text);
//! ```

// Policy: no panics on user input. `unwrap()` is denied in library code (clippy checks it);
// `expect()` is used only for invariants the code itself established, its message naming the
// invariant. Everything a user controls (files, options, traces, ranks) returns a typed error.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Nothing here needs `unsafe`; the speed comes from layout (see `columns`, `rebuild`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arg;
pub mod builder;
pub mod canon;
pub mod codec;
mod columns;
pub mod decomposition;
pub mod dot;
pub mod error;
pub mod export;
pub mod fsio;
pub mod fusion;
pub mod lowering;
mod meta;
mod name_table;
mod name_text;
pub mod node;
pub mod op;
pub mod op_name;
mod op_table;
pub mod parse;
pub mod print;
pub mod program;
pub mod prologue;
pub mod pyfloat;
mod rebuild;
pub mod region;
pub mod registry;
pub mod rewriter;
pub mod signature;
pub mod synth;
pub mod trace;
mod type_table;
pub mod types;
pub mod value;
pub mod verify;

pub use arg::{Arg, DTypeSpelling, DeviceSpelling, Opaque};
pub use builder::{BuildError, TraceBuilder};
pub use canon::{canonical_text, canonicalize};
pub use codec::CodecError;
pub use decomposition::{inline_unknown_decompositions, InlinedOp};
pub use error::FileError;
pub use export::{is_export_dir, load_export, load_export_with, Export, ExportInfo};
pub use fusion::{inline_fusion_regions, FusionRegion};
pub use node::{Edge, Lhs, LhsSlot, Node, SubSymbol};
pub use op_name::OpName;
pub use op_table::fallback::saved_call as fallback_call;
pub use op_table::fallback::saved_operands as fallback_operands;
pub use parse::{parse_trace, parse_trace_with, ParseError};
pub use petgraph::stable_graph::NodeIndex;
pub use print::{print_node_line, print_trace, print_trace_with, PrintOptions};
pub use program::{Module, Param, ParamShard, Program, ProgramError};
pub use prologue::{parse_prologue, ModuleTensor, Prologue, TensorKind};
pub use region::{body_lines, free_names, region_body, RegionError};
pub use registry::{
    ops, DTypeRule, Effect, EffectCache, MetaCx, MetaOut, OpDef, OpRegistry, OpSpec, RegistryError,
    ResultPlace,
};
pub use rewriter::{literal_fits, Applied, NewNode, NodeRef, RewriteError, Rewriter};
pub use signature::{Bound, Signature};
pub use trace::{NameGen, Provenance, Trace, TraceKind, NOT_READ, RETURNED, UNSCHEDULED};
pub use types::{
    broadcast_shapes, broadcast_shapes_in, DType, Device, DeviceKind, Shape, TensorType, Type,
    MAX_TENSOR_BYTES,
};
pub use value::{Def, Name, ValueId, ValueIdMap, ValueIdSet, ValueRef};
pub use verify::{verify, verify_return_types, verify_with, Diagnostic, ReturnTypes, VerifyError};
