//! `tracepass run`: executes one trace, or a forward and its backward, on tensors from a
//! safetensors file and writes what it returns to another, like `mlir-cpu-runner`.

use crate::input::{check_output, load_module};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use tracepass_ir::{Module, Trace};
use tracepass_runtime::run::{Named, RunOptions};
use tracepass_runtime::tensor::{save_tensors, TensorFile};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The trace to run (.trace, .tpb, .json); with --backward, the forward.
    pub trace: PathBuf,
    /// The backward of TRACE: runs the forward, then the backward on what it saved and the
    /// cotangents `cotangents.I` (zeros for an output without one); writes `output.I` and
    /// `grad.ARG`.
    #[arg(long)]
    pub backward: Option<PathBuf>,
    /// Inputs by the trace's argument names (`NAME.I` for member I of a collection argument).
    #[arg(long)]
    pub inputs: PathBuf,
    /// Where to write the results (safetensors): every returned value by its name in the
    /// trace, or `output.I` and `grad.ARG` with --backward.
    #[arg(short, long)]
    pub output: PathBuf,
    /// `cpu` (default) or `cuda` (a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Seed of the random stream of ops that draw numbers (dropout, `uniform`).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn trace_of(path: &std::path::Path, want_forward: bool) -> Result<Trace> {
    Ok(match load_module(path)? {
        Module::Trace(t) => t,
        Module::Program(p) if want_forward => p.forward,
        Module::Program(p) => p.backward,
    })
}

pub fn run(args: RunArgs) -> Result<()> {
    check_output(&args.output, "--output")?;
    if !matches!(args.device.as_str(), "cpu" | "cuda") {
        bail!(
            "--device {}: unknown device (valid: cpu, cuda)",
            args.device
        );
    }
    let forward =
        with_decompositions(&args.trace, trace_of(&args.trace, args.backward.is_some())?)?;
    let backward = args
        .backward
        .as_ref()
        .map(|b| with_decompositions(b, trace_of(b, false)?))
        .transpose()?;
    let inputs = TensorFile::load(&args.inputs)
        .with_context(|| format!("--inputs {}", args.inputs.display()))?
        .tensors;
    let opts = RunOptions { seed: args.seed };
    let what = format!(
        "running {} on {}",
        args.trace.display(),
        args.inputs.display()
    );
    let results = match args.device.as_str() {
        "cuda" => run_cuda(&forward, backward.as_ref(), &inputs, opts),
        _ => {
            let group = tracepass_runtime::comm::ThreadGroup::new(
                1,
                tracepass_runtime::comm::CommOptions::default(),
            );
            let mut comm = group.comm(0);
            let cpu = tracepass_runtime::cpu::CpuBackend;
            run_on(&cpu, &mut comm, &forward, backward.as_ref(), &inputs, opts)
        }
    }
    .context(what)?;
    let list: Vec<(String, tracepass_runtime::Tensor)> = results.into_iter().collect();
    save_tensors(&args.output, &list)
        .with_context(|| format!("--output {}", args.output.display()))?;
    eprintln!(
        "{}: {} tensor{} written",
        args.output.display(),
        list.len(),
        if list.len() == 1 { "" } else { "s" }
    );
    Ok(())
}

/// `t` with its ops that have no kernel replaced by their printed decompositions (as the
/// runtime would), said on stderr.
fn with_decompositions(path: &std::path::Path, t: Trace) -> Result<Trace> {
    use tracepass_runtime::exec::unrunnable::{expand_unrunnable, PROVENANCE};
    let Some(expanded) =
        expand_unrunnable(&t).map_err(|m| anyhow::anyhow!("{}: {m}", path.display()))?
    else {
        return Ok(t);
    };
    for p in &expanded.provenance {
        if let Some(ops) = p.pass.strip_prefix(PROVENANCE) {
            eprintln!(
                "note: {}: `{}`: no kernel, run through Thunder's printed decomposition: {ops}",
                path.display(),
                t.name
            );
        }
    }
    Ok(expanded)
}

fn run_on<B, C>(
    backend: &B,
    comm: &mut C,
    forward: &Trace,
    backward: Option<&Trace>,
    inputs: &Named,
    opts: RunOptions,
) -> Result<Named>
where
    B: tracepass_runtime::Backend,
    C: tracepass_runtime::Communicator<Tensor = B::Tensor>,
{
    use tracepass_runtime::run::{run_pair, run_trace};
    Ok(match backward {
        Some(b) => run_pair(backend, comm, forward, Some(b), inputs, opts)?,
        None => run_trace(backend, comm, forward, inputs, opts)?,
    })
}

#[cfg(feature = "cuda")]
fn run_cuda(
    forward: &Trace,
    backward: Option<&Trace>,
    inputs: &Named,
    opts: RunOptions,
) -> Result<Named> {
    use tracepass_runtime::cuda::{check_available, CudaBackend, SoloComm};
    check_available(0)?;
    let backend = CudaBackend::new(0)?;
    let mut comm = SoloComm::default();
    run_on(&backend, &mut comm, forward, backward, inputs, opts)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_: &Trace, _: Option<&Trace>, _: &Named, _: RunOptions) -> Result<Named> {
    bail!("--device cuda: this tracepass was built without the `cuda` feature (cargo build --release --features cuda)")
}
