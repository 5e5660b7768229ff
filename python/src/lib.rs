//! tracepass-python: the `tracepass._native` extension module. The Python package
//! `tracepass` (in `python/tracepass/`) wraps it; compiler authors call the Rust core through
//! it, never through the command line.

mod ddp_plan;
mod errors;
mod trace;

use pyo3::prelude::*;

/// The module `tracepass._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<trace::PyTrace>()?;
    m.add_class::<trace::PyStatement>()?;
    m.add_function(wrap_pyfunction!(trace::parse_trace, m)?)?;
    m.add_function(wrap_pyfunction!(trace::print_trace, m)?)?;
    ddp_plan::register(m)?;
    Ok(())
}
