//! The model a trainer runs: a forward/backward program, which forward argument is a
//! parameter, a buffer or data, how its output becomes a loss, and which buffers the forward
//! updates. The seed example's Thunder traces are built into the binary.

use crate::exec::executor::RValue;
use crate::train::buffer_updates::{buffer_updates, BufferUpdate};
use std::path::PathBuf;
use tracepass_ir::{parse_trace, synth, Arg, Program, TensorType, Trace, ValueId};

/// Thunder's export of the seed model (testdata/thunder/mlp), final forward and backward.
pub const SEED_FORWARD: &str = include_str!("../../../testdata/thunder/mlp/forward.trace");
pub const SEED_BACKWARD: &str = include_str!("../../../testdata/thunder/mlp/backward.trace");

/// Where the traces come from.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSource {
    /// The seed example: Linear(32,64) -> tanh GELU -> Linear(64,4), from Thunder's traces.
    Seed,
    /// A forward and a backward trace file (Thunder's export convention), each `.trace`, `.tpb`
    /// or `.json` (a program file stands for its forward or its backward).
    Files { forward: PathBuf, backward: PathBuf },
    /// A whole program, already loaded (`tracepass pack`, `opt -o prog.tpb`).
    Program(Box<Program>),
    /// An export directory (`forward.trace`, `backward.trace`, `prologue.trace`,
    /// `params.safetensors`, `data.safetensors`, `export.json`).
    Export(PathBuf),
    /// `layers` x [Linear(width, width), tanh GELU], generated in Thunder's export shape.
    DeepMlp {
        layers: usize,
        width: usize,
        batch: usize,
    },
}

/// How the model output becomes the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossKind {
    /// The seed's `F.cross_entropy(y, out)`: y is the input (logits), out the soft target.
    SeedCrossEntropy,
    /// `F.cross_entropy(out.view(-1, C), targets.view(-1))`: integer class targets over any
    /// leading dims, mean over the targets that are not `ignore_index` (PyTorch's -100).
    CrossEntropy { ignore_index: i64 },
    /// `F.mse_loss(out, targets)`: mean of the squared differences.
    Mse,
    /// `out.sum()`.
    Sum,
    /// The model output is the loss already (a scalar).
    Output,
}

impl LossKind {
    /// The loss `export.json` names.
    pub fn from_export(name: &str) -> Result<LossKind, String> {
        match name {
            "cross_entropy" => Ok(LossKind::CrossEntropy { ignore_index: -100 }),
            "mse" => Ok(LossKind::Mse),
            "sum" => Ok(LossKind::Sum),
            "output" => Ok(LossKind::Output),
            other => Err(format!(
                "unknown loss `{other}` (valid: cross_entropy, mse, sum, output)"
            )),
        }
    }
    /// Whether the loss reads a targets tensor.
    pub fn needs_targets(self) -> bool {
        matches!(
            self,
            LossKind::SeedCrossEntropy | LossKind::CrossEntropy { .. } | LossKind::Mse
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{what}: {message}")]
    Load { what: String, message: String },
    #[error("the forward trace's output could not be found: it must return `({{'output': (out,), ...}}, (saved, ()))` or `(out, ...)`")]
    NoOutput,
    #[error("the forward has no model output {index} (export.json `output`)")]
    NoOutputAt { index: usize },
    #[error(
        "forward argument `{name}` is neither a parameter (`t_<module path>`) nor the input `x`"
    )]
    UnknownInput { name: String },
    #[error("{0}")]
    Export(String),
    #[error("forward argument `{name}` has type {ty}; inputs must be tensors")]
    InputNotTensor { name: String, ty: String },
}

/// A forward argument that is data: a batch tensor the data source gives each step.
#[derive(Clone, Debug, PartialEq)]
pub struct DataArg {
    /// Its position among the forward's arguments.
    pub position: usize,
    /// Its name in the forward's signature (`idx`, `input_ids`, `x`): the data file's key.
    pub name: String,
    /// Its shape and dtype.
    pub ty: TensorType,
}

