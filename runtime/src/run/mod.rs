//! Runs one trace, or a forward and its backward, on named host tensors, the way
//! `mlir-cpu-runner` runs a module: what `tracepass run` does, and the tool for op-level tests
//! and for checking that a pass keeps a trace's numbers.
//!
//! Inputs are named as the trace names its arguments (`t_0`, `idx`); a collection argument
//! (`saved_for_backward`, `cotangents`) takes `NAME.0`, `NAME.1`, ... (nested: `NAME.0.2`), a
//! missing member being `None`. A single trace's outputs are the values it returns, each named
//! as the trace names it. A forward and backward pair takes the forward's arguments and
//! `cotangents.I` for the I-th output of the forward's `'output'` (zeros where absent: an output
//! the loss does not use), and gives `output.I` and `grad.ARG` for each forward argument the
//! backward returns a gradient for.

use crate::comm::Communicator;
use crate::exec::unrunnable::expand_unrunnable;
use crate::exec::{Backend, Clock, ExecError, Executor, Plan, PlanError, RValue, Recording};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use tracepass_ir::{Arg, Trace, Type, ValueId};

/// Why a run could not be done.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("{0}")]
    Exec(#[from] ExecError),
    #[error("trace `{trace}`: argument `{name}`: {message}")]
    Input {
        trace: String,
        name: String,
        message: String,
    },
    #[error("the {what} backend: {message}")]
    Device { what: &'static str, message: String },
    #[error("the forward and backward do not fit together: {0}")]
    Pair(String),
    /// Ops without a kernel whose printed decomposition could not be read.
    #[error("{0}")]
    Decomposition(String),
}

/// Named tensors, in name order.
pub type Named = BTreeMap<String, Tensor>;

/// The random stream of a run (dropout, `uniform`): one seed, rank 0, step 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    pub seed: u64,
}

fn device_err<B: Backend>(b: &B, e: impl std::fmt::Display) -> RunError {
    RunError::Device {
        what: b.name(),
        message: e.to_string(),
    }
}

/// The value an argument of type `ty` named `name` gets from `inputs`.
fn input_value<B: Backend>(
    backend: &B,
    trace: &Trace,
    name: &str,
    ty: &Type,
    inputs: &Named,
) -> Result<RValue<B::Tensor>, RunError> {
    let bad = |message: String| RunError::Input {
        trace: trace.name.clone(),
        name: name.to_string(),
        message,
    };
    match ty {
        Type::Collection => Ok(collection(backend, name, inputs)?),
        Type::Int(_) | Type::Float(_) | Type::Bool(_) => {
            let t = inputs
                .get(name)
                .ok_or_else(|| bad("no tensor of this name in the inputs".into()))?;
            match t.to_f64_vec().as_slice() {
                [x] => Ok(RValue::Scalar(*x)),
                _ => Err(bad(format!(
                    "a number is expected, the inputs hold a tensor of shape {:?}",
                    t.shape()
                ))),
            }
        }
        _ => match inputs.get(name) {
            Some(t) => Ok(RValue::Tensor(
                backend.upload(t).map_err(|e| device_err(backend, e))?,
            )),
            None if matches!(ty, Type::None) => Ok(RValue::None),
            None => Err(bad("no tensor of this name in the inputs".into())),
        },
    }
}

/// The collection `prefix` from the inputs named `prefix.I` (nested `prefix.I.J`).
fn collection<B: Backend>(
    backend: &B,
    prefix: &str,
    inputs: &Named,
) -> Result<RValue<B::Tensor>, RunError> {
    let dotted = format!("{prefix}.");
    let mut count = 0usize;
    for k in inputs.range(dotted.clone()..) {
        let Some(rest) = k.0.strip_prefix(&dotted) else {
            break;
        };
        let head = rest.split('.').next().unwrap_or_default();
        if let Ok(i) = head.parse::<usize>() {
            count = count.max(i + 1);
        }
    }
    let mut items = Vec::with_capacity(count);
    for i in 0..count {
        let key = format!("{prefix}.{i}");
        items.push(match inputs.get(&key) {
            Some(t) => RValue::Tensor(backend.upload(t).map_err(|e| device_err(backend, e))?),
            None => collection(backend, &key, inputs)?,
        });
    }
    if items.is_empty() && !inputs.contains_key(prefix) {
        return Ok(RValue::Seq(Vec::new()));
    }
    Ok(RValue::Seq(items))
}

