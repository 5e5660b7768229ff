//! The DDP plan on Thunder's real backwards (the corpus exports): it agrees with what the `ddp`
//! pass builds on the same program, bucket for bucket.

use std::path::Path;
use tracepass_ir::*;
use tracepass_passes::*;

fn export(name: &str) -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/models")
        .join(name);
    load_export(&dir).unwrap().program
}

fn plan_params(p: &Program) -> Vec<PlanParam> {
    p.params
        .iter()
        .filter(|x| !x.buffer)
        .map(|x| PlanParam {
            fqn: x.fqn.clone(),
            grad_output: x.grad_output,
            requires_grad: x.requires_grad,
            tied_to: x.tied_to.clone(),
        })
        .collect()
}

#[test]
fn plan_matches_the_ddp_pass_on_the_corpus() {
    for model in ["nanogpt", "llama", "bert", "cnn", "mlp-frozen"] {
        for bucket_mb in [0.0, 0.01, 25.0] {
            let program = export(model);
            let params = plan_params(&program);
            let plan = plan_ddp(program.backward.clone(), &params, 2, bucket_mb).unwrap();

            let mut rewritten = program.clone();
            let pm = PassManager::from_specs(
                PassRegistry::builtin(),
                &[DdpOptions {
                    world_size: 2,
                    bucket_mb,
                    ..DdpOptions::default()
                }
                .spec()],
            )
            .unwrap();
            pm.run(&mut rewritten, OpRegistry::builtin()).unwrap();
            let recorded = tracepass_passes::ddp::recorded_plan(&rewritten.backward);
            assert_eq!(plan.buckets.len(), recorded.len(), "{model} {bucket_mb}");
            for (b, (id, members, nbytes)) in plan.buckets.iter().zip(&recorded) {
                assert_eq!(&b.id, id, "{model}");
                assert_eq!(b.nbytes, *nbytes, "{model} {id}");
                assert_eq!(b.gradients.len(), members.len(), "{model} {id}");
                // the trigger is a value of the original backward, produced by a statement
                let after = b.after.as_deref().unwrap();
                let v = program.backward.find_value(after).unwrap();
                assert!(program.backward.producer(v).is_some(), "{model} {after}");
            }
            // every trainable tensor once; frozen parameters never
            let covered: Vec<&String> = plan.gradients.iter().flat_map(|g| &g.fqns).collect();
            let trainable = params.iter().filter(|p| p.requires_grad).count();
            assert_eq!(covered.len(), trainable, "{model}");
            for p in params.iter().filter(|p| !p.requires_grad) {
                assert!(!covered.contains(&&p.fqn), "{model}: frozen {}", p.fqn);
            }
            // buckets are issued in ready order: their triggers' statements ascend
            let pos = program.backward.schedule_positions();
            let slots: Vec<u32> = plan
                .buckets
                .iter()
                .map(|b| {
                    let v = program
                        .backward
                        .find_value(b.after.as_deref().unwrap())
                        .unwrap();
                    pos[program.backward.producer(v).unwrap().index()]
                })
                .collect();
            assert!(slots.windows(2).all(|w| w[0] <= w[1]), "{model} {slots:?}");
        }
    }
}

#[test]
fn nanogpt_tie_is_one_gradient_summed_from_two_values() {
    let program = export("nanogpt");
    let plan = plan_ddp(program.backward.clone(), &plan_params(&program), 4, 25.0).unwrap();
    let tie = plan
        .gradients
        .iter()
        .find(|g| g.fqns.len() == 2)
        .expect("the tie of wte and lm_head");
    assert_eq!(tie.values.len(), 2);
    assert_eq!(tie.positions.len(), 2);
    assert!(tie.positions.contains(&tie.return_position));
}

#[test]
fn a_torch_compile_fusion_region_is_read_through_its_body() {
    // Thunder 0.2.6 on CPU with `executors=[torch_compile_ex, ...]`: the whole backward of
    // Linear(4,4), Tanh, Linear(4,2) is one `TorchCompile1` region
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/thunder/torchcompile/backward.fused-trace"),
    )
    .unwrap();
    // the parser reads the region through its body as well, and says so
    let parsed = parse_trace(&text).unwrap();
    assert!(
        parsed
            .provenance
            .iter()
            .any(|p| p.pass.contains("printed decomposition: `TorchCompile1`")),
        "{:?}",
        parsed.provenance
    );
    let params: Vec<PlanParam> = [
        ("0.bias", 1),
        ("0.weight", 2),
        ("2.bias", 3),
        ("2.weight", 4),
    ]
    .iter()
    .map(|(f, p)| PlanParam {
        fqn: f.to_string(),
        grad_output: Some(*p),
        requires_grad: true,
        tied_to: None,
    })
    .collect();
    let plan = plan_ddp_text(&text, &params, 2, 0.0).unwrap();
    assert_eq!(plan.buckets.len(), 4);
    // ready order inside the region: the last layer's weight and bias first
    let order: Vec<&str> = plan.gradients.iter().map(|g| g.fqns[0].as_str()).collect();
    assert_eq!(order, ["2.weight", "2.bias", "0.weight", "0.bias"]);
    assert_eq!(plan.gradients[0].shape, [2, 4]);
    let (_, regions) = inline_fusion_regions(&text);
    assert_eq!(regions.len(), 1);
    assert_eq!(regions[0].outputs, ["t34", "t37", "t17", "t20"]);
}