/// What the trainer feeds the backward for one model output.
#[derive(Clone, Debug, PartialEq)]
pub enum Cotangent {
    /// The loss's gradient: the output the loss reads (`export.json`'s `output`).
    Loss,
    /// Zeros of this type: an output the loss does not read (an encoder state returned next to
    /// the logits), which contributes nothing to the gradients.
    Zeros(TensorType),
    /// `None`: an output that is not a tensor.
    Absent,
}

/// A loaded model: the plain (unsynchronized) program plus what the trainer needs to feed it.
#[derive(Clone, Debug)]
pub struct Model {
    pub program: Program,
    pub output: ValueId,
    /// One entry per model output, in the forward's order: the backward's cotangents.
    pub cotangents: Vec<Cotangent>,
    /// The data arguments, in forward-argument order (every argument that is not a parameter
    /// or a buffer).
    pub data_args: Vec<DataArg>,
    pub loss: LossKind,
    /// The targets' name in a data file (`targets`; `y` for the seed's soft targets).
    pub targets: String,
    /// Buffers the forward updates, carried to the next forward.
    pub buffer_updates: Vec<BufferUpdate>,
    /// Groups of parameters that are one tensor (indices into `program.params`, the primary
    /// first): their gradients add up at the primary, and every member takes its value.
    pub ties: Vec<Vec<usize>>,
    /// The export's own parameters and data files, used when no other is given.
    pub default_params: Option<PathBuf>,
    pub default_data: Option<PathBuf>,
    /// The world size an export's backward already holds Thunder's DDP for.
    pub exported_world_size: Option<usize>,
    pub description: String,
}

/// The forward's model output: `{'output': (out,)}` in Thunder's dict, or the first returned value.
pub fn forward_output(forward: &Trace) -> Option<ValueId> {
    forward_output_at(forward, 0)
}

/// The forward's `index`-th model output: `{'output': (out0, out1, ...)}` in Thunder's dict,
/// or the first returned value for index 0.
pub fn forward_output_at(forward: &Trace, index: usize) -> Option<ValueId> {
    let first = match &forward.ret {
        Arg::Tuple(items) | Arg::List(items) => items.first()?,
        other => other,
    };
    let pick = |a: &Arg| -> Option<ValueId> {
        match a {
            Arg::Value(v) if index == 0 => Some(*v),
            Arg::Tuple(x) | Arg::List(x) => x.get(index).and_then(Arg::as_value),
            _ => None,
        }
    };
    match first {
        Arg::Dict(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some("output"))
            .and_then(|(_, v)| pick(v)),
        other => pick(other),
    }
}

/// The forward's model outputs, in order: the members of `{'output': (out0, out1, ...)}` in
/// Thunder's dict, or the first returned value alone.
pub fn forward_output_args(forward: &Trace) -> Vec<Arg> {
    let first = match &forward.ret {
        Arg::Tuple(items) | Arg::List(items) => match items.first() {
            Some(a) => a,
            None => return Vec::new(),
        },
        other => other,
    };
    let members = |a: &Arg| match a {
        Arg::Tuple(x) | Arg::List(x) => x.clone(),
        other => vec![other.clone()],
    };
    match first {
        Arg::Dict(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some("output"))
            .map(|(_, v)| members(v))
            .unwrap_or_default(),
        other => members(other),
    }
}

/// What the backward takes for each model output when the loss reads output `index`.
pub fn cotangents_for(forward: &Trace, index: usize) -> Vec<Cotangent> {
    forward_output_args(forward)
        .iter()
        .enumerate()
        .map(|(i, a)| {
            if i == index {
                return Cotangent::Loss;
            }
            match a
                .as_value()
                .and_then(|v| forward.ty(v))
                .and_then(|t| t.as_tensor())
            {
                Some(t) => Cotangent::Zeros(t.clone()),
                None => Cotangent::Absent,
            }
        })
        .collect()
}

