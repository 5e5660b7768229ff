//! `tracepass.Program`: forward + backward + parameters, read from an export directory, a
//! program file, or paired from two traces.

use crate::errors;
use crate::trace::PyTrace;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};
use tracepass_ir::{fsio, ExportInfo, Module, OpRegistry, Program};

/// A training step's program. `Program.load(path)` reads an export directory (the exporter's
/// output), a `.tpb` or a `.json` program file.
#[pyclass(name = "Program", module = "tracepass", frozen)]
pub struct PyProgram {
    pub inner: Program,
    /// The export directory and its `export.json`, when read from one.
    pub export: Option<(PathBuf, ExportInfo)>,
}

impl PyProgram {
    /// Reads an export directory, or a program file.
    pub fn load_path(py: Python<'_>, path: &Path) -> PyResult<PyProgram> {
        if tracepass_ir::is_export_dir(path) {
            let e = py
                .detach(|| tracepass_ir::load_export_with(path, OpRegistry::builtin()))
                .map_err(|e| errors::file_error(py, &e))?;
            return Ok(PyProgram {
                inner: e.program,
                export: Some((e.dir, e.info)),
            });
        }
        if path.is_dir() {
            return Err(errors::file_err(
                py,
                format!(
                    "{}: is a folder without export.json, not an export directory",
                    path.display()
                ),
                path,
                "a folder without export.json, not an export directory".into(),
            ));
        }
        match py.detach(|| fsio::load_with(path, OpRegistry::builtin())) {
            Ok(Module::Program(p)) => Ok(PyProgram {
                inner: p,
                export: None,
            }),
            Ok(Module::Trace(_)) => Err(errors::file_err(
                py,
                format!(
                    "{}: holds one trace, not a program; load it with Trace.load, or pair a forward with its backward (Program.from_traces)",
                    path.display()
                ),
                path,
                "holds one trace, not a program".into(),
            )),
            Err(e) => Err(errors::file_error(py, &e)),
        }
    }
}

fn param_dict<'py>(py: Python<'py>, p: &tracepass_ir::Param) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("fqn", p.fqn.as_str())?;
    d.set_item("forward_arg", p.forward_arg)?;
    d.set_item("grad_output", p.grad_output)?;
    d.set_item("shape", p.shape.clone())?;
    d.set_item("dtype", p.dtype.to_string())?;
    d.set_item("device", p.device.to_string())?;
    d.set_item("requires_grad", p.requires_grad)?;
    d.set_item("tied_to", p.tied_to.as_deref())?;
    d.set_item("buffer", p.buffer)?;
    Ok(d)
}

#[pymethods]
impl PyProgram {
    /// Reads an export directory (`forward.trace`, `backward.trace`, `prologue.trace`,
    /// `export.json`) or a `.tpb`/`.json` program file.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<PyProgram> {
        Self::load_path(py, &path)
    }

    /// Pairs a forward with its backward in Thunder's convention; without a prologue the
    /// parameters are the forward's arguments named `t_<module path>`.
    #[staticmethod]
    #[pyo3(signature = (forward, backward, prologue = None))]
    fn from_traces(
        py: Python<'_>,
        forward: &PyTrace,
        backward: &PyTrace,
        prologue: Option<&str>,
    ) -> PyResult<PyProgram> {
        let (f, b) = (forward.inner.clone(), backward.inner.clone());
        let program = match prologue {
            Some(text) => {
                let pro = tracepass_ir::parse_prologue(text)
                    .map_err(|e| errors::parse_error(py, &e, None))?;
                Program::from_prologue(f, b, &pro, &[])
            }
            None => Program::from_thunder(f, b),
        };
        program
            .map(|inner| PyProgram {
                inner,
                export: None,
            })
            .map_err(|e| errors::file_error(py, &tracepass_ir::FileError::Program(e)))
    }

    /// Writes the program as `.tpb` (binary) or `.json`; the write is atomic.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let m = Module::Program(self.inner.clone());
        py.detach(|| fsio::save(&path, &m))
            .map_err(|e| errors::file_error(py, &e))
    }

    /// Verifies the forward and the backward; raises `VerifyError` on the first that fails.
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        for t in [&self.inner.forward, &self.inner.backward] {
            if self.inner.is_lone() && std::ptr::eq(t, &self.inner.forward) {
                continue;
            }
            if let Some(e) = PyTrace::verify_err(py, t) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The forward trace (a copy).
    #[getter]
    fn forward(&self) -> PyTrace {
        PyTrace {
            inner: self.inner.forward.clone(),
        }
    }

    /// The backward trace (a copy).
    #[getter]
    fn backward(&self) -> PyTrace {
        PyTrace {
            inner: self.inner.backward.clone(),
        }
    }

    /// The parameters and buffers in the module's order: dicts with `fqn`, `forward_arg`,
    /// `grad_output`, `shape`, `dtype`, `device`, `requires_grad`, `tied_to`, `buffer`.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .params
            .iter()
            .map(|p| param_dict(py, p))
            .collect()
    }

    /// Groups of parameter names that are one tensor, the one the others are tied to first.
    #[getter]
    fn ties(&self) -> Vec<Vec<String>> {
        ties(&self.inner)
    }

    /// The export directory it was read from, or None.
    #[getter]
    fn export_dir(&self) -> Option<PathBuf> {
        self.export.as_ref().map(|(d, _)| d.clone())
    }

    /// The export's `export.json` as a dict (model, loss, tied, world_size, ...), or None.
    #[getter]
    fn export_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some((_, info)) = &self.export else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("format", info.format)?;
        d.set_item("model", info.model.as_str())?;
        d.set_item("loss", info.loss.as_str())?;
        d.set_item("output", info.output)?;
        d.set_item("targets", info.targets.as_str())?;
        d.set_item("tied", info.tied.clone())?;
        d.set_item("world_size", info.world_size)?;
        d.set_item("thunder", info.thunder.as_deref())?;
        d.set_item("torch", info.torch.as_deref())?;
        Ok(Some(d))
    }

    fn __repr__(&self) -> String {
        format!(
            "<Program {} / {} ({} params)>",
            self.inner.forward.name,
            self.inner.backward.name,
            self.inner.params.len()
        )
    }
}

/// A program's ties as name groups, each led by the parameter the others are tied to.
pub fn ties(p: &Program) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    for q in &p.params {
        let Some(primary) = &q.tied_to else { continue };
        match groups.iter_mut().find(|g| &g[0] == primary) {
            Some(g) => g.push(q.fqn.clone()),
            None => groups.push(vec![primary.clone(), q.fqn.clone()]),
        }
    }
    groups
}

/// Reads an export directory (or a program file) as a `Program`.
#[pyfunction]
pub fn load_program(py: Python<'_>, path: PathBuf) -> PyResult<PyProgram> {
    PyProgram::load_path(py, &path)
}
