//! `tracepass.train`: training an exported model on N ranks (threads on the CPU), as
//! `tracepass train` does, from Python; checkpoints come back with `load_checkpoint`.

use crate::errors::{self, TrainError};
use crate::program::PyProgram;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use tracepass_passes::parse_pipeline;
use tracepass_runtime::{ModelSource, TrainConfig};

/// Trains `model` (an export directory, or a `Program`) for `steps` steps on `world_size`
/// ranks with AdamW, the backward rewritten by `passes` (default: `ddp(world_size=N,
/// bucket_mb=B),sort-waits`). `save` writes a checkpoint after the last step (and every
/// `save_every` steps); `resume` starts from one. `params` and `data` are safetensors files
/// replacing the export's. Returns a dict: `losses` (one per step), `pipeline`,
/// `param_names`, `first_step`, `wall_s`.
#[pyfunction]
#[pyo3(signature = (
    model, steps, world_size = 1, passes = None, bucket_mb = 25.0, seed = 0, save = None,
    save_every = None, resume = None, params = None, data = None
))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, one per `tracepass train` flag
pub fn train<'py>(
    py: Python<'py>,
    model: &Bound<'py, PyAny>,
    steps: usize,
    world_size: usize,
    passes: Option<&str>,
    bucket_mb: f64,
    seed: u64,
    save: Option<PathBuf>,
    save_every: Option<usize>,
    resume: Option<PathBuf>,
    params: Option<PathBuf>,
    data: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let source = if let Ok(p) = model.cast::<PyProgram>() {
        match &p.get().export {
            Some((dir, _)) => ModelSource::Export(dir.clone()),
            None => ModelSource::Program(Box::new(p.get().inner.clone())),
        }
    } else {
        ModelSource::Export(model.extract::<PathBuf>()?)
    };
    let passes = passes
        .map(parse_pipeline)
        .transpose()
        .map_err(|e| errors::pass_error(py, &e, None))?;
    let cfg = TrainConfig {
        model: source,
        world_size,
        steps,
        bucket_mb,
        seed,
        passes,
        save,
        save_every,
        resume,
        params,
        data,
        // leave threads where the OS puts them: the caller's process has its own threads
        pin_ranks: false,
        ..TrainConfig::default()
    };
    let report = py
        .detach(|| tracepass_runtime::train(&cfg, &|_, _| {}))
        .map_err(|e| errors::simple::<TrainError>(py, e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("losses", report.losses.clone())?;
    d.set_item("pipeline", report.pipeline.as_str())?;
    d.set_item("param_names", report.param_names.clone())?;
    d.set_item("first_step", report.first_step)?;
    d.set_item("wall_s", report.wall.as_secs_f64())?;
    Ok(d)
}