fn parse(what: &str, text: &str) -> Result<Trace, ModelError> {
    parse_trace(text).map_err(|e| ModelError::Load {
        what: what.to_string(),
        message: e.to_string(),
    })
}

/// What an export directory adds to its program: the loss, the output, the files.
struct ExportParts {
    output_index: usize,
    targets: String,
    params: PathBuf,
    data: PathBuf,
    world_size: Option<usize>,
}

/// A floor of the bytes a deep MLP takes to build and train (`None` past u64): its f32
/// parameters, the activations a layer saves (its input and four GELU values), and the traces'
/// nodes (at least [`DEEP_MLP_IR_BYTES_PER_LAYER`] a layer).
fn deep_mlp_bytes(layers: usize, width: usize, batch: usize) -> Option<u64> {
    let (l, w, b) = (layers as u64, width as u64, batch as u64);
    let params = w.checked_mul(w)?.checked_add(w)?;
    let saved = b.checked_mul(w)?.checked_mul(5)?;
    let per_layer = params
        .checked_add(saved)?
        .checked_mul(4)?
        .checked_add(DEEP_MLP_IR_BYTES_PER_LAYER)?;
    l.checked_mul(per_layer)
}

/// The forward and backward of one deep-MLP layer hold about 30 nodes with their types and
/// names; measured at tens of KiB a layer with the plans, so 4 KiB is a floor.
const DEEP_MLP_IR_BYTES_PER_LAYER: u64 = 4096;

fn load_err(what: impl Into<String>, message: impl ToString) -> ModelError {
    ModelError::Load {
        what: what.into(),
        message: message.to_string(),
    }
}

impl Model {
    pub fn load(source: &ModelSource) -> Result<Model, ModelError> {
        let mut export = None;
        let (program, loss, description) = match source {
            ModelSource::Seed => {
                let f = parse("built-in seed forward", SEED_FORWARD)?;
                let b = parse("built-in seed backward", SEED_BACKWARD)?;
                let p = Program::from_thunder(f, b).map_err(|e| load_err("seed program", e))?;
                (
                    p,
                    LossKind::SeedCrossEntropy,
                    "seed MLP (Thunder traces)".to_string(),
                )
            }
            ModelSource::Files { forward, backward } => {
                let read = |p: &PathBuf, forward: bool| {
                    let m = tracepass_ir::fsio::load(p)
                        .map_err(|e| load_err(p.display().to_string(), e))?;
                    Ok::<_, ModelError>(match m {
                        tracepass_ir::Module::Trace(t) => t,
                        tracepass_ir::Module::Program(p) if forward => p.forward,
                        tracepass_ir::Module::Program(p) => p.backward,
                    })
                };
                let (f, b) = (read(forward, true)?, read(backward, false)?);
                let p = Program::from_thunder(f, b).map_err(|e| {
                    load_err(format!("{} + {}", forward.display(), backward.display()), e)
                })?;
                (
                    p,
                    LossKind::SeedCrossEntropy,
                    format!("traces {}", forward.display()),
                )
            }
            ModelSource::Program(p) => {
                if p.is_lone() || p.params.is_empty() {
                    return Err(load_err("the program", "it has no forward or no parameters; pair a forward with its backward (tracepass pack FORWARD BACKWARD -o prog.tpb)"));
                }
                (
                    (**p).clone(),
                    LossKind::SeedCrossEntropy,
                    "program file".to_string(),
                )
            }
            ModelSource::Export(dir) => {
                let e = tracepass_ir::load_export(dir)
                    .map_err(|e| load_err(dir.display().to_string(), e))?;
                let loss = LossKind::from_export(&e.info.loss)
                    .map_err(|m| load_err(dir.join("export.json").display().to_string(), m))?;
                let description = format!("export {} ({})", e.info.model, dir.display());
                export = Some(ExportParts {
                    output_index: e.info.output,
                    targets: e.info.targets.clone(),
                    params: e.file("params.safetensors"),
                    data: e.file("data.safetensors"),
                    world_size: e.info.world_size,
                });
                (e.program, loss, description)
            }
            ModelSource::DeepMlp {
                layers,
                width,
                batch,
            } => {
                // the trace is built before any other check: count first, then build
                crate::train::memory::check_fits(
                    "the model",
                    deep_mlp_bytes(*layers, *width, *batch),
                )
                .map_err(|m| load_err(format!("deep-mlp:{layers},{width},{batch}"), m))?;
                let spec = synth::MlpSpec::deep(*layers, *width, *batch);
                let p = synth::mlp_program(&spec).map_err(|e| load_err("deep MLP", e))?;
                (
                    p,
                    LossKind::Sum,
                    format!("deep MLP {layers} x Linear({width},{width}) + GELU, batch {batch}"),
                )
            }
        };
        let program = crate::exec::unrunnable::expand_program(program)
            .map_err(|m| load_err(description.clone(), m))?;
        let output_index = export.as_ref().map_or(0, |e| e.output_index);
        let output =
            forward_output_at(&program.forward, output_index).ok_or(if output_index == 0 {
                ModelError::NoOutput
            } else {
                ModelError::NoOutputAt {
                    index: output_index,
                }
            })?;
        // an export's or a program file's parameters are named by metadata (the prologue), so
        // every other argument is data; loose traces keep the seed's convention (one input `x`)
        let cotangents = cotangents_for(&program.forward, output_index);
        let named = export.is_some() || matches!(source, ModelSource::Program(_));
        let data_args = data_args(&program, named)?;
        let buffer_updates = buffer_updates(&program).map_err(ModelError::Export)?;
        let ties = ties(&program).map_err(ModelError::Export)?;
        Ok(Model {
            output,
            cotangents,
            data_args,
            loss,
            targets: export
                .as_ref()
                .map_or_else(|| "y".to_string(), |e| e.targets.clone()),
            buffer_updates,
            ties,
            default_params: export.as_ref().map(|e| e.params.clone()),
            default_data: export.as_ref().map(|e| e.data.clone()),
            exported_world_size: export.as_ref().and_then(|e| e.world_size),
            program,
            description,
        })
    }

