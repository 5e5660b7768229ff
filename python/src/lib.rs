//! tracepass-python: the `tracepass._native` extension module. The Python package
//! `tracepass` (in `python/tracepass/`) wraps it; compiler authors call the Rust core through
//! it, never through the command line.

mod checkpoint;
mod ddp_plan;
mod errors;
mod pipeline;
mod program;
mod registry;
mod simulate;
mod trace;
mod train;

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
    m.add_class::<program::PyProgram>()?;
    m.add_class::<pipeline::PyPipelineResult>()?;
    m.add_function(wrap_pyfunction!(program::load_program, m)?)?;
    m.add_function(wrap_pyfunction!(pipeline::run_pipeline, m)?)?;
    m.add_function(wrap_pyfunction!(registry::register_pass, m)?)?;
    m.add_function(wrap_pyfunction!(registry::passes, m)?)?;
    m.add_function(wrap_pyfunction!(registry::passes_help, m)?)?;
    m.add_function(wrap_pyfunction!(simulate::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::read_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    ddp_plan::register(m)?;
    Ok(())
}
