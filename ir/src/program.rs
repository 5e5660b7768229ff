//! A training step's program: forward, backward, parameters, and how they are linked.

use crate::arg::Arg;
use crate::node::Lhs;
use crate::registry::ops;
use crate::trace::{Trace, TraceKind};
use crate::types::{DType, Device, Type};
use crate::value::ValueId;
use serde::{Deserialize, Serialize};

/// A parameter or buffer of the model: a forward argument the module provides.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Param {
    /// Fully qualified module path (`l1.weight`).
    pub fqn: String,
    /// Position among the forward trace's arguments.
    pub forward_arg: usize,
    /// Position of its gradient in the backward's return tuple (`None`: no gradient computed).
    pub grad_output: Option<usize>,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its dtype.
    pub dtype: DType,
    /// Its device.
    pub device: Device,
    /// Frozen parameters get no gradient synchronization.
    pub requires_grad: bool,
    /// Another parameter's fqn when both are one tensor (tied weights): one all-reduce serves both.
    pub tied_to: Option<String>,
    /// A buffer (`module.get_buffer`: running statistics, masks), not a parameter: never
    /// trained, never synchronized.
    pub buffer: bool,
    /// Where `fsdp` put the parameter: then `forward_arg` is its bucket's shard argument and
    /// `grad_output` the position of that shard's gradient (`None`: not sharded).
    pub shard: Option<ParamShard>,
}

/// A sharded parameter's place in its bucket: the bucket is the flat concatenation of its
/// members, zero-padded at the end to a multiple of `world_size` elements, and rank `r` holds
/// elements `r * shard_numel .. (r + 1) * shard_numel` of it. What the runtime needs to cut a
/// parameter into shards and to put a checkpoint's shards back together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamShard {
    /// The bucket's name (`b0`); its shard argument is `shard_<bucket>`.
    pub bucket: String,
    /// Where the parameter starts in the bucket's flat buffer, in elements.
    pub offset: usize,
    /// The parameter's element count.
    pub numel: usize,
    /// Elements of the bucket's members together, before padding.
    pub bucket_numel: usize,
    /// Zeros after the last member, so the bucket splits into equal shards.
    pub padding: usize,
    /// Ranks the bucket is split over.
    pub world_size: usize,
}

impl ParamShard {
    /// Elements of each rank's shard: the padded bucket over the world size.
    pub fn shard_numel(&self) -> usize {
        (self.bucket_numel + self.padding) / self.world_size.max(1)
    }
}

/// Files of format versions 1 and 2 have no `buffer` field: their parameters are parameters;
/// files before version 5 have no `shard` field: their parameters are not sharded. One stored
/// form serves every version: JSON leaves an absent field out, and the binary form (which
/// does not name its fields) is read as only as many fields as the file's version wrote, the
/// rest taking their defaults.
impl<'de> Deserialize<'de> for Param {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Param, D::Error> {
        #[derive(Deserialize)]
        struct Stored {
            fqn: String,
            forward_arg: usize,
            grad_output: Option<usize>,
            shape: Vec<usize>,
            dtype: DType,
            device: Device,
            requires_grad: bool,
            tied_to: Option<String>,
            /// Since version 3.
            #[serde(default)]
            buffer: bool,
            /// Since version 5.
            #[serde(default)]
            shard: Option<ParamShard>,
        }
        const FIELDS: &[&str] = &[
            "fqn",
            "forward_arg",
            "grad_output",
            "shape",
            "dtype",
            "device",
            "requires_grad",
            "tied_to",
            "buffer",
            "shard",
        ];
        /// Hands the fields the file holds to `Stored`, whose missing ones default.
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Stored;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a parameter")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Stored, A::Error> {
                Stored::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Stored, A::Error> {
                Stored::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        let stored_fields = if crate::trace::reading_legacy_params() {
            8
        } else if crate::trace::reading_unsharded_params() {
            9
        } else {
            FIELDS.len()
        };
        let s = d.deserialize_struct("Param", &FIELDS[..stored_fields], Fields)?;
        Ok(Param {
            fqn: s.fqn,
            forward_arg: s.forward_arg,
            grad_output: s.grad_output,
            shape: s.shape,
            dtype: s.dtype,
            device: s.device,
            requires_grad: s.requires_grad,
            tied_to: s.tied_to,
            buffer: s.buffer,
            shard: s.shard,
        })
    }
}

/// What a training step needs: forward, backward, and their contract.
///
/// The contract is Thunder's: the forward returns `(outputs, (saved, ()))`; the backward takes
/// `(saved_for_backward, cotangents)` and returns one gradient (or `None`) per forward argument.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// The forward trace (an empty placeholder for a lone trace: see [`Program::lone`]).
    pub forward: Trace,
    /// The backward trace (or the lone trace).
    pub backward: Trace,
    /// The parameters and buffers, in the module's order.
    pub params: Vec<Param>,
    /// Rank whose parameters every rank takes before the first step (`None`: no broadcast).
    pub broadcast_from: Option<usize>,
}

