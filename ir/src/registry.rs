//! The op registry: each op's effect and its meta (shape/dtype inference), plus the mapping of
//! Thunder's spellings (`torch.mul`, `torch_wait_prim_impl`, ...) to canonical names. Open: users
//! register their own ops on a registry of their own.

use crate::arg::Arg;
use crate::node::{Lhs, LhsSlot, Node};
use crate::op_name::OpName;
use crate::op_table;
use crate::signature::{Bound, Signature};
use crate::trace::Trace;
use crate::types::Type;
use rustc_hash::FxHashMap as HashMap;
use std::sync::OnceLock;

/// Canonical names of the ops that passes and runtimes refer to by name.
pub mod ops {
    /// Division (`ddp` pre- and post-averages with it).
    pub const DIV: &str = "prims.div";
    /// Packs gradients into a bucket's flat buffer.
    pub const BUCKET_PACK: &str = "dist.bucket_pack";
    /// Starts an asynchronous all-reduce; its output is a future.
    pub const ALL_REDUCE: &str = "dist.all_reduce_async";
    /// Starts an asynchronous all-gather of each rank's flat shard; its output is a future of
    /// the `world_size` shards end to end.
    pub const ALL_GATHER: &str = "dist.all_gather_async";
    /// Starts an asynchronous reduce-scatter of a flat buffer; its output is a future of this
    /// rank's reduced `1/world_size` of it.
    pub const REDUCE_SCATTER: &str = "dist.reduce_scatter_async";
    /// Waits on a future.
    pub const WAIT: &str = "dist.wait";
    /// Unpacks a reduced bucket into gradients.
    pub const UNPACK: &str = "dist.unpack";
    /// Thunder's bucket view update.
    pub const UPDATE_BUCKET_VIEW: &str = "dist.update_bucket_view";
    /// Python sequence unpacking (`a, b, = x`).
    pub const UNPACK_SEQUENCE: &str = "prims.unpack_sequence";
    /// Thunder's `clear_mutable_collection`.
    pub const CLEAR_COLLECTION: &str = "python.clear_mutable_collection";
    /// `torch.true_divide`.
    pub const TRUE_DIVIDE: &str = "ltorch.true_divide";
    /// Addition (tied gradients, gradient accumulation).
    pub const ADD: &str = "ltorch.add";
    /// Thunder's in-place copy.
    pub const COPY: &str = "python.copy_";
    /// Thunder's alias bookkeeping.
    pub const UPDATE_ALIASES: &str = "python.update_aliases";
    /// A fusion region of `fuse-elementwise`: its body is its decomposition (`crate::region`).
    pub const FUSION: &str = "tracepass.fusion";
}

/// What running an op does besides computing its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Only its outputs matter: removable when unused, movable within data dependencies.
    Pure,
    /// Communicates with other ranks: every rank must run the same collectives in the same order.
    Collective,
    /// Changes state outside its outputs (clears a collection, copies into a buffer, an op
    /// nobody registered): kept, and kept in order.
    SideEffect,
    /// Draws random numbers: two calls with equal operands differ, so never merged or dropped.
    Random,
}

/// How an op's output dtype follows from its operands (what elementwise metas apply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeRule {
    /// PyTorch's type promotion over tensors and numbers (`add`, `mul`, `where`).
    Promote,
    /// Promotion, then integers and booleans become the default float (`true_divide`, `exp`).
    PromoteToFloat,
    /// Always `b8` (`eq`, `lt`, `isnan`, `logical_and`).
    Bool,
    /// The dtype of the first tensor operand (`reshape`, `expand`).
    First,
    /// The `dtype=` operand (`arange`, `full`, `uniform`), else the op's own default.
    Operand,
    /// The meta function decides on its own.
    Meta,
}

/// What an op's meta function concludes about its outputs.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaOut {
    /// Exactly these output types.
    Types(Vec<Type>),
    /// Outputs cannot be inferred from operands (sequence unpacking, unregistered ops); declared
    /// types are trusted.
    Declared,
    /// Results nested in tuples, some of them `None` (Thunder's `*_vjp` fallbacks give one
    /// gradient per leaf of the forward's operands): [`MetaOut::bind`] matches them against
    /// the statement's left-hand side.
    Places(Vec<ResultPlace>),
}

