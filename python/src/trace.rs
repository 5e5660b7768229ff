//! `tracepass.Trace`: one trace (a forward, a backward, or any Thunder trace), parsed, printed,
//! verified and read statement by statement.

use crate::errors;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};
use tracepass_ir::{fsio, Module, NodeIndex, OpRegistry, Trace, TraceKind};

/// How a trace's kind is spelled in Python.
pub fn kind_name(kind: TraceKind) -> &'static str {
    match kind {
        TraceKind::Forward => "forward",
        TraceKind::Backward => "backward",
        TraceKind::Joint => "joint",
        TraceKind::Computation => "computation",
    }
}

/// A trace: `Trace.parse(text)` or `Trace.load(path)`; `str(trace)` prints it as Thunder does.
#[pyclass(name = "Trace", module = "tracepass", frozen)]
pub struct PyTrace {
    pub inner: Trace,
}

/// One statement of a trace, as a compiler author reads it.
#[pyclass(name = "Statement", module = "tracepass", frozen, get_all)]
pub struct PyStatement {
    /// The canonical op (`prims.div`, `ltorch.linear`, `dist.all_reduce_async`).
    pub op: String,
    /// The names of the values it reads, in operand order.
    pub inputs: Vec<String>,
    /// The names of the values it defines.
    pub outputs: Vec<String>,
    /// Its keyword operands' names.
    pub kwargs: Vec<String>,
    /// The statement as printed.
    pub text: String,
    /// Its line (from 1) in `str(trace)`, or None.
    pub line: Option<usize>,
}

#[pymethods]
impl PyStatement {
    fn __repr__(&self) -> String {
        format!("<Statement {}>", self.text)
    }
}

impl PyTrace {
    /// Reads the trace a file holds (`.trace`, `.tpb`, `.json`); of a program file, its
    /// backward (or forward).
    pub fn load_path(py: Python<'_>, path: &Path, forward: bool) -> PyResult<Trace> {
        match py.detach(|| fsio::load_with(path, OpRegistry::builtin())) {
            Ok(Module::Trace(t)) => Ok(t),
            Ok(Module::Program(p)) if forward => Ok(p.forward),
            Ok(Module::Program(p)) => Ok(p.backward),
            Err(e) => Err(errors::file_error(py, &e)),
        }
    }

    /// The trace's violations as a Python error, or None.
    pub fn verify_err(py: Python<'_>, t: &Trace) -> Option<PyErr> {
        tracepass_ir::verify(t).err().map(|e| {
            let printed = tracepass_ir::print_trace(t);
            errors::verify_error(py, &e, Some(&printed), None, e.to_string())
        })
    }
}

#[pymethods]
impl PyTrace {
    /// Parses Thunder's printed form.
    #[staticmethod]
    fn parse(py: Python<'_>, text: &str) -> PyResult<PyTrace> {
        py.detach(|| tracepass_ir::parse_trace(text))
            .map(|inner| PyTrace { inner })
            .map_err(|e| errors::parse_error(py, &e, None))
    }

    /// Reads a `.trace`, `.tpb` or `.json` file (of a program file, its backward, or its
    /// forward when `forward` is true).
    #[staticmethod]
    #[pyo3(signature = (path, forward = false))]
    fn load(py: Python<'_>, path: PathBuf, forward: bool) -> PyResult<PyTrace> {
        Self::load_path(py, &path, forward).map(|inner| PyTrace { inner })
    }

