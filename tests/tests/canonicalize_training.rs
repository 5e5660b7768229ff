//! `canonicalize` is exact: training an export with it in the pipeline gives bit for bit the
//! losses and parameters of training without it.

use std::path::Path;
use tracepass_passes::parse_pipeline;
use tracepass_runtime::{train, ModelSource, TrainConfig, TrainReport};

fn run(export: &str, pipeline: &str) -> TrainReport {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(export);
    let cfg = TrainConfig {
        model: ModelSource::Export(dir),
        world_size: 2,
        steps: 2,
        passes: Some(parse_pipeline(pipeline).unwrap()),
        ..TrainConfig::default()
    };
    train(&cfg, &|_, _| {}).unwrap_or_else(|e| panic!("{export} `{pipeline}`: {e}"))
}

#[test]
fn canonicalized_exports_train_to_the_same_bits() {
    // both have reshapes and expands to their own shape (`canonicalize` removes them)
    for export in ["mlp", "cnn"] {
        let plain = run(export, "ddp(world_size=2),sort-waits");
        let canon = run(export, "canonicalize,dce,ddp(world_size=2),sort-waits");
        assert!(
            canon.backward.node_count() < plain.backward.node_count(),
            "{export}: canonicalize removed nothing from the backward"
        );
        let bits = |r: &TrainReport| r.losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&plain), bits(&canon), "{export}: losses");
        assert_eq!(plain.param_names, canon.param_names);
        for (a, b) in plain.params[0].iter().zip(&canon.params[0]) {
            let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{export}: parameters differ"
            );
        }
    }
}