fn execute<B: Backend, C: Communicator<Tensor = B::Tensor>>(
    backend: &B,
    comm: &mut C,
    plan: &Plan,
    inputs: Vec<RValue<B::Tensor>>,
    opts: RunOptions,
) -> Result<Vec<RValue<B::Tensor>>, RunError> {
    let mut e: Executor<B, C> = Executor::new();
    e.set_rng(opts.seed, 0, 0);
    Ok(e.run(
        plan,
        backend,
        comm,
        inputs,
        &Clock::new(false),
        &mut Recording::default(),
    )?)
}

fn download<B: Backend>(backend: &B, v: RValue<B::Tensor>) -> Result<Option<Tensor>, RunError> {
    Ok(match v {
        RValue::Tensor(t) => Some(backend.download(&t).map_err(|e| device_err(backend, e))?),
        RValue::Scalar(x) => Some(Tensor::from_f64(Vec::new(), vec![x])),
        _ => None,
    })
}

fn args_of<B: Backend>(
    backend: &B,
    trace: &Trace,
    inputs: &Named,
) -> Result<Vec<RValue<B::Tensor>>, RunError> {
    trace
        .args()
        .iter()
        .map(|&v| {
            let ty = trace.ty(v).cloned().unwrap_or(Type::Any);
            input_value(backend, trace, &trace.name(v), &ty, inputs)
        })
        .collect()
}

/// Runs one trace on `inputs`; returns every value it returns, by its name in the trace.
pub fn run_trace<B: Backend, C: Communicator<Tensor = B::Tensor>>(
    backend: &B,
    comm: &mut C,
    trace: &Trace,
    inputs: &Named,
    opts: RunOptions,
) -> Result<Named, RunError> {
    let expanded = expand_unrunnable(trace).map_err(RunError::Decomposition)?;
    let trace = expanded.as_ref().unwrap_or(trace);
    let mut results: Vec<ValueId> = Vec::new();
    trace.ret.for_each_value(&mut |v| {
        if !results.contains(&v) {
            results.push(v);
        }
    });
    let wanted: Vec<Option<ValueId>> = results.iter().map(|&v| Some(v)).collect();
    let plan = Plan::compile(trace, &wanted)?;
    let args = args_of(backend, trace, inputs)?;
    let out = execute(backend, comm, &plan, args, opts)?;
    let mut named = Named::new();
    for (v, r) in results.iter().zip(out) {
        if let Some(t) = download(backend, r)? {
            named.insert(trace.name(*v), t);
        }
    }
    Ok(named)
}

/// Rebuilds a value tree shaped like `arg` from flat values, in `for_each_value` order.
fn tree<T>(arg: &Arg, flat: &mut impl Iterator<Item = RValue<T>>) -> RValue<T> {
    match arg {
        Arg::Value(_) => flat.next().unwrap_or(RValue::None),
        Arg::Tuple(items) | Arg::List(items) => {
            RValue::Seq(items.iter().map(|a| tree(a, flat)).collect())
        }
        Arg::Dict(items) => RValue::Seq(items.iter().map(|(_, v)| tree(v, flat)).collect()),
        _ => RValue::None,
    }
}

/// The forward's model outputs: the values of `'output'` in Thunder's return dict; for a
/// forward without that dict (one Thunder made without gradients), every value it returns.
pub fn forward_output_values(forward: &Trace) -> Vec<ValueId> {
    let dict = match &forward.ret {
        Arg::Tuple(items) | Arg::List(items) => match items.first() {
            Some(Arg::Dict(entries)) => Some(entries),
            _ => None,
        },
        Arg::Dict(entries) => Some(entries),
        _ => None,
    };
    let mut out = Vec::new();
    match dict {
        Some(entries) => {
            if let Some((_, v)) = entries.iter().find(|(k, _)| k.as_str() == Some("output")) {
                v.for_each_value(&mut |v| out.push(v));
            }
        }
        None => forward.ret.for_each_value(&mut |v| out.push(v)),
    }
    out
}