/// One place of a nested result ([`MetaOut::Places`]).
#[derive(Clone, Debug, PartialEq)]
pub enum ResultPlace {
    /// A value of this type.
    Value(Type),
    /// Python's `None`: no value, so the statement must discard it (`_`).
    Nothing,
    /// A tuple of places.
    Group(Vec<ResultPlace>),
}

impl ResultPlace {
    /// The left-hand side that names every value of `places` (pushing their types, in order)
    /// and discards every `None`.
    pub fn bind_all(places: &[ResultPlace], types: &mut Vec<Type>) -> Vec<LhsSlot> {
        places
            .iter()
            .map(|p| match p {
                ResultPlace::Value(t) => {
                    types.push(t.clone());
                    LhsSlot::Out
                }
                ResultPlace::Nothing => LhsSlot::Discard,
                ResultPlace::Group(g) => LhsSlot::Group(ResultPlace::bind_all(g, types)),
            })
            .collect()
    }
}

impl MetaOut {
    /// The output types of `node`: nested places matched against its left-hand side (each
    /// name must meet a value, each tuple a tuple of the same length); other results as
    /// they are.
    pub fn bind(self, node: &Node) -> Result<MetaOut, String> {
        let MetaOut::Places(places) = self else {
            return Ok(self);
        };
        let flat;
        let pattern = match (node.lhs, node.lhs_pattern()) {
            (Lhs::Nested, Some(p)) => p,
            (Lhs::Tuple | Lhs::List, _) => {
                flat = vec![LhsSlot::Out; node.outputs().len()];
                &flat[..]
            }
            _ => {
                return Err(format!(
                    "{} gives a tuple of {} results: bind them with a tuple, `(a, _, b) = ...`",
                    node.op,
                    places.len()
                ))
            }
        };
        let mut types = Vec::with_capacity(node.outputs().len());
        bind_places(&node.op, pattern, &places, &mut types, &mut Vec::new())?;
        Ok(MetaOut::Types(types))
    }
}

/// Walks a left-hand side and the results side by side; `at` is the path of tuple indices,
/// for the message.
fn bind_places(
    op: &str,
    slots: &[LhsSlot],
    places: &[ResultPlace],
    types: &mut Vec<Type>,
    at: &mut Vec<usize>,
) -> Result<(), String> {
    let path = |at: &[usize]| {
        if at.is_empty() {
            "the result".to_string()
        } else {
            let p: Vec<String> = at.iter().map(|i| format!("[{i}]")).collect();
            format!("result{}", p.concat())
        }
    };
    if slots.len() != places.len() {
        return Err(format!(
            "{op}: {} is a tuple of {} places, the left-hand side unpacks {}",
            path(at),
            places.len(),
            slots.len()
        ));
    }
    for (i, (slot, place)) in slots.iter().zip(places).enumerate() {
        at.push(i);
        match (slot, place) {
            (LhsSlot::Discard, _) => {}
            (LhsSlot::Out, ResultPlace::Value(t)) => types.push(t.clone()),
            (LhsSlot::Out, ResultPlace::Nothing) => {
                return Err(format!(
                    "{op}: {} is None (no gradient), the left-hand side names it",
                    path(at)
                ))
            }
            (LhsSlot::Out, ResultPlace::Group(_)) => {
                return Err(format!(
                    "{op}: {} is a tuple, the left-hand side names it as one value",
                    path(at)
                ))
            }
            (LhsSlot::Group(g), ResultPlace::Group(p)) => bind_places(op, g, p, types, at)?,
            (LhsSlot::Group(_), _) => {
                return Err(format!(
                    "{op}: {} is not a tuple, the left-hand side unpacks it",
                    path(at)
                ))
            }
        }
        at.pop();
    }
    Ok(())
}

/// The operands a meta function sees, with value types resolved through the trace.
pub struct MetaCx<'a> {
    /// The op's canonical name.
    pub op: &'a str,
    /// Positional operands.
    pub args: &'a [Arg],
    /// Keyword operands.
    pub kwargs: &'a [(String, Arg)],
    /// The trace, to read operand types.
    pub trace: &'a Trace,
    /// The operands bound to the op's signature (`None` for ops declared without one).
    pub bound: Option<Bound<'a>>,
    /// How the op's result dtype follows from its operands'.
    pub dtype_rule: DTypeRule,
}

/// Shape and dtype inference: an error message on bad operands.
pub type MetaFn = fn(&MetaCx) -> Result<MetaOut, String>;

