//! The passes Python pipelines can name: the built-in ones and those registered from Python
//! (`tracepass.register_pass`), which then work in pipeline strings like any other.

use crate::errors;
use crate::trace::PyTrace;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::sync::{Mutex, OnceLock};
use tracepass_ir::Trace;
use tracepass_passes::{
    Changed, OptionDecl, OptionDefault, OptionKind, OptionValue, OptionValues, PassContext,
    PassDecl, PassError, PassLevel, PassRegistry, Show, TracePass,
};

fn user_registry() -> &'static Mutex<PassRegistry> {
    static REG: OnceLock<Mutex<PassRegistry>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(PassRegistry::with_builtins()))
}

/// The registry pipelines are built from: built-in passes and every registered one.
pub fn registry() -> PassRegistry {
    match user_registry().lock() {
        Ok(r) => r.clone(),
        // a registration that panicked left the registry as it was before it
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

/// A trace-level pass written in Python: `func(trace, options) -> Trace | None`, or a tuple
/// `(Trace | None, {counter: int})`. None means it changed nothing.
struct PyTracePass {
    name: &'static str,
    func: Py<PyAny>,
    options: OptionValues,
}

fn option_to_py(py: Python<'_>, v: Option<&OptionValue>) -> PyResult<Py<PyAny>> {
    use pyo3::IntoPyObjectExt;
    match v {
        None => Ok(py.None()),
        Some(OptionValue::Int(i)) => i.into_py_any(py),
        Some(OptionValue::Float(x)) => x.into_py_any(py),
        Some(OptionValue::Word(w)) => w.into_py_any(py),
    }
}

impl PyTracePass {
    fn call(&self, py: Python<'_>, t: &mut Trace, cx: &mut PassContext) -> PyResult<Changed> {
        let opts = PyDict::new(py);
        for o in self.options.decl().options {
            opts.set_item(o.name, option_to_py(py, self.options.get(o.name))?)?;
        }
        let arg = Py::new(py, PyTrace { inner: t.clone() })?;
        let out = self.func.bind(py).call1((arg, opts))?;
        let (new, stats) = match out.cast::<PyTuple>() {
            Ok(tuple) if tuple.len() == 2 => (tuple.get_item(0)?, Some(tuple.get_item(1)?)),
            _ => (out, None),
        };
        if let Some(stats) = stats {
            for (k, v) in stats.cast::<PyDict>()?.iter() {
                cx.stat(k.extract::<String>()?, v.extract::<u64>()?);
            }
        }
        if new.is_none() {
            return Ok(Changed::No);
        }
        let new = new.cast::<PyTrace>().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "pass `{}` returned {}, not a tracepass.Trace or None",
                self.name,
                new.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        *t = new.get().inner.clone();
        Ok(Changed::Yes)
    }
}

impl TracePass for PyTracePass {
    fn name(&self) -> &str {
        self.name
    }
    fn spec(&self) -> String {
        self.options.decl().spell(&self.options)
    }
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError> {
        Python::attach(|py| {
            self.call(py, t, cx).map_err(|e| PassError::Failed {
                pass: self.name.to_string(),
                message: e.to_string(),
            })
        })
    }
}

/// A declaration lives as long as the process: pipelines name it by its `'static` decl.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn option_decl(name: String, default: &Bound<'_, PyAny>) -> PyResult<OptionDecl> {
    let (kind, default) = if default.is_none() {
        (OptionKind::Word, OptionDefault::Absent)
    } else if default.is_instance_of::<pyo3::types::PyBool>() {
        (
            OptionKind::Choice(&["true", "false"]),
            OptionDefault::Value(if default.extract::<bool>()? {
                "true"
            } else {
                "false"
            }),
        )
    } else if let Ok(i) = default.extract::<u64>() {
        (
            OptionKind::Int {
                min: 0,
                max: u64::MAX,
            },
            OptionDefault::Value(leak(i.to_string())),
        )
    } else if let Ok(x) = default.extract::<f64>() {
        (
            OptionKind::Float {
                min: f64::NEG_INFINITY,
                min_inclusive: false,
            },
            OptionDefault::Value(leak(format!("{x:?}"))),
        )
    } else if let Ok(w) = default.extract::<String>() {
        (OptionKind::Word, OptionDefault::Value(leak(w)))
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "option `{name}`: the default must be an int >= 0, a float, a str, a bool or None"
        )));
    };
    Ok(OptionDecl {
        name: leak(name),
        kind,
        default,
        help: "",
        show: Show::IfChanged,
    })
}