/// Why a forward and a backward do not make a program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    /// The backward returns something other than a tuple (or list) of gradients.
    #[error("the backward trace must return a tuple of gradients, one per forward argument; it returns something else")]
    BackwardReturnNotTuple,
    /// The backward returns more or fewer gradients than the forward takes arguments.
    #[error("the forward takes {forward} arguments but the backward returns {backward} gradients")]
    GradientCount {
        /// The forward's argument count.
        forward: usize,
        /// The backward's gradient count.
        backward: usize,
    },
    /// A parameter (or buffer) argument is not a tensor.
    #[error("forward argument `{name}` is a parameter but has type {ty}, not a tensor")]
    ParamNotTensor {
        /// The argument's name in the forward.
        name: String,
        /// Its type, as printed.
        ty: String,
    },
    /// The forward saves a different number of values than the backward unpacks.
    #[error("the forward returns {forward} saved values but the backward unpacks {backward}")]
    SavedCount {
        /// Values the forward saves for the backward.
        forward: usize,
        /// Values the backward unpacks.
        backward: usize,
    },
    /// A forward argument the prologue does not provide: the traces are not from one run.
    #[error("forward argument `{name}` is not among the values the prologue returns")]
    NotInPrologue {
        /// The argument's name in the forward.
        name: String,
    },
    /// A tie names a parameter the forward does not take.
    #[error("tie {group:?}: `{fqn}` is not a parameter the forward takes")]
    TieUnknown {
        /// The tie group, as given.
        group: Vec<String>,
        /// The name that is not a parameter.
        fqn: String,
    },
    /// Tied parameters differ in shape, dtype or device, so they cannot be one tensor.
    #[error("tie {group:?}: `{a}` is {a_ty} but `{b}` is {b_ty}; tied parameters are one tensor")]
    TieMismatch {
        /// The tie group, as given.
        group: Vec<String>,
        /// The group's first parameter in the module's order, the one the others are tied to.
        a: String,
        /// Its type, as printed.
        a_ty: String,
        /// The parameter that differs from it.
        b: String,
        /// Its type, as printed.
        b_ty: String,
    },
    /// A gradient's shape is not its parameter's.
    #[error("gradient {index} (`{name}`) has type {ty} but parameter `{param}` is {param_ty}")]
    GradientType {
        /// Its position in the backward's return tuple.
        index: usize,
        /// The gradient's name in the backward.
        name: String,
        /// The gradient's type, as printed.
        ty: String,
        /// The parameter's fqn.
        param: String,
        /// The parameter's type, as printed.
        param_ty: String,
    },
}

