//! The Python exceptions of tracepass, and the one mapping from the Rust crates' typed errors
//! to them. Every exception keeps the Rust message as its text; the structured parts (file,
//! line, column, pass, violations) become attributes, so a caller can act on them without
//! parsing messages.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::IntoPyObjectExt;
use std::path::Path;
use tracepass_ir::{
    FileError as IrFileError, ParseError as IrParseError, VerifyError as IrVerifyError,
};
use tracepass_passes::{PassError as RsPassError, PlanError as RsPlanError, RunError};

create_exception!(
    _native,
    TracepassError,
    PyException,
    "Base class of every error tracepass raises."
);
create_exception!(
    _native,
    ParseError,
    TracepassError,
    "A trace's text does not parse: `message`, `file` (or None), `line`, `col`, `text`."
);
create_exception!(
    _native,
    VerifyError,
    TracepassError,
    "A trace breaks the IR's invariants: `trace`, `violations` (each a dict with `statement`, `message`, `line`), `pass_name` (the pass after which, or None)."
);
create_exception!(
    _native,
    FileError,
    TracepassError,
    "A file or export directory cannot be read or written: `file`, `message`."
);
create_exception!(
    _native,
    ProgramError,
    TracepassError,
    "A forward and a backward do not make a program: `file` (or None), `message`."
);
create_exception!(
    _native,
    PipelineError,
    TracepassError,
    "A pipeline string or pass registration is wrong (unknown pass or option, bad value, syntax): `message`."
);
create_exception!(
    _native,
    PassError,
    TracepassError,
    "A pass refused its input or failed: `pass_name`, `message`, `reproducer` (a file, or None)."
);
create_exception!(
    _native,
    CheckpointError,
    TracepassError,
    "A checkpoint cannot be read: `file`, `message`."
);
create_exception!(
    _native,
    SimulateError,
    TracepassError,
    "A trace cannot be simulated (unknown device or link, an op without a cost): `message`."
);
create_exception!(
    _native,
    TrainError,
    TracepassError,
    "Training failed: `message`."
);
create_exception!(
    _native,
    PlanError,
    TracepassError,
    "No DDP plan for a backward: `kind` (`parse`, `options` or `gradients`), `message`, `file` (None: a trace's text), `line` (of the backward, or None)."
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TracepassError", py.get_type::<TracepassError>())?;
    m.add("ParseError", py.get_type::<ParseError>())?;
    m.add("VerifyError", py.get_type::<VerifyError>())?;
    m.add("FileError", py.get_type::<FileError>())?;
    m.add("ProgramError", py.get_type::<ProgramError>())?;
    m.add("PipelineError", py.get_type::<PipelineError>())?;
    m.add("PassError", py.get_type::<PassError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("SimulateError", py.get_type::<SimulateError>())?;
    m.add("TrainError", py.get_type::<TrainError>())?;
    m.add("PlanError", py.get_type::<PlanError>())?;
    Ok(())
}

/// Sets attributes on a new exception; an attribute that cannot be set (it never happens on
/// these plain classes) leaves the exception as it is rather than hiding it.
fn with_attrs(py: Python<'_>, err: PyErr, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let value = err.value(py);
    for (k, v) in attrs {
        let _ = value.setattr(*k, v.bind(py));
    }
    err
}

fn path_obj(py: Python<'_>, path: Option<&Path>) -> Py<PyAny> {
    match path {
        Some(p) => p
            .display()
            .to_string()
            .into_pyobject(py)
            .map(|s| s.into_any().unbind())
            .unwrap_or_else(|_| py.None()),
        None => py.None(),
    }
}

fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> Py<PyAny> {
    v.into_bound_py_any(py)
        .map(Bound::unbind)
        .unwrap_or_else(|_| py.None())
}

/// A [`tracepass_ir::ParseError`], of `file` when it came from one.
pub fn parse_error(py: Python<'_>, e: &IrParseError, file: Option<&Path>) -> PyErr {
    let text = match file {
        Some(f) => format!("{}: {e}", f.display()),
        None => e.to_string(),
    };
    with_attrs(
        py,
        ParseError::new_err(text),
        &[
            ("message", obj(py, e.message.as_str())),
            ("file", path_obj(py, file)),
            ("line", obj(py, e.line)),
            ("col", obj(py, e.col)),
            ("text", obj(py, e.text.as_str())),
        ],
    )
}

/// A [`tracepass_ir::VerifyError`]; `printed` is the trace as printed, to give each violation
/// its line number there (the verifier names the statement, not its line).
pub fn verify_error(
    py: Python<'_>,
    e: &IrVerifyError,
    printed: Option<&str>,
    pass: Option<&str>,
    message: String,
) -> PyErr {
    let index = printed.map(LineIndex::new);
    let violations: Vec<Py<PyAny>> = e
        .diagnostics
        .iter()
        .map(|d| {
            let dict = PyDict::new(py);
            let line = index.as_ref().and_then(|i| i.line_of(&d.line));
            let _ = dict.set_item("statement", d.line.as_str());
            let _ = dict.set_item("message", d.message.as_str());
            let _ = dict.set_item("line", line);
            dict.into_any().unbind()
        })
        .collect();
    with_attrs(
        py,
        VerifyError::new_err(message),
        &[
            ("trace", obj(py, e.trace.as_str())),
            ("violations", obj(py, violations)),
            ("pass_name", obj(py, pass)),
        ],
    )
}

/// Where each statement of a printed trace is: its code (before the `  # ...` comment) to its
/// line, from 1. The verifier names statements by their text, not their line.
pub struct LineIndex<'a> {
    lines: std::collections::HashMap<&'a str, usize>,
}

