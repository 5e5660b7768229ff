//! The checkpoint reader behind `tracepass.load_checkpoint`: the runtime reads and checks the
//! file; Python gets each tensor as dtype, shape and little-endian bytes, which
//! `tracepass/checkpoint.py` turns into torch tensors.

use crate::errors::{self, CheckpointError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tracepass_runtime::tensor::Storage;
use tracepass_runtime::train::checkpoint::{self, CheckpointError as RsCheckpointError};
use tracepass_runtime::Tensor;

/// A tensor's dtype (as torch names it) and its elements as little-endian bytes.
fn raw(t: &Tensor) -> (&'static str, Vec<u8>) {
    let t = t.contiguous();
    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    let storage = t.storage();
    let (start, n) = (t.offset(), t.numel());
    match storage {
        Storage::F32(v) => ("float32", le(&v[start..start + n], f32::to_le_bytes)),
        Storage::F64(v) => ("float64", le(&v[start..start + n], f64::to_le_bytes)),
        Storage::BF16(v) => (
            "bfloat16",
            le(&v[start..start + n], |x| x.to_bits().to_le_bytes()),
        ),
        Storage::F16(v) => (
            "float16",
            le(&v[start..start + n], |x| x.to_bits().to_le_bytes()),
        ),
        Storage::I64(v) => ("int64", le(&v[start..start + n], i64::to_le_bytes)),
        Storage::I32(v) => ("int32", le(&v[start..start + n], i32::to_le_bytes)),
        Storage::Bool(v) => (
            "bool",
            v[start..start + n].iter().map(|&b| b as u8).collect(),
        ),
    }
}

fn tensors<'py>(py: Python<'py>, m: &BTreeMap<String, Tensor>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, t) in m {
        let (dtype, bytes) = raw(t);
        d.set_item(
            name.as_str(),
            (dtype, t.shape().to_vec(), PyBytes::new(py, &bytes)),
        )?;
    }
    Ok(d)
}

/// Reads a checkpoint `tracepass train --save` wrote: a dict with `step`, `optimizer`,
/// `optimizer_step`, `world_size`, `tied` (name groups, the primary first), and `params`,
/// `exp_avg`, `exp_avg_sq` (name -> (dtype, shape, bytes)).
#[pyfunction]
pub fn read_checkpoint(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let ck = py.detach(|| checkpoint::read(&path)).map_err(|e| {
        let err = errors::simple::<CheckpointError>(py, e.to_string());
        let _ = err.value(py).setattr("file", path.display().to_string());
        if let RsCheckpointError::Format { what, .. } | RsCheckpointError::Mismatch { what, .. } =
            &e
        {
            let _ = err.value(py).setattr("message", what.as_str());
        }
        err
    })?;
    let d = PyDict::new(py);
    d.set_item("step", ck.step)?;
    d.set_item("optimizer", ck.optimizer.as_str())?;
    d.set_item("optimizer_step", ck.optimizer_step)?;
    d.set_item("world_size", ck.world_size)?;
    d.set_item("tied", ck.tied.clone())?;
    d.set_item("params", tensors(py, &ck.params)?)?;
    d.set_item("exp_avg", tensors(py, &ck.exp_avg)?)?;
    d.set_item("exp_avg_sq", tensors(py, &ck.exp_avg_sq)?)?;
    Ok(d)
}