/// What PyTorch's autograd does with a gradient broadcast past its input's shape: sums it
/// back to that shape (Thunder's backward returns `t4` for both operands of `add(x, s)` with a
/// 0-d `s`). Other shapes are left as they are, for the caller to compare.
fn sum_to(g: Tensor, shape: &[usize]) -> Tensor {
    let gs = g.shape().to_vec();
    if gs == shape || shape.len() > gs.len() {
        return g;
    }
    let lead = gs.len() - shape.len();
    let fits = shape
        .iter()
        .zip(&gs[lead..])
        .all(|(&s, &d)| s == d || s == 1);
    if !fits {
        return g;
    }
    let numel: usize = shape.iter().product();
    let mut acc = vec![0.0f64; numel];
    let strides = row_major_strides(shape);
    let vals = g.to_f64_vec();
    let mut idx = vec![0usize; gs.len()];
    for v in vals {
        let mut at = 0usize;
        for (k, (&s, &st)) in shape.iter().zip(&strides).enumerate() {
            if s != 1 {
                at += idx[lead + k] * st;
            }
        }
        acc[at] += v;
        for d in (0..gs.len()).rev() {
            idx[d] += 1;
            if idx[d] < gs[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let dtype = g.dtype();
    Tensor::from_f64(shape, acc).to_dtype(dtype).unwrap_or(g)
}

fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Runs a forward and its backward: the forward on its arguments, the backward on what the
/// forward saved and the cotangents `cotangents.I` (zeros for an output without one).
/// Returns `output.I` and `grad.ARG`; without a backward, `output.I` only.
pub fn run_pair<B: Backend, C: Communicator<Tensor = B::Tensor>>(
    backend: &B,
    comm: &mut C,
    forward: &Trace,
    backward: Option<&Trace>,
    inputs: &Named,
    opts: RunOptions,
) -> Result<Named, RunError> {
    let expanded_fwd = expand_unrunnable(forward).map_err(RunError::Decomposition)?;
    let forward = expanded_fwd.as_ref().unwrap_or(forward);
    let expanded_bwd = match backward {
        Some(b) => expand_unrunnable(b).map_err(RunError::Decomposition)?,
        None => None,
    };
    let backward = expanded_bwd.as_ref().or(backward);
    let outputs = forward_output_values(forward);
    let saved = match &forward.ret {
        Arg::Tuple(items) if items.len() == 2 => items[1].clone(),
        _ if backward.is_none() => Arg::Tuple(Vec::new()),
        _ => {
            return Err(RunError::Pair(format!(
                "the forward `{}` does not return (outputs, saved for backward)",
                forward.name
            )))
        }
    };
    let mut wanted: Vec<Option<ValueId>> = outputs.iter().map(|&v| Some(v)).collect();
    saved.for_each_value(&mut |v| wanted.push(Some(v)));
    let plan = Plan::compile(forward, &wanted)?;
    let args = args_of(backend, forward, inputs)?;
    let mut flat = execute(backend, comm, &plan, args, opts)?.into_iter();
    let mut named = Named::new();
    let mut cotangents = Vec::with_capacity(outputs.len());
    for (i, &v) in outputs.iter().enumerate() {
        let out = flat.next().unwrap_or(RValue::None);
        let host = download(backend, out)?;
        if backward.is_some() {
            let cot = match inputs.get(&format!("cotangents.{i}")) {
                Some(c) => c.clone(),
                None => {
                    let Some(Type::Tensor(tt)) = forward.ty(v) else {
                        return Err(RunError::Pair(format!(
                            "output {i} (`{}`) is not a tensor",
                            forward.name(v)
                        )));
                    };
                    Tensor::zeros(&tt.shape, tt.dtype).ok_or_else(|| {
                        RunError::Pair(format!("no zeros of dtype {} for output {i}", tt.dtype))
                    })?
                }
            };
            cotangents.push(RValue::Tensor(
                backend.upload(&cot).map_err(|e| device_err(backend, e))?,
            ));
        }
        if let Some(t) = host {
            named.insert(format!("output.{i}"), t);
        }
    }
    let Some(backward) = backward else {
        return Ok(named);
    };
    let saved = tree(&saved, &mut flat);
    let grads: Vec<Option<ValueId>> = match &backward.ret {
        Arg::Tuple(items) | Arg::List(items) => items.iter().map(Arg::as_value).collect(),
        Arg::Value(v) => vec![Some(*v)],
        _ => Vec::new(),
    };
    let bplan = Plan::compile(backward, &grads)?;
    let bargs = match backward.args().len() {
        2 => vec![saved, RValue::Seq(cotangents)],
        1 => vec![RValue::Seq(cotangents)],
        n => {
            return Err(RunError::Pair(format!(
                "the backward `{}` takes {n} arguments (saved_for_backward, cotangents expected)",
                backward.name
            )))
        }
    };
    let fargs = forward.args();
    for (i, g) in execute(backend, comm, &bplan, bargs, opts)?
        .into_iter()
        .enumerate()
    {
        let Some(t) = download(backend, g)? else {
            continue;
        };
        let (name, t) = match fargs.get(i) {
            Some(&a) if grads.len() == fargs.len() => match forward.ty(a) {
                Some(Type::Tensor(tt)) => (forward.name(a), sum_to(t, &tt.shape)),
                _ => (forward.name(a), t),
            },
            _ => (i.to_string(), t),
        };
        named.insert(format!("grad.{name}"), t);
    }
    Ok(named)
}