/// Thunder names parameters `t_<fqn with . replaced by _>`; this reverses it as well as it can.
/// Only for traces that come without a prologue: the name is lossy (`.` and `_` both become
/// `_`) and some parameters have no prefix at all. [`Program::from_prologue`] is exact.
pub fn fqn_from_arg_name(name: &str) -> Option<String> {
    name.strip_prefix("t_").map(|s| s.replace('_', "."))
}

/// The form a module path takes in a Thunder argument name.
pub fn arg_name_for_fqn(fqn: &str) -> String {
    format!("t_{}", fqn.replace('.', "_"))
}

impl Program {
    /// Pairs a forward and a backward in Thunder's convention: forward arguments named `t_<fqn>`
    /// are parameters, the rest are inputs; the backward returns their gradients in argument order.
    pub fn from_thunder(mut forward: Trace, mut backward: Trace) -> Result<Program, ProgramError> {
        forward.kind = TraceKind::Forward;
        backward.kind = TraceKind::Backward;
        let grads = match &backward.ret {
            Arg::Tuple(items) | Arg::List(items) => items.clone(),
            _ => return Err(ProgramError::BackwardReturnNotTuple),
        };
        if grads.len() != forward.args().len() {
            return Err(ProgramError::GradientCount {
                forward: forward.args().len(),
                backward: grads.len(),
            });
        }
        let mut params = Vec::new();
        for (i, a) in forward.args().iter().enumerate() {
            let v = forward
                .value(*a)
                .expect("forward args are in its value table");
            let Some(fqn) = fqn_from_arg_name(v.name) else {
                continue;
            };
            let Type::Tensor(tt) = &v.ty else {
                return Err(ProgramError::ParamNotTensor {
                    name: v.name.to_string(),
                    ty: v.ty.to_string(),
                });
            };
            let grad_output = match &grads[i] {
                Arg::Value(g) => {
                    if let Some(gt) = backward.ty(*g) {
                        if gt.as_tensor().map(|g| &g.shape) != Some(&tt.shape) {
                            return Err(ProgramError::GradientType {
                                index: i,
                                name: backward.name(*g),
                                ty: gt.to_string(),
                                param: fqn,
                                param_ty: tt.to_string(),
                            });
                        }
                    }
                    Some(i)
                }
                _ => None,
            };
            params.push(Param {
                fqn,
                forward_arg: i,
                grad_output,
                shape: tt.shape.to_vec(),
                dtype: tt.dtype,
                device: tt.device,
                requires_grad: grad_output.is_some(),
                tied_to: None,
                buffer: false,
                shard: None,
            });
        }
        let p = Program {
            forward,
            backward,
            params,
            broadcast_from: None,
        };
        let (f, b) = (p.forward_saved().len(), p.backward_saved().len());
        if f != b {
            return Err(ProgramError::SavedCount {
                forward: f,
                backward: b,
            });
        }
        Ok(p)
    }

