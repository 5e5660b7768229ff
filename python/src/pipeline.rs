//! `tracepass.run_pipeline`: a pipeline string of built-in and registered passes run on a
//! program or a trace, with its statistics (each attributed to its pass and trace), timings
//! and the provenance it left.

use crate::errors;
use crate::program::PyProgram;
use crate::registry::registry;
use crate::trace::{provenance, PyTrace};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use tracepass_ir::{OpRegistry, Program};
use tracepass_passes::{
    parse_pipeline, print_pipeline, Anchor, PassLevel, PassManager, PassRegistry, PassSpec,
};

/// What a pipeline made: the rewritten program (or trace), and what the passes reported.
#[pyclass(name = "PipelineResult", module = "tracepass", frozen, get_all)]
pub struct PyPipelineResult {
    /// The rewritten program (None when the input was a lone trace).
    pub program: Option<Py<PyProgram>>,
    /// The rewritten trace: the lone trace, or the program's backward.
    pub trace: Py<PyTrace>,
    /// The pipeline as the registry spells it (defaults shown as the passes print them).
    pub pipeline: String,
    /// Counters: dicts with `pass`, `spec`, `trace` (`forward`, `backward`, or None for a
    /// program-level pass), `name`, `value`.
    pub stats: Py<PyAny>,
    /// Findings (`ddp.frozen`, ...): dicts with `pass`, `trace`, `name`, `text`.
    pub notes: Py<PyAny>,
    /// Per pass and trace: dicts with `pass` (as written), `trace`, `seconds`, `changed`.
    pub timings: Py<PyAny>,
    /// The provenance of each trace after the run: `{"forward": [...], "backward": [...]}`.
    pub provenance: Py<PyAny>,
}

#[pymethods]
impl PyPipelineResult {
    /// The value of counter `name` (summed over traces), or None.
    fn stat(&self, py: Python<'_>, name: &str) -> PyResult<Option<u64>> {
        let mut total = None;
        for s in self.stats.bind(py).try_iter()? {
            let s = s?;
            if s.get_item("name")?.extract::<String>()? == name {
                *total.get_or_insert(0) += s.get_item("value")?.extract::<u64>()?;
            }
        }
        Ok(total)
    }

    fn __repr__(&self) -> String {
        format!("<PipelineResult {}>", self.pipeline)
    }
}

/// One pass run: its spec, the trace it ran on (`None`: the program), what it reported.
struct Step {
    spec: PassSpec,
    trace: Option<&'static str>,
    report: tracepass_passes::RunReport,
}

/// The runs a spec becomes: itself for a program-level or anchored pass; one anchored run
/// per trace for an unanchored trace-level pass, so its counters name the trace they came from.
fn expand(reg: &PassRegistry, spec: &PassSpec, lone: bool) -> Vec<PassSpec> {
    let trace_level = reg
        .get(&spec.name)
        .is_some_and(|d| d.level == PassLevel::Trace);
    if !trace_level || spec.anchor.is_some() {
        return vec![spec.clone()];
    }
    let anchors: &[Anchor] = if lone {
        &[Anchor::Backward]
    } else {
        &[Anchor::Forward, Anchor::Backward]
    };
    anchors
        .iter()
        .map(|&a| PassSpec {
            anchor: Some(a),
            ..spec.clone()
        })
        .collect()
}

fn anchor_name(a: Option<Anchor>) -> Option<&'static str> {
    a.map(|a| match a {
        Anchor::Forward => "forward",
        Anchor::Backward => "backward",
    })
}

/// Runs `specs` on `p`, pass by pass; the provenance a split trace-level pass leaves is
/// spelled as the pipeline wrote it (`dce`, not `backward(dce)`).
fn run_specs(
    reg: &PassRegistry,
    specs: &[PassSpec],
    p: &mut Program,
    verify: bool,
    reproducer_dir: Option<PathBuf>,
) -> Result<Vec<Step>, tracepass_passes::RunError> {
    let mut steps = Vec::new();
    for spec in specs {
        for run in expand(reg, spec, p.is_lone()) {
            let mut pm = PassManager::from_specs(reg, std::slice::from_ref(&run))
                .map_err(tracepass_passes::RunError::new)?;
            pm.verify_each = verify;
            pm.reproducer_dir = reproducer_dir.clone();
            let before = (p.forward.provenance.len(), p.backward.provenance.len());
            let report = pm.run(p, OpRegistry::builtin())?;
            if let (None, Some(a)) = (spec.anchor, run.anchor) {
                // spelled as the pipeline wrote it: `dce`, not `backward(dce)`
                let (t, n) = match a {
                    Anchor::Forward => (&mut p.forward, before.0),
                    Anchor::Backward => (&mut p.backward, before.1),
                };
                let prefix = format!("{}(", a.name());
                for rec in t.provenance.iter_mut().skip(n) {
                    if let Some(inner) = rec
                        .pass
                        .strip_prefix(&prefix)
                        .and_then(|r| r.strip_suffix(')'))
                    {
                        rec.pass = inner.to_string();
                    }
                }
            }
            steps.push(Step {
                spec: spec.clone(),
                trace: anchor_name(run.anchor),
                report,
            });
        }
    }
    Ok(steps)
}

