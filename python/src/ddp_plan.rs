//! `plan_ddp`: tracepass's DDP plan for a backward Thunder is about to run. `tracepass.thunder`
//! maps the plan onto Thunder's bound symbols; every decision (which gradients, which buckets,
//! where each all-reduce goes) is made here, by the same code as the `ddp` pass.

use crate::errors;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tracepass_passes::{plan_ddp_text, PlanParam};

/// Plans DDP for `backward` (Thunder's printed backward trace).
///
/// `params`: `(fqn, grad_output, requires_grad, tied_to)` per parameter, in the module's order.
/// Returns `{"gradients": [...], "buckets": [...]}` (see `tracepass_passes::DdpPlan`). Raises
/// `PlanError` with `kind` `parse` (the trace does not parse: an unknown op, with its
/// `line`), `options` (world size below 2, a bad bucket size) or `gradients` (the parameters
/// and the backward disagree).
#[pyfunction]
#[pyo3(signature = (backward, params, world_size, bucket_mb))]
fn plan_ddp<'py>(
    py: Python<'py>,
    backward: &str,
    params: Vec<(String, Option<usize>, bool, Option<String>)>,
    world_size: usize,
    bucket_mb: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let params: Vec<PlanParam> = params
        .into_iter()
        .map(|(fqn, grad_output, requires_grad, tied_to)| PlanParam {
            fqn,
            grad_output,
            requires_grad,
            tied_to,
        })
        .collect();
    let result = py.detach(|| plan_ddp_text(backward, &params, world_size, bucket_mb));
    let p = result.map_err(|e| errors::plan_error(py, &e))?;
    let gradients = PyList::empty(py);
    for g in &p.gradients {
        let d = PyDict::new(py);
        d.set_item("fqns", &g.fqns)?;
        d.set_item("values", &g.values)?;
        d.set_item("positions", &g.positions)?;
        d.set_item("return_position", g.return_position)?;
        d.set_item("ready_after", &g.ready_after)?;
        d.set_item("shape", &g.shape)?;
        d.set_item("nbytes", g.nbytes)?;
        gradients.append(d)?;
    }
    let buckets = PyList::empty(py);
    for b in &p.buckets {
        let d = PyDict::new(py);
        d.set_item("id", &b.id)?;
        d.set_item("gradients", &b.gradients)?;
        d.set_item("nbytes", b.nbytes)?;
        d.set_item("dtype", &b.dtype)?;
        d.set_item("device", &b.device)?;
        d.set_item("after", &b.after)?;
        buckets.append(d)?;
    }
    let out = PyDict::new(py);
    out.set_item("gradients", gradients)?;
    out.set_item("buckets", buckets)?;
    Ok(out)
}

/// Adds `plan_ddp` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan_ddp, m)?)
}