    /// The model with another loss (`--loss`) and targets name (`--targets`); a loss other
    /// than the seed's reads `targets` unless told otherwise.
    pub fn with_loss(mut self, loss: Option<LossKind>, targets: Option<&str>) -> Model {
        if let Some(l) = loss {
            if self.loss == LossKind::SeedCrossEntropy && l != LossKind::SeedCrossEntropy {
                self.targets = "targets".into();
            }
            self.loss = l;
        }
        if let Some(t) = targets {
            self.targets = t.to_string();
        }
        self
    }

    /// The backward's `cotangents` argument: `loss_grad` for the output the loss reads, zeros
    /// (made by `zeros`) for every other tensor output, `None` for the rest.
    pub fn cotangent_values<T>(
        &self,
        loss_grad: T,
        zeros: impl FnMut(&TensorType) -> Result<T, String>,
    ) -> Result<RValue<T>, String> {
        let mut out = Vec::with_capacity(self.cotangents.len().max(1));
        self.cotangent_values_into(loss_grad, zeros, &mut out)?;
        Ok(RValue::Seq(out))
    }

    /// [`Model::cotangent_values`]' list, into `out` (emptied first: a list kept from step to
    /// step).
    pub fn cotangent_values_into<T>(
        &self,
        loss_grad: T,
        mut zeros: impl FnMut(&TensorType) -> Result<T, String>,
        out: &mut Vec<RValue<T>>,
    ) -> Result<(), String> {
        out.clear();
        let mut loss_grad = Some(loss_grad);
        for c in &self.cotangents {
            out.push(match c {
                Cotangent::Loss => match loss_grad.take() {
                    Some(g) => RValue::Tensor(g),
                    None => return Err("two model outputs are marked as the loss's".into()),
                },
                Cotangent::Zeros(t) => RValue::Tensor(zeros(t)?),
                Cotangent::Absent => RValue::None,
            });
        }
        // a program built without model outputs in Thunder's dict takes the one gradient
        if let Some(g) = loss_grad {
            out.clear();
            out.push(RValue::Tensor(g));
        }
        Ok(())
    }

