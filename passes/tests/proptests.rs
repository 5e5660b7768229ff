//! Property tests: every pipeline keeps every program valid, and ddp's plan covers each
//! parameter gradient exactly once whatever the bucket size.

use proptest::prelude::*;
use tracepass_ir::synth::{mlp_program, MlpSpec};
use tracepass_ir::*;
use tracepass_passes::*;

fn spec() -> impl Strategy<Value = MlpSpec> {
    (
        prop::collection::vec(1usize..40, 2..6),
        1usize..9,
        any::<bool>(),
        prop::sample::select(vec![DType::F32, DType::BF16, DType::F64]),
    )
        .prop_map(|(dims, batch, input_grad, dtype)| {
            let layers = dims.len() - 1;
            MlpSpec {
                batch,
                gelu: (0..layers).map(|i| i + 1 < layers).collect(),
                names: (0..layers).map(|i| format!("layers.{i}")).collect(),
                dims,
                input_grad,
                dtype,
                device: Device::CPU,
            }
        })
}

fn pass() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            1usize..9,
            prop::sample::select(vec![0.0, 0.0001, 0.001, 0.01, 25.0]),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(w, mb, post, end)| format!(
                "ddp(world_size={w},bucket_mb={mb}{}{})",
                if post { ",average=post" } else { "" },
                if end { ",launch=end" } else { "" }
            )),
        Just("sort-waits".to_string()),
        Just("no-sync".to_string()),
        Just("accumulate-grads".to_string()),
        Just("dce".to_string()),
        Just("cse".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn pipelines_keep_programs_valid(spec in spec(), passes in prop::collection::vec(pass(), 1..5)) {
        let mut p = mlp_program(&spec).unwrap();
        let pipeline = passes.join(",");
        let pm = PassManager::parse(&pipeline).unwrap();
        match pm.run(&mut p, OpRegistry::builtin()) {
            Ok(_) => {
                prop_assert!(verify(&p.forward).is_ok());
                prop_assert!(verify(&p.backward).is_ok());
            }
            Err(e) => {
                // refusing (e.g. ddp on an already synchronized backward) is fine; breaking is not
                let broke = matches!(e.error, PassError::Verify { .. } | PassError::InvalidInput(_));
                prop_assert!(!broke, "{pipeline}: {e}");
            }
        }
    }

    #[test]
    fn ddp_reduces_every_parameter_gradient_once(spec in spec(), mb in 0.0f64..0.05, world in 1usize..9) {
        let p = mlp_program(&spec).unwrap();
        let mut q = p.clone();
        PassManager::parse(&format!("ddp(world_size={world},bucket_mb={mb}),sort-waits"))
            .unwrap()
            .run(&mut q, OpRegistry::builtin())
            .unwrap();
        let b = &q.backward;
        let mut packed = 0usize;
        for (_, n) in b.nodes().filter(|(_, n)| n.op == ops::BUCKET_PACK) {
            packed += n.args()[0].as_seq().unwrap().len();
        }
        prop_assert_eq!(packed, p.params.len());
        let reduces = b.nodes().filter(|(_, n)| n.op == ops::ALL_REDUCE).count();
        let waits = b.nodes().filter(|(_, n)| n.op == ops::WAIT).count();
        prop_assert_eq!(reduces, waits);
        prop_assert!(reduces >= 1 && reduces <= p.params.len());
    }
}