    /// Writes the trace; the format is the extension's (`.trace`, `.tpb`, `.json`), the
    /// write atomic.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let m = Module::Trace(self.inner.clone());
        py.detach(|| fsio::save(&path, &m))
            .map_err(|e| errors::file_error(py, &e))
    }

    /// Raises `VerifyError` with every violation, each with its line; returns None when the
    /// trace is valid.
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        match Self::verify_err(py, &self.inner) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every violation (a list of dicts with `statement`, `message`, `line`); empty when valid.
    fn violations(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match Self::verify_err(py, &self.inner) {
            Some(e) => Ok(e.value(py).getattr("violations")?.unbind()),
            None => Ok(pyo3::types::PyList::empty(py).into_any().unbind()),
        }
    }

    /// The function's name.
    #[getter]
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    /// `forward`, `backward`, `joint` or `computation`.
    #[getter]
    fn kind(&self) -> &'static str {
        kind_name(self.inner.kind)
    }

    /// The arguments' names, in signature order.
    #[getter]
    fn args(&self) -> Vec<String> {
        self.inner
            .args()
            .iter()
            .map(|&a| self.inner.name(a))
            .collect()
    }

    /// The names of the values the trace returns.
    #[getter]
    fn returns(&self) -> Vec<String> {
        self.inner
            .returned_values()
            .into_iter()
            .map(|v| self.inner.name(v))
            .collect()
    }

    /// The passes that made it, oldest first: dicts with `pass` and `millis` (or None).
    #[getter]
    fn provenance(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        provenance(py, &self.inner)
    }

    /// The statements in schedule order.
    #[getter]
    fn statements(&self) -> Vec<PyStatement> {
        statements(&self.inner)
    }

    /// The ops in schedule order (`[s.op for s in trace.statements]`).
    #[getter]
    fn ops(&self) -> Vec<String> {
        self.inner
            .schedule()
            .iter()
            .filter_map(|&i| self.inner.node(i).map(|n| n.op.as_str().to_string()))
            .collect()
    }

    /// The type of value `name` as printed (`cpu f32[4, 8]`), or None when there is no such
    /// value.
    fn type_of(&self, name: &str) -> Option<String> {
        let id = self.inner.find_value(name)?;
        self.inner.ty(id).map(|t| t.to_string())
    }

    /// The trace as a Graphviz DOT graph.
    fn to_dot(&self) -> String {
        tracepass_ir::dot::to_dot(&self.inner)
    }

    fn __len__(&self) -> usize {
        self.inner.node_count()
    }

    fn __str__(&self) -> String {
        tracepass_ir::print_trace(&self.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "<Trace {} ({}, {} statements)>",
            self.inner.name,
            kind_name(self.inner.kind),
            self.inner.node_count()
        )
    }

    /// Two traces are equal when they print the same.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PyTrace>() {
            Ok(o) => {
                tracepass_ir::print_trace(&self.inner) == tracepass_ir::print_trace(&o.get().inner)
            }
            Err(_) => false,
        }
    }
}

/// A trace's provenance records as dicts.
pub fn provenance(py: Python<'_>, t: &Trace) -> PyResult<Vec<Py<PyAny>>> {
    t.provenance
        .iter()
        .map(|p| {
            let d = PyDict::new(py);
            d.set_item("pass", p.pass.as_str())?;
            d.set_item("millis", p.millis)?;
            Ok(d.into_any().unbind())
        })
        .collect()
}

fn statements(t: &Trace) -> Vec<PyStatement> {
    let printed = tracepass_ir::print_trace(t);
    let index = errors::LineIndex::new(&printed);
    let schedule: Vec<NodeIndex> = t.schedule().to_vec();
    schedule
        .into_iter()
        .filter_map(|i| {
            let n = t.node(i)?;
            let text = tracepass_ir::print_node_line(t, i);
            Some(PyStatement {
                op: n.op.as_str().to_string(),
                inputs: n.operands().into_iter().map(|v| t.name(v)).collect(),
                outputs: n.outputs().iter().map(|&v| t.name(v)).collect(),
                kwargs: n.kwargs().iter().map(|(k, _)| k.clone()).collect(),
                line: index.line_of(&text),
                text,
            })
        })
        .collect()
}

/// Parses Thunder's printed form into a `Trace`.
#[pyfunction]
pub fn parse_trace(py: Python<'_>, text: &str) -> PyResult<PyTrace> {
    PyTrace::parse(py, text)
}

/// Prints a trace as Thunder does (`str(trace)`).
#[pyfunction]
pub fn print_trace(trace: &PyTrace) -> String {
    tracepass_ir::print_trace(&trace.inner)
}
