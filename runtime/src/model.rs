//! The model a trainer runs: a forward/backward program, its inputs, and how its output becomes
//! a loss. The seed example's Thunder traces are built into the binary.

use crate::executor::RValue;
use std::path::PathBuf;
use tracepass_ir::{parse_trace, synth, Arg, DType, Program, TensorType, Trace, ValueId};

/// Thunder's export of the seed model (testdata/thunder/mlp), final forward and backward.
pub const SEED_FORWARD: &str = include_str!("../../testdata/thunder/mlp/forward.trace");
pub const SEED_BACKWARD: &str = include_str!("../../testdata/thunder/mlp/backward.trace");

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
    /// `out.sum()`.
    Sum,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{what}: {message}")]
    Load { what: String, message: String },
    #[error("the forward trace's output could not be found: it must return `({{'output': (out,), ...}}, (saved, ()))` or `(out, ...)`")]
    NoOutput,
    #[error(
        "forward argument `{name}` is neither a parameter (`t_<module path>`) nor the input `x`"
    )]
    UnknownInput { name: String },
    #[error("forward argument `{name}` has type {ty}; inputs must be tensors")]
    InputNotTensor { name: String, ty: String },
}

/// A loaded model: the plain (unsynchronized) program plus what the trainer needs to feed it.
#[derive(Clone, Debug)]
pub struct Model {
    pub program: Program,
    pub output: ValueId,
    /// The data input `x`: its position among the forward's arguments and its type.
    pub input: (usize, TensorType),
    pub loss: LossKind,
    pub description: String,
}

/// The forward's model output: `{'output': (out,)}` in Thunder's dict, or the first returned value.
pub fn forward_output(forward: &Trace) -> Option<ValueId> {
    let first = match &forward.ret {
        Arg::Tuple(items) | Arg::List(items) => items.first()?,
        other => other,
    };
    let pick = |a: &Arg| -> Option<ValueId> {
        match a {
            Arg::Value(v) => Some(*v),
            Arg::Tuple(x) | Arg::List(x) => x.first().and_then(Arg::as_value),
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

fn parse(what: &str, text: &str) -> Result<Trace, ModelError> {
    parse_trace(text).map_err(|e| ModelError::Load {
        what: what.to_string(),
        message: e.to_string(),
    })
}

impl Model {
    pub fn load(source: &ModelSource) -> Result<Model, ModelError> {
        let (program, loss, description) = match source {
            ModelSource::Seed => {
                let f = parse("built-in seed forward", SEED_FORWARD)?;
                let b = parse("built-in seed backward", SEED_BACKWARD)?;
                let p = Program::from_thunder(f, b).map_err(|e| ModelError::Load {
                    what: "seed program".into(),
                    message: e.to_string(),
                })?;
                (
                    p,
                    LossKind::SeedCrossEntropy,
                    "seed MLP (Thunder traces)".to_string(),
                )
            }
            ModelSource::Files { forward, backward } => {
                let read = |p: &PathBuf, forward: bool| {
                    let m = tracepass_ir::fsio::load(p).map_err(|e| ModelError::Load {
                        what: p.display().to_string(),
                        message: e.to_string(),
                    })?;
                    Ok::<_, ModelError>(match m {
                        tracepass_ir::Module::Trace(t) => t,
                        tracepass_ir::Module::Program(p) if forward => p.forward,
                        tracepass_ir::Module::Program(p) => p.backward,
                    })
                };
                let (f, b) = (read(forward, true)?, read(backward, false)?);
                let p = Program::from_thunder(f, b).map_err(|e| ModelError::Load {
                    what: format!("{} + {}", forward.display(), backward.display()),
                    message: e.to_string(),
                })?;
                (
                    p,
                    LossKind::SeedCrossEntropy,
                    format!("traces {}", forward.display()),
                )
            }
            ModelSource::Program(p) => {
                if p.is_lone() || p.params.is_empty() {
                    return Err(ModelError::Load {
                        what: "the program".into(),
                        message: "it has no forward or no parameters; pair a forward with its backward (tracepass pack FORWARD BACKWARD -o prog.tpb)".into(),
                    });
                }
                (
                    (**p).clone(),
                    LossKind::SeedCrossEntropy,
                    "program file".to_string(),
                )
            }
            ModelSource::DeepMlp {
                layers,
                width,
                batch,
            } => {
                let spec = synth::MlpSpec::deep(*layers, *width, *batch);
                let p = synth::mlp_program(&spec).map_err(|e| ModelError::Load {
                    what: "deep MLP".into(),
                    message: e.to_string(),
                })?;
                (
                    p,
                    LossKind::Sum,
                    format!("deep MLP {layers} x Linear({width},{width}) + GELU, batch {batch}"),
                )
            }
        };
        let output = forward_output(&program.forward).ok_or(ModelError::NoOutput)?;
        let mut input = None;
        for (i, &a) in program.forward.args().iter().enumerate() {
            if program.params.iter().any(|p| p.forward_arg == i) {
                continue;
            }
            let name = program.forward.name(a);
            let ty = program.forward.ty(a).cloned();
            match (name.as_str(), ty.as_ref().and_then(|t| t.as_tensor())) {
                ("x", Some(tt)) if input.is_none() => input = Some((i, tt.clone())),
                ("x", None) => {
                    return Err(ModelError::InputNotTensor {
                        name,
                        ty: ty.map_or("unknown".into(), |t| t.to_string()),
                    })
                }
                _ => return Err(ModelError::UnknownInput { name }),
            }
        }
        let input = input.ok_or_else(|| ModelError::UnknownInput {
            name: "x (missing)".into(),
        })?;
        Ok(Model {
            program,
            output,
            input,
            loss,
            description,
        })
    }

    /// Shape and dtype of the model output.
    pub fn output_type(&self) -> Option<TensorType> {
        self.program
            .forward
            .ty(self.output)
            .and_then(|t| t.as_tensor())
            .cloned()
    }

    pub fn dtype(&self) -> DType {
        self.input.1.dtype
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

    /// The forward's arguments in signature order: the batch `x` and the parameters.
    pub fn forward_inputs<T: Clone>(&self, x: T, params: &[T]) -> Vec<RValue<T>> {
        let mut inputs = vec![RValue::None; self.program.forward.args().len()];
        inputs[self.input.0] = RValue::Tensor(x);
        for (p, t) in self.program.params.iter().zip(params) {
            inputs[p.forward_arg] = RValue::Tensor(t.clone());
        }
        inputs
    }

    /// Per parameter, its gradient among the backward's results (`None`: no gradient).
    pub fn param_grads<T: Clone>(&self, results: &[RValue<T>]) -> Vec<Option<T>> {
        self.program
            .params
            .iter()
            .map(|p| {
                p.grad_output
                    .and_then(|i| results.get(i).cloned())
                    .and_then(RValue::tensor)
            })
            .collect()
    }
}