    /// Shape and dtype of the model output.
    pub fn output_type(&self) -> Option<TensorType> {
        self.program
            .forward
            .ty(self.output)
            .and_then(|t| t.as_tensor())
            .cloned()
    }

    /// The parameters' module paths (`l1.weight`, ...), in parameter order.
    pub fn param_names(&self) -> Vec<String> {
        self.program.params.iter().map(|p| p.fqn.clone()).collect()
    }

    /// The parameters' shapes, in parameter order.
    pub fn param_shapes(&self) -> Vec<Vec<usize>> {
        self.program
            .params
            .iter()
            .map(|p| p.shape.clone())
            .collect()
    }

    /// The forward's arguments in signature order: the data (one per [`DataArg`]) and the
    /// parameters and buffers.
    pub fn forward_inputs<T: Clone>(
        &self,
        data: impl IntoIterator<Item = T>,
        params: &[T],
    ) -> Vec<RValue<T>> {
        let mut inputs = Vec::new();
        self.forward_inputs_into(data, params, &mut inputs);
        inputs
    }

    /// [`Model::forward_inputs`] into `inputs` (emptied first: a list kept from step to step).
    pub fn forward_inputs_into<T: Clone>(
        &self,
        data: impl IntoIterator<Item = T>,
        params: &[T],
        inputs: &mut Vec<RValue<T>>,
    ) {
        inputs.clear();
        inputs.resize(self.program.forward.args().len(), RValue::None);
        for (a, t) in self.data_args.iter().zip(data) {
            inputs[a.position] = RValue::Tensor(t);
        }
        for (p, t) in self.program.params.iter().zip(params) {
            inputs[p.forward_arg] = RValue::Tensor(t.clone());
        }
    }

    /// Per parameter, its gradient among the backward's results (`None`: no gradient), with
    /// the ties' gradients added up ([`Model::sum_ties`]).
    pub fn param_grads<T: Clone>(
        &self,
        results: &[RValue<T>],
        add: impl Fn(&T, &T) -> Result<T, String>,
    ) -> Result<Vec<Option<T>>, String> {
        self.sum_ties(self.raw_param_grads(results), add)
    }

    /// Per parameter (in `program.params` order): whether the backward never gives it a
    /// gradient although it is trainable ([`Program::unused_params`]): no update, no optimizer
    /// state, and files say it had no gradient.
    pub fn unused_mask(&self) -> Vec<bool> {
        let unused = self.program.unused_params();
        self.program
            .params
            .iter()
            .map(|p| unused.contains(&p.fqn.as_str()))
            .collect()
    }

    /// Per parameter, its gradient among the backward's results as the backward returns it.
    pub fn raw_param_grads<T: Clone>(&self, results: &[RValue<T>]) -> Vec<Option<T>> {
        let mut grads = Vec::with_capacity(self.program.params.len());
        self.raw_param_grads_into(results, &mut grads);
        grads
    }

    /// [`Model::raw_param_grads`] into `grads` (emptied first: a list kept from step to step).
    pub fn raw_param_grads_into<T: Clone>(
        &self,
        results: &[RValue<T>],
        grads: &mut Vec<Option<T>>,
    ) {
        grads.clear();
        grads.extend(self.program.params.iter().map(|p| {
            p.grad_output
                .and_then(|i| results.get(i).cloned())
                .and_then(RValue::tensor)
        }));
    }

    /// The members of a tie are one tensor: their gradients are added at the primary (the
    /// others get `None`), and [`Model::share_ties`] copies the primary's update to them.
    pub fn sum_ties<T>(
        &self,
        mut grads: Vec<Option<T>>,
        add: impl Fn(&T, &T) -> Result<T, String>,
    ) -> Result<Vec<Option<T>>, String> {
        self.sum_ties_in_place(&mut grads, add)?;
        Ok(grads)
    }