    /// Pairs a forward and a backward using Thunder's prologue: parameters and buffers are
    /// what the prologue fetches from the module, by their PyTorch names, with `requires_grad`
    /// from its metadata checks; every other argument is data. `ties` lists groups of parameter
    /// names that are one tensor (from `export.json`); the first of each group in the
    /// prologue's order (PyTorch's `named_parameters()`) is the one the others are tied to.
    pub fn from_prologue(
        mut forward: Trace,
        mut backward: Trace,
        prologue: &crate::prologue::Prologue,
        ties: &[Vec<String>],
    ) -> Result<Program, ProgramError> {
        use crate::prologue::TensorKind;
        forward.kind = TraceKind::Forward;
        backward.kind = TraceKind::Backward;
        let grads = match &backward.ret {
            Arg::Tuple(items) | Arg::List(items) => items.clone(),
            _ => return Err(ProgramError::BackwardReturnNotTuple),
        };
        if grads.len() != forward.args().len() {
            return Err(ProgramError::GradientCount {
                forward: forward.args().len(),
                backward: grads.len(),
            });
        }
        let mut params = Vec::new();
        for (i, a) in forward.args().iter().enumerate() {
            let v = forward
                .value(*a)
                .expect("forward args are in its value table");
            if !prologue.returns.iter().any(|r| r == v.name) {
                return Err(ProgramError::NotInPrologue {
                    name: v.name.to_string(),
                });
            }
            let Some(mt) = prologue.tensor(v.name) else {
                continue; // data
            };
            let Type::Tensor(tt) = &v.ty else {
                return Err(ProgramError::ParamNotTensor {
                    name: v.name.to_string(),
                    ty: v.ty.to_string(),
                });
            };
            let grad_output = match &grads[i] {
                Arg::Value(g) => {
                    if let Some(gt) = backward.ty(*g) {
                        if gt.as_tensor().map(|g| &g.shape) != Some(&tt.shape) {
                            return Err(ProgramError::GradientType {
                                index: i,
                                name: backward.name(*g),
                                ty: gt.to_string(),
                                param: mt.fqn.clone(),
                                param_ty: tt.to_string(),
                            });
                        }
                    }
                    Some(i)
                }
                _ => None,
            };
            let buffer = mt.kind != TensorKind::Parameter;
            params.push(Param {
                fqn: mt.fqn.clone(),
                forward_arg: i,
                grad_output,
                shape: tt.shape.to_vec(),
                dtype: tt.dtype,
                device: tt.device,
                requires_grad: !buffer && mt.requires_grad.unwrap_or(false),
                tied_to: None,
                buffer,
                shard: None,
            });
        }
        let order = |fqn: &str| prologue.tensors.iter().position(|t| t.fqn == fqn);
        for group in ties {
            let mut members: Vec<usize> = Vec::new();
            let mut unread = None;
            for fqn in group {
                match params.iter().position(|p| &p.fqn == fqn && !p.buffer) {
                    Some(i) => members.push(i),
                    // fetched by the prologue but not passed to the forward: nothing to tie
                    None if order(fqn).is_some() => continue,
                    None => unread = unread.or(Some(fqn)),
                }
            }
            // a name neither fetched nor passed is one the model never reads the tensor by
            // (T5's `encoder.embed_tokens.weight` is read as `shared.weight`): harmless when
            // the forward takes the tensor under another name of the group, an error otherwise
            if let (Some(fqn), true) = (unread, members.is_empty()) {
                return Err(ProgramError::TieUnknown {
                    group: group.clone(),
                    fqn: fqn.clone(),
                });
            }
            members.sort_by_key(|i| order(&params[*i].fqn));
            let Some((&primary, rest)) = members.split_first() else {
                continue;
            };
            for &m in rest {
                let (a, b) = (&params[primary], &params[m]);
                if a.shape != b.shape || a.dtype != b.dtype || a.device != b.device {
                    let ty =
                        |p: &Param| Type::tensor(p.shape.clone(), p.dtype, p.device).to_string();
                    return Err(ProgramError::TieMismatch {
                        group: group.clone(),
                        a: a.fqn.clone(),
                        a_ty: ty(a),
                        b: b.fqn.clone(),
                        b_ty: ty(b),
                    });
                }
                let primary_fqn = params[primary].fqn.clone();
                params[m].tied_to = Some(primary_fqn);
            }
        }
        let p = Program {
            forward,
            backward,
            params,
            broadcast_from: None,
        };
        let (f, b) = (p.forward_saved().len(), p.backward_saved().len());
        if f != b {
            return Err(ProgramError::SavedCount {
                forward: f,
                backward: b,
            });
        }
        Ok(p)
    }

    /// Forward arguments that are data (neither parameter nor buffer), by name.
    pub fn data_inputs(&self) -> Vec<(usize, String)> {
        let params: std::collections::HashSet<usize> =
            self.params.iter().map(|p| p.forward_arg).collect();
        self.forward
            .args()
            .iter()
            .enumerate()
            .filter(|(i, _)| !params.contains(i))
            .map(|(i, a)| (i, self.forward.name(*a)))
            .collect()
    }

