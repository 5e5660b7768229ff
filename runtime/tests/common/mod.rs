//! What the runtime's corpus tests share: the exports under `testdata/models/`, their names
//! and their JSON files. Each test file uses some of these, so the unused rest is allowed.
#![allow(dead_code)]

pub mod training;

use std::path::{Path, PathBuf};
use tracepass_ir::{Trace, ValueId};
use tracepass_runtime::comm::{CommOptions, ThreadComm, ThreadGroup};
use tracepass_runtime::cpu::CpuBackend;
use tracepass_runtime::exec::{Clock, Executor, Plan, RValue, Recording};
use tracepass_runtime::tensor::Tensor;
use tracepass_runtime::train::{train, ModelSource, OptimizerKind, TrainConfig, TrainReport};

/// Every export directory of the corpus, sorted: `testdata/models/`, or the folder
/// `TRACEPASS_CORPUS_DIR` names (fresh exports of other models, checked by the same tests).
pub fn corpus() -> Vec<PathBuf> {
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let other = std::env::var_os("TRACEPASS_CORPUS_DIR").map(PathBuf::from);
    let dir = other.clone().unwrap_or(own);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("export.json").is_file())
        .collect();
    v.sort();
    if other.is_none() {
        assert!(v.len() >= 12, "the corpus has {} exports", v.len());
    }
    v
}

/// An export's folder name (`nanogpt`).
pub fn name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// A JSON file of an export.
pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json file")).expect("json")
}

/// Numbers in [-1, 1) from a seed (xorshift), for the kernel tests' inputs.
pub fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// Runs `t` on one CPU rank with `inputs` as its arguments; its returned tensors.
pub fn run_trace(t: &Trace, inputs: &[Tensor]) -> Vec<Tensor> {
    run_trace_for(t, &t.returned_values(), inputs.to_vec())
}

/// Runs `t` on one CPU rank with `inputs` as its arguments; the tensors `results` name.
pub fn run_trace_for(t: &Trace, results: &[ValueId], inputs: Vec<Tensor>) -> Vec<Tensor> {
    let results: Vec<Option<ValueId>> = results.iter().map(|r| Some(*r)).collect();
    let plan = Plan::compile(t, &results).unwrap_or_else(|e| panic!("{e}"));
    let g = ThreadGroup::new(1, CommOptions::default());
    let mut comm = g.comm(0);
    let mut e: Executor<CpuBackend, ThreadComm> = Executor::new();
    e.run(
        &plan,
        &CpuBackend,
        &mut comm,
        inputs.into_iter().map(RValue::Tensor).collect(),
        &Clock::new(false),
        &mut Recording::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .into_iter()
    .map(|v| match v {
        RValue::Tensor(t) => t,
        other => panic!("expected a tensor, got {other:?}"),
    })
    .collect()
}

/// Whether two gradient lists hold the same tensors bit for bit (`None` where the other has
/// `None`).
pub fn same_bits(a: &[Option<Tensor>], b: &[Option<Tensor>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => x.bitwise_eq(y),
            (None, None) => true,
            _ => false,
        })
}

/// One step of the export in `dir` on `world` unpinned ranks with `pipeline` and buckets of
/// `bucket_mb`, SGD at learning rate 0 (the step-0 gradients of every rank kept).
pub fn step0(dir: &Path, world: usize, pipeline: &str, bucket_mb: f64) -> TrainReport {
    let c = TrainConfig {
        model: ModelSource::Export(dir.to_path_buf()),
        world_size: world,
        steps: 1,
        keep_all_ranks: true,
        pin_ranks: false,
        bucket_mb,
        optimizer: OptimizerKind::Sgd { lr: 0.0 },
        passes: Some(tracepass_passes::parse_pipeline(pipeline).expect("pipeline")),
        ..TrainConfig::default()
    };
    train(&c, &|_, _| {}).unwrap_or_else(|e| panic!("{} `{pipeline}`: {e}", name(dir)))
}

/// A shape as its printed dims, `2, 3, 4`.
pub fn dims(v: &[usize]) -> String {
    v.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
