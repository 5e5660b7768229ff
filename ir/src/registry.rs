//! The op registry: each op's effect and its meta (shape/dtype inference), plus the mapping of
//! Thunder's spellings (`torch.mul`, `torch_wait_prim_impl`, ...) to canonical names. Open: users
//! register their own ops on a registry of their own.

use crate::arg::Arg;
use crate::meta;
use crate::op_name::OpName;
use crate::trace::Trace;
use crate::types::Type;
use rustc_hash::FxHashMap as HashMap;
use std::sync::OnceLock;

/// Canonical names of the ops that passes and runtimes refer to by name.
pub mod ops {
    pub const DIV: &str = "prims.div";
    pub const BUCKET_PACK: &str = "dist.bucket_pack";
    pub const ALL_REDUCE: &str = "dist.all_reduce_async";
    pub const WAIT: &str = "dist.wait";
    pub const UNPACK: &str = "dist.unpack";
    pub const UPDATE_BUCKET_VIEW: &str = "dist.update_bucket_view";
    pub const UNPACK_SEQUENCE: &str = "prims.unpack_sequence";
    pub const CLEAR_COLLECTION: &str = "python.clear_mutable_collection";
    pub const TRUE_DIVIDE: &str = "ltorch.true_divide";
}

/// What running an op does besides computing its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Only its outputs matter: removable when unused, movable within data dependencies.
    Pure,
    /// Communicates with other ranks: every rank must run the same collectives in the same order.
    Collective,
    /// Changes state outside its outputs (clears a collection, writes a file).
    SideEffect,
}

/// What an op's meta function concludes about its outputs.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaOut {
    /// Exactly these output types.
    Types(Vec<Type>),
    /// Outputs cannot be inferred from operands (sequence unpacking); declared types are trusted.
    Declared,
}

/// The operands a meta function sees, with value types resolved through the trace.
pub struct MetaCx<'a> {
    pub op: &'a str,
    pub args: &'a [Arg],
    pub kwargs: &'a [(String, Arg)],
    pub trace: &'a Trace,
}

/// Shape and dtype inference: an error message on bad operands.
pub type MetaFn = fn(&MetaCx) -> Result<MetaOut, String>;

/// One op's declaration.
#[derive(Clone)]
pub struct OpDef {
    pub name: String,
    pub effect: Effect,
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
    /// A fresh registry with the built-in ops, to extend with `register`.
    pub fn with_builtins() -> OpRegistry {
        let mut r = OpRegistry::empty();
        meta::register_builtins(&mut r);
        r
    }
    pub fn register(&mut self, name: impl Into<String>, effect: Effect, meta: MetaFn) {
        let name = name.into();
        self.ops.insert(name.clone(), OpDef { name, effect, meta });
    }
    /// Makes `spelling` another name of the canonical op `canonical`.
    pub fn alias(&mut self, spelling: impl Into<String>, canonical: impl Into<String>) {
        self.aliases.insert(spelling.into(), canonical.into());
    }
    /// The canonical name for a printed callee, if known.
    pub fn resolve<'a>(&'a self, callee: &'a str) -> Option<&'a str> {
        if self.ops.contains_key(callee) {
            return Some(callee);
        }
        self.aliases.get(callee).map(String::as_str)
    }
    pub fn get(&self, name: &str) -> Option<&OpDef> {
        self.ops.get(name)
    }
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
    /// Runs an op's meta on a node's operands.
    pub fn infer(
        &self,
        trace: &Trace,
        op: &str,
        args: &[Arg],
        kwargs: &[(String, Arg)],
    ) -> Result<MetaOut, String> {
        let def = self.get(op).ok_or_else(|| format!("unknown op `{op}`"))?;
        (def.meta)(&MetaCx {
            op,
            args,
            kwargs,
            trace,
        })
    }
}
