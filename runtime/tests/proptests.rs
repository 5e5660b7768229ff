//! Property test: the synchronized gradients do not depend on the bucket size, to the bit.

use proptest::prelude::*;
use tracepass_runtime::train::{train, TrainConfig};

fn grads(world: usize, bucket_mb: f64, seed: u64) -> Vec<Vec<u32>> {
    let r = train(
        &TrainConfig {
            world_size: world,
            steps: 1,
            bucket_mb,
            seed,
            ..TrainConfig::default()
        },
        &|_, _| {},
    )
    .unwrap();
    r.grads_step0[0]
        .iter()
        .map(|g| {
            g.as_ref()
                .unwrap()
                .to_f32_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_bucket_size_gives_the_same_gradients(world in 1usize..5, mb in -1.0f64..0.02, seed in 0u64..1000) {
        prop_assert_eq!(grads(world, mb, seed), grads(world, 25.0, seed));
    }
}