/// One op of the table, as written in the source: everything about it in one place.
pub struct OpSpec {
    /// Canonical name: `prims.*` (primitives), `ltorch.*` (torch-level ops), `dist.*`
    /// (communication), `python.*` (collection plumbing).
    pub name: &'static str,
    /// Every other name Thunder prints for it (`torch.mul`, `Tensor.expand`,
    /// `torch_pad_prim_impl`, `torch.nn.functional.silu`).
    pub spellings: &'static [&'static str],
    /// Pure, collective, side effect or random.
    pub effect: Effect,
    /// Python-style parameter list: `"a, dim=None, keepdim=False, *, dtype=None"`.
    pub signature: &'static str,
    /// How the result dtype follows from the operands'.
    pub dtype: DTypeRule,
    /// Shape and dtype inference.
    pub meta: MetaFn,
}

/// One op's declaration, as the registry holds it.
#[derive(Clone)]
pub struct OpDef {
    /// Canonical name.
    pub name: String,
    /// Every other name Thunder prints for it.
    pub spellings: Vec<String>,
    /// Pure, collective, side effect or random.
    pub effect: Effect,
    /// `None`: any operands are accepted (ops registered with [`OpRegistry::register`]).
    pub signature: Option<Signature>,
    /// How the result dtype follows from the operands'.
    pub dtype: DTypeRule,
    /// Shape and dtype inference.
    pub meta: MetaFn,
}

/// Effects of the ops a sweep meets, looked up in the registry once per op name. Keyed by
/// where the name is stored ([`OpName::addr`]): one address per built-in op, so no name is
/// hashed per node.
pub struct EffectCache<'a> {
    reg: &'a OpRegistry,
    seen: HashMap<usize, Effect>,
}

impl EffectCache<'_> {
    /// The effect of `op` (looked up once per distinct op).
    pub fn effect(&mut self, op: &OpName) -> Effect {
        let reg = self.reg;
        *self.seen.entry(op.addr()).or_insert_with(|| reg.effect(op))
    }
}

/// Known ops and the spellings that name them.
#[derive(Clone, Default)]
pub struct OpRegistry {
    ops: HashMap<String, OpDef>,
    aliases: HashMap<String, String>,
    allow_unregistered: bool,
}

/// Why a declaration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// An op's signature does not parse.
    #[error("op `{op}`: bad signature: {message}")]
    Signature {
        /// The op.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// A spelling already names another op.
    #[error("`{spelling}` already names `{existing}`; it cannot also name `{op}`")]
    SpellingTaken {
        /// The spelling.
        spelling: String,
        /// The op it names.
        existing: String,
        /// The op being registered.
        op: String,
    },
}