    /// [`Model::sum_ties`] in the caller's list.
    pub fn sum_ties_in_place<T>(
        &self,
        grads: &mut [Option<T>],
        add: impl Fn(&T, &T) -> Result<T, String>,
    ) -> Result<(), String> {
        for group in &self.ties {
            let mut sum: Option<T> = None;
            for &i in group {
                if let Some(g) = grads[i].take() {
                    sum = Some(match sum {
                        None => g,
                        Some(s) => add(&s, &g)?,
                    });
                }
            }
            grads[group[0]] = sum;
        }
        Ok(())
    }

    /// Lets the tie members other than the primary drop their share of its storage (each
    /// becomes an empty tensor until [`Model::share_ties`]), so that the optimizer updates the
    /// primary in place: a shared buffer is copied on write, a whole embedding every step.
    pub fn release_ties(&self, params: &mut [crate::tensor::Tensor]) {
        // one empty tensor for all of them: a step makes no tensor here
        static RELEASED: std::sync::OnceLock<crate::tensor::Tensor> = std::sync::OnceLock::new();
        let released = RELEASED.get_or_init(|| crate::tensor::Tensor::from_f32([0], Vec::new()));
        for group in &self.ties {
            for &i in &group[1..] {
                params[i] = released.clone();
            }
        }
    }

    /// Gives every tied parameter its primary's value (after an optimizer step).
    pub fn share_ties<T: Clone>(&self, params: &mut [T]) {
        for group in &self.ties {
            for &i in &group[1..] {
                params[i] = params[group[0]].clone();
            }
        }
    }

    /// Whether parameter `i` is trained: it needs a gradient and is not a buffer.
    pub fn trainable(&self, i: usize) -> bool {
        self.program
            .params
            .get(i)
            .is_some_and(|p| p.requires_grad && !p.buffer)
    }
}

/// The forward arguments that are neither parameters nor buffers. Without an export the seed
/// convention holds: the one input is `x`.
fn data_args(program: &Program, from_export: bool) -> Result<Vec<DataArg>, ModelError> {
    let mut out = Vec::new();
    let params: std::collections::HashSet<usize> =
        program.params.iter().map(|p| p.forward_arg).collect();
    for (i, &a) in program.forward.args().iter().enumerate() {
        if params.contains(&i) {
            continue;
        }
        let name = program.forward.name(a);
        let ty = program.forward.ty(a).cloned();
        let Some(tt) = ty.as_ref().and_then(|t| t.as_tensor()) else {
            return Err(ModelError::InputNotTensor {
                name,
                ty: ty.map_or("unknown".into(), |t| t.to_string()),
            });
        };
        if !from_export && (name != "x" || !out.is_empty()) {
            return Err(ModelError::UnknownInput { name });
        }
        out.push(DataArg {
            position: i,
            name,
            ty: tt.clone(),
        });
    }
    if out.is_empty() && !from_export {
        return Err(ModelError::UnknownInput {
            name: "x (missing)".into(),
        });
    }
    Ok(out)
}

/// The program's ties as index groups, the primary (the parameter others are `tied_to`) first.
fn ties(program: &Program) -> Result<Vec<Vec<usize>>, String> {
    let params = &program.params;
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, p) in params.iter().enumerate() {
        let Some(primary) = &p.tied_to else { continue };
        let Some(j) = params.iter().position(|q| &q.fqn == primary) else {
            return Err(format!(
                "parameter `{}` is tied to `{primary}`, which is not a parameter of the model",
                p.fqn
            ));
        };
        if params[j].shape != p.shape || params[j].dtype != p.dtype {
            return Err(format!(
                "tied parameters `{}` {:?} {} and `{primary}` {:?} {} differ in shape or dtype",
                p.fqn, p.shape, p.dtype, params[j].shape, params[j].dtype
            ));
        }
        match groups.iter_mut().find(|g| g[0] == j) {
            Some(g) => g.push(i),
            None => groups.push(vec![j, i]),
        }
    }
    Ok(groups)
}
