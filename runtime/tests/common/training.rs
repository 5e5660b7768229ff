//! Training runs of corpus exports for the sharded-training tests (`fsdp_train.rs`,
//! `sharded_checkpoint.rs`): one configuration, one runner and one comparison of parameters.

use std::path::{Path, PathBuf};
use tracepass_passes::parse_pipeline;
use tracepass_runtime::train::{train, ModelSource, TrainConfig, TrainReport};

/// The export folder of corpus model `name`.
pub fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name)
}

/// `steps` steps of `name` on `world_size` unpinned one-thread ranks with `passes`.
pub fn cfg(name: &str, world_size: usize, steps: usize, passes: &str) -> TrainConfig {
    TrainConfig {
        model: ModelSource::Export(model(name)),
        world_size,
        steps,
        passes: Some(parse_pipeline(passes).expect("pipeline")),
        pin_ranks: false,
        threads_per_rank: 1,
        ..TrainConfig::default()
    }
}

/// Trains `c`; a failure panics with the model and the passes.
pub fn run(c: &TrainConfig) -> TrainReport {
    train(c, &|_, _| {}).unwrap_or_else(|e| panic!("{:?} {:?}: {e}", c.model, c.passes))
}

/// Every tensor of `got` within `1e-6` of the largest magnitude in `want`'s tensor.
pub fn assert_same_params(got: &TrainReport, want: &TrainReport, what: &str) {
    assert_eq!(got.param_names, want.param_names);
    let (g, w) = (&got.params[0], &want.params[0]);
    assert_eq!(g.len(), w.len(), "{what}");
    for ((name, a), b) in got.param_names.iter().zip(g).zip(w) {
        assert_eq!(a.shape(), b.shape(), "{what}: `{name}`");
        let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
        let scale = b
            .iter()
            .fold(0.0f64, |m, x| m.max(x.abs()))
            .max(f64::MIN_POSITIVE);
        let err = a
            .iter()
            .zip(&b)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            err <= 1e-6 * scale,
            "{what}: `{name}` differs by {err:e} (scale {scale:e})"
        );
    }
}