impl OpRegistry {
    /// An empty registry.
    pub fn empty() -> OpRegistry {
        OpRegistry::default()
    }
    /// The shared registry of built-in ops.
    pub fn builtin() -> &'static OpRegistry {
        static REG: OnceLock<OpRegistry> = OnceLock::new();
        REG.get_or_init(OpRegistry::with_builtins)
    }
    /// The registry's own copy of `name` when it names an op or is a spelling of one (used to
    /// share op names between nodes).
    pub(crate) fn builtin_name(&'static self, name: &str) -> Option<&'static str> {
        self.ops
            .get_key_value(name)
            .map(|(k, _)| k.as_str())
            .or_else(|| self.aliases.get_key_value(name).map(|(k, _)| k.as_str()))
    }
    /// The built-in registry that keeps unknown ops as opaque nodes (`--allow-unregistered`).
    pub fn builtin_allowing_unregistered() -> &'static OpRegistry {
        static REG: OnceLock<OpRegistry> = OnceLock::new();
        REG.get_or_init(|| OpRegistry::with_builtins().allowing_unregistered(true))
    }
    /// A fresh registry with the built-in ops, to extend with `register`.
    pub fn with_builtins() -> OpRegistry {
        let mut r = OpRegistry::empty();
        for spec in op_table::all() {
            if let Err(e) = r.declare(spec) {
                // the table is source code; `builtin_table_registers` tests it
                panic!("built-in op table: {e}");
            }
        }
        r
    }
    /// Whether ops outside the registry are kept as opaque nodes (their declared types
    /// trusted, ordered as side effects) instead of refused.
    pub fn allowing_unregistered(mut self, allow: bool) -> OpRegistry {
        self.allow_unregistered = allow;
        self
    }
    /// Whether unknown ops are kept opaque rather than refused.
    pub fn allows_unregistered(&self) -> bool {
        self.allow_unregistered
    }
    /// Declares an op from its table entry: name, spellings, effect, signature, dtype rule, meta.
    pub fn declare(&mut self, spec: &OpSpec) -> Result<(), RegistryError> {
        let signature =
            Signature::parse(spec.signature).map_err(|message| RegistryError::Signature {
                op: spec.name.to_string(),
                message,
            })?;
        for sp in spec.spellings {
            if let Some(existing) = self.resolve(sp).filter(|e| *e != spec.name) {
                return Err(RegistryError::SpellingTaken {
                    spelling: sp.to_string(),
                    existing: existing.to_string(),
                    op: spec.name.to_string(),
                });
            }
        }
        self.ops.insert(
            spec.name.to_string(),
            OpDef {
                name: spec.name.to_string(),
                spellings: spec.spellings.iter().map(|s| s.to_string()).collect(),
                effect: spec.effect,
                signature: Some(signature),
                dtype: spec.dtype,
                meta: spec.meta,
            },
        );
        for sp in spec.spellings {
            self.aliases.insert(sp.to_string(), spec.name.to_string());
        }
        Ok(())
    }
    /// Registers an op without a signature (any operands) and the meta rule `Meta`.
    pub fn register(&mut self, name: impl Into<String>, effect: Effect, meta: MetaFn) {
        let name = name.into();
        self.ops.insert(
            name.clone(),
            OpDef {
                name,
                spellings: Vec::new(),
                effect,
                signature: None,
                dtype: DTypeRule::Meta,
                meta,
            },
        );
    }
    /// Makes `spelling` another name of the canonical op `canonical`.
    pub fn alias(&mut self, spelling: impl Into<String>, canonical: impl Into<String>) {
        let (spelling, canonical) = (spelling.into(), canonical.into());
        if let Some(def) = self.ops.get_mut(&canonical) {
            def.spellings.push(spelling.clone());
        }
        self.aliases.insert(spelling, canonical);
    }
    /// The canonical name for a printed callee, if known.
    pub fn resolve<'a>(&'a self, callee: &'a str) -> Option<&'a str> {
        if self.ops.contains_key(callee) {
            return Some(callee);
        }
        self.aliases.get(callee).map(String::as_str)
    }
    /// The op named or spelled `name`.
    pub fn get(&self, name: &str) -> Option<&OpDef> {
        self.ops.get(name)
    }
    /// Every op's declaration, sorted by canonical name.
    pub fn defs(&self) -> Vec<&OpDef> {
        let mut v: Vec<&OpDef> = self.ops.values().collect();
        v.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        v
    }
    /// The effect of the op named `name` (unknown ops: side effect).
    pub fn effect(&self, name: &str) -> Effect {
        self.get(name).map_or(Effect::SideEffect, |d| d.effect)
    }
    /// An effect lookup for sweeps over every node: each distinct op name is looked up once.
    pub fn effects(&self) -> EffectCache<'_> {
        EffectCache {
            reg: self,
            seen: HashMap::default(),
        }
    }
    /// Canonical op names, sorted.
    pub fn op_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.ops.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
    /// [`OpRegistry::infer`] for a node: its operands, its results bound to its left-hand side
    /// ([`MetaOut::bind`]).
    pub fn infer_node(&self, trace: &Trace, node: &Node) -> Result<MetaOut, String> {
        self.infer(trace, &node.op, node.args(), node.kwargs())?
            .bind(node)
    }
    /// Runs an op's meta on a node's operands.
    pub fn infer(
        &self,
        trace: &Trace,
        op: &str,
        args: &[Arg],
        kwargs: &[(String, Arg)],
    ) -> Result<MetaOut, String> {
        let Some(def) = self.get(op) else {
            if self.allow_unregistered {
                return Ok(MetaOut::Declared);
            }
            return Err(format!("unknown op `{op}`"));
        };
        let bound = match &def.signature {
            Some(sig) => Some(
                sig.bind(args, kwargs)
                    .map_err(|m| format!("{op}({sig}) {m}"))?,
            ),
            None => None,
        };
        (def.meta)(&MetaCx {
            op,
            args,
            kwargs,
            trace,
            bound,
            dtype_rule: def.dtype,
        })
    }
}
