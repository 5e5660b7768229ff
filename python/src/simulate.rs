//! `tracepass.simulate`: a backward's predicted step time on a modelled device and network,
//! as `tracepass simulate` reports it.

use crate::errors::{self, SimulateError};
use crate::pipeline::checked_rewrite;
use crate::program::PyProgram;
use crate::trace::PyTrace;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tracepass_ir::Program;
use tracepass_runtime::sim::{cpu_model, parse_link, DeviceModel, SimOptions, SimReport};

fn report_dict<'py>(
    py: Python<'py>,
    r: &SimReport,
    o: &SimOptions,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("device", o.device.name.as_str())?;
    d.set_item("world_size", o.world_size)?;
    d.set_item("step_s", r.step_s)?;
    d.set_item("compute_s", r.compute_s)?;
    d.set_item("comm_s", r.comm_s)?;
    d.set_item("overlap_s", r.overlap_s)?;
    d.set_item("overlap_pct", r.overlap_pct)?;
    d.set_item("exposed_comm_s", r.exposed_comm_s)?;
    d.set_item("ops", r.ops)?;
    let mut buckets = Vec::new();
    for b in &r.buckets {
        let bd = PyDict::new(py);
        bd.set_item("label", b.label.as_str())?;
        bd.set_item("bytes", b.bytes)?;
        bd.set_item("launch_s", b.launch_s)?;
        bd.set_item("start_s", b.start_s)?;
        bd.set_item("end_s", b.end_s)?;
        bd.set_item("wait_s", b.wait_s)?;
        buckets.push(bd);
    }
    d.set_item("buckets", buckets)?;
    Ok(d)
}

/// Predicts one step of `target`'s backward (a `Program`, or a backward `Trace`) on
/// `world_size` ranks of `device` (h100, h200, a100, l40s, or cpu: this machine) joined by
/// `link` (nvlink, nvlink3, pcie5, ib-400g, ib-200g, eth-100g, or `"LATENCY_US,GBPS"`).
/// `passes` rewrites a copy first (`"ddp(world_size=8),sort-waits"`). Returns a dict:
/// `step_s`, `compute_s`, `comm_s`, `overlap_s`, `overlap_pct`, `exposed_comm_s`, `ops`,
/// `buckets`.
#[pyfunction]
#[pyo3(signature = (target, world_size, device = "h100", link = "nvlink", passes = None))]
pub fn simulate<'py>(
    py: Python<'py>,
    target: &Bound<'py, PyAny>,
    world_size: usize,
    device: &str,
    link: &str,
    passes: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let fail = |m: String| errors::simple::<SimulateError>(py, m);
    if world_size == 0 {
        return Err(fail("world_size must be at least 1".into()));
    }
    let device_model = match device {
        "cpu" => cpu_model(world_size),
        g => DeviceModel::named(g).ok_or_else(|| {
            fail(format!(
                "device `{g}`: unknown (valid: {})",
                DeviceModel::NAMES.join(", ")
            ))
        })?,
    };
    let link_model = parse_link(link).map_err(|e| fail(format!("link `{link}`: {e}")))?;
    let opts = SimOptions {
        world_size,
        host_reduction: device == "cpu",
        device: device_model,
        link: link_model,
    };
    let mut program = if let Ok(p) = target.cast::<PyProgram>() {
        p.get().inner.clone()
    } else if let Ok(t) = target.cast::<PyTrace>() {
        Program::lone(t.get().inner.clone())
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "simulate takes a tracepass.Program or tracepass.Trace",
        ));
    };
    if let Some(pipeline) = passes {
        checked_rewrite(py, &mut program, pipeline, Some(world_size))?;
    }
    let report = py
        .detach(|| tracepass_runtime::sim::simulate(&program.backward, &opts))
        .map_err(|e| {
            let err = fail(e.to_string());
            let _ = err.value(py).setattr("statement", e.line.as_str());
            err
        })?;
    report_dict(py, &report, &opts)
}