    /// The values the forward saves for the backward (the first tuple of its second result).
    pub fn forward_saved(&self) -> Vec<ValueId> {
        let mut out = Vec::new();
        if let Arg::Tuple(items) = &self.forward.ret {
            if let Some(Arg::Tuple(saved)) = items.get(1) {
                if let Some(first) = saved.first() {
                    first.for_each_value(&mut |v| out.push(v));
                }
            }
        }
        out
    }

    /// The names the backward gives the saved values (unpacked from its first argument).
    pub fn backward_saved(&self) -> Vec<ValueId> {
        let b = &self.backward;
        let Some(&saved_arg) = b.args().first() else {
            return Vec::new();
        };
        let unpack_of = |src: ValueId| {
            b.nodes()
                .find(|(_, n)| {
                    n.op == ops::UNPACK_SEQUENCE
                        && n.lhs == Lhs::Unpack
                        && n.args.first().and_then(Arg::as_value) == Some(src)
                })
                .map(|(_, n)| n.outputs.clone())
        };
        let Some(top) = unpack_of(saved_arg) else {
            return Vec::new();
        };
        top.first()
            .and_then(|c0| unpack_of(*c0))
            .unwrap_or_default()
    }

    /// Trainable parameters (not buffers, `requires_grad`) whose tensor the backward returns no
    /// gradient for, in parameter order: the loss never reaches them, which the trace proves.
    /// A tie is one tensor: its members are unused only if none of them gets a gradient.
    /// PyTorch leaves such a `.grad` as `None`; the trainer leaves the parameter as it is.
    pub fn unused_params(&self) -> Vec<&str> {
        let grads = self.gradient_values();
        let primary =
            |x: &'_ Param| -> String { x.tied_to.clone().unwrap_or_else(|| x.fqn.clone()) };
        let with_grad: std::collections::HashSet<String> = self
            .params
            .iter()
            .filter(|x| {
                x.grad_output
                    .and_then(|i| grads.get(i).copied().flatten())
                    .is_some()
            })
            .map(primary)
            .collect();
        self.params
            .iter()
            .filter(|x| x.requires_grad && !x.buffer && !with_grad.contains(&primary(x)))
            .map(|x| x.fqn.as_str())
            .collect()
    }

    /// The backward's gradient output values, one per forward argument (`None` where none).
    pub fn gradient_values(&self) -> Vec<Option<ValueId>> {
        match &self.backward.ret {
            Arg::Tuple(items) | Arg::List(items) => items.iter().map(Arg::as_value).collect(),
            _ => Vec::new(),
        }
    }

    /// A program around a lone trace (no forward, no parameter metadata): the trace sits in the
    /// `backward` slot, which is the one passes rewrite.
    pub fn lone(trace: Trace) -> Program {
        Program {
            forward: Trace::new("", TraceKind::Forward),
            backward: trace,
            params: Vec::new(),
            broadcast_from: None,
        }
    }
    /// True for a program made by `lone`.
    pub fn is_lone(&self) -> bool {
        self.forward.name.is_empty() && self.forward.node_count() == 0 && self.params.is_empty()
    }

    /// The parameter named `fqn`.
    pub fn param(&self, fqn: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.fqn == fqn)
    }
}

/// What a tracepass file holds: one trace, or a whole program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)] // one per file: boxing buys nothing
pub enum Module {
    /// A single trace (a `.trace` file, or any trace on its own).
    Trace(Trace),
    /// Forward, backward and parameters.
    Program(Program),
}

impl Module {
    /// The program a module is: itself, or a lone trace as [`Program::lone`] makes it (with
    /// whether it was one), as a pass driver runs either.
    pub fn into_program(self) -> (Program, bool) {
        match self {
            Module::Program(p) => (p, false),
            Module::Trace(t) => (Program::lone(t), true),
        }
    }
}