fn dict_list<'py>(py: Python<'py>, items: Vec<Bound<'py, PyDict>>) -> Py<PyAny> {
    pyo3::types::PyList::new(py, items)
        .map(|l| l.into_any().unbind())
        .unwrap_or_else(|_| py.None())
}

/// Runs a pipeline (`"ddp(world_size=2),sort-waits,dce"`) of built-in and registered passes
/// on a copy of `target` (a `Program` or a `Trace`); the input is left as it was.
///
/// With `verify` (the default) the input is verified before the first pass and every trace a
/// pass changed after it. A pass that fails raises `PassError` (or `VerifyError` when it left
/// invalid IR); a wrong pipeline raises `PipelineError` before any pass runs.
#[pyfunction]
#[pyo3(signature = (target, pipeline, verify = true, reproducer_dir = None))]
pub fn run_pipeline(
    py: Python<'_>,
    target: &Bound<'_, PyAny>,
    pipeline: &str,
    verify: bool,
    reproducer_dir: Option<PathBuf>,
) -> PyResult<PyPipelineResult> {
    let (mut program, lone) = if let Ok(p) = target.cast::<PyProgram>() {
        (p.get().inner.clone(), false)
    } else if let Ok(t) = target.cast::<PyTrace>() {
        (Program::lone(t.get().inner.clone()), true)
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "run_pipeline takes a tracepass.Program or tracepass.Trace, not {}",
            target.get_type().name()?
        )));
    };
    let export = target
        .cast::<PyProgram>()
        .ok()
        .and_then(|p| p.get().export.clone());
    let reg = registry();
    let specs = parse_pipeline(pipeline).map_err(|e| errors::pass_error(py, &e, None))?;
    // the whole pipeline is checked before any pass runs
    let checked =
        PassManager::from_specs(&reg, &specs).map_err(|e| errors::pass_error(py, &e, None))?;
    let spelled = checked.pipeline();
    let steps = py
        .detach(|| run_specs(&reg, &specs, &mut program, verify, reproducer_dir))
        .map_err(|e| errors::run_error(py, &e))?;

    let mut stats = Vec::new();
    let mut notes = Vec::new();
    let mut timings = Vec::new();
    for s in &steps {
        for (name, value) in &s.report.stats {
            let d = PyDict::new(py);
            d.set_item("pass", s.spec.name.as_str())?;
            d.set_item("spec", s.spec.to_string())?;
            d.set_item("trace", s.trace)?;
            d.set_item("name", name.as_str())?;
            d.set_item("value", *value)?;
            stats.push(d);
        }
        for (name, text) in &s.report.notes {
            let d = PyDict::new(py);
            d.set_item("pass", s.spec.name.as_str())?;
            d.set_item("trace", s.trace)?;
            d.set_item("name", name.as_str())?;
            d.set_item("text", text.as_str())?;
            notes.push(d);
        }
        for t in &s.report.timings {
            let d = PyDict::new(py);
            d.set_item("pass", s.spec.to_string())?;
            d.set_item("trace", s.trace)?;
            d.set_item("seconds", t.time.as_secs_f64())?;
            d.set_item("changed", t.changed == tracepass_passes::Changed::Yes)?;
            timings.push(d);
        }
    }
    let prov = PyDict::new(py);
    if !lone {
        prov.set_item("forward", provenance(py, &program.forward)?)?;
    }
    prov.set_item("backward", provenance(py, &program.backward)?)?;
    let trace = Py::new(
        py,
        PyTrace {
            inner: program.backward.clone(),
        },
    )?;
    let program = if lone {
        None
    } else {
        Some(Py::new(
            py,
            PyProgram {
                inner: program,
                export,
            },
        )?)
    };
    Ok(PyPipelineResult {
        program,
        trace,
        pipeline: if spelled.is_empty() {
            print_pipeline(&specs)
        } else {
            spelled
        },
        stats: dict_list(py, stats),
        notes: dict_list(py, notes),
        timings: dict_list(py, timings),
        provenance: prov.into_any().unbind(),
    })
}

/// Rewrites `program` with a pipeline string of registered passes, verifying after each; a
/// `ddp(world_size=N)` must agree with `world_size` when one is given (simulation, training).
pub fn checked_rewrite(
    py: Python<'_>,
    program: &mut Program,
    pipeline: &str,
    world_size: Option<usize>,
) -> PyResult<()> {
    let specs = parse_pipeline(pipeline).map_err(|e| errors::pass_error(py, &e, None))?;
    if let Some(n) = world_size {
        tracepass_runtime::train::check_pipeline(&specs, n)
            .map_err(|e| errors::simple::<errors::PipelineError>(py, e.to_string()))?;
    }
    let reg = registry();
    // the whole pipeline is checked before any pass runs
    PassManager::from_specs(&reg, &specs).map_err(|e| errors::pass_error(py, &e, None))?;
    py.detach(|| run_specs(&reg, &specs, program, true, None))
        .map_err(|e| errors::run_error(py, &e))?;
    Ok(())
}