/// Registers a trace-level pass written in Python under `name`; pipelines then name it like a
/// built-in one (`"dce,my-pass(factor=2)"`, `"backward(my-pass)"`).
///
/// `func(trace, options)` gets a copy of each trace and the options as a dict; it returns a
/// new `Trace` (the pass changed it), None (it did not), or `(trace_or_none, {counter: int})`.
/// `options` maps each option's name to its default, whose type (int, float, str, bool) is the
/// option's; None makes an optional word. A name already registered raises `PipelineError`.
#[pyfunction]
#[pyo3(signature = (name, func, help = "", options = None))]
pub fn register_pass(
    py: Python<'_>,
    name: String,
    func: Py<PyAny>,
    help: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    if !func.bind(py).is_callable() {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "register_pass: func must be callable: func(trace, options)",
        ));
    }
    let mut decls = Vec::new();
    if let Some(options) = options {
        for (k, v) in options.iter() {
            decls.push(option_decl(k.extract::<String>()?, &v)?);
        }
    }
    let mut reg = user_registry().lock().map_err(|_| {
        crate::errors::simple::<crate::errors::PipelineError>(
            py,
            "the pass registry is unusable after a failed registration".into(),
        )
    })?;
    if reg.get(&name).is_some() {
        return Err(errors::pass_error(py, &PassError::Duplicate { name }, None));
    }
    let decl: &'static PassDecl = Box::leak(Box::new(PassDecl {
        name: leak(name),
        help: leak(help.to_string()),
        level: PassLevel::Trace,
        options: Box::leak(decls.into_boxed_slice()),
    }));
    let func = std::sync::Arc::new(func);
    reg.register_trace_pass(decl, move |options| {
        Ok(PyTracePass {
            name: decl.name,
            func: Python::attach(|py| func.clone_ref(py)),
            options: options.clone(),
        })
    })
    .map_err(|e| errors::pass_error(py, &e, None))?;
    Ok(())
}

/// The passes pipelines can name, built-in and registered: dicts with `name`, `help`, `level`
/// (`trace` or `program`) and `options` (dicts with `name`, `kind`, `default`, `help`).
#[pyfunction]
pub fn passes<'py>(py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let reg = registry();
    let mut out = Vec::new();
    for name in reg.names() {
        let Some(decl) = reg.get(name) else { continue };
        let d = PyDict::new(py);
        d.set_item("name", decl.name)?;
        d.set_item("help", decl.help)?;
        d.set_item(
            "level",
            match decl.level {
                PassLevel::Trace => "trace",
                PassLevel::Program => "program",
            },
        )?;
        let mut opts = Vec::new();
        for o in decl.options {
            let od = PyDict::new(py);
            od.set_item("name", o.name)?;
            od.set_item("kind", kind_name(o.kind))?;
            od.set_item(
                "default",
                match o.default {
                    OptionDefault::Required => None,
                    OptionDefault::Absent => None,
                    OptionDefault::Value(v) => Some(v),
                },
            )?;
            od.set_item("required", o.default == OptionDefault::Required)?;
            od.set_item("help", o.help)?;
            opts.push(od);
        }
        d.set_item("options", opts)?;
        out.push(d);
    }
    Ok(out)
}

fn kind_name(k: OptionKind) -> String {
    match k {
        OptionKind::Int { min, max } if max == u64::MAX => format!("int >= {min}"),
        OptionKind::Int { min, max } => format!("int {min}..={max}"),
        OptionKind::Float { .. } => "float".into(),
        OptionKind::Choice(c) => c.join("|"),
        OptionKind::Word => "word".into(),
    }
}

/// The help text of every pass and its options, as `tracepass opt --help` prints it.
#[pyfunction]
pub fn passes_help() -> String {
    registry().help()
}