impl<'a> LineIndex<'a> {
    /// Indexes a printed trace.
    pub fn new(printed: &'a str) -> LineIndex<'a> {
        let mut lines = std::collections::HashMap::new();
        for (i, l) in printed.lines().enumerate() {
            let code = l.split("  #").next().unwrap_or(l).trim();
            if !code.is_empty() {
                lines.entry(code).or_insert(i + 1);
            }
        }
        LineIndex { lines }
    }

    /// The line of `statement` (as `print_node_line` prints it), if it is there.
    pub fn line_of(&self, statement: &str) -> Option<usize> {
        let code = statement.split("  #").next().unwrap_or(statement).trim();
        self.lines.get(code).copied()
    }
}

/// A [`tracepass_ir::FileError`]: parse errors keep file and line; program errors are
/// [`ProgramError`]; everything else is a [`FileError`] naming the file.
pub fn file_error(py: Python<'_>, e: &IrFileError) -> PyErr {
    match e {
        IrFileError::Parse { path, error } => parse_error(py, error, Some(path)),
        IrFileError::Program(error) => with_attrs(
            py,
            ProgramError::new_err(e.to_string()),
            &[("file", py.None()), ("message", obj(py, error.to_string()))],
        ),
        IrFileError::InProgram { path, error } => with_attrs(
            py,
            ProgramError::new_err(e.to_string()),
            &[
                ("file", path_obj(py, Some(path))),
                ("message", obj(py, error.to_string())),
            ],
        ),
        IrFileError::Io { path, error } => file_err(py, e.to_string(), path, error.to_string()),
        IrFileError::Codec { path, error } => file_err(py, e.to_string(), path, error.to_string()),
        IrFileError::Json { path, message } | IrFileError::ExportInfo { path, message } => {
            file_err(py, e.to_string(), path, message.clone())
        }
        IrFileError::UnknownFormat { path }
        | IrFileError::ProgramAsText { path }
        | IrFileError::NotAProgram { path } => file_err(py, e.to_string(), path, e.to_string()),
    }
}

/// A [`FileError`] exception about `path`.
pub fn file_err(py: Python<'_>, text: String, path: &Path, message: String) -> PyErr {
    with_attrs(
        py,
        FileError::new_err(text),
        &[
            ("file", path_obj(py, Some(path))),
            ("message", obj(py, message)),
        ],
    )
}

/// A [`tracepass_passes::PassError`]: a wrong pipeline is a [`PipelineError`], the verifier's
/// findings a [`VerifyError`], a pass that refused or failed a [`PassError`].
pub fn pass_error(py: Python<'_>, e: &RsPassError, reproducer: Option<&Path>) -> PyErr {
    let text = match reproducer {
        Some(r) => format!("{e}\nreproducer written to {}", r.display()),
        None => e.to_string(),
    };
    match e {
        RsPassError::Verify { pass, error } => {
            verify_error(py, error, None, Some(pass.as_str()), text)
        }
        RsPassError::InvalidInput(error) => verify_error(py, error, None, None, text),
        // verification after each pass was off; the end of the pipeline is always verified
        RsPassError::VerifyAtEnd { error, .. } => verify_error(py, error, None, None, text),
        RsPassError::Failed { pass, message } | RsPassError::Panicked { pass, message } => {
            with_attrs(
                py,
                PassError::new_err(text),
                &[
                    ("pass_name", obj(py, pass.as_str())),
                    ("message", obj(py, message.as_str())),
                    ("reproducer", path_obj(py, reproducer)),
                ],
            )
        }
        RsPassError::Rewrite { pass, error } => with_attrs(
            py,
            PassError::new_err(text),
            &[
                ("pass_name", obj(py, pass.as_str())),
                ("message", obj(py, error.to_string())),
                ("reproducer", path_obj(py, reproducer)),
            ],
        ),
        _ => with_attrs(
            py,
            PipelineError::new_err(text),
            &[("message", obj(py, e.to_string()))],
        ),
    }
}

/// A failed pipeline run: its pass error, with the reproducer written for it.
pub fn run_error(py: Python<'_>, e: &RunError) -> PyErr {
    pass_error(py, &e.error, e.reproducer.as_deref())
}

/// A [`tracepass_passes::PlanError`]: its kind as a word, and the backward's line where the
/// text did not parse.
pub fn plan_error(py: Python<'_>, e: &RsPlanError) -> PyErr {
    let (kind, line) = match e {
        RsPlanError::Parse(p) => ("parse", Some(p.line)),
        RsPlanError::Options(_) => ("options", None),
        RsPlanError::Gradients(_) => ("gradients", None),
    };
    with_attrs(
        py,
        PlanError::new_err(e.to_string()),
        &[
            ("kind", obj(py, kind)),
            ("message", obj(py, e.to_string())),
            ("file", py.None()),
            ("line", obj(py, line)),
        ],
    )
}

/// An error of a kind that carries only its message.
pub fn simple<T: pyo3::PyTypeInfo>(py: Python<'_>, message: String) -> PyErr {
    with_attrs(
        py,
        PyErr::new::<T, _>(message.clone()),
        &[("message", obj(py, message))],
    )
}

#[cfg(test)]
mod tests {
    use super::LineIndex;

    #[test]
    fn a_statement_is_found_on_its_printed_line_with_or_without_its_comment() {
        let printed = "def f(x):\n  # x: \"cpu f32[4]\"\n  a = prims.neg(x)  # a: \"cpu f32[4]\"\n  return a\n";
        let index = LineIndex::new(printed);
        assert_eq!(
            index.line_of("a = prims.neg(x)  # a: \"cpu f32[4]\""),
            Some(3)
        );
        assert_eq!(index.line_of("a = prims.neg(x)"), Some(3));
        assert_eq!(index.line_of("return a"), Some(4));
        assert_eq!(index.line_of("b = prims.neg(a)"), None);
        assert_eq!(index.line_of(""), None);
    }
}
